"""Flax NNX drop-ins: ``RMSNorm`` and ``LayerNorm`` subclassing
``flax.nnx.RMSNorm`` / ``flax.nnx.LayerNorm`` (same constructor, same state),
computed by jax_rmsnorm's kernels. The limits of ``jax_rmsnorm.flax`` apply;
``zero_centered_gamma`` is an extra keyword argument.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from .._modules import check_flax_module, normalize

__all__ = ["RMSNorm", "LayerNorm"]


def _call(mod, kind, x, scale, bias, mask):
    if mask is not None:
        raise NotImplementedError(f"jax_rmsnorm.flax.nnx.{type(mod).__name__} does not take a mask")
    params = [p for p in (scale, bias) if p is not None]
    if mod.dtype is not None:  # nnx promotes the input to dtype first
        x = x.astype(mod.dtype)
        out_dtype = mod.dtype
    else:
        out_dtype = jnp.result_type(x, *params)
    return normalize(kind, x, scale, bias, eps=mod.epsilon, out_dtype=out_dtype,
                     zero_centered_gamma=mod.zero_centered_gamma, axis_name=mod.axis_name)


class RMSNorm(nnx.RMSNorm):
    """``flax.nnx.RMSNorm`` on jax_rmsnorm's kernels; ``x``: ``(..., num_features)``."""

    def __init__(self, num_features: int, *, zero_centered_gamma: bool = False, **kwargs):
        super().__init__(num_features, **kwargs)
        self.zero_centered_gamma = zero_centered_gamma
        check_flax_module(self)

    def __call__(self, x, mask=None):
        scale = self.scale[...] if self.scale is not None else None
        return _call(self, "rms", x, scale, None, mask)


class LayerNorm(nnx.LayerNorm):
    """``flax.nnx.LayerNorm`` on jax_rmsnorm's kernels; ``x``: ``(..., num_features)``."""

    def __init__(self, num_features: int, *, zero_centered_gamma: bool = False, **kwargs):
        super().__init__(num_features, **kwargs)
        self.zero_centered_gamma = zero_centered_gamma
        check_flax_module(self)

    def __call__(self, x, *, mask=None):
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        return _call(self, "layer", x, scale, bias, mask)
