"""Flax linen drop-ins: ``RMSNorm`` and ``LayerNorm`` subclass
``flax.linen.RMSNorm`` / ``flax.linen.LayerNorm``: the same constructor
arguments and defaults, the same parameter names, shapes and dtypes, the same
output dtype, computed by jax_rmsnorm's kernels. Swap the import; existing
parameters load unchanged. Flax NNX modules are in ``jax_rmsnorm.flax.nnx``.

Which path a call takes:

- Kernels: ``reduction_axes`` that are x's trailing axes (``-1``, ``(-2, -1)``,
  ``1`` on a rank-2 x, ...), flattened into one row each, with
  ``feature_axes`` among them (the parameters are broadcast over the
  reduced axes that are not feature axes); x, the parameters and the output
  in float32, bfloat16 or float16 (a NumPy float64 x with x64 off is float32,
  as in flax). ``axis_name`` works as in flax, inside ``shard_map`` with the
  features split over that mesh axis: only per-row statistics cross devices.
  Statistics are float32, taken in two passes or in one around a shift near
  the row's mean, never as E[x^2] - E[x]^2 (``use_fast_variance`` and
  ``force_float32_reductions`` are accepted and change nothing).
- flax's own code (``flax.linen.LayerNorm.__call__``), with a one-time
  ``jax_rmsnorm.FallbackWarning`` that names the reason: a ``mask``;
  reduction axes that are not the trailing ones, or feature axes outside
  them; ``axis_index_groups``; float64 or complex x, parameters or ``dtype``
  (x64), integer x; an empty reduced block. Results and errors are flax's.

Extra: ``zero_centered_gamma`` scales by ``1 + scale`` (kernels only: with it,
a call that needs flax's own code raises ``ValueError``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from .._modules import flax_path

__all__ = ["RMSNorm", "LayerNorm"]


def _param_dtype(mod, name, init, shape):
    """The dtype of parameter ``name`` in this call: as stored, or as
    ``init`` makes it (traced only, with a placeholder key: the module's own
    random stream is untouched)."""
    if mod.has_variable("params", name):
        return nn.meta.unbox(mod.get_variable("params", name)).dtype
    return jax.eval_shape(lambda k: nn.meta.unbox(init(k, shape, mod.param_dtype)), jax.random.key(0)).dtype


def _call(mod, kind, x, mask):
    """The output on the kernels, or None where flax's own code runs."""
    name = "RMSNorm" if kind == "rms" else "LayerNorm"
    xa = jnp.asarray(x)
    inits = {"scale": mod.scale_init} if mod.use_scale else {}
    if kind == "layer" and mod.use_bias:
        inits["bias"] = mod.bias_init
    path = flax_path(mod, xa, mask, f"jax_rmsnorm.flax.{name}", f"flax.linen.{name}", lambda rows: [
        (n, _param_dtype(mod, n, init, rows.param_shape)) for n, init in inits.items()])
    if path is None:
        return None
    rows, out_dtype = path
    params = {n: mod.param(n, init, rows.param_shape, mod.param_dtype) for n, init in inits.items()}
    return rows.run(kind, xa, params.get("scale"), params.get("bias"), eps=mod.epsilon, out_dtype=out_dtype,
                    zero_centered_gamma=mod.zero_centered_gamma, axis_name=mod.axis_name)


class RMSNorm(nn.RMSNorm):
    """``flax.linen.RMSNorm`` on jax_rmsnorm's kernels.

    ``x``: any shape; normalized over ``reduction_axes`` (default -1).
    Parameter ``scale``: the sizes of ``feature_axes``, in ``param_dtype``.
    Output: x's shape, in ``dtype`` or else the promotion of x and ``scale``.
    The kernels run where ``reduction_axes`` are x's trailing axes and
    ``feature_axes`` among them, with float32/bfloat16/float16 arrays and no
    ``mask`` or ``axis_index_groups``; otherwise flax's own code runs, with a
    one-time ``jax_rmsnorm.FallbackWarning`` (see ``jax_rmsnorm.flax``).
    """

    zero_centered_gamma: bool = False

    @nn.compact
    def __call__(self, x, *, mask=None):
        y = _call(self, "rms", x, mask)
        return super().__call__(x, mask=mask) if y is None else y


class LayerNorm(nn.LayerNorm):
    """``flax.linen.LayerNorm`` on jax_rmsnorm's kernels.

    ``x``: any shape; normalized over ``reduction_axes`` (default -1).
    Parameters ``scale`` and ``bias``: the sizes of ``feature_axes``, in
    ``param_dtype``. Output: x's shape, in ``dtype`` or else the promotion of
    x and the parameters. Paths as in ``RMSNorm`` (kernels, or flax's own
    code for a ``mask``, other axes, ``axis_index_groups``, other dtypes).
    """

    zero_centered_gamma: bool = False

    @nn.compact
    def __call__(self, x, *, mask=None):
        y = _call(self, "layer", x, mask)
        return super().__call__(x, mask=mask) if y is None else y
