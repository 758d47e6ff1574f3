// The CPU kernels for RMSNorm/LayerNorm forward and backward. Plain C++:
// elementwise math in float32, row sums and dgamma/dbeta accumulated in
// float64 (cheap on a CPU, and accurate for rows of any length), in a fixed
// order, so results are reproducible. On x86-64 the row loops run in AVX2
// where the CPU has it (with_isa), with the same results.
//
// The entry points at the end are instantiated in
// norm_cpu_fwd_rms.cc, norm_cpu_fwd_layer.cc and norm_cpu_bwd.cc, and called
// by the handlers in norm_cpu.cc: files that compile in parallel (as one
// file the CPU module took 76 s, the longest compile of the whole build).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>


#include "../norm_common.h"
#include "../dist_handlers.h"
#include "../norm_fused.h"

namespace jrn::cpu {

// c ? a : b by masks, for the conversions below: GCC turns a conditional
// whose arm holds a floating-point operation (one that could trap) into a
// branch, and a loop with a branch does not vectorize.
inline uint32_t pick(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

// 16-bit float storage types with round-to-nearest-even conversions. The
// conversions have no branches (`pick` chooses among the cases), so that the
// loops over a row vectorize; every input gives the bits the branching
// versions they replaced gave (checked over all inputs). No floating-point
// operation takes a float32 subnormal that matters: those would read as zero
// where a caller's thread flushes denormals.
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float to_float(float v) { return v; }
inline float to_float(bf16_t v) { return bits_float(static_cast<uint32_t>(v.bits) << 16); }
inline float to_float(f16_t v) {
  // The exponent and mantissa moved to a float32's places: a normal value
  // needs its exponent rebiased (+112), a subnormal one is its mantissa times
  // 2^-24, infinity and NaN take an all-ones exponent.
  const uint32_t sign = (v.bits & 0x8000u) << 16, mag = (v.bits & 0x7fffu) << 13;
  const uint32_t normal = mag + (112u << 23);
  const uint32_t subnormal = float_bits(static_cast<float>(v.bits & 0x3ffu) * 0x1p-24f);
  const uint32_t finite = pick(mag < (1u << 23), subnormal, normal);
  return bits_float(sign | pick(mag >= (0x1fu << 23), 0x7f800000u | mag, finite));
}

template <class T> T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }
template <> inline bf16_t from_float<bf16_t>(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // ties to even
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  // A select, not a branch: the loops that store rows vectorize.
  return bf16_t{static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}
template <> inline f16_t from_float<f16_t>(float f) {
  const uint32_t u = float_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  // Normal: the mantissa rounded to 10 bits (ties to even), the exponent
  // rebiased. Subnormal or zero (below 2^-14): the magnitude in steps of
  // 2^-24 plus 2^23, whose low bits are it rounded to an integer (ties to
  // even). At or above 65520 infinity; NaN stays NaN.
  const uint32_t normal = ((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10);
  const uint32_t subnormal = float_bits(bits_float(a) * 0x1p24f + 0x1p23f) - float_bits(0x1p23f);
  const uint32_t finite = pick(a >= 0x477ff000u, 0x7c00u, pick(a < 0x38800000u, subnormal, normal));
  const uint32_t code = pick(a > 0x7f800000u, 0x7e00u, finite);
  return f16_t{static_cast<uint16_t>(sign | code)};
}

// float -> a small float format (FP8, or E2M1 for NVFP4's codes) of kMan
// mantissa bits, exponent bias kBias and kBits bits, saturating at its largest
// finite value (float32 bits `max_bits`), round to nearest even; NaN gives
// `nan_code`. No branches, so that the loops over a row vectorize: the
// saturation is a min of the magnitudes' bits (infinity's are above the
// largest finite value's); a normal result drops mantissa bits with a carry
// that rounds ties to even; a subnormal one is the magnitude in steps of the
// smallest subnormal, rounded to an integer by adding and taking off 2^23
// (exact, and ties to even in the default rounding mode). Every float32 input
// gives the bits the branching version (nearbyint for subnormals) gave, for
// both FP8 formats.
template <int kMan, int kBias, int kBits>
inline uint8_t to_small_float(float v, uint32_t max_bits, uint32_t nan_code) {
  constexpr int shift = 23 - kMan;
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(127 - kBias + 1) << 23;
  const float subnormal_steps = bits_float(static_cast<uint32_t>(127 + kBias - 1 + kMan) << 23);  // 1 / the smallest subnormal
  const uint32_t u = float_bits(v), sign = (u >> 31) << (kBits - 1), abs_bits = u & 0x7fffffffu;
  const uint32_t a = std::min(abs_bits, max_bits);
  const uint32_t normal =
      ((a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift) - (static_cast<uint32_t>(127 - kBias) << kMan);
  const uint32_t subnormal = float_bits(bits_float(a) * subnormal_steps + 0x1p23f) - float_bits(0x1p23f);
  const uint32_t finite = pick(a < min_normal_bits, subnormal, normal);
  const uint32_t code = pick(abs_bits > 0x7f800000u, nan_code, finite);
  return static_cast<uint8_t>(sign | code);
}

// float -> FP8 (float8_e4m3fn or float8_e5m2), as to_small_float.
template <Fp8 F>
inline uint8_t to_fp8(float v) {
  constexpr bool e4m3 = F == Fp8::kE4M3;
  return to_small_float<e4m3 ? 3 : 2, e4m3 ? 7 : 15, 8>(v, float_bits(fp8_max(F)), fp8_nan_code(F));
}

// float -> float4_e2m1fn (NVFP4's codes, one a byte: sign in bit 3),
// saturating at 6. The format has no NaN: callers give it none.
inline uint8_t to_fp4(float v) { return to_small_float<1, 1, 4>(v, float_bits(kFp4Max), 0u); }

// q[i] = to_fp8(v[i] * mul) for i in [0, n).
template <Fp8 F>
inline void quantize_n(const float* v, int64_t n, float mul, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = to_fp8<F>(v[i] * mul);
}
inline void quantize_n(const float* v, int64_t n, float mul, Fp8 fmt, uint8_t* q) {
  if (fmt == Fp8::kE4M3) {
    quantize_n<Fp8::kE4M3>(v, n, mul, q);
  } else {
    quantize_n<Fp8::kE5M2>(v, n, mul, q);
  }
}

// max |v[i]| over i in [0, n), NaN if any is: the magnitudes' bits compared
// as integers (their order is the floats' order, and every NaN's is above
// infinity's), a reduction that vectorizes.
inline float abs_max(const float* v, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, float_bits(v[i]) & 0x7fffffffu);
  return bits_float(m);
}

// FP8 (float8_e4m3fn or float8_e5m2) code -> float, exactly.
inline float from_fp8(uint8_t b, Fp8 fmt) {
  const bool e4m3 = fmt == Fp8::kE4M3;
  const int man_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int e = (b & 0x7f) >> man_bits, m = b & ((1 << man_bits) - 1);
  const float sign = (b & 0x80) ? -1.f : 1.f;
  if (e4m3 ? (e == 15 && m == 7) : (e == 31 && m != 0)) return std::nanf("");
  if (!e4m3 && e == 31) return sign * std::numeric_limits<float>::infinity();
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), 1 - bias - man_bits);  // subnormal
  return sign * std::ldexp(static_cast<float>(m + (1 << man_bits)), e - bias - man_bits);
}

// ---- Block-scaled outputs (GroupScale::kE8M0, kNvfp4; norm_fused.h has
// the rules), in IEEE float32 arithmetic with denormals kept: XLA's CPU
// threads flush denormal results to zero and read denormal operands as
// zero, so every quotient whose float32 result or operand may be subnormal
// is taken in double from the operands' exact values and rounded to float32
// once (a quotient of two floats rounded to double and then to float is the
// correctly rounded float quotient).

// The exact value of float32 bits, denormals included.
inline double f32_exact(uint32_t bits) {
  const uint32_t a = bits & 0x7fffffffu;
  const double m = a < 0x00800000u ? static_cast<double>(a) * 0x1p-149 : static_cast<double>(bits_float(a));
  return bits >> 31 ? -m : m;
}

// d rounded to float32 (to nearest even), as bits, subnormals included.
inline uint32_t f32_rounded(double d) {
  const uint32_t sign = std::signbit(d) ? 0x80000000u : 0u;
  const double m = std::fabs(d);
  if (m < 0x1p-126) return sign | static_cast<uint32_t>(std::nearbyint(m * 0x1p149));  // exact product
  return sign | float_bits(static_cast<float>(m));
}

// The float32 quotient (bits) of float32 bits `a` by the exact value `b`.
inline uint32_t f32_div(uint32_t a, double b) { return f32_rounded(f32_exact(a) / b); }

// The blocks' fast paths: where the only subnormal operands or results of
// the float32 arithmetic are ones whose code is a zero of their sign either
// way, plain float32 products and quotients give the exact paths' codes bit
// for bit, subnormals flushed or not. (Under XLA's flushing threads y itself
// is never subnormal; the bounds below hold where a thread does not flush.)

// MXFP8: one block of n values of y into FP8 codes `q` and its E8M0 scale.
// The codes are y * 2^(127 - e) rounded to FP8. Fast path (e >= 19; a finite
// max gives e <= 247, so 2^(127 - e) is a normal float from 2^-120 to 2^108):
// the product is exact where it is normal; a subnormal y or product lies
// below 2^-18, which rounds to a zero of y's sign in both formats (E5M2's
// least subnormal is 2^-16).
inline void quantize_mxfp8(const float* y, int64_t n, Fp8 fmt, uint8_t* q, uint8_t* scale) {
  const uint32_t amax = float_bits(abs_max(y, n));
  if (amax >= 0x7f800000u) {  // NaN or an infinity
    *scale = kE8M0Nan;
    std::memset(q, static_cast<int>(fp8_nan_code(fmt)), static_cast<size_t>(n));
    return;
  }
  const uint8_t e = e8m0_round_up(f32_div(amax, fp8_max(fmt)));
  *scale = e;
  if (e >= 19) {
    quantize_n(y, n, bits_float(static_cast<uint32_t>(254 - e) << 23), fmt, q);
    return;
  }
  const double inv = std::ldexp(1.0, 127 - e);  // y / 2^(e - 127), exact before the rounding to float32
  for (int64_t i = 0; i < n; ++i) {
    const float v = bits_float(f32_rounded(f32_exact(float_bits(y[i])) * inv));
    q[i] = fmt == Fp8::kE4M3 ? to_fp8<Fp8::kE4M3>(v) : to_fp8<Fp8::kE5M2>(v);
  }
}

// NVFP4: one block of n (even) values of y, divided by the global scale g,
// into E2M1 codes and its E4M3 scale. XLA stores float4 arrays two codes a
// byte, the first in the low 4 bits: `q` gets n / 2 bytes. quot(a, b): the
// float32 quotient (bits) of float32 bits a by float b.
template <class Quot>
inline void nvfp4_block(const float* y, int64_t n, float g, Quot quot, uint8_t* q, uint8_t* scale) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, quot(float_bits(y[i]), g) & 0x7fffffffu);
  if (amax >= 0x7f800000u) {  // NaN or an infinity
    *scale = kE4M3Nan;
    std::memset(q, 0, static_cast<size_t>(n / 2));
    return;
  }
  // min(amax / 6, 448) rounded to E4M3: to_fp8 saturates at 448 (a float32
  // subnormal quotient, which it may read as zero, rounds to 0 either way).
  const uint8_t s = to_fp8<Fp8::kE4M3>(bits_float(quot(amax, kFp4Max)));
  *scale = s;
  if (s == 0) {
    std::memset(q, 0, static_cast<size_t>(n / 2));
    return;
  }
  const float sv = from_fp8(s, Fp8::kE4M3);
  // The codes a run of kNvfp4Block at a time, then paired (loops that vectorize).
  for (int64_t i0 = 0; i0 < n; i0 += kNvfp4Block) {
    const int64_t m = std::min<int64_t>(kNvfp4Block, n - i0);
    uint8_t codes[kNvfp4Block];
    for (int64_t i = 0; i < m; ++i) codes[i] = to_fp4(bits_float(quot(quot(float_bits(y[i0 + i]), g), sv)));
    for (int64_t i = 0; i < m; i += 2) q[(i0 + i) / 2] = static_cast<uint8_t>(codes[i] | (codes[i + 1] << 4));
  }
}
// Fast path (|g| from 2^-100 to the largest float): a subnormal y / g, or a
// y / g from a subnormal y (below 2^-26 here), divided by a nonzero block
// scale (at least 2^-9) stays below 2^-17, far under E2M1's first rounding
// boundary (0.25): a zero of the quotient's sign either way, as is a
// subnormal amax / 6 in E4M3. Otherwise each quotient is taken in double from
// the operands' exact values.
inline void quantize_nvfp4(const float* y, int64_t n, float g, uint8_t* q, uint8_t* scale) {
  const uint32_t gbits = float_bits(g) & 0x7fffffffu;
  if (gbits >= 27u << 23 && gbits < 0x7f800000u) {  // 2^-100 up
    nvfp4_block(y, n, g, [](uint32_t a, float b) { return float_bits(bits_float(a) / b); }, q, scale);
  } else {
    nvfp4_block(y, n, g, [](uint32_t a, float b) { return f32_div(a, f32_exact(float_bits(b))); }, q, scale);
  }
}

// One group of n values v of per-group output (Quant::kGroup), by
// a.group_scale's rule: its codes into q (NVFP4: n / 2 bytes, two codes a
// byte) and its scale into *fscale (float32 rules) or *bscale (block-scaled).
// g: NVFP4's global scale. The rowwise output and the columnwise copy
// both quantize through here.
inline void quantize_group(const FwdArgs& a, const float* v, int64_t n, uint8_t* q, float* fscale, uint8_t* bscale,
                           float g) {
  if (a.group_scale == GroupScale::kE8M0) {
    quantize_mxfp8(v, n, a.fp8, q, bscale);
  } else if (a.group_scale == GroupScale::kNvfp4) {
    quantize_nvfp4(v, n, g, q, bscale);
  } else {
    float s = quant_scale(abs_max(v, n), a.fp8, a.scale_ub);
    if (a.group_scale == GroupScale::kPow2) s = pow2_ceil_scale(s);  // then 1 / s is exact
    *fscale = s;
    quantize_n(v, n, 1.f / s, a.fp8, q);
  }
}

// max that keeps a NaN of either side.
inline float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

// ---- Instruction sets.
//
// The module is built for the baseline x86-64 (SSE2), so that it runs on any
// x86-64 CPU. The loops over a row's elements are compiled once more for AVX2
// (with FMA, BMI2 and F16C): with_isa(f) runs f in a function
// compiled for AVX2 where the CPU has it, with f and all it calls inlined into
// it (`flatten`), so that f's loops are vectorized 256 bits wide. The module
// is compiled with -ffp-contract=off (no fused multiply-adds formed), so both
// give bit-identical results (tests/test_cpu_isa.py). The environment
// variable JAX_RMSNORM_CPU_ISA=baseline keeps the baseline; the Python package
// checks its value before this reads it. AVX2 was faster in every cell
// measured on CI's machine; an AVX-512 version ran level with it and was
// not kept.
enum class Isa : int { kBaseline = 0, kAvx2 = 1 };
inline constexpr const char* kIsaNames[] = {"baseline", "avx2"};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define JRN_HAS_AVX2_PATH 1

inline Isa detect_isa() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("popcnt") &&
                    __builtin_cpu_supports("sse4.2");
  return avx2 ? Isa::kAvx2 : Isa::kBaseline;
}

template <class F>
__attribute__((flatten, target("avx,avx2,fma,bmi,bmi2,f16c,popcnt,sse3,ssse3,sse4.1,sse4.2")))
void run_avx2(const F& f) {
  f();
}
#else
inline Isa detect_isa() { return Isa::kBaseline; }
#endif

// The set with_isa uses: AVX2 where the CPU has it, unless
// JAX_RMSNORM_CPU_ISA says baseline.
inline Isa active_isa() {
  static const Isa isa = [] {
    const char* cap = std::getenv("JAX_RMSNORM_CPU_ISA");
    return cap && std::strcmp(cap, kIsaNames[0]) == 0 ? Isa::kBaseline : detect_isa();
  }();
  return isa;
}

template <class F>
void with_isa(const F& f) {
#ifdef JRN_HAS_AVX2_PATH
  if (active_isa() == Isa::kAvx2) return run_avx2(f);
#endif
  f();
}

// A parameter group's scale (gamma, 1 + gamma, or ones) and shift (beta or
// zeros) as float rows, filled once per group: the per-element loops then
// have no branch on the parameters' presence or kind.
template <class P>
void fill_scale(std::vector<float>& out, const P* gamma, int64_t H, bool zero_centered) {
  if (!gamma) {
    std::fill(out.begin(), out.begin() + H, 1.f);
    return;
  }
  for (int64_t i = 0; i < H; ++i) out[i] = zero_centered ? to_float(gamma[i]) + 1.f : to_float(gamma[i]);
}
template <class P>
void fill_shift(std::vector<float>& out, const P* beta, int64_t H) {
  if (!beta) {
    std::fill(out.begin(), out.begin() + H, 0.f);
    return;
  }
  for (int64_t i = 0; i < H; ++i) out[i] = to_float(beta[i]);
}

// sum over i in [0, n) of term(i), in float64: eight interleaved partial sums
// added in a fixed order at the end, so the result is the same on every call
// and the additions do not wait on one another (the loop vectorizes; a single
// running sum took 4 cycles an element on its chain of dependent additions).
template <class F>
inline double sum_f64(int64_t n, F term) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += term(i + j);
  }
  for (int j = 0; i + j < n; ++j) acc[j] += term(i + j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// LayerNorm's centring of a row on its mean, in float64: row[i] - mean, and
// with `exact` less the row's residue from that mean, mean(row - mean). The
// mean is stored in float32, off from the row's by up to half its ulp: on a
// row far from zero (mean 1e6: up to 0.03) far more than a float32 ulp of the
// centred values. The residue puts the exact mean back, and every pass that
// recomputes it from the same float32 mean gets the same bits. Not `exact`
// where the mean is given for a longer row (a slice of the hidden dim).
inline void centre_row(std::vector<float>& row, int64_t H, float mean, bool exact) {
  const double m = mean;
  const double c = exact ? sum_f64(H, [&](int64_t i) { return row[i] - m; }) / static_cast<double>(H) : 0.0;
  for (int64_t i = 0; i < H; ++i) row[i] = static_cast<float>((row[i] - m) - c);
}

// A row's gradient sums in float64: sum(gdy * xhat) and, with `with_gdy`,
// sum(gdy); xhat(i) is the row's i-th normalized element. The backward's
// coefficients are these over the hidden size; grad_stats writes them.
template <class XHat>
inline std::pair<double, double> grad_row_sums(const std::vector<float>& gdy, XHat xhat, int64_t H, bool with_gdy) {
  return {sum_f64(H, [&](int64_t i) { return static_cast<double>(gdy[i]) * xhat(i); }),
          with_gdy ? sum_f64(H, [&](int64_t i) { return static_cast<double>(gdy[i]); }) : 0.0};
}

// ---- Work split over XLA's intra-op thread pool.

// How many chunks [0, n) is split into: chunks of at least `grain` items, at
// most one per thread of the pool (one when there is no pool).
inline int64_t chunk_count(ffi::ThreadPool& pool, int64_t n, int64_t grain) {
  if (n <= grain) return 1;
  const int64_t workers = std::max<int64_t>(1, pool.num_threads());
  return std::max<int64_t>(1, std::min(workers, n / grain));
}

// Runs body(c, begin, end) for the `chunks` consecutive parts c of [0, n),
// each through with_isa.
// Pool tasks and the calling thread take chunks from one counter; the caller
// waits only for chunks already taken, so a busy pool cannot stall it, and a
// task that starts after every chunk is taken finds none and returns (the
// state it shares outlives the call; `body` is reached only through a chunk).
template <class Body>
void run_chunks(ffi::ThreadPool& pool, int64_t n, int64_t chunks, const Body& body) {
  if (chunks <= 1) {
    with_isa([&] { body(int64_t{0}, int64_t{0}, n); });
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0};
    std::mutex mu;
    std::condition_variable all_done;
    int64_t done = 0;  // guarded by mu
    std::function<void(int64_t)> run;
  };
  auto shared = std::make_shared<Shared>();
  shared->run = [&](int64_t c) { with_isa([&] { body(c, n * c / chunks, n * (c + 1) / chunks); }); };
  auto work = [shared, chunks]() {
    for (int64_t c; (c = shared->next.fetch_add(1)) < chunks;) {
      shared->run(c);
      std::lock_guard<std::mutex> lock(shared->mu);
      if (++shared->done == chunks) shared->all_done.notify_all();
    }
  };
  for (int64_t i = 1; i < chunks; ++i) pool.Schedule(decltype(work)(work));  // a copy for each task
  work();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->all_done.wait(lock, [&] { return shared->done == chunks; });
}

// Rows a chunk of the row-parallel passes gets at least: about 64K elements,
// so that handing it to another thread costs little against its work.
inline int64_t row_grain(int64_t hidden) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(hidden, 1));
}

// h = x + residual of row r (`row` holds x on entry), summed in float32,
// rounded to h's dtype and stored to a.h: `row` becomes h as stored.
// FwdArgs and StatsArgs both carry the residual and h this way.
template <class T, class Args>
void add_residual(const Args& a, int64_t r, int64_t H, std::vector<float>& row) {
  if (a.residual_f32) {
    const float* res = static_cast<const float*>(a.residual) + r * H;
    for (int64_t i = 0; i < H; ++i) row[i] += res[i];
  } else {
    const T* res = static_cast<const T*>(a.residual) + r * H;
    for (int64_t i = 0; i < H; ++i) row[i] += to_float(res[i]);
  }
  if (a.h_f32) {
    std::copy(row.begin(), row.end(), static_cast<float*>(a.h) + r * H);
  } else {
    T* h = static_cast<T*>(a.h) + r * H;
    for (int64_t i = 0; i < H; ++i) {
      h[i] = from_float<T>(row[i]);
      row[i] = to_float(h[i]);
    }
  }
}

// body(r0, r1) for consecutive chunks of rows [0, rows), run in parallel.
template <class Body>
void for_row_chunks(ffi::ThreadPool& pool, int64_t rows, int64_t hidden, const Body& body) {
  run_chunks(pool, rows, chunk_count(pool, rows, row_grain(hidden)),
             [&](int64_t, int64_t r0, int64_t r1) { body(r0, r1); });
}

// 8 x 8 bytes: w[i] holds row i (byte j: column j); on return w[j] holds
// column j. The off-diagonal 4 x 4 blocks swap, then the 2 x 2 blocks within
// each 4 x 4, then the bytes within each 2 x 2.
inline void transpose8x8(uint64_t (&w)[8]) {
  for (int i = 0; i < 4; ++i) {
    const uint64_t t = ((w[i] >> 32) ^ w[i + 4]) & 0x00000000ffffffffull;
    w[i + 4] ^= t;
    w[i] ^= t << 32;
  }
  for (int i : {0, 1, 4, 5}) {
    const uint64_t t = ((w[i] >> 16) ^ w[i + 2]) & 0x0000ffff0000ffffull;
    w[i + 2] ^= t;
    w[i] ^= t << 16;
  }
  for (int i = 0; i < 8; i += 2) {
    const uint64_t t = ((w[i] >> 8) ^ w[i + 1]) & 0x00ff00ff00ff00ffull;
    w[i + 1] ^= t;
    w[i] ^= t << 8;
  }
}

// out[b, c, r] = in[b, r, c] for bytes (current scaling's q_t). A tile of
// 64 x 64 bytes is copied into a local buffer a row at a time, transposed
// there in blocks of 8 x 8, and copied out a row at a time: each cache line
// of the input and the output is touched once, where moving a byte at a time
// between rows 2^k bytes apart kept evicting lines that map to the same L1
// set (18 ms against 1 ms for 4096 x 1024 on one thread). Strips of 64
// columns run in parallel.
inline void transpose_bytes(ffi::ThreadPool& pool, const void* in, void* out, int64_t batch, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 64;
  const int64_t strips = (cols + kTile - 1) / kTile, items = batch * strips;
  const int64_t grain = row_grain(rows * kTile);  // a strip (rows x 64 bytes) counted as one row that wide
  run_chunks(pool, items, chunk_count(pool, items, grain), [&](int64_t, int64_t i0, int64_t i1) {
    // Zeroed once: the 8 x 8 blocks at a tile's ragged edge read past its bytes.
    std::vector<uint8_t> buf(2 * kTile * kTile, 0);
    uint8_t* tile = buf.data();
    uint8_t* tile_t = buf.data() + kTile * kTile;
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t b = item / strips, c0 = item % strips * kTile, cn = std::min(kTile, cols - c0);
      const uint8_t* src = static_cast<const uint8_t*>(in) + b * rows * cols;
      uint8_t* dst = static_cast<uint8_t*>(out) + b * rows * cols;
      for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
        const int64_t rn = std::min(kTile, rows - r0);
        for (int64_t r = 0; r < rn; ++r) std::memcpy(tile + r * kTile, src + (r0 + r) * cols + c0, cn);
        for (int64_t i = 0; i < rn; i += 8) {
          for (int64_t j = 0; j < cn; j += 8) {
            uint64_t w[8];
            for (int k = 0; k < 8; ++k) std::memcpy(&w[k], tile + (i + k) * kTile + j, 8);
            transpose8x8(w);
            for (int k = 0; k < 8; ++k) std::memcpy(tile_t + (j + k) * kTile + i, &w[k], 8);
          }
        }
        for (int64_t c = 0; c < cn; ++c) std::memcpy(dst + (c0 + c) * rows + r0, tile_t + c * kTile, rn);
      }
    }
  });
}

struct CpuKernels {
  template <NormKind K, class T, class P>
  static ffi::Error fwd(ffi::ThreadPool& pool, const FwdArgs& a) {
    const int64_t H = a.shape.hidden;
    // FP8 input: its 256 codes decoded once.
    float fp8_value[256];
    if (a.x_fp8) {
      for (int c = 0; c < 256; ++c) fp8_value[c] = from_fp8(static_cast<uint8_t>(c), a.x_fmt);
    }
    const bool current = a.quant == Quant::kCurrent, per_tensor = a.tensor_amax();
    // Rows are split into chunks run in parallel. A per-tensor amax (tensors
    // are runs of consecutive rows, as many as rows at most) is taken per
    // chunk over the tensors its rows touch: a tensor inside one chunk's rows
    // is that chunk's alone and written at once, the first and last tensors
    // of each chunk are merged over the chunks afterwards.
    const int64_t chunks = chunk_count(pool, a.shape.rows, row_grain(H));
    std::vector<int64_t> ends(per_tensor ? 2 * chunks : 0, -1);  // a chunk's first and last tensor
    std::vector<float> end_amax(ends.size(), 0.f);
    auto finish = [&](float m) { return current ? quant_scale(m, a.fp8, a.scale_ub) : m; };
    // Per-group output's columnwise copy is quantized from y's float32 rows, kept here.
    const bool columns = a.quant == Quant::kGroup && a.qt;
    std::vector<float> y_rows(columns ? static_cast<size_t>(a.shape.rows * H) : 0);
    // One pass over the rows; current scaling takes two: the first merges each
    // tensor's amax (and stores h and the statistics), then amax becomes
    // scale_inv, then the second quantizes.
    auto pass = [&](bool second) {
      run_chunks(pool, a.shape.rows, chunks, [&](int64_t c, int64_t r0, int64_t r1) {
        if (!per_tensor || second || r1 <= r0) {
          rows_fwd<K, T, P>(a, fp8_value, r0, r1, second, nullptr, 0, y_rows.empty() ? nullptr : y_rows.data());
          return;
        }
        const int64_t t0 = a.tensor_of(r0), t1 = a.tensor_of(r1 - 1);
        std::vector<float> m(static_cast<size_t>(t1 - t0 + 1), 0.f);
        rows_fwd<K, T, P>(a, fp8_value, r0, r1, second, m.data(), t0);
        for (int64_t t = t0 + 1; t < t1; ++t) a.amax[t] = finish(m[t - t0]);
        ends[2 * c] = t0;
        ends[2 * c + 1] = t1;
        end_amax[2 * c] = m.front();
        end_amax[2 * c + 1] = m.back();
      });
    };
    pass(false);
    if (per_tensor) {
      if (a.shape.rows == 0) std::fill(a.amax, a.amax + a.tensors, finish(0.f));
      // The ends rise over the chunks: each tensor's run of them merged, then finished once.
      int64_t t = -1;
      float run = 0.f;
      for (size_t i = 0; i < ends.size(); ++i) {
        if (ends[i] < 0) continue;
        if (ends[i] != t) {
          if (t >= 0) a.amax[t] = finish(run);
          t = ends[i];
          run = 0.f;
        }
        run = nan_max(run, end_amax[i]);
      }
      if (t >= 0) a.amax[t] = finish(run);
    }
    if (current) pass(true);
    if (current && a.qt) transpose_bytes(pool, a.y, a.qt, a.tensors, a.rows_per_tensor(), H);
    if (columns) quantize_columns(pool, a, y_rows.data());
    return ffi::Error::Success();
  }

  // Rows [r0, r1) of the forward; `amax` (per-tensor FP8) is this chunk's,
  // amax[t - t0] for tensor t. `keep` (per-group output): where y's float32
  // rows go too, rows x H.
  template <NormKind K, class T, class P>
  static void rows_fwd(const FwdArgs& a, const float* fp8_value, int64_t r0, int64_t r1, bool second,
                       float* amax, int64_t t0, float* keep = nullptr) {
    const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
    const T* x = static_cast<const T*>(a.x);
    const bool current = a.quant == Quant::kCurrent, per_tensor = a.tensor_amax();
    std::vector<float> row(H), out(H), scale(H), shift(H);
    int64_t params_of = -1;  // the parameter group that scale/shift hold
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t g = r / rpg;
      if (g != params_of) {
        fill_scale(scale, a.gamma ? static_cast<const P*>(a.gamma) + g * H : nullptr, H, a.zero_centered);
        fill_shift(shift, a.beta ? static_cast<const P*>(a.beta) + g * H : nullptr, H);
        params_of = g;
      }
      // The row to normalize: x (dequantized if FP8), or h = x + residual
      // rounded to h's dtype (in current scaling's second pass, h as its
      // first stored it).
      const bool stored_h = second && a.residual;
      if (stored_h) {
        if (a.h_f32) {
          const float* hr = static_cast<const float*>(a.h) + r * H;
          std::copy(hr, hr + H, row.begin());
        } else {
          const T* hr = static_cast<const T*>(a.h) + r * H;
          for (int64_t i = 0; i < H; ++i) row[i] = to_float(hr[i]);
        }
      } else if (a.x_fp8) {
        const uint8_t* xq = static_cast<const uint8_t*>(a.x) + r * H;
        const float* xs = a.x_scale + r * (H / a.x_group);
        for (int64_t g0 = 0; g0 < H; g0 += a.x_group) {  // a scale per group of x_group columns
          const float s = xs[g0 / a.x_group];
          for (int64_t i = g0; i < g0 + a.x_group; ++i) row[i] = fp8_value[xq[i]] * s;
        }
      } else {
        const T* xr = x + r * H;
        for (int64_t i = 0; i < H; ++i) row[i] = to_float(xr[i]);
      }
      if (a.residual && !stored_h) add_residual<T>(a, r, H, row);
      // Current scaling's second pass recomputes the statistics its first
      // wrote (the same sums, so the same bits).
      const bool given = a.given_stats;
      if constexpr (K == NormKind::kLayer) {
        const float mean = given ? a.mean[r]
                                 : static_cast<float>(sum_f64(H, [&](int64_t i) { return static_cast<double>(row[i]); }) /
                                                      static_cast<double>(H));
        centre_row(row, H, mean, !given);
        if (!given) a.mean[r] = mean;
      }
      float rstd;
      if (given) {
        rstd = a.rstd[r];
      } else {
        // In float64: the squares of any float32 row and their sum stay finite.
        const double ss = sum_f64(H, [&](int64_t i) { return static_cast<double>(row[i]) * row[i]; });
        const double rstd64 = 1.0 / std::sqrt(ss / static_cast<double>(H) + a.eps);
        rstd = static_cast<float>(rstd64);
        a.rstd[r] = rstd;
        // An RMS beyond 2^126 leaves rstd below float32's normal range (its
        // stored value subnormal or zero): the row is scaled in float64.
        if (rstd64 < std::numeric_limits<float>::min()) {
          for (int64_t i = 0; i < H; ++i) row[i] = static_cast<float>(row[i] * rstd64);
          rstd = 1.f;
        }
      }
      const bool shifted = a.beta != nullptr;
      if (a.quant == Quant::kNone) {
        T* y = static_cast<T*>(a.y) + r * H;
        if (shifted) {
          for (int64_t i = 0; i < H; ++i) y[i] = from_float<T>(row[i] * rstd * scale[i] + shift[i]);
        } else {
          for (int64_t i = 0; i < H; ++i) y[i] = from_float<T>(row[i] * rstd * scale[i]);
        }
        continue;
      }
      if (shifted) {
        for (int64_t i = 0; i < H; ++i) out[i] = row[i] * rstd * scale[i] + shift[i];
      } else {
        for (int64_t i = 0; i < H; ++i) out[i] = row[i] * rstd * scale[i];
      }
      uint8_t* q = static_cast<uint8_t*>(a.y) + r * H;
      // Columns [c0, c0 + n) quantized with one scale: the given one, or the
      // one from their own max |y|.
      auto quantize = [&](int64_t c0, int64_t n, float* scale_out, float given_mul, bool store = true) {
        const float m = abs_max(out.data() + c0, n);
        float mul = given_mul;
        if (scale_out) {
          const float s = quant_scale(m, a.fp8, a.scale_ub);
          *scale_out = s;
          mul = 1.f / s;
        }
        if (store) quantize_n(out.data() + c0, n, mul, a.fp8, q + c0);
        return m;
      };
      if (per_tensor) {
        const int64_t t = a.tensor_of(r);
        if (!current) {
          const float mul = a.no_output ? 0.f : a.tensor_mul(t);
          amax[t - t0] = nan_max(amax[t - t0], quantize(0, H, nullptr, mul, !a.no_output));
        } else if (!second) {
          amax[t - t0] = nan_max(amax[t - t0], quantize(0, H, nullptr, 0.f, false));
        } else {
          quantize(0, H, nullptr, 1.f / a.amax[t]);  // a.amax holds scale_inv by now
        }
      } else if (a.quant == Quant::kRow) {
        quantize(0, H, a.qscale + r, 0.f);
      } else {  // per group
        const int64_t G = a.group_size, per_row = H / G;
        const bool fp4 = a.group_scale == GroupScale::kNvfp4;  // two codes a byte (H is even)
        const float g = fp4 ? a.scale[a.tensor_of(r)] : 0.f;
        uint8_t* qr = static_cast<uint8_t*>(a.y) + (fp4 ? r * H / 2 : r * H);
        for (int64_t c = 0; c < per_row; ++c) {
          const int64_t i = r * per_row + c;
          quantize_group(a, out.data() + c * G, G, qr + (fp4 ? c * G / 2 : c * G), a.qscale ? a.qscale + i : nullptr,
                         a.block_scales ? a.block_scales + i : nullptr, g);
        }
      }
      if (keep) std::copy(out.begin(), out.end(), keep + r * H);
    }
  }

  // Per-group output's columnwise copy from y (float32, rows x H, all
  // tensors' rows): each tensor's y transposed to (H, rows per tensor) and
  // quantized along its rows in groups, into a.qt and a.qt_scales. Threads
  // take runs of the tensors' columns.
  static void quantize_columns(ffi::ThreadPool& pool, const FwdArgs& a, const float* y) {
    const int64_t H = a.shape.hidden, R = a.rows_per_tensor(), G = a.group_size, per_col = R / G;
    const bool fp4 = a.group_scale == GroupScale::kNvfp4, block = a.block_scales != nullptr;
    const int64_t columns = (a.tensors <= 1 ? 1 : a.tensors) * H;
    const int64_t grain = row_grain(R);  // columns of R values, as rows are of H
    run_chunks(pool, columns, chunk_count(pool, columns, grain), [&](int64_t, int64_t k0, int64_t k1) {
      // A run of up to kColumnRun columns of one tensor at a time: each
      // block of G rows is read along its rows and transposed into v
      // (v[i * G + j]: column i's row j), then quantized column by column.
      constexpr int64_t kColumnRun = 64;
      std::vector<float> v(static_cast<size_t>(G * kColumnRun));
      for (int64_t k = k0; k < k1;) {  // column k % H of tensor k / H
        const int64_t t = k / H, c = k % H, m = std::min({kColumnRun, k1 - k, H - c});
        const float g = fp4 ? a.scale[t] : 0.f;
        for (int64_t b = 0; b < per_col; ++b) {
          const float* src = y + (t * R + b * G) * H + c;
          for (int64_t j = 0; j < G; ++j) {
            for (int64_t i = 0; i < m; ++i) v[i * G + j] = src[j * H + i];
          }
          for (int64_t i = 0; i < m; ++i) {
            const int64_t e = (k + i) * R + b * G, s = (k + i) * per_col + b;  // first code, scale
            quantize_group(a, v.data() + i * G, G, static_cast<uint8_t*>(a.qt) + (fp4 ? e / 2 : e),
                           block ? nullptr : static_cast<float*>(a.qt_scales) + s,
                           block ? static_cast<uint8_t*>(a.qt_scales) + s : nullptr, g);
          }
        }
        k += m;
      }
    });
  }

  // dgamma/dbeta: a group's rows are cut into blocks of consecutive rows, as
  // many as the shape alone gives (never the thread count): each block sums
  // its columns in row order in float64, then the blocks are added in order,
  // so results do not depend on the machine. Up to 64 blocks of at least 512
  // rows, their partial sums within 2^21 doubles.
  static int64_t bwd_blocks(int64_t rows, int64_t columns) {
    const int64_t by_memory = std::max<int64_t>(1, (int64_t{1} << 21) / std::max<int64_t>(columns, 1));
    return std::max<int64_t>(1, std::min({rows / 512, int64_t{64}, by_memory}));
  }

  template <NormKind K, class T, class P>
  static ffi::Error bwd(ffi::ThreadPool& pool, const BwdArgs& a) {
    const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
    const int outs = a.param_outputs();
    // Without dgamma/dbeta every row is a block of its own.
    const int64_t blocks = outs ? bwd_blocks(rpg, outs * H) : rpg;
    const int64_t chunks = outs ? chunk_count(pool, blocks, 1) : chunk_count(pool, rpg, row_grain(H));
    // part[(b * outs + o) * H + i]: block b's sum of column i of output o
    // (dgamma, then dbeta).
    std::vector<double> part(static_cast<size_t>(blocks * outs * H));
    for (int64_t g = 0; g < a.shape.groups; ++g) {
      std::fill(part.begin(), part.end(), 0.0);
      run_chunks(pool, blocks, chunks, [&](int64_t, int64_t b0, int64_t b1) {
        std::vector<float> xhat(H), d(H), gdy(H), scale(H);
        fill_scale(scale, a.gamma ? static_cast<const P*>(a.gamma) + g * H : nullptr, H, a.zero_centered);
        for (int64_t b = b0; b < b1; ++b) {
          double* dg = a.dgamma ? part.data() + b * outs * H : nullptr;
          double* db = a.dbeta ? part.data() + (b * outs + outs - 1) * H : nullptr;
          for (int64_t r = g * rpg + rpg * b / blocks; r < g * rpg + rpg * (b + 1) / blocks; ++r) {
            const float rstd = a.rstd[r];
            const T* x = static_cast<const T*>(a.x) + r * H;
            const T* dy = static_cast<const T*>(a.dy) + r * H;
            for (int64_t i = 0; i < H; ++i) xhat[i] = to_float(x[i]);
            // Whole rows (no coefficients given) centre on their exact mean, as the forward did.
            if constexpr (K == NormKind::kLayer) centre_row(xhat, H, a.mean[r], !a.coef);
            for (int64_t i = 0; i < H; ++i) {
              d[i] = to_float(dy[i]);
              xhat[i] *= rstd;
              gdy[i] = d[i] * scale[i];
            }
            float c1, c2 = 0.f;
            if (a.coef) {
              c1 = a.coef[grad_sums_per_row(K) * r];
              if constexpr (K == NormKind::kLayer) c2 = a.coef[2 * r + 1];
            } else {
              const auto [s1, s2] = grad_row_sums(gdy, [&](int64_t i) { return xhat[i]; }, H, K == NormKind::kLayer);
              c1 = static_cast<float>(s1 / static_cast<double>(H));
              c2 = static_cast<float>(s2 / static_cast<double>(H));
            }
            if (dg) {
              for (int64_t i = 0; i < H; ++i) dg[i] += static_cast<double>(d[i]) * xhat[i];
            }
            if (db) {
              for (int64_t i = 0; i < H; ++i) db[i] += d[i];
            }
            T* dx = static_cast<T*>(a.dx) + r * H;
            if (a.dh) {
              const T* dh = static_cast<const T*>(a.dh) + r * H;
              for (int64_t i = 0; i < H; ++i)
                dx[i] = from_float<T>(rstd * (gdy[i] - c2 - xhat[i] * c1) + to_float(dh[i]));
            } else {
              for (int64_t i = 0; i < H; ++i) dx[i] = from_float<T>(rstd * (gdy[i] - c2 - xhat[i] * c1));
            }
          }
        }
      });
      // The blocks' column sums, added in block order into block 0's.
      for (int64_t b = 1; b < blocks; ++b) {
        for (int64_t k = 0; k < outs * H; ++k) part[k] += part[b * outs * H + k];
      }
      for (int o = 0; o < outs; ++o) {
        P* dst = static_cast<P*>(a.param_output(o)) + g * H;
        for (int64_t i = 0; i < H; ++i) dst[i] = from_float<P>(static_cast<float>(part[o * H + i]));
      }
    }
    return ffi::Error::Success();
  }

  template <NormKind K, class T>
  static ffi::Error stats(ffi::ThreadPool& pool, const StatsArgs& a) {
    const int64_t H = a.shape.hidden;
    for_row_chunks(pool, a.shape.rows, H, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(H);  // x, or h = x + residual as stored
      for (int64_t r = r0; r < r1; ++r) {
        const T* x = static_cast<const T*>(a.x) + r * H;
        for (int64_t i = 0; i < H; ++i) row[i] = to_float(x[i]);
        if (a.residual) add_residual<T>(a, r, H, row);
        double mean = 0.0;
        if constexpr (K == NormKind::kLayer) {
          mean = sum_f64(H, [&](int64_t i) { return static_cast<double>(row[i]); }) / static_cast<double>(H);
        }
        const double ss = sum_f64(H, [&](int64_t i) {
          const double v = row[i] - mean;
          return v * v;
        });
        if constexpr (K == NormKind::kLayer) {
          a.out[2 * r] = static_cast<float>(mean);
          a.out[2 * r + 1] = static_cast<float>(ss);
        } else {
          a.out[r] = static_cast<float>(ss);
        }
      }
    });
    return ffi::Error::Success();
  }

  template <NormKind K, class T, class P>
  static ffi::Error grad_stats(ffi::ThreadPool& pool, const StatsArgs& a) {
    const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
    for_row_chunks(pool, a.shape.rows, H, [&](int64_t r0, int64_t r1) {
      std::vector<float> gdy(H), scale(H);
      int64_t params_of = -1;
      for (int64_t r = r0; r < r1; ++r) {
        if (r / rpg != params_of) {
          params_of = r / rpg;
          fill_scale(scale, a.gamma ? static_cast<const P*>(a.gamma) + params_of * H : nullptr, H, a.zero_centered);
        }
        const float mean = K == NormKind::kLayer ? a.mean[r] : 0.f, rstd = a.rstd[r];
        const T* x = static_cast<const T*>(a.x) + r * H;
        const T* dy = static_cast<const T*>(a.dy) + r * H;
        for (int64_t i = 0; i < H; ++i) gdy[i] = to_float(dy[i]) * scale[i];
        constexpr bool kLayer = K == NormKind::kLayer;  // RMSNorm: sum(gdy * xhat) alone
        const auto [s1, s2] = grad_row_sums(gdy, [&](int64_t i) { return (to_float(x[i]) - mean) * rstd; }, H, kLayer);
        a.out[grad_sums_per_row(K) * r] = static_cast<float>(s1);
        if constexpr (kLayer) a.out[2 * r + 1] = static_cast<float>(s2);
      }
    });
    return ffi::Error::Success();
  }
};

}  // namespace jrn::cpu

// The backend the handlers take (norm_common.h): its entry points, one
// instance per (normalization, element type, parameter type) of
// JRN_CPU_FOR_EACH_INSTANCE (stats: per element type), defined out of the
// class so that they are not inline: every file that includes this header is
// told that the instances are made elsewhere (extern template), and
// norm_cpu_fwd_rms.cc, norm_cpu_fwd_layer.cc and norm_cpu_bwd.cc each make
// their share.
namespace jrn::cpu {
struct CpuBackend {
  static constexpr bool kGroupScales = true;  // every GroupScale (norm_fused.h)
  static constexpr bool kGroupColumns = true;  // and the per-group columnwise copy
  using Bf16 = bf16_t;
  using F16 = f16_t;
  template <NormKind K, class T, class P>
  static ffi::Error fwd(ffi::ThreadPool& pool, const FwdArgs& a);
  template <NormKind K, class T, class P>
  static ffi::Error bwd(ffi::ThreadPool& pool, const BwdArgs& a);
  template <NormKind K, class T>
  static ffi::Error stats(ffi::ThreadPool& pool, const StatsArgs& a);
  template <NormKind K, class T, class P>
  static ffi::Error grad_stats(ffi::ThreadPool& pool, const StatsArgs& a);
};
template <NormKind K, class T, class P>
ffi::Error CpuBackend::fwd(ffi::ThreadPool& pool, const FwdArgs& a) {
  return CpuKernels::fwd<K, T, P>(pool, a);
}
template <NormKind K, class T, class P>
ffi::Error CpuBackend::bwd(ffi::ThreadPool& pool, const BwdArgs& a) {
  return CpuKernels::bwd<K, T, P>(pool, a);
}
template <NormKind K, class T>
ffi::Error CpuBackend::stats(ffi::ThreadPool& pool, const StatsArgs& a) {
  return CpuKernels::stats<K, T>(pool, a);
}
template <NormKind K, class T, class P>
ffi::Error CpuBackend::grad_stats(ffi::ThreadPool& pool, const StatsArgs& a) {
  return CpuKernels::grad_stats<K, T, P>(pool, a);
}
}  // namespace jrn::cpu

#define JRN_CPU_FOR_EACH_KIND_INSTANCE(MACRO, K)   \
  MACRO(K, float, float)                            \
  MACRO(K, ::jrn::cpu::bf16_t, ::jrn::cpu::bf16_t)  \
  MACRO(K, ::jrn::cpu::bf16_t, float)               \
  MACRO(K, ::jrn::cpu::f16_t, ::jrn::cpu::f16_t)    \
  MACRO(K, ::jrn::cpu::f16_t, float)
#define JRN_CPU_FOR_EACH_INSTANCE(MACRO)                       \
  JRN_CPU_FOR_EACH_KIND_INSTANCE(MACRO, ::jrn::NormKind::kRms) \
  JRN_CPU_FOR_EACH_KIND_INSTANCE(MACRO, ::jrn::NormKind::kLayer)

// PREFIX "extern" declares an instance, PREFIX empty makes it.
#define JRN_CPU_FWD_INSTANCE(PREFIX, K, T, P) \
  PREFIX template ::xla::ffi::Error jrn::cpu::CpuBackend::fwd<K, T, P>(::xla::ffi::ThreadPool&, const ::jrn::FwdArgs&);
#define JRN_CPU_BWD_INSTANCE(PREFIX, K, T, P)                                                                   \
  PREFIX template ::xla::ffi::Error jrn::cpu::CpuBackend::bwd<K, T, P>(::xla::ffi::ThreadPool&, const ::jrn::BwdArgs&);     \
  PREFIX template ::xla::ffi::Error jrn::cpu::CpuBackend::grad_stats<K, T, P>(::xla::ffi::ThreadPool&, const ::jrn::StatsArgs&);
#define JRN_CPU_STATS_INSTANCE(PREFIX, K)                                                                          \
  PREFIX template ::xla::ffi::Error jrn::cpu::CpuBackend::stats<K, float>(::xla::ffi::ThreadPool&, const ::jrn::StatsArgs&);   \
  PREFIX template ::xla::ffi::Error jrn::cpu::CpuBackend::stats<K, ::jrn::cpu::bf16_t>(::xla::ffi::ThreadPool&,                \
                                                                         const ::jrn::StatsArgs&);                 \
  PREFIX template ::xla::ffi::Error jrn::cpu::CpuBackend::stats<K, ::jrn::cpu::f16_t>(::xla::ffi::ThreadPool&, const ::jrn::StatsArgs&);
#define JRN_CPU_EXTERN_FWD(K, T, P) JRN_CPU_FWD_INSTANCE(extern, K, T, P)
#define JRN_CPU_EXTERN_BWD(K, T, P) JRN_CPU_BWD_INSTANCE(extern, K, T, P)
// For the units that make them (norm_cpu_fwd_*.cc, norm_cpu_bwd.cc).
#define JRN_CPU_MAKE_FWD(K, T, P) JRN_CPU_FWD_INSTANCE(, K, T, P)
#define JRN_CPU_MAKE_BWD(K, T, P) JRN_CPU_BWD_INSTANCE(, K, T, P)
JRN_CPU_FOR_EACH_INSTANCE(JRN_CPU_EXTERN_FWD)
JRN_CPU_FOR_EACH_INSTANCE(JRN_CPU_EXTERN_BWD)
JRN_CPU_STATS_INSTANCE(extern, ::jrn::NormKind::kRms)
JRN_CPU_STATS_INSTANCE(extern, ::jrn::NormKind::kLayer)
