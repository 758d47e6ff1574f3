// Host-side pieces shared by the CPU and CUDA FFI handlers: the problem shape
// read off the FFI buffers, and the argument checks every handler makes.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "norm_types.h"
#include "xla/ffi/api/ffi.h"

#if defined(__CUDACC__)
#define JRN_HOST_DEVICE __host__ __device__
#else
#define JRN_HOST_DEVICE
#endif

namespace jrn {

namespace ffi = xla::ffi;

// A normalization problem: `rows` rows of `hidden` elements. The parameters
// (gamma, beta) have `groups` rows; row r uses parameter row r / (rows / groups).
// groups > 1 comes from vmapping over the parameters.
struct NormShape {
  int64_t rows = 0;
  int64_t hidden = 0;
  int64_t groups = 1;
  JRN_HOST_DEVICE int64_t rows_per_group() const { return groups > 0 ? rows / groups : 0; }
  // Offset of `row`'s gamma/beta (groups > 1: vmapped parameters); one group
  // costs no 64-bit division.
  JRN_HOST_DEVICE int64_t param_offset(int64_t row) const {
    return groups == 1 ? 0 : (row / rows_per_group()) * hidden;
  }
};

inline bool is_float_type(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

inline const char* dtype_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F64: return "float64";
    default: return "an unsupported dtype";
  }
}

// Reads rows/hidden from x and groups from the parameter buffer (gamma, or beta
// when there is no gamma). `param_present` is false when neither is given.
inline ffi::Error read_shape(const ffi::AnyBuffer& x, const ffi::AnyBuffer& param,
                             bool param_present, NormShape* shape) {
  auto dims = x.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("jax_rmsnorm: x must have rank >= 1");
  shape->hidden = dims.back();
  // Kernels index the columns of a row with 32-bit integers.
  if (shape->hidden > INT32_MAX)
    return ffi::Error::InvalidArgument("jax_rmsnorm: the hidden size must be below 2^31");
  shape->rows = shape->hidden > 0 ? static_cast<int64_t>(x.element_count()) / shape->hidden : 0;
  shape->groups = 1;
  if (!is_float_type(x.element_type())) {
    return ffi::Error::InvalidArgument(std::string("jax_rmsnorm: x has dtype ") +
                                       dtype_name(x.element_type()) +
                                       ", expected float32, bfloat16 or float16");
  }
  if (param_present) {
    auto pdims = param.dimensions();
    if (pdims.size() < 1 || pdims.back() != shape->hidden) {
      return ffi::Error::InvalidArgument("jax_rmsnorm: gamma/beta length must equal x's hidden size");
    }
    shape->groups = shape->hidden > 0 ? static_cast<int64_t>(param.element_count()) / shape->hidden : 1;
    if (shape->groups < 1 || shape->rows % shape->groups != 0) {
      return ffi::Error::InvalidArgument("jax_rmsnorm: parameter groups must divide the rows of x");
    }
    if (param.element_type() != ffi::DataType::F32 && param.element_type() != x.element_type()) {
      return ffi::Error::InvalidArgument("jax_rmsnorm: gamma/beta dtype must be float32 or x's dtype");
    }
  }
  return ffi::Error::Success();
}

inline ffi::Error check_same(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const char* what) {
  if (a.element_count() != b.element_count() || a.element_type() != b.element_type()) {
    return ffi::Error::InvalidArgument(std::string("jax_rmsnorm: ") + what);
  }
  return ffi::Error::Success();
}

inline ffi::Error check_stats(const ffi::AnyBuffer& s, int64_t rows, const char* name) {
  if (s.element_type() != ffi::DataType::F32 || static_cast<int64_t>(s.element_count()) != rows) {
    return ffi::Error::InvalidArgument(std::string("jax_rmsnorm: ") + name +
                                       " must be float32 with one value per row");
  }
  return ffi::Error::Success();
}

// Calls f.template operator()<T, P>() with T the element type of x and P the
// parameter type (float or T), or returns an error for an unsupported pair.
template <typename Bf16, typename F16, typename F>
ffi::Error dispatch_types(ffi::DataType x_type, ffi::DataType p_type, F&& f) {
  const bool p32 = p_type == ffi::DataType::F32;
  switch (x_type) {
    case ffi::DataType::F32: return f.template operator()<float, float>();
    case ffi::DataType::BF16:
      return p32 ? f.template operator()<Bf16, float>() : f.template operator()<Bf16, Bf16>();
    case ffi::DataType::F16:
      return p32 ? f.template operator()<F16, float>() : f.template operator()<F16, F16>();
    default:
      return ffi::Error::InvalidArgument(std::string("jax_rmsnorm: unsupported dtype ") +
                                         dtype_name(x_type));
  }
}

// The parameters of the common case (FwdArgs::plain_params; a kernel may ask
// of the pointers it holds, offset to the row's parameter group).
template <NormKind K>
JRN_HOST_DEVICE inline bool plain_params(const void* gamma, const void* beta, bool zero_centered) {
  return gamma != nullptr && (K == NormKind::kRms || beta != nullptr) && !zero_centered;
}

// Everything a forward kernel needs. Pointers are typed by the dispatch.
struct FwdArgs {
  NormShape shape;
  const void* x = nullptr;
  const void* gamma = nullptr;  // null: no scale
  const void* beta = nullptr;   // null: no shift
  void* y = nullptr;
  float* mean = nullptr;  // LayerNorm only
  float* rstd = nullptr;
  float eps = 0.f;
  bool zero_centered = false;  // scale is (1 + gamma)
  // "Apply" mode (hidden dim split across devices): mean/rstd are inputs,
  // already combined across the devices; only y is written.
  bool given_stats = false;
  // Fused variants (norm_fused.h); left at these defaults by the plain norm.
  const void* residual = nullptr;  // h = x + residual is stored to `h` and normalized
  void* h = nullptr;
  bool residual_f32 = false;  // residual / h are float32 (else x's dtype)
  bool h_f32 = false;
  Quant quant = Quant::kNone;  // y is FP8 in format `fp8`
  Fp8 fp8 = Fp8::kE4M3;
  const float* scale = nullptr;  // kTensor: q = y * scale[t], one per tensor t
  float* amax = nullptr;         // kTensor: max |y| of tensor t (zeroed before the kernel)
                                 // kCurrent: the scale_inv output
  void* qt = nullptr;            // kCurrent: q transposed, (tensors, hidden, rows per tensor); null: not wanted
                                 // kGroup: the columnwise copy, y transposed so and quantized along
                                 // its rows in groups of group_size (CPU only)
  void* qt_scales = nullptr;     // kGroup with qt: its scales, (tensors, hidden, rows per tensor /
                                 // group_size), float32 or block_scales' bytes
  void* qt_scales_ws = nullptr;  // (CUDA, the block formats) scratch of qt_scales' size: fwd_tiles writes
                                 // them there as (tensors, rows per tensor / group_size, hidden), then
                                 // transposes them into qt_scales
  bool scale_inverted = false;   // kTensor: q = y / scale[t] (CUDA: current scaling's 2nd pass)
  bool no_output = false;        // kTensor: amax only, y and h not written (CUDA: its 1st pass)
  int64_t tensors = 0;           // kTensor: x's rows split evenly into tensors (vmap)
  float* qscale = nullptr;       // kRow: one per row; kGroup: rows x (hidden / group_size)
  float scale_ub = std::numeric_limits<float>::infinity();  // kRow / kGroup: upper bound
  int64_t group_size = 0;        // kGroup
  // kGroup: how each group's scale is made (norm_types.h). kE8M0 and kNvfp4
  // write one scale byte a group to `block_scales` (qscale is then null);
  // kNvfp4's codes are E2M1, one a byte, and its global scales are `scale`,
  // one per tensor of `tensors`.
  GroupScale group_scale = GroupScale::kFloat;
  uint8_t* block_scales = nullptr;
  // FP8 input: x holds FP8 codes in format `x_fmt`, read as
  // code * x_scale[row * (hidden / x_group) + col / x_group]; y (and h) are
  // in the kernel's element type.
  bool x_fp8 = false;
  Fp8 x_fmt = Fp8::kE4M3;
  const float* x_scale = nullptr;
  int64_t x_group = 0;
  // One amax per tensor is taken over all rows (given or current scaling).
  JRN_HOST_DEVICE bool tensor_amax() const { return quant == Quant::kTensor || quant == Quant::kCurrent; }
  // kTensor: the rows of each tensor, and the tensor of `row` (one tensor
  // costs no 64-bit division).
  JRN_HOST_DEVICE int64_t rows_per_tensor() const { return tensors <= 1 ? shape.rows : shape.rows / tensors; }
  JRN_HOST_DEVICE int64_t tensor_of(int64_t row) const { return tensors <= 1 ? 0 : row / rows_per_tensor(); }
  // kTensor: what y of tensor t is multiplied by before rounding to FP8.
  JRN_HOST_DEVICE float tensor_mul(int64_t t) const { return scale_inverted ? 1.f / scale[t] : scale[t]; }
  // The common case the CUDA kernels give code of its own: gamma given (and
  // LayerNorm's beta), the scale not zero-centred.
  template <NormKind K>
  JRN_HOST_DEVICE bool plain_params() const { return jrn::plain_params<K>(gamma, beta, zero_centered); }
};

struct BwdArgs {
  NormShape shape;
  const void* dy = nullptr;
  const void* x = nullptr;
  const float* mean = nullptr;  // LayerNorm only
  const float* rstd = nullptr;
  const void* gamma = nullptr;
  void* dx = nullptr;
  void* dgamma = nullptr;  // null: not wanted
  void* dbeta = nullptr;   // null: not wanted
  // CUDA only: float32 partial sums of dgamma/dbeta, `slots` rows per group of
  // `param_outputs * hidden` floats, reduced in a fixed order by a second pass.
  // Null with dgamma/dbeta wanted: a column kernel sums them from x and dy
  // (in bwd_decode, `slots` is then the rows of threads of its column CTAs).
  float* workspace = nullptr;
  int64_t slots = 0;
  bool zero_centered = false;
  // Hidden dim split across devices: per row c1 = mean(gdy * xhat), and for
  // LayerNorm c2 = mean(gdy) after it (grad_sums_per_row values a row), over
  // the whole row, already combined across the devices. When set, the
  // kernels use them instead of their own (local) row means.
  const float* coef = nullptr;
  const void* dh = nullptr;  // fused residual add: dx += dh (x's dtype)
  JRN_HOST_DEVICE int param_outputs() const { return (dgamma ? 1 : 0) + (dbeta ? 1 : 0); }
  // The wanted parameter gradients in order: output k (< param_outputs()) is
  // dgamma (which 0) or dbeta (which 1).
  JRN_HOST_DEVICE int param_which(int k) const { return k == 0 && dgamma ? 0 : 1; }
  JRN_HOST_DEVICE void* param_output(int k) const { return param_which(k) == 0 ? dgamma : dbeta; }
};
// Every backward kernel takes BwdArgs by value: a larger struct changed the
// code of all of them (docs/tuning.md, bwd-centred-rows).
static_assert(sizeof(BwdArgs) <= 128, "BwdArgs grew past 128 bytes: check the backward kernels' code");

// Per-row partial statistics of a slice of the hidden dim (the building blocks
// of distributed normalization). Two kinds:
//  * of x: RMSNorm writes sum(x^2) per row; LayerNorm writes (mean, m2) per
//    row, m2 = sum((x - mean)^2) over the slice.
//  * of the gradient: sum(gdy * xhat) per row, and for LayerNorm sum(gdy)
//    after it (grad_sums_per_row), gdy = dy * scale.
struct StatsArgs {
  NormShape shape;
  const void* x = nullptr;
  const void* dy = nullptr;     // gradient statistics only
  const float* mean = nullptr;  // gradient statistics of LayerNorm only
  const float* rstd = nullptr;  // gradient statistics only
  const void* gamma = nullptr;  // gradient statistics only; null: no scale
  bool zero_centered = false;
  float* out = nullptr;  // rows x (1 or 2) floats
  // x statistics with a residual: h = x + residual (summed in float32, stored
  // to `h` in its dtype), and the statistics of h as stored.
  const void* residual = nullptr;
  bool residual_f32 = false;  // residual is float32 (else x's dtype)
  void* h = nullptr;
  bool h_f32 = false;  // h is float32 (else x's dtype)
};

// ---- Decoding of the FFI buffers into FwdArgs/BwdArgs, shared by both platforms.

inline ffi::Error decode_fwd(NormKind kind, const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                             const ffi::AnyBuffer* beta, ffi::AnyBuffer& y, ffi::AnyBuffer* mean,
                             ffi::AnyBuffer& rstd, float eps, bool zero_centered, bool has_gamma,
                             bool has_beta, FwdArgs* a) {
  const ffi::AnyBuffer& param = has_gamma || !beta ? gamma : *beta;
  if (auto e = read_shape(x, param, has_gamma || has_beta, &a->shape); e.failure()) return e;
  if (has_gamma && has_beta && beta) {
    if (auto e = check_same(gamma, *beta, "beta must match gamma in shape and dtype"); e.failure())
      return e;
  }
  if (auto e = check_same(x, y, "y must match x"); e.failure()) return e;
  if (auto e = check_stats(rstd, a->shape.rows, "rstd"); e.failure()) return e;
  if (kind == NormKind::kLayer && mean) {
    if (auto e = check_stats(*mean, a->shape.rows, "mean"); e.failure()) return e;
    a->mean = static_cast<float*>(mean->untyped_data());
  }
  if (!(eps >= 0.f)) return ffi::Error::InvalidArgument("jax_rmsnorm: eps must be >= 0");
  a->x = x.untyped_data();
  a->gamma = has_gamma ? gamma.untyped_data() : nullptr;
  a->beta = has_beta && beta ? beta->untyped_data() : nullptr;
  a->y = y.untyped_data();
  a->rstd = static_cast<float*>(rstd.untyped_data());
  a->eps = eps;
  a->zero_centered = zero_centered;
  return ffi::Error::Success();
}

inline ffi::Error decode_bwd(NormKind kind, const ffi::AnyBuffer& dy, const ffi::AnyBuffer& x,
                             const ffi::AnyBuffer* mean, const ffi::AnyBuffer& rstd,
                             const ffi::AnyBuffer& gamma, ffi::AnyBuffer& dx,
                             ffi::AnyBuffer& dgamma, ffi::AnyBuffer* dbeta, bool zero_centered,
                             bool has_gamma, bool has_beta, BwdArgs* a) {
  const ffi::AnyBuffer& param = has_gamma ? gamma : (has_beta && dbeta ? *dbeta : gamma);
  if (auto e = read_shape(x, param, has_gamma || has_beta, &a->shape); e.failure()) return e;
  if (auto e = check_same(x, dy, "dy must match x in shape and dtype"); e.failure()) return e;
  if (auto e = check_same(x, dx, "dx must match x"); e.failure()) return e;
  if (auto e = check_stats(rstd, a->shape.rows, "rstd"); e.failure()) return e;
  if (kind == NormKind::kLayer) {
    if (!mean) return ffi::Error::InvalidArgument("jax_rmsnorm: LayerNorm backward needs mean");
    if (auto e = check_stats(*mean, a->shape.rows, "mean"); e.failure()) return e;
    a->mean = static_cast<const float*>(mean->untyped_data());
  }
  if (has_gamma) {
    if (auto e = check_same(gamma, dgamma, "dgamma must match gamma"); e.failure()) return e;
    a->gamma = gamma.untyped_data();
    a->dgamma = dgamma.untyped_data();
  }
  if (has_beta && dbeta) {
    if (static_cast<int64_t>(dbeta->element_count()) != a->shape.groups * a->shape.hidden)
      return ffi::Error::InvalidArgument("jax_rmsnorm: dbeta must have the parameters' shape");
    if (has_gamma && dbeta->element_type() != dgamma.element_type())
      return ffi::Error::InvalidArgument("jax_rmsnorm: dbeta must have gamma's dtype");
    a->dbeta = dbeta->untyped_data();
  }
  a->dy = dy.untyped_data();
  a->x = x.untyped_data();
  a->rstd = static_cast<const float*>(rstd.untyped_data());
  a->dx = dx.untyped_data();
  a->zero_centered = zero_centered;
  return ffi::Error::Success();
}

// The buffer types of the handlers' signatures.
using FfiBuf = ffi::AnyBuffer;
using FfiRet = ffi::Result<ffi::AnyBuffer>;

// The parameter dtype a kernel is instantiated for: gamma's (or beta's), else x's.
inline ffi::DataType param_type(const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma,
                                const ffi::AnyBuffer* beta, bool has_gamma, bool has_beta) {
  if (has_gamma) return gamma.element_type();
  if (has_beta && beta) return beta->element_type();
  return x.element_type();
}

}  // namespace jrn

// BIND followed by A buffer arguments and R buffer results (A, R <= 7).
#define JRN_REP0(X)
#define JRN_REP1(X) X
#define JRN_REP2(X) X X
#define JRN_REP3(X) X X X
#define JRN_REP4(X) X X X X
#define JRN_REP5(X) X X X X X
#define JRN_REP6(X) X X X X X X
#define JRN_REP7(X) X X X X X X X
#define JRN_REP8(X) X X X X X X X X
#define JRN_BUFFERS(BIND, A, R) \
  BIND JRN_REP##A(.Arg<::xla::ffi::AnyBuffer>()) JRN_REP##R(.Ret<::xla::ffi::AnyBuffer>())

// One handler of the platform's set: the symbol NAME, its binding (JRN_BUFFERS
// and the attributes), then its body, a lambda taking the context, the
// buffers (::jrn::FfiBuf, results ::jrn::FfiRet) and the attributes in that
// order. Every handler is safe inside XLA's command buffers (CUDA graphs).
#define JRN_HANDLER(NAME, BINDING, ...) \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, __VA_ARGS__, BINDING, {::xla::ffi::Traits::kCmdBufferCompatible})

// The parameters' attributes: a zero-centred scale and whether gamma (and
// LayerNorm's beta) is given.
#define JRN_GAMMA_ATTRS .Attr<bool>("zero_centered_gamma").Attr<bool>("has_gamma")
#define JRN_GAMMA_BETA_ATTRS JRN_GAMMA_ATTRS.Attr<bool>("has_beta")

// ---- The four FFI handlers of one platform, defined once for both.
//
// BACKEND is a struct with
//   template <NormKind K, class T, class P> static ffi::Error fwd(CTX, const FwdArgs&);
//   template <NormKind K, class T, class P> static ffi::Error bwd(CTX, const BwdArgs&);
// and types BACKEND::Bf16 / BACKEND::F16 naming its 16-bit element types.
// BIND is the binder with the platform's context already added; CTX_DECL/CTX
// declare and forward that context (the CUDA stream; on the CPU, XLA's intra-op
// thread pool).
#define JRN_DEFINE_NORM_HANDLERS(PREFIX, BACKEND, BIND, CTX_DECL, CTX)                           \
  namespace jrn_handlers_##PREFIX {                                                             \
  using namespace ::jrn;                                                                        \
  template <NormKind K>                                                                         \
  ::xla::ffi::Error Fwd(CTX_DECL ::xla::ffi::AnyBuffer x, ::xla::ffi::AnyBuffer gamma, const ::xla::ffi::AnyBuffer* beta,    \
                 ::xla::ffi::AnyBuffer y, ::xla::ffi::AnyBuffer* mean, ::xla::ffi::AnyBuffer rstd, float eps,          \
                 bool zc, bool has_gamma, bool has_beta) {                                      \
    FwdArgs a;                                                                                  \
    if (auto e = decode_fwd(K, x, gamma, beta, y, mean, rstd, eps, zc, has_gamma, has_beta, &a); \
        e.failure())                                                                            \
      return e;                                                                                 \
    if (a.shape.rows == 0) return ::xla::ffi::Error::Success();                                        \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), param_type(x, gamma, beta, has_gamma, has_beta),                      \
        [&]<class T, class P>() { return BACKEND::fwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  template <NormKind K>                                                                         \
  ::xla::ffi::Error Bwd(CTX_DECL ::xla::ffi::AnyBuffer dy, ::xla::ffi::AnyBuffer x, const ::xla::ffi::AnyBuffer* mean,       \
                 ::xla::ffi::AnyBuffer rstd, ::xla::ffi::AnyBuffer gamma, ::xla::ffi::AnyBuffer dx,                   \
                 ::xla::ffi::AnyBuffer dgamma, ::xla::ffi::AnyBuffer* dbeta, ::xla::ffi::AnyBuffer ws, \
                 bool zc, bool has_gamma, bool has_beta, const float* coef = nullptr,           \
                 const ::xla::ffi::AnyBuffer* dh = nullptr) {                                   \
    BwdArgs a;                                                                                  \
    if (auto e = decode_bwd(K, dy, x, mean, rstd, gamma, dx, dgamma, dbeta, zc, has_gamma,       \
                            has_beta, &a);                                                      \
        e.failure())                                                                            \
      return e;                                                                                 \
    a.coef = coef;                                                                              \
    if (dh) {                                                                                   \
      if (auto e = check_same(x, *dh, "dh must match x in shape and dtype"); e.failure())       \
        return e;                                                                               \
      a.dh = dh->untyped_data();                                                                \
    }                                                                                           \
    if (a.shape.rows == 0 && a.param_outputs() == 0) return ::xla::ffi::Error::Success();              \
    const int64_t per_slot = a.shape.groups * a.param_outputs() * a.shape.hidden;               \
    /* ws: the dgamma (dbeta) partials, float32, whole slots of per_slot. */                    \
    const int64_t ws_floats = static_cast<int64_t>(ws.element_count());                         \
    a.workspace = per_slot > 0 && ws_floats > 0 ? static_cast<float*>(ws.untyped_data()) : nullptr; \
    a.slots = per_slot > 0 ? ws_floats / per_slot : 0;                                          \
    return dispatch_types<BACKEND::Bf16, BACKEND::F16>(                                         \
        x.element_type(), has_gamma ? gamma.element_type() : dgamma.element_type(),             \
        [&]<class T, class P>() { return BACKEND::bwd<K, T, P>(CTX a); });                      \
  }                                                                                             \
  }                                                                                             \
  JRN_HANDLER(PREFIX##RmsNormFwd, JRN_BUFFERS(BIND, 2, 2).Attr<float>("eps") JRN_GAMMA_ATTRS,      \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiRet y, ::jrn::FfiRet rstd,           \
         float eps, bool zc, bool has_gamma) {                                                     \
        return jrn_handlers_##PREFIX::Fwd<::jrn::NormKind::kRms>(CTX x, g, nullptr, *y, nullptr,   \
                                                                 *rstd, eps, zc, has_gamma,        \
                                                                 false);                           \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormFwd,                                                                \
      JRN_BUFFERS(BIND, 3, 3).Attr<float>("eps") JRN_GAMMA_BETA_ATTRS,                             \
      [](CTX_DECL ::jrn::FfiBuf x, ::jrn::FfiBuf g, ::jrn::FfiBuf b, ::jrn::FfiRet y,              \
         ::jrn::FfiRet mean, ::jrn::FfiRet rstd, float eps, bool zc, bool has_gamma,               \
         bool has_beta) {                                                                          \
        return jrn_handlers_##PREFIX::Fwd<::jrn::NormKind::kLayer>(                                \
            CTX x, g, &b, *y, &*mean, *rstd, eps, zc, has_gamma, has_beta);                        \
      });                                                                                          \
  JRN_HANDLER(PREFIX##RmsNormBwd, JRN_BUFFERS(BIND, 4, 3) JRN_GAMMA_ATTRS,                         \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf rstd, ::jrn::FfiBuf g,          \
         ::jrn::FfiRet dx, ::jrn::FfiRet dg, ::jrn::FfiRet ws, bool zc, bool has_gamma) {          \
        return jrn_handlers_##PREFIX::Bwd<::jrn::NormKind::kRms>(                                  \
            CTX dy, x, nullptr, rstd, g, *dx, *dg, nullptr, *ws, zc, has_gamma, false);            \
      });                                                                                          \
  JRN_HANDLER(PREFIX##LayerNormBwd, JRN_BUFFERS(BIND, 5, 4) JRN_GAMMA_BETA_ATTRS,                  \
      [](CTX_DECL ::jrn::FfiBuf dy, ::jrn::FfiBuf x, ::jrn::FfiBuf mean, ::jrn::FfiBuf rstd,       \
         ::jrn::FfiBuf g, ::jrn::FfiRet dx, ::jrn::FfiRet dg, ::jrn::FfiRet db, ::jrn::FfiRet ws,  \
         bool zc, bool has_gamma, bool has_beta) {                                                 \
        return jrn_handlers_##PREFIX::Bwd<::jrn::NormKind::kLayer>(                                \
            CTX dy, x, &mean, rstd, g, *dx, *dg, &*db, *ws, zc, has_gamma, has_beta);              \
      })
