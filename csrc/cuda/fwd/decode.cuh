// fwd_decode: the norm at decode-time row counts (at most two rows an SM):
// one row a CTA, ITEMS packs a thread, gamma/beta (x's dtype, one set)
// loaded with x before the reduction, 32-bit indexing, and one reduction a
// row (LayerNorm's sums taken around layer_shift). With a warp or four per
// scheduler, a warp's instructions wait on each other at their full
// latency, so the kernel's time follows its instructions per warp: this
// kernel has none for FP8, given statistics or parameter groups, its PLAIN
// configuration none for the parameters' presence or a zero-centred scale,
// and its configuration for a residual and h in x's dtype (kSame) none for
// their dtypes (docs/tuning.md, fwd-decode).
//
// SPLIT: a row split into gridDim.y parts (a power of two): each part's CTA
// reads the whole row for its statistics (from L2 after the first), but
// loads the parameters for, and writes, only its part, so more SMs load the
// parameters and store y at once (fwd-decode-split).
//
// The row's fixed work is kept off its critical path: the kernel parameters
// the row's end needs are read as x arrives, H's reciprocal is taken then
// (no division after the reduction), the split's bounds are shifts, a
// thread's sums run in two chains, and the warps' partials are added by a
// butterfly (fwd-decode-fixed-work).
#pragma once

#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

//
// ITEMS, PLAIN, SPLIT and R are the fields of the plan's plan::DecodeConfig
// (a kernel's template arguments cannot be of class type: nvcc's host stubs
// do not take them).
template <NormKind K, class T, int VEC, int ITEMS, bool PLAIN, bool SPLIT, plan::DecodeResidual R>
__global__ void __launch_bounds__(kMaxRowThreads) fwd_decode(FwdArgs a) {
  using DecodeResid = plan::DecodeResidual;
  early_launch_wait();  // launched by launch_early: before any global memory access
  using V = Pack<T, VEC>;
  __shared__ float smem[kRowSumSmem];
  const int H = static_cast<int>(a.shape.hidden), nvec = H / VEC;
  const int row = static_cast<int>(blockIdx.x);
  const T* xrow = static_cast<const T*>(a.x) + row * H;
  const V* x = reinterpret_cast<const V*>(xrow);
  const V* gamma = static_cast<const V*>(a.gamma);
  const V* beta = K == NormKind::kLayer ? static_cast<const V*>(a.beta) : nullptr;
  auto pack = [&](int i) { return static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x); };
  // SPLIT: part blockIdx.y of gridDim.y. This CTA reads the whole row for its
  // statistics, but loads the parameters of, and writes, only its packs.
  // gridDim.y is a power of two (the launcher's): the bounds take a shift.
  const int part = SPLIT ? static_cast<int>(blockIdx.y) : 0, log_parts = __ffs(static_cast<int>(gridDim.y)) - 1;
  const int lo = (nvec * part) >> log_parts, hi = (nvec * (part + 1)) >> log_parts;
  V xv[ITEMS], gv[ITEMS], bv[ITEMS];
  float r[R == DecodeResid::kNone ? 1 : ITEMS][VEC];  // the residual's packs, loaded with x
  bool in[ITEMS], mine[ITEMS];
  auto load_params = [&](int i) {
    if (gamma) gv[i] = gamma[pack(i)];
    if (beta) bv[i] = beta[pack(i)];
  };
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    in[i] = pack(i) < nvec;
    mine[i] = SPLIT ? pack(i) >= lo && pack(i) < hi : in[i];
    if (in[i]) {
      xv[i] = x[pack(i)];
      if constexpr (R == DecodeResid::kSame)
        load_pack<VEC>(static_cast<const T*>(a.residual) + row * H + pack(i) * VEC, r[i]);
      if constexpr (R == DecodeResid::kAny)
        load_pack_as<VEC, T>(a.residual, a.residual_f32, row * H + pack(i) * VEC, r[i]);
      if (!SPLIT) load_params(i);
    }
    if (SPLIT && mine[i]) load_params(i);
  }
  // What the row's end needs (y, rstd and mean, eps, 1 / H), read here, as x
  // arrives: left to ptxas, the kernel parameters were read from the constant
  // bank after the row's reduction, on its critical path.
  float eps = a.eps, inv_h = 1.f / static_cast<float>(H);
  T* y = static_cast<T*>(a.y) + row * H;
  float *rstd_out = a.rstd, *mean_out = a.mean;
  asm volatile("" : "+f"(eps), "+f"(inv_h), "+l"(y), "+l"(rstd_out), "+l"(mean_out));
  float shift = 0.f;
  if constexpr (K == NormKind::kLayer) {
    shift = layer_shift(
        [&](int c) {
          float e[1] = {to_float(xrow[c])};
          if constexpr (R == DecodeResid::kSame) e[0] += to_float(static_cast<const T*>(a.residual)[row * H + c]);
          if constexpr (R == DecodeResid::kAny) add_residual<1, T>(e, a.residual, a.residual_f32, row * H + c);
          return e[0];
        },
        H);
  }
  float v[ITEMS][VEC];
  // Two chains of dependent adds (even and odd packs), added at the end:
  // half the latency of one. (One a pack spilled the float32 LayerNorm
  // instance of four packs at 64 registers.)
  float sums[2][2] = {};
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    if (in[i]) {
      unpack(xv[i], v[i]);
      if constexpr (R != DecodeResid::kNone) {
        // h = x + residual, stored (this CTA's packs) and rounded as stored:
        // what is normalized is h as the caller gets it.
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[i][j] += r[i][j];
        const bool h_f32 = R == DecodeResid::kAny && a.h_f32;
        if (mine[i]) {
          store_pack_as<VEC, T>(a.h, h_f32, row * H + pack(i) * VEC, v[i]);
        } else {
          round_as<VEC, T>(h_f32, v[i]);
        }
      }
      add_row_sums<K>(sums[i % 2], v[i], shift);
    }
  }
  float acc[2];
#pragma unroll
  for (int m = 0; m < 2; ++m) acc[m] = sums[0][m] + sums[1][m];
  if constexpr (K == NormKind::kRms) {
    acc[1] = scaled_sq_of(acc[0], [&] {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) add_scaled_sq(s, v[i]);  // zeros past the row
      return s;
    });
  }
  row_sum_wide<2>(acc, smem);
  RowMean mean;
  float rstd;
  if constexpr (K == NormKind::kLayer) {
    const float m1 = acc[0] * inv_h;
    mean = {shift, m1};
    rstd = rsqrtf(shifted_mean_m2_of(acc, shift, m1).y * inv_h + eps);
  } else {
    rstd = rms_rstd(acc[0], acc[1], eps, [&](float s) { return s * inv_h; });
  }
  const float centred = centred_mean<T>(mean);  // after centre_base
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (mine[i]) {
      if constexpr (K == NormKind::kLayer) centre_base<T>(v[i], mean);
      if constexpr (PLAIN) {  // gamma (and beta) given, not zero-centred
        float g[VEC];
        unpack(gv[i], g);
        if constexpr (K == NormKind::kLayer) {
          float b[VEC];
          unpack(bv[i], b);
          scale_shift_plain<(sizeof(T) < 4)>(v[i], centred, rstd, g, b);
        } else {
          scale_plain(v[i], rstd, g);
        }
      } else {
        const V g = gv[i], b = bv[i];
        scale_shift_packs<VEC>(v[i], centred, rstd, g, gamma != nullptr, b, beta != nullptr, a.zero_centered);
      }
      store_pack<VEC>(y + pack(i) * VEC, v[i]);
    }
  }
  if (threadIdx.x == 0 && part == 0) {
    rstd_out[row] = rstd;
    if constexpr (K == NormKind::kLayer) mean_out[row] = mean.value();
  }
}


}  // namespace
}  // namespace jrn::cuda
