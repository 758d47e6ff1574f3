// RMSNorm's forward launchers for float32 x: norm_fwd.cuh instantiated for
// RMSNorm with each parameter type of that x (launch.h).
#include "norm_fwd.cuh"

namespace jrn::cuda {
JRN_FOR_EACH_F32_X(JRN_INSTANTIATE_FWD, ::jrn::NormKind::kRms)
}  // namespace jrn::cuda
