// describe_fwd_plan / describe_bwd_plan / describe_current_plan on a nanobind
// module: the launch plans of a problem, given as a dict, on a device given
// as a dict (jax_rmsnorm._ffi.describe_plan is their Python face).
#pragma once

#include <nanobind/nanobind.h>

namespace jrn::plan {
void bind_describe(nanobind::module_& m);
}  // namespace jrn::plan
