// The fused variants' host-side pieces, shared by the CPU and CUDA handlers:
// residual add (h = x + residual, normalized and stored) and FP8 output
// scaled per tensor, per row or per group of columns; the backward with the
// residual's gradient added to dx.
#pragma once

#include <cstdint>
#include <string>

#include "norm_common.h"

namespace jrn {

// Largest finite value of each FP8 format; quantization saturates there.
JRN_HOST_DEVICE inline float fp8_max(Fp8 f) { return f == Fp8::kE4M3 ? 448.f : 57344.f; }

// Smallest per-row / per-group scale: an all-zero row quantizes to zeros with
// this scale instead of dividing by zero.
constexpr float kMinQuantScale = 1e-12f;

// The scale of a row or group whose largest |y| is `amax`:
// max(min(amax / fp8_max, ub), kMinQuantScale); NaN stays NaN.
JRN_HOST_DEVICE inline float quant_scale(float amax, Fp8 f, float ub) {
  float s = amax / fp8_max(f);
  if (s != s) return s;
  s = s < ub ? s : ub;
  return s > kMinQuantScale ? s : kMinQuantScale;
}

inline ffi::Error check_kind(const ffi::AnyBuffer& b, int64_t count, ffi::DataType t1, ffi::DataType t2,
                             const char* what) {
  if (static_cast<int64_t>(b.element_count()) != count ||
      (b.element_type() != t1 && b.element_type() != t2)) {
    return ffi::Error::InvalidArgument(std::string("jax_rmsnorm: ") + what);
  }
  return ffi::Error::Success();
}

// decode_fwd for the fused forward, then the residual and quantization
// buffers. `quant` is a Quant value.
inline ffi::Error decode_fused_fwd(NormKind kind, const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                                   const ffi::AnyBuffer* beta, const ffi::AnyBuffer& residual,
                                   const ffi::AnyBuffer& scale, ffi::AnyBuffer& y, ffi::AnyBuffer* mean,
                                   ffi::AnyBuffer& rstd, ffi::AnyBuffer& h, ffi::AnyBuffer& qs, float eps,
                                   bool zero_centered, bool has_gamma, bool has_beta, bool has_residual,
                                   int32_t quant, int64_t group_size, float scale_ub, FwdArgs* a) {
  if (quant < 0 || quant > static_cast<int32_t>(Quant::kCurrent))
    return ffi::Error::InvalidArgument("jax_rmsnorm: unknown quantization mode");
  a->quant = static_cast<Quant>(quant);
  // With FP8 output, y's dtype differs from x's: decode_fwd checks a stand-in.
  ffi::AnyBuffer y_checked = a->quant == Quant::kNone ? y : x;
  if (auto e = decode_fwd(kind, x, gamma, beta, y_checked, mean, rstd, eps, zero_centered, has_gamma,
                          has_beta, a);
      e.failure())
    return e;
  const int64_t n = a->shape.rows * a->shape.hidden;
  const auto F32 = ffi::DataType::F32;
  if (has_residual) {
    if (auto e = check_kind(residual, n, x.element_type(), F32,
                            "residual must have x's shape, and x's dtype or float32");
        e.failure())
      return e;
    if (auto e = check_kind(h, n, x.element_type(), F32, "h must have x's shape, and x's dtype or float32");
        e.failure())
      return e;
    a->residual = residual.untyped_data();
    a->residual_f32 = residual.element_type() == F32;
    a->h = h.untyped_data();
    a->h_f32 = h.element_type() == F32;
  }
  if (a->quant == Quant::kNone) return ffi::Error::Success();
  if (y.element_type() == ffi::DataType::F8E4M3FN) {
    a->fp8 = Fp8::kE4M3;
  } else if (y.element_type() == ffi::DataType::F8E5M2) {
    a->fp8 = Fp8::kE5M2;
  } else {
    return ffi::Error::InvalidArgument("jax_rmsnorm: FP8 output must be float8_e4m3fn or float8_e5m2");
  }
  if (static_cast<int64_t>(y.element_count()) != n)
    return ffi::Error::InvalidArgument("jax_rmsnorm: the FP8 output must have x's shape");
  a->y = y.untyped_data();
  if (!(scale_ub > 0.f)) return ffi::Error::InvalidArgument("jax_rmsnorm: scale_ub must be > 0");
  a->scale_ub = scale_ub;
  if (a->quant == Quant::kTensor || a->quant == Quant::kCurrent) {
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
    if (auto e = check_kind(qs, n / group_size, F32, F32, "group scales must be float32, one per group");
        e.failure())
      return e;
    a->qscale = static_cast<float*>(qs.untyped_data());
    a->group_size = group_size;
  }
  return ffi::Error::Success();
}

// An FP8 array (..., rows, cols) and its transpose (..., cols, rows): the
// leading dimensions are a batch.
// dims: batch, rows, cols.
inline ffi::Error decode_transpose(const ffi::AnyBuffer& q, const ffi::AnyBuffer& qt, int64_t* dims) {
  int64_t *batch = dims, *rows = dims + 1, *cols = dims + 2;
  auto d = q.dimensions();
  auto dt = qt.dimensions();
  if (d.size() < 2 || dt.size() != d.size())
    return ffi::Error::InvalidArgument("jax_rmsnorm: the transpose needs rank >= 2");
  const auto t = q.element_type();
  if ((t != ffi::DataType::F8E4M3FN && t != ffi::DataType::F8E5M2) || qt.element_type() != t)
    return ffi::Error::InvalidArgument("jax_rmsnorm: the transpose takes FP8 arrays of one dtype");
  *rows = d[d.size() - 2];
  *cols = d[d.size() - 1];
  if (dt[dt.size() - 2] != *cols || dt[dt.size() - 1] != *rows || qt.element_count() != q.element_count())
    return ffi::Error::InvalidArgument("jax_rmsnorm: the transpose's output must be (..., cols, rows)");
  *batch = *rows * *cols > 0 ? static_cast<int64_t>(q.element_count()) / (*rows * *cols) : 0;
  return ffi::Error::Success();
}

}  // namespace jrn

// ---- The fused handlers of one platform (arguments as JRN_DEFINE_NORM_HANDLERS).
//
// Forward: (x, gamma, [beta,] residual, scale) -> (y, [mean,] rstd, h, qs), the
// absent ones empty placeholders. qs is amax (kTensor), the row scales (kRow),
// the group scales (kGroup) or scale_inv (kCurrent). Backward: the plain
// backward's operands plus dh, added to dx. Fp8Transpose: q (..., rows, cols)
// -> q_t (..., cols, rows), bytes moved as they are.
#define JRN_DEFINE_FUSED_HANDLERS(PREFIX, BACKEND, BIND, CTX_DECL, CTX)                          \
  namespace jrn_fused_##PREFIX {                                                                \
  using namespace ::jrn;                                                                        \
  using ::xla::ffi::AnyBuffer;                                                                  \
  template <NormKind K>                                                                         \
  ::xla::ffi::Error Fwd(CTX_DECL AnyBuffer x, AnyBuffer gamma, const AnyBuffer* beta,           \
                        AnyBuffer residual, AnyBuffer scale, AnyBuffer y, AnyBuffer* mean,      \
                        AnyBuffer rstd, AnyBuffer h, AnyBuffer qs, float eps, bool zc,          \
                        bool has_gamma, bool has_beta, bool has_residual, int32_t quant,        \
                        int64_t group_size, float scale_ub) {                                   \
    FwdArgs a;                                                                                  \
    if (auto e = decode_fused_fwd(K, x, gamma, beta, residual, scale, y, mean, rstd, h, qs, eps, \
                                  zc, has_gamma, has_beta, has_residual, quant, group_size,     \
                                  scale_ub, &a);                                                \
        e.failure())                                                                            \
      return e;                                                                                 \
    if (a.shape.rows == 0 && a.quant != Quant::kTensor && a.quant != Quant::kCurrent)           \
      return ::xla::ffi::Error::Success();                                                      \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), param_type(x, gamma, beta, has_gamma, has_beta),                      \
        [&]<class T, class P>() { return BACKEND::fwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  template <NormKind K>                                                                         \
  ::xla::ffi::Error Bwd(CTX_DECL AnyBuffer dy, AnyBuffer x, const AnyBuffer* mean, AnyBuffer rstd, \
                        AnyBuffer gamma, AnyBuffer dh, AnyBuffer dx, AnyBuffer dgamma,          \
                        AnyBuffer* dbeta, float* ws, int64_t ws_floats, bool zc, bool has_gamma, \
                        bool has_beta) {                                                        \
    BwdArgs a;                                                                                  \
    if (auto e = decode_bwd(K, dy, x, mean, rstd, gamma, dx, dgamma, dbeta, zc, has_gamma,       \
                            has_beta, &a);                                                      \
        e.failure())                                                                            \
      return e;                                                                                 \
    if (auto e = check_same(x, dh, "dh must match x in shape and dtype"); e.failure()) return e; \
    a.dh = dh.untyped_data();                                                                   \
    if (a.shape.rows == 0 && a.param_outputs() == 0) return ::xla::ffi::Error::Success();       \
    const int64_t per_slot = a.shape.groups * a.param_outputs() * a.shape.hidden;               \
    a.workspace = per_slot > 0 ? ws : nullptr;                                                  \
    a.slots = per_slot > 0 ? ws_floats / per_slot : 0;                                          \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), has_gamma ? gamma.element_type() : dgamma.element_type(),             \
        [&]<class T, class P>() { return BACKEND::bwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  }                                                                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      PREFIX##RmsNormFwdFused,                                                                  \
      [](CTX_DECL ::xla::ffi::AnyBuffer x, ::xla::ffi::AnyBuffer g, ::xla::ffi::AnyBuffer r,    \
         ::xla::ffi::AnyBuffer s, ::xla::ffi::Result<::xla::ffi::AnyBuffer> y,                  \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> rstd, ::xla::ffi::Result<::xla::ffi::AnyBuffer> h, \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> qs, float eps, bool zc, bool has_gamma,       \
         bool has_residual, int32_t quant, int64_t group_size, float scale_ub) {                \
        return jrn_fused_##PREFIX::Fwd<::jrn::NormKind::kRms>(CTX x, g, nullptr, r, s, *y, nullptr, \
                                                              *rstd, *h, *qs, eps, zc, has_gamma, \
                                                              false, has_residual, quant,       \
                                                              group_size, scale_ub);            \
      },                                                                                        \
      BIND.Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Attr<float>("eps")                                                                   \
          .Attr<bool>("zero_centered_gamma")                                                    \
          .Attr<bool>("has_gamma")                                                              \
          .Attr<bool>("has_residual")                                                           \
          .Attr<int32_t>("quant")                                                               \
          .Attr<int64_t>("group_size")                                                          \
          .Attr<float>("scale_ub"),                                                             \
      {::xla::ffi::Traits::kCmdBufferCompatible});                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      PREFIX##LayerNormFwdFused,                                                                \
      [](CTX_DECL ::xla::ffi::AnyBuffer x, ::xla::ffi::AnyBuffer g, ::xla::ffi::AnyBuffer b,    \
         ::xla::ffi::AnyBuffer r, ::xla::ffi::AnyBuffer s, ::xla::ffi::Result<::xla::ffi::AnyBuffer> y, \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> mean, ::xla::ffi::Result<::xla::ffi::AnyBuffer> rstd, \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> h, ::xla::ffi::Result<::xla::ffi::AnyBuffer> qs, \
         float eps, bool zc, bool has_gamma, bool has_beta, bool has_residual, int32_t quant,   \
         int64_t group_size, float scale_ub) {                                                  \
        return jrn_fused_##PREFIX::Fwd<::jrn::NormKind::kLayer>(                                \
            CTX x, g, &b, r, s, *y, &*mean, *rstd, *h, *qs, eps, zc, has_gamma, has_beta,       \
            has_residual, quant, group_size, scale_ub);                                         \
      },                                                                                        \
      BIND.Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Attr<float>("eps")                                                                   \
          .Attr<bool>("zero_centered_gamma")                                                    \
          .Attr<bool>("has_gamma")                                                              \
          .Attr<bool>("has_beta")                                                               \
          .Attr<bool>("has_residual")                                                           \
          .Attr<int32_t>("quant")                                                               \
          .Attr<int64_t>("group_size")                                                          \
          .Attr<float>("scale_ub"),                                                             \
      {::xla::ffi::Traits::kCmdBufferCompatible});                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      PREFIX##RmsNormBwdAdd,                                                                    \
      [](CTX_DECL ::xla::ffi::AnyBuffer dy, ::xla::ffi::AnyBuffer x, ::xla::ffi::AnyBuffer rstd, \
         ::xla::ffi::AnyBuffer g, ::xla::ffi::AnyBuffer dh,                                     \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> dx, ::xla::ffi::Result<::xla::ffi::AnyBuffer> dg, \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> ws, bool zc, bool has_gamma) {               \
        return jrn_fused_##PREFIX::Bwd<::jrn::NormKind::kRms>(                                  \
            CTX dy, x, nullptr, rstd, g, dh, *dx, *dg, nullptr,                                 \
            static_cast<float*>(ws->untyped_data()), static_cast<int64_t>(ws->element_count()), \
            zc, has_gamma, false);                                                              \
      },                                                                                        \
      BIND.Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Attr<bool>("zero_centered_gamma")                                                    \
          .Attr<bool>("has_gamma"),                                                             \
      {::xla::ffi::Traits::kCmdBufferCompatible});                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      PREFIX##LayerNormBwdAdd,                                                                  \
      [](CTX_DECL ::xla::ffi::AnyBuffer dy, ::xla::ffi::AnyBuffer x, ::xla::ffi::AnyBuffer mean, \
         ::xla::ffi::AnyBuffer rstd, ::xla::ffi::AnyBuffer g, ::xla::ffi::AnyBuffer dh,         \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> dx, ::xla::ffi::Result<::xla::ffi::AnyBuffer> dg, \
         ::xla::ffi::Result<::xla::ffi::AnyBuffer> db, ::xla::ffi::Result<::xla::ffi::AnyBuffer> ws, \
         bool zc, bool has_gamma, bool has_beta) {                                              \
        return jrn_fused_##PREFIX::Bwd<::jrn::NormKind::kLayer>(                                \
            CTX dy, x, &mean, rstd, g, dh, *dx, *dg, &*db,                                      \
            static_cast<float*>(ws->untyped_data()), static_cast<int64_t>(ws->element_count()), \
            zc, has_gamma, has_beta);                                                           \
      },                                                                                        \
      BIND.Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Arg<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Ret<::xla::ffi::AnyBuffer>()                                                         \
          .Attr<bool>("zero_centered_gamma")                                                    \
          .Attr<bool>("has_gamma")                                                              \
          .Attr<bool>("has_beta"),                                                              \
      {::xla::ffi::Traits::kCmdBufferCompatible});                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      PREFIX##Fp8Transpose,                                                                     \
      [](CTX_DECL ::xla::ffi::AnyBuffer q, ::xla::ffi::Result<::xla::ffi::AnyBuffer> qt) {      \
        int64_t dims[3] = {};  /* batch, rows, cols */                                          \
        if (auto e = ::jrn::decode_transpose(q, *qt, dims); e.failure()) return e;              \
        if (dims[0] * dims[1] * dims[2] == 0) return ::xla::ffi::Error::Success();              \
        return BACKEND::transpose8(CTX q.untyped_data(), qt->untyped_data(), dims[0], dims[1], dims[2]); \
      },                                                                                        \
      BIND.Arg<::xla::ffi::AnyBuffer>().Ret<::xla::ffi::AnyBuffer>(),                           \
      {::xla::ffi::Traits::kCmdBufferCompatible})
