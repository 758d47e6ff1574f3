"""The one place that loads the compiled modules and registers their FFI targets.

``_jax_rmsnorm_cpu`` is always built; ``_jax_rmsnorm_cuda`` only where a CUDA
compiler was found at build time. Targets are registered per platform, and the
primitives lower to the target of the platform a computation is lowered for.
"""

from __future__ import annotations

import os

import jax

# The instruction sets the CPU kernels' row loops come in, narrowest first;
# JAX_RMSNORM_CPU_ISA=baseline keeps the first (see cpu_isa).
CPU_ISAS = ("baseline", "avx2")
_cpu_isa_cap = os.environ.get("JAX_RMSNORM_CPU_ISA", "")
if _cpu_isa_cap and _cpu_isa_cap not in CPU_ISAS:
    raise ValueError(f"JAX_RMSNORM_CPU_ISA={_cpu_isa_cap!r}: expected one of {', '.join(CPU_ISAS)} (or unset)")

try:
    from . import _jax_rmsnorm_cpu
except ImportError as e:  # pragma: no cover - depends on how it was installed
    raise ImportError(
        "jax_rmsnorm's compiled module is missing. Install the package (`pip install .`, or "
        "`pip install --no-build-isolation -e .` for development) and import it from outside "
        f"the source tree; this import found {__file__}.") from e

try:  # absent when the package was built without CUDA
    from . import _jax_rmsnorm_cuda
except ImportError:  # pragma: no cover - depends on the build
    _jax_rmsnorm_cuda = None

TARGETS = tuple(f"jrn_{kind}_norm_{op}" for kind in ("rms", "layer")
                for op in ("fwd", "bwd", "stats", "grad_stats", "apply", "apply_fp8", "bwd_given",
                           "fwd_fused", "bwd_add", "bwd_given_add")) + ("jrn_all_reduce_rms_norm",)

for _name, _capsule in _jax_rmsnorm_cpu.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

if _jax_rmsnorm_cuda is not None:
    for _name, _capsule in _jax_rmsnorm_cuda.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")
    for _name, _capsule in _jax_rmsnorm_cuda.own_registrations().items():  # CUDA-only targets
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")


def cpu_isa() -> str:
    """The instruction set the CPU kernels' row loops run in.

    ``"avx2"`` on x86-64 CPUs that have AVX2 (with FMA, BMI2 and F16C), else
    ``"baseline"`` (SSE2, and every non-x86 CPU). Both give the same results
    bit for bit. ``JAX_RMSNORM_CPU_ISA=baseline`` in the environment (read at
    the first call) keeps the baseline.
    """
    return _jax_rmsnorm_cpu.cpu_isa()


def cuda_built() -> bool:
    """Whether this installation includes the CUDA kernels."""
    return _jax_rmsnorm_cuda is not None


def export_checks() -> list:
    """The safety checks ``jax.export`` must skip for these custom calls.

    ``jax.export`` accepts only custom calls it knows to be stable; pass
    ``disabled_checks=jax_rmsnorm.export_checks()`` to ``jax.export.export``.
    The side that deserializes and runs the artifact must ``import
    jax_rmsnorm`` first (same or newer version), which registers the targets.
    """
    from jax import export

    return [export.DisabledSafetyCheck.custom_call(name) for name in TARGETS]
