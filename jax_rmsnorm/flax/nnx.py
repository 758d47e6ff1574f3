"""Flax NNX drop-ins: ``RMSNorm`` and ``LayerNorm`` subclass
``flax.nnx.RMSNorm`` / ``flax.nnx.LayerNorm`` (the same constructor, state and
graph), computed by jax_rmsnorm's kernels.

A call first applies the module's ``promote_dtype`` to x and the parameters,
as flax does (the default promotes them to ``dtype``, or else to their
common dtype; ``promote_dtype=lambda a, **kw: a`` leaves them as they are),
then takes the kernels or flax's own code by the rules of
``jax_rmsnorm.flax``: kernels for trailing ``reduction_axes`` (flattened)
with ``feature_axes`` among them and float32/bfloat16/float16 arrays; flax's
own ``__call__``, with a one-time ``jax_rmsnorm.FallbackWarning``, for a
``mask``, other axes, ``axis_index_groups`` or other dtypes. Extra keyword:
``zero_centered_gamma`` (kernels only).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes as _dtypes

from .._checks import check_bool
from .._modules import flax_path

__all__ = ["RMSNorm", "LayerNorm"]


def _call(mod, kind, x, mask):
    """The output on the kernels, or None where flax's own code runs."""
    name = "RMSNorm" if kind == "rms" else "LayerNorm"
    scale = mod.scale[...] if mod.scale is not None else None
    bias = mod.bias[...] if kind == "layer" and mod.bias is not None else None
    promote = getattr(mod, "promote_dtype", _dtypes.promote_dtype)
    promoted = promote((x, scale, bias) if kind == "layer" else (x, scale), dtype=mod.dtype)
    xa, scale = jnp.asarray(promoted[0]), promoted[1]
    bias = promoted[2] if kind == "layer" else None
    path = flax_path(mod, xa, mask, f"jax_rmsnorm.flax.nnx.{name}", f"flax.nnx.{name}", lambda rows: [
        (n, p.dtype) for n, p in (("scale", scale), ("bias", bias)) if p is not None])
    if path is None:
        return None
    rows, out_dtype = path
    return rows.run(kind, xa, scale, bias, eps=mod.epsilon, out_dtype=out_dtype,
                    zero_centered_gamma=mod.zero_centered_gamma, axis_name=mod.axis_name)


class RMSNorm(nnx.RMSNorm):
    """``flax.nnx.RMSNorm`` on jax_rmsnorm's kernels.

    ``x``: any shape, normalized over ``reduction_axes`` (default -1, of
    size ``num_features``); output in ``dtype`` or else the promotion of x
    and ``scale``. Kernels or flax's own code as in ``jax_rmsnorm.flax.nnx``.
    """

    def __init__(self, num_features: int, *, zero_centered_gamma: bool = False, **kwargs):
        super().__init__(num_features, **kwargs)
        self.zero_centered_gamma = check_bool(zero_centered_gamma, "zero_centered_gamma")

    def __call__(self, x, mask=None):
        y = _call(self, "rms", x, mask)
        return super().__call__(x, mask=mask) if y is None else y


class LayerNorm(nnx.LayerNorm):
    """``flax.nnx.LayerNorm`` on jax_rmsnorm's kernels.

    ``x``: any shape, normalized over ``reduction_axes`` (default -1, of
    size ``num_features``); output in ``dtype`` or else the promotion of x
    and the parameters. Kernels or flax's own code as in
    ``jax_rmsnorm.flax.nnx``.
    """

    def __init__(self, num_features: int, *, zero_centered_gamma: bool = False, **kwargs):
        super().__init__(num_features, **kwargs)
        self.zero_centered_gamma = check_bool(zero_centered_gamma, "zero_centered_gamma")

    def __call__(self, x, *, mask=None):
        y = _call(self, "layer", x, mask)
        return super().__call__(x, mask=mask) if y is None else y
