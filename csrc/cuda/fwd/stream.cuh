// fwd_stream: one CTA a row, the row streamed twice (the second read served
// mostly by L2), or three times for per-row FP8 (its max first); per group,
// a thread a group. The fallback for rows too wide or unaligned for the
// kernels that hold a row.
#pragma once

#include "../common/block_scale.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
__global__ void __launch_bounds__(kStreamThreads) fwd_stream(FwdArgs a) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC;
  const int64_t row = blockIdx.x;
  // The row being normalized: x, or h = x + residual (`rounded`: as h
  // stores it; the first pass leaves that to store_h_as). Later passes
  // recompute h rather than read it back (h is written through a different
  // path than the read-only loads, within this kernel).
  auto load_row = [&]<int N>(int64_t col, float (&v)[N], bool rounded) {
    load_x<XQ, N, T>(a, row, col, v);
    if (a.residual) {
      add_residual<N, T>(v, a.residual, a.residual_f32, row * H + col);
      if (rounded) round_as<N, T>(a.h_f32, v);
    }
  };

  // The row's two sums (add_row_sums): LayerNorm's around a shift near the
  // row's mean (layer_shift).
  float acc[2] = {0.f, 0.f};
  float shift = 0.f;
  if (K == NormKind::kLayer) {
    shift = layer_shift([&](int64_t col) {
      float v[1];
      load_row(col, v, true);
      return v[0];
    }, H);
  }
  for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
    float v[VEC];
    load_row(p * VEC, v, false);
    if (a.residual) store_h_as<VEC, T>(a.no_output ? nullptr : a.h, a.h_f32, row * H + p * VEC, v);
    add_row_sums<K>(acc, v, shift);
  }
  if constexpr (K == NormKind::kRms) {
    acc[1] = scaled_sq_of(acc[0], [&] {
      float s = 0.f;
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
        float v[VEC];
        load_row(p * VEC, v, true);
        add_scaled_sq(s, v);
      }
      return s;
    });
  }
  row_sum<2>(acc, smem);
  const float m1 = acc[0] / static_cast<float>(H);
  const RowMean mean = K == NormKind::kLayer ? RowMean{shift, m1} : RowMean{};
  float rstd;
  if constexpr (K == NormKind::kLayer) {
    rstd = rsqrtf(fmaxf(acc[1] / static_cast<float>(H) - m1 * m1, 0.f) + a.eps);
  } else {
    rstd = rms_rstd(acc[0], acc[1], a.eps, H);
  }
  if (a.given_stats) rstd = a.rstd[row];
  const RowMean mean_used = a.given_stats && K == NormKind::kLayer ? RowMean{a.mean[row], 0.f} : mean;
  const float centred = centred_mean<T>(mean_used);

  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;  // RMSNorm has none
  auto normalize = [&](int64_t col, float (&v)[VEC]) {
    load_row(col, v, true);
    if constexpr (K == NormKind::kLayer) centre_base<T>(v, mean_used);
    scale_shift<VEC>(v, centred, rstd, gamma, beta, col, a.zero_centered);
  };
  if constexpr (Q == Quant::kNone) {
    T* y = static_cast<T*>(a.y) + row * H;
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      float v[VEC];
      normalize(p * VEC, v);
      store_pack<VEC>(y + p * VEC, v);
    }
  } else if constexpr (Q == Quant::kTensor || Q == Quant::kRow) {
    // kRow: one more pass for the row's max |y| before anything is stored.
    float inv = 0.f;
    if constexpr (Q == Quant::kRow) {
      float m[1] = {0.f};
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
        float v[VEC];
        normalize(p * VEC, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) m[0] = max_abs(m[0], v[j]);
      }
      row_sum<1>(m, smem, AbsMaxOp{});
      const float scale = quant_scale(m[0], a.fp8, a.scale_ub);
      inv = 1.f / scale;
      if (threadIdx.x == 0) a.qscale[row] = scale;
    }
    float mul = inv;
    if (Q == Quant::kTensor && !a.no_output) mul = a.tensor_mul(a.tensor_of(row));
    float m[1] = {0.f};
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      float v[VEC];
      normalize(p * VEC, v);
      if constexpr (Q == Quant::kTensor) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) m[0] = max_abs(m[0], v[j]);
      }
      if (!a.no_output) store_q<VEC>(a, row * H + p * VEC, v, mul);
    }
    if constexpr (Q == Quant::kTensor) {
      if (a.amax) {  // uniform over the CTA
        row_sum<1>(m, smem, AbsMaxOp{});
        if (threadIdx.x == 0) atomic_abs_max(a.amax + a.tensor_of(row), m[0]);
      }
    }
  } else {
    // A thread per group: its max, then the group again, coded by the
    // group scale's rule (block_scale.cuh). NVFP4's codes go two a byte:
    // single-element packs are taken in pairs (its groups are even).
    const int64_t G = a.group_size, gvec = G / VEC;
    const GroupGlobal global = group_global(a, row);
    const bool pairs = VEC == 1 && a.group_scale == GroupScale::kNvfp4;
    for (int64_t g = threadIdx.x; g < H / G; g += blockDim.x) {
      float gm = 0.f;
      for (int64_t p = 0; p < gvec; ++p) {
        float v[VEC];
        normalize(g * G + p * VEC, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) gm = max_abs(gm, v[j]);
      }
      const GroupCode code = group_scale(a, group_scales(a), row * (H / G) + g, gm, global);
      for (int64_t p = 0; p < gvec; p += pairs ? 2 : 1) {
        const int64_t col = g * G + p * VEC;
        if (pairs) {
          float v0[VEC], v1[VEC];
          normalize(col, v0);
          normalize(col + 1, v1);
          float v[2] = {v0[0], v1[0]};
          store_group<2>(a, row * H + col, v, global, code);
        } else {
          float v[VEC];
          normalize(col, v);
          store_group<VEC>(a, row * H + col, v, global, code);
        }
      }
    }
  }
  if (threadIdx.x == 0 && !a.given_stats) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean.value();
  }
}

}  // namespace
}  // namespace jrn::cuda
