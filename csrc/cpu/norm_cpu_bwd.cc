// The CPU backward's instances, and the statistics' (norm_cpu.h).
#include "norm_cpu.h"

JRN_CPU_FOR_EACH_INSTANCE(JRN_CPU_MAKE_BWD)
JRN_CPU_STATS_INSTANCE(, ::jrn::NormKind::kRms)
JRN_CPU_STATS_INSTANCE(, ::jrn::NormKind::kLayer)
