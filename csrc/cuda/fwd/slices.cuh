// fwd_slices (sm_90+): rows too wide for one CTA, and the FP8 outputs from
// narrower rows. Persistent slots of `cluster` CTAs walk the rows; each CTA's
// slice of x (contiguous) arrives by bulk copy in one of two shared-memory
// stages while the previous row is normalized from the other. A cluster's
// CTAs push their row sums to each other (ClusterPush) instead of meeting at
// a cluster barrier each row. LayerNorm takes both sums in one pass around a
// shift near the mean of each CTA's slice (layer_shift, from the stage), one
// reduction a row: the CTAs push their slice's mean and squared deviations,
// merged by size. The FP8 outputs read y's inputs from the stage again for
// each pass they need, unless the configuration holds y; per-tensor amax is
// merged once per CTA and tensor, not once per row. The FP8 outputs are
// bound by instruction issue, so a pack's work is kept short: the row's
// parameter and output pointers are held in registers (held), and
// per-tensor FP8 skips columns past the row's end.
//
// The configuration (plan::SliceVariant, and WHOLE where the row's packs fill
// the CTAs' threads exactly) is the plan's; plan.h names each and says when
// it is picked, and docs/tuning.md why. What they fix (plan::SliceConfig):
//  - held_params (ONE_CTA): gamma and beta packs in registers across rows,
//    reloaded only where the parameter group changes (one CTA a row);
//  - refill_at_end: the prologue fills both stages, and a row's stage takes
//    the row after next at the row's end (two rows' copies in flight);
//  - staged_params: gamma and beta in shared memory after the stages, each
//    thread its own packs (no barrier), reloaded where the group changes;
//  - hold_y: the row's y (RMSNorm: x * gamma) held between the row's max and
//    its quantization (LayerNorm: the max reduced with the next row's sums);
//  - halves / row_cap: register caps for CTAs half as wide / one more CTA.
#pragma once

#include <type_traits>

#include "../common/async_copy.cuh"
#include "../common/block_scale.cuh"
#include "../common/cluster.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

// Resident CTAs an SM the configuration is compiled for, and its register cap.
constexpr int slice_min_ctas(plan::SliceConfig c) { return c.staged_params ? 1 : c.held_params || c.hold_y ? 2 : 3; }
constexpr int slice_max_regs(plan::SliceConfig c, Quant q) {
  return c.halves ? kSliceHalvesRegs : q == Quant::kRow && c.hold_y && !c.held_params && c.row_cap ? kSliceRowRegs : 128;
}

template <NormKind K, Quant Q, class T, class P, int VEC, plan::SliceVariant V, bool WHOLE>
__global__ void __launch_bounds__(kSliceThreads, slice_min_ctas(plan::slice_config(V)))
    __maxnreg__(slice_max_regs(plan::slice_config(V), Q))
        fwd_slices(FwdArgs a, int64_t used, int cluster, float inv_h) {
#ifdef JRN_NO_CLUSTERS
  __trap();  // sm_90+ only (bulk copies, clusters): the plans send nothing older here
#else
  constexpr plan::FwdKey kKey = fwd_key<K, Q, T, P, VEC>();
  static_assert(plan::slice_instance_exists(kKey, V, WHOLE),
                "fwd_slices: a configuration the plan never picks for this output");
  constexpr plan::SliceConfig C = plan::slice_config(V);
  constexpr bool ONE_CTA = C.held_params, REFILL_AT_END = C.refill_at_end, STAGED_PARAMS = C.staged_params;
  constexpr bool HOLD_Y = C.hold_y;
  using Vec = Pack<T, VEC>;
  static_assert(sizeof(Vec) == 16, "fwd_slices moves 16-byte packs");
  // LayerNorm's per row with its parameters held (ONE_CTA) keeps the pending
  // row's y as floats in shared memory after the two stages, not in the 32
  // registers the held parameters take: each thread writes and reads only
  // its own packs, so no barrier orders them (kHeldParamsYSmem).
  constexpr bool kYSmem = ONE_CTA && Q == Quant::kRow && K == NormKind::kLayer;
  // LayerNorm's per row (y held): the row's max is reduced with the next
  // row's sums (one block reduction a row instead of two; across a cluster
  // also one push a row, kClusterMerge), and the row is quantized after it
  // (see pending; docs/tuning.md, slice-merge-max).
  constexpr bool kMergeMax = HOLD_Y && K == NormKind::kLayer;
  constexpr bool kClusterMerge = kMergeMax && REFILL_AT_END;
  constexpr bool kOwnCopies = REFILL_AT_END && plan::slice_own_copies(kKey);
  Pack<P, VEC> held_gamma[ONE_CTA ? kSliceItems : 1], held_beta[ONE_CTA ? kSliceItems : 1];
  int64_t held_off = -1;  // parameter offset of the held (or STAGED_PARAMS' staged) packs
  // RMSNorm's per-row FP8 scale: max |y| = rstd * max |x * scale| (rstd > 0
  // is common to the row), taken in the pass of the sums and reduced with
  // them: one reduction a row instead of two.
  constexpr bool kRowMaxFirst = Q == Quant::kRow && K == NormKind::kRms;
  constexpr int kRed = kRowMaxFirst ? 3 : 2;  // the row's two sums (add_row_sums)[, the max]
  // RMSNorm's per row holding x * gamma across a cluster reads its stage in
  // the sums pass alone: right after the row's block reduction (not at the
  // row's end) the stage takes the row after next.
  constexpr bool kRefillOwn = REFILL_AT_END && HOLD_Y && K == NormKind::kRms;
  using RedOp = std::conditional_t<kRowMaxFirst, SqMaxOp, SumOp>;
  // Values a CTA pushes a row, in one store of 8 or 16 bytes: LayerNorm's
  // {slice mean, slice squared deviations, kClusterMerge's pending row's
  // max, the slice mean's rounding residue}; RMSNorm's sums (zero-padded).
  constexpr int kXchg = K == NormKind::kLayer || kRed > 2 ? 4 : 2;
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
  // arithmetic rather than scale pack(i), which changed the code of many
  // instances for no gain.
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
  // variance cost a multiplication each, not an IEEE division
  // (docs/tuning.md, slice-inv-h).
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
  // 40 (docs/tuning.md, slice-word-reads).
  constexpr bool kWordReads = STAGED_PARAMS || HOLD_Y;
  auto read = [&](int st, int i, float (&v)[VEC]) {
    unpack<kWordReads>(reinterpret_cast<const Vec*>(stages + st * packs)[pack(i)], v);
  };
  [[maybe_unused]] void* const scales = per_group(Q) ? group_scales(a) : nullptr;  // the group scales of q
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

  // REFILL_AT_END: the prologue fills both stages, and
  // a row's stage takes the row after next at the row's end.
  // (The first row's copy asks L2 for nothing: the second's follows at once.)
  prefetch(slot, 0, !REFILL_AT_END);
  if constexpr (REFILL_AT_END) prefetch(slot + used, 1);
  // kMergeMax: `ys` holds the pending row's y, `pending` names it (-1:
  // none), and `pending_max` is this thread's max |y| of it (after the next
  // row's block reduction, the CTA's). Across a cluster its max travels
  // with the next row's slice sums (kClusterMerge): one push a row.
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
    // NVFP4's global scale, read before the row's copy is waited for: its
    // load is not left to hold up the output pass.
    [[maybe_unused]] const GroupGlobal global = Q == Quant::kBlock ? group_global(a, row) : GroupGlobal{};
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
    // The row's two sums (add_row_sums: RMSNorm's pair of sums of squares,
    // LayerNorm's {sum(d), sum(d^2)}, d = x - shift), and RMSNorm's per-row
    // FP8 max |x * scale| after them. RMSNorm's scaled twin is summed with
    // the squares, except in the block-rule instances, which derive it
    // (scaled_sq_of, the stage read again where the squares overflowed):
    // ptxas spills less there, more elsewhere (docs/tuning.md, block-rule-instances).
    constexpr bool kScaledLater = K == NormKind::kRms && Q == Quant::kBlock;
    float acc[kRed] = {};
#pragma unroll
    for (int i = 0; i < kSliceItems; ++i) {
      if (in[i]) {
        float v[VEC];
        read(st, i, v);
        if constexpr (K == NormKind::kRms && !kScaledLater) add_scaled_sq(acc[1], v);
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
          add_row_sums<K>(acc, v, shift);
        }
      } else if constexpr (HOLD_Y && per_group(Q)) {  // zeros past the row's end, for the group maxima
#pragma unroll
        for (int j = 0; j < VEC; ++j) ys[i][j] = 0.f;
      }
    }
    if constexpr (kScaledLater) {
      acc[1] = scaled_sq_of(acc[0], [&] {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < kSliceItems; ++i) {
          if (in[i]) {
            float v[VEC];
            read(st, i, v);
            add_scaled_sq(sum, v);
          }
        }
        return sum;
      });
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
    RowMean mean;
    float sq = 0.f;  // LayerNorm: sum((x - mean)^2) over the row
    if constexpr (K == NormKind::kLayer) {
      // Each CTA takes its slice's mean (around the slice's own shift, read
      // from its stage) and squared deviations, and the slices are merged
      // weighted by their sizes (Chan et al.'s pairwise update, all at once)
      // around rank 0's slice mean: each slice's offset from it, its mean's
      // rounding residue added back, stays exact on rows far from zero
      // (RowMean).
      float part[kXchg] = {};
      float m1 = 0.f;
      if (slice_elems > 0) {
        m1 = acc[0] * inv_slice;
        const float2 mean_m2 = shifted_mean_m2_of(acc, shift, m1);
        part[0] = mean_m2.x;
        part[1] = mean_m2.y;
        part[3] = (shift - part[0]) + m1;
      }
      if constexpr (kClusterMerge) part[2] = pending_max;
      if (cluster > 1) {
        exchange.push(part, st);
        exchange.take(part, st);  // lane q: rank q's slice (n = 0 past the cluster)
        const float n = static_cast<float>(slice_of(threadIdx.x % 32));
        const float base = __shfl_sync(0xffffffffu, part[0], 0);
        const float off = (part[0] - base) + part[3];
        if constexpr (kClusterMerge) {  // the slices' weighted offsets and the pending row's max, one butterfly
          float w[2] = {n * off, part[2]};
          warp_sum<2>(w, 32, SumAbsMaxOp{});
          mean = {base, w[0] * inv_h};
          pending_max = w[1];
        } else {
          float w[1] = {n * off};
          warp_sum<1>(w, 32);
          mean = {base, w[0] * inv_h};
        }
        const float d = off - mean.rest;
        float m2[1] = {part[1] + n * d * d};
        warp_sum<1>(m2, 32);
        sq = m2[0];
      } else {
        mean = {shift, m1};
        sq = part[1];
      }
      if constexpr (kClusterMerge) {
        if (pending >= 0) store_pending(pending_max);  // the previous row's
      }
    } else {
      float part[kXchg] = {};
#pragma unroll
      for (int m = 0; m < kRed; ++m) part[m] = acc[m];
      exchange.sum(part, st, RedOp{});
#pragma unroll
      for (int m = 0; m < kRed; ++m) acc[m] = part[m];
    }
    if constexpr (!REFILL_AT_END) {
      // The only CTAs of one warp:
      if constexpr (ONE_CTA || HOLD_Y || plan::slice_quant_warp(kKey)) ring.order_refill_after_reduction();
      prefetch(row + used, st ^ 1);
    }
    const float rstd = K == NormKind::kLayer ? rsqrtf(sq * inv_h + a.eps)
                                             : rms_rstd(acc[0], acc[1], a.eps, [&](float t) { return t * inv_h; });
    const float centred = centred_mean<T>(mean);  // after centre_base
    const int64_t out = row * H + first;
    // The row's outputs, by pass: `plain` (a std::bool_constant) says gamma
    // (and LayerNorm's beta) is given and the scale is not zero-centred.
    // That common case runs in loops of its own, with nothing left to decide
    // a pack (scale_shift's placeholder ones and predicated-off adds, eight
    // each), beta's add in the fma, and for 16-bit y (v - mean) * rstd as one
    // fma too (its rounding of mean * rstd is far below y's). The held-
    // parameter instances take it too (docs/tuning.md, slice-plain-loops).
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
        if constexpr (K == NormKind::kLayer) centre_base<T>(v, mean);
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
            scale_shift_plain<(sizeof(T) < 4)>(v, centred, r, g, b);
          } else {
            scale_plain(v, r, g);
          }
        } else if constexpr (ONE_CTA) {
          const Pack<P, VEC> g = held_gamma[i], b = held_beta[i];  // by value: no address taken of the arrays
          scale_shift_packs<VEC>(v, centred, r, g, gamma != nullptr, b, beta != nullptr, a.zero_centered);
        } else {
          scale_shift<VEC>(v, centred, r, gamma, beta, first + local(i), a.zero_centered);
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
          if constexpr (!kRowMaxFirst) {  // LayerNorm: y for the row's max, held to quantize (HOLD_Y)
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
        } else if constexpr (per_group(Q)) {
          // A group is lane_mask + 1 consecutive threads (a power of two of at
          // most 32, and a CTA's slice a whole number of groups): its max by shuffles.
          // kGroup's RMSNorm: y = rstd * (x * gamma) with rstd > 0 common to
          // the row, so the group's max is rstd * max |x * gamma| and q = (x *
          // gamma) * (rstd / scale): rstd a pack, not an element. (rstd / scale
          // stays finite: scale >= kMinQuantScale, rstd = rsqrt of at least the
          // least denormal, or infinite, where y is NaN either way.) The
          // scale's reciprocal comes from quant_rcp, not a division (every
          // lane of a group takes it, each pack; docs/tuning.md, quant-rcp).
          // kBlock's rules (block_scale.cuh) code y itself, rstd applied first
          // (the codes are those of y's float32 values).
          // Each block rule's items run in a loop of its own, the rule (and
          // MXFP8's and NVFP4's group size) a compile-time constant there: no
          // switch on the rule and no chain of shuffles by the group's lanes
          // an item (docs/tuning.md, block-rule-loops). kRule < 0: kGroup's.
          // The row's codes and scales are addressed from its first element's
          // (codes_at, scale_at), each pack adding its column's offset in
          // 32-bit arithmetic.
          constexpr bool kLateRstd = K == NormKind::kRms && Q == Quant::kGroup;
          auto items = [&](auto rule) {
            constexpr int kRule = decltype(rule)::value;
            const Pow2Groups groups(rule_group_size<kRule>(a), VEC);
            [[maybe_unused]] uint8_t* const codes = held(codes_at<kRule>(a, a.y, out));
            void* const srow = held(Q == Quant::kGroup ? static_cast<void*>(a.qscale + (out >> groups.shift))
                                                       : scale_at<kRule>(a, scales, out >> groups.shift));
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
                const int col = local(i), group = col >> groups.shift;
                if constexpr (Q == Quant::kGroup) {
                  const float scale = quant_scale(gm, a.fp8, a.scale_ub);
                  store_q<VEC>(qrow + col, a.fp8, v, kLateRstd ? rstd * quant_rcp(scale) : quant_rcp(scale));
                  if (groups.leader()) static_cast<float*>(srow)[group] = scale;
                } else {
                  const GroupCode code = group_scale<kRule>(a, srow, group, gm, global, groups.leader());
                  store_codes_at<VEC, kRule>(a, codes + code_offset<kRule>(a, col), v, global, code);
                }
              }
            }
          };
          if constexpr (Q == Quant::kBlock) {
            with_block_rule<static_cast<int>(GroupScale::kPow2)>(a.group_scale, items);  // (kFloat: Quant::kGroup)
          } else {
            items(std::integral_constant<int, -1>{});
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
      if constexpr (K == NormKind::kLayer) a.mean[row] = mean.value();
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
#endif
}

}  // namespace
}  // namespace jrn::cuda
