// Helpers of the backward kernels:
//
//   xhat = (x - mean) * rstd,  gdy = dy * scale
//   dx   = rstd * (gdy - mean(gdy) - xhat * mean(gdy * xhat))   (LayerNorm)
//   dx   = rstd * (gdy - xhat * mean(gdy * xhat))               (RMSNorm)
//   dgamma = sum_rows dy * xhat,  dbeta = sum_rows dy
//   dx  += dh  (fused residual add: the gradient of h = x + residual)
//
// dgamma/dbeta are reduced without atomics: each "slot" (one row of threads
// of a CTA, or a cluster) walks a fixed set of rows and keeps its column
// sums, written to its own row of the float32 workspace; bwd_reduce then adds
// the rows column by column in a fixed order. Without a workspace (groups of
// few rows) bwd_columns, or bwd_decode's own column CTAs, sum them from x and
// dy, also in a fixed order. The result is bitwise reproducible run to run.
//
// With `coef` (the hidden dim split across devices) the kernels take the row
// means c1 = mean(gdy * xhat) and, for LayerNorm, c2 = mean(gdy) of the whole
// row from it (row_coefs).
#pragma once

#include "../common/cluster.cuh"
#include "../common/norm_math.cuh"
#include "../common/reduce.cuh"
#include "../common/vec_io.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

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
    // xhat as one FFMA, x * rstd - mean * rstd (with grad_sums_scaled: fewer
    // instructions a column; docs/tuning.md, grad-dx-xhat).
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

}  // namespace
}  // namespace jrn::cuda
