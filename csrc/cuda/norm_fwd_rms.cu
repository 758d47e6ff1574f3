// RMSNorm's forward launchers: norm_fwd.cuh instantiated for RMSNorm's
// (element type, parameter type) combinations.
#include "norm_fwd.cuh"

namespace jrn::cuda {
JRN_FOR_EACH_RMS_INSTANCE(JRN_INSTANTIATE_FWD)
}  // namespace jrn::cuda
