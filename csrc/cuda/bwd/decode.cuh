// bwd_decode: the backward at decode-time row counts (plan: at most
// kDecodeMaxRows rows, one parameter group, no workspace but a slot a row
// for centred rows), and its column CTAs that sum dgamma/dbeta in the same
// launch.
#pragma once

#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

// dgamma/dbeta of bwd_decode's launch, in its CTAs after the rows' (one
// column tile each): a CTA of `threads` is S = a.slots rows of threads (the
// host's choice, decode_launch) by threads / S packs of columns. Each row
// of threads takes every S-th row, kDecodeColUnroll rows' loads in flight,
// and the rows of threads' sums are added in order through shared memory: a
// fixed order, so the result is the same run to run.
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
// kBwdDecodeMaxRows rows, one parameter group): one row a CTA
// (up to kBwdDecodePartsMaxRows wide rows: a cluster of kBwdDecodeParts CTAs
// a row, their sums added through distributed shared memory), ITEMS packs a
// thread held raw; x, dy, the scales and the row's statistics
// loaded at once after the early launch's wait, and one reduction a row, as
// in fwd_decode. The persistent kernels' pipeline (bwd_slices' stages, the
// slot's walk over rows) is start-up cost that a row or a few never repay.
// DIRECT: each row writes its dy * xhat and dy itself: dgamma and dbeta
// where it is the launch's only row, else (centred rows, kCentred, given a
// workspace) its own workspace slot, which bwd_reduce adds after. Otherwise
// the CTAs after the rows' sum dgamma/dbeta by columns (decode_columns), in
// the same launch: one kernel a step.
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
  __shared__ float xchg[2][kGradSums<K, T>];
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
  float acc[3] = {0.f, 0.f, 0.f};
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
  grad_row_sums<K, T, true>(acc, smem, xchg, parts > 1);
  const RowCoefs c = row_coefs<K, T>(a, row, true, acc);
  T* dx = static_cast<T*>(a.dx) + row * H;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (in[i]) {
      const int col = pack(i) * VEC;
      float xf[VEC], d[VEC], out[VEC], dg[VEC] = {}, db[VEC] = {}, si[VEC];
      if constexpr (!kHoldScales) load_scale<VEC>(gamma, col, a.zero_centered, si);
      unpack(xv[i], xf);
      unpack(dv[i], d);
      grad_dx<K, T>(out, dg, db, xf, d, kHoldScales ? s[i] : si, mean, rstd, c);
      if (a.dh) add_dh<VEC, T>(a, row * H + col, out);
      store_pack<VEC>(dx + col, out);
      if constexpr (DIRECT) {
        if (kCentred<K, T> && a.workspace) {  // centred rows: to the row's slot
          store_slot_sums<K>(a, SlotLayout{a.shape.rows, a.slots}, row, col, dg, db);
        } else {
          if (a.dgamma) store_pack<VEC>(static_cast<P*>(a.dgamma) + col, dg);
          if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(static_cast<P*>(a.dbeta) + col, db);
        }
      }
    }
  }
  if (parts > 1) cluster_done();  // no CTA leaves while another reads its xchg
}

}  // namespace
}  // namespace jrn::cuda
