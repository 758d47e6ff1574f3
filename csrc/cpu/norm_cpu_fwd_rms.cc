// The CPU forward's RMSNorm instances (norm_cpu.h).
#include "norm_cpu.h"

JRN_CPU_FOR_EACH_KIND_INSTANCE(JRN_CPU_MAKE_FWD, ::jrn::NormKind::kRms)
