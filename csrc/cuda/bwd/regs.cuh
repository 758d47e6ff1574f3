// bwd_regs: rows of up to kRegThreads * kRegItems packs held in registers,
// several rows a CTA (a row of threads a slot), each slot's dgamma sums in
// registers.
#pragma once

#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kRegThreads) bwd_regs(BwdArgs a, SlotLayout l) {
  early_launch_now();  // bwd_columns may run beside it (param_sums)
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
  const int64_t group_row0 = static_cast<int64_t>(blockIdx.y) * rpg;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + blockIdx.y * H : nullptr;

  float scale[kRegItems][VEC], dg[kRegItems][VEC], db[kRegItems][VEC];
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
    if (col < H) {
      load_scale<VEC>(gamma, col, a.zero_centered, scale[i]);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) dg[i][j] = db[i][j] = 0.f;
  }

  // Every thread of the block runs the same number of iterations (row_sum
  // holds barriers); rows past the group's end are masked.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < rpg; base += l.used) {
    const int64_t r = base + threadIdx.y;
    const bool valid = r < rpg;
    const int64_t row = group_row0 + r;
    const T* x = static_cast<const T*>(a.x) + row * H;
    const T* dy = static_cast<const T*>(a.dy) + row * H;
    const float rstd = valid ? a.rstd[row] : 0.f;
    const float mean = (K == NormKind::kLayer && valid) ? a.mean[row] : 0.f;

    // Centred rows (kCentred) keep dy: their dgamma sums wait for the row's
    // shift nb.
    constexpr bool kCentre = kCentred<K, T>;
    float xh[kRegItems][VEC], g[kRegItems][VEC], dk[kCentre ? kRegItems : 1][VEC];
    float acc[3] = {0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
      if (valid && col < H) {
        float d[VEC];
        load_pack<VEC>(x + col, xh[i]);
        load_pack<VEC>(dy + col, d);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          xh[i][j] = (xh[i][j] - mean) * rstd;
          g[i][j] = d[j] * scale[i][j];
          acc[0] += g[i][j] * xh[i][j];
          acc[1] += g[i][j];
          acc[2] += xh[i][j];
          if constexpr (kCentre) {
            dk[i][j] = d[j];
          } else {
            dg[i][j] += d[j] * xh[i][j];
          }
          if constexpr (K == NormKind::kLayer) db[i][j] += d[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) xh[i][j] = g[i][j] = 0.f;
      }
    }
    grad_row_sums<K, T>(acc, smem);
    const RowCoefs c = row_coefs<K, T>(a, row, valid, acc);
    if (valid) {
      T* dx = static_cast<T*>(a.dx) + row * H;
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
        if (col < H) {
          float out[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if constexpr (kCentre) {
              xh[i][j] += c.nb;
              dg[i][j] += dk[i][j] * xh[i][j];
            }
            out[j] = rstd * (g[i][j] - c.c2 - xh[i][j] * c.c1);
          }
          if (a.dh) add_dh<VEC, T>(a, row * H + col, out);
          store_pack<VEC>(dx + col, out);
        }
      }
    }
  }

  if (a.workspace == nullptr || slot >= l.used) return;
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
    if (col < H) store_slot_sums<K>(a, l, slot, col, dg[i], db[i]);
  }
}

}  // namespace
}  // namespace jrn::cuda
