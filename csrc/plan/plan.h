// Which CUDA kernel takes a normalization, and in which configuration: the
// launch plans of the forward and the backward.
//
// Plain C++ with no CUDA call: the device comes in as a Device, so a plan can
// be printed and tested on any machine (jax_rmsnorm._ffi.describe_plan, and
// tests/test_plan.py's golden file). The CUDA launchers (csrc/cuda/fwd/
// launch.cuh, csrc/cuda/bwd/launch.cuh) build a problem from the FFI
// buffers, ask for its plan and execute it; they decide nothing themselves.
// Each routing rule cites the entry of docs/tuning.md that says why it is
// what it is (FwdPlan::rule, BwdPlan::rule).
//
// The kernel instances a unit compiles are the ones a plan can pick: the
// `*_exists` predicates below say which, from an instance's static identity
// (FwdKey, BwdKey); the plans pick nothing else and the launchers instantiate
// nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../norm_types.h"

namespace jrn {

// ---- Launch geometry, shared by the plans and the kernels.

inline constexpr int kMaxCluster = 16;  // CTAs of a cluster at most (a non-portable size on sm_90)

namespace fwd {
inline constexpr int kRegItems = 4;          // packs a thread in fwd_regs
inline constexpr int kMaxRowThreads = 1024;  // fwd_regs' CTA at most
inline constexpr int kStreamThreads = 512;
inline constexpr int kBlockThreads = 256;  // CTA size aimed at for rows narrower than it
inline constexpr int kClusterCtaThreads = 512;
inline constexpr int kQuantRowThreads = 512;  // FP8 outputs in fwd_regs: CTAs of at most this many threads,
inline constexpr int kQuantMinBlocks = 2;     // at least this many resident
inline constexpr int kEarlyThreads = 512;     // fwd_regs with parameters loaded early: CTA at most
inline constexpr int kDecodeThreads = 128;    // CTAs of the few rows of a decode step
inline constexpr int kDecodeItems = 2;        // packs a thread in fwd_decode
inline constexpr int kDecodeWideThreads = 512;
inline constexpr int kDecodeMaxParts = 4;
inline constexpr int kDecodeSplitMinThreads = 512;
inline constexpr int kOnePassMinThreads = 128;  // LayerNorm's one-pass statistics in fwd_regs from rows this wide
inline constexpr int kP32Threads = 128;         // fwd_regs' P32 instance: CTAs of this many threads,
inline constexpr int kP32RowThreads = 64;       // rows of at most this many (one pass from this many),
inline constexpr int kP32MinCtas = 7;           // this many resident
inline constexpr int kSliceItems = 4;           // packs a thread and row in fwd_slices
inline constexpr int kSliceThreads = 512;
inline constexpr int64_t kSliceVecs = static_cast<int64_t>(kSliceThreads) * kSliceItems;  // a CTA's packs
inline constexpr int64_t kSliceMinVecs = 64 * kSliceItems;
inline constexpr int64_t kSliceOneCtaMinVecs = 32 * kSliceItems;
inline constexpr int kSliceRowRegs = 56;     // the capped hold-y configurations' registers
inline constexpr int kSliceHalvesRegs = 80;  // the staged-halves configurations' registers
inline constexpr int kSmRegisters = 65536;
inline constexpr int kSliceStagedCluster = 4;
inline constexpr int kSliceStagedRowThreads = 256;
inline constexpr int kSliceL2AheadCluster = 16;
inline constexpr int kSliceRmsHoldThreads = 256;
inline constexpr int kSliceYSmemThreads = 32;
inline constexpr int kSliceRowSplitThreads = 384;
inline constexpr int kAddStatsThreads = 256;  // fwd_add_stats: one row a CTA
inline constexpr int kApplyThreads = 256;     // fwd_apply
inline constexpr int kApplyItems = 4;
inline constexpr int kFp8Vec = 16;  // FP8 codes a pack in fwd_fp8_regs
inline constexpr int kTileRows = 32;      // fwd_tiles: rows a cluster (whole groups of 16 or 32 rows)
inline constexpr int kTileThreads = 256;  // fwd_tiles' CTA,
inline constexpr int kTileMinCtas = 3;    // this many resident (its registers' bound)
inline constexpr int kTileCols = 1024;    // a CTA's columns at most (twice as many past kMaxCluster CTAs), its rows' pitch
}  // namespace fwd

namespace bwd {
inline constexpr int kRegItems = 2;  // packs a thread in bwd_regs
inline constexpr int kRegThreads = 512;
inline constexpr int kStreamThreads = 512;
inline constexpr int kBlockThreads = 256;
inline constexpr int kReduceLanes = 32, kReduceSplit = 8, kReduceUnroll = 4;  // bwd_reduce's CTA and loads
inline constexpr int64_t kReduceRows = kReduceSplit * kReduceUnroll;
inline constexpr int kColLanes = 8, kColSplit = 32, kColUnroll = 8;  // bwd_columns'
inline constexpr int kSliceItems = 4;  // packs a thread and row in bwd_slices
inline constexpr int kSliceThreads = 512;
inline constexpr int64_t kSliceVecs = static_cast<int64_t>(kSliceThreads) * kSliceItems;
inline constexpr int64_t kRegVecs = 64;  // rows of at most this many packs stay in bwd_regs
inline constexpr int kFold = 2;          // bwd_slices' CTAs folding their dgamma sums into one slot
inline constexpr int kStatsAheadGbps = 4000;  // DRAM bandwidth from which bwd_slices' late instance loads stats ahead
inline constexpr int64_t kStatsAheadRmsCols = 1024;  // ... RMSNorm's only where a CTA takes more columns than this
inline constexpr int kDecodeMaxThreads = 1024;
inline constexpr int kDecodeColUnroll = 2;
inline constexpr int64_t kDecodeMaxRows = 192;
inline constexpr int64_t kDecodeNarrowPacks = 128;
inline constexpr int64_t kDecodeNarrowMaxRows = 128;
inline constexpr int64_t kDecodeOneItemPacks = 512;
inline constexpr int64_t kDecodeMaxPacks = 2 * kDecodeMaxThreads;
inline constexpr int kDecodeParts = 8;
inline constexpr int64_t kDecodePartsPacks = 1024;
inline constexpr int64_t kDecodePartsMaxRows = 8;
inline constexpr int64_t kDecodeHalfCtasPerSm = 2;
inline constexpr int kUnalignedMaxCluster = 4;
inline constexpr int kUnalignedWideItems = 3;
inline constexpr int kUnalignedWidestItems = 4;
inline constexpr int64_t kUnalignedLayerWidestPacks = 448 * kUnalignedWidestItems;
inline constexpr int64_t kUnalignedFourFromPacks = 64;
inline constexpr int64_t kUnalignedLayerFourMostPacks = 96;
inline constexpr int64_t kUnalignedLayerThreeAbovePacks = 640;
static_assert(kDecodeMaxRows * kDecodeMaxPacks * 8 <= INT32_MAX, "bwd_decode indexes its rows in 32 bits");
}  // namespace bwd

namespace plan {

// ---- Small integer helpers of launch geometry (host and device).

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}
// The largest power of two at most v (v >= 1).
constexpr int pow2_floor(int64_t v) {
  int p = 1;
  while (2 * static_cast<int64_t>(p) <= v) p <<= 1;
  return p;
}
// Threads for a row (or a CTA's slice of one) of `packs` packs, `items` a
// thread: a power of two up to a warp (the warp reductions' shuffles), whole
// warps beyond, so that few threads are left without columns.
constexpr int row_threads(int64_t packs, int items) {
  const int64_t per_thread = ceil_div(packs, items);
  return per_thread <= 32 ? pow2_ceil(per_thread) : static_cast<int>(ceil_div(per_thread, 32) * 32);
}
// Whether a row of `hidden` elements, `packs` packs of `vec`, fills `cluster`
// CTAs of `tpr` threads of `items` packs exactly (the WHOLE instances).
constexpr bool fills_threads(int64_t packs, int vec, int64_t hidden, int cluster, int tpr, int items) {
  return static_cast<int64_t>(cluster) * tpr * items == packs && packs * vec == hidden;
}
// Rows of `tpr` threads a CTA of about `cta_threads`: as many as fit, at least one.
constexpr int rows_per_cta(int tpr, int cta_threads) { return tpr >= cta_threads ? 1 : cta_threads / tpr; }

// ---- The problem as a plan sees it.

enum class DType : uint8_t { kF32, kBF16, kF16 };
constexpr int size_of(DType t) { return t == DType::kF32 ? 4 : 2; }
const char* name_of(DType t);

// What a device offers that a plan depends on.
struct Device {
  int sms = 0;            // multiprocessors
  int cc_major = 0;       // compute capability
  int cc_minor = 0;
  int64_t smem_optin = 0;  // shared memory a CTA may opt in to, bytes
  int dram_gbps = 0;       // peak DRAM bandwidth, GB/s (0: unknown)
  bool clusters() const { return cc_major >= 9; }  // thread block clusters, bulk copies (sm_90+)
};

// The static identity of a forward kernel instance: what a unit fixes at
// compile time (normalization, output, element types, pack width, FP8 x).
struct FwdKey {
  NormKind kind = NormKind::kRms;
  Quant quant = Quant::kNone;
  DType x = DType::kBF16;      // the kernel's element type (y's where x is FP8)
  DType param = DType::kBF16;  // gamma's and beta's (float32 or x's)
  int vec = 8;                 // elements a pack
  bool fp8_x = false;          // x holds FP8 codes, dequantized as loaded
  constexpr bool narrow() const { return size_of(x) == 2; }  // 16-bit x
  constexpr bool packs16() const { return size_of(x) * vec == 16; }
  constexpr int param_pack_bytes() const { return size_of(param) * vec; }
};

struct FwdProblem {
  NormKind kind = NormKind::kRms;
  Quant quant = Quant::kNone;
  DType x = DType::kBF16;
  DType param = DType::kBF16;
  int64_t rows = 0, hidden = 0, groups = 1;
  bool gamma = true, beta = false, zero_centered = false;  // which parameters are given
  bool residual = false, residual_f32 = false, h_f32 = false;
  bool given_stats = false;  // mean/rstd given (the hidden dim split across devices)
  bool no_output = false;    // per-tensor FP8's measuring pass: amax only
  bool fp8_x = false;        // x as FP8 codes with a scale per x_group columns
  int64_t x_group = 0;
  int64_t group_size = 0;    // per-group FP8
  GroupScale group_scale = GroupScale::kFloat;  // per-group FP8: the scale rule (norm_types.h)
  bool qt = false;           // current scaling's transposed copy wanted
  int64_t tensors = 1;       // per-tensor FP8: x's rows split into this many tensors
  // 16-byte alignment of the buffers: x, y (or q), gamma and beta (those
  // given), residual and h (where present), current scaling's q_t.
  bool x_aligned = true, y_aligned = true, params_aligned = true, residual_aligned = true, qt_aligned = true;
  // gamma (and LayerNorm's beta) given, the scale not zero-centred: the
  // common case, which several kernels give code of its own.
  bool plain_params() const { return gamma && (kind == NormKind::kRms || beta) && !zero_centered; }
};

// ---- Forward configurations.

enum class FwdKernel : uint8_t {
  kNone,       // nothing to launch (no rows)
  kDecode,     // fwd_decode: decode-time row counts, one CTA (or `parts`) a row, few instructions a warp
  kRegs,       // fwd_regs: the row held in registers, several rows a CTA, a CTA or a cluster a row
  kUnaligned,  // fwd_unaligned: widths that are no multiple of a 16-byte pack, head and tail apart
  kSlices,     // fwd_slices (sm_90+): persistent CTAs or clusters, each row's slice bulk-copied to shared memory
  kStream,     // fwd_stream: one CTA a row, the row read twice (the rest)
  kTwoPass,    // fwd_add_stats + fwd_apply: h and statistics, then y, for wide rows with a residual
  kFp8Regs,    // fwd_fp8_regs: FP8 x held as raw codes in registers
  kTiles,      // fwd_tiles (sm_90+): the per-group output and its columnwise copy from one read of x, a cluster
               // a slab of kTileRows rows held in shared memory
};

enum class RegsVariant : uint8_t {
  kBase,   // parameters loaded next to the stores of y
  kEarly,  // parameters loaded with x (launches of at most two CTAs an SM; see fwd-regs-early)
  kP32,    // CTAs of kP32Threads, kP32MinCtas resident (see regs-p32)
};

// fwd_decode's residual add: none; residual and h in x's dtype; or either float32.
enum class DecodeResidual : uint8_t { kNone, kSame, kAny };

// fwd_decode's named configuration (its fields are the kernel's template
// arguments).
struct DecodeConfig {
  int items = 2;       // packs a thread: 2; 4 for the widest rows; 1 for RMSNorm's residual add
  bool plain = false;  // gamma (and beta) given, not zero-centred: nothing to decide a pack
  bool split = false;  // rows split into parts (gridDim.y), each storing its part
  DecodeResidual resid = DecodeResidual::kNone;
  constexpr bool operator==(const DecodeConfig&) const = default;
};

// fwd_slices' named configurations. Each is one set of the kernel's
// compile-time choices (SliceConfig); the comment says when the plan picks it.
enum class SliceVariant : uint8_t {
  kBase,                // whatever no variant below takes (e.g. RMSNorm's per-tensor FP8 across a cluster)
  kHeldParams,          // one CTA a row: LayerNorm's per-tensor/per-group FP8 and plain 16-bit rows of > 256
                        // threads, RMSNorm's FP8 outputs of 16-bit x in one-warp CTAs: gamma/beta held in registers
  kHeldParamsYSmem,     // LayerNorm's per-row FP8 of bf16 x in one-warp CTAs: held parameters, y in shared memory
  kClusterRefill,       // across a cluster: the plain norms, LayerNorm's per-tensor FP8 (row after next in flight)
  kHoldY,               // one CTA a row: LayerNorm's per-row FP8 of 16-bit x, RMSNorm's per-row / per-group
                        // FP8 of 16-bit x from kSliceRmsHoldThreads threads: y (RMSNorm: x * gamma) held
  kHoldYCapped,         // kHoldY per row where the kSliceRowRegs cap applies (parameters in x's dtype, or a CTA more)
  kClusterHoldY,        // per-row FP8 of 16-bit x across a cluster: y held, the row after next in flight
  kClusterHoldYCapped,  // kClusterHoldY where the kSliceRowRegs cap applies
  kStagedParams,        // LayerNorm's plain forward of 16-bit x with float32 gamma and beta given: staged in
                        // shared memory, in a cluster twice the natural size
  kStagedHalves,        // LayerNorm's plain forward (16-byte parameter packs) across clusters of 4-8: staged,
                        // CTAs half as wide
  kStagedHalvesHoldY,   // LayerNorm's per-row FP8 of bf16 x across a cluster of CTAs of <= 256 threads: staged,
                        // halves, y held
};
const char* name_of(SliceVariant v);

// What a SliceVariant fixes in fwd_slices.
struct SliceConfig {
  bool held_params = false;    // gamma/beta packs in registers, reloaded where the parameter group changes
  bool refill_at_end = false;  // the prologue fills both stages; a row's stage takes the row after next
  bool staged_params = false;  // gamma/beta in shared memory after the stages (one CTA an SM)
  bool hold_y = false;         // y (RMSNorm: x * gamma) held between the row's max and its quantization
  bool halves = false;         // staged in CTAs half as wide, held to kSliceHalvesRegs registers
  bool row_cap = false;        // held to kSliceRowRegs registers
};
constexpr SliceConfig slice_config(SliceVariant v) {
  switch (v) {
    case SliceVariant::kBase: return {};
    case SliceVariant::kHeldParams: return {.held_params = true};
    case SliceVariant::kHeldParamsYSmem: return {.held_params = true, .hold_y = true};
    case SliceVariant::kClusterRefill: return {.refill_at_end = true};
    case SliceVariant::kHoldY: return {.hold_y = true};
    case SliceVariant::kHoldYCapped: return {.hold_y = true, .row_cap = true};
    case SliceVariant::kClusterHoldY: return {.refill_at_end = true, .hold_y = true};
    case SliceVariant::kClusterHoldYCapped: return {.refill_at_end = true, .hold_y = true, .row_cap = true};
    case SliceVariant::kStagedParams: return {.refill_at_end = true, .staged_params = true};
    case SliceVariant::kStagedHalves: return {.refill_at_end = true, .staged_params = true, .halves = true};
    case SliceVariant::kStagedHalvesHoldY:
      return {.refill_at_end = true, .staged_params = true, .hold_y = true, .halves = true};
  }
  return {};
}

// ---- Which forward instances exist (and so may be planned).

// fwd_regs' P32 instance: LayerNorm's plain forward of 16-bit x with float32
// parameters, RMSNorm's per-row FP8 of 16-bit x with parameters in x's dtype.
constexpr bool p32_layer_params(FwdKey k) {
  return k.kind == NormKind::kLayer && k.quant == Quant::kNone && !k.fp8_x && k.narrow() && k.packs16() &&
         k.param == DType::kF32;
}
constexpr bool p32_rms_row(FwdKey k) {
  return k.kind == NormKind::kRms && k.quant == Quant::kRow && !k.fp8_x && k.narrow() && k.packs16() &&
         k.param == k.x;
}
constexpr bool regs_exists(FwdKey k, RegsVariant v) {
  if (k.fp8_x && k.quant != Quant::kNone) return false;
  switch (v) {
    case RegsVariant::kBase: return true;
    case RegsVariant::kEarly: return k.quant == Quant::kNone && !k.fp8_x && k.param == k.x;
    case RegsVariant::kP32: return p32_layer_params(k) || p32_rms_row(k);
  }
  return false;
}

// fwd_decode: the plain norm (optionally with the residual add) of 16-byte
// packs, parameters in x's dtype. Four packs a thread for the widest rows of
// float32 or RMSNorm; one with RMSNorm's residual add; parts for rows split.
constexpr bool decode_exists(FwdKey k, DecodeConfig c) {
  if (k.quant != Quant::kNone || k.fp8_x || !k.packs16() || k.param != k.x) return false;
  if (c.resid == DecodeResidual::kAny && !k.narrow()) return false;  // float32: residual and h are x's dtype
  if (c.split) return c.items == fwd::kDecodeItems && c.resid == DecodeResidual::kNone;
  if (c.items == 4) return c.resid == DecodeResidual::kNone && (!k.narrow() || k.kind == NormKind::kRms);
  if (c.items == 1) return c.resid != DecodeResidual::kNone && k.kind == NormKind::kRms;
  return c.items == 2;
}

// The fwd_slices predicates: which outputs take which configuration.
constexpr bool slice_one_cta(FwdKey k) {  // LayerNorm's per-tensor FP8, parameters held in one CTA a row
  return k.kind == NormKind::kLayer && k.quant == Quant::kTensor && k.param_pack_bytes() == 16;
}
constexpr bool slice_one_cta_plain(FwdKey k) {  // LayerNorm's plain forward of 16-bit x, x's-dtype parameters
  return k.kind == NormKind::kLayer && k.quant == Quant::kNone && k.narrow() && k.param_pack_bytes() == 16;
}
constexpr bool slice_one_cta_group(FwdKey k) {  // LayerNorm's per-group FP8 of 16-bit x
  return k.kind == NormKind::kLayer && k.quant == Quant::kGroup && k.narrow() && k.param_pack_bytes() == 16;
}
constexpr bool slice_quant_warp(FwdKey k) {  // one-warp CTAs from hidden 1024: per group, RMSNorm's per tensor
  return k.narrow() && (k.quant == Quant::kGroup || (k.kind == NormKind::kRms && k.quant == Quant::kTensor));
}
constexpr bool slice_one_cta_warp(FwdKey k) {  // RMSNorm's FP8 outputs of 16-bit x in one-warp CTAs, gamma held
  return k.kind == NormKind::kRms && k.narrow() && k.param_pack_bytes() == 16 &&
         (slice_quant_warp(k) || k.quant == Quant::kRow);
}
constexpr bool slice_row_ln_warp(FwdKey k) {  // LayerNorm's per-row FP8 of bf16 from one-warp CTAs
  return k.kind == NormKind::kLayer && k.quant == Quant::kRow && k.x == DType::kBF16;
}
constexpr bool slice_ysmem_row(FwdKey k) { return slice_row_ln_warp(k) && k.param_pack_bytes() == 16; }
constexpr bool slice_hold_y(FwdKey k) {  // per-row FP8 (RMSNorm also per-group) of 16-bit x may hold y
  return k.narrow() && (k.quant == Quant::kRow || (k.kind == NormKind::kRms && k.quant == Quant::kGroup));
}
constexpr bool slice_refill_at_end(FwdKey k) {
  return k.quant == Quant::kNone || (k.kind == NormKind::kLayer && (k.quant == Quant::kTensor || k.quant == Quant::kRow));
}
constexpr bool slice_staged_p32(FwdKey k) {
  return k.kind == NormKind::kLayer && k.quant == Quant::kNone && k.narrow() && k.param == DType::kF32;
}
constexpr bool slice_staged_row(FwdKey k) { return slice_row_ln_warp(k) && k.param == k.x; }
constexpr bool slice_own_copies(FwdKey k) { return k.kind == NormKind::kRms && k.quant == Quant::kNone; }
constexpr bool ln_row_holds_y(FwdKey k) { return k.kind == NormKind::kLayer && k.quant == Quant::kRow && k.narrow(); }

constexpr bool slice_exists(FwdKey k, SliceVariant v) {
  if (!k.packs16() || k.fp8_x || k.quant == Quant::kCurrent) return false;
  const bool row16 = k.quant == Quant::kRow && k.narrow();
  switch (v) {
    case SliceVariant::kBase: return !slice_one_cta(k) && !ln_row_holds_y(k);
    case SliceVariant::kHeldParams:
      return slice_one_cta(k) || slice_one_cta_plain(k) || slice_one_cta_group(k) || slice_one_cta_warp(k);
    case SliceVariant::kHeldParamsYSmem: return slice_ysmem_row(k);
    case SliceVariant::kClusterRefill: return slice_refill_at_end(k) && !ln_row_holds_y(k);
    case SliceVariant::kHoldY:
      return slice_hold_y(k) && (k.quant == Quant::kGroup || k.param != k.x);
    case SliceVariant::kHoldYCapped: return row16;
    case SliceVariant::kClusterHoldY: return row16 && k.param != k.x;
    case SliceVariant::kClusterHoldYCapped: return row16;
    case SliceVariant::kStagedParams: return slice_staged_p32(k);
    case SliceVariant::kStagedHalves: return k.kind == NormKind::kLayer && k.quant == Quant::kNone &&
                                             k.param_pack_bytes() == 16;
    case SliceVariant::kStagedHalvesHoldY: return slice_staged_row(k);
  }
  return false;
}
// WHOLE instances (every pack inside the row: no per-pack test): 16-bit x
// with parameters in x's dtype.
constexpr bool slice_whole_exists(FwdKey k) { return k.narrow() && k.param == k.x; }
// The fwd_slices instances the units compile: a configuration of the output,
// WHOLE or not. LayerNorm's per-group output holds its parameters only where
// its rows fill the CTA (slice-one-cta-group).
constexpr bool slice_instance_exists(FwdKey k, SliceVariant v, bool whole) {
  if (whole) return slice_exists(k, v) && slice_whole_exists(k);
  return slice_exists(k, v) && !(v == SliceVariant::kHeldParams && slice_one_cta_group(k));
}

// The two passes: the plain norm, per-tensor FP8 or RMSNorm's per-row FP8.
constexpr bool two_pass_exists(FwdKey k) {
  return k.packs16() && !k.fp8_x &&
         (k.quant == Quant::kNone || k.quant == Quant::kTensor ||
          (k.quant == Quant::kRow && k.kind == NormKind::kRms));
}
constexpr bool unaligned_exists(Quant q) { return q == Quant::kNone || q == Quant::kTensor || q == Quant::kRow; }

// ---- The forward plan.

// Whether fwd_tiles writes q_t's scales of `rule` by rows into the fused
// forward's workspace (an FFI result of q_t scales' size, which the
// primitive sizes by this), then transposes them (fwd-tiles): the block
// formats' scale bytes, which in q_t's layout would land one a sector.
constexpr bool tile_scales_by_rows(GroupScale rule) { return rule == GroupScale::kE8M0 || rule == GroupScale::kNvfp4; }

struct FwdPlan {
  FwdKernel kernel = FwdKernel::kNone;
  FwdKey key;              // the instance: element types, pack width, FP8 x
  int threads = 0;         // a row's threads (a CTA's slice of a row): blockDim.x
  int rows_per_cta = 1;    // blockDim.y
  int64_t ctas = 0;        // gridDim.x; 0 for persistent kernels: as many as are resident at once
  int parts = 1;           // gridDim.y: fwd_decode's parts of a row
  int cluster = 1;         // CTAs of a thread block cluster (a row across them)
  int items = 0;           // packs a thread
  int64_t smem = 0;        // dynamic shared memory, bytes
  bool early_launch = false;  // programmatic dependent launch (fwd_decode)
  RegsVariant regs = RegsVariant::kBase;
  DecodeConfig decode;     // fwd_decode's configuration
  SliceVariant slice = SliceVariant::kBase;
  bool whole = false;      // fwd_slices: the row fills the threads exactly
  int64_t chunks = 0;      // two passes: fwd_apply's CTAs a row
  int width = 0;           // fwd_tiles: a CTA's columns (the last CTA of a cluster's may be fewer)
  bool scales_by_rows = false;  // fwd_tiles: q_t's block scales by rows into the workspace, then transpose8
  bool columns = false;    // fwd_columns after the rowwise kernel: the per-group output's columnwise copy
  const char* rule = "";   // the docs/tuning.md entry that says why
};

// Current scaling (Quant::kCurrent): a measuring pass (amax and the rows'
// statistics), amax turned into scale_inv, a quantizing pass, and the
// transposed copy q_t where wanted and not written by the quantizing pass.
enum class CurrentMeasure : uint8_t { kAmaxRows, kTensorPass };  // x_amax, or the per-tensor kernel without output
enum class CurrentQuantize : uint8_t { kTiles, kRows, kTensorPass };  // quantize_tiles, x_quantize, per-tensor kernel
struct CurrentPlan {
  CurrentMeasure measure = CurrentMeasure::kAmaxRows;
  FwdPlan measure_pass;  // kTensorPass's plan
  CurrentQuantize quantize = CurrentQuantize::kRows;
  FwdPlan quantize_pass;  // kTensorPass's plan
  bool transpose = false;  // q_t by launch_transpose8 after the quantizing pass
  const char* rule = "current-measure";
};

FwdPlan plan_fwd(const FwdProblem& p, const Device& d);  // p.quant != kCurrent
CurrentPlan plan_current(const FwdProblem& p, const Device& d);
// The problems of current scaling's per-tensor passes.
FwdProblem current_measure_problem(const FwdProblem& p);
FwdProblem current_quantize_problem(const FwdProblem& p);
// Whether quantize_tiles takes current scaling's quantizing pass; its words
// a store of q_t (4, 2 or 1: rows a multiple of 16, 8 or 4; 0: none fits).
int transposed_store_words(int64_t rows);
bool quantize_tiles_fit(const FwdProblem& p);

// ---- The backward.

struct BwdKey {
  NormKind kind = NormKind::kRms;
  DType x = DType::kBF16;
  DType param = DType::kBF16;
  int vec = 8;
  constexpr bool narrow() const { return size_of(x) == 2; }
  constexpr bool packs16() const { return size_of(x) * vec == 16; }
};

struct BwdProblem {
  NormKind kind = NormKind::kRms;
  DType x = DType::kBF16;
  DType param = DType::kBF16;
  int64_t rows = 0, hidden = 0, groups = 1;
  bool gamma = true;
  int param_outputs = 1;  // dgamma and dbeta wanted
  int64_t slots = 0;      // rows of float32 partial dgamma sums in the workspace (0: no workspace)
  bool coef = false;      // the rows' coefficients given (the hidden dim split across devices)
  bool dh = false;        // the residual's gradient added to dx
  // 16-byte alignment: x, dy, dx and dh; gamma; the workspace and dgamma/dbeta.
  bool rows_aligned = true, gamma_aligned = true, sums_aligned = true;
};

enum class BwdKernel : uint8_t {
  kNone,       // nothing to launch
  kDecode,     // bwd_decode: decode-time rows, one CTA (or a cluster of `parts`) a row; dgamma in the same launch
  kRegs,       // bwd_regs: rows of up to kRegVecs packs held in registers, several rows a CTA
  kSlices,     // bwd_slices (sm_90+): persistent CTAs or clusters, x and dy bulk-copied into stages
  kStream,     // bwd_stream: one CTA a slot, rows streamed twice
  kUnaligned,  // bwd_unaligned: widths that are no multiple of a pack, persistent
};

// How dgamma/dbeta are finished after the dx kernel.
enum class ParamSums : uint8_t {
  kNone,     // not wanted, or written by the dx kernel (bwd_decode)
  kColumns,  // bwd_columns sums them from x and dy (no workspace), launched early beside the dx kernel
  kReduce,   // bwd_reduce adds the slots' partial rows in a fixed order
};

struct BwdPlan {
  BwdKernel kernel = BwdKernel::kNone;
  BwdKey key;
  int threads = 0;       // blockDim.x
  int rows_per_cta = 1;  // blockDim.y (bwd_regs, bwd_unaligned)
  int64_t ctas = 0;      // gridDim.x (x groups for persistent kernels: 0, as many as are resident)
  int cluster = 1;       // CTAs a row (bwd_slices, bwd_unaligned, bwd_decode's parts)
  int fold = 1;          // bwd_slices: CTAs folding their dgamma sums into one slot
  int items = 0;         // packs a thread
  int64_t smem = 0;      // dynamic shared memory, bytes
  int64_t slots = 0;     // slots walking the rows (before the persistent kernels' own bound)
  bool early = false;    // bwd_slices' EARLY instance
  bool whole = false;    // bwd_slices' WHOLE instance
  bool stats_ahead = false;  // bwd_slices: a row's rstd/mean loaded a row ahead (bwd-slices-stats)
  bool direct = false;   // bwd_decode: the one row writes dgamma/dbeta itself
  int splits = 0;        // bwd_decode: the column tiles' rows of threads
  int64_t tiles = 0;     // bwd_decode: CTAs summing dgamma/dbeta by columns
  int64_t period = 1;    // bwd_unaligned: rows apart that start at the same offset from a pack
  ParamSums sums = ParamSums::kNone;
  int sums_vec = 1;          // columns a thread of bwd_reduce (4 or 1) or of bwd_columns (a pack or 1)
  int64_t column_tiles = 0;  // bwd_columns' CTAs along the row
  const char* rule = "";
};

BwdPlan plan_bwd(const BwdProblem& p, const Device& d);

// Whether the backward centres each row again (float32 LayerNorm): the
// saved mean is the row's mean rounded to float32, off by up to half an ulp
// of it, which in rows far from zero (|mean| much larger than std) shifts
// every xhat of the row alike. The dx kernels take a third row sum, of xhat
// (zero at the exact mean), and remove that shift from the row's xhat, its
// coefficients and its dgamma sums. 16-bit x carry more rounding of their
// own than the shift (see kShiftedSums).
constexpr bool centres_rows(NormKind kind, DType x) { return kind == NormKind::kLayer && x == DType::kF32; }

// Rows of float32 partial dgamma/dbeta sums ("slots") the backward's
// workspace gets, per parameter group (the primitives allocate it at trace
// time). None for groups of at most kColumnRows rows and kColumnElems
// elements: dgamma/dbeta are summed straight from x and dy (bwd_decode's
// column CTAs, or bwd_columns), which the dx kernel reads too, so that L2
// serves one of the two reads; larger groups would read them from DRAM a
// second time (docs/tuning.md, column-rows). Not for rows the backward
// centres (centres_rows): the column sums see no whole row, so those always
// take slots, summed by the dx kernels after each row's centring.
// Otherwise kSlotFloats floats a group at most, kMaxSlots slots
// (slot-budget).
inline constexpr int64_t kSlotFloats = int64_t{1} << 24;
inline constexpr int64_t kMaxSlots = 4096;
inline constexpr int64_t kColumnRows = 512;
inline constexpr int64_t kColumnElems = 512 * 8192;
constexpr int64_t workspace_slots(NormKind kind, DType x, int64_t rows_per_group, int64_t hidden, int param_outputs) {
  if (param_outputs == 0 || hidden == 0) return 0;
  if (!centres_rows(kind, x) && rows_per_group <= kColumnRows && rows_per_group * hidden <= kColumnElems) return 0;
  int64_t slots = kSlotFloats / (param_outputs * hidden);
  slots = slots < 1 ? 1 : slots > kMaxSlots ? kMaxSlots : slots;
  return slots < rows_per_group ? slots : (rows_per_group > 1 ? rows_per_group : 1);
}
// The same problem in single elements: where bwd_unaligned's persistent
// slots turn out fewer than its rows' period (a workspace of few slots).
BwdPlan plan_bwd_elements(const BwdProblem& p, const Device& d);

// Whether the backward instances exist: bwd_slices and bwd_decode move
// 16-byte packs; bwd_decode's items are 1, 2 or 4.
constexpr bool bwd_decode_exists(BwdKey k) { return k.packs16(); }
constexpr bool bwd_slices_exists(BwdKey k) { return k.packs16(); }

// ---- Printing: one line a plan (what describe_plan returns).
std::string describe(const FwdPlan& p);
std::string describe(const CurrentPlan& p);
std::string describe(const BwdPlan& p);

}  // namespace plan
}  // namespace jrn
