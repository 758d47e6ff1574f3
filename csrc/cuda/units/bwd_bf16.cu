// The backward for bfloat16 x: bwd/launch.cuh instantiated for RMSNorm and
// LayerNorm with each parameter type of that x (launch.h).
#include "../bwd/launch.cuh"

namespace jrn::cuda {
JRN_FOR_EACH_BF16_X(JRN_INSTANTIATE_BWD, ::jrn::NormKind::kRms)
JRN_FOR_EACH_BF16_X(JRN_INSTANTIATE_BWD, ::jrn::NormKind::kLayer)
}  // namespace jrn::cuda
