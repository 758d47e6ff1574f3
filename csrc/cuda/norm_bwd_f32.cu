// The backward's launchers for float32 x: norm_bwd.cuh instantiated for RMSNorm
// and LayerNorm with each parameter type of that x (launch.h).
#include "norm_bwd.cuh"

namespace jrn::cuda {
JRN_FOR_EACH_F32_X(JRN_INSTANTIATE_BWD, ::jrn::NormKind::kRms)
JRN_FOR_EACH_F32_X(JRN_INSTANTIATE_BWD, ::jrn::NormKind::kLayer)
}  // namespace jrn::cuda
