"""Forward-mode and higher-order differentiation: jvp, linearize, jacfwd,
hessian and grad of grad of every differentiable function, against the same
transformations of jnp references (tests/reference.py with xp=jnp) and
against central differences of the float64 NumPy references; under vmap in
both orders, inside shard_map, and for the straight-through FP8 outputs.
And that jax.grad still runs the backward kernels, with one forward kernel."""

import contextlib
import re
from functools import partial

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jax_rmsnorm as jrn
from reference import f64, random, ref_backward, ref_forward

F32 = jnp.float32
E4M3 = jnp.float8_e4m3fn
EPS = {"rms": 1e-6, "layer": 1e-5}
H = 16


def _close(got, want, tol=2e-5, what=""):
    got, want = f64(got), f64(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max(initial=0.0))),
                               err_msg=what)


def _all_close(got, want, tol=2e-5, what=""):
    got_l, want_l = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_l) == len(want_l), f"{what}: {len(got_l)} leaves != {len(want_l)}"
    for i, (a, b) in enumerate(zip(got_l, want_l)):
        _close(a, b, tol, f"{what} [{i}]")


def _args(*specs, seed=0):
    """Arrays of (shape, dtype[, offset]) specs."""
    return [random(seed + i, s[0], s[1], offset=s[2] if len(s) > 2 else 0.0) for i, s in enumerate(specs)]


def _ours(kind, **kw):
    if kind == "rms":
        return lambda x, g, b: jrn.rms_norm(x, g, **kw)
    return lambda x, g, b: jrn.layer_norm(x, g, b, **kw)


def _ref(kind, zc=False):
    """The jnp reference of _ours, computed in float32 and returned in x's dtype
    (RMSNorm ignores b; b may be None)."""
    def f(x, g, b):
        beta = None if kind == "rms" or b is None else b.astype(F32)
        y = ref_forward(kind, x.astype(F32), g.astype(F32), beta, EPS[kind], zc, xp=jnp)[0]
        return y.astype(x.dtype)
    return f


def _ref64(kind, zc=False):
    return lambda x, g, b: ref_forward(kind, x, g, None if kind == "rms" else b, EPS[kind], zc)[0]


def _central(f64_fn, args, tangents, h=1e-4):
    """Central differences of a float64 NumPy function along the tangents."""
    plus = [f64(a) + h * f64(t) for a, t in zip(args, tangents)]
    minus = [f64(a) - h * f64(t) for a, t in zip(args, tangents)]
    return (f64_fn(*plus) - f64_fn(*minus)) / (2 * h)


def _loss(y):
    # Not linear in y, so that second derivatives are not zero.
    y = y.astype(F32)
    return jnp.sum(jnp.sin(1.3 * y) + 0.25 * y * y)


def _both(transform, ours, ref, *args):
    """``transform(ours)(*args)`` and ``transform(ref)(*args)`` in one jitted call
    (one compilation: the tests' time is mostly XLA's)."""
    return jax.jit(lambda *a: (transform(ours)(*a), transform(ref)(*a)))(*args)


def _jvp(f):
    return lambda primals, tangents: jax.jvp(f, primals, tangents)


def _hvp(loss):
    """The hessian-vector product of ``loss`` (the jvp of its gradient)."""
    return lambda p, t: jax.jvp(jax.grad(loss, tuple(range(len(p)))), p, t)[1]


# ---------------------------------------------------------------------------
# jvp, linearize, jacfwd, hessian, grad of grad


@pytest.mark.parametrize("kind,dtype,zc,p_dtype", [
    ("rms", F32, False, F32), ("layer", F32, True, F32), ("layer", jnp.bfloat16, False, jnp.bfloat16),
    ("rms", jnp.float16, True, F32)])
def test_jvp(kind, dtype, zc, p_dtype):
    x, g, b, tx, tg, tb = _args(((3, 5, H), dtype, 0.5), ((H,), p_dtype, 1.0), ((H,), p_dtype),
                                ((3, 5, H), dtype), ((H,), p_dtype), ((H,), p_dtype))
    (y, t), (want_y, want_t) = _both(_jvp, _ours(kind, zero_centered_gamma=zc), _ref(kind, zc), (x, g, b),
                                     (tx, tg, tb))
    assert t.dtype == dtype and t.shape == x.shape
    tol = {F32: 2e-5, jnp.float16: 3e-3, jnp.bfloat16: 2e-2}[dtype]
    _close(y, want_y, tol, "y")
    _close(t, want_t, tol, "tangent")
    if dtype == F32:
        _close(t, _central(_ref64(kind, zc), (x, g, b), (tx, tg, tb)), 1e-4, "finite differences")


def test_linearize():
    x, g, b, tx, tg, tb = _args(((4, H), F32, 0.5), ((H,), F32, 1.0), ((H,), F32), ((4, H), F32), ((H,), F32),
                                ((H,), F32), seed=10)
    y, f_lin = jax.linearize(_ours("layer"), x, g, b)
    want_y, want_t = jax.jit(jax.jvp, static_argnums=0)(_ref("layer"), (x, g, b), (tx, tg, tb))
    _close(y, want_y, what="y")
    _close(f_lin(tx, tg, tb), want_t, what="linear function")
    _close(jax.jit(f_lin)(2 * tx, 2 * tg, 2 * tb), 2 * want_t, what="linear function, jitted")


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_jacobians_hessian_grad_of_grad(kind):
    x, g, b = _args(((2, 6), F32, 0.5), ((6,), F32, 1.0), ((6,), F32), seed=20)
    f, ref = _ours(kind), _ref(kind)
    loss = lambda *a: _loss(f(*a))
    if kind == "rms":
        fwd, rev = jax.jit(lambda *a: (jax.jacfwd(f, (0, 1, 2))(*a), jax.jacrev(f, (0, 1, 2))(*a)))(x, g, b)
        _all_close(fwd, rev, what="jacfwd vs jacrev")
    else:
        def grad_of_grad(lf):
            return jax.grad(lambda x, g, b: jnp.sum(jnp.square(jax.grad(lf, (0, 1))(x, g, b)[0])), (0, 1, 2))
        got, want = _both(grad_of_grad, loss, lambda *a: _loss(ref(*a)), x, g, b)
        _all_close(got, want, 1e-4, "grad of grad")

    # The hessian against central differences of the float64 NumPy gradient.
    def grad64(x, g, b):
        y = _ref64(kind)(x, g, b)
        dy = 1.3 * np.cos(1.3 * y) + 0.5 * y
        dx, dg, _ = ref_backward(kind, dy, x, g, EPS[kind])
        return np.concatenate([dx.ravel(), dg])
    directions = [(np.eye(12)[i].reshape(2, 6), np.zeros(6), np.zeros(6)) for i in range(12)] + [
        (np.zeros((2, 6)), np.eye(6)[i], np.zeros(6)) for i in range(6)]
    jac64 = np.stack([_central(grad64, (x, g, b), t) for t in directions], -1)  # d grad[out] / d direction
    (hxx, hxg), (hgx, hgg) = jax.jit(jax.hessian(loss, (0, 1)))(x, g, b)
    _close(hxx.reshape(12, 12), jac64[:12, :12], 1e-4, "hessian, x x")
    _close(hgx.reshape(6, 12), jac64[12:, :12], 1e-4, "hessian, gamma x")
    _close(hxg.reshape(12, 6), jac64[:12, 12:], 1e-4, "hessian, x gamma")
    _close(hgg, jac64[12:, 12:], 1e-4, "hessian, gamma gamma")


def test_empty_rows():
    x, t = jnp.zeros((0, H), F32), jnp.zeros((0, H), F32)
    g = jnp.ones((H,), F32)
    (y, ty), hess = jax.jit(lambda x, g, t: (jax.jvp(lambda x, g: jrn.layer_norm(x, g), (x, g), (t, g)),
                                             jax.hessian(lambda g: jnp.sum(jrn.rms_norm(x, g)))(g)))(x, g, t)
    assert y.shape == ty.shape == (0, H)
    np.testing.assert_array_equal(hess, np.zeros((H, H)))


# ---------------------------------------------------------------------------
# jax.grad runs the backward kernel; the forward kernel runs once


def _kernels(fn, *args):
    """The library's custom calls in the compiled HLO of fn, in order."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return re.findall(r'custom_call_target="(jrn_[a-z_0-9]+)"', hlo)


def _grad_cases():
    """(loss, its arguments, the kernels its gradient runs); a loss None: the
    function given is compiled as it is."""
    x, r, g, b, xs = _args(((4, H), F32, 0.5), ((4, H), F32), ((H,), F32, 1.0), ((H,), F32), ((3, 4, H), F32),
                           seed=30)
    gs = jnp.stack([g, g + 1, g - 1])
    rms, layer = _ours("rms"), _ours("layer")
    return {
        "rms_norm": (lambda x, g: _loss(rms(x, g, None)), (x, g), ["jrn_rms_norm_fwd", "jrn_rms_norm_bwd"]),
        "layer_norm": (lambda x, g: _loss(layer(x, g, b)), (x, g), ["jrn_layer_norm_fwd", "jrn_layer_norm_bwd"]),
        "add_rms_norm": (lambda x, g: _loss(jnp.concatenate(jrn.add_rms_norm(x, r, g))), (x, g),
                         ["jrn_rms_norm_fwd_fused", "jrn_rms_norm_bwd_add"]),
        "add_rms_norm, y only": (lambda x, g: _loss(jrn.add_rms_norm(x, r, g)[0]), (x, g),
                                 ["jrn_rms_norm_fwd_fused", "jrn_rms_norm_bwd"]),
        "rms_norm_fp8": (lambda x, g: _loss(jrn.rms_norm_fp8(x, g, scale=2.0)[0]), (x, g),
                         ["jrn_rms_norm_fwd_fused", "jrn_rms_norm_bwd"]),
        "layer_norm_fwd, y only": (lambda x, g: _loss(jrn.layer_norm_fwd(x, g, b)[0]), (x, g),
                                   ["jrn_layer_norm_fwd", "jrn_layer_norm_bwd"]),
        # The statistics' cotangents enter through the kernel's row coefficients.
        "layer_norm_fwd, y and stats": (lambda x, g: sum(_loss(o) for o in jrn.layer_norm_fwd(x, g, b)), (x, g),
                                        ["jrn_layer_norm_fwd", "jrn_layer_norm_grad_stats",
                                         "jrn_layer_norm_bwd_given"]),
        "grad of vmap, shared gamma": (lambda x, g: _loss(jax.vmap(rms, (0, None, None))(x, g, None)), (xs, g),
                                       ["jrn_rms_norm_fwd", "jrn_rms_norm_bwd"]),
        "vmap of grad, batched gamma": (jax.vmap(jax.grad(lambda x, g: _loss(layer(x, g, b)), (0, 1))), (xs, gs),
                                        ["jrn_layer_norm_fwd", "jrn_layer_norm_bwd"], False),
    }


@pytest.mark.parametrize("case", list(_grad_cases()))
def test_grad_runs_the_backward_kernel(case):
    loss, args, want, *of_loss = _grad_cases()[case]
    fn = jax.grad(loss, tuple(range(len(args)))) if of_loss != [False] else loss
    assert sorted(_kernels(fn, *args)) == sorted(want)


def test_jvp_runs_the_forward_kernel_only():
    x, g, b = _args(((4, H), F32, 0.5), ((H,), F32, 1.0), ((H,), F32))
    jvp = lambda x, g, b: jax.jvp(_ours("layer"), (x, g, b), (x, g, b))
    assert _kernels(jvp, x, g, b) == ["jrn_layer_norm_fwd"]
    # A hessian-vector product: the forward kernel once; the backward kernel
    # for the gradient and for the tangent of its cotangent; the rest (the
    # backward's own derivative) is its reference's, in jnp.
    hvp = lambda x, g, b: jax.jvp(jax.grad(lambda x: _loss(jrn.layer_norm(x, g, b))), (x,), (x,))
    assert sorted(_kernels(hvp, x, g, b)) == ["jrn_layer_norm_bwd"] * 2 + ["jrn_layer_norm_fwd"]


# ---------------------------------------------------------------------------
# the forward and backward functions (*_fwd, *_bwd)


def _sum_loss(fn):
    return lambda *a: sum(_loss(o) for o in fn(*a))


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_fwd_function_derivatives(kind):
    x, g, b, tx, tg, tb = _args(((3, H), F32, 0.5), ((H,), F32, 1.0), ((H,), F32), ((3, H), F32), ((H,), F32),
                                ((H,), F32), seed=40)

    def ours(x, g, b):
        if kind == "rms":
            return jrn.rms_norm_fwd(x, g, zero_centered_gamma=True)
        return jrn.layer_norm_fwd(x, g, b)

    def ref(x, g, b):
        y, mean, rstd = ref_forward(kind, x, g, b if kind == "layer" else None, EPS[kind], kind == "rms", xp=jnp)
        return (y, rstd) if kind == "rms" else (y, mean, rstd)

    # jvp; grad through y and the statistics; the hessian in gamma.
    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), jax.grad(_sum_loss(fn), (0, 1, 2))(*p),
                                      jax.hessian(_sum_loss(fn), 1)(*p))
    got, want = _both(checks, ours, ref, (x, g, b), (tx, tg, tb))
    _all_close(got, want, 1e-4, "jvp, grad, hessian")


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_bwd_function_derivatives(kind):
    dy, x, g, tdy, tx, tg, tmean, trstd = _args(((3, H), F32), ((3, H), F32, 0.5), ((H,), F32, 1.0), ((3, H), F32),
                                                ((3, H), F32), ((H,), F32), ((3,), F32), ((3,), F32), seed=50)
    _, mean, rstd = ref_forward(kind, x, eps=EPS[kind])
    mean, rstd = jnp.asarray(mean, F32), jnp.asarray(rstd, F32)

    def ours(dy, x, mean, rstd, g):
        if kind == "rms":
            return jrn.rms_norm_bwd(dy, x, rstd, g)
        return jrn.layer_norm_bwd(dy, x, mean, rstd, g)

    def ref(dy, x, mean, rstd, g):
        dx, dg, db = ref_backward(kind, dy, x, g, xp=jnp, mean=mean if kind == "layer" else None, rstd=rstd)
        return (dx, dg) if kind == "rms" else (dx, dg, db)

    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), jax.grad(_sum_loss(fn), tuple(range(5)))(*p))
    got, want = _both(checks, ours, ref, (dy, x, mean, rstd, g), (tdy, tx, tmean, trstd, tg))
    _all_close(got, want, 1e-4, "jvp, grad")


# ---------------------------------------------------------------------------
# vmap


@pytest.mark.parametrize("kind,in_axes", [("rms", (0, 0, 0)), ("layer", (0, None, None)), ("layer", (None, 0, 0))])
def test_vmap_and_jvp_both_orders(kind, in_axes):
    B = 3
    shape = lambda ax, s: (B,) + s if ax == 0 else s
    x, g, b = _args((shape(in_axes[0], (4, H)), F32, 0.5), (shape(in_axes[1], (H,)), F32, 1.0),
                    (shape(in_axes[2], (H,)), F32), seed=60)
    tx, tg, tb = _args((x.shape, F32), (g.shape, F32), (b.shape, F32), seed=63)

    def checks(f):
        def run(p, t):
            loss = lambda x, g, b: _loss(f(x, g, b))
            hvp = lambda x, g, b, t: jax.jvp(lambda x: jax.grad(loss)(x, g, b), (x,), (t,))[1]
            return (jax.vmap(lambda p, t: jax.jvp(f, p, t), in_axes=(in_axes, in_axes))(p, t),  # vmap of jvp
                    jax.jvp(jax.vmap(f, in_axes), p, t),  # jvp of vmap
                    jax.grad(lambda *a: _loss(jax.vmap(f, in_axes)(*a)), (0, 1, 2))(*p),  # grad of vmap
                    jax.vmap(jax.grad(loss, (0, 1, 2)), in_axes)(*p),  # vmap of grad
                    # second order under vmap, with x shared
                    jax.vmap(hvp, in_axes + (in_axes[0],))(*p, t[0]) if in_axes[0] is None else ())
        return run

    got, want = _both(checks, _ours(kind), _ref(kind), (x, g, b), (tx, tg, tb))
    for what, a, w in zip(["vmap of jvp", "jvp of vmap", "grad of vmap", "vmap of grad", "vmap of hvp"], got, want):
        _all_close(a, w, 1e-4, what)


# ---------------------------------------------------------------------------
# the residual add and the FP8 outputs (straight-through)


def _add_ref(kind, h_dtype):
    def f(x, r, g, b):
        h = (x.astype(F32) + r.astype(F32)).astype(h_dtype)
        return _ref(kind)(h, g, b).astype(x.dtype), h
    return f


@pytest.mark.parametrize("kind,dtype,h_dtype", [("rms", F32, F32), ("layer", F32, F32),
                                                ("rms", jnp.bfloat16, F32)])
def test_add_norm(kind, dtype, h_dtype):
    x, r, g, b, tx, tr, tg, tb = _args(((3, H), dtype, 0.5), ((3, H), dtype), ((H,), F32, 1.0), ((H,), F32),
                                       ((3, H), dtype), ((3, H), dtype), ((H,), F32), ((H,), F32), seed=70)
    if kind == "rms":
        ours = lambda x, r, g, b: jrn.add_rms_norm(x, r, g, h_dtype=h_dtype)
    else:
        ours = lambda x, r, g, b: jrn.add_layer_norm(x, r, g, b, h_dtype=h_dtype)
    ref = _add_ref(kind, h_dtype)
    args, tangents = (x, r, g, b), (tx, tr, tg, tb)
    if dtype != F32:
        got, want = _both(_jvp, ours, ref, args, tangents)
        _all_close(got, want, 2e-2, "jvp")
        return
    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), _hvp(_sum_loss(fn))(p, t))
    got, want = _both(checks, ours, ref, args, tangents)
    _all_close(got, want, 1e-4, "jvp, hessian-vector product")


def _fp8_outputs():
    """Our function of (x, g, b, r), its kind, q's dtype, h's dtype (None: no
    residual), and where q, the scales, h and q_t are among its outputs."""
    return {
        "rms_norm_fp8": (lambda x, g, b, r: jrn.rms_norm_fp8(x, g, scale=3.0), "rms", E4M3, None,
                         (0, 1, None, None)),
        "layer_norm_fp8 e5m2, residual": (
            lambda x, g, b, r: jrn.layer_norm_fp8(x, g, b, scale=0.5, out_dtype=jnp.float8_e5m2, residual=r),
            "layer", jnp.float8_e5m2, jnp.bfloat16, (0, 1, 2, None)),
        "rms_norm_fp8_current, transpose": (lambda x, g, b, r: jrn.rms_norm_fp8_current(x, g, transpose=True),
                                            "rms", E4M3, None, (0, 1, None, 2)),
        "layer_norm_fp8_rowwise": (lambda x, g, b, r: jrn.layer_norm_fp8_rowwise(x, g, b), "layer", E4M3, None,
                                   (0, 1, None, None)),
        "rms_norm_fp8_groupwise, residual": (
            lambda x, g, b, r: jrn.rms_norm_fp8_groupwise(x, g, group_size=8, residual=r, h_dtype=F32),
            "rms", E4M3, F32, (0, 1, 2, None)),
    }


@pytest.mark.parametrize("case", list(_fp8_outputs()))
def test_fp8_outputs_straight_through(case):
    ours, kind, fmt, h_dtype, (iq, iscale, ih, iqt) = _fp8_outputs()[case]
    x, g, b, r, tx, tg, tb, tr = _args(((4, H), jnp.bfloat16, 0.5), ((H,), F32, 1.0), ((H,), F32),
                                       ((4, H), jnp.bfloat16), ((4, H), jnp.bfloat16), ((H,), F32), ((H,), F32),
                                       ((4, H), jnp.bfloat16), seed=80)

    # Straight-through: q's derivative is y's, rounded to h's (or x's) dtype,
    # then to FP8 (as JAX differentiates a conversion), and the scales have none.
    def ref(x, g, b, r):
        h = x if h_dtype is None else (x.astype(F32) + r.astype(F32)).astype(h_dtype)
        return _ref(kind)(h, g, b).astype(fmt), h

    # The loss is linear in q, whose values differ (ours are scaled), with
    # weights that FP8 holds exactly.
    w = jnp.round(jnp.clip(2 * tx.astype(F32), -2, 2) * 4) / 4

    def checks(fn, q_at, h_at):
        def loss(x, g):
            outs = fn(x, g, b, r)
            return jnp.sum(outs[q_at].astype(F32) * w) + (0.0 if h_dtype is None else _loss(outs[h_at]))
        grad_of_grad = jax.grad(lambda x, g: jnp.sum(jnp.square(jax.grad(loss, 1)(x, g))), 0)
        return lambda p, t: (jax.jvp(fn, p, t)[1], jax.grad(loss, (0, 1))(*p[:2]), grad_of_grad(*p[:2]))

    args, tangents = (x, g, b, r), (tx, tg, tb, tr)
    (t, grad, gg), ((want_tq, want_th), want_grad, want_gg) = jax.jit(lambda p, t: (
        checks(ours, iq, ih)(p, t), checks(ref, 0, 1)(p, t)))(args, tangents)
    assert t[iq].dtype == fmt
    _close(t[iq].astype(F32), want_tq.astype(F32), 2.0 ** -3, "q's tangent")
    assert not np.any(f64(t[iscale])), "the scales' tangent is zero"
    if ih is not None:
        _close(t[ih], want_th, 1e-5, "h's tangent")
    if iqt is not None:
        np.testing.assert_array_equal(f64(t[iqt]), f64(t[iq]).T, "q_t's tangent is q's transposed")
    _all_close(grad, want_grad, 2e-2, "grad")
    _close(gg, want_gg, 5e-2, "grad of grad")


# ---------------------------------------------------------------------------
# statistics and apply; FP8 inputs


def test_stats_and_apply():
    x, g, b, tx, tg, tb = _args(((3, 2 * H), F32, 0.5), ((H,), F32, 1.0), ((H,), F32), ((3, 2 * H), F32),
                                ((H,), F32), ((H,), F32), seed=90)
    ss, st = jrn.rms_norm_stats(x), jrn.layer_norm_stats(x)
    tss, tst = _args((ss.shape, F32), (st.shape, F32), seed=96)

    # Each half row with the whole rows' statistics, and the statistics themselves.
    def ours(x, ss, st, g, b):
        half = x[:, :H]
        return (jrn.rms_norm_stats(x), jrn.layer_norm_stats(x), jrn.rms_norm_apply(half, ss, g, hidden_size=2 * H,
                                                                                    eps=1e-3),
                jrn.layer_norm_apply(half, st, g, b, hidden_size=2 * H))

    def ref(x, ss, st, g, b):
        _, mean, rstd = ref_forward("layer", x, eps=0.0, xp=jnp)
        half = x[:, :H]
        return (jnp.sum(x * x, -1), jnp.stack([mean, x.shape[-1] / rstd ** 2], -1),
                half * jax.lax.rsqrt(ss / (2 * H) + 1e-3)[:, None] * g,
                (half - st[:, :1]) * jax.lax.rsqrt(st[:, 1:] / (2 * H) + 1e-5) * g + b)

    # The halves composed are the norm.
    def composed(x, g):
        halves = jnp.split(x, 2, axis=-1)
        total = sum(jrn.rms_norm_stats(s) for s in halves)
        return jnp.concatenate([jrn.rms_norm_apply(s, total, g, hidden_size=2 * H) for s in halves], -1)

    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), _hvp(_sum_loss(fn))(p, t))
    args, tangents = (x, ss, st, g, b), (tx, tss, tst, tg, tb)
    got, want, (comp, whole) = jax.jit(lambda p, t: (
        checks(ours)(p, t), checks(ref)(p, t),
        (jax.jvp(composed, (p[0], p[3]), (t[0], t[3]))[1],
         jax.jvp(lambda x, g: jrn.rms_norm(x, jnp.concatenate([g, g])), (p[0], p[3]), (t[0], t[3]))[1])))(
        args, tangents)
    for what, a, w in zip(["jvp", "hessian-vector product"], got, want):
        _all_close(a, w, 1e-4, what)
    _close(comp, whole, 1e-4, "composed")


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_fp8_input(kind):
    x, g, s, r, tg, ts, tr = _args(((4, H), F32), ((H,), F32, 1.0), ((4, 2), F32, 2.0), ((4, H), F32),
                                   ((H,), F32), ((4, 2), F32), ((4, H), F32), seed=100)
    q = x.astype(E4M3)
    tq = (0.25 * tr).astype(E4M3)

    def deq(q, s):
        return (q.astype(F32).reshape(4, 2, H // 2) * s[..., None]).reshape(4, H)

    def ours(q, g, s, r):
        if kind == "rms":
            return jrn.rms_norm(q, g, x_scale=s, group_size=8, dtype=F32), jrn.add_rms_norm(
                q, r, g, x_scale=s, group_size=8, dtype=F32)[0]
        return jrn.layer_norm(q, g, x_scale=s, group_size=8, dtype=F32), jrn.add_layer_norm(
            q, r, g, x_scale=s, group_size=8, dtype=F32)[0]

    def ref(q, g, s, r):
        x = deq(q, s)
        return _ref(kind)(x, g, None), _ref(kind)(x + r, g, None)

    # jvp, and (RMSNorm) the hessian-vector product in gamma and x_scale.
    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), _hvp(lambda g, s: _sum_loss(fn)(q, g, s, r))(p[1:3], t[1:3])
                                      if kind == "rms" else ())
    got, want = _both(checks, ours, ref, (q, g, s, r), (tq, tg, ts, tr))
    _all_close(got, want, 1e-4, "jvp, hessian-vector product")


# ---------------------------------------------------------------------------
# shard_map: the hidden dim split over "model", rows over "data"


def _mesh(data, model):
    devices = jax.devices("cpu")
    if len(devices) < data * model:
        pytest.skip(f"needs {data * model} CPU devices")
    return jax.sharding.Mesh(np.asarray(devices[:data * model]).reshape(data, model), ("data", "model"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_shard_map_axis_name():
    mesh = _mesh(2, 2)
    x, r, g, b, tx, tr, tg, tb = _args(((4, 2 * H), F32, 0.5), ((4, 2 * H), F32), ((2 * H,), F32, 1.0),
                                       ((2 * H,), F32), ((4, 2 * H), F32), ((4, 2 * H), F32), ((2 * H,), F32),
                                       ((2 * H,), F32), seed=110)
    rows_cols, cols = P("data", "model"), P("model")

    @partial(jax.shard_map, mesh=mesh, in_specs=(rows_cols, rows_cols, cols, cols), out_specs=(rows_cols,) * 4)
    def sharded(x, r, g, b):
        y, h = jrn.add_layer_norm(x, r, g, b, axis_name="model")
        total = jax.lax.psum(jrn.rms_norm_stats(x), "model")  # the stats/apply building blocks
        return jrn.rms_norm(x, g, axis_name="model"), y, h, jrn.rms_norm_apply(x, total, g, hidden_size=2 * H)

    def whole(x, r, g, b):
        h = x + r
        return _ref("rms")(x, g, b), _ref("layer")(h, g, b), h, _ref("rms")(x, g, b)

    # jvp, and a hessian-vector product (jvp of grad) of the first output
    # through the shard_map.
    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), _hvp(lambda x, g: _loss(fn(x, r, g, b)[0]))(
        (p[0], p[2]), (t[0], t[2])))
    got, want = _both(checks, sharded, whole, (x, r, g, b), (tx, tr, tg, tb))
    _all_close(got, want, 1e-4, "jvp, hessian-vector product")

    # jvp inside the shard_map body.
    @partial(jax.shard_map, mesh=mesh, in_specs=(rows_cols, cols, rows_cols, cols), out_specs=rows_cols)
    def inner(x, g, tx, tg):
        return jax.jvp(lambda x, g: jrn.rms_norm(x, g, axis_name="model"), (x, g), (tx, tg))[1]

    _close(jax.jit(inner)(x, g, tx, tg), got[0][1][0], 1e-5, "jvp inside shard_map")


def test_sharded_jit():
    # An Explicit mesh, rows over "data" and the hidden dim over "model":
    # the tangent map (jnp) is partitioned by XLA, the kernels by their rules.
    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"),
                             axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x, g, tx, tg = _args(((4, 2 * H), F32, 0.5), ((2 * H,), F32, 1.0), ((4, 2 * H), F32), ((2 * H,), F32), seed=115)
    put = lambda a, *spec: jax.device_put(a, jax.sharding.NamedSharding(mesh, P(*spec)))
    f = lambda x, g: (jrn.layer_norm(x, g), jrn.add_rms_norm(x, x, g)[0])
    checks = lambda p, t: (jax.jvp(f, p, t), _hvp(_sum_loss(f))(p, t))
    want = jax.jit(checks)((x, g), (tx, tg))
    with jax.set_mesh(mesh):
        got = jax.jit(checks)((put(x, "data", "model"), put(g, "model")), (put(tx, "data", "model"), put(tg, "model")))
    _all_close(got, want, 1e-5, "sharded jit")


@pytest.mark.parametrize("method,scatter", [("auto", False), ("scatter", False), ("psum", True)])
def test_all_reduce_rms_norm(method, scatter):
    n = 4
    mesh = _mesh(1, n)
    parts, tparts = _args(((n, 8, H), F32), ((n, 8, H), F32), seed=120)
    g, tg = _args(((H,), F32, 1.0), ((H,), F32), seed=122)

    @partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model") if scatter else P())
    def sharded(p, g):
        return jrn.all_reduce_rms_norm(p[0], g, axis_name="model", method=method, scatter=scatter)

    ref = lambda p, g: _ref("rms")(jnp.sum(p, 0), g, None)
    if method != "auto":
        got, want = _both(_jvp, sharded, ref, (parts, g), (tparts, tg))
        _all_close(got, want, 1e-4, "jvp")
        return
    checks = lambda fn: lambda p, t: (jax.jvp(fn, p, t), _hvp(lambda *a: _loss(fn(*a)))(p, t))
    got, want = _both(checks, sharded, ref, (parts, g), (tparts, tg))
    _all_close(got, want, 1e-4, "jvp, hessian-vector product")


# ---------------------------------------------------------------------------
# every map's kernel backward is the transpose of its jnp tangent map


def _transpose_cases():
    x, r, g, b, dy = _args(((3, H), F32, 0.5), ((3, H), F32), ((H,), F32, 1.0), ((H,), F32), ((3, H), F32), seed=130)
    _, mean, rstd = jrn.layer_norm_fwd(x)
    q, s = x.astype(E4M3), jnp.full((3, 2), 0.75, F32)
    gb = g.astype(jnp.bfloat16)
    return {  # (function, arguments, tolerance)
        "rms_norm": (lambda x, g: jrn.rms_norm(x, g, zero_centered_gamma=True), (x, g), 1e-5),
        "layer_norm": (lambda x, g, b: jrn.layer_norm(x, g, b), (x, g, b), 1e-5),
        "layer_norm, bf16 gamma": (lambda x, g, b: jrn.layer_norm(x, g, b), (x, gb, b), 1e-2),
        "add_rms_norm": (lambda x, r, g: jrn.add_rms_norm(x, r, g), (x, r, g), 1e-5),
        "add_layer_norm": (lambda x, r, g, b: jrn.add_layer_norm(x, r, g, b), (x, r, g, b), 1e-5),
        "rms_norm_fwd": (lambda x, g: jrn.rms_norm_fwd(x, g), (x, g), 1e-5),
        "layer_norm_fwd": (lambda x, g, b: jrn.layer_norm_fwd(x, g, b), (x, g, b), 1e-5),
        "rms_norm_bwd": (lambda dy, x, rstd, g: jrn.rms_norm_bwd(dy, x, rstd, g), (dy, x, rstd, g), 1e-5),
        "layer_norm_bwd": (lambda dy, x, m, rstd, g: jrn.layer_norm_bwd(dy, x, m, rstd, g), (dy, x, mean, rstd, g),
                           1e-5),
        "stats": (lambda x: (jrn.rms_norm_stats(x), jrn.layer_norm_stats(x)), (x,), 1e-5),
        "apply": (lambda x, st, g, b: jrn.layer_norm_apply(x, st, g, b, hidden_size=H),
                  (x, jrn.layer_norm_stats(x), g, b), 1e-5),
        "fp8 input": (lambda g, s: jrn.layer_norm(q, g, x_scale=s, group_size=8, dtype=F32), (g, s), 1e-5),
    }


@pytest.mark.parametrize("case", list(_transpose_cases()))
def test_backward_is_the_tangent_maps_transpose(case):
    # <ct, J t> == <J^T ct, t>: the jnp tangent map (jvp) against the kernel
    # backward (vjp) at random tangents and cotangents (in the arguments' and
    # outputs' dtypes: bf16 rounds both sides).
    f, args, tol = _transpose_cases()[case]
    tangents = _args(*[(a.shape, a.dtype) for a in args], seed=140)
    outs = jax.eval_shape(f, *args)
    cts = jax.tree.unflatten(jax.tree.structure(outs),
                             _args(*[(o.shape, o.dtype) for o in jax.tree.leaves(outs)], seed=150))
    jt, jtct = jax.jit(lambda a, t, c: (jax.jvp(f, a, t)[1], jax.vjp(f, *a)[1](c)))(tuple(args), tuple(tangents),
                                                                                   cts)
    dot = lambda u, v: sum(float(np.sum(f64(a) * f64(b))) for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(v)))
    lhs, rhs = dot(cts, jt), dot(jtct, tangents)
    assert abs(lhs - rhs) <= tol * max(1.0, abs(lhs)), (lhs, rhs)


# ---------------------------------------------------------------------------
# op by op (disable_jit) and under JAX's strict settings


def _settings_case():
    x, r, g, b, t = _args(((3, H), F32, 0.5), ((3, H), F32), ((H,), jnp.bfloat16, 1.0), ((H,), F32), ((3, H), F32),
                          seed=160)

    def f(x, g):  # a float32 x with a bf16 gamma: the parameters are widened inside
        y, h = jrn.add_layer_norm(x, r, g, b)
        return _loss(y) + _loss(h)

    def f8(x, g):  # an FP8 output, whose tangent is rounded to FP8 too
        return _loss(jrn.rms_norm_fp8_rowwise(jrn.add_layer_norm(x, r, g, b)[1], g)[0])
    return (f, f8), (x, g), (t, jnp.ones_like(g))


@contextlib.contextmanager
def _strict():
    with jax.enable_checks(True), jax.numpy_rank_promotion("raise"), jax.numpy_dtype_promotion("strict"):
        yield


@pytest.mark.parametrize("setting", ["disable_jit", "strict"])
def test_settings(setting):
    # jvp, a hessian-vector product, grad (and linearize): op by op under
    # disable_jit (each primitive compiled alone), traced under the strict
    # settings; as without them.
    # The FP8 output's tangents are FP8: where XLA fuses the float32 tangent
    # differently (op by op against jitted, on a GPU), one may round to the
    # next FP8 value, a relative step of 1/8 for e4m3 (1/16 on a sum's scale).
    fns, args, tangents = _settings_case()
    for f, tol in zip(fns, (1e-4, 1 / 16)):
        run = lambda args, tangents: (jax.jvp(f, args, tangents), _hvp(f)(args, tangents), jax.grad(f, (0, 1))(*args),
                                      jax.linearize(f, *args)[1](*tangents) if setting == "disable_jit" else ())
        want = jax.jit(run)(args, tangents)
        with jax.disable_jit() if setting == "disable_jit" else _strict():
            got = run(args, tangents) if setting == "disable_jit" else jax.jit(run)(args, tangents)
        _all_close(got, want, tol, setting)
