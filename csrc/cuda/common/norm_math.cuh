// The normalization's arithmetic on packs: effective scales, y from x and
// the statistics, LayerNorm's shifted one-pass sums, the backward's row sums.
#pragma once

#include <cstdint>

#include "reduce.cuh"
#include "vec_io.cuh"

namespace jrn::cuda {

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
// as floats: acc[0] += sum(g * (x - mean)), with two sums or more acc[1] +=
// sum(g), where g = dy * scale, and with three acc[2] += sum(x - mean)
// (centred rows, bwd/common.cuh). acc[0] and acc[2] are not yet multiplied
// by rstd: the caller does that once a row (grad_sums_scaled), one multiply
// a column fewer. SHIFTED (two sums): acc[0] += sum(g * x) instead, one
// subtraction a column fewer, and grad_sums_scaled takes mean * acc[1] off
// once a row. Sums the caller never reads are dead code.
template <int VEC, bool SHIFTED = false, int SUMS>
__device__ __forceinline__ void add_grad_sums_of(float (&acc)[SUMS], const float (&xv)[VEC], const float (&d)[VEC],
                                                 const float (&s)[VEC], float mean) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float g = d[j] * s[j];
    if constexpr (SHIFTED && SUMS >= 2) {
      acc[0] = fmaf(g, xv[j], acc[0]);
    } else {
      acc[0] += g * (xv[j] - mean);
    }
    if constexpr (SUMS >= 2) acc[1] += g;
    if constexpr (SUMS >= 3) acc[2] += xv[j] - mean;
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

// A thread's sums of add_grad_sums_of as sum(g * xhat) (and sum(xhat)):
// acc[0] (and acc[2]) times rstd (SHIFTED: less mean * sum(g) first).
template <bool SHIFTED = false, int SUMS>
__device__ __forceinline__ void grad_sums_scaled(float (&acc)[SUMS], float rstd, float mean = 0.f) {
  if constexpr (SHIFTED && SUMS >= 2) acc[0] = fmaf(-mean, acc[1], acc[0]);
  acc[0] *= rstd;
  if constexpr (SUMS >= 3) acc[2] *= rstd;
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
    for (int i = 0; i < N; ++i) s[i] += zero_centered ? 1.f : -0.f;  // (+0 would turn a gamma of -0 into +0)
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

// ---- RMSNorm's sum of squares, to the float32 maximum. The square of an
// |x| of 2^64 or more overflows float32, so a row's sum of squares is kept
// as a pair {sum(x^2), sum((x * 2^-80)^2)}: the second is finite for any
// float32 row, and rms_rstd takes it where the first overflowed. Most loops
// over a row take the first alone and each thread then derives its second
// (scaled_sq_of); fwd_slices sums both as it goes. The pair is reduced as
// two sums.
constexpr float kSqScale = 0x1p-80f;
// A thread's scaled sum from its plain one: that times 2^-160 while it is
// finite (flushing to zero where it cannot count next to a row's sum of at
// least 2^128), else `again()`, the thread's values summed again by
// add_scaled_sq (rare: values past 2^64 only).
template <class Again>
__device__ __forceinline__ float scaled_sq_of(float plain, Again again) {
  return plain <= 3.402823466e38f ? plain * kSqScale * kSqScale : again();
}
template <int N>
__device__ __forceinline__ void add_scaled_sq(float& sum, const float (&v)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float t = v[j] * kSqScale;
    sum += t * t;
  }
}
// rstd = rsqrt(ss / n + eps) from a row's pair, ss / n formed by `per_n`
// (a division or a multiplication by 1 / n, as the kernel forms it). Past
// 2^126 the RMS leaves rstd subnormal (y keeps about 22 bits there).
template <class PerN>
__device__ __forceinline__ float rms_rstd(float plain, float scaled, float eps, PerN per_n) {
  if (plain <= 3.402823466e38f) return rsqrtf(per_n(plain) + eps);  // finite (NaN goes on to the pair's other)
  return rsqrtf(per_n(scaled) + eps * kSqScale * kSqScale) * kSqScale;
}
__device__ __forceinline__ float rms_rstd(float plain, float scaled, float eps, int64_t n) {
  return rms_rstd(plain, scaled, eps, [&](float s) { return s / static_cast<float>(n); });
}

// ---- A row's two sums (every kernel reduces both): LayerNorm's around
// `shift` (layer_shift), d = v - shift, {sum(d), sum(d^2)}; RMSNorm's
// sum(v^2) into acc[0] (acc[1] is its scaled twin, scaled_sq_of; `shift`
// unused).
template <NormKind K, int N>
__device__ __forceinline__ void add_row_sums(float (&acc)[2], const float (&v)[N], float shift) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if constexpr (K == NormKind::kLayer) {
      const float d = v[j] - shift;
      acc[1] += d * d;
      acc[0] += d;
    } else {
      acc[0] += v[j] * v[j];
    }
  }
}

// LayerNorm's mean as base + rest: `base` near the row's values (an element
// of the row, or a slice's mean), `rest` the mean of x - base, both kept.
// float32 x is centred in two steps, (x - base) - rest: x - base is exact
// where x lies within a factor of two of base, so rows far from zero lose
// nothing to the mean's rounding (a float32 mean is off by up to half its
// ulp: 0.03 at 1e6, against an ulp of 1e-7 in the centred values of unit
// spread). 16-bit x carry far more rounding of their own: one subtraction.
struct RowMean {
  float base = 0.f, rest = 0.f;
  __device__ __forceinline__ float value() const { return base + rest; }
};
// The first step (float32 x): v -= base; the mean the second step takes
// (centred_mean) is then rest, else the whole mean.
template <class T, int N>
__device__ __forceinline__ void centre_base(float (&v)[N], RowMean m) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] -= m.base;
  }
}
template <class T>
__device__ __forceinline__ float centred_mean(RowMean m) {
  return sizeof(T) == 4 ? m.rest : m.value();
}

// RMSNorm's sum of squares of N columns from `col`, acc[0] += sum(v^2)
// (acc[1] its scaled twin, scaled_sq_of), and their v * scale (scale as load_scale; W < N:
// parameters aligned to W elements only, load_scale_by) in `scaled`, for a
// caller that keeps it (y = rstd * scaled). Other values of acc are left
// alone.
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
// acc[0] += sum(v^2) (acc[1] its scaled twin) and acc[2] = max(acc[2], |v * scale|) for the N
// columns from `col` (scale as add_sq_scaled), reduced with SqMaxOp. rstd > 0
// is common to the row, so max |y| = rstd * acc[2] once all are reduced.
// `scaled` receives v * scale, for a caller that keeps it (y = rstd * scaled).
using SqMaxOp = SumsAbsMaxOp<2>;
template <int N, int W = N, class P>
__device__ __forceinline__ void add_sq_scaled_max(float (&acc)[3], const float (&v)[N], const P* gamma,
                                                  int64_t col, bool zero_centered, float (&scaled)[N]) {
  add_sq_scaled<N, W>(acc, v, gamma, col, zero_centered, scaled);
#pragma unroll
  for (int j = 0; j < N; ++j) acc[2] = max_abs(acc[2], scaled[j]);
}
template <int N, int W = N, class P>
__device__ __forceinline__ void add_sq_scaled_max(float (&acc)[3], const float (&v)[N], const P* gamma,
                                                  int64_t col, bool zero_centered) {
  float scaled[N];
  add_sq_scaled_max<N, W>(acc, v, gamma, col, zero_centered, scaled);
}

// The same from a held pack of gamma (has_gamma: it is given).
template <int N, class P>
__device__ __forceinline__ void add_sq_scaled_max(float (&acc)[3], const float (&v)[N], const Pack<P, N>& gamma,
                                                  bool has_gamma, bool zero_centered) {
  float s[N];
  effective_scale<N>(has_gamma, zero_centered, [&](float (&g)[N]) { unpack(gamma, g); }, s);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    acc[0] += v[j] * v[j];
    acc[2] = max_abs(acc[2], v[j] * s[j]);
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
}  // namespace jrn::cuda
