"""Public fused variants: residual add + norm, norm + FP8 quantization (scaled
per tensor, row or group, or block-scaled: MXFP8, NVFP4), and the norm of an
FP8 input (dequantized in the kernel).

One kernel pass per call: ``x`` (and ``residual``) read once, ``y`` or its FP8
quantization (and ``h``) written once, with the statistics the backward needs.
The derivatives of the FP8 variants are straight-through: quantization is
treated as the identity, so ``dx``/``dgamma``/``dbeta`` are the norm's
gradients taken at the high-precision input with the cotangent of ``q`` (cast
to ``x``'s dtype), and ``q``'s tangent is the norm's, cast to ``q``'s dtype;
``amax`` and the scales have no derivative.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import jax
import jax.numpy as jnp

from ._checks import (FP8_MAX, Config, check_axis_name, check_block_size, check_bool, check_columnwise,
                      check_fp8_input, check_group_size, check_h_dtype, check_out_dtype, check_param, check_residual,
                      check_scale_ub, check_tensor_scale, check_x, config,
                      dtype_name, is_fp8, no_fp8_options, staged)
from ._ad import kernel_op
from ._core import (backward, full_hidden, grad_sums, normalize_reference, param_dtype, slice_stats, sliced_forward,
                    sum_to_primal_vma)
from ._primitives import LAYER, MIN_QUANT_SCALE, RMS, FusedSpec, absent_param, kernel_params, norm_fwd_fused

Array = jax.Array


# ---------------------------------------------------------------------------
# FP8 input


def _by_group(a, group):
    """``a`` in float32 with its last axis split into groups: ``(..., hidden // group, group)``."""
    return a.astype(jnp.float32).reshape(a.shape[:-1] + (a.shape[-1] // group, group))


def _dequantize(q, x_scale, group, dtype):
    """``q * x_scale`` per group of columns, float32 math, in ``dtype``."""
    return (_by_group(q, group) * x_scale[..., None]).reshape(q.shape).astype(dtype)


def _fp8_input_grads(dx, q, x_scale, group):
    """Cotangents of an FP8 ``x`` and its scales from ``dx``, the gradient of
    the dequantized input: ``dx * scale`` saturated into ``q``'s FP8 dtype,
    and ``sum(dx * q)`` over each group (float32)."""
    d = _by_group(dx, group)
    fmax = FP8_MAX[np.dtype(q.dtype)]
    dq = jnp.clip(d * x_scale[..., None], -fmax, fmax).reshape(q.shape).astype(q.dtype)
    return dq, jnp.sum(d * _by_group(q, group), axis=-1)


# ---------------------------------------------------------------------------
# the kernels behind one call


@dataclasses.dataclass(frozen=True)
class _FusedConfig:
    norm: Config
    spec: FusedSpec
    x_dtype: np.dtype  # the gradients' dtypes
    r_dtype: Optional[np.dtype]
    # Inside shard_map: the mesh axes the hidden dim is split over (residual
    # add + norm only); statistics of whole rows are combined over them.
    axes: tuple = ()


def _fused_forward(x, residual, gamma, beta, scale, x_scale, cfg: _FusedConfig):
    """(y or q, mean, rstd, h, qs, qt, qts) from one forward kernel (with ``cfg.axes``:
    ``h``, then the norm of a slice of the hidden dim)."""
    spec, norm = cfg.spec, cfg.norm
    if cfg.axes:
        stats, h = slice_stats(x, norm.kind, residual, spec.h_dtype)  # h and its statistics: one pass
        y, mean, rstd = sliced_forward(h, *kernel_params(h, gamma, beta), norm, cfg.axes, stats)
        return y.astype(x.dtype), mean, rstd, h, None, None, None
    if x.size == 0:
        stat = jnp.zeros(x.shape[:-1], jnp.float32)
        y = jnp.zeros(x.shape, spec.out_dtype or x.dtype)
        h = jnp.zeros(x.shape, spec.h_dtype) if spec.residual else None
        qs = None
        if spec.quant == "tensor":
            qs = jnp.zeros(jnp.shape(scale), jnp.float32)
        elif spec.quant == "current":
            qs = jnp.full(jnp.shape(scale), MIN_QUANT_SCALE, jnp.float32)
        elif spec.quant == "row":
            qs = stat
        elif spec.quant == "group":
            qs = jnp.zeros(x.shape[:-1] + (x.shape[-1] // spec.group_size,), spec.scale_dtype)
        qt = jnp.zeros(jnp.shape(scale) + (x.shape[-1], 0), y.dtype) if spec.transpose else None
        qts = jnp.zeros(jnp.shape(scale) + (x.shape[-1], 0), spec.scale_dtype) if spec.columnwise else None
        return y, (stat if norm.kind == LAYER else None), stat, h, qs, qt, qts
    typed = jax.ShapeDtypeStruct(x.shape, spec.out_dtype) if spec.x_group_size else x
    ph = absent_param(param_dtype(typed, gamma, beta))
    return norm_fwd_fused(x, ph if gamma is None else gamma, ph if beta is None else beta, residual, scale,
                          x_scale, kind=norm.kind, eps=norm.eps, zero_centered_gamma=norm.zero_centered_gamma,
                          has_gamma=gamma is not None, has_beta=beta is not None, fused=spec)


def _fused_fwd(cfg, x, residual, gamma, beta, scale, x_scale):
    y, mean, rstd, h, qs, qt, qts = _fused_forward(x, residual, gamma, beta, scale, x_scale, cfg)
    return (y, h, qs, qt, qts), (mean, rstd, h)


def _fused_reference(cfg, x, residual, gamma, beta, scale, x_scale):
    """The math of (y or q, h, qs, qt, qts) in jnp, straight-through for an
    FP8 output: q is y rounded to the normalized input's dtype and taken as the
    FP8 value (quantization counts as the identity, as the backward has it),
    q_t the same transposed, and the scales have no derivative (None)."""
    spec, norm = cfg.spec, cfg.norm
    group = spec.x_group_size
    xf = _dequantize(x, x_scale, group, jnp.float32) if group else x.astype(jnp.float32)
    h = None
    if spec.residual:  # summed in float32, stored in h_dtype, normalized as stored
        h = (xf + residual.astype(jnp.float32)).astype(spec.h_dtype)
        xf = h.astype(jnp.float32)
    y = normalize_reference(xf, gamma, beta, norm, cfg.axes)
    if spec.quant is None:
        return y.astype(spec.out_dtype if group else x.dtype), h, None, None, None
    y = y.astype(x.dtype if h is None else h.dtype)
    qt = None
    if spec.transpose:  # (hidden, rows) per tensor
        qt = jnp.swapaxes(y.reshape(jnp.shape(scale) + (-1, x.shape[-1])), -1, -2).astype(spec.out_dtype)
    return y.astype(spec.out_dtype), h, None, qt, None


def _fused_bwd(cfg, args, res, cts):
    x, residual, gamma, beta, scale, x_scale = args
    mean, rstd, h = res
    x_dtype, r_dtype = cfg.x_dtype, cfg.r_dtype
    ct_y, ct_h, _, ct_qt, _ = cts  # amax / scales: no gradient; None: a zero cotangent
    norm = cfg.norm
    group = cfg.spec.x_group_size
    # The backward reads the normalized input: h with a residual, else x
    # (dequantized if FP8; the FP8 x is kept for its own cotangents).
    saved = h if cfg.spec.residual else (_dequantize(x, x_scale, group, cfg.spec.out_dtype) if group else x)

    def x_grads(dx):
        """Cotangents of x and x_scale from the gradient of the (dequantized) input."""
        if not group:
            return sum_to_primal_vma(dx.astype(x_dtype), x), None
        dq, dxs = _fp8_input_grads(dx, x, x_scale, group)
        return sum_to_primal_vma(dq, x), sum_to_primal_vma(dxs, x_scale)

    # Straight-through for FP8 output: q's cotangent taken in the input's dtype;
    # q_t's (hidden, rows) is q's transposed, so its cotangent adds to q's.
    dy = jnp.zeros_like(saved) if ct_y is None else ct_y.astype(saved.dtype)
    if ct_qt is not None:
        dy = dy + jnp.swapaxes(ct_qt, -1, -2).reshape(dy.shape).astype(dy.dtype)
    d_scale = None if scale is None else jnp.zeros_like(scale)
    if not cfg.spec.residual:
        dx, dgamma, dbeta = backward(dy, saved, mean, rstd, gamma, beta, norm)
        gx, gxs = x_grads(dx)
        return (gx, None, sum_to_primal_vma(dgamma, gamma), sum_to_primal_vma(dbeta, beta), d_scale, gxs)
    dh = None if ct_h is None else ct_h.astype(saved.dtype)
    # With h in float32 and bf16/f16 parameters, the kernels run in float32.
    g, b = kernel_params(saved, gamma, beta)
    coef = None
    if cfg.axes and saved.size:  # the rows' sums, of whole rows
        coef = jax.lax.psum(grad_sums(dy, saved, mean, rstd, g, norm), cfg.axes) / full_hidden(saved, cfg.axes)
    dx, dgamma, dbeta = backward(dy, saved, mean, rstd, g, b, norm, coef=coef, dh=dh)
    dgamma = None if gamma is None else dgamma.astype(gamma.dtype)
    dbeta = None if beta is None else dbeta.astype(beta.dtype)
    gx, gxs = x_grads(dx)
    return (gx, sum_to_primal_vma(dx.astype(r_dtype), residual), sum_to_primal_vma(dgamma, gamma),
            sum_to_primal_vma(dbeta, beta), d_scale, gxs)


# (x, residual, gamma, beta, scale, x_scale) -> (y or q, h, qs, qt, qts)
_fused = kernel_op(_fused_fwd, _fused_reference, _fused_bwd)


# The block-scaled formats: their group scale (FusedSpec.group_scale), block
# size, name and code dtype (None: out_dtype, FP8).
_BLOCK_FORMATS = {"mxfp8": ("e8m0", 32, "MXFP8", None),
                  "nvfp4": ("nvfp4", 16, "NVFP4", np.dtype(jnp.float4_e2m1fn))}


def _run(kind, x, residual, gamma, beta, *, eps, zero_centered_gamma, h_dtype=None, quant=None,
         out_dtype=None, scale=None, group_size=0, scale_ub=None, x_scale=None, x_group_size=None, dtype=None,
         axis_name=None, transpose=False, power_of_two_scales=False, block_format=None):
    """Checks the arguments, then returns (y or q, h or None, qs or None, qt or None, qts or None).

    ``power_of_two_scales`` (quant "group"): scales rounded up to powers of
    two. ``block_format`` (quant "group"): a key of _BLOCK_FORMATS, whose
    block is the group; NVFP4 takes ``scale`` as its global scale.

    ``x_scale``/``x_group_size``/``dtype``: an FP8 ``x``'s scales, the columns
    per scale (None: one scale for the tensor), and the output dtype.
    ``axis_name``: inside shard_map, the mesh axes splitting the hidden dim
    (residual add + norm of a float ``x`` only). ``transpose``: current
    scaling's transposed copy of q too, or (quant "group") the columnwise
    copy and its scales."""
    spec = dict(quant=quant, transpose=check_bool(transpose, "transpose"))
    if is_fp8(x):
        if axis_name is not None:
            raise NotImplementedError("axis_name is not supported with an FP8 x yet")
        if quant is not None:
            raise TypeError(f"x must be float32, bfloat16 or float16 for an FP8 output, got {dtype_name(x.dtype)}")
        x, x_scale, group, typed = check_fp8_input(x, x_scale, x_group_size, dtype)
        spec.update(x_group_size=group, out_dtype=np.dtype(typed.dtype))
    else:
        no_fp8_options(x_scale, x_group_size, dtype)
        x = typed = check_x(x)
    gamma, beta = kernel_params(typed, check_param(gamma, "gamma", typed), check_param(beta, "beta", typed))
    norm = config(kind, eps, zero_centered_gamma)
    axes = check_axis_name(axis_name)
    if residual is not None:
        residual = check_residual(residual, typed)
        spec.update(residual=True, h_dtype=check_h_dtype(h_dtype, typed))
    elif h_dtype is not None:
        raise ValueError("h_dtype is only meaningful with a residual")
    fmt = _BLOCK_FORMATS[block_format] if block_format is not None else None
    if quant is not None:  # NVFP4's codes are E2M1 (no out_dtype)
        spec["out_dtype"] = fmt[3] if fmt and fmt[3] is not None else check_out_dtype(out_dtype)
    if quant == "tensor":
        scale = check_tensor_scale(scale)
    if quant in ("row", "group"):
        spec["scale_ub"] = check_scale_ub(scale_ub)
    if quant == "group" and fmt is not None:
        rule, block, name, _ = fmt
        spec.update(group_size=check_block_size(x, block, name), group_scale=rule)
        if rule == "nvfp4":
            scale = check_tensor_scale(scale, "global_scale", "NVFP4's per-tensor float32 scale (the block "
                                                              "scales are of y / global_scale)")
    elif quant == "group":
        spec["group_size"] = check_group_size(group_size, x)
        if check_bool(power_of_two_scales, "power_of_two_scales"):
            spec["group_scale"] = "pow2"
    if quant == "group" and spec["transpose"]:
        check_columnwise(x, spec["group_size"])
    if quant == "current" or (spec["transpose"] and scale is None):
        scale = jnp.zeros((), jnp.float32)  # not read: its shape counts the tensors (vmap)
    r_dtype = None if residual is None else np.dtype(residual.dtype)
    cfg = _FusedConfig(norm, FusedSpec(**spec), np.dtype(x.dtype), r_dtype, axes or ())
    return _fused(cfg, x, residual, gamma, beta, scale, x_scale)


def _with_h(outs, residual):
    """The public results: (q, qs), then h with a residual, then q_t and its
    scales (per-group output) if made."""
    q, h, qs, qt, qts = outs
    return (q, qs) + (() if residual is None else (h,)) + tuple(a for a in (qt, qts) if a is not None)


# ---------------------------------------------------------------------------
# public API: residual add


@staged
def add_rms_norm(x: Array, residual: Array, gamma: Optional[Array] = None, *, eps: float = 1e-6,
                 zero_centered_gamma: bool = False, h_dtype=None, axis_name=None, x_scale=None, group_size=None,
                 dtype=None):
    """Residual add fused with RMSNorm: ``h = x + residual``, ``y = rms_norm(h)``.

    One pass: reads ``x`` and ``residual``, writes ``h`` and ``y``. With the
    hidden dim split across devices (sharded ``jit``, or ``axis_name``), three
    passes over each device's slice (``h``; its statistics, of which only one
    float a row crosses devices; ``y``).

    Args:
      x: ``(..., hidden)``, float32, bfloat16 or float16.
      residual: ``x``'s shape; ``x``'s dtype or float32.
      gamma: ``(hidden,)`` scale, float32, bfloat16 or float16 (as in
        :func:`rms_norm`); None for no scale.
      eps, zero_centered_gamma: as :func:`rms_norm`.
      h_dtype: dtype of ``h``: ``x.dtype`` (default) or float32 (keep the
        residual stream in float32 while ``x`` is bf16/f16). The sum is taken
        in float32 and rounded to ``h_dtype``; ``y`` normalizes ``h`` as stored.
      axis_name: inside ``shard_map``, the mesh axis name (or tuple of names)
        over which the hidden dim is split (``x``, ``residual`` and ``gamma``
        are this device's slices), as in :func:`rms_norm`. Not with an FP8
        ``x``.
      x_scale, group_size, dtype: for an FP8 ``x``, as in :func:`rms_norm`;
        ``x.dtype`` above then means ``dtype``.

    Returns:
      ``(y, h)``: ``y`` like ``x``; ``h`` of ``x``'s shape in ``h_dtype``.
      Differentiable in ``x``, ``residual`` and ``gamma``: the backward kernel
      adds the cotangent of ``h`` to the norm's ``dx``; that sum is the gradient
      of both ``x`` and ``residual`` (each in its own dtype).
    """
    y, h, *_ = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                      h_dtype=h_dtype, x_scale=x_scale, x_group_size=group_size, dtype=dtype, axis_name=axis_name)
    return y, h


@staged
def add_layer_norm(x: Array, residual: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                   eps: float = 1e-5, zero_centered_gamma: bool = False, h_dtype=None, axis_name=None,
                   x_scale=None, group_size=None, dtype=None):
    """Residual add fused with LayerNorm: ``h = x + residual``, ``y = layer_norm(h)``.

    Arguments and results as :func:`add_rms_norm`, plus ``beta`` (``(hidden,)``,
    float32, bfloat16 or float16). Differentiable in ``x``, ``residual``, ``gamma``, ``beta``.
    """
    y, h, *_ = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                      h_dtype=h_dtype, x_scale=x_scale, x_group_size=group_size, dtype=dtype, axis_name=axis_name)
    return y, h


# ---------------------------------------------------------------------------
# public API: FP8 output

_FP8_ROUNDING_DOC = """
    The FP8 output is ``saturate(v)`` rounded to nearest even: values beyond the
    format's largest finite value (448 for float8_e4m3fn, 57344 for
    float8_e5m2) become that value, NaN stays NaN. ``y`` is the float32
    normalized value before any rounding to ``x``'s dtype.
"""

_FP8_DOC = """
    With ``residual=`` (``x``'s shape, ``x``'s dtype or float32) the input is
    ``h = x + residual`` (stored in ``h_dtype``: ``x.dtype`` or float32) and
    ``h`` is returned as a third result.

    Gradients are straight-through: quantization counts as the identity, so
    ``dx``, ``dgamma`` (``dbeta``, ``dresidual``) are the norm's gradients at the
    high-precision input with the cotangent of ``q`` cast to ``x``'s dtype
    (JAX hands an FP8 output an FP8 cotangent). In forward mode ``q``'s
    tangent is the norm's, cast to ``x``'s dtype and then to ``out_dtype``.
    The scales have no derivative.
"""


@staged
def rms_norm_fp8(x: Array, gamma: Optional[Array] = None, *, scale, out_dtype=jnp.float8_e4m3fn,
                 eps: float = 1e-6, zero_centered_gamma: bool = False, residual: Optional[Array] = None,
                 h_dtype=None):
    """RMSNorm with FP8 output, per-tensor scale given (delayed scaling).

    ``q = saturate(y * scale)`` in ``out_dtype``; ``amax = max |y|`` over the
    whole tensor, for the caller's next scale. One pass.

    Args:
      x: ``(..., hidden)``, float32, bfloat16 or float16.
      gamma: ``(hidden,)``, float32, bfloat16 or float16; None for no scale.
      scale: float32 scalar: an array, or a Python number, which must be
        finite and > 0. An array's value is not checked (it is not known at
        trace time) and is used as it is: zero gives zeros, a negative scale
        negated codes, an infinite one saturated codes (NaN where ``y`` is
        0), NaN gives NaN; ``amax`` does not depend on it.
      out_dtype: ``jnp.float8_e4m3fn`` (default) or ``jnp.float8_e5m2``.

    Returns:
      ``(q, amax)``, or ``(q, amax, h)`` with ``residual``: ``q`` of ``x``'s
      shape in ``out_dtype``; ``amax`` a float32 scalar. Under ``vmap`` each
      example gets its own ``amax`` (and may have its own ``scale``).
    """
    outs = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="tensor", out_dtype=out_dtype, scale=scale)
    return _with_h(outs, residual)


@staged
def layer_norm_fp8(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *, scale,
                   out_dtype=jnp.float8_e4m3fn, eps: float = 1e-5, zero_centered_gamma: bool = False,
                   residual: Optional[Array] = None, h_dtype=None):
    """LayerNorm with FP8 output, per-tensor scale given: as :func:`rms_norm_fp8`."""
    outs = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="tensor", out_dtype=out_dtype, scale=scale)
    return _with_h(outs, residual)


@staged
def rms_norm_fp8_current(x: Array, gamma: Optional[Array] = None, *, out_dtype=jnp.float8_e4m3fn,
                         eps: float = 1e-6, zero_centered_gamma: bool = False, residual: Optional[Array] = None,
                         h_dtype=None, transpose: bool = False):
    """RMSNorm with FP8 output, per-tensor current scaling: the scale comes
    from this tensor's own ``amax = max |y|``.

    ``scale_inv = max(amax / fp8_max, 1e-12)``, ``q = saturate(y * (1 /
    scale_inv))``, so ``y ~ q * scale_inv``. The whole tensor's amax is needed
    before anything is quantized: on the GPU this runs the norm twice (an amax
    pass reading x, then the quantizing pass), with no host synchronization.

    Args:
      transpose: also return ``q_t = q.reshape(-1, hidden).T``, shape
        ``(hidden, rows)`` (``rows = prod(x.shape[:-1])``), for the next
        matmul's backward. On the GPU the quantizing pass writes it with
        ``q`` from the same read of ``x`` where hidden and rows are multiples
        of 16 and there is no residual; otherwise a tiled transpose of ``q``
        follows that pass. Its cotangent is added to ``q``'s (transposed).

    Returns:
      ``(q, scale_inv)``, then ``h`` with ``residual``, then ``q_t`` with
      ``transpose``: ``scale_inv`` a float32 scalar (under ``vmap``, one per
      example).
    """
    outs = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="current", out_dtype=out_dtype, transpose=transpose)
    return _with_h(outs, residual)


@staged
def layer_norm_fp8_current(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                           out_dtype=jnp.float8_e4m3fn, eps: float = 1e-5, zero_centered_gamma: bool = False,
                           residual: Optional[Array] = None, h_dtype=None, transpose: bool = False):
    """LayerNorm with FP8 output, per-tensor current scaling: as :func:`rms_norm_fp8_current`."""
    outs = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="current", out_dtype=out_dtype, transpose=transpose)
    return _with_h(outs, residual)


@staged
def rms_norm_fp8_rowwise(x: Array, gamma: Optional[Array] = None, *, scale_ub: Optional[float] = None,
                         out_dtype=jnp.float8_e4m3fn, eps: float = 1e-6, zero_centered_gamma: bool = False,
                         residual: Optional[Array] = None, h_dtype=None):
    """RMSNorm with FP8 output and one dynamic scale per row.

    ``row_scale = max(min(max|y_row| / fp8_max, scale_ub), 1e-12)`` (the floor
    keeps all-zero rows finite: they quantize to zeros), ``q = saturate(y *
    (1 / row_scale))``, so ``y ~ q * row_scale``. One pass.

    Args:
      scale_ub: upper bound for the row scales (a Python number > 0), or None.
      other arguments as :func:`rms_norm_fp8`.

    Returns:
      ``(q, row_scale)`` or ``(q, row_scale, h)``: ``row_scale`` float32 of
      shape ``x.shape[:-1]``.
    """
    outs = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="row", out_dtype=out_dtype, scale_ub=scale_ub)
    return _with_h(outs, residual)


@staged
def layer_norm_fp8_rowwise(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                           scale_ub: Optional[float] = None, out_dtype=jnp.float8_e4m3fn, eps: float = 1e-5,
                           zero_centered_gamma: bool = False, residual: Optional[Array] = None, h_dtype=None):
    """LayerNorm with FP8 output and one dynamic scale per row: as :func:`rms_norm_fp8_rowwise`."""
    outs = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="row", out_dtype=out_dtype, scale_ub=scale_ub)
    return _with_h(outs, residual)


@staged
def rms_norm_fp8_groupwise(x: Array, gamma: Optional[Array] = None, *, group_size: int = 128,
                           scale_ub: Optional[float] = None, out_dtype=jnp.float8_e4m3fn, eps: float = 1e-6,
                           zero_centered_gamma: bool = False, residual: Optional[Array] = None, h_dtype=None,
                           power_of_two_scales: bool = False, transpose: bool = False):
    """RMSNorm with FP8 output and one dynamic scale per group of ``group_size``
    consecutive columns (e.g. 16 or 128; any size dividing the hidden size).

    Scales as in :func:`rms_norm_fp8_rowwise`, per group. One pass.

    Args:
      power_of_two_scales: round each scale up to a power of two (1x128
        blocks with power-of-two scales):
        ``2 ** ceil(log2(max(min(max|y| / fp8_max, scale_ub), 1e-12)))``, so
        an all-zero group's scale is ``2 ** -39``; ``q = saturate(y * (1 /
        scale))`` is then exact before its rounding. NaN stays NaN.

    Returns:
      ``(q, group_scales)`` or ``(q, group_scales, h)``: ``group_scales``
      float32 of shape ``x.shape[:-1] + (hidden // group_size,)``; column ``c``
      of a row dequantizes as ``q[..., c] * group_scales[..., c // group_size]``.
    """
    outs = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="group", out_dtype=out_dtype, group_size=group_size, scale_ub=scale_ub,
                power_of_two_scales=power_of_two_scales, transpose=transpose)
    return _with_h(outs, residual)


@staged
def layer_norm_fp8_groupwise(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                             group_size: int = 128, scale_ub: Optional[float] = None,
                             out_dtype=jnp.float8_e4m3fn, eps: float = 1e-5, zero_centered_gamma: bool = False,
                             residual: Optional[Array] = None, h_dtype=None, power_of_two_scales: bool = False,
                             transpose: bool = False):
    """LayerNorm with FP8 output and per-group scales: as :func:`rms_norm_fp8_groupwise`."""
    outs = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="group", out_dtype=out_dtype, group_size=group_size, scale_ub=scale_ub,
                power_of_two_scales=power_of_two_scales, transpose=transpose)
    return _with_h(outs, residual)


# ---------------------------------------------------------------------------
# public API: block-scaled outputs (MXFP8, NVFP4), for jax.nn.scaled_matmul

_BLOCK_DOC = """
    Scales as ``jax.nn.scaled_dot_general``'s quantizer defines them, so a
    model quantized by either gets the same codes on finite blocks (computed
    in IEEE float32 with denormals kept); where that quantizer divides by zero
    or loses a NaN, this library defines the result: a block holding NaN or an
    infinity gets a NaN scale and NaN codes (NVFP4's E2M1 has no NaN: its
    codes are +0 there), so it dequantizes to NaN. ``q`` and ``scales`` have
    the shapes and dtypes ``jax.nn.scaled_matmul`` takes (with ``x`` of shape
    ``(batch, rows, hidden)``).
"""


@staged
def rms_norm_mxfp8(x: Array, gamma: Optional[Array] = None, *, out_dtype=jnp.float8_e4m3fn, eps: float = 1e-6,
                   zero_centered_gamma: bool = False, residual: Optional[Array] = None, h_dtype=None,
                   transpose: bool = False):
    """RMSNorm with MXFP8 output: FP8 codes in blocks of 32 columns, each with
    an E8M0 (power-of-two) scale. One pass.

    For each block of 32 consecutive columns of the float32 ``y``:
    ``e = E8M0(max|y| / fp8_max)`` rounded up to a power of two (the
    exponent, plus one where the quotient has mantissa bits; E8M0 byte 0,
    ``2 ** -127``, for an all-zero block), ``q = saturate(y / 2 ** (e -
    127))`` rounded to nearest even; so ``y ~ q * scale``.

    Args:
      x: ``(..., hidden)``, float32, bfloat16 or float16; hidden a multiple of 32.
      gamma: ``(hidden,)``, float32, bfloat16 or float16; None for no scale.
      out_dtype: ``jnp.float8_e4m3fn`` (default) or ``jnp.float8_e5m2``.

    Returns:
      ``(q, scales)`` or ``(q, scales, h)``: ``q`` of ``x``'s shape in
      ``out_dtype``; ``scales`` float8_e8m0fnu of shape ``x.shape[:-1] +
      (hidden // 32,)``; column ``c`` dequantizes as ``q[..., c] *
      scales[..., c // 32]``.
    """
    outs = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="group", out_dtype=out_dtype, block_format="mxfp8", transpose=transpose)
    return _with_h(outs, residual)


@staged
def layer_norm_mxfp8(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                     out_dtype=jnp.float8_e4m3fn, eps: float = 1e-5, zero_centered_gamma: bool = False,
                     residual: Optional[Array] = None, h_dtype=None, transpose: bool = False):
    """LayerNorm with MXFP8 output: as :func:`rms_norm_mxfp8`."""
    outs = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="group", out_dtype=out_dtype, block_format="mxfp8", transpose=transpose)
    return _with_h(outs, residual)


@staged
def rms_norm_nvfp4(x: Array, gamma: Optional[Array] = None, *, global_scale, eps: float = 1e-6,
                   zero_centered_gamma: bool = False, residual: Optional[Array] = None, h_dtype=None,
                   transpose: bool = False):
    """RMSNorm with NVFP4 output: E2M1 (float4) codes in blocks of 16
    columns, each with an E4M3 scale, under a given per-tensor float32
    ``global_scale``. One pass.

    For each block of 16 consecutive columns of ``t = y / global_scale``
    (float32 ``y``, float32 division): ``scale = E4M3(min(max|t| / 6,
    448))`` rounded to nearest even, ``q = E2M1(clip(t / scale, -6, 6))``
    rounded to nearest even; so ``y ~ q * scale * global_scale``. A block
    whose scale rounds to 0 (all zeros, or ``max|t| <= 6 * 2 ** -10``) gets
    codes +0.

    ``global_scale`` is given, not computed: a scale from this tensor's own
    amax (``amax / (6 * 448)``, as current scaling does) would need that amax
    before any block is quantized, a second pass over ``x``; pass one from a
    previous step or your own amax.

    Args:
      x: ``(..., hidden)``, float32, bfloat16 or float16; hidden a multiple of 16.
      gamma: ``(hidden,)``, float32, bfloat16 or float16; None for no scale.
      global_scale: float32 scalar: an array, or a Python number, which must
        be finite and > 0. An array's value is not checked (it is not known
        at trace time) and is used as it is (a zero or NaN one gives NaN
        blocks). Under ``vmap`` each example may have its own.

    Returns:
      ``(q, scales)`` or ``(q, scales, h)``: ``q`` of ``x``'s shape in
      float4_e2m1fn; ``scales`` float8_e4m3fn of shape ``x.shape[:-1] +
      (hidden // 16,)``; column ``c`` dequantizes as ``q[..., c] *
      scales[..., c // 16] * global_scale``.
    """
    outs = _run(RMS, x, residual, gamma, None, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="group", scale=global_scale, block_format="nvfp4", transpose=transpose)
    return _with_h(outs, residual)


@staged
def layer_norm_nvfp4(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *, global_scale,
                     eps: float = 1e-5, zero_centered_gamma: bool = False, residual: Optional[Array] = None,
                     h_dtype=None, transpose: bool = False):
    """LayerNorm with NVFP4 output: as :func:`rms_norm_nvfp4`."""
    outs = _run(LAYER, x, residual, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                h_dtype=h_dtype, quant="group", scale=global_scale, block_format="nvfp4", transpose=transpose)
    return _with_h(outs, residual)


_COLUMNWISE_DOC = """
    With ``transpose=True`` the results end with the columnwise copy for the
    next matmul's weight gradient, ``(q_t, q_t_scales)`` (after ``h``): the
    float32 ``y`` of all rows (``rows = prod(x.shape[:-1])``) transposed to
    ``(hidden, rows)`` and quantized along its last axis, the rows, in blocks
    of the same size by the same rule (NVFP4: under the same
    ``global_scale``); quantized from ``y``, not from ``q``. ``q_t``:
    ``(hidden, rows)`` in ``q``'s dtype; ``q_t_scales``: ``(hidden, rows //
    block)`` in the scales' dtype; under ``vmap`` both gain the leading
    example axis. ``rows`` must be a multiple of the block (ValueError
    otherwise). ``q_t``'s cotangent is added to ``q``'s (transposed); its
    scales have none. Under a sharded ``jit``, rows split along ``x``'s
    first dim into whole blocks stay on their devices (``q_t`` split along
    its last dim); other splits are gathered for the call.
"""

for _f in (rms_norm_fp8, layer_norm_fp8, rms_norm_fp8_current, layer_norm_fp8_current, rms_norm_fp8_rowwise,
           layer_norm_fp8_rowwise, rms_norm_fp8_groupwise, layer_norm_fp8_groupwise):
    _f.__doc__ += _FP8_ROUNDING_DOC + _FP8_DOC
for _f in (rms_norm_mxfp8, layer_norm_mxfp8, rms_norm_nvfp4, layer_norm_nvfp4):
    _f.__doc__ += _BLOCK_DOC + _FP8_DOC
for _f in (rms_norm_fp8_groupwise, layer_norm_fp8_groupwise, rms_norm_mxfp8, layer_norm_mxfp8, rms_norm_nvfp4,
           layer_norm_nvfp4):
    _f.__doc__ += _COLUMNWISE_DOC
