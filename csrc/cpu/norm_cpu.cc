// The CPU FFI handlers and the nanobind module that hands them to Python.
// The kernels are in norm_cpu.h, instantiated in norm_cpu_fwd_rms.cc,
// norm_cpu_fwd_layer.cc and norm_cpu_bwd.cc.
#include "../nb_module.h"
#include "../norm_common.h"
#include "../dist_handlers.h"
#include "../norm_fused.h"
#include "norm_cpu.h"
#include "../plan/describe_py.h"

// The CPU handlers take XLA's intra-op thread pool (see run_chunks).
#define JRN_COMMA ,
JRN_DEFINE_NORM_HANDLERS(Cpu, ::jrn::cpu::CpuBackend, ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>(),
                         ::xla::ffi::ThreadPool pool JRN_COMMA, pool JRN_COMMA);
JRN_DEFINE_DIST_HANDLERS(Cpu, ::jrn::cpu::CpuBackend, ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>(),
                         ::xla::ffi::ThreadPool pool JRN_COMMA, pool JRN_COMMA);
JRN_DEFINE_FUSED_HANDLERS(Cpu, ::jrn::cpu::CpuBackend, ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::ThreadPool>(),
                          ::xla::ffi::ThreadPool pool JRN_COMMA, pool JRN_COMMA);

// cpu_isa(): the instruction set the row loops run in (see with_isa);
// describe_*_plan: the CUDA launch plans (csrc/plan), printable anywhere.
JRN_NB_MODULE(_jax_rmsnorm_cpu, Cpu,
              m.def("cpu_isa", [] { return ::jrn::cpu::kIsaNames[static_cast<int>(::jrn::cpu::active_isa())]; });
              ::jrn::plan::bind_describe(m);)
