// The enums every layer shares: host handlers, the launch plans and the
// kernels. No dependencies, so the plans (csrc/plan) stay plain C++.
#pragma once

namespace jrn {

enum class NormKind { kRms, kLayer };

// Per-row gradient sums a backward needs of the whole row, written by the
// gradient statistics and read back as given coefficients (BwdArgs::coef)
// when the hidden dim is split across devices: mean(gdy * xhat) for both
// norms, and mean(gdy) for LayerNorm alone.
constexpr int grad_sums_per_row(NormKind k) { return k == NormKind::kLayer ? 2 : 1; }

// FP8 output of the fused forward (norm_fused.h): none, one scale per tensor
// (given; amax returned), per row or per group of columns (computed), or one
// per tensor computed from the tensor's own amax (current scaling).
// kBlock names CUDA kernel instances only: a per-group output whose scales
// follow a block rule (GroupScale other than kFloat). Arguments and plans
// say kGroup; the launcher runs kBlock's instances where the rule is not
// kFloat, so that float32 scales keep kernels free of the rules' code.
enum class Quant { kNone, kTensor, kRow, kGroup, kCurrent, kBlock };
enum class Fp8 { kE4M3, kE5M2 };

// The scale of each group of a per-group output (Quant::kGroup): float32
// amax / fp8_max (kFloat); that rounded up to a power of two (kPow2);
// block-scaled formats as jax.nn's quantizer defines them: an E8M0 power of
// two rounded up from amax / fp8_max (kE8M0, MXFP8), or an E4M3 scale of the
// values divided by a per-tensor float32 global scale, with E2M1 codes
// (kNvfp4, NVFP4). norm_fused.h has the rules.
enum class GroupScale { kFloat, kPow2, kE8M0, kNvfp4 };

}  // namespace jrn
