"""Public functions of the plain norms: the differentiable ops over the
kernels of ``_core`` (see ``_ad``), the distributed building blocks and
``all_reduce_rms_norm``."""

from __future__ import annotations

import math
import os
import re
from typing import Optional, Tuple

import numpy as np
import jax
import jax.numpy as jnp

from ._checks import (Config, as_array, check_axis_name, check_bool, check_hidden_size, check_like, check_param,
                      check_stat, check_x, config, dtype_name, is_fp8, no_fp8_options, staged)
from ._compat import varying_axes
from ._ad import kernel_op
from ._core import (backward, forward, full_hidden, grad_sums, moments_reference, normalize_reference,
                    scale_reference, slice_stats, sliced_forward, sum_to_primal_vma)
from ._fused import _run
from ._primitives import (LAYER, NVLINK_MAX_DEVICES, NVLINK_MAX_ROW_BYTES, RMS, absent_param, all_reduce_norm_p,
                          kernel_params, merge_layer_stats, nvlink_available)

Array = jax.Array

# ---------------------------------------------------------------------------
# the ops of one call: each a kernel forward, a jnp reference of its math and
# a backward (see _ad.kernel_op)


def _normalize_fwd(cfg, x, gamma, beta):
    y, mean, rstd = forward(x, gamma, beta, cfg)
    return (y,), (mean, rstd)


def _normalize_reference(cfg, x, gamma, beta):
    return (normalize_reference(x.astype(jnp.float32), gamma, beta, cfg).astype(x.dtype),)


def _normalize_bwd(cfg, args, res, cts):
    x, gamma, beta = args
    mean, rstd = res
    grads = backward(cts[0], x, mean, rstd, gamma, beta, cfg)
    return tuple(sum_to_primal_vma(g, p) for g, p in zip(grads, args))


# (x, gamma, beta) -> (y,)
_normalize = kernel_op(_normalize_fwd, _normalize_reference, _normalize_bwd)


# The hidden dim split over mesh axes inside shard_map: statistics of whole
# rows are combined over those axes (a few floats a row), never activations.


def _sliced_fwd(static, x, gamma, beta):
    cfg, axes = static
    y, mean, rstd = sliced_forward(x, gamma, beta, cfg, axes)
    return (y,), (mean, rstd)


def _sliced_reference(static, x, gamma, beta):
    cfg, axes = static
    return (normalize_reference(x.astype(jnp.float32), gamma, beta, cfg, axes).astype(x.dtype),)


def _sliced_bwd(static, args, res, cts):
    cfg, axes = static
    x, gamma, beta = args
    mean, rstd = res
    dy = cts[0]
    coef = jax.lax.psum(grad_sums(dy, x, mean, rstd, gamma, cfg), axes) / full_hidden(x, axes)
    grads = backward(dy, x, mean, rstd, gamma, beta, cfg, coef=coef)
    return tuple(sum_to_primal_vma(g, p) for g, p in zip(grads, args))


# ((cfg, axes), x, gamma, beta) -> (y,)
_normalize_sliced = kernel_op(_sliced_fwd, _sliced_reference, _sliced_bwd)


def _dispatch(x, gamma, beta, cfg, axis_name):
    axes = check_axis_name(axis_name)
    gamma, beta = kernel_params(x, gamma, beta)
    if axes is None:
        return _normalize(cfg, x, gamma, beta)[0]
    return _normalize_sliced((cfg, axes), x, gamma, beta)[0]


# The forward with its statistics as outputs (rms_norm_fwd, layer_norm_fwd).


def _with_stats_fwd(cfg, x, gamma, beta):
    y, mean, rstd = forward(x, gamma, beta, cfg)
    return (y, mean, rstd), (mean, rstd)


def _with_stats_reference(cfg, x, gamma, beta):
    xf = x.astype(jnp.float32)
    mean, rstd = moments_reference(xf, cfg.kind, cfg.eps)
    y = normalize_reference(xf, gamma, beta, cfg, mean=mean, rstd=rstd).astype(x.dtype)
    return y, (None if mean is None else mean[..., 0]), rstd[..., 0]


def _with_stats_bwd(cfg, args, res, cts):
    x, gamma, beta = args
    mean, rstd = res
    dy, d_mean, d_rstd = cts
    dy = jnp.zeros_like(x) if dy is None else dy
    coef = None
    if d_mean is not None or d_rstd is not None:
        # The statistics' cotangents enter the backward kernel through its row
        # coefficients: d rstd / dx = -rstd^2 xhat / n and d mean / dx = 1 / n
        # shift mean(gdy * xhat) by d_rstd * rstd / n and mean(gdy) by
        # -d_mean / (rstd n), in dx = rstd (gdy - mean(gdy) - xhat mean(gdy * xhat)).
        sums = grad_sums(dy, x, mean, rstd, gamma, cfg)
        c1 = sums if cfg.kind == RMS else sums[..., 0]
        if d_rstd is not None:
            c1 = c1 + d_rstd * rstd
        if cfg.kind == RMS:
            coef = c1 / x.shape[-1]
        else:
            c2 = sums[..., 1] if d_mean is None else sums[..., 1] - d_mean / rstd
            coef = jnp.stack([c1, c2], axis=-1) / x.shape[-1]
    grads = backward(dy, x, mean, rstd, gamma, beta, cfg, coef=coef)
    return tuple(sum_to_primal_vma(g, p) for g, p in zip(grads, args))


# (x, gamma, beta) -> (y, mean or None, rstd)
_normalize_with_stats = kernel_op(_with_stats_fwd, _with_stats_reference, _with_stats_bwd)


# The backward as a function (rms_norm_bwd, layer_norm_bwd): its own
# derivatives are its reference's (jnp).


def _backward_fwd(static, dy, x, mean, rstd, gamma):
    cfg, beta_dtype = static
    beta_like = None if beta_dtype is None else jnp.zeros((x.shape[-1],), beta_dtype)  # dbeta's shape and dtype
    return backward(dy, x, mean, rstd, gamma, beta_like, cfg), ()


def _backward_reference(static, dy, x, mean, rstd, gamma):
    cfg, beta_dtype = static
    xf, d = x.astype(jnp.float32), dy.astype(jnp.float32)
    r = rstd[..., None]
    xhat = (xf if mean is None else xf - mean[..., None]) * r
    gdy = scale_reference(d, gamma, cfg.zero_centered_gamma)
    dx = gdy - xhat * jnp.mean(gdy * xhat, axis=-1, keepdims=True)
    if cfg.kind == LAYER:
        dx = dx - jnp.mean(gdy, axis=-1, keepdims=True)
    rows = tuple(range(x.ndim - 1))
    dgamma = None if gamma is None else jnp.sum(d * xhat, axis=rows).astype(gamma.dtype)
    dbeta = None if beta_dtype is None else jnp.sum(d, axis=rows).astype(beta_dtype)
    return (r * dx).astype(x.dtype), dgamma, dbeta


# ((cfg, dbeta's dtype or None), dy, x, mean, rstd, gamma) -> (dx, dgamma, dbeta)
_backward_op = kernel_op(_backward_fwd, _backward_reference)


# Statistics of a slice, and normalization with given statistics, as
# differentiable building blocks.


def _stats_fwd(kind, x):
    stats = slice_stats(x, kind)
    return (stats,), (stats,)


def _stats_reference(kind, x):
    xf = x.astype(jnp.float32)
    if kind == RMS:
        return (jnp.sum(xf * xf, axis=-1),)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    return (jnp.stack([mean[..., 0], jnp.sum(jnp.square(xf - mean), axis=-1)], axis=-1),)


def _stats_bwd(kind, args, res, cts):
    (x,), (stats,), (ct,) = args, res, cts
    xf = x.astype(jnp.float32)
    if kind == RMS:  # d sum(x^2) = 2 x
        return ((2.0 * xf * ct[..., None]).astype(x.dtype),)
    # d mean = 1/n; d m2 = 2 (x - mean) (the mean's own variation sums to zero)
    n = x.shape[-1]
    dx = ct[..., :1] / n + 2.0 * (xf - stats[..., :1]) * ct[..., 1:]
    return (dx.astype(x.dtype),)


# (x,) -> (stats,)
_stats = kernel_op(_stats_fwd, _stats_reference, _stats_bwd)


def _apply_fwd(cfg, x, gamma, beta, mean, rstd):
    return (forward(x, gamma, beta, cfg, mean=mean, rstd=rstd)[0],), ()


def _apply_reference(cfg, x, gamma, beta, mean, rstd):
    y = normalize_reference(x.astype(jnp.float32), gamma, beta, cfg, mean=None if mean is None else mean[..., None],
                            rstd=rstd[..., None])
    return (y.astype(x.dtype),)


def _apply_bwd(cfg, args, res, cts):
    x, gamma, beta, mean, rstd = args
    dy = cts[0]
    layer = cfg.kind == LAYER
    # With mean and rstd held fixed: dx = rstd * gdy, i.e. the backward with
    # zero row coefficients; their own gradients from the row sums of gdy.
    sums = grad_sums(dy, x, mean, jnp.ones_like(rstd), gamma, cfg)  # sum(gdy * (x - mean))[, sum(gdy)]
    dx, dgamma, dbeta = backward(dy, x, mean, rstd, gamma, beta, cfg, coef=jnp.zeros_like(sums))
    dmean = -rstd * sums[..., 1] if layer else None
    grads = (dx, dgamma, dbeta, dmean, sums[..., 0] if layer else sums)
    return tuple(sum_to_primal_vma(g, p) for g, p in zip(grads, args))


# (x, gamma, beta, mean, rstd) -> (y,)
_apply = kernel_op(_apply_fwd, _apply_reference, _apply_bwd)


# ---------------------------------------------------------------------------
# public API


_FP8_INPUT_DOC = """
    FP8 input: ``x`` may be ``float8_e4m3fn``/``float8_e5m2`` holding codes of
    ``x_scale * x`` (dequantized in the kernel, in float32, as it is read).

      x_scale: float32; a scalar (one scale for the tensor), or with
        ``group_size`` shape ``x.shape[:-1] + (hidden // group_size,)``: column
        ``c`` of a row reads ``x[..., c] * x_scale[..., c // group_size]``
        (the layout ``rms_norm_fp8_groupwise`` returns). A Python number must
        be finite and > 0; a JAX array's values are used as they are,
        unchecked (not known at trace time): each code is multiplied by its
        scale, so a zero, negative, infinite or NaN scale gives zero, negated,
        infinite or NaN inputs to the norm.
      group_size: columns per scale (must divide the hidden size), or None.
      dtype: ``y``'s dtype, float32, bfloat16 (default) or float16; ``gamma``
        and ``beta`` may be any of these three whatever ``dtype`` is.

    Its backward dequantizes ``x`` in ``dtype`` and runs the backward kernel
    on it (one more pass over ``x`` than a float input). The cotangent of the
    FP8 ``x`` is ``dx * x_scale`` rounded to its FP8 dtype (saturating), and
    that of ``x_scale`` the per-group ``sum(dx * x)``.
"""


def _fp8_input(kind, x, gamma, beta, eps, zero_centered_gamma, axis_name, x_scale, group_size, dtype):
    """The FP8-input path of rms_norm/layer_norm; None for a float x (once
    its FP8-only options are checked to be absent)."""
    if not is_fp8(x):
        no_fp8_options(x_scale, group_size, dtype)
        return None
    if axis_name is not None:
        raise NotImplementedError("axis_name is not supported with an FP8 x yet")
    y, *_ = _run(kind, x, None, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                      x_scale=x_scale, x_group_size=group_size, dtype=dtype)
    return y


@staged
def rms_norm(x: Array, gamma: Optional[Array] = None, *, eps: float = 1e-6,
             zero_centered_gamma: bool = False, axis_name=None, x_scale=None, group_size=None,
             dtype=None) -> Array:
    """RMSNorm over the last axis: ``y = x * rsqrt(mean(x**2) + eps) * scale``.

    Args:
      x: ``(..., hidden)`` array, float32, bfloat16 or float16 (or FP8 with
        ``x_scale``, below); any rank >= 1.
      gamma: ``(hidden,)`` scale, float32, bfloat16 or float16 (any with any
        ``x``: the kernels take it in ``x``'s dtype or float32, others are
        widened to float32); None for no scale.
      eps: added to the mean square, a Python number >= 0.
      zero_centered_gamma: scale by ``1 + gamma`` (Gemma) instead of ``gamma``.
      axis_name: inside ``shard_map``, the mesh axis name (or tuple of names)
        the hidden dim is split over: ``x`` and ``gamma`` are this device's
        slices, and only per-row statistics (one float a row) are summed
        across the devices, forward and backward. Not needed under ``jit``
        with sharded arrays, where the partitioning is automatic.

    Returns:
      ``y`` with ``x``'s shape and dtype. Statistics are computed in float32.
      Differentiable in ``x`` and ``gamma`` (``dgamma`` in ``gamma``'s dtype),
      in forward and reverse mode and to any order: ``jax.grad`` runs the
      backward kernel, ``jax.jvp`` a jnp tangent (docs/api.md, Gradients).
    """
    y = _fp8_input(RMS, x, gamma, None, eps, zero_centered_gamma, axis_name, x_scale, group_size, dtype)
    if y is not None:
        return y
    x = check_x(x)
    gamma = check_param(gamma, "gamma", x)
    return _dispatch(x, gamma, None, config(RMS, eps, zero_centered_gamma), axis_name)


@staged
def layer_norm(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
               eps: float = 1e-5, zero_centered_gamma: bool = False, axis_name=None, x_scale=None,
               group_size=None, dtype=None) -> Array:
    """LayerNorm over the last axis: ``y = (x - mean) * rsqrt(var + eps) * scale + beta``.

    Args:
      x: ``(..., hidden)`` array, float32, bfloat16 or float16 (or FP8 with
        ``x_scale``, below); any rank >= 1.
      gamma: ``(hidden,)`` scale, float32, bfloat16 or float16 (as in
        :func:`rms_norm`); None for no scale.
      beta: ``(hidden,)`` shift, float32, bfloat16 or float16 (gamma's dtype
        or not); None for no shift.
      eps: added to the (biased) variance, a Python number >= 0.
      zero_centered_gamma: scale by ``1 + gamma`` instead of ``gamma``.
      axis_name: inside ``shard_map``, the mesh axis name(s) the hidden dim is
        split over (see :func:`rms_norm`); per-row (mean, m2) pairs are
        gathered and merged exactly, two floats a row per device.

    Returns:
      ``y`` with ``x``'s shape and dtype. Differentiable in ``x``, ``gamma``,
      ``beta`` (each gradient in its argument's dtype).
    """
    y = _fp8_input(LAYER, x, gamma, beta, eps, zero_centered_gamma, axis_name, x_scale, group_size, dtype)
    if y is not None:
        return y
    x = check_x(x)
    gamma = check_param(gamma, "gamma", x)
    beta = check_param(beta, "beta", x)
    return _dispatch(x, gamma, beta, config(LAYER, eps, zero_centered_gamma), axis_name)


@staged
def rms_norm_fwd(x: Array, gamma: Optional[Array] = None, *, eps: float = 1e-6,
                 zero_centered_gamma: bool = False) -> Tuple[Array, Array]:
    """RMSNorm forward that also returns the statistic the backward needs.

    Returns:
      ``(y, rstd)``: ``y`` like ``x``; ``rstd = rsqrt(mean(x**2) + eps)``,
      float32 of shape ``x.shape[:-1]``. Both differentiable in ``x`` and
      ``gamma``: ``jax.grad`` runs the backward kernel, into which the
      cotangent of ``rstd`` enters through the rows' coefficients.
    """
    x = check_x(x)
    gamma, _ = kernel_params(x, check_param(gamma, "gamma", x))
    y, _, rstd = _normalize_with_stats(config(RMS, eps, zero_centered_gamma), x, gamma, None)
    return y, rstd


@staged
def rms_norm_bwd(dy: Array, x: Array, rstd: Array, gamma: Optional[Array] = None, *,
                 zero_centered_gamma: bool = False) -> Tuple[Array, Optional[Array]]:
    """RMSNorm backward from the forward's saved ``rstd``.

    Args:
      dy: gradient of ``y``, ``x``'s shape and dtype.
      x: the forward's input.
      rstd: float32, ``x.shape[:-1]``, as returned by :func:`rms_norm_fwd`.
      gamma: the forward's scale, or None.

    Returns:
      ``(dx, dgamma)``: ``dx`` like ``x``; ``dgamma`` like ``gamma`` (None without gamma).
      Differentiable in every argument (those derivatives are jnp).
    """
    x = check_x(x)
    dy = check_like(dy, "dy", x)
    rstd = check_stat(rstd, "rstd", x)
    gamma = check_param(gamma, "gamma", x)
    cfg = Config(RMS, 0.0, check_bool(zero_centered_gamma, "zero_centered_gamma"))
    dx, dgamma, _ = _backward_op((cfg, None), dy, x, None, rstd, kernel_params(x, gamma)[0])
    return dx, (None if gamma is None else dgamma.astype(gamma.dtype))


@staged
def layer_norm_fwd(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                   eps: float = 1e-5, zero_centered_gamma: bool = False) -> Tuple[Array, Array, Array]:
    """LayerNorm forward that also returns the statistics the backward needs.

    Returns:
      ``(y, mean, rstd)``: ``y`` like ``x``; ``mean`` and ``rstd = rsqrt(var + eps)``
      float32 of shape ``x.shape[:-1]``. All differentiable, as in
      :func:`rms_norm_fwd`.
    """
    x = check_x(x)
    gamma, beta = kernel_params(x, check_param(gamma, "gamma", x), check_param(beta, "beta", x))
    return _normalize_with_stats(config(LAYER, eps, zero_centered_gamma), x, gamma, beta)


@staged
def layer_norm_bwd(dy: Array, x: Array, mean: Array, rstd: Array, gamma: Optional[Array] = None, *,
                   zero_centered_gamma: bool = False) -> Tuple[Array, Optional[Array], Array]:
    """LayerNorm backward from the forward's saved ``mean`` and ``rstd``.

    Returns:
      ``(dx, dgamma, dbeta)``: ``dx`` like ``x``; ``dgamma`` like ``gamma`` (None
      without gamma); ``dbeta = sum(dy)`` over rows, in gamma's dtype (``x``'s
      dtype without gamma), shape ``(hidden,)``. Differentiable in every
      argument (those derivatives are jnp).
    """
    x = check_x(x)
    dy = check_like(dy, "dy", x)
    mean = check_stat(mean, "mean", x)
    rstd = check_stat(rstd, "rstd", x)
    gamma = check_param(gamma, "gamma", x)
    cfg = Config(LAYER, 0.0, check_bool(zero_centered_gamma, "zero_centered_gamma"))
    kernel_gamma, _ = kernel_params(x, gamma)
    beta_dtype = np.dtype(x.dtype if gamma is None else kernel_gamma.dtype)
    dx, dgamma, dbeta = _backward_op((cfg, beta_dtype), dy, x, mean, rstd, kernel_gamma)
    p_dtype = x.dtype if gamma is None else gamma.dtype
    return dx, (None if gamma is None else dgamma.astype(p_dtype)), dbeta.astype(p_dtype)


# ---------------------------------------------------------------------------
# distributed building blocks


@staged
def rms_norm_stats(x: Array) -> Array:
    """Per-row sum of squares of this slice of the hidden dim: the statistic
    that devices holding slices of a row add up (with ``psum`` or any
    all-reduce) before :func:`rms_norm_apply`.

    Args:
      x: ``(..., hidden_slice)``, float32, bfloat16 or float16.

    Returns:
      ``sum(x**2, axis=-1)`` in float32, shape ``x.shape[:-1]``. Differentiable.
    """
    return _stats(RMS, check_x(x))[0]


@staged
def rms_norm_apply(x: Array, stats: Array, gamma: Optional[Array] = None, *, hidden_size: int,
                   eps: float = 1e-6, zero_centered_gamma: bool = False) -> Array:
    """Normalizes a slice of the hidden dim with statistics of whole rows.

    Args:
      x: ``(..., hidden_slice)``, this device's slice of the rows.
      stats: float32 ``x.shape[:-1]``: the sum of squares over whole rows (the
        sum of every slice's :func:`rms_norm_stats`).
      gamma: ``(hidden_slice,)``, this slice's scale, or None.
      hidden_size: the whole row's length (the mean square is ``stats / hidden_size``).

    Returns:
      ``x * rsqrt(stats / hidden_size + eps) * scale``, like ``x``.
      Differentiable in ``x``, ``stats`` and ``gamma``.
    """
    x = check_x(x)
    stats = check_stat(stats, "stats", x)
    gamma, _ = kernel_params(x, check_param(gamma, "gamma", x))
    hidden = check_hidden_size(hidden_size, x)
    cfg = config(RMS, eps, zero_centered_gamma)
    return _apply(cfg, x, gamma, None, None, jax.lax.rsqrt(stats / hidden + cfg.eps))[0]


@staged
def layer_norm_stats(x: Array) -> Array:
    """Per-row ``(mean, m2)`` of this slice of the hidden dim, ``m2 =
    sum((x - mean)**2)``: gather these from the devices holding slices of a
    row (``all_gather``; two floats a row each) and pass them stacked to
    :func:`layer_norm_apply`, which merges them exactly (no ``E[x^2] -
    E[x]^2`` cancellation).

    Returns:
      float32 ``x.shape[:-1] + (2,)``. Differentiable.
    """
    return _stats(LAYER, check_x(x))[0]


@staged
def layer_norm_apply(x: Array, stats: Array, gamma: Optional[Array] = None,
                     beta: Optional[Array] = None, *, hidden_size: int, eps: float = 1e-5,
                     zero_centered_gamma: bool = False) -> Array:
    """Normalizes a slice of the hidden dim with statistics of whole rows.

    Args:
      x: ``(..., hidden_slice)``, this device's slice of the rows.
      stats: the slices' :func:`layer_norm_stats` stacked on a leading axis,
        ``(n_slices,) + x.shape[:-1] + (2,)``, from ``n_slices`` equal slices
        making up ``hidden_size``; or ``x.shape[:-1] + (2,)``: (mean, m2) of
        whole rows.
      gamma, beta: ``(hidden_slice,)``, this slice's parameters, or None.
      hidden_size: the whole row's length.

    Returns:
      ``(x - mean) * rsqrt(m2 / hidden_size + eps) * scale + beta``, like ``x``.
      Differentiable in ``x``, ``stats``, ``gamma`` and ``beta``.
    """
    x = check_x(x)
    gamma, beta = kernel_params(x, check_param(gamma, "gamma", x), check_param(beta, "beta", x))
    hidden = check_hidden_size(hidden_size, x)
    stats = as_array(stats, "stats")
    pair = x.shape[:-1] + (2,)
    if stats.dtype != jnp.float32 or stats.shape[-len(pair):] != pair or stats.ndim not in (
            len(pair), len(pair) + 1):
        raise ValueError(f"stats must be float32 of shape {pair} or (n_slices,) + {pair}, "
                         f"got {stats.shape} {dtype_name(stats.dtype)}")
    if stats.ndim == len(pair) + 1:
        if stats.shape[0] * x.shape[-1] != hidden:
            raise ValueError(f"{stats.shape[0]} slices of {x.shape[-1]} do not make up "
                             f"hidden_size {hidden}")
        mean, m2 = merge_layer_stats(stats, x.shape[-1])
    else:
        mean, m2 = stats[..., 0], stats[..., 1]
    cfg = config(LAYER, eps, zero_centered_gamma)
    return _apply(cfg, x, gamma, beta, mean, jax.lax.rsqrt(m2 / hidden + cfg.eps))[0]


def all_reduce_rms_norm(partial_sum: Array, gamma: Optional[Array] = None, *, axis_name,
                        eps: float = 1e-6, zero_centered_gamma: bool = False,
                        scatter: bool = False, method: str = "auto") -> Array:
    """RMSNorm of the sum over devices of ``partial_sum`` (the output of a
    row-parallel matmul), inside ``shard_map``.

    Methods (how the forward without ``scatter`` communicates; the result is
    the same):

    * ``"nvlink"`` (CUDA GPUs of one process): one kernel a device sums and
      normalizes. Each device reads its 1/n of the rows from every device's
      partial sum through peer access (NVLink), normalizes them, and writes
      y into every device's output: the bytes of a ring all-reduce over
      NVLink, and no separate norm pass. Small calls (at most 512 KB / (n -
      1) a partial sum: decode-time rows) take a second kernel instead, in
      which each device sends its partial sum to every peer and computes
      every row itself, with no barrier. It needs peer access between the
      GPUs, at most 8 devices in ``axis_name``, a hidden size that is a
      whole number of 16-byte packs and at most 32 KB a row (16384 bf16,
      8192 float32), and every device of the axis in this process; it raises
      a ValueError otherwise. Under differentiation the forward is "psum"'s
      (the backward needs the whole sum on every device). The devices wait
      for each other inside the kernel; a wait of more than 20 s stops the
      program with a CUDA error rather than hang. Peer access reaches
      buffers of JAX's default allocator (and ``XLA_PYTHON_CLIENT_ALLOCATOR=
      platform``), not those of a stream-ordered memory pool. The kernel's
      call names the devices it was lowered for: a program exported with
      ``jax.export`` runs it only on those (``"auto"`` exports ``"psum"``).
      The calls on one GPU must run one after another, as XLA runs them by
      default: with ``--xla_gpu_command_buffer_scheduling_mode=CONCURRENT``
      in ``XLA_FLAGS`` "nvlink" raises a ValueError and "auto" takes
      "psum" (the mode given as a compiler option instead is not seen).
    * ``"psum"``: the all-reduce, then every device normalizes every row.
    * ``"scatter"``: the rows reduce-scattered (each device receives the sums
      of 1/n of the rows), normalized where they land, and all-gathered: the
      same bytes on the wire as the all-reduce, and 1/n of the norm's work
      each.
    * ``"auto"``: ``"nvlink"`` where it applies (lowered for CUDA, one
      process, peer access between every pair of its GPUs, the default or
      "platform" allocator, within the limits above, not exported with
      ``jax.export``), else ``"psum"``. docs/sharding.md compares the
      methods' times.

    Under differentiation (without ``scatter``) the forward saves the whole
    sum: the cotangent of the (replicated) output is the same on every
    device, so the backward then needs no communication at all, where the
    scattered rows would need their gradients all-gathered.

    Args:
      partial_sum: ``(rows, ..., hidden)``, this device's partial sum.
      gamma: ``(hidden,)``, replicated over ``axis_name``, or None.
      axis_name: the mesh axis (or tuple of axes) to sum over.
      scatter: return only this device's share of the rows, ``partial_sum``'s
        shape with the first axis divided by the axis size (sequence
        parallelism), skipping the all-gather. The first axis must then be a
        multiple of the axis size.
      method: ``"auto"``, ``"nvlink"``, ``"psum"`` or ``"scatter"`` (above).

    Returns:
      ``rms_norm(psum(partial_sum, axis_name), gamma)``, or its
      ``scatter``-ed share. Differentiable.
    """
    x = check_x(partial_sum, "partial_sum")
    gamma = check_param(gamma, "gamma", x)
    if method not in _ALL_REDUCE_METHODS:
        raise ValueError(f"method must be one of {_ALL_REDUCE_METHODS}, got {method!r}")
    cfg = config(RMS, eps, zero_centered_gamma)
    axes = check_axis_name(axis_name, required=True)
    n = math.prod(jax.lax.axis_size(a) for a in axes)
    if check_bool(scatter, "scatter"):
        if x.ndim < 2 or x.shape[0] % n:
            raise ValueError(f"scatter=True needs partial_sum's first axis to be a multiple of the "
                             f"axis size {n}, got shape {x.shape}")
        return _all_reduce(x, gamma, cfg, axes, None)
    if method == "nvlink":
        problem = _nvlink_problem(x, n)
        if problem:
            raise ValueError(f"method='nvlink' {problem}; use method='psum'")
    elif method == "auto":
        # The GPUs' one kernel where it applies (lowered for CUDA), else psum.
        method = "auto" if not _nvlink_problem(x, n) and nvlink_available() else "psum"
    if n == 1 or x.size == 0:  # nothing to sum, or nothing to launch
        method = "psum"
    return _all_reduce(x, gamma, cfg, axes, method)


@staged
def _all_reduce(x, gamma, cfg, axes, method):
    """all_reduce_rms_norm once its arguments are checked and its method
    chosen (None: scatter=True). The choice reads XLA_FLAGS and the devices,
    so it is made on every call, outside the staged part."""
    if method is None:
        return rms_norm(jax.lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True), gamma, eps=cfg.eps,
                        zero_centered_gamma=cfg.zero_centered_gamma)
    return _all_reduce_norm((cfg, tuple(axes), method), x, kernel_params(x, gamma)[0])[0]


# all_reduce_rms_norm's methods (see its docstring).
_ALL_REDUCE_METHODS = ("auto", "scatter", "psum", "nvlink")


def _nvlink_problem(x, n):
    """Why the "nvlink" kernel cannot take this call (None: it can)."""
    row_bytes = x.shape[-1] * x.dtype.itemsize
    if row_bytes % 16 or row_bytes > NVLINK_MAX_ROW_BYTES:
        return (f"needs partial_sum's hidden size to be a multiple of {16 // x.dtype.itemsize} and at most "
                f"{NVLINK_MAX_ROW_BYTES // x.dtype.itemsize} for {dtype_name(x.dtype)}, got {x.shape[-1]}")
    if n > NVLINK_MAX_DEVICES:
        return f"sums over at most {NVLINK_MAX_DEVICES} devices, got an axis size of {n}"
    if _concurrent_command_buffers():
        return ("needs the calls on one GPU to run one after another, which XLA_FLAGS' "
                "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT does not keep")
    return None


def _concurrent_command_buffers():
    """Whether XLA_FLAGS sets XLA's command buffers to run independent
    kernels at once (by the flag's last setting)."""
    modes = re.findall(r"--xla_gpu_command_buffer_scheduling_mode=(\w+)", os.environ.get("XLA_FLAGS", ""))
    return bool(modes) and modes[-1].upper() == "CONCURRENT"


def _nvlink_norm(x, gamma, cfg, axes, fallback):
    g = absent_param(x.dtype) if gamma is None else gamma
    return all_reduce_norm_p.bind(x, g, axes=tuple(axes), eps=cfg.eps, zero_centered=cfg.zero_centered_gamma,
                                  has_gamma=gamma is not None, fallback=fallback)


def _all_reduce_primal(static, x, gamma):
    """Reduce-scatter the rows, normalize this device's share, all-gather
    ("scatter"); sum and normalize in one kernel ("nvlink"; "auto": that on
    CUDA, psum elsewhere); or all-reduce and normalize every row ("psum")."""
    cfg, axes, method = static
    if method in ("nvlink", "auto"):  # "auto": psum + norm where lowered for the CPU, or exported
        return (_nvlink_norm(x, gamma, cfg, axes, fallback=method == "auto")[0],)
    if method != "scatter":  # the differentiated forward's own output
        return _all_reduce_fwd(static, x, gamma)[0]
    n = math.prod(jax.lax.axis_size(a) for a in axes)
    rows = x.reshape(-1, x.shape[-1])
    pad = -rows.shape[0] % n
    if pad:  # zero rows normalize to zero rows; they are dropped below
        rows = jnp.pad(rows, ((0, pad), (0, 0)))
    mine = forward(jax.lax.psum_scatter(rows, axes, scatter_dimension=0, tiled=True), gamma, None, cfg)[0]
    # Invariant over `axes` (the same on every device), as psum's result is.
    out = jax.lax.all_gather(mine, axes, axis=0, tiled=True, to="invarying")
    return (out[: out.shape[0] - pad].reshape(x.shape),)


def _all_reduce_fwd(static, x, gamma):
    # Differentiated, every method all-reduces: the backward needs the whole
    # sum on every device, which the "nvlink" kernel does not write.
    cfg, axes, _ = static
    total = jax.lax.psum(x, axes)
    y, _, rstd = forward(total, gamma, None, cfg)
    return (y,), (total, rstd)


def _all_reduce_reference(static, x, gamma):
    cfg, axes, _ = static
    return (normalize_reference(jax.lax.psum(x, axes).astype(jnp.float32), gamma, None, cfg).astype(x.dtype),)


def _all_reduce_bwd(static, args, res, cts):
    cfg = static[0]
    x, gamma = args
    total, rstd = res
    dx, dgamma, _ = backward(cts[0], total, None, rstd, gamma, None, cfg)
    # psum's transpose: every device's partial sum gets the whole gradient.
    extra = varying_axes(jax.typeof(x)) - varying_axes(jax.typeof(dx))
    if extra:
        dx = jax.lax.pcast(dx, tuple(sorted(extra)), to="varying")
    return dx, sum_to_primal_vma(dgamma, gamma)


# ((cfg, axes, method), x, gamma) -> (y,)
_all_reduce_norm = kernel_op(_all_reduce_fwd, _all_reduce_reference, _all_reduce_bwd, primal=_all_reduce_primal)


rms_norm.__doc__ += _FP8_INPUT_DOC
layer_norm.__doc__ += _FP8_INPUT_DOC
