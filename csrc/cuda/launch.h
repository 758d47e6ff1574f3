// The CUDA launchers, as the FFI handlers see them. Implemented in
// fwd/launch.cuh and bwd/launch.cuh (instantiated by units/fwd_{rms,layer}_*.cu
// and units/bwd_*.cu, one unit for each type of x), norm_stats.cu and
// fp8_transpose.cu, for every supported (normalization, element type,
// parameter type).
#pragma once

#include <cuda_runtime.h>

#include "../norm_common.h"

namespace jrn::cuda {

template <NormKind K, class T, class P>
ffi::Error launch_fwd(cudaStream_t stream, const FwdArgs& a);

template <NormKind K, class T, class P>
ffi::Error launch_bwd(cudaStream_t stream, const BwdArgs& a);

template <NormKind K, class T>
ffi::Error launch_stats(cudaStream_t stream, const StatsArgs& a);

template <NormKind K, class T, class P>
ffi::Error launch_grad_stats(cudaStream_t stream, const StatsArgs& a);
// Current scaling's measuring pass where it has a kernel of its own (no
// residual, given statistics or FP8 input; RMSNorm, and LayerNorm at widths
// that are not a multiple of a 16-byte pack): max |y| into a.amax, and the
// rows' statistics.
template <NormKind K, class T, class P>
ffi::Error launch_fwd_amax(cudaStream_t stream, const FwdArgs& a);
// Current scaling's quantizing pass row by row (no residual, given
// statistics or FP8 input; x and q 16-byte aligned): q = y / scale_inv from
// the statistics of the measuring pass and scale_inv in a.amax.
template <NormKind K, class T, class P>
ffi::Error launch_quantize_rows(cudaStream_t stream, const FwdArgs& a);
// out[b, c, r] = in[b, r, c] for bytes (FP8): the transposed copy of q.
ffi::Error launch_transpose8(cudaStream_t stream, const void* in, void* out, int64_t batch, int64_t rows,
                             int64_t cols);
// Current scaling's quantizing pass from the statistics and scale_inv
// (a.amax) of the passes before, writing q and, with a.qt, its transposed
// copy in the same read of x, where plan::quantize_tiles_fit says so.
template <NormKind K, class T, class P>
ffi::Error launch_quantize_tiles(cudaStream_t stream, const FwdArgs& a);

// Apply MACRO(K, T, P) to the instantiated combinations of normalization K
// with x of one type T, one for each parameter type P it takes; the forward's
// and backward's translation units instantiate one such group each
// (csrc/cuda/units).
#define JRN_FOR_EACH_F32_X(MACRO, K) MACRO(K, float, float)
#define JRN_FOR_EACH_BF16_X(MACRO, K)    \
  MACRO(K, __nv_bfloat16, __nv_bfloat16) \
  MACRO(K, __nv_bfloat16, float)
#define JRN_FOR_EACH_F16_X(MACRO, K) \
  MACRO(K, __half, __half)           \
  MACRO(K, __half, float)
// ... and to every instantiated combination.
#define JRN_FOR_EACH_KIND_INSTANCE(MACRO, K) \
  JRN_FOR_EACH_F32_X(MACRO, K)               \
  JRN_FOR_EACH_BF16_X(MACRO, K)              \
  JRN_FOR_EACH_F16_X(MACRO, K)
#define JRN_FOR_EACH_INSTANCE(MACRO)                       \
  JRN_FOR_EACH_KIND_INSTANCE(MACRO, ::jrn::NormKind::kRms) \
  JRN_FOR_EACH_KIND_INSTANCE(MACRO, ::jrn::NormKind::kLayer)

}  // namespace jrn::cuda
