"""Every use of JAX's private internals, and of what moved between releases.

Covers JAX 0.10.2 (the oldest release pyproject.toml allows) through 0.11.2
(the newest tested, on GPUs). A JAX release that moves one of these needs a
change here only.
"""

from __future__ import annotations

from functools import partial

import jax
from jax._src import dispatch as _dispatch  # no public hook for this yet
from jax._src.lib.mlir import ir as _ir


def compiled_impl(prim) -> None:
    """Give ``prim`` the impl rule of JAX's own primitives: an eager call
    compiles the primitive alone and runs it. ``apply_primitive`` turns
    ``jax.disable_jit()`` off around that call, so the impl does not reenter
    ``bind`` (a ``jax.jit`` of ``bind`` would, under ``disable_jit``)."""
    prim.def_impl(partial(_dispatch.apply_primitive, prim))


def require_devices_during_lowering(prim) -> None:
    """Have JAX pass the device assignment when it lowers a jaxpr holding
    ``prim``: ``custom_partitioning`` needs it while lowering (JAX keeps the
    set of such primitives in ``jax._src.dispatch``)."""
    _dispatch.prim_requires_devices_during_lowering.add(prim)


def tensor_shape(mlir_type) -> tuple:
    """The shape of an MLIR ranked tensor type (as a sharding rule receives
    its operand and result types)."""
    return tuple(_ir.RankedTensorType(mlir_type).shape)


def varying_axes(aval) -> frozenset:
    """The shard_map mesh axes an aval varies over (empty outside shard_map).

    JAX 0.10 keeps them in ``aval.manual_axis_type.varying``; 0.11 in
    ``aval.vma``."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", frozenset()))


def varying_update(aval, vma) -> dict:
    """The ``aval.update`` keywords that set the axes it varies over to
    ``vma`` (empty where the aval keeps none), by the same two layouts."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return {"manual_axis_type": type(mat)(varying=vma, unreduced=mat.unreduced, reduced=mat.reduced)}
    if hasattr(aval, "vma"):
        return {"vma": vma}
    return {}


def traced_avals(fn, avals) -> list:
    """The avals of ``fn``'s outputs on inputs of the avals ``avals`` (their
    vma and shardings included), as a primitive's abstract evaluation returns
    them: ``jax.make_jaxpr`` takes avals as it takes arrays (its
    abstractification passes an abstract value through), in 0.10.2 and 0.11."""
    return list(jax.make_jaxpr(fn)(*avals).out_avals)
