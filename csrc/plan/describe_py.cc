#include "describe_py.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <stdexcept>
#include <string>

#include "plan.h"

namespace nb = nanobind;

namespace jrn::plan {
namespace {

int64_t get(const nb::dict& d, const char* key, int64_t fallback) {
  return d.contains(key) ? nb::cast<int64_t>(d[key]) : fallback;
}
bool flag(const nb::dict& d, const char* key, bool fallback) {
  return d.contains(key) ? nb::cast<bool>(d[key]) : fallback;
}
DType dtype(const nb::dict& d, const char* key, DType fallback) {
  if (!d.contains(key)) return fallback;
  const std::string s = nb::cast<std::string>(d[key]);
  if (s == "float32") return DType::kF32;
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  throw std::invalid_argument(std::string(key) + " must be float32, bfloat16 or float16, got " + s);
}
NormKind kind_of(const nb::dict& d) {
  const std::string s = nb::cast<std::string>(d["kind"]);
  if (s == "rms") return NormKind::kRms;
  if (s == "layer") return NormKind::kLayer;
  throw std::invalid_argument("kind must be 'rms' or 'layer', got " + s);
}
Quant quant_of(const nb::dict& d) {
  const std::string s = d.contains("quant") ? nb::cast<std::string>(d["quant"]) : "none";
  if (s == "none") return Quant::kNone;
  if (s == "tensor") return Quant::kTensor;
  if (s == "row") return Quant::kRow;
  if (s == "group") return Quant::kGroup;
  if (s == "current") return Quant::kCurrent;
  throw std::invalid_argument("quant must be none, tensor, row, group or current, got " + s);
}
GroupScale group_scale_of(const nb::dict& d) {
  const std::string s = d.contains("group_scale") ? nb::cast<std::string>(d["group_scale"]) : "float32";
  if (s == "float32") return GroupScale::kFloat;
  if (s == "pow2") return GroupScale::kPow2;
  if (s == "e8m0") return GroupScale::kE8M0;
  if (s == "nvfp4") return GroupScale::kNvfp4;
  throw std::invalid_argument("group_scale must be float32, pow2, e8m0 or nvfp4, got " + s);
}

Device device_of(const nb::dict& d) {
  Device dev;
  dev.sms = static_cast<int>(get(d, "sms", 0));
  dev.cc_major = static_cast<int>(get(d, "cc_major", 0));
  dev.cc_minor = static_cast<int>(get(d, "cc_minor", 0));
  dev.smem_optin = get(d, "smem_optin", 0);
  if (dev.sms < 1 || dev.cc_major < 1) throw std::invalid_argument("device needs sms and cc_major");
  return dev;
}

// The fields both directions' problems share: the normalization, the
// dtypes and the shape.
template <class Problem>
void read_common(const nb::dict& d, Problem& p) {
  p.kind = kind_of(d);
  p.x = dtype(d, "dtype", DType::kBF16);
  p.param = dtype(d, "param_dtype", p.x);
  if (p.param != p.x && p.param != DType::kF32) throw std::invalid_argument("param_dtype must be float32 or x's");
  p.rows = get(d, "rows", 0);
  p.hidden = get(d, "hidden", 0);
  p.groups = get(d, "groups", 1);
  if (p.rows < 0 || p.hidden < 1 || p.groups < 1) throw std::invalid_argument("rows >= 0, hidden >= 1, groups >= 1");
  p.gamma = flag(d, "gamma", true);
}

FwdProblem fwd_problem_of(const nb::dict& d) {
  FwdProblem p;
  read_common(d, p);
  p.quant = quant_of(d);
  p.beta = p.kind == NormKind::kLayer && flag(d, "beta", true);
  p.zero_centered = flag(d, "zero_centered", false);
  p.residual = flag(d, "residual", false);
  p.residual_f32 = flag(d, "residual_f32", false);
  p.h_f32 = flag(d, "h_f32", false);
  p.given_stats = flag(d, "given_stats", false);
  p.fp8_x = flag(d, "fp8_x", false);
  p.x_group = get(d, "x_group", 0);
  p.group_size = get(d, "group_size", 0);
  p.group_scale = group_scale_of(d);
  p.qt = flag(d, "qt", false);
  p.tensors = get(d, "tensors", 1);
  const bool aligned = flag(d, "aligned", true);
  p.x_aligned = p.y_aligned = p.params_aligned = p.residual_aligned = p.qt_aligned = aligned;
  return p;
}

BwdProblem bwd_problem_of(const nb::dict& d) {
  BwdProblem p;
  read_common(d, p);
  p.param_outputs = static_cast<int>(get(d, "param_outputs", 1));
  p.slots = get(d, "slots", 0);
  p.coef = flag(d, "coef", false);
  p.dh = flag(d, "dh", false);
  const bool aligned = flag(d, "aligned", true);
  p.rows_aligned = p.gamma_aligned = p.sums_aligned = aligned;
  return p;
}

}  // namespace

void bind_describe(nb::module_& m) {
  m.def("describe_fwd_plan", [](const nb::dict& problem, const nb::dict& device) {
    const FwdProblem p = fwd_problem_of(problem);
    const Device d = device_of(device);
    return p.quant == Quant::kCurrent ? describe(plan_current(p, d)) : describe(plan_fwd(p, d));
  });
  m.def("describe_bwd_plan", [](const nb::dict& problem, const nb::dict& device) {
    return describe(plan_bwd(bwd_problem_of(problem), device_of(device)));
  });
  m.def("bwd_workspace_slots", &workspace_slots);
  // The plans' thresholds that the tests probe on both sides.
  m.def("plan_limits", [] {
    nb::dict d;
    d["fwd_decode_items"] = fwd::kDecodeItems;
    d["fwd_max_row_threads"] = fwd::kMaxRowThreads;
    d["fwd_decode_wide_threads"] = fwd::kDecodeWideThreads;
    d["fwd_decode_max_parts"] = fwd::kDecodeMaxParts;
    d["fwd_decode_split_min_threads"] = fwd::kDecodeSplitMinThreads;
    d["fwd_reg_items"] = fwd::kRegItems;
    d["bwd_decode_max_rows"] = bwd::kDecodeMaxRows;
    d["bwd_decode_narrow_packs"] = bwd::kDecodeNarrowPacks;
    d["bwd_decode_narrow_max_rows"] = bwd::kDecodeNarrowMaxRows;
    d["bwd_decode_one_item_packs"] = bwd::kDecodeOneItemPacks;
    d["bwd_decode_max_threads"] = bwd::kDecodeMaxThreads;
    d["bwd_decode_max_packs"] = bwd::kDecodeMaxPacks;
    d["bwd_decode_parts"] = bwd::kDecodeParts;
    d["bwd_decode_parts_packs"] = bwd::kDecodePartsPacks;
    d["bwd_decode_parts_max_rows"] = bwd::kDecodePartsMaxRows;
    d["column_rows"] = kColumnRows;
    d["column_elems"] = kColumnElems;
    return d;
  });
}

}  // namespace jrn::plan
