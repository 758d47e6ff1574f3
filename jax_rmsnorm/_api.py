"""Public functions: argument checks, the custom VJP, and empty-array handling."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from functools import partial
from typing import Optional, Tuple

import numpy as np
import jax
import jax.numpy as jnp

from ._primitives import (LAYER, NVLINK_MAX_DEVICES, NVLINK_MAX_ROW_BYTES, RMS, _placeholder, _row_stats_shape,
                          all_reduce_norm_p, combine_stats, merge_layer_stats, norm_bwd, norm_fwd, norm_grad_stats,
                          norm_stats, nvlink_available, residual_sum, varying_axes)

Array = jax.Array

_X_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


# ---------------------------------------------------------------------------
# argument checks (all at trace time, on shapes and dtypes only)


def _dtype_name(dt) -> str:
    return np.dtype(dt).name


def _as_array(v, name):
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
        try:
            v = jnp.asarray(v)
        except TypeError as e:
            raise TypeError(f"{name} must be an array, got {type(v).__name__}") from e
    return v


def _check_x(x, name="x", dtypes=_X_DTYPES):
    x = _as_array(x, name)
    if x.ndim < 1:
        raise ValueError(f"{name} must have rank >= 1 (normalized over its last axis), got a scalar")
    if x.dtype not in dtypes:
        names = [_dtype_name(d) for d in dtypes]
        raise TypeError(f"{name} must be {', '.join(names[:-1])} or {names[-1]}, got {_dtype_name(x.dtype)}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name}'s last axis (the hidden size) must be >= 1, got shape {x.shape}")
    return x


def _check_param(p, name, x, dtype_of=None):
    if p is None:
        return None
    p = _as_array(p, name)
    hidden = x.shape[-1]
    if p.shape != (hidden,):
        raise ValueError(f"{name} must have shape ({hidden},) to match x's hidden size, got {p.shape}")
    if dtype_of is not None:
        if p.dtype != dtype_of.dtype:
            raise TypeError(f"{name} must have gamma's dtype {_dtype_name(dtype_of.dtype)}, "
                            f"got {_dtype_name(p.dtype)}")
    elif p.dtype not in (jnp.float32, x.dtype):
        raise TypeError(f"{name} must be float32 or x's dtype {_dtype_name(x.dtype)}, "
                        f"got {_dtype_name(p.dtype)}")
    return p


def _check_eps(eps):
    if isinstance(eps, (str, bytes)) or isinstance(eps, jax.core.Tracer):
        raise TypeError(f"eps must be a Python number, got {type(eps).__name__}")
    try:
        e = float(eps)
    except (TypeError, ValueError) as err:
        raise TypeError(f"eps must be a Python number, got {type(eps).__name__}") from err
    if not (e >= 0.0 and math.isfinite(e)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return e


def _check_like(a, name, x):
    a = _as_array(a, name)
    if a.shape != x.shape or a.dtype != x.dtype:
        raise ValueError(f"{name} must have x's shape {x.shape} and dtype {_dtype_name(x.dtype)}, "
                         f"got {a.shape} {_dtype_name(a.dtype)}")
    return a


def _check_stat(s, name, x):
    s = _as_array(s, name)
    if s.shape != x.shape[:-1] or s.dtype != jnp.float32:
        raise ValueError(f"{name} must be float32 of shape {x.shape[:-1]} (x.shape[:-1]), "
                         f"got {s.shape} {_dtype_name(s.dtype)}")
    return s


# ---------------------------------------------------------------------------
# the kernels behind one call, with empty inputs answered without a launch


@dataclasses.dataclass(frozen=True)
class _Config:
    kind: str
    eps: float
    zero_centered_gamma: bool


def _param_dtype(x, gamma, beta):
    p = gamma if gamma is not None else beta
    return x.dtype if p is None else p.dtype


def _forward(x, gamma, beta, cfg: _Config, mean=None, rstd=None):
    """(y, mean or None, rstd) from the forward kernel; with ``rstd`` (and
    ``mean``) given, normalizes with them."""
    if x.size == 0:
        stat = jnp.zeros(x.shape[:-1], jnp.float32) if rstd is None else rstd
        return x, ((stat if mean is None else mean) if cfg.kind == LAYER else None), stat
    ph = _placeholder(_param_dtype(x, gamma, beta))
    return norm_fwd(x, ph if gamma is None else gamma, ph if beta is None else beta,
                    kind=cfg.kind, eps=cfg.eps, zero_centered_gamma=cfg.zero_centered_gamma,
                    has_gamma=gamma is not None, has_beta=beta is not None, mean=mean, rstd=rstd)


def _backward(dy, x, mean, rstd, gamma, beta, cfg: _Config, coef=None, dh=None):
    """(dx, dgamma or None, dbeta or None) from the backward kernel; ``coef``:
    the per-row means of whole rows, if given (see ``_grad_sums``, over the
    hidden size); ``dh`` (x's shape and dtype): added to ``dx`` in the kernel
    (the residual add's gradient)."""
    if x.size == 0:
        zeros = lambda p: None if p is None else jnp.zeros_like(p)
        return (jnp.zeros_like(x) if dh is None else dh), zeros(gamma), zeros(beta)
    ph = _placeholder(_param_dtype(x, gamma, beta))
    dx, dgamma, dbeta = norm_bwd(dy, x, mean, rstd, ph if gamma is None else gamma,
                                 ph if beta is None else beta, kind=cfg.kind,
                                 zero_centered_gamma=cfg.zero_centered_gamma,
                                 has_gamma=gamma is not None, has_beta=beta is not None, coef=coef, dh=dh)
    return dx, (dgamma if gamma is not None else None), (dbeta if beta is not None else None)


def _grad_sums(dy, x, mean, rstd, gamma, cfg: _Config):
    """Per-row sum(gdy * xhat), float32 ``x.shape[:-1]`` (RMSNorm), or
    (sum(gdy * xhat), sum(gdy)), ``x.shape[:-1] + (2,)`` (LayerNorm): the row
    sums each backward needs."""
    if x.size == 0:
        return jnp.zeros(_row_stats_shape(cfg.kind, x), jnp.float32)
    ph = _placeholder(x.dtype)
    return norm_grad_stats(dy, x, mean, rstd, ph if gamma is None else gamma, kind=cfg.kind,
                           zero_centered_gamma=cfg.zero_centered_gamma, has_gamma=gamma is not None)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _normalize(x, gamma, beta, cfg):
    return _forward(x, gamma, beta, cfg)[0]


def _normalize_fwd(x, gamma, beta, cfg):
    y, mean, rstd = _forward(x, gamma, beta, cfg)
    return y, (x, gamma, beta, mean, rstd)


def _normalize_bwd(cfg, res, dy):
    x, gamma, beta, mean, rstd = res
    grads = _backward(dy, x, mean, rstd, gamma, beta, cfg)
    return tuple(_sum_to_primal_vma(g, p) for g, p in zip(grads, (x, gamma, beta)))


def _sum_to_primal_vma(ct, primal):
    """Inside shard_map, a cotangent that varies over more mesh axes than its
    primal (dgamma of a replicated gamma, from rows split over 'data') is a
    per-device partial: sum it over those axes, as JAX's own transposes do."""
    if ct is None:
        return None
    extra = varying_axes(jax.typeof(ct)) - varying_axes(jax.typeof(primal))
    return jax.lax.psum(ct, tuple(sorted(extra))) if extra else ct


_normalize.defvjp(_normalize_fwd, _normalize_bwd)


# The hidden dim split over mesh axes inside shard_map: statistics of whole
# rows are combined over those axes (a few floats a row), never activations.


def _axes_tuple(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _full_hidden(x, axes):
    return x.shape[-1] * math.prod(jax.lax.axis_size(a) for a in axes)


def _sliced_forward(x, gamma, beta, cfg, axes, stats=None):
    """(y, mean, rstd) of a slice of the hidden dim; ``stats``: the slice's
    statistics, if already taken."""
    stats = _slice_stats(x, cfg.kind) if stats is None else stats
    mean, rstd = combine_stats(cfg.kind, stats, axes, _full_hidden(x, axes), x.shape[-1], cfg.eps)
    y, _, _ = _forward(x, gamma, beta, cfg, mean=mean, rstd=rstd)
    return y, mean, rstd


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _normalize_sliced(x, gamma, beta, cfg, axes):
    return _sliced_forward(x, gamma, beta, cfg, axes)[0]


def _normalize_sliced_fwd(x, gamma, beta, cfg, axes):
    y, mean, rstd = _sliced_forward(x, gamma, beta, cfg, axes)
    return y, (x, gamma, beta, mean, rstd)


def _normalize_sliced_bwd(cfg, axes, res, dy):
    x, gamma, beta, mean, rstd = res
    coef = jax.lax.psum(_grad_sums(dy, x, mean, rstd, gamma, cfg), axes) / _full_hidden(x, axes)
    grads = _backward(dy, x, mean, rstd, gamma, beta, cfg, coef=coef)
    return tuple(_sum_to_primal_vma(g, p) for g, p in zip(grads, (x, gamma, beta)))


_normalize_sliced.defvjp(_normalize_sliced_fwd, _normalize_sliced_bwd)


def _dispatch(x, gamma, beta, cfg, axis_name):
    if axis_name is None:
        return _normalize(x, gamma, beta, cfg)
    return _normalize_sliced(x, gamma, beta, cfg, _axes_tuple(axis_name))


# Statistics of a slice, and normalization with given statistics, as
# differentiable building blocks.


def _slice_stats(x, kind, residual=None, h_dtype=None):
    """The statistics of a slice of the hidden dim; with ``residual``,
    ``(statistics of h, h)`` for h = x + residual stored in ``h_dtype``."""
    if x.size == 0:
        stats = jnp.zeros(_row_stats_shape(kind, x), jnp.float32)
        return stats if residual is None else (stats, residual_sum(x, residual, h_dtype))
    return norm_stats(x, kind=kind, residual=residual, h_dtype=h_dtype)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _stats(x, kind):
    return _slice_stats(x, kind)


def _stats_fwd(x, kind):
    stats = _slice_stats(x, kind)
    return stats, (x, stats)


def _stats_bwd(kind, res, ct):
    x, stats = res
    xf = x.astype(jnp.float32)
    if kind == RMS:  # d sum(x^2) = 2 x
        return ((2.0 * xf * ct[..., None]).astype(x.dtype),)
    # d mean = 1/n; d m2 = 2 (x - mean) (the mean's own variation sums to zero)
    n = x.shape[-1]
    dx = ct[..., :1] / n + 2.0 * (xf - stats[..., :1]) * ct[..., 1:]
    return (dx.astype(x.dtype),)


_stats.defvjp(_stats_fwd, _stats_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def _apply(x, gamma, beta, mean, rstd, cfg):
    return _forward(x, gamma, beta, cfg, mean=mean, rstd=rstd)[0]


def _apply_fwd(x, gamma, beta, mean, rstd, cfg):
    return _apply(x, gamma, beta, mean, rstd, cfg), (x, gamma, beta, mean, rstd)


def _apply_bwd(cfg, res, dy):
    x, gamma, beta, mean, rstd = res
    layer = cfg.kind == LAYER
    # With mean and rstd held fixed: dx = rstd * gdy, i.e. the backward with
    # zero row coefficients; their own gradients from the row sums of gdy.
    sums = _grad_sums(dy, x, mean, jnp.ones_like(rstd), gamma, cfg)  # sum(gdy * (x - mean))[, sum(gdy)]
    dx, dgamma, dbeta = _backward(dy, x, mean, rstd, gamma, beta, cfg, coef=jnp.zeros_like(sums))
    dmean = -rstd * sums[..., 1] if layer else None
    grads = (dx, dgamma, dbeta, dmean, sums[..., 0] if layer else sums)
    return tuple(_sum_to_primal_vma(g, p) for g, p in zip(grads, (x, gamma, beta, mean, rstd)))


_apply.defvjp(_apply_fwd, _apply_bwd)


# ---------------------------------------------------------------------------
# public API


_FP8_INPUT_DOC = """
    FP8 input: ``x`` may be ``float8_e4m3fn``/``float8_e5m2`` holding codes of
    ``x_scale * x`` (dequantized in the kernel, in float32, as it is read).

      x_scale: float32; a scalar (one scale for the tensor), or with
        ``group_size`` shape ``x.shape[:-1] + (hidden // group_size,)``: column
        ``c`` of a row reads ``x[..., c] * x_scale[..., c // group_size]``
        (the layout ``rms_norm_fp8_groupwise`` returns).
      group_size: columns per scale (must divide the hidden size), or None.
      dtype: ``y``'s dtype, float32, bfloat16 (default) or float16; ``gamma``
        (``beta``) is float32 or this dtype.

    Its backward dequantizes ``x`` in ``dtype`` and runs the backward kernel
    on it (one more pass over ``x`` than a float input). The cotangent of the
    FP8 ``x`` is ``dx * x_scale`` rounded to its FP8 dtype (saturating), and
    that of ``x_scale`` the per-group ``sum(dx * x)``.
"""


def _fp8_input(kind, x, gamma, beta, eps, zero_centered_gamma, axis_name, x_scale, group_size, dtype):
    """The FP8-input path of rms_norm/layer_norm; None for a float x (once
    its FP8-only options are checked to be absent)."""
    from ._fused import _run, is_fp8  # _fused builds on this module
    if not is_fp8(x):
        _no_fp8_options(x_scale, group_size, dtype)
        return None
    if axis_name is not None:
        raise NotImplementedError("axis_name is not supported with an FP8 x yet")
    y, _, _, _ = _run(kind, x, None, gamma, beta, eps=eps, zero_centered_gamma=zero_centered_gamma,
                      x_scale=x_scale, x_group_size=group_size, dtype=dtype)
    return y


def _no_fp8_options(x_scale, group_size, dtype):
    for name, v in (("x_scale", x_scale), ("group_size", group_size), ("dtype", dtype)):
        if v is not None:
            raise ValueError(f"{name} is only for an FP8 x (float8_e4m3fn or float8_e5m2)")


def rms_norm(x: Array, gamma: Optional[Array] = None, *, eps: float = 1e-6,
             zero_centered_gamma: bool = False, axis_name=None, x_scale=None, group_size=None,
             dtype=None) -> Array:
    """RMSNorm over the last axis: ``y = x * rsqrt(mean(x**2) + eps) * scale``.

    Args:
      x: ``(..., hidden)`` array, float32, bfloat16 or float16 (or FP8 with
        ``x_scale``, below); any rank >= 1.
      gamma: ``(hidden,)`` scale, float32 or ``x.dtype``; None for no scale.
      eps: added to the mean square, >= 0.
      zero_centered_gamma: scale by ``1 + gamma`` (Gemma) instead of ``gamma``.
      axis_name: inside ``shard_map``, the mesh axis name (or tuple of names)
        the hidden dim is split over: ``x`` and ``gamma`` are this device's
        slices, and only per-row statistics (one float a row) are summed
        across the devices, forward and backward. Not needed under ``jit``
        with sharded arrays, where the partitioning is automatic.

    Returns:
      ``y`` with ``x``'s shape and dtype. Statistics are computed in float32.
      Differentiable in ``x`` and ``gamma`` (``dgamma`` in ``gamma``'s dtype).
    """
    y = _fp8_input(RMS, x, gamma, None, eps, zero_centered_gamma, axis_name, x_scale, group_size, dtype)
    if y is not None:
        return y
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    return _dispatch(x, gamma, None, _Config(RMS, _check_eps(eps), bool(zero_centered_gamma)), axis_name)


def layer_norm(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
               eps: float = 1e-5, zero_centered_gamma: bool = False, axis_name=None, x_scale=None,
               group_size=None, dtype=None) -> Array:
    """LayerNorm over the last axis: ``y = (x - mean) * rsqrt(var + eps) * scale + beta``.

    Args:
      x: ``(..., hidden)`` array, float32, bfloat16 or float16 (or FP8 with
        ``x_scale``, below); any rank >= 1.
      gamma: ``(hidden,)`` scale, float32 or ``x.dtype``; None for no scale.
      beta: ``(hidden,)`` shift, gamma's dtype (float32 or ``x.dtype`` without
        gamma); None for no shift.
      eps: added to the (biased) variance, >= 0.
      zero_centered_gamma: scale by ``1 + gamma`` instead of ``gamma``.
      axis_name: inside ``shard_map``, the mesh axis name(s) the hidden dim is
        split over (see :func:`rms_norm`); per-row (mean, m2) pairs are
        gathered and merged exactly, two floats a row per device.

    Returns:
      ``y`` with ``x``'s shape and dtype. Differentiable in ``x``, ``gamma``, ``beta``.
    """
    y = _fp8_input(LAYER, x, gamma, beta, eps, zero_centered_gamma, axis_name, x_scale, group_size, dtype)
    if y is not None:
        return y
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    beta = _check_param(beta, "beta", x, dtype_of=gamma)
    return _dispatch(x, gamma, beta, _Config(LAYER, _check_eps(eps), bool(zero_centered_gamma)), axis_name)


def rms_norm_fwd(x: Array, gamma: Optional[Array] = None, *, eps: float = 1e-6,
                 zero_centered_gamma: bool = False) -> Tuple[Array, Array]:
    """RMSNorm forward that also returns the statistic the backward needs.

    Returns:
      ``(y, rstd)``: ``y`` like ``x``; ``rstd = rsqrt(mean(x**2) + eps)``,
      float32 of shape ``x.shape[:-1]``.
    """
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    y, _, rstd = _forward(x, gamma, None, _Config(RMS, _check_eps(eps), bool(zero_centered_gamma)))
    return y, rstd


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
    """
    x = _check_x(x)
    dy = _check_like(dy, "dy", x)
    rstd = _check_stat(rstd, "rstd", x)
    gamma = _check_param(gamma, "gamma", x)
    dx, dgamma, _ = _backward(dy, x, None, rstd, gamma, None, _Config(RMS, 0.0, bool(zero_centered_gamma)))
    return dx, dgamma


def layer_norm_fwd(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
                   eps: float = 1e-5, zero_centered_gamma: bool = False) -> Tuple[Array, Array, Array]:
    """LayerNorm forward that also returns the statistics the backward needs.

    Returns:
      ``(y, mean, rstd)``: ``y`` like ``x``; ``mean`` and ``rstd = rsqrt(var + eps)``
      float32 of shape ``x.shape[:-1]``.
    """
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    beta = _check_param(beta, "beta", x, dtype_of=gamma)
    y, mean, rstd = _forward(x, gamma, beta, _Config(LAYER, _check_eps(eps), bool(zero_centered_gamma)))
    return y, mean, rstd


def layer_norm_bwd(dy: Array, x: Array, mean: Array, rstd: Array, gamma: Optional[Array] = None, *,
                   zero_centered_gamma: bool = False) -> Tuple[Array, Optional[Array], Array]:
    """LayerNorm backward from the forward's saved ``mean`` and ``rstd``.

    Returns:
      ``(dx, dgamma, dbeta)``: ``dx`` like ``x``; ``dgamma`` like ``gamma`` (None
      without gamma); ``dbeta = sum(dy)`` over rows, in gamma's dtype (``x``'s
      dtype without gamma), shape ``(hidden,)``.
    """
    x = _check_x(x)
    dy = _check_like(dy, "dy", x)
    mean = _check_stat(mean, "mean", x)
    rstd = _check_stat(rstd, "rstd", x)
    gamma = _check_param(gamma, "gamma", x)
    beta_like = jnp.zeros((x.shape[-1],), gamma.dtype if gamma is not None else x.dtype)
    return _backward(dy, x, mean, rstd, gamma, beta_like, _Config(LAYER, 0.0, bool(zero_centered_gamma)))


# ---------------------------------------------------------------------------
# distributed building blocks


def _check_hidden_size(hidden_size, x):
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, (int, np.integer)):
        raise TypeError(f"hidden_size must be an int (the whole row's length), got {hidden_size!r}")
    if hidden_size < x.shape[-1]:
        raise ValueError(f"hidden_size ({hidden_size}) must be at least x's slice of the hidden dim "
                         f"({x.shape[-1]})")
    return int(hidden_size)


def rms_norm_stats(x: Array) -> Array:
    """Per-row sum of squares of this slice of the hidden dim: the statistic
    that devices holding slices of a row add up (with ``psum`` or any
    all-reduce) before :func:`rms_norm_apply`.

    Args:
      x: ``(..., hidden_slice)``, float32, bfloat16 or float16.

    Returns:
      ``sum(x**2, axis=-1)`` in float32, shape ``x.shape[:-1]``. Differentiable.
    """
    return _stats(_check_x(x), RMS)


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
    x = _check_x(x)
    stats = _check_stat(stats, "stats", x)
    gamma = _check_param(gamma, "gamma", x)
    hidden = _check_hidden_size(hidden_size, x)
    cfg = _Config(RMS, _check_eps(eps), bool(zero_centered_gamma))
    return _apply(x, gamma, None, None, jax.lax.rsqrt(stats / hidden + cfg.eps), cfg)


def layer_norm_stats(x: Array) -> Array:
    """Per-row ``(mean, m2)`` of this slice of the hidden dim, ``m2 =
    sum((x - mean)**2)``: gather these from the devices holding slices of a
    row (``all_gather``; two floats a row each) and pass them stacked to
    :func:`layer_norm_apply`, which merges them exactly (no ``E[x^2] -
    E[x]^2`` cancellation).

    Returns:
      float32 ``x.shape[:-1] + (2,)``. Differentiable.
    """
    return _stats(_check_x(x), LAYER)


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
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    beta = _check_param(beta, "beta", x, dtype_of=gamma)
    hidden = _check_hidden_size(hidden_size, x)
    stats = _as_array(stats, "stats")
    pair = x.shape[:-1] + (2,)
    if stats.dtype != jnp.float32 or stats.shape[-len(pair):] != pair or stats.ndim not in (
            len(pair), len(pair) + 1):
        raise ValueError(f"stats must be float32 of shape {pair} or (n_slices,) + {pair}, "
                         f"got {stats.shape} {_dtype_name(stats.dtype)}")
    if stats.ndim == len(pair) + 1:
        if stats.shape[0] * x.shape[-1] != hidden:
            raise ValueError(f"{stats.shape[0]} slices of {x.shape[-1]} do not make up "
                             f"hidden_size {hidden}")
        mean, m2 = merge_layer_stats(stats, x.shape[-1])
    else:
        mean, m2 = stats[..., 0], stats[..., 1]
    cfg = _Config(LAYER, _check_eps(eps), bool(zero_centered_gamma))
    return _apply(x, gamma, beta, mean, jax.lax.rsqrt(m2 / hidden + cfg.eps), cfg)


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
      ``jax.export``), else ``"psum"``. After the matmul that makes the
      partial sums (8192 x 8192 bf16 a device), the kernel took 0.62-0.66 ms
      against 0.77 for psum + norm on 2 H100s, and was level on 4
      (0.89-0.93 against 0.91-0.93); from a program input, 0.43-0.47
      against 0.68 and 0.71 against 0.83 (benchmarks/RESULTS.md, table 5).

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
    x = _check_x(partial_sum, "partial_sum")
    gamma = _check_param(gamma, "gamma", x)
    if method not in _ALL_REDUCE_METHODS:
        raise ValueError(f"method must be one of {_ALL_REDUCE_METHODS}, got {method!r}")
    axes = _axes_tuple(axis_name)
    n = math.prod(jax.lax.axis_size(a) for a in axes)
    if scatter:
        if x.ndim < 2 or x.shape[0] % n:
            raise ValueError(f"scatter=True needs partial_sum's first axis to be a multiple of the "
                             f"axis size {n}, got shape {x.shape}")
        return rms_norm(jax.lax.psum_scatter(x, axes, scatter_dimension=0, tiled=True), gamma, eps=eps,
                        zero_centered_gamma=zero_centered_gamma)
    if method == "nvlink":
        problem = _nvlink_problem(x, n)
        if problem:
            raise ValueError(f"method='nvlink' {problem}; use method='psum'")
    elif method == "auto":
        # The GPUs' one kernel where it applies (lowered for CUDA), else psum.
        method = "auto" if not _nvlink_problem(x, n) and nvlink_available() else "psum"
    if n == 1 or x.size == 0:  # nothing to sum, or nothing to launch
        method = "psum"
    return _all_reduce_norm(x, gamma, _Config(RMS, _check_eps(eps), bool(zero_centered_gamma)), axes, method)


# all_reduce_rms_norm's methods (benchmarks/RESULTS.md, table 5).
_ALL_REDUCE_METHODS = ("auto", "scatter", "psum", "nvlink")


def _nvlink_problem(x, n):
    """Why the "nvlink" kernel cannot take this call (None: it can)."""
    row_bytes = x.shape[-1] * x.dtype.itemsize
    if row_bytes % 16 or row_bytes > NVLINK_MAX_ROW_BYTES:
        return (f"needs partial_sum's hidden size to be a multiple of {16 // x.dtype.itemsize} and at most "
                f"{NVLINK_MAX_ROW_BYTES // x.dtype.itemsize} for {_dtype_name(x.dtype)}, got {x.shape[-1]}")
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
    g = _placeholder(x.dtype) if gamma is None else gamma
    return all_reduce_norm_p.bind(x, g, axes=tuple(axes), eps=cfg.eps, zero_centered=cfg.zero_centered_gamma,
                                  has_gamma=gamma is not None, fallback=fallback)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _all_reduce_norm(x, gamma, cfg, axes, method):
    """Reduce-scatter the rows, normalize this device's share, all-gather
    ("scatter"); sum and normalize in one kernel ("nvlink"; "auto": that on
    CUDA, psum elsewhere); or all-reduce and normalize every row ("psum")."""
    if method in ("nvlink", "auto"):  # "auto": psum + norm where lowered for the CPU, or exported
        return _nvlink_norm(x, gamma, cfg, axes, fallback=method == "auto")[0]
    if method != "scatter":  # the differentiated forward's own output
        return _all_reduce_norm_fwd(x, gamma, cfg, axes, method)[0]
    n = math.prod(jax.lax.axis_size(a) for a in axes)
    rows = x.reshape(-1, x.shape[-1])
    pad = -rows.shape[0] % n
    if pad:  # zero rows normalize to zero rows; they are dropped below
        rows = jnp.pad(rows, ((0, pad), (0, 0)))
    mine = _forward(jax.lax.psum_scatter(rows, axes, scatter_dimension=0, tiled=True), gamma, None, cfg)[0]
    # Invariant over `axes` (the same on every device), as psum's result is.
    out = jax.lax.all_gather(mine, axes, axis=0, tiled=True, to="invarying")
    return out[: out.shape[0] - pad].reshape(x.shape)


def _all_reduce_norm_fwd(x, gamma, cfg, axes, method):
    # Differentiated, every method all-reduces: the backward needs the whole
    # sum on every device, which the "nvlink" kernel does not write.
    total = jax.lax.psum(x, axes)
    y, _, rstd = _forward(total, gamma, None, cfg)
    # An empty slice of x keeps its type (the mesh axes it varies over).
    return y, (x.reshape(-1)[:0], total, gamma, rstd)


def _all_reduce_norm_bwd(cfg, axes, method, res, dy):
    x_type, total, gamma, rstd = res
    dx, dgamma, _ = _backward(dy, total, None, rstd, gamma, None, cfg)
    # psum's transpose: every device's partial sum gets the whole gradient.
    extra = varying_axes(jax.typeof(x_type)) - varying_axes(jax.typeof(dx))
    if extra:
        dx = jax.lax.pcast(dx, tuple(sorted(extra)), to="varying")
    return dx, _sum_to_primal_vma(dgamma, gamma)


_all_reduce_norm.defvjp(_all_reduce_norm_fwd, _all_reduce_norm_bwd)


rms_norm.__doc__ += _FP8_INPUT_DOC
layer_norm.__doc__ += _FP8_INPUT_DOC
