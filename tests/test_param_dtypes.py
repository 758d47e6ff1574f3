"""Parameters of any supported float dtype with any supported x dtype: gamma
and beta of float32, bfloat16 or float16 (alike or not) with x of any of
them, against the float64 reference, forward and gradient; the gradients
come back in each parameter's own dtype, the output in x's."""

import itertools

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from reference import (DTYPES, FP8_MAX, TOL, assert_close, assert_fp8_close, case_key, f64, put, random, ref_add,
                       ref_backward, ref_forward, y_error)

EPS = {"rms": 1e-6, "layer": 1e-5}
SHAPE = (6, 3, 40)
ROWS = 18
name = lambda d: "none" if d is None else np.dtype(d).name

# (kind, x, gamma, beta dtypes): every combination, and LayerNorm's shift
# without a scale.
COMBOS = [("rms", x, g, None) for x, g in itertools.product(DTYPES, DTYPES)] + [
    ("layer", x, g, b) for x, g, b in itertools.product(DTYPES, DTYPES + [None], DTYPES + [None]) if g or b]


def _data(kind, x_dtype, g_dtype, b_dtype, zc=False, key=0):
    x = random(key, SHAPE, x_dtype, scale=2.0, offset=0.5)
    dy = random(key + 1, SHAPE, x_dtype)
    gamma = None if g_dtype is None else random(key + 2, SHAPE[-1:], g_dtype, scale=0.5, offset=0.0 if zc else 1.0)
    beta = None if b_dtype is None or kind == "rms" else random(key + 3, SHAPE[-1:], b_dtype, scale=0.5)
    return x, dy, gamma, beta


def _coarsest(*dtypes):
    """The dtype of the widest tolerance among ``dtypes``."""
    return max((d for d in dtypes if d is not None), key=lambda d: TOL[np.dtype(d)][0])


def _check_grads(what, grads, args, dtypes, refs, sums_from=1):
    """Each gradient in its argument's dtype, close to the float64 one within
    the tolerance of ``dtypes``; those from ``sums_from`` on (dgamma, dbeta)
    are sums over the rows."""
    for n, (gv, a, ref) in enumerate(zip(grads, args, refs)):
        assert gv.dtype == a.dtype, f"{what} grad {n}: {gv.dtype} != {a.dtype}"
        assert_close(gv, ref, dtypes[n], f"{what} grad {n}",
                     scale=max(1.0, np.abs(ref).max(), np.sqrt(ROWS)) if n >= sums_from else None)


@pytest.mark.parametrize("kind, x_dtype, g_dtype, b_dtype", COMBOS, ids=lambda v: v if isinstance(v, str) else name(v))
def test_norm(kind, x_dtype, g_dtype, b_dtype, platform):
    zc = kind == "rms"
    key = case_key((kind, name(x_dtype), name(g_dtype), name(b_dtype)))
    x, dy, gamma, beta = _data(kind, x_dtype, g_dtype, b_dtype, zc, key)
    x, dy, gamma, beta = put(platform, x, dy, gamma, beta)
    norm = (lambda x, g, b: jrn.rms_norm(x, g, zero_centered_gamma=zc)) if kind == "rms" else (
        lambda x, g, b: jrn.layer_norm(x, g, b))
    loss = lambda x, g, b: jnp.sum(norm(x, g, b).astype(jnp.float32) * dy.astype(jnp.float32))
    argnums = tuple(i for i, a in enumerate((x, gamma, beta)) if a is not None)
    y, grads = jax.jit(lambda *a: (norm(*a), jax.grad(loss, argnums)(*a)))(x, gamma, beta)

    what = f"{kind} x {name(x_dtype)} gamma {name(g_dtype)} beta {name(b_dtype)}"
    y_ref, _, _ = ref_forward(kind, x, gamma, beta, EPS[kind], zc)
    assert y.dtype == x.dtype
    assert_close(y, y_ref, x_dtype, what + " y")
    refs = ref_backward(kind, dy, x, gamma, EPS[kind], zc)
    present = [a for a in (x, gamma, beta) if a is not None]
    _check_grads(what, grads, present, [a.dtype for a in present],
                 [r for r, a in zip(refs, (x, gamma, beta)) if a is not None])


@pytest.mark.parametrize("x_dtype, g_dtype", [(jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float16),
                                              (jnp.float16, jnp.bfloat16), (jnp.float16, jnp.float32)],
                         ids=lambda d: name(d))
def test_fwd_bwd_halves(x_dtype, g_dtype, platform):
    # The explicit halves: statistics from the forward, dgamma (dbeta in
    # gamma's dtype) from the backward.
    x, dy, gamma, _ = _data("layer", x_dtype, g_dtype, None, key=7)
    x, dy, gamma = put(platform, x, dy, gamma)
    what = f"x {name(x_dtype)} gamma {name(g_dtype)}"
    y, rstd = jax.jit(lambda x, g: jrn.rms_norm_fwd(x, g))(x, gamma)
    assert_close(y, ref_forward("rms", x, gamma, None, EPS["rms"])[0], x_dtype, what + " rms y")
    dx, dgamma = jax.jit(lambda *a: jrn.rms_norm_bwd(*a, zero_centered_gamma=True))(dy, x, rstd, gamma)
    refs = ref_backward("rms", dy, x, gamma, EPS["rms"], zero_centered=True)
    _check_grads(what + " rms", (dx, dgamma), (x, gamma), (x_dtype, g_dtype), refs)

    beta = gamma * 0.5
    y, mean, rstd = jax.jit(lambda x, g, b: jrn.layer_norm_fwd(x, g, b))(x, gamma, beta)
    assert_close(y, ref_forward("layer", x, gamma, beta, EPS["layer"])[0], x_dtype, what + " layer y")
    dx, dgamma, dbeta = jax.jit(jrn.layer_norm_bwd)(dy, x, mean, rstd, gamma)
    refs = ref_backward("layer", dy, x, gamma, EPS["layer"])
    _check_grads(what + " layer", (dx, dgamma, dbeta), (x, gamma, beta), (x_dtype, g_dtype, g_dtype), refs)


@pytest.mark.parametrize("x_dtype, g_dtype, b_dtype", [(jnp.float32, jnp.bfloat16, jnp.float16),
                                                       (jnp.bfloat16, jnp.float16, jnp.float32),
                                                       (jnp.float16, jnp.bfloat16, jnp.bfloat16)],
                         ids=lambda d: name(d))
def test_stats_apply(x_dtype, g_dtype, b_dtype, platform):
    x, dy, gamma, beta = _data("layer", x_dtype, g_dtype, b_dtype, key=11)
    x, dy, gamma, beta = put(platform, x, dy, gamma, beta)
    H = SHAPE[-1]

    def norms(x, g, b):
        return (jrn.rms_norm_apply(x, jrn.rms_norm_stats(x), g, hidden_size=H),
                jrn.layer_norm_apply(x, jrn.layer_norm_stats(x)[None], g, b, hidden_size=H))

    loss = lambda x, g, b: sum(jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32)) for y in norms(x, g, b))
    ys, grads = jax.jit(lambda *a: (norms(*a), jax.grad(loss, (0, 1, 2))(*a)))(x, gamma, beta)
    what = f"apply x {name(x_dtype)} gamma {name(g_dtype)} beta {name(b_dtype)}"
    for kind, y in zip(("rms", "layer"), ys):
        assert y.dtype == x.dtype
        assert_close(y, ref_forward(kind, x, gamma, beta if kind == "layer" else None, EPS[kind])[0], x_dtype,
                     f"{what} {kind} y")
    rms_refs, layer_refs = (ref_backward(k, dy, x, gamma, EPS[k]) for k in ("rms", "layer"))
    refs = [rms_refs[0] + layer_refs[0], rms_refs[1] + layer_refs[1], layer_refs[2]]
    _check_grads(what, grads, (x, gamma, beta), (x_dtype, g_dtype, b_dtype), refs)


@pytest.mark.parametrize("h_dtype", [None, jnp.float32], ids=name)
@pytest.mark.parametrize("x_dtype, g_dtype, b_dtype", [(jnp.float32, jnp.bfloat16, jnp.float16),
                                                       (jnp.bfloat16, jnp.float16, jnp.float16),
                                                       (jnp.bfloat16, jnp.float32, jnp.bfloat16),
                                                       (jnp.float16, jnp.bfloat16, None)],
                         ids=lambda d: name(d))
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_add_norm(kind, x_dtype, g_dtype, b_dtype, h_dtype, platform):
    x, dy, gamma, beta = _data(kind, x_dtype, g_dtype, b_dtype, key=case_key((kind, name(x_dtype), name(h_dtype))))
    r = random(5, SHAPE, jnp.float32, scale=0.5)
    x, dy, gamma, beta, r = put(platform, x, dy, gamma, beta, r)
    fn = (lambda x, r, g, b: jrn.add_rms_norm(x, r, g, h_dtype=h_dtype)) if kind == "rms" else (
        lambda x, r, g, b: jrn.add_layer_norm(x, r, g, b, h_dtype=h_dtype))
    loss = lambda *a: jnp.sum(fn(*a)[0].astype(jnp.float32) * dy.astype(jnp.float32))
    argnums = (0, 1, 2) if beta is None else (0, 1, 2, 3)
    (y, h), grads = jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums)(*a)))(x, r, gamma, beta)

    what = f"add {kind} x {name(x_dtype)} gamma {name(g_dtype)} beta {name(b_dtype)} h {name(h_dtype)}"
    h_ref = ref_add(x, r, h_dtype or x_dtype)
    assert y.dtype == x.dtype and h.dtype == (h_dtype or x_dtype)
    assert_close(y, ref_forward(kind, h_ref, gamma, beta, EPS[kind])[0], x_dtype, what + " y")
    # The norm's gradient at h; it is both x's and the residual's.
    # The norm's gradient at h is both x's and the residual's, computed in h's dtype.
    dh, dgamma, dbeta = ref_backward(kind, dy, h_ref, gamma, EPS[kind])
    args = [x, r, gamma, beta][:len(argnums)]
    _check_grads(what, grads, args, [x_dtype, h_dtype or x_dtype, g_dtype, b_dtype], [dh, dh, dgamma, dbeta],
                 sums_from=2)


@pytest.mark.parametrize("quant", ["tensor", "current", "row", "group"])
@pytest.mark.parametrize("x_dtype, g_dtype, b_dtype", [(jnp.float32, jnp.bfloat16, jnp.float16),
                                                       (jnp.bfloat16, jnp.float16, jnp.float32),
                                                       (jnp.float16, jnp.float32, jnp.bfloat16)],
                         ids=lambda d: name(d))
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_fp8_output(kind, x_dtype, g_dtype, b_dtype, quant, platform):
    x, dy, gamma, beta = _data(kind, x_dtype, g_dtype, b_dtype, key=case_key((kind, quant, name(x_dtype))))
    x, dy, gamma, beta = put(platform, x, dy, gamma, beta)
    fn = getattr(jrn, f"{kind}_norm_fp8" + {"tensor": "", "current": "_current", "row": "_rowwise",
                                            "group": "_groupwise"}[quant])
    kw = {"tensor": dict(scale=4.0), "group": dict(group_size=8)}.get(quant, {})
    call = (lambda x, g, b: fn(x, g, **kw)) if kind == "rms" else (lambda x, g, b: fn(x, g, b, **kw))
    # Straight-through: q's cotangent (FP8) as the norm's.
    loss = lambda *a: jnp.sum(call(*a)[0].astype(jnp.float32) * dy.astype(jnp.float32))
    argnums = (0, 1) if beta is None else (0, 1, 2)
    (q, qs), grads = jax.jit(lambda *a: (call(*a), jax.grad(loss, argnums)(*a)))(x, gamma, beta)

    what = f"fp8 {quant} {kind} x {name(x_dtype)} gamma {name(g_dtype)} beta {name(b_dtype)}"
    y = ref_forward(kind, x, gamma, beta, EPS[kind])[0]
    fmax = FP8_MAX[np.dtype(jnp.float8_e4m3fn)]
    if quant == "tensor":
        scale = 4.0
    elif quant == "current":
        scale = fmax / np.abs(y).max()
    elif quant == "row":
        scale = fmax / np.abs(y).max(-1, keepdims=True)
    else:
        scale = np.repeat(fmax / np.abs(y.reshape(y.shape[:-1] + (-1, 8))).max(-1), 8, axis=-1)
    want = np.clip(y * scale, -fmax, fmax)
    assert_fp8_close(q, want, jnp.float8_e4m3fn, what + " q", y_err=y_error(y) * np.max(scale))
    refs = ref_backward(kind, f64(dy.astype(jnp.float8_e4m3fn)), x, gamma, EPS[kind])
    args = [x, gamma, beta][:len(argnums)]
    _check_grads(what, grads, args, [x_dtype, g_dtype, b_dtype], refs)


@pytest.mark.parametrize("dtype, g_dtype, b_dtype", [(jnp.bfloat16, jnp.float16, jnp.float32),
                                                     (jnp.float32, jnp.bfloat16, jnp.bfloat16),
                                                     (jnp.float16, jnp.bfloat16, None)],
                         ids=lambda d: name(d))
def test_fp8_input(dtype, g_dtype, b_dtype, platform):
    # An FP8 x with y in `dtype`: the parameters of any dtype with any `dtype`.
    kind = "layer" if b_dtype is not None else "rms"
    x, dy, gamma, beta = _data(kind, jnp.float32, g_dtype, b_dtype, key=23)
    q = x.astype(jnp.float8_e4m3fn)
    q, dy, gamma, beta = put(platform, q, dy.astype(dtype), gamma, beta)
    norm = (lambda g, b: jrn.rms_norm(q, g, x_scale=0.5, dtype=dtype)) if kind == "rms" else (
        lambda g, b: jrn.layer_norm(q, g, b, x_scale=0.5, dtype=dtype))
    loss = lambda g, b: jnp.sum(norm(g, b).astype(jnp.float32) * dy.astype(jnp.float32))
    argnums = (0,) if beta is None else (0, 1)
    y, grads = jax.jit(lambda *a: (norm(*a), jax.grad(loss, argnums)(*a)))(gamma, beta)

    what = f"fp8 x, y {name(dtype)} gamma {name(g_dtype)} beta {name(b_dtype)}"
    x_deq = f64(q) * 0.5
    assert y.dtype == dtype
    assert_close(y, ref_forward(kind, x_deq, gamma, beta, EPS[kind])[0], dtype, what + " y")
    # The backward runs on x dequantized into `dtype`.
    refs = ref_backward(kind, dy, jnp.asarray(x_deq, dtype), gamma, EPS[kind])[1:]
    _check_grads(what, grads, [gamma, beta][:len(argnums)], [g_dtype, b_dtype], refs, sums_from=0)


@pytest.mark.parametrize("x_dtype, param_dtype", [(jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float16),
                                                  (jnp.float16, jnp.float32)], ids=name)
@pytest.mark.parametrize("name_", ["RMSNorm", "LayerNorm"])
def test_modules_match_upstream(name_, x_dtype, param_dtype, platform):
    # The drop-ins with parameters of another dtype than x's: the output and
    # the gradients of the modules they replace.
    nnx = pytest.importorskip("flax.nnx")
    eqx = pytest.importorskip("equinox")
    import jax_rmsnorm.equinox as jeqx
    import jax_rmsnorm.flax.nnx as jnnx

    (x,) = put(platform, random(31, (4, 48), x_dtype, scale=2.0, offset=0.3))
    tol = _coarsest(x_dtype, param_dtype)
    ours = getattr(jnnx, name_)(48, param_dtype=param_dtype, rngs=nnx.Rngs(0))
    theirs = getattr(nnx, name_)(48, param_dtype=param_dtype, rngs=nnx.Rngs(0))
    for m in (ours, theirs):  # the same non-trivial parameters
        m.scale[...] = random(32, (48,), param_dtype, scale=0.3, offset=1.0)
    y, y_ref = ours(x), theirs(x)
    assert y.dtype == y_ref.dtype
    assert_close(y, f64(y_ref), tol, f"nnx {name_}")
    grad = lambda m: nnx.grad(lambda m: jnp.sum(jnp.sin(m(x).astype(jnp.float32))))(m)
    for a, b in zip(jax.tree.leaves(grad(ours)), jax.tree.leaves(grad(theirs))):
        assert a.dtype == b.dtype == param_dtype
        assert_close(a, f64(b), tol, f"nnx {name_} grad", scale=max(1.0, np.abs(f64(b)).max()))

    ours, theirs = getattr(jeqx, name_)(48, dtype=param_dtype), getattr(eqx.nn, name_)(48, dtype=param_dtype)
    w = random(33, (48,), param_dtype, scale=0.3, offset=1.0)
    ours, theirs = (eqx.tree_at(lambda m: m.weight, m, w) for m in (ours, theirs))
    y, y_ref = jax.vmap(ours)(x), jax.vmap(theirs)(x)
    assert y.dtype == y_ref.dtype
    assert_close(y, f64(y_ref), tol, f"equinox {name_}")
    loss = lambda m: jnp.sum(jnp.sin(jax.vmap(m)(x).astype(jnp.float32)))
    for a, b in zip(jax.tree.leaves(eqx.filter(eqx.filter_grad(loss)(ours), eqx.is_array)),
                    jax.tree.leaves(eqx.filter(eqx.filter_grad(loss)(theirs), eqx.is_array))):
        assert a.dtype == b.dtype
        assert_close(a, f64(b), tol, f"equinox {name_} grad", scale=max(1.0, np.abs(f64(b)).max()))
