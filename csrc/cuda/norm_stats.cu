// Per-row statistics of a slice of the hidden dim, for normalization with the
// hidden dim split across devices (see StatsArgs):
//   x_stats:    RMSNorm sum(x^2); LayerNorm (mean, sum((x - mean)^2)), the
//               sums taken around a shift near the row's mean (layer_shift);
//               or the same of h = x + residual, h stored in the same pass.
//   grad_stats: sum(gdy * xhat), and for LayerNorm sum(gdy) after it,
//               gdy = dy * scale.
// and, on the same launch shape, current FP8 scaling's two passes:
//   x_amax:     max |y| of the tensor and the rows' statistics, read-only
//               (RMSNorm, and LayerNorm at widths that are not a multiple of
//               a pack);
//   x_quantize: q = y / scale_inv from those statistics.
// A block is (threads per row, rows per block), as row_sum expects.
#include "common/async_copy.cuh"
#include "common/cluster.cuh"
#include "common/fp8.cuh"
#include "common/launch.cuh"
#include "common/norm_math.cuh"
#include "common/reduce.cuh"
#include "common/vec_io.cuh"
#include "launch.h"

namespace jrn::cuda {
namespace {

constexpr int kThreads = 256;

// The row a thread of a (threads per row, rows per block) block sums, and
// whether it exists (the last block's rows may not).
struct BlockRow {
  int64_t row;
  bool valid;
};
template <class Args>
__device__ __forceinline__ BlockRow block_row(const Args& a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  return {row, row < a.shape.rows};
}

// That row's gamma (its parameter group's), or null: none given, or no row.
template <class P, class Args>
__device__ __forceinline__ const P* row_gamma(const Args& a, int64_t row, bool valid) {
  return a.gamma && valid ? static_cast<const P*>(a.gamma) + a.shape.param_offset(row) : nullptr;
}

// That row's beta (LayerNorm's, where given), or null.
template <NormKind K, class P, class Args>
__device__ __forceinline__ const P* row_beta(const Args& a, int64_t row, bool valid) {
  return K == NormKind::kLayer && a.beta && valid ? static_cast<const P*>(a.beta) + a.shape.param_offset(row)
                                                  : nullptr;
}

// y of the N columns from `col` of a row with these statistics: x loaded,
// centred, scaled and shifted (parameters in loads of W elements).
template <int N, int W, class T, class P>
__device__ __forceinline__ void load_y(float (&v)[N], const T* x, int64_t col, float mean, float rstd, const P* gamma,
                                       const P* beta, bool zero_centered) {
  load_pack<N>(x + col, v);
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] -= mean;
  scale_shift_by<W>(v, rstd, gamma, beta, static_cast<int>(col), zero_centered);
}

// Threads per row of the gradient statistics: a thread per kRowPacks packs of
// the row, up to kThreads (x statistics: x_stats_threads below). Each thread
// loads one pack (of x, and of dy) at a time. These kernels only read, so
// what hides the loads' latency is many resident threads: with one pack at a
// time (24-40 registers) an SM holds 1536-2048 threads (docs/tuning.md,
// grad-stats-threads). The sums meet in the row's first thread only
// (row_sum_lead, one barrier), and RMSNorm's x statistics sum one value,
// not two (row-sum-lead).
constexpr int kRowPacks = 2;
inline int grad_stats_threads(int64_t nvec) {
  return static_cast<int>(std::min<int64_t>(kThreads, pow2_ceil(ceil_div(nvec, kRowPacks))));
}

// ADD: the statistics of h = x + residual, h stored as it is summed (the
// residual add + norm with the hidden dim split: one pass over x and the
// residual instead of XLA's add, then these statistics reading h again).
template <NormKind K, class T, int VEC, bool ADD = false>
__global__ void __launch_bounds__(kThreads) x_stats(StatsArgs a) {
  constexpr bool kLayer = K == NormKind::kLayer;
  constexpr int M = kLayer ? 2 : 1;  // LayerNorm: sum(d), sum(d^2); RMSNorm: sum(x^2)
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC;
  const auto [row, valid] = block_row(a);
  const T* x = static_cast<const T*>(a.x) + row * H;
  // N values of the row from column c: x, or h = x + residual, not yet
  // rounded to what h stores.
  auto load_row = [&]<int N>(int64_t c, float (&v)[N]) {
    load_pack<N>(x + c, v);
    if constexpr (ADD) add_residual<N, T>(v, a.residual, a.residual_f32, row * H + c);
  };
  const float shift = kLayer && valid ? layer_shift([&](int64_t c) {
    float v[1];
    load_row(c, v);
    if constexpr (ADD) round_as<1, T>(a.h_f32, v);
    return v[0];
  }, H) : 0.f;
  float acc[M] = {};
  for (int64_t p = threadIdx.x; valid && p < nvec; p += blockDim.x) {
    float v[VEC];
    load_row(p * VEC, v);
    // h stored, and v rounded to it: its statistics are those of h as stored.
    if constexpr (ADD) store_pack_as<VEC, T>(a.h, a.h_f32, row * H + p * VEC, v);
    if constexpr (kLayer) {
      add_row_sums<K>(acc, v, shift);
    } else {  // the float32 partial sum the caller combines (inf past float32)
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[0] += v[j] * v[j];
    }
  }
  row_sum_lead<M>(acc, smem);
  if (!valid || threadIdx.x != 0) return;
  if constexpr (kLayer) {
    const float2 mean_m2 = shifted_mean_m2(acc, shift, H);
    a.out[2 * row] = mean_m2.x;
    a.out[2 * row + 1] = mean_m2.y;
  } else {
    a.out[row] = acc[0];
  }
}

template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kThreads) grad_stats(StatsArgs a) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC;
  const auto [row, valid] = block_row(a);
  const T* x = static_cast<const T*>(a.x) + row * H;
  const T* dy = static_cast<const T*>(a.dy) + row * H;
  const P* gamma = row_gamma<P>(a, row, valid);
  const float rstd = valid ? a.rstd[row] : 0.f;
  const float mean = K == NormKind::kLayer && valid ? a.mean[row] : 0.f;
  constexpr int kSums = grad_sums_per_row(K);  // RMSNorm: sum(gdy * xhat) alone
  float acc[kSums] = {};
  for (int64_t p = threadIdx.x; valid && p < nvec; p += blockDim.x)
    add_grad_sums<VEC>(acc, x, dy, gamma, p * VEC, a.zero_centered, mean);
  grad_sums_scaled(acc, rstd);
  row_sum_lead<kSums>(acc, smem);
  if (valid && threadIdx.x == 0) {
#pragma unroll
    for (int m = 0; m < kSums; ++m) a.out[kSums * row + m] = acc[m];
  }
}

// f(Int<N>{}, Int<W>{}, col) for the pieces of a row of H elements from
// element `start` that this thread takes (every blockDim.x-th): N columns
// from `col`, their parameters in loads of W elements. CUT false: packs of
// VEC (H a multiple of VEC). CUT: the row cut at its 16-byte boundaries
// (cut_row; x's buffer 16-byte aligned), its packs' parameters in the widest
// loads that gamma's and beta's offset from the packs allows (param_width),
// the head's and tail's elements one at a time, as fwd_unaligned takes them.
template <int N, int W, class F>
__device__ __forceinline__ void each_piece_of(int64_t first, int64_t n, F& f) {
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) f(Int<N>{}, Int<W>{}, first + p * N);
}
template <int VEC, bool CUT, class P, class F>
__device__ __forceinline__ void each_piece(int64_t start, int64_t H, const P* gamma, const P* beta, F&& f) {
  if constexpr (CUT) {
    const auto [head, body, tail] = cut_row<VEC>(start, H);
    const auto at = reinterpret_cast<uintptr_t>(gamma ? gamma + head : nullptr) |
                    reinterpret_cast<uintptr_t>(beta ? beta + head : nullptr);
    with_constant<4, 2, 1>(param_width<P>(at), [&](auto w) { each_piece_of<VEC, decltype(w)::value>(head, body, f); });
    each_piece_of<1, 1>(0, head, f);
    each_piece_of<1, 1>(head + static_cast<int64_t>(body) * VEC, tail, f);
  } else {
    each_piece_of<VEC, VEC>(0, H / VEC, f);
  }
}

// Current scaling's measuring pass: max |y| of each row merged into amax of
// the row's tensor (zeroed before), and the row's statistics; x only read,
// on the x statistics' launch shape (below). Measured with the quantizing
// pass after it: see plan::plan_current (csrc/plan). CUT: rows whose
// width is not a multiple of a pack, cut as each_piece cuts them.
// RMSNorm: y = x * rstd * scale with rstd > 0 common to the row, so max |y| =
// rstd * max |x * scale|, and one reduction a row takes both sums.
// LayerNorm: y = (x - mean) * rstd * scale + beta needs the row's mean and
// rstd first: the shifted sums (layer_shift), then the row read again (L1
// and L2 hits) for max |y|, two reductions a row.
template <NormKind K, class T, class P, int VEC, bool CUT = false>
__global__ void __launch_bounds__(kThreads) x_amax(FwdArgs a) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden;
  const auto [row, valid] = block_row(a);
  const T* x = static_cast<const T*>(a.x) + row * H;
  const P* gamma = row_gamma<P>(a, row, valid);
  const P* beta = row_beta<K, P>(a, row, valid);
  const bool zc = a.zero_centered;
  // The row's first thread writes its statistics and merges its max |y|.
  auto finish = [&](float mean, float rstd, float row_max) {
    a.rstd[row] = rstd;  // what quantize_tiles normalizes with
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
    atomic_abs_max(a.amax + a.tensor_of(row), row_max);
  };
  if constexpr (K == NormKind::kRms) {
    float acc[3] = {};  // the pair of sums of squares, max |x * scale|
    if (valid) {
      each_piece<VEC, CUT>(row * H, H, gamma, beta, [&](auto n, auto w, int64_t c) {
        float v[decltype(n)::value];
        load_pack<decltype(n)::value>(x + c, v);
        add_sq_scaled_max<decltype(n)::value, decltype(w)::value>(acc, v, gamma, c, zc);
      });
    }
    acc[1] = scaled_sq_of(acc[0], [&] {
      float s = 0.f;
      if (valid) {
        each_piece<VEC, CUT>(row * H, H, gamma, beta, [&](auto n, auto, int64_t c) {
          float v[decltype(n)::value];
          load_pack<decltype(n)::value>(x + c, v);
          add_scaled_sq(s, v);
        });
      }
      return s;
    });
    row_sum<3, SqMaxOp, true>(acc, smem);
    if (valid && threadIdx.x == 0) {
      const float rstd = rms_rstd(acc[0], acc[1], a.eps, H);
      finish(0.f, rstd, max_abs(0.f, rstd * acc[2]));
    }
  } else {
    const float shift = valid ? layer_shift([&](int64_t c) {
      float v[1];
      load_pack<1>(x + c, v);
      return v[0];
    }, H) : 0.f;
    float acc[2] = {};  // the shifted sums
    if (valid) {
      each_piece<VEC, CUT>(row * H, H, gamma, beta, [&](auto n, auto, int64_t c) {
        float v[decltype(n)::value];
        load_pack<decltype(n)::value>(x + c, v);
        add_row_sums<K>(acc, v, shift);
      });
    }
    row_sum<2>(acc, smem);
    const float2 mean_m2 = shifted_mean_m2(acc, shift, H);
    const float mean = mean_m2.x, rstd = rsqrtf(mean_m2.y / static_cast<float>(H) + a.eps);
    float m[1] = {0.f};
    if (valid) {
      each_piece<VEC, CUT>(row * H, H, gamma, beta, [&](auto n, auto w, int64_t c) {
        float v[decltype(n)::value];
        load_y<decltype(n)::value, decltype(w)::value>(v, x, c, mean, rstd, gamma, beta, zc);
        for (float y : v) m[0] = max_abs(m[0], y);
      });
    }
    row_sum<1, AbsMaxOp, true>(m, smem);
    if (valid && threadIdx.x == 0) finish(mean, rstd, m[0]);
  }
}

// Current scaling's quantizing pass where quantize_tiles does not take it:
// q = y / scale_inv, y from the rows' statistics as the measuring pass wrote
// them and scale_inv in a.amax (amax_to_scale_inv). Reads x, writes q, with
// no reduction: each piece of the row (each_piece) loaded, normalized and
// stored on its own. CUT: at widths that are not a multiple of a pack, q's
// packs lie on 8-byte (float32 x: 4-byte) boundaries at the columns where
// x's lie on 16-byte ones.
template <NormKind K, class T, class P, int VEC, bool CUT>
__global__ void __launch_bounds__(kThreads) x_quantize(FwdArgs a) {
  const int64_t H = a.shape.hidden;
  const auto [row, valid] = block_row(a);
  if (!valid) return;
  const T* x = static_cast<const T*>(a.x) + row * H;
  const P* gamma = row_gamma<P>(a, row, valid);
  const P* beta = row_beta<K, P>(a, row, valid);
  const float mean = K == NormKind::kLayer ? a.mean[row] : 0.f, rstd = a.rstd[row];
  const float mul = 1.f / a.amax[a.tensor_of(row)];
  const bool zc = a.zero_centered;
  each_piece<VEC, CUT>(row * H, H, gamma, beta, [&](auto n, auto w, int64_t c) {
    float v[decltype(n)::value];
    load_y<decltype(n)::value, decltype(w)::value>(v, x, c, mean, rstd, gamma, beta, zc);
    store_q<decltype(n)::value>(a, row * H + c, v, mul);
  });
}

// Threads per row of x statistics: about kXRowPacks packs a thread, so that
// a warp or two sums a row of 2048-8192 bf16 and blocks carry several rows
// (a warp a row at least, where the row has the packs); more where the rows
// alone would not fill the GPU (kThreads a row at most; docs/tuning.md,
// x-stats-threads).
constexpr int kXRowPacks = 16;
inline int x_stats_threads(int64_t nvec, int64_t rows) {
  const int sms = std::max(device_attribute<cudaDevAttrMultiProcessorCount>(), 1);
  const int64_t fill = ceil_div(static_cast<int64_t>(sms) * 2048, std::max<int64_t>(rows, 1));
  const int64_t want = std::max({ceil_div(nvec, kXRowPacks), fill, std::min<int64_t>(nvec, 32)});
  return pow2_ceil(std::min<int64_t>(want, kThreads));  // kThreads is a power of two
}

}  // namespace

template <NormKind K, class T>
ffi::Error launch_stats(cudaStream_t stream, const StatsArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool add = a.residual != nullptr;
  const bool vec = a.shape.hidden % kVec == 0 && aligned16(a.x) && (!add || (aligned16(a.residual) && aligned16(a.h)));
  const int64_t nvec = a.shape.hidden / (vec ? kVec : 1);
  // With the residual: the gradient statistics' threads (two tensors' loads).
  const int tpr = add ? grad_stats_threads(nvec) : x_stats_threads(nvec, a.shape.rows);
  dim3 grid, block;
  JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, tpr, kThreads, &grid, &block));
  if (add) {
    if (vec) {
      x_stats<K, T, kVec, true><<<grid, block, 0, stream>>>(a);
    } else {
      x_stats<K, T, 1, true><<<grid, block, 0, stream>>>(a);
    }
  } else if (vec) {
    x_stats<K, T, kVec><<<grid, block, 0, stream>>>(a);
  } else {
    x_stats<K, T, 1><<<grid, block, 0, stream>>>(a);
  }
  return check_launch("x_stats");
}

template <NormKind K, class T, class P>
ffi::Error launch_grad_stats(cudaStream_t stream, const StatsArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = a.shape.hidden % kVec == 0 && aligned16(a.x) && aligned16(a.dy) &&
                   (!a.gamma || aligned16(a.gamma));
  dim3 grid, block;
  const int64_t nvec = a.shape.hidden / (vec ? kVec : 1);
  JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, grad_stats_threads(nvec), kThreads, &grid, &block));
  if (vec) {
    grad_stats<K, T, P, kVec><<<grid, block, 0, stream>>>(a);
  } else {
    grad_stats<K, T, P, 1><<<grid, block, 0, stream>>>(a);
  }
  return check_launch("grad_stats");
}

template <NormKind K, class T, class P>
ffi::Error launch_fwd_amax(cudaStream_t stream, const FwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = a.shape.hidden % kVec == 0 && aligned16(a.x) && params_aligned16(a);
  const bool cut = !vec && aligned16(a.x);  // rows cut at their 16-byte boundaries
  dim3 grid, block;
  const int64_t nvec = a.shape.hidden / (vec || cut ? kVec : 1);
  JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, x_stats_threads(nvec, a.shape.rows), kThreads, &grid, &block));
  if (vec) {
    x_amax<K, T, P, kVec><<<grid, block, 0, stream>>>(a);
  } else if (cut) {
    x_amax<K, T, P, kVec, true><<<grid, block, 0, stream>>>(a);
  } else {
    x_amax<K, T, P, 1><<<grid, block, 0, stream>>>(a);
  }
  return check_launch("x_amax");
}

template <NormKind K, class T, class P>
ffi::Error launch_quantize_rows(cudaStream_t stream, const FwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  if (!aligned16(a.x) || !aligned16(a.y)) return ffi::Error::Internal("jax_rmsnorm: x_quantize takes aligned x and q");
  const bool vec = a.shape.hidden % kVec == 0 && params_aligned16(a);
  dim3 grid, block;
  JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, x_stats_threads(a.shape.hidden / kVec, a.shape.rows), kThreads, &grid,
                               &block));
  if (vec) {
    x_quantize<K, T, P, kVec, false><<<grid, block, 0, stream>>>(a);
  } else {
    x_quantize<K, T, P, kVec, true><<<grid, block, 0, stream>>>(a);
  }
  return check_launch("x_quantize");
}

#define JRN_INSTANTIATE_AMAX(K, T, P)                                      \
  template ffi::Error launch_fwd_amax<K, T, P>(cudaStream_t, const FwdArgs&); \
  template ffi::Error launch_quantize_rows<K, T, P>(cudaStream_t, const FwdArgs&);
JRN_FOR_EACH_INSTANCE(JRN_INSTANTIATE_AMAX)
#define JRN_INSTANTIATE_GRAD_STATS(K, T, P) \
  template ffi::Error launch_grad_stats<K, T, P>(cudaStream_t, const StatsArgs&);
JRN_FOR_EACH_INSTANCE(JRN_INSTANTIATE_GRAD_STATS)
#define JRN_INSTANTIATE_STATS(K)                                                                \
  template ffi::Error launch_stats<K, float>(cudaStream_t, const StatsArgs&);                   \
  template ffi::Error launch_stats<K, __nv_bfloat16>(cudaStream_t, const StatsArgs&);           \
  template ffi::Error launch_stats<K, __half>(cudaStream_t, const StatsArgs&);
JRN_INSTANTIATE_STATS(NormKind::kRms)
JRN_INSTANTIATE_STATS(NormKind::kLayer)

}  // namespace jrn::cuda
