"""The two primitive families: normalization forward and backward.

Each primitive has, side by side, its abstract evaluation, its lowering to the
FFI target of the platform (CPU or CUDA), and its batching rule.

Operands are passed in the layout the kernels read: ``x`` of any rank,
normalized over its last axis, and parameters (gamma/beta) of shape
``x.shape[:k] + (hidden,)`` for some ``k >= 0``. ``k > 0`` ("parameter groups")
only arises from ``vmap`` over the parameters: every row of ``x`` under the
same leading index uses the same parameter row. An absent gamma or beta is
passed as an empty placeholder array with ``has_gamma``/``has_beta`` False.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from . import _ffi

RMS = "rms"
LAYER = "layer"

# ---------------------------------------------------------------------------
# helpers shared by both families


def varying_axes(aval) -> frozenset:
    """The shard_map mesh axes an aval varies over (empty outside shard_map).

    JAX 0.10 keeps them in ``aval.manual_axis_type.varying``; other releases in
    ``aval.vma``."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", frozenset()))


def _vma(*avals):
    """Union of the varying axes of some avals."""
    return frozenset().union(*(varying_axes(a) for a in avals))


def _like(aval, vma, shape=None, dtype=None):
    """An aval of ``aval``'s kind with a new shape/dtype and the given varying axes."""
    kwargs = {}
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        kwargs["manual_axis_type"] = type(mat)(varying=vma, unreduced=mat.unreduced, reduced=mat.reduced)
    elif hasattr(aval, "vma"):
        kwargs["vma"] = vma
    if shape is not None and tuple(shape) != tuple(aval.shape):
        sharding = getattr(aval, "sharding", None)
        spec = getattr(sharding, "spec", None)
        if spec is not None and len(shape) == len(aval.shape) - 1:
            kwargs["sharding"] = sharding.update(spec=jax.sharding.PartitionSpec(*tuple(spec)[:-1]))
    return aval.update(shape=aval.shape if shape is None else tuple(shape),
                       dtype=aval.dtype if dtype is None else dtype, **kwargs)


def _placeholder(dtype):
    """The operand passed for an absent gamma/beta."""
    return jnp.zeros((0,), dtype)


def _move_to_front(arrays, dims, size):
    """Moves each batch dim to axis 0, broadcasting unbatched arrays to ``size``."""
    return [batching.bdim_at_front(a, d, size) for a, d in zip(arrays, dims)]


def _batch_size(args, dims):
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def _ffi_call_lowering(target, ctx, operands, extra_outs=(), **attrs):
    """Lowers to ``target``; ``extra_outs`` are scratch outputs dropped afterwards."""
    ctx = ctx.replace(avals_in=ctx.avals_in[: len(operands)], avals_out=[*ctx.avals_out, *extra_outs])
    results = jax.ffi.ffi_lowering(target)(ctx, *operands, **attrs)
    return results[: len(results) - len(extra_outs)]


def _no_cuda_lowering(ctx, *args, **params):
    raise RuntimeError(
        "jax_rmsnorm was built without its CUDA kernels, so it cannot run on a GPU. "
        "Reinstall it on a machine with nvcc (JAX_RMSNORM_CUDA=ON forces the CUDA build), "
        "or run the computation on the CPU.")


def _register_lowering(prim, rule):
    mlir.register_lowering(prim, lambda ctx, *a, **p: rule(ctx, *a, platform="cpu", **p), platform="cpu")
    if _ffi.cuda_built():
        mlir.register_lowering(prim, lambda ctx, *a, **p: rule(ctx, *a, platform="cuda", **p),
                               platform="cuda")
    else:
        mlir.register_lowering(prim, _no_cuda_lowering, platform="cuda")


# ---------------------------------------------------------------------------
# forward: (x, gamma[, beta]) -> (y[, mean], rstd)

norm_fwd_p = Primitive("jax_rmsnorm_fwd")
norm_fwd_p.multiple_results = True


def norm_fwd(x, gamma, beta, *, kind, eps, zero_centered_gamma, has_gamma, has_beta):
    """Binds the forward primitive; returns ``(y, mean, rstd)`` (``mean`` None for RMS)."""
    params = dict(kind=kind, eps=float(eps), zero_centered_gamma=bool(zero_centered_gamma),
                  has_gamma=bool(has_gamma), has_beta=bool(has_beta))
    if kind == RMS:
        y, rstd = norm_fwd_p.bind(x, gamma, **params)
        return y, None, rstd
    return tuple(norm_fwd_p.bind(x, gamma, beta, **params))


def _fwd_abstract(x, *params_avals, kind, fused=None, **_):
    if fused is not None:
        return _fwd_fused_abstract(x, *params_avals, kind=kind, fused=fused)
    vma = _vma(x, *params_avals)
    y = _like(x, vma)
    stat = _like(x, vma, shape=x.shape[:-1], dtype=np.float32)
    return [y, stat] if kind == RMS else [y, stat, stat]


def _fwd_lowering(ctx, *operands, kind, eps, zero_centered_gamma, has_gamma, has_beta, platform, fused=None):
    del platform  # the FFI target of the platform being lowered for is picked by XLA
    attrs = dict(eps=np.float32(eps), zero_centered_gamma=zero_centered_gamma, has_gamma=has_gamma)
    if fused is not None:
        return _fwd_fused_lowering(ctx, operands, kind, has_beta, fused, attrs)
    if kind == RMS:
        return _ffi_call_lowering("jrn_rms_norm_fwd", ctx, operands, **attrs)
    return _ffi_call_lowering("jrn_layer_norm_fwd", ctx, operands, has_beta=has_beta, **attrs)


def _fwd_batch(args, dims, *, kind, has_gamma, has_beta, **params):
    if params.get("fused") is not None:
        return _fwd_fused_batch(args, dims, kind=kind, has_gamma=has_gamma, has_beta=has_beta, **params)
    x, *ps = args
    bx, *bps = dims
    full = dict(kind=kind, has_gamma=has_gamma, has_beta=has_beta, **params)
    if all(b is None for b in bps):
        # Shared parameters: the batch axis is one more row axis, unless it is last.
        if bx == x.ndim - 1:
            x, bx = jnp.moveaxis(x, bx, 0), 0
        outs = norm_fwd_p.bind(x, *ps, **full)
        return outs, [bx] * len(outs)
    # Per-example parameters: batch axis first everywhere, parameters become groups.
    size = _batch_size(args, dims)
    x = batching.bdim_at_front(x, bx, size)
    present = [has_gamma, has_beta][: len(ps)]
    ps = [batching.bdim_at_front(p, b, size) if keep else p for p, b, keep in zip(ps, bps, present)]
    outs = norm_fwd_p.bind(x, *ps, **full)
    return outs, [0] * len(outs)


norm_fwd_p.def_impl(lambda *args, **params: jax.jit(
    lambda *a: norm_fwd_p.bind(*a, **params))(*args))
norm_fwd_p.def_abstract_eval(_fwd_abstract)
_register_lowering(norm_fwd_p, _fwd_lowering)
batching.primitive_batchers[norm_fwd_p] = _fwd_batch


# ---------------------------------------------------------------------------
# fused forward: the forward primitive with ``fused`` set (a FusedSpec).
#
# (x, gamma[, beta], residual, scale) -> (y[, mean], rstd, h, qs)
#
# With ``residual``: h = x + residual (in h_dtype) is stored and normalized.
# With ``quant``: y is FP8 (out_dtype); qs is amax (quant "tensor": one per
# tensor, shaped like ``scale``), the row scales (``x.shape[:-1]``), the group
# scales (``x.shape[:-1] + (hidden // group_size,)``), or scale_inv (quant
# "current": shaped like ``scale``, whose values are not read). Absent operands and
# outputs are empty placeholders: residual/h of shape (0,), scale/qs (0,) float32.

QUANT_CODES = {None: 0, "tensor": 1, "row": 2, "group": 3, "current": 4}


@dataclasses.dataclass(frozen=True)
class FusedSpec:
    residual: bool = False
    h_dtype: Optional[np.dtype] = None  # with residual
    quant: Optional[str] = None  # None, "tensor", "row", "group", "current"
    out_dtype: Optional[np.dtype] = None  # FP8 dtype with quant
    group_size: int = 0  # quant "group"
    scale_ub: float = math.inf  # quant "row"/"group"


def norm_fwd_fused(x, gamma, beta, residual, scale, *, kind, eps, zero_centered_gamma, has_gamma,
                   has_beta, fused: FusedSpec):
    """Binds the fused forward; returns ``(y, mean, rstd, h, qs)`` (None where absent)."""
    params = dict(kind=kind, eps=float(eps), zero_centered_gamma=bool(zero_centered_gamma),
                  has_gamma=bool(has_gamma), has_beta=bool(has_beta), fused=fused)
    if residual is None:
        residual = _placeholder(x.dtype)
    if scale is None:
        scale = _placeholder(np.float32)
    if kind == RMS:
        y, rstd, h, qs = norm_fwd_p.bind(x, gamma, residual, scale, **params)
        mean = None
    else:
        y, mean, rstd, h, qs = norm_fwd_p.bind(x, gamma, beta, residual, scale, **params)
    return y, mean, rstd, (h if fused.residual else None), (qs if fused.quant else None)


def _fwd_fused_abstract(x, *rest, kind, fused):
    residual, scale = rest[-2:]
    vma = _vma(x, *rest)
    outs = [_like(x, vma, dtype=fused.out_dtype if fused.quant else None)]
    stat = _like(x, vma, shape=x.shape[:-1], dtype=np.float32)
    outs += [stat] if kind == RMS else [stat, stat]
    outs.append(_like(x, vma, dtype=fused.h_dtype) if fused.residual else _like(residual, vma))
    if fused.quant == "row":
        outs.append(stat)
    elif fused.quant == "group":
        outs.append(_like(x, vma, shape=x.shape[:-1] + (x.shape[-1] // fused.group_size,), dtype=np.float32))
    else:  # amax / scale_inv are shaped like scale; without quantization both are placeholders
        outs.append(_like(scale, vma))
    return outs


def _fwd_fused_lowering(ctx, operands, kind, has_beta, fused, attrs):
    attrs.update(has_residual=fused.residual, quant=np.int32(QUANT_CODES[fused.quant]),
                 group_size=np.int64(fused.group_size), scale_ub=np.float32(fused.scale_ub))
    if kind == RMS:
        return _ffi_call_lowering("jrn_rms_norm_fwd_fused", ctx, operands, **attrs)
    return _ffi_call_lowering("jrn_layer_norm_fwd_fused", ctx, operands, has_beta=has_beta, **attrs)


def _fwd_fused_batch(args, dims, *, kind, has_gamma, has_beta, fused, **params):
    # Batch axis first for x, the residual and (per tensor) the scale. Per-
    # example parameters become groups; a batched tensor scale gives one amax
    # per example (an unbatched one is broadcast: still one amax per example).
    n_params = 1 if kind == RMS else 2
    x, ps, (residual, scale) = args[0], list(args[1:1 + n_params]), args[1 + n_params:]
    bx, bps, (br, bs) = dims[0], dims[1:1 + n_params], dims[1 + n_params:]
    size = _batch_size(args, dims)
    x = batching.bdim_at_front(x, bx, size)
    if fused.residual:
        residual = batching.bdim_at_front(residual, br, size)
    if fused.quant in ("tensor", "current"):
        scale = batching.bdim_at_front(scale, bs, size)
    if any(b is not None for b in bps):
        present = [has_gamma, has_beta][:n_params]
        ps = [batching.bdim_at_front(p, b, size) if keep else p for p, b, keep in zip(ps, bps, present)]
    outs = norm_fwd_p.bind(x, *ps, residual, scale, kind=kind, has_gamma=has_gamma, has_beta=has_beta,
                           fused=fused, **params)
    n_stats = 1 if kind == RMS else 2
    out_dims = [0] * (1 + n_stats) + [0 if fused.residual else None, 0 if fused.quant else None]
    return outs, out_dims


# ---------------------------------------------------------------------------
# FP8 transpose: q (..., rows, cols) -> q_t (..., cols, rows), the transposed
# copy of a quantized output (leading dims are a batch).

fp8_transpose_p = Primitive("jax_rmsnorm_fp8_transpose")


def fp8_transpose(q):
    return fp8_transpose_p.bind(q)


def _transpose_abstract(q):
    return _like(q, _vma(q), shape=q.shape[:-2] + (q.shape[-1], q.shape[-2]))


def _transpose_lowering(ctx, q, platform):
    del platform
    return _ffi_call_lowering("jrn_fp8_transpose", ctx, (q,))


def _transpose_batch(args, dims):
    (q,), (bq,) = args, dims
    return fp8_transpose_p.bind(batching.bdim_at_front(q, bq, q.shape[bq])), 0


fp8_transpose_p.def_impl(lambda q: jax.jit(fp8_transpose_p.bind)(q))
fp8_transpose_p.def_abstract_eval(_transpose_abstract)
_register_lowering(fp8_transpose_p, _transpose_lowering)
batching.primitive_batchers[fp8_transpose_p] = _transpose_batch

# ---------------------------------------------------------------------------
# backward: (dy, x[, mean], rstd, gamma, beta) -> (dx, dgamma[, dbeta])
#
# ``beta`` is an operand for its shape and dtype only (dbeta is shaped like it);
# the kernels never read it. For RMSNorm it is absent.

norm_bwd_p = Primitive("jax_rmsnorm_bwd")
norm_bwd_p.multiple_results = True

# Budget for the CUDA backward's float32 dgamma/dbeta partial sums ("slots",
# one row of partials each), per parameter group.
_SLOT_FLOATS = 1 << 24
_MAX_SLOTS = 4096


def norm_bwd(dy, x, mean, rstd, gamma, beta, *, kind, zero_centered_gamma, has_gamma, has_beta, dh=None):
    """Binds the backward primitive; returns ``(dx, dgamma, dbeta)`` (``dbeta`` None for RMS).

    ``dh`` (fused residual add: like ``x``) is added to ``dx`` in the kernel."""
    params = dict(kind=kind, zero_centered_gamma=bool(zero_centered_gamma),
                  has_gamma=bool(has_gamma), has_beta=bool(has_beta))
    extra = ()
    if dh is not None:
        params["has_dh"], extra = True, (dh,)
    if kind == RMS:
        dx, dgamma = norm_bwd_p.bind(dy, x, rstd, gamma, *extra, **params)
        return dx, dgamma, None
    return tuple(norm_bwd_p.bind(dy, x, mean, rstd, gamma, beta, *extra, **params))


def _bwd_abstract(dy, x, *rest, kind, has_dh=False, **_):
    vma = _vma(dy, x, *rest)
    if has_dh:
        rest = rest[:-1]
    gamma = rest[-1] if kind == RMS else rest[-2]
    outs = [_like(x, vma), _like(gamma, vma)]
    if kind == LAYER:
        outs.append(_like(rest[-1], vma))
    return outs


def cuda_slots(rows_per_group: int, hidden: int, param_outputs: int) -> int:
    """How many partial-sum rows the CUDA backward gets for dgamma/dbeta."""
    if param_outputs == 0 or hidden == 0:
        return 0
    slots = max(1, min(_SLOT_FLOATS // (param_outputs * hidden), _MAX_SLOTS))
    return max(1, min(slots, rows_per_group))


def _bwd_lowering(ctx, *operands, kind, zero_centered_gamma, has_gamma, has_beta, platform, has_dh=False):
    x_aval = ctx.avals_in[1]
    param_aval = ctx.avals_out[1] if has_gamma or kind == RMS else ctx.avals_out[2]
    hidden = x_aval.shape[-1]
    outputs = int(has_gamma) + int(kind == LAYER and has_beta)
    n_floats = 0
    if platform == "cuda" and outputs:
        groups = math.prod(param_aval.shape[:-1])
        rows = math.prod(x_aval.shape[:-1])
        n_floats = groups * outputs * hidden * cuda_slots(rows // max(groups, 1), hidden, outputs)
    workspace = jax.core.ShapedArray((n_floats,), np.float32)
    attrs = dict(zero_centered_gamma=zero_centered_gamma, has_gamma=has_gamma)
    if has_dh:  # (..., gamma[, beta], dh): the kernel takes dh after gamma
        ops = operands if kind == RMS else (*operands[:-2], operands[-1])
        if kind == LAYER:
            ctx = ctx.replace(avals_in=[*ctx.avals_in[:-2], ctx.avals_in[-1]])
        return _ffi_call_lowering("jrn_rms_norm_bwd_add" if kind == RMS else "jrn_layer_norm_bwd_add",
                                  ctx, ops, [workspace], **attrs, **({} if kind == RMS else dict(has_beta=has_beta)))
    if kind == RMS:
        return _ffi_call_lowering("jrn_rms_norm_bwd", ctx, operands, [workspace], **attrs)
    # beta's operand only shapes dbeta: the kernel does not take it.
    return _ffi_call_lowering("jrn_layer_norm_bwd", ctx, operands[:-1], [workspace],
                              has_beta=has_beta, **attrs)


def _bwd_batch(args, dims, *, kind, has_gamma, has_beta, has_dh=False, **params):
    n_rows = 4 if kind == LAYER else 3  # dy, x, [mean,] rstd
    n_ps = len(args) - n_rows - int(has_dh)  # then dh, one more row operand
    rows, ps = list(args[:n_rows]), list(args[n_rows:n_rows + n_ps])
    full = dict(kind=kind, has_gamma=has_gamma, has_beta=has_beta, **params)
    if has_dh:
        full["has_dh"] = True
    size = _batch_size(args, dims)
    # Batch axis first everywhere. dgamma/dbeta are per example, so present
    # parameters become groups along the batch axis; absent ones stay
    # placeholders with unbatched outputs.
    rows = _move_to_front(rows, dims[:n_rows], size)
    present = [has_gamma, has_beta][: len(ps)]
    ps = [batching.bdim_at_front(p, b, size) if keep else p
          for p, b, keep in zip(ps, dims[n_rows:n_rows + n_ps], present)]
    extra = _move_to_front(args[n_rows + n_ps:], dims[n_rows + n_ps:], size)
    outs = norm_bwd_p.bind(*rows, *ps, *extra, **full)
    out_dims = [0] + [0 if keep else None for keep in present]
    return outs, out_dims


norm_bwd_p.def_impl(lambda *args, **params: jax.jit(
    lambda *a: norm_bwd_p.bind(*a, **params))(*args))
norm_bwd_p.def_abstract_eval(_bwd_abstract)
_register_lowering(norm_bwd_p, _bwd_lowering)
batching.primitive_batchers[norm_bwd_p] = _bwd_batch
