"""What the Flax and Equinox modules share: the call into the kernels with the
dtype rules of the module being replaced."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._api import layer_norm, rms_norm


def check_last_axis(name: str, axes) -> None:
    """The kernels normalize over the last axis only."""
    if axes not in (-1, (-1,), [-1]):
        raise NotImplementedError(
            f"jax_rmsnorm modules normalize over the last axis only: {name} must be -1, got {axes!r}")


def check_flax_module(mod) -> None:
    """Construction-time checks of the Flax (linen and NNX) modules' options."""
    check_last_axis("reduction_axes", mod.reduction_axes)
    check_last_axis("feature_axes", mod.feature_axes)
    if mod.axis_index_groups is not None:
        raise NotImplementedError("jax_rmsnorm modules do not take axis_index_groups yet")


def normalize(kind: str, x, scale, bias, *, eps: float, out_dtype, zero_centered_gamma: bool, axis_name=None):
    """Normalizes ``x`` over its last axis and returns it in ``out_dtype``.

    ``axis_name``: the mesh axis (or axes) over which the features are split
    inside ``shard_map``: statistics of whole rows are combined over it, as
    flax's ``axis_name`` averages its statistics over it.

    Where ``out_dtype`` is wider than ``x`` (bf16 input with float32 parameters,
    say), ``x`` is widened first so that the kernel writes the wide result
    directly; the statistics are float32 either way. The parameters go in
    their own dtypes (the functions widen them where the kernels need it).
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
