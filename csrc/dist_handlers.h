// The FFI handlers of the distributed building blocks, defined once for both
// platforms (like JRN_DEFINE_NORM_HANDLERS, whose helpers they reuse):
//   *_stats       x -> per-row statistics of this slice of the hidden dim
//   *_add_stats   (x, residual) -> (the same statistics of h, h = x + residual)
//   *_grad_stats  (dy, x, [mean], rstd, gamma) -> per-row sum gdy*xhat (LayerNorm: and sum gdy)
//   *_apply       (x, gamma, [beta], [mean], rstd) -> y, with given statistics
//   *_apply_fp8   (x, gamma, [beta], [mean], rstd, scale) -> (q, qs): the same,
//                 y written as FP8 with given scales (one per tensor of
//                 consecutive rows: per tensor, or per row) or per-group scales
//   *_bwd_given   the backward with given per-row (c1, c2) coefficients
//   *_bwd_given_add  the same, with the residual's gradient dh added to dx
//                 (the residual add + norm with the hidden dim split)
//
// BACKEND additionally provides
//   template <NormKind K, class T> static ffi::Error stats(CTX, const StatsArgs&);
//   template <NormKind K, class T, class P> static ffi::Error grad_stats(CTX, const StatsArgs&);
#pragma once

#include "norm_fused.h"

namespace jrn {

// The per-row coefficients of the backward with given statistics (c1, and
// c2 for LayerNorm: grad_sums_per_row values a row).
inline ffi::Error check_coef(const ffi::AnyBuffer& coef, const ffi::AnyBuffer& x, NormKind kind) {
  const auto dims = x.dimensions();
  const int64_t hidden = dims.size() ? dims.back() : 0;
  const int64_t rows = hidden > 0 ? static_cast<int64_t>(x.element_count()) / hidden : 0;
  const int per_row = grad_sums_per_row(kind);
  if (coef.element_type() != ffi::DataType::F32 || static_cast<int64_t>(coef.element_count()) != per_row * rows)
    return ffi::Error::InvalidArgument(per_row == 1
                                           ? "jax_rmsnorm: coef must be float32 with one value per row"
                                           : "jax_rmsnorm: coef must be float32 with two values per row");
  return ffi::Error::Success();
}

inline ffi::Error check_out_stats(const ffi::AnyBuffer& out, int64_t rows, int64_t width) {
  if (out.element_type() != ffi::DataType::F32 || static_cast<int64_t>(out.element_count()) != rows * width)
    return ffi::Error::InvalidArgument("jax_rmsnorm: statistics output has the wrong size");
  return ffi::Error::Success();
}

}  // namespace jrn

// The quantization attributes that end both *_apply_fp8 bindings.
#define JRN_APPLY_FP8_ATTRS \
  .Attr<int32_t>("quant").Attr<int64_t>("group_size").Attr<float>("scale_ub").Attr<bool>("inverted").Attr<bool>("measure") \
      .Attr<int32_t>("group_scale")

#define JRN_DEFINE_DIST_HANDLERS(PREFIX, BACKEND, BIND, CTX_DECL, CTX)                           \
  namespace jrn_dist_##PREFIX {                                                                 \
  using namespace ::jrn;                                                                        \
  namespace xf = ::xla::ffi;                                                                    \
  /* With a residual (and h): h = x + residual is stored and its */                            \
  /* statistics taken, in one pass.                               */                            \
  template <NormKind K>                                                                         \
  xf::Error Stats(CTX_DECL xf::AnyBuffer x, const xf::AnyBuffer* residual, xf::AnyBuffer out,    \
                  xf::AnyBuffer* h) {                                                           \
    StatsArgs a;                                                                                \
    if (auto e = read_shape(x, x, false, &a.shape); e.failure()) return e;                      \
    if (auto e = check_out_stats(out, a.shape.rows, K == NormKind::kLayer ? 2 : 1); e.failure()) \
      return e;                                                                                 \
    if (residual) {                                                                             \
      if (auto e = decode_residual(*residual, *h, static_cast<int64_t>(x.element_count()),      \
                                   x.element_type(), &a);                                       \
          e.failure())                                                                          \
        return e;                                                                               \
    }                                                                                           \
    if (a.shape.rows == 0) return xf::Error::Success();                                         \
    a.x = x.untyped_data();                                                                     \
    a.out = static_cast<float*>(out.untyped_data());                                            \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), x.element_type(),                                                     \
        [&]<class T, class P>() { return BACKEND::stats<K, T>(CTX a); });                       \
  }                                                                                             \
  template <NormKind K>                                                                         \
  xf::Error GradStats(CTX_DECL xf::AnyBuffer dy, xf::AnyBuffer x, const xf::AnyBuffer* mean,    \
                      xf::AnyBuffer rstd, xf::AnyBuffer gamma, xf::AnyBuffer out, bool zc,      \
                      bool has_gamma) {                                                         \
    StatsArgs a;                                                                                \
    if (auto e = read_shape(x, gamma, has_gamma, &a.shape); e.failure()) return e;              \
    if (auto e = check_same(x, dy, "dy must match x in shape and dtype"); e.failure()) return e; \
    if (auto e = check_stats(rstd, a.shape.rows, "rstd"); e.failure()) return e;                \
    if (mean) {                                                                                 \
      if (auto e = check_stats(*mean, a.shape.rows, "mean"); e.failure()) return e;             \
      a.mean = static_cast<const float*>(mean->untyped_data());                                 \
    }                                                                                           \
    if (auto e = check_out_stats(out, a.shape.rows, grad_sums_per_row(K)); e.failure()) return e; \
    if (a.shape.rows == 0) return xf::Error::Success();                                         \
    a.x = x.untyped_data();                                                                     \
    a.dy = dy.untyped_data();                                                                   \
    a.rstd = static_cast<const float*>(rstd.untyped_data());                                    \
    a.gamma = has_gamma ? gamma.untyped_data() : nullptr;                                       \
    a.zero_centered = zc;                                                                       \
    a.out = static_cast<float*>(out.untyped_data());                                            \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), has_gamma ? gamma.element_type() : x.element_type(),                  \
        [&]<class T, class P>() { return BACKEND::grad_stats<K, T, P>(CTX a); });               \
  }                                                                                             \
  template <NormKind K>                                                                         \
  xf::Error Apply(CTX_DECL xf::AnyBuffer x, xf::AnyBuffer gamma, const xf::AnyBuffer* beta,     \
                  xf::AnyBuffer* mean, xf::AnyBuffer rstd, xf::AnyBuffer y, bool zc,            \
                  bool has_gamma, bool has_beta) {                                              \
    FwdArgs a;                                                                                  \
    if (auto e = decode_fwd(K, x, gamma, beta, y, mean, rstd, 0.f, zc, has_gamma, has_beta, &a); \
        e.failure())                                                                            \
      return e;                                                                                 \
    a.given_stats = true;                                                                       \
    if (a.shape.rows == 0) return xf::Error::Success();                                         \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), param_type(x, gamma, beta, has_gamma, has_beta),                      \
        [&]<class T, class P>() { return BACKEND::fwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  /* With given statistics, y as FP8: quant 1 (kTensor), q = y * scale[t] */ \
  /* (y / scale[t] with `inverted`) for each tensor t of consecutive rows,  */ \
  /* as many tensors as scales (one a row for per-row scales), max |y| of   */ \
  /* each into qs; with `measure`, qs alone (q, not written, may be        */ \
  /* empty). quant 3 (kGroup): the scales of this slice's groups into qs.   */ \
  template <NormKind K>                                                                         \
  xf::Error ApplyFp8(CTX_DECL xf::AnyBuffer x, xf::AnyBuffer gamma, const xf::AnyBuffer* beta,  \
                     xf::AnyBuffer* mean, xf::AnyBuffer rstd, xf::AnyBuffer scale, xf::AnyBuffer q, \
                     xf::AnyBuffer qs, bool zc, bool has_gamma, bool has_beta, int32_t quant,   \
                     int64_t group_size, float scale_ub, bool inverted, bool measure,           \
                     int32_t group_scale) {                                                     \
    const bool given = quant == static_cast<int32_t>(Quant::kTensor);                           \
    if (!given && quant != static_cast<int32_t>(Quant::kGroup))                                 \
      return xf::Error::InvalidArgument(                                                        \
          "jax_rmsnorm: apply_fp8 takes quant 1 (given scales) or 3 (per group)");              \
    if (!given && (inverted || measure))                                                        \
      return xf::Error::InvalidArgument("jax_rmsnorm: inverted and measure go with quant 1");    \
    FwdArgs a;                                                                                  \
    a.no_output = measure;                                                                      \
    /* x stands in for the absent residual, h and x_scale (none is read). */                    \
    if (auto e = decode_fused_fwd(K, x, gamma, beta, x, scale, x, q, mean, rstd, x, qs,          \
                                  nullptr, nullptr, 0.f, zc, has_gamma, has_beta, false, quant, \
                                  group_size, scale_ub, 0, group_scale, &a);                    \
        e.failure())                                                                            \
      return e;                                                                                 \
    if (auto e = check_group_scale<BACKEND>(a); e.failure()) return e;                          \
    a.given_stats = true;                                                                       \
    a.scale_inverted = inverted;                                                                \
    if (a.shape.rows == 0 && !given) return xf::Error::Success();                               \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), param_type(x, gamma, beta, has_gamma, has_beta),                      \
        [&]<class T, class P>() { return BACKEND::fwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  /* The backward with given coefficients (and, with dh, the residual's */                      \
  /* gradient added to dx): the kernels of the plain backward.          */                      \
  template <NormKind K>                                                                         \
  xf::Error BwdGiven(CTX_DECL xf::AnyBuffer dy, xf::AnyBuffer x, const xf::AnyBuffer* mean,     \
                     xf::AnyBuffer rstd, xf::AnyBuffer g, xf::AnyBuffer coef, xf::AnyBuffer dx, \
                     xf::AnyBuffer dg, xf::AnyBuffer* db, xf::AnyBuffer ws, bool zc,            \
                     bool has_gamma, bool has_beta, const xf::AnyBuffer* dh) {                  \
    if (auto e = check_coef(coef, x, K); e.failure()) return e;                                 \
    return jrn_handlers_##PREFIX::Bwd<K>(                                                       \
        CTX dy, x, mean, rstd, g, dx, dg, db, ws, zc, has_gamma, has_beta,                      \
        static_cast<const float*>(coef.untyped_data()), dh);                                    \
  }                                                                                             \
  }                                                                                             \
  JRN_HANDLER(PREFIX##RmsNormStats, JRN_BUFFERS(BIND, 1, 1),                                       \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiRet out) {                                            \
        return jrn_dist_##PREFIX::Stats<::jrn::NormKind::kRms>(CTX x, nullptr, *out, nullptr);     \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormStats, JRN_BUFFERS(BIND, 1, 1),                                     \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiRet out) {                                            \
        return jrn_dist_##PREFIX::Stats<::jrn::NormKind::kLayer>(CTX x, nullptr, *out, nullptr);   \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormAddStats, JRN_BUFFERS(BIND, 2, 2),                                    \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf res, ::jrn::FfiRet out, ::jrn::FfiRet h) {        \
        return jrn_dist_##PREFIX::Stats<::jrn::NormKind::kRms>(CTX x, &res, *out, &*h);            \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormAddStats, JRN_BUFFERS(BIND, 2, 2),                                  \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf res, ::jrn::FfiRet out, ::jrn::FfiRet h) {        \
        return jrn_dist_##PREFIX::Stats<::jrn::NormKind::kLayer>(CTX x, &res, *out, &*h);          \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormGradStats, JRN_BUFFERS(BIND, 4, 1) JRN_GAMMA_ATTRS,                   \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf rstd, ::jrn::FfiBuf g,          \
         ::jrn::FfiRet out, bool zc, bool has_gamma) {                                             \
        return jrn_dist_##PREFIX::GradStats<::jrn::NormKind::kRms>(CTX dy, x, nullptr, rstd, g,    \
                                                                    *out, zc, has_gamma);          \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormGradStats, JRN_BUFFERS(BIND, 5, 1) JRN_GAMMA_ATTRS,                 \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf mean, ::jrn::FfiBuf rstd,       \
         ::jrn::FfiBuf g, ::jrn::FfiRet out, bool zc, bool has_gamma) {                            \
        return jrn_dist_##PREFIX::GradStats<::jrn::NormKind::kLayer>(CTX dy, x, &mean, rstd, g,    \
                                                                      *out, zc, has_gamma);        \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormApply, JRN_BUFFERS(BIND, 3, 1) JRN_GAMMA_ATTRS,                       \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf rstd, ::jrn::FfiRet y, bool zc,  \
         bool has_gamma) {                                                                         \
        return jrn_dist_##PREFIX::Apply<::jrn::NormKind::kRms>(CTX x, g, nullptr, nullptr, rstd,   \
                                                                *y, zc, has_gamma, false);         \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormApply, JRN_BUFFERS(BIND, 5, 1) JRN_GAMMA_BETA_ATTRS,                \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf b, ::jrn::FfiBuf mean,           \
         ::jrn::FfiBuf rstd, ::jrn::FfiRet y, bool zc, bool has_gamma, bool has_beta) {            \
        return jrn_dist_##PREFIX::Apply<::jrn::NormKind::kLayer>(CTX x, g, &b, &mean, rstd, *y,    \
                                                                  zc, has_gamma, has_beta);        \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormApplyFp8,                                                             \
      JRN_BUFFERS(BIND, 4, 2) JRN_GAMMA_ATTRS JRN_APPLY_FP8_ATTRS,                                 \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf rstd, ::jrn::FfiBuf s,           \
         ::jrn::FfiRet q, ::jrn::FfiRet qs, bool zc, bool has_gamma, int32_t quant,                \
         int64_t group_size, float scale_ub, bool inverted, bool measure, int32_t group_scale) {   \
        return jrn_dist_##PREFIX::ApplyFp8<::jrn::NormKind::kRms>(                                 \
            CTX x, g, nullptr, nullptr, rstd, s, *q, *qs, zc, has_gamma, false, quant, group_size, \
            scale_ub, inverted, measure, group_scale);                                             \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormApplyFp8,                                                           \
      JRN_BUFFERS(BIND, 6, 2) JRN_GAMMA_BETA_ATTRS JRN_APPLY_FP8_ATTRS,                            \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf b, ::jrn::FfiBuf mean,           \
         ::jrn::FfiBuf rstd, ::jrn::FfiBuf s, ::jrn::FfiRet q, ::jrn::FfiRet qs, bool zc,          \
         bool has_gamma, bool has_beta, int32_t quant, int64_t group_size, float scale_ub,         \
         bool inverted, bool measure, int32_t group_scale) {                                       \
        return jrn_dist_##PREFIX::ApplyFp8<::jrn::NormKind::kLayer>(                               \
            CTX x, g, &b, &mean, rstd, s, *q, *qs, zc, has_gamma, has_beta, quant, group_size,     \
            scale_ub, inverted, measure, group_scale);                                             \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormBwdGiven, JRN_BUFFERS(BIND, 5, 3) JRN_GAMMA_ATTRS,                    \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf rstd, ::jrn::FfiBuf g,          \
         ::jrn::FfiBuf coef, ::jrn::FfiRet dx, ::jrn::FfiRet dg, ::jrn::FfiRet ws, bool zc,        \
         bool has_gamma) {                                                                         \
        return jrn_dist_##PREFIX::BwdGiven<::jrn::NormKind::kRms>(                                 \
            CTX dy, x, nullptr, rstd, g, coef, *dx, *dg, nullptr, *ws, zc, has_gamma, false, nullptr); \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormBwdGiven, JRN_BUFFERS(BIND, 6, 4) JRN_GAMMA_BETA_ATTRS,             \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf mean, ::jrn::FfiBuf rstd,       \
         ::jrn::FfiBuf g, ::jrn::FfiBuf coef, ::jrn::FfiRet dx, ::jrn::FfiRet dg,                  \
         ::jrn::FfiRet db, ::jrn::FfiRet ws, bool zc, bool has_gamma, bool has_beta) {             \
        return jrn_dist_##PREFIX::BwdGiven<::jrn::NormKind::kLayer>(                               \
            CTX dy, x, &mean, rstd, g, coef, *dx, *dg, &*db, *ws, zc, has_gamma, has_beta, nullptr); \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormBwdGivenAdd, JRN_BUFFERS(BIND, 6, 3) JRN_GAMMA_ATTRS,                 \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf rstd, ::jrn::FfiBuf g,          \
         ::jrn::FfiBuf coef, ::jrn::FfiBuf dh, ::jrn::FfiRet dx, ::jrn::FfiRet dg,                 \
         ::jrn::FfiRet ws, bool zc, bool has_gamma) {                                              \
        return jrn_dist_##PREFIX::BwdGiven<::jrn::NormKind::kRms>(                                 \
            CTX dy, x, nullptr, rstd, g, coef, *dx, *dg, nullptr, *ws, zc, has_gamma, false, &dh); \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormBwdGivenAdd, JRN_BUFFERS(BIND, 7, 4) JRN_GAMMA_BETA_ATTRS,          \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf mean, ::jrn::FfiBuf rstd,       \
         ::jrn::FfiBuf g, ::jrn::FfiBuf coef, ::jrn::FfiBuf dh, ::jrn::FfiRet dx,                  \
         ::jrn::FfiRet dg, ::jrn::FfiRet db, ::jrn::FfiRet ws, bool zc, bool has_gamma,            \
         bool has_beta) {                                                                          \
        return jrn_dist_##PREFIX::BwdGiven<::jrn::NormKind::kLayer>(                               \
            CTX dy, x, &mean, rstd, g, coef, *dx, *dg, &*db, *ws, zc, has_gamma, has_beta, &dh);   \
      })
