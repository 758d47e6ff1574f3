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
enum class Quant { kNone, kTensor, kRow, kGroup, kCurrent };
enum class Fp8 { kE4M3, kE5M2 };

}  // namespace jrn
