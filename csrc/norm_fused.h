// The fused variants' host-side pieces, shared by the CPU and CUDA handlers:
// residual add (h = x + residual, normalized and stored), FP8 output scaled
// per tensor, per row or per group of columns, FP8 input with a scale per
// group of columns; the backward with the residual's gradient added to dx.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "norm_common.h"

namespace jrn {

// Largest finite value of each FP8 format; quantization saturates there.
JRN_HOST_DEVICE inline float fp8_max(Fp8 f) { return f == Fp8::kE4M3 ? 448.f : 57344.f; }

// The NaN code each FP8 format's conversions give (positive).
JRN_HOST_DEVICE inline uint32_t fp8_nan_code(Fp8 f) { return f == Fp8::kE4M3 ? 0x7fu : 0x7eu; }

// ---- The group scales of GroupScale (norm_types.h) beyond kFloat. Block
// formats (kE8M0, kNvfp4) follow jax.nn's quantizer (scaled_dot_general's
// MXFP8 and NVFP4 configurations) on finite blocks, in IEEE float32
// arithmetic with denormals kept (not flushed); what that quantizer leaves
// undefined or garbles is defined here:
//  * kE8M0 (MXFP8, blocks of 32): s = amax / fp8_max (float32), scale byte
//    e8m0_round_up(s) (byte 0 is 2^-127: an all-zero block quantizes to
//    zeros), codes saturate(y / 2^(e - 127)) in the FP8 format.
//  * kNvfp4 (blocks of 16): codes stored as XLA stores float4 arrays, two
//    a byte, the first in the low 4 bits. t = y / global_scale (float32, global_scale
//    per tensor), scale = E4M3(min(max|t| / 6, 448)) rounded to nearest
//    even, codes E2M1(clip(t / scale, -6, 6)) rounded to nearest even (a
//    division, not a product with the reciprocal). A block whose scale
//    rounds to 0 (max|t| / 6 at most 2^-10, half E4M3's smallest subnormal:
//    all zeros, or tiny values): scale 0 and codes +0 (the quantizer divides
//    by zero there).
//  * A block holding NaN or an infinity (of y, or of t): NaN scale (E8M0
//    0xff, E4M3 0x7f) and every code NaN (FP8: fp8_nan_code) or +0 (E2M1,
//    which has no NaN), so the whole block dequantizes to NaN (the
//    quantizer maps an E8M0 NaN scale to 2^-127 and saturates the block).
//  * kPow2 (per-group FP8, float32 scales): quant_scale's scale rounded up
//    to a power of two (pow2_ceil_scale), codes saturate(y * (1 / scale)), exact.
constexpr float kFp4Max = 6.f;
constexpr uint8_t kE8M0Nan = 0xff, kE4M3Nan = 0x7f;
constexpr int kMxfp8Block = 32, kNvfp4Block = 16;  // the block formats' group sizes
// A rule's fixed group size: MXFP8's and NVFP4's blocks; 0 where the group
// size is the call's (per-group FP8).
constexpr int block_group_size(GroupScale s) {
  return s == GroupScale::kE8M0 ? kMxfp8Block : s == GroupScale::kNvfp4 ? kNvfp4Block : 0;
}

// float32 bits of a value and back, on the host and the device.
JRN_HOST_DEVICE inline uint32_t float_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
JRN_HOST_DEVICE inline float bits_float(uint32_t u) {
  float v;
  memcpy(&v, &u, 4);
  return v;
}

// kPow2: a scale (> 0) rounded up to a power of two: the exponent, plus one
// where mantissa bits are set; infinity and NaN as they are.
JRN_HOST_DEVICE inline float pow2_ceil_scale(float s) {
  const uint32_t u = float_bits(s);
  if ((u & 0x7f800000u) == 0x7f800000u || (u & 0x7fffffu) == 0) return s;
  return bits_float((u & 0xff800000u) + 0x800000u);
}

// kE8M0: the E8M0 byte of a block whose float32 amax / fp8_max (finite,
// >= 0, not flushed to zero) has bits `s`, rounded up as jax.nn's quantizer
// rounds: the exponent, plus one where mantissa bits are set, except at the
// largest finite exponent and for subnormals of at most 2^-127.
JRN_HOST_DEVICE inline uint8_t e8m0_round_up(uint32_t s) {
  const uint32_t exp = s >> 23, mant = s & 0x7fffffu;
  const bool up = mant > 0 && exp != 0xfeu && !(exp == 0 && mant <= 0x400000u);
  return static_cast<uint8_t>(exp + (up ? 1u : 0u));
}

// Whether a backend's kernels take group scales other than kFloat: a
// backend says so with `static constexpr bool kGroupScales = true;` (the
// CPU's); the handlers refuse them on the others.
template <class Backend>
constexpr bool backend_group_scales() {
  if constexpr (requires { Backend::kGroupScales; }) {
    return Backend::kGroupScales;
  } else {
    return false;
  }
}
// The same for the per-group output's columnwise copy (qt_scales):
// `static constexpr bool kGroupColumns = true;`.
template <class Backend>
constexpr bool backend_group_columns() {
  if constexpr (requires { Backend::kGroupColumns; }) {
    return Backend::kGroupColumns;
  } else {
    return false;
  }
}

// Smallest per-row / per-group scale: an all-zero row quantizes to zeros with
// this scale instead of dividing by zero.
constexpr float kMinQuantScale = 1e-12f;

// amax / fp8_max(f), correctly rounded. On the GPU in three FP32 operations
// (q = amax * (1 / c), then one correction by the remainder r = amax - q * c)
// instead of a division (about ten instructions and a branch, taken per pack
// by the per-group kernels). tools/check_div_fp8_max.c checks it against
// the division for every finite float amax (both formats): identical wherever
// the quotient is at least 1e-13, below which quant_scale floors it at
// kMinQuantScale anyway. Infinite amax leaves r NaN: q (infinite) is returned
// (docs/tuning.md, div-fp8-max).
JRN_HOST_DEVICE inline float div_fp8_max(float amax, Fp8 f) {
#ifdef __CUDA_ARCH__
  const float c = fp8_max(f), rc = f == Fp8::kE4M3 ? 1.f / 448.f : 1.f / 57344.f;
  const float q = amax * rc;
  const float r = fmaf(-q, c, amax);
  return r != r ? q : fmaf(r, rc, q);
#else
  return amax / fp8_max(f);
#endif
}

// The scale of a row or group whose largest |y| is `amax`:
// max(min(amax / fp8_max, ub), kMinQuantScale); NaN stays NaN.
JRN_HOST_DEVICE inline float quant_scale(float amax, Fp8 f, float ub) {
  float s = div_fp8_max(amax, f);
  if (s != s) return s;
  s = s < ub ? s : ub;
  return s > kMinQuantScale ? s : kMinQuantScale;
}

inline bool is_fp8_type(ffi::DataType t) {
  return t == ffi::DataType::F8E4M3FN || t == ffi::DataType::F8E5M2;
}

inline ffi::Error check_kind(const ffi::AnyBuffer& b, int64_t count, ffi::DataType t1, ffi::DataType t2,
                             const char* what) {
  if (static_cast<int64_t>(b.element_count()) != count ||
      (b.element_type() != t1 && b.element_type() != t2)) {
    return ffi::Error::InvalidArgument(std::string("jax_rmsnorm: ") + what);
  }
  return ffi::Error::Success();
}

// The buffer whose dtype is the kernel's element type: x, or y when x is FP8.
inline const ffi::AnyBuffer& typed_input(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y) {
  return is_fp8_type(x.element_type()) ? y : x;
}

// The residual add's buffers into `a` (FwdArgs or StatsArgs): residual and h
// of x's `n` elements, each in x's dtype `xt` or float32.
template <class Args>
inline ffi::Error decode_residual(const ffi::AnyBuffer& residual, ffi::AnyBuffer& h, int64_t n,
                                  ffi::DataType xt, Args* a) {
  if (auto e = check_kind(residual, n, xt, ffi::DataType::F32,
                          "residual must have x's shape, and x's dtype or float32");
      e.failure())
    return e;
  if (auto e = check_kind(h, n, xt, ffi::DataType::F32, "h must have x's shape, and x's dtype or float32");
      e.failure())
    return e;
  a->residual = residual.untyped_data();
  a->residual_f32 = residual.element_type() == ffi::DataType::F32;
  a->h = h.untyped_data();
  a->h_f32 = h.element_type() == ffi::DataType::F32;
  return ffi::Error::Success();
}

// decode_fwd for the fused forward, then the FP8 input, residual and
// quantization buffers. `quant` is a Quant value. The fields the caller set
// in `a` before (no_output) are kept.
inline ffi::Error decode_fused_fwd(NormKind kind, const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                                   const ffi::AnyBuffer* beta, const ffi::AnyBuffer& residual,
                                   const ffi::AnyBuffer& scale, const ffi::AnyBuffer& x_scale,
                                   ffi::AnyBuffer& y, ffi::AnyBuffer* mean, ffi::AnyBuffer& rstd,
                                   ffi::AnyBuffer& h, ffi::AnyBuffer& qs, ffi::AnyBuffer* qt,
                                   ffi::AnyBuffer* qt_scales, float eps,
                                   bool zero_centered, bool has_gamma, bool has_beta, bool has_residual,
                                   int32_t quant, int64_t group_size, float scale_ub, int64_t x_group_size,
                                   int32_t group_scale, FwdArgs* a) {
  if (quant < 0 || quant > static_cast<int32_t>(Quant::kCurrent))
    return ffi::Error::InvalidArgument("jax_rmsnorm: unknown quantization mode");
  a->quant = static_cast<Quant>(quant);
  if (group_scale < 0 || group_scale > static_cast<int32_t>(GroupScale::kNvfp4))
    return ffi::Error::InvalidArgument("jax_rmsnorm: unknown group scale");
  a->group_scale = static_cast<GroupScale>(group_scale);
  if (a->group_scale != GroupScale::kFloat && a->quant != Quant::kGroup)
    return ffi::Error::InvalidArgument("jax_rmsnorm: a group scale other than float32 goes with per-group output");
  const bool block_scaled = a->group_scale == GroupScale::kE8M0 || a->group_scale == GroupScale::kNvfp4;
  if (block_scaled && group_size != block_group_size(a->group_scale))
    return ffi::Error::InvalidArgument("jax_rmsnorm: MXFP8 takes groups of 32, NVFP4 groups of 16");
  const bool x_fp8 = is_fp8_type(x.element_type());
  if (x_fp8 && a->quant != Quant::kNone)
    return ffi::Error::InvalidArgument("jax_rmsnorm: FP8 input takes a float32/bfloat16/float16 output");
  if (x_fp8 != (x_group_size > 0))
    return ffi::Error::InvalidArgument("jax_rmsnorm: x_group_size > 0 goes with an FP8 x, and only with it");
  // decode_fwd checks a stand-in of x's shape in the kernel's element type:
  // y when x is FP8 (dequantized in the kernel), x when y is FP8.
  const ffi::AnyBuffer& xt = typed_input(x, y);
  ffi::AnyBuffer y_checked = a->quant == Quant::kNone ? y : x;
  if (auto e = decode_fwd(kind, xt, gamma, beta, y_checked, mean, rstd, eps, zero_centered, has_gamma,
                          has_beta, a);
      e.failure())
    return e;
  const int64_t n = a->shape.rows * a->shape.hidden;
  const auto F32 = ffi::DataType::F32;
  if (x_fp8) {
    if (static_cast<int64_t>(x.element_count()) != n)
      return ffi::Error::InvalidArgument("jax_rmsnorm: an FP8 x must have y's shape");
    if (a->shape.hidden % x_group_size != 0)
      return ffi::Error::InvalidArgument("jax_rmsnorm: x_group_size must divide the hidden size");
    if (auto e = check_kind(x_scale, n / x_group_size, F32, F32,
                            "x_scale must be float32, one per group of x_group_size columns of x");
        e.failure())
      return e;
    a->x = x.untyped_data();
    a->x_fp8 = true;
    a->x_fmt = x.element_type() == ffi::DataType::F8E4M3FN ? Fp8::kE4M3 : Fp8::kE5M2;
    a->x_scale = static_cast<const float*>(x_scale.untyped_data());
    a->x_group = x_group_size;
  }
  if (has_residual) {
    if (auto e = decode_residual(residual, h, n, xt.element_type(), a); e.failure()) return e;
  }
  if (a->quant == Quant::kNone) return ffi::Error::Success();
  if (a->group_scale == GroupScale::kNvfp4) {  // E2M1 codes, two a byte; a->fp8 (E4M3) is the scales' format
    if (y.element_type() != ffi::DataType::F4E2M1FN || group_size % 2 != 0)
      return ffi::Error::InvalidArgument("jax_rmsnorm: NVFP4 output must be float4_e2m1fn in groups of an even size");
  } else if (y.element_type() == ffi::DataType::F8E4M3FN) {
    a->fp8 = Fp8::kE4M3;
  } else if (y.element_type() == ffi::DataType::F8E5M2) {
    a->fp8 = Fp8::kE5M2;
  } else {
    return ffi::Error::InvalidArgument("jax_rmsnorm: FP8 output must be float8_e4m3fn or float8_e5m2");
  }
  // (With no_output set by the caller, y is not written and may be empty.)
  if (!a->no_output && static_cast<int64_t>(y.element_count()) != n)
    return ffi::Error::InvalidArgument("jax_rmsnorm: the FP8 output must have x's shape");
  a->y = y.untyped_data();
  if (!(scale_ub > 0.f)) return ffi::Error::InvalidArgument("jax_rmsnorm: scale_ub must be > 0");
  a->scale_ub = scale_ub;
  if (a->tensor_amax()) {
    // kCurrent reads no scale: its placeholder's size is the tensor count.
    const int64_t tensors = static_cast<int64_t>(scale.element_count());
    if (scale.element_type() != F32 || tensors < 1 || a->shape.rows % tensors != 0)
      return ffi::Error::InvalidArgument("jax_rmsnorm: scale must be float32, one per tensor");
    if (auto e = check_kind(qs, tensors, F32, F32, "amax / scale_inv must be float32 like scale"); e.failure())
      return e;
    a->scale = a->quant == Quant::kTensor ? static_cast<const float*>(scale.untyped_data()) : nullptr;
    a->amax = static_cast<float*>(qs.untyped_data());
    a->tensors = tensors;
  } else if (a->quant == Quant::kRow) {
    if (auto e = check_kind(qs, a->shape.rows, F32, F32, "row scales must be float32, one per row");
        e.failure())
      return e;
    a->qscale = static_cast<float*>(qs.untyped_data());
  } else {
    if (group_size < 1 || a->shape.hidden % group_size != 0)
      return ffi::Error::InvalidArgument("jax_rmsnorm: group_size must divide the hidden size");
    const ffi::DataType st = a->group_scale == GroupScale::kE8M0    ? ffi::DataType::F8E8M0FNU
                             : a->group_scale == GroupScale::kNvfp4 ? ffi::DataType::F8E4M3FN
                                                                    : F32;
    if (auto e = check_kind(qs, n / group_size, st, st,
                            "group scales must be one per group: float32, float8_e8m0fnu (MXFP8) or "
                            "float8_e4m3fn (NVFP4)");
        e.failure())
      return e;
    if (block_scaled) {
      a->block_scales = static_cast<uint8_t*>(qs.untyped_data());
    } else {
      a->qscale = static_cast<float*>(qs.untyped_data());
    }
    a->group_size = group_size;
    if (a->group_scale == GroupScale::kNvfp4) {  // the global scales, one per tensor
      const int64_t tensors = static_cast<int64_t>(scale.element_count());
      if (scale.element_type() != F32 || tensors < 1 || a->shape.rows % tensors != 0)
        return ffi::Error::InvalidArgument("jax_rmsnorm: NVFP4's global scale must be float32, one per tensor");
      a->scale = static_cast<const float*>(scale.untyped_data());
      a->tensors = tensors;
    }
  }
  // The transposed copy: null or empty (not wanted), or q's codes as
  // (tensors, hidden, rows per tensor): kCurrent's q transposed, or kGroup's
  // columnwise copy with its scales qt_scales (tensors, hidden, rows per
  // tensor / group_size), in the group scales' dtype.
  const bool want_qt = qt && qt->element_count() != 0;
  const bool want_qt_scales = qt_scales && qt_scales->element_count() != 0;
  if (want_qt_scales && !(want_qt && a->quant == Quant::kGroup))
    return ffi::Error::InvalidArgument("jax_rmsnorm: q_t's scales go with per-group output's q_t");
  if (want_qt) {
    const bool group = a->quant == Quant::kGroup;
    if (!(a->quant == Quant::kCurrent || group) || static_cast<int64_t>(qt->element_count()) != n ||
        qt->element_type() != y.element_type())
      return ffi::Error::InvalidArgument(
          "jax_rmsnorm: q_t must be empty, or (current scaling, per-group output) q's size and dtype");
    if (group) {  // the tensors' count: scale's size (NVFP4's global scales, else a placeholder not read)
      const int64_t tensors = static_cast<int64_t>(scale.element_count());
      if (tensors < 1 || a->shape.rows % tensors != 0 || (a->shape.rows / tensors) % group_size != 0)
        return ffi::Error::InvalidArgument(
            "jax_rmsnorm: per-group q_t needs scale's size to count the tensors, of whole groups of rows");
      a->tensors = tensors;
      if (!want_qt_scales || static_cast<int64_t>(qt_scales->element_count()) != n / group_size ||
          qt_scales->element_type() != qs.element_type())
        return ffi::Error::InvalidArgument("jax_rmsnorm: q_t's scales must be one per group, in q's scales' dtype");
      a->qt_scales = qt_scales->untyped_data();
    }
    auto d = qt->dimensions();
    const int64_t rows = a->rows_per_tensor();
    if (d.size() < 2 || d[d.size() - 2] != a->shape.hidden || d[d.size() - 1] != rows)
      return ffi::Error::InvalidArgument("jax_rmsnorm: q_t must be (..., hidden, rows of a tensor)");
    a->qt = qt->untyped_data();
  }
  return ffi::Error::Success();
}

// Refuses group scales other than kFloat, and per-group output's transposed
// copy, on a backend without kernels for them (backend_group_scales).
template <class Backend>
inline ffi::Error check_group_scale(const FwdArgs& a) {
  if ((!backend_group_scales<Backend>() && a.group_scale != GroupScale::kFloat) ||
      (!backend_group_columns<Backend>() && a.qt_scales))
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_rmsnorm: block-scaled and power-of-two group scales, and per-group q_t, have no kernels on "
                      "this platform yet");
  return ffi::Error::Success();
}

}  // namespace jrn

// The attributes that follow the parameters' in the fused forward.
#define JRN_FUSED_FWD_ATTRS                                                         \
  .Attr<bool>("has_residual").Attr<int32_t>("quant").Attr<int64_t>("group_size") \
      .Attr<float>("scale_ub").Attr<int64_t>("x_group_size").Attr<int32_t>("group_scale")

// ---- The fused handlers of one platform (arguments as JRN_DEFINE_NORM_HANDLERS).
//
// Forward: (x, gamma, [beta,] residual, scale, x_scale) -> (y, [mean,] rstd, h,
// qs, qt, qt_scales), the absent ones empty placeholders. qs is amax (kTensor),
// the row scales (kRow), the group scales (kGroup) or scale_inv (kCurrent); qt
// is kCurrent's transposed copy of y or kGroup's columnwise copy, (tensors,
// hidden, rows per tensor), qt_scales the latter's scales. x_scale
// (with x_group_size > 0) dequantizes an FP8 x, one scale per group of
// columns; y is then in the kernel's element type. Backward: the plain
// backward's operands plus dh, added to dx.
#define JRN_DEFINE_FUSED_HANDLERS(PREFIX, BACKEND, BIND, CTX_DECL, CTX)                          \
  namespace jrn_fused_##PREFIX {                                                                \
  using namespace ::jrn;                                                                        \
  using ::xla::ffi::AnyBuffer;                                                                  \
  template <NormKind K>                                                                         \
  ::xla::ffi::Error Fwd(CTX_DECL AnyBuffer x, AnyBuffer gamma, const AnyBuffer* beta,           \
                        AnyBuffer residual, AnyBuffer scale, AnyBuffer xs, AnyBuffer y,         \
                        AnyBuffer* mean, AnyBuffer rstd, AnyBuffer h, AnyBuffer qs,             \
                        AnyBuffer qt, AnyBuffer qts, AnyBuffer ws, float eps,                   \
                        bool zc, bool has_gamma, bool has_beta, bool has_residual,              \
                        int32_t quant, int64_t group_size, float scale_ub, int64_t x_group,     \
                        int32_t group_scale) {                                                  \
    FwdArgs a;                                                                                  \
    if (auto e = decode_fused_fwd(K, x, gamma, beta, residual, scale, xs, y, mean, rstd, h, qs, \
                                  &qt, &qts, eps, zc, has_gamma, has_beta, has_residual, quant, \
                                  group_size, scale_ub, x_group, group_scale, &a);              \
        e.failure())                                                                            \
      return e;                                                                                 \
    if (auto e = check_group_scale<BACKEND>(a); e.failure()) return e;                          \
    if (ws.element_count() != 0) { /* q_t's block scales' scratch (CUDA: fwd_tiles) */          \
      if (!a.qt_scales || ws.size_bytes() != qts.size_bytes())                                  \
        return ::xla::ffi::Error::InvalidArgument(                                              \
            "jax_rmsnorm: the forward's workspace must be empty or of q_t's scales' size");     \
      a.qt_scales_ws = ws.untyped_data();                                                       \
    }                                                                                           \
    if (a.shape.rows == 0 && !a.tensor_amax())                                                  \
      return ::xla::ffi::Error::Success();                                                      \
    const AnyBuffer& xt = typed_input(x, y);                                                    \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        xt.element_type(), param_type(xt, gamma, beta, has_gamma, has_beta),                    \
        [&]<class T, class P>() { return BACKEND::fwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  }                                                                                             \
  JRN_HANDLER(PREFIX##RmsNormFwdFused,                                                             \
      JRN_BUFFERS(BIND, 5, 7).Attr<float>("eps") JRN_GAMMA_ATTRS JRN_FUSED_FWD_ATTRS,              \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf r, ::jrn::FfiBuf s,              \
         ::jrn::FfiBuf xs, ::jrn::FfiRet y, ::jrn::FfiRet rstd, ::jrn::FfiRet h,                   \
         ::jrn::FfiRet qs, ::jrn::FfiRet qt, ::jrn::FfiRet qts, ::jrn::FfiRet ws, float eps,       \
         bool zc, bool has_gamma, bool has_residual, int32_t quant, int64_t group_size,            \
         float scale_ub, int64_t x_group, int32_t group_scale) {                                   \
        return jrn_fused_##PREFIX::Fwd<::jrn::NormKind::kRms>(CTX x, g, nullptr, r, s, xs, *y,     \
                                                              nullptr, *rstd, *h, *qs, *qt, *qts,  \
                                                              *ws, eps, zc, has_gamma, false,      \
                                                              has_residual,                        \
                                                              quant, group_size, scale_ub,         \
                                                              x_group, group_scale);               \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormFwdFused,                                                           \
      JRN_BUFFERS(BIND, 6, 8).Attr<float>("eps") JRN_GAMMA_BETA_ATTRS JRN_FUSED_FWD_ATTRS,         \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf b, ::jrn::FfiBuf r,              \
         ::jrn::FfiBuf s, ::jrn::FfiBuf xs, ::jrn::FfiRet y, ::jrn::FfiRet mean,                   \
         ::jrn::FfiRet rstd, ::jrn::FfiRet h, ::jrn::FfiRet qs, ::jrn::FfiRet qt, ::jrn::FfiRet qts, \
         ::jrn::FfiRet ws, float eps, bool zc, bool has_gamma, bool has_beta, bool has_residual,   \
         int32_t quant, int64_t group_size, float scale_ub, int64_t x_group, int32_t group_scale) { \
        return jrn_fused_##PREFIX::Fwd<::jrn::NormKind::kLayer>(                                   \
            CTX x, g, &b, r, s, xs, *y, &*mean, *rstd, *h, *qs, *qt, *qts, *ws, eps, zc, has_gamma, \
            has_beta, has_residual, quant, group_size, scale_ub, x_group, group_scale);            \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormBwdAdd, JRN_BUFFERS(BIND, 5, 3) JRN_GAMMA_ATTRS,                      \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf rstd, ::jrn::FfiBuf g,          \
         ::jrn::FfiBuf dh, ::jrn::FfiRet dx, ::jrn::FfiRet dg, ::jrn::FfiRet ws, bool zc,          \
         bool has_gamma) {                                                                         \
        return jrn_handlers_##PREFIX::Bwd<::jrn::NormKind::kRms>(                                  \
            CTX dy, x, nullptr, rstd, g, *dx, *dg, nullptr, *ws, zc, has_gamma, false, nullptr, &dh); \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormBwdAdd, JRN_BUFFERS(BIND, 6, 4) JRN_GAMMA_BETA_ATTRS,               \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf mean, ::jrn::FfiBuf rstd,       \
         ::jrn::FfiBuf g, ::jrn::FfiBuf dh, ::jrn::FfiRet dx, ::jrn::FfiRet dg, ::jrn::FfiRet db,  \
         ::jrn::FfiRet ws, bool zc, bool has_gamma, bool has_beta) {                               \
        return jrn_handlers_##PREFIX::Bwd<::jrn::NormKind::kLayer>(                                \
            CTX dy, x, &mean, rstd, g, *dx, *dg, &*db, *ws, zc, has_gamma, has_beta, nullptr, &dh); \
      })
