// The forward's launcher: the FFI arguments as a plan::FwdProblem, its plan
// (csrc/plan), and the plan executed: the kernel instance it names, launched
// with its geometry. Nothing here chooses a kernel.
//
// The families (one header each): decode.cuh (decode-time rows), regs.cuh
// (rows in registers), unaligned.cuh (widths no multiple of a pack),
// slices.cuh (persistent, bulk-copied stages; sm_90+), stream.cuh (the
// rest), two_pass.cuh (wide rows with a residual or given statistics),
// fp8_in.cuh (FP8 x), tiles.cuh (the per-group output with its columnwise
// copy). Current scaling's own passes are in norm_stats.cu and
// fp8_transpose.cu.
//
// This header is instantiated by the forward's units (csrc/cuda/units), one
// for each normalization and type of x, which compile in parallel.
#pragma once

#include <array>
#include <utility>

#include "../common/launch.cuh"
#include "../launch.h"
#include "columns.cuh"
#include "decode.cuh"
#include "fp8_in.cuh"
#include "regs.cuh"
#include "slices.cuh"
#include "stream.cuh"
#include "tiles.cuh"
#include "two_pass.cuh"
#include "unaligned.cuh"

namespace jrn::cuda {
namespace {

template <NormKind K, class T, class P>
plan::FwdProblem fwd_problem(const FwdArgs& a) {
  plan::FwdProblem p;
  p.kind = K;
  p.quant = a.quant;
  p.x = dtype_of<T>();
  p.param = dtype_of<P>();
  p.rows = a.shape.rows;
  p.hidden = a.shape.hidden;
  p.groups = a.shape.groups;
  p.gamma = a.gamma != nullptr;
  p.beta = a.beta != nullptr;
  p.zero_centered = a.zero_centered;
  p.residual = a.residual != nullptr;
  p.residual_f32 = a.residual_f32;
  p.h_f32 = a.h_f32;
  p.given_stats = a.given_stats;
  p.no_output = a.no_output;
  p.fp8_x = a.x_fp8;
  p.x_group = a.x_group;
  p.group_size = a.group_size;
  p.group_scale = a.group_scale;
  p.qt = a.qt != nullptr;
  p.tensors = a.tensors;
  p.x_aligned = aligned16(a.x);
  p.y_aligned = aligned16(a.y);
  p.params_aligned = params_aligned16(a);
  p.residual_aligned = !a.residual || (aligned16(a.residual) && aligned16(a.h));
  p.qt_aligned = !a.qt || aligned16(a.qt);
  return p;
}

inline ffi::Error no_instance(const char* kernel) {
  return ffi::Error::Internal(std::string("jax_rmsnorm: the plan named a configuration of ") + kernel +
                              " that this build does not instantiate");
}

// f(std::integral_constant<E, v>{}) for the value v of E equal to `value`
// among Vs: a run-time choice among compile-time instances.
template <class E, E... Vs, class F>
ffi::Error with_value(E value, F&& f) {
  ffi::Error result = no_instance("a kernel");
  (void)((value == Vs ? (result = f(std::integral_constant<E, Vs>{}), true) : false) || ...);
  return result;
}

// amax (one float per tensor, if wanted) is merged into atomically: zeroed
// first, in the stream.
inline ffi::Error zero_amax(cudaStream_t stream, const FwdArgs& a) {
  if (a.amax == nullptr) return ffi::Error::Success();
  cudaError_t e = cudaMemsetAsync(a.amax, 0, static_cast<size_t>(a.tensors) * sizeof(float), stream);
  return e == cudaSuccess ? ffi::Error::Success() : cuda_error(e, "cudaMemsetAsync(amax)");
}

// ---- fwd_decode: every configuration, those that exist for the key instantiated.

constexpr std::array<plan::DecodeConfig, 36> kDecodeConfigs = [] {
  std::array<plan::DecodeConfig, 36> all{};
  int n = 0;
  for (const int items : {1, 2, 4})
    for (const bool plain : {false, true})
      for (const bool split : {false, true})
        for (const auto r : {plan::DecodeResidual::kNone, plan::DecodeResidual::kSame, plan::DecodeResidual::kAny})
          all[n++] = {items, plain, split, r};
  return all;
}();

template <NormKind K, class T, int VEC, size_t... I>
ffi::Error run_decode(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p, std::index_sequence<I...>) {
  ffi::Error result = no_instance("fwd_decode");
  auto launch = [&](auto c) {
    constexpr plan::DecodeConfig C = decltype(c)::value;
    if constexpr (plan::decode_exists(fwd_key<K, Quant::kNone, T, T, VEC>(), C)) {
      return launch_early(fwd_decode<K, T, VEC, C.items, C.plain, C.split, C.resid>,
                          dim3(static_cast<unsigned>(p.ctas), p.parts), dim3(p.threads), stream, "fwd_decode", a);
    } else {
      return no_instance("fwd_decode");
    }
  };
  (void)((p.decode == kDecodeConfigs[I]
              ? (result = launch(std::integral_constant<plan::DecodeConfig, kDecodeConfigs[I]>{}), true)
              : false) ||
         ...);
  return result;
}

// ---- fwd_regs

template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
ffi::Error run_regs(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p) {
  if (p.ctas > INT32_MAX) return too_many_rows();
  const dim3 grid(static_cast<unsigned>(p.ctas)), block(p.threads, p.rows_per_cta);
  return with_value<plan::RegsVariant, plan::RegsVariant::kBase, plan::RegsVariant::kEarly, plan::RegsVariant::kP32>(
      p.regs, [&](auto v) -> ffi::Error {
        constexpr plan::RegsVariant V = decltype(v)::value;
        if constexpr (plan::regs_exists(fwd_key<K, Q, T, P, VEC, XQ>(), V)) {
          auto kernel = fwd_regs<K, Q, T, P, VEC, XQ, V>;
          if (p.cluster > 1) {
            return launch_clustered(kernel, grid, block, 0, stream, p.cluster, "fwd_regs (clusters)", a, p.cluster);
          }
          kernel<<<grid, block, 0, stream>>>(a, 1);
          return check_launch("fwd_regs");
        } else {
          return no_instance("fwd_regs");
        }
      });
}

// ---- fwd_slices: persistent, as many slots as are resident at once.

inline float inv_hidden(const FwdArgs& a) { return 1.f / static_cast<float>(a.shape.hidden); }

template <NormKind K, Quant Q, class T, class P, int VEC>
ffi::Error run_slices(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p) {
  if (p.threads % 32 != 0) return ffi::Error::Internal("jax_rmsnorm: fwd_slices takes whole warps");
  auto launch = [&](auto v, auto whole) -> ffi::Error {
    constexpr plan::SliceVariant V = decltype(v)::value;
    constexpr bool W = decltype(whole)::value;
    constexpr plan::FwdKey key = fwd_key<K, Q, T, P, VEC>();
    if constexpr (plan::slice_instance_exists(key, V, W)) {
      auto kernel = fwd_slices<K, Q, T, P, VEC, V, W>;
      const size_t smem = static_cast<size_t>(p.smem);
      int resident = 0;
      JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, dim3(p.threads), smem, p.cluster, &resident));
      const int64_t used = std::max<int64_t>(1, std::min<int64_t>(a.shape.rows, resident));
      return launch_clustered(kernel, dim3(static_cast<unsigned>(used * p.cluster)), dim3(p.threads), smem, stream,
                              p.cluster, "fwd_slices", a, used, p.cluster, inv_hidden(a));
    } else {
      return no_instance("fwd_slices");
    }
  };
  using SV = plan::SliceVariant;
  return with_value<SV, SV::kBase, SV::kHeldParams, SV::kHeldParamsYSmem, SV::kClusterRefill, SV::kHoldY,
                    SV::kHoldYCapped, SV::kClusterHoldY, SV::kClusterHoldYCapped, SV::kStagedParams, SV::kStagedHalves,
                    SV::kStagedHalvesHoldY>(p.slice, [&](auto v) {
    return p.whole ? launch(v, std::true_type{}) : launch(v, std::false_type{});
  });
}

// ---- fwd_tiles: the per-group output with its columnwise copy (16-bit x).

template <NormKind K, class T, class P>
ffi::Error run_tiles(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p) {
  if constexpr (sizeof(T) == 2) {
    if (p.ctas > INT32_MAX) return too_many_rows();
    // The block formats' q_t scales by rows into the workspace, then
    // transposed into place (the plan's scales_by_rows; the primitive gives
    // the workspace by the same rule, tile_scales_by_rows).
    if (p.scales_by_rows != (a.qt_scales_ws != nullptr))
      return ffi::Error::Internal("jax_rmsnorm: fwd_tiles: the forward's workspace disagrees with the plan's "
                                  "q_t scales by rows");
    JRN_RETURN_IF_ERROR(launch_clustered(fwd_tiles<K, T, P>, dim3(static_cast<unsigned>(p.ctas)), dim3(p.threads),
                                         static_cast<size_t>(p.smem), stream, p.cluster, "fwd_tiles", a, p.width,
                                         inv_hidden(a)));
    if (!p.scales_by_rows) return ffi::Error::Success();
    return launch_transpose8(stream, a.qt_scales_ws, a.qt_scales, a.tensors, a.rows_per_tensor() / a.group_size,
                             a.shape.hidden);
  } else {
    return no_instance("fwd_tiles");
  }
}

// ---- The two passes: h and the rows' statistics, then y.

template <NormKind K, Quant Q, class T, class P, int VEC>
ffi::Error run_two_pass(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p) {
  if constexpr (plan::two_pass_exists(fwd_key<K, Q, T, P, VEC>())) {
    if (p.ctas > INT32_MAX) return too_many_rows();  // fwd_apply's grid bounds fwd_add_stats' too
    const T* src = static_cast<const T*>(a.x);
    if (!a.given_stats) {
      fwd_add_stats<K, Q, T, P, VEC><<<static_cast<unsigned>(a.shape.rows), kAddStatsThreads, 0, stream>>>(a);
      JRN_RETURN_IF_ERROR(check_launch("fwd_add_stats"));
      src = static_cast<const T*>(a.h);
    }
    fwd_apply<K, Q, T, P, VEC><<<static_cast<unsigned>(p.ctas), p.threads, 0, stream>>>(a, src,
                                                                                       static_cast<int>(p.chunks));
    return check_launch("fwd_apply");
  } else {
    return no_instance("fwd_add_stats + fwd_apply");
  }
}

// The kernels of `vec`-element packs (XQ: x as FP8 codes).
template <NormKind K, Quant Q, class T, class P, int VEC, bool XQ>
ffi::Error run_packs(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p) {
  switch (p.kernel) {
    case plan::FwdKernel::kRegs: return run_regs<K, Q, T, P, VEC, XQ>(stream, a, p);
    case plan::FwdKernel::kDecode:
      if constexpr (Q == Quant::kNone && !XQ && std::is_same_v<P, T>) {
        return run_decode<K, T, VEC>(stream, a, p, std::make_index_sequence<kDecodeConfigs.size()>{});
      }
      break;
    case plan::FwdKernel::kSlices:
      if constexpr (!XQ && Q != Quant::kCurrent) return run_slices<K, Q, T, P, VEC>(stream, a, p);
      break;
    case plan::FwdKernel::kTwoPass:
      if constexpr (!XQ) return run_two_pass<K, Q, T, P, VEC>(stream, a, p);
      break;
    case plan::FwdKernel::kStream:
      // fwd_stream takes every group scale's rule at run time: kBlock runs
      // kGroup's instance.
      if (p.ctas > INT32_MAX) return too_many_rows();
      fwd_stream<K, plan_quant(Q), T, P, VEC, XQ><<<static_cast<unsigned>(p.ctas), p.threads, 0, stream>>>(a);
      return check_launch("fwd_stream");
    default: break;
  }
  return no_instance("the forward");
}

// Executes plan `p` of output Q.
template <NormKind K, Quant Q, class T, class P>
ffi::Error run_fwd(cudaStream_t stream, const FwdArgs& a, const plan::FwdPlan& p) {
  constexpr int kVec = 16 / sizeof(T);
  if constexpr (Q == Quant::kTensor) JRN_RETURN_IF_ERROR(zero_amax(stream, a));
  switch (p.kernel) {
    case plan::FwdKernel::kNone: return ffi::Error::Success();
    case plan::FwdKernel::kFp8Regs:
      if constexpr (Q == Quant::kNone) {
        if (p.ctas > INT32_MAX) return too_many_rows();
        fwd_fp8_regs<K, T, P><<<static_cast<unsigned>(p.ctas), dim3(p.threads, p.rows_per_cta), 0, stream>>>(a);
        return check_launch("fwd_fp8_regs");
      }
      return no_instance("fwd_fp8_regs");
    case plan::FwdKernel::kUnaligned:
      if constexpr (plan::unaligned_exists(Q)) {
        if (p.ctas > INT32_MAX) return too_many_rows();
        fwd_unaligned<K, Q, T, P><<<static_cast<unsigned>(p.ctas), dim3(p.threads, p.rows_per_cta), 0, stream>>>(a);
        return check_launch("fwd_unaligned");
      }
      return no_instance("fwd_unaligned");
    default: break;
  }
  if (p.key.fp8_x) {
    if constexpr (Q == Quant::kNone) {
      return p.key.vec == kVec ? run_packs<K, Q, T, P, kVec, true>(stream, a, p)
                               : run_packs<K, Q, T, P, 1, true>(stream, a, p);
    }
    return no_instance("the FP8-input forward");
  }
  return p.key.vec == kVec ? run_packs<K, Q, T, P, kVec, false>(stream, a, p)
                           : run_packs<K, Q, T, P, 1, false>(stream, a, p);
}

// scale_inv[t] = quant_scale(amax[t]), in place.
__global__ void amax_to_scale_inv(float* amax, int64_t tensors, Fp8 fmt, float ub) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < tensors;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    amax[t] = quant_scale(amax[t], fmt, ub);
}

// Current scaling, in three launches or four: the measuring pass, amax
// turned into scale_inv, the quantizing pass, and the transposed copy where
// the quantizing pass did not write it (plan::CurrentPlan).
template <NormKind K, class T, class P>
ffi::Error run_current(cudaStream_t stream, const FwdArgs& a) {
  const plan::CurrentPlan c = plan::plan_current(fwd_problem<K, T, P>(a), this_device());
  FwdArgs measure = a;
  measure.quant = Quant::kTensor;
  measure.no_output = true;
  if (c.measure == plan::CurrentMeasure::kAmaxRows) {
    JRN_RETURN_IF_ERROR(zero_amax(stream, a));
    if (a.shape.rows > 0) JRN_RETURN_IF_ERROR((launch_fwd_amax<K, T, P>(stream, measure)));
  } else {
    JRN_RETURN_IF_ERROR((run_fwd<K, Quant::kTensor, T, P>(stream, measure, c.measure_pass)));
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((a.tensors + 255) / 256, 1024));
  amax_to_scale_inv<<<blocks, 256, 0, stream>>>(a.amax, a.tensors, a.fp8, a.scale_ub);
  JRN_RETURN_IF_ERROR(check_launch("amax_to_scale_inv"));
  if (a.shape.rows == 0) return ffi::Error::Success();
  switch (c.quantize) {
    case plan::CurrentQuantize::kTiles: return launch_quantize_tiles<K, T, P>(stream, a);
    case plan::CurrentQuantize::kRows: JRN_RETURN_IF_ERROR((launch_quantize_rows<K, T, P>(stream, a))); break;
    case plan::CurrentQuantize::kTensorPass: {
      FwdArgs quantize = a;
      quantize.quant = Quant::kTensor;
      quantize.scale = a.amax;
      quantize.scale_inverted = true;
      quantize.amax = nullptr;
      JRN_RETURN_IF_ERROR((run_fwd<K, Quant::kTensor, T, P>(stream, quantize, c.quantize_pass)));
      break;
    }
  }
  if (!c.transpose) return ffi::Error::Success();
  return launch_transpose8(stream, a.y, a.qt, a.tensors, a.rows_per_tensor(), a.shape.hidden);
}

}  // namespace

template <NormKind K, class T, class P>
ffi::Error launch_fwd(cudaStream_t stream, const FwdArgs& a) {
  if (a.quant == Quant::kCurrent) return run_current<K, T, P>(stream, a);
  const plan::FwdPlan p = plan::plan_fwd(fwd_problem<K, T, P>(a), this_device());
  switch (a.quant) {
    case Quant::kNone: return run_fwd<K, Quant::kNone, T, P>(stream, a, p);
    case Quant::kTensor: return run_fwd<K, Quant::kTensor, T, P>(stream, a, p);
    case Quant::kRow: return run_fwd<K, Quant::kRow, T, P>(stream, a, p);
    case Quant::kGroup:
      if (p.kernel == plan::FwdKernel::kTiles) return run_tiles<K, T, P>(stream, a, p);
      JRN_RETURN_IF_ERROR((a.group_scale == GroupScale::kFloat ? run_fwd<K, Quant::kGroup, T, P>(stream, a, p)
                                                               : run_fwd<K, Quant::kBlock, T, P>(stream, a, p)));
      return p.columns ? launch_columns<K, T, P>(stream, a) : ffi::Error::Success();  // the columnwise copy
    case Quant::kCurrent:
    case Quant::kBlock: break;
  }
  return ffi::Error::InvalidArgument("jax_rmsnorm: unknown quantization mode");
}

}  // namespace jrn::cuda

// Used inside namespace jrn::cuda by the forward's units.
#define JRN_INSTANTIATE_FWD(K, T, P) template ffi::Error launch_fwd<K, T, P>(cudaStream_t, const FwdArgs&);
