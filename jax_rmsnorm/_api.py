"""Public functions: argument checks, the custom VJP, and empty-array handling."""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Optional, Tuple

import numpy as np
import jax
import jax.numpy as jnp

from ._primitives import LAYER, RMS, _placeholder, norm_bwd, norm_fwd, varying_axes

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


def _check_x(x, name="x"):
    x = _as_array(x, name)
    if x.ndim < 1:
        raise ValueError(f"{name} must have rank >= 1 (normalized over its last axis), got a scalar")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {_dtype_name(x.dtype)}")
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


def _forward(x, gamma, beta, cfg: _Config):
    """(y, mean or None, rstd) from the forward kernel."""
    if x.size == 0:
        stat = jnp.zeros(x.shape[:-1], jnp.float32)
        return x, (stat if cfg.kind == LAYER else None), stat
    ph = _placeholder(_param_dtype(x, gamma, beta))
    return norm_fwd(x, ph if gamma is None else gamma, ph if beta is None else beta,
                    kind=cfg.kind, eps=cfg.eps, zero_centered_gamma=cfg.zero_centered_gamma,
                    has_gamma=gamma is not None, has_beta=beta is not None)


def _backward(dy, x, mean, rstd, gamma, beta, cfg: _Config):
    """(dx, dgamma or None, dbeta or None) from the backward kernel."""
    if x.size == 0:
        zeros = lambda p: None if p is None else jnp.zeros_like(p)
        return jnp.zeros_like(x), zeros(gamma), zeros(beta)
    ph = _placeholder(_param_dtype(x, gamma, beta))
    dx, dgamma, dbeta = norm_bwd(dy, x, mean, rstd, ph if gamma is None else gamma,
                                 ph if beta is None else beta, kind=cfg.kind,
                                 zero_centered_gamma=cfg.zero_centered_gamma,
                                 has_gamma=gamma is not None, has_beta=beta is not None)
    return dx, (dgamma if gamma is not None else None), (dbeta if beta is not None else None)


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


# ---------------------------------------------------------------------------
# public API


def rms_norm(x: Array, gamma: Optional[Array] = None, *, eps: float = 1e-6,
             zero_centered_gamma: bool = False) -> Array:
    """RMSNorm over the last axis: ``y = x * rsqrt(mean(x**2) + eps) * scale``.

    Args:
      x: ``(..., hidden)`` array, float32, bfloat16 or float16; any rank >= 1.
      gamma: ``(hidden,)`` scale, float32 or ``x.dtype``; None for no scale.
      eps: added to the mean square, >= 0.
      zero_centered_gamma: scale by ``1 + gamma`` (Gemma) instead of ``gamma``.

    Returns:
      ``y`` with ``x``'s shape and dtype. Statistics are computed in float32.
      Differentiable in ``x`` and ``gamma`` (``dgamma`` in ``gamma``'s dtype).
    """
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    return _normalize(x, gamma, None, _Config(RMS, _check_eps(eps), bool(zero_centered_gamma)))


def layer_norm(x: Array, gamma: Optional[Array] = None, beta: Optional[Array] = None, *,
               eps: float = 1e-5, zero_centered_gamma: bool = False) -> Array:
    """LayerNorm over the last axis: ``y = (x - mean) * rsqrt(var + eps) * scale + beta``.

    Args:
      x: ``(..., hidden)`` array, float32, bfloat16 or float16; any rank >= 1.
      gamma: ``(hidden,)`` scale, float32 or ``x.dtype``; None for no scale.
      beta: ``(hidden,)`` shift, gamma's dtype (float32 or ``x.dtype`` without
        gamma); None for no shift.
      eps: added to the (biased) variance, >= 0.
      zero_centered_gamma: scale by ``1 + gamma`` instead of ``gamma``.

    Returns:
      ``y`` with ``x``'s shape and dtype. Differentiable in ``x``, ``gamma``, ``beta``.
    """
    x = _check_x(x)
    gamma = _check_param(gamma, "gamma", x)
    beta = _check_param(beta, "beta", x, dtype_of=gamma)
    return _normalize(x, gamma, beta, _Config(LAYER, _check_eps(eps), bool(zero_centered_gamma)))


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
