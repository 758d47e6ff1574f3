// LayerNorm's forward launchers for bfloat16 x: norm_fwd.cuh instantiated for
// LayerNorm with each parameter type of that x (launch.h).
#include "norm_fwd.cuh"

namespace jrn::cuda {
JRN_FOR_EACH_BF16_X(JRN_INSTANTIATE_FWD, ::jrn::NormKind::kLayer)
}  // namespace jrn::cuda
