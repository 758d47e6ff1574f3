// The backward's launch plan (plan.h).
#include <algorithm>
#include <numeric>

#include "plan.h"

namespace jrn::plan {
namespace {

using namespace ::jrn::bwd;

// dgamma/dbeta after the dx kernel, from columns of `vec` elements.
void plan_param_sums(BwdPlan& plan, const BwdProblem& p, int vec) {
  if (p.param_outputs == 0) {
    plan.sums = ParamSums::kNone;
  } else if (p.slots == 0) {
    plan.sums = ParamSums::kColumns;
    plan.sums_vec = vec;
    plan.column_tiles = ceil_div(p.hidden / vec, kColLanes);
  } else {
    plan.sums = ParamSums::kReduce;
    plan.sums_vec = p.hidden % 4 == 0 && p.sums_aligned ? 4 : 1;
  }
}

// bwd_decode's launch: packs a thread, the CTA's threads, the column tiles'
// rows of threads (splits) and count, and CTAs a row (a cluster).
void plan_decode(BwdPlan& plan, const BwdProblem& p, int64_t nvec, const Device& d) {
  plan.kernel = BwdKernel::kDecode;
  plan.rule = "bwd-decode";
  // Centred rows (centres_rows) of more than one row each write their
  // dgamma/dbeta sums to their own workspace slot, which bwd_reduce adds:
  // the column CTAs would miss each row's centring.
  const bool to_slots = centres_rows(p.kind, p.x) && p.rows > 1 && p.param_outputs > 0;
  plan.direct = (p.rows == 1 || to_slots) && p.param_outputs > 0;
  const bool tiles_wanted = !plan.direct && p.param_outputs > 0;
  auto make = [&](int items, int splits, int parts = 1) {
    plan.items = items;
    plan.threads = std::max(32, pow2_ceil(ceil_div(nvec, static_cast<int64_t>(items) * parts)));
    plan.splits = plan.threads < 256 ? plan.threads / 8 : splits;
    const int64_t tiles = tiles_wanted ? ceil_div(nvec, static_cast<int64_t>(plan.threads / plan.splits)) : 0;
    plan.tiles = ceil_div(tiles, parts) * parts;  // the tiles' CTAs fill whole clusters after the rows'
    plan.cluster = parts;
    plan.ctas = p.rows * parts + plan.tiles;
  };
  const int64_t sms = d.sms;
  if (nvec >= kDecodePartsPacks && p.rows <= kDecodePartsMaxRows && d.clusters()) {
    make(1, 32, kDecodeParts);
    plan.rule = "bwd-decode-parts";
  } else if (nvec <= kDecodeOneItemPacks) {
    make(1, 32);
  } else if (nvec <= kDecodeMaxThreads) {
    make(2, 32);
  } else {
    make(2, 16);
    if (p.rows + plan.tiles > sms) {
      make(4, 32);
      if (p.rows + plan.tiles > kDecodeHalfCtasPerSm * sms) make(4, 16);
    }
    plan.rule = "decode-launch";
  }
  plan.sums = ParamSums::kNone;  // the launch sums dgamma/dbeta itself
  if (to_slots) plan_param_sums(plan, p, plan.key.vec);  // slots: bwd_reduce
}

// bwd_slices' cluster for rows of `nvec` packs (see bwd-cluster-split).
int slices_cluster(const BwdKey& k, int64_t nvec) {
  const int cluster = pow2_ceil(ceil_div(nvec, kSliceVecs));
  if (k.kind == NormKind::kLayer && k.narrow() && cluster == 4) return 8;
  const int64_t share = ceil_div(nvec, cluster);  // packs of a CTA at the natural size
  bool split = false;
  if (k.narrow() && 2 * share > kSliceVecs) {
    split = k.kind == NormKind::kLayer
                ? (cluster == 1 ? share < kSliceVecs : cluster == 2 && 8 * share <= 7 * kSliceVecs)
                : cluster == 1 && 16 * share <= 11 * kSliceVecs;
  }
  return split ? 2 * cluster : cluster;
}

void plan_slices(BwdPlan& plan, const BwdProblem& p, int64_t nvec, const Device& d) {
  const BwdKey& k = plan.key;
  plan.kernel = BwdKernel::kSlices;
  plan.rule = "bwd-cluster-split";
  plan.items = kSliceItems;
  plan.cluster = slices_cluster(k, nvec);
  const int tpr = std::max(32, row_threads(ceil_div(nvec, plan.cluster), kSliceItems));  // whole warps
  plan.threads = tpr;
  // Two stages of x and dy, and gamma's packs.
  plan.smem = static_cast<int64_t>(tpr) * kSliceItems * (2 * 2 * 16 + (p.gamma ? k.vec * size_of(k.param) : 0));
  plan.early = tpr > kSliceThreads / 2 ||
               (k.kind == NormKind::kLayer &&
                (plan.cluster > 1 || (tpr > kSliceThreads / 4 && tpr < kSliceThreads / 2))) ||
               (k.kind == NormKind::kRms && k.narrow() && tpr == 192);
  if (plan.early) plan.rule = "bwd-slices-early";
  plan.whole = plan.early && fills_threads(nvec, k.vec, p.hidden, plan.cluster, tpr, kSliceItems);
  // The late instance on fast memory loads a row's statistics a row ahead,
  // but not RMSNorm's CTAs of at most 1024 columns (bwd-slices-stats).
  plan.stats_ahead = !plan.early && d.dram_gbps >= kStatsAheadGbps &&
                     (k.kind == NormKind::kLayer || static_cast<int64_t>(tpr) * kSliceItems * k.vec > kStatsAheadRmsCols);
  // One CTA of more than half of kSliceThreads a row (one an SM): clusters
  // of kFold CTAs fold their column sums into one workspace row.
  plan.fold = plan.cluster == 1 && tpr > kSliceThreads / 2 && p.slots > 0 && p.param_outputs > 0 && p.slots >= kFold
                  ? kFold
                  : 1;
  plan.ctas = 0;  // persistent: as many clusters as are resident, at most slots / fold
}

// How bwd_unaligned takes a row of `hidden` elements (hidden / vec whole
// packs between its head and tail); kernel kNone where nothing fits.
void plan_unaligned(BwdPlan& plan, const BwdProblem& p, const Device& d) {
  const BwdKey& k = plan.key;
  const int kvec = 16 / size_of(k.x);
  const int64_t nvec = p.hidden / kvec, one_cta = static_cast<int64_t>(kRegThreads) * kRegItems;
  // Shared memory a CTA may opt in to, less a margin for the kernel's own arrays.
  const int64_t smem_most = d.smem_optin - 1024;
  auto fit = [&](int items, int cluster) {
    plan.items = items;
    plan.cluster = cluster;
    plan.threads = std::max(2 * kvec, row_threads(ceil_div(nvec, cluster), items));  // head, tail: 2 * kvec
    plan.rows_per_cta = rows_per_cta(plan.threads, kBlockThreads);
    plan.smem = static_cast<int64_t>(plan.threads) * plan.rows_per_cta * items * kvec * 4 *
                (k.kind == NormKind::kLayer ? 3 : 2);
    return plan.smem <= smem_most;
  };
  plan.kernel = BwdKernel::kUnaligned;
  plan.rule = "unaligned-plan";
  const int64_t four_most = k.kind == NormKind::kLayer ? kUnalignedLayerFourMostPacks : one_cta;
  if (k.narrow() && nvec >= kUnalignedFourFromPacks && nvec <= four_most && fit(kUnalignedWidestItems, 1)) {
    plan.rule = "unaligned-four-from-packs";
    return;
  }
  if (k.kind == NormKind::kLayer && k.narrow() && nvec > kUnalignedLayerThreeAbovePacks &&
      nvec <= static_cast<int64_t>(kBlockThreads) * kUnalignedWideItems && fit(kUnalignedWideItems, 1)) {
    plan.rule = "unaligned-layer-three-above-packs";
    return;
  }
  if (nvec <= one_cta) {
    if (!fit(kRegItems, 1)) plan.kernel = BwdKernel::kNone;
    return;
  }
  const int64_t widest = k.kind == NormKind::kLayer ? kUnalignedLayerWidestPacks
                                                     : static_cast<int64_t>(kRegThreads) * kUnalignedWidestItems;
  for (const int items : {kUnalignedWideItems, kUnalignedWidestItems}) {
    if (nvec <= std::min(widest, static_cast<int64_t>(kRegThreads) * items)) {
      if (fit(items, 1)) {
        plan.rule = "unaligned-wide-items";
        return;
      }
      break;
    }
  }
  if (!d.clusters() || nvec > one_cta * kUnalignedMaxCluster || !fit(kRegItems, pow2_ceil(ceil_div(nvec, one_cta)))) {
    plan.kernel = BwdKernel::kNone;
    return;
  }
  plan.rule = "unaligned-max-cluster";
}

// Rows of `vec`-element packs: bwd_decode, bwd_regs, bwd_slices or bwd_stream.
BwdPlan plan_packs(const BwdProblem& p, const Device& d, int vec) {
  BwdPlan plan;
  plan.key = {p.kind, p.x, p.param, vec};
  const int64_t nvec = p.hidden / vec, rpg = p.groups > 0 ? p.rows / p.groups : 0;
  const int64_t max_rows = nvec > kDecodeNarrowPacks ? kDecodeMaxRows : kDecodeNarrowMaxRows;
  const bool slots_free = p.slots == 0 || (centres_rows(p.kind, p.x) && p.slots >= p.rows);  // a slot a row
  if (bwd_decode_exists(plan.key) && slots_free && !p.coef && p.groups == 1 && p.rows <= max_rows &&
      nvec <= kDecodeMaxPacks) {
    plan_decode(plan, p, nvec, d);
    return plan;
  }
  // Without a workspace (no dgamma/dbeta, or few rows: bwd_columns sums
  // them) the slot count is free.
  plan.slots = p.slots > 0 ? p.slots : std::min<int64_t>(rpg, 4096);
  const bool slices = bwd_slices_exists(plan.key) && d.clusters() && nvec > kRegVecs && nvec <= kSliceVecs * kMaxCluster;
  if (!slices && nvec <= static_cast<int64_t>(kRegThreads) * kRegItems) {
    plan.kernel = BwdKernel::kRegs;
    plan.rule = "bwd-regs";
    plan.items = kRegItems;
    plan.threads = pow2_ceil(ceil_div(nvec, kRegItems));
    plan.rows_per_cta = static_cast<int>(std::min<int64_t>(rows_per_cta(plan.threads, kBlockThreads), plan.slots));
    plan.ctas = plan.rows_per_cta > 0 ? plan.slots / plan.rows_per_cta : 0;
  } else if (slices) {
    plan_slices(plan, p, nvec, d);
  } else {
    plan.kernel = BwdKernel::kStream;
    plan.rule = "bwd-stream";
    plan.threads = kStreamThreads;
    plan.ctas = plan.slots;
  }
  plan_param_sums(plan, p, vec);
  return plan;
}

}  // namespace

BwdPlan plan_bwd(const BwdProblem& p, const Device& d) {
  const int kvec = 16 / size_of(p.x);
  if (p.rows == 0 && p.param_outputs == 0) {
    BwdPlan none;
    none.key = {p.kind, p.x, p.param, kvec};
    return none;
  }
  if (p.hidden % kvec == 0) {
    if (p.rows_aligned && p.gamma_aligned) return plan_packs(p, d, kvec);
  } else if (p.rows_aligned) {
    // Widths that are no multiple of a pack with x, dy, dx (and dh) aligned:
    // bwd_unaligned where its configuration fits, else single elements.
    BwdPlan plan;
    plan.key = {p.kind, p.x, p.param, kvec};
    plan_unaligned(plan, p, d);
    if (plan.kernel == BwdKernel::kUnaligned) {
      // Persistent slots, a multiple of `period` rows apart: rows that far
      // apart start at the same offset from a 16-byte boundary.
      plan.period = kvec / std::gcd(p.hidden, static_cast<int64_t>(kvec));
      plan.slots = p.slots;
      plan.ctas = 0;
      plan_param_sums(plan, p, 1);  // its dgamma sums are single columns
      return plan;
    }
  }
  return plan_packs(p, d, 1);
}

BwdPlan plan_bwd_elements(const BwdProblem& p, const Device& d) { return plan_packs(p, d, 1); }

}  // namespace jrn::plan
