"""FP8 input: rms_norm / layer_norm / add_*_norm of an FP8 x with a scale per
tensor or per group of columns, against float64 references of the dequantized
input; gradients (of gamma, the FP8 x and its scales), vmap, jit, round trip
from the groupwise FP8 output, sharded rows, and bad input."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_rmsnorm as jrn
from reference import (DTYPES, FP8_MAX, assert_close, case_key, f64, gpu_routing_case, poison, put, random, ref_add,
                       ref_forward)

KINDS = ["rms", "layer"]
EPS = {"rms": 1e-6, "layer": 1e-5}
FMTS = [jnp.float8_e4m3fn, jnp.float8_e5m2]
dname = lambda d: np.dtype(d).name
sid = lambda s: "x".join(map(str, s))
# (shape, group_size): hidden 1 (per tensor only), 7 (scalar path), groups of
# 16 and 128 on the register kernel, 8 at hidden 40000 (streaming kernel),
# 128 at 65536 (clusters), and 3 (groups narrower than a pack: scalar loads).
CASES = [((3, 1), None), ((5, 7), 7), ((2, 3, 1024), 16), ((16, 4096), 128), ((3, 40000), 8),
         ((2, 65536), 128), ((4, 96), 3), ((4, 4096), None)]


def _fp8_data(key, shape, group, fmt):
    """(q, x_scale, x_deq): FP8 codes spanning the format, scales of a few
    magnitudes per group, and the exact dequantized value in float64."""
    fmax = FP8_MAX[np.dtype(fmt)]
    v = jax.random.uniform(jax.random.key(key), shape, jnp.float32, -1.0, 1.0) * (fmax / 2)
    q = v.astype(fmt)
    hidden = shape[-1]
    n = 1 if group is None else hidden // group
    s_shape = () if group is None else shape[:-1] + (n,)
    s = jnp.exp2(jax.random.randint(jax.random.key(key + 1), s_shape, -12, -4).astype(jnp.float32)) * \
        jax.random.uniform(jax.random.key(key + 2), s_shape, jnp.float32, 1.0, 2.0)
    g = hidden if group is None else group
    sd = f64(s) if group is None else f64(s)[..., None]
    x = f64(q).reshape(shape[:-1] + (hidden // g, g)) * sd
    return q, s, x.reshape(shape)


def _norm(kind, q, gamma, beta, s, group, dtype, zc=False):
    if kind == "rms":
        return jrn.rms_norm(q, gamma, eps=EPS[kind], zero_centered_gamma=zc, x_scale=s, group_size=group,
                            dtype=dtype)
    return jrn.layer_norm(q, gamma, beta, eps=EPS[kind], zero_centered_gamma=zc, x_scale=s, group_size=group,
                          dtype=dtype)


@pytest.mark.parametrize("fmt", FMTS, ids=dname)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{sid(c[0])}-g{c[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_forward(kind, dtype, case, fmt, platform):
    gpu_routing_case(platform, case, [c for c in CASES if c[0] not in ((16, 4096), (3, 40000), (2, 65536))])
    shape, group = case
    key = case_key(("fp8in", kind, shape, group))
    q, s, x = _fp8_data(key, shape, group, fmt)
    hidden = shape[-1]
    for pdtype, zc in [(dtype, False), (jnp.float32, True)]:
        gamma = random(key + 3, (hidden,), pdtype, scale=0.5, offset=0.0 if zc else 1.0)
        beta = random(key + 4, (hidden,), pdtype, scale=0.5) if kind == "layer" else None
        args = put(platform, q, gamma, beta, s)
        poison(platform, 8 * q.size + 1024)
        y = jax.jit(lambda q, g, b, s: _norm(kind, q, g, b, s, group, dtype, zc))(*args)
        assert y.dtype == dtype and y.shape == shape
        want = ref_forward(kind, x, gamma, beta, EPS[kind], zc)[0]
        assert_close(y, want, dtype, f"{kind} {dname(fmt)} -> {dname(dtype)} {shape} group {group} zc {zc}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_default_dtype_and_no_gamma(kind, dtype, platform):
    q, s, x = _fp8_data(11, (6, 256), 32, jnp.float8_e4m3fn)
    (q, s) = put(platform, q, s)
    y = jax.jit(lambda q, s: _norm(kind, q, None, None, s, 32, None))(q, s)
    assert y.dtype == jnp.bfloat16
    assert_close(y, ref_forward(kind, x, eps=EPS[kind])[0], jnp.bfloat16, f"{kind} default dtype")


@pytest.mark.parametrize("kind", KINDS)
def test_nan_code_propagates(kind, platform):
    q, s, _ = _fp8_data(5, (4, 256), 16, jnp.float8_e4m3fn)
    q = q.at[2, 17].set(jnp.nan)
    (q, s) = put(platform, q, s)
    y = f64(_norm(kind, q, None, None, s, 16, jnp.float32))
    assert np.isnan(y[2]).all() and np.isfinite(np.delete(y, 2, axis=0)).all()


def test_roundtrip_from_groupwise_output(platform):
    """The groupwise FP8 output feeds the FP8 input as it is."""
    x = random(21, (8, 2048), jnp.bfloat16, scale=2.0)
    gamma = random(22, (2048,), jnp.bfloat16, scale=0.3, offset=1.0)
    x, gamma = put(platform, x, gamma)
    q, scales = jrn.rms_norm_fp8_groupwise(x, gamma, group_size=128)
    y = jrn.rms_norm(q, x_scale=scales, group_size=128, dtype=jnp.float32)
    deq = f64(q).reshape(8, 16, 128) * f64(scales)[..., None]
    assert_close(y, ref_forward("rms", deq.reshape(8, 2048))[0], jnp.float32, "round trip")


@pytest.mark.parametrize("kind", KINDS)
def test_residual(kind, platform):
    shape, group = (6, 1024), 64
    q, s, x = _fp8_data(31, shape, group, jnp.float8_e4m3fn)
    r = random(32, shape, jnp.float32, scale=0.1)
    gamma = random(33, (shape[-1],), jnp.bfloat16, offset=1.0)
    beta = random(34, (shape[-1],), jnp.bfloat16) if kind == "layer" else None
    q, s, r, gamma, beta = put(platform, q, s, r, gamma, beta)
    if kind == "rms":
        y, h = jrn.add_rms_norm(q, r, gamma, x_scale=s, group_size=group, h_dtype=jnp.float32)
    else:
        y, h = jrn.add_layer_norm(q, r, gamma, beta, x_scale=s, group_size=group, h_dtype=jnp.float32)
    assert y.dtype == jnp.bfloat16 and h.dtype == jnp.float32
    h_ref = ref_add(jnp.asarray(x, jnp.float32), r, jnp.float32)
    assert_close(h, f64(h_ref), jnp.float32, "h")
    assert_close(y, ref_forward(kind, h_ref, gamma, beta, EPS[kind])[0], jnp.bfloat16, "y")


@pytest.mark.parametrize("group", [None, 16])
@pytest.mark.parametrize("kind", KINDS)
def test_grads(kind, group, platform):
    shape = (6, 512)
    dtype = jnp.float32
    q, s, _ = _fp8_data(41, shape, group, jnp.float8_e4m3fn)
    gamma = random(42, (512,), jnp.float32, scale=0.5, offset=1.0)
    beta = random(43, (512,), jnp.float32, scale=0.5) if kind == "layer" else None
    w = random(44, shape, jnp.float32)
    q, s, gamma, beta, w = put(platform, q, s, gamma, beta, w)

    def loss(q, s, g, b):
        return jnp.sum(_norm(kind, q, g, b, s, group, dtype) * w)

    def ref_loss(q, s, g, b):  # jnp on the dequantized input
        xs = s if group is None else jnp.repeat(s, group, axis=-1)
        xf = q.astype(jnp.float32) * xs
        mean = xf.mean(-1, keepdims=True) if kind == "layer" else 0.0
        y = (xf - mean) * jax.lax.rsqrt(jnp.mean(jnp.square(xf - mean), -1, keepdims=True) + EPS[kind]) * g
        return jnp.sum((y if b is None else y + b) * w)

    argnums = (0, 1, 2) if kind == "rms" else (0, 1, 2, 3)
    got = jax.jit(jax.grad(loss, argnums))(q, s, gamma, beta)
    # jax.grad of the reference w.r.t. the FP8 codes: through their float32 value.
    dq_ref = jax.grad(lambda xf, s, g, b: ref_loss(xf, s, g, b), argnums)(q.astype(jnp.float32), s, gamma, beta)
    fmax = 448.0
    assert got[0].dtype == jnp.float8_e4m3fn
    want_dq = np.clip(f64(dq_ref[0]), -fmax, fmax)
    err = np.abs(f64(got[0]) - want_dq)
    assert (err <= 2.0 ** -3 * np.abs(want_dq) + 2.0 ** -9 + 1e-6 * np.abs(want_dq).max()).all(), "dq"
    # d x_scale sums dx * q over a group, terms that largely cancel (RMSNorm is
    # nearly invariant to a per-tensor scale): the tolerance scales with their
    # absolute sum.
    g = shape[-1] if group is None else group
    s_b = f64(s) if group is None else f64(s)[..., None]
    terms = np.abs(f64(dq_ref[0]) * f64(q)).reshape(shape[:-1] + (shape[-1] // g, g)) / s_b
    terms = terms.sum() if group is None else terms.sum(-1)
    assert_close(got[1], f64(dq_ref[1]), jnp.float32, "dx_scale", scale=np.maximum(terms, 1.0))
    for n in range(2, len(argnums)):
        assert_close(got[n], f64(dq_ref[n]), jnp.float32, f"param {n}", scale=max(1.0, np.abs(f64(dq_ref[n])).max()))


def test_vmap(platform):
    shape, group = (3, 4, 256), 32
    q, s, x = _fp8_data(51, shape, group, jnp.float8_e5m2)
    gamma = random(52, (3, 256), jnp.float32, offset=1.0)  # per-example gamma
    q, s, gamma = put(platform, q, s, gamma)
    f = lambda q, s, g: jrn.rms_norm(q, g, x_scale=s, group_size=group, dtype=jnp.float16)
    y = jax.jit(jax.vmap(f))(q, s, gamma)
    want = np.stack([ref_forward("rms", x[i], gamma[i])[0] for i in range(3)])
    assert_close(y, want, jnp.float16, "vmap")
    # per-tensor scales, one per example
    st = jnp.asarray([0.5, 0.25, 2.0], jnp.float32)
    y = jax.jit(jax.vmap(lambda q, s: jrn.rms_norm(q, x_scale=s, dtype=jnp.float32)))(q, put(platform, st)[0])
    want = np.stack([ref_forward("rms", f64(q[i]) * float(st[i]))[0] for i in range(3)])
    assert_close(y, want, jnp.float32, "vmap per-tensor")


def test_empty(platform):
    q = jnp.zeros((0, 64), jnp.float8_e4m3fn)
    s = jnp.zeros((0, 4), jnp.float32)
    y = jrn.rms_norm(q, x_scale=s, group_size=16, dtype=jnp.float32)
    assert y.shape == (0, 64) and y.dtype == jnp.float32


def test_rows_sharded():
    devs = jax.devices("cpu")[:4]
    mesh = jax.sharding.Mesh(np.array(devs), ("data",))
    q, s, x = _fp8_data(61, (16, 512), 64, jnp.float8_e4m3fn)
    gamma = random(62, (512,), jnp.float32, offset=1.0)
    q = jax.device_put(q, NamedSharding(mesh, P("data", None)))
    s = jax.device_put(s, NamedSharding(mesh, P("data", None)))
    gamma = jax.device_put(gamma, NamedSharding(mesh, P()))
    f = jax.jit(lambda q, s, g: jrn.rms_norm(q, g, x_scale=s, group_size=64, dtype=jnp.float32))
    y = f(q, s, gamma)
    assert_close(y, ref_forward("rms", x, gamma)[0], jnp.float32, "sharded rows")
    hlo = f.lower(q, s, gamma).compile().as_text()
    assert "all-gather" not in hlo and "all-reduce" not in hlo


def test_bad_input():
    q = jnp.zeros((4, 64), jnp.float8_e4m3fn)
    with pytest.raises(TypeError, match="x_scale is required"):
        jrn.rms_norm(q)
    with pytest.raises(ValueError, match="needs group_size"):
        jrn.rms_norm(q, x_scale=jnp.ones((4, 4), jnp.float32))
    with pytest.raises(ValueError, match=r"x_scale must have shape \(4, 4\)"):
        jrn.rms_norm(q, x_scale=jnp.ones((4, 2), jnp.float32), group_size=16)
    with pytest.raises(TypeError, match="x_scale must be float32"):
        jrn.rms_norm(q, x_scale=jnp.ones((), jnp.bfloat16))
    with pytest.raises(ValueError, match="group_size must divide the hidden size 64, got 30"):
        jrn.rms_norm(q, x_scale=jnp.ones((4, 2), jnp.float32), group_size=30)
    with pytest.raises(TypeError, match="dtype .* must be float32, bfloat16 or float16"):
        jrn.rms_norm(q, x_scale=1.0, dtype=jnp.int8)
    with pytest.raises(TypeError, match="gamma must be float32, bfloat16 or float16, got int8"):
        jrn.rms_norm(q, jnp.ones((64,), jnp.int8), x_scale=1.0, dtype=jnp.float16)
    with pytest.raises(ValueError, match="x_scale is only for an FP8 x"):
        jrn.rms_norm(jnp.ones((4, 64)), x_scale=1.0)
    with pytest.raises(TypeError, match="x must be float32, bfloat16 or float16"):
        jrn.rms_norm_fp8(q, scale=1.0)
    with pytest.raises(NotImplementedError, match="axis_name"):
        jrn.rms_norm(q, x_scale=1.0, axis_name="model")
