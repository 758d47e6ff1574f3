"""Equinox drop-ins: ``RMSNorm`` and ``LayerNorm`` subclassing
``equinox.nn.RMSNorm`` / ``equinox.nn.LayerNorm`` (same fields: ``shape``,
``eps``, ``use_weight``, ``use_bias``, ``weight``, ``bias``), computed by
jax_rmsnorm's kernels. Called on a single example of shape ``shape`` (use
``jax.vmap`` over a batch, as with Equinox); a multi-axis ``shape`` is
normalized over all its axes, like Equinox. Output has ``x``'s dtype; the
arithmetic is float32. Extra keyword: ``zero_centered_gamma`` (scale by
``1 + weight``).
"""

from __future__ import annotations

import math

import equinox as eqx

from ._modules import normalize

__all__ = ["RMSNorm", "LayerNorm"]

_sentinel = object()


def _call(mod, kind, x, state, name):
    if x.shape != mod.shape:
        raise ValueError(f"`{name}(shape)(x)` needs x.shape == shape: got shape={mod.shape} and "
                         f"x.shape={x.shape}. Use jax.vmap over a batch.")
    n = math.prod(mod.shape)
    flat = lambda p: None if p is None else p.reshape(n)
    weight = flat(mod.weight) if mod.use_weight else None
    bias = flat(mod.bias) if mod.use_bias else None
    y = normalize(kind, x.reshape(n), weight, bias, eps=mod.eps, out_dtype=x.dtype,
                  zero_centered_gamma=mod.zero_centered_gamma).reshape(x.shape)
    return y if state is _sentinel else (y, state)


def _drop_in(base, kind: str):
    """A subclass of the Equinox module `base` that runs jax_rmsnorm's kernels."""

    class Norm(base):
        zero_centered_gamma: bool = eqx.field(static=True, default=False)

        def __init__(self, shape, eps: float = 1e-5, use_weight: bool = True, use_bias: bool = True,
                     dtype=None, *, zero_centered_gamma: bool = False):
            super().__init__(shape, eps, use_weight, use_bias, dtype)
            self.zero_centered_gamma = zero_centered_gamma

        def __call__(self, x, state=_sentinel, *, key=None):
            return _call(self, kind, x, state, base.__name__)

    Norm.__name__ = Norm.__qualname__ = base.__name__
    Norm.__module__ = __name__
    Norm.__doc__ = f"``equinox.nn.{base.__name__}`` on jax_rmsnorm's kernels."
    return Norm


RMSNorm = _drop_in(eqx.nn.RMSNorm, "rms")
LayerNorm = _drop_in(eqx.nn.LayerNorm, "layer")
