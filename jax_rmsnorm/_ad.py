"""Differentiation of the kernels' ops, in every mode: forward (``jvp``,
``linearize``, ``jacfwd``), reverse (``grad``, ``vjp``) and higher order.

Each op is a ``jax.custom_jvp`` (:func:`kernel_op`) whose tangent map is one
linear primitive, ``linear_p``, as JAX's own ops are built: ``jax.grad``
transposes that map, and its transpose runs the op's backward (the backward
kernel), so reverse mode runs the forward kernel once and the backward
kernel once. ``jax.jvp`` evaluates the tangent map as jnp: the ``jvp`` of a
jnp ``reference`` of the op's math, which XLA fuses into one computation.
Derivatives of a derivative differentiate the reference.

``linear_p.bind(*primals, *res, *lin, spec=spec)`` computes a map linear in
``lin`` that depends on the ``primals``; ``res`` (what the op's forward kernel
saved, functions of the primals) only feed the backward kernel. ``spec``
describes the map (:class:`LinearMap`, or :class:`_Batched` under ``vmap``):

* ``formula(primals, lin)``: the map in jnp (a ``jvp`` or ``vjp`` of the
  reference). It gives the primitive's output types, its derivative in the
  primals, and its value where there is no kernel;
* ``kernel(primals, res, lin)`` or None: the fast evaluation (the backward);
* ``transpose()``: the spec of the transposed map;
* ``restrict(keep_lin, keep_out)``: the map on some of its linear inputs
  (the others zero) and to some of its outputs, so that symbolic zeros are
  never materialized.
"""

from __future__ import annotations

import dataclasses
import functools
from functools import partial
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ._compat import compiled_impl, require_devices_during_lowering, traced_avals


# ---------------------------------------------------------------------------
# the maps


def _replaced(values, at, new):
    """``values`` as a list, with ``new``'s entries in turn at the indices ``at``."""
    out = list(values)
    for i, v in zip(at, new):
        out[i] = v
    return out


@dataclasses.dataclass(frozen=True)
class _Op:
    """What one op's maps share. ``reference(static, *args)`` is the op's math
    in jnp and returns a tuple with one entry per output: None for an absent
    output and for one without a derivative (per-tensor amax, FP8 scales).
    ``backward(static, args, res, cts)`` (or None) returns one cotangent per
    argument from the outputs' cotangents (None where zero)."""
    reference: Callable
    backward: Optional[Callable]
    static: object


@dataclasses.dataclass(frozen=True)
class LinearMap:
    """The tangent map of an op (``transposed`` False: tangents of arguments
    ``lin_in`` to tangents of outputs ``lin_out``) or its transpose (cotangents
    of outputs ``lin_in`` to cotangents of arguments ``lin_out``), at the
    primals: the op's arguments that are present (``args``, a mask over them)
    and the forward's residuals that are present (``res``, a mask)."""
    op: _Op
    transposed: bool
    args: tuple
    res: tuple
    n_outs: int
    lin_in: tuple
    lin_out: tuple

    @property
    def n_primals(self):
        return sum(self.args)

    @property
    def n_res(self):
        return sum(self.res)

    def _full(self, mask, values):
        it = iter(values)
        return tuple(next(it) if present else None for present in mask)

    def formula(self, primals, lin):
        args = self._full(self.args, primals)
        moving = self.lin_out if self.transposed else self.lin_in

        def of(*chosen):  # the reference as a function of the arguments in `moving`
            return self.op.reference(self.op.static, *_replaced(args, moving, chosen))

        if not self.transposed:
            _, tangents = jax.jvp(of, tuple(args[i] for i in moving), tuple(lin))
            return [tangents[j] for j in self.lin_out]
        outs, pullback = jax.vjp(of, *(args[i] for i in moving))
        cts = _replaced([None if o is None else jnp.zeros_like(o) for o in outs], self.lin_in, lin)
        return list(pullback(tuple(cts)))

    @property
    def kernel(self):
        if not self.transposed or self.op.backward is None:
            return None
        return self._backward

    def _backward(self, primals, res, lin):
        cts = _replaced([None] * self.n_outs, self.lin_in, lin)
        got = self.op.backward(self.op.static, self._full(self.args, primals), self._full(self.res, res),
                               tuple(cts))
        return [got[i] for i in self.lin_out]

    def transpose(self):
        return dataclasses.replace(self, transposed=not self.transposed, lin_in=self.lin_out,
                                   lin_out=self.lin_in)

    def restrict(self, keep_lin, keep_out):
        return dataclasses.replace(self, lin_in=tuple(i for i, k in zip(self.lin_in, keep_lin) if k),
                                   lin_out=tuple(j for j, k in zip(self.lin_out, keep_out) if k))


@dataclasses.dataclass(frozen=True)
class _Batched:
    """``inner`` under ``vmap``: primals and residuals batched on axis 0 where
    ``p_axes``/``r_axes`` say 0 (None: shared), linear inputs and outputs all
    batched on axis 0. The kernel is ``inner``'s under ``vmap``: the kernels'
    own batching rules run it (per-example parameters as parameter groups)."""
    inner: object
    p_axes: tuple
    r_axes: tuple

    n_primals = property(lambda self: self.inner.n_primals)
    n_res = property(lambda self: self.inner.n_res)

    def formula(self, primals, lin):
        return jax.vmap(self.inner.formula, in_axes=(list(self.p_axes), 0))(list(primals), list(lin))

    @property
    def kernel(self):
        if self.inner.kernel is None:
            return None
        return jax.vmap(self.inner.kernel, in_axes=(list(self.p_axes), list(self.r_axes), 0))

    def transpose(self):
        return _Batched(self.inner.transpose(), self.p_axes, self.r_axes)

    def restrict(self, keep_lin, keep_out):
        return _Batched(self.inner.restrict(keep_lin, keep_out), self.p_axes, self.r_axes)


# ---------------------------------------------------------------------------
# the primitive

linear_p = Primitive("jrn_linear")
linear_p.multiple_results = True


def _split(spec, args):
    p, r = spec.n_primals, spec.n_res
    return list(args[:p]), list(args[p:p + r]), list(args[p + r:])


def _evaluate(*args, spec):
    """The map's value: the kernel where there is one, else the formula."""
    primals, res, lin = _split(spec, args)
    kernel = spec.kernel
    return list(kernel(primals, res, lin) if kernel is not None else spec.formula(primals, lin))


def _formula(*args, spec):
    primals, _, lin = _split(spec, args)
    return list(spec.formula(primals, lin))


def _abstract(*avals, spec):
    return _formula_avals(spec, avals, jax.config.read("jax_enable_x64"))


@functools.lru_cache(maxsize=4096)
def _formula_avals(spec, avals, x64):
    """The formula's output types (vma and shardings included), what the
    kernel must give too. Kept: JAX asks again wherever it checks a jaxpr
    (jax_enable_checks), and tracing the formula is the costly part."""
    del x64  # a key only: the types are the same unless x64 changes a dtype
    return tuple(traced_avals(partial(_formula, spec=spec), avals))


def _lowering(ctx, *args, spec):
    def checked(*args):
        outs = _evaluate(*args, spec=spec)
        got = [(tuple(o.shape), o.dtype) for o in outs]
        want = [(tuple(a.shape), a.dtype) for a in ctx.avals_out]
        if got != want:  # a kernel that does not give what its formula does: a bug here
            raise RuntimeError(f"jax_rmsnorm: {spec} evaluates to {got}, its formula to {want}")
        return outs

    return mlir.lower_fun(checked, multiple_results=True)(ctx, *args)


def _jvp(primals_in, tangents_in, *, spec):
    # Linear in `lin`; through the primals the map varies as its formula does
    # (the residuals are functions of the primals, so their tangents are not
    # needed: the formula reads the primals only).
    outs = linear_p.bind(*primals_in, spec=spec)
    primals, res, lin = _split(spec, primals_in)
    t_primals, _, t_lin = _split(spec, tangents_in)
    total = None
    keep = tuple(type(t) is not ad.Zero for t in t_lin)
    if any(keep):
        total = linear_p.bind(*primals, *res, *(t for t, k in zip(t_lin, keep) if k),
                              spec=spec.restrict(keep, (True,) * len(outs)))
    moving = [i for i, t in enumerate(t_primals) if type(t) is not ad.Zero]
    if moving:
        def of(*chosen):
            return spec.formula(_replaced(primals, moving, chosen), lin)

        _, extra = jax.jvp(of, tuple(primals[i] for i in moving), tuple(t_primals[i] for i in moving))
        total = list(extra) if total is None else [a + b for a, b in zip(total, extra)]
    if total is None:
        return outs, [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
    return outs, total


def _transpose(cts, *args, spec):
    primals, res, lin = _split(spec, args)
    if any(ad.is_undefined_primal(a) for a in primals + res):
        raise NotImplementedError("jax_rmsnorm's linear maps are linear in their last operands only")
    need = tuple(ad.is_undefined_primal(a) for a in lin)
    nonzero = tuple(type(c) is not ad.Zero for c in cts)
    none = [None] * (len(primals) + len(res))
    if not any(need) or not any(nonzero):
        return none + [None] * len(lin)
    outs = iter(linear_p.bind(*primals, *res, *(c for c, k in zip(cts, nonzero) if k),
                              spec=spec.transpose().restrict(nonzero, need)))
    return none + [next(outs) if n else None for n in need]


def _batch(args, dims, *, spec):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    n = spec.n_primals + spec.n_res
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args[:n], dims[:n])]
    axes = [None if d is None else 0 for d in dims[:n]]
    # Shared linear inputs are broadcast: the transpose of that broadcast
    # (JAX's) sums their cotangents over the batch.
    lin = [batching.bdim_at_front(a, d, size) for a, d in zip(args[n:], dims[n:])]
    batched = _Batched(spec, tuple(axes[:spec.n_primals]), tuple(axes[spec.n_primals:]))
    outs = linear_p.bind(*moved, *lin, spec=batched)
    return outs, [0] * len(outs)


compiled_impl(linear_p)
require_devices_during_lowering(linear_p)  # the kernels lower through custom_partitioning
linear_p.def_abstract_eval(_abstract)
mlir.register_lowering(linear_p, _lowering)
ad.primitive_jvps[linear_p] = _jvp
ad.primitive_transposes[linear_p] = _transpose
batching.primitive_batchers[linear_p] = _batch


# ---------------------------------------------------------------------------
# ops


@functools.lru_cache(maxsize=4096)
def _has_derivative(reference, static, avals, x64):
    """Which outputs the reference gives (not None) at arguments of these
    avals: those with a derivative. Kept, as the formula's types are."""
    del x64  # a key only
    return tuple(r is not None for r in jax.eval_shape(partial(reference, static), *avals))


def kernel_op(fwd, reference, backward=None, primal=None):
    """A differentiable op over kernels, called as ``op(static, *args)``.

    ``static``: hashable, not differentiated (a configuration, axis names);
    ``args``: arrays or None. ``fwd(static, *args) -> (outs, res)``: the
    forward kernel's outputs (a tuple of arrays or None) and what the backward
    reads besides the arguments (a tuple of arrays or None). ``reference``,
    ``backward``: as in :class:`_Op` (without a backward, the transposed map
    is the formula's). ``primal(static, *args) -> outs``: the value when not
    differentiated, if not ``fwd``'s.
    """

    # The forward with its residuals, differentiable itself: an outer
    # derivative of the rule below differentiates it in turn (to any order).
    def with_res(static, *args):
        return fwd(static, *args)

    def outputs(static, *args):
        return fwd(static, *args)[0]

    # Named after the forward in jaxprs (custom_jvp_call[name=...]).
    for f, suffix in ((with_res, "_with_res"), (outputs, "")):
        f.__name__ = f.__qualname__ = fwd.__name__.removesuffix("_fwd") + suffix
    with_res = jax.custom_jvp(with_res, nondiff_argnums=(0,))
    op = jax.custom_jvp(primal or outputs, nondiff_argnums=(0,))

    def rule(static, primals, tangents):
        """(outs, res) and their tangents: the outputs' from one linear map
        of the nonzero tangents to the outputs with a derivative; the
        residuals' zero (only that map reads them, and its own derivative
        does not)."""
        outs, res = with_res(static, *primals)
        avals = tuple(None if p is None else jax.typeof(p) for p in primals)
        derivative = _has_derivative(reference, static, avals, jax.config.read("jax_enable_x64"))
        t_outs = [None if o is None else SymbolicZero.from_primal_value(o) for o in outs]
        lin_in = tuple(i for i, (p, t) in enumerate(zip(primals, tangents))
                       if p is not None and type(t) is not SymbolicZero)
        lin_out = tuple(j for j, (o, d) in enumerate(zip(outs, derivative)) if o is not None and d)
        if lin_in and lin_out:
            spec = LinearMap(_Op(reference, backward, static), False, tuple(p is not None for p in primals),
                             tuple(r is not None for r in res), len(outs), lin_in, lin_out)
            vals = linear_p.bind(*(p for p in primals if p is not None), *(r for r in res if r is not None),
                                 *(tangents[i] for i in lin_in), spec=spec)
            t_outs = _replaced(t_outs, lin_out, vals)
        t_res = tuple(None if r is None else SymbolicZero.from_primal_value(r) for r in res)
        return (outs, res), (tuple(t_outs), t_res)

    with_res.defjvp(rule, symbolic_zeros=True)

    @partial(op.defjvp, symbolic_zeros=True)
    def _(static, primals, tangents):
        (outs, _), (t_outs, _) = rule(static, primals, tangents)
        return outs, t_outs

    return op
