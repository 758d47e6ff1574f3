// FP8 codes: packing floats into codes (saturating), decoding them, and
// the quantized store of a pack.
#pragma once

#include <cuda_fp8.h>

#include "vec_io.cuh"

namespace jrn::cuda {

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
}  // namespace jrn::cuda
