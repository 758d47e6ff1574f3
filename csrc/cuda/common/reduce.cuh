// Reductions: the operators (sums, NaN-keeping maxima of |y|), the atomic
// max of amax, and sums over a warp, a row of threads and a CTA.
#pragma once

#include <cstdint>

#include "base.cuh"

namespace jrn::cuda {

// max of non-negative floats (|y|) by their bits; a NaN (positive bits above
// infinity's) wins, so it reaches amax and the scales instead of vanishing.
__device__ __forceinline__ float abs_max(float a, float b) {
  return __int_as_float(max(__float_as_int(a), __float_as_int(b)));
}
// max(m, |v|) for a non-negative m, NaN propagated (max.NaN: one FMNMX with
// the |v| operand modifier, where abs_max(m, fabsf(v)) takes two).
__device__ __forceinline__ float max_abs(float m, float v) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v)));
  return r;
}
// Reduction operators, applied to value m of the M reduced at once.
struct SumOp {
  __device__ __forceinline__ float operator()(int, float a, float b) const { return a + b; }
};
struct AbsMaxOp {
  __device__ __forceinline__ float operator()(int, float a, float b) const { return abs_max(a, b); }
};
// Values 0..S-1 summed, the next a maximum of absolute values (one
// reduction for all).
template <int S>
struct SumsAbsMaxOp {
  __device__ __forceinline__ float operator()(int m, float a, float b) const { return m < S ? a + b : abs_max(a, b); }
};
using SumAbsMaxOp = SumsAbsMaxOp<1>;

// *p = abs_max(*p, v) for a non-negative v; *p must start non-negative
// (zeroed in the stream before the kernel). Skips the atomic when *p is
// already at least v (it only grows).
__device__ __forceinline__ void atomic_abs_max(float* p, float v) {
  const int bits = __float_as_int(v);
  if (bits > *reinterpret_cast<volatile int*>(p)) atomicMax(reinterpret_cast<int*>(p), bits);
}
// The same against `seen`, *p as read earlier (load_seen, with the kernel's
// first loads): no load at the end, where the warp would wait for it.
__device__ __forceinline__ float load_seen(const float* p) { return *reinterpret_cast<const volatile float*>(p); }
__device__ __forceinline__ void atomic_abs_max(float* p, float v, float seen) {
  const int bits = __float_as_int(v);
  if (bits > __float_as_int(seen)) atomicMax(reinterpret_cast<int*>(p), bits);
}

// ---- Reductions over the threads of one row.
//
// A block is (threads_per_row, rows_per_block). Threads of one row are
// consecutive lanes (threads_per_row <= 32) or whole warps (> 32).
// row_sum<M> sums M values at once, so LayerNorm pays one barrier pair for two
// sums (and RMSNorm for its pair of sums of squares and a max). `smem` holds kRowSumSmem floats (one per warp of the block and value).
// Every thread of the block must call it (it may contain __syncthreads).

constexpr int kMaxBlockWarps = 32;
constexpr int kRowSumSmem = kMaxBlockWarps * 3;

// Op (default: sum) combines two values; row_sum<M, AbsMaxOp> takes row maxima.
template <int M, class Op = SumOp>
__device__ __forceinline__ void warp_sum(float (&v)[M], int width, Op op = {}) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if (off < width) {
#pragma unroll
      for (int m = 0; m < M; ++m) v[m] = op(m, v[m], __shfl_xor_sync(0xffffffffu, v[m], off));
    }
  }
}

// LEAD: only the row's first thread (threadIdx.x == 0) gets the total, the
// others keep their partials; one barrier instead of two, for kernels that
// end after the sum (smem is not reused).
// BUTTERFLY (row_sum_wide): the warps' partials are added by a butterfly
// over a warp, lane w taking warp w's, in every warp alike (commuted pairs
// give equal sums, so every thread gets the same bits), instead of a loop
// over the warps in every thread: with 16 warps and two sums about 20
// instructions a thread and row instead of about 100.
// WARPS: the most warps a row may have (M values of each fit kRowSumSmem).
// WHOLE_WARPS: the row is whole warps (at least one), so the shuffles within
// a warp test no width.
template <int M, class Op = SumOp, bool LEAD = false, bool BUTTERFLY = false, int WARPS = kMaxBlockWarps,
          bool WHOLE_WARPS = false>
__device__ __forceinline__ void row_sum(float (&v)[M], float* smem, Op op = {}) {
  static_assert(M * WARPS <= kRowSumSmem, "row_sum: scratch too small");
  static_assert(!(LEAD && BUTTERFLY), "row_sum: LEAD adds in one thread");
  const int tpr = blockDim.x;
  warp_sum<M>(v, WHOLE_WARPS ? 32 : (tpr < 32 ? tpr : 32), op);
  if (tpr <= 32) return;
  const int warps = tpr / 32, lane = threadIdx.x % 32;
  float* mine = smem + threadIdx.y * warps * M;  // this row's warps
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) mine[(threadIdx.x / 32) * M + m] = v[m];
  }
  __syncthreads();
  if (LEAD && threadIdx.x != 0) return;
  if constexpr (BUTTERFLY) {
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = lane < warps ? mine[lane * M + m] : 0.f;  // 0: identity of every Op
    warp_sum<M>(v, 32, op);
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = mine[m];
      for (int w = 1; w < warps; ++w) s = op(m, s, mine[w * M + m]);  // same order in every thread
      v[m] = s;
    }
  }
  if (!LEAD) __syncthreads();  // smem may be reused right after
}

// For CTAs of many warps (fwd_decode); fwd_slices and bwd_slices, whose
// CTAs are whole warps, take cta_sum below, the same butterfly. Not in
// fwd_regs (up to 32 warps a row): there ptxas then put each of a row's
// loads in a branch of its own with its unpacking, so that they waited for
// each other (docs/tuning.md, row-sum-wide).
template <int M, class Op = SumOp, int WARPS = kMaxBlockWarps>
__device__ __forceinline__ void row_sum_wide(float (&v)[M], float* smem, Op op = {}) {
  row_sum<M, Op, false, true, WARPS>(v, smem, op);
}

// row_sum_wide for CTAs of whole warps (fwd_slices, bwd_slices).
template <int M, class Op = SumOp, int WARPS = kMaxBlockWarps>
__device__ __forceinline__ void cta_sum(float (&v)[M], float* smem, Op op = {}) {
  row_sum<M, Op, false, true, WARPS, true>(v, smem, op);
}

template <int M>
__device__ __forceinline__ void row_sum_lead(float (&v)[M], float* smem) {
  row_sum<M, SumOp, true>(v, smem);
}

}  // namespace jrn::cuda
