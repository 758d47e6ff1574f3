"""The kernels behind one call, shared by the public functions of ``_api``
and ``_fused``: each runs the primitive of its pass, answers empty inputs
without a launch, and passes an absent gamma or beta as a placeholder. Also
the norms' math in jnp, which the ops' references (their derivatives) share."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ._checks import Config
from ._compat import varying_axes
from ._primitives import LAYER, RMS, absent_param, _row_stats_shape, combine_stats, norm_bwd, norm_fwd, norm_grad_stats, \
    norm_stats, residual_sum


def param_dtype(x, gamma, beta):
    p = gamma if gamma is not None else beta
    return x.dtype if p is None else p.dtype


def forward(x, gamma, beta, cfg: Config, mean=None, rstd=None):
    """(y, mean or None, rstd) from the forward kernel; with ``rstd`` (and
    ``mean``) given, normalizes with them."""
    if x.size == 0:
        stat = jnp.zeros(x.shape[:-1], jnp.float32) if rstd is None else rstd
        return x, ((stat if mean is None else mean) if cfg.kind == LAYER else None), stat
    ph = absent_param(param_dtype(x, gamma, beta))
    return norm_fwd(x, ph if gamma is None else gamma, ph if beta is None else beta,
                    kind=cfg.kind, eps=cfg.eps, zero_centered_gamma=cfg.zero_centered_gamma,
                    has_gamma=gamma is not None, has_beta=beta is not None, mean=mean, rstd=rstd)


def backward(dy, x, mean, rstd, gamma, beta, cfg: Config, coef=None, dh=None):
    """(dx, dgamma or None, dbeta or None) from the backward kernel; ``coef``:
    the per-row means of whole rows, if given (see ``grad_sums``, over the
    hidden size); ``dh`` (x's shape and dtype): added to ``dx`` in the kernel
    (the residual add's gradient)."""
    if x.size == 0:
        zeros = lambda p: None if p is None else jnp.zeros_like(p)
        return (jnp.zeros_like(x) if dh is None else dh), zeros(gamma), zeros(beta)
    ph = absent_param(param_dtype(x, gamma, beta))
    dx, dgamma, dbeta = norm_bwd(dy, x, mean, rstd, ph if gamma is None else gamma,
                                 ph if beta is None else beta, kind=cfg.kind,
                                 zero_centered_gamma=cfg.zero_centered_gamma,
                                 has_gamma=gamma is not None, has_beta=beta is not None, coef=coef, dh=dh)
    return dx, (dgamma if gamma is not None else None), (dbeta if beta is not None else None)


def grad_sums(dy, x, mean, rstd, gamma, cfg: Config):
    """Per-row sum(gdy * xhat), float32 ``x.shape[:-1]`` (RMSNorm), or
    (sum(gdy * xhat), sum(gdy)), ``x.shape[:-1] + (2,)`` (LayerNorm): the row
    sums each backward needs."""
    if x.size == 0:
        return jnp.zeros(_row_stats_shape(cfg.kind, x), jnp.float32)
    ph = absent_param(x.dtype)
    return norm_grad_stats(dy, x, mean, rstd, ph if gamma is None else gamma, kind=cfg.kind,
                           zero_centered_gamma=cfg.zero_centered_gamma, has_gamma=gamma is not None)


def sum_to_primal_vma(ct, primal):
    """Inside shard_map, a cotangent that varies over more mesh axes than its
    primal (dgamma of a replicated gamma, from rows split over 'data') is a
    per-device partial: sum it over those axes, as JAX's own transposes do."""
    if ct is None:
        return None
    extra = varying_axes(jax.typeof(ct)) - varying_axes(jax.typeof(primal))
    return jax.lax.psum(ct, tuple(sorted(extra))) if extra else ct


def full_hidden(x, axes):
    return x.shape[-1] * math.prod(jax.lax.axis_size(a) for a in axes)


def slice_stats(x, kind, residual=None, h_dtype=None):
    """The statistics of a slice of the hidden dim; with ``residual``,
    ``(statistics of h, h)`` for h = x + residual stored in ``h_dtype``."""
    if x.size == 0:
        stats = jnp.zeros(_row_stats_shape(kind, x), jnp.float32)
        return stats if residual is None else (stats, residual_sum(x, residual, h_dtype))
    return norm_stats(x, kind=kind, residual=residual, h_dtype=h_dtype)


def sliced_forward(x, gamma, beta, cfg, axes, stats=None):
    """(y, mean, rstd) of a slice of the hidden dim; ``stats``: the slice's
    statistics, if already taken."""
    stats = slice_stats(x, cfg.kind) if stats is None else stats
    mean, rstd = combine_stats(cfg.kind, stats, axes, full_hidden(x, axes), x.shape[-1], cfg.eps)
    y, _, _ = forward(x, gamma, beta, cfg, mean=mean, rstd=rstd)
    return y, mean, rstd


# ---------------------------------------------------------------------------
# the math in jnp: what the ops' references are built of (see _ad)


def as_row(p, x):
    """A ``(hidden,)`` parameter with ``x``'s rank, for arithmetic with ``x``
    (no implicit rank promotion: jax_numpy_rank_promotion may be "raise")."""
    return p.reshape((1,) * (x.ndim - 1) + p.shape)


def moments_reference(x, kind, eps, axes=()):
    """(mean or None, rstd) of the rows of a float32 ``x``, with a trailing
    axis of 1: the biased variance, taken around the mean. With mesh
    ``axes`` (inside shard_map), ``x`` is a slice of the hidden dim and the
    statistics are those of whole rows (sums taken over the axes)."""
    n = full_hidden(x, axes)
    total = (lambda v: jax.lax.psum(v, axes)) if axes else (lambda v: v)
    mean, d = None, x
    if kind == LAYER:
        mean = total(jnp.sum(x, axis=-1, keepdims=True)) / n
        d = x - mean
    return mean, jax.lax.rsqrt(total(jnp.sum(d * d, axis=-1, keepdims=True)) / n + eps)


def scale_reference(y, gamma, zero_centered_gamma):
    """``y * gamma`` (``1 + gamma`` if zero-centered) in float32; ``y`` without gamma."""
    if gamma is None:
        return y
    scale = gamma.astype(jnp.float32)
    return y * as_row(scale + 1.0 if zero_centered_gamma else scale, y)


def normalize_reference(x, gamma, beta, cfg: Config, axes=(), mean=None, rstd=None):
    """The norm of a float32 ``x`` in float32: ``(x - mean) * rstd * scale +
    beta`` (RMSNorm: no mean), with the rows' own statistics or the given
    ``mean``/``rstd`` (a trailing axis of 1)."""
    if rstd is None:
        mean, rstd = moments_reference(x, cfg.kind, cfg.eps, axes)
    y = scale_reference((x if cfg.kind == RMS else x - mean) * rstd, gamma, cfg.zero_centered_gamma)
    if beta is not None:
        y = y + as_row(beta.astype(jnp.float32), y)
    return y
