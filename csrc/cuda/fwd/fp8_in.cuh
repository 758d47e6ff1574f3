// fwd_fp8_regs: FP8 input (a scale per group of columns), no residual,
// rows of up to kMaxRowThreads * kRegItems packs of kFp8Vec codes: each
// thread keeps its packs as raw codes, four registers per 16 columns, so its
// four 16-byte loads are in flight together (twice the bytes of fwd_regs'
// 8-code packs in the same registers), and decodes them again for each pass
// over the row.
#pragma once

#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

template <NormKind K, class T, class P>
__global__ void __launch_bounds__(kMaxRowThreads) fwd_fp8_regs(FwdArgs a) {
  __shared__ float smem[kRowSumSmem];
  constexpr int V = kFp8Vec;
  const int64_t H = a.shape.hidden;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  auto column = [&](int i) { return (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * V; };
  const uint8_t* x = static_cast<const uint8_t*>(a.x);
  uint4 raw[kRegItems];
  float sc[kRegItems];  // each pack's scale (zero where there is no pack)
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t idx = row * H + column(i);
    const bool here = valid && column(i) < H;
    raw[i] = here ? __ldg(reinterpret_cast<const uint4*>(x + idx)) : make_uint4(0, 0, 0, 0);
    sc[i] = here ? __ldg(a.x_scale + idx / a.x_group) : 0.f;
  }
  auto decode = [&](int i, float (&f)[V]) {
    decode_fp8x4(raw[i].x, a.x_fmt, f);
    decode_fp8x4(raw[i].y, a.x_fmt, f + 4);
    decode_fp8x4(raw[i].z, a.x_fmt, f + 8);
    decode_fp8x4(raw[i].w, a.x_fmt, f + 12);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] *= sc[i];
  };
  float mean = 0.f;
  if constexpr (K == NormKind::kLayer) {
    float sum[1] = {0.f};
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      float f[V];
      decode(i, f);
#pragma unroll
      for (int j = 0; j < V; ++j) sum[0] += f[j];
    }
    row_sum<1>(sum, smem);
    mean = sum[0] / static_cast<float>(H);
  }
  // The sum of squares about the mean (RMSNorm: and its scaled twin, scaled_sq_of).
  constexpr int kSq = K == NormKind::kLayer ? 1 : 2;
  float sq[kSq] = {};
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    if (column(i) < H) {
      float f[V];
      decode(i, f);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sq[0] += (f[j] - mean) * (f[j] - mean);  // RMSNorm: mean 0
      }
    }
  }
  if constexpr (kSq == 2) {
    sq[kSq - 1] = scaled_sq_of(sq[0], [&] {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        if (column(i) < H) {
          float f[V];
          decode(i, f);
          add_scaled_sq(s, f);
        }
      }
      return s;
    });
  }
  row_sum<kSq>(sq, smem);
  const float rstd = kSq == 1 ? rsqrtf(sq[0] / static_cast<float>(H) + a.eps) : rms_rstd(sq[0], sq[kSq - 1], a.eps, H);
  if (!valid) return;
  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;  // RMSNorm has none
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t col = column(i);
    if (col < H) {
      float f[V];
      decode(i, f);
      scale_shift<V>(f, mean, rstd, gamma, beta, col, a.zero_centered);
      store_pack<V>(static_cast<T*>(a.y) + row * H + col, f);
    }
  }
  if (threadIdx.x == 0) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}

}  // namespace
}  // namespace jrn::cuda
