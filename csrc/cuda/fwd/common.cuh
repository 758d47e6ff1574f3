// Helpers of the forward kernels: x's loads (16-bit, float32 or FP8 codes),
// per-tensor amax merges, per-group FP8 group arithmetic, held-row sums.
#pragma once

#include <algorithm>

#include "../common/fp8.cuh"
#include "../common/norm_math.cuh"
#include "../common/reduce.cuh"
#include "../common/vec_io.cuh"

// Each family header puts its kernels in an anonymous namespace, as every
// unit that includes it compiles its own instances; a unit holds one
// direction (fwd or bwd), whose constants it names unqualified.
namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

// A per-group output's instances: float32 scales (kGroup) or a block rule
// (kBlock, norm_types.h).
constexpr bool per_group(Quant q) { return q == Quant::kGroup || q == Quant::kBlock; }
// The output as plans name it: kBlock's instances are those of kGroup.
constexpr Quant plan_quant(Quant q) { return q == Quant::kBlock ? Quant::kGroup : q; }

// The static identity (plan::FwdKey) of the instances of these parameters.
template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ = false>
constexpr plan::FwdKey fwd_key() {
  return {K, plan_quant(Q), dtype_of<T>(), dtype_of<P>(), VEC, XQ};
}

// The per-group scales of fwd_regs, fwd_slices and fwd_tiles, whose groups are a
// power of two of lanes (at most 32) times VEC columns: the group's first
// lane writes its scale, found with shifts and masks rather than divisions
// and remainders (docs/tuning.md, pow2-groups).
struct Pow2Groups {
  int shift;      // log2 of the group size
  int lane_mask;  // lanes per group - 1
  __device__ Pow2Groups(int64_t group, int vec) {
    shift = __ffsll(group) - 1;
    lane_mask = static_cast<int>(group / vec) - 1;
  }
  __device__ bool leader() const { return (static_cast<int>(threadIdx.x) & lane_mask) == 0; }
  // The index of element e's scale (a row is whole groups): one shift of the
  // q store's own index, which ptxas keeps where registers are short (see
  // docs/tuning.md, pow2-groups).
  __device__ int64_t index(int64_t e) const { return e >> shift; }
  // The abs-max of m over the group's lanes (lane_mask is uniform over the
  // warp): the usual groups (16 lanes: 128 columns of 16-bit x; 2 or 4
  // lanes: 16 or 32) in straight runs of shuffles behind one branch, the
  // others a step at a time, each behind a branch of its own.
  __device__ float max_over_lanes(float m) const {
    auto step = [&](int off) { m = abs_max(m, __shfl_xor_sync(0xffffffffu, m, off)); };
    if (lane_mask == 15) {
      step(8), step(4), step(2), step(1);
    } else if (lane_mask == 1) {
      step(1);
    } else if (lane_mask == 3) {
      step(2), step(1);
    } else {
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        if (off <= lane_mask) step(off);
      }
    }
    return m;
  }
};

// Loads VEC elements of x at (row, col) as floats: T values, or with XQ (FP8
// input) FP8 codes times their group's scale. A pack lies within one group
// (the launcher makes the group size a multiple of VEC). Columns and group
// sizes are below 2^31 (checked by the launchers): 32-bit arithmetic.
template <bool XQ, int VEC, class T>
__device__ __forceinline__ void load_x(const FwdArgs& a, int64_t row, int col, float (&v)[VEC]) {
  const int64_t idx = row * a.shape.hidden + col;
  if constexpr (XQ) {
    load_fp8<VEC>(static_cast<const uint8_t*>(a.x) + idx, a.x_fmt, v);
    const int group = static_cast<int>(a.x_group);
    const float s = __ldg(a.x_scale + row * (a.shape.hidden / group) + col / group);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] *= s;
  } else {
    load_pack<VEC>(static_cast<const T*>(a.x) + idx, v);
  }
}

// Merges this thread's max |y| `m` into amax of its row's tensor with no
// barrier: the max over a warp's lanes of the row (a row's threads, or a
// warp of them), then an atomic from its first lane where that max exceeds
// `seen`, amax as loaded at the kernel's start (amax only grows, so an atomic
// skipped could not have raised it). CTAs of several rows (blockDim.y > 1),
// all of one tensor, merge over the CTA first (a barrier, then one atomic
// from thread 0), so that narrow rows do not send an atomic each to one
// address (docs/tuning.md, merge-amax). Every thread of the CTA must call
// this (no thread has returned); `smem`, kRowSumSmem floats free for it, or
// null for CTAs of one row.
__device__ __forceinline__ void merge_amax(const FwdArgs& a, int64_t row, float m, float seen,
                                           float* smem = nullptr) {
  float mm[1] = {m};
  const int threads = static_cast<int>(blockDim.x * blockDim.y);
  const int64_t first = row - threadIdx.y;  // the CTA's first row (valid)
  const int64_t last = std::min<int64_t>(first + blockDim.y, a.shape.rows) - 1;
  if (smem != nullptr && blockDim.y > 1 && threads % 32 == 0 && a.tensor_of(first) == a.tensor_of(last)) {  // uniform over the CTA
    const int t = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
    warp_sum<1>(mm, 32, AbsMaxOp{});
    if (t % 32 == 0) smem[t / 32] = mm[0];
    __syncthreads();
    if (t < 32) {
      mm[0] = t < threads / 32 ? smem[t] : 0.f;
      warp_sum<1>(mm, 32, AbsMaxOp{});
      if (t == 0) atomic_abs_max(a.amax + a.tensor_of(first), mm[0], seen);
    }
    return;
  }
  const int lanes = blockDim.x < 32 ? static_cast<int>(blockDim.x) : 32;
  warp_sum<1>(mm, lanes, AbsMaxOp{});
  if (threadIdx.x % lanes == 0 && row < a.shape.rows) atomic_abs_max(a.amax + a.tensor_of(row), mm[0], seen);
}

// The sum of a row's packs held by a thread, after `init` (packs it does not
// hold are zeros).
template <int ITEMS, int VEC>
__device__ __forceinline__ float held_sum(const float (&v)[ITEMS][VEC], float init) {
  float sum = init;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += v[i][j];
  }
  return sum;
}

// The held packs (in[i]) less the row's mean, and the sum of their squares.
template <int ITEMS, int VEC>
__device__ __forceinline__ float center_held(float (&v)[ITEMS][VEC], const bool (&in)[ITEMS], float mean) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (in[i]) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[i][j] -= mean;
        ss += v[i][j] * v[i][j];
      }
    }
  }
  return ss;
}

// The held packs centred on a RowMean: float32 x in two subtractions,
// 16-bit x in one (RowMean says why).
template <class T, int ITEMS, int VEC>
__device__ __forceinline__ void center_held_on(float (&v)[ITEMS][VEC], const bool (&in)[ITEMS], RowMean mean) {
  if constexpr (sizeof(T) == 4) {
    center_held(v, in, mean.base);
    center_held(v, in, mean.rest);
  } else {
    center_held(v, in, mean.value());
  }
}

}  // namespace
}  // namespace jrn::cuda
