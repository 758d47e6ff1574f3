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

# JAX_RMSNORM_DRAM_GBPS: the DRAM bandwidth (GB/s) the CUDA plans take for the
# GPU's own (read once by the CUDA module), for tests of the plans that depend
# on it (docs/tuning.md, bwd-slices-stats) on whichever GPU is at hand.
_dram_gbps = os.environ.get("JAX_RMSNORM_DRAM_GBPS", "")
if _dram_gbps and not (_dram_gbps.isdigit() and 0 < int(_dram_gbps) < 1 << 31):
    raise ValueError(f"JAX_RMSNORM_DRAM_GBPS={_dram_gbps!r}: expected a positive integer, GB/s (or unset)")

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


# Devices whose launch plans tests/test_plan.py pins: an H100 (132 SMs,
# compute capability 9.0), an H200 (the same, with faster DRAM: the backward's
# stats_ahead) and an A100 (108 SMs, 8.0).
PLAN_DEVICES = {
    "h100": dict(sms=132, cc_major=9, cc_minor=0, smem_optin=232448, dram_gbps=3352),
    "h200": dict(sms=132, cc_major=9, cc_minor=0, smem_optin=232448, dram_gbps=4917),
    "a100": dict(sms=108, cc_major=8, cc_minor=0, smem_optin=166912, dram_gbps=1555),
}


def current_device() -> dict:
    """The fields of ``PLAN_DEVICES`` for the GPU that runs this process's
    kernels (CUDA's current device), as its plans read them."""
    if _jax_rmsnorm_cuda is None:
        raise RuntimeError("device='current' needs the CUDA kernels; this installation was built without them")
    dev = _jax_rmsnorm_cuda.current_device()
    if dev["sms"] < 1:
        raise RuntimeError("device='current': no CUDA device could be read")
    return dev


_FWD_OPTIONS = frozenset({"gamma", "beta", "zero_centered", "groups", "residual", "residual_f32", "h_f32", "quant",
                          "group_size", "group_scale", "tensors", "qt", "fp8_x", "x_group", "given_stats", "aligned"})
_BWD_OPTIONS = frozenset({"gamma", "param_outputs", "groups", "coef", "dh", "aligned", "slots"})


def describe_plan(direction: str, kind: str, shape, dtype, *, device="h100", param_dtype=None, **options) -> str:
    """Which CUDA kernel, in which configuration, takes a normalization (a debugging aid).

    ``direction`` is ``"fwd"`` or ``"bwd"``, ``kind`` ``"rms"`` or ``"layer"``;
    ``shape`` is x's shape (normalized over its last axis), ``dtype`` x's dtype
    (float32, bfloat16 or float16; for FP8 x, y's), ``param_dtype`` gamma's
    (default x's). ``device`` names one of ``PLAN_DEVICES``, is a dict of the
    same fields, or is ``"current"``: the GPU that runs this process's kernels
    (CUDA's current device; needs the CUDA module and a GPU). Forward
    options: ``gamma``, ``beta``, ``zero_centered``, ``groups`` (parameter groups, from vmap), ``residual`` with ``residual_f32``
    and ``h_f32``, ``quant`` (``"none"``, ``"tensor"``, ``"row"``, ``"group"``,
    ``"current"``) with ``group_size``, ``group_scale`` (``"float32"``, ``"pow2"``, ``"e8m0"``,
    ``"nvfp4"``), ``tensors`` and ``qt`` (current
    scaling's transposed copy), ``fp8_x`` with ``x_group``, ``given_stats``,
    ``aligned`` (all buffers 16-byte aligned; XLA's always are). Backward
    options: ``gamma``, ``param_outputs`` (dgamma and dbeta wanted), ``groups``,
    ``coef`` (the hidden dim split across devices), ``dh``, ``aligned``; the
    workspace is sized as the primitives size it.

    Returns one line: the kernel and its configuration, the launch's geometry
    (``ctas=resident`` for persistent kernels, whose grid is the GPU's
    occupancy), and ``rule=``, the entry of docs/tuning.md that says why.
    The plans are plain C++ (csrc/plan), so this works on any machine.
    """
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError("shape must have rank >= 1")
    hidden = shape[-1]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    known = _FWD_OPTIONS if direction == "fwd" else _BWD_OPTIONS
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"describe_plan: unknown {direction} option(s) {unknown}; known: {sorted(known)}")
    if device == "current":
        dev = current_device()
    elif isinstance(device, str):
        if device not in PLAN_DEVICES:
            raise ValueError(f"device must be 'current', one of {sorted(PLAN_DEVICES)} or a dict, got {device!r}")
        dev = PLAN_DEVICES[device]
    else:
        dev = dict(device)
    problem = dict(kind=kind, dtype=_dtype_name(dtype), rows=rows, hidden=hidden, **options)
    if param_dtype is not None:
        problem["param_dtype"] = _dtype_name(param_dtype)
    if direction == "fwd":
        return _jax_rmsnorm_cpu.describe_fwd_plan(problem, dev)
    groups = int(problem.get("groups", 1))
    outputs = int(problem.setdefault("param_outputs", 1 if kind == "rms" else 2))
    problem.setdefault("slots", cuda_slots(kind, dtype, rows // max(groups, 1), hidden, outputs))
    return _jax_rmsnorm_cpu.describe_bwd_plan(problem, dev)


def _dtype_name(d) -> str:
    """The plans' name of a float dtype (float32, bfloat16, float16)."""
    import numpy as np

    return np.dtype(d).name


def cuda_slots(kind: str, dtype, rows_per_group: int, hidden: int, param_outputs: int) -> int:
    """Rows of float32 partial dgamma/dbeta sums the CUDA backward's workspace
    gets per parameter group for x of ``dtype`` (0: none; the plan's
    workspace_slots). ``kind``: "rms" or "layer"."""
    return _jax_rmsnorm_cpu.bwd_workspace_slots(kind, _dtype_name(dtype), int(rows_per_group), int(hidden),
                                                int(param_outputs))


def qt_scales_workspace(group_scale: str) -> bool:
    """Whether the CUDA fused forward takes a workspace of the columnwise
    copy's scales' size for ``group_scale`` (its scales written by rows, then
    transposed: the plan's tile_scales_by_rows)."""
    return bool(_jax_rmsnorm_cpu.tile_scales_by_rows(group_scale))


def plan_limits() -> dict:
    """The launch plans' thresholds (csrc/plan/plan.h) that tests probe on both sides."""
    return dict(_jax_rmsnorm_cpu.plan_limits())


def export_checks() -> list:
    """The safety checks ``jax.export`` must skip for these custom calls.

    ``jax.export`` accepts only custom calls it knows to be stable; pass
    ``disabled_checks=jax_rmsnorm.export_checks()`` to ``jax.export.export``.
    The side that deserializes and runs the artifact must ``import
    jax_rmsnorm`` first, of the same version, which registers the targets.
    """
    from jax import export

    return [export.DisabledSafetyCheck.custom_call(name) for name in TARGETS]
