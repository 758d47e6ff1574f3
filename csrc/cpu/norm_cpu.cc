// The CPU FFI handlers and the nanobind module that hands them to Python.
// The kernels are in norm_cpu.h, instantiated in norm_cpu_fwd_rms.cc,
// norm_cpu_fwd_layer.cc and norm_cpu_bwd.cc.
#include "../nb_module.h"
#include "../norm_common.h"
#include "../dist_handlers.h"
#include "../norm_fused.h"
#include "norm_cpu.h"

namespace jrn {

struct CpuBackend {
  using Bf16 = cpu::bf16_t;
  using F16 = cpu::f16_t;
  template <NormKind K, class T, class P>
  static ffi::Error fwd(ffi::ThreadPool& pool, const FwdArgs& a) {
    return cpu::fwd<K, T, P>(pool, a);
  }
  template <NormKind K, class T, class P>
  static ffi::Error bwd(ffi::ThreadPool& pool, const BwdArgs& a) {
    return cpu::bwd<K, T, P>(pool, a);
  }
  template <NormKind K, class T>
  static ffi::Error stats(ffi::ThreadPool& pool, const StatsArgs& a) {
    return cpu::stats<K, T>(pool, a);
  }
  template <NormKind K, class T, class P>
  static ffi::Error grad_stats(ffi::ThreadPool& pool, const StatsArgs& a) {
    return cpu::grad_stats<K, T, P>(pool, a);
  }
};

}  // namespace jrn

// The CPU handlers take XLA's intra-op thread pool (see run_chunks).
#define JRN_COMMA ,
JRN_DEFINE_NORM_HANDLERS(Cpu, ::jrn::CpuBackend, ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>(),
                         ::xla::ffi::ThreadPool pool JRN_COMMA, pool JRN_COMMA);
JRN_DEFINE_DIST_HANDLERS(Cpu, ::jrn::CpuBackend, ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>(),
                         ::xla::ffi::ThreadPool pool JRN_COMMA, pool JRN_COMMA);
JRN_DEFINE_FUSED_HANDLERS(Cpu, ::jrn::CpuBackend, ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>(),
                          ::xla::ffi::ThreadPool pool JRN_COMMA, pool JRN_COMMA);

// cpu_isa(): the instruction set the row loops run in (see with_isa).
JRN_NB_MODULE(_jax_rmsnorm_cpu, Cpu,
              m.def("cpu_isa", [] { return ::jrn::cpu::kIsaNames[static_cast<int>(::jrn::cpu::active_isa())]; });)
