// Two passes for rows wider than one CTA, with a residual or with given
// statistics (16-bit or float x and h alike, 16-byte packs; y plain,
// per-tensor FP8, or RMSNorm's per-row FP8). fwd_add_stats reads x and the
// residual, stores h and writes the row's mean/rstd of h as stored (and per
// row its FP8 scale); fwd_apply then normalizes h (or x, with given
// statistics) pack by pack, a row split across CTAs with no reduction. Five
// tensor passes of DRAM traffic against four for one cluster a row
// (fwd_regs), but each at about the speed of a copy (docs/tuning.md,
// two-pass-fits).
#pragma once

#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

// Per-row FP8 (RMSNorm only): the row's scale from rstd * max |h * scale|,
// reduced with the sum of squares (as fwd_slices does), written to qscale for
// fwd_apply.
template <NormKind K, Quant Q, class T, class P, int VEC>
__global__ void __launch_bounds__(kAddStatsThreads) fwd_add_stats(FwdArgs a) {
  constexpr bool kLayer = K == NormKind::kLayer;
  constexpr bool kRowMax = Q == Quant::kRow;
  static_assert(!(kLayer && kRowMax), "fwd_add_stats: per-row FP8 scales for RMSNorm only");
  // The row's two sums (add_row_sums), and RMSNorm's per row max |h * scale| after them.
  constexpr int M = kRowMax ? 3 : 2;
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC, row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * H;
  const T* res = static_cast<const T*>(a.residual) + row * H;
  T* h = static_cast<T*>(a.h) + row * H;
  const P* gamma = kRowMax && a.gamma ? static_cast<const P*>(a.gamma) + a.shape.param_offset(row) : nullptr;
  auto h_at = [&](int64_t c) { return to_float(from_float<T>(to_float(x[c]) + to_float(res[c]))); };
  const float shift = kLayer ? layer_shift(h_at, H) : 0.f;
  float acc[M] = {};
  for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
    float v[VEC];
    load_pack<VEC>(x + p * VEC, v);
    add_residual<VEC, T>(v, res, false, p * VEC);
    store_pack_as<VEC, T>(h, false, p * VEC, v);  // h as stored is what is normalized
    if constexpr (kRowMax) {
      add_sq_scaled_max<VEC>(acc, v, gamma, p * VEC, a.zero_centered);
    } else {
      add_row_sums<K>(acc, v, shift);
    }
  }
  if constexpr (!kLayer) {
    acc[1] = scaled_sq_of(acc[0], [&] {
      float s = 0.f;
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
        float v[VEC];
        load_pack<VEC>(x + p * VEC, v);
        add_residual<VEC, T>(v, res, false, p * VEC);
        round_as<VEC, T>(false, v);  // h as stored
        add_scaled_sq(s, v);
      }
      return s;
    });
  }
  if constexpr (kRowMax) {
    row_sum<M, SqMaxOp, true>(acc, smem);
  } else {
    row_sum_lead<M>(acc, smem);
  }
  if (threadIdx.x != 0) return;
  if constexpr (kLayer) {
    const float2 mean_m2 = shifted_mean_m2(acc, shift, H);
    a.mean[row] = mean_m2.x;
    a.rstd[row] = rsqrtf(mean_m2.y / static_cast<float>(H) + a.eps);
  } else {
    const float rstd = rms_rstd(acc[0], acc[1], a.eps, H);
    a.rstd[row] = rstd;
    if constexpr (kRowMax) a.qscale[row] = quant_scale(rstd * acc[2], a.fp8, a.scale_ub);
  }
}

// y = (src - mean) * rstd * scale + beta for kApplyItems packs a thread of
// one row (CTA b: row b / chunks), mean/rstd read from a.mean/a.rstd. Per-tensor
// FP8 (Q = kTensor): y stored as q = y * scale, and max |y| merged into
// its tensor's amax by warps (merge_amax); per row (kRow): q = y /
// qscale[row], the row's scale written by fwd_add_stats.
template <NormKind K, Quant Q, class T, class P, int VEC>
__global__ void __launch_bounds__(kApplyThreads) fwd_apply(FwdArgs a, const T* src, int chunks) {
  static_assert(Q == Quant::kNone || Q == Quant::kTensor || Q == Quant::kRow, "fwd_apply: no per-group FP8");
  const int64_t H = a.shape.hidden;
  const int64_t row = blockIdx.x / chunks;
  const int64_t chunk = blockIdx.x - row * chunks;
  const float rstd = a.rstd[row];
  const float mean = K == NormKind::kLayer ? a.mean[row] : 0.f;
  float mul = 0.f, amax_seen = 0.f;  // FP8: q = y * mul
  if constexpr (Q == Quant::kTensor) {
    if (a.amax) amax_seen = load_seen(a.amax + a.tensor_of(row));
    mul = a.tensor_mul(a.tensor_of(row));
  } else if constexpr (Q == Quant::kRow) {
    mul = 1.f / a.qscale[row];
  }
  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
  const int64_t col0 = (chunk * kApplyItems * blockDim.x + threadIdx.x) * VEC;
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  float v[kApplyItems][VEC];
#pragma unroll
  for (int i = 0; i < kApplyItems; ++i) {
    if (col0 + i * step < H) load_pack<VEC>(src + row * H + col0 + i * step, v[i]);
  }
  float m[1] = {0.f};  // max |y| of this thread's columns
#pragma unroll
  for (int i = 0; i < kApplyItems; ++i) {
    const int64_t col = col0 + i * step;
    if (col < H) {
      scale_shift<VEC>(v[i], mean, rstd, gamma, beta, col, a.zero_centered);
      if constexpr (Q == Quant::kNone) {
        store_pack<VEC>(static_cast<T*>(a.y) + row * H + col, v[i]);
      } else {
        store_q<VEC>(a, row * H + col, v[i], mul);
        if constexpr (Q == Quant::kTensor) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) m[0] = max_abs(m[0], v[i][j]);
        }
      }
    }
  }
  if constexpr (Q == Quant::kTensor) {
    if (a.amax) merge_amax(a, row, m[0], amax_seen);
  }
}

}  // namespace
}  // namespace jrn::cuda
