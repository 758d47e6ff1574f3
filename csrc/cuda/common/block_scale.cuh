// The per-group output's scale rules (GroupScale, norm_fused.h has them) on
// the device: from a group's max |y|, the scale it stores and how its codes
// are made; and the NVFP4 codes (E2M1, two a byte). IEEE float32 arithmetic,
// divisions correctly rounded, denormals kept, as on the CPU.
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "../../norm_fused.h"
#include "fp8.cuh"

namespace jrn::cuda {

// One group's coding: FP8 codes are saturate(y * mul), or all `nan_code`
// (a NaN or infinite block); NVFP4's are E2M1(y / global / value), or all
// +0 where `value` is 0 or the block is not finite.
struct GroupCode {
  float mul = 0.f;      // FP8: what y is multiplied by (kFloat, kPow2: 1 / scale; kE8M0: 2^(127 - e));
                        // NVFP4: (1 / g) * (1 / value), or 0 where the codes take the divisions
  float value = 0.f;    // NVFP4: the block scale's E4M3 value
  bool finite = true;   // the block holds no NaN or infinity
};

// NVFP4's global scale g of a row's tensor (1 for the other rules), with
// what each block's scale takes from it, formed once a row.
struct GroupGlobal {
  float g = 1.f;
  float rcp = 1.f;     // quant_rcp(g)
  bool normal = true;  // |g| within 2^-100..2^100: the first try's reciprocals apply
};

// kE8M0: the scale byte of a block of max |y| `gm` and the code's multiplier.
// For gm normal from 2^-110 up, e8m0_round_up(RN(gm / fp8_max)) is read off
// gm's bits, without the division: fp8_max is 1.75 * 2^8 (E4M3) or 1.75 *
// 2^15 (E5M2), so the quotient's exponent is gm's less 8 or 15, one more
// where gm's mantissa exceeds 1.75's (tools/check_e8m0_scale.py checks every
// such float against the division). The rest take the division.
__device__ __forceinline__ uint8_t mxfp8_scale(float gm, Fp8 fmt, GroupCode& c) {
  const uint32_t bits = __float_as_uint(gm), exp = bits >> 23;  // gm >= 0, or NaN
  if (exp >= 17u && exp <= 254u) {
    const uint32_t e = exp - (fmt == Fp8::kE4M3 ? 8u : 15u) + ((bits & 0x7fffffu) > 0x600000u ? 1u : 0u);
    c.mul = __uint_as_float((254u - e) << 23);  // 2^(127 - e), e in [2, 247]
    return static_cast<uint8_t>(e);
  }
  if (!(gm <= 3.402823466e38f)) {
    c.finite = false;
    return kE8M0Nan;
  }
  const uint8_t e = e8m0_round_up(__float_as_uint(__fdiv_rn(gm, fp8_max(fmt))));
  const int k = 127 - static_cast<int>(e);  // y / 2^(e - 127) = y * 2^k, k in [-127, 127]
  c.mul = k >= -126 ? __uint_as_float(static_cast<uint32_t>(k + 127) << 23) : __uint_as_float(0x00400000u);
  return e;
}

// kNvfp4: the E4M3 scale byte of a block of max |y| `gm` under global scale
// `g`: E4M3(min(max|t| / 6, 448)), t = y / g (the max of the quotients is the
// quotient of the max: the division rounds monotonically).
// Two divisions a block (by every lane of it) are first replaced by q = gm *
// (1 / |g|) * (1 / 6), approximate reciprocals: within 8 ulps of the divisions'
// RN(RN(gm / g) / 6). Every boundary of E4M3's rounding (values of four
// mantissa bits; odd multiples of 2^-10 below 2^-6) has its low 18 bits zero,
// so where q's lie at least 16 ulps from 0 (mod 2^18) q rounds to the same
// byte; elsewhere, and for |g| outside 2^-100..2^100 or gm above 2^27 (or
// NaN), the divisions decide.
__device__ __forceinline__ uint8_t nvfp4_scale(float gm, const GroupGlobal& global, GroupCode& c) {
  const float g = global.g;
  float q = gm * (fabsf(global.rcp) * (1.f / 6.f));
  if (!(global.normal && gm <= 0x1p27f) || ((__float_as_uint(q) + 16u) & 0x3ffe0u) == 0u) {
    const float tmax = fabsf(__fdiv_rn(gm, g));  // g < 0 (an array is not checked): |t| as the CPU takes it
    if (!(tmax <= 3.402823466e38f)) {
      c.finite = false;
      return kE4M3Nan;
    }
    q = __fdiv_rn(tmax, kFp4Max);
  }
  const uint8_t s = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
  c.value = __half2float(__half(__nv_cvt_fp8_to_halfraw(s, __NV_E4M3)));
  // The multiplier of nvfp4_word_near, where it is a normal number (1 / value
  // lies within 2^-9..2^9; |g| within 2^-100..2^100 keeps the product far
  // from float32's limits). Approximate reciprocals (within an ulp each) will
  // do: the codes near a boundary take the divisions.
  c.mul = c.value != 0.f && global.normal ? global.rcp * quant_rcp(c.value) : 0.f;
  return s;
}

// E2M1 of a finite v, saturating at 6, round to nearest even (ties to the
// even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
// 5 -> 4), sign kept (-0 included): the code in the low 4 bits.
__device__ __forceinline__ uint32_t e2m1(float v) {
  const float m = fabsf(v);
  const uint32_t c = m <= 0.25f ? 0u : m < 0.75f ? 1u : m <= 1.25f ? 2u : m < 1.75f ? 3u
                   : m <= 2.5f  ? 4u : m < 3.5f  ? 5u : m <= 5.f    ? 6u : 7u;
  return ((__float_as_uint(v) >> 31) << 3) | c;
}

// The E2M1 code of y / g / value, each division rounded as jax.nn's
// quantizer takes them, for a finite y in a block of value != 0.
__device__ __forceinline__ uint32_t nvfp4_code_divided(float y, float g, float value) {
  return e2m1(__fdiv_rn(__fdiv_rn(y, g), value));
}

// The E2M1 codes of eight values t_j = y[j] * mul (code j in bits 4j..4j+3),
// a stand-in for the quotients y / g / value that two divisions an element
// would make compute-bound: mul = 1 / g * 1 / value with approximate
// reciprocals, so t is within 8 ulps of the divisions' quotient: where t lies
// at least 16 ulps from every boundary of E2M1's rounding (0.25, 0.75, 1.25,
// 1.75, 2.5, 3.5, 5), t and the quotient round to the same code, and any
// rounding of ties will do. The code of m = |t| >= 1 is read from its bits:
// the mantissa rounded to one bit (half up), then exponent and bit, 2 for
// 1.0 up to 7 (saturated) from 5 on. Below 1, where E2M1's step is 0.5 as on
// [1, 2), m takes the code of (m + 1) / 2 (the larger of the two above 1) read
// the same way (its rounding moves it by half an ulp, far inside the guard).
// Each boundary is then a value whose low 22 bits are 2^21 (a one-bit
// mantissa and a half), and the guard's 16 ulps ride on the rounding's
// addend: values less than 16 ulps from a boundary set `near`, for the caller
// to take the divisions. Codes k and k + 4 are packed and saturated as the
// 16-bit halves of one word, which then lands at bits 4k and 4k + 16. No
// branch: a word's codes run straight, and the rare word with a near value is
// coded again. tools/check_nvfp4_codes.py checks this arithmetic on every
// float32 below 16.
__device__ __forceinline__ uint32_t nvfp4_word_near(const float (&y)[8], float mul, bool& near) {
  uint32_t word = 0, low = 0xffffffffu;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t mag[2], bits[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float t = y[k + 4 * e] * mul;
      const float m = fabsf(t);
      const uint32_t x = __float_as_uint(fmaxf(m, fmaf(m, 0.5f, 0.5f))) + 0x200010u;  // 2^21 rounds; 16 ulps of guard
      low = min(low, x & 0x3fffe0u);
      mag[e] = (x >> 22) - 252u;  // 2 for 1.0 ([0.5, 1) gives 0 to 2)
      bits[e] = __float_as_uint(t);
    }
    const uint32_t mags = __vminu2(__byte_perm(mag[0], mag[1], 0x5410), 0x00070007u);      // halves: k, k + 4
    const uint32_t codes = mags | ((__byte_perm(bits[0], bits[1], 0x7632) >> 12) & 0x00080008u);  // signs
    word |= codes << (4 * k);
  }
  near |= low == 0u;
  return word;
}

// The codes of eight values by the divisions (a word with a value near a
// boundary, or a global scale far from 1); out of line: it is rare, and eight
// inlined pairs of divisions at each store made the kernels' code several
// times larger.
struct Nvfp4Word {
  float v[8];
};
static __device__ __noinline__ uint32_t nvfp4_word_divided(Nvfp4Word y, float g, float value) {
  uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) word |= nvfp4_code_divided(y.v[j], g, value) << (4 * j);
  return word;
}

// The NVFP4 codes of N (2, 4 or a multiple of 8) values of y, two a byte (the
// first in the low 4 bits), at byte `dst` (aligned to N / 2 bytes: whole
// words in one store). All +0 where the block is not coded (not finite, or
// scale 0); c.mul == 0 (a global scale far from 1) takes the divisions. Fewer
// than 8 values are coded as a word padded with zeros.
template <int N>
__device__ __forceinline__ void store_nvfp4(uint8_t* dst, const float (&y)[N], const GroupGlobal& global,
                                            const GroupCode& c) {
  static_assert(N == 2 || N == 4 || N % 8 == 0, "store_nvfp4: 2, 4 or whole words of 8 codes");
  constexpr int kWords = (N + 7) / 8;
  const bool coded = c.finite && c.value != 0.f;
  uint32_t words[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    Nvfp4Word yw;
#pragma unroll
    for (int j = 0; j < 8; ++j) yw.v[j] = 8 * w + j < N ? y[8 * w + j] : 0.f;
    bool near = c.mul == 0.f;
    uint32_t word = nvfp4_word_near(yw.v, c.mul, near);
    if (near && coded) word = nvfp4_word_divided(yw, global.g, c.value);
    words[w] = coded ? word : 0u;
  }
  if constexpr (N % 8 == 0) {
    store_words<kWords>(dst, words);
  } else if constexpr (N == 4) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(words[0]);
  } else {
    *dst = static_cast<uint8_t>(words[0]);
  }
}

// The rule a kernel codes by: kRule, a GroupScale fixed at compile time
// (kRule >= 0), else the call's.
template <int kRule = -1>
__device__ __forceinline__ GroupScale rule_of(const FwdArgs& a) {
  return kRule >= 0 ? static_cast<GroupScale>(kRule) : a.group_scale;
}

// The group size of rule kRule, a GroupScale fixed at compile time (kRule >=
// 0: NVFP4's and MXFP8's are constants, block_group_size; the FFI refuses
// others), else the call's.
template <int kRule>
__device__ __forceinline__ int64_t rule_group_size(const FwdArgs& a) {
  constexpr int kFixed = kRule >= 0 ? block_group_size(static_cast<GroupScale>(kRule)) : 0;
  return kFixed > 0 ? kFixed : a.group_size;
}

// f(std::integral_constant<int, kRule>{}) with `rule` as kRule where it is
// NVFP4's or MXFP8's, else kOther: the kernels' loops of a compile-time rule
// (docs/tuning.md, block-rule-loops).
template <int kOther, class F>
__device__ __forceinline__ void with_block_rule(GroupScale rule, F&& f) {
  switch (rule) {
    case GroupScale::kNvfp4: f(std::integral_constant<int, static_cast<int>(GroupScale::kNvfp4)>{}); break;
    case GroupScale::kE8M0: f(std::integral_constant<int, static_cast<int>(GroupScale::kE8M0)>{}); break;
    default: f(std::integral_constant<int, kOther>{}); break;
  }
}

template <int kRule = -1>
__device__ __forceinline__ bool nvfp4_rule(const FwdArgs& a) {
  return rule_of<kRule>(a) == GroupScale::kNvfp4;
}

// The byte that holds the code of element `idx` of the codes at `codes`
// (FP8: one an element; NVFP4: two a byte; rule_of). Kernels take a row's
// once and add its columns' offsets (code_offset) in 32-bit arithmetic.
template <int kRule = -1>
__device__ __forceinline__ uint8_t* codes_at(const FwdArgs& a, void* codes, int64_t idx) {
  return static_cast<uint8_t*>(codes) + (nvfp4_rule<kRule>(a) ? idx / 2 : idx);
}
template <int kRule = -1>
__device__ __forceinline__ int code_offset(const FwdArgs& a, int col) {
  return nvfp4_rule<kRule>(a) ? col / 2 : col;  // col: a multiple of the pack's elements
}

// A group's codes of N values of y at `dst` (codes_at: FP8 or NVFP4 by the
// rule): into q, or the columnwise copy q_t.
template <int N, int kRule = -1>
__device__ __forceinline__ void store_codes_at(const FwdArgs& a, uint8_t* dst, float (&y)[N],
                                               const GroupGlobal& global, const GroupCode& c) {
  if (nvfp4_rule<kRule>(a)) {
    if constexpr (N % 2 == 0) store_nvfp4<N>(dst, y, global, c);  // odd N never: callers pair elements
  } else if (c.finite) {
    store_q<N>(dst, a.fp8, y, c.mul);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = static_cast<uint8_t>(fp8_nan_code(a.fp8));
  }
}
// The same at element `idx` of the codes at `codes`.
template <int N, int kRule = -1>
__device__ __forceinline__ void store_codes(const FwdArgs& a, void* codes, int64_t idx, float (&y)[N],
                                            const GroupGlobal& global, const GroupCode& c) {
  store_codes_at<N, kRule>(a, codes_at<kRule>(a, codes, idx), y, global, c);
}
template <int N, int kRule = -1>
__device__ __forceinline__ void store_group(const FwdArgs& a, int64_t idx, float (&y)[N], const GroupGlobal& global,
                                            const GroupCode& c) {
  store_codes<N, kRule>(a, a.y, idx, y, global, c);
}

// Where scale `index` of group scales `scales` lies: bytes for the block
// formats (E8M0, NVFP4's E4M3), float32 for the others. Kernels take a
// row's once and index it by its columns' groups in 32-bit arithmetic.
template <int kRule = -1>
__device__ __forceinline__ void* scale_at(const FwdArgs& a, void* scales, int64_t index) {
  const GroupScale rule = rule_of<kRule>(a);
  const bool bytes = rule == GroupScale::kE8M0 || rule == GroupScale::kNvfp4;
  return bytes ? static_cast<void*>(static_cast<uint8_t*>(scales) + index)
               : static_cast<void*>(static_cast<float*>(scales) + index);
}

// The scale of group `index` of group scales `scales` (scale_at: q's
// group_scales, q_t's, or a row's from its first group) from its max |y|,
// stored if `store` (one of the threads sharing a group); returns the group's
// coding. kFloat and kPow2 keep float32 scales (quant_scale, then
// pow2_ceil_scale); the block formats a byte each.
template <int kRule = -1>
__device__ __forceinline__ GroupCode group_scale(const FwdArgs& a, void* scales, int64_t index, float gm,
                                                 const GroupGlobal& global, bool store = true) {
  void* const at = scale_at<kRule>(a, scales, index);
  GroupCode c;
  switch (rule_of<kRule>(a)) {
    case GroupScale::kE8M0: {
      const uint8_t e = mxfp8_scale(gm, a.fp8, c);
      if (store) *static_cast<uint8_t*>(at) = e;
      break;
    }
    case GroupScale::kNvfp4: {
      const uint8_t s = nvfp4_scale(gm, global, c);
      if (store) *static_cast<uint8_t*>(at) = s;
      break;
    }
    default: {
      float s = quant_scale(gm, a.fp8, a.scale_ub);
      if (rule_of<kRule>(a) == GroupScale::kPow2) s = pow2_ceil_scale(s);  // then 1 / s is exact
      if (store) *static_cast<float*>(at) = s;
      c.mul = 1.f / s;
    }
  }
  return c;
}
// Where the group scales of q go: bytes for the block formats, else float32.
__device__ __forceinline__ void* group_scales(const FwdArgs& a) {
  return a.block_scales ? static_cast<void*>(a.block_scales) : static_cast<void*>(a.qscale);
}

// NVFP4's global scale for `row` (the kernel reads it per tensor), else 1.
__device__ __forceinline__ GroupGlobal group_global(const FwdArgs& a, int64_t row) {
  GroupGlobal global;
  if (a.group_scale == GroupScale::kNvfp4) {
    global.g = a.scale[a.tensor_of(row)];
    global.rcp = quant_rcp(global.g);
    const float ag = fabsf(global.g);
    global.normal = ag >= 0x1p-100f && ag <= 0x1p100f;
  }
  return global;
}

}  // namespace jrn::cuda
