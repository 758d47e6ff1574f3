// fwd_regs: each thread holds its packs of the row in registers (up to
// kRegItems packs of 16 bytes), read once: several rows a CTA (rows of up to
// a warp), one CTA a row, or one thread block cluster a row (each CTA holds a
// slice; the row sums are combined through distributed shared memory). Takes
// every output and the fused variants: with XQ, x is FP8 with a scale per
// group of columns, dequantized as loaded; with a residual, the row is h = x
// + residual (stored, then normalized as stored); with FP8 output, y times
// the given per-tensor scale (max |y| merged into amax) or divided by the
// row's or the group's scale (groups of up to 32 lanes by shuffles); with
// given statistics (the hidden dim split across devices), mean and rstd
// come from the inputs and only y is written.
//
// Configurations (plan::RegsVariant): kBase; kEarly, parameters loaded with
// x, for launches of few CTAs; kP32, CTAs of kP32Threads with kP32MinCtas
// resident (LayerNorm's plain forward of 16-bit x with float32 parameters,
// RMSNorm's per-row FP8 of 16-bit x).
#pragma once

#include <type_traits>

#include "../common/block_scale.cuh"
#include "../common/cluster.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ, plan::RegsVariant V>
__global__ void __launch_bounds__(V == plan::RegsVariant::kP32     ? kP32Threads
                                  : V == plan::RegsVariant::kEarly ? kEarlyThreads
                                  : Q == Quant::kNone              ? kMaxRowThreads
                                                                   : kQuantRowThreads,
                                  V == plan::RegsVariant::kP32 ? kP32MinCtas
                                  : Q == Quant::kNone          ? 1
                                                               : kQuantMinBlocks)
    fwd_regs(FwdArgs a, int cluster_arg) {
  constexpr bool EARLY = V == plan::RegsVariant::kEarly, P32 = V == plan::RegsVariant::kP32;
  // EARLY launches are never clustered: a constant 1 spares their prologue two
  // integer divisions by the runtime cluster size.
  const int cluster = EARLY ? 1 : cluster_arg;
  __shared__ float smem[kRowSumSmem];
  __shared__ float xchg[2][1];
  __shared__ float xpair[2][2];  // LayerNorm's one-pass sums across a cluster
  __shared__ float xsq[2][K == NormKind::kLayer && sizeof(T) < 4 ? 1 : 2];  // the two passes' (kSq)
  const int64_t H = a.shape.hidden;
  // With clusters, CTA `rank` of the cluster holds vectors [rank * slice, (rank + 1) * slice).
  // Columns are ints (hidden < 2^31, checked by the handlers): 64-bit column
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
  // before it (they could alias). In larger launches the registers this
  // takes cost occupancy (docs/tuning.md, fwd-regs-early).
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
    float acc[3] = {0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) {
        add_scaled_sq(acc[1], v[i]);  // here, as v becomes x * scale
        add_sq_scaled_max<VEC>(acc, v[i], gamma, column(i), a.zero_centered, v[i]);
      }
    }
    row_sum<3>(acc, smem, SqMaxOp{});
    const float rstd = rms_rstd(acc[0], acc[1], a.eps, H);
    const float scale = quant_scale(rstd * acc[2], a.fp8, a.scale_ub);
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
  // LayerNorm's statistics, two ways (docs/tuning.md, one-pass-min-threads).
  // - One pass: sum(d) and sum(d^2) with d = v - layer_shift (the median of
  //   the row's first, middle and last elements), one reduction, then the held
  //   packs centred on the mean.
  // - Two exact passes over the held row (sum, then the centred squares), two
  //   reductions: with a residual (the shift's loads would read x and the
  //   residual again), in rows of fewer than kOnePassMinThreads threads
  //   (kP32RowThreads in the P32 instance), and with float32 parameters on
  //   16-bit x outside the P32 instance (the one-pass instance spills there).
  constexpr bool kLayerOnePass = K == NormKind::kLayer && (std::is_same_v<T, P> || P32);
  const bool two_passes =
      !kLayerOnePass || (!EARLY && a.residual) || blockDim.x < (P32 ? kP32RowThreads : kOnePassMinThreads);
  // What the passes leave: the held packs centred (LayerNorm), the row's
  // mean, and sq[0], its sum of squares (RMSNorm: and its scaled twin,
  // scaled_sq_of; LayerNorm's two passes of float32 x: and the residue).
  constexpr int kSq = K == NormKind::kLayer && sizeof(T) < 4 ? 1 : 2;
  RowMean mean;
  float sq[kSq] = {};
  if (two_passes) {
    if constexpr (K == NormKind::kLayer) {
      // The mean of the row's sum, then in one reduction its squares and
      // (float32 x) the residue of the row centred on it: centred again on
      // the residue, the row loses nothing to the first sum's rounding
      // (RowMean).
      float sum[1] = {held_sum(v, 0.f)};
      row_sum<1>(sum, smem);
      if (cluster > 1) cluster_sum<1>(sum, xchg, 0);
      mean.base = a.given_stats && valid ? a.mean[row] : sum[0] / static_cast<float>(H);
      center_held(v, in, mean.base);
      if constexpr (kSq == 2) sq[kSq - 1] = held_sum(v, 0.f);
      sq[0] = center_held(v, in, 0.f);
    } else {
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) sq[0] += v[i][j] * v[i][j];  // zeros past the row
      }
      sq[kSq - 1] = scaled_sq_of(sq[0], [&] {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kRegItems; ++i) add_scaled_sq(s, v[i]);
        return s;
      });
    }
    row_sum<kSq>(sq, smem);
    if (cluster > 1) {
      cluster_sum<kSq>(sq, xsq, 1);
      if (Q != Quant::kRow) cluster_done();
    }
    if constexpr (K == NormKind::kLayer && kSq == 2) {
      if (!a.given_stats) {
        mean.rest = sq[kSq - 1] / static_cast<float>(H);
        center_held(v, in, mean.rest);
        sq[0] = fmaxf(sq[0] - sq[kSq - 1] * mean.rest, 0.f);
      }
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
      if (in[i]) add_row_sums<K>(acc, v[i], shift);
    }
    row_sum<2>(acc, smem);
    if (cluster > 1) {
      cluster_sum<2>(acc, xpair, 0);
      if (Q != Quant::kRow) cluster_done();
    }
    const float m1 = acc[0] / static_cast<float>(H);
    sq[0] = shifted_mean_m2_of(acc, shift, m1).y;
    mean = a.given_stats && valid ? RowMean{a.mean[row], 0.f} : RowMean{shift, m1};
    center_held_on<T>(v, in, mean);
  }
  const float rstd = a.given_stats ? (valid ? a.rstd[row] : 0.f)
                     : K == NormKind::kLayer ? rsqrtf(sq[0] / static_cast<float>(H) + a.eps)
                                             : rms_rstd(sq[0], sq[kSq - 1], a.eps, H);
  if (Q == Quant::kNone && !valid) return;

  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;  // RMSNorm has none
  float m = 0.f;  // max |y| of this thread's columns
  if (Q == Quant::kTensor && a.scale_inverted && valid && !a.no_output) tensor_scale = 1.f / tensor_scale;
  // `plain`: gamma (and LayerNorm's beta) given and not zero-centred, with
  // nothing left to decide a pack: v * rstd * g (+ b in the same fma). The
  // general case pays for the others in every pack (placeholder ones for a
  // missing gamma, predicated zero-centred adds, beta's add apart). The plain
  // norm of many rows gets a loop of its own for it; the FP8 outputs do not,
  // as their instances spilled with it (docs/tuning.md, fwd-regs-plain).
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
  } else if constexpr (per_group(Q)) {
    // A group is lane_mask + 1 consecutive threads (the launcher makes
    // blockDim.x a multiple of it, at most 32): its max by shuffles among
    // them. kGroup: float32 scales; kBlock: the rules of block_scale.cuh.
    const Pow2Groups groups(a.group_size, VEC);
    [[maybe_unused]] const GroupGlobal global = Q == Quant::kBlock && valid ? group_global(a, row) : GroupGlobal{};
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      float gm = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) gm = max_abs(gm, v[i][j]);
      gm = groups.max_over_lanes(gm);
      if (in[i]) {
        const int64_t idx = row * H + column(i);
        if constexpr (Q == Quant::kGroup) {
          const float scale = quant_scale(gm, a.fp8, a.scale_ub);
          store_q<VEC>(a, idx, v[i], 1.f / scale);
          if (groups.leader()) a.qscale[groups.index(idx)] = scale;
        } else {
          const GroupCode code = group_scale(a, group_scales(a), groups.index(idx), gm, global, groups.leader());
          store_group<VEC>(a, idx, v[i], global, code);
        }
      }
    }
  }
  if (valid && threadIdx.x == 0 && rank == 0 && !a.given_stats) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean.value();
  }
}


}  // namespace
}  // namespace jrn::cuda
