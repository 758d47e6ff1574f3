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
//
// float32 LayerNorm centres each row again (kCentred): xhat = (x - mean) *
// rstd + nb, where nb = -mean(xhat) over the row undoes the rounding of the
// saved float32 mean (plan::centres_rows).
#pragma once

#include "../common/cluster.cuh"
#include "../common/norm_math.cuh"
#include "../common/reduce.cuh"
#include "../common/vec_io.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

// Whether x's rows are centred again (plan::centres_rows: float32
// LayerNorm): a third row sum, sum(xhat) over the row, gives the shift nb
// that the saved mean's float32 rounding put on every xhat of the row.
template <NormKind K, class T>
constexpr bool kCentred = plan::centres_rows(K, dtype_of<T>());

// The row sums of the backward, acc = {sum(g * xhat), sum(g), sum(xhat)},
// g = dy * scale, over the row's threads (and its cluster's CTAs): RMSNorm
// needs only the first, LayerNorm the first two, centred rows all three;
// the rest are dead code.
template <NormKind K, class T>
constexpr int kGradSums = K == NormKind::kLayer ? (kCentred<K, T> ? 3 : 2) : 1;

// WIDE: cta_sum (bwd_slices: whole warps).
template <NormKind K, class T, bool WIDE = false>
__device__ __forceinline__ void grad_row_sums(float (&acc)[3], float* smem,
                                              ClusterPush<kGradSums<K, T>>* exchange = nullptr, int buf = 0) {
  float(&sums)[kGradSums<K, T>] = reinterpret_cast<float(&)[kGradSums<K, T>]>(acc);
  if constexpr (WIDE) {
    cta_sum<kGradSums<K, T>>(sums, smem);
  } else {
    row_sum<kGradSums<K, T>>(sums, smem);
  }
  if (exchange) exchange->sum(sums, buf);  // a cluster of one: nothing to add
}

// The same, then, where `clustered`, the CTAs' sums added over the cluster by
// cluster_sum (each CTA's pulled from its `xchg`, parity 0): for kernels of
// one row a cluster that take these sums once (bwd_decode's split rows).
template <NormKind K, class T, bool WIDE = false>
__device__ __forceinline__ void grad_row_sums(float (&acc)[3], float* smem, float (*xchg)[kGradSums<K, T>],
                                              bool clustered) {
  grad_row_sums<K, T, WIDE>(acc, smem);
  if (clustered) cluster_sum<kGradSums<K, T>>(reinterpret_cast<float(&)[kGradSums<K, T>]>(acc), xchg, 0);
}

// p[0] + p[stride] + ... + p[(n - 1) * stride], added in that order: the
// fixed order that makes the column sums' totals the same run to run.
__device__ __forceinline__ float ordered_sum(const float* p, int n, int stride) {
  float total = 0.f;
#pragma unroll 8
  for (int k = 0; k < n; ++k) total += p[k * stride];
  return total;
}

// A row's coefficients: c1 = mean(gdy * xhat), c2 = mean(gdy) (0 for
// RMSNorm), and nb, the shift that centres the row's xhat (0 but for
// centred rows, kCentred).
struct RowCoefs {
  float c1, c2, nb;
};

// A row's coefficients, given in a.coef (grad_sums_per_row values a row,
// combined across the devices that split the hidden dim; no centring) or
// from the row's own sums `acc` (grad_row_sums). Centred, xhat + nb has
// mean zero, and sum(g * (xhat + nb)) = acc[0] + nb * acc[1].
// `read` false: the row is past the end (no coefficients to read).
template <NormKind K, class T>
__device__ __forceinline__ RowCoefs row_coefs(const BwdArgs& a, int64_t row, bool read, const float (&acc)[3]) {
  constexpr int kGiven = grad_sums_per_row(K);
  const float H = static_cast<float>(a.shape.hidden);
  RowCoefs c;
  c.nb = kCentred<K, T> && !a.coef ? -acc[2] / H : 0.f;
  c.c1 = a.coef ? (read ? a.coef[kGiven * row] : 0.f) : (kCentred<K, T> ? fmaf(c.nb, acc[1], acc[0]) : acc[0]) / H;
  c.c2 = K != NormKind::kLayer ? 0.f : a.coef ? (read ? a.coef[kGiven * row + 1] : 0.f) : acc[1] / H;
  return c;
}

// xhat of one column: centred, (x - mean) * rstd + nb (x - mean is exact in
// float32 for x within a factor of two of the mean); else one FFMA,
// x * rstd - mean * rstd (with grad_sums_scaled: fewer instructions a column;
// docs/tuning.md, grad-dx-xhat).
template <bool CENTRED>
__device__ __forceinline__ float xhat_of(float x, float mean, float rstd, float nb) {
  return CENTRED ? fmaf(x - mean, rstd, nb) : fmaf(x, rstd, -mean * rstd);
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

// A slot's dgamma (and dbeta) sums of the VEC columns from `col` into its
// workspace rows: the outputs wanted, in order.
template <NormKind K, int VEC>
__device__ __forceinline__ void store_slot_sums(const BwdArgs& a, SlotLayout l, int64_t slot, int64_t col,
                                                const float (&dg)[VEC], const float (&db)[VEC]) {
  int out = 0;
  if (a.dgamma) store_pack<VEC>(slot_row(a, l, slot, out++) + col, dg);
  if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(slot_row(a, l, slot, out) + col, db);
}

// dx of a pack of VEC columns (x, dy and the scales as floats) into `out`,
// and the pack's dy * xhat and dy added to its dgamma and dbeta sums.
// FOLD (LayerNorm): rstd * (g - c2 - xh * c1) as g * rstd + (xh * k1 + k0),
// k1 = -c1 * rstd and k0 = -c2 * rstd the row's, one instruction a column
// fewer (bwd_slices' LEAN).
template <NormKind K, class T, bool FOLD = false, int VEC>
__device__ __forceinline__ void grad_dx(float (&out)[VEC], float (&dg)[VEC], float (&db)[VEC], const float (&xv)[VEC],
                                        const float (&d)[VEC], const float (&s)[VEC], float mean, float rstd,
                                        RowCoefs c) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float xh = xhat_of<kCentred<K, T>>(xv[j], mean, rstd, c.nb);
    if constexpr (FOLD && K == NormKind::kLayer) {
      out[j] = fmaf(d[j] * s[j], rstd, fmaf(xh, -c.c1 * rstd, -c.c2 * rstd));
    } else {
      out[j] = rstd * (d[j] * s[j] - c.c2 - xh * c.c1);
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
// (never centred rows, kCentred: launch_bwd gives them slots)
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
