// bwd_slices (sm_90+): rows of more than kRegVecs packs, persistent.
#pragma once

#include <cooperative_groups.h>

#include "../common/async_copy.cuh"
#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

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
// 16-bit x: the plan has the rule), else just after that row's
// reduction, whose barrier already orders it (best with several CTAs per
// SM; docs/tuning.md, bwd-slices-early). gamma's packs of the slice are
// copied into shared memory once (sgamma). dgamma/dbeta column sums stay in
// registers; with `fold` > 1 (whole rows a CTA, so `cluster` is 1) each
// hardware cluster of `fold` CTAs folds them into one workspace row.
// WHOLE: every CTA's slice is whole packs inside the row (launch_bwd_slices
// checks), so no pack tests whether it is in the row.
template <NormKind K, class T, class P, int VEC, bool EARLY, bool WHOLE = false>
__global__ void __launch_bounds__(kSliceThreads) bwd_slices(BwdArgs a, SlotLayout l, int cluster, int fold,
                                                            bool stats_ahead) {
#ifdef JRN_NO_CLUSTERS
  __trap();  // sm_90+ only (bulk copies, clusters): the plans send nothing older here
#else
  early_launch_now();  // bwd_columns may run beside it (param_sums)
  using Vec = Pack<T, VEC>;
  static_assert(sizeof(Vec) == 16, "bwd_slices moves 16-byte packs");
  // [2 stages][x, dy][kSliceItems * blockDim.x] packs, then gamma's packs
  // of this CTA's slice (kSliceItems * blockDim.x, where gamma is given).
  extern __shared__ uint4 stages[];
  __shared__ float smem[kRowSumSmem];
  __shared__ alignas(8) float xchg[2][kMaxCluster][kGradSums<K, T>];
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
  // sums (kShiftedSums) and grad_dx's FOLD: two instructions a column fewer
  // (docs/tuning.md, bwd-slices-lean).
  constexpr bool kLean = EARLY && kShiftedSums<K, T>;
  // Pack i of this thread in a stage (or in the staged gamma), and its
  // column in the CTA's slice. The column repeats the index sum in 64 bits
  // rather than widen pack(i), which changed the code of many instances.
  auto pack = [&](int i) { return i * blockDim.x + threadIdx.x; };
  auto local = [&](int i) { return (static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC; };
  auto in_row = [&](int i) { return WHOLE || first + local(i) < H; };
  auto stage = [&](int st, int tensor, int i) {
    return reinterpret_cast<const Vec*>(stages + (2 * st + tensor) * packs + pack(i));
  };
  const int64_t slice_elems = slice_columns(rank, static_cast<int64_t>(packs) * VEC, H);
  const unsigned slice_bytes = static_cast<unsigned>(slice_elems * sizeof(T));
  BulkStages ring(landed);
  ClusterPush<kGradSums<K, T>> exchange(xchg, pushed, cluster, rank);
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
  // time (the loads' waits were the kernel's largest stall). The registers
  // have no room for them, and the shared memory costs no CTAs: at 512
  // threads the registers already allow one an SM (docs/tuning.md,
  // bwd-slices-sgamma).
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
    // The row's statistics, loaded after the wait for its stage, or (the
    // plan's stats_ahead, late instances only) a row ahead as x and dy are:
    // which is faster depends on the memory (docs/tuning.md, bwd-slices-stats).
    const bool ahead = !EARLY && stats_ahead;
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
      float acc[3] = {0.f, 0.f, 0.f};
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
      grad_row_sums<K, T, true>(acc, smem, &exchange, st);
      if constexpr (!EARLY) {
        ring.order_refill_after_reduction();  // one-warp CTAs: hidden 1024 in bf16
        prefetch(r + l.used, st ^ 1);
      }
      const RowCoefs c = row_coefs<K, T>(a, row, true, acc);
      T* dx = static_cast<T*>(a.dx) + row * H + first;
#pragma unroll
      for (int i = 0; i < kSliceItems; ++i) {
        if (in_row(i)) {
          float xf[VEC], df[VEC], s[VEC], out[VEC];
          unpack<true>(*stage(st, 0, i), xf);
          unpack<true>(*stage(st, 1, i), df);
          scale_of(i, s);
          grad_dx<K, T, kLean>(out, dg[i], db[i], xf, df, s, mean, rstd, c);
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
  // The common case's walk, compiled twice: once where the slot is a
  // cluster and once where it is one CTA, so that each is scheduled for its
  // own case (docs/tuning.md, bwd-slices-plain-walk).
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
    if (in_row(i)) {  // store_slot_sums written out: the call changed this kernel's code
      int out = 0;
      if (a.dgamma) store_pack<VEC>(slot_row(a, l, slot, out++) + first + local(i), dg[i]);
      if (K == NormKind::kLayer && a.dbeta) store_pack<VEC>(slot_row(a, l, slot, out) + first + local(i), db[i]);
    }
  }
#endif
}

}  // namespace
}  // namespace jrn::cuda
