// Basics every CUDA file uses: FFI errors from CUDA calls and launches,
// run-time values among a few as compile-time constants, held registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>
#include <utility>

#include "../../norm_common.h"
#include "../../norm_fused.h"
#include "../../plan/plan.h"

namespace jrn::cuda {

// Launch geometry's integer helpers (plan.h), here as in the plans.
using plan::ceil_div;
using plan::fills_threads;
using plan::pow2_ceil;
using plan::pow2_floor;
using plan::row_threads;
using plan::rows_per_cta;

// The plans' name of element type T.
template <class T>
constexpr plan::DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  return std::is_same_v<T, float> ? plan::DType::kF32 : std::is_same_v<T, __half> ? plan::DType::kF16 : plan::DType::kBF16;
}

template <int N>
using Int = std::integral_constant<int, N>;

// f(Int<K>{}) for the first K of the list equal to n, else for the last: a
// value known at run time among a few, each its own instance of f (a
// template's parameter, a kernel's), e.g. with_constant<4, 2, 1>(width, f).
template <int K, int... Ks, class F>
__host__ __device__ __forceinline__ decltype(auto) with_constant(int n, F&& f) {
  if constexpr (sizeof...(Ks) == 0) {
    return f(Int<K>{});
  } else {
    if (n == K) return f(Int<K>{});
    return with_constant<Ks...>(n, f);
  }
}

// ---- Error checking: every CUDA call and launch is turned into an ffi::Error.

inline ffi::Error cuda_error(cudaError_t err, const char* what) {
  return ffi::Error::Internal(std::string("jax_rmsnorm: ") + what + ": " + cudaGetErrorString(err));
}

// Checks the launch that just happened (configuration errors surface here).
inline ffi::Error check_launch(const char* kernel) {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? ffi::Error::Success() : cuda_error(err, kernel);
}

#define JRN_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::xla::ffi::Error jrn_err_ = (expr);       \
    if (jrn_err_.failure()) return jrn_err_;   \
  } while (0)

// The value of p, which the compiler must now keep in a register: it can no
// longer re-derive p from constants at each use (what it did with a row's
// parameter pointers in fwd_slices, a dozen instructions per use).
template <class T>
__device__ __forceinline__ T* held(T* p) {
  asm("" : "+l"(p));
  return p;
}
}  // namespace jrn::cuda
