// The CPU forward's LayerNorm instances (norm_cpu.h).
#include "norm_cpu.h"

#define JRN_CPU_MAKE_FWD(K, T, P) JRN_CPU_FWD_INSTANCE(, K, T, P)
JRN_CPU_FOR_EACH_KIND_INSTANCE(JRN_CPU_MAKE_FWD, ::jrn::NormKind::kLayer)
