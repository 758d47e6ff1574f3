// Backward kernels.
//
//   xhat = (x - mean) * rstd,  gdy = dy * scale
//   dx   = rstd * (gdy - mean(gdy) - xhat * mean(gdy * xhat))   (LayerNorm)
//   dx   = rstd * (gdy - xhat * mean(gdy * xhat))               (RMSNorm)
//   dgamma = sum_rows dy * xhat,  dbeta = sum_rows dy
//   dx  += dh  (fused residual add: the gradient of h = x + residual)
//
// Kernels: bwd_decode (a few rows: one row a CTA, or a cluster of CTAs for a
// few wide rows, nothing persistent, and
// dgamma/dbeta summed by columns in further CTAs of the same launch),
// bwd_regs (rows of up to 64 packs, several rows per CTA, dgamma
// sums in registers), bwd_slices (wider aligned rows on sm_90+: each slot is a
// CTA or a thread block cluster that walks its rows, each CTA bulk-copying its
// slice of the next row into shared memory and keeping its dgamma sums in
// registers; row sums pushed across the cluster into each CTA's shared memory,
// ClusterPush), and bwd_stream (the rest: rows streamed twice).
//
// dgamma/dbeta are reduced without atomics: each "slot" (one row of threads of
// a CTA) walks a fixed set of rows and keeps its column sums, written to its
// own row of the float32 workspace (bwd_slices with one CTA per SM: the CTAs
// of a cluster fold theirs into one row first); bwd_reduce then adds the rows
// column by column in a fixed order. The result is bitwise reproducible run to run.
// Groups of few rows outside bwd_decode get no workspace: bwd_columns,
// launched after the dx kernel, sums dgamma/dbeta column by column from x
// and dy, also in a fixed order.
//
// With `coef` (the hidden dim split across devices) the kernels take the row
// means c1 = mean(gdy * xhat) and, for LayerNorm, c2 = mean(gdy) of the whole
// row from it (row_coefs).
//
// This header is the backward's code; norm_bwd_{f32,bf16,f16}.cu instantiate
// launch_bwd for both normalizations, one translation unit for each type of
// x, that compile in parallel.
#pragma once

#include <numeric>
#include <type_traits>

#include "device_utils.cuh"
#include "launch.h"

namespace jrn::cuda {
namespace {

constexpr int kRegItems = 2;  // packs per thread in bwd_regs
constexpr int kRegThreads = 512;
constexpr int kStreamThreads = 512;
constexpr int kBlockThreads = 256;
// bwd_reduce: 32 lanes x kReduceSplit threads a CTA, kReduceUnroll loads in
// flight per thread, parts of kReduceRows slots in the first of two passes.
constexpr int kReduceLanes = 32, kReduceSplit = 8, kReduceUnroll = 4;
constexpr int64_t kReduceRows = kReduceSplit * kReduceUnroll;
constexpr int kSliceItems = 4;  // packs per thread in bwd_slices
constexpr int kSliceThreads = 512;
constexpr int kDecodeMaxThreads = 1024;  // bwd_decode's CTA at most (one row)

// The row sums of the backward, acc = {sum(g * xhat), sum(g)}, g = dy * scale,
// over the row's threads (and its cluster's CTAs): RMSNorm needs only the
// first, so it reduces one value (the second is then dead code).
template <NormKind K>
constexpr int kGradSums = K == NormKind::kLayer ? 2 : 1;

// WIDE: cta_sum (bwd_slices: whole warps).
template <NormKind K, bool WIDE = false>
__device__ __forceinline__ void grad_row_sums(float (&acc)[2], float* smem,
                                              ClusterPush<kGradSums<K>>* exchange = nullptr, int buf = 0) {
  float(&sums)[kGradSums<K>] = reinterpret_cast<float(&)[kGradSums<K>]>(acc);
  if constexpr (WIDE) {
    cta_sum<kGradSums<K>>(sums, smem);
  } else {
    row_sum<kGradSums<K>>(sums, smem);
  }
  if (exchange) exchange->sum(sums, buf);  // a cluster of one: nothing to add
}

// The same, then, where `clustered`, the CTAs' sums added over the cluster by
// cluster_sum (each CTA's pulled from its `xchg`, parity 0): for kernels of
// one row a cluster that take these sums once (bwd_decode's split rows).
template <NormKind K, bool WIDE = false>
__device__ __forceinline__ void grad_row_sums(float (&acc)[2], float* smem, float (*xchg)[kGradSums<K>],
                                              bool clustered) {
  grad_row_sums<K, WIDE>(acc, smem);
  if (clustered) cluster_sum<kGradSums<K>>(reinterpret_cast<float(&)[kGradSums<K>]>(acc), xchg, 0);
}

// p[0] + p[stride] + ... + p[(n - 1) * stride], added in that order: the
// fixed order that makes the column sums' totals the same run to run.
__device__ __forceinline__ float ordered_sum(const float* p, int n, int stride) {
  float total = 0.f;
#pragma unroll 8
  for (int k = 0; k < n; ++k) total += p[k * stride];
  return total;
}

// The row's (c1, c2) = (mean(gdy * xhat), mean(gdy); c2 = 0 for RMSNorm):
// given in a.coef (grad_sums_per_row values a row, combined across the
// devices that split the hidden dim) or from the row's own sums `acc`.
// `read` false: the row is past the end (no coefficients to read).
template <NormKind K>
__device__ __forceinline__ void row_coefs(const BwdArgs& a, int64_t row, bool read, const float (&acc)[2],
                                          float* c1, float* c2) {
  constexpr int kGiven = grad_sums_per_row(K);
  const int64_t H = a.shape.hidden;
  *c1 = a.coef ? (read ? a.coef[kGiven * row] : 0.f) : acc[0] / static_cast<float>(H);
  *c2 = K != NormKind::kLayer ? 0.f : a.coef ? (read ? a.coef[kGiven * row + 1] : 0.f) : acc[1] / static_cast<float>(H);
}

// Slots [0, used) of group blockIdx.y; `stride` is the slot count the
// workspace was allocated with.
struct SlotLayout {
  int64_t used;
  int64_t stride;
};

__device__ __forceinline__ float* slot_row(const BwdArgs& a, SlotLayout l, int64_t slot, int out) {
  const int64_t H = a.shape.hidden, K = a.param_outputs();
  return a.workspace + ((blockIdx.y * l.stride + slot) * K + out) * H;
}

// dx of a pack of VEC columns (x, dy and the scales as floats) into `out`,
// and the pack's dy * xhat and dy added to its dgamma and dbeta sums.
// FOLD (LayerNorm): rstd * (g - c2 - xh * c1) as g * rstd + (xh * k1 + k0),
// k1 = -c1 * rstd and k0 = -c2 * rstd the row's, one instruction a column
// fewer (bwd_slices' LEAN).
template <NormKind K, int VEC, bool FOLD = false>
__device__ __forceinline__ void grad_dx(float (&out)[VEC], float (&dg)[VEC], float (&db)[VEC], const float (&xv)[VEC],
                                        const float (&d)[VEC], const float (&s)[VEC], float mean, float rstd,
                                        float c1, float c2) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    // xhat as one FFMA, x * rstd - mean * rstd. With grad_sums_scaled this
    // cut LayerNorm's bf16 cluster row loop from 1172 to 1112 instructions
    // (sm_90 SASS). Same-call A/B on an H200, bf16, us, two rounds: ln_bwd
    // 32768x4096 221.6 / 221.0 -> 219.5 / 216.6, 2048x65536 268.2 / 258.9
    // -> 256.0 / 254.5, 512x262144 278.1 / 279.4 -> 272.6 / 272.2; RMSNorm
    // level (RESULTS.md 1t).
    const float xh = fmaf(xv[j], rstd, -mean * rstd);
    if constexpr (FOLD && K == NormKind::kLayer) {
      out[j] = fmaf(d[j] * s[j], rstd, fmaf(xh, -c1 * rstd, -c2 * rstd));
    } else {
      out[j] = rstd * (d[j] * s[j] - c2 - xh * c1);
    }
    dg[j] += d[j] * xh;
    if constexpr (K == NormKind::kLayer) db[j] += d[j];
  }
}

// out += dh[idx .. idx + VEC): the residual's gradient, added before dx is stored.
template <int VEC, class T>
__device__ __forceinline__ void add_dh(const BwdArgs& a, int64_t idx, float (&out)[VEC]) {
  float d[VEC];
  load_pack<VEC>(static_cast<const T*>(a.dh) + idx, d);
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] += d[j];
}

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

    float xh[kRegItems][VEC], g[kRegItems][VEC];
    float acc[2] = {0.f, 0.f};
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
          dg[i][j] += d[j] * xh[i][j];
          if constexpr (K == NormKind::kLayer) db[i][j] += d[j];
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) xh[i][j] = g[i][j] = 0.f;
      }
    }
    grad_row_sums<K>(acc, smem);
    float c1, c2;
    row_coefs<K>(a, row, valid, acc, &c1, &c2);
    if (valid) {
      T* dx = static_cast<T*>(a.dx) + row * H;
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        const int64_t col = (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC;
        if (col < H) {
          float out[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) out[j] = rstd * (g[i][j] - c2 - xh[i][j] * c1);
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
    if (col < H) {
      int out = 0;
      if (a.dgamma) store_pack<VEC>(slot_row(a, l, slot, out++) + col, dg[i]);
      if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(slot_row(a, l, slot, out) + col, db[i]);
    }
  }
}

// Adds dy * xhat (and dy, for LayerNorm) of one column's pack over rows
// first, first + step, ... below `rows` of the group from row0 to dg (db),
// U rows' raw packs in flight, widened one row at a time (fewer registers).
// I: the index type (int where the caller's bounds keep 32 bits enough).
template <NormKind K, class T, int VEC, int U, class I>
__device__ __forceinline__ void add_column_sums(const BwdArgs& a, I row0, I rows, I first, I step, I col,
                                                float (&dg)[VEC], float (&db)[VEC]) {
  const I H = static_cast<I>(a.shape.hidden);
  for (I r0 = first; r0 < rows; r0 += step * U) {
    Pack<T, VEC> px[U], pd[U];
    float mean[U], rstd[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I r = r0 + u * step;
      rstd[u] = mean[u] = 0.f;
      px[u] = pd[u] = Pack<T, VEC>{};
      if (r < rows) {
        const I idx = (row0 + r) * H + col;
        px[u] = *reinterpret_cast<const Pack<T, VEC>*>(static_cast<const T*>(a.x) + idx);
        pd[u] = *reinterpret_cast<const Pack<T, VEC>*>(static_cast<const T*>(a.dy) + idx);
        rstd[u] = a.rstd[row0 + r];
        if constexpr (K == NormKind::kLayer) mean[u] = a.mean[row0 + r];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float xv[VEC], d[VEC];
      unpack(px[u], xv);
      unpack(pd[u], d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        dg[j] += d[j] * ((xv[j] - mean[u]) * rstd[u]);
        if constexpr (K == NormKind::kLayer) db[j] += d[j];
      }
    }
  }
}

// dgamma/dbeta of bwd_decode's launch, in its CTAs after the rows' (one
// column tile each): a CTA of `threads` is S = a.slots rows of threads (the
// host's choice, decode_launch) by threads / S packs of columns. Each row
// of threads takes every S-th row, kDecodeColUnroll rows' loads in flight,
// and the rows of threads' sums are added in order through shared memory: a
// fixed order, so the result is the same run to run.
constexpr int kDecodeColUnroll = 2;

template <NormKind K, class T, class P, int VEC>
__device__ __forceinline__ void decode_columns(const BwdArgs& a, int tile) {
  __shared__ float part[kDecodeMaxThreads * VEC];  // [split][lane * VEC + j], one output at a time
  const int threads = static_cast<int>(blockDim.x), S = static_cast<int>(a.slots), L = threads / S;
  const int lane = static_cast<int>(threadIdx.x) % L, split = static_cast<int>(threadIdx.x) / L;
  const int H = static_cast<int>(a.shape.hidden), rows = static_cast<int>(a.shape.rows);
  const int col0 = tile * L * VEC, col = col0 + lane * VEC;
  float dg[VEC] = {}, db[VEC] = {};
  if (col < H) add_column_sums<K, T, VEC, kDecodeColUnroll, int>(a, 0, rows, split, S, col, dg, db);
  for (int k = 0; k < a.param_outputs(); ++k) {
    const bool beta = a.param_which(k) == 1;
#pragma unroll
    for (int j = 0; j < VEC; ++j) part[split * L * VEC + lane * VEC + j] = beta ? db[j] : dg[j];
    __syncthreads();
    for (int c = static_cast<int>(threadIdx.x); c < L * VEC; c += threads) {
      if (col0 + c < H) {
        static_cast<P*>(a.param_output(k))[col0 + c] = from_float<P>(ordered_sum(part + c, S, L * VEC));
      }
    }
    __syncthreads();
  }
}

// The backward at decode-time row counts (launch_bwd_decode: at most
// kBwdDecodeMaxRows rows, one parameter group, no workspace): one row a CTA
// (up to kBwdDecodePartsMaxRows wide rows: a cluster of kBwdDecodeParts CTAs
// a row, their sums added through distributed shared memory), ITEMS packs a
// thread held raw; x, dy, the scales and the row's statistics
// loaded at once after the early launch's wait, and one reduction a row, as
// in fwd_decode. The persistent kernels' pipeline (bwd_slices' stages, the
// slot's walk over rows) is start-up cost that a row or a few never repay.
// DIRECT: the launch's only row, whose dy * xhat and dy are dgamma and dbeta,
// written here. Otherwise the CTAs after the rows' sum dgamma/dbeta by
// columns (decode_columns), in the same launch: one kernel a step.
template <NormKind K, class T, class P, int VEC, int ITEMS, bool DIRECT>
__global__ void __launch_bounds__(kDecodeMaxThreads) bwd_decode(BwdArgs a) {
  early_launch_wait();  // launched by launch_early_clustered: before any global memory access
  // A row is split across the `parts` CTAs of a cluster (1 without one):
  // part `rank` takes its packs from rank * ITEMS * blockDim.x.
  const int parts = cluster_ctas();
  if constexpr (!DIRECT) {
    if (static_cast<int64_t>(blockIdx.x) >= a.shape.rows * parts) {
      decode_columns<K, T, P, VEC>(a, static_cast<int>(blockIdx.x - a.shape.rows * parts));
      return;
    }
  }
  using V = Pack<T, VEC>;
  __shared__ float smem[kRowSumSmem];
  __shared__ float xchg[2][kGradSums<K>];
  const int H = static_cast<int>(a.shape.hidden), nvec = H / VEC;
  // parts is a power of two (the launcher's).
  const int row = static_cast<int>(blockIdx.x) >> (__ffs(parts) - 1), rank = static_cast<int>(blockIdx.x) & (parts - 1);
  const V* x = reinterpret_cast<const V*>(static_cast<const T*>(a.x) + row * H);
  const V* dy = reinterpret_cast<const V*>(static_cast<const T*>(a.dy) + row * H);
  const P* gamma = static_cast<const P*>(a.gamma);
  const int first = rank * ITEMS * static_cast<int>(blockDim.x);
  auto pack = [&](int i) { return first + static_cast<int>(threadIdx.x) + i * static_cast<int>(blockDim.x); };
  // At four packs a thread x and dy take 32 of the 64 registers: the scales
  // are not held but loaded again (from L1) for dx.
  constexpr bool kHoldScales = ITEMS <= 2;
  V xv[ITEMS], dv[ITEMS];
  float s[kHoldScales ? ITEMS : 1][VEC];
  bool in[ITEMS];
  const float rstd = a.rstd[row];
  const float mean = K == NormKind::kLayer ? a.mean[row] : 0.f;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    in[i] = pack(i) < nvec;
    if (in[i]) {
      xv[i] = x[pack(i)];
      dv[i] = dy[pack(i)];
      if constexpr (kHoldScales) load_scale<VEC>(gamma, pack(i) * VEC, a.zero_centered, s[i]);
    }
  }
  float acc[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (in[i]) {
      float xf[VEC], d[VEC], si[VEC];
      if constexpr (!kHoldScales) load_scale<VEC>(gamma, pack(i) * VEC, a.zero_centered, si);
      unpack(xv[i], xf);
      unpack(dv[i], d);
      add_grad_sums_of<VEC>(acc, xf, d, kHoldScales ? s[i] : si, mean);
    }
  }
  grad_sums_scaled(acc, rstd);
  grad_row_sums<K, true>(acc, smem, xchg, parts > 1);
  float c1, c2;
  row_coefs<K>(a, row, true, acc, &c1, &c2);
  T* dx = static_cast<T*>(a.dx) + row * H;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (in[i]) {
      const int col = pack(i) * VEC;
      float xf[VEC], d[VEC], out[VEC], dg[VEC] = {}, db[VEC] = {}, si[VEC];
      if constexpr (!kHoldScales) load_scale<VEC>(gamma, col, a.zero_centered, si);
      unpack(xv[i], xf);
      unpack(dv[i], d);
      grad_dx<K, VEC>(out, dg, db, xf, d, kHoldScales ? s[i] : si, mean, rstd, c1, c2);
      if (a.dh) add_dh<VEC, T>(a, row * H + col, out);
      store_pack<VEC>(dx + col, out);
      if constexpr (DIRECT) {
        if (a.dgamma) store_pack<VEC>(static_cast<P*>(a.dgamma) + col, dg);
        if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(static_cast<P*>(a.dbeta) + col, db);
      }
    }
  }
  if (parts > 1) cluster_done();  // no CTA leaves while another reads its xchg
}

// One element of a row taken on its own by bwd_unaligned (a head or tail
// element): its column, effective scale and dgamma/dbeta sums over the
// slot's rows, its x and dy in the next row (loaded a row ahead), and the
// current row's xhat and g.
struct LoneColumn {
  int col;
  bool has;
  float scale, dg, db, nx, nd, xh, g;
};

template <class P>
__device__ __forceinline__ LoneColumn lone_column(const P* gamma, int col, bool has, bool zero_centered) {
  LoneColumn e{col, has, 1.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (has) {
    float s[1];
    load_scale<1>(gamma, col, zero_centered, s);
    e.scale = s[0];
  }
  return e;
}

// Loads the element's x and dy of the row from `start` (`in`: it exists).
template <class T>
__device__ __forceinline__ void lone_load(LoneColumn& e, bool in, const BwdArgs& a, int64_t start) {
  if (!in) return;
  e.nx = to_float(static_cast<const T*>(a.x)[start + e.col]);
  e.nd = to_float(static_cast<const T*>(a.dy)[start + e.col]);
}

// The element's part of the row sums and of dgamma/dbeta, from the x and dy
// loaded last (`in`: the row is valid and the element exists).
template <NormKind K>
__device__ __forceinline__ void lone_sums(LoneColumn& e, bool in, float mean, float rstd, float (&acc)[2]) {
  e.xh = e.g = 0.f;
  if (!in) return;
  e.xh = (e.nx - mean) * rstd;
  e.g = e.nd * e.scale;
  acc[0] += e.g * e.xh;
  acc[1] += e.g;
  e.dg += e.nd * e.xh;
  if constexpr (K == NormKind::kLayer) e.db += e.nd;
}

// The element's dx, in the row from `start` (a valid row).
template <class T>
__device__ __forceinline__ void lone_dx(const BwdArgs& a, const LoneColumn& e, int64_t start, float rstd, float c1,
                                        float c2) {
  if (!e.has) return;
  float out[1] = {rstd * (e.g - c2 - e.xh * c1)};
  if (a.dh) add_dh<1, T>(a, start + e.col, out);
  store_pack<1>(static_cast<T*>(a.dx) + start + e.col, out);
}

__device__ __forceinline__ void lone_store(const LoneColumn& e, float* wg, float* wb) {
  if (wg) wg[e.col] = e.dg;
  if (wb) wb[e.col] = e.db;
}

// The plain backward of rows whose width is not a multiple of a 16-byte pack
// (x, dy, dx and dh 16-byte aligned), as fwd_unaligned takes their forward:
// each row's elements before its first 16-byte boundary (`head`) and after
// its last (`tail`) one by one in the row's first 2 * VEC threads, the rest
// in 16-byte packs, ITEMS a thread. Each thread keeps its columns' dgamma/
// dbeta sums over the slot's rows: a slot walks rows `l.used` apart, and the
// launcher makes l.used * hidden a multiple of the pack, so that every row
// of a slot starts at the same offset from a 16-byte boundary and each
// thread keeps the same columns. The slot's sums are stored one float at a
// time, once.
//
// The sums sit in shared memory beside the scales (each thread reads and
// writes only its own), and a thread takes a head or a tail element, not
// both, so that the plain instances fit 96 registers and two CTAs of 288-320
// threads (9-10 warps, e.g. hidden 4500 and 5000 in bf16) share an SM,
// against one at 112 (RMSNorm's plain instances do not spill at 96;
// LayerNorm's spill 8 bytes in bf16, 28-40 in fp16). The launcher sizes a
// row by its whole packs, hidden / VEC (512 threads' worth at 4100, not 513,
// so 256 threads rather than 288). Same-call A/B, H100, bf16, 2^27 elements,
// us, before -> whole-pack sizing -> sums in shared memory: RMSNorm
// 32736x4100 520.0 -> 346.5 -> 342.8 (XLA 541), 29826x4500 508.6 -> 512.9 ->
// 341.7 (XLA 648), 16382x8193 660.7 -> 379.5 -> 375.3 (XLA 800, one CTA
// instead of a cluster), 10920x12290 555.4 -> 492.0 -> 471.7 (XLA 494),
// 134083x1001 349.8 -> 349.6 -> 342.7; LayerNorm 604.7 -> 394.2 -> 390.9,
// 594.6 -> 582.0 -> 392.8, 777.9 -> 448.5 -> 469.9, 652.3 -> 559.4 -> 553.2,
// 396.8 -> 394.4 -> 387.8. RESULTS.md 1i.
//
// Each row's x, dy and statistics are loaded while the row before is reduced
// and written. Earlier, with the sums in registers, the scales alone in
// shared memory and a cap of 112 registers (LayerNorm of 16-bit x spilled
// 12-20 bytes), two CTAs of 288 threads did not share an SM: Nsight Compute
// showed one (9 warps an SM, RESULTS.md 1h). With one-element packs
// (bwd_regs to 1024 elements, bwd_stream above) these widths ran at 0.6-1.2
// TB/s. Same-call A/Bs on an H100, bf16, 2^27 elements, us, one-element
// packs -> rows loaded ahead -> statistics too: RMSNorm 32736x4100 709.1 ->
// 553.9 -> 516.9 (XLA 540), 65472x2050 761.5 -> 382.0 -> 376.2 (XLA 513),
// 134083x1001 699.0 -> 365.1 -> 351.2, 16386x8191 1228.5 -> 425.5 -> 379.8 (XLA 752); LayerNorm 1089.9 ->
// 652.2 -> 601.4 (XLA 992), 910.3 -> 440.6 -> 440.0, 1010.8 -> 413.7 -> 396.6,
// 2153.3 -> 500.8 -> 449.4. Loading nothing ahead: 4100 663.8 and 733.2.
// RESULTS.md 1g.
//
// ITEMS: the packs a thread holds, kRegItems, or kUnalignedWideItems for
// rows of 1025-1536 packs in one CTA (8200-12295 elements of 16-bit x),
// which replaced a cluster of two CTAs of two packs a thread and its
// exchange each row, or kUnalignedWidestItems above (and for narrower rows
// of 16-bit x, see kUnalignedFourFromPacks). Its one
// CTA of up to 512 threads an SM may take 128 registers. Same-call A/B,
// H100, bf16, 2^27 elements, us, cluster -> one CTA of three packs a
// thread: RMSNorm 16366x8201 627.7 -> 383.9 (XLA 567), 13420x10001 561.9 ->
// 354.8, 10920x12290 474.6 -> 335.8 (XLA 496); LayerNorm 715.3 -> 472.2,
// 646.7 -> 452.6, 537.5 -> 431.3 (RESULTS.md 1j).
//
// CLUSTERED: rows wider than one CTA takes (up to 32775 elements of 16-bit
// x). A slot is then a cluster of `cluster_size` (2-4) one-row CTAs, each
// with its own range of the row's packs; the row sums go through
// ClusterPush, and rank 0 takes the head and tail. Against bwd_stream's
// one-element packs (same-call A/B, H100, bf16, 2^27 elements,
// us): RMSNorm 10920x12290 1467.0 -> 557.4 (XLA 497), 8192x16383 1439.3 ->
// 437.7 (XLA 553); LayerNorm 2244.0 -> 655.2, 2196.1 -> 507.9 (XLA 1192,
// 1188). It is an instance of its own: with the cluster size a runtime
// argument, the plain widths lost up to 15% (RMSNorm 1001: 346 -> 400 us).
// RESULTS.md 1h.
template <NormKind K, class T, class P, bool CLUSTERED, int ITEMS>
__global__ void __maxnreg__(CLUSTERED ? 112 : ITEMS == 2 ? 96 : 128)
    bwd_unaligned(BwdArgs a, SlotLayout l, int cluster_size) {
  constexpr int VEC = 16 / sizeof(T);
  const int cluster = CLUSTERED ? cluster_size : 1;
  using Vec = Pack<T, VEC>;
  __shared__ float smem[kRowSumSmem];
  __shared__ alignas(8) float xchg[2][kMaxCluster][kGradSums<K>];
  __shared__ alignas(8) uint64_t pushed[2];
  const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
  const int64_t group_row0 = static_cast<int64_t>(blockIdx.y) * rpg;
  // A slot is a row of threads of a CTA, or a cluster of one-row CTAs, each
  // CTA (`rank`) holding its own range of the row's packs.
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t slot0 = static_cast<int64_t>(blockIdx.x / cluster) * blockDim.y;  // the CTA's first slot
  const int64_t slot = slot0 + threadIdx.y;
  const auto [head, body, tail] = cut_row<VEC>((group_row0 + slot) * H, H);  // the same on each of the slot's rows
  const int tid = static_cast<int>(threadIdx.x), tpr = static_cast<int>(blockDim.x);
  const int first = rank * tpr * ITEMS;  // the CTA's first pack
  auto pack = [&](int i) { return first + tid + i * tpr; };  // the row's pack that item i holds
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + blockIdx.y * H : nullptr;
  ClusterPush<kGradSums<K>> exchange(xchg, pushed, cluster, rank);

  // The thread's columns' effective scale and dgamma (dbeta) sums, in shared
  // memory (the registers have no room for them): float4 q of pack i of
  // array `arr` (kScale, kDg, kDb) at
  // cols[(((arr * rpb + threadIdx.y) * ITEMS + i) * VEC / 4 + q) * tpr + tid],
  // used by this thread alone.
  extern __shared__ float4 cols[];
  const int rpb = static_cast<int>(blockDim.y);
  auto col_at = [&](int arr, int i, int q) -> float4& {
    return cols[(((arr * rpb + static_cast<int>(threadIdx.y)) * ITEMS + i) * (VEC / 4) + q) * tpr + tid];
  };
  enum { kScale, kDg, kDb };
  auto read_cols = [&](int arr, int i, float(&v)[VEC]) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 f = col_at(arr, i, q);
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  };
  auto write_cols = [&](int arr, int i, const float(&v)[VEC]) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) col_at(arr, i, q) = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  };
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int p = pack(i);
    float sc[VEC], zero[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      sc[j] = 1.f;
      zero[j] = 0.f;
      // Element by element: gamma's packs are not aligned to these columns.
      if (p < body) {
        float one[1];
        load_scale<1>(gamma, head + p * VEC + j, a.zero_centered, one);
        sc[j] = one[0];
      }
    }
    write_cols(kScale, i, sc);
    write_cols(kDg, i, zero);
    if constexpr (K == NormKind::kLayer) write_cols(kDb, i, zero);
  }
  // The head and tail elements: the first threads of rank 0.
  // Threads [0, head) of rank 0 take the head's elements, threads
  // [VEC, VEC + tail) the tail's: one such element a thread at most (the
  // launcher gives a row at least 2 * VEC threads).
  const bool takes_tail = tid >= VEC;
  const int lone = takes_tail ? tid - VEC : tid;  // the element's index in the head or tail
  LoneColumn e = lone_column(gamma, takes_tail ? head + body * VEC + lone : lone,
                             rank == 0 && lone < (takes_tail ? tail : head), a.zero_centered);

  // The current row's packs and the next row's, as stored, and the next
  // row's statistics.
  Vec cx[ITEMS], cd[ITEMS], nx[ITEMS], nd[ITEMS];
  float next_rstd = 0.f, next_mean = 0.f;
  auto load_row = [&](int64_t r) {
    const bool in = r < rpg;
    const int64_t start = (group_row0 + r) * H;
    if (in) {
      next_rstd = a.rstd[group_row0 + r];
      if constexpr (K == NormKind::kLayer) next_mean = a.mean[group_row0 + r];
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = pack(i);
      if (in && p < body) {
        load_raw(static_cast<const T*>(a.x) + start + head + p * VEC, nx[i]);
        load_raw(static_cast<const T*>(a.dy) + start + head + p * VEC, nd[i]);
      }
    }
    lone_load<T>(e, in && e.has, a, start);
  };
  load_row(slot);

  // Every thread of the block runs the same number of iterations (row_sum
  // holds barriers); rows past the group's end are masked.
  int buf = 0;  // the exchange's buffer for this row
  for (int64_t base = slot0; base < rpg; base += l.used, buf ^= 1) {
    const int64_t r = base + threadIdx.y;
    const bool valid = r < rpg;
    const int64_t row = group_row0 + r;
    const float rstd = valid ? next_rstd : 0.f;
    const float mean = valid ? next_mean : 0.f;

    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      cx[i] = nx[i];
      cd[i] = nd[i];
      if (valid && pack(i) < body) {
        float xv[VEC], d[VEC], sc[VEC];
        unpack(cx[i], xv);
        unpack(cd[i], d);
        read_cols(kScale, i, sc);
        add_grad_sums_of<VEC>(acc, xv, d, sc, mean);
      }
    }
    grad_sums_scaled(acc, rstd);
    lone_sums<K>(e, valid && e.has, mean, rstd, acc);
    load_row(r + l.used);  // in flight during the reduction and the stores
    grad_row_sums<K>(acc, smem, CLUSTERED ? &exchange : nullptr, buf);
    float c1, c2;
    row_coefs<K>(a, row, valid, acc, &c1, &c2);
    if (!valid) continue;
    T* dx = static_cast<T*>(a.dx) + row * H;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = pack(i);
      if (p < body) {
        const int col = head + p * VEC;
        float xv[VEC], d[VEC], sc[VEC], out[VEC], dg[VEC], db[VEC];
        unpack(cx[i], xv);
        unpack(cd[i], d);
        read_cols(kScale, i, sc);
        read_cols(kDg, i, dg);
        if constexpr (K == NormKind::kLayer) read_cols(kDb, i, db);
        grad_dx<K>(out, dg, db, xv, d, sc, mean, rstd, c1, c2);
        write_cols(kDg, i, dg);
        if constexpr (K == NormKind::kLayer) write_cols(kDb, i, db);
        if (a.dh) add_dh<VEC, T>(a, row * H + col, out);
        store_pack<VEC>(dx + col, out);
      }
    }
    lone_dx<T>(a, e, row * H, rstd, c1, c2);
  }

  if (CLUSTERED) cluster_done();
  if (a.workspace == nullptr || slot >= l.used) return;
  float* wg = a.dgamma ? slot_row(a, l, slot, 0) : nullptr;
  float* wb = K == NormKind::kLayer && a.dbeta ? slot_row(a, l, slot, a.dgamma ? 1 : 0) : nullptr;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int p = pack(i);
    if (p < body) {
      float dg[VEC], db[VEC];
      read_cols(kDg, i, dg);
      if constexpr (K == NormKind::kLayer) read_cols(kDb, i, db);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (wg) wg[head + p * VEC + j] = dg[j];
        if (wb) wb[head + p * VEC + j] = db[j];
      }
    }
  }
  if (e.has) lone_store(e, wg, wb);
}

// The column sums of the `fold` CTAs of a thread block cluster (each a slot
// walking its own rows, whole rows a CTA) added into one workspace row, the
// cluster's (blockIdx.x / fold): each CTA puts its sums in its shared memory
// (`sums`, `n` floats per output: the stages, free once the rows are done),
// then CTA k adds the k-th part of the columns over the cluster in rank order
// (a fixed order: reproducible) and writes it. The workspace, and the passes
// of bwd_reduce over it, shrink `fold` times. The sums fit the stages: those
// hold 64 bytes a pack (two stages of x and dy), the sums at most 2 outputs x
// VEC floats (VEC <= 8 for 16-byte packs of 16-bit values, 4 for float32).
template <NormKind K, int VEC>
__device__ __forceinline__ void fold_sums(const BwdArgs& a, SlotLayout l, const float (&dg)[kSliceItems][VEC],
                                          const float (&db)[kSliceItems][VEC], float* sums, int n, int fold) {
#ifdef JRN_NO_CLUSTERS
  __trap();
#else
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const int outs = a.param_outputs();
  __syncthreads();  // every thread is done reading the stages
#pragma unroll
  for (int i = 0; i < kSliceItems; ++i) {
    const int c = (i * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * VEC;
    int out = 0;
    if (a.dgamma) store_pack<VEC>(sums + (out++) * n + c, dg[i]);
    if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(sums + out * n + c, db[i]);
  }
  cl.sync();
  const int rank = static_cast<int>(cl.block_rank());
  const int part = n / fold;  // n and fold are powers of two, n >= 4 * fold
  const int64_t H = a.shape.hidden;
  for (int e = static_cast<int>(threadIdx.x) * 4; e < outs * part; e += static_cast<int>(blockDim.x) * 4) {
    const int out = e / part, c = rank * part + e % part;
    if (c >= H) continue;
    float total[4] = {};
    for (int k = 0; k < fold; ++k) {
      // A plain load: the address is in another CTA's shared memory, which
      // load_pack's read-only global loads (__ldg) cannot reach.
      const float4 v = *reinterpret_cast<const float4*>(cl.map_shared_rank(sums, k) + out * n + c);
      total[0] += v.x;
      total[1] += v.y;
      total[2] += v.z;
      total[3] += v.w;
    }
    store_pack<4>(slot_row(a, l, blockIdx.x / fold, out) + c, total);
  }
  cl.sync();  // no CTA leaves while another reads its shared memory
#endif
}

// A slot is a cluster of `cluster` CTAs (blockIdx.x / cluster); CTA `rank`
// owns vectors [rank * slice, (rank + 1) * slice) of every row the slot walks.
// Its slices of x and dy are contiguous: thread 0 copies each with one bulk
// copy into the other of two shared-memory stages while the CTA processes the
// current row, so the loads of the next row overlap this row's reductions and
// stores. A stage is refilled only once every thread is done reading it: with
// EARLY after a barrier at the top of the next row (the longest lead, best
// with one CTA per SM: 16384-wide rows; LayerNorm's in every cluster and
// from CTAs of more than 128 threads, RMSNorm's in CTAs of 192 threads of
// 16-bit x: launch_bwd_slices has the rule), else just after that row's
// reduction, whose barrier already orders it (best with several CTAs per
// SM; on an H100, bf16, 32768x4096: 303 against 337 us, and 8192x16384:
// 339 against 324 us the other way). gamma's packs of the slice are
// copied into shared memory once (sgamma). dgamma/dbeta column sums stay in
// registers; with `fold` > 1 (whole rows a CTA, so `cluster` is 1) each
// hardware cluster of `fold` CTAs folds them into one workspace row.
// WHOLE: every CTA's slice is whole packs inside the row (launch_bwd_slices
// checks), so no pack tests whether it is in the row.
template <NormKind K, class T, class P, int VEC, bool EARLY, bool WHOLE = false>
__global__ void __launch_bounds__(kSliceThreads) bwd_slices(BwdArgs a, SlotLayout l, int cluster, int fold) {
  early_launch_now();  // bwd_columns may run beside it (param_sums)
  using Vec = Pack<T, VEC>;
  static_assert(sizeof(Vec) == 16, "bwd_slices moves 16-byte packs");
  // [2 stages][x, dy][kSliceItems * blockDim.x] packs, then gamma's packs
  // of this CTA's slice (kSliceItems * blockDim.x, where gamma is given).
  extern __shared__ uint4 stages[];
  __shared__ float smem[kRowSumSmem];
  __shared__ alignas(8) float xchg[2][kMaxCluster][kGradSums<K>];
  __shared__ alignas(8) uint64_t landed[2], pushed[2];
  const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t slot = blockIdx.x / cluster;
  const int64_t first = static_cast<int64_t>(rank) * blockDim.x * kSliceItems * VEC;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * rpg;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + blockIdx.y * H : nullptr;
  const int packs = kSliceItems * blockDim.x;
  // LEAN: LayerNorm's EARLY instances of 16-bit x (one CTA of 129-255 or
  // more than 256 threads a row, and every cluster) take the shifted row
  // sums (kShiftedSums) and grad_dx's FOLD: two instructions a column fewer (sm_90 SASS: the EARLY, WHOLE
  // instance 4960 -> 4848, 128 FADDs fewer). Same-call A/B on an H200, bf16,
  // us, two rounds: 8192x16384 222.0 / 222.6 -> 219.6 / 220.1, 2048x65536
  // 227.9 / 229.7 -> 225.6 / 226.1, 512x262144 256.7 / 254.2 -> 247.0 /
  // 246.0. Not its CTAs of 32-128 threads (rows of 1024-4096, not EARLY):
  // 217.3 / 217.6 -> 218.5 / 219.7 and 215.1 / 215.7 -> 215.9 / 217.0
  // (RESULTS.md 1zo).
  constexpr bool kLean = EARLY && kShiftedSums<K, T>;
  // Pack i of this thread in a stage (or in the staged gamma), and its
  // column in the CTA's slice. The column repeats the index sum in 64 bits
  // rather than widen pack(i): that changed the code of 20 of the file's
  // kernels (sm_90 SASS).
  auto pack = [&](int i) { return i * blockDim.x + threadIdx.x; };
  auto local = [&](int i) { return (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC; };
  auto in_row = [&](int i) { return WHOLE || first + local(i) < H; };
  auto stage = [&](int st, int tensor, int i) {
    return reinterpret_cast<const Vec*>(stages + (2 * st + tensor) * packs + pack(i));
  };
  const int64_t slice_elems = slice_columns(rank, static_cast<int64_t>(packs) * VEC, H);
  const unsigned slice_bytes = static_cast<unsigned>(slice_elems * sizeof(T));
  BulkStages ring(landed);
  ClusterPush<kGradSums<K>> exchange(xchg, pushed, cluster, rank);
  auto prefetch = [&](int64_t r, int st) {
    if (threadIdx.x == 0 && r < rpg && slice_bytes > 0) {
      const int64_t off = (row0 + r) * H + first;
      ring.fill<2>(st, {stages + 2 * st * packs, stages + (2 * st + 1) * packs},
                   {static_cast<const T*>(a.x) + off, static_cast<const T*>(a.dy) + off}, slice_bytes);
    }
  };

  float dg[kSliceItems][VEC], db[kSliceItems][VEC];
#pragma unroll
  for (int i = 0; i < kSliceItems; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dg[i][j] = db[i][j] = 0.f;
  }
  // The CTA walks one slice of columns for all its rows and reads a pack's
  // gamma twice a row: the slice is copied into shared memory once, each
  // thread its own packs (so no barrier), rather than loaded from L1/L2 each
  // time (waits on L1TEX loads were 31% of the cycles between issues,
  // Nsight Compute at 2048x16384). The registers have no room for them, and
  // the shared memory costs no CTAs: at 512 threads the registers already
  // allow one an SM (at most 192 KB with float32 gamma). Same-call
  // A/B on an H100, bf16, us (RESULTS.md, table 1): RMSNorm 32768x4096 297
  // -> 287, 8192x16384 297 -> 291, 2048x65536 333 -> 297, 512x262144 353
  // -> 300; LayerNorm 309 -> 298, 308 -> 299, 343 -> 296, 373 -> 310.
  using GammaPack = Pack<P, VEC>;
  GammaPack* const sgamma = reinterpret_cast<GammaPack*>(stages + 4 * packs);
  if (gamma != nullptr) {
#pragma unroll
    for (int i = 0; i < kSliceItems; ++i) {
      if (in_row(i)) load_raw(gamma + first + local(i), sgamma[pack(i)]);
    }
  }

  // The rows' walk, instantiated twice: for the common case (gamma, not
  // zero-centred) a pack's scale is gamma as staged, with nothing left to
  // decide a pack (placeholder ones and predicated-off adds, eight each,
  // twice a row); the other case decides them (no gamma: ones; zero-centred:
  // gamma + 1).
  auto walk_rows = [&](auto plain) {
    auto scale_of = [&](int i, float(&s)[VEC]) {
      auto staged = [&](float(&g)[VEC]) { unpack<true>(sgamma[pack(i)], g); };
      if constexpr (decltype(plain)::value) {
        staged(s);
      } else {
        effective_scale<VEC>(gamma != nullptr, a.zero_centered, staged, s);
      }
    };
    prefetch(slot, 0);
    // The row's statistics are loaded a row ahead, as its x and dy are: loaded
    // after the stage's wait, every warp waited a memory round trip a row for
    // them before its first sum (at 8192-16384, in one CTA an SM). Same-call A/B
    // on an H200, bf16, us, before -> after (this change alone): RMSNorm
    // 32768x4096 228.2 -> 213.6, 16384x8192 239.3 -> 224.0, 8192x16384 233.2
    // -> 210.9, 512x262144 241.1 -> 229.5; LayerNorm 16384x8192 277.0 ->
    // 266.1, 2048x65536 252.5 -> 258.0 (RESULTS.md 1r).
    // Not RMSNorm's rows of at most 1024 columns a CTA (one warp in 16-bit,
    // two in float32): they load them after the wait, as before. Same-call
    // A/B on an H200, us, ahead -> after the wait, in two calls: bf16
    // 131072x1024 220.3 -> 210.1 and 223.7 -> 215.3, float32 417.6 -> 398.6
    // and 419.6 -> 401.5; bf16 65536x2048 (two warps) lost 1-3% (211.9 ->
    // 214.6, 216.8 -> 223.4), so it loads ahead; LayerNorm at 1024 level
    // (RESULTS.md 1s).
    const bool ahead = K == NormKind::kLayer || static_cast<int>(blockDim.x) * VEC * kSliceItems > 1024;
    float rstd_next = 0.f, mean_next = 0.f;
    auto load_stats = [&](int64_t r) {
      if (r < rpg) {
        rstd_next = a.rstd[row0 + r];
        if constexpr (K == NormKind::kLayer) mean_next = a.mean[row0 + r];
      }
    };
    if (ahead) load_stats(slot);
    int st = 0;
    for (int64_t r = slot; r < rpg; r += l.used, st ^= 1) {
      if constexpr (EARLY) {
        __syncthreads();  // every thread is done with the previous row's stage
        prefetch(r + l.used, st ^ 1);
      }
      float rstd = rstd_next, mean = mean_next;
      if (ahead) load_stats(r + l.used);
      if (slice_bytes > 0) ring.wait(st);
      if (!ahead) {
        load_stats(r);
        rstd = rstd_next;
        mean = mean_next;
      }
      const int64_t row = row0 + r;
      // The residual's gradient for this row, loaded now so that it arrives
      // during the row reduction rather than between the stores of dx.
      Vec dhr[kSliceItems];
      if (a.dh) {
#pragma unroll
        for (int i = 0; i < kSliceItems; ++i) {
          if (in_row(i))
            dhr[i] = *reinterpret_cast<const Vec*>(static_cast<const T*>(a.dh) + row * H + first + local(i));
        }
      }
      float acc[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kSliceItems; ++i) {
        if (in_row(i)) {
          float xf[VEC], df[VEC], s[VEC];
          unpack<true>(*stage(st, 0, i), xf);
          unpack<true>(*stage(st, 1, i), df);
          scale_of(i, s);
          add_grad_sums_of<VEC, kLean>(acc, xf, df, s, mean);
        }
      }
      grad_sums_scaled<kLean>(acc, rstd, mean);
      grad_row_sums<K, true>(acc, smem, &exchange, st);
      if constexpr (!EARLY) {
        ring.order_refill_after_reduction();  // one-warp CTAs: hidden 1024 in bf16
        prefetch(r + l.used, st ^ 1);
      }
      float c1, c2;
      row_coefs<K>(a, row, true, acc, &c1, &c2);
      T* dx = static_cast<T*>(a.dx) + row * H + first;
#pragma unroll
      for (int i = 0; i < kSliceItems; ++i) {
        if (in_row(i)) {
          float xf[VEC], df[VEC], s[VEC], out[VEC];
          unpack<true>(*stage(st, 0, i), xf);
          unpack<true>(*stage(st, 1, i), df);
          scale_of(i, s);
          grad_dx<K, VEC, kLean>(out, dg[i], db[i], xf, df, s, mean, rstd, c1, c2);
          if (a.dh) {
            float dhf[VEC];
            unpack(dhr[i], dhf);
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] += dhf[j];
          }
          store_pack<VEC>(dx + local(i), out);
        }
      }
    }
  };
  // The common case's walk. Slices of a cluster (hidden > kSliceVecs packs),
  // same-call A/B on an H100, bf16, us: at 2048x65536 LayerNorm's backward
  // 357-360 -> 344-346 and RMSNorm's 343-346 -> 333-335 (512x262144: 389-393
  // -> 372-374 and 364-365 -> 353).
  // One CTA a row takes it too, as an instance of its own. The trial that
  // compiled one walk for both (cluster a runtime value in it) lost 5% in
  // clusters on an H200 (LayerNorm 2048x65536 252.5 -> 266.4, 512x262144
  // 274.4 -> 286.2) and gained one CTA a row: same-call A/B, bf16, us,
  // LayerNorm 32768x4096 264.2 -> 249.9, 16384x8192 277.0 -> 265.7,
  // 8192x16384 275.7 -> 251.1; RMSNorm 228.2 -> 220.8, 239.3 -> 235.7, 233.2
  // -> 215.9 (on an H100, at 8192x16384, it had lost 3-5%: RMSNorm 299-300
  // -> 308-314). Both changes here against neither, same call: LayerNorm
  // 131072x1024 268.0 -> 218.2, 32768x4096 271.0 -> 222.2, 8192x16384 273.3
  // -> 245.6; RMSNorm 131072x1024 215.8 -> 227.3 (a loss), 16384x8192 238.8
  // -> 215.9; clusters: LayerNorm 2048x65536 252.6 -> 260.9 (RESULTS.md 1r).
  if (gamma != nullptr && !a.zero_centered) {
    if (cluster > 1) {
      walk_rows(std::true_type{});
    } else {
      walk_rows(std::true_type{});  // the same walk, compiled where cluster == 1
    }
  } else {
    walk_rows(std::false_type{});
  }
  if (cluster > 1) cluster_done();
  if (a.workspace == nullptr) return;
  if (fold > 1) {
    fold_sums<K, VEC>(a, l, dg, db, reinterpret_cast<float*>(stages), packs * VEC, fold);
    return;
  }
#pragma unroll
  for (int i = 0; i < kSliceItems; ++i) {
    if (in_row(i)) {
      int out = 0;
      if (a.dgamma) store_pack<VEC>(slot_row(a, l, slot, out++) + first + local(i), dg[i]);
      if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(slot_row(a, l, slot, out) + first + local(i), db[i]);
    }
  }
}

// One CTA per slot, one row at a time, the row streamed twice. The slot's
// column sums live in its workspace row (each column always touched by the
// same thread, so no synchronization is needed for them).
template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kStreamThreads) bwd_stream(BwdArgs a, SlotLayout l) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC, rpg = a.shape.rows_per_group();
  const int64_t slot = blockIdx.x;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + blockIdx.y * H : nullptr;
  const bool keep = a.workspace != nullptr;
  float* wg = keep && a.dgamma ? slot_row(a, l, slot, 0) : nullptr;
  float* wb = keep && a.dbeta ? slot_row(a, l, slot, a.dgamma ? 1 : 0) : nullptr;
  const float zero[VEC] = {};
  for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
    if (wg) store_pack<VEC>(wg + p * VEC, zero);
    if (wb) store_pack<VEC>(wb + p * VEC, zero);
  }

  for (int64_t r = slot; r < rpg; r += l.used) {
    const int64_t row = static_cast<int64_t>(blockIdx.y) * rpg + r;
    const T* x = static_cast<const T*>(a.x) + row * H;
    const T* dy = static_cast<const T*>(a.dy) + row * H;
    const float rstd = a.rstd[row];
    const float mean = K == NormKind::kLayer ? a.mean[row] : 0.f;
    float acc[2] = {0.f, 0.f};
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x)
      add_grad_sums<VEC>(acc, x, dy, gamma, p * VEC, a.zero_centered, mean);
    grad_sums_scaled(acc, rstd);
    grad_row_sums<K>(acc, smem);
    float c1, c2;
    row_coefs<K>(a, row, true, acc, &c1, &c2);
    T* dx = static_cast<T*>(a.dx) + row * H;
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      float xv[VEC], d[VEC], s[VEC], out[VEC];
      load_pack<VEC>(x + p * VEC, xv);
      load_pack<VEC>(dy + p * VEC, d);
      load_scale<VEC>(gamma, p * VEC, a.zero_centered, s);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xh = (xv[j] - mean) * rstd;
        out[j] = rstd * (d[j] * s[j] - c2 - xh * c1);
        xv[j] = d[j] * xh;  // reuse: this row's dgamma contribution
      }
      if (a.dh) add_dh<VEC, T>(a, row * H + p * VEC, out);
      store_pack<VEC>(dx + p * VEC, out);
      if (wg) add_to<VEC>(wg + p * VEC, xv);
      if (wb) add_to<VEC>(wb + p * VEC, d);
    }
  }
}

// dgamma/dbeta[g, col] = sum over the slots' partial rows, in a fixed order.
// One launch sums, for every column, the `n` rows first, first + step, ...,
// first + (n - 1) * step of each part (part p starts at slot p * part_rows):
// the first launch sums the slots in parts of kReduceRows rows and leaves each
// part's sum in the part's first row (in place: a CTA reads and writes only
// its own part and columns), the second adds those; with few slots one launch
// sums them all straight into dgamma/dbeta. Each thread loads its rows'
// CV-column packs all at once (a part is one round trip to memory, not one
// per row), then the threads of a column are added in a fixed tree.
struct ReduceStep {
  int64_t part_rows;  // the slot distance between parts (gridDim.z / outputs parts)
  int64_t step;       // the slot distance between the rows a part sums
  int64_t n;          // rows per part (the last part may have fewer)
  int64_t total;      // slots in use: rows at or past it are absent
  bool final;         // write dgamma/dbeta, not the part's first row
};

template <class P, int CV>
__global__ void __launch_bounds__(kReduceLanes* kReduceSplit) bwd_reduce(BwdArgs a, SlotLayout l, ReduceStep s) {
  __shared__ float part[kReduceSplit][CV][kReduceLanes + 1];
  const int64_t H = a.shape.hidden;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kReduceLanes + threadIdx.x) * CV;
  const int outs = a.param_outputs();
  const int out = static_cast<int>(blockIdx.z % outs);
  const int64_t first = static_cast<int64_t>(blockIdx.z / outs) * s.part_rows;
  float sum[CV] = {};
  if (col < H) {
    for (int64_t k0 = 0; k0 < s.n; k0 += kReduceSplit * kReduceUnroll) {
      float v[kReduceUnroll][CV];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        const int64_t k = k0 + u * kReduceSplit + threadIdx.y, slot = first + k * s.step;
        if (k < s.n && slot < s.total) {
          load_pack<CV>(slot_row(a, l, slot, out) + col, v[u]);
        } else {
#pragma unroll
          for (int j = 0; j < CV; ++j) v[u][j] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < CV; ++j) sum[j] += v[u][j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < CV; ++j) part[threadIdx.y][j][threadIdx.x] = sum[j];
  __syncthreads();
#pragma unroll
  for (int half = kReduceSplit / 2; half > 0; half >>= 1) {
    if (threadIdx.y < half) {
#pragma unroll
      for (int j = 0; j < CV; ++j) part[threadIdx.y][j][threadIdx.x] += part[threadIdx.y + half][j][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y != 0 || col >= H) return;
  float total[CV];
#pragma unroll
  for (int j = 0; j < CV; ++j) total[j] = part[0][j][threadIdx.x];
  if (!s.final) {
    store_pack<CV>(slot_row(a, l, first, out) + col, total);
    return;
  }
  store_pack<CV>(static_cast<P*>(a.param_output(out)) + blockIdx.y * H + col, total);
}

// dgamma/dbeta straight from x and dy, for groups of few rows (the caller
// passes no workspace; see cuda_slots in _primitives.py). Each CTA owns
// kColLanes packs of columns; its kColSplit rows of threads take every
// kColSplit-th row, kColUnroll rows' loads in flight at once, and the CTA adds
// its rows of threads in shared memory, in a fixed order. At decode-time row
// counts this replaces the slots' float32 partials, as large as the gradient
// itself when every row is its own slot, and the one or two reduction passes
// over them.
constexpr int kColLanes = 8, kColSplit = 32, kColUnroll = 8;

template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kColLanes* kColSplit) bwd_columns(BwdArgs a) {
  constexpr int kCols = kColLanes * VEC;  // the CTA's columns
  __shared__ float part[2][kColSplit][kCols];
  const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * rpg;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const int64_t col = col0 + threadIdx.x * VEC;
  float dg[VEC] = {}, db[VEC] = {};
  if (col < H)
    add_column_sums<K, T, VEC, kColUnroll, int64_t>(a, row0, rpg, static_cast<int64_t>(threadIdx.y), kColSplit, col,
                                                    dg, db);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    part[0][threadIdx.y][threadIdx.x * VEC + j] = dg[j];
    if constexpr (K == NormKind::kLayer) part[1][threadIdx.y][threadIdx.x * VEC + j] = db[j];
  }
  __syncthreads();
  // One thread a column and output: the rows of threads in order.
  const int t = threadIdx.y * kColLanes + threadIdx.x, c = t % kCols, out = t / kCols;
  if (out < a.param_outputs() && col0 + c < H) {
    const float total = ordered_sum(&part[a.param_which(out)][0][c], kColSplit, kCols);
    static_cast<P*>(a.param_output(out))[blockIdx.y * H + col0 + c] = from_float<P>(total);
  }
  // Launched early (param_sums), it ran beside the dx kernel; it ends only
  // after that kernel has, so that what comes next sees dx.
  early_launch_wait();
}

// Adds the slots' partial rows into dgamma/dbeta (one or two launches).
template <class P, int CV>
ffi::Error reduce_slots(cudaStream_t stream, const BwdArgs& a, SlotLayout l) {
  const unsigned tiles = static_cast<unsigned>(ceil_div(a.shape.hidden, kReduceLanes * CV));
  const unsigned groups = static_cast<unsigned>(a.shape.groups), outs = static_cast<unsigned>(a.param_outputs());
  const dim3 block(kReduceLanes, kReduceSplit);
  int64_t rows = l.used;
  if (rows > kReduceRows) {  // first pass: parts of kReduceRows slots
    const int64_t parts = ceil_div(rows, kReduceRows);
    if (parts * outs > 65535) return ffi::Error::Internal("jax_rmsnorm: too many backward slots");
    bwd_reduce<P, CV><<<dim3(tiles, groups, static_cast<unsigned>(parts * outs)), block, 0, stream>>>(
        a, l, ReduceStep{kReduceRows, 1, kReduceRows, l.used, false});
    JRN_RETURN_IF_ERROR(check_launch("bwd_reduce"));
    bwd_reduce<P, CV><<<dim3(tiles, groups, outs), block, 0, stream>>>(
        a, l, ReduceStep{0, kReduceRows, parts, l.used, true});
  } else {
    bwd_reduce<P, CV><<<dim3(tiles, groups, outs), block, 0, stream>>>(a, l, ReduceStep{0, 1, rows, l.used, true});
  }
  return check_launch("bwd_reduce");
}

// bwd_slices moves 16-byte packs; rows of up to kRegVecs packs go to bwd_regs.
template <class T, int VEC>
constexpr bool kSlicesFit = sizeof(T) * VEC == 16;
constexpr int64_t kRegVecs = 64;
constexpr int64_t kSliceVecs = static_cast<int64_t>(kSliceThreads) * kSliceItems;  // per CTA

// LayerNorm of 16-bit x splits rows of more than half and less than one
// CTA's packs (hidden 8193 to 16383) over a cluster of 2, with EARLY (see
// launch_bwd_slices). Same-call A/B on an H100, bf16, us, two rounds, one
// CTA a row -> a cluster of 2: 14563x9216 397.7 / 398.8 -> 298.1 / 297.7,
// 13107x10240 368.5 / 367.5 -> 313.5 / 315.8, 10922x12288 332.0 / 333.4 ->
// 300.8 / 299.9, 9362x14336 323.8 / 327.0 -> 303.7 / 303.7; float16
// 10922x12288 342.8 / 341.6 -> 301.9 / 301.4. In a build with knobs, two
// rounds: 11915x11264 342 / 341 -> 301 / 302, 10082x13312 334 / 334 -> 293 /
// 294; float32 parameters 13107x10240 356 -> 310, 10922x12288 326 -> 296.
// Not taken: the cluster without EARLY (9216: 324 / 327), at 16384 (301 ->
// 316), for float32 x (hidden 5120 level, 6144 557 -> 570) and for RMSNorm
// (14336 286 -> 311, 12288 290 -> 302, 11264 296 -> 285). RESULTS.md 1c.
//
// Past one CTA the same holds one step up: where each CTA of the cluster of
// 2 would take more than half and at most 7/8 of a CTA's packs (hidden 16385
// to 28672), LayerNorm of 16-bit x takes a cluster of 4. Same-call A/B on an
// H100, bf16, us, two rounds, a cluster of 2 -> 4: 8188x16392 357.7 / 355.6
// -> 316.3 / 317.4, 7710x17408 343.2 / 343.8 -> 305.4 / 305.6, 7281x18432
// 334.3 / 335.3 -> 302.1 / 301.4, 6553x20480 318.7 / 318.9 -> 301.1 /
// 301.0, 5461x24576 304.5 / 302.2 -> 302.4 / 302.9, 4681x28672 301.7 /
// 299.6 -> 299.3 / 299.0; float16 20480 326.6 / 326.9 -> 299.5 / 299.7;
// float32 parameters 20480 321.6 / 323.0 -> 299.3 / 298.8. Above 7/8 the
// cluster of 4 lost: 4519x29696 300.3 / 301.1 -> 305.5 / 305.0, 4369x30720
// 300.3 / 299.8 -> 306.3 / 307.5, 4228x31744 304.0 / 303.4 -> 308.2 /
// 309.9. The same cap on the first step was mixed (15360: bf16 1% faster,
// float16 3% slower; 14848 level), so it is not taken there. RESULTS.md 1d.
//
// RMSNorm of 16-bit x splits rows of more than half and at most 11/16 of a
// CTA's packs (hidden 8193 to 11264) over a cluster of 2: one CTA of 288-352
// threads a row, two an SM, lost to clusters of CTAs of 160 threads (8193 to
// 10240, four an SM) and of 192 threads with EARLY (10241 to 11264, below).
// One build with knobs, H100, bf16, us, one CTA -> a cluster of 2: 15420x8704
// 333.0 -> 303.2, 14563x9216 330.3 / 329.1 -> 302.4 / 297.8, 13797x9728
// 312.5 -> 297.5, 13107x10240 311.2 / 310.5 -> 293.4 / 294.8, 12483x10752
// 304.1 -> 286.6, 11915x11264 299.8 / 297.9 -> 287.8 / 285.3, 12787x10496
// 306.2 -> 289.0; float16 9216 339.6 -> 303.8, 11264 305.7 -> 288.2; float32
// parameters 9216 329.2 -> 304.4, 11264 302.9 -> 288.8. Not above: 11397x11776
// 291.6 -> 294.6, 10922x12288 288.3 -> 302.3, 9362x14336 287.6 -> 311.0.
// RESULTS.md 1e.
//
// LayerNorm of 16-bit x whose natural cluster is 4 (hidden 32769 to 65536)
// takes 8 CTAs half as wide, two an SM. One build with a knob, H200, bf16,
// us, two rounds, 4 -> 8: 2730x49152 254.7 / 256.6 -> 244.9 / 247.7,
// 2048x65536 240.6 / 240.3 -> 228.2 / 228.9. Not taken: 8 -> 16 (1024x131072
// level, 243.7 / 242.5 -> 243.1 / 241.0), nor for RMSNorm (2730x49152 level,
// 212.4 / 214.3 -> 211.0 / 210.3; 2048x65536 217.0 / 215.9 -> 237.5 /
// 239.8; 16 CTAs at 1024x131072 218.3 / 215.4 -> 253.2 / 253.7).
// RESULTS.md 1zh.
template <NormKind K, class T>
int bwd_cluster(int64_t nvec) {
  const int cluster = pow2_ceil(ceil_div(nvec, kSliceVecs));
  if (K == NormKind::kLayer && sizeof(T) == 2 && cluster == 4) return 8;
  const int64_t share = ceil_div(nvec, cluster);  // packs of a CTA at the natural size
  bool split = false;
  if constexpr (sizeof(T) == 2) {
    if (2 * share > kSliceVecs) {
      split = K == NormKind::kLayer ? (cluster == 1 ? share < kSliceVecs : cluster == 2 && 8 * share <= 7 * kSliceVecs)
                                    : cluster == 1 && 16 * share <= 11 * kSliceVecs;
    }
  }
  return split ? 2 * cluster : cluster;
}

template <NormKind K, class T, class P, int VEC>
ffi::Error launch_bwd_slices(cudaStream_t stream, const BwdArgs& a, int64_t nvec, SlotLayout* l) {
  if constexpr (kSlicesFit<T, VEC>) {
    const int cluster = bwd_cluster<K, T>(nvec);
    // Across a cluster the row's packs are spread evenly over its CTAs
    // (row_threads of a CTA's share), not a power of two of threads each.
    // Same-call A/B on an H100, bf16, us, one round, before -> after:
    // LayerNorm 6553x20480 339.3 -> 319.7, 5461x24576 312.0 -> 303.9,
    // 2730x49152 321.3 -> 310.6; RMSNorm 305.2 -> 296.1, 294.0 -> 291.1,
    // 299.5 -> 291.9 (RESULTS.md 1b).
    // Where one CTA takes the row, whole warps too (row_threads): 43690x3072
    // LayerNorm 322.6 -> 295.7, RMSNorm 298.1 -> 290.0; 26214x5120 353.3 ->
    // 303.6 and 322.2 -> 288.5; 21845x6144 327.3 -> 333.9 and 308.6 ->
    // 314.4; 10922x12288 level (one round). CTAs of more than half of
    // kSliceThreads (one an SM) take EARLY and the fold below.
    const int tpr = std::max(32, row_threads(ceil_div(nvec, cluster), kSliceItems));  // whole warps (cta_sum)
    // Two stages of x and dy, and gamma's packs (bwd_slices' sgamma).
    const size_t smem = static_cast<size_t>(tpr) * kSliceItems * (2 * 2 * 16 + (a.gamma ? VEC * sizeof(P) : 0));
    // LayerNorm takes EARLY in clusters, and in one CTA of 129 to 255
    // threads too. Same-call A/B on an H100, us, two rounds, after the
    // reduction -> EARLY: bf16 26214x5120 306.9 / 305.8 -> 299.8 / 298.5,
    // 21845x6144 339.1 / 341.3 -> 310.3 / 308.6, 18724x7168 316.6 / 318.3 ->
    // 300.2 / 298.4; float32 x 43690x3072 614.0 / 617.0 -> 558.6 / 558.4;
    // bf16 x with float32 parameters 21845x6144 343.4 / 345.2 -> 309.4 /
    // 307.4. Not at 256 threads (float32 32768x4096 575.9 / 576.8 -> 594.2 /
    // 594.8; bf16 16384x8192 1% faster), nor for RMSNorm (5120 290 -> 316,
    // 7168 298 -> 310, 8192 294 -> 314; float32 3072 level) except in CTAs
    // of 192 threads of 16-bit x (three an SM), one a row or two: one build
    // with knobs, bf16, us, after the reduction -> EARLY: 23831x5632 313.9 ->
    // 285.7, 24966x5376 322.6 -> 286.6, 21845x6144 310.9 / 306.4 / 307.5 ->
    // 289.8 / 286.1 / 284.7; float16 6144 307.8 -> 286.9; float32 parameters
    // 6144 308.6 -> 287.6; clusters of 2 at 10752-11264 (bwd_cluster).
    // RESULTS.md 1e.
    const bool early = tpr > kSliceThreads / 2 ||
                       (K == NormKind::kLayer && (cluster > 1 || (tpr > kSliceThreads / 4 && tpr < kSliceThreads / 2))) ||
                       (K == NormKind::kRms && sizeof(T) == 2 && tpr == 192);
    // WHOLE where the row's packs fill the cluster's threads exactly, in
    // EARLY instances only. H200 same-call A/B, two rounds, bf16 (us):
    // with WHOLE, LayerNorm 8192x16384 239.2/238.7 -> 222.2/221.4,
    // 2048x65536 254.4/256.0 -> 240.3/241.7, 512x262144 273.7/274.6 ->
    // 260.3/259.2; but at 32768x4096 (non-EARLY, where LayerNorm's WHOLE
    // instance spills 16 bytes) RMSNorm 214.0/218.1 -> 228.1/225.2 and
    // LayerNorm 217.6/217.4 -> 222.6/221.9.
    const bool whole = early && fills_threads(nvec, VEC, a.shape.hidden, cluster, tpr, kSliceItems);
    auto kernel = early ? (whole ? bwd_slices<K, T, P, VEC, true, true> : bwd_slices<K, T, P, VEC, true>)
                        : bwd_slices<K, T, P, VEC, false>;
    // Persistent slots: as many clusters as are resident on the GPU at once.
    // Where one CTA of kSliceThreads holds a row (one CTA per SM), clusters
    // of kFold CTAs fold their column sums into one workspace row (fold_sums).
    // On an H100, us, one slot per CTA -> folded by 4 (by 8 the same as 4):
    // bf16 8192x16384 RMSNorm 330-332 -> 312-315, LayerNorm 337-338 -> 328-330;
    // float32 16384x8192 635 -> 618 and 649 -> 629. Smaller CTAs, several per
    // SM, gained nothing (32768x4096: 306 both ways) or lost (131072x1024:
    // 316 -> 338-342, as clusters leave fewer CTAs resident).
    constexpr int kFold = 4;
    const int fold =
        cluster == 1 && tpr > kSliceThreads / 2 && a.workspace && a.param_outputs() > 0 && l->stride >= kFold ? kFold
                                                                                                         : 1;
    const int hw = cluster * fold;  // CTAs of a hardware cluster
    int resident = 0;
    JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, dim3(tpr), smem, hw, &resident));
    const int64_t clusters = std::max<int64_t>(1, std::min<int64_t>(l->stride / fold, resident));
    l->used = clusters * fold;  // slots walking the rows
    JRN_RETURN_IF_ERROR(launch_clustered(
        kernel, dim3(static_cast<unsigned>(clusters * hw), static_cast<unsigned>(a.shape.groups)), dim3(tpr), smem,
        stream, hw, "bwd_slices", a, *l, cluster, fold));
    l->used = clusters;  // workspace rows written
    return ffi::Error::Success();
  } else {
    return ffi::Error::Internal("jax_rmsnorm: bwd_slices needs 16-byte packs");
  }
}

// dgamma/dbeta from what the dx kernel left: the slots' partial rows
// (`l`), or x and dy again where there is no workspace (bwd_columns).
template <NormKind K, class T, class P, int VEC>
ffi::Error param_sums(cudaStream_t stream, const BwdArgs& a, SlotLayout l) {
  if (a.param_outputs() == 0) return ffi::Error::Success();
  if (!a.workspace) {
    const int64_t tiles = ceil_div(a.shape.hidden / VEC, kColLanes);
    if (tiles > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: hidden size too large");
    // It reads only the backward's inputs, which the dx kernel does not
    // write, so it is launched early (launch_early) and runs beside that
    // kernel, which lets it start at once (early_launch_now); it waits for
    // the dx kernel only before it ends. Same-call A/B on an H200, bf16, in
    // XLA's CUDA graphs (benchmarks/chain_trace.py, chains of 50, the GPU's
    // us a step, JAX_RMSNORM_PDL=0 -> launched early; XLA's jnp backward):
    // RMSNorm 1x4096 5.21 -> 3.52 (2.51), 16x4096 5.28 -> 3.63 (4.07),
    // 64x4096 6.25 -> 3.78 (4.42); LayerNorm 5.69 -> 3.72 (3.73), 6.22 ->
    // 3.82 (3.92), 7.03 -> 4.15 (6.55). RESULTS.md 1zh.
    return launch_early(bwd_columns<K, T, P, VEC>,
                        dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a.shape.groups)),
                        dim3(kColLanes, kColSplit), stream, "bwd_columns", a);
  }
  const bool aligned = a.shape.hidden % 4 == 0 && aligned16(a.workspace) && (!a.dgamma || aligned16(a.dgamma)) &&
                       (!a.dbeta || aligned16(a.dbeta));
  return aligned ? reduce_slots<P, 4>(stream, a, l) : reduce_slots<P, 1>(stream, a, l);
}

// bwd_decode where it applies (bwd_decode_fits): rows of 16-byte packs, at
// most kBwdDecodeMaxRows, one parameter group, no workspace and no given
// coefficients. One pack a thread in rows of at most kBwdDecodeOneItemPacks
// packs, two in wider ones. In XLA's CUDA graphs on an H200
// (benchmarks/chain_trace.py, chains of 50, the GPU's us a step, bf16,
// bwd_slices or bwd_regs + bwd_columns -> bwd_decode with two packs a
// thread / with one; XLA's jnp backward in brackets): RMSNorm 1x2048 3.42
// -> 2.02 / 1.80 (2.43), 1x4096 3.49 -> 2.26 / 2.16 (2.54), 1x8192 4.05 ->
// 2.79 / 2.87 (3.07), 1x16384 4.92 -> 4.00 (3.81), 16x4096 3.56 -> 3.07 /
// 3.09 (4.04), 64x4096 3.73 -> 3.55 / 3.58 (4.43), 16x8192 4.12 -> 3.36 /
// 3.39 (4.69), 64x8192 4.20 -> 4.08 / 4.14 (4.83); LayerNorm 1x2048 3.75 ->
// 2.12 / 1.93 (3.55), 1x4096 3.75 -> 2.43 / 2.43 (3.83), 1x8192 4.31 ->
// 3.22 / 3.50 (7.20), 1x16384 5.29 -> 4.87 (8.75), 16x4096 3.88 -> 3.49 /
// 3.51, 64x4096 4.16 -> 4.07 / 4.11, 16x8192 4.43 -> 4.15 / 4.19, 64x8192
// 5.09 -> 5.11 / 5.16. RESULTS.md 1zi. Its dgamma/dbeta in its own CTAs
// after the rows' (decode_columns) instead of bwd_columns beside it, same
// call (benchmarks/trial_bwd_cols.sh, RESULTS.md 1zj): RMSNorm 2x4096 3.05
// -> 2.27 (2.89), 16x2048 3.05 -> 2.17 (3.29), 16x16384 4.29 -> 3.71 (5.61),
// 64x4096 3.59 -> 2.69 (4.44), 64x16384 6.79 (1zi) -> 4.57 (5.29);
// LayerNorm 16x2048 3.46 -> 2.17 (3.13), 64x8192 5.11 -> 3.25 (8.97). At
// 128 rows (the persistent kernels + bwd_columns -> this): RMSNorm 128x2048
// 3.97 -> 3.25, 128x4096 4.10 -> 3.80, 128x8192 4.78 -> 3.58; LayerNorm 4.55
// -> 2.93, 4.73 -> 3.76, 5.43 -> 4.42. Not at 256: 256x4096 5.15 -> 5.55 and
// 5.72 -> 6.78. At 65-128 rows of more than kDecodeMaxThreads packs (CTAs
// of 1024 threads, one an SM at 64 registers) the rows' and tiles' CTAs took
// two waves, and this was still ahead of the persistent kernels (RESULTS.md
// 1zj, the second A/B): RMSNorm 96x16384 8.13 -> 6.72 (XLA 5.60-5.98),
// 128x16384 8.65 -> 7.07 (6.48-6.58); LayerNorm 10.13 -> 8.32 (13.35-14.45),
// 10.47 -> 8.66 (15.32-15.36). Up to 100 rows there on 132 SMs the tiles
// now fit beside the rows, and from 101 rows CTAs of 512 threads take the
// rows (decode_launch): 96x16384 4.90 (6.03), 128x16384 5.75 (6.61).
// Up to 192 rows (128 of at most kBwdDecodeNarrowPacks packs). Against the
// persistent kernels + bwd_columns, same call (RESULTS.md 1zk): RMSNorm
// 160x2048 4.40 -> 3.75 us a step, 192x2048 4.66 -> 3.96, 160x8192 6.79 ->
// 4.06 (XLA 6.52), 192x8192 7.13 -> 4.27 (6.81), 192x16384 10.46 -> 8.52
// (8.05); LayerNorm 192x2048 5.20 -> 3.51, 192x8192 8.54 -> 5.34. Not for
// narrow rows: RMSNorm 192x1024 4.45 -> 5.00 (LayerNorm 4.95 -> 3.98), nor
// at 256 rows, where it lost at 1024 and 4096 (RMSNorm 4.93 -> 6.13 and 5.16
// -> 5.55, LayerNorm 5.76 -> 6.65).
constexpr int64_t kBwdDecodeMaxRows = 192;
constexpr int64_t kBwdDecodeNarrowPacks = 128;
constexpr int64_t kBwdDecodeNarrowMaxRows = 128;
constexpr int64_t kBwdDecodeOneItemPacks = 512;
constexpr int64_t kBwdDecodeMaxPacks = 2 * kDecodeMaxThreads;  // two packs a thread
// Rows of at least kBwdDecodePartsPacks packs, at most kBwdDecodePartsMaxRows
// of them, are each split across a cluster of kBwdDecodeParts CTAs (one pack
// a thread; the row's sums added over the cluster through distributed shared
// memory): one CTA a row had a row's loads and stores, 96 KB of 16384-wide
// bf16 rows, waiting on one SM. In XLA's CUDA graphs on an H200
// (benchmarks/trial_decode_parts.sh, us a step, bf16, one CTA a row -> 2 /
// 4 / 8 parts, XLA in brackets; RESULTS.md 1zm): RMSNorm 1x16384 4.19 ->
// 3.84 / 3.30 / 2.84 (3.88), 2x16384 3.56 -> 3.70 / 3.36 / 2.93 (3.44),
// 8x16384 3.67 -> 4.05 / 3.40 / 3.14 (4.42), 1x8192 2.88 -> 3.25 / 2.72 /
// 2.57 (2.69), 2x8192 2.65 -> 3.20 / 2.69 / 2.62 (3.28); LayerNorm 1x16384
// 5.18 -> 4.40 / 3.64 / 3.16 (7.77), 8x16384 4.13 -> 4.32 / 3.73 / 3.44
// (11.05), 1x8192 3.39 -> 3.55 / 2.99 / 2.81 (6.31).
constexpr int kBwdDecodeParts = 8;
constexpr int64_t kBwdDecodePartsPacks = 1024;
constexpr int64_t kBwdDecodePartsMaxRows = 8;
// bwd_decode indexes its rows in 32 bits (8: the elements of a 16-byte pack of 16-bit x).
static_assert(kBwdDecodeMaxRows * kBwdDecodeMaxPacks * 8 <= INT32_MAX, "bwd_decode: 32-bit indexing");

inline bool bwd_decode_fits(const BwdArgs& a, int64_t nvec) {
  const int64_t max_rows = nvec > kBwdDecodeNarrowPacks ? kBwdDecodeMaxRows : kBwdDecodeNarrowMaxRows;
  return !a.workspace && !a.coef && a.shape.groups == 1 && a.shape.rows <= max_rows && nvec <= kBwdDecodeMaxPacks;
}

// bwd_decode's launch: packs a thread, the CTA's threads, and the column
// CTAs' rows of threads (S, so threads / S packs a tile) and count.
struct DecodeLaunch {
  int items, threads, splits;
  int64_t tiles;
  int parts = 1;  // CTAs (a cluster) a row
};

// CTAs of 512 threads an SM at bwd_decode's 64 registers (kDecodeMaxThreads'
// bound): two.
constexpr int64_t kDecodeHalfCtasPerSm = 2;

// Up to kBwdDecodePartsMaxRows rows of at least kBwdDecodePartsPacks packs:
// clusters of kBwdDecodeParts CTAs a row (see there), one pack a thread.
// Otherwise one pack a thread up to kBwdDecodeOneItemPacks, two up to kDecodeMaxThreads
// packs (CTAs of at most 512 threads; tiles of 32 rows of threads, a quarter
// of the threads below 256). Wider rows take CTAs of kDecodeMaxThreads, one
// an SM, with tiles of 16 rows of threads where rows and tiles fit in one
// wave; else four packs a thread in CTAs of 512, two an SM, with tiles of 32
// rows of threads where those fit in one wave, else of 16. In chains of
// bf16 backwards in XLA's CUDA graphs on an H200 (benchmarks/chain_trace.py,
// us a step, RESULTS.md 1zk and 1zl):
//   - S=16 against 32 in CTAs of 1024 where both fit: 64x16384 RMSNorm 4.56
//     -> 3.98, 96x16384 6.64 -> 5.04 (XLA 5.90), LayerNorm 8.25 -> 5.82.
//   - Where 1024-thread CTAs took two waves, four packs a thread in CTAs of
//     512 (S=32 / S=16): RMSNorm 112x16384 7.05 -> 5.64 / 5.85 (XLA 5.87),
//     128x16384 7.11 -> 5.75 / 5.96 (6.61), 160x16384 7.79 -> 7.69 / 7.01
//     (7.73), 192x16384 8.54 -> 8.07 / 7.27 (8.02); LayerNorm 112x16384 8.53
//     -> 6.22 / 6.82, 192x16384 9.69 -> 10.39 / 8.25. Not where CTAs of 1024
//     fit: 96x16384 5.03 -> 5.55 / 5.72.
inline DecodeLaunch decode_launch(int64_t rows, int64_t nvec, bool tiles_wanted) {
  auto make = [&](int items, int splits, int parts = 1) {
    const int threads = std::max(32, pow2_ceil(ceil_div(nvec, static_cast<int64_t>(items) * parts)));
    const int s = threads < 256 ? threads / 8 : splits;
    const int64_t tiles = tiles_wanted ? ceil_div(nvec, static_cast<int64_t>(threads / s)) : 0;
    // The tiles' CTAs fill whole clusters after the rows'.
    return DecodeLaunch{items, threads, s, ceil_div(tiles, parts) * parts, parts};
  };
  // A part of at most 256 packs: one pack a thread.
  if (nvec >= kBwdDecodePartsPacks && rows <= kBwdDecodePartsMaxRows && has_clusters()) {
    return make(1, 32, kBwdDecodeParts);
  }
  if (nvec <= kBwdDecodeOneItemPacks) return make(1, 32);
  if (nvec <= kDecodeMaxThreads) return make(2, 32);
  const int64_t sms = device_attribute<cudaDevAttrMultiProcessorCount>();
  if (const DecodeLaunch l = make(2, 16); rows + l.tiles <= sms) return l;
  if (const DecodeLaunch l = make(4, 32); rows + l.tiles <= kDecodeHalfCtasPerSm * sms) return l;
  return make(4, 16);
}

template <NormKind K, class T, class P, int VEC, int ITEMS>
auto bwd_decode_kernel(bool direct) {
  return direct ? bwd_decode<K, T, P, VEC, ITEMS, true> : bwd_decode<K, T, P, VEC, ITEMS, false>;
}

template <NormKind K, class T, class P, int VEC>
ffi::Error launch_bwd_decode(cudaStream_t stream, const BwdArgs& a, int64_t nvec) {
  const bool direct = a.shape.rows == 1 && a.param_outputs() > 0;
  // Column tiles: none where the row's CTA writes dgamma itself, or where
  // neither dgamma nor dbeta is asked for.
  const DecodeLaunch l = decode_launch(a.shape.rows, nvec, !direct && a.param_outputs() > 0);
  auto kernel = l.items == 1   ? bwd_decode_kernel<K, T, P, VEC, 1>(direct)
                : l.items == 2 ? bwd_decode_kernel<K, T, P, VEC, 2>(direct)
                               : bwd_decode_kernel<K, T, P, VEC, 4>(direct);
  BwdArgs b = a;
  b.slots = l.splits;  // without a workspace `slots` carries the tiles' rows of threads
  return launch_early_clustered(kernel, dim3(static_cast<unsigned>(a.shape.rows * l.parts + l.tiles)),
                                dim3(l.threads), static_cast<unsigned>(l.parts), stream, "bwd_decode", b);
}

template <NormKind K, class T, class P, int VEC>
ffi::Error launch_bwd_vec(cudaStream_t stream, const BwdArgs& a) {
  const int64_t nvec = a.shape.hidden / VEC, rpg = a.shape.rows_per_group();
  if constexpr (kSlicesFit<T, VEC>) {
    if (bwd_decode_fits(a, nvec)) return launch_bwd_decode<K, T, P, VEC>(stream, a, nvec);
  }
  if (a.shape.groups > 65535) return ffi::Error::InvalidArgument("jax_rmsnorm: too many parameter groups");
  // Without a workspace (no dgamma/dbeta, or few rows: bwd_columns sums them),
  // pick a slot count freely.
  const int64_t slots = a.workspace ? a.slots : std::min<int64_t>(rpg, 4096);
  if (slots < 1) return ffi::Error::InvalidArgument("jax_rmsnorm: backward workspace is missing");
  SlotLayout l{slots, slots};
  const bool slices = kSlicesFit<T, VEC> && has_clusters() && nvec > kRegVecs &&
                      nvec <= kSliceVecs * kMaxCluster;
  if (!slices && nvec <= static_cast<int64_t>(kRegThreads) * kRegItems) {
    const int tpr = pow2_ceil(ceil_div(nvec, kRegItems));
    const int64_t rpb = std::min<int64_t>(rows_per_cta(tpr, kBlockThreads), slots);
    const int64_t blocks = slots / rpb;
    l.used = blocks * rpb;
    bwd_regs<K, T, P, VEC><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.shape.groups)),
                             dim3(tpr, static_cast<unsigned>(rpb)), 0, stream>>>(a, l);
    JRN_RETURN_IF_ERROR(check_launch("bwd_regs"));
  } else if (slices) {
    JRN_RETURN_IF_ERROR((launch_bwd_slices<K, T, P, VEC>(stream, a, nvec, &l)));
  } else {
    bwd_stream<K, T, P, VEC><<<dim3(static_cast<unsigned>(slots), static_cast<unsigned>(a.shape.groups)),
                               kStreamThreads, 0, stream>>>(a, l);
    JRN_RETURN_IF_ERROR(check_launch("bwd_stream"));
  }
  return param_sums<K, T, P, VEC>(stream, a, l);
}

// Rows wider than one CTA takes (see unaligned_plan) split over a cluster
// of up to this many CTAs (sm_90+).
constexpr int kUnalignedMaxCluster = 4;
// Packs a thread of bwd_unaligned holds in rows of kRegThreads * kRegItems
// to kRegThreads * kUnalignedWideItems packs (8200-12295 elements of 16-bit
// x): one CTA, with no exchange across a cluster.
constexpr int kUnalignedWideItems = 3;
// And four packs a thread up to kRegThreads * kUnalignedWidestItems packs
// (12296-16383 elements of 16-bit x), LayerNorm only up to
// kUnalignedLayerWidestPacks (CTAs of at most 448 threads). RMSNorm fits 128
// registers there; LayerNorm of 16-bit x spills 96-120 bytes a thread, and
// at 512 threads its shared memory (192 KB) leaves L1 too little to hold
// them. Same-call A/B on an H100, bf16, 2^27 elements, us, cluster of two ->
// one CTA: RMSNorm 10914x12297 523.2 -> 345.6, 9586x14001 466.3 -> 331.5,
// 8192x16383 412.4 -> 322.2; LayerNorm 617.3 -> 560.1 (416 threads), 564.5
// -> 533.3 (448), but 482.6 -> 519.2 at 16383 (512). RESULTS.md 1k.
constexpr int kUnalignedWidestItems = 4;
constexpr int64_t kUnalignedLayerWidestPacks = 448 * kUnalignedWidestItems;
// Narrower rows of 16-bit x take four packs a thread as well from
// kUnalignedFourFromPacks: RMSNorm up to kRegThreads * kRegItems packs,
// LayerNorm up to kUnalignedLayerFourMostPacks. A quarter of the packs in
// threads, not a half: CTAs of more rows, or (8191) two CTAs of 256 threads
// an SM instead of one of 512. Same-call A/B on an H100, bf16, 2^27
// elements, us, two packs -> four: RMSNorm 223324x601 430.1 -> 315.2,
// 134083x1001 343.5 -> 318.2, 65472x2050 335.9 -> 306.3, 32760x4097 338.4
// -> 307.5, 32736x4100 337.5 -> 306.0, 22365x6001 422.8 -> 314.4,
// 16386x8191 370.1 -> 306.7 (XLA 511-1042). LayerNorm gains at 601 (496.4
// -> 413.2) but loses at 1001 (389.2 -> 397.4), 2050 (384.6 -> 448.3) and
// 4097 (395.2 -> 451.4), so it stops between them. Float32 x loses (RMSNorm
// 65504x2049 573.3 -> 591.7, 32760x4097 573.5 -> 591.1) and keeps two.
// Below 64 packs not measured. RESULTS.md 1m.
constexpr int64_t kUnalignedFourFromPacks = 64;
constexpr int64_t kUnalignedLayerFourMostPacks = 96;
// LayerNorm of 16-bit x takes three packs a thread where two would need
// more than 320 threads (one CTA an SM under their 96-register cap) and
// three fit in kBlockThreads (two CTAs an SM under 128): rows of 641-768
// packs, 5128-6151 elements. Same-call A/B on an H100 (two rounds), bf16,
// 2^27 elements, us, two packs -> three packs from 256 packs on: 22365x6001
// 508.9 -> 380.4 (XLA 905); no gain where two packs already fit two CTAs or
// three do not: 65472x2050 384.9 -> 391.4, 32760x4097 392.6 -> 395.7,
// 26843x5000 318.9 -> 318.0, 16386x8191 470.1 -> 473.6. RESULTS.md 1n.
constexpr int64_t kUnalignedLayerThreeAbovePacks = 640;

// The most whole 16-byte packs between a row's head and tail, at any
// offset (bwd_unaligned's threads hold these; the head and tail elements go
// to the first threads on their own): hidden / kVec, one fewer than
// ceil(hidden / kVec). At 4100 (bf16) 512, which 256 threads hold, where
// 513 took 288: nine warps, one CTA an SM under the register cap (RESULTS.md
// 1h).
template <class T>
int64_t unaligned_packs(int64_t hidden) {
  return hidden / static_cast<int64_t>(16 / sizeof(T));
}

// How bwd_unaligned takes a row of `nvec` whole packs: kRegItems packs a
// thread in one CTA up to kRegThreads * kRegItems packs (16-bit x four from
// kUnalignedFourFromPacks, LayerNorm up to kUnalignedLayerFourMostPacks, and
// LayerNorm three above kUnalignedLayerThreeAbovePacks), then
// kUnalignedWideItems or kUnalignedWidestItems in one CTA, then kRegItems
// across a cluster of up to kUnalignedMaxCluster CTAs (sm_90+). `ok` is
// false where none fits (the shared memory, or the cluster): bwd_stream
// takes the row.
struct UnalignedPlan {
  bool ok = false;
  int items = 0, cluster = 1, tpr = 0, rpb = 1;
  size_t smem = 0;  // the scales and dgamma (dbeta) sums of each thread's columns
};

template <NormKind K, class T>
UnalignedPlan unaligned_plan(int64_t hidden) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t nvec = unaligned_packs<T>(hidden), one_cta = static_cast<int64_t>(kRegThreads) * kRegItems;
  // Shared memory a CTA may opt in to, less a margin for the kernel's own
  // arrays (the row sums and the cluster exchange).
  const int64_t smem_most = static_cast<int64_t>(device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>()) - 1024;
  auto plan = [&](int items, int cluster) {
    UnalignedPlan u;
    u.items = items, u.cluster = cluster;
    u.tpr = std::max(2 * kVec, row_threads(ceil_div(nvec, cluster), items));  // head, tail: 2 * kVec
    u.rpb = rows_per_cta(u.tpr, kBlockThreads);  // 1 in clusters (tpr > 256)
    u.smem = static_cast<size_t>(u.tpr) * u.rpb * items * kVec * sizeof(float) * (K == NormKind::kLayer ? 3 : 2);
    u.ok = static_cast<int64_t>(u.smem) <= smem_most;
    return u;
  };
  const int64_t four_most = K == NormKind::kLayer ? kUnalignedLayerFourMostPacks : one_cta;
  if (sizeof(T) == 2 && nvec >= kUnalignedFourFromPacks && nvec <= four_most) {
    const UnalignedPlan u = plan(kUnalignedWidestItems, 1);
    if (u.ok) return u;
  }
  if (K == NormKind::kLayer && sizeof(T) == 2 && nvec > kUnalignedLayerThreeAbovePacks &&
      nvec <= static_cast<int64_t>(kBlockThreads) * kUnalignedWideItems) {
    const UnalignedPlan u = plan(kUnalignedWideItems, 1);
    if (u.ok) return u;
  }
  if (nvec <= one_cta) return plan(kRegItems, 1);
  const int64_t widest = K == NormKind::kLayer ? kUnalignedLayerWidestPacks
                                               : static_cast<int64_t>(kRegThreads) * kUnalignedWidestItems;
  for (const int items : {kUnalignedWideItems, kUnalignedWidestItems}) {
    if (nvec <= std::min(widest, static_cast<int64_t>(kRegThreads) * items)) {
      const UnalignedPlan u = plan(items, 1);
      if (u.ok) return u;
      break;
    }
  }
  if (!has_clusters() || nvec > one_cta * kUnalignedMaxCluster) return UnalignedPlan{};
  return plan(kRegItems, pow2_ceil(ceil_div(nvec, one_cta)));
}

template <NormKind K, class T, class P>
ffi::Error launch_bwd_unaligned(cudaStream_t stream, const BwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const UnalignedPlan u = unaligned_plan<K, T>(a.shape.hidden);
  if (!u.ok) return launch_bwd_vec<K, T, P, 1>(stream, a);
  if (a.shape.groups > 65535) return ffi::Error::InvalidArgument("jax_rmsnorm: too many parameter groups");
  const int64_t rpg = a.shape.rows_per_group();
  const int cluster = u.cluster, rpb = u.rpb;
  const size_t smem = u.smem;
  const dim3 block(u.tpr, rpb);
  int resident = 0;  // slots: CTAs, or clusters
  auto kernel = cluster > 1                        ? bwd_unaligned<K, T, P, true, kRegItems>
                : u.items == kUnalignedWideItems   ? bwd_unaligned<K, T, P, false, kUnalignedWideItems>
                : u.items == kUnalignedWidestItems ? bwd_unaligned<K, T, P, false, kUnalignedWidestItems>
                                                   : bwd_unaligned<K, T, P, false, kRegItems>;
  JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, block, smem, cluster, &resident));
  // Persistent slots, as many as are resident at once (and the workspace
  // holds), a multiple of `period` (see bwd_unaligned): rows `period` apart
  // start at the same offset from a 16-byte boundary (period * hidden a
  // multiple of kVec: 2 at 4100, 4 at 2050 and 12290, 8 at odd widths).
  // CTAs (or clusters) a multiple of `step`.
  const int64_t period = kVec / std::gcd(a.shape.hidden, static_cast<int64_t>(kVec));
  const int64_t step = period / std::gcd(static_cast<int64_t>(rpb), period);
  int64_t groups_of = std::min<int64_t>(resident, ceil_div(rpg, rpb));  // CTAs or clusters
  if (a.workspace) {
    groups_of = std::min<int64_t>(groups_of, a.slots / rpb) / step * step;
    // Fewer than `period` slots (not with cuda_slots' counts at these widths).
    if (groups_of == 0) return launch_bwd_vec<K, T, P, 1>(stream, a);
  } else {
    groups_of = ceil_div(groups_of, step) * step;
  }
  SlotLayout l{groups_of * rpb, a.workspace ? a.slots : groups_of * rpb};
  const dim3 grid(static_cast<unsigned>(groups_of * cluster), static_cast<unsigned>(a.shape.groups));
  if (cluster > 1) {
    JRN_RETURN_IF_ERROR(
        launch_clustered(kernel, grid, block, smem, stream, cluster, "bwd_unaligned (clusters)", a, l, cluster));
  } else {
    kernel<<<grid, block, smem, stream>>>(a, l, 1);
    JRN_RETURN_IF_ERROR(check_launch("bwd_unaligned"));
  }
  return param_sums<K, T, P, 1>(stream, a, l);
}

}  // namespace

template <NormKind K, class T, class P>
ffi::Error launch_bwd(cudaStream_t stream, const BwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool rows16 = aligned16(a.x) && aligned16(a.dy) && aligned16(a.dx) && (!a.dh || aligned16(a.dh));
  if (a.shape.hidden % kVec == 0) {
    if (rows16 && (!a.gamma || aligned16(a.gamma))) return launch_bwd_vec<K, T, P, kVec>(stream, a);
  } else if (rows16) {
    // Rows that are not a multiple of the pack, with x, dy, dx (and dh)
    // 16-byte aligned: bwd_unaligned (where its plan fits), else bwd_stream.
    return launch_bwd_unaligned<K, T, P>(stream, a);
  }
  return launch_bwd_vec<K, T, P, 1>(stream, a);
}

}  // namespace jrn::cuda

// Used inside namespace jrn::cuda by norm_bwd_*.cu.
#define JRN_INSTANTIATE_BWD(K, T, P) \
  template ffi::Error launch_bwd<K, T, P>(cudaStream_t, const BwdArgs&);
