"""Flax linen drop-ins: ``RMSNorm`` and ``LayerNorm`` with the constructor
arguments, defaults, parameter names and shapes of ``flax.linen.RMSNorm`` /
``flax.linen.LayerNorm``, computed by jax_rmsnorm's kernels. Swap the import;
existing parameters load unchanged. Flax NNX modules are in
``jax_rmsnorm.flax.nnx``.

Differences: normalization is over the last axis only (``reduction_axes`` and
``feature_axes`` must be -1); ``axis_index_groups`` is not supported yet
(raises at construction); statistics are always float32, taken in two passes
or in one around a shift near the row's mean, never as E[x^2] - E[x]^2
(docs/api.md says which kernels take which; ``use_fast_variance`` and
``force_float32_reductions`` are accepted and change nothing). ``axis_name``
works as in flax, inside ``shard_map`` with the features split over that mesh
axis: each device holds a slice of the features (and of ``scale``/``bias``),
and only per-row statistics cross devices. Extra: ``zero_centered_gamma``
scales by ``1 + scale``.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from .._modules import check_flax_module, normalize

__all__ = ["RMSNorm", "LayerNorm"]


def _out_dtype(mod, x, *params):
    """flax.linen's rule: ``dtype`` if given, else the promotion of input and parameters."""
    return mod.dtype if mod.dtype is not None else jnp.result_type(x, *params)


class RMSNorm(nn.RMSNorm):
    """``flax.linen.RMSNorm`` on jax_rmsnorm's kernels.

    Input ``x``: ``(..., features)``, float32/bfloat16/float16. Parameter
    ``scale``: ``(features,)`` in ``param_dtype``. Output: ``x``'s shape, in
    ``dtype`` or else the promotion of ``x`` and ``scale`` (as flax does).
    """

    zero_centered_gamma: bool = False

    def __post_init__(self):
        check_flax_module(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, x, mask=None):
        if mask is not None:
            raise NotImplementedError("jax_rmsnorm.flax.RMSNorm does not take a mask")
        scale = (self.param("scale", self.scale_init, (x.shape[-1],), self.param_dtype)
                 if self.use_scale else None)
        return normalize("rms", x, scale, None, eps=self.epsilon,
                         out_dtype=_out_dtype(self, x, *([scale] if scale is not None else [])),
                         zero_centered_gamma=self.zero_centered_gamma, axis_name=self.axis_name)


class LayerNorm(nn.LayerNorm):
    """``flax.linen.LayerNorm`` on jax_rmsnorm's kernels.

    Input ``x``: ``(..., features)``. Parameters ``scale`` and ``bias``:
    ``(features,)`` in ``param_dtype``. Output dtype as in flax.
    """

    zero_centered_gamma: bool = False

    def __post_init__(self):
        check_flax_module(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, x, *, mask=None):
        if mask is not None:
            raise NotImplementedError("jax_rmsnorm.flax.LayerNorm does not take a mask")
        feat = (x.shape[-1],)
        scale = self.param("scale", self.scale_init, feat, self.param_dtype) if self.use_scale else None
        bias = self.param("bias", self.bias_init, feat, self.param_dtype) if self.use_bias else None
        params = [p for p in (scale, bias) if p is not None]
        return normalize("layer", x, scale, bias, eps=self.epsilon, out_dtype=_out_dtype(self, x, *params),
                         zero_centered_gamma=self.zero_centered_gamma, axis_name=self.axis_name)
