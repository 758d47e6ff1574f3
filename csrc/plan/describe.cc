// Plans as one line of text (plan.h's describe): the kernel, its
// configuration, the launch's shape, and the docs/tuning.md entry.
#include <string>

#include "plan.h"

namespace jrn::plan {

const char* name_of(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "?";
}

const char* name_of(SliceVariant v) {
  switch (v) {
    case SliceVariant::kBase: return "base";
    case SliceVariant::kHeldParams: return "held_params";
    case SliceVariant::kHeldParamsYSmem: return "held_params_y_smem";
    case SliceVariant::kClusterRefill: return "cluster_refill";
    case SliceVariant::kHoldY: return "hold_y";
    case SliceVariant::kHoldYCapped: return "hold_y_capped";
    case SliceVariant::kClusterHoldY: return "cluster_hold_y";
    case SliceVariant::kClusterHoldYCapped: return "cluster_hold_y_capped";
    case SliceVariant::kStagedParams: return "staged_params";
    case SliceVariant::kStagedHalves: return "staged_halves";
    case SliceVariant::kStagedHalvesHoldY: return "staged_halves_hold_y";
  }
  return "?";
}

namespace {

const char* name_of(RegsVariant v) {
  switch (v) {
    case RegsVariant::kBase: return "base";
    case RegsVariant::kEarly: return "early";
    case RegsVariant::kP32: return "p32";
  }
  return "?";
}

const char* name_of(DecodeResidual r) {
  switch (r) {
    case DecodeResidual::kNone: return "none";
    case DecodeResidual::kSame: return "same";
    case DecodeResidual::kAny: return "any";
  }
  return "?";
}

std::string ctas_of(int64_t ctas) { return ctas == 0 ? "resident" : std::to_string(ctas); }

// " key=value" for each field that applies.
struct Line {
  std::string s;
  Line& add(const char* key, const std::string& v) {
    s += std::string(" ") + key + "=" + v;
    return *this;
  }
  Line& add(const char* key, int64_t v) { return add(key, std::to_string(v)); }
};

}  // namespace

std::string describe(const FwdPlan& p) {
  std::string name, config;
  switch (p.kernel) {
    case FwdKernel::kNone: return "none";
    case FwdKernel::kDecode:
      name = "fwd_decode";
      config = std::string(p.decode.plain ? "plain" : "general") + (p.decode.split ? ",split" : "") +
               ",residual=" + name_of(p.decode.resid);
      break;
    case FwdKernel::kRegs:
      name = "fwd_regs";
      config = name_of(p.regs);
      break;
    case FwdKernel::kUnaligned: name = "fwd_unaligned"; break;
    case FwdKernel::kSlices:
      name = "fwd_slices";
      config = std::string(name_of(p.slice)) + (p.whole ? ",whole" : "");
      break;
    case FwdKernel::kStream: name = "fwd_stream"; break;
    case FwdKernel::kTwoPass: name = "fwd_add_stats+fwd_apply"; break;
    case FwdKernel::kFp8Regs: name = "fwd_fp8_regs"; break;
    case FwdKernel::kTiles: name = "fwd_tiles"; break;
  }
  Line l{name + (config.empty() ? "" : "[" + config + "]")};
  l.add("vec", p.key.vec);
  if (p.key.fp8_x) l.add("fp8_x", 1);
  l.add("threads", p.threads).add("rows_per_cta", p.rows_per_cta).add("ctas", ctas_of(p.ctas));
  if (p.parts > 1) l.add("parts", p.parts);
  if (p.cluster > 1) l.add("cluster", p.cluster);
  if (p.items > 0) l.add("items", p.items);
  if (p.smem > 0) l.add("smem", p.smem);
  if (p.chunks > 0) l.add("chunks", p.chunks);
  if (p.width > 0) l.add("width", p.width);
  if (p.scales_by_rows) l.add("qt_scales", "transpose8");
  if (p.early_launch) l.add("early_launch", 1);
  if (p.columns) l.add("columns", "fwd_columns");
  l.add("rule", p.rule);
  // A plan must name an instance the units compile (plan.h's *_exists).
  const bool exists = p.kernel == FwdKernel::kDecode   ? decode_exists(p.key, p.decode)
                      : p.kernel == FwdKernel::kRegs   ? regs_exists(p.key, p.regs)
                      : p.kernel == FwdKernel::kSlices ? slice_instance_exists(p.key, p.slice, p.whole)
                      : p.kernel == FwdKernel::kTwoPass ? two_pass_exists(p.key)
                      : p.kernel == FwdKernel::kUnaligned ? unaligned_exists(p.key.quant)
                                                          : true;
  if (!exists) l.add("error", "no-such-instance");
  return l.s;
}

std::string describe(const CurrentPlan& p) {
  std::string s = "measure=";
  s += p.measure == CurrentMeasure::kAmaxRows ? "x_amax" : "(" + describe(p.measure_pass) + ")";
  s += "; scale_inv; quantize=";
  s += p.quantize == CurrentQuantize::kTiles ? "quantize_tiles"
       : p.quantize == CurrentQuantize::kRows ? "x_quantize"
                                               : "(" + describe(p.quantize_pass) + ")";
  if (p.transpose) s += "; transpose8";
  return s + "; rule=" + p.rule;
}

std::string describe(const BwdPlan& p) {
  std::string name, config;
  switch (p.kernel) {
    case BwdKernel::kNone: return "none";
    case BwdKernel::kDecode:
      name = "bwd_decode";
      config = !p.direct ? "tiles" : p.sums == ParamSums::kReduce ? "slots" : "direct";
      break;
    case BwdKernel::kRegs: name = "bwd_regs"; break;
    case BwdKernel::kSlices:
      name = "bwd_slices";
      config = std::string(p.early ? "early" : "late") + (p.whole ? ",whole" : "") +
               (p.stats_ahead ? ",stats_ahead" : "");
      break;
    case BwdKernel::kStream: name = "bwd_stream"; break;
    case BwdKernel::kUnaligned: name = "bwd_unaligned"; break;
  }
  Line l{name + (config.empty() ? "" : "[" + config + "]")};
  l.add("vec", p.key.vec).add("threads", p.threads).add("rows_per_cta", p.rows_per_cta).add("ctas", ctas_of(p.ctas));
  if (p.cluster > 1) l.add("cluster", p.cluster);
  if (p.fold > 1) l.add("fold", p.fold);
  if (p.items > 0) l.add("items", p.items);
  if (p.smem > 0) l.add("smem", p.smem);
  if (p.slots > 0) l.add("slots", p.slots);
  if (p.kernel == BwdKernel::kDecode) l.add("splits", p.splits).add("tiles", p.tiles);
  if (p.period > 1) l.add("period", p.period);
  switch (p.sums) {
    case ParamSums::kNone: break;
    case ParamSums::kColumns: l.add("sums", "bwd_columns").add("sums_vec", p.sums_vec).add("column_tiles", p.column_tiles); break;
    case ParamSums::kReduce: l.add("sums", "bwd_reduce").add("sums_vec", p.sums_vec); break;
  }
  l.add("rule", p.rule);
  return l.s;
}

}  // namespace jrn::plan
