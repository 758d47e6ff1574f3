"""The primitive families: normalization forward, backward, and row statistics.

Each primitive has, side by side, its abstract evaluation, its batching rule,
and its partitioning rule (how it runs on arrays sharded over a mesh under
``jit``). Every primitive lowers the same way: through
``jax.experimental.custom_partitioning`` to the FFI target of the platform
(CPU or CUDA). On one device, and inside ``shard_map``, that is a plain call of
the kernel; on a sharded array XLA calls the partitioning rule, which picks how
the operands are laid out and what each device runs:

* rows (leading dims) sharded: each device runs the kernel on its rows; the
  only communication is the sum of the dgamma/dbeta partials over the mesh
  axes that split the rows.
* hidden dim sharded: each device computes per-row statistics of its slice
  with a kernel, only those statistics (a few floats a row) are combined over
  the hidden axes, and each device normalizes its own slice. The fused
  residual add + norm does the same on its slice of ``h``. So do the FP8
  outputs with a given per-tensor scale, per-row scales (the maxima of |y|
  combined with pmax) and per-group scales (where each slice holds whole
  groups). Current scaling and an FP8 input split rows only.

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
import os
from functools import partial
from typing import Optional

import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from . import _ffi
from ._compat import compiled_impl, require_devices_during_lowering, tensor_shape, varying_axes, varying_update

RMS = "rms"
LAYER = "layer"

# ---------------------------------------------------------------------------
# helpers shared by all families


def _vma(*avals):
    """Union of the varying axes of some avals."""
    return frozenset().union(*(varying_axes(a) for a in avals))


def _like(aval, vma, shape=None, dtype=None, rows=None):
    """An aval of ``aval``'s kind with a new shape/dtype and the given varying axes.

    With a new shape, the sharding of the first ``rows`` dims (default: all but
    the last) is kept and the other dims are unsharded."""
    kwargs = varying_update(aval, vma)
    if shape is not None and tuple(shape) != tuple(aval.shape):
        sharding = getattr(aval, "sharding", None)
        spec = getattr(sharding, "spec", None)
        if spec is not None:
            keep = len(aval.shape) - 1 if rows is None else rows
            spec = tuple(spec) + (None,) * (len(aval.shape) - len(spec))
            kwargs["sharding"] = sharding.update(
                spec=PartitionSpec(*spec[:keep], *([None] * (len(shape) - keep))))
    return aval.update(shape=aval.shape if shape is None else tuple(shape),
                       dtype=aval.dtype if dtype is None else dtype, **kwargs)


def _with_spec(aval, spec):
    """``aval`` typed as split by ``spec`` (an entry a dim) where its mesh's
    explicit axes give it a type and each split dim divides by its devices;
    else as it is."""
    sharding = getattr(aval, "sharding", None)
    if spec is None or getattr(sharding, "spec", None) is None or getattr(sharding, "mesh", None) is None:
        return aval
    sizes = dict(sharding.mesh.shape)
    for dim, entry in zip(aval.shape, spec):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        if dim % math.prod(sizes[n] for n in names):
            return aval
    return aval.update(sharding=sharding.update(spec=PartitionSpec(*spec)))


def _x_spec(x):
    """x's sharding spec, an entry a dim (None: x has no sharding type)."""
    spec = getattr(getattr(x, "sharding", None), "spec", None)
    return None if spec is None else tuple(spec) + (None,) * (x.ndim - len(spec))


def _placeholder(dtype):
    """An absent operand or output of the kernels (a residual, a scale): (0,)."""
    return jnp.zeros((0,), dtype)


def absent_param(dtype):
    """The operand passed for an absent gamma/beta: one element, never read.
    (A zero-size operand crashes XLA's CPU compiler, JAX 0.11, where shard_map
    runs op by op under disable_jit.) dgamma/dbeta of an absent parameter
    stay (0,)."""
    return jnp.zeros((1,), dtype)


def _batch_size(args, dims):
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def _no_cuda_lowering(ctx, *args, **params):
    raise RuntimeError(
        "jax_rmsnorm was built without its CUDA kernels, so it cannot run on a GPU. "
        "Reinstall it on a machine with nvcc (JAX_RMSNORM_CUDA=ON forces the CUDA build), "
        "or run the computation on the CPU.")


# Operand/result roles, which say how each array is laid out and sharded:
X = "x"   # (rows..., hidden): x, dy, y, dx
R = "r"   # (rows...): mean, rstd
C = "c"   # (rows..., 2): pairs of per-row statistics (LayerNorm's)
P = "p"   # (rows[:k]..., hidden): gamma, beta, dgamma, dbeta
E = "e"   # an absent operand or output: (0,), or (1,) for an absent gamma/beta (absent_param)
S = "s"   # replicated: a per-tensor scale or amax (one per vmapped example)
G = "g"   # (rows..., hidden // group_size): per-group FP8 scales, split with the hidden dim
T = "t"   # (hidden, rows): the per-group output's columnwise copy and its scales, split with the first row dim


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything about one primitive call that is not an array."""
    prim: str
    params: tuple  # sorted (name, value) pairs of the primitive's params
    platform: str

    def __getattr__(self, name):
        for k, v in self.params:
            if k == name:
                return v
        raise AttributeError(name)

    def get(self, name, default=None):
        return dict(self.params).get(name, default)


def _call(target, outs, *operands, **attrs):
    """One FFI call; ``outs`` are (shape, dtype) pairs."""
    return jax.ffi.ffi_call(target, [jax.ShapeDtypeStruct(tuple(s), d) for s, d in outs])(
        *operands, **attrs)


def _param_roles(operands, has):
    return [P if keep else E for keep in has][: len(operands)]


# ---------------------------------------------------------------------------
# forward: (x, gamma[, beta]) -> (y[, mean], rstd)
#      or, with given_stats: (x, gamma[, beta][, mean], rstd) -> (y,)

norm_fwd_p = Primitive("jax_rmsnorm_fwd")
norm_fwd_p.multiple_results = True


def norm_fwd(x, gamma, beta, *, kind, eps, zero_centered_gamma, has_gamma, has_beta,
             mean=None, rstd=None):
    """Binds the forward primitive; returns ``(y, mean, rstd)`` (``mean`` None for RMS).

    With ``rstd`` (and ``mean`` for LayerNorm) given, normalizes with those
    statistics and returns them unchanged."""
    params = dict(kind=kind, eps=float(eps), zero_centered_gamma=bool(zero_centered_gamma),
                  has_gamma=bool(has_gamma), has_beta=bool(has_beta), given_stats=rstd is not None)
    ps = [gamma] if kind == RMS else [gamma, beta]
    if rstd is not None:
        stats = [rstd] if kind == RMS else [mean, rstd]
        (y,) = norm_fwd_p.bind(x, *ps, *stats, **params)
        return y, mean, rstd
    outs = norm_fwd_p.bind(x, *ps, **params)
    return (outs[0], None, outs[1]) if kind == RMS else tuple(outs)


# The fused forward: the forward primitive with ``fused`` set (a FusedSpec).
#
# (x, gamma[, beta], residual, scale, x_scale) -> (y[, mean], rstd, h, qs, qt, qts)
#
# With ``x_group_size``: x is FP8, dequantized in the kernel as x * x_scale
# (x_scale: ``x.shape[:-1] + (hidden // x_group_size,)``, float32), and y is in
# ``out_dtype``. With ``residual``: h = x + residual (in h_dtype) is stored and normalized.
# With ``quant``: y is FP8 (out_dtype); qs is amax (quant "tensor": one per
# tensor, shaped like ``scale``), the row scales (``x.shape[:-1]``), the group
# scales (``x.shape[:-1] + (hidden // group_size,)``), or scale_inv (quant
# "current": shaped like ``scale``, whose values are not read). With ``transpose``
# (quant "current"): qt, y's bytes transposed per tensor, ``scale.shape + (hidden,
# rows per tensor)``, written by the same kernels; (quant "group"): qt
# the columnwise copy, each tensor's float32 y transposed so and quantized along
# its rows in groups of ``group_size`` by the same rule, and qts its scales,
# ``scale.shape + (hidden, rows per tensor // group_size)`` (``scale`` counts
# the tensors: NVFP4's global scales, else values not read). With quant "group" and a
# block-scaled ``group_scale``, qs holds the E8M0 / E4M3 block scales, and for
# NVFP4 ``scale`` the per-tensor global scale. Absent operands and outputs
# are empty placeholders: residual/h of shape (0,), scale/x_scale/qs/qt/qts (0,) float32.

QUANT_CODES = {None: 0, "tensor": 1, "row": 2, "group": 3, "current": 4}

# How quant "group" makes each group's scale (csrc/norm_types.h GroupScale,
# whose rules csrc/norm_fused.h states): float32 amax / fp8_max; that rounded
# up to a power of two; MXFP8's E8M0 scale; NVFP4's E4M3 scale under the
# per-tensor global scale (passed as ``scale``), with E2M1 codes. The
# block-scaled ones write their scales in the dtype of GROUP_SCALE_DTYPES.
GROUP_SCALE_CODES = {"float32": 0, "pow2": 1, "e8m0": 2, "nvfp4": 3}
GROUP_SCALE_DTYPES = {"e8m0": np.dtype(jnp.float8_e8m0fnu), "nvfp4": np.dtype(jnp.float8_e4m3fn)}


@dataclasses.dataclass(frozen=True)
class FusedSpec:
    residual: bool = False
    h_dtype: Optional[np.dtype] = None  # with residual
    quant: Optional[str] = None  # None, "tensor", "row", "group", "current"
    out_dtype: Optional[np.dtype] = None  # y's dtype where it is not x's: FP8 with quant, float with FP8 x
    x_group_size: int = 0  # > 0: x is FP8 with one scale per group of this many columns
    group_size: int = 0  # quant "group"
    scale_ub: float = math.inf  # quant "row"/"group"
    transpose: bool = False  # quant "current": also the transposed copy qt; "group": the columnwise copy
    group_scale: str = "float32"  # quant "group": a key of GROUP_SCALE_CODES

    @property
    def scale_dtype(self):
        """The dtype of the per-row or per-group scales."""
        return GROUP_SCALE_DTYPES.get(self.group_scale, np.dtype(np.float32))

    @property
    def columnwise(self):
        """Whether qt is per-group output's columnwise copy, with its scales qts."""
        return self.transpose and self.quant == "group"

    @property
    def global_scale(self):
        """Whether ``scale`` holds a per-tensor scale the kernel reads: quant
        "tensor"'s, or NVFP4's global scale."""
        return self.quant == "tensor" or self.group_scale == "nvfp4"


def norm_fwd_fused(x, gamma, beta, residual, scale, x_scale, *, kind, eps, zero_centered_gamma, has_gamma,
                   has_beta, fused: FusedSpec, on_hidden_slice: Optional[str] = None):
    """Binds the fused forward; returns ``(y, mean, rstd, h, qs, qt, qts)`` (None where absent).

    ``on_hidden_slice`` (a platform, "cpu" or "cuda"): instead of binding,
    run what each device runs when the hidden dim is split across devices,
    here on these arrays as one slice with no mesh axes (that path's tests
    and benchmark use it on one device)."""
    params = dict(kind=kind, eps=float(eps), zero_centered_gamma=bool(zero_centered_gamma),
                  has_gamma=bool(has_gamma), has_beta=bool(has_beta), given_stats=False, fused=fused)
    if residual is None:
        residual = _placeholder(fused.out_dtype if fused.x_group_size else x.dtype)
    if scale is None:
        scale = _placeholder(np.float32)
    if x_scale is None:
        x_scale = _placeholder(np.float32)
    ps = [gamma] if kind == RMS else [gamma, beta]
    if on_hidden_slice is not None:
        st = _Static("fwd", tuple(sorted(params.items())), on_hidden_slice)
        outs = _fwd_sharded(st, (), x.shape[-1], x, *ps, residual, scale, x_scale)
    else:
        outs = norm_fwd_p.bind(x, *ps, residual, scale, x_scale, **params)
    if kind == RMS:
        y, rstd, h, qs, qt, qts = outs
        mean = None
    else:
        y, mean, rstd, h, qs, qt, qts = outs
    return (y, mean, rstd, (h if fused.residual else None), (qs if fused.quant else None),
            (qt if fused.transpose else None), (qts if fused.columnwise else None))


def _fwd_roles(kind, has_gamma, has_beta, given_stats, fused=None, **_):
    params = [P if has_gamma else E] + ([] if kind == RMS else [P if has_beta else E])
    stats = [R] if kind == RMS else [R, R]
    if fused is not None:
        h = X if fused.residual else E
        qs = {None: E, "tensor": S, "current": S, "row": R, "group": G}[fused.quant]
        # qt, qts: current scaling's transposed copy takes whole tensors (never
        # split), like a placeholder; the columnwise copy splits with the rows.
        qt = T if fused.columnwise else E
        return [X, *params, h, S, C if fused.x_group_size else E], [X, *stats, h, qs, qt, qt]
    operands = [X, *params, *(stats if given_stats else [])]
    return operands, [X] if given_stats else [X, *stats]


def _fwd_abstract(x, *rest, kind, given_stats, fused=None, **_):
    if fused is not None:
        return _fwd_fused_abstract(x, *rest, kind=kind, fused=fused)
    vma = _vma(x, *rest)
    y = _like(x, vma)
    if given_stats:
        return [y]
    stat = _like(x, vma, shape=x.shape[:-1], dtype=np.float32)
    return [y, stat] if kind == RMS else [y, stat, stat]


def _fwd_fused_abstract(x, *rest, kind, fused):
    residual, scale, _ = rest[-3:]
    vma = _vma(x, *rest)
    outs = [_like(x, vma, dtype=fused.out_dtype)]
    stat = _like(x, vma, shape=x.shape[:-1], dtype=np.float32)
    outs += [stat] if kind == RMS else [stat, stat]
    outs.append(_like(x, vma, dtype=fused.h_dtype) if fused.residual else _like(residual, vma))
    if fused.quant == "row":
        outs.append(stat)
    elif fused.quant == "group":
        # Split with the hidden dim (whole groups a slice) as the kernels make them.
        scales = _like(x, vma, shape=x.shape[:-1] + (x.shape[-1] // fused.group_size,),
                       dtype=fused.scale_dtype, rows=x.ndim - 1)
        outs.append(_with_spec(scales, _x_spec(x)))
    else:  # amax / scale_inv are shaped like scale; without quantization both are placeholders
        outs.append(_like(scale, vma))
    rows = x.size // x.shape[-1] // max(math.prod(scale.shape), 1)  # a tensor's rows per scale
    # The columnwise copy (hidden, rows) and its scales: the rows split as x's
    # (whole blocks a device, as the kernels make them), the hidden dim whole.
    x_spec = _x_spec(x)
    rows_split = None if x.ndim != 2 or scale.shape or x_spec is None else (None, x_spec[0])
    if fused.transpose:
        outs.append(_with_spec(_like(x, vma, shape=scale.shape + (x.shape[-1], rows), dtype=fused.out_dtype,
                                     rows=0), rows_split))
    else:
        outs.append(_like(scale, vma, shape=(0,)))
    if fused.columnwise:
        outs.append(_with_spec(_like(x, vma, shape=scale.shape + (x.shape[-1], rows // fused.group_size),
                                     dtype=fused.scale_dtype, rows=0), rows_split))
    else:
        outs.append(_like(scale, vma, shape=(0,)))
    return outs


def _fwd_local(st, x, *rest):
    """The forward on one device's arrays (the whole row present)."""
    attrs = dict(zero_centered_gamma=st.zero_centered_gamma, has_gamma=st.has_gamma)
    stat = (x.shape[:-1], np.float32)
    if st.kind == LAYER:
        attrs["has_beta"] = st.has_beta
    fused = st.get("fused")
    if fused is not None:
        avals = [jax.core.ShapedArray(a.shape, a.dtype) for a in (x, *rest)]
        outs = _fwd_fused_abstract(*avals, kind=st.kind, fused=fused)
        attrs.update(has_residual=fused.residual, quant=np.int32(QUANT_CODES[fused.quant]),
                     group_size=np.int64(fused.group_size), scale_ub=np.float32(fused.scale_ub),
                     x_group_size=np.int64(fused.x_group_size),
                     group_scale=np.int32(GROUP_SCALE_CODES[fused.group_scale]))
        target = "jrn_rms_norm_fwd_fused" if st.kind == RMS else "jrn_layer_norm_fwd_fused"
        # A workspace of the columnwise copy's scales' size where the GPU's
        # kernel writes them by rows, then transposes them; else empty. It is
        # sized for every such call: whether fwd_tiles or fwd_columns runs is
        # the plan's choice at run time (buffer alignment among its tests).
        qts = outs[-1]
        by_rows = st.platform == "cuda" and fused.columnwise and _ffi.qt_scales_workspace(fused.group_scale)
        ws = qts.size * np.dtype(qts.dtype).itemsize if by_rows else 0  # bytes
        results = [(o.shape, o.dtype) for o in outs] + [((ws,), np.uint8)]
        return _call(target, results, x, *rest, eps=np.float32(st.eps), **attrs)[:-1]
    if st.given_stats:
        target = "jrn_rms_norm_apply" if st.kind == RMS else "jrn_layer_norm_apply"
        return _call(target, [(x.shape, x.dtype)], x, *rest, **attrs)
    target = "jrn_rms_norm_fwd" if st.kind == RMS else "jrn_layer_norm_fwd"
    n_stats = 1 if st.kind == RMS else 2
    return _call(target, [(x.shape, x.dtype)] + [stat] * n_stats, x, *rest,
                 eps=np.float32(st.eps), **attrs)


def combine_stats(kind, stats, axes, hidden, slice_len, eps):
    """(mean or None, rstd) of whole rows from per-slice statistics (as
    :func:`norm_stats` returns them) of the ``slice_len``-wide slices held by
    the devices along mesh ``axes``."""
    if kind == RMS:
        ss = jax.lax.psum(stats, axes) if axes else stats
        return None, jax.lax.rsqrt(ss / hidden + eps)
    gathered = jax.lax.all_gather(stats, axes) if axes else stats[None]
    mean, m2 = merge_layer_stats(gathered, slice_len)
    return mean, jax.lax.rsqrt(m2 / hidden + eps)


def merge_layer_stats(gathered, slice_len):
    """Merges per-slice (mean, m2) pairs of equal ``slice_len``-wide slices,
    stacked on axis 0, into the whole row's (mean, m2): the exact
    parallel-variance formula, with no cancellation."""
    means, m2s = gathered[..., 0], gathered[..., 1]
    mean = jnp.mean(means, axis=0, keepdims=True)  # keepdims: no rank promotion (jax_numpy_rank_promotion)
    return mean[0], jnp.sum(m2s, axis=0) + jnp.sum(jnp.square(means - mean), axis=0) * slice_len


def hidden_splittable(fused, slice_len) -> bool:
    """Whether a fused forward can run on ``slice_len``-wide slices of the
    hidden dim: a float ``x`` with the residual add and/or an FP8 output with a
    given per-tensor scale, per-row scales, or per-group scales where a slice
    holds whole groups. Current scaling, an FP8 ``x`` and a transposed copy
    split rows only."""
    if fused.x_group_size or fused.quant == "current" or fused.transpose:
        return False
    return fused.quant != "group" or slice_len % fused.group_size == 0


def _fwd_sharded(st, axes, hidden, x, *rest, slice_stats=None):
    """The forward on one device's slice of the hidden dim (split over ``axes``).
    ``slice_stats``: the plain norm's statistics of the slice, if already taken."""
    if st.given_stats:
        return _fwd_local(st, x, *rest)
    fused = st.get("fused")
    if fused is not None and fused.quant is not None:
        return _fwd_quant_sharded(st, axes, hidden, x, *rest)
    if fused is not None:
        return _fwd_add_sharded(st, axes, hidden, x, *rest)
    if slice_stats is None:
        slice_stats = _stats_kernel(st.kind, x)
    mean, rstd = combine_stats(st.kind, slice_stats, axes, hidden, x.shape[-1], st.eps)
    (y,) = _fwd_local(_with(st, given_stats=True), x, *rest, *([rstd] if st.kind == RMS else [mean, rstd]))
    return [y, rstd] if st.kind == RMS else [y, mean, rstd]


def residual_sum(x, residual, h_dtype):
    """``h = x + residual`` as the fused kernels make it: summed in float32,
    stored in ``h_dtype``."""
    return (x.astype(np.float32) + residual.astype(np.float32)).astype(h_dtype)


def kernel_params(x, gamma, beta=None):
    """gamma and beta (present, placeholders or None) as the kernels on ``x``
    take them: both in x's dtype or both in float32. Parameters that are not
    (a bf16 gamma of a float32 x or h, unlike dtypes of gamma and beta) are
    widened to float32, exactly; the cast's own gradient brings dgamma/dbeta
    back in each one's dtype."""
    present = [p for p in (gamma, beta) if p is not None]
    dtypes = {np.dtype(p.dtype) for p in present}
    if len(dtypes) <= 1 and dtypes <= {np.dtype(np.float32), np.dtype(x.dtype)}:
        return gamma, beta
    widen = lambda p: None if p is None else p.astype(np.float32)
    return widen(gamma), widen(beta)


def _fwd_add_sharded(st, axes, hidden, x, *rest):
    """The residual add + norm on one device's slice of the hidden dim: ``h``
    and the statistics of the slice of ``h`` in one pass (``*_add_stats``),
    the statistics combined over ``axes``, then ``h`` normalized with them.
    Two passes over the slice instead of the fused kernel's one, but only
    per-row statistics cross devices."""
    n_params = 1 if st.kind == RMS else 2
    params, (residual, placeholder) = rest[:n_params], rest[n_params:n_params + 2]
    slice_stats, h = _add_stats_kernel(st.kind, x, residual, st.fused.h_dtype)
    y, *stats = _fwd_sharded(_with(st, fused=None), axes, hidden, h, *kernel_params(h, *params)[:n_params],
                             slice_stats=slice_stats)
    return [y.astype(x.dtype), *stats, h, placeholder, _placeholder(np.float32), _placeholder(np.float32)]


# The smallest per-row / per-group FP8 scale (all-zero rows quantize to zeros).
MIN_QUANT_SCALE = 1e-12


def _apply_fp8(st, x, params, stats, scale, quant, *, inverted=False, measure=False):
    """The ``*_apply_fp8`` kernel on one device's slice: ``x`` normalized with
    the given statistics and written as FP8. quant "tensor": ``q = y *
    scale[t]`` (``y / scale[t]`` if ``inverted``) for each of ``scale.size``
    tensors of consecutive rows (one per row for per-row scales), and each
    tensor's max |y|; with ``measure`` only the maxima (``q`` is empty).
    quant "group": ``q`` and the scales of the slice's groups."""
    fused = st.fused
    qs = (scale.shape, np.float32) if quant == "tensor" else (
        x.shape[:-1] + (x.shape[-1] // fused.group_size,), fused.scale_dtype)
    attrs = dict(zero_centered_gamma=st.zero_centered_gamma, has_gamma=st.has_gamma)
    if st.kind == LAYER:
        attrs["has_beta"] = st.has_beta
    target = "jrn_rms_norm_apply_fp8" if st.kind == RMS else "jrn_layer_norm_apply_fp8"
    return _call(target, [((0,) if measure else x.shape, fused.out_dtype), qs], x, *params, *stats, scale,
                 quant=np.int32(QUANT_CODES[quant]), group_size=np.int64(fused.group_size),
                 scale_ub=np.float32(fused.scale_ub), inverted=inverted, measure=measure,
                 group_scale=np.int32(GROUP_SCALE_CODES[fused.group_scale if quant == "group" else "float32"]),
                 **attrs)


def _fwd_quant_sharded(st, axes, hidden, x, *rest):
    """An FP8 output (after the residual add, if any) on one device's slice of
    the hidden dim: the slice's statistics kernel, the statistics combined over
    ``axes``, then the slice normalized and quantized by ``*_apply_fp8``. With
    a given per-tensor scale, amax is combined over ``axes`` by pmax; per-group
    scales are the slice's own (the slice holds whole groups). Per-row scales
    need each row's max |y| first: a pass of the kernel that measures it, the
    maxima combined by pmax, then the pass that quantizes. Only per-row values
    cross devices."""
    fused = st.fused
    n_params = 1 if st.kind == RMS else 2
    params, (residual, scale, _) = rest[:n_params], rest[n_params:n_params + 3]
    if fused.residual:
        slice_stats, h = _add_stats_kernel(st.kind, x, residual, fused.h_dtype)
    else:
        slice_stats, h = _stats_kernel(st.kind, x), x
    params = list(kernel_params(h, *params)[:n_params])
    mean, rstd = combine_stats(st.kind, slice_stats, axes, hidden, h.shape[-1], st.eps)
    stats = [rstd] if st.kind == RMS else [mean, rstd]
    pmax = lambda v: jax.lax.pmax(v, axes) if axes else v
    if fused.quant == "tensor":
        q, amax = _apply_fp8(st, h, params, stats, scale, "tensor")
        qs = pmax(amax)
    elif fused.quant == "group":
        q, qs = _apply_fp8(st, h, params, stats, scale, "group")
    else:
        _, row_max = _apply_fp8(st, h, params, stats, jnp.ones(h.shape[:-1], np.float32), "tensor",
                                measure=True)
        # the kernels' row scale: max(min(max|y| / fp8_max, scale_ub), MIN_QUANT_SCALE)
        fmax = float(jnp.finfo(fused.out_dtype).max)
        qs = jnp.maximum(jnp.minimum(pmax(row_max) / np.float32(fmax), np.float32(fused.scale_ub)),
                         np.float32(MIN_QUANT_SCALE))
        q, _ = _apply_fp8(st, h, params, stats, qs, "tensor", inverted=True)
    return [q, *stats, h if fused.residual else residual, qs, _placeholder(np.float32), _placeholder(np.float32)]


def _fwd_fused_batch(args, dims, *, kind, has_gamma, has_beta, fused, **params):
    # Batch axis first for x, the residual and (per tensor) the scale. Per-
    # example parameters become groups; a batched tensor scale gives one amax
    # per example (an unbatched one is broadcast: still one amax per example).
    n_params = 1 if kind == RMS else 2
    x, ps, (residual, scale, x_scale) = args[0], list(args[1:1 + n_params]), args[1 + n_params:]
    bx, bps, (br, bs, bxs) = dims[0], dims[1:1 + n_params], dims[1 + n_params:]
    size = _batch_size(args, dims)
    x = batching.bdim_at_front(x, bx, size)
    if fused.residual:
        residual = batching.bdim_at_front(residual, br, size)
    if fused.x_group_size:
        x_scale = batching.bdim_at_front(x_scale, bxs, size)
    if fused.quant == "current" or fused.global_scale or fused.columnwise:
        scale = batching.bdim_at_front(scale, bs, size)
    if any(b is not None for b in bps):
        present = [has_gamma, has_beta][:n_params]
        ps = [batching.bdim_at_front(p, b, size) if keep else p for p, b, keep in zip(ps, bps, present)]
    outs = norm_fwd_p.bind(x, *ps, residual, scale, x_scale, kind=kind, has_gamma=has_gamma,
                           has_beta=has_beta, fused=fused, **params)
    n_stats = 1 if kind == RMS else 2
    out_dims = [0] * (1 + n_stats) + [0 if fused.residual else None, 0 if fused.quant else None,
                                      0 if fused.transpose else None, 0 if fused.columnwise else None]
    return outs, out_dims


def _fwd_batch(args, dims, *, kind, has_gamma, has_beta, given_stats, fused=None, **params):
    if fused is not None:
        return _fwd_fused_batch(args, dims, kind=kind, has_gamma=has_gamma, has_beta=has_beta,
                                given_stats=given_stats, fused=fused, **params)
    full = dict(kind=kind, has_gamma=has_gamma, has_beta=has_beta, given_stats=given_stats, **params)
    n_params = 1 if kind == RMS else 2
    x, ps = args[0], list(args[1:1 + n_params])
    bx, bps = dims[0], dims[1:1 + n_params]
    if not given_stats and all(b is None for b in bps):
        # Shared parameters: the batch axis is one more row axis, unless it is last.
        if bx == x.ndim - 1:
            x, bx = jnp.moveaxis(x, bx, 0), 0
        outs = norm_fwd_p.bind(x, *ps, **full)
        return outs, [bx] * len(outs)
    return _batch_front(norm_fwd_p, args, dims, _fwd_roles(**full)[0], full)


def _batch_front(prim, args, dims, roles, params, out_roles=()):
    """Batching by moving the batch axis to the front of every operand: rows
    operands are broadcast to it; present parameters too, which makes them
    parameter groups (one per example); placeholders stay as they are, and
    so do the placeholder outputs (``out_roles`` E: an absent dbeta)."""
    size = _batch_size(args, dims)
    moved = [a if role == E else batching.bdim_at_front(a, d, size)
             for a, d, role in zip(args, dims, roles)]
    outs = prim.bind(*moved, **params)
    out_roles = list(out_roles) + [X] * (len(outs) - len(out_roles))
    return outs, [None if role == E else 0 for role in out_roles]


# ---------------------------------------------------------------------------
# backward: (dy, x[, mean], rstd, gamma[, beta][, coef]) -> (dx, dgamma[, dbeta])
#
# ``beta`` is an operand for its shape and dtype only (dbeta is shaped like it);
# the kernels never read it. For RMSNorm it is absent. ``coef`` (has_coef) holds
# the per-row mean(gdy * xhat) of whole rows (RMSNorm: shaped like rstd) or
# (mean(gdy * xhat), mean(gdy)) (LayerNorm: rows..., 2), for a device that
# holds a slice of the hidden dim.

norm_bwd_p = Primitive("jax_rmsnorm_bwd")
norm_bwd_p.multiple_results = True

def norm_bwd(dy, x, mean, rstd, gamma, beta, *, kind, zero_centered_gamma, has_gamma, has_beta,
             coef=None, dh=None):
    """Binds the backward primitive; returns ``(dx, dgamma, dbeta)`` (``dbeta`` None for RMS).

    ``coef``: the rows' coefficients, given (the hidden dim split across
    devices); ``dh`` (fused residual add: like ``x``) is added to ``dx`` in the
    kernel."""
    params = dict(kind=kind, zero_centered_gamma=bool(zero_centered_gamma),
                  has_gamma=bool(has_gamma), has_beta=bool(has_beta), has_coef=coef is not None,
                  has_dh=dh is not None)
    extra = [a for a in (coef, dh) if a is not None]
    if kind == RMS:
        dx, dgamma = norm_bwd_p.bind(dy, x, rstd, gamma, *extra, **params)
        return dx, dgamma, None
    return tuple(norm_bwd_p.bind(dy, x, mean, rstd, gamma, beta, *extra, **params))


def _bwd_roles(kind, has_gamma, has_beta, has_coef, has_dh, **_):
    stats = [R] if kind == RMS else [R, R]
    params = [P if has_gamma else E] + ([] if kind == RMS else [P if has_beta else E])
    operands = [X, X, *stats, *params, *([_row_stats_role(kind)] if has_coef else []), *([X] if has_dh else [])]
    return operands, [X, *params]


def _param_grad_shapes(ps, has):
    """(shape, dtype) of dgamma (dbeta): the parameter's, (0,) where it is absent."""
    return [(p.shape if present else (0,), p.dtype) for p, present in zip(ps, has)]


def _bwd_abstract(dy, x, *rest, kind, has_gamma, has_beta, has_coef, has_dh, **_):
    vma = _vma(dy, x, *rest)
    ps = rest[:len(rest) - int(has_coef) - int(has_dh)][-(1 if kind == RMS else 2):]
    return [_like(x, vma)] + [_like(p, vma, shape=shape) for p, (shape, _) in
                              zip(ps, _param_grad_shapes(ps, (has_gamma, has_beta)))]


def _bwd_local(st, dy, x, *rest):
    """The backward on one device's arrays; ``coef`` or ``dh`` (if any) is the last operand."""
    n_stats = 1 if st.kind == RMS else 2
    stats = rest[:n_stats]
    ps = rest[n_stats:n_stats + (1 if st.kind == RMS else 2)]
    extra = list(rest[n_stats + len(ps):])  # coef or dh: after gamma for the kernels
    gamma = ps[0]
    param_outs = _param_grad_shapes(ps, (st.has_gamma, st.has_beta))
    hidden = x.shape[-1]
    outputs = int(st.has_gamma) + int(st.kind == LAYER and st.has_beta)
    n_floats = 0
    if st.platform == "cuda" and outputs and x.size:
        shaped = ps[0] if st.has_gamma or st.kind == RMS else ps[1]
        groups = math.prod(shaped.shape[:-1])
        rows = math.prod(x.shape[:-1])
        n_floats = groups * outputs * hidden * _ffi.cuda_slots(
            st.kind, x.dtype, rows // max(groups, 1), hidden, outputs)
    attrs = dict(zero_centered_gamma=st.zero_centered_gamma, has_gamma=st.has_gamma)
    if st.kind == LAYER:
        attrs["has_beta"] = st.has_beta
    base = "jrn_rms_norm_bwd" if st.kind == RMS else "jrn_layer_norm_bwd"
    target = base + ("_given" if st.has_coef else "") + ("_add" if st.has_dh else "")
    outs = _call(target, [(x.shape, x.dtype), *param_outs, ((n_floats,), np.float32)],
                 dy, x, *stats, gamma, *extra, **attrs)
    return outs[:-1]  # the workspace is scratch


def _bwd_sharded(st, axes, hidden, dy, x, *rest):
    """The backward on one device's slice of the hidden dim: the row sums it
    needs are combined over ``axes`` first."""
    if st.has_coef:
        return _bwd_local(st, dy, x, *rest)
    n_stats = 1 if st.kind == RMS else 2
    stats, ps = rest[:n_stats], rest[n_stats:]
    mean = stats[0] if st.kind == LAYER else None
    sums = _grad_stats_kernel(st, dy, x, mean, stats[-1], ps[0])
    coef = jax.lax.psum(sums, axes) / hidden
    # The coefficients go before the residual's gradient (if any).
    dh = [rest[-1]] if st.has_dh else []
    return _bwd_local(_with(st, has_coef=True), dy, x, *rest[:len(rest) - len(dh)], coef, *dh)


def _bwd_batch(args, dims, **params):
    roles_in, roles_out = _bwd_roles(**params)
    return _batch_front(norm_bwd_p, args, dims, roles_in, params, roles_out)


# ---------------------------------------------------------------------------
# row statistics of x:    x -> sum(x^2) (RMS) or (mean, sum((x - mean)^2)) (Layer)
# row statistics of dy:   (dy, x[, mean], rstd, gamma) -> sum(gdy * xhat) (RMS) or
#                         (sum(gdy * xhat), sum(gdy)) (Layer): what the backward needs

norm_stats_p = Primitive("jax_rmsnorm_stats")
norm_stats_p.multiple_results = True


def norm_stats(x, *, kind, residual=None, h_dtype=None):
    """Per-row statistics of ``x`` over its last axis (see the section title).
    With ``residual``: ``(statistics of h, h)``, ``h = x + residual`` summed in
    float32 and stored in ``h_dtype``, in one pass."""
    params = dict(kind=kind, grad=False, zero_centered_gamma=False, has_gamma=False)
    if residual is None:
        return norm_stats_p.bind(x, **params, h_dtype=None)[0]
    return tuple(norm_stats_p.bind(x, residual, **params, h_dtype=np.dtype(h_dtype)))


def norm_grad_stats(dy, x, mean, rstd, gamma, *, kind, zero_centered_gamma, has_gamma):
    """Per-row gradient sums, float32: ``sum(gdy * xhat)`` shaped ``x.shape[:-1]``
    (RMSNorm), or ``(sum(gdy * xhat), sum(gdy))`` shaped ``x.shape[:-1] + (2,)``
    (LayerNorm)."""
    stats = [rstd] if kind == RMS else [mean, rstd]
    return norm_stats_p.bind(dy, x, *stats, gamma, kind=kind, grad=True, h_dtype=None,
                             zero_centered_gamma=bool(zero_centered_gamma), has_gamma=bool(has_gamma))[0]


def _row_stats_role(kind):
    """Per-row statistics, of x or of the gradient, and the backward's given
    coefficients: one float a row for RMSNorm, a pair for LayerNorm."""
    return R if kind == RMS else C


def _row_stats_shape(kind, x):
    """The shape of ``x``'s per-row statistics (see _row_stats_role)."""
    return x.shape[:-1] + ((2,) if kind == LAYER else ())


def _stats_roles(kind, grad, has_gamma, h_dtype, **_):
    if not grad and h_dtype is not None:  # (x, residual) -> (statistics of h, h)
        return [X, X], [_row_stats_role(kind), X]
    if not grad:
        return [X], [_row_stats_role(kind)]
    return [X, X, *([R] if kind == RMS else [R, R]), P if has_gamma else E], [_row_stats_role(kind)]


def _stats_abstract(*args, kind, grad, h_dtype, **_):
    x = args[1] if grad else args[0]
    stats = _like(x, _vma(*args), shape=_row_stats_shape(kind, x), dtype=np.float32, rows=x.ndim - 1)
    return [stats] + ([] if h_dtype is None else [_like(x, _vma(*args), dtype=h_dtype)])


def _stats_kernel(kind, x):
    target = "jrn_rms_norm_stats" if kind == RMS else "jrn_layer_norm_stats"
    return _call(target, [(_row_stats_shape(kind, x), np.float32)], x)[0]


def _add_stats_kernel(kind, x, residual, h_dtype):
    """(statistics of h, h): h = x + residual as :func:`residual_sum` makes it."""
    target = "jrn_rms_norm_add_stats" if kind == RMS else "jrn_layer_norm_add_stats"
    return tuple(_call(target, [(_row_stats_shape(kind, x), np.float32), (x.shape, h_dtype)], x, residual))


def _grad_stats_kernel(st, dy, x, mean, rstd, gamma):
    stats = [rstd] if st.kind == RMS else [mean, rstd]
    target = "jrn_rms_norm_grad_stats" if st.kind == RMS else "jrn_layer_norm_grad_stats"
    return _call(target, [(_row_stats_shape(st.kind, x), np.float32)], dy, x, *stats, gamma,
                 zero_centered_gamma=st.zero_centered_gamma, has_gamma=st.has_gamma)[0]


def _stats_local(st, *args):
    if not st.grad and st.h_dtype is not None:
        return list(_add_stats_kernel(st.kind, *args, st.h_dtype))
    if not st.grad:
        return [_stats_kernel(st.kind, args[0])]
    dy, x, *rest = args
    mean = rest[0] if st.kind == LAYER else None
    return [_grad_stats_kernel(st, dy, x, mean, rest[-2], rest[-1])]


def _stats_sharded(st, axes, hidden, *args):
    """Statistics of whole rows from a slice of the hidden dim: sums are added
    over ``axes``; LayerNorm's (mean, m2) pairs are gathered and merged."""
    local, *h = _stats_local(st, *args)
    if st.grad or st.kind == RMS:
        return [jax.lax.psum(local, axes), *h]
    mean, m2 = merge_layer_stats(jax.lax.all_gather(local, axes), args[0].shape[-1])
    return [jnp.stack([mean, m2], axis=-1), *h]


def _stats_batch(args, dims, **params):
    return _batch_front(norm_stats_p, args, dims, _stats_roles(**params)[0], params)


# ---------------------------------------------------------------------------
# partitioning: one rule for all three families, driven by the roles above


_FAMILIES = {
    "fwd": (_fwd_roles, _fwd_local, _fwd_sharded),
    "bwd": (_bwd_roles, _bwd_local, _bwd_sharded),
    "stats": (_stats_roles, _stats_local, _stats_sharded),
}


def _with(st, **changes):
    params = dict(st.params)
    params.update(changes)
    return _Static(st.prim, tuple(sorted(params.items())), st.platform)


def _axes_of(entry):
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _spec_of(shape_info):
    sharding = getattr(shape_info, "sharding", None)
    spec = tuple(getattr(sharding, "spec", ()) or ())
    return spec + (None,) * (len(shape_info.shape) - len(spec))


def _layout(st, mesh, arg_infos, result_infos):
    """How to shard one call: (row entries, hidden entry, operand and result
    shardings). Takes the row and hidden sharding of the first (rows, hidden)
    operand; a dim is sharded only where its size divides evenly."""
    roles_in, roles_out = _FAMILIES[st.prim][0](**dict(st.params))
    first = arg_infos[roles_in.index(X)]
    spec = _spec_of(first)

    def fits(entry, size):
        n = math.prod(mesh.shape[a] for a in _axes_of(entry))
        return entry if entry is not None and size % n == 0 else None

    rows = tuple(fits(e, n) for e, n in zip(spec[:-1], first.shape[:-1]))
    hidden = fits(spec[-1], first.shape[-1])
    fused = st.get("fused")
    if fused is not None:
        # Current scaling, an FP8 x, and per-group scales whose groups a split
        # would cut split rows only (the hidden dim is gathered). A scale from
        # a whole tensor's amax (current scaling, or a per-tensor scale per
        # vmapped example) and a transposed copy (a whole tensor's columns)
        # need all of the tensor's rows on every device.
        n_hidden = math.prod(mesh.shape[a] for a in _axes_of(hidden))
        if not hidden_splittable(fused, first.shape[-1] // n_hidden):
            hidden = None
        scale = arg_infos[-2]
        if fused.quant == "current" or (fused.transpose and not _columns_split(fused, mesh, rows, first.shape, scale.shape)) or (
                fused.global_scale and scale.shape):
            rows = (None,) * len(rows)

    def spec_for(role, info_shape):
        if role == X:
            return PartitionSpec(*rows, hidden)
        if role == R:
            return PartitionSpec(*rows)
        if role == C:
            return PartitionSpec(*rows, None)
        if role == G:
            return PartitionSpec(*rows, hidden)
        if role == P:
            return PartitionSpec(*rows[:len(info_shape) - 1], hidden)
        if role == T:  # (hidden, rows): the rows split as x's first row dim is
            return PartitionSpec(*([None] * (len(info_shape) - 1)), rows[0] if rows else None)
        return PartitionSpec(*([None] * len(info_shape)))

    ins = [NamedSharding(mesh, spec_for(r, a.shape)) for r, a in zip(roles_in, arg_infos)]
    outs = [NamedSharding(mesh, spec_for(r, a.shape)) for r, a in zip(roles_out, result_infos)]
    return rows, hidden, ins, outs


def _columns_split(fused, mesh, rows, shape, scale_shape):
    """Whether the columnwise copy can be made where the rows lie: of one
    tensor (``scale`` not vmapped), split along x's first row dim only (so each
    device's rows are a contiguous run of the flattened rows, and of q_t's
    last dim), each device holding whole blocks of rows."""
    if not fused.columnwise or scale_shape or not rows or rows[0] is None or any(e is not None for e in rows[1:]):
        return False
    n = math.prod(mesh.shape[a] for a in _axes_of(rows[0]))
    return (math.prod(shape[:-1]) // n) % fused.group_size == 0


def _partition(st, mesh, arg_infos, result_infos):
    _, local, sharded = _FAMILIES[st.prim]
    rows, hidden, ins, outs = _layout(st, mesh, arg_infos, result_infos)
    roles_in, roles_out = _FAMILIES[st.prim][0](**dict(st.params))
    hidden_axes = _axes_of(hidden)
    full_hidden = arg_infos[roles_in.index(X)].shape[-1]
    # dgamma/dbeta are sums over rows: add the partials of the devices that
    # split the rows (not those that split the parameter groups).
    n_groups = [len(a.shape) - 1 for r, a in zip(roles_in, arg_infos) if r == P]
    group_dims = n_groups[0] if n_groups else 0
    row_axes = tuple(a for e in rows[group_dims:] for a in _axes_of(e))
    all_row_axes = tuple(a for e in rows for a in _axes_of(e))

    # The per-device function runs with every mesh axis manual. JAX 0.11 traces
    # it under the caller's mesh instead; with Explicit axes the collectives'
    # reduction bodies then carry sharding annotations that XLA's GPU backend
    # rejects (a CHECK failure in all_reduce_thunk), so the manual mesh is set
    # here explicitly.
    manual = mesh.abstract_mesh.update_axis_types({a: AxisType.Manual for a in mesh.axis_names})

    def lower(*args):
        with jax.sharding.use_abstract_mesh(manual):
            return _lower(*args)

    def _lower(*args):
        if hidden_axes:
            results = sharded(st, hidden_axes, full_hidden, *args)
        else:
            results = local(st, *args)
        results = list(results)
        for i, r in enumerate(roles_out):
            if r == P and row_axes and st.prim == "bwd":
                results[i] = jax.lax.psum(results[i], row_axes)
            if r == S and all_row_axes and st.get("fused").quant == "tensor":  # amax of the whole tensor
                results[i] = jax.lax.pmax(results[i], all_row_axes)
        return results

    return mesh, lower, outs, tuple(ins)


def _infer(st, mesh, arg_infos, result_infos):
    return _layout(st, mesh, arg_infos, result_infos)[3]


def _sharding_rule(st, mesh, operand_types, result_types):
    """The einsum-like rule Shardy propagates shardings with: rows dims r0..,
    the hidden dim h, and a factor of its own for each pair or scale dim and
    each placeholder dim. With per-group scales the hidden dim is the compound
    ``(h k)``: h groups of k columns, the scales' last dim h, so that a split
    of the hidden dim keeps groups whole."""
    roles_in, roles_out = _FAMILIES[st.prim][0](**dict(st.params))
    ranks_in = [len(tensor_shape(t)) for t in operand_types]
    ranks_out = [len(tensor_shape(t)) for t in result_types]
    n_rows = ranks_in[roles_in.index(X)] - 1
    rows = [f"r{i}" for i in range(n_rows)]
    fresh = iter(range(1 << 20))
    fused = st.get("fused")
    # The compound factor only where any split of the hidden dim over mesh
    # axes falls on whole groups: Shardy would otherwise split h over parts
    # of an axis, which JAX's partitioner cannot express. Elsewhere the scales
    # take a factor of their own (a split of them is then gathered after the
    # call, a few bytes a group).
    grouped = fused is not None and fused.quant == "group"
    if grouped:
        hidden_size = tensor_shape(operand_types[roles_in.index(X)])[-1]
        grouped = (hidden_size // fused.group_size) % math.prod(mesh.shape.values()) == 0
    hidden = "(h k)" if grouped else "h"
    # The columnwise copy of rank-2 x: the rows are the compound (r0 b), b
    # rows a block, so that q_t's scales (hidden, rows / b) split with them.
    # Only where any split of the rows over the mesh falls on whole blocks, as
    # for (h k).
    columns = fused is not None and fused.columnwise and n_rows == 1
    if columns:
        n_blocks = tensor_shape(operand_types[roles_in.index(X)])[0] // fused.group_size
        columns = n_blocks % math.prod(mesh.shape.values()) == 0
    if columns:
        rows = ["(r0 b)"]

    def factors(role, rank):
        if role == X:
            return rows + [hidden]
        if role == R:
            return list(rows)
        if role == C:  # never split: a factor of its own
            return rows + [f"c{next(fresh)}"]
        if role == G:
            return rows + (["h"] if grouped else [f"g{next(fresh)}"])
        if role == P:
            return rows[:rank - 1] + [hidden]
        if role == T and columns and rank == 2:  # (hidden, rows) and (hidden, rows / b)
            return [f"e{next(fresh)}", rows[0] if next(t_seen) == 0 else "r0"]
        return [f"e{next(fresh)}" for _ in range(rank)]

    t_seen = iter(range(2))  # q_t, then its scales
    side = lambda roles, ranks: ", ".join(" ".join(factors(r, n)) for r, n in zip(roles, ranks))
    rule = f"{side(roles_in, ranks_in)} -> {side(roles_out, ranks_out)}"
    # k and b are never split: a split of the hidden dim (the rows) then falls
    # on h (r0) alone.
    sizes, replicated = {}, ()
    if grouped:
        sizes["k"], replicated = fused.group_size, replicated + ("k",)
    if columns:
        sizes["b"], replicated = fused.group_size, replicated + ("b",)
    replicated = tuple(sorted(replicated, key=rule.index))  # in the order the rule names them
    return (rule, dict(sizes, need_replication_factors=replicated)) if sizes else rule


def _make_partitioned(prim_name):
    _, local, _ = _FAMILIES[prim_name]

    def body(st, *args):
        return local(st, *args)

    fn = custom_partitioning(body, static_argnums=(0,))
    fn.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                     sharding_rule=_sharding_rule)
    return fn


def _register(prim, family, abstract, batch):
    partitioned = _make_partitioned(family)

    def lowering(platform):
        def rule(ctx, *args, **params):
            st = _Static(family, tuple(sorted(params.items())), platform)
            return mlir.lower_fun(partial(partitioned, st), multiple_results=True)(ctx, *args)
        return rule

    def cuda_rule(ctx, *args, **params):
        return (lowering("cuda") if _ffi.cuda_built() else _no_cuda_lowering)(ctx, *args, **params)

    compiled_impl(prim)
    require_devices_during_lowering(prim)  # custom_partitioning needs the devices while lowering
    prim.def_abstract_eval(abstract)
    batching.primitive_batchers[prim] = batch
    mlir.register_lowering(prim, lowering("cpu"), platform="cpu")
    mlir.register_lowering(prim, cuda_rule, platform="cuda")


_register(norm_fwd_p, "fwd", _fwd_abstract, _fwd_batch)
_register(norm_bwd_p, "bwd", _bwd_abstract, _bwd_batch)
_register(norm_stats_p, "stats", _stats_abstract, _stats_batch)


# ---------------------------------------------------------------------------
# all_reduce_rms_norm's "nvlink" method: one kernel a device sums the devices'
# partial sums by reading its peers' memory, and normalizes the sum
# (csrc/cuda/all_reduce_norm.cu). Inside shard_map. With ``fallback``
# ("auto") it lowers to psum + norm on the CPU and wherever the kernel's call
# could not name its devices; without, it runs on CUDA GPUs only. Its
# batching rule takes the vmapped axis as rows; it has no sharding rule (a
# shard_map body is already per device).

# The limits of the kernel: devices a group, and bytes a row (512 threads of
# four 16-byte packs).
NVLINK_MAX_DEVICES = 8
NVLINK_MAX_ROW_BYTES = 512 * 4 * 16

all_reduce_norm_p = Primitive("jrn_all_reduce_rms_norm")
all_reduce_norm_p.multiple_results = True


def _all_reduce_abstract(x, gamma, *, axes, eps, zero_centered, has_gamma, fallback):
    vma = _vma(x, gamma) - frozenset(axes)  # the same on every device of the group
    return [_like(x, vma), _like(x, vma, shape=x.shape[:-1], dtype=np.float32)]


def _all_reduce_batch(args, dims, **params):
    x, gamma = args
    if dims[1] is not None:
        raise NotImplementedError("all_reduce_rms_norm(method='nvlink') under vmap takes one gamma for "
                                  "every example; use method='psum' to vmap over gamma")
    # Every row is summed and normalized on its own: the vmapped axis is one
    # more row axis.
    outs = all_reduce_norm_p.bind(jnp.moveaxis(x, dims[0], 0), gamma, **params)
    return outs, [0] * len(outs)


def _device_groups(mesh, axes):
    """The devices of ``mesh`` that sum together, as rows of CUDA device
    ordinals in the order of ``jax.lax.axis_index(axes)``: one row for each
    combination of the other mesh axes."""
    if getattr(mesh, "devices", None) is None:
        raise ValueError("all_reduce_rms_norm(method='nvlink') must run inside shard_map over a mesh "
                         "of concrete devices")
    names = list(mesh.axis_names)
    grid = np.moveaxis(np.asarray(mesh.devices), [names.index(a) for a in axes],
                       list(range(-len(axes), 0)))
    n = math.prod(grid.shape[-len(axes):])
    flat = grid.reshape(-1, n)
    here = jax.process_index()
    if any(d.process_index != here for d in flat.flat):
        raise ValueError("all_reduce_rms_norm(method='nvlink') needs every device of the summed axes "
                         "in this process; use method='psum' across processes")
    return np.asarray([[d.local_hardware_id for d in row] for row in flat], np.int64).reshape(-1), n


def _all_reduce_psum(x, gamma, *, axes, eps, zero_centered, has_gamma, fallback):
    """What the kernel computes, as psum + the norm of every row: the
    primitive's lowering where the kernel cannot run and ``fallback`` is set
    (``method="auto"``)."""
    y, _, rstd = norm_fwd(jax.lax.psum(x, axes), gamma, gamma, kind=RMS, eps=eps,
                          zero_centered_gamma=zero_centered, has_gamma=has_gamma, has_beta=False)
    return [y, rstd]


def _all_reduce_lowering(ctx, x, gamma, *, axes, eps, zero_centered, has_gamma, fallback):
    """The kernel, or with ``fallback`` psum + norm where the kernel's call
    could not name its devices: an exported program (it may run on other
    devices than those it was lowered for) or a mesh without devices."""
    mesh = getattr(ctx.module_context.axis_context, "mesh", None)
    portable = ctx.module_context.lowering_parameters.for_export or getattr(mesh, "devices", None) is None
    if fallback and portable:
        return _psum_lowering(ctx, x, gamma, axes=axes, eps=eps, zero_centered=zero_centered,
                              has_gamma=has_gamma, fallback=fallback)
    groups, n = _device_groups(mesh, axes)
    return jax.ffi.ffi_lowering("jrn_all_reduce_rms_norm")(
        ctx, x, gamma, groups=groups, n=np.int64(n), eps=np.float32(eps),
        zero_centered_gamma=bool(zero_centered), has_gamma=bool(has_gamma))


def _psum_lowering(ctx, x, gamma, **params):
    return mlir.lower_fun(partial(_all_reduce_psum, **params), multiple_results=True)(ctx, x, gamma)


def _all_reduce_cpu_lowering(ctx, x, gamma, **params):
    if not params["fallback"]:
        raise ValueError("all_reduce_rms_norm(method='nvlink') runs on CUDA GPUs only (it reads the other "
                         "GPUs' memory); use method='psum' or 'auto' on the CPU")
    return _psum_lowering(ctx, x, gamma, **params)


# XLA_PYTHON_CLIENT_ALLOCATOR values whose buffers peer access reaches
# (cuMemAlloc underneath); a stream-ordered pool's buffers it does not.
_PEER_MAPPED_ALLOCATORS = ("", "default", "bfc", "platform")


def nvlink_available() -> bool:
    """Whether ``all_reduce_rms_norm(method="auto")`` may take the "nvlink"
    kernel: one process, at least two GPUs, peer access between every pair,
    and JAX's default (or "platform") allocator."""
    return (_ffi.cuda_built() and jax.process_count() == 1
            and os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() in _PEER_MAPPED_ALLOCATORS
            and _ffi._jax_rmsnorm_cuda.peer_access_everywhere())


all_reduce_norm_p.def_abstract_eval(_all_reduce_abstract)
batching.primitive_batchers[all_reduce_norm_p] = _all_reduce_batch
mlir.register_lowering(all_reduce_norm_p, _all_reduce_cpu_lowering, platform="cpu")
mlir.register_lowering(all_reduce_norm_p,
                       _all_reduce_lowering if _ffi.cuda_built() else _no_cuda_lowering, platform="cuda")
