// The Python module of one platform: `registrations()` returns the FFI
// handlers defined by JRN_DEFINE_NORM_HANDLERS and JRN_DEFINE_DIST_HANDLERS
// (PREFIX, ...) by target name. EXTRA: the platform's own definitions on `m`.
#pragma once

#include <nanobind/nanobind.h>

#define JRN_NB_MODULE(MODULE, PREFIX, EXTRA)                                            \
  NB_MODULE(MODULE, m) {                                                                \
    EXTRA                                                                               \
    m.def("registrations", []() {                                                       \
      namespace nb = nanobind;                                                          \
      nb::dict d;                                                                       \
      d["jrn_rms_norm_fwd"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormFwd));     \
      d["jrn_rms_norm_bwd"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormBwd));     \
      d["jrn_layer_norm_fwd"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormFwd)); \
      d["jrn_layer_norm_bwd"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormBwd)); \
      d["jrn_rms_norm_stats"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormStats)); \
      d["jrn_layer_norm_stats"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormStats));\
      d["jrn_rms_norm_add_stats"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormAddStats));\
      d["jrn_layer_norm_add_stats"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormAddStats));\
      d["jrn_rms_norm_grad_stats"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormGradStats));\
      d["jrn_layer_norm_grad_stats"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormGradStats));\
      d["jrn_rms_norm_apply"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormApply)); \
      d["jrn_layer_norm_apply"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormApply));\
      d["jrn_rms_norm_apply_fp8"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormApplyFp8));\
      d["jrn_layer_norm_apply_fp8"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormApplyFp8));\
      d["jrn_rms_norm_bwd_given"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormBwdGiven));\
      d["jrn_layer_norm_bwd_given"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormBwdGiven));\
      d["jrn_rms_norm_bwd_given_add"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormBwdGivenAdd));\
      d["jrn_layer_norm_bwd_given_add"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormBwdGivenAdd));\
      d["jrn_rms_norm_fwd_fused"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormFwdFused)); \
      d["jrn_layer_norm_fwd_fused"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormFwdFused)); \
      d["jrn_rms_norm_bwd_add"] = nb::capsule(reinterpret_cast<void*>(PREFIX##RmsNormBwdAdd)); \
      d["jrn_layer_norm_bwd_add"] = nb::capsule(reinterpret_cast<void*>(PREFIX##LayerNormBwdAdd)); \
      return d;                                                                         \
    });                                                                                 \
  }
