"""Block-scaled outputs (rms_norm_mxfp8 / layer_norm_mxfp8, rms_norm_nvfp4 /
layer_norm_nvfp4) and the per-group FP8 output's power-of-two scales, on the
CPU and, for the rowwise outputs, on the GPU (test_kernel_*).

Codes and scales are checked bit for bit against the NumPy reference
quantizer (reference.quantize_blocks, itself bit-exact against jax.nn's) run
on the kernel's own float32 y, which the plain norm of the float32-cast
inputs gives bit for bit on the CPU; that y is checked against float64, and
the dequantized output against the float64 norm within the format's error.
"""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_dtypes

import jax_rmsnorm as jrn
from reference import (DTYPES, FP8_MAX, assert_close, case_key, f64, poison, pow2_group_scales, put, quantize_blocks,
                       random, ref_add, ref_forward, ref_scales)

E4M3, E5M2, E2M1 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float4_e2m1fn
EPS = {"rms": 1e-6, "layer": 1e-5}
KINDS = ["rms", "layer"]
dname = lambda d: np.dtype(d).name
CPU = jax.devices("cpu")[0]


def _bits(a):
    """The codes' bits (uint8), from an FP8, float4 or E8M0 array."""
    return np.ascontiguousarray(np.asarray(a)).view(np.uint8)


def _params(kind, hidden, dtype, key, spread=0):
    """gamma (and LayerNorm's beta); with ``spread``, gamma times a power of
    two from 2**-spread to 2**spread for each 16 columns, so that the blocks'
    scales differ (y's rows are normalized: x's magnitudes do not show)."""
    gamma = random(key + 1, (hidden,), jnp.float32, scale=0.5, offset=1.0)
    if spread:
        k = jnp.round(random(key + 4, (hidden // 16, 1), jnp.float32, scale=spread / 2))
        gamma = (gamma.reshape(-1, 16) * jnp.exp2(jnp.clip(k, -spread, spread))).reshape(hidden)
    gamma = gamma.astype(dtype)
    beta = random(key + 2, (hidden,), dtype, scale=0.3) if kind == "layer" else None
    return gamma, beta


def _mxfp8(kind, x, gamma, beta, **kw):
    return (jrn.rms_norm_mxfp8(x, gamma, **kw) if kind == "rms" else jrn.layer_norm_mxfp8(x, gamma, beta, **kw))


def _nvfp4(kind, x, gamma, beta, **kw):
    return (jrn.rms_norm_nvfp4(x, gamma, **kw) if kind == "rms" else jrn.layer_norm_nvfp4(x, gamma, beta, **kw))


def _kernel_y(kind, x, gamma, beta):
    """The float32 y the quantizing kernel computes, from the plain norm of
    the inputs cast to float32 (exact casts, the same CPU kernel), checked
    against float64."""
    f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)
    if kind == "rms":
        y = jrn.rms_norm(f32(x), f32(gamma), eps=EPS[kind])
    else:
        y = jrn.layer_norm(f32(x), f32(gamma), f32(beta), eps=EPS[kind])
    y = np.asarray(y)
    want, _, _ = ref_forward(kind, x, gamma, beta, EPS[kind])
    assert_close(y, want, jnp.float32, f"{kind} float32 y")
    return y, want


def _dequantized(q, scales, block, global_scale=1.0):
    q = np.asarray(q).astype(np.float32).astype(np.float64)
    s = np.repeat(np.asarray(scales).astype(np.float32).astype(np.float64), block, axis=-1)
    return q * s * global_scale


SHAPES = [(3, 5, 64), (7, 256), (2, 1024)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("out_dtype", [E4M3, E5M2], ids=dname)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_mxfp8_bit_exact(kind, dtype, out_dtype, shape):
    key = case_key(("mxfp8", kind, dname(dtype), dname(out_dtype), shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.3)
    gamma, beta = _params(kind, shape[-1], dtype, key, spread=12)
    q, s = _mxfp8(kind, x, gamma, beta, out_dtype=out_dtype)
    assert q.dtype == np.dtype(out_dtype) and q.shape == x.shape
    assert s.dtype == np.dtype(jnp.float8_e8m0fnu) and s.shape == x.shape[:-1] + (shape[-1] // 32,)
    y, y64 = _kernel_y(kind, x, gamma, beta)
    rq, rs = quantize_blocks(y, "mxfp8", out_dtype, 32)
    np.testing.assert_array_equal(_bits(s), rs)
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    assert len(np.unique(rs)) > 1  # scales differ: gamma's blocks spread over binades
    # within the format's error of the float64 norm: half a step relative,
    # half the smallest subnormal times the scale, and float32's error in y
    fmt = np.dtype(out_dtype)
    scale = np.repeat(np.asarray(s).astype(np.float32).astype(np.float64), 32, axis=-1)
    sub = {np.dtype(E4M3): 2.0 ** -9, np.dtype(E5M2): 2.0 ** -16}[fmt]
    bound = (2.0 ** -4 if fmt == np.dtype(E4M3) else 2.0 ** -3) * np.abs(y64) + sub / 2 * scale + 1e-5 * np.abs(y64)
    assert (np.abs(_dequantized(q, s, 32) - y64) <= bound + 1e-300).all()


@pytest.mark.parametrize("shape", SHAPES + [(4, 48)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_nvfp4_bit_exact(kind, dtype, shape):
    # hidden 48: a multiple of 16 (NVFP4's block) but not of 32
    key = case_key(("nvfp4", kind, dname(dtype), shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.3)
    gamma, beta = _params(kind, shape[-1], dtype, key, spread=6)
    y, y64 = _kernel_y(kind, x, gamma, beta)
    # the usual global scale (amax / (6 * 448)), and one that makes some
    # blocks' scales saturate at 448 and others round to small E4M3 subnormals
    for g in (np.float32(np.abs(y64).max() / (6 * 448)), np.float32(3e-4)):
        q, s = _nvfp4(kind, x, gamma, beta, global_scale=jnp.float32(g))
        assert q.dtype == np.dtype(E2M1) and q.shape == x.shape
        assert s.dtype == np.dtype(E4M3) and s.shape == x.shape[:-1] + (shape[-1] // 16,)
        rq, rs = quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, 16, global_scale=g)
        np.testing.assert_array_equal(_bits(s), _bits(rs))
        np.testing.assert_array_equal(_bits(q), _bits(rq))
        assert len(np.unique(_bits(q))) > 8
        # the format's error: a quarter of |y| (one mantissa bit), half a
        # scale's worth near zero and where the E4M3 scale rounded down (codes
        # saturate at 6), and the saturated blocks' excess over 448 scales
        sv = np.repeat(np.asarray(s).astype(np.float32).astype(np.float64), 16, axis=-1) * g
        deq = _dequantized(q, s, 16, np.float64(g))
        over = np.maximum(np.abs(y64) - 6 * 448 * np.float64(g), 0)
        bound = 0.25 * np.abs(y64) + 0.5 * sv + over + 1e-5 * np.abs(y64)
        assert (np.abs(deq - y64) <= bound).all()


@pytest.mark.parametrize("kind", KINDS)
def test_matches_jax_quantizer(kind):
    # The library's codes and scales are those jax.nn's quantizer
    # (scaled_dot_general's) makes of the same float32 y.
    sm = pytest.importorskip("jax._src.cudnn.scaled_matmul_stablehlo")
    x = random(case_key(("jaxq", kind)), (2, 16, 128), jnp.bfloat16, scale=2.0)
    gamma, beta = _params(kind, 128, jnp.bfloat16, 5)
    y, _ = _kernel_y(kind, x, gamma, beta)
    g = jnp.float32(2e-3)
    for mode, block, codes, stype, kw in (("mxfp8", 32, E4M3, jnp.float8_e8m0fnu, {}),
                                          ("nvfp4", 16, E2M1, E4M3, dict(global_scale=g))):
        cfg = sm.BlockScaleConfig(mode=mode, block_size=block, data_type=codes, scale_type=stype,
                                  global_scale=g if mode == "nvfp4" else None, infer_only=False)
        jq, js = jax.jit(lambda y: sm.quantize(y, cfg))(jnp.asarray(y))
        q, s = (_mxfp8 if mode == "mxfp8" else _nvfp4)(kind, x, gamma, beta, **kw)
        np.testing.assert_array_equal(_bits(q), _bits(jq))
        np.testing.assert_array_equal(_bits(s), _bits(js))


def test_nan_inf_zero_and_tiny_blocks():
    # gamma picks the blocks: column 3 NaN, 40 infinite (every row's y there
    # is +-inf), 64..95 zero (an all-zero MXFP8 block, two NVFP4 blocks),
    # 96..111 tiny (an NVFP4 scale that rounds to 0).
    x = random(7, (4, 128), jnp.float32, offset=0.5)
    gamma = np.ones(128, np.float32)
    gamma[3], gamma[40], gamma[64:96], gamma[96:112] = np.nan, np.inf, 0.0, 1e-30
    gamma = jnp.asarray(gamma)
    y = np.asarray(jrn.rms_norm(x, gamma))
    q, s = jrn.rms_norm_mxfp8(x, gamma)
    rq, rs = quantize_blocks(y, "mxfp8", E4M3, 32)
    np.testing.assert_array_equal(_bits(s), rs)
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    sb, qb = _bits(s), _bits(q)
    assert (sb[:, 0] == 0xFF).all() and (sb[:, 1] == 0xFF).all()  # NaN, infinity: the E8M0 NaN
    assert (qb[:, :64] == 0x7F).all()  # and NaN codes
    assert (sb[:, 2] == 0).all() and (qb[:, 64:96] & 0x7F == 0).all()  # all zero: 2**-127, (signed) zeros
    assert np.isnan(np.asarray(s, np.float32)[:, :2]).all()

    q, s = jrn.rms_norm_nvfp4(x, gamma, global_scale=0.01)
    rq, rs = quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, 16, global_scale=np.float32(0.01))
    np.testing.assert_array_equal(_bits(s), _bits(rs))
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    sv, qb = np.asarray(s, np.float32), _bits(q)
    assert np.isnan(sv[:, [0, 2]]).all() and (qb[:, 0:16] == 0).all() and (qb[:, 32:48] == 0).all()
    assert (sv[:, 4:7] == 0).all() and (qb[:, 64:112] == 0).all()  # zero and tiny blocks: scale 0, codes +0
    assert np.isfinite(sv[:, [1, 3, 7]]).all() and (sv[:, [1, 3, 7]] > 0).all()


@pytest.mark.parametrize("group, fmt, ub", [(128, E4M3, None), (16, E5M2, None), (32, E4M3, 1e-3)])
@pytest.mark.parametrize("kind", KINDS)
def test_power_of_two_scales(kind, group, fmt, ub):
    shape = (6, 256)
    key = case_key(("pow2", kind, group))
    x = random(key, shape, jnp.bfloat16, scale=2.0)
    gamma, beta = _params(kind, 256, jnp.bfloat16, key)
    gamma = gamma.at[:group].set(0)  # an all-zero group: the floor's power of two
    kw = dict(group_size=group, out_dtype=fmt, scale_ub=ub, power_of_two_scales=True)
    q, s = (jrn.rms_norm_fp8_groupwise(x, gamma, **kw) if kind == "rms"
            else jrn.layer_norm_fp8_groupwise(x, gamma, beta, **kw))
    y, y64 = _kernel_y(kind, x, gamma, beta)
    want = pow2_group_scales(y, fmt, group, np.inf if ub is None else ub)
    np.testing.assert_array_equal(np.asarray(s).view(np.uint32), want.view(np.uint32))
    assert np.all(np.log2(np.asarray(s)) == np.round(np.log2(np.asarray(s))))  # powers of two
    if kind == "rms":
        assert (np.asarray(s)[:, 0] == 2.0 ** -39).all()  # pow2 ceil of the 1e-12 floor
    top = np.float32(FP8_MAX[np.dtype(fmt)])
    mul = np.repeat(np.float32(1) / want, group, axis=-1)
    rq = np.clip(y * mul, -top, top).astype(fmt)  # exact product: 1 / scale is a power of two
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    if ub is None:  # not clamped: within the format's error, never saturated
        deq = np.asarray(q).astype(np.float64) * np.repeat(want.astype(np.float64), group, axis=-1)
        assert (np.abs(deq - y64) <= 2.0 ** -3 * np.abs(y64) + 2.0 ** -16 * np.abs(deq).max() + 1e-5).all()
    # the float32 scales of the same call without rounding differ: the option is read
    _, s_plain = (jrn.rms_norm_fp8_groupwise(x, gamma, group_size=group, out_dtype=fmt, scale_ub=ub)
                  if kind == "rms" else
                  jrn.layer_norm_fp8_groupwise(x, gamma, beta, group_size=group, out_dtype=fmt, scale_ub=ub))
    assert not np.array_equal(np.asarray(s_plain), np.asarray(s))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("kind", KINDS)
def test_residual(kind, fmt):
    shape = (5, 96 if fmt == "nvfp4" else 128)
    key = case_key(("blk_res", kind, fmt))
    x = random(key, shape, jnp.bfloat16)
    r = random(key + 5, shape, jnp.float32)
    gamma, beta = _params(kind, shape[-1], jnp.bfloat16, key)
    run = _mxfp8 if fmt == "mxfp8" else _nvfp4
    kw = {} if fmt == "mxfp8" else dict(global_scale=1e-3)
    q, s, h = run(kind, x, gamma, beta, residual=r, h_dtype=jnp.float32, **kw)
    np.testing.assert_array_equal(np.asarray(h), np.asarray(ref_add(x, r, jnp.float32)))
    q2, s2 = run(kind, h, gamma, beta, **kw)
    np.testing.assert_array_equal(_bits(q), _bits(q2))
    np.testing.assert_array_equal(_bits(s), _bits(s2))


def test_shapes_fit_scaled_matmul():
    # (batch, rows, hidden) outputs are the operands jax.nn.scaled_matmul takes.
    a = random(1, (2, 8, 64), jnp.bfloat16)
    b = random(2, (2, 16, 64), jnp.bfloat16)
    for run, kw in ((jrn.rms_norm_mxfp8, {}), (jrn.rms_norm_mxfp8, dict(out_dtype=E5M2)),
                    (jrn.rms_norm_nvfp4, dict(global_scale=1.0))):
        (qa, sa), (qb, sb) = run(a, **kw), run(b, **kw)
        out = jax.eval_shape(jax.nn.scaled_matmul, qa, qb, sa, sb)
        assert out.shape == (2, 8, 16)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_dequantized_matmul(fmt):
    # The matmul of the dequantized outputs is that of the float32 norm
    # outputs within the bound the two operands' quantization errors give.
    a = random(3, (32, 256), jnp.float32, scale=2.0, offset=0.1)
    b = random(4, (48, 256), jnp.float32)
    ga = random(5, (256,), jnp.float32, offset=1.0)
    ya, yb = np.asarray(jrn.rms_norm(a, ga), np.float64), np.asarray(jrn.rms_norm(b), np.float64)
    if fmt == "mxfp8":
        (qa, sa), (qb, sb) = jrn.rms_norm_mxfp8(a, ga), jrn.rms_norm_mxfp8(b)
        da, db = _dequantized(qa, sa, 32), _dequantized(qb, sb, 32)
        rel, sub_a, sub_b = 2.0 ** -4, 2.0 ** -10 * np.repeat(f64(sa), 32, -1), 2.0 ** -10 * np.repeat(f64(sb), 32, -1)
    else:
        # each tensor's global scale from its amax, as NVFP4 recipes take it
        g, h = (float(np.float32(np.abs(v).max() / (6 * 448))) for v in (ya, yb))
        (qa, sa), (qb, sb) = jrn.rms_norm_nvfp4(a, ga, global_scale=g), jrn.rms_norm_nvfp4(b, global_scale=h)
        da, db = _dequantized(qa, sa, 16, g), _dequantized(qb, sb, 16, h)
        rel, sub_a, sub_b = 0.25, 0.5 * g * np.repeat(f64(sa), 16, -1), 0.5 * h * np.repeat(f64(sb), 16, -1)
    ea = rel * np.abs(ya) + sub_a + 1e-6
    eb = rel * np.abs(yb) + sub_b + 1e-6
    assert (np.abs(da - ya) <= ea).all() and (np.abs(db - yb) <= eb).all()
    bound = ea @ np.abs(db).T + np.abs(ya) @ eb.T
    err = np.abs(da @ db.T - ya @ yb.T)
    assert (err <= bound).all()
    assert 0 < err.max() < 0.05 * (np.abs(ya) @ np.abs(yb).T).max()  # a real error, small against the terms


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("kind", KINDS)
def test_vmap(kind, fmt):
    key = case_key(("blk_vmap", kind, fmt))
    x = random(key, (3, 4, 64), jnp.bfloat16, scale=2.0)
    gammas = random(key + 1, (3, 64), jnp.float32, offset=1.0)  # per-example parameters
    betas = random(key + 2, (3, 64), jnp.float32)
    gs = jnp.asarray([1e-3, 2e-2, 0.5], jnp.float32)  # per-example global scales (NVFP4)

    def one(x, g, b, gs):
        bb = b if kind == "layer" else None
        return _mxfp8(kind, x, g, bb) if fmt == "mxfp8" else _nvfp4(kind, x, g, bb, global_scale=gs)

    q, s = jax.vmap(one)(x, gammas, betas, gs)
    for i in range(3):
        qi, si = one(x[i], gammas[i], betas[i], gs[i])
        np.testing.assert_array_equal(_bits(q[i]), _bits(qi))
        np.testing.assert_array_equal(_bits(s[i]), _bits(si))
    if fmt == "nvfp4":  # the global scale was each example's own
        q0, _ = one(x[1], gammas[1], betas[1], gs[0])
        assert not np.array_equal(_bits(q[1]), _bits(q0))
    q2, s2 = jax.vmap(lambda x: one(x, gammas[0], betas[0], gs[0]))(x)  # shared parameters
    np.testing.assert_array_equal(_bits(s2[2]), _bits(one(x[2], gammas[0], betas[0], gs[0])[1]))


@pytest.mark.parametrize("transpose", [False, True], ids=["rowwise", "columnwise"])
@pytest.mark.parametrize("fmt", ["mxfp8-e4m3", "nvfp4", "pow2-128"])
@pytest.mark.parametrize("kind", KINDS)
def test_grad_straight_through(kind, fmt, transpose):
    key = case_key(("blk_grad", kind, fmt, transpose))
    rows = 128 if transpose else 6  # the columnwise copy's blocks of rows
    x = random(key, (rows, 128), jnp.bfloat16, offset=0.2)
    gamma, beta = _params(kind, 128, jnp.float32, key)
    w, wt = random(key + 7, (rows, 128), jnp.float32), random(key + 8, (128, rows), jnp.float32)

    def quantized(x, g, b):
        """q, and q_t with transpose."""
        outs = _format_call(fmt, kind, x, g, b, 0.01, transpose=transpose)[0]
        return outs[0], (outs[2] if transpose else None)

    def loss(x, g, b):
        q, qt = quantized(x, g, b)
        value = jnp.sum(q.astype(jnp.float32) * w)
        return value if qt is None else value + jnp.sum(qt.astype(jnp.float32) * wt)

    code_dtype = quantized(x, gamma, beta)[0].dtype
    got = jax.grad(loss, (0, 1, 2))(x, gamma, beta)
    # the norm's gradients with q's cotangent (w in q's dtype, then x's), and
    # q_t's transposed added to it
    ct = w.astype(code_dtype).astype(x.dtype)
    if transpose:
        ct = ct + wt.astype(code_dtype).astype(x.dtype).T
    norm = (lambda x, g, b: jrn.rms_norm(x, g)) if kind == "rms" else jrn.layer_norm
    _, pull = jax.vjp(norm, x, gamma, beta)
    want = pull(ct)
    for a, b, name in zip(got, want, ("dx", "dgamma", "dbeta")):
        if kind == "rms" and name == "dbeta":
            assert not np.asarray(a).any()
            continue
        np.testing.assert_allclose(f64(a), f64(b), rtol=1e-2, atol=1e-2, err_msg=name)
        assert np.abs(f64(a)).max() > 0
    # forward mode: q's tangent is the norm's, cast to q's dtype; q_t's the same transposed
    t = random(key + 9, x.shape, jnp.bfloat16)
    _, tq = jax.jvp(lambda x: quantized(x, gamma, beta)[int(transpose)], (x,), (t,))
    _, ty = jax.jvp(lambda x: norm(x, gamma, beta), (x,), (t,))
    assert tq.dtype == code_dtype
    np.testing.assert_array_equal(_bits(tq), _bits((ty.T if transpose else ty).astype(code_dtype)))


def test_hidden_slice_path():
    # What each device runs with the hidden dim split (statistics, then the
    # apply_fp8 kernel), here as one slice: the same bits as the fused kernel.
    from jax_rmsnorm import _primitives as prim

    x = random(11, (5, 96), jnp.bfloat16, scale=2.0)
    gamma = random(12, (96,), jnp.bfloat16, offset=1.0)
    for rule, block, codes, g in (("e8m0", 32, E4M3, None), ("nvfp4", 16, E2M1, jnp.float32(3e-3)),
                                  ("pow2", 32, E5M2, None)):
        fused = prim.FusedSpec(quant="group", out_dtype=np.dtype(codes), group_size=block, group_scale=rule)

        def run(x, g_, on):
            y, _, _, _, qs, _, _ = prim.norm_fwd_fused(x, g_, g_, None, g, None, kind="rms", eps=1e-6,
                                                    zero_centered_gamma=False, has_gamma=True, has_beta=False,
                                                    fused=fused, on_hidden_slice=on)
            return y, qs

        sliced = jax.jit(lambda x, g_: run(x, g_, "cpu"))
        assert "jrn_rms_norm_apply_fp8" in sliced.lower(x, gamma).as_text()
        for a, b in zip(sliced(x, gamma), jax.jit(lambda x, g_: run(x, g_, None))(x, gamma)):
            np.testing.assert_array_equal(_bits(a) if a.dtype.itemsize == 1 else np.asarray(a),
                                          _bits(b) if b.dtype.itemsize == 1 else np.asarray(b))


@pytest.mark.parametrize("layout", ["rows", "hidden"])
def test_sharded_jit(layout):
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices("cpu")[:4])
    spec = P("data", None) if layout == "rows" else P(None, "model")
    x = random(13, (8, 128), jnp.bfloat16, scale=2.0)
    g = random(14, (128,), jnp.float32, offset=1.0)
    for fn in (lambda x, g: jrn.rms_norm_mxfp8(x, g), lambda x, g: jrn.layer_norm_nvfp4(x, g, g, global_scale=0.01),
               lambda x, g: jrn.rms_norm_fp8_groupwise(x, g, group_size=32, power_of_two_scales=True)):
        f = jax.jit(fn)
        want = f(x, g)
        got = f(jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(g, NamedSharding(mesh, P(spec[1]))))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            # split along the hidden dim, float32 row sums in another order:
            # a code may round the other way
            diff = _bits(a) != _bits(b) if a.dtype.itemsize == 1 else np.asarray(a) != np.asarray(b)
            assert diff.mean() < (0.02 if layout == "hidden" else 1e-9)


def test_empty():
    x = jnp.zeros((0, 64), jnp.bfloat16)
    q, s = jrn.rms_norm_mxfp8(x)
    assert q.shape == (0, 64) and s.shape == (0, 2) and s.dtype == np.dtype(jnp.float8_e8m0fnu)
    q, s = jrn.layer_norm_nvfp4(x, global_scale=1.0)
    assert q.dtype == np.dtype(E2M1) and s.shape == (0, 4) and s.dtype == np.dtype(E4M3)


def test_errors():
    x = jnp.ones((4, 48), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"x's hidden size must be a multiple of 32 for MXFP8"):
        jrn.rms_norm_mxfp8(x)
    with pytest.raises(ValueError, match=r"multiple of 16 for NVFP4"):
        jrn.layer_norm_nvfp4(jnp.ones((4, 40)), global_scale=1.0)
    x = jnp.ones((4, 64), jnp.bfloat16)
    with pytest.raises(TypeError, match="out_dtype must be float8_e4m3fn or float8_e5m2"):
        jrn.rms_norm_mxfp8(x, out_dtype=jnp.bfloat16)
    with pytest.raises(TypeError, match="global_scale is required"):
        jrn.rms_norm_nvfp4(x, global_scale=None)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="global_scale must be finite and > 0"):
            jrn.rms_norm_nvfp4(x, global_scale=bad)
    with pytest.raises(TypeError, match="global_scale must be float32, got float16"):
        jrn.rms_norm_nvfp4(x, global_scale=jnp.float16(1))
    with pytest.raises(ValueError, match=r"global_scale must be a scalar \(one scale per tensor\)"):
        jrn.rms_norm_nvfp4(x, global_scale=jnp.ones((2,), jnp.float32))
    with pytest.raises(TypeError, match="global_scale must be an array, got str"):
        jrn.rms_norm_nvfp4(x, global_scale="1")
    with pytest.raises(TypeError, match="x must be float32, bfloat16 or float16"):
        jrn.rms_norm_mxfp8(jnp.ones((4, 64), jnp.int32))
    with pytest.raises(TypeError, match="power_of_two_scales must be a bool"):
        jrn.rms_norm_fp8_groupwise(x, group_size=32, power_of_two_scales="yes")
    with pytest.raises(TypeError):  # no out_dtype for NVFP4: its codes are float4_e2m1fn
        jrn.rms_norm_nvfp4(x, global_scale=1.0, out_dtype=E4M3)


@pytest.mark.parametrize("name, call", [
    ("rms_norm_mxfp8", lambda x: jrn.rms_norm_mxfp8(x)),
    ("layer_norm_nvfp4", lambda x: jrn.layer_norm_nvfp4(x, global_scale=1.0)),
    ("rms_norm_fp8_groupwise(power_of_two_scales=True)",
     lambda x: jrn.rms_norm_fp8_groupwise(x, group_size=32, power_of_two_scales=True))])
def test_lowers_for_both_platforms(name, call):
    # One custom call each, on the CPU and (where the CUDA module is built) the GPU.
    from jax_rmsnorm import _ffi

    x = jnp.ones((4, 64), jnp.bfloat16)
    platforms = ("cpu", "cuda") if _ffi.cuda_built() else ("cpu",)
    for platform in platforms:
        assert "jrn_" in jax.jit(call).trace(x).lower(lowering_platforms=(platform,)).as_text(), (name, platform)


def test_mxfp8_scale_of_a_subnormal_quotient():
    # max|y| / 448 below 2**-126 (a float32 subnormal): IEEE arithmetic
    # rounds it up to E8M0 2**-126, where flushing denormals (as XLA's CPU
    # does) would give 0, i.e. 2**-127, and saturated codes.
    x = jnp.ones((2, 64), jnp.float32)
    gamma = jnp.asarray(np.r_[np.full(32, 1.5 * 2.0 ** -118), np.ones(32)].astype(np.float32))
    q, s = jrn.rms_norm_mxfp8(x, gamma)
    assert (_bits(s)[:, 0] == 1).all()
    assert (np.asarray(q, np.float32)[:, :32] == 384.0).all()
    rq, rs = quantize_blocks(np.asarray(jrn.rms_norm(x, gamma)), "mxfp8", E4M3, 32)
    np.testing.assert_array_equal(_bits(s), rs)
    np.testing.assert_array_equal(_bits(q), _bits(rq))


def _exact_y(gamma):
    """gamma with its subnormals flushed to zeros of their sign (XLA's CPU
    flushes them), and x of ones: with eps 0, rstd is 1 and y is gamma."""
    gamma = np.asarray(gamma, np.float32)
    gamma = np.where(np.abs(gamma) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), gamma), gamma)
    x = jnp.ones((2, gamma.shape[-1]), jnp.float32)
    y = np.asarray(jrn.rms_norm(x, jnp.asarray(gamma), eps=0.0))
    np.testing.assert_array_equal(y[0].view(np.uint32), gamma.view(np.uint32))
    return x, jnp.asarray(gamma), y


@pytest.mark.parametrize("out_dtype", [E4M3, E5M2], ids=dname)
def test_mxfp8_codes_around_the_float32_path(out_dtype):
    # The CPU codes a block in plain float32 where its E8M0 exponent e is at
    # least 19, else exactly: blocks on either side of that edge (and at the
    # ends of e's range), each from its max down to the least normal floats,
    # zeros of both signs, are the reference's bit for bit.
    top = float(ml_dtypes.finfo(out_dtype).max)
    blocks = []
    for e in [0, 1, 17, 18, 19, 20, 60, 127, 200, 239 if out_dtype == E5M2 else 246]:
        amax = top * 2.0 ** (e - 127) * 0.75  # rounds up to 2^(e - 127)
        vals = [amax * f for f in (1, -0.999, 0.5, 2.0 ** -8, -(2.0 ** -15), 2.0 ** -30, -(2.0 ** -60))]
        vals += [v for v in (2.0 ** -126, -1.5 * 2.0 ** -126, 2.0 ** -120) if abs(v) < amax] + [0.0, -0.0]
        blocks.append(np.resize(np.asarray(vals, np.float32), 32))
    x, gamma, y = _exact_y(np.concatenate(blocks))
    q, s = jrn.rms_norm_mxfp8(x, gamma, eps=0.0, out_dtype=out_dtype)
    rq, rs = quantize_blocks(y, "mxfp8", out_dtype, 32)
    np.testing.assert_array_equal(_bits(s), rs)
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    assert len(np.unique(rs)) == len(blocks)


@pytest.mark.parametrize("global_scale", [2.0 ** -130, 2.0 ** -101, 2.0 ** -100, 2.0 ** -99, 3e-3, 1.0, 2.0 ** 100,
                                          2.0 ** 127, float(np.finfo(np.float32).max)], ids=lambda g: f"{g:.3g}")
def test_nvfp4_codes_around_the_float32_path(global_scale):
    # The CPU divides in plain float32 where |global_scale| is from 2**-100 to
    # the largest float, else exactly: values from 2**-126 to 2**126, so that
    # y / global_scale and its block scale run from subnormal to overflowing,
    # are coded as the reference codes them.
    rng = np.random.default_rng(11)
    mags = 2.0 ** np.repeat(np.arange(-126, 127, 9), 16)[:, None] * rng.uniform(0.5, 1.0, (1, 1))
    vals = (mags.ravel() * rng.choice([-1.0, 1.0], mags.size) * rng.uniform(0.2, 1.0, mags.size)).astype(np.float32)
    x, gamma, y = _exact_y(vals[: vals.size // 16 * 16])
    g = np.float32(global_scale)
    q, s = jrn.rms_norm_nvfp4(x, gamma, eps=0.0, global_scale=g)
    rq, rs = quantize_blocks(y, "nvfp4", E2M1, 16, global_scale=g)
    np.testing.assert_array_equal(_bits(s), _bits(rs))
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    assert len(np.unique(_bits(q))) > 4


# ---------------------------------------------------------------------------
# the columnwise copy (transpose=True): the float32 y of all rows transposed
# to (hidden, rows) and quantized along the rows in blocks of the same size

# the formats' calls (_format_call): MXFP8 of either code dtype, NVFP4,
# the per-group output with power-of-two and with float32 scales
COLUMNWISE = ["mxfp8-e4m3", "mxfp8-e5m2", "nvfp4", "pow2-128", "float32-32"]


def _group_reference(y, fmt, group, pow2, ub=np.inf):
    """Per-group FP8 codes and float32 scales of float32 ``y`` along its last
    axis: the scale rule (rounded up to a power of two with ``pow2``), then
    ``saturate(y * (1 / scale))`` in float32."""
    y = np.asarray(y, np.float32)
    if pow2:
        s = pow2_group_scales(y, fmt, group, ub)
    else:
        amax = np.max(np.abs(y.reshape(y.shape[:-1] + (-1, group))), -1)
        s = ref_scales(amax, fmt, ub).astype(np.float32)
    top = np.float32(FP8_MAX[np.dtype(fmt)])
    mul = np.repeat(np.float32(1) / s, group, axis=-1)
    return np.clip(y * mul, -top, top).astype(fmt), s


def _format_call(name, kind, x, gamma, beta, g=None, transpose=True, **kw):
    """(results of the call of format ``name`` (one of COLUMNWISE; NVFP4's
    global scale ``g``), block, reference of float32 y along its last axis)."""
    bb = beta if kind == "layer" else None
    if name.startswith("mxfp8"):
        fmt = E4M3 if name.endswith("e4m3") else E5M2
        return (_mxfp8(kind, x, gamma, bb, out_dtype=fmt, transpose=transpose, **kw), 32,
                lambda y: quantize_blocks(y, "mxfp8", fmt, 32))
    if name == "nvfp4":
        return (_nvfp4(kind, x, gamma, bb, global_scale=g, transpose=transpose, **kw), 16,
                lambda y: quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, 16, global_scale=np.float32(g)))
    group, pow2 = (128, True) if name == "pow2-128" else (32, False)
    args = (x, gamma) if kind == "rms" else (x, gamma, bb)
    fn = jrn.rms_norm_fp8_groupwise if kind == "rms" else jrn.layer_norm_fp8_groupwise
    return (fn(*args, group_size=group, out_dtype=E5M2 if pow2 else E4M3, power_of_two_scales=pow2,
               transpose=transpose, **kw), group,
            lambda y: _group_reference(y, E5M2 if pow2 else E4M3, group, pow2))


def _assert_codes(got, want):
    """The same shapes and bits (the references' E8M0 scales are uint8)."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=dname)
@pytest.mark.parametrize("name", COLUMNWISE)
@pytest.mark.parametrize("kind", KINDS)
def test_columnwise_bit_exact(kind, name, dtype):
    shape = (2, 64, 128)  # 128 rows: whole blocks of 16, 32 and 128
    key = case_key(("columnwise", kind, name, dname(dtype)))
    x = random(key, shape, dtype, scale=2.0, offset=0.3)
    gamma, beta = _params(kind, 128, dtype, key, spread=6)
    # rows spread over binades too, so that the columns' blocks differ
    x = x * jnp.exp2(jnp.round(random(key + 3, shape[:-1] + (1,), jnp.float32, scale=4.0))).astype(dtype)
    y, _ = _kernel_y(kind, x, gamma, beta)
    g = np.float32(np.abs(y).max() / (6 * 448))
    (q, s, qt, st), block, ref = _format_call(name, kind, x, gamma, beta, g)
    assert qt.shape == (128, 128) and st.shape == (128, 128 // block)
    assert qt.dtype == q.dtype and st.dtype == s.dtype
    want_t = ref(y.reshape(-1, 128).T)
    np.testing.assert_array_equal(_bits(qt), _bits(want_t[0]))
    np.testing.assert_array_equal(_bits(st), _bits(want_t[1]))
    assert len(np.unique(_bits(st))) > 2  # the columns' blocks have scales of their own
    _assert_codes((q, s), ref(y))  # the rowwise results as without the copy
    # from y itself: not q's codes requantized (they differ somewhere)
    q_from_codes = ref(np.asarray(q, np.float32).reshape(-1, 128).T)[0]
    assert not np.array_equal(_bits(qt), _bits(q_from_codes))


@pytest.mark.parametrize("name", ["mxfp8-e4m3", "nvfp4", "pow2-128"])
def test_columnwise_nan_and_zero_columns(name):
    # gamma's column 3 NaN and columns 64..79 zero: NaN and all-zero column blocks
    x = random(17, (128, 128), jnp.float32, offset=0.5)
    gamma = np.ones(128, np.float32)
    gamma[3], gamma[64:80] = np.nan, 0.0
    gamma = jnp.asarray(gamma)
    y = np.asarray(jrn.rms_norm(x, gamma))
    (_, _, qt, st), _, ref = _format_call(name, "rms", x, gamma, None, np.float32(0.01))
    _assert_codes((qt, st), ref(y.T))
    sv = np.asarray(st, np.float32)
    assert np.isnan(sv[3]).all() and not np.isnan(np.delete(sv, 3, axis=0)).any()


def test_columnwise_rows_refused():
    x = jnp.ones((5, 8, 64), jnp.bfloat16)  # 40 rows
    with pytest.raises(ValueError, match=r"x's rows \(the product of all but its last dim: 40\) must be a multiple "
                                         r"of 32 for the columnwise copy"):
        jrn.rms_norm_mxfp8(x, transpose=True)
    with pytest.raises(ValueError, match=r"must be a multiple of 16 for the columnwise copy"):
        jrn.layer_norm_nvfp4(jnp.ones((24, 64)), global_scale=1.0, transpose=True)
    with pytest.raises(ValueError, match=r"must be a multiple of 128 for the columnwise copy"):
        jrn.rms_norm_fp8_groupwise(jnp.ones((40, 128)), transpose=True)
    for g in (6, 512):  # blocks of rows: a multiple of 4, at most 256
        with pytest.raises(ValueError, match=f"group_size must be a multiple of 4 up to 256 for the columnwise copy "
                                             fr"\(transpose=True quantizes blocks of group_size rows\), got {g}"):
            jrn.rms_norm_fp8_groupwise(jnp.ones((1024, 1536)), group_size=g, transpose=True)
    with pytest.raises(TypeError, match="transpose must be a bool"):
        jrn.rms_norm_mxfp8(x, transpose="yes")
    q, s = jrn.rms_norm_mxfp8(x)  # without the copy: any rows
    assert q.shape == x.shape


@pytest.mark.parametrize("name", COLUMNWISE)
def test_columnwise_vmap(name):
    key = case_key(("columnwise_vmap", name))
    x = random(key, (3, 32, 128), jnp.bfloat16, scale=2.0)
    gammas = random(key + 1, (3, 128), jnp.float32, offset=1.0)
    betas = random(key + 2, (3, 128), jnp.float32)
    gs = jnp.asarray([1e-3, 2e-2, 0.5], jnp.float32)
    x = jnp.concatenate([x] * 4, axis=1) if name == "pow2-128" else x  # 128 rows an example
    one = lambda x, g, b, gs: _format_call(name, "layer", x, g, b, gs)[0]
    outs = jax.vmap(one)(x, gammas, betas, gs)
    assert outs[2].shape == (3, 128, x.shape[1])
    for i in range(3):
        _assert_codes([o[i] for o in outs], one(x[i], gammas[i], betas[i], gs[i]))


@pytest.mark.parametrize("name", ["mxfp8-e4m3", "nvfp4"])
def test_columnwise_residual(name):
    key = case_key(("columnwise_res", name))
    x = random(key, (64, 96 if name == "nvfp4" else 128), jnp.bfloat16)
    r = random(key + 5, x.shape, jnp.float32)
    gamma, beta = _params("rms", x.shape[-1], jnp.bfloat16, key)
    q, s, h, qt, st = _format_call(name, "rms", x, gamma, beta, 1e-3, residual=r, h_dtype=jnp.float32)[0]
    np.testing.assert_array_equal(np.asarray(h), np.asarray(ref_add(x, r, jnp.float32)))
    _assert_codes((q, s, qt, st), _format_call(name, "rms", h, gamma, beta, 1e-3)[0])


def test_columnwise_fits_scaled_matmul():
    # The weight gradient dW = x_n^T @ dy contracts over the rows: the two
    # tensors' columnwise copies, (batch, hidden, rows), are the operands
    # jax.nn.scaled_matmul takes.
    a = random(1, (2, 64, 64), jnp.bfloat16)
    b = random(2, (2, 64, 96), jnp.bfloat16)
    for run, kw in ((jrn.rms_norm_mxfp8, {}), (jrn.rms_norm_mxfp8, dict(out_dtype=E5M2)),
                    (jrn.rms_norm_nvfp4, dict(global_scale=1.0))):
        (_, _, qa, sa), (_, _, qb, sb) = (jax.vmap(lambda v: run(v, transpose=True, **kw))(v) for v in (a, b))
        out = jax.eval_shape(jax.nn.scaled_matmul, qa, qb, sa, sb)
        assert out.shape == (2, 64, 96)


def test_columnwise_sharded_jit_and_empty():
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices("cpu")[:4])
    x = random(13, (64, 128), jnp.bfloat16, scale=2.0)
    g = random(14, (128,), jnp.float32, offset=1.0)
    for fn in (lambda x, g: jrn.rms_norm_mxfp8(x, g, transpose=True),
               lambda x, g: jrn.layer_norm_nvfp4(x, g, g, global_scale=0.01, transpose=True)):
        f = jax.jit(fn)
        want = f(x, g)
        for spec in (P("data", None), P(None, "model")):
            args = jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(g, NamedSharding(mesh, P(spec[1])))
            got = f(*args)
            _assert_codes(got[2:], want[2:])
            if spec[0]:  # rows split into whole blocks: each device copies its own rows, nothing gathered
                N = lambda *s: NamedSharding(mesh, P(*s))
                split = jax.jit(fn, out_shardings=(N("data", None),) * 2 + (N(None, "data"),) * 2)
                assert "all-gather" not in split.lower(*args).compile().as_text()
                got = split(*args)
                assert got[2].sharding.spec == P(None, "data")
                _assert_codes(got[2:], want[2:])
        # rows split into parts of MXFP8 blocks (16 rows a device): gathered for the copy
        mesh4 = jax.make_mesh((4,), ("data",), devices=jax.devices("cpu")[:4])
        _assert_codes(f(jax.device_put(x, NamedSharding(mesh4, P("data", None))), g)[2:], want[2:])
    q, s, qt, st = jrn.rms_norm_mxfp8(jnp.zeros((0, 64), jnp.bfloat16), transpose=True)
    assert qt.shape == (64, 0) and st.shape == (64, 0) and st.dtype == np.dtype(jnp.float8_e8m0fnu)


# Lowering for the GPU (any machine) needs the CUDA module built.
needs_cuda_module = pytest.mark.skipif(not jrn._ffi.cuda_built(), reason="the CUDA module is not built")


@needs_cuda_module
@pytest.mark.parametrize("call", [lambda x: jrn.rms_norm_mxfp8(x, transpose=True),
                                  lambda x: jrn.rms_norm_fp8_groupwise(x, group_size=32, transpose=True)])
def test_columnwise_lowers_for_gpu(call):
    x = jnp.ones((64, 64), jnp.bfloat16)
    text = jax.jit(call).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "jrn_rms_norm_fwd" in text


# ---------------------------------------------------------------------------
# GPU: the CUDA kernels' codes and scales, from the kernel's own statistics


def _codes(y, fmt, block, g):
    """(code bits, scale bits) of float32 ``y`` by the reference quantizer
    of ``fmt``: "mxfp8", "nvfp4" or "pow2" (per-group E4M3 with scales
    rounded up to powers of two)."""
    if fmt == "pow2":
        s = pow2_group_scales(y, E4M3, block)
        top = np.float32(FP8_MAX[np.dtype(E4M3)])
        q = np.clip(y * np.repeat(np.float32(1) / s, block, axis=-1), -top, top).astype(E4M3)
        return _bits(q), s.view(np.uint32)
    if fmt == "mxfp8":
        q, s = quantize_blocks(y, "mxfp8", E4M3, block)
        return _bits(q), np.asarray(s)
    q, s = quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, block, global_scale=np.float32(g))
    return _bits(q), _bits(s)


def _assert_kernel_codes(codes, qb, sb, yk, block, exact, delta=None, fp4=False):
    """qb, sb: a kernel's code and scale bits of y along its last axis, to
    match codes(y) -> (code bits, scale bits) of the reference quantizer
    (fp4: E2M1 codes, one a byte, else FP8). yk: y emulated, float32 where
    exact (bit for bit), else float64 known to a few float32 ulps
    (LayerNorm: centred in two steps, beta's add maybe contracted): each
    scale must be that of some y within `delta` (default: a few ulps of the
    largest |y|), each code lie between the codes, under its block's scale,
    of two such y (codes rise with y: elements far below the block's max
    step through several codes within delta), and all but 1% of both be
    those of the nearest float32."""
    if exact:
        want_q, want_s = codes(yk)
        np.testing.assert_array_equal(sb, want_s)
        np.testing.assert_array_equal(qb, want_q)
        return
    if delta is None:
        delta = 4e-7 * np.abs(yk).max() + 2.0 ** -22 * np.abs(yk)
    sign = 0x8 if fp4 else 0x80  # codes are sign and magnitude: order them as integers
    order = lambda b: np.where(b & sign, -(b & (sign - 1)).astype(np.int16), (b & (sign - 1)).astype(np.int16))
    cands = [codes((yk + k * delta / 3).astype(np.float32)) for k in range(-3, 4)]
    s_ok = np.zeros(sb.shape, bool)
    lo, hi = np.full(qb.shape, 255, np.int16), np.full(qb.shape, -255, np.int16)
    for cq, cs in cands:
        same = cs == sb
        s_ok |= same
        same = np.repeat(same, block, axis=-1)
        lo, hi = np.where(same, np.minimum(lo, order(cq)), lo), np.where(same, np.maximum(hi, order(cq)), hi)
    assert s_ok.all(), f"{(~s_ok).sum()} scales are no y's within a few ulps"
    q_ok = (lo <= order(qb)) & (order(qb) <= hi)
    assert q_ok.all(), f"{(~q_ok).sum()} codes are no y's within a few ulps"
    near_q, near_s = cands[3]
    assert (near_s != sb).mean() < 0.01 and (near_q != qb).mean() < 0.01


GPU_FORMATS = {"mxfp8": ("e8m0", 32, E4M3), "nvfp4": ("nvfp4", 16, E2M1), "pow2": ("pow2", 128, E4M3)}


# The block formats' group sizes are constants of the kernels (and of the
# public functions): the FFI refuses a primitive call with another size.
@pytest.mark.parametrize("rule, block, codes", [("e8m0", 64, E4M3), ("nvfp4", 32, E2M1)], ids=["e8m0", "nvfp4"])
def test_block_formats_refuse_other_group_sizes(rule, block, codes, platform):
    from jax_rmsnorm import _primitives as prim

    spec = prim.FusedSpec(quant="group", out_dtype=np.dtype(codes), group_size=block, group_scale=rule)
    dev = jax.devices(platform)[0]
    x, g = (jax.device_put(a, dev) for a in (jnp.ones((4, 256), jnp.bfloat16), jnp.ones((256,), jnp.bfloat16)))
    with pytest.raises(Exception, match="MXFP8 takes groups of 32, NVFP4 groups of 16"):
        out = prim.norm_fwd_fused(x, g, g, None, jax.device_put(jnp.float32(1), dev), None, kind="rms", eps=1e-6,
                                  zero_centered_gamma=False, has_gamma=True, has_beta=False, fused=spec)
        jax.block_until_ready(out)


# fwd_regs, fwd_slices (one-warp CTAs, held parameters, held y, wide rows;
# rows that do not fill the CTA's threads: 2560 is 320 packs of 16-bit x on
# 96 threads, whose last warps hold no fourth pack, 2176 is 272, whose third
# warp holds half of its third), fwd_stream (float32 at 262144):
# describe_plan says which takes each.
@pytest.mark.parametrize("shape", [(37, 256), (8, 4096), (3, 12288), (600, 1024), (16, 65536), (4, 262144),
                                   (24, 2560), (40, 2176)], ids=str)
@pytest.mark.parametrize("fmt", list(GPU_FORMATS))
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_kernel_codes(kind, dtype, fmt, shape, platform):
    # The kernel's codes and scales are the reference quantizer's of its own
    # float32 y. RMSNorm's y is emulated exactly from the kernel's rstd
    # ((x * rstd) * gamma, each product rounded; kernels that hold x * gamma
    # take (x * gamma) * rstd): bit for bit. LayerNorm's y
    # (centred in two steps, beta's add maybe contracted) is known to a few
    # float32 ulps: each code and scale must be that of some y within them,
    # and all but a few those of the nearest float32.
    from jax_rmsnorm import _primitives as prim

    rule, block, codes = GPU_FORMATS[fmt]
    key = case_key(("gpu_codes", kind, dname(dtype), fmt, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.3)
    gamma, beta = _params(kind, shape[-1], dtype, key, spread=6)
    y64, _, rstd64 = ref_forward(kind, x, gamma, beta, EPS[kind])
    g = np.float32(np.abs(y64).max() / (6 * 448))
    spec = prim.FusedSpec(quant="group", out_dtype=np.dtype(codes), group_size=block, group_scale=rule)
    dev = jax.devices(platform)[0]

    @jax.jit
    def run(x, gamma, beta, g):
        q, mean, rstd, _, qs, _, _ = prim.norm_fwd_fused(
            x, gamma, gamma if beta is None else beta, None, g, None, kind=kind, eps=EPS[kind],
            zero_centered_gamma=False, has_gamma=True, has_beta=beta is not None, fused=spec)
        return q, qs, mean, rstd

    args = [jax.device_put(a, dev) if a is not None else None for a in (x, gamma, beta, jnp.float32(g))]
    poison(platform, 16 * x.size + 4096)
    q, s, mean, rstd = run(*args)
    qb, sb = _bits(q), (np.asarray(s).view(np.uint32) if fmt == "pow2" else _bits(s))
    # the public function runs the same kernel
    pub = (_mxfp8(kind, *args[:3]) if fmt == "mxfp8" else _nvfp4(kind, *args[:3], global_scale=args[3])
           if fmt == "nvfp4" else
           (jrn.rms_norm_fp8_groupwise(*args[:2], group_size=block, power_of_two_scales=True) if kind == "rms" else
            jrn.layer_norm_fp8_groupwise(*args[:3], group_size=block, power_of_two_scales=True)))
    np.testing.assert_array_equal(_bits(pub[0]), qb)

    xf, gf = np.asarray(x, np.float32), np.asarray(gamma, np.float32)
    rs = np.asarray(rstd, np.float32)[..., None]
    np.testing.assert_allclose(rs[..., 0], np.asarray(rstd64).reshape(rs.shape[:-1]), rtol=4e-6)
    if kind == "rms":
        orders = [_codes((xf * rs) * gf, fmt, block, g), _codes((xf * gf) * rs, fmt, block, g)]
        match = [np.array_equal(sb, ws) and np.array_equal(qb, wq) for wq, ws in orders]
        if not any(match):  # the usual order's differences, for the report
            np.testing.assert_array_equal(sb, orders[0][1])
            np.testing.assert_array_equal(qb, orders[0][0])
    else:
        m = np.asarray(mean, np.float64)[..., None]
        yk = (f64(x) - m) * rs * f64(gamma) + f64(beta)
        delta = 4e-7 * np.abs(yk).max(-1, keepdims=True) + 2.0 ** -22 * np.abs(yk)
        _assert_kernel_codes(lambda y: _codes(y, fmt, block, g), qb, sb, yk, block, exact=False, delta=delta,
                             fp4=fmt == "nvfp4")
    assert len(np.unique(qb)) > 8


@pytest.mark.parametrize("platform", ["gpu"])
def test_kernel_residual_and_special_blocks(platform):
    # GPU: the residual's h, and NaN, infinite, zero and tiny blocks as the CPU defines them.
    dev = jax.devices(platform)[0]
    x = random(7, (4, 256), jnp.bfloat16, offset=0.5)
    r = random(8, (4, 256), jnp.bfloat16)
    gamma = np.ones(256, np.float32)
    gamma[3], gamma[40], gamma[64:96], gamma[96:112] = np.nan, np.inf, 0.0, 1e-30
    cpu_args = (x, r, jnp.asarray(gamma))
    gpu_args = [jax.device_put(a, dev) for a in cpu_args]
    for fn in (lambda x, r, g: jrn.rms_norm_mxfp8(x, g, residual=r),
               lambda x, r, g: jrn.rms_norm_nvfp4(x, g, residual=r, global_scale=0.01),
               lambda x, r, g: jrn.layer_norm_mxfp8(x, g, residual=r, out_dtype=E5M2)):
        on_gpu, on_cpu = fn(*gpu_args), fn(*cpu_args)
        assert list(on_gpu[0].devices())[0].platform == "gpu"
        np.testing.assert_array_equal(np.asarray(on_gpu[2]), np.asarray(on_cpu[2]))  # h
        # the special blocks' scales and codes are the CPU's; elsewhere a
        # LayerNorm code may round the other way (other summation order)
        sg, sc, qg, qc = _bits(on_gpu[1]), _bits(on_cpu[1]), _bits(on_gpu[0]), _bits(on_cpu[0])
        special = [0, 1, 2] if sg.shape[-1] == 8 else [0, 2, 4, 5, 6]  # NaN, inf, zero (and tiny) blocks
        np.testing.assert_array_equal(sg[:, special], sc[:, special])
        assert (sg != sc).mean() < 0.05 and (qg != qc).mean() < 0.01


@pytest.mark.parametrize("fmt", list(GPU_FORMATS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_kernel_columnwise(kind, fmt, platform):
    # fwd_columns: q_t's codes and scales are the reference quantizer's of y
    # transposed (each tensor's), from the kernel's statistics; as in
    # test_kernel_codes, RMSNorm bit for bit, LayerNorm within a few ulps.
    # Two tensors (vmap), rows a multiple of every block.
    from jax_rmsnorm import _primitives as prim

    rule, block, codes = GPU_FORMATS[fmt]
    key = case_key(("gpu_cols", kind, fmt))
    x = random(key, (2, 256, 384), jnp.bfloat16, scale=2.0, offset=0.3)
    gamma, beta = _params(kind, 384, jnp.bfloat16, key, spread=6)
    y64, _, _ = ref_forward(kind, x, gamma, beta, EPS[kind])
    g = np.float32(np.abs(y64).max() / (6 * 448))
    spec = prim.FusedSpec(quant="group", out_dtype=np.dtype(codes), group_size=block, group_scale=rule,
                          transpose=True)
    dev = jax.devices(platform)[0]

    def one(x, gamma, beta, g):
        q, mean, rstd, _, qs, qt, qts = prim.norm_fwd_fused(
            x, gamma, gamma if beta is None else beta, None, g, None, kind=kind, eps=EPS[kind],
            zero_centered_gamma=False, has_gamma=True, has_beta=beta is not None, fused=spec)
        return qt, qts, mean, rstd

    args = [jax.device_put(a, dev) if a is not None else None for a in (x, gamma, beta)]
    gs = jax.device_put(jnp.full((2,), g, jnp.float32), dev)
    poison(platform, 16 * x.size + 4096)
    qt, qts, mean, rstd = jax.jit(jax.vmap(one, in_axes=(0, None, None, 0)))(*args, gs)
    assert qt.shape == (2, 384, 256) and qts.shape == (2, 384, 256 // block)
    qb, sb = _bits(qt), (np.asarray(qts).view(np.uint32) if fmt == "pow2" else _bits(qts))
    rs = np.asarray(rstd, np.float32)[..., None]
    if kind == "rms":
        yk = (np.asarray(x, np.float32) * rs) * np.asarray(gamma, np.float32)
    else:
        yk = (f64(x) - np.asarray(mean, np.float64)[..., None]) * rs * f64(gamma) + f64(beta)
    _assert_kernel_codes(lambda y: _codes(y, fmt, block, g), qb, sb, np.swapaxes(yk, -1, -2), block,
                         exact=kind == "rms", fp4=fmt == "nvfp4")
    assert len(np.unique(qb)) > 8
    # the public function's copy on the GPU is the same kernel's
    pub = jax.vmap(lambda x, g_: (_mxfp8(kind, x, *args[1:], transpose=True) if fmt == "mxfp8" else
                                  _nvfp4(kind, x, *args[1:], global_scale=g_, transpose=True) if fmt == "nvfp4" else
                                  (jrn.rms_norm_fp8_groupwise(x, args[1], group_size=block, power_of_two_scales=True,
                                                              transpose=True) if kind == "rms" else
                                   jrn.layer_norm_fp8_groupwise(x, *args[1:], group_size=block,
                                                                power_of_two_scales=True, transpose=True))),
                   in_axes=(0, 0))(args[0], gs)
    np.testing.assert_array_equal(_bits(pub[2]), qb)


# fwd_columns' tiles hold whole groups of rows (the most in 128, or one
# group); its threads take 32-row runs of a column, a group's parts meeting
# in shared memory (groups of 64 and 256). Rows: two tiles and a group, so
# that the last tile is short; columns: whole groups from 200 (a short last
# chunk of 64 columns at 204, 200 and 288; single elements at 204).
# The per-group output with float32 scales, RMSNorm: its y emulated from the
# kernel's rstd, bit for bit (either order of the two products).
@pytest.mark.parametrize("group", [12, 40, 64, 96, 256])
def test_columnwise_group_sizes(platform, group):
    from jax_rmsnorm import _primitives as prim

    tile = group if group >= 128 else 128 // group * group
    rows, hidden = 2 * tile + group, -(-200 // group) * group
    key = case_key(("cols_groups", group))
    x = random(key, (rows, hidden), jnp.bfloat16, scale=2.0, offset=0.3)
    x = x * jnp.exp2(jnp.round(random(key + 3, (rows, 1), jnp.float32, scale=3.0))).astype(jnp.bfloat16)
    gamma = random(key + 1, (hidden,), jnp.bfloat16, scale=0.5, offset=1.0)
    spec = prim.FusedSpec(quant="group", out_dtype=np.dtype(E4M3), group_size=group, group_scale="float32",
                          transpose=True)

    @jax.jit
    def run(x, gamma, g):
        q, _, rstd, _, qs, qt, qts = prim.norm_fwd_fused(
            x, gamma, gamma, None, g, None, kind="rms", eps=EPS["rms"], zero_centered_gamma=False,
            has_gamma=True, has_beta=False, fused=spec)
        return qt, qts, rstd

    args = put(platform, x, gamma, jnp.float32(1.0))
    poison(platform, 16 * x.size + 4096)
    qt, qts, rstd = (np.asarray(a) for a in run(*args))
    assert qt.shape == (hidden, rows) and qts.shape == (hidden, rows // group)
    rs = rstd.astype(np.float32)[:, None]
    xf, gf = np.asarray(x, np.float32), np.asarray(gamma, np.float32)
    got = (_bits(qt), qts.view(np.uint32))
    wants = []
    for y in ((xf * rs) * gf, (xf * gf) * rs):
        wq, ws = _group_reference(y.T, E4M3, group, False)
        wants.append((_bits(wq), ws.view(np.uint32)))
    if not any(np.array_equal(got[0], wq) and np.array_equal(got[1], ws) for wq, ws in wants):
        np.testing.assert_array_equal(got[1], wants[0][1])  # the usual order's differences, for the report
        np.testing.assert_array_equal(got[0], wants[0][0])
    assert len(np.unique(got[1])) > 2 and len(np.unique(got[0])) > 8


# fwd_tiles: q and q_t from one read of x, a cluster a slab of 32 rows. The
# widths cut into one CTA (384), three of 960 columns (2880), four (4096) and
# ten of 2048 (20480, past kMaxCluster CTAs of 1024); the scale rules of
# groups of 16 and 32; parameters as float32, zero-centred or absent; two
# tensors (vmap); LayerNorm's rows far from zero (offset: 150 times their
# spread; RMSNorm's y would be nearly constant there, its codes too). RMSNorm
# bit for bit against y emulated from the kernel's rstd, LayerNorm within a
# few ulps (as test_kernel_codes), its mean and rstd against float64. The
# block formats' q_t scales are written by rows and transposed: the cases of
# 128 rows a tensor and more take the transpose's wider stores (4, 8 and 16
# rows of scales); the float32 and power-of-two scales, in place, also of
# two tensors.
TILE_FORMATS = {"mxfp8": ("e8m0", 32, E4M3), "nvfp4": ("nvfp4", 16, E2M1), "float": ("float32", 32, E4M3),
                "pow2": ("pow2", 16, E5M2)}
TILE_CASES = [("mxfp8", (64, 384), {}), ("nvfp4", (64, 384), {}), ("float", (64, 384), {}),
              ("pow2", (64, 384), {}), ("mxfp8", (96, 2880), {}), ("nvfp4", (96, 2880), {"param": jnp.float32}),
              ("mxfp8", (64, 4096), {"dtype": jnp.float16}), ("nvfp4", (64, 4096), {"zero_centered": True}),
              ("mxfp8", (32, 20480), {}), ("nvfp4", (32, 20480), {"no_params": True}),
              ("mxfp8", (2, 32, 1024), {}), ("nvfp4", (2, 64, 512), {}),
              ("mxfp8", (64, 4096), {"residual": True}), ("nvfp4", (96, 2880), {"residual": True}),
              ("pow2", (32, 20480), {"residual": True}),
              ("mxfp8", (64, 4096), {"offset": 300.0}), ("nvfp4", (32, 20480), {"offset": -300.0, "residual": True}),
              ("mxfp8", (256, 1024), {}), ("nvfp4", (128, 2880), {"param": jnp.float32}),
              ("nvfp4", (256, 1024), {}), ("mxfp8", (2, 128, 4096), {"residual": True}),
              ("nvfp4", (2, 128, 512), {"zero_centered": True}), ("mxfp8", (128, 4096), {"offset": 300.0}),
              ("pow2", (128, 20480), {"residual": True}), ("float", (2, 64, 384), {}), ("pow2", (2, 64, 2048), {})]


def _tile_codes(fmt, y, block, g):
    """(code bits, scale bits) of float32 ``y`` along its last axis."""
    if fmt == "float":
        q, s = _group_reference(y, E4M3, block, False)
        return _bits(q), s.view(np.uint32)
    if fmt == "pow2":
        q, s = _group_reference(y, E5M2, block, True)
        return _bits(q), s.view(np.uint32)
    return _codes(y, fmt, block, g)


# (LayerNorm's float32 scales follow y's max to the ulp: only RMSNorm's y,
# emulated exactly, can check them.)
@pytest.mark.parametrize("kind,fmt,shape,opts", [(k, *c) for k in KINDS for c in TILE_CASES
                                                 if not (k == "layer" and c[0] == "float")
                                                 and not (k == "rms" and "offset" in c[2])],
                         ids=lambda v: str(v).replace(" ", ""))
@pytest.mark.parametrize("platform", ["gpu"])
def test_kernel_tiles(kind, fmt, shape, opts, platform):
    from jax_rmsnorm import _ffi
    from jax_rmsnorm import _primitives as prim

    rule, block, codes = TILE_FORMATS[fmt]
    dtype, param = opts.get("dtype", jnp.bfloat16), opts.get("param", opts.get("dtype", jnp.bfloat16))
    zc, no_params = opts.get("zero_centered", False), opts.get("no_params", False)
    residual = opts.get("residual", False)
    rows, hidden = int(np.prod(shape[:-1])), shape[-1]
    tensors = shape[0] if len(shape) == 3 else 1
    plan = _ffi.describe_plan("fwd", kind, (rows, hidden), np.dtype(dtype).name, param_dtype=np.dtype(param).name,
                              quant="group", group_size=block, group_scale=rule, qt=True, tensors=tensors,
                              zero_centered=zc, gamma=not no_params, beta=not no_params, residual=residual,
                              device="current")
    assert plan.startswith("fwd_tiles"), plan
    assert ("qt_scales=transpose8" in plan) == (fmt in ("mxfp8", "nvfp4")), plan
    key = case_key(("gpu_tiles", kind, fmt, shape, str(opts)))
    x = random(key, shape, dtype, scale=2.0, offset=opts.get("offset", 0.3))
    # rows spread over binades, so that the columns' blocks differ
    x = x * jnp.exp2(jnp.round(random(key + 3, shape[:-1] + (1,), jnp.float32, scale=3.0))).astype(dtype)
    r = random(key + 4, shape, dtype) if residual else None
    xn = ref_add(x, r, dtype) if residual else x  # what is normalized: h
    gamma, beta = _params(kind, hidden, param, key, spread=6)
    y64, mean64, rstd64 = ref_forward(kind, xn, gamma, beta, EPS[kind])
    g = np.float32(np.abs(y64).max() / (6 * 448))
    spec = prim.FusedSpec(quant="group", out_dtype=np.dtype(codes), group_size=block, group_scale=rule,
                          transpose=True, residual=residual, h_dtype=np.dtype(dtype) if residual else None)
    dev = jax.devices(platform)[0]
    has_beta = kind == "layer" and not no_params

    def one(x, r, gamma, beta, g):
        q, mean, rstd, h, qs, qt, qts = prim.norm_fwd_fused(
            x, gamma, gamma if beta is None else beta, r, g, None, kind=kind, eps=EPS[kind],
            zero_centered_gamma=zc, has_gamma=not no_params, has_beta=has_beta, fused=spec)
        return q, qs, qt, qts, mean, rstd, h

    args = [None if a is None else jax.device_put(a, dev) for a in (x, r, gamma, gamma if beta is None else beta)]
    poison(platform, 16 * x.size + 4096)
    if tensors > 1:
        gs = jax.device_put(jnp.full((tensors,), g, jnp.float32), dev)
        outs = jax.jit(jax.vmap(one, in_axes=(0, 0 if residual else None, None, None, 0)))(*args, gs)
    else:
        outs = jax.jit(one)(*args, jax.device_put(jnp.float32(g), dev))
    q, qs, qt, qts, mean, rstd = (np.asarray(o) for o in outs[:6])
    if residual:
        np.testing.assert_array_equal(np.asarray(outs[6]), np.asarray(xn))
    x = xn
    assert qt.shape == shape[:-2] + (hidden, shape[-2]) and qts.shape == shape[:-2] + (hidden, shape[-2] // block)
    bits = lambda a: a.view(np.uint32) if a.dtype == np.float32 else _bits(a)
    rs = rstd.astype(np.float32)[..., None]
    np.testing.assert_allclose(rs[..., 0], np.asarray(rstd64).reshape(rs.shape[:-1]), rtol=4e-6)
    if kind == "layer":  # within a few float32 ulps of the row's mean |x|
        err = np.abs(mean.astype(np.float64) - np.asarray(mean64).reshape(mean.shape))
        assert (err <= 2.0 ** -21 * np.abs(f64(x)).mean(-1)).all(), err.max()
    s = 1.0 if no_params else np.asarray(gamma, np.float32)
    if zc and not no_params:
        s = s + np.float32(1)  # (only then: a gamma of -0 stays -0)
    if kind == "rms":
        yk = (np.asarray(x, np.float32) * rs) * np.float32(s)
    else:
        yk = (f64(x) - mean.astype(np.float64)[..., None]) * rs * f64(s) + (f64(beta) if has_beta else 0.0)
    exact = kind == "rms"
    codes = lambda y: _tile_codes(fmt, y, block, g)
    _assert_kernel_codes(codes, bits(q), bits(qs), yk, block, exact, fp4=fmt == "nvfp4")
    _assert_kernel_codes(codes, bits(qt), bits(qts), np.swapaxes(yk, -1, -2), block, exact, fp4=fmt == "nvfp4")
    assert len(np.unique(bits(qt))) > 8 and len(np.unique(bits(qts))) > 2


@pytest.mark.parametrize("platform", ["gpu"])
def test_kernel_tiles_signed_zero_gamma(platform):
    # fwd_tiles keeps gamma's -0 (not 1 + gamma): y = x * rstd * -0 is -0 for
    # x > 0, coded 0x80 in q and q_t, as on the CPU
    dev = jax.devices(platform)[0]
    x = jax.device_put(jnp.ones((32, 1024), jnp.bfloat16), dev)
    g = jax.device_put(jnp.ones((1024,), jnp.bfloat16).at[0].set(-0.0), dev)
    assert jrn._ffi.describe_plan("fwd", "rms", (32, 1024), "bfloat16", quant="group", group_size=32,
                                  group_scale="e8m0", qt=True).startswith("fwd_tiles")
    q, _, qt, _ = jrn.rms_norm_mxfp8(x, g, transpose=True)
    qb, qtb = _bits(q), _bits(qt)
    assert (qb[:, 0] == 0x80).all() and (qtb[0] == 0x80).all()
    assert (qb[:, 1] == 0x78).all()  # 1.0 in a block of max 1: 2^-8 * 256 (E4M3 0x78)


# NVFP4's codes at and around E2M1's rounding boundaries (0.25, 0.75, 1.25,
# 1.75, 2.5, 3.5, 5): y / global_scale / scale lands on a boundary, 1-2 ulps
# from it (the kernels' first try hands those to the divisions) and 15-40 ulps
# from it (on either side of the first try's guard of 16 ulps). RMSNorm of
# rows of +-1 with eps 0 has rstd 1, so y = +-gamma exactly; each block of 16
# holds 6 * global_scale, so its E4M3 scale is 1 and t = y / global_scale.
def _boundary_gamma(global_scale, hidden, key):
    rng = np.random.default_rng(key)
    values = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    for b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        b = np.float32(b)
        values.append(b)
        for k in (1, 2, 15, 16, 17, 18, 40):
            up, down = b, b
            for _ in range(k):
                up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
            values += [up, down]
    t = rng.choice(np.asarray(values, np.float32), size=(hidden // 16, 16))
    t[np.arange(hidden // 16), rng.integers(0, 16, hidden // 16)] = 6.0
    return (t.reshape(hidden) * np.float32(global_scale)).astype(np.float32)


@pytest.mark.parametrize("global_scale", [1.0, 0.37], ids=["g1", "g0.37"])
@pytest.mark.parametrize("shape", [(8, 256), (4, 4096)], ids=str)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=dname)
def test_nvfp4_rounding_boundaries(dtype, shape, global_scale, platform):
    key = case_key(("nvfp4-boundaries", dname(dtype), shape, global_scale))
    rows, hidden = shape
    signs = np.where(np.random.default_rng(key).random(shape) < 0.5, -1.0, 1.0).astype(np.float32)
    gamma = _boundary_gamma(global_scale, hidden, key)
    x, g = put(platform, jnp.asarray(signs, dtype), jnp.asarray(gamma))
    _, rstd = jrn.rms_norm_fwd(x, g, eps=0.0)
    assert (np.asarray(rstd) == 1.0).all(), "premise: rstd of rows of +-1 is 1"
    y = signs * gamma
    q, s = jrn.rms_norm_nvfp4(x, g, eps=0.0, global_scale=jnp.float32(global_scale))
    rq, rs = quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, 16, global_scale=np.float32(global_scale))
    np.testing.assert_array_equal(_bits(s), _bits(rs))
    np.testing.assert_array_equal(_bits(q), _bits(rq))
    assert (np.asarray(s).astype(np.float32) == 1.0).all()  # the premise of the boundaries


# NVFP4's scales at and around E4M3's rounding boundaries: max |t| / 6 of a
# block (t = y / global_scale) on a boundary (a value of four mantissa bits;
# an odd multiple of 2^-10 in E4M3's subnormal range), and nudged up or down
# by up to 60 ulps of t (the kernels' first try hands those within 16 ulps of
# the quotient to the divisions). As above, y = +-gamma exactly.
def _scale_boundary_gamma(global_scale, hidden, key):
    rng = np.random.default_rng(key)
    bounds = [(2 * k + 1) * 2.0 ** -10 for k in range(8)]
    bounds += [(1 + (2 * m + 1) / 16) * 2.0 ** e for e in range(-6, 9) for m in range(8)]
    bounds = np.asarray([b for b in bounds if b < 448], np.float32)
    blocks = hidden // 16
    t = np.float32(6) * rng.choice(bounds, size=blocks)  # exact: b has at most five significant bits
    for i, k in enumerate(rng.choice([0, 1, 2, 3, 5, 8, 12, 16, 20, 24, 30, 40, 60], size=blocks)):
        toward = np.float32(np.inf) if rng.random() < 0.5 else np.float32(0)
        for _ in range(k):
            t[i] = np.nextafter(t[i], toward)
    y = (t * np.float32(global_scale)).astype(np.float32)
    block = rng.uniform(-0.9, 0.9, size=(blocks, 16)).astype(np.float32) * y[:, None]
    block[np.arange(blocks), rng.integers(0, 16, blocks)] = y
    return block.reshape(hidden)


@pytest.mark.parametrize("global_scale", [1.0, 0.37], ids=["g1", "g0.37"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=dname)
def test_nvfp4_scale_rounding_boundaries(dtype, global_scale, platform):
    rows, hidden = 4, 4096
    key = case_key(("nvfp4-scale-boundaries", dname(dtype), global_scale))
    signs = np.where(np.random.default_rng(key).random((rows, hidden)) < 0.5, -1.0, 1.0).astype(np.float32)
    gamma = _scale_boundary_gamma(global_scale, hidden, key)
    x, g = put(platform, jnp.asarray(signs, dtype), jnp.asarray(gamma))
    y = signs * gamma
    q, s = jrn.rms_norm_nvfp4(x, g, eps=0.0, global_scale=jnp.float32(global_scale))
    rq, rs = quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, 16, global_scale=np.float32(global_scale))
    np.testing.assert_array_equal(_bits(s), _bits(rs))
    np.testing.assert_array_equal(_bits(q), _bits(rq))
