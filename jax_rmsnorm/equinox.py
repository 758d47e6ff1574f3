"""Equinox drop-ins: ``RMSNorm`` and ``LayerNorm`` subclass
``equinox.nn.RMSNorm`` / ``equinox.nn.LayerNorm`` (the same constructor
arguments, ``elementwise_affine`` of LayerNorm included, and the same fields:
``shape``, ``eps``, ``use_weight``, ``use_bias``, ``weight``, ``bias``),
computed by jax_rmsnorm's kernels.

Called, as Equinox's, on one example of shape ``shape`` (``jax.vmap`` over a
batch); a multi-axis ``shape`` such as ``(8, 16)`` is normalized over all its
axes as one flattened row on the kernels. As in Equinox, the arithmetic is in
the promotion of x's dtype and float32, the parameters are cast to it and the
output has x's dtype (an integer x gives an integer output); every cast is
explicit, so ``jax_numpy_dtype_promotion="strict"`` (Equinox's own tests run
under it) changes nothing.

Which path a call takes: the kernels where that arithmetic is float32 (x
float32, bfloat16, float16, or an integer, bool or FP8 x, cast to float32
first); Equinox's own code, with a one-time ``jax_rmsnorm.FallbackWarning``,
where it is not (float64 x under x64, complex x) or ``shape`` holds a 0.
Equinox's own code also raises its own error where ``x.shape != shape``.

Extra keyword: ``zero_centered_gamma`` (scale by ``1 + weight``; kernels
only: with it, a call that needs Equinox's own code raises ``ValueError``).
"""

from __future__ import annotations

import inspect
import math

import equinox as eqx
import numpy as np
import jax.numpy as jnp

from ._checks import check_bool
from ._modules import KERNEL_DTYPES, _promote, fallback, normalize, took_kernels

__all__ = ["RMSNorm", "LayerNorm"]


def _call(mod, base, kind, x):
    """The output on the kernels, or None where Equinox's own code runs."""
    if not hasattr(x, "shape") or tuple(x.shape) != mod.shape:
        return None  # Equinox's own error
    xa = jnp.asarray(x)
    compute = np.dtype(_promote(xa.dtype, jnp.float32))  # Equinox's arithmetic dtype
    owner, upstream = f"jax_rmsnorm.equinox.{base.__name__}", f"equinox.nn.{base.__name__}"
    if compute != np.float32:
        fallback(owner, upstream, "dtype", f"x of dtype {xa.dtype.name} (computed in {compute.name}; "
                 "the kernels compute in float32)", mod.zero_centered_gamma)
        return None
    n = math.prod(mod.shape)
    if n == 0:
        fallback(owner, upstream, "empty", f"shape {mod.shape}", mod.zero_centered_gamma)
        return None
    took_kernels()
    x_in = xa if xa.dtype in KERNEL_DTYPES else xa.astype(jnp.float32)

    def param(p):  # as Equinox casts it to the arithmetic dtype (exact for the kernels' dtypes)
        if p is None:
            return None
        p = jnp.asarray(p).reshape(n)
        return p if p.dtype in KERNEL_DTYPES else p.astype(jnp.float32)

    y = normalize(kind, x_in.reshape(n), param(mod.weight if mod.use_weight else None),
                  param(mod.bias if mod.use_bias else None), eps=mod.eps, out_dtype=x_in.dtype,
                  zero_centered_gamma=mod.zero_centered_gamma)
    return y.reshape(mod.shape).astype(xa.dtype)


def _drop_in(base, kind: str):
    """A subclass of the Equinox module ``base`` that runs jax_rmsnorm's kernels."""
    no_state = inspect.signature(base.__call__).parameters["state"].default  # Equinox's sentinel

    class Norm(base):
        zero_centered_gamma: bool = eqx.field(static=True, default=False)

        def __init__(self, *args, zero_centered_gamma: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.zero_centered_gamma = check_bool(zero_centered_gamma, "zero_centered_gamma")

        def __call__(self, x, state=no_state, *, key=None):
            y = _call(self, base, kind, x)
            if y is None:
                return base.__call__(self, x, state, key=key)
            return y if state is no_state else (y, state)

    Norm.__name__ = Norm.__qualname__ = base.__name__
    Norm.__module__ = __name__
    Norm.__doc__ = (f"``equinox.nn.{base.__name__}`` on jax_rmsnorm's kernels: same arguments and fields, "
                    f"plus ``zero_centered_gamma``. Kernels where the arithmetic is float32, Equinox's own "
                    f"code (one-time ``jax_rmsnorm.FallbackWarning``) for float64 or complex x; see "
                    f"``jax_rmsnorm.equinox``.")
    return Norm


RMSNorm = _drop_in(eqx.nn.RMSNorm, "rms")
LayerNorm = _drop_in(eqx.nn.LayerNorm, "layer")
