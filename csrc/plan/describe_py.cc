#include "describe_py.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

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
// The value `s` (option `key`) names among `names` ({name, value} pairs).
template <class E, size_t N>
E named(const std::string& s, const char* key, const std::pair<const char*, E> (&names)[N]) {
  std::string known;
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i].first) return names[i].second;
    known += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + names[i].first;
  }
  throw std::invalid_argument(std::string(key) + " must be " + known + ", got " + s);
}
// The same for option `key` of `d`; `fallback` where the option is absent
// (required where there is none).
template <class E, size_t N>
E named(const nb::dict& d, const char* key, const std::pair<const char*, E> (&names)[N],
        std::optional<E> fallback = std::nullopt) {
  if (!d.contains(key)) {
    if (fallback) return *fallback;
    throw std::invalid_argument(std::string(key) + " is required");
  }
  return named(nb::cast<std::string>(d[key]), key, names);
}

constexpr std::pair<const char*, DType> kDTypes[] = {
    {"float32", DType::kF32}, {"bfloat16", DType::kBF16}, {"float16", DType::kF16}};
constexpr std::pair<const char*, NormKind> kKinds[] = {{"rms", NormKind::kRms}, {"layer", NormKind::kLayer}};
constexpr std::pair<const char*, Quant> kQuants[] = {{"none", Quant::kNone},
                                                     {"tensor", Quant::kTensor},
                                                     {"row", Quant::kRow},
                                                     {"group", Quant::kGroup},
                                                     {"current", Quant::kCurrent}};
constexpr std::pair<const char*, GroupScale> kGroupScales[] = {
    {"float32", GroupScale::kFloat}, {"pow2", GroupScale::kPow2}, {"e8m0", GroupScale::kE8M0},
    {"nvfp4", GroupScale::kNvfp4}};

Device device_of(const nb::dict& d) {
  Device dev;
  dev.sms = static_cast<int>(get(d, "sms", 0));
  dev.cc_major = static_cast<int>(get(d, "cc_major", 0));
  dev.cc_minor = static_cast<int>(get(d, "cc_minor", 0));
  dev.smem_optin = get(d, "smem_optin", 0);
  dev.dram_gbps = static_cast<int>(get(d, "dram_gbps", 0));
  if (dev.sms < 1 || dev.cc_major < 1) throw std::invalid_argument("device needs sms and cc_major");
  return dev;
}

// The fields both directions' problems share: the normalization, the
// dtypes and the shape.
template <class Problem>
void read_common(const nb::dict& d, Problem& p) {
  p.kind = named(d, "kind", kKinds);
  p.x = named(d, "dtype", kDTypes, std::optional(DType::kBF16));
  p.param = named(d, "param_dtype", kDTypes, std::optional(p.x));
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
  p.quant = named(d, "quant", kQuants, std::optional(Quant::kNone));
  p.beta = p.kind == NormKind::kLayer && flag(d, "beta", true);
  p.zero_centered = flag(d, "zero_centered", false);
  p.residual = flag(d, "residual", false);
  p.residual_f32 = flag(d, "residual_f32", false);
  p.h_f32 = flag(d, "h_f32", false);
  p.given_stats = flag(d, "given_stats", false);
  p.fp8_x = flag(d, "fp8_x", false);
  p.x_group = get(d, "x_group", 0);
  p.group_size = get(d, "group_size", 0);
  p.group_scale = named(d, "group_scale", kGroupScales, std::optional(GroupScale::kFloat));
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
  m.def("bwd_workspace_slots", [](const std::string& kind, const std::string& dtype, int64_t rows_per_group,
                                   int64_t hidden, int param_outputs) {
    return workspace_slots(named(kind, "kind", kKinds), named(dtype, "dtype", kDTypes), rows_per_group, hidden,
                           param_outputs);
  });
  m.def("tile_scales_by_rows", [](const std::string& group_scale) {
    return tile_scales_by_rows(named(group_scale, "group_scale", kGroupScales));
  });
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
