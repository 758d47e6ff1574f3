// Forward kernels: y = (x - mean) * rstd * scale + beta, saving mean/rstd.
//
// The kernels:
//  * fwd_decode: the norm, with or without the residual add, at decode-time
//    row counts (at most two rows per SM): one row per CTA, few instructions
//    per warp.
//  * fwd_regs: the row is read once into registers (up to 4 packs of 16 bytes
//    per thread): several rows per CTA, one CTA per row, or, for wide rows,
//    one thread block cluster per row (each CTA holds a slice; the row sums
//    are combined through distributed shared memory).
//  * fwd_slices (sm_90+): rows too wide for one CTA, and per-tensor FP8
//    output from 2048 columns (bf16; LayerNorm's from 1024): persistent CTAs
//    (clusters for wide rows) walk the rows, each CTA's slice of the next row
//    bulk-copied into shared memory while the current one is normalized
//    (LayerNorm's plain forward across a cluster stages gamma and beta there
//    too; RMSNorm's plain forward copies each thread's packs itself).
//  * fwd_stream: one CTA per row, the row streamed twice (the second read is
//    served mostly by L2); used for rows too wide or unaligned for the above.
//  * fwd_add_stats + fwd_apply: rows wider than one CTA with a residual (and
//    rows enough) or with given statistics: h and the row's statistics in one
//    pass, then y from h (or x) in a second, a row split across CTAs.
//
// fwd_regs and fwd_stream take the fused variants (norm_fused.h; fwd_slices
// also the FP8 outputs without a residual, fwd_decode the residual add):
// with XQ, x is FP8 with a scale per group of columns, dequantized as it is
// loaded; with a residual, the row is h = x + residual (stored, then
// normalized as stored); with Q != kNone, y is written as FP8: times the
// given per-tensor scale (max |y| atomically merged into amax), or divided
// by a scale computed from the row's / the group's own max |y| (row maxima
// with the row-sum machinery; groups of up to 32 lanes by shuffles in
// fwd_regs, a thread per group in fwd_stream). Current scaling (a scale
// from the tensor's own amax) takes a measuring and a quantizing pass
// (launch_fwd_current below), the per-tensor kernels where the kernels of
// norm_stats.cu and fp8_transpose.cu do not take them.
//
// FP8 input without a residual takes fwd_fp8_regs where the row fits: the
// codes held raw in registers, decoded for each pass.
//
// With `given_stats` (the hidden dim split across devices) both take mean and
// rstd from their inputs instead of the row and write only y.
//
// This header is the forward's code; six translation units instantiate
// launch_fwd, one for each normalization and type of x
// (norm_fwd_{rms,layer}_{f32,bf16,f16}.cu), and compile in parallel: the
// forward's kernels are most of the build, and its longest file took 86 s
// as two units (an H200 machine's cold build).
#pragma once

#include "device_utils.cuh"
#include "launch.h"

#include <algorithm>
#include <type_traits>

namespace jrn::cuda {
namespace {

constexpr int kRegItems = 4;        // packs per thread in fwd_regs
constexpr int kMaxRowThreads = 1024;
constexpr int kStreamThreads = 512;
constexpr int kBlockThreads = 256;  // target CTA size for narrow rows
constexpr int kClusterCtaThreads = 512;
// FP8 output keeps more live per thread: at most this many threads per CTA
// (wider rows take clusters), and at least two such CTAs resident per SM. The
// register cap this implies (64) costs 24-148 bytes of spills in the bf16/fp16
// variants, and pays for itself: measured on an H200 at 32768x4096 bf16,
// per-tensor FP8 went from 407 to 249 us, per-row from 264 to 219 us,
// per-group from 398 to 260 us (at 79-87 registers only two 256-thread CTAs
// fit an SM, half the loads in flight of the plain norm).
constexpr int kQuantRowThreads = 512;
constexpr int kQuantMinBlocks = 2;
// fwd_regs with parameters loaded early (EARLY, below): at most this many
// threads per CTA (the register cap that leaves is 128; 80-109 registers used
// for bf16, no spill).
constexpr int kEarlyThreads = 512;
constexpr int kDecodeThreads = 128;  // target CTA size where the rows are few (below)
constexpr int kDecodeItems = 2;      // packs per thread in fwd_decode
constexpr int kDecodeWideThreads = 512;  // fwd_decode's CTA for rows of more packs (twice the items)
constexpr int kDecodeMaxParts = 4;       // CTAs a row in fwd_decode, at most
constexpr int kDecodeSplitMinThreads = 512;  // RMSNorm's decode rows split from CTAs of this many threads

// The per-group FP8 scales of fwd_regs and fwd_slices, whose groups are a
// power of two of lanes (at most 32) times VEC columns: the group's first
// lane writes its scale, found with shifts and masks; the divisions and
// remainders these replace took about 60 instructions a pack. With index's
// one shift, the straight runs of max_over_lanes and RMSNorm's rstd a pack
// (fwd_slices, kLateRstd), same-call A/B on an H200, bf16, groups of 128, us:
// LayerNorm 131072x1024 155.3 -> 141.8, 32768x4096 163.2 -> 148.7, 8192x16384
// 152.7 -> 142.4; RMSNorm 135.2 -> 132.4, 129.1 -> 121.5, 133.4 -> 125.5;
// groups of 16 at 32768x4096 LayerNorm 157.6 / 158.2 -> 146.4 / 146.0,
// RMSNorm 128.6 / 132.0 -> 127.7 / 127.5. Nsight Compute at 32768x4096:
// 117.3 -> 108.0 M instructions (LayerNorm), 91.3 -> 80.5 M (RMSNorm).
// RESULTS.md 6zh.
struct Pow2Groups {
  int shift;      // log2 of the group size
  int lane_mask;  // lanes per group - 1
  __device__ Pow2Groups(int64_t group, int vec) {
    shift = __ffsll(group) - 1;
    lane_mask = static_cast<int>(group / vec) - 1;
  }
  __device__ bool leader() const { return (static_cast<int>(threadIdx.x) & lane_mask) == 0; }
  // The index of element e's scale (a row is whole groups): one shift of the
  // q store's own index. Row times groups a row plus the column's group,
  // which ptxas rematerialized at each pack's store where registers are
  // short, took 7 instructions more a pack (LayerNorm's bf16 ONE_CTA sm_90).
  __device__ int64_t index(int64_t e) const { return e >> shift; }
  // The abs-max of m over the group's lanes (lane_mask is uniform over the
  // warp): the usual groups (16 lanes: 128 columns of 16-bit x; 2 lanes: 16)
  // in straight runs of shuffles behind one branch, the others a step at a
  // time, each behind a branch of its own.
  __device__ float max_over_lanes(float m) const {
    auto step = [&](int off) { m = abs_max(m, __shfl_xor_sync(0xffffffffu, m, off)); };
    if (lane_mask == 15) {
      step(8), step(4), step(2), step(1);
    } else if (lane_mask == 1) {
      step(1);
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
// skipped could not have raised it). It replaced a CTA-wide max (two
// barriers) and one atomic a row after a load of amax, at the CTA's end.
// Same-call A/B on an H100, bf16 residual add + per-tensor FP8, us, two
// rounds, before -> after: 32768x4096 362.9 / 366.0 -> 354.9 / 351.2,
// 16384x8192 363.2 / 361.8 -> 356.6 / 354.9, 8192x16384 392.4 / 387.5 ->
// 372.5 / 388.8, 131072x1024 (rows of a warp or less: no barrier before
// either) level, 349.0 / 349.6 -> 351.2 / 350.4. fwd_apply merges the same
// way (its CTA-wide max and load of amax at the end were level with it: the
// two-pass residual add + per-tensor FP8, 2048x65536 442.6 / 442.3 ->
// 441.2 / 438.2 us; the hidden-slice apply, 8192x16384, 469.8 / 469.4 ->
// 467.5 / 468.9).
//
// CTAs of several rows (blockDim.y > 1), all of one tensor, merge over the
// CTA first (a barrier, then one atomic from thread 0): with one atomic a
// row, narrow rows send one to amax's address per row, 131072 at 1024 wide.
// Same-call A/B on an H200, bf16, us, two rounds: rms_fp8 131072x1024
// 145.3 / 144.6 -> 140.9 / 142.0, the other per-tensor cells level (RESULTS.md
// 1t): 2-3%, so the atomics are not that kernel's main cost. Every thread of the CTA
// must call this (no thread has returned); `smem`, kRowSumSmem floats free
// for it, or null for CTAs of one row.
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

// fwd_regs takes LayerNorm's statistics in one pass only in rows of at least
// this many threads (see there).
constexpr int kOnePassMinThreads = 128;

// LayerNorm's plain forward of 16-bit x with float32 parameters, in rows of
// exactly kP32Threads or kP32RowThreads threads (hidden 3080-4096 or
// 1032-2048 in packs of 8), runs in an instance of its own (P32): CTAs of
// kP32Threads (one row or two), kP32MinCtas of them resident, so a register
// cap of 72 rather than 64, where its one-pass statistics fit without
// spilling, from rows of kP32RowThreads. Same-call A/B on an H200, two
// rounds, us (RESULTS.md 1za): 32768x4096 bf16 x 162.9 / 163.4 -> 157.3 /
// 159.1, float16 x 165.3 / 162.3 -> 156.2 / 157.9, zero-centred 165.2 /
// 164.9 -> 158.6 / 158.9, 37449x3584 172.4 / 167.8 -> 162.4 / 164.8;
// 65536x2048 bf16 159.3 / 160.0 -> 153.6 / 158.1, float16 159.0 / 158.4 ->
// 155.4 / 155.1. There with two passes it lost 3% (163.2 / 163.6); rows of
// 32 and 96 threads keep the general instance (not measured in this one).
// Not kept: CTAs of 256 threads, three resident (72 registers): 4096 8%
// slower, 8192 10% (176-182 us); in those, the next pack's parameters loaded
// before the previous pack's store (two buffers) took 80 registers, spilled
// 16 bytes and lost more (180.8 us at 4096); rows of 8192 in clusters of two
// P32 CTAs: 166.8 -> 220-222 us.
// The same instance (CTAs of kP32Threads, kP32MinCtas resident) also takes
// RMSNorm's per-row FP8 of 16-bit x with parameters in x's dtype, in rows of
// 16 to kP32RowThreads threads (see there). Both are chosen by p32_row_threads.
constexpr int kP32Threads = 128;
constexpr int kP32RowThreads = 64;
constexpr int kP32MinCtas = 7;
static_assert(kP32Threads >= kOnePassMinThreads, "the P32 instance exists for its one-pass statistics");

template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ, bool EARLY = false, bool P32 = false>
__global__ void __launch_bounds__(P32     ? kP32Threads
                                  : EARLY ? kEarlyThreads
                                  : Q == Quant::kNone ? kMaxRowThreads
                                                      : kQuantRowThreads,
                                  P32 ? kP32MinCtas : Q == Quant::kNone ? 1 : kQuantMinBlocks)
    fwd_regs(FwdArgs a, int cluster_arg) {
  // EARLY launches are never clustered: a constant 1 spares their prologue two
  // integer divisions by the runtime cluster size (about 45 instructions).
  const int cluster = EARLY ? 1 : cluster_arg;
  __shared__ float smem[kRowSumSmem];
  __shared__ float xchg[2][1];
  __shared__ float xchg2[1][2];  // LayerNorm's one-pass sums across a cluster
  const int64_t H = a.shape.hidden;
  // With clusters, CTA `rank` of the cluster holds vectors [rank * slice, (rank + 1) * slice).
  // Columns are ints (hidden < 2^31, checked by the launcher): 64-bit column
  // arithmetic was most of this kernel's integer instructions, and its spills.
  const int rank = cluster > 1 ? static_cast<int>(blockIdx.x % cluster) : 0;
  const int64_t row = static_cast<int64_t>(blockIdx.x / cluster) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  // Per-tensor FP8: the scale loaded with x, not after the reductions, where
  // the stores waited for it (an L2 round trip a row); inverted (tensor_mul)
  // only after them, so that the division does not wait for the load.
  float tensor_scale = 0.f, amax_seen = 0.f;
  if (Q == Quant::kTensor && valid && !a.no_output) tensor_scale = a.scale[a.tensor_of(row)];
  if (Q == Quant::kTensor && valid && a.amax) amax_seen = load_seen(a.amax + a.tensor_of(row));
  const int col0 = (rank * static_cast<int>(blockDim.x) * kRegItems + static_cast<int>(threadIdx.x)) * VEC;
  const int col_step = static_cast<int>(blockDim.x) * VEC;
  auto column = [&](int i) { return col0 + i * col_step; };
  bool in[kRegItems];  // pack i is a column of a valid row
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) in[i] = valid && column(i) < H;

  // Every load of the row is issued before any is used (no branch or store
  // between them): the packs are in flight together. The residual, if any,
  // is added in a second loop of loads, and h stored in a third.
  float v[kRegItems][VEC];
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    if (in[i]) {
      load_x<XQ, VEC, T>(a, row, column(i), v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
  }
  // EARLY (launches of few CTAs: decode-time row counts; no residual): each
  // pack's gamma/beta loaded into registers with x, before the reductions.
  // Loaded after them, next to the stores of y, they wait an L2 round trip per
  // pack, as the compiler does not move a load above the store of the pack
  // before it (they could alias). In larger launches the registers this takes
  // cost occupancy (LayerNorm, 32768x4096: 193 -> 250 us).
  Pack<P, VEC> pg[kRegItems], pb[kRegItems];
  if constexpr (EARLY) {
    const int64_t poff = a.shape.param_offset(row);
    const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
    const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) {
        if (gamma) pg[i] = *reinterpret_cast<const Pack<P, VEC>*>(gamma + column(i));
        if (beta) pb[i] = *reinterpret_cast<const Pack<P, VEC>*>(beta + column(i));
      }
    }
  }
  if (!EARLY && a.residual) {  // EARLY launches take no residual
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) add_residual<VEC, T>(v[i], a.residual, a.residual_f32, row * H + column(i));
    }
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) store_h_as<VEC, T>(a.no_output ? nullptr : a.h, a.h_f32, row * H + column(i), v[i]);
    }
  }
  // RMSNorm's per-row FP8 (P32 CTAs): the row's max |x * scale| is reduced
  // with its sum of squares, one reduction a row (max |y| = rstd * that max),
  // and x * scale stays in v for the output.
  if constexpr (P32 && K == NormKind::kRms && Q == Quant::kRow) {
    const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + a.shape.param_offset(row) : nullptr;
    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) add_sq_scaled_max<VEC>(acc, v[i], gamma, column(i), a.zero_centered, v[i]);
    }
    row_sum<2>(acc, smem, SumAbsMaxOp{});
    const float rstd = rsqrtf(acc[0] / static_cast<float>(H) + a.eps);
    const float scale = quant_scale(rstd * acc[1], a.fp8, a.scale_ub);
    const float inv = 1.f / scale;
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) {
        float y[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) y[j] = v[i][j] * rstd;
        store_q<VEC>(a, row * H + column(i), y, inv);
      }
    }
    if (valid && threadIdx.x == 0) {
      a.qscale[row] = scale;
      a.rstd[row] = rstd;
    }
    return;
  }
  // LayerNorm's statistics, two ways.
  // - One pass: sum(d) and sum(d^2) with d = v - layer_shift (the median of
  //   the row's first, middle and last elements), one reduction, then the held
  //   packs centred on the mean. bf16 ln_fwd, H200, same-call A/B, two rounds
  //   (RESULTS.md 1v): 8192x16384 (512 threads a row) 163.8/164.1 ->
  //   157.4/156.9 us, float32 32768x4096 (256) 277.7/277.2 -> 269.1/270.6.
  // - Two exact passes over the held row (sum, then the centred squares), two
  //   reductions:
  //   - with a residual: the shift's three loads read x and the residual again
  //     (add_ln 32768x4096 +2.6%, RESULTS.md 1u);
  //   - in rows of fewer than kOnePassMinThreads threads (blockDim.x, uniform
  //     over the CTA; kP32RowThreads in the P32 instance): one pass lost 2%
  //     at 131072x1024 (32 threads a row, RESULTS.md 1u). Rows of 128
  //     threads take one pass: same-call A/B, two rounds, us (RESULTS.md
  //     1w): bf16 32768x4096 149.3/150.4 -> 146.0/146.2, float16
  //     150.1/150.1 -> 146.2/146.4, float32 65536x2048 272.0/272.7 ->
  //     268.7/270.8;
  //   - with float32 parameters on 16-bit x, except in the P32 instance: at
  //     64 registers the one-pass instance spills 16 bytes and lost 6% at
  //     32768x4096 (RESULTS.md 1v).
  // Not kept (RESULTS.md 6ze): each warp's count, mean and M2 by shuffles,
  // merged across warps by a butterfly; 32768x4096 155.2 -> 184.8 us.
  constexpr bool kLayerOnePass = K == NormKind::kLayer && (std::is_same_v<T, P> || P32);
  const bool two_passes =
      !kLayerOnePass || (!EARLY && a.residual) || blockDim.x < (P32 ? kP32RowThreads : kOnePassMinThreads);
  float mean = 0.f;
  float ss[1];
  if (two_passes) {
    if constexpr (K == NormKind::kLayer) {
      float sum[1] = {held_sum(v, 0.f)};
      row_sum<1>(sum, smem);
      if (cluster > 1) cluster_sum<1>(sum, xchg, 0);
      mean = sum[0] / static_cast<float>(H);
      if (a.given_stats && valid) mean = a.mean[row];
    }
    ss[0] = center_held(v, in, mean);
    row_sum<1>(ss, smem);
    if (cluster > 1) {
      cluster_sum<1>(ss, xchg, 1);
      if (Q != Quant::kRow) cluster_done();
    }
  } else if constexpr (kLayerOnePass) {
    float shift = 0.f;
    if (valid) {
      shift = layer_shift(
          [&](int64_t c) {
            float e[1];
            load_x<XQ, 1, T>(a, row, static_cast<int>(c), e);
            return e[0];
          },
          H);
    }
    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) add_shifted_sums<2>(acc, v[i], shift);
    }
    row_sum<2>(acc, smem);
    if (cluster > 1) {
      cluster_sum<2>(acc, xchg2, 0);
      if (Q != Quant::kRow) cluster_done();
    }
    const float2 mm2 = shifted_mean_m2(acc, shift, H);
    mean = mm2.x;
    ss[0] = mm2.y;
    if (a.given_stats && valid) mean = a.mean[row];
    center_held(v, in, mean);  // its sum of squares unused here
  }
  const float rstd = a.given_stats ? (valid ? a.rstd[row] : 0.f) : rsqrtf(ss[0] / static_cast<float>(H) + a.eps);
  if (Q == Quant::kNone && !valid) return;

  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;  // RMSNorm has none
  float m = 0.f;  // max |y| of this thread's columns
  if (Q == Quant::kTensor && a.scale_inverted && valid && !a.no_output) tensor_scale = 1.f / tensor_scale;
  // `plain`: gamma (and LayerNorm's beta) given and not zero-centred, with
  // nothing left to decide a pack: v * rstd * g (+ b in the same fma). The
  // general case pays for the others in every pack (placeholder ones for a
  // missing gamma, predicated zero-centred adds, beta's add apart): 85 SASS
  // instructions a LayerNorm bf16 pack against 54 here, 80 against 43 for
  // RMSNorm. Same-call A/B on an H200, bf16, us, one loop -> two (RESULTS.md
  // 1q): LayerNorm 131072x1024 145.5 -> 140.1, 32768x4096 157.3 -> 147.9,
  // 16384x8192 162.5 -> 150.9, 8192x16384 177.2 -> 163.2; RMSNorm level or
  // faster (138.4 -> 138.1 ... 146.1 -> 142.2). Not for the FP8 outputs:
  // this kernel takes LayerNorm's only below kSliceOneCtaMinVecs packs (1024
  // bf16 elements), and with the loop their instances spilled up to 28 bytes
  // more (a build tried and measured, RESULTS.md 1q); RMSNorm's spilled 24-84.
  auto apply = [&](auto plain) {
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      const int col = column(i);
      if (in[i]) {
        if constexpr (decltype(plain)::value) {
          float g[VEC];
          load_pack<VEC>(gamma + col, g);
          if constexpr (K == NormKind::kLayer) {
            float b[VEC];
            load_pack<VEC>(beta + col, b);
            scale_shift_plain<false>(v[i], 0.f, rstd, g, b);  // the mean is already off
          } else {
            scale_plain(v[i], rstd, g);
          }
        } else if constexpr (EARLY) {
          // Copies: passing &pg[i] itself put pg/pb in local memory (stack frames
          // of up to 256 bytes in the ptxas report).
          const Pack<P, VEC> g = pg[i], b = pb[i];
          scale_shift_packs<VEC>(v[i], 0.f, rstd, g, gamma != nullptr, b, beta != nullptr, a.zero_centered);
        } else {
          scale_shift<VEC>(v[i], 0.f, rstd, gamma, beta, col, a.zero_centered);  // the mean is already off
        }
        if constexpr (Q == Quant::kNone) {
          store_pack<VEC>(static_cast<T*>(a.y) + row * H + col, v[i]);
        } else if constexpr (Q == Quant::kTensor) {
          if (!a.no_output) store_q<VEC>(a, row * H + col, v[i], tensor_scale);
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
      }
      if constexpr (Q != Quant::kNone) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) m = max_abs(m, v[i][j]);
      }
    }
  };
  if constexpr (!EARLY && Q == Quant::kNone) {  // the plain outputs of many rows
    if (plain_params<K>(gamma, beta, a.zero_centered)) {
      apply(std::true_type{});
    } else {
      apply(std::false_type{});
    }
  } else {
    apply(std::false_type{});
  }
  if constexpr (Q == Quant::kTensor) {
    if (a.amax) merge_amax(a, row, m, amax_seen, smem);
  } else if constexpr (Q == Quant::kRow) {
    float mm[1] = {m};
    row_sum<1>(mm, smem, AbsMaxOp{});
    if (cluster > 1) {
      cluster_sum<1>(mm, xchg, 0, AbsMaxOp{});
      cluster_done();
    }
    const float scale = quant_scale(mm[0], a.fp8, a.scale_ub);
    const float inv = 1.f / scale;
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) store_q<VEC>(a, row * H + column(i), v[i], inv);
    }
    if (valid && threadIdx.x == 0 && rank == 0) a.qscale[row] = scale;
  } else if constexpr (Q == Quant::kGroup) {
    // A group is lane_mask + 1 consecutive threads (the launcher makes
    // blockDim.x a multiple of it, at most 32): its max by shuffles among them.
    const Pow2Groups groups(a.group_size, VEC);
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      float gm = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) gm = max_abs(gm, v[i][j]);
      gm = groups.max_over_lanes(gm);
      if (in[i]) {
        const float scale = quant_scale(gm, a.fp8, a.scale_ub);
        store_q<VEC>(a, row * H + column(i), v[i], 1.f / scale);
        if (groups.leader()) a.qscale[groups.index(row * H + column(i))] = scale;
      }
    }
  }
  if (valid && threadIdx.x == 0 && rank == 0 && !a.given_stats) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}

// The forward without FP8, or with per-tensor or per-row FP8 (with or
// without a residual), of rows whose width is not a multiple of a 16-byte
// pack (x and y or q themselves 16-byte aligned, and the residual and h).
// Each row then starts at its own
// offset from a 16-byte boundary: its elements before the first boundary
// (`head`, fewer than a pack) and after the last (`tail`) are taken one by
// one by the row's first threads, and the others in 16-byte packs, up to
// kRegItems a thread, held as fwd_regs holds a row. Gamma and beta, whose
// offset from the packs changes row to row, are loaded in the widest loads
// (of 4, 2 or 1 elements; L1 hits) that the row's offset keeps aligned.
// With one-element packs throughout, those rows' kernels were
// bound by instructions at 0.6-1.3 TB/s (RESULTS.md 1f). Same-call A/B on
// an H100, bf16, us, one-element packs (fwd_regs, or fwd_stream above 4096)
// -> fwd_unaligned: RMSNorm 32736x4100 473.7 -> 191.5, 32760x4097 472.8 ->
// 190.4, 65472x2050 604.2 -> 200.7, 10920x12290 413.6 -> 205.7, 134083x1001
// 468.3 -> 190.1; LayerNorm 548.1 -> 230.6, 546.6 -> 237.4, 877.2 -> 248.4,
// 446.3 -> 281.8, 673.9 -> 208.4 (XLA: 198-233 and 204-318). The parameters
// in loads of 4 or 2 elements where the row's offset allows (scale_shift_by)
// rather than one: LayerNorm 4100 233.0 -> 212.6, 4097 235.2 -> 224.3, 2050
// 246.0 -> 237.5, float32 parameters at 4100 349.0 -> 213.8; RMSNorm 190.8
// -> 193.6, 191.5 -> 195.3, 201.3 -> 205.6 (one round). The residual add
// here rather than in one-element packs (fwd_regs, or the two passes above
// 4096 elements), us (jnp composition): add_rms 32736x4100 794.9 -> 410.4
// (561.7), 65472x2050 1975.1 -> 421.3 (602.4), 10920x12290 936.7 -> 448.7
// (608.4); add_ln 914.8 -> 431.4 (571.5), 2608.5 -> 442.4 (617.4), 974.9 ->
// 481.6 (694.4). RESULTS.md 1g.
template <NormKind K, Quant Q, class T, class P>
__global__ void __launch_bounds__(kMaxRowThreads) fwd_unaligned(FwdArgs a) {
  static_assert(Q == Quant::kNone || Q == Quant::kTensor || Q == Quant::kRow, "fwd_unaligned: no per-group FP8");
  constexpr int VEC = 16 / sizeof(T);
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  // Per-tensor FP8: the scale and amax loaded with x, as in fwd_regs.
  float tensor_scale = 0.f, amax_seen = 0.f;
  if (Q == Quant::kTensor && valid && !a.no_output) tensor_scale = a.scale[a.tensor_of(row)];
  if (Q == Quant::kTensor && valid && a.amax) amax_seen = load_seen(a.amax + a.tensor_of(row));
  const int64_t start = row * H;  // the row's first element
  auto [head, body, tail] = cut_row<VEC>(start, H);
  // An empty asm that the compiler cannot see through: the cut stays in three
  // registers rather than being worked out again at its uses (with the 32-bit
  // cut alone, RMSNorm's per-row FP8 was 5-6% slower; RESULTS.md 6zb).
  asm("" : "+r"(head), "+r"(body), "+r"(tail));
  const int tid = static_cast<int>(threadIdx.x);
  auto pack = [&](int i) { return tid + i * static_cast<int>(blockDim.x); };  // the row's pack that item i holds
  auto column = [&](int i) { return head + pack(i) * VEC; };                  // its first column
  const T* x = static_cast<const T*>(a.x) + start;
  // Thread t takes the head's element t and the tail's element t, where they
  // exist (the launcher gives a row at least VEC threads).
  const bool has_head = valid && tid < head, has_tail = valid && tid < tail;
  const int tail_col = head + body * VEC + tid;

  float v[kRegItems][VEC];
  bool in[kRegItems];
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    in[i] = valid && pack(i) < body;
    if (in[i]) {
      load_pack<VEC>(x + column(i), v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
  }
  float eh[1] = {0.f}, et[1] = {0.f};  // the head's element and the tail's
  if (has_head) load_pack<1>(x + tid, eh);
  if (has_tail) load_pack<1>(x + tail_col, et);
  if (a.residual) {  // h = x + residual, stored, then normalized as stored
    // A float32 residual or h lies on 32-byte boundaries where a 16-bit
    // row's packs lie on 16-byte ones: the same packs.
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) add_residual<VEC, T>(v[i], a.residual, a.residual_f32, start + column(i));
    }
    if (has_head) add_residual<1, T>(eh, a.residual, a.residual_f32, start + tid);
    if (has_tail) add_residual<1, T>(et, a.residual, a.residual_f32, start + tail_col);
    void* h = a.no_output ? nullptr : a.h;  // current scaling's measuring pass writes no h
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) store_h_as<VEC, T>(h, a.h_f32, start + column(i), v[i]);
    }
    if (has_head) store_h_as<1, T>(h, a.h_f32, start + tid, eh);
    if (has_tail) store_h_as<1, T>(h, a.h_f32, start + tail_col, et);
  }

  float sum[1] = {held_sum(v, eh[0] + et[0])};
  float mean = 0.f;
  if constexpr (K == NormKind::kLayer) {
    row_sum<1>(sum, smem);
    mean = sum[0] / static_cast<float>(H);
  }
  float ss[1] = {center_held(v, in, mean)};
  if (has_head) eh[0] -= mean;
  if (has_tail) et[0] -= mean;
  ss[0] += eh[0] * eh[0] + et[0] * et[0];
  row_sum<1>(ss, smem);
  const float rstd = rsqrtf(ss[0] / static_cast<float>(H) + a.eps);
  // With FP8 the rows past the end go on: their threads take part in the
  // warp's and the CTA's max below.
  if (Q == Quant::kNone && !valid) return;
  if (Q == Quant::kTensor && a.scale_inverted && valid && !a.no_output) tensor_scale = 1.f / tensor_scale;

  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
  // The packs' parameters in loads of W elements, the widest that the
  // parameters' offset from the packs (the same for every pack of the row)
  // keeps aligned: 4, 2 or 1.
  const auto params_at = reinterpret_cast<uintptr_t>(gamma ? gamma + head : nullptr) |
                         reinterpret_cast<uintptr_t>(beta ? beta + head : nullptr);
  const int width = param_width<P>(params_at);
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    if (in[i]) {
      with_constant<4, 2, 1>(width, [&](auto w) {
        scale_shift_by<decltype(w)::value>(v[i], rstd, gamma, beta, column(i), a.zero_centered);
      });
    }
  }
  // The packs not held, and the head's and tail's elements where absent,
  // stay zeros (never centred or scaled): they add nothing to the max below.
  if (has_head) scale_shift<1>(eh, 0.f, rstd, gamma, beta, tid, a.zero_centered);  // the mean is already off
  if (has_tail) scale_shift<1>(et, 0.f, rstd, gamma, beta, tail_col, a.zero_centered);
  // y, or q = y * mul: the per-tensor scale, or 1 / the row's scale.
  auto store = [&](float mul) {
    if constexpr (Q == Quant::kNone) {
      T* y = static_cast<T*>(a.y) + start;
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        if (in[i]) store_pack<VEC>(y + column(i), v[i]);
      }
      if (has_head) store_pack<1>(y + tid, eh);
      if (has_tail) store_pack<1>(y + tail_col, et);
    } else {
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        if (in[i]) store_q<VEC>(a, start + column(i), v[i], mul);
      }
      if (has_head) store_q<1>(a, start + tid, eh, mul);
      if (has_tail) store_q<1>(a, start + tail_col, et, mul);
    }
  };
  if constexpr (Q == Quant::kNone) {
    store(1.f);
  } else {
    float m = max_abs(max_abs(0.f, eh[0]), et[0]);  // max |y| of this thread's columns
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = max_abs(m, v[i][j]);
    }
    if constexpr (Q == Quant::kTensor) {
      if (!a.no_output) store(tensor_scale);
      if (a.amax) merge_amax(a, row, m, amax_seen, smem);
    } else {
      float mm[1] = {m};
      row_sum<1>(mm, smem, AbsMaxOp{});
      const float scale = quant_scale(mm[0], a.fp8, a.scale_ub);
      store(1.f / scale);
      if (valid && tid == 0) a.qscale[row] = scale;
    }
  }
  if (valid && tid == 0) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}

// fwd_decode's residual add: none; residual and h in x's dtype (the common
// case: no dtype to test a pack); or either of them in float32.
enum class DecodeResid { kNone, kSame, kAny };

// The norm at decode-time row counts (at most two rows per SM): one
// row per CTA, kDecodeItems packs per thread (one for RMSNorm's rows with
// the residual add, see the launcher), gamma/beta (x's dtype, one
// set) loaded with x before the reduction, 32-bit indexing, and one
// reduction a row (LayerNorm's sums taken around layer_shift, as in
// fwd_slices). With a warp or four per scheduler, a warp's instructions
// wait on each other at their full latency, so the kernel's time follows its
// instructions per warp: this kernel has none for FP8, given statistics or
// parameter groups, its PLAIN instance none for the parameters' presence or
// a zero-centred scale, and its instance for a residual and h in x's dtype
// (R = kSame) none for their dtypes (see the launcher). Its sm_90 SASS for RMSNorm bf16 is 496
// instructions against 1143 for fwd_regs' EARLY instance. Latency on an
// H100, in-process and interleaved, bf16, median us per norm, 16 cells of
// 1-256 rows x 4096/8192 columns, two runs: faster than fwd_regs EARLY by
// 0.1-0.7 us in 28 of 32 cells and level (within 0.05 us) in the other four
// (16x4096 RMSNorm 3.04 -> 2.90, LayerNorm 3.55 -> 3.34; 1x8192 RMSNorm
// 3.31 -> 2.97). Two packs a thread: one or four were level or slower
// (LayerNorm 256x8192 with four: 6.39 against 5.44), except for rows of
// 1024-thread CTAs, more than one a SM (ITEMS = 4 there, see the launcher;
// float32 256x8192 LayerNorm 9.2 -> 6.6 us, bf16 256x16384 RMSNorm 7.7 ->
// 6.2, table 6q).
//
// Rows of at most a quarter of the SMs are split into gridDim.y parts
// (SPLIT; at most kDecodeMaxParts, rows x parts within half the SMs): each
// part's CTA reads the whole row for its statistics (from L2 after the
// first), but loads the parameters for, and writes, only its part, so more
// SMs load the parameters and store y at once. LayerNorm, same-call A/B,
// Nsight Compute kernel times on an H100, bf16, median of calls 2-5, two
// rounds, us, one CTA a row -> parts (RESULTS.md table 3, "LayerNorm's decode rows
// split into parts"): 1x4096 3.55 / 3.54 -> 3.46 / 3.46 (4 parts); 16x4096
// 3.58 / 3.58 -> 3.52 / 3.52 (4); 32x4096 3.55 / 3.55 -> 3.52 / 3.52 (2);
// 1x8192 4.05 / 4.02 -> 3.86 / 3.84 (4); 16x8192 4.10 / 4.08 -> 3.92 / 3.92
// (4); 32x8192 4.05 / 4.03 -> 3.94 / 3.94 (2). Eight or sixteen parts gained
// nothing over four. RMSNorm's rows, with gamma alone, are split only in
// CTAs of 512 threads or more (0.03-0.34 us faster, see the launcher); in
// smaller ones the split was level or slower (16x4096 3.12 / 3.10 -> 3.20 /
// 3.17).
//
// The row's fixed work is kept off its critical path (RESULTS.md table 3,
// "The decode forward's fixed work"): the kernel parameters the row's end
// needs are read as x arrives, H's reciprocal is taken then (no division
// after the reduction), the split's bounds are shifts, a thread's sums run
// in two chains, and the warps' partials are added by a butterfly. Nsight
// Compute on an H100 had found the constant-bank reads of y and eps after
// the reduction, waiting, and 1.6x the instructions a warp of XLA's kernel
// of the same grid. Same-call A/B, kernel us, bf16, two rounds, before ->
// after: RMSNorm 16x4096 2.93 / 2.91 -> 2.77 / 2.77, 32x8192 3.41 / 3.41 ->
// 3.20 / 3.18; LayerNorm 16x4096 3.31 / 3.31 -> 2.93 / 2.90, 32x8192 3.78 /
// 3.76 -> 3.20 / 3.22, 64x8192 3.97 / 3.97 -> 3.44 / 3.42.
template <NormKind K, class T, int VEC, int ITEMS = kDecodeItems, bool PLAIN = false, bool SPLIT = false,
          DecodeResid R = DecodeResid::kNone>
__global__ void __launch_bounds__(kMaxRowThreads) fwd_decode(FwdArgs a) {
  early_launch_wait();  // launched by launch_early: before any global memory access
  using V = Pack<T, VEC>;
  constexpr int kSums = K == NormKind::kLayer ? 2 : 1;
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
  float sums[2][kSums] = {};
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
      add_shifted_sums<kSums>(sums[i % 2], v[i], shift);
    }
  }
  float acc[kSums];
#pragma unroll
  for (int m = 0; m < kSums; ++m) acc[m] = sums[0][m] + sums[1][m];
  row_sum_wide<kSums>(acc, smem);
  float mean = 0.f, rstd;
  if constexpr (K == NormKind::kLayer) {
    const float2 mm = shifted_mean_m2_of(acc, shift, acc[0] * inv_h);
    mean = mm.x;
    rstd = rsqrtf(mm.y * inv_h + eps);
  } else {
    rstd = rsqrtf(acc[0] * inv_h + eps);
  }
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (mine[i]) {
      if constexpr (PLAIN) {  // gamma (and beta) given, not zero-centred
        float g[VEC];
        unpack(gv[i], g);
        if constexpr (K == NormKind::kLayer) {
          float b[VEC];
          unpack(bv[i], b);
          scale_shift_plain<(sizeof(T) < 4)>(v[i], mean, rstd, g, b);
        } else {
          scale_plain(v[i], rstd, g);
        }
      } else {
        const V g = gv[i], b = bv[i];
        scale_shift_packs<VEC>(v[i], mean, rstd, g, gamma != nullptr, b, beta != nullptr, a.zero_centered);
      }
      store_pack<VEC>(y + pack(i) * VEC, v[i]);
    }
  }
  if (threadIdx.x == 0 && part == 0) {
    rstd_out[row] = rstd;
    if constexpr (K == NormKind::kLayer) mean_out[row] = mean;
  }
}

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

  // LayerNorm sums are taken around a shift near the row's mean (layer_shift).
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
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[j] - shift;
      acc[0] += d;
      acc[1] += d * d;
    }
  }
  row_sum<2>(acc, smem);
  const float m1 = acc[0] / static_cast<float>(H);
  const float mean = K == NormKind::kLayer ? shift + m1 : 0.f;
  const float var = K == NormKind::kLayer ? fmaxf(acc[1] / static_cast<float>(H) - m1 * m1, 0.f)
                                          : acc[1] / static_cast<float>(H);
  const float rstd = a.given_stats ? a.rstd[row] : rsqrtf(var + a.eps);
  const float mean_used = a.given_stats && K == NormKind::kLayer ? a.mean[row] : mean;

  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;  // RMSNorm has none
  auto normalize = [&](int64_t col, float (&v)[VEC]) {
    load_row(col, v, true);
    scale_shift<VEC>(v, mean_used, rstd, gamma, beta, col, a.zero_centered);
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
    // A thread per group: its max, then the group again, quantized.
    const int64_t G = a.group_size, gvec = G / VEC;
    for (int64_t g = threadIdx.x; g < H / G; g += blockDim.x) {
      float gm = 0.f;
      for (int64_t p = 0; p < gvec; ++p) {
        float v[VEC];
        normalize(g * G + p * VEC, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) gm = max_abs(gm, v[j]);
      }
      const float scale = quant_scale(gm, a.fp8, a.scale_ub);
      const float inv = 1.f / scale;
      for (int64_t p = 0; p < gvec; ++p) {
        float v[VEC];
        normalize(g * G + p * VEC, v);
        store_q<VEC>(a, row * H + g * G + p * VEC, v, inv);
      }
      a.qscale[row * (H / G) + g] = scale;
    }
  }
  if (threadIdx.x == 0 && !a.given_stats) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}

// Forward of rows too wide for one CTA, and of FP8 outputs (sm_90+, 16-byte
// packs, no residual): like bwd_slices, persistent slots of `cluster` CTAs
// walk the rows; each CTA's
// slice of x (contiguous) arrives by bulk copy in one of two shared-memory
// stages while the previous row is normalized from the other. A cluster's
// CTAs push their row sums to each other (ClusterPush) instead of meeting at
// a cluster barrier each row (H100, bf16, same-call A/B: 512x262144 RMSNorm
// 251 -> 216 us, LayerNorm 328 -> 253; 65536 level). With one CTA a row
// the stage is refilled right after the row reduction (its barrier orders
// the previous row's reads first; a barrier of its own at the top of the row
// measured slower here); across a cluster most variants refill a row's
// stage with the row after next at the row's end (REFILL_AT_END,
// kSliceRefillAtEnd). Rows then need no registers of their own (three CTAs
// per SM; two for LayerNorm's per-tensor FP8 in one CTA a row, ONE_CTA
// below) and the next row's load is always in flight: with one cluster per row and
// the row in registers (fwd_regs) the SM had no loads in flight during each
// row's reductions and stores (on an H100, bf16 2048x65536: 288 us there,
// 218 us here). LayerNorm takes both sums in one pass around a shift near
// the mean of each CTA's slice (layer_shift, from the stage), one reduction
// a row: the CTAs push their slice's mean and squared deviations, merged
// by size. Against one shift for the whole row read from global memory
// (same-call A/B, H100, bf16, us): 512x262144 256.1 / 256.8 -> 251.0 /
// 249.2, 2048x65536 level (240.0 / 235.6 -> 236.2 / 236.0). Not taken:
// issuing the next row's copy between the push and the wait (rms_fp8
// 2048x65536 170.7 / 167.8 -> 175.9 / 173.5 us, ln_fp8 219.8 / 221.2 ->
// 226.7 / 223.7; the rest level), and in bwd_slices loading the row's
// rstd before the stage's wait (rms_bwd 2048x65536 349.4 / 351.9 -> 360.7
// / 357.7). The FP8
// outputs read y's inputs from the stage again for each pass they need,
// except the per-row ones of 16-bit x, which hold y (LayerNorm) or x *
// gamma (RMSNorm) in registers between the row's max and the quantized
// store (kSliceHoldY), and per-tensor amax is merged once per CTA and
// tensor, not once per row.
// The FP8 variants are bound by instruction issue, not DRAM (Nsight, H100),
// so a pack's work is kept short: the row's parameter and output pointers
// are held in registers (held) instead of being re-derived for every pack,
// and per-tensor FP8 skips columns past the row's end (about 180 instructions
// a pack of LayerNorm per-tensor FP8 before, 127 after).
constexpr int kSliceItems = 4;  // packs per thread and row in fwd_slices
constexpr int kSliceThreads = 512;

// Every variant but ONE_CTA and kSliceHoldY (two CTAs, 64 registers) and
// STAGED_PARAMS (one CTA, 128 KB of shared memory) is held to three CTAs of
// 512 threads per SM (at most 40 registers; none spills but LayerNorm's
// per-group ones, 8-24 bytes). Without the bound the plain LayerNorm took 49
// registers with float32 parameters (283.0 us against 257.3 with it, H100,
// bf16 x 2048x65536), and per row and per group at 2048x65536 took 233.6
// and 231.6 us against 215.1 and 220.4 with it. An explicit bound of 1
// would let ptxas raise them to 42-64 registers.
//
// ONE_CTA: LayerNorm with per-tensor FP8 output (16-byte parameter packs) where
// one CTA holds the whole row (hidden 1024 to 16384 in bf16). It holds its
// gamma and beta packs in registers across rows, reloaded only when the row's
// parameter group changes, so that no parameter load sits on a pack's path
// (L1TEX was the largest stall, table 6n), at two CTAs of 512 threads per SM
// (64 registers, no spills). The other FP8 outputs read the row's shift
// (layer_shift) from the stage too where one CTA holds the row: one L2 round
// trip a row fewer than from global memory.
// Same-call A/B on an H100, bf16, us (table 6o): 65536x2048 169.9 -> 159.6,
// 32768x4096 175.7 -> 156.8, 8192x16384 190.7 -> 168.0 (the shift's part:
// 175.1 -> 166.0); current scaling's quantizing pass 317.1 -> 293.6 at 4096.
// Held with clusters too, at 2048x65536, it was 222 -> 229 us (the occupancy
// lost); ONE_CTA is chosen at launch, where the cluster is one CTA (table 6p:
// 225.3 -> 221.7 us against holding everywhere). At hidden 1024 its CTAs are
// one warp, 32 a SM (the same 1024 threads), and it beats fwd_regs there:
// 131072x1024 196.7 -> 165.5 us (table 6p).
// Not taken: the ONE_CTA instance held to kSliceRowRegs where that fits
// one more CTA (36-100 bytes spilled; one build with a knob, H200, bf16, us,
// two rounds: 32768x4096 132.5 / 125.6 -> 138.2 / 138.3, 10922x12288
// 130.3 / 132.9 -> 134.9 / 134.8, 14563x9216 level; RESULTS.md 1zf), and
// the held packs for RMSNorm's per-tensor, per-row and per-group
// outputs (gamma alone: more lost to occupancy than gained; rms_fp8 2048 162
// -> 170 us, 65536 174 -> 185, per row at 65536 209 -> 222), and the shift's
// elements loaded before the wait with clusters (ln_fwd 2048x65536 235.5 ->
// 238.8 us, 512x262144 327.3 -> 333.9).
template <NormKind K, Quant Q, class P, int VEC>
constexpr bool kSliceOneCta = K == NormKind::kLayer && Q == Quant::kTensor && sizeof(P) * VEC == 16;
// ONE_CTA also takes LayerNorm's plain forward of 16-bit x with parameters
// in x's dtype where one CTA of more than kBlockThreads threads takes the row
// (hidden 8200-16384 in bf16; plain_slices sends it here), instead of fwd_regs
// (16384) or the unheld one-CTA instance (10240-12288). One build with a
// knob, H200, us, one round, unheld -> held: bf16 13107x10240 154.4 ->
// 148.9, 10922x12288 158.5 -> 154.5, 8192x16384 162.4 -> 149.6; float16
// 155.2 -> 149.0, 157.7 -> 149.9, 159.0 -> 150.7 (RMSNorm's 138.9-158.4 in
// the same run). Not at 8192 (256 threads: bf16 152.1 -> 150.9, float16
// 151.6 -> 155.2). RESULTS.md 1zi.
template <NormKind K, Quant Q, class P, int VEC>
constexpr bool kSliceOneCtaPlain = K == NormKind::kLayer && Q == Quant::kNone && sizeof(P) * VEC == 16;
// ONE_CTA also takes LayerNorm's per-row FP8 in narrow rows (kSliceYSmemThreads).
template <NormKind K, Quant Q, class P, int VEC>
constexpr bool kSliceOneCtaRow = K == NormKind::kLayer && Q == Quant::kRow && sizeof(P) * VEC == 16;
// ONE_CTA also takes LayerNorm's per-group FP8 of 16-bit x (parameters in x's
// dtype) where one CTA takes the row (hidden 1024-16384 in bf16): 64
// registers, two CTAs of 512 threads an SM (bf16: no spill where the row
// fills the CTA's threads, WHOLE, 56 bytes otherwise; float16 4 and 52),
// against 40 registers and gamma and beta loaded for every row. Nsight
// Compute at 32768x4096 before (H200): 122.5 M instructions against RMSNorm's
// per group's 91.4 M, a scheduler issuing in 77% of cycles. One build with a
// knob, H200, bf16, groups of 128, us, two rounds, unheld -> held:
// 131072x1024 170.1 / 167.8 -> 163.0 / 155.9, 65536x2048 177.2 / 174.9 ->
// 171.5 / 168.0, 32768x4096 168.3 / 167.7 -> 165.6 / 165.0, 16384x8192 167.9
// / 168.9 -> 161.0 / 160.4, 8192x16384 173.5 / 165.5 -> 158.9 / 156.4;
// float16 held 157.3 / 166.1 / 154.8 at 1024 / 4096 / 16384 (169.7 / 168.7 /
// 168.0 unheld in an earlier call). RESULTS.md 6zg.
template <NormKind K, Quant Q, class T, class P, int VEC>
constexpr bool kSliceOneCtaGroup =
    K == NormKind::kLayer && Q == Quant::kGroup && sizeof(T) == 2 && sizeof(P) * VEC == 16;

// RMSNorm's per-tensor and per-group FP8 of 16-bit x from kSliceOneCtaMinVecs
// too (CTAs of one warp at hidden 1024, not fwd_regs' CTAs of 256 threads,
// whose per-tensor instance spills 16 bytes at its 64-register cap). One
// build with a knob, H200, bf16, 131072x1024, us, two rounds: per tensor
// 142.0 / 143.3 -> 126.7 / 126.3, per group of 128 152.7 / 150.3 -> 135.6
// / 136.2. Not RMSNorm's per row, which keeps its P32 CTAs there (125.5 /
// 126.3 -> 130.6 / 131.2), nor fwd_regs' P32 CTAs for per tensor or per
// group (at 1024 per tensor 1-2% slower, per group 4-6%; per tensor
// 65536x2048 123-125 -> 151-153). RESULTS.md 6zf.
// LayerNorm's per group likewise (at 64 registers fwd_regs' bf16 instance
// spills 8 bytes, with float32 parameters 112; fwd_slices' at 40 none and
// 32). One build with a knob, H200, bf16, groups of 128, us, two rounds,
// fwd_regs -> fwd_slices from 1024 columns: 131072x1024 183.9 / 187.1 ->
// 167.2 / 164.4, 65536x2048 196.2 / 193.8 -> 175.1 / 175.5, 32768x4096 198.0
// / 200.2 -> 166.9 / 166.3, 16384x8192 204.0 / 206.0 -> 164.9 / 166.6,
// 8192x16384 218.0 / 218.3 -> 167.9 / 169.5 (from 2048 columns instead: 1024
// level with fwd_regs, the rest the same); float16 at 1024 / 4096 / 16384
// 184.8 / 184.5 -> 168.1 / 167.4, 199.1 / 201.2 -> 167.7 / 168.2, 222.2 /
// 221.3 -> 169.8 / 169.7; float32 parameters 220.6 / 220.5 -> 187.4 / 183.4,
// 225.9 / 227.5 -> 186.5 / 185.4, 269.9 / 270.0 -> 200.6 / 200.0 (RESULTS.md
// 6zg). These one-warp CTAs take the barrier before the refill
// (order_refill_after_reduction) that ONE_CTA's and HOLD_Y's do.
template <NormKind K, Quant Q, class T>
constexpr bool kSliceQuantWarp =
    sizeof(T) == 2 && (Q == Quant::kGroup || (K == NormKind::kRms && Q == Quant::kTensor));
// Those RMSNorm instances hold gamma (ONE_CTA) where the CTA is that one
// warp: there the 32 CTAs an SM bind before registers do (ONE_CTA's 64
// leave 32 one-warp CTAs), so no occupancy is lost, and no gamma load sits
// on a pack's path. Wider CTAs keep gamma unheld (see kSliceOneCta).
// Same-call A/B on an H200, 131072x1024, us, three rounds, unheld -> held:
// bf16 per tensor 126.0 / 121.8 / 124.5 -> 117.4 / 117.6 / 117.6, per group
// 131.2 / 132.2 / 131.4 -> 115.3 / 115.6 / 116.3; float16 per tensor 125.2
// / 124.1 / 125.9 -> 113.0 / 115.7 / 116.1, per group 131.0 / 131.2 / 132.1
// -> 112.5 / 116.0 / 114.5 (RESULTS.md 6zk). RMSNorm's per row of 16-bit x
// too, at exactly one warp's packs (hidden 1024; its sums pass reads the
// held gamma for the row's max): it takes these CTAs instead of fwd_regs'
// P32 instance (p32_row_threads). One build with a knob, H200, 131072x1024,
// us, three rounds, P32 -> held: bf16 129.4 / 127.9 / 128.1 -> 112.4 / 113.0
// / 115.1, float16 126.1 / 128.9 / 127.8 -> 113.2 / 111.3 / 112.1 (RESULTS.md
// 6zl; unheld in these CTAs it had lost to P32, 6zf).
template <NormKind K, Quant Q, class T, class P, int VEC>
constexpr bool kSliceOneCtaWarp =
    K == NormKind::kRms && (kSliceQuantWarp<K, Q, T> || (Q == Quant::kRow && sizeof(T) == 2)) && sizeof(P) * VEC == 16;

// LayerNorm's per-row FP8 of 16-bit x holds the row's y between its two
// passes (the row's max, then the quantization) instead of normalizing each
// pack again: 32 registers more (64, no stack), two CTAs an SM (in bf16
// rows of CTAs of one warp, in shared memory instead:
// kSliceYSmemThreads). Same-call
// A/B on an H200, bf16, us, two rounds each, again -> held: 65536x2048 209.9
// / 207.4 -> 170.3 / 167.6, 32768x4096 205.1 / 200.2 -> 166.1 / 164.3,
// 8192x16384 223.1 / 221.5 -> 174.4 / 173.1, 2048x65536 258.7 / 261.2 ->
// 237.4 / 234.0, 512x262144 301.1 / 300.0 -> 269.6 / 266.3 (float16
// 2048x65536 263.0 / 261.0 -> 235.5 / 235.4). float32 x (16 registers
// more) lost at 8192x16384, 365.5 / 357.9 -> 377.2 / 376.0, and is not held.
// RMSNorm's per row takes its max with the sums (kRowMaxFirst below), so it
// has one pass to quantize; holding x * gamma from the sums pass (HOLD_Y)
// spares that pass the stage's and gamma's reads again. It gains where one
// CTA of 256-512 threads holds the row (kSliceRmsHoldThreads) and across a
// cluster (with REFILL_AT_END); launchers choose it there. Its per-group
// output, whose one output pass read the stage and gamma, holds x * gamma
// too, where one CTA holds the row.
template <NormKind K, Quant Q, class T>
constexpr bool kSliceHoldY = (Q == Quant::kRow || (K == NormKind::kRms && Q == Quant::kGroup)) && sizeof(T) == 2;

// REFILL_AT_END: across a cluster, a row's stage takes the row after next at
// the row's end (after a barrier: the row's last pass read the stage; for
// RMSNorm's per row holding x * gamma, which reads it in the sums pass
// alone, after the sums' reduction), instead of the next row right after
// the reduction: two rows' copies in flight in the same two stages.
// Same-call A/Bs (RESULTS.md 6u, 6v), bf16, us: RMSNorm 2048x65536 201 ->
// 197-200 and 512x262144 216 -> 204, LayerNorm 223 -> 209 and 230 -> 215,
// its per-tensor FP8 190 -> 181 and 211 -> 197 (H100); LayerNorm's per-row
// FP8 240 -> 226 and 270 -> 237-242 (H200), RMSNorm's per-row FP8 with x *
// gamma held 190 -> 170 and 208 -> 187 (H100, kSliceRmsHoldThreads). Not
// taken: RMSNorm's per-tensor and, unheld, per-row FP8 (level) and
// per-group FP8 (7-9% slower: 174 -> 186 us at 2048x65536). With one CTA a
// row the refill lost (LayerNorm per row, float32 parameters, 32768x4096:
// 173 -> 188 us).
template <NormKind K, Quant Q>
constexpr bool kSliceRefillAtEnd =
    Q == Quant::kNone || (K == NormKind::kLayer && (Q == Quant::kTensor || Q == Quant::kRow));

// STAGED_PARAMS: LayerNorm's plain forward across a cluster of at least
// kSliceStagedCluster CTAs (gamma and beta given, not zero-centred, packs as
// wide as x's) copies its gamma and beta slices into shared memory after the
// two stages, each thread its own packs (no barrier: no thread reads
// another's), again only when the row's parameter group changes. The output
// pass then reads them from there instead of from L2: with 192 KB of stages
// an SM, L1 holds little, and the two parameter loads a pack doubled what x
// alone moves from L2. One CTA an SM (128 KB, 80 registers). Same-run A/B on an H100, us, two rounds
// (RESULTS.md 6w): bf16 2048x65536 210.5 / 209.9 -> 202.4 / 202.5,
// 512x262144 216.5 / 215.5 -> 208.8 / 207.5; float32 x 2048x65536 400.8 /
// 403.0 -> 386.2 / 387.9. Not taken: RMSNorm's gamma staged the same way
// (two CTAs an SM): 197.2 / 200.1 -> 206.4 / 205.3 us at 2048x65536 (but
// 206.7 / 204.6 -> 202.2 / 203.3 at 512x262144); LayerNorm's gamma alone,
// 210 -> 213 us; LayerNorm's per-row FP8 (one CTA an SM, y held): bf16
// 2048x65536 level, 512x262144 226.8 / 225.9 -> 232.1 / 231.5, float16
// 2048x65536 219.4 / 219.8 -> 246.3 / 248.7 (RESULTS.md 6y); nor its gamma
// alone, which keeps two CTAs an SM (96 KB each), in one CTA a row and across
// a cluster: bf16 8192x16384 176.1 / 179.2 -> 188.0 / 188.2 us, 2048x65536
// 219.6 / 218.0 -> 222.6 / 223.2, float16 2048x65536 221.2 / 220.2 -> 234.9
// / 237.5; beta's loads issued a pack ahead besides spilled 48-64 bytes and
// lost 12-23% (RESULTS.md 6z).
// From clusters of 4 (rows of over 32768 16-bit columns): in clusters of 2
// the CTAs that staging makes one an SM lost to two unstaged. One build with
// a knob, H100, bf16, us, staged -> not: 6553x20480 217.2 / 222.0 / 217.4 ->
// 207.1 / 204.1 / 204.5, 5461x24576 209.1 -> 199.4, 4681x28672 level (202.9
// -> 202.8), 4096x32768 205.4 -> 199.8; float16 5461x24576 216.4 -> 203.3.
// Same-call A/B, two rounds: bf16 6553x20480 217.4 / 217.2 -> 206.8 / 206.4,
// float16 5461x24576 212.5 / 215.9 -> 200.5 / 203.6, float32 (clusters of 2
// at 8193-16384) 10922x12288 421.8 / 406.2 -> 385.8 / 389.0, 8192x16384
// 398.5 / 397.1 -> 390.0 / 390.1.
// From clusters of 4 staging still won (2184x61440 205.9 against 209.5,
// 2048x65536 201.2 / 207.4, 1024x131072 200.6 / 209.7, 585x229376 212.9 /
// 216.2, 512x262144 200.1 / 212.4) or was mixed (3276x40960 213.0 / 208.5,
// 2730x49152 214.2 / 208.7, 2340x57344 level; 1365x98304 bf16 215.7 / 205.3,
// float16 206.6 / 210.5). RESULTS.md 1e.
// Not in clusters of 16 (hidden over 131072 in 16-bit x), on later code: its
// 128 KB CTAs, one an SM, left 7 clusters resident (112 of 132 SMs; Nsight
// Compute, H200, 512x262144), unstaged 21 (336 CTAs of 64 KB, 40 registers).
// One build with a knob, H200, bf16, us, two rounds, staged -> not:
// 512x262144 185.8 / 187.0 -> 177.0 / 176.2 (2048x65536, staged either way,
// level). RESULTS.md 1zo.
constexpr int kSliceStagedCluster = 4;
// LayerNorm's plain forward of 16-bit x with float32 gamma and beta
// (STAGED_PARAMS with float32 packs) stages them in shared memory as floats,
// each pack as two 16-byte pieces in planes of their own ([gamma,
// beta][piece][pack], so that a warp's 16-byte reads stay one wavefront a
// phase), in a cluster twice the natural size (CTAs half as wide; 8192
// (rows of kBlockThreads threads) goes to fwd_slices for it, plain_slices).
// One build with a knob, H200, bf16 x, us, two rounds, unstaged -> staged in
// the doubled cluster (staged at the natural size; at four times it):
// 16384x8192 167.3 / 165.2 -> 152.1 / 153.9 (169.1 / 170.4; 161.2 / 159.0),
// 10922x12288 177.7 / 177.9 -> 154.1 / 154.1 (228.9 / 228.5; 154.7 /
// 154.8), 8192x16384 184.7 / 184.7 -> 160.7 / 158.1 (199.2 / 200.4; 160.0 /
// 161.2), 5461x24576 189.0 / 193.8 -> 164.5 / 163.8 (187.6 / 187.9; 159.9 /
// 158.7), 2048x65536 213.4 / 210.5 -> 171.1 / 174.3 (192.5 / 189.0; 177.4 /
// 176.9), 512x262144 (a cluster of 16 either way) 240.4 / 236.2 -> 203.5 /
// 205.8; float16 8192x16384 159.1, 2048x65536 176.1. RESULTS.md 1zh.
template <NormKind K, Quant Q, class T, class P>
constexpr bool kSliceStagedP32 =
    K == NormKind::kLayer && Q == Quant::kNone && sizeof(T) == 2 && std::is_same_v<P, float>;
// STAGED_HALVES: where STAGED_PARAMS' cluster is 4 or 8 CTAs, it takes
// twice as many, each half as wide (256 threads or fewer, 64 KB of shared
// memory), three an SM instead of one; their instance is held to
// kSliceHalvesRegs registers so that three fit (ptxas, sm_90: bf16 81 -> 72,
// float16 72 -> 64, float32 72 -> 71, no spill). Same-call A/B on an H200,
// us, two rounds: bf16 2048x65536 177.4 / 179.5 -> 157.5 / 156.0,
// 1024x131072 179.5 / 179.1 -> 167.0 / 166.6, 3276x40960 level (158.2 /
// 156.7 -> 158.7 / 157.8); float32 2048x65536 312.0 / 315.4 -> 292.5 /
// 294.9. Clusters of 16 (512x262144) cannot double: the same cap on their
// instance lost 4% (190.2 / 190.0 -> 197.2 / 198.2), so it stays uncapped.
// RESULTS.md 1t. Not measured on an H100.
constexpr int kSliceHalvesRegs = 80;
// The per-row FP8 outputs of 16-bit x that hold y (LayerNorm) or x * gamma
// (RMSNorm) in registers (HOLD_Y, not ONE_CTA, parameters in x's dtype) are
// held to kSliceRowRegs registers: CTAs of 384 threads then fit three an SM
// instead of two, the split CTAs of 192 (kSliceRowSplitThreads) six instead
// of five, those of 256 four either way (ptxas, sm_90: LayerNorm 61-64 ->
// 55-56, RMSNorm 58 -> 53-56, no spills but 4 bytes in LayerNorm's
// instances for rows that do not fill their CTAs). One build with a
// knob each, H200, us, two rounds, 64 -> 56 registers. Across a cluster:
// LayerNorm bf16 5461x24576 167.9 / 168.3 -> 159.1 / 159.9, 2730x49152
// 184.4 / 187.9 -> 176.2 / 176.1, 2048x65536 181.7 / 183.4 -> 179.6 / 178.2,
// 1365x98304 188.7 / 190.1 -> 175.1 / 176.8, float16 2730x49152 182.4 /
// 185.8 -> 173.1 / 174.2; RMSNorm bf16 5461x24576 145.1 / 144.1 -> 132.5 /
// 133.9, 2048x65536 147.4 / 145.0 -> 144.8 / 144.3, 1365x98304 150.4 /
// 150.3 -> 145.5 / 149.5, float16 2730x49152 level (135.6 / 136.0 -> 137.5
// / 136.0), bf16 2730x49152 (CTAs of 192) 139.3 / 138.3 -> 140.5 / 142.2,
// taken with the rest (one instance). One CTA a row: LayerNorm bf16
// 21845x6144 149.0 / 150.2 -> 143.5 / 142.9, 16384x8192 142.9 / 142.1 ->
// 143.0 / 138.7, 10922x12288 152.5 / 149.5 -> 140.6 / 140.2, 8192x16384
// level (144.5 / 143.5 -> 143.3 / 142.9), float16 10922x12288 146.5 ->
// 139.8; RMSNorm (held from 256 threads, kSliceRmsHoldThreads) bf16
// 10922x12288 134.7 / 132.9 -> 122.7 / 118.0, 16384x8192 and 8192x16384
// level, float16 10922x12288 level (121.7 -> 122.3). Not taken: 48
// registers (LayerNorm spilled 88-132 bytes and lost 10-16% across a
// cluster: 5461x24576 195.0 / 195.6), 40 (LayerNorm twice as slow), CTAs of
// 512 threads of 3 packs instead of 384 of 4 at 64 registers (two an SM
// either way; LayerNorm 5-42% slower at 12288-98304, RMSNorm mixed).
// RESULTS.md 1zd. LayerNorm's rows with y in shared memory (ONE_CTA) keep
// 64, and so do float32 parameters: the same limit for them (bf16 x) was
// mixed, two wheels, same call, H200, us, two rounds, 64 -> 56: CTAs of 384
// faster, LayerNorm 10922x12288 193.2 / 194.3 -> 175.0 / 177.7, 5461x24576
// 210.4 / 208.9 -> 201.6 / 199.5, RMSNorm 147.9 / 148.8 -> 132.4 / 133.8 and
// 160.0 / 160.6 -> 143.0 / 142.2; CTAs of 512 (two an SM either way)
// slower, 2048x65536 LayerNorm 217.5 / 216.1 -> 226.0 / 224.5, RMSNorm
// 157.9 / 158.4 -> 162.5 / 162.9 (RESULTS.md 1ze). So float32 parameters
// take the limit (ROW_CAP, an instance of its own) only where it fits one
// more CTA an SM than the 64 registers of two CTAs of kSliceThreads do
// (row_cap_fits): CTAs of 384 threads (hidden 12288, 24576, 49152 and
// 98304 of 16-bit x), 352, 288, 224 and so on; not those of 512 (16384,
// 32768, 65536, 131072 and wider), 320 or 256. Wheels of both, same call,
// H200, bf16 x, us, two rounds, 64 registers -> ROW_CAP: LayerNorm
// 14563x9216 (CTAs of 288) 177.9 / 177.7 -> 170.9 / 173.7, 11915x11264
// (352) 200.8 / 197.2 -> 179.1 / 178.3, 10922x12288 195.5 / 197.0 -> 178.0
// / 176.5, 2730x49152 226.9 / 227.7 -> 212.8 / 213.9, 1365x98304 229.9 /
// 232.7 -> 221.6 / 221.3; RMSNorm 137.9 / 137.2 -> 132.4 / 130.6, 154.2 /
// 153.0 -> 134.4 / 135.4, 147.9 / 147.3 -> 134.0 / 134.2, 168.3 / 169.3 ->
// 147.5 / 148.8, 167.9 / 169.6 -> 161.5 / 159.1; the uncapped launches
// (10240, 40960: CTAs of 320; 65536: 512) level (RESULTS.md 1zf).
// Parameters in x's dtype keep the limit where it adds no CTA too: 64
// registers there (one build with a knob, H200, bf16, us, two rounds) lost
// in LayerNorm's, 1024x131072 181.9 / 178.1 -> 189.0 / 190.6, 512x262144
// 200.1 / 201.3 -> 208.9 / 209.8, 16384x8192 142.4 / 140.5 -> 145.9 /
// 144.2, and left RMSNorm's level (RESULTS.md 1zf).
constexpr int kSliceRowRegs = 56;
constexpr int kSmRegisters = 65536;
// Whether CTAs of `threads` threads fit one more an SM at kSliceRowRegs
// registers than at the 64 that two CTAs of kSliceThreads leave (ROW_CAP).
constexpr bool row_cap_fits(int threads) {
  return kSmRegisters / (kSliceRowRegs * threads) > kSmRegisters / (kSmRegisters / (2 * kSliceThreads) * threads);
}
// LayerNorm's per-row FP8 of bf16 x (bf16 parameters) across a cluster of
// CTAs of at most kSliceStagedRowThreads threads (hidden 32769-65536: the
// split clusters, kSliceRowSplitThreads) stages gamma and beta in shared
// memory as the plain forward does (STAGED_PARAMS), in the STAGED_HALVES
// instance: kSliceHalvesRegs registers (no spill), y held in registers, and
// four stages' worth of shared memory, 48-64 KB a CTA (three or four CTAs an
// SM, against four or six at 56 registers unstaged); its y pass then makes
// no L2 trip for parameters. One build with a knob, H200, bf16, us, two
// rounds, unstaged -> staged: 2730x49152 177.6 / 178.6 -> 168.7 / 172.3,
// 2048x65536 181.0 / 180.8 -> 165.9 / 163.5. Not taken: float16 x (same
// build: 2730x49152 173.7 -> 184.6, 2048x65536 180.1 -> 188.1; after the
// stage's reads became 16-byte loads, 178.1 / 179.0 and 175.0 / 170.6), and
// clusters doubled until their CTAs are 256 threads or fewer, staged
// (5461x24576 158.0 / 165.7 -> 162.9 / 163.1, 1365x98304 176.7 / 176.9 ->
// 177.3 / 178.3, 1024x131072 182.5 / 182.6 -> 179.2 / 181.1). RESULTS.md 1ze.
template <NormKind K, Quant Q, class T, class P>
constexpr bool kSliceStagedRow =
    K == NormKind::kLayer && Q == Quant::kRow && std::is_same_v<T, __nv_bfloat16> && std::is_same_v<P, T>;
constexpr int kSliceStagedRowThreads = 256;
template <NormKind K, Quant Q, class P, int VEC>
constexpr bool kSliceStagedParams = K == NormKind::kLayer && Q == Quant::kNone && sizeof(P) * VEC == 16;
// With STAGED_PARAMS in clusters of at least kSliceL2AheadCluster CTAs
// (rows of over 131072 16-bit columns), and for LayerNorm's per-row FP8
// (kClusterMerge) in any cluster, thread 0 also asks L2 for its slice of the
// row after the one it copies in (bulk_prefetch_l2): a third row on its way
// without a third stage. The prologue's first copy asks for nothing (the
// second copy follows at once). LayerNorm's per row, same-call A/Bs on an
// H100, bf16, us, two rounds: 512x262144 253.7 / 248.4 -> 237.7 / 243.2
// (the plain forward, whose prologue lost that prefetch in the same build,
// level: 205.6 / 202.3 -> 202.8 / 200.8); from clusters of 2, 4096x32768 230.5 / 258.0 -> 213.4 /
// 212.6, 2048x65536 242.8 / 245.5 -> 232.3 / 233.1, 1024x131072 234.1 /
// 232.8 -> 227.1 / 225.1. The plain forward's, one build with a knob, on
// an H100, bf16, us, two rounds (RESULTS.md, "An L2 prefetch a row
// ahead"): 512x262144 210.5 / 209.6 -> 200.3 / 200.4; at 2048x65536
// (clusters of 4) it lost, 205.3 / 203.0 -> 214.7 / 212.4, as it did for
// RMSNorm's per-thread copies at both widths (204 -> 246 us and 202 -> 239)
// and for LayerNorm's per-tensor FP8. RMSNorm's FP8 outputs lost with it too
// (same-call A/B, H100, bf16, us, two rounds; RESULTS.md 6z): from clusters
// of 16, per tensor 512x262144 174.9 / 178.4 -> 195.0 / 196.4, per group
// 193.2 / 196.0 -> 199.2 / 200.2, per row level at best; from clusters of 2,
// per tensor 2048x65536 162.6 / 164.6 -> 185.2 / 185.8.
constexpr int kSliceL2AheadCluster = 16;

// kSliceOwnCopies: RMSNorm's plain forward across a cluster fills its
// stages by per-thread copies (cp.async, 16 bytes each) instead of one bulk
// copy a stage. Its threads read only their own packs of the stage
// (no shift, no group spans threads' packs), so each waits for its own copies
// and refills its own packs as soon as it has written their outputs: no
// barrier at the row's end. One build with a knob, on an H100, bf16, us,
// three rounds (RESULTS.md, "What the wide forward's time is made of"):
// 512x262144 206.7-208.7 -> 198.1-201.5, 2048x65536 level
// (202.0-202.4 -> 202.6-204.8); float32 2048x65536 388.9 / 386.6 -> 384.1 /
// 383.1. Not taken: RMSNorm's FP8 outputs, which lost 3-10% at 65536 and
// 262144 with their own copies (per group at 512x262144 188 -> 206 us), and
// LayerNorm's plain forward, whose shift then came from thread 0's packs
// after a barrier: level to 1% faster with gamma and beta staged, 8-10%
// slower with float32 parameters (2048x65536 233.1 / 234.1 -> 251.3 / 254.4).
template <NormKind K, Quant Q>
constexpr bool kSliceOwnCopies = K == NormKind::kRms && Q == Quant::kNone;

template <NormKind K, Quant Q, class T, class P, int VEC, bool WHOLE = false, bool ONE_CTA = false,
          bool REFILL_AT_END = false, bool STAGED_PARAMS = false,
          bool HOLD_Y = K == NormKind::kLayer && kSliceHoldY<K, Q, T>, bool STAGED_HALVES = false,
          bool ROW_CAP = std::is_same_v<P, T>>
__global__ void __launch_bounds__(kSliceThreads, STAGED_PARAMS ? 1 : ONE_CTA || HOLD_Y ? 2 : 3)
    __maxnreg__(STAGED_HALVES                                         ? kSliceHalvesRegs
                : Q == Quant::kRow && HOLD_Y && !ONE_CTA && ROW_CAP ? kSliceRowRegs
                                                                    : 128)
        fwd_slices(FwdArgs a, int64_t used, int cluster, float inv_h) {
  using Vec = Pack<T, VEC>;
  static_assert(sizeof(Vec) == 16, "fwd_slices moves 16-byte packs");
  static_assert(!ONE_CTA || kSliceOneCta<K, Q, P, VEC> || kSliceOneCtaPlain<K, Q, P, VEC> ||
                    kSliceOneCtaGroup<K, Q, T, P, VEC> || (HOLD_Y && kSliceOneCtaRow<K, Q, P, VEC>) ||
                    (!HOLD_Y && kSliceOneCtaWarp<K, Q, T, P, VEC>),
                "fwd_slices: ONE_CTA is LayerNorm's per-tensor, per-group or per-row FP8 or plain forward, or "
                "RMSNorm's per-tensor, per-row or per-group FP8 in one-warp CTAs");
  // LayerNorm's per row with its parameters held (ONE_CTA) keeps the pending
  // row's y as floats in shared memory after the two stages, not in the 32
  // registers the held parameters take: each thread writes and reads only
  // its own packs, so no barrier orders them (kSliceYSmemThreads).
  constexpr bool kYSmem = ONE_CTA && Q == Quant::kRow && K == NormKind::kLayer;
  static_assert(!REFILL_AT_END || (!ONE_CTA && (kSliceRefillAtEnd<K, Q> || (HOLD_Y && K == NormKind::kRms))),
                "fwd_slices: REFILL_AT_END is for clusters");
  static_assert(!STAGED_PARAMS || (REFILL_AT_END && (kSliceStagedParams<K, Q, P, VEC> || kSliceStagedP32<K, Q, T, P> ||
                                                     (HOLD_Y && STAGED_HALVES && kSliceStagedRow<K, Q, T, P>))),
                "fwd_slices: STAGED_PARAMS is LayerNorm's plain forward or per-row FP8 across a cluster");
  static_assert(!STAGED_HALVES || STAGED_PARAMS, "fwd_slices: STAGED_HALVES is a STAGED_PARAMS instance");
  static_assert(std::is_same_v<P, T> || !ROW_CAP || (Q == Quant::kRow && HOLD_Y && !ONE_CTA),
                "fwd_slices: ROW_CAP with float32 parameters is for per-row FP8 held in registers");
  static_assert(!HOLD_Y || kSliceHoldY<K, Q, T>,
                "fwd_slices: HOLD_Y is for per-row (RMSNorm: per-group) FP8 of 16-bit x");
  // LayerNorm's per row (y held): the row's max is reduced with the next
  // row's sums (one block reduction a row instead of two; across a cluster
  // also one push a row, kClusterMerge), and the row is quantized after it
  // (see pending). Same-call A/B on an H100, us, two rounds, one CTA a row:
  // bf16 131072x1024 188.1 / 189.0 -> 184.1 / 185.6, 32768x4096 184.8 /
  // 185.2 -> 182.1 / 184.2, 16384x8192 183.2 / 184.2 -> 180.0 / 180.3,
  // 8192x16384 187.0 / 181.9 -> 174.5 / 175.6; float16 32768x4096 level,
  // 8192x16384 187.3 / 186.2 -> 175.0 / 175.3. Across a cluster (against
  // a push of its own for the max): bf16 2048x65536 238.4 / 235.1 -> 214.5
  // / 212.8, 512x262144 243.9 / 243.8 -> 222.3 / 222.7; float16 2048x65536
  // 232.9 / 231.2 -> 216.3 / 216.9.
  constexpr bool kMergeMax = HOLD_Y && K == NormKind::kLayer;
  constexpr bool kClusterMerge = kMergeMax && REFILL_AT_END;
  constexpr bool kOwnCopies = REFILL_AT_END && kSliceOwnCopies<K, Q>;
  Pack<P, VEC> held_gamma[ONE_CTA ? kSliceItems : 1], held_beta[ONE_CTA ? kSliceItems : 1];
  int64_t held_off = -1;  // parameter offset of the held (or STAGED_PARAMS' staged) packs
  constexpr int kSums = K == NormKind::kLayer ? 2 : 1;
  // RMSNorm's per-row FP8 scale: max |y| = rstd * max |x * scale| (rstd > 0
  // is common to the row), taken in the pass of the sums and reduced with
  // them: one reduction a row instead of two.
  constexpr bool kRowMaxFirst = Q == Quant::kRow && K == NormKind::kRms;
  constexpr int kRed = kRowMaxFirst ? 2 : kSums;
  // RMSNorm's per row holding x * gamma across a cluster reads its stage in
  // the sums pass alone: right after the row's block reduction (not at the
  // row's end) the stage takes the row after next.
  constexpr bool kRefillOwn = REFILL_AT_END && HOLD_Y && K == NormKind::kRms;
  using RedOp = std::conditional_t<kRowMaxFirst, SumAbsMaxOp, SumOp>;
  // Values a CTA pushes a row: kClusterMerge's {slice mean, slice squared
  // deviations, the pending row's max, unused} go in one 16-byte store.
  constexpr int kXchg = kClusterMerge ? 4 : kRed;
  extern __shared__ uint4 stages[];  // [2 stages][kSliceItems * blockDim.x] packs
  __shared__ float smem[kRowSumSmem];
  __shared__ alignas(kXchg == 4 ? 16 : 8) float xchg[2][kMaxCluster][kXchg];
  // LayerNorm's per-row FP8 of float32 x (y not held): the row maxima's own
  // exchange (its row max comes after the sums, from y).
  __shared__ alignas(8) float xmax[2][kMaxCluster][1];
  __shared__ alignas(8) uint64_t landed[2], pushed[2], max_pushed[2];
  const int64_t H = a.shape.hidden, rows = a.shape.rows;
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t slot = blockIdx.x / cluster;
  const int packs = kSliceItems * blockDim.x;
  const int first = rank * packs * VEC;  // hidden < 2^31
  // Pack i of this thread in a stage (or in the staged parameters), and its
  // column in the CTA's slice. The column repeats the index sum in signed
  // arithmetic rather than scale pack(i): that changed the code of 63
  // kernels, with mixed timings (H100, LayerNorm's per-row FP8 at 65536
  // float16 3% slower, at 262144 bf16 2% faster).
  auto pack = [&](int i) { return i * blockDim.x + threadIdx.x; };
  auto local = [&](int i) { return (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * VEC; };
  auto x_slice = [&](int64_t r) { return static_cast<const T*>(a.x) + r * H + first; };  // row r's slice
  // Whether pack i is in the row, in 32 bits: H <= kSliceVecs * kMaxCluster * VEC here (slices_fit).
  bool in[kSliceItems];
#pragma unroll
  for (int i = 0; i < kSliceItems; ++i) in[i] = WHOLE || first + local(i) < static_cast<int>(H);
  // STAGED_PARAMS: gamma's and then beta's packs of the slice after the two
  // stages, for the parameter offset held_off, each in planes of its 16-byte
  // pieces ([gamma, beta][piece][pack]: float32 packs of 16-bit x's width
  // are two pieces; a warp's 16-byte reads stay one wavefront a phase).
  using ParamPack = Pack<P, VEC>;
  constexpr int kPieces = sizeof(ParamPack) / 16;
  [[maybe_unused]] ParamPack* const sparams = reinterpret_cast<ParamPack*>(stages + 2 * packs);  // one piece a pack
  [[maybe_unused]] uint4* const spieces = stages + 2 * packs;
  [[maybe_unused]] auto stage_param = [&](int which, int i, const ParamPack& pk) {
    if constexpr (kPieces == 1) {
      sparams[which * packs + pack(i)] = pk;
    } else {
#pragma unroll
      for (int c = 0; c < kPieces; ++c)
        spieces[(which * kPieces + c) * packs + pack(i)] = reinterpret_cast<const uint4*>(&pk)[c];
    }
  };
  [[maybe_unused]] auto staged_param = [&](int which, int i) -> decltype(auto) {
    if constexpr (kPieces == 1) {
      return (sparams[which * packs + pack(i)]);
    } else {
      ParamPack pk;
#pragma unroll
      for (int c = 0; c < kPieces; ++c)
        reinterpret_cast<uint4*>(&pk)[c] = spieces[(which * kPieces + c) * packs + pack(i)];
      return pk;
    }
  };
  auto slice_of = [&](int q) { return slice_columns(q, static_cast<int64_t>(packs) * VEC, H); };
  const int64_t slice_elems = slice_of(rank);
  // 1 / H (the launcher's, a kernel parameter) and 1 / the slice's columns
  // (that of H where one CTA takes the row), taken once: a row's mean and
  // variance cost a multiplication each, not an IEEE division (the sm_90 SASS
  // of the bf16 units' fwd_slices instances 6% shorter in all, up to 10%
  // each; spills 8 bytes more or less in a dozen of them). Same-call A/B on an
  // H200, bf16, us, two rounds -> one, groups of 128: LayerNorm per group
  // 32768x4096 151.9 / 149.9 -> 145.9, 8192x16384 145.5 / 145.3 -> 141.3,
  // 131072x1024 level (139.6 / 140.7 -> 138.9 / 139.5); RMSNorm per group
  // 124.5 / 124.3 -> 122.7 and 129.4 / 128.9 -> 126.5 (1024 level); the plain
  // forward and LayerNorm's per row level (RESULTS.md 6zi). Not in fwd_regs
  // (one row a thread): there its instances spilled up to 60 bytes more,
  // LayerNorm's with float32 parameters 32768x4096 157.4 / 158.5 -> 178.3,
  // the rest level.
  const float inv_slice = cluster == 1 || slice_elems == 0 ? inv_h : 1.f / static_cast<float>(slice_elems);
  const unsigned slice_bytes = static_cast<unsigned>(slice_elems * sizeof(T));
  BulkStages ring(landed);
  ClusterPush<kXchg> exchange(xchg, pushed, cluster, rank);
  ClusterPush<1> max_exchange(xmax, max_pushed, Q == Quant::kRow && !kRowMaxFirst ? cluster : 1, rank);
  auto prefetch = [&](int64_t r, int st, bool l2_ahead = true) {
    if constexpr (STAGED_PARAMS || kClusterMerge) {
      if (l2_ahead && (kClusterMerge || cluster >= kSliceL2AheadCluster) && threadIdx.x == 0 && r + used < rows &&
          slice_bytes > 0) {
        bulk_prefetch_l2(x_slice(r + used), slice_bytes);
      }
    }
    if constexpr (kOwnCopies) {  // this thread's packs, one group a row (empty past the last row)
      if (r < rows) {
#pragma unroll
        for (int i = 0; i < kSliceItems; ++i) {
          if (in[i]) cp_async16(stages + st * packs + pack(i), x_slice(r) + local(i));
        }
      }
      cp_async_commit();
    } else if (threadIdx.x == 0 && r < rows && slice_bytes > 0) {
      ring.fill<1>(st, {stages + st * packs}, {x_slice(r)}, slice_bytes);
    }
  };
  // float16 packs read from the stage as whole 16-byte loads (unpack's
  // WORDS) where the instance has registers to spare, not in those held to
  // 40. One build each, H200, float16, us, two rounds, two 8-byte loads ->
  // one: LayerNorm's plain forward staged 2048x65536 173.0 / 173.5 -> 155.2
  // / 163.4, RMSNorm's per row 149.1 / 148.5 -> 146.1 / 144.8 (RESULTS.md
  // 1ze).
  constexpr bool kWordReads = STAGED_PARAMS || HOLD_Y;
  auto read = [&](int st, int i, float (&v)[VEC]) {
    unpack<kWordReads>(reinterpret_cast<const Vec*>(stages + st * packs)[pack(i)], v);
  };
  // Per-tensor FP8: this thread's max |y| over the rows of tensor `tensor`
  // walked so far, merged into amax (one atomic per CTA) when the CTA moves
  // on to another tensor's rows and at the end. Uniform over the CTA.
  int64_t tensor = -1;
  float tensor_max = 0.f, tensor_scale = 0.f;
  auto merge_tensor_max = [&]() {
    if (a.amax == nullptr || tensor < 0) return;
    float mm[1] = {tensor_max};
    cta_sum<1>(mm, smem, AbsMaxOp{});
    if (threadIdx.x == 0) atomic_abs_max(a.amax + tensor, mm[0]);
  };

  // REFILL_AT_END (kSliceRefillAtEnd): the prologue fills both stages, and
  // a row's stage takes the row after next at the row's end.
  // (The first row's copy asks L2 for nothing: the second's follows at once.)
  prefetch(slot, 0, !REFILL_AT_END);
  if constexpr (REFILL_AT_END) prefetch(slot + used, 1);
  // kMergeMax: `ys` holds the pending row's y, `pending` names it (-1:
  // none), and `pending_max` is this thread's max |y| of it (after the next
  // row's block reduction, the CTA's). Across a cluster its max travels
  // with the next row's slice sums (kClusterMerge): one push a row. It had
  // a push of its own before, taken after the next row's sums were pushed
  // (itself 512x262144 268.3 / 272.5 -> 246.4 / 245.0 us against waiting
  // for the max within the row).
  [[maybe_unused]] float ys[HOLD_Y && !kYSmem ? kSliceItems : 1][VEC];
  [[maybe_unused]] Pack<float, VEC>* const ysm = reinterpret_cast<Pack<float, VEC>*>(stages + 2 * packs);  // kYSmem
  // RMSNorm's y of pack i from the held x * scale.
  [[maybe_unused]] auto held_y = [&](int i, float rstd, float (&v)[VEC]) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = ys[i][j] * rstd;
  };
  [[maybe_unused]] int64_t pending = -1;
  [[maybe_unused]] float pending_max = 0.f;
  [[maybe_unused]] auto store_pending = [&](float row_max) {  // the held y of row `pending`
    if constexpr (HOLD_Y && K == NormKind::kLayer) {
      const float scale = quant_scale(row_max, a.fp8, a.scale_ub);
      const float inv = 1.f / scale;
      uint8_t* const qrow = held(static_cast<uint8_t*>(a.y) + pending * H + first);
#pragma unroll
      for (int i = 0; i < kSliceItems; ++i) {
        if (!in[i]) continue;
        if constexpr (kYSmem) {
          float v[VEC];
          unpack(ysm[pack(i)], v);
          store_q<VEC>(qrow + local(i), a.fp8, v, inv);
        } else {
          store_q<VEC>(qrow + local(i), a.fp8, ys[i], inv);
        }
      }
      if (threadIdx.x == 0 && rank == 0) a.qscale[pending] = scale;
      pending = -1;
    }
  };
  int st = 0;
  for (int64_t row = slot; row < rows; row += used, st ^= 1) {
    if constexpr (kOwnCopies) {
      cp_async_wait<1>();  // this row's group; the next row's may still be in flight
    } else if (slice_bytes > 0) {
      ring.wait(st);
    }
    // LayerNorm's shift: near the mean of this CTA's slice, read from its
    // stage (no trip to L2 for elements of other CTAs' slices).
    float shift = 0.f;
    if constexpr (K == NormKind::kLayer) {
      const T* srow = reinterpret_cast<const T*>(stages + st * packs);
      if (slice_elems > 0) shift = layer_shift([&](int64_t c) { return to_float(srow[c]); }, slice_elems);
    }
    const int64_t poff = a.shape.param_offset(row);
    const P* gamma = held(a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr);
    const P* beta = held(K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr);
    // Each thread's parameter packs, again where the row's group changes:
    // into registers (ONE_CTA) or shared memory (STAGED_PARAMS, where gamma
    // and beta are both given).
    if constexpr (ONE_CTA || STAGED_PARAMS) {
      if (poff != held_off) {  // uniform over the CTA
        held_off = poff;
#pragma unroll
        for (int i = 0; i < kSliceItems; ++i) {
          if (in[i]) {
            if constexpr (ONE_CTA) {
              if (gamma) load_raw(gamma + first + local(i), held_gamma[i]);
              if (beta) load_raw(beta + first + local(i), held_beta[i]);
            } else {
              ParamPack pk;
              load_raw(gamma + first + local(i), pk);
              stage_param(0, i, pk);
              load_raw(beta + first + local(i), pk);
              stage_param(1, i, pk);
            }
          }
        }
      }
    }
    // RMSNorm: {sum(x^2)}, per-row FP8 {sum(x^2), max |x * scale|};
    // LayerNorm: {sum(d), sum(d^2)}, d = x - shift (add_shifted_sums).
    float acc[kRed] = {};
#pragma unroll
    for (int i = 0; i < kSliceItems; ++i) {
      if (in[i]) {
        float v[VEC];
        read(st, i, v);
        if constexpr (kRowMaxFirst && HOLD_Y) {  // RMSNorm: no shift; x * scale held
          add_sq_scaled_max<VEC>(acc, v, gamma, first + local(i), a.zero_centered, ys[i]);
        } else if constexpr (kRowMaxFirst && ONE_CTA) {  // gamma held
          const Pack<P, VEC> gp = held_gamma[i];      // by value: no address taken of the array
          add_sq_scaled_max<VEC>(acc, v, gp, gamma != nullptr, a.zero_centered);
        } else if constexpr (kRowMaxFirst) {
          add_sq_scaled_max<VEC>(acc, v, gamma, first + local(i), a.zero_centered);
        } else if constexpr (HOLD_Y && K == NormKind::kRms) {  // per group: x * scale held
          add_sq_scaled<VEC>(acc, v, gamma, first + local(i), a.zero_centered, ys[i]);
        } else {
          add_shifted_sums<kSums>(acc, v, shift);
        }
      } else if constexpr (HOLD_Y && Q == Quant::kGroup) {  // zeros past the row's end, for the group maxima
#pragma unroll
        for (int j = 0; j < VEC; ++j) ys[i][j] = 0.f;
      }
    }
    if constexpr (kMergeMax) {
      float red[3] = {acc[0], acc[1], pending_max};
      cta_sum<3, SumsAbsMaxOp<2>, kSliceThreads / 32>(red, smem);
      acc[0] = red[0];
      acc[1] = red[1];
      pending_max = red[2];
      if constexpr (!kClusterMerge) {
        if (pending >= 0) store_pending(pending_max);  // the previous row's
      }
    } else {
      cta_sum<kRed>(acc, smem, RedOp{});
    }
    if constexpr (kRefillOwn) {  // the reduction's barrier ordered the stage's reads
      ring.order_refill_after_reduction();
      prefetch(row + 2 * used, st);
    }
    float mean = 0.f, sq;  // sq: sum((x - mean)^2) over the row (RMSNorm: mean 0)
    if constexpr (K == NormKind::kLayer) {
      // Each CTA takes its slice's mean and squared deviations (around the
      // slice's own shift, read from its stage), and the slices are merged
      // weighted by their sizes (Chan et al.'s pairwise update, all at once).
      float part[kXchg] = {};  // {slice mean, slice sum of squared deviations[, kClusterMerge's]}
      if (slice_elems > 0) {
        const float2 mean_m2 = shifted_mean_m2_of(acc, shift, acc[0] * inv_slice);
        part[0] = mean_m2.x;
        part[1] = mean_m2.y;
      }
      if constexpr (kClusterMerge) part[2] = pending_max;
      if (cluster > 1) {
        exchange.push(part, st);
        exchange.take(part, st);  // lane q: rank q's slice
        const float n = static_cast<float>(slice_of(threadIdx.x % 32));
        if constexpr (kClusterMerge) {  // the slices' weighted means and the pending row's max, one butterfly
          float w[2] = {n * part[0], part[2]};
          warp_sum<2>(w, 32, SumAbsMaxOp{});
          mean = w[0] * inv_h;
          pending_max = w[1];
        } else {
          float w[1] = {n * part[0]};
          warp_sum<1>(w, 32);
          mean = w[0] * inv_h;
        }
        const float d = part[0] - mean;
        float m2[1] = {part[1] + n * d * d};
        warp_sum<1>(m2, 32);
        sq = m2[0];
      } else {
        mean = part[0];
        sq = part[1];
      }
      if constexpr (kClusterMerge) {
        if (pending >= 0) store_pending(pending_max);  // the previous row's
      }
    } else {
      exchange.sum(acc, st, RedOp{});
      sq = acc[0];
    }
    if constexpr (!REFILL_AT_END) {
      // The only CTAs of one warp:
      if constexpr (ONE_CTA || HOLD_Y || kSliceQuantWarp<K, Q, T>) ring.order_refill_after_reduction();
      prefetch(row + used, st ^ 1);
    }
    const float rstd = rsqrtf(sq * inv_h + a.eps);
    const int64_t out = row * H + first;
    // The row's outputs, by pass: `plain` (a std::bool_constant) says gamma
    // (and LayerNorm's beta) is given and the scale is not zero-centred.
    // That common case runs in loops of its own, with nothing left to decide
    // a pack (scale_shift's placeholder ones and predicated-off adds, eight
    // each), beta's add in the fma, and for 16-bit y (v - mean) * rstd as one
    // fma too (its rounding of mean * rstd is far below y's). For the FP8
    // outputs, same-call A/B on an H200, bf16, us, one loop -> two: per row
    // 2048x65536 LayerNorm 297.4 / 291.4 -> 260.7 / 257.9, RMSNorm 177.1 /
    // 172.4 -> 173.7 / 167.8; 512x262144 LayerNorm 329.3 / 331.8 -> 293.1 /
    // 291.5; per tensor (RMSNorm) 157.4 / 155.5 -> 144.2 / 147.1; per group
    // 173.1 / 175.5 -> 164.2 / 165.1 (RMSNorm, 2048x65536). The one-CTA
    // instances (held parameters) too, since 51e5d7e: same-call A/B on an
    // H200, LayerNorm bf16, us, per tensor 131072x1024 146.5 -> 132.0,
    // 32768x4096 151.1 -> 137.8, 8192x16384 149.6 -> 133.2; per row 178.5 ->
    // 164.0, 179.6 -> 170.8, 160.3 -> 159.0 (RESULTS.md 1q). Their bf16
    // instances spill 4-16 bytes more, loaded and stored once a row.
    auto emit_row = [&](auto plain) {
      // y of pack i with r for rstd (zeros past the row's end): y_of's r is
      // the row's; RMSNorm's per group takes r = 1 (x * gamma, whose
      // multiplication by 1 the compiler drops) and rstd later, per group.
      auto y_by = [&](int i, float (&v)[VEC], float r) {
        if (!in[i]) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) v[j] = 0.f;
          return;
        }
        read(st, i, v);
        if constexpr (decltype(plain)::value) {
          float g[VEC];
          if constexpr (ONE_CTA) {
            const Pack<P, VEC> gp = held_gamma[i];  // by value: no address taken of the array
            unpack(gp, g);
          } else if constexpr (STAGED_PARAMS) {
            unpack<true>(staged_param(0, i), g);
          } else {
            load_pack<VEC>(gamma + first + local(i), g);
          }
          if constexpr (K == NormKind::kLayer) {
            float b[VEC];
            if constexpr (ONE_CTA) {
              const Pack<P, VEC> bp = held_beta[i];
              unpack(bp, b);
            } else if constexpr (STAGED_PARAMS) {
              unpack<true>(staged_param(1, i), b);
            } else {
              load_pack<VEC>(beta + first + local(i), b);
            }
            scale_shift_plain<(sizeof(T) < 4)>(v, mean, r, g, b);
          } else {
            scale_plain(v, r, g);
          }
        } else if constexpr (ONE_CTA) {
          const Pack<P, VEC> g = held_gamma[i], b = held_beta[i];  // by value: no address taken of the arrays
          scale_shift_packs<VEC>(v, mean, r, g, gamma != nullptr, b, beta != nullptr, a.zero_centered);
        } else {
          scale_shift<VEC>(v, mean, r, gamma, beta, first + local(i), a.zero_centered);
        }
      };
      auto y_of = [&](int i, float (&v)[VEC]) { y_by(i, v, rstd); };
      if constexpr (Q == Quant::kNone) {
        T* const yrow = held(static_cast<T*>(a.y) + out);
#pragma unroll
        for (int i = 0; i < kSliceItems; ++i) {
          if (in[i]) {
            float v[VEC];
            y_of(i, v);
            store_pack<VEC>(yrow + local(i), v);
          }
        }
      } else {
        uint8_t* const qrow = held(static_cast<uint8_t*>(a.y) + out);  // FP8 outputs' row slice
        if constexpr (Q == Quant::kTensor) {
          if (a.tensor_of(row) != tensor) {
            merge_tensor_max();
            tensor = a.tensor_of(row);
            tensor_max = 0.f;
            if (!a.no_output) tensor_scale = a.tensor_mul(tensor);
          }
#pragma unroll
          for (int i = 0; i < kSliceItems; ++i) {
            if (in[i]) {
              float v[VEC];
              y_of(i, v);
              if (!a.no_output) store_q<VEC>(qrow + local(i), a.fp8, v, tensor_scale);
#pragma unroll
              for (int j = 0; j < VEC; ++j) tensor_max = max_abs(tensor_max, v[j]);
            }
          }
        } else if constexpr (Q == Quant::kRow) {
          float mm[1] = {kRowMaxFirst ? rstd * acc[kRed - 1] : 0.f};
          if constexpr (!kRowMaxFirst) {  // LayerNorm: y for the row's max, held to quantize (kSliceHoldY)
#pragma unroll
            for (int i = 0; i < kSliceItems; ++i) {
              float v[VEC];
              y_of(i, v);
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                mm[0] = max_abs(mm[0], v[j]);
                if constexpr (HOLD_Y && !kYSmem) ys[i][j] = v[j];
              }
              if constexpr (kYSmem) store_pack<VEC>(ysm[pack(i)].v, v);
            }
            if constexpr (kMergeMax) {  // reduced (and pushed) with the next row's sums
              pending_max = mm[0];
              pending = row;
              return;
            }
            row_sum<1>(mm, smem, AbsMaxOp{});
            max_exchange.sum(mm, st, AbsMaxOp{});  // a cluster of one: nothing to do
          }
          const float scale = quant_scale(mm[0], a.fp8, a.scale_ub);
          const float inv = 1.f / scale;
#pragma unroll
          for (int i = 0; i < kSliceItems; ++i) {
            if (in[i]) {
              if constexpr (HOLD_Y && kRowMaxFirst) {  // RMSNorm holds x * scale
                float v[VEC];
                held_y(i, rstd, v);
                store_q<VEC>(qrow + local(i), a.fp8, v, inv);
              } else if constexpr (HOLD_Y) {
                store_q<VEC>(qrow + local(i), a.fp8, ys[i], inv);
              } else {
                float v[VEC];
                y_of(i, v);
                store_q<VEC>(qrow + local(i), a.fp8, v, inv);
              }
            }
          }
          if (threadIdx.x == 0 && rank == 0) a.qscale[row] = scale;
        } else if constexpr (Q == Quant::kGroup) {
          // A group is lane_mask + 1 consecutive threads (a power of two of at
          // most 32, and a CTA's slice a whole number of groups): its max by shuffles.
          const Pow2Groups groups(a.group_size, VEC);
          // RMSNorm: y = rstd * (x * gamma) with rstd > 0 common to the row, so
          // the group's max is rstd * max |x * gamma| and q = (x * gamma) *
          // (rstd / scale): rstd a pack, not an element. (rstd / scale stays
          // finite: scale >= kMinQuantScale, rstd = rsqrt of at least the
          // least denormal, or infinite, where y is NaN either way.)
          // The scale's reciprocal comes from quant_rcp, not a division (every
          // lane of a group takes it, each pack): sm_90 SASS of the per-group
          // instances 5-12% shorter. Same-call A/B on an H200, bf16, groups of
          // 128, us, two rounds: LayerNorm 131072x1024 140.5 / 140.7 -> 133.4 /
          // 136.8, 32768x4096 150.0 / 148.1 -> 140.5 / 138.1, 8192x16384 141.3 /
          // 141.6 -> 140.1 / 133.9; RMSNorm 130.7 / 128.4 -> 125.7 / 125.3 at
          // 16384, level at 1024 and 4096 (RESULTS.md 6zj).
          constexpr bool kLateRstd = K == NormKind::kRms;
#pragma unroll
          for (int i = 0; i < kSliceItems; ++i) {
            float v[VEC];
            if constexpr (HOLD_Y) {
              held_y(i, kLateRstd ? 1.f : rstd, v);
            } else {
              y_by(i, v, kLateRstd ? 1.f : rstd);
            }
            float gm = 0.f;
#pragma unroll
            for (int j = 0; j < VEC; ++j) gm = max_abs(gm, v[j]);
            gm = groups.max_over_lanes(gm);
            if constexpr (kLateRstd) gm *= rstd;
            if (in[i]) {
              const float scale = quant_scale(gm, a.fp8, a.scale_ub);
              store_q<VEC>(qrow + local(i), a.fp8, v, kLateRstd ? rstd * quant_rcp(scale) : quant_rcp(scale));
              if (groups.leader()) a.qscale[groups.index(out + local(i))] = scale;
            }
          }
        }
      }
    };
    if (plain_params<K>(gamma, beta, a.zero_centered)) {  // the held pointers
      emit_row(std::true_type{});
    } else {
      emit_row(std::false_type{});
    }
    if (threadIdx.x == 0 && rank == 0) {
      a.rstd[row] = rstd;
      if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
    }
    if constexpr (REFILL_AT_END && !kRefillOwn) {
      // The output pass read the stage (each thread only its own packs with
      // kOwnCopies, which it has read by now).
      if constexpr (!kOwnCopies) __syncthreads();
      prefetch(row + 2 * used, st);
    }
  }
  if constexpr (kMergeMax) {  // the last row's (uniform over the cluster)
    float mm[1] = {pending_max};
    cta_sum<1>(mm, smem, AbsMaxOp{});
    if constexpr (kClusterMerge) {
      if (cluster > 1) {
        float part[kXchg] = {0.f, 0.f, mm[0], 0.f};
        exchange.push(part, st);
        exchange.take(part, st);
        float w[1] = {part[2]};
        warp_sum<1>(w, 32, AbsMaxOp{});
        mm[0] = w[0];
      }
    }
    store_pending(mm[0]);
  }
  if constexpr (Q == Quant::kTensor) merge_tensor_max();
  if (cluster > 1) cluster_done();
}

// FP8 input, no residual, rows of up to kMaxRowThreads * kRegItems packs of
// 16 codes (hidden <= 65536): each thread keeps its packs as raw codes, four
// registers per 16 columns, so its four 16-byte loads are in flight together
// (twice the bytes of fwd_regs' 8-code packs in the same registers), and
// decodes them again for each pass over the row.
constexpr int kFp8Vec = 16;

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
  float ss[1] = {0.f};
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    if (column(i) < H) {
      float f[V];
      decode(i, f);
#pragma unroll
      for (int j = 0; j < V; ++j) ss[0] += (f[j] - mean) * (f[j] - mean);
    }
  }
  row_sum<1>(ss, smem);
  const float rstd = rsqrtf(ss[0] / static_cast<float>(H) + a.eps);
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

constexpr int64_t kSliceVecs = static_cast<int64_t>(kSliceThreads) * kSliceItems;  // per CTA
// ---- Two passes for rows wider than one CTA, with a residual or with given
// statistics (16-bit or float x and h alike, 16-byte packs; y plain, per-tensor
// FP8, or RMSNorm's per-row FP8). fwd_add_stats reads x and the residual,
// stores h and writes the row's mean/rstd of h as stored (and per row its FP8
// scale); fwd_apply then normalizes h (or x, with given statistics) pack by
// pack, a row split across CTAs with no reduction. Five tensor passes of DRAM
// traffic against four for one cluster a row (fwd_regs), but each at about the
// speed of a copy: on an H100, bf16, 512x262144, one cluster a row took 579 us
// for the residual add + RMSNorm (XLA's fusion of the jnp version, which also
// makes two passes: 468) and 331 us for the normalization with given
// statistics alone; with per-tensor FP8 output 601.0 against 450.5 for the two
// passes, per-row 671.1 against 447.3.
constexpr int kAddStatsThreads = 256;  // one row a CTA
constexpr int kApplyThreads = 256;
constexpr int kApplyItems = 4;         // packs per thread in fwd_apply

// Per-row FP8 (RMSNorm only): the row's scale from rstd * max |h * scale|,
// reduced with the sum of squares (as fwd_slices does), written to qscale for
// fwd_apply.
template <NormKind K, Quant Q, class T, class P, int VEC>
__global__ void __launch_bounds__(kAddStatsThreads) fwd_add_stats(FwdArgs a) {
  constexpr bool kLayer = K == NormKind::kLayer;
  constexpr bool kRowMax = Q == Quant::kRow;
  static_assert(!(kLayer && kRowMax), "fwd_add_stats: per-row FP8 scales for RMSNorm only");
  // LayerNorm: sum(d), sum(d^2) around a shift; RMSNorm: sum(h^2), and per row max |h * scale|.
  constexpr int M = kLayer || kRowMax ? 2 : 1;
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
      add_shifted_sums<M>(acc, v, shift);
    }
  }
  if constexpr (kRowMax) {
    row_sum<M, SumAbsMaxOp, true>(acc, smem);
  } else {
    row_sum_lead<M>(acc, smem);
  }
  if (threadIdx.x != 0) return;
  if constexpr (kLayer) {
    const float2 mean_m2 = shifted_mean_m2(acc, shift, H);
    a.mean[row] = mean_m2.x;
    a.rstd[row] = rsqrtf(mean_m2.y / static_cast<float>(H) + a.eps);
  } else {
    const float rstd = rsqrtf(acc[0] / static_cast<float>(H) + a.eps);
    a.rstd[row] = rstd;
    if constexpr (kRowMax) a.qscale[row] = quant_scale(rstd * acc[1], a.fp8, a.scale_ub);
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

// Whether a forward takes the two passes: rows wider than one CTA of
// fwd_regs (`cta_vecs` packs), with given statistics, or with a residual of
// x's dtype stored as x's dtype and rows enough for fwd_add_stats' one CTA a
// row to fill the GPU (at least two a SM); the plain norm, per-tensor FP8, or
// RMSNorm's per-row FP8 (its scale found with the statistics).
template <NormKind K, Quant Q>
constexpr bool two_pass_quant() {
  return Q == Quant::kNone || Q == Quant::kTensor || (Q == Quant::kRow && K == NormKind::kRms);
}

// 1 / hidden, passed to fwd_slices: its rows' mean and variance take a
// multiplication by it instead of an IEEE division (a dozen instructions and
// a branch each, in every thread and row).
inline float inv_hidden(const FwdArgs& a) { return 1.f / static_cast<float>(a.shape.hidden); }

template <NormKind K, Quant Q, class T, int VEC, bool XQ>
bool two_pass_fits(const FwdArgs& a, int64_t nvec, int64_t cta_vecs) {
  if constexpr (!two_pass_quant<K, Q>() || XQ || sizeof(T) * VEC != 16) {
    return false;
  } else {
    if (nvec <= cta_vecs || a.shape.rows == 0 || a.no_output) return false;
    if (a.given_stats) return Q != Quant::kRow && !a.residual;
    const int sms = device_attribute<cudaDevAttrMultiProcessorCount>();
    return a.residual && !a.residual_f32 && !a.h_f32 && sms > 0 && a.shape.rows >= 2 * sms;
  }
}

template <NormKind K, Quant Q, class T, class P, int VEC>
ffi::Error launch_fwd_two_pass(cudaStream_t stream, const FwdArgs& a, int64_t nvec) {
  if constexpr (!two_pass_quant<K, Q>()) {
    return ffi::Error::Internal("jax_rmsnorm: the two-pass forward takes no per-group FP8");
  } else {
    // fwd_apply's grid (rows * chunks CTAs) bounds fwd_add_stats' (rows) too.
    const int64_t chunks = ceil_div(nvec, kApplyThreads * kApplyItems);
    if (a.shape.rows * chunks > INT32_MAX) return too_many_rows();
    const T* src = static_cast<const T*>(a.x);
    if (!a.given_stats) {
      fwd_add_stats<K, Q, T, P, VEC><<<static_cast<unsigned>(a.shape.rows), kAddStatsThreads, 0, stream>>>(a);
      JRN_RETURN_IF_ERROR(check_launch("fwd_add_stats"));
      src = static_cast<const T*>(a.h);
    }
    fwd_apply<K, Q, T, P, VEC><<<static_cast<unsigned>(a.shape.rows * chunks), kApplyThreads, 0, stream>>>(
        a, src, static_cast<int>(chunks));
    return check_launch("fwd_apply");
  }
}

// Per-tensor FP8 output takes fwd_slices from rows of this many packs (CTAs
// of 64 threads or more; with 32-thread CTAs, at hidden 1024 bf16, it was
// slower than fwd_regs on an H100 then: 263.8 against 210.8 us; at 2048,
// 197.9 against 200.8). So does RMSNorm's per group, whose rows below one
// CTA of fwd_regs (hidden 16384 in 16-bit x) had kept fwd_regs (on an H100
// level or 1% slower at 4096-8192, RESULTS.md 6r).
// One build with a knob, H200, groups of 128, us, two rounds, fwd_regs ->
// fwd_slices: bf16 65536x2048 156.3 / 159.6 -> 135.4 / 135.4, 43690x3072
// 160.9 / 161.2 -> 133.5 / 133.0, 32768x4096 162.3 / 158.4 -> 131.7 /
// 131.8, 21845x6144 162.5 / 163.1 -> 135.2 / 134.1, 16384x8192 161.2 /
// 159.7 -> 170.8 (once) / 135.9, 10922x12288 187.9 / 193.3 -> 145.6 /
// 145.7; groups of 16 at 2048-8192 153.4-159.4 -> 130.9-135.7; float16
// 32768x4096 164.5 / 164.5 -> 130.6 / 130.9; float32 parameters 32768x4096
// 167.6 / 166.0 -> 142.8 / 145.7 (RESULTS.md 6zf).
constexpr int64_t kSliceMinVecs = 64 * kSliceItems;
// LayerNorm's per-tensor FP8 with parameters held (ONE_CTA) from CTAs of one
// warp: at 131072x1024 bf16 165.5 against fwd_regs' 196.7 us (table 6p).
constexpr int64_t kSliceOneCtaMinVecs = 32 * kSliceItems;
// Per-row FP8 from kSliceMinVecs packs too. Same-call A/B on an H200, us,
// fwd_regs -> fwd_slices, two rounds each:
//  * LayerNorm, before fwd_slices held y (kSliceHoldY): bf16 65536x2048
//    222.7 / 217.8 -> 210.0 / 205.8, 32768x4096 219.0 / 219.0 -> 199.3 /
//    199.2, 8192x16384 252.3 / 246.9 -> 224.0 / 220.3; float32 32768x4096
//    306.8 / 312.6 -> 301.0 / 300.1, 8192x16384 418.0 / 418.0 -> 361.0 /
//    359.9; float16 slower, 184.5 / 179.4 -> 196.6 / 197.9 and 211.0 / 214.8
//    -> 223.3 / 224.7 (fwd_regs' float16 instance issues its loads of x
//    together; the bfloat16 one waits for each before the next, RESULTS 6s).
//    With y held, float16 too: 65536x2048 176.0 / 175.2 -> 168.0 / 166.6,
//    32768x4096 178.7 / 179.7 -> 168.1 / 166.1, 8192x16384 214.6 / 210.0 ->
//    172.7 / 176.2.
//  * RMSNorm, after fwd_slices' plain loop: bf16 65536x2048 145.5 / 145.6 ->
//    143.8 / 142.8, 32768x4096 146.1 / 150.6 -> 136.6 / 135.3, 16384x8192
//    153.3 / 155.2 -> 141.7 / 142.6, 8192x16384 167.9 / 169.7 -> 150.0 /
//    150.9; float16 32768x4096 148.6 / 146.6 -> 140.7 / 136.3, 8192x16384
//    167.7 / 174.0 -> 147.3 / 147.1. (Before that loop, on an H100, it was
//    slower: 184.3 / 176.3 us at 4096 and 198.3 / 193.8 at 16384.)
// LayerNorm's in bf16 from kSliceOneCtaMinVecs (CTAs of one warp at hidden
// 1024): H200, 131072x1024, 199.8 / 195.1 -> 158.3 / 159.0 us; float16's
// stays in fwd_regs there (157.0 / 157.6 against 163.2 / 159.6).
template <NormKind K, Quant Q, class T>
constexpr bool kSliceRowLnWarp = K == NormKind::kLayer && Q == Quant::kRow && std::is_same_v<T, __nv_bfloat16>;
// The packs a row of one CTA of fwd_regs holds at most (wider rows take
// clusters, fwd_slices or the streaming kernel).
template <Quant Q>
constexpr int64_t kRegsCtaVecs =
    static_cast<int64_t>(Q == Quant::kNone ? kMaxRowThreads : kQuantRowThreads) * kRegItems;

// Whether a forward goes to fwd_slices: 16-byte packs of a float x without a
// residual or given statistics, on sm_90+; for per-tensor FP8 (and current
// scaling), per-row FP8 and RMSNorm's per group from kSliceMinVecs packs a
// row (from kSliceOneCtaMinVecs: LayerNorm's per-tensor with parameters held,
// its per-row in bf16, and kSliceQuantWarp's per tensor and per group of
// 16-bit x), otherwise rows wider than one CTA of fwd_regs.
// Measured on an H100, bf16, fwd_slices against fwd_regs: per-tensor 165.7 /
// 197.1 us at 32768x4096 and 164.2 / 209.4 at 8192x16384 (263.8 us at
// 131072x1024 with 32-thread CTAs); per group 252.9 / 239.2 and 241.7 /
// 252.8 (per row: above).
// RMSNorm's per-group FP8 also from rows that fill one CTA of fwd_regs
// (hidden 16384 in bf16): at 8192x16384 bf16, groups of 128, 175.1 / 176.3
// us against fwd_regs' 182.8 / 181.7 (H100, same build, two rounds; 77-78%
// -> 80-82% of a copy). From 512 packs it was level at 32768x4096 (172.0 /
// 173.2 against 171.9 / 171.7) and slower at 16384x8192 (176.3 / 175.9
// against 174.2 / 173.8).
// The plain norm's rows of more than one fwd_slices CTA that fwd_regs would
// give one CTA of up to 1024 threads (hidden 16384 to 32768 in 16-bit x) go
// to fwd_slices too (clusters of 2), where the rows are many (fewer take
// fwd_decode): fwd_regs has no loads in flight during a row's reductions
// and stores, and at 20480-24576 a quarter or more of its threads hold no
// columns. RMSNorm stays in fwd_regs where more than three quarters of that
// CTA's threads would hold columns, the CTA counted as the power of two of
// threads fwd_regs took when this was measured (it now takes whole warps,
// row_threads, below; RMSNorm's fwd_regs against fwd_slices at 20480-24576
// with whole warps is not measured). Same-call A/B on an H100, bf16, us,
// two rounds, fwd_regs -> fwd_slices: LayerNorm 6553x20480 323.2 / 323.0 ->
// 220.7 / 218.6, 5461x24576 282.9 / 281.2 -> 212.1 / 211.3, 4096x32768
// 244.0 / 245.5 -> 207.9 / 208.1; RMSNorm 6553x20480 250.1 / 246.4 -> 197.9
// / 198.2, 5461x24576 223.6 / 221.2 -> 202.4 / 202.1, but 4096x32768 (its
// CTA full) 200.6 / 199.7 -> 208.8 / 206.5 (RESULTS.md 1b).
//
// LayerNorm's rows of 16-bit x that one CTA of fwd_slices holds go there too
// where fwd_regs' CTAs of one row (capped at 64 registers by kMaxRowThreads)
// would fill less than five sixths of kMaxRowThreads threads an SM (hidden
// 10241 to 13312: two CTAs of 352-416 threads), with fewer bytes in flight.
// Same-call A/B on an H100, bf16, us, two rounds, fwd_regs -> fwd_slices:
// 11915x11264 218.3 / 218.6 -> 203.9 / 203.3, 10922x12288 212.7 / 213.5 ->
// 201.6 / 203.2, 10082x13312 209.2 / 210.5 -> 204.0 / 204.7; float16
// 10922x12288 213.4 / 212.3 -> 201.2 / 203.6; bf16 x with float32
// parameters 218.1 / 218.2 -> 212.5 / 212.6. Not taken: at 84% and more
// (14563x9216, three CTAs of 288: 202.9 / 202.0 -> 199.9 / 202.6;
// 16368x8200 level; 9362x14336, two of 448, level), float32 x (21845x6144
// 370.1 / 371.2 -> 389.4 / 389.8), RMSNorm (10922x12288 191.2 / 188.8 ->
// 202.3 / 203.4, knob build). RESULTS.md 1c. Since 3b2b25d all of
// LayerNorm's rows of 16-bit x of more than kBlockThreads threads go there
// (the two paragraphs below), so that five-sixths rule no longer decides.
//
// With float32 parameters (and 16-bit x) LayerNorm's rows of more than
// kBlockThreads threads (hidden 8200-16384) all go to fwd_slices: fwd_regs'
// CTA of one row holds float32 gamma and beta in registers beside x and, at
// 64 registers, takes two passes. Same-call A/B on an H200, us, two rounds,
// fwd_regs -> fwd_slices, bf16 x: 14563x9216 179.2 / 180.1 -> 162.5 /
// 162.7, 13107x10240 174.8 / 177.4 -> 163.1 / 165.7, 9362x14336 197.6 /
// 197.7 -> 170.3 / 167.0, 8192x16384 197.5 / 196.3 -> 183.5 / 184.3; float16
// x: 13107x10240 177.0 / 179.7 -> 171.1 / 170.5, 8192x16384 194.4 / 196.3 ->
// 192.5 / 191.7. Not taken at 256 threads (hidden 8192): bf16 level (168.2
// / 167.3 -> 168.5 / 172.9), float16 slower (165.0 / 166.8 -> 183.8 /
// 183.8). RESULTS.md 1zb.
//
// With parameters in x's dtype too, from 3b2b25d: fwd_slices' ONE_CTA
// instance holds them across rows (kSliceOneCtaPlain). So every such row of
// 16-bit x goes to fwd_slices, with either parameter dtype; rows of
// kBlockThreads threads only with float32 gamma and beta given
// (kSliceStagedP32).
template <NormKind K, class T, class P>
bool plain_slices(const FwdArgs& a, int64_t nvec) {
  if (a.shape.rows <= 2 * device_attribute<cudaDevAttrMultiProcessorCount>()) return false;
  if constexpr (K == NormKind::kRms) {
    return nvec > kSliceVecs &&
           4 * nvec <= 3 * static_cast<int64_t>(kRegItems) * pow2_ceil(ceil_div(nvec, kRegItems));
  }
  if (nvec > kSliceVecs) return true;
  const int tpr = row_threads(nvec, kRegItems);
  return sizeof(T) == 2 && (tpr > kBlockThreads || (kSliceStagedP32<K, Quant::kNone, T, P> &&
                                                    tpr == kBlockThreads && a.plain_params<K>()));
}

template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
bool slices_fit(const FwdArgs& a, int64_t nvec, bool regs_ok) {
  if constexpr (XQ || sizeof(T) * VEC != 16) {
    return false;
  } else {
    constexpr int64_t kCtaVecs = kRegsCtaVecs<Q>;
    const int64_t min_vecs =
        kSliceOneCta<K, Q, P, VEC> || kSliceRowLnWarp<K, Q, T> || kSliceQuantWarp<K, Q, T> ||
                (kSliceOneCtaWarp<K, Q, T, P, VEC> && Q == Quant::kRow)
            ? kSliceOneCtaMinVecs
        : Q == Quant::kTensor || Q == Quant::kRow || (K == NormKind::kRms && Q == Quant::kGroup) ? kSliceMinVecs
        : Q == Quant::kNone && plain_slices<K, T, P>(a, nvec) ? 1
                                                               : kCtaVecs + 1;
    return regs_ok && !a.residual && !a.given_stats && nvec >= min_vecs && nvec <= kSliceVecs * kMaxCluster &&
           has_clusters();
  }
}

// RMSNorm's per-row FP8 of 16-bit x holds x * gamma (HOLD_Y) where one CTA
// of at least this many threads takes a row (hidden 8192 to 16384 in bf16).
// One build, the threshold from the environment, H100, us, two rounds, not
// held -> held: bf16 16384x8192 160.9 / 159.8 -> 154.1 / 153.1,
// 8192x16384 167.4 / 168.0 -> 154.3 / 154.0, 10922x12288 level (165.3 /
// 166.1 -> 164.7 / 166.9); float16 16384x8192 158.2 / 159.0 -> 153.6 /
// 154.2, 8192x16384 165.2 / 166.9 -> 155.2 / 154.2. Not taken: 128-thread
// CTAs (hidden 4096: 159.8 / 159.1 -> 166.7 / 166.4, float16 158.4 / 159.1
// -> 168.1 / 174.4, same-call A/B; 64 registers allow 8 such CTAs an SM
// against 12 at 40). Across a cluster it holds too, with both stages in
// flight: a row's stage takes the row after next once its sums are reduced
// (REFILL_AT_END, kRefillOwn). Same-call A/B on an H100, us, two rounds,
// not held -> held: bf16 2048x65536 189.9 / 189.1 -> 169.8 / 171.0,
// 512x262144 208.1 / 207.6 -> 186.0 / 188.5; float16 2048x65536 189.5 /
// 190.5 -> 175.5 / 175.9. Held alone (the next row's copy issued after the
// reduction, into the other stage) it was level there (194.6 / 190.7 ->
// 190.7 / 190.8 and 213.2 / 210.9 -> 211.1 / 208.4). Where one CTA takes
// the row, the same refill lost (16384x8192 155.0 / 155.4 -> 169.6 /
// 168.3, 8192x16384 158.5 / 154.7 -> 171.7 / 169.4).
// RMSNorm's per-group FP8 holds x * gamma by the same rule where one CTA
// takes the row (hidden 8192-16384 in 16-bit x): its output pass then reads
// neither the stage nor gamma. Same-call A/B,
// H100, bf16, us, two rounds: 8192x16384 165.3 / 164.2 -> 159.4 / 157.1
// (16384x8192, fwd_regs, level as it should be). Not across a cluster,
// where its sums pass then read gamma too: 2048x65536 176.6 / 176.6 ->
// 199.3 / 199.2, 512x262144 193.2 / 193.0 -> 196.5 / 197.8, float16
// 2048x65536 178.1 / 175.5 -> 197.6 / 198.7 (with the own-stage refill).
constexpr int kSliceRmsHoldThreads = 256;
// LayerNorm's per-row FP8 of bf16 x with its parameters held (ONE_CTA) and
// y in shared memory (kYSmem) where one CTA of at most this many threads
// takes the row (hidden 1024). First measured on an H100 from CTAs of up to
// 128 threads (hidden 1024 to 4096; same-call A/B, bf16, us, two rounds, y
// in registers -> in shared memory: 131072x1024 185.5 / 184.7 -> 178.1 /
// 177.5, 32768x4096 184.1 / 181.5 -> 178.4 / 177.9). On later code, on an
// H200, y in registers (as float16 x has it) won back the CTAs of 64-128
// threads: shared memory -> registers, 32768x4096 153.6 / 151.3 -> 141.7 /
// 142.8, 65536x2048 151.9 / 150.8 -> 150.7 / 146.6, 43690x3072 150.6 /
// 150.3 -> 151.5 / 150.6 (RESULTS.md 1zb). Not taken:
// CTAs of 256 (16384x8192 180.4 / 178.2 -> 184.0 / 185.1: three CTAs an
// SM by shared memory against four by registers), float16 x (32768x4096
// 184.2 / 181.7 -> 183.5 / 185.4, with a 4-byte spill). RESULTS.md 6z.
constexpr int kSliceYSmemThreads = 32;
// The per-row FP8 outputs of 16-bit x (parameters in x's dtype) whose rows
// span a cluster of 4 CTAs double it, each CTA half as wide: LayerNorm's at
// hidden 32769-65536, RMSNorm's of bf16 x where the 4 CTAs would have at
// most kSliceRowSplitThreads threads (hidden 32769-49152). Held at 64
// registers (HOLD_Y), CTAs of 384 threads fit two an SM (768 threads); of
// 192, five. Same-call A/B on an H200 (one build, an environment knob), us,
// four rounds over two calls, 4 CTAs -> 8: LayerNorm bf16 2730x49152 192.8 /
// 192.6 / 197.3 / 189.0 -> 185.4 / 184.8 / 185.5 / 184.5, 2048x65536 195.0 /
// 191.9 -> 183.3 / 183.6 (two rounds); float16 2730x49152 188.4 / 188.9 ->
// 183.9 / 181.4, 2048x65536 194.6 / 196.2 -> 185.3 / 183.7; RMSNorm bf16
// 2730x49152 152.1 / 153.0 / 151.1 / 153.4 -> 140.9 / 140.1 / 140.2 / 139.9.
// Not taken (RESULTS.md 1zc): LayerNorm's clusters of 2 (5461x24576 168.8 /
// 170.5 -> 182.4 / 184.5, 4096x32768 166.9 / 170.4 -> 177.1 / 176.7) and of 8
// (1365x98304 189.2 / 188.7 -> 198.6 / 200.1, 1024x131072 184.9 / 185.1 ->
// 189.8 / 189.6), one CTA a row split in 2 (8-16% slower at 6144-16384, both
// norms) or a cluster of 4 made 16; RMSNorm's rows of 512-thread CTAs
// (2048x65536 146.6 / 145.5 -> 148.3 / 148.0, 4096x32768 134.8 / 134.9 ->
// 138.3 / 138.9), its float16 x (2730x49152 137.1 / 139.8 -> 141.1 /
// 141.5), its clusters of 2
// (5461x24576 2% faster, 144.1-146.2 -> 139.8-142.3, left) and of 8
// (1365x98304 152.1 / 151.6 -> 153.8 / 156.1), and float32 parameters (one
// build with a knob, H200, bf16 x, us, two rounds: RMSNorm 3276x40960 148.8 /
// 146.8 -> 155.1 / 154.0, 2730x49152 145.4 / 146.6 -> 150.3 / 154.0;
// LayerNorm level there, 2048x65536 216.3 / 216.4 -> 210.9 / 210.2;
// RESULTS.md 1zf). float32 x and decode-time rows (a few clusters) were not
// measured.
constexpr int kSliceRowSplitThreads = 384;
template <NormKind K, Quant Q, class T, class P, int VEC>
ffi::Error launch_fwd_slices(cudaStream_t stream, const FwdArgs& a, int64_t nvec) {
  if constexpr (sizeof(T) * VEC != 16) {
    return ffi::Error::Internal("jax_rmsnorm: fwd_slices needs 16-byte packs");
  } else {
    int cluster = pow2_ceil(ceil_div(nvec, kSliceVecs));
    [[maybe_unused]] const bool staged =
        kSliceStagedParams<K, Q, P, VEC> && cluster >= kSliceStagedCluster && cluster < kMaxCluster &&
        a.plain_params<K>();
    [[maybe_unused]] const bool halves = staged && cluster * 2 <= kMaxCluster;  // STAGED_HALVES
    if (halves) cluster *= 2;
    [[maybe_unused]] const bool staged_p32 = kSliceStagedP32<K, Q, T, P> && a.plain_params<K>();
    if (staged_p32) cluster = std::min(kMaxCluster, 2 * cluster);
    if constexpr (Q == Quant::kRow && sizeof(T) == 2 && std::is_same_v<P, T>) {
      if (cluster == 4 &&
          (K == NormKind::kLayer ||
           (std::is_same_v<T, __nv_bfloat16> && ceil_div(nvec, cluster) <= kSliceRowSplitThreads * kSliceItems))) {
        cluster *= 2;  // kSliceRowSplitThreads
      }
    }
    // The row's packs spread evenly over the cluster's CTAs (row_threads of
    // a CTA's share), not a power of two of threads each, which left the last
    // CTAs few columns or none. Same-call A/B on an H100, bf16, us, one round, before
    // -> after: LayerNorm 2730x49152 226.6 -> 216.2, 1365x98304 228.2 ->
    // 216.4; per-tensor FP8 5461x24576 205.4 -> 177.6, 2730x49152 220.2 ->
    // 186.4; per row 234.4 -> 198.6 and 270.2 -> 221.8 (RMSNorm 181.6 ->
    // 169.8, 198.9 -> 174.4); in one CTA a row too (hidden 12288: RMSNorm
    // per row 165.8 -> 155.0, LayerNorm per tensor 169.4 -> 160.5). Not
    // RMSNorm's plain forward with its own copies (kSliceOwnCopies), which
    // lost: 2730x49152 201.1 / 199.4 -> 208.2 / 206.2 (RESULTS.md 1b).
    const int64_t share = ceil_div(nvec, cluster);  // packs of a CTA's slice
    const int tpr = kSliceOwnCopies<K, Q> ? pow2_ceil(ceil_div(share, kSliceItems)) : row_threads(share, kSliceItems);
    if (tpr % 32 != 0) return ffi::Error::Internal("jax_rmsnorm: fwd_slices takes whole warps");
    const size_t stage_bytes = static_cast<size_t>(tpr) * kSliceItems * 16;  // a CTA's slice of x
    size_t smem = 2 * stage_bytes;                                            // two stages
    constexpr bool kYSmemRow = kSliceOneCtaRow<K, Q, P, VEC> && std::is_same_v<T, __nv_bfloat16>;
    const bool ysmem = kYSmemRow && cluster == 1 && tpr <= kSliceYSmemThreads;
    if (ysmem) smem += 2 * stage_bytes;   // the pending row's y, as floats
    [[maybe_unused]] const bool staged_row =
        kSliceStagedRow<K, Q, T, P> && cluster > 1 && tpr <= kSliceStagedRowThreads && a.plain_params<K>();
    if (staged || staged_row) smem += 2 * stage_bytes;  // LayerNorm's gamma and beta packs
    if (staged_p32) smem += 2 * stage_bytes * (sizeof(P) * VEC / 16);  // as float32, two pieces a pack
    auto pick = [&](auto whole) {
      constexpr bool W = decltype(whole)::value;
      auto kernel = fwd_slices<K, Q, T, P, VEC, W>;
      if constexpr (kSliceOneCta<K, Q, P, VEC> || kSliceOneCtaGroup<K, Q, T, P, VEC>) {
        if (cluster == 1) kernel = fwd_slices<K, Q, T, P, VEC, W, true>;
      }
      if constexpr (kSliceOneCtaWarp<K, Q, T, P, VEC>) {
        if (cluster == 1 && tpr == 32) kernel = fwd_slices<K, Q, T, P, VEC, W, true>;
      }
      if constexpr (kSliceOneCtaPlain<K, Q, P, VEC> && sizeof(T) == 2) {
        if (cluster == 1 && tpr > kBlockThreads) kernel = fwd_slices<K, Q, T, P, VEC, W, true>;
      }
      if constexpr (kYSmemRow) {
        if (ysmem) kernel = fwd_slices<K, Q, T, P, VEC, W, true>;
      }
      if constexpr (kSliceRefillAtEnd<K, Q>) {
        if (cluster > 1) kernel = fwd_slices<K, Q, T, P, VEC, W, false, true>;
      }
      if constexpr (K == NormKind::kRms && kSliceHoldY<K, Q, T>) {
        if (cluster == 1 && tpr >= kSliceRmsHoldThreads) {
          kernel = fwd_slices<K, Q, T, P, VEC, W, false, false, false, true>;
        }
        if constexpr (Q == Quant::kRow) {
          if (cluster > 1) kernel = fwd_slices<K, Q, T, P, VEC, W, false, true, false, true>;
        }
      }
      if constexpr (Q == Quant::kRow && kSliceHoldY<K, Q, T> && !std::is_same_v<P, T>) {
        // The y-holding instance chosen above, held to kSliceRowRegs
        // (ROW_CAP) where that fits one more CTA an SM (row_cap_fits).
        if (row_cap_fits(tpr)) {
          if (kernel == fwd_slices<K, Q, T, P, VEC, W, false, true, false, true>) {
            kernel = fwd_slices<K, Q, T, P, VEC, W, false, true, false, true, false, true>;
          } else if (kernel == fwd_slices<K, Q, T, P, VEC, W, false, false, false, true>) {
            kernel = fwd_slices<K, Q, T, P, VEC, W, false, false, false, true, false, true>;
          }
        }
      }
      if constexpr (kSliceStagedP32<K, Q, T, P>) {
        if (staged_p32) kernel = fwd_slices<K, Q, T, P, VEC, W, false, true, true>;
      }
      if constexpr (kSliceStagedRow<K, Q, T, P>) {
        if (staged_row) kernel = fwd_slices<K, Q, T, P, VEC, W, false, true, true, true, true>;
      }
      if constexpr (kSliceStagedParams<K, Q, P, VEC>) {
        if (staged) {
          kernel = halves ? fwd_slices<K, Q, T, P, VEC, W, false, true, true, kSliceHoldY<K, Q, T>, true>
                          : fwd_slices<K, Q, T, P, VEC, W, false, true, true>;
        }
      }
      return kernel;
    };
    auto kernel = pick(std::false_type{});
    // WHOLE: every CTA's slice is whole packs inside the row (the row's packs
    // fill the cluster's threads exactly), so no pack asks whether it is in
    // the row. 16-bit x with parameters in x's dtype only: with float32
    // parameters most WHOLE instances spilled 4-24 bytes (none before), with
    // float32 x LayerNorm's per-row FP8 60-72.
    if constexpr (sizeof(T) == 2 && sizeof(P) == sizeof(T)) {
      if (fills_threads(nvec, VEC, a.shape.hidden, cluster, tpr, kSliceItems)) {
        kernel = pick(std::true_type{});
      }
    }
    int resident = 0;
    JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, dim3(tpr), smem, cluster, &resident));
    const int64_t used = std::max<int64_t>(1, std::min<int64_t>(a.shape.rows, resident));
    return launch_clustered(kernel, dim3(static_cast<unsigned>(used * cluster)), dim3(tpr), smem, stream, cluster,
                            "fwd_slices", a, used, cluster, inv_hidden(a));
  }
}

// fwd_decode's instance for the launch's parameters (PLAIN or not), residual
// add (R), packs a thread and split.
template <NormKind K, class T, int VEC, DecodeResid R = DecodeResid::kNone, int ITEMS = kDecodeItems,
          bool SPLIT = false>
auto decode_instance(bool plain) {
  return plain ? fwd_decode<K, T, VEC, ITEMS, true, SPLIT, R> : fwd_decode<K, T, VEC, ITEMS, false, SPLIT, R>;
}

// Whether fwd_regs' P32 instance (CTAs of kP32Threads, kP32MinCtas
// resident) takes the rows, at every row count: neither with the residual add
// (two passes there) nor with given statistics (layer_norm_apply), which were
// not measured in it.
//  * LayerNorm's plain forward of 16-bit x with float32 parameters in rows of
//    kP32Threads or kP32RowThreads threads (see kP32Threads).
//  * RMSNorm's per-row FP8 of 16-bit x in rows of 16 to kP32RowThreads
//    threads (hidden 264-2048 in packs of 8) goes to fwd_regs' P32 CTAs of
//    128 (two to eight rows each, seven CTAs resident), not to fwd_regs'
//    CTAs of 512 (hidden up to 1024) or fwd_slices (2048). Same-call A/B on
//    an H200, two rounds, us: rows of 64 threads, fwd_slices -> P32, bf16
//    87381x1536 168.2 / 170.1 -> 153.8 / 152.1, 65536x2048 136.8 / 136.1 ->
//    133.2 / 132.6, float16 65536x2048 137.4 / 136.4 -> 131.7 / 132.0
//    (RESULTS.md 1zb); rows of 16 and 32, CTAs of 512 -> P32, bf16
//    262144x512 134.0 / 133.7 -> 125.6 / 126.8, 131072x1024 134.4 / 134.6
//    -> 126.7 / 125.1, float16 131072x1024 134.7 / 134.4 -> 125.6 / 126.2
//    (RESULTS.md 1zc). Not taken: rows of 96 threads (43690x3072 from
//    fwd_slices, bf16 129.7 / 130.0 -> 135.2 / 136.0, float16 127.5 / 134.9
//    -> 136.2 / 135.2) and of 128 (32768x4096 130.0 / 129.5 -> 135.2 /
//    135.0), LayerNorm's per row at 2048-4096 (10-21% slower), float32
//    parameters, the residual add and given statistics (not measured), and
//    rows under 16 threads (hidden 256 and less, not measured). The latency
//    of decode-time rows (a few CTAs) in this instance is not measured.
template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
constexpr bool kP32LayerParams =
    K == NormKind::kLayer && Q == Quant::kNone && !XQ && sizeof(T) == 2 && std::is_same_v<P, float>;
template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
constexpr bool kP32RmsRow =
    K == NormKind::kRms && Q == Quant::kRow && !XQ && sizeof(T) == 2 && sizeof(T) * VEC == 16 && std::is_same_v<P, T>;
// The row's threads in the P32 instance (row_threads), or 0 where it does not take the rows.
template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
int p32_row_threads(const FwdArgs& a, int64_t nvec) {
  if (a.residual || a.given_stats) return 0;
  const int tpr = row_threads(nvec, kRegItems);
  if constexpr (kP32LayerParams<K, Q, T, P, VEC, XQ>) return tpr == kP32Threads || tpr == kP32RowThreads ? tpr : 0;
  if (nvec == kSliceOneCtaMinVecs && has_clusters()) return 0;  // fwd_slices' one-warp CTAs (kSliceOneCtaWarp)
  return tpr >= 16 && tpr <= kP32RowThreads ? tpr : 0;  // kP32RmsRow
}

template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
ffi::Error launch_fwd_vec(cudaStream_t stream, const FwdArgs& a) {
  const int64_t nvec = a.shape.hidden / VEC;
  // Groups are taken by shuffles in fwd_regs when they span a power of two of
  // at most 32 lanes; other group sizes stream.
  int lanes = 1;
  bool regs_ok = true;
  if constexpr (Q == Quant::kGroup) {
    lanes = static_cast<int>(a.group_size / VEC);
    regs_ok = a.group_size % VEC == 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0;
  }
  constexpr int64_t kCtaVecs = kRegsCtaVecs<Q>;
  if constexpr (kP32LayerParams<K, Q, T, P, VEC, XQ> || kP32RmsRow<K, Q, T, P, VEC, XQ>) {
    if (const int tpr = p32_row_threads<K, Q, T, P, VEC, XQ>(a, nvec); tpr > 0) {
      dim3 grid, block;
      JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, tpr, kP32Threads, &grid, &block));
      fwd_regs<K, Q, T, P, VEC, XQ, false, true><<<grid, block, 0, stream>>>(a, 1);
      return check_launch("fwd_regs (CTAs of kP32Threads)");
    }
  }
  if (regs_ok && nvec <= kCtaVecs && !slices_fit<K, Q, T, P, VEC, XQ>(a, nvec, regs_ok)) {
    // Whole warps beyond one (row_threads), not a power of two of threads:
    // fewer threads without columns. Same-call A/B on an H100, bf16, us, one
    // round, before -> after: LayerNorm 43690x3072 200.0 -> 192.0, 26214x5120
    // 216.0 -> 191.5, 21845x6144 203.8 -> 191.8; RMSNorm 26214x5120 197.3 ->
    // 193.3, 10922x12288 197.7 -> 191.7. With a residual a power of two
    // still: add_ln 10922x12288 lost, 420.2 / 417.2 -> 447.5 / 448.0 (two
    // rounds), though 26214x5120 gained, 424.9 / 421.9 -> 390.7 / 390.2
    // (RESULTS.md 1b). Rows of 1025-2048 packs with a residual keep one CTA:
    // a cluster of 2 or 4 smaller CTAs a row lost 5-20% at 8192x16384 and
    // 24-39% at 10922x12288, with or without FP8 (RESULTS.md 6, "Latest").
    const int tpr =
        std::max<int>(lanes, a.residual ? pow2_ceil(ceil_div(nvec, kRegItems)) : row_threads(nvec, kRegItems));
    dim3 grid, block;
    JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, tpr, kBlockThreads, &grid, &block));
    if constexpr (Q == Quant::kNone && !XQ && sizeof(P) == sizeof(T)) {
      // Parameters loaded early (see fwd_regs) when the CTAs are few: at most
      // two per SM. Same-run latency on an H100, bf16, us per norm, plain ->
      // early: 256x8192 RMSNorm 4.7 -> 4.2, LayerNorm 5.8 -> 5.1-5.4;
      // 512x4096 4.6-4.7 -> 4.1-5.0 and 5.8 -> 5.0; at four CTAs per SM
      // (512x8192) slower: 5.9 -> 6.8 and 6.9 -> 8.8. Below half the SMs it
      // replaces parameters staged in shared memory by cp.async (16x4096
      // LayerNorm 4.0-4.1 -> 3.6-3.7 us). float32 parameters for 16-bit x
      // were not measured and keep the plain kernel.
      //
      // Where the rows alone are at most two per SM and fwd_decode (below)
      // does not apply (parameter groups, given statistics), CTAs of kDecodeThreads
      // (one row each from hidden 4096 in bf16), not kBlockThreads: more SMs
      // loading at once. Latency on an H100, bf16, us per norm, two rows a
      // CTA -> one: 16x4096 RMSNorm 2.8 -> 2.6, LayerNorm 3.7 -> 3.3; at 64
      // and 256 rows the same within noise. Two or four times the threads per
      // row (fewer packs each) and clusters of 2 or 4 CTAs a row were slower
      // (256x4096 LayerNorm 4.3, 7.1; 6.2, 8.9 us, against 4.1-4.7).
      const int sms = device_attribute<cudaDevAttrMultiProcessorCount>();
      // The norm where the rows alone are at most two per SM: fwd_decode.
      // With the residual add too (not in its variant of four packs a
      // thread), where fwd_regs (several rows a CTA, parameters loaded after
      // the reductions) took 5.1-7.1 us. Nsight Compute kernel times on an
      // H100, bf16, median of calls 2-5, us, fwd_regs -> fwd_decode (R =
      // kSame, two rounds): add_rms 16x4096 5.52 -> 3.15 / 3.15, 64x4096
      // 5.66 -> 3.22 / 3.23, 32x8192 5.66 -> 3.49 / 3.52, 256x4096 5.94 ->
      // 3.79 / 3.74; add_ln 6.80 -> 3.44 / 3.44, 64x4096 6.88 -> 3.39 / 3.39,
      // 32x8192 6.98 -> 3.94 / 3.97, 256x4096 7.10 -> 4.14 / 4.18. XLA runs
      // the jnp composition as two kernels, h's and then the norm's reading
      // h: 5.5-7.5 us a call at 16-256 rows of 4096/8192. Testing the dtypes
      // at each pack (R = kAny for all) cost 0.1-0.2 us (add_rms 16x4096
      // 3.39 / 3.33). LayerNorm's rows split into 2-4 parts, or RMSNorm's
      // into 2-16, were level or slower (add_rms 16x4096 in 4: 3.30; 32x8192
      // in 8: 4.37); so were clusters of 2 or 4 CTAs a row, each CTA loading
      // only its part, with the sums exchanged through distributed shared
      // memory (0.8-1.0 us slower: add_rms 16x4096 3.20 -> 4.03, 4.03;
      // 256x4096 3.84 -> 4.74, 6.82). RESULTS.md table 3.
      const bool wide_decode = nvec > kDecodeItems * kDecodeWideThreads && a.shape.rows > sms;
      if (!a.given_stats && a.shape.groups == 1 && sms > 0 && a.shape.rows <= 2 * sms &&
          a.shape.rows * a.shape.hidden <= INT32_MAX && nvec <= kDecodeItems * kMaxRowThreads &&
          !(a.residual && wide_decode)) {
        // Rows of more than kDecodeItems * kDecodeWideThreads packs, more
        // than one a SM: CTAs of 1024 threads fit one a SM (52-60 registers),
        // so those rows ran in two waves; half the threads with twice the
        // packs fit two (64 registers, no spills, for float32 and RMSNorm;
        // LayerNorm in 16 bits would spill and keeps the 1024 threads).
        // PLAIN: gamma (and beta) given, not zero-centred, in an instance
        // with nothing left to decide a pack (LayerNorm bf16: 528 -> 423
        // instructions a warp). Same-call A/B on an H100, ncu kernel times,
        // bf16, us, five calls, two rounds: LayerNorm 16x4096 3.71-3.94 ->
        // 3.49-3.68, 64x8192 4.29-4.45 -> 4.06-4.32, 256x4096 4.22-4.48 ->
        // 4.16-4.42; RMSNorm level (16x4096 3.04-3.68 -> 3.01-3.58).
        const bool plain = a.plain_params<K>();
        auto kernel = decode_instance<K, T, VEC, DecodeResid::kNone>(plain);
        auto threads_for = [&](int items) { return std::max(32, pow2_ceil(static_cast<int>(ceil_div(nvec, items)))); };
        int threads = threads_for(kDecodeItems), parts = 1;
        if (wide_decode) {
          if constexpr (sizeof(T) == 4 || K == NormKind::kRms) {
            kernel = decode_instance<K, T, VEC, DecodeResid::kNone, 2 * kDecodeItems>(plain);
            threads = kDecodeWideThreads;
          }
        } else if (a.residual) {
          const bool same = sizeof(T) == 4 || (!a.residual_f32 && !a.h_f32);
          kernel = same ? decode_instance<K, T, VEC, DecodeResid::kSame>(plain)
                        : decode_instance<K, T, VEC, DecodeResid::kAny>(plain);
          if constexpr (K == NormKind::kRms) {
            // RMSNorm's rows with the add, of at most kMaxRowThreads packs:
            // one pack a thread, twice the warps, each with half the loads
            // and stores. Same build, env knob, Nsight Compute kernel times
            // on an H100, bf16, median of calls 2-5, us, two rounds, two
            // packs -> one: 16x4096 3.15 / 3.17 -> 2.99 / 2.99, 64x4096 3.14
            // / 3.14 -> 2.98 / 3.02, 16x8192 3.55 / 3.57 -> 3.49 / 3.52,
            // 32x8192 3.66 / 3.68 -> 3.58 / 3.58, 256x4096 3.81 / 3.82 ->
            // 3.76 / 3.81; with h in float32 (R = kAny) 16x4096 3.42 / 3.42 ->
            // 3.25 / 3.23, 32x8192 4.40 / 4.37 -> 4.21 / 4.22, 256x4096 5.36 /
            // 5.28 -> 4.62 / 4.59. LayerNorm's rows lost at hidden 8192
            // (1024 threads: 32x8192 3.92 -> 4.22) and at 256x4096 (4.19 ->
            // 4.43), and four packs a thread spilled and lost everywhere
            // (RESULTS.md table 3).
            if (nvec <= kMaxRowThreads) {
              kernel = same ? decode_instance<K, T, VEC, DecodeResid::kSame, 1>(plain)
                            : decode_instance<K, T, VEC, DecodeResid::kAny, 1>(plain);
              threads = threads_for(1);
            }
          }
        } else if (K == NormKind::kLayer || threads >= kDecodeSplitMinThreads) {
          // Rows of at most a quarter of the SMs are split into parts (each
          // CTA reads its row, and loads the parameters of and writes a
          // part): more SMs load the parameters and store y at once.
          // LayerNorm's rows at every width; RMSNorm's, with gamma alone,
          // only in CTAs of kDecodeSplitMinThreads or more. Nsight Compute
          // kernel times on an H100, bf16, same build, us, two rounds, one
          // CTA a row -> parts: 1x8192 3.07 / 3.04 -> 2.85 / 2.85 (4 parts),
          // 8x8192 3.06 / 3.02 -> 2.90 / 2.90 (4), 16x8192 3.12 / 3.10 ->
          // 2.99 / 2.99 (4), 32x8192 3.20 / 3.18 -> 3.10 / 3.14 (2),
          // 16x16384 3.81 / 3.79 -> 3.46 / 3.46 (4), 32x16384 3.84 / 3.82 ->
          // 3.62 / 3.60 (2); in CTAs of 256 threads level or slower (16x4096
          // 2.85 / 2.83 -> 2.90 / 2.88 in 2 parts, 32x4096 2.91 / 2.88 ->
          // 3.02 / 3.01 in 4). Four packs a thread, with or without parts,
          // were slower (16x8192 3.10-3.14). Not with the residual add,
          // where the split was level or slower (RESULTS.md table 3).
          parts = pow2_floor(static_cast<int>(std::clamp<int64_t>(sms / (2 * a.shape.rows), 1, kDecodeMaxParts)));
          if (parts > 1) kernel = decode_instance<K, T, VEC, DecodeResid::kNone, kDecodeItems, true>(plain);
        }
        return launch_early(kernel, dim3(static_cast<unsigned>(a.shape.rows), parts), dim3(threads), stream,
                            "fwd_decode", a);
      }
      if (!a.residual && (a.gamma || a.beta) && block.x * block.y <= kEarlyThreads && sms > 0 &&
          grid.x <= 2u * sms) {
        if (a.shape.rows <= 2 * sms) JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, tpr, kDecodeThreads, &grid, &block));
        fwd_regs<K, Q, T, P, VEC, XQ, true><<<grid, block, 0, stream>>>(a, 1);
        return check_launch("fwd_regs (early parameters)");
      }
    }
    fwd_regs<K, Q, T, P, VEC, XQ><<<grid, block, 0, stream>>>(a, 1);
    return check_launch("fwd_regs");
  }
  // Persistent slots walking rows (fwd_slices): the plain norm's rows too
  // wide for one CTA, and per-tensor and per-row FP8 output from
  // kSliceMinVecs packs (LayerNorm's per tensor, parameters held, and its
  // per row in bf16 from kSliceOneCtaMinVecs).
  if (slices_fit<K, Q, T, P, VEC, XQ>(a, nvec, regs_ok)) return launch_fwd_slices<K, Q, T, P, VEC>(stream, a, nvec);
  // With a residual or given statistics: two passes, each at about a copy's speed.
  if (two_pass_fits<K, Q, T, VEC, XQ>(a, nvec, kCtaVecs)) return launch_fwd_two_pass<K, Q, T, P, VEC>(stream, a, nvec);
  // One cluster per row, of CTAs of at most kClusterCtaThreads threads (smaller
  // CTAs than the single-CTA path: more of them resident per SM).
  constexpr int64_t kClusterCtaVecs = static_cast<int64_t>(kClusterCtaThreads) * kRegItems;
  if (regs_ok && VEC > 1 && nvec <= kClusterCtaVecs * kMaxCluster && has_clusters()) {
    const int cluster = pow2_ceil(ceil_div(nvec, kClusterCtaVecs));
    const int tpr = std::max<int>(lanes, pow2_ceil(ceil_div(nvec, cluster * kRegItems)));
    const int64_t blocks = a.shape.rows * cluster;
    if (blocks > INT32_MAX) return too_many_rows();
    return launch_clustered(fwd_regs<K, Q, T, P, VEC, XQ>, dim3(static_cast<unsigned>(blocks)), dim3(tpr), 0,
                            stream, cluster, "fwd_regs (clusters)", a, cluster);
  }
  if (a.shape.rows > INT32_MAX) return too_many_rows();
  fwd_stream<K, Q, T, P, VEC, XQ><<<static_cast<unsigned>(a.shape.rows), kStreamThreads, 0, stream>>>(a);
  return check_launch("fwd_stream");
}

// amax (one float per tensor, if wanted) is merged into atomically: zeroed
// first, in the stream.
inline ffi::Error zero_amax(cudaStream_t stream, const FwdArgs& a) {
  if (a.amax == nullptr) return ffi::Error::Success();
  cudaError_t e = cudaMemsetAsync(a.amax, 0, static_cast<size_t>(a.tensors) * sizeof(float), stream);
  return e == cudaSuccess ? ffi::Error::Success() : cuda_error(e, "cudaMemsetAsync(amax)");
}

// Whether the forward without FP8 or with per-tensor or per-row FP8 takes
// fwd_unaligned: a width that is not a multiple of a 16-byte pack, x and y
// or q (and the residual and h) 16-byte aligned (as XLA allocates them),
// rows of at most kMaxRowThreads * kRegItems packs, no FP8 input or given
// statistics. (q's packs then lie on VEC-byte boundaries where x's lie on
// 16-byte ones: the same columns.)
template <class T>
bool unaligned_fits(const FwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  return !a.x_fp8 && !a.given_stats && a.shape.rows > 0 && a.shape.hidden % kVec != 0 && aligned16(a.x) &&
         aligned16(a.y) && (!a.residual || (aligned16(a.residual) && aligned16(a.h))) &&
         ceil_div(a.shape.hidden, kVec) <= kMaxRowThreads * kRegItems;
}

template <NormKind K, Quant Q, class T, class P>
ffi::Error launch_fwd_unaligned(cudaStream_t stream, const FwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const int tpr = std::max(kVec, row_threads(ceil_div(a.shape.hidden, kVec), kRegItems));
  dim3 grid, block;
  JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, tpr, kBlockThreads, &grid, &block));
  fwd_unaligned<K, Q, T, P><<<grid, block, 0, stream>>>(a);
  return check_launch("fwd_unaligned");
}

template <NormKind K, Quant Q, class T, class P>
ffi::Error launch_fwd_quant(cudaStream_t stream, const FwdArgs& a) {
  if constexpr (Q == Quant::kTensor) {
    JRN_RETURN_IF_ERROR(zero_amax(stream, a));
    if (a.shape.rows == 0) return ffi::Error::Success();
  }
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = a.shape.hidden % kVec == 0 && aligned16(a.x) && aligned16(a.y) && params_aligned16(a) &&
                      (!a.residual || (aligned16(a.residual) && aligned16(a.h))) &&
                      (Q != Quant::kGroup || a.group_size % kVec == 0) &&
                      (!a.x_fp8 || a.x_group % kVec == 0);
  if constexpr (Q == Quant::kNone) {
    // FP8 input: only without FP8 output (checked by the decoder).
    const int64_t packs = a.shape.hidden / kFp8Vec;
    if (a.x_fp8 && !a.residual && !a.given_stats && a.shape.hidden % kFp8Vec == 0 &&
        a.x_group % kFp8Vec == 0 && packs <= kMaxRowThreads * kRegItems && aligned16(a.x) && aligned16(a.y) &&
        params_aligned16(a)) {
      const int tpr = pow2_ceil(ceil_div(packs, kRegItems));
      dim3 grid, block;
      JRN_RETURN_IF_ERROR(row_grid(a.shape.rows, tpr, kBlockThreads, &grid, &block));
      fwd_fp8_regs<K, T, P><<<grid, block, 0, stream>>>(a);
      return check_launch("fwd_fp8_regs");
    }
    if (a.x_fp8) {
      return vec_ok ? launch_fwd_vec<K, Q, T, P, kVec, true>(stream, a)
                    : launch_fwd_vec<K, Q, T, P, 1, true>(stream, a);
    }
  }
  if constexpr (Q != Quant::kGroup) {  // a group size dividing such a width is no multiple of a pack
    if (!vec_ok && unaligned_fits<T>(a)) return launch_fwd_unaligned<K, Q, T, P>(stream, a);
  }
  return vec_ok ? launch_fwd_vec<K, Q, T, P, kVec, false>(stream, a)
                : launch_fwd_vec<K, Q, T, P, 1, false>(stream, a);
}

// scale_inv[t] = quant_scale(amax[t]), in place.
__global__ void amax_to_scale_inv(float* amax, int64_t tensors, Fp8 fmt, float ub) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tensors;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    amax[t] = quant_scale(amax[t], fmt, ub);
}

// Current scaling, in three launches on the stream: a measuring pass that
// writes amax and the rows' statistics, amax turned into scale_inv, then a
// quantizing pass, q = y / scale_inv:
// - measured by x_amax (norm_stats.cu), a read-only kernel, for RMSNorm and
//   for LayerNorm at widths that are not a multiple of a pack; by the
//   per-tensor kernel with no output for LayerNorm at the other widths (and
//   wherever there is a residual, given statistics or FP8 input);
// - quantized by quantize_tiles (fp8_transpose.cu) where it fits, RMSNorm,
//   or either norm with the transposed copy q_t (written with q); else by
//   x_quantize, row by row from the statistics measured; else (a residual,
//   given statistics, FP8 input, unaligned buffers) the per-tensor kernel
//   again, h written. q_t, where the tiles did not write it, is a transpose
//   of q.
// H100, bf16, 2^27 elements, same-call A/B, us: quantize_tiles took
// rms_fp8_current_t 1024 347.5 -> 302.1, 4096 359.2 -> 302.6, 16384 353.7 ->
// 302.9, 65536 373.6 -> 304.4; ln_fp8_current_t 442.9 -> 386.6, 412.9 ->
// 372.8, 448.0 -> 392.9, 516.2 -> 429.7. x_amax took rms_fp8_current (both
// passes) 1024 264.2 -> 250.7, 4096 270.9 -> 262.7, 16384 276.0 -> 254.2,
// 65536 319.4 -> 272.1, 262144 403.0 -> 323.0, where the per-tensor kernels
// computed y for nothing but its max. LayerNorm's x_amax reads each row twice
// (its max |y| needs the mean first) and measures slower than the per-tensor
// kernel where the width is a multiple of a pack; where it is not, that
// kernel is fwd_unaligned, slower still. H200, bf16, same-call A/B, us
// (RESULTS.md 6zd): LayerNorm measured by x_amax at every width, against the
// per-tensor kernel, ln_fp8_current_t 1024 347.9 -> 372.6, 4096 353.5 ->
// 358.4, 16384 349.8 -> 365.5, 65536 372.5 -> 394.7; with the row held in
// registers instead of read twice (up to 8 packs a thread, 73-77 registers,
// rows of up to 2048 packs), against the same per-tensor kernel, also
// slower: ln_fp8_current 1024 254.3 -> 312.8, 4096 254.5 -> 274.3, 8192
// 255.6 -> 275.1, 16384 253.0 -> 279.4 (RESULTS.md 6ze; not kept). At
// 10919x12290 its measuring pass took 137.5 us in x_amax (Nsight Compute),
// about 110 less than in fwd_unaligned: ln_fp8_current 516.7 -> 405.8, then
// 263.1 with x_quantize too (ln_fp8_current_t 675.3 -> 430.9). x_quantize against the
// per-tensor kernel's second pass: rms_fp8_current 10919x12290 264.5 ->
// 194.5, 32700x4104 208.1 -> 189.7; ln_fp8_current (measured by the
// per-tensor kernel) 1024 280.2 -> 254.6, 4096 286.8 -> 257.0, 65536 325.9 ->
// 289.6.
template <NormKind K, class T, class P>
ffi::Error launch_fwd_current(cudaStream_t stream, const FwdArgs& a) {
  FwdArgs measure = a;
  measure.quant = Quant::kTensor;
  measure.no_output = true;
  constexpr int kVec = 16 / sizeof(T);
  const bool by_rows = !a.residual && !a.given_stats && !a.x_fp8;
  // LayerNorm's per-tensor kernel measures faster where the width is a
  // multiple of a pack (x_amax reads each row twice).
  if (by_rows && (K == NormKind::kRms || a.shape.hidden % kVec != 0)) {
    JRN_RETURN_IF_ERROR(zero_amax(stream, a));
    if (a.shape.rows > 0) JRN_RETURN_IF_ERROR((launch_fwd_amax<K, T, P>(stream, measure)));
  } else {
    JRN_RETURN_IF_ERROR((launch_fwd_quant<K, Quant::kTensor, T, P>(stream, measure)));
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((a.tensors + 255) / 256, 1024));
  amax_to_scale_inv<<<blocks, 256, 0, stream>>>(a.amax, a.tensors, a.fp8, a.scale_ub);
  JRN_RETURN_IF_ERROR(check_launch("amax_to_scale_inv"));
  if (a.shape.rows == 0) return ffi::Error::Success();
  // q (and q_t) from the statistics the measuring pass wrote (see above).
  if ((K == NormKind::kRms || a.qt) && quantize_tiles_fit(a)) return launch_quantize_tiles<K, T, P>(stream, a);
  if (by_rows && aligned16(a.x) && aligned16(a.y)) {
    JRN_RETURN_IF_ERROR((launch_quantize_rows<K, T, P>(stream, a)));
  } else {
    FwdArgs quantize = a;
    quantize.quant = Quant::kTensor;
    quantize.scale = a.amax;
    quantize.scale_inverted = true;
    quantize.amax = nullptr;
    JRN_RETURN_IF_ERROR((launch_fwd_quant<K, Quant::kTensor, T, P>(stream, quantize)));
  }
  if (!a.qt) return ffi::Error::Success();
  return launch_transpose8(stream, a.y, a.qt, a.tensors, a.rows_per_tensor(), a.shape.hidden);
}

}  // namespace

template <NormKind K, class T, class P>
ffi::Error launch_fwd(cudaStream_t stream, const FwdArgs& a) {
  switch (a.quant) {
    case Quant::kNone: return launch_fwd_quant<K, Quant::kNone, T, P>(stream, a);
    case Quant::kTensor: return launch_fwd_quant<K, Quant::kTensor, T, P>(stream, a);
    case Quant::kRow: return launch_fwd_quant<K, Quant::kRow, T, P>(stream, a);
    case Quant::kGroup: return launch_fwd_quant<K, Quant::kGroup, T, P>(stream, a);
    case Quant::kCurrent: return launch_fwd_current<K, T, P>(stream, a);
  }
  return ffi::Error::InvalidArgument("jax_rmsnorm: unknown quantization mode");
}

}  // namespace jrn::cuda

// Used inside namespace jrn::cuda by norm_fwd_{rms,layer}_*.cu.
#define JRN_INSTANTIATE_FWD(K, T, P) \
  template ffi::Error launch_fwd<K, T, P>(cudaStream_t, const FwdArgs&);
