// Element conversions and vectorized loads and stores: packs of 16 bytes,
// the residual add's loads and stores in either of its dtypes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "base.cuh"

namespace jrn::cuda {

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
// registers, and the unaligned kernels; docs/tuning.md, slice-word-reads).
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
}  // namespace jrn::cuda
