// Device helpers shared by every CUDA kernel of the library: element
// conversions, vectorized loads/stores, row reductions, and error checking.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../norm_common.h"
#include "../norm_fused.h"

namespace jrn::cuda {

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

// ---- Conversions.

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// ---- Vectorized access: N consecutive elements moved with the widest
// aligned accesses (16 bytes when N * sizeof(T) is a multiple of 16).

template <class T, int N>
struct alignas(N * sizeof(T) >= 16 ? 16 : N * sizeof(T)) Pack {
  T v[N];
};

// The two 16-bit T of a 32-bit word (the first in the low half) widened to
// float. bfloat16 by one shift (the low half) and one mask (the high half):
// per element, the compiler's extract-then-shift takes two instructions for
// the high half.
template <class T>
__device__ __forceinline__ void widen2(uint32_t w, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
}
// A pack widened to float: bfloat16 by pairs (widen2); float16 too with
// WORDS, otherwise element by element. Read from shared memory, a float16
// pack taken element by element is two 8-byte loads (LDS.64, sm_90 SASS),
// which at a 16-byte stride across a warp's lanes touch twice the
// wavefronts their bytes need (by the bank arithmetic; not profiled); by
// words it is one LDS.128, as bfloat16's always was. WORDS is asked for
// where that was measured to help (fwd_slices' and bwd_slices' stages and
// staged parameters; see fwd_slices): elsewhere the 16-byte load's four
// registers made kernels spill (fwd_slices' instances held to 40
// registers: 52 bytes, LayerNorm's plain forward of float16 x 14-21% slower
// at 10922x12288 and 5461x24576; the unaligned kernels). RESULTS.md 1ze.
template <bool WORDS = false, class T, int N>
__device__ __forceinline__ void unpack(const Pack<T, N>& pk, float (&f)[N]) {
  if constexpr ((std::is_same_v<T, __nv_bfloat16> || (WORDS && sizeof(T) == 2)) && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      widen2<T>(reinterpret_cast<const uint32_t*>(&pk)[i], f[2 * i], f[2 * i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_float(pk.v[i]);
  }
}

// Loads the pack at p[0..N) as stored, in 16-byte read-only loads (N *
// sizeof(T) a multiple of 16, `p` aligned to 16 bytes).
template <class T, int N>
__device__ __forceinline__ void load_raw(const T* p, Pack<T, N>& pk) {
  static_assert(N * sizeof(T) % 16 == 0, "load_raw: whole 16-byte pieces");
#pragma unroll
  for (int c = 0; c < static_cast<int>(N * sizeof(T) / 16); ++c)
    reinterpret_cast<uint4*>(&pk)[c] = __ldg(reinterpret_cast<const uint4*>(p) + c);
}

// Loads N elements of p[0..N) into f as float. `p` must be aligned to the pack.
template <int N, class T>
__device__ __forceinline__ void load_pack(const T* p, float (&f)[N]) {
  constexpr int kBytes = N * sizeof(T);
  if constexpr (kBytes % 16 == 0) {
    Pack<T, N> pk;
    load_raw(p, pk);
    unpack(pk, f);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_float(p[i]);
  }
}

// Two floats as one 32-bit word of two 16-bit T (the first in the low half,
// as it lies in memory), rounded to nearest even by one paired conversion.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162_raw r = __floats2bfloat162_rn(lo, hi);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2_raw r = __floats2half2_rn(lo, hi);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}

// Stores K 32-bit words with the widest accesses their count allows (`p`
// aligned to them), written as PTX vector stores: in the larger kernels the
// compiler split a uint4 assigned through a pointer into four 4-byte stores
// (seen in the PTX), four times the store instructions; the store
// intrinsics (__stwb) keep the width but compile to a stronger, ordered store.
template <int K>
__device__ __forceinline__ void store_words(void* p, const uint32_t (&w)[K]) {
  if constexpr (K % 4 == 0) {
#pragma unroll
    for (int c = 0; c < K / 4; ++c)
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(static_cast<uint4*>(p) + c),
                   "r"(w[4 * c]), "r"(w[4 * c + 1]), "r"(w[4 * c + 2]), "r"(w[4 * c + 3])
                   : "memory");
  } else if constexpr (K == 2) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
  } else {
#pragma unroll
    for (int c = 0; c < K; ++c) static_cast<uint32_t*>(p)[c] = w[c];
  }
}

template <int N, class T>
__device__ __forceinline__ void store_pack(T* p, const float (&f)[N]) {
  constexpr int kBytes = N * sizeof(T);
  if constexpr (kBytes % 16 == 0 && sizeof(T) == 2) {
    uint32_t w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) w[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
    store_words<N / 2>(p, w);
  } else if constexpr (kBytes % 16 == 0) {
    Pack<T, N> pk;
#pragma unroll
    for (int i = 0; i < N; ++i) pk.v[i] = from_float<T>(f[i]);
#pragma unroll
    for (int c = 0; c < kBytes / 16; ++c)
      reinterpret_cast<uint4*>(p)[c] = reinterpret_cast<const uint4*>(&pk)[c];
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(f[i]);
  }
}

// p[0..N) += v, for float data this kernel itself writes (no read-only path).
template <int N>
__device__ __forceinline__ void add_to(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int c = 0; c < N / 4; ++c) {
      float4 w = reinterpret_cast<float4*>(p)[c];
      w.x += v[4 * c]; w.y += v[4 * c + 1]; w.z += v[4 * c + 2]; w.w += v[4 * c + 3];
      reinterpret_cast<float4*>(p)[c] = w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] += v[i];
  }
}

// Loads N elements at index `idx` of a buffer holding float32 (`f32`) or T.
template <int N, class T>
__device__ __forceinline__ void load_pack_as(const void* base, bool f32, int64_t idx, float (&f)[N]) {
  if (f32) {
    load_pack<N>(static_cast<const float*>(base) + idx, f);
  } else {
    load_pack<N>(static_cast<const T*>(base) + idx, f);
  }
}

// Stores N elements at index `idx` of a float32 (`f32`) or T buffer, and
// rounds f to what was stored. Whole 16-byte packs of a 16-bit T are
// converted once, by pairs, and the stored words widened back.
template <int N, class T>
__device__ __forceinline__ void store_pack_as(void* base, bool f32, int64_t idx, float (&f)[N]) {
  if (f32) {
    store_pack<N>(static_cast<float*>(base) + idx, f);
  } else if constexpr (sizeof(T) == 2 && N * sizeof(T) % 16 == 0) {
    uint32_t w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) w[i] = pack2<T>(f[2 * i], f[2 * i + 1]);
    store_words<N / 2>(static_cast<T*>(base) + idx, w);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) widen2<T>(w[i], f[2 * i], f[2 * i + 1]);
  } else {
    store_pack<N>(static_cast<T*>(base) + idx, f);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_float(from_float<T>(f[i]));
  }
}

// Rounds f to what a float32 (`f32`) or T buffer would store.
template <int N, class T>
__device__ __forceinline__ void round_as(bool f32, float (&f)[N]) {
  if (!f32) {
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = to_float(from_float<T>(f[i]));
  }
}

// The residual add: f += residual[idx, idx + N) of a float32
// (`residual_f32`) or T buffer, in float, not yet rounded to what h stores
// (store_h_as or round_as does that).
template <int N, class T>
__device__ __forceinline__ void add_residual(float (&f)[N], const void* residual, bool residual_f32,
                                             int64_t idx) {
  float r[N];
  load_pack_as<N, T>(residual, residual_f32, idx, r);
#pragma unroll
  for (int j = 0; j < N; ++j) f[j] += r[j];
}

// h = f after add_residual: stored at index `idx` of h (float32 if `h_f32`,
// else T) where h is an output (`h` not null), and f rounded to it either way,
// so that what is normalized is h as stored.
template <int N, class T>
__device__ __forceinline__ void store_h_as(void* h, bool h_f32, int64_t idx, float (&f)[N]) {
  if (h) {
    store_pack_as<N, T>(h, h_f32, idx, f);
  } else {
    round_as<N, T>(h_f32, f);
  }
}

// Four floats as the four FP8 codes of a 32-bit word (the first in the lowest
// byte), saturating at the format's largest finite value, round to nearest
// even, NaN kept.
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ uint32_t fp8x4(const float* f) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(f[0], f[1]), __NV_SATFINITE, KIND);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(f[2], f[3]), __NV_SATFINITE, KIND);
  return lo | (hi << 16);
}

// The four FP8 codes of a 32-bit word (lowest byte first) as floats, exactly.
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void decode_fp8x4_as(uint32_t w, float* f) {
  const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), KIND)));
  const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(w >> 16), KIND)));
  f[0] = lo.x;
  f[1] = lo.y;
  f[2] = hi.x;
  f[3] = hi.y;
}
__device__ __forceinline__ void decode_fp8x4(uint32_t w, Fp8 fmt, float* f) {
  if (fmt == Fp8::kE4M3) {
    decode_fp8x4_as<__NV_E4M3>(w, f);
  } else {
    decode_fp8x4_as<__NV_E5M2>(w, f);
  }
}

// N floats (a multiple of 4) as the FP8 codes of N / 4 words, four to a
// word (fp8x4). The format is chosen once per call, not per pair.
template <int N>
__device__ __forceinline__ void fp8_words(const float (&f)[N], Fp8 fmt, uint32_t (&w)[N / 4]) {
  static_assert(N % 4 == 0, "fp8_words: four codes a word");
  if (fmt == Fp8::kE4M3) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) w[i] = fp8x4<__NV_E4M3>(f + 4 * i);
  } else {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) w[i] = fp8x4<__NV_E5M2>(f + 4 * i);
  }
}

// Stores N floats as FP8 codes, with one access when N is a multiple of 4
// (`p` aligned to N bytes).
template <int N>
__device__ __forceinline__ void store_fp8(uint8_t* p, const float (&f)[N], Fp8 fmt) {
  if constexpr (N % 4 == 0) {
    uint32_t w[N / 4];
    fp8_words<N>(f, fmt, w);
    store_words<N / 4>(p, w);
  } else {
    const __nv_fp8_interpretation_t kind = fmt == Fp8::kE4M3 ? __NV_E4M3 : __NV_E5M2;
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = __nv_cvt_float_to_fp8(f[i], __NV_SATFINITE, kind);
  }
}

// The FP8 output of one pack: per-tensor (q = y * scale), or per row/group
// (q = y * inv, inv = 1 / scale), at `dst` or at element `idx` of y.
template <int VEC>
__device__ __forceinline__ void store_q(uint8_t* dst, Fp8 fmt, float (&y)[VEC], float mul) {
  float q[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) q[j] = y[j] * mul;
  store_fp8<VEC>(dst, q, fmt);
}
template <int VEC>
__device__ __forceinline__ void store_q(const FwdArgs& a, int64_t idx, float (&y)[VEC], float mul) {
  store_q<VEC>(static_cast<uint8_t*>(a.y) + idx, a.fp8, y, mul);
}

// Loads N FP8 codes as floats, exactly (NaN kept), with one access when N is a
// multiple of 4 (`p` aligned to N bytes).
template <int N>
__device__ __forceinline__ void load_fp8(const uint8_t* p, Fp8 fmt, float (&f)[N]) {
  if constexpr (N % 16 == 0) {
#pragma unroll
    for (int c = 0; c < N / 16; ++c) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(p) + c);
      decode_fp8x4(w.x, fmt, f + 16 * c);
      decode_fp8x4(w.y, fmt, f + 16 * c + 4);
      decode_fp8x4(w.z, fmt, f + 16 * c + 8);
      decode_fp8x4(w.w, fmt, f + 16 * c + 12);
    }
  } else if constexpr (N == 8) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
    decode_fp8x4(w.x, fmt, f);
    decode_fp8x4(w.y, fmt, f + 4);
  } else if constexpr (N == 4) {
    decode_fp8x4(__ldg(reinterpret_cast<const unsigned int*>(p)), fmt, f);
  } else {
    const __nv_fp8_interpretation_t kind = fmt == Fp8::kE4M3 ? __NV_E4M3 : __NV_E5M2;
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(p[i], kind)));
  }
}

// max of non-negative floats (|y|) by their bits; a NaN (positive bits above
// infinity's) wins, so it reaches amax and the scales instead of vanishing.
__device__ __forceinline__ float abs_max(float a, float b) {
  return __int_as_float(max(__float_as_int(a), __float_as_int(b)));
}
// 1 / s from the SFU alone (rcp.approx: one MUFU.RCP, within an ulp of the
// quotient, against a dozen instructions and a branch for 1.f / s), for an
// FP8 scale s >= kMinQuantScale (a normal float; infinite s gives 0, as the
// division does). What it multiplies is rounded to FP8, whose step is 2^20
// times the difference.
__device__ __forceinline__ float quant_rcp(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  return r;
}
// max(m, |v|) for a non-negative m, NaN propagated (max.NaN: one FMNMX with
// the |v| operand modifier, where abs_max(m, fabsf(v)) takes two).
__device__ __forceinline__ float max_abs(float m, float v) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v)));
  return r;
}
// Reduction operators, applied to value m of the M reduced at once.
struct SumOp {
  __device__ __forceinline__ float operator()(int, float a, float b) const { return a + b; }
};
struct AbsMaxOp {
  __device__ __forceinline__ float operator()(int, float a, float b) const { return abs_max(a, b); }
};
// Values 0..S-1 summed, the next a maximum of absolute values (one
// reduction for all).
template <int S>
struct SumsAbsMaxOp {
  __device__ __forceinline__ float operator()(int m, float a, float b) const { return m < S ? a + b : abs_max(a, b); }
};
using SumAbsMaxOp = SumsAbsMaxOp<1>;

// *p = abs_max(*p, v) for a non-negative v; *p must start non-negative
// (zeroed in the stream before the kernel). Skips the atomic when *p is
// already at least v (it only grows).
__device__ __forceinline__ void atomic_abs_max(float* p, float v) {
  const int bits = __float_as_int(v);
  if (bits > *reinterpret_cast<volatile int*>(p)) atomicMax(reinterpret_cast<int*>(p), bits);
}
// The same against `seen`, *p as read earlier (load_seen, with the kernel's
// first loads): no load at the end, where the warp would wait for it.
__device__ __forceinline__ float load_seen(const float* p) { return *reinterpret_cast<const volatile float*>(p); }
__device__ __forceinline__ void atomic_abs_max(float* p, float v, float seen) {
  const int bits = __float_as_int(v);
  if (bits > __float_as_int(seen)) atomicMax(reinterpret_cast<int*>(p), bits);
}

// Clusters and bulk copies exist from sm_90 on; the launchers check
// has_clusters() first, so the older architectures' builds never reach the
// helpers below that need them (they trap if they do).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define JRN_NO_CLUSTERS 1
#endif
// The body of such a helper: compiled from sm_90 on, a trap before (bodies
// with preprocessor lines, such as #pragma, keep an #ifdef instead).
#ifdef JRN_NO_CLUSTERS
#define JRN_SM90(...) __trap()
#else
#define JRN_SM90(...) __VA_ARGS__
#endif

// ---- Bulk copies global -> shared (the tensor memory accelerator, sm_90+):
// one thread moves a contiguous run of bytes (a multiple of 16, both ends
// 16-byte aligned); an mbarrier counts the bytes in and completes its phase
// when all have landed. Only kernels launched after has_clusters() use these.

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Initializes `bar` for one arriving thread, visible to the copy engine once
// the CTA has synchronized.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  JRN_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)) : "memory");
           asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
// Arms `bar` for `bytes` and starts copying them from `src` (global) to `dst` (shared).
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
  JRN_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                        "r"(bytes) : "memory"));
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  JRN_SM90(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                        ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory"));
}

// Asks L2 to fetch `bytes` (a multiple of 16, 16-byte aligned) from global
// memory ahead of a later copy; nothing lands in shared memory.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  JRN_SM90(asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory"));
}

// Orders this thread's earlier shared-memory accesses (and, after a barrier,
// the CTA's) before later bulk copies into the same bytes.
__device__ __forceinline__ void fence_async_smem() {
  JRN_SM90(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}
// Waits for the phase of `bar` with the given parity to complete. CLUSTER:
// the phase's bytes were stored by other CTAs of the cluster (st.async), so
// the wait acquires at cluster scope.
#define JRN_TRY_WAIT(SEM)                                                                       \
  "{\n .reg .pred p;\n mbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%1], %2;\n" \
  " selp.u32 %0, 1, 0, p;\n}\n"
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  JRN_SM90(unsigned done = 0; do {
    if constexpr (CLUSTER) {
      asm volatile(JRN_TRY_WAIT(".acquire.cluster") : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } else {
      asm volatile(JRN_TRY_WAIT("") : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    }
  } while (!done));
}
#undef JRN_TRY_WAIT

// Columns of CTA `rank`'s slice of a row of `hidden` columns cut into
// slices of `width` (fwd_slices, bwd_slices): the last ranks' may be short,
// or empty.
__device__ __forceinline__ int64_t slice_columns(int rank, int64_t width, int64_t hidden) {
  return std::max<int64_t>(std::min<int64_t>(width, hidden - rank * width), 0);
}

// Per-thread asynchronous copies global -> shared (cp.async; compiled, like
// the bulk copies, from sm_90 on), for a thread that alone reads what it
// copies: 16 bytes a copy, bypassing L1. The copies issued since the last
// commit form a group; cp_async_wait<N> returns once at most the newest N of
// this thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  JRN_SM90(asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory"));
}
__device__ __forceinline__ void cp_async_commit() { JRN_SM90(asm volatile("cp.async.commit_group;\n" ::: "memory")); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  JRN_SM90(asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"));
}

// Two shared-memory stages filled by bulk copies, for kernels that walk rows:
// thread 0 fills a stage with N contiguous runs of `bytes` each, and every
// thread waits for a stage before reading it. The caller makes sure no thread
// still reads a stage when it is refilled (a barrier in between).
struct BulkStages {
  uint64_t* landed;     // two mbarriers in shared memory: stage st has arrived
  unsigned phases = 0;  // bit st: the parity of stage st's next phase

  // Every thread of the CTA calls it (it holds a barrier).
  __device__ __forceinline__ explicit BulkStages(uint64_t* bars) : landed(bars) {
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      mbar_init(&landed[0]);
      mbar_init(&landed[1]);
    }
    __syncthreads();
  }
  template <int N>
  __device__ __forceinline__ void fill(int st, void* const (&dst)[N], const void* const (&src)[N], unsigned bytes) {
    fence_async_smem();
    mbar_expect(&landed[st], N * bytes);
#pragma unroll
    for (int i = 0; i < N; ++i) bulk_copy(dst[i], src[i], bytes, &landed[st]);
  }
  __device__ __forceinline__ void wait(int st) {
    mbar_wait(&landed[st], (phases >> st) & 1u);
    phases ^= 1u << st;
  }
  // Between a row's reduction and the refill of the stage the previous row
  // was read from: row_sum's barrier orders those reads first, but a CTA of
  // one warp reduces by shuffles alone and takes a barrier here (without it,
  // racecheck reported the refill's bulk writes against the earlier reads;
  // __syncwarp compiles to nothing on sm_90).
  __device__ __forceinline__ void order_refill_after_reduction() const {
    if (blockDim.x <= 32) __syncthreads();
  }
};

// The effective scale of N columns: gamma, 1 + gamma (zero-centred), or 1
// where no gamma is given. `load(s)` fills s with gamma's values, from
// wherever the caller keeps them (global memory, a staged pack).
template <int N, class Load>
__device__ __forceinline__ void effective_scale(bool has_gamma, bool zero_centered, Load&& load, float (&s)[N]) {
  if (!has_gamma) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = 1.f;
    return;
  }
  load(s);
  if (zero_centered) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] += 1.f;
  }
}

// Loads the effective scale (gamma, 1 + gamma, or 1) for N columns.
template <int N, class P>
__device__ __forceinline__ void load_scale(const P* gamma, int64_t col, bool zero_centered,
                                           float (&s)[N]) {
  effective_scale<N>(gamma != nullptr, zero_centered, [&](float (&g)[N]) { load_pack<N>(gamma + col, g); }, s);
}

// The effective scale of N columns whose parameters from `col` are aligned to
// W elements only (W divides N): in N / W loads of W elements.
template <int N, int W, class P>
__device__ __forceinline__ void load_scale_by(const P* gamma, int64_t col, bool zero_centered, float (&s)[N]) {
  effective_scale<N>(gamma != nullptr, zero_centered, [&](float (&g)[N]) {
#pragma unroll
    for (int q = 0; q < N; q += W) {
      auto& part = *reinterpret_cast<float(*)[W]>(g + q);
      if constexpr (W * sizeof(P) % 16 == 0) {
        load_pack<W>(gamma + col + q, part);
      } else {
        unpack(*reinterpret_cast<const Pack<P, W>*>(gamma + col + q), part);  // aligned to its size: one load
      }
    }
  }, s);
}

// The widest loads of parameters at `at` that stay aligned: 4, 2 or 1
// elements of P (the offset of a row's parameters from its 16-byte packs).
template <class P>
__device__ __forceinline__ int param_width(uintptr_t at) {
  return at % (4 * sizeof(P)) == 0 ? 4 : at % (2 * sizeof(P)) == 0 ? 2 : 1;
}

// A row of `hidden` elements from element `start` of a 16-byte aligned
// buffer, cut at its 16-byte boundaries (packs of VEC elements): `head`
// elements before the first, `body` whole packs, `tail` elements after the
// last (fwd_unaligned, bwd_unaligned).
struct RowCut {
  int head, body, tail;
};
// In 32-bit arithmetic with no signed remainders (these rows are narrower
// than 2^31 elements, and only the low bits of `start` count): where
// registers are short, the compiler recomputes the cut at each of its uses.
template <int VEC>
__device__ __forceinline__ RowCut cut_row(int64_t start, int64_t hidden) {
  static_assert((VEC & (VEC - 1)) == 0, "cut_row: VEC is a power of two");
  const int h = static_cast<int>(hidden);
  const int lead = static_cast<int>(static_cast<uint32_t>(-start) & (VEC - 1));  // (VEC - start % VEC) % VEC
  const int head = lead < h ? lead : h;
  const int body = static_cast<int>(static_cast<uint32_t>(h - head) / VEC);
  return {head, body, h - head - body * VEC};
}

// The backward's row sums over a pack of VEC columns, x, dy and the scales
// as floats: acc[0] += sum(g * (x - mean)) and, with two sums, acc[1] +=
// sum(g), where g = dy * scale. acc[0] is not yet multiplied by rstd: the
// caller does that once a row (grad_sums_scaled), one multiply a column
// fewer. SHIFTED (two sums): acc[0] += sum(g * x) instead, one subtraction a
// column fewer, and grad_sums_scaled takes mean * acc[1] off once a row.
template <int VEC, bool SHIFTED = false, int SUMS>
__device__ __forceinline__ void add_grad_sums_of(float (&acc)[SUMS], const float (&xv)[VEC], const float (&d)[VEC],
                                                 const float (&s)[VEC], float mean) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float g = d[j] * s[j];
    if constexpr (SHIFTED && SUMS == 2) {
      acc[0] = fmaf(g, xv[j], acc[0]);
    } else {
      acc[0] += g * (xv[j] - mean);
    }
    if constexpr (SUMS == 2) acc[1] += g;
  }
}

// Where the shifted sums are exact enough: LayerNorm's (RMSNorm has one sum
// and no mean) of 16-bit x. sum(g * x) - mean * sum(g) loses about
// log2(|mean| / std) bits of float32 to cancellation. A 16-bit x is itself
// rounded to 8 (bf16) or 11 (float16) bits of its magnitude, so its centred
// values carry far more error than that: about 2^-9 of |mean| / std, against
// 2^-21 over a thread's columns. float32 x keeps the centred form.
template <NormKind K, class T>
constexpr bool kShiftedSums = K == NormKind::kLayer && sizeof(T) == 2;

// A thread's sums of add_grad_sums_of as sum(g * xhat): acc[0] times rstd
// (SHIFTED: less mean * sum(g) first).
template <bool SHIFTED = false, int SUMS>
__device__ __forceinline__ void grad_sums_scaled(float (&acc)[SUMS], float rstd, float mean = 0.f) {
  if constexpr (SHIFTED && SUMS == 2) acc[0] = fmaf(-mean, acc[1], acc[0]);
  acc[0] *= rstd;
}

// The same over the VEC columns from `col` of x and dy (the row's).
template <int VEC, int SUMS, class T, class P>
__device__ __forceinline__ void add_grad_sums(float (&acc)[SUMS], const T* x, const T* dy, const P* gamma,
                                              int64_t col, bool zero_centered, float mean) {
  float xv[VEC], d[VEC], s[VEC];
  load_pack<VEC>(x + col, xv);
  load_pack<VEC>(dy + col, d);
  load_scale<VEC>(gamma, col, zero_centered, s);
  add_grad_sums_of<VEC>(acc, xv, d, s, mean);
}

// v = (v - mean) * rstd * scale + beta for the N columns from `col`: the
// normalization's last step (gamma/beta null: scale 1 / no shift).
template <int N, class P>
__device__ __forceinline__ void scale_shift(float (&v)[N], float mean, float rstd, const P* gamma,
                                            const P* beta, int64_t col, bool zero_centered) {
  float s[N];
  load_scale<N>(gamma, col, zero_centered, s);
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = (v[j] - mean) * rstd * s[j];
  if (beta) {
    float b[N];
    load_pack<N>(beta + col, b);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] += b[j];
  }
}

// scale_shift with gamma/beta of the N columns already at hand, as stored
// (has_gamma false: scale 1; has_beta false: no shift). Flags, not nullable
// pointers: the callers' `cond ? &pack : nullptr` gave their packs addresses,
// and with 16-bit half or float parameters ptxas kept them on the stack.
template <int N, class P>
__device__ __forceinline__ void scale_shift_packs(float (&v)[N], float mean, float rstd, const Pack<P, N>& gamma,
                                                  bool has_gamma, const Pack<P, N>& beta, bool has_beta,
                                                  bool zero_centered) {
  float s[N];
  if (has_gamma) {
    unpack(gamma, s);
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] += zero_centered ? 1.f : 0.f;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = 1.f;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = (v[j] - mean) * rstd * s[j];
  if (has_beta) {
    float b[N];
    unpack(beta, b);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] += b[j];
  }
}

// scale_shift of a pack of VEC centred elements whose parameters from `col`
// are aligned to W elements, not to the pack: in loads of W elements.
template <int W, int VEC, class P>
__device__ __forceinline__ void scale_shift_by(float (&v)[VEC], float rstd, const P* gamma, const P* beta, int col,
                                               bool zero_centered) {
#pragma unroll
  for (int q = 0; q < VEC; q += W) {
    Pack<P, W> g, b;  // aligned to their size: one load each
    if (gamma) g = *reinterpret_cast<const Pack<P, W>*>(gamma + col + q);
    if (beta) b = *reinterpret_cast<const Pack<P, W>*>(beta + col + q);
    float part[W];
#pragma unroll
    for (int j = 0; j < W; ++j) part[j] = v[q + j];
    scale_shift_packs<W>(part, 0.f, rstd, g, gamma != nullptr, b, beta != nullptr, zero_centered);
#pragma unroll
    for (int j = 0; j < W; ++j) v[q + j] = part[j];
  }
}

// RMSNorm's output where gamma is given and the scale is not zero-centred:
// v = v * rstd * g.
template <int N>
__device__ __forceinline__ void scale_plain(float (&v)[N], float rstd, const float (&g)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = v[j] * rstd * g[j];
}

// LayerNorm's output where gamma and beta are given and the scale is not
// zero-centred, with nothing left to decide: v = (v - mean) * rstd * g + b,
// beta's add in the fma, and for 16-bit x (NARROW) (v - mean) * rstd as one
// fma too (its rounding of mean * rstd is far below y's).
template <bool NARROW, int N>
__device__ __forceinline__ void scale_shift_plain(float (&v)[N], float mean, float rstd, const float (&g)[N],
                                                  const float (&b)[N]) {
  const float shifted = -mean * rstd;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float t = NARROW ? fmaf(v[j], rstd, shifted) : (v[j] - mean) * rstd;
    v[j] = fmaf(t, g[j], b[j]);
  }
}

// ---- LayerNorm's one-pass statistics. Kernels that take sum(x - c) and
// sum((x - c)^2) in the same pass need a shift c near the row's mean, or
// var = E[(x - c)^2] - E[x - c]^2 cancels in float32 (with c = x[0] = 3000
// among N(0, 1) values, rstd was off by 0.2% at hidden 65536 and 4% at
// 262144). c is the median of three of the row's elements, its first,
// middle and last: one outlier channel among them does not move it, and
// rows far from zero keep c near their mean. `elem(col)` gives the row's
// value at `col` as a float.
__device__ __forceinline__ float median3(float a, float b, float c) {
  return fmaxf(fminf(a, b), fminf(fmaxf(a, b), c));
}

template <class Elem>
__device__ __forceinline__ float layer_shift(Elem&& elem, int64_t hidden) {
  return median3(elem(0), elem(hidden / 2), elem(hidden - 1));
}

// A row's sums around `shift` (layer_shift; 0 for RMSNorm), d = v - shift:
// M = 1, sum(d^2); M = 2 (LayerNorm), sum(d) then sum(d^2).
template <int M, int N>
__device__ __forceinline__ void add_shifted_sums(float (&acc)[M], const float (&v)[N], float shift) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float d = v[j] - shift;
    acc[M - 1] += d * d;
    if constexpr (M == 2) acc[0] += d;
  }
}

// RMSNorm's sum of squares of N columns from `col`, acc[0] += sum(v^2), and
// their v * scale (scale as load_scale; W < N: parameters aligned to W
// elements only, load_scale_by) in `scaled`, for a caller that keeps it (y =
// rstd * scaled). Other values of acc are left alone.
template <int N, int W = N, int M, class P>
__device__ __forceinline__ void add_sq_scaled(float (&acc)[M], const float (&v)[N], const P* gamma, int64_t col,
                                              bool zero_centered, float (&scaled)[N]) {
  float s[N];
  if constexpr (W == N) {
    load_scale<N>(gamma, col, zero_centered, s);
  } else {
    load_scale_by<N, W>(gamma, col, zero_centered, s);
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    acc[0] += v[j] * v[j];
    scaled[j] = v[j] * s[j];
  }
}

// RMSNorm's row sums where the row's FP8 scale or amax is found with them:
// acc[0] += sum(v^2), acc[1] = max(acc[1], |v * scale|) for the N columns
// from `col` (scale as add_sq_scaled). rstd > 0 is common to the row, so max
// |y| = rstd * acc[1] once both are reduced (SumAbsMaxOp). `scaled` receives
// v * scale, for a caller that keeps it (y = rstd * scaled).
template <int N, int W = N, class P>
__device__ __forceinline__ void add_sq_scaled_max(float (&acc)[2], const float (&v)[N], const P* gamma,
                                                  int64_t col, bool zero_centered, float (&scaled)[N]) {
  add_sq_scaled<N, W>(acc, v, gamma, col, zero_centered, scaled);
#pragma unroll
  for (int j = 0; j < N; ++j) acc[1] = max_abs(acc[1], scaled[j]);
}
template <int N, int W = N, class P>
__device__ __forceinline__ void add_sq_scaled_max(float (&acc)[2], const float (&v)[N], const P* gamma,
                                                  int64_t col, bool zero_centered) {
  float scaled[N];
  add_sq_scaled_max<N, W>(acc, v, gamma, col, zero_centered, scaled);
}

// The same from a held pack of gamma (has_gamma: it is given).
template <int N, class P>
__device__ __forceinline__ void add_sq_scaled_max(float (&acc)[2], const float (&v)[N], const Pack<P, N>& gamma,
                                                  bool has_gamma, bool zero_centered) {
  float s[N];
  effective_scale<N>(has_gamma, zero_centered, [&](float (&g)[N]) { unpack(gamma, g); }, s);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    acc[0] += v[j] * v[j];
    acc[1] = max_abs(acc[1], v[j] * s[j]);
  }
}

// LayerNorm's mean and m2 = sum((v - mean)^2) from the whole row's
// add_shifted_sums<2>, given m1, the mean of v - shift.
__device__ __forceinline__ float2 shifted_mean_m2_of(const float (&acc)[2], float shift, float m1) {
  return make_float2(shift + m1, fmaxf(acc[1] - acc[0] * m1, 0.f));
}

// The same over `n` values.
__device__ __forceinline__ float2 shifted_mean_m2(const float (&acc)[2], float shift, int64_t n) {
  return shifted_mean_m2_of(acc, shift, acc[0] / static_cast<float>(n));
}

// ---- Reductions over the threads of one row.
//
// A block is (threads_per_row, rows_per_block). Threads of one row are
// consecutive lanes (threads_per_row <= 32) or whole warps (> 32).
// row_sum<M> sums M values at once, so LayerNorm pays one barrier pair for two
// sums. `smem` holds kRowSumSmem floats (one per warp of the block and value).
// Every thread of the block must call it (it may contain __syncthreads).

constexpr int kMaxBlockWarps = 32;
constexpr int kRowSumSmem = kMaxBlockWarps * 2;

// Op (default: sum) combines two values; row_sum<M, AbsMaxOp> takes row maxima.
template <int M, class Op = SumOp>
__device__ __forceinline__ void warp_sum(float (&v)[M], int width, Op op = {}) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if (off < width) {
#pragma unroll
      for (int m = 0; m < M; ++m) v[m] = op(m, v[m], __shfl_xor_sync(0xffffffffu, v[m], off));
    }
  }
}

// LEAD: only the row's first thread (threadIdx.x == 0) gets the total, the
// others keep their partials; one barrier instead of two, for kernels that
// end after the sum (smem is not reused).
// BUTTERFLY (row_sum_wide): the warps' partials are added by a butterfly
// over a warp, lane w taking warp w's, in every warp alike (commuted pairs
// give equal sums, so every thread gets the same bits), instead of a loop
// over the warps in every thread: with 16 warps and two sums about 20
// instructions a thread and row instead of about 100.
// WARPS: the most warps a row may have (M values of each fit kRowSumSmem).
// WHOLE_WARPS: the row is whole warps (at least one), so the shuffles within
// a warp test no width.
template <int M, class Op = SumOp, bool LEAD = false, bool BUTTERFLY = false, int WARPS = kMaxBlockWarps,
          bool WHOLE_WARPS = false>
__device__ __forceinline__ void row_sum(float (&v)[M], float* smem, Op op = {}) {
  static_assert(M * WARPS <= kRowSumSmem, "row_sum: scratch too small");
  static_assert(!(LEAD && BUTTERFLY), "row_sum: LEAD adds in one thread");
  const int tpr = blockDim.x;
  warp_sum<M>(v, WHOLE_WARPS ? 32 : (tpr < 32 ? tpr : 32), op);
  if (tpr <= 32) return;
  const int warps = tpr / 32, lane = threadIdx.x % 32;
  float* mine = smem + threadIdx.y * warps * M;  // this row's warps
  if (lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) mine[(threadIdx.x / 32) * M + m] = v[m];
  }
  __syncthreads();
  if (LEAD && threadIdx.x != 0) return;
  if constexpr (BUTTERFLY) {
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = lane < warps ? mine[lane * M + m] : 0.f;  // 0: identity of every Op
    warp_sum<M>(v, 32, op);
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = mine[m];
      for (int w = 1; w < warps; ++w) s = op(m, s, mine[w * M + m]);  // same order in every thread
      v[m] = s;
    }
  }
  if (!LEAD) __syncthreads();  // smem may be reused right after
}

// For CTAs of many warps (fwd_decode); fwd_slices and bwd_slices, whose
// CTAs are whole warps, take cta_sum below, the same butterfly. Measured
// there, when they took this: same-call A/B on an H100, bf16, us:
// 2048x65536 LayerNorm backward 378 / 376 -> 359 / 357, forward 229 / 230
// -> 225 / 225; 512x262144 backward 413 / 411 -> 384 / 388, forward 246 /
// 246 -> 236 / 236; LayerNorm per-tensor FP8 2048x65536 215 / 212 -> 199 /
// 199; the RMSNorm cells level. Not in
// fwd_regs (up to 32 warps a row): there ptxas then put each of a row's
// loads in a branch of its own with its unpacking, so that they waited for
// each other (LayerNorm 32768x4096 188 -> 238 us).
template <int M, class Op = SumOp, int WARPS = kMaxBlockWarps>
__device__ __forceinline__ void row_sum_wide(float (&v)[M], float* smem, Op op = {}) {
  row_sum<M, Op, false, true, WARPS>(v, smem, op);
}

// row_sum_wide for CTAs of whole warps (fwd_slices, bwd_slices).
template <int M, class Op = SumOp, int WARPS = kMaxBlockWarps>
__device__ __forceinline__ void cta_sum(float (&v)[M], float* smem, Op op = {}) {
  row_sum<M, Op, false, true, WARPS, true>(v, smem, op);
}

template <int M>
__device__ __forceinline__ void row_sum_lead(float (&v)[M], float* smem) {
  row_sum<M, SumOp, true>(v, smem);
}

// ---- Reductions over the CTAs of a thread block cluster (one row split
// across the cluster). Each CTA passes its row_sum result; every thread gets
// the cluster-wide sum, added in rank order (the same in every CTA).
// `xchg` is the caller's __shared__ float[2][M]; consecutive calls alternate
// `parity`, so one cluster barrier per call suffices: a slot is rewritten only
// after the next barrier, which every reader of the old value has passed.
// Before exiting, a kernel must cluster-sync once more (cluster_done) so that
// no CTA leaves while another still reads its shared memory. Kernels that
// walk many rows per cluster (fwd_slices, bwd_slices) take ClusterPush below
// instead; cluster_sum stays for those with one row per cluster, where the
// push was not measured.


template <int M, class Op = SumOp>
__device__ __forceinline__ void cluster_sum(float (&v)[M], float (*xchg)[M], int parity, Op op = {}) {
#ifdef JRN_NO_CLUSTERS
  __trap();
#else
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) xchg[parity][m] = v[m];
  }
  cluster.sync();
  // Lane q reads rank q's partials; a butterfly over the warp adds them in the
  // same order in every warp of every CTA.
  const int lane = threadIdx.x % 32;
  const float* remote = lane < static_cast<int>(cluster.num_blocks())
                            ? cluster.map_shared_rank(&xchg[parity][0], lane)
                            : nullptr;
#pragma unroll
  for (int m = 0; m < M; ++m) v[m] = remote ? remote[m] : 0.f;  // 0: identity of sum and max
  warp_sum<M>(v, 32, op);
#endif
}

constexpr int kMaxCluster = 16;  // CTAs of a cluster at most (a non-portable size on sm_90)

// The same cluster-wide sum with the partials pushed instead of pulled:
// each CTA stores its M partials into slot `rank` of every CTA's exchange
// (st.async from lane q to rank q, which counts the bytes on the receiving
// CTA's mbarrier), and each CTA's threads wait on their own mbarrier and read the
// slots from their own shared memory. No cluster barrier a row and no remote
// loads. `parity` alternates as for cluster_sum: a CTA pushes into buffer p
// again only after the exchange of buffer p ^ 1, which takes every CTA's
// push of it, and each CTA pushes after the CTA barrier of its row_sum,
// which follows its threads' reads of the buffer. Every thread of the
// cluster constructs it (it holds a cluster barrier, so that no push lands
// before the mbarriers are initialized); a kernel using it ends with
// cluster_done(), as with cluster_sum. Against cluster_sum in the persistent
// kernels (H100, bf16, same-call A/B, us): 512x262144 backward RMSNorm 455 ->
// 369, LayerNorm 548 -> 415; 2048x65536 backward 381 -> 349 and 419 -> 379.
template <int M>
struct ClusterPush {
  float (*slots)[kMaxCluster][M];  // __shared__ float[2][kMaxCluster][M]
  uint64_t* bars;                  // __shared__ uint64_t[2]
  int size, rank;
  unsigned phases = 0;  // bit p: the parity of buffer p's next phase

  __device__ __forceinline__ ClusterPush(float (*s)[kMaxCluster][M], uint64_t* b, int cluster_size, int my_rank)
      : slots(s), bars(b), size(cluster_size), rank(my_rank) {
    if (size <= 1) return;
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      mbar_init(&bars[0]);
      mbar_init(&bars[1]);
    }
    JRN_SM90(cooperative_groups::this_cluster().sync());
  }
  // The two halves of sum(), for callers that combine the slots their own
  // way (LayerNorm's slice means in fwd_slices). push: this CTA's M partials
  // to every CTA of the cluster.
  __device__ __forceinline__ void push(const float (&v)[M], int parity) {
#ifdef JRN_NO_CLUSTERS
    __trap();
#else
    // Lane q of the first warp pushes to rank q in one store (M = 2: 8
    // bytes; M = 4: 16, the slots aligned to 16 bytes).
    static_assert(M == 1 || M == 2 || M == 4, "ClusterPush: one, two or four values a row");
    if (threadIdx.y == 0 && threadIdx.x < size) {
      if (threadIdx.x == 0) mbar_expect(&bars[parity], static_cast<unsigned>(size * M * sizeof(float)));
      const int q = static_cast<int>(threadIdx.x);
      unsigned rslot, rbar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rslot) : "r"(smem_u32(&slots[parity][rank][0])), "r"(q));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(smem_u32(&bars[parity])), "r"(q));
      if constexpr (M == 1) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
                     ::"r"(rslot), "r"(__float_as_uint(v[0])), "r"(rbar) : "memory");
      } else if constexpr (M == 2) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n"
                     ::"r"(rslot), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[M - 1])), "r"(rbar) : "memory");
      } else {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
                     ::"r"(rslot), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])),
                     "r"(__float_as_uint(v[3])), "r"(rbar) : "memory");
      }
    }
#endif
  }
  // take: waits for every CTA's push of buffer `parity`; lane q of each warp
  // gets rank q's partials (0 for lanes past the cluster).
  __device__ __forceinline__ void take(float (&v)[M], int parity) {
    mbar_wait<true>(&bars[parity], (phases >> parity) & 1u);
    phases ^= 1u << parity;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = lane < size ? slots[parity][lane][m] : 0.f;
  }
  // Every thread gets the cluster-wide result of op over the CTAs' partials
  // v, added by a butterfly in the same order in every warp of every CTA (as
  // cluster_sum does). A cluster of one leaves v as it is.
  template <class Op = SumOp>
  __device__ __forceinline__ void sum(float (&v)[M], int parity, Op op = {}) {
    if (size <= 1) return;
    push(v, parity);
    take(v, parity);
    warp_sum<M>(v, 32, op);
  }
};

__device__ __forceinline__ void cluster_done() {
  JRN_SM90(cooperative_groups::this_cluster().sync());
}

// The CTAs of this CTA's cluster (1 without clusters).
__device__ __forceinline__ int cluster_ctas() {
#ifdef JRN_NO_CLUSTERS
  return 1;
#else
  return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
#endif
}

// An attribute of the current device, asked once per device (-1 where it
// cannot be read).
template <cudaDeviceAttr A>
inline int device_attribute() {
  static int cache[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return -1;
  if (cache[dev] == 0) {
    int v = 0;
    cache[dev] = cudaDeviceGetAttribute(&v, A, dev) == cudaSuccess && v > 0 ? v : -1;
  }
  return cache[dev];
}

// Whether the current device runs thread block clusters (compute capability
// 9.0 or newer).
inline bool has_clusters() { return device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9; }

// A launch configuration with thread block clusters of `cluster` CTAs along
// x and, with `early`, programmatic dependent launch (launch_early_clustered
// below): the one place that builds the launch attributes.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2] = {};
  ClusterLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, unsigned cluster, bool early = false) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (early) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    // A "cluster" of one CTA is a plain launch: with the cluster attribute the
    // occupancy query for clusters answered 8 CTAs per SM for bwd_slices with
    // 32-thread CTAs at hidden 1024 on an H100, where registers allow 16.
    if (cluster > 1) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs++].val.clusterDim = {cluster, 1, 1};
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // cfg points into attr
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Lets `kernel` run with clusters of `cluster` CTAs and `smem` bytes of
// dynamic shared memory (limits above the defaults must be asked for). The
// limit belongs to the kernel, not to a launch, so it is only ever raised:
// lowered for a launch with less shared memory, it would refuse a later
// launch with more whose configuration co_resident_clusters has cached
// ("invalid argument"; LayerNorm's bwd_unaligned at hidden 5000, then 4100,
// then 5000 again).
template <class... Params>
ffi::Error allow_cluster_launch(void (*kernel)(Params...), size_t smem, unsigned cluster) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, std::pair<size_t, bool>> allowed;  // smem, non-portable clusters
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_error(e, "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto& [most, non_portable] = allowed[{dev, reinterpret_cast<const void*>(kernel)}];
  if (cluster > 8 && !non_portable) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
    non_portable = true;
  }
  if (smem > 32 * 1024 && smem > most) {  // opt in well before 48 KB: static shared memory adds to it
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    most = smem;
  }
  return ffi::Error::Success();
}

// Launches `kernel` with thread block clusters of `cluster` CTAs along x.
template <class... Params, class... Args>
ffi::Error launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, unsigned cluster, const char* name, Args&&... args) {
  JRN_RETURN_IF_ERROR(allow_cluster_launch(kernel, smem, cluster));
  ClusterLaunch launch(grid, block, smem, stream, cluster);
  cudaError_t e = cudaLaunchKernelEx(&launch.cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) return cuda_error(e, name);
  return check_launch(name);
}

// ---- Programmatic dependent launch (compute capability 9.0 and newer).
// A kernel launched by launch_early may be scheduled while the kernel before
// it in the stream (or in XLA's CUDA graph) is still finishing, so a launch's
// start-up overlaps the previous kernel's tail. Such a kernel must call
// early_launch_wait() before it touches memory that kernel writes: it returns
// once the previous grid has completed and its writes are visible. A kernel
// that reads none of it may run on and call it only before it ends, so that
// its own completion still implies the previous kernel's (bwd_columns).
// Without the launch attribute (an older GPU, or JAX_RMSNORM_PDL=0) both
// instructions return at once.

// Lets the next kernel, where launch_early launched it, be scheduled now,
// while this one runs (without waiting for anything itself).
__device__ __forceinline__ void early_launch_now() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits for the previous grid (see above), then lets the next one be
// scheduled at once (early_launch_now).
__device__ __forceinline__ void early_launch_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  early_launch_now();
}

// Whether launch_early asks for the overlap: on compute capability 9.0 and
// newer (the devices has_clusters() names), unless JAX_RMSNORM_PDL=0 is in
// the environment (read once).
inline bool early_launch_enabled() {
  static const bool allowed = [] {
    const char* v = std::getenv("JAX_RMSNORM_PDL");
    return !(v && std::string(v) == "0");
  }();
  return allowed && has_clusters();
}

// Launches `kernel`, which calls early_launch_wait() as described above, with
// programmatic dependent launch where early_launch_enabled().
// Measured in XLA's CUDA graphs on an H100 (benchmarks/chain_trace.py, chains
// of 50 norms, bf16, 1-256 rows of 4096 and 8192): the gap between one of our
// decode-time kernels and the next of ours went from 0.26-0.29 us to
// 0.06-0.13 us. Between ours and XLA's kernels (--mix) it was 0.06-0.10 us
// with or without the attribute: XLA did not start its kernel early after ours,
// nor ours early after its own.
// With `cluster` > 1 (a device with clusters, at most 8, dividing grid.x) the
// launch also takes thread block clusters of that many CTAs along x.
template <class... Params, class... Args>
ffi::Error launch_early_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned cluster,
                                  cudaStream_t stream, const char* name, Args&&... args) {
  ClusterLaunch launch(grid, block, 0, stream, cluster, early_launch_enabled());
  cudaError_t e = cudaLaunchKernelEx(&launch.cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) return cuda_error(e, name);
  return check_launch(name);
}

template <class... Params, class... Args>
ffi::Error launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* name,
                        Args&&... args) {
  return launch_early_clustered(kernel, grid, block, 1, stream, name, std::forward<Args>(args)...);
}

// How many clusters of `kernel` (launched as launch_clustered would) fit on
// the current device at once. Asked once per device and configuration.
template <class... Params>
ffi::Error co_resident_clusters(void (*kernel)(Params...), dim3 block, size_t smem, unsigned cluster,
                                int* count) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, unsigned, size_t, unsigned>, int> cache;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_error(e, "cudaGetDevice");
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), block.x * block.y, smem, cluster);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *count = it->second;
    return ffi::Error::Success();
  }
  JRN_RETURN_IF_ERROR(allow_cluster_launch(kernel, smem, cluster));
  ClusterLaunch launch(dim3(cluster), block, smem, nullptr, cluster);
  int n = 0;
  if (cluster > 1) {
    e = cudaOccupancyMaxActiveClusters(&n, kernel, &launch.cfg);
    if (e != cudaSuccess) return cuda_error(e, "cudaOccupancyMaxActiveClusters");
  } else {
    int per_sm = 0, sms = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(block.x * block.y), smem);
    if (e != cudaSuccess) return cuda_error(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return cuda_error(e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    n = per_sm * sms;
  }
  if (n < 1) return ffi::Error::Internal("jax_rmsnorm: a kernel configuration does not fit on this GPU");
  cache.emplace(key, n);
  *count = n;
  return ffi::Error::Success();
}

inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The largest power of two at most v (v >= 1).
inline int pow2_floor(int64_t v) {
  int p = 1;
  while (2 * static_cast<int64_t>(p) <= v) p <<= 1;
  return p;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads for a row (or a CTA's slice of one) of `packs` packs, `items` a
// thread: a power of two up to a warp (warp_sum's shuffles), whole warps
// beyond, so that few threads are left without columns. A cluster's CTAs
// take row_threads(ceil_div(packs, cluster), items) each: equal slices
// (fwd_slices, bwd_slices; CTA `rank` holds packs [rank, rank + 1) *
// items * threads).
inline int row_threads(int64_t packs, int items) {
  const int64_t per_thread = ceil_div(packs, items);
  return per_thread <= 32 ? pow2_ceil(per_thread) : static_cast<int>(ceil_div(per_thread, 32) * 32);
}

// Whether a row of `hidden` elements, `packs` packs of `vec`, fills `cluster`
// CTAs of `tpr` threads of `items` packs exactly: every thread's every pack
// lies inside the row (the slice kernels' WHOLE instances).
inline bool fills_threads(int64_t packs, int vec, int64_t hidden, int cluster, int tpr, int items) {
  return static_cast<int64_t>(cluster) * tpr * items == packs && packs * vec == hidden;
}

inline ffi::Error too_many_rows() { return ffi::Error::InvalidArgument("jax_rmsnorm: too many rows"); }

// Rows of `tpr` threads a CTA: as many as fit `cta_threads` threads, at least one.
inline int rows_per_cta(int tpr, int cta_threads) { return tpr >= cta_threads ? 1 : cta_threads / tpr; }

// The launch of rows of `tpr` threads each (threadIdx.x), rows_per_cta of
// them a CTA (threadIdx.y).
inline ffi::Error row_grid(int64_t rows, int tpr, int cta_threads, dim3* grid, dim3* block) {
  const int rpb = rows_per_cta(tpr, cta_threads);
  const int64_t blocks = ceil_div(rows, rpb);
  if (blocks > INT32_MAX) return too_many_rows();
  *grid = dim3(static_cast<unsigned>(blocks));
  *block = dim3(tpr, rpb);
  return ffi::Error::Success();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// gamma and beta (those given) 16-byte aligned, as the kernels' packs of
// parameters need.
inline bool params_aligned16(const FwdArgs& a) {
  return (!a.gamma || aligned16(a.gamma)) && (!a.beta || aligned16(a.beta));
}

}  // namespace jrn::cuda
