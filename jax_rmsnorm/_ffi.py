"""The one place that loads the compiled modules and registers their FFI targets.

``_jax_rmsnorm_cpu`` is always built; ``_jax_rmsnorm_cuda`` only where a CUDA
compiler was found at build time. Targets are registered per platform, and the
primitives lower to the target of the platform a computation is lowered for.
"""

from __future__ import annotations

import jax

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
                           "fwd_fused", "bwd_add", "bwd_given_add"))

for _name, _capsule in _jax_rmsnorm_cpu.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

if _jax_rmsnorm_cuda is not None:
    for _name, _capsule in _jax_rmsnorm_cuda.registrations().items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA")


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
