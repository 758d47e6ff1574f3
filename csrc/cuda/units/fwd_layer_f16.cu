// LayerNorm's forward for float16 x: fwd/launch.cuh instantiated with each
// parameter type of that x (launch.h).
#include "../fwd/launch.cuh"

namespace jrn::cuda {
JRN_FOR_EACH_F16_X(JRN_INSTANTIATE_FWD, ::jrn::NormKind::kLayer)
}  // namespace jrn::cuda
