// The CUDA FFI handlers and the nanobind module that hands them to Python.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>


#include "../nb_module.h"
#include "../norm_common.h"
#include "../dist_handlers.h"
#include "../norm_fused.h"
#include "common/device.h"
#include "launch.h"

namespace jrn {

struct CudaBackend {
  static constexpr bool kGroupScales = true;   // every GroupScale (norm_fused.h)
  static constexpr bool kGroupColumns = true;  // and the columnwise copy (fwd_columns)
  using Bf16 = __nv_bfloat16;
  using F16 = __half;
  template <NormKind K, class T, class P>
  static ffi::Error fwd(cudaStream_t stream, const FwdArgs& a) {
    return cuda::launch_fwd<K, T, P>(stream, a);
  }
  template <NormKind K, class T, class P>
  static ffi::Error bwd(cudaStream_t stream, const BwdArgs& a) {
    return cuda::launch_bwd<K, T, P>(stream, a);
  }
  template <NormKind K, class T>
  static ffi::Error stats(cudaStream_t stream, const StatsArgs& a) {
    return cuda::launch_stats<K, T>(stream, a);
  }
  template <NormKind K, class T, class P>
  static ffi::Error grad_stats(cudaStream_t stream, const StatsArgs& a) {
    return cuda::launch_grad_stats<K, T, P>(stream, a);
  }
};

}  // namespace jrn

#define JRN_COMMA ,
JRN_DEFINE_NORM_HANDLERS(Cuda, ::jrn::CudaBackend,
                         ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>(),
                         cudaStream_t stream JRN_COMMA, stream JRN_COMMA);
JRN_DEFINE_DIST_HANDLERS(Cuda, ::jrn::CudaBackend,
                         ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>(),
                         cudaStream_t stream JRN_COMMA, stream JRN_COMMA);
JRN_DEFINE_FUSED_HANDLERS(Cuda, ::jrn::CudaBackend,
                          ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>(),
                          cudaStream_t stream JRN_COMMA, stream JRN_COMMA);

// all_reduce_rms_norm's "nvlink" method (all_reduce_norm.cu): CUDA only.
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaAllReduceRmsNorm);
namespace jrn::cuda {
bool peer_access_everywhere();  // every pair of the visible GPUs, and at least two
}

namespace {
nanobind::dict own_registrations() {
  nanobind::dict d;
  d["jrn_all_reduce_rms_norm"] = nanobind::capsule(reinterpret_cast<void*>(CudaAllReduceRmsNorm));
  return d;
}
// The current GPU as the plans see it (describe_plan's device="current").
nanobind::dict current_device() {
  const jrn::plan::Device d = jrn::cuda::this_device();
  nanobind::dict out;
  out["sms"] = d.sms;
  out["cc_major"] = d.cc_major;
  out["cc_minor"] = d.cc_minor;
  out["smem_optin"] = d.smem_optin;
  out["dram_gbps"] = d.dram_gbps;
  return out;
}
}  // namespace

JRN_NB_MODULE(_jax_rmsnorm_cuda, Cuda, m.def("own_registrations" JRN_COMMA & own_registrations);
              m.def("peer_access_everywhere" JRN_COMMA & ::jrn::cuda::peer_access_everywhere);
              m.def("current_device" JRN_COMMA & current_device);)
