"""What the Flax and Equinox modules share: which path a call takes (the
kernels, or the code of the module it replaces), the call into the kernels
with the dtype rules of the replaced module, and the one-time warning of the
slow path."""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings
from collections.abc import Iterable

import numpy as np
import jax
import jax.numpy as jnp

from ._api import layer_norm, rms_norm
from ._checks import X_DTYPES, check_bool

KERNEL_DTYPES = frozenset(np.dtype(d) for d in X_DTYPES)


class FallbackWarning(UserWarning):
    """A jax_rmsnorm module ran the code of the module it replaces (a slow
    path) for something the kernels do not take: a mask, normalization axes
    other than x's trailing ones, ``axis_index_groups``, float64 or complex
    arrays. Warned once per process for each module and reason; silence it
    with ``warnings.filterwarnings("ignore", category=jax_rmsnorm.FallbackWarning)``."""


# How many module calls (traces) took each path: "kernel" or "fallback".
calls: collections.Counter = collections.Counter()
_warned: set = set()


def took_kernels() -> None:
    calls["kernel"] += 1


def fallback(owner: str, upstream: str, reason: str, detail: str, zero_centered_gamma=False, stacklevel=3) -> None:
    """Notes a call that runs ``upstream``'s own code: warns once per
    ``owner`` and ``reason`` (a mask, axes, dtype, ...), naming ``detail``
    (``stacklevel`` frames up). ``zero_centered_gamma`` exists on the
    kernels only: it refuses the call."""
    if check_bool(zero_centered_gamma, "zero_centered_gamma"):
        raise ValueError(f"{owner}: zero_centered_gamma=True runs on jax_rmsnorm's kernels only, and {detail} "
                         f"needs {upstream}'s own code, which has no zero_centered_gamma")
    calls["fallback"] += 1
    if (owner, reason) in _warned:
        return
    _warned.add((owner, reason))
    warnings.warn(f"{owner} runs {upstream}'s own code, not jax_rmsnorm's kernels (a slow path), for {detail}. "
                  f"Warned once per process for this reason ({reason}).", FallbackWarning, stacklevel=stacklevel)


# ---------------------------------------------------------------------------
# Flax: which calls the kernels take


def canonical_axes(axes, ndim):
    """flax's canonical axes (the same expression, so the same order: the
    parameters' shape follows it), or None where an axis is not an int in
    range (flax's own code then says what is wrong)."""
    if not isinstance(axes, Iterable):
        axes = (axes,)
    axes = tuple(axes)
    if not all(isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) and -ndim <= a < ndim
               for a in axes):
        return None
    return tuple({ndim + a if a < 0 else a for a in axes})


@dataclasses.dataclass(frozen=True)
class Rows:
    """A call on the kernels: x's trailing ``k`` axes flattened into rows;
    each parameter (``param_shape``, flax's shape of the feature axes)
    reshaped to ``block_shape`` (1 on the reduced axes that are not feature
    axes) and broadcast over the reduced block."""
    k: int
    param_shape: tuple
    block_shape: tuple

    def rows(self, x):
        return x.reshape(x.shape[:x.ndim - self.k] + (math.prod(x.shape[x.ndim - self.k:]),))

    def param(self, p, x):
        if p is None:
            return None
        block = x.shape[x.ndim - self.k:]
        p = p.reshape(self.block_shape)
        if p.shape != block:
            p = jnp.broadcast_to(p, block)
        return p.reshape(-1)

    def run(self, kind, x, scale, bias, **kw):
        y = normalize(kind, self.rows(x), self.param(scale, x), self.param(bias, x), **kw)
        return y.reshape(x.shape)


def flax_rows(x, reduction_axes, feature_axes, *, mask=None, axis_index_groups=None):
    """``(Rows, None, None)`` where the kernels can compute flax's
    normalization of ``x`` (an array) over these axes, else ``(None, reason,
    detail)``: the call runs flax's own code."""
    if mask is not None:
        return None, "mask", "a mask (the kernels normalize whole rows)"
    if axis_index_groups is not None:
        return None, "axis_index_groups", "axis_index_groups"
    n = x.ndim
    red, feat = canonical_axes(reduction_axes, n), canonical_axes(feature_axes, n)
    where = f"reduction_axes={reduction_axes!r}, feature_axes={feature_axes!r} on x of rank {n}"
    if n < 1 or not red or feat is None:
        return None, "axes", where
    k = len(red)
    if set(red) != set(range(n - k, n)):
        return None, "axes", where + " (the kernels reduce x's trailing axes)"
    if not set(feat) <= set(red):
        return None, "axes", where + " (feature axes outside the reduced ones)"
    if math.prod(x.shape[n - k:]) == 0:
        return None, "empty", "an empty reduced block"
    block_shape = tuple(x.shape[a] if a in feat else 1 for a in range(n - k, n))
    return Rows(k, tuple(x.shape[a] for a in feat), block_shape), None, None


def dtype_reason(named_dtypes):
    """``(None, None)`` where the kernels take every ``(name, dtype)``, else
    ``("dtype", detail)`` of the first they do not."""
    for name, dt in named_dtypes:
        try:
            dt = np.dtype(dt)
        except TypeError:
            return "dtype", f"{name} {dt!r}"
        if dt not in KERNEL_DTYPES:
            return "dtype", f"{name} of dtype {dt.name} (the kernels take float32, bfloat16, float16)"
    return None, None


def flax_out_dtype(x, param_dtypes, dtype):
    """flax's output dtype (``flax.linen.dtypes.canonicalize_dtype``):
    ``dtype`` if given, else the promotion of x and the parameters, made
    floating where it is not."""
    if dtype is not None:
        return np.dtype(dtype) if _is_dtype(dtype) else dtype
    out = jnp.result_type(x, *param_dtypes)
    if not jnp.issubdtype(out, jnp.inexact):
        out = jnp.promote_types(jnp.float32, out)
    return np.dtype(out)


def flax_path(mod, x, mask, owner: str, upstream: str, param_dtypes):
    """``(rows, out_dtype)`` where the kernels compute the flax module
    ``mod``'s normalization of the array ``x``, else None (after noting the
    fallback: flax's own code runs). ``param_dtypes(rows)``: the ``(name,
    dtype)`` of the parameters in this call; ``owner``/``upstream``: the
    module's and the replaced module's names, for the warning."""
    rows, reason, detail = flax_rows(x, mod.reduction_axes, mod.feature_axes, mask=mask,
                                     axis_index_groups=mod.axis_index_groups)
    if rows is not None:
        params = param_dtypes(rows)
        out_dtype = flax_out_dtype(x, [d for _, d in params], mod.dtype)
        reason, detail = dtype_reason([("x", x.dtype), *params, ("dtype", out_dtype)])
    if reason is not None:
        fallback(owner, upstream, reason, detail, mod.zero_centered_gamma, stacklevel=4)  # as from _call
        return None
    took_kernels()
    return rows, out_dtype


def _is_dtype(d) -> bool:
    try:
        np.dtype(d)
        return True
    except TypeError:
        return False


# ---------------------------------------------------------------------------
# the kernels


def normalize(kind: str, x, scale, bias, *, eps: float, out_dtype, zero_centered_gamma: bool, axis_name=None):
    """Normalizes ``x`` over its last axis and returns it in ``out_dtype``.

    ``axis_name``: the mesh axis (or axes) over which the features are split
    inside ``shard_map``: statistics of whole rows are combined over it, as
    flax's ``axis_name`` averages its statistics over it.

    Where ``out_dtype`` is wider than ``x`` (bf16 input with float32 parameters,
    say), ``x`` is widened first so that the kernel writes the wide result
    directly; the statistics are float32 either way. The parameters go in
    their own dtypes (the functions widen them where the kernels need it).
    Every cast is explicit: nothing here depends on
    ``jax_numpy_dtype_promotion``.
    """
    out_dtype = jnp.dtype(out_dtype)
    widen_to = out_dtype
    if kind == "rms" and bias is not None:
        # RMSNorm with a shift (Equinox has one) adds it after the kernel, in
        # float32 as the module it replaces does.
        widen_to = _promote(out_dtype, jnp.float32)
    if _promote(x.dtype, widen_to) == widen_to and widen_to != x.dtype:
        x = x.astype(widen_to)
    if kind == "rms":
        y = rms_norm(x, scale, eps=eps, zero_centered_gamma=zero_centered_gamma, axis_name=axis_name)
        if bias is not None:
            y = y + bias.astype(y.dtype)
    else:
        y = layer_norm(x, scale, bias, eps=eps, zero_centered_gamma=zero_centered_gamma, axis_name=axis_name)
    return y.astype(out_dtype)


def _promote(a, b):
    """JAX's promotion of two dtypes, as the module's own rule (not an
    implicit promotion, which jax_numpy_dtype_promotion='strict' refuses)."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.promote_types(a, b)
