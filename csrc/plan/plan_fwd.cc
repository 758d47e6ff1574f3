// The forward's launch plan (plan.h). Rules are tried in order; each names
// the docs/tuning.md entry that explains it.
#include <algorithm>

#include "plan.h"

namespace jrn::plan {
namespace {

using namespace ::jrn::fwd;

// CTAs of `tpr`-thread rows, `rows_per_cta(tpr, cta_threads)` rows each.
void row_launch(FwdPlan& p, int64_t rows, int tpr, int cta_threads) {
  p.threads = tpr;
  p.rows_per_cta = rows_per_cta(tpr, cta_threads);
  p.ctas = ceil_div(rows, p.rows_per_cta);
}

bool has_param(const FwdProblem& p) { return p.gamma || (p.kind == NormKind::kLayer && p.beta); }

// fwd_regs' P32 instance: the rows' threads where it takes them, else 0
// (docs/tuning.md: p32-layer-params, p32-rms-row).
int p32_row_threads(const FwdProblem& p, const FwdKey& k, int64_t nvec, const Device& d) {
  if (p.residual || p.given_stats) return 0;
  const int tpr = row_threads(nvec, kRegItems);
  if (p32_layer_params(k)) return tpr == kP32Threads || tpr == kP32RowThreads ? tpr : 0;
  if (!p32_rms_row(k)) return 0;
  if (nvec == kSliceOneCtaMinVecs && d.clusters()) return 0;  // fwd_slices' one-warp CTAs take hidden 1024
  return tpr >= 16 && tpr <= kP32RowThreads ? tpr : 0;
}

// The plain norm's rows that fwd_slices takes although fwd_regs could hold
// them (plain-slices, plain-slices-layer).
bool plain_slices(const FwdProblem& p, const FwdKey& k, int64_t nvec, const Device& d) {
  if (p.rows <= 2 * static_cast<int64_t>(d.sms)) return false;
  if (p.kind == NormKind::kRms) {
    return nvec > kSliceVecs && 4 * nvec <= 3 * static_cast<int64_t>(kRegItems) * pow2_ceil(ceil_div(nvec, kRegItems));
  }
  if (nvec > kSliceVecs) return true;
  const int tpr = row_threads(nvec, kRegItems);
  return k.narrow() && (tpr > kBlockThreads || (slice_staged_p32(k) && tpr == kBlockThreads && p.plain_params()));
}

// Whether fwd_slices takes the rows (sm_90+, 16-byte packs, no residual or
// given statistics), and from how many packs a row (slices-fit).
bool slices_fit(const FwdProblem& p, const FwdKey& k, int64_t nvec, bool regs_ok, const Device& d) {
  if (k.fp8_x || !k.packs16()) return false;
  const int64_t regs_cta_vecs = static_cast<int64_t>(p.quant == Quant::kNone ? kMaxRowThreads : kQuantRowThreads) * kRegItems;
  const int64_t min_vecs =
      slice_one_cta(k) || slice_row_ln_warp(k) || slice_quant_warp(k) || (slice_one_cta_warp(k) && k.quant == Quant::kRow)
          ? kSliceOneCtaMinVecs
      : k.quant == Quant::kTensor || k.quant == Quant::kRow || (k.kind == NormKind::kRms && k.quant == Quant::kGroup)
          ? kSliceMinVecs
      : k.quant == Quant::kNone && plain_slices(p, k, nvec, d) ? 1
                                                              : regs_cta_vecs + 1;
  return regs_ok && !p.residual && !p.given_stats && nvec >= min_vecs && nvec <= kSliceVecs * kMaxCluster &&
         d.clusters();
}

// Whether CTAs of `threads` fit one more an SM at kSliceRowRegs registers
// than at the 64 that two CTAs of kSliceThreads leave (row-cap-fits).
bool row_cap_fits(int threads) {
  return kSmRegisters / (kSliceRowRegs * threads) > kSmRegisters / (kSmRegisters / (2 * kSliceThreads) * threads);
}

void plan_slices(FwdPlan& plan, const FwdProblem& p, int64_t nvec) {
  const FwdKey& k = plan.key;
  plan.kernel = FwdKernel::kSlices;
  plan.items = kSliceItems;
  plan.ctas = 0;  // persistent
  plan.rule = "slices-fit";
  int cluster = pow2_ceil(ceil_div(nvec, kSliceVecs));
  const bool staged = k.kind == NormKind::kLayer && k.quant == Quant::kNone && k.param_pack_bytes() == 16 &&
                      cluster >= kSliceStagedCluster && cluster < kMaxCluster && p.plain_params();
  if (staged) cluster *= 2;  // halves
  const bool staged_p32 = slice_staged_p32(k) && p.plain_params();
  if (staged_p32) cluster = std::min(kMaxCluster, 2 * cluster);
  bool row_split = false;
  if (k.quant == Quant::kRow && k.narrow() && k.param == k.x && cluster == 4 &&
      (k.kind == NormKind::kLayer ||
       (k.x == DType::kBF16 && ceil_div(nvec, cluster) <= static_cast<int64_t>(kSliceRowSplitThreads) * kSliceItems))) {
    cluster *= 2;
    row_split = true;
  }
  const int64_t share = ceil_div(nvec, cluster);  // a CTA's packs
  const int tpr = slice_own_copies(k) ? pow2_ceil(ceil_div(share, kSliceItems)) : row_threads(share, kSliceItems);
  const int64_t stage_bytes = static_cast<int64_t>(tpr) * kSliceItems * 16;
  int64_t smem = 2 * stage_bytes;
  const bool ysmem = slice_ysmem_row(k) && cluster == 1 && tpr <= kSliceYSmemThreads;
  if (ysmem) smem += 2 * stage_bytes;  // the pending row's y, as floats
  const bool staged_row = slice_staged_row(k) && cluster > 1 && tpr <= kSliceStagedRowThreads && p.plain_params();
  if (staged || staged_row) smem += 2 * stage_bytes;                   // gamma's and beta's packs
  if (staged_p32) smem += 2 * stage_bytes * (k.param_pack_bytes() / 16);  // as float32, two pieces a pack

  // Whether the row's packs fill the CTAs' threads exactly (a WHOLE instance).
  const bool whole = slice_whole_exists(k) && fills_threads(nvec, k.vec, p.hidden, cluster, tpr, kSliceItems);
  SliceVariant v = SliceVariant::kBase;
  if (cluster == 1) {
    if (slice_one_cta(k)) {
      v = SliceVariant::kHeldParams, plan.rule = "slice-one-cta";
    } else if (slice_one_cta_group(k)) {  // parameters held where the row fills the CTA
      if (whole) v = SliceVariant::kHeldParams;
      plan.rule = "slice-one-cta-group";
    } else if (slice_one_cta_warp(k) && tpr == 32) {
      v = SliceVariant::kHeldParams, plan.rule = "slice-one-cta-warp";
    } else if (slice_one_cta_plain(k) && tpr > kBlockThreads) {
      v = SliceVariant::kHeldParams, plan.rule = "slice-one-cta-plain";
    } else if (ysmem) {
      v = SliceVariant::kHeldParamsYSmem, plan.rule = "slice-y-smem-threads";
    } else if (ln_row_holds_y(k) || (k.kind == NormKind::kRms && slice_hold_y(k) && tpr >= kSliceRmsHoldThreads)) {
      v = SliceVariant::kHoldY, plan.rule = k.kind == NormKind::kLayer ? "slice-hold-y" : "slice-rms-hold-threads";
    }
  } else if (ln_row_holds_y(k) || (k.kind == NormKind::kRms && k.quant == Quant::kRow && k.narrow())) {
    v = SliceVariant::kClusterHoldY, plan.rule = "slice-hold-y";
  } else if (slice_refill_at_end(k)) {
    v = SliceVariant::kClusterRefill, plan.rule = "slice-refill-at-end";
  }
  // Per row with y held: capped registers where parameters are x's dtype,
  // or where the cap fits one more CTA an SM.
  if (k.quant == Quant::kRow && (v == SliceVariant::kHoldY || v == SliceVariant::kClusterHoldY) &&
      (k.param == k.x || row_cap_fits(tpr))) {
    v = v == SliceVariant::kHoldY ? SliceVariant::kHoldYCapped : SliceVariant::kClusterHoldYCapped;
    plan.rule = "slice-row-regs";
  }
  if (staged_p32) v = SliceVariant::kStagedParams, plan.rule = "slice-staged-p32";
  if (staged_row) v = SliceVariant::kStagedHalvesHoldY, plan.rule = "slice-staged-row";
  if (staged) v = SliceVariant::kStagedHalves, plan.rule = "slice-staged-halves";
  if (row_split && v != SliceVariant::kStagedHalvesHoldY) plan.rule = "slice-row-split-threads";
  plan.slice = v;
  plan.cluster = cluster;
  plan.threads = tpr;
  plan.smem = smem;
  plan.whole = whole;
}

// fwd_decode's configuration for rows at most two an SM (see fwd-decode).
void plan_decode(FwdPlan& plan, const FwdProblem& p, int64_t nvec, bool wide_decode, const Device& d) {
  plan.kernel = FwdKernel::kDecode;
  plan.early_launch = true;
  plan.decode.plain = p.plain_params();
  plan.items = kDecodeItems;
  plan.rule = "fwd-decode";
  auto threads_for = [&](int items) { return std::max(32, pow2_ceil(ceil_div(nvec, items))); };
  plan.threads = threads_for(kDecodeItems);
  if (wide_decode) {
    if (!plan.key.narrow() || p.kind == NormKind::kRms) {
      plan.items = 2 * kDecodeItems;
      plan.threads = kDecodeWideThreads;
      plan.rule = "fwd-decode-wide";
    }
  } else if (p.residual) {
    const bool same = !plan.key.narrow() || (!p.residual_f32 && !p.h_f32);
    plan.decode.resid = same ? DecodeResidual::kSame : DecodeResidual::kAny;
    plan.rule = "fwd-decode-residual";
    if (p.kind == NormKind::kRms && nvec <= kMaxRowThreads) {
      plan.rule = "fwd-decode-residual-one-item";
      plan.items = 1;
      plan.threads = threads_for(1);
    }
  } else if (p.kind == NormKind::kLayer || plan.threads >= kDecodeSplitMinThreads) {
    plan.parts = pow2_floor(std::clamp<int64_t>(d.sms / (2 * p.rows), 1, kDecodeMaxParts));
    if (plan.parts > 1) plan.decode.split = true, plan.rule = "fwd-decode-split";
  }
  plan.decode.items = plan.items;
  plan.rows_per_cta = 1;
  plan.ctas = p.rows;
}

// Rows of `vec`-element packs (16 bytes, or single elements where the row or
// a buffer does not allow packs).
FwdPlan plan_packs(const FwdProblem& p, const Device& d, int vec, bool fp8_x) {
  FwdPlan plan;
  plan.key = {p.kind, p.quant, p.x, p.param, vec, fp8_x};
  const FwdKey& k = plan.key;
  const int64_t nvec = p.hidden / vec;
  // Groups are taken by shuffles in fwd_regs / fwd_slices when they span a
  // power of two of at most 32 lanes; other group sizes stream, and so do
  // NVFP4's codes in single elements (they go two a byte).
  int lanes = 1;
  bool regs_ok = true;
  if (p.quant == Quant::kGroup) {
    lanes = static_cast<int>(p.group_size / vec);
    regs_ok = p.group_size % vec == 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0 &&
              !(p.group_scale == GroupScale::kNvfp4 && vec == 1);
  }
  const int64_t cta_vecs = static_cast<int64_t>(p.quant == Quant::kNone ? kMaxRowThreads : kQuantRowThreads) * kRegItems;
  plan.kernel = FwdKernel::kRegs;
  plan.items = kRegItems;
  if (const int tpr = p32_row_threads(p, k, nvec, d); tpr > 0) {
    plan.regs = RegsVariant::kP32;
    plan.rule = p32_layer_params(k) ? "p32-layer-params" : "p32-rms-row";
    row_launch(plan, p.rows, tpr, kP32Threads);
    return plan;
  }
  const bool slices = slices_fit(p, k, nvec, regs_ok, d);
  if (regs_ok && nvec <= cta_vecs && !slices) {
    plan.rule = "fwd-regs";
    const int tpr = std::max<int>(lanes, p.residual ? pow2_ceil(ceil_div(nvec, kRegItems)) : row_threads(nvec, kRegItems));
    row_launch(plan, p.rows, tpr, kBlockThreads);
    if (p.quant == Quant::kNone && !fp8_x && p.param == p.x) {
      const int64_t sms = d.sms;
      const bool wide_decode = nvec > kDecodeItems * kDecodeWideThreads && p.rows > sms;
      if (k.packs16() && !p.given_stats && p.groups == 1 && sms > 0 && p.rows <= 2 * sms && p.rows * p.hidden <= INT32_MAX &&
          nvec <= kDecodeItems * kMaxRowThreads && !(p.residual && wide_decode)) {
        plan_decode(plan, p, nvec, wide_decode, d);
        return plan;
      }
      if (!p.residual && has_param(p) && tpr * plan.rows_per_cta <= kEarlyThreads && sms > 0 && plan.ctas <= 2 * sms) {
        if (p.rows <= 2 * sms) row_launch(plan, p.rows, tpr, kDecodeThreads);
        plan.regs = RegsVariant::kEarly;
        plan.rule = "fwd-regs-early";
      }
    }
    return plan;
  }
  if (slices) {
    plan_slices(plan, p, nvec);
    return plan;
  }
  // Wide rows with a residual (rows enough) or with given statistics: two
  // passes, each at about a copy's speed. Not float32 LayerNorm's own
  // statistics: they would reach fwd_apply as a float32 mean, whose rounding
  // costs rows far from zero their accuracy (RowMean in norm_math.cuh).
  if (two_pass_exists(k) && nvec > cta_vecs && p.rows > 0 && !p.no_output) {
    const bool exact_mean = p.kind == NormKind::kLayer && p.x == DType::kF32;
    const bool two = p.given_stats ? p.quant != Quant::kRow && !p.residual
                                   : p.residual && !p.residual_f32 && !p.h_f32 && !exact_mean && d.sms > 0 &&
                                         p.rows >= 2 * static_cast<int64_t>(d.sms);
    if (two) {
      plan.kernel = FwdKernel::kTwoPass;
      plan.rule = "two-pass-fits";
      plan.chunks = ceil_div(nvec, static_cast<int64_t>(kApplyThreads) * kApplyItems);
      plan.threads = kApplyThreads;
      plan.items = kApplyItems;
      plan.ctas = p.rows * plan.chunks;
      return plan;
    }
  }
  // One cluster a row, of CTAs of at most kClusterCtaThreads threads.
  constexpr int64_t kClusterCtaVecs = static_cast<int64_t>(kClusterCtaThreads) * kRegItems;
  if (regs_ok && vec > 1 && nvec <= kClusterCtaVecs * kMaxCluster && d.clusters()) {
    plan.cluster = pow2_ceil(ceil_div(nvec, kClusterCtaVecs));
    plan.threads = std::max<int>(lanes, pow2_ceil(ceil_div(nvec, plan.cluster * kRegItems)));
    plan.rows_per_cta = 1;
    plan.ctas = p.rows * plan.cluster;
    plan.rule = "fwd-regs-clusters";
    return plan;
  }
  plan.kernel = FwdKernel::kStream;
  plan.rule = "fwd-stream";
  plan.items = 0;
  plan.threads = kStreamThreads;
  plan.rows_per_cta = 1;
  plan.ctas = p.rows;
  return plan;
}

// fwd_tiles' cut of a row: `cluster` CTAs of `width` columns (whole groups;
// the last CTA's may be fewer), at most kTileCols each, twice that where
// more than kMaxCluster CTAs would be needed; and the dynamic shared memory
// a CTA takes: the slab's rows in x's dtype, in blocks of kTileCols columns
// (the rows' fixed pitch), then gamma (and beta) as given, then the
// exchange of the rows' sums (two floats a row and CTA of the cluster).
// cluster 0: no cut fits.
struct TileCut {
  int cluster = 0, width = 0;
  int64_t smem = 0;
};
TileCut tile_cut(const FwdProblem& p) {
  TileCut t;
  int64_t most = kTileCols, cluster = ceil_div(p.hidden, most);
  if (cluster > kMaxCluster) most *= 2, cluster = ceil_div(p.hidden, most);
  if (cluster > kMaxCluster || p.group_size <= 0) return t;
  const int64_t width = ceil_div(ceil_div(p.hidden, cluster), p.group_size) * p.group_size;
  t.cluster = static_cast<int>(ceil_div(p.hidden, width));
  t.width = static_cast<int>(width);
  const bool layer = p.kind == NormKind::kLayer;
  const int64_t params = (layer ? 2 : 1) * width * size_of(p.param);
  const int64_t sums = int64_t{t.cluster} * kTileRows * 2 * sizeof(float);
  t.smem = ceil_div(width, kTileCols) * kTileCols * kTileRows * size_of(p.x) + params + sums;
  return t;
}

// fwd_tiles for the per-group output with its columnwise copy (fwd-tiles),
// in cut `t` (tiles_fit's).
void plan_tiles(FwdPlan& plan, const FwdProblem& p, const TileCut& t) {
  plan.kernel = FwdKernel::kTiles;
  plan.threads = kTileThreads;
  plan.cluster = t.cluster;
  plan.width = t.width;
  plan.scales_by_rows = tile_scales_by_rows(p.group_scale);
  plan.smem = t.smem;
  plan.ctas = p.rows / kTileRows * t.cluster;
  plan.rule = "fwd-tiles";
}

// The plan of the rows alone (the per-group output's columnwise copy, where
// wanted, is fwd_columns' after it).
FwdPlan plan_rows(const FwdProblem& p, const Device& d) {
  FwdPlan none;
  none.key = {p.kind, p.quant, p.x, p.param, 16 / size_of(p.x), p.fp8_x};
  if (p.rows == 0 || p.quant == Quant::kCurrent) return none;
  const int kvec = 16 / size_of(p.x);
  const bool vec_ok = p.hidden % kvec == 0 && p.x_aligned && p.y_aligned && p.params_aligned &&
                      (!p.residual || p.residual_aligned) && (p.quant != Quant::kGroup || p.group_size % kvec == 0) &&
                      (!p.fp8_x || p.x_group % kvec == 0);
  if (p.fp8_x) {  // (with a float output: the handlers refuse FP8 x with FP8 y)
    const int64_t packs = p.hidden / kFp8Vec;
    if (!p.residual && !p.given_stats && p.hidden % kFp8Vec == 0 && p.x_group % kFp8Vec == 0 &&
        packs <= static_cast<int64_t>(kMaxRowThreads) * kRegItems && p.x_aligned && p.y_aligned && p.params_aligned) {
      FwdPlan plan;
      plan.key = {p.kind, p.quant, p.x, p.param, kFp8Vec, true};
      plan.kernel = FwdKernel::kFp8Regs;
      plan.items = kRegItems;
      plan.rule = "fwd-fp8-regs";
      row_launch(plan, p.rows, pow2_ceil(ceil_div(packs, kRegItems)), kBlockThreads);
      return plan;
    }
    return plan_packs(p, d, vec_ok ? kvec : 1, true);
  }
  // Widths that are no multiple of a pack, buffers aligned, rows of at most
  // kMaxRowThreads * kRegItems packs: fwd_unaligned (not per group: a group
  // size dividing such a width is no multiple of a pack).
  if (!vec_ok && unaligned_exists(p.quant) && !p.given_stats && p.hidden % kvec != 0 && p.x_aligned &&
      p.y_aligned && (!p.residual || p.residual_aligned) &&
      ceil_div(p.hidden, kvec) <= static_cast<int64_t>(kMaxRowThreads) * kRegItems) {
    FwdPlan plan;
    plan.key = {p.kind, p.quant, p.x, p.param, kvec, false};
    plan.kernel = FwdKernel::kUnaligned;
    plan.items = kRegItems;
    plan.rule = "unaligned-fits";
    row_launch(plan, p.rows, std::max(kvec, row_threads(ceil_div(p.hidden, kvec), kRegItems)), kBlockThreads);
    return plan;
  }
  return plan_packs(p, d, vec_ok ? kvec : 1, false);
}

// fwd_tiles' cut where it takes the per-group output with its columnwise
// copy, else a cut of no cluster.
TileCut tiles_fit(const FwdProblem& p, const Device& d) {
  const bool residual_ok = !p.residual || (p.residual_aligned && !p.residual_f32 && !p.h_f32);  // h in x's dtype
  if (!(p.qt && p.quant == Quant::kGroup && p.rows > 0 && p.hidden > 0 && d.clusters() && size_of(p.x) == 2 &&
        !p.fp8_x && residual_ok && !p.given_stats && !p.no_output && p.x_aligned && p.y_aligned && p.params_aligned &&
        p.qt_aligned && (p.group_size == 16 || p.group_size == 32) && p.hidden % p.group_size == 0)) {
    return {};
  }
  const int64_t rows_per_tensor = p.tensors <= 1 ? p.rows : p.rows / p.tensors;
  const int64_t rows_per_group = p.rows / std::max<int64_t>(p.groups, 1);
  const TileCut t = tile_cut(p);
  const bool fits = rows_per_tensor % kTileRows == 0 && rows_per_group % kTileRows == 0 && t.cluster > 0 &&
                    t.smem <= d.smem_optin - 1024;  // a margin for the kernel's own arrays
  return fits ? t : TileCut{};
}

}  // namespace

FwdPlan plan_fwd(const FwdProblem& p, const Device& d) {
  FwdPlan plan;
  if (const TileCut t = tiles_fit(p, d); t.cluster > 0) {
    plan.key = {p.kind, p.quant, p.x, p.param, 16 / size_of(p.x), false};
    plan_tiles(plan, p, t);
    return plan;
  }
  plan = plan_rows(p, d);
  plan.columns = p.qt && p.quant == Quant::kGroup && p.rows > 0;
  return plan;
}

int transposed_store_words(int64_t rows) { return rows % 16 == 0 ? 4 : rows % 8 == 0 ? 2 : rows % 4 == 0 ? 1 : 0; }

bool quantize_tiles_fit(const FwdProblem& p) {
  const int64_t rows_per_tensor = p.tensors <= 1 ? p.rows : p.rows / p.tensors;
  const bool qt_fits = !p.qt || (transposed_store_words(rows_per_tensor) > 0 && p.qt_aligned);
  return !p.residual && !p.fp8_x && !p.given_stats && p.hidden % 16 == 0 && p.x_aligned && p.y_aligned &&
         p.params_aligned && qt_fits;
}

FwdProblem current_measure_problem(const FwdProblem& p) {
  FwdProblem m = p;
  m.quant = Quant::kTensor;
  m.no_output = true;
  return m;
}

FwdProblem current_quantize_problem(const FwdProblem& p) {
  FwdProblem q = p;
  q.quant = Quant::kTensor;
  return q;
}

CurrentPlan plan_current(const FwdProblem& p, const Device& d) {
  CurrentPlan c;
  const int kvec = 16 / size_of(p.x);
  const bool by_rows = !p.residual && !p.given_stats && !p.fp8_x;
  // LayerNorm's per-tensor kernel measures faster where the width is a
  // multiple of a pack (x_amax reads each row twice).
  if (by_rows && (p.kind == NormKind::kRms || p.hidden % kvec != 0)) {
    c.measure = CurrentMeasure::kAmaxRows;
  } else {
    c.measure = CurrentMeasure::kTensorPass;
    c.measure_pass = plan_fwd(current_measure_problem(p), d);
  }
  if ((p.kind == NormKind::kRms || p.qt) && quantize_tiles_fit(p)) {
    c.quantize = CurrentQuantize::kTiles;
    return c;
  }
  if (by_rows && p.x_aligned && p.y_aligned) {
    c.quantize = CurrentQuantize::kRows;
  } else {
    c.quantize = CurrentQuantize::kTensorPass;
    c.quantize_pass = plan_fwd(current_quantize_problem(p), d);
  }
  c.transpose = p.qt;
  return c;
}

}  // namespace jrn::plan
