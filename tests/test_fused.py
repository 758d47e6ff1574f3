"""Fused variants against float64 references: residual add + norm, FP8 output
per tensor / row / group (values, amax and scales, saturation, zero rows,
scale_ub, group boundaries), their straight-through gradients, vmap and jit."""

import math

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from reference import (DTYPES, FP8_MAX, FP8_RTOL, MIN_SCALE, assert_close, assert_fp8_close, case_key, decode_bounds,
                       decode_hidden, f64, gpu_routing_case, poison, put, random, ref_add, ref_forward, ref_scales, y_error)

KINDS = ["rms", "layer"]
EPS = {"rms": 1e-6, "layer": 1e-5}
E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
# hidden 1 and 7 (scalar paths), 1000 / 4096 (one CTA, bwd_slices on sm_90),
# 40001 (unaligned: streaming kernels), 65536 (clusters / slices).
SHAPES = [(3, 1), (5, 7), (2, 3, 1000), (16, 4096), (3, 40001), (2, 65536)]
sid = lambda s: "x".join(map(str, s))
dname = lambda d: np.dtype(d).name


def _params(kind, hidden, dtype, key, pdtype=None):
    pdtype = pdtype or dtype
    gamma = random(key + 2, (hidden,), pdtype, scale=0.5, offset=1.0)
    beta = random(key + 3, (hidden,), pdtype, scale=0.5) if kind == "layer" else None
    return gamma, beta


def _param_case(kind, params, hidden, dtype, key):
    """(gamma, beta, zero_centered) of a parameter case other than the common
    one: "f32" (float32 parameters for 16-bit x), "zero_centered" (1 + gamma
    near 1), "no_beta" (LayerNorm without beta), "none" (no parameters)."""
    gamma, beta = _params(kind, hidden, dtype, key, pdtype=jnp.float32 if params == "f32" else None)
    zc = params == "zero_centered"
    if zc:
        gamma = (gamma.astype(jnp.float32) - 1.0).astype(gamma.dtype)  # 1 + gamma near 1
    if params in ("no_beta", "none"):
        beta = None
    if params == "none":
        gamma = None
    return gamma, beta, zc


def _ref_y(kind, x, gamma, beta, zc=False):
    return ref_forward(kind, x, gamma, beta, EPS[kind], zc)[0]


# ---------------------------------------------------------------------------
# residual add


def _add_norm(kind, platform, x, r, gamma, beta, h_dtype, zc=False):
    if kind == "rms":
        f = lambda x, r, g, b: jrn.add_rms_norm(x, r, g, eps=EPS[kind], zero_centered_gamma=zc, h_dtype=h_dtype)
    else:
        f = lambda x, r, g, b: jrn.add_layer_norm(x, r, g, b, eps=EPS[kind], zero_centered_gamma=zc,
                                                  h_dtype=h_dtype)
    x, r, gamma, beta = put(platform, x, r, gamma, beta)
    poison(platform, 8 * x.size + 1024)
    return f, jax.jit(f)(x, r, gamma, beta)


@pytest.mark.parametrize("shape", SHAPES, ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_forward(kind, dtype, shape, platform):
    _check_add_forward(kind, dtype, shape, platform)


# On a GPU, widths that are not a multiple of a 16-byte pack take
# fwd_unaligned (each row from its own offset to a 16-byte boundary) up to
# 4096 packs a row, several rows a CTA at 127; 32769 (16-bit x) lies past it.
@pytest.mark.parametrize("shape", [(600, 127), (300, 1001), (100, 4097), (64, 4100), (20, 12290), (10, 32769)],
                         ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_add_norm_forward_unaligned(kind, dtype, shape, platform):
    _check_add_forward(kind, dtype, shape, platform)


def _check_add_forward(kind, dtype, shape, platform):
    """h exactly and y against float64, for each residual / h dtype (a float32 h zero-centred)."""
    key = case_key(("add", kind, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    hidden = shape[-1]
    for i, (r_dtype, h_dtype, zc) in enumerate([(dtype, None, False), (jnp.float32, jnp.float32, True),
                                                 (jnp.float32, None, False)]):
        r = random(key + 10 + i, shape, r_dtype, scale=1.5)
        gamma, beta = _params(kind, hidden, dtype, key + i, jnp.float32 if i == 1 else None)
        if zc:
            gamma = gamma - 1
        _, (y, h) = _add_norm(kind, platform, x, r, gamma, beta, h_dtype, zc)
        hd = h_dtype or dtype
        what = f"{kind} {dname(dtype)} {shape} residual {dname(r_dtype)} h {dname(hd)}"
        h_ref = ref_add(x, r, hd)
        assert h.dtype == hd and h.shape == shape and y.dtype == dtype
        np.testing.assert_array_equal(f64(h), f64(h_ref), err_msg=what + " h")
        assert_close(y, _ref_y(kind, h_ref, gamma, beta, zc), dtype, what + " y")


# On a GPU the residual add at decode-time row counts takes fwd_decode as the
# plain norm does, with three differences: rows are not split into parts,
# rows of more than 1024 packs, more than one a SM, take fwd_regs (not
# fwd_decode's variant of four packs a thread), and RMSNorm's rows of at most
# 1024 packs take one pack a thread (two otherwise).
@pytest.mark.parametrize("rows, packs", decode_bounds(), ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_add_norm_decode_bounds(kind, dtype, rows, packs, platform):
    _check_add_forward(kind, dtype, (rows, decode_hidden(packs, dtype)), platform)


# The residual add + norm on a slice of a split hidden dim, as each device
# runs it (h and the slice's statistics in one pass, *_add_stats, then the
# apply kernel), here on one device with no mesh axes: h exactly, y against
# float64, for each residual / h dtype; 700x4096 puts several rows in a CTA
# of the statistics kernel, (5, 7) and (3, 40001) take its unaligned path.
@pytest.mark.parametrize("shape", [(5, 7), (700, 4096), (3, 40001), (2, 65536)], ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_hidden_slice_path(kind, dtype, shape, platform):
    from jax_rmsnorm import _primitives as prim

    key = case_key(("addslice", kind, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    gamma, beta = _params(kind, shape[-1], dtype, key)
    for i, (r_dtype, h_dtype) in enumerate([(dtype, dtype), (jnp.float32, jnp.float32), (jnp.float32, dtype),
                                            (dtype, jnp.float32)]):
        r = random(key + 10 + i, shape, r_dtype, scale=1.5)
        fused = prim.FusedSpec(residual=True, h_dtype=np.dtype(h_dtype))

        def run(x, r, g, b):
            y, _, _, h, _, _, _ = prim.norm_fwd_fused(
                x, g, b, r, None, None, kind=kind, eps=EPS[kind], zero_centered_gamma=False, has_gamma=True,
                has_beta=kind == "layer", fused=fused, on_hidden_slice="cuda" if platform == "gpu" else "cpu")
            return y, h

        args = put(platform, x, r, gamma, beta)
        hlo = jax.jit(run).lower(*args).as_text()
        assert f"jrn_{kind}_norm_add_stats" in hlo and f"jrn_{kind}_norm_apply" in hlo
        poison(platform, 8 * x.size + 1024)
        y, h = jax.jit(run)(*args)
        what = f"{kind} {dname(dtype)} {shape} slice residual {dname(r_dtype)} h {dname(h_dtype)}"
        h_ref = ref_add(x, r, h_dtype)
        assert h.dtype == h_dtype and h.shape == shape and y.dtype == dtype, what
        np.testing.assert_array_equal(f64(h), f64(h_ref), err_msg=what + " h")
        assert_close(y, _ref_y(kind, h_ref, gamma, beta), dtype, what + " y")


# Wide rows on a GPU, in every dtype: 500x65536 takes the two passes
# (fwd_add_stats, fwd_apply: rows enough to fill the GPU), 40x262144 one
# cluster a row; a float32 h (h_dtype) always the cluster.
@pytest.mark.parametrize("shape", [(500, 65536), (40, 262144)], ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_add_norm_forward_many_rows(kind, dtype, shape, platform):
    key = case_key(("addmany", kind, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    r = random(key + 1, shape, dtype, scale=1.5)
    gamma, beta = _params(kind, shape[-1], dtype, key)
    cases = [(None, False), (None, True)] + ([(jnp.float32, False)] if dtype != jnp.float32 else [])
    for hd, zc in cases:
        g = gamma - 1 if zc else gamma  # zero-centered: the same scale
        _, (y, h) = _add_norm(kind, platform, x, r, g, beta, hd, zc)
        h_ref = ref_add(x, r, hd or dtype)
        what = f"{kind} {dname(dtype)} {shape} h {dname(hd or dtype)} zc {zc}"
        np.testing.assert_array_equal(f64(h), f64(h_ref), err_msg=what + " h")
        assert_close(y, _ref_y(kind, h_ref, g, beta, zc), dtype, what + " y")


def _jnp_norm(kind, x, gamma, beta, zc=False):
    """The jnp composition the gradients are checked against (float32 math)."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True) if kind == "layer" else 0.0
    var = jnp.mean(jnp.square(xf - mean), -1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + EPS[kind])
    if gamma is not None:
        y = y * (gamma.astype(jnp.float32) + (1.0 if zc else 0.0))
    if beta is not None:
        y = y + beta.astype(jnp.float32)
    return y


GRAD_SHAPES = [(5, 7), (4, 1000), (3, 40001), (2, 65536)]


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_add_norm_grad(kind, dtype, shape, platform):
    _check_add_grad(kind, dtype, shape, platform, [(None, dtype), (jnp.float32, jnp.float32)])


# More rows than the GPU's persistent slots: dh goes through every stage of the
# backward's shared-memory ring, several rows per slot (GRAD_SHAPES has too few).
# At 4097 each row starts at its own offset from a 16-byte boundary; at 12290
# such rows take one CTA of three packs a thread, at 16383 (16-bit x) one of
# four for RMSNorm and a cluster of two CTAs for LayerNorm, at 24583 a
# cluster of four for both.
@pytest.mark.parametrize("shape", [(3000, 4096), (500, 65536), (1200, 4097), (600, 12290), (600, 16383),
                                   (300, 24583)], ids=sid)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_add_norm_grad_many_rows(kind, shape, platform):
    _check_add_grad(kind, jnp.bfloat16, shape, platform, [(None, jnp.bfloat16)])


def _check_add_grad(kind, dtype, shape, platform, h_r_dtypes):
    key = case_key(("addgrad", kind, shape))
    hidden = shape[-1]
    for h_dtype, r_dtype in h_r_dtypes:
        x = random(key, shape, dtype, offset=0.3)
        r = random(key + 1, shape, r_dtype)
        gamma, beta = _params(kind, hidden, dtype, key)
        wy = random(key + 4, shape, jnp.float32)
        wh = random(key + 5, shape, jnp.float32)
        hd = h_dtype or dtype
        f, _ = _add_norm(kind, platform, x, r, gamma, beta, h_dtype)

        def loss(x, r, g, b):
            y, h = f(x, r, g, b)
            return jnp.sum(y.astype(jnp.float32) * wy) + jnp.sum(h.astype(jnp.float32) * wh)

        def ref_loss(x, r, g, b):
            h = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(hd)
            y = _jnp_norm(kind, h, g, b).astype(dtype)
            return jnp.sum(y.astype(jnp.float32) * wy) + jnp.sum(h.astype(jnp.float32) * wh)

        argnums = (0, 1, 2) if kind == "rms" else (0, 1, 2, 3)
        args = put(platform, x, r, gamma, beta)
        poison(platform, 8 * x.size + 1024)
        got = jax.jit(jax.grad(loss, argnums))(*args)
        want = jax.grad(ref_loss, argnums)(*[None if a is None else jnp.asarray(a, jnp.float32) for a in args])
        rows = math.prod(shape[:-1])
        for n, (gv, wv, a) in enumerate(zip(got, want, args)):
            what = f"{kind} {dname(dtype)} {shape} h {dname(hd)} grad {['x', 'residual', 'gamma', 'beta'][n]}"
            assert gv.dtype == a.dtype, what
            wv = f64(wv)
            assert_close(gv, wv, dtype if n < 2 else a.dtype, what,
                         scale=max(1.0, np.abs(wv).max(), np.sqrt(rows) if n >= 2 else 1.0))


# ---------------------------------------------------------------------------
# FP8 output

FP8_SHAPES = [(3, 1), (5, 7), (2, 3, 1000), (37, 1024), (16, 4096), (3, 40001), (2, 65536)]


def _fp8_fn(kind, quant, **kw):
    name = {"tensor": "norm_fp8", "row": "norm_fp8_rowwise", "group": "norm_fp8_groupwise",
            "current": "norm_fp8_current"}[quant]
    fn = getattr(jrn, ("rms_" if kind == "rms" else "layer_") + name)
    if kind == "rms":
        return lambda x, g, b, **k: fn(x, g, eps=EPS[kind], **kw, **k)
    return lambda x, g, b, **k: fn(x, g, b, eps=EPS[kind], **kw, **k)


def _run_fp8(platform, f, x, gamma, beta, **kw):
    """jit(f)(x, gamma, beta, **kw) on `platform` (an `_fp8_fn`), with the
    memory its outputs will take poisoned first."""
    x_, g_, b_ = put(platform, x, gamma, beta)
    poison(platform, 8 * x.size + 1024)
    return jax.jit(f)(x_, g_, b_, **kw)


def _fp8_case(tag, kind, dtype, shape, fmt, platform, quant, **kw):
    """One FP8-output case on fresh data keyed by (tag, kind, shape): x = 2 *
    N(0, 1) + 0.5 and its parameters (x, gamma, beta), the op's outputs on
    `platform`, the float64 reference y, and the case's name."""
    key = case_key((tag, kind, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    gamma, beta = _params(kind, shape[-1], dtype, key)
    outs = _run_fp8(platform, _fp8_fn(kind, quant, out_dtype=fmt), x, gamma, beta, **kw)
    return (x, gamma, beta), outs, _ref_y(kind, x, gamma, beta), f"{kind} {dname(dtype)} {shape} {dname(fmt)}"


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=dname)
@pytest.mark.parametrize("shape", FP8_SHAPES, ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_tensor(kind, dtype, shape, fmt, platform):
    scale = np.float32(37.5 if fmt == E4M3 else 3000.0)
    _, (q, amax), y, what = _fp8_case("t", kind, dtype, shape, fmt, platform, "tensor", scale=scale)
    assert q.shape == shape and amax.shape == () and amax.dtype == jnp.float32
    np.testing.assert_allclose(float(amax), np.abs(y).max(), rtol=2e-5, err_msg=what + " amax")
    m = FP8_MAX[np.dtype(fmt)]
    assert_fp8_close(q, np.clip(y * scale, -m, m), fmt, what + " q", y_error(y) * scale)


# 4x12288: on the GPU, rows of one 512-thread CTA whose last packs are past
# the row's end, where RMSNorm's per-row kernel holds x * gamma in registers.
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=dname)
@pytest.mark.parametrize("shape", FP8_SHAPES + [(4, 12288)], ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_rowwise(kind, dtype, shape, fmt, platform):
    _check_fp8_rowwise(kind, dtype, shape, fmt, platform, "r")


# Per-row FP8 with many rows a cluster walks (the exchange buffers reused
# row after row; a row's max pushed with the next row's sums): 300x65536 on a
# GPU, a cluster of 4 CTAs a row; 200x65544, clusters of 8 whose last three
# CTAs hold no columns (and the fifth 8), several rows a cluster.
@pytest.mark.parametrize("shape", [(300, 65536), (200, 65544)], ids=sid)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_rowwise_many_rows(kind, shape, platform):
    _check_fp8_rowwise(kind, jnp.bfloat16, shape, E4M3, platform, "rmany")


def _check_fp8_rowwise(kind, dtype, shape, fmt, platform, tag):
    """Per-row FP8 output against the float64 reference: the row scales, q, and
    each row's largest |q| at the format's max."""
    _, (q, rs), y, what = _fp8_case(tag, kind, dtype, shape, fmt, platform, "row")
    assert rs.shape == shape[:-1] and rs.dtype == jnp.float32
    np.testing.assert_allclose(f64(rs), ref_scales(np.abs(y).max(-1), fmt), rtol=2e-5, err_msg=what + " scales")
    m = FP8_MAX[np.dtype(fmt)]
    assert_fp8_close(q, np.clip(y / f64(rs)[..., None], -m, m), fmt, what + " q", y_error(y) / f64(rs)[..., None])
    # the row's largest |y| lands at (or within rounding of) the format's max
    np.testing.assert_allclose(np.abs(f64(q)).max(-1), m, rtol=FP8_RTOL[np.dtype(fmt)])


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=dname)
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 1000), (16, 4096), (3, 40001), (2, 65536)], ids=sid)
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_current(kind, dtype, shape, fmt, platform):
    (x, gamma, beta), (q, si), y, what = _fp8_case("c", kind, dtype, shape, fmt, platform, "current")
    what += " current"
    assert si.shape == () and si.dtype == jnp.float32
    np.testing.assert_allclose(float(si), ref_scales(np.abs(y).max(), fmt), rtol=2e-5, err_msg=what)
    m = FP8_MAX[np.dtype(fmt)]
    assert_fp8_close(q, np.clip(y / float(si), -m, m), fmt, what + " q", y_error(y) / float(si))
    assert np.abs(f64(q)).max() == m
    # the transposed copy: q's bytes, (hidden, rows); q itself as without it
    # (on the GPU made by another kernel, from the statistics of the measuring pass)
    q2, si2, qt = _run_fp8(platform, _fp8_fn(kind, "current", out_dtype=fmt, transpose=True), x, gamma, beta)
    rows = math.prod(shape[:-1])
    assert qt.shape == (shape[-1], rows) and qt.dtype == q.dtype and float(si2) == float(si)
    np.testing.assert_array_equal(np.asarray(qt).view(np.uint8), np.asarray(q2).reshape(rows, -1).T.view(np.uint8))
    assert_fp8_close(q2, np.clip(y / float(si), -m, m), fmt, what + " q with q_t", y_error(y) / float(si))
    # an all-zero tensor: the floor scale, zeros out
    x_, g_ = put(platform, x, gamma)
    q, si = _fp8_fn(kind, "current", out_dtype=fmt)(jnp.zeros_like(x_), g_, None)
    assert float(si) == np.float32(MIN_SCALE) and not f64(q).any()



# Current scaling's parameters as its measuring pass reads them (RMSNorm's is a
# kernel of its own on the GPU): float32 gamma for 16-bit x, zero-centered
# gamma, no gamma, an unaligned hidden size, and under vmap a gamma per tensor.
@pytest.mark.parametrize("shape", [(64, 1000), (32, 4096), (4, 65536), (6, 1001)], ids=sid)
@pytest.mark.parametrize("params", ["f32", "zero_centered", "none"])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_current_params(kind, params, shape, platform):
    key = case_key(("cp", kind, params, shape))
    dtype = jnp.bfloat16
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    gamma, beta, zc = _param_case(kind, params, shape[-1], dtype, key)
    f = _fp8_fn(kind, "current", zero_centered_gamma=zc)
    q, si = _run_fp8(platform, f, x, gamma, beta)
    what = f"{kind} {params} {shape} current"
    y = ref_forward(kind, x, gamma, beta, EPS[kind], zc)[0]
    np.testing.assert_allclose(float(si), ref_scales(np.abs(y).max(), E4M3), rtol=2e-5, err_msg=what + " scale_inv")
    m = FP8_MAX[np.dtype(E4M3)]
    assert_fp8_close(q, np.clip(y / float(si), -m, m), E4M3, what + " q", y_error(y) / float(si))
    if gamma is None:
        return
    # three tensors, each with its own gamma (and beta): one scale_inv each
    x3 = random(key + 7, (3,) + shape, dtype, scale=2.0, offset=0.5) * jnp.array([1.0, 8.0, 0.25])[
        (slice(None),) + (None,) * len(shape)]
    x3 = x3.astype(dtype)
    g3 = jnp.stack([gamma, (gamma.astype(jnp.float32) * 0.5).astype(gamma.dtype), gamma[::-1]])
    b3 = None if beta is None else jnp.stack([beta, beta * 2, -beta])
    x3_, g3_, b3_ = put(platform, x3, g3, b3)
    poison(platform, 8 * x3.size + 1024)
    q3, si3 = jax.jit(jax.vmap(f))(x3_, g3_, b3_)
    for i in range(3):
        yi = ref_forward(kind, x3[i], g3[i], None if b3 is None else b3[i], EPS[kind], zc)[0]
        wi = f"{what} vmapped tensor {i}"
        np.testing.assert_allclose(float(si3[i]), ref_scales(np.abs(yi).max(), E4M3), rtol=2e-5,
                                   err_msg=wi + " scale_inv")
        assert_fp8_close(q3[i], np.clip(yi / float(si3[i]), -m, m), E4M3, wi + " q", y_error(yi) / float(si3[i]))

def _check_fp8_outputs(kind, quant, x, gamma, beta, outs, fmt, what, scale=None, group=None, zc=False):
    """q and its statistic (amax, scale_inv, row or group scales) against the float64 reference."""
    y = _ref_y(kind, x, gamma, beta, zc)
    m = FP8_MAX[np.dtype(fmt)]
    q, stat = outs[0], f64(outs[1])
    if quant == "tensor":
        np.testing.assert_allclose(stat, np.abs(y).max(), rtol=2e-5, err_msg=what + " amax")
        assert_fp8_close(q, np.clip(y * scale, -m, m), fmt, what + " q", y_error(y) * scale)
        return
    if quant == "current":
        s = ref_scales(np.abs(y).max(), fmt)
    elif quant == "row":
        s = ref_scales(np.abs(y).max(-1), fmt)[..., None]
    else:
        s = ref_scales(np.abs(y.reshape(y.shape[:-1] + (-1, group))).max(-1), fmt).repeat(group, -1)
        stat = stat.repeat(group, -1)
    np.testing.assert_allclose(stat if quant != "row" else stat[..., None], s, rtol=2e-5, err_msg=what + " scales")
    assert_fp8_close(q, np.clip(y / s, -m, m), fmt, what + " q", y_error(y) / s)


def _check_fp8_vmapped(kind, quant, xs, gamma, beta, platform, what, scales=None):
    """The per-tensor ("tensor", with `scales` one a tensor) or current-scaling FP8 forward under vmap over
    xs' first axis (one amax or scale_inv a tensor), each tensor against the float64 reference."""
    f = _fp8_fn(kind, quant, out_dtype=E4M3)
    g_, b_ = put(platform, gamma, beta)
    if scales is None:
        got = jax.jit(jax.vmap(lambda x: f(x, g_, b_)))(put(platform, xs)[0])
    else:
        got = jax.jit(jax.vmap(lambda x, s: f(x, g_, b_, scale=s)))(put(platform, xs)[0], scales)
    for i in range(xs.shape[0]):
        _check_fp8_outputs(kind, quant, np.asarray(xs[i]), gamma, beta, (got[0][i], got[1][i]), E4M3,
                           f"{what} vmapped tensor {i}", scale=None if scales is None else scales[i])


# The FP8 outputs with parameters other than gamma (and LayerNorm's beta) as
# given: the wide-row kernel (fwd_slices) has a loop of its own for that common
# case and takes these through the general one. float32 gamma for bf16 x,
# zero-centred gamma, LayerNorm without beta, no parameters; rows of one CTA
# (4096; 16384, where RMSNorm's per row holds x * gamma) and of a cluster (65536).
@pytest.mark.parametrize("shape", [(32, 4096), (8, 16384), (4, 65536)], ids=sid)
@pytest.mark.parametrize("kind,params", [("rms", "f32"), ("rms", "zero_centered"), ("rms", "none"),
                                         ("layer", "f32"), ("layer", "zero_centered"), ("layer", "no_beta"),
                                         ("layer", "none")])
@pytest.mark.parametrize("quant", ["tensor", "row", "group"])
def test_fp8_params(kind, params, quant, shape, platform):
    _check_fp8_params(kind, params, quant, shape, platform)


# LayerNorm's per row where one CTA of up to 128 threads takes the row (bf16
# x, hidden 1024 to 4096: parameters held, the pending row's y in shared
# memory), with parameters other than the common case and rows enough for
# several a CTA; at 49152 a cluster whose common case stages gamma and beta
# (kSliceStagedRow), these cases not.
@pytest.mark.parametrize("shape", [(10000, 1024), (3000, 4096), (300, 49152)], ids=sid)
@pytest.mark.parametrize("params", ["zero_centered", "no_beta", "none"])
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_rowwise_params_many_rows(params, shape, platform):
    _check_fp8_params("layer", params, "row", shape, platform)


# The per-tensor, per-row and per-group FP8 outputs where a GPU CTA of one
# warp takes the row (bf16 x, hidden 1024: RMSNorm's gamma, LayerNorm's gamma
# and beta held in registers across rows), with parameters other than the
# common case and rows enough for several a CTA.
@pytest.mark.parametrize("params", ["zero_centered", "none"])
@pytest.mark.parametrize("quant", ["tensor", "row", "group"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_one_warp_params_many_rows(kind, quant, params, platform):
    _check_fp8_params(kind, params, quant, (10000, 1024), platform)


# The same CTAs with each example's own parameters under vmap: 3 x 3000
# rows, so a CTA's rows cross from one example's parameters to the next and
# it loads the held ones again; each example against the float64 reference.
@pytest.mark.parametrize("quant", ["tensor", "row", "group"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_one_warp_per_example_params(kind, quant, platform):
    key = case_key(("onewarp", kind, quant))
    xs = random(key, (3, 3000, 1024), jnp.bfloat16, scale=2.0, offset=0.5)
    gs = random(key + 1, (3, 1024), jnp.bfloat16, scale=0.5, offset=1.0)
    bs = random(key + 2, (3, 1024), jnp.bfloat16, scale=0.5) if kind == "layer" else None
    f = _fp8_fn(kind, quant, out_dtype=E4M3, **(dict(group_size=128) if quant == "group" else {}))
    scale = np.float32(37.5)
    kw = dict(scale=scale) if quant == "tensor" else {}
    x_, g_, b_ = put(platform, xs, gs, bs)
    poison(platform, 8 * xs.size + 1024)
    if kind == "rms":
        got = jax.jit(jax.vmap(lambda x, g: f(x, g, None, **kw)))(x_, g_)
    else:
        got = jax.jit(jax.vmap(lambda x, g, b: f(x, g, b, **kw)))(x_, g_, b_)
    for i in range(3):
        _check_fp8_outputs(kind, quant, np.asarray(xs[i]), gs[i], None if bs is None else bs[i],
                           (got[0][i], got[1][i]), E4M3, f"{kind} {quant} example {i}",
                           scale=scale if quant == "tensor" else None, group=128)


# Per row with float32 gamma (and beta) for bf16 x where the kernel that holds
# y (LayerNorm) or x * gamma (RMSNorm) runs its instance held to fewer
# registers (row_cap_fits): CTAs of 352 and 384 threads, one a row with
# rows enough for several a CTA, and a cluster of 2 a row.
@pytest.mark.parametrize("shape", [(40, 11264), (1500, 12288), (300, 24576)], ids=sid)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_rowwise_f32_params(kind, shape, platform):
    _check_fp8_params(kind, "f32", "row", shape, platform)


def _check_fp8_params(kind, params, quant, shape, platform):
    key = case_key(("fp", kind, params, quant, shape))
    x = random(key, shape, jnp.bfloat16, scale=2.0, offset=0.5)
    gamma, beta, zc = _param_case(kind, params, shape[-1], jnp.bfloat16, key)
    kw = dict(group_size=128) if quant == "group" else {}
    scale = np.float32(37.5)
    f = _fp8_fn(kind, quant, out_dtype=E4M3, zero_centered_gamma=zc, **kw)
    outs = _run_fp8(platform, f, x, gamma, beta, **(dict(scale=scale) if quant == "tensor" else {}))
    _check_fp8_outputs(kind, quant, x, gamma, beta, outs, E4M3, f"{kind} {params} {quant} {shape}",
                       scale=scale, group=128, zc=zc)


# On a GPU, per-tensor and per-row FP8 (current scaling's two passes too) at
# widths that are not a multiple of a 16-byte pack take fwd_unaligned, as the
# plain forward does (test_add_norm_forward_unaligned), with the residual and
# without; 32769 (16-bit x) lies past it. Each width takes one parameter case
# in turn (float32 gamma, zero-centred, LayerNorm without beta, none).
UNALIGNED_SHAPES = [(600, 127), (300, 1001), (100, 4097), (64, 4100), (20, 12290), (10, 32769)]


@pytest.mark.parametrize("shape", UNALIGNED_SHAPES, ids=sid)
@pytest.mark.parametrize("quant", ["tensor", "row", "current"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_unaligned(kind, dtype, quant, shape, platform):
    cases = ["common", "f32", "zero_centered", "none"] + (["no_beta"] if kind == "layer" else [])
    params = cases[UNALIGNED_SHAPES.index(shape) % len(cases)]
    key = case_key(("fp8u", kind, quant, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    r = random(key + 1, shape, dtype, scale=1.5)
    gamma, beta, zc = _param_case(kind, params, shape[-1], dtype, key)
    scale = np.float32(37.5)
    kw = dict(scale=scale) if quant == "tensor" else {}
    f = _fp8_fn(kind, quant, out_dtype=E4M3, zero_centered_gamma=zc)
    what = f"{kind} {dname(dtype)} {shape} {quant} {params}"
    outs = _run_fp8(platform, f, x, gamma, beta, **kw)
    _check_fp8_outputs(kind, quant, x, gamma, beta, outs, E4M3, what, scale=scale, zc=zc)
    q, qs, h = _run_fp8(platform, f, x, gamma, beta, residual=put(platform, r)[0], **kw)
    h_ref = ref_add(x, r, dtype)
    np.testing.assert_array_equal(f64(h), f64(h_ref), err_msg=what + " residual h")
    _check_fp8_outputs(kind, quant, h_ref, gamma, beta, (q, qs), E4M3, what + " residual", scale=scale, zc=zc)


# Current scaling at widths that are not a multiple of a pack, under vmap:
# three tensors of 5 rows and different magnitudes, each its own scale. On a
# GPU each row's max |y| is merged into its tensor's amax by x_amax (rows cut
# at their 16-byte boundaries), and x_quantize divides by that tensor's scale.
@pytest.mark.parametrize("hidden", [127, 4100, 12290])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_current_unaligned_vmapped(kind, hidden, platform):
    key = case_key(("fp8uv", kind, hidden))
    xs = random(key, (3, 5, hidden), jnp.bfloat16, scale=2.0, offset=0.5) * jnp.array([0.5, 4.0, 1.0])[:, None, None]
    xs = xs.astype(jnp.bfloat16)
    gamma, beta = _params(kind, hidden, jnp.bfloat16, key)
    poison(platform, 8 * xs.size + 1024)
    _check_fp8_vmapped(kind, "current", xs, gamma, beta, platform, f"{kind} {hidden}")


# More rows than the GPU's persistent slots: the FP8 forward walks several
# rows per slot through every stage of its shared-memory ring, and under vmap
# a slot's rows cross from one tensor (one amax) to the next. At 1024,
# LayerNorm's per-tensor slots are CTAs of one warp (32 a SM on an H100); at
# 8192, RMSNorm's per row holds x * gamma in 256-thread CTAs, at 16384 its
# per row and per group in 512-thread CTAs. At 12288 a row takes one CTA of
# 384 threads, at 24576 a cluster of two such CTAs (row_threads). At 8200
# (1025 packs in 288 threads of four) a CTA's last packs lie past the row's
# end; at the other widths the row's packs fill the threads exactly.
# LayerNorm's per row of bf16 x holds y in shared memory at 1024 and in
# registers at 2048 and 4096. RMSNorm's per row at 1032 (129 packs in rows of
# 64 threads of four slots: half of a row's slots empty) and 2048 runs two
# rows a CTA of 128 in fwd_regs; at 512 eight (rows of 16 threads), at 520
# (65 packs in 128 slots) and 1024 four (rows of 32). Both per-row outputs take
# clusters of 8 at 49152 and LayerNorm's at 65536 (kSliceRowSplitThreads).
@pytest.mark.parametrize("shape", [(8000, 512), (6000, 520), (10000, 1024), (3000, 1032), (4000, 2048), (3000, 4096),
                                   (1200, 8192), (600, 8200), (700, 12288), (600, 16384), (300, 24576), (300, 49152),
                                   (300, 65536)], ids=sid)
@pytest.mark.parametrize("quant", ["tensor", "row", "group", "current"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_many_rows(kind, quant, shape, platform):
    key = case_key(("many", kind, quant, shape))
    x = random(key, shape, jnp.bfloat16, scale=2.0, offset=0.5)
    gamma, beta = _params(kind, shape[-1], jnp.bfloat16, key)
    group = 128 if shape[-1] % 128 == 0 else 8  # 8200 = 8 * 1025
    kw = dict(group_size=group) if quant == "group" else {}
    f = _fp8_fn(kind, quant, out_dtype=E4M3, **kw)
    scale = np.float32(37.5)
    outs = _run_fp8(platform, f, x, gamma, beta, **(dict(scale=scale) if quant == "tensor" else {}))
    what = f"{kind} {shape} {quant}"
    _check_fp8_outputs(kind, quant, x, gamma, beta, outs, E4M3, what, scale=scale, group=group)
    if quant in ("tensor", "current"):  # three tensors of 1000 rows, one amax / scale each
        n = 1000 * 4096 // shape[-1]
        xs = random(key + 1, (3, n, shape[-1]), jnp.bfloat16, scale=2.0) * jnp.array([0.5, 4.0, 1.0])[:, None, None]
        xs = xs.astype(jnp.bfloat16)
        scales = np.array([300.0, 20.0, 90.0], np.float32) if quant == "tensor" else None
        _check_fp8_vmapped(kind, quant, xs, gamma, beta, platform, what, scales)


# The per-row FP8 outputs across a cluster of CTAs (kSliceRowRegs) at
# widths whose packs do not fill the cluster's threads, so each pack asks
# whether it lies in the row, in both 16-bit dtypes: 24584 (3073 packs of 8)
# in two CTAs of 416 threads; 49160 (6145 packs) in LayerNorm's eight CTAs of
# 224 and RMSNorm's four of 416 (a CTA's share one pack past
# kSliceRowSplitThreads' limit, so not split).
@pytest.mark.parametrize("shape", [(300, 24584), (200, 49160)], ids=sid)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=dname)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_row_cluster_ragged(kind, dtype, shape, platform):
    key = case_key(("rowragged", kind, dtype, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    gamma, beta = _params(kind, shape[-1], dtype, key)
    outs = _run_fp8(platform, _fp8_fn(kind, "row", out_dtype=E4M3), x, gamma, beta)
    _check_fp8_outputs(kind, "row", x, gamma, beta, outs, E4M3, f"{kind} {dname(dtype)} {shape} row")


# Per-tensor FP8 under vmap at narrow widths, where a GPU CTA takes several
# rows (fwd_regs; fwd_unaligned at 1000) and merges their max |y| into amax
# once when they are all of one tensor: tensors of row counts that are not a
# multiple of a CTA's rows put the rows of two tensors in one CTA (merged row
# by row) and leave the last CTA part empty; each tensor's amax must still be
# its own.
@pytest.mark.parametrize("shape", [(3, 1001, 1024), (3, 37, 256), (2, 333, 2048), (3, 50, 1000), (4, 130, 512)],
                         ids=sid)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_tensor_vmapped_rows(kind, dtype, shape, platform):
    key = case_key(("fp8tv", kind, dtype, shape))
    mags = jnp.array([0.5, 4.0, 1.0, 2.5][: shape[0]])[:, None, None]
    xs = (random(key, shape, jnp.float32, scale=2.0, offset=0.5) * mags).astype(dtype)
    gamma, beta = _params(kind, shape[-1], dtype, key)
    scales = np.array([300.0, 20.0, 90.0, 45.0][: shape[0]], np.float32)
    poison(platform, 8 * xs.size + 1024)
    _check_fp8_vmapped(kind, "tensor", xs, gamma, beta, platform, f"{kind} {dname(dtype)} {shape}", scales)


# 16384: on the GPU, RMSNorm's per-group kernel changes there (fwd_slices, a
# row to one CTA of 512 threads, for 16-bit x, holding x * gamma; float32
# rows are wider than one CTA). 1040 (130 packs of bf16): a row that does not
# fill its CTA's threads, LayerNorm's per group then in ONE_CTA without WHOLE.
GROUP_CASES = [(16, (3, 16)), (16, (5, 1008)), (128, (4, 4096)), (128, (2, 3, 1024)), (16, (2, 65536)),
               (128, (2, 65536)), (24, (3, 72)), (48, (2, 4800)), (128, (5, 16384)), (16, (3, 16384)),
               (16, (37, 1024)), (16, (4, 2048)), (128, (3, 6144)), (16, (5, 1040))]


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=dname)
@pytest.mark.parametrize("group, shape", GROUP_CASES, ids=lambda v: str(v) if isinstance(v, int) else sid(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_groupwise(kind, dtype, group, shape, fmt, platform):
    gpu_routing_case(platform, (group, shape), [(16, (3, 16)), (16, (5, 1008)), (128, (2, 3, 1024)), (24, (3, 72)),
                                                (48, (2, 4800)), (16, (2, 65536))])
    key = case_key(("g", kind, shape, group))
    hidden = shape[-1]
    # Magnitudes that differ by group, so a value assigned to the wrong group
    # (or a group max taken over the wrong lanes) is off by far more than rounding.
    mag = np.exp(np.random.default_rng(key).uniform(-3, 3, hidden // group)).repeat(group)
    x = (random(key, shape, jnp.float32) * mag).astype(dtype)
    gamma, beta = _params(kind, hidden, dtype, key)
    q, gs = _run_fp8(platform, _fp8_fn(kind, "group", out_dtype=fmt, group_size=group), x, gamma, beta)
    y = _ref_y(kind, x, gamma, beta)
    what = f"{kind} {dname(dtype)} {shape} group {group} {dname(fmt)}"
    assert gs.shape == shape[:-1] + (hidden // group,) and gs.dtype == jnp.float32
    yg = y.reshape(shape[:-1] + (hidden // group, group))
    np.testing.assert_allclose(f64(gs), ref_scales(np.abs(yg).max(-1), fmt), rtol=2e-5, err_msg=what + " scales")
    m = FP8_MAX[np.dtype(fmt)]
    want = np.clip(yg / f64(gs)[..., None], -m, m).reshape(shape)
    err = (y_error(y) / f64(gs)[..., None] + 0 * yg).reshape(shape)
    assert_fp8_close(q, want, fmt, what + " q", err)


@pytest.mark.parametrize("quant", ["tensor", "row", "group", "current"])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_with_residual(kind, quant, platform):
    for shape, dtype, r_dtype, h_dtype in [((6, 256), jnp.bfloat16, jnp.bfloat16, None),
                                           ((3, 4096), jnp.bfloat16, jnp.float32, jnp.float32),
                                           ((2, 40064), jnp.float16, jnp.float16, None),
                                           ((2, 65536), jnp.float32, jnp.float32, None)]:
        key = case_key((kind, quant, shape))
        x = random(key, shape, dtype)
        r = random(key + 1, shape, r_dtype, offset=0.5)
        gamma, beta = _params(kind, shape[-1], dtype, key)
        kw = dict(scale=np.float32(50.0)) if quant == "tensor" else {}
        if quant == "group":
            kw["group_size"] = 128
        args = put(platform, x, gamma, beta, r)
        poison(platform, 8 * x.size + 1024)
        q, qs, h = jax.jit(lambda x, g, b, r: _fp8_fn(kind, quant, **kw)(x, g, b, residual=r, h_dtype=h_dtype))(*args)
        hd = h_dtype or dtype
        h_ref = ref_add(x, r, hd)
        what = f"{kind} {quant} {shape} {dname(dtype)} residual {dname(r_dtype)}"
        np.testing.assert_array_equal(f64(h), f64(h_ref), err_msg=what + " h")
        y = _ref_y(kind, h_ref, gamma, beta)
        if quant == "tensor":
            np.testing.assert_allclose(float(qs), np.abs(y).max(), rtol=2e-5, err_msg=what)
            want, err = np.clip(y * 50.0, -448, 448), y_error(y) * 50.0
        elif quant == "current":
            np.testing.assert_allclose(float(qs), ref_scales(np.abs(y).max(), E4M3), rtol=2e-5, err_msg=what)
            want, err = np.clip(y / float(qs), -448, 448), y_error(y) / float(qs)
        elif quant == "row":
            np.testing.assert_allclose(f64(qs), ref_scales(np.abs(y).max(-1), E4M3), rtol=2e-5, err_msg=what)
            want, err = np.clip(y / f64(qs)[..., None], -448, 448), y_error(y) / f64(qs)[..., None]
        else:
            yg = y.reshape(shape[:-1] + (-1, 128))
            np.testing.assert_allclose(f64(qs), ref_scales(np.abs(yg).max(-1), E4M3), rtol=2e-5, err_msg=what)
            want = np.clip(yg / f64(qs)[..., None], -448, 448).reshape(shape)
            err = (y_error(y) / f64(qs)[..., None] + 0 * yg).reshape(shape)
        assert_fp8_close(q, want, E4M3, what + " q", err)


# A residual, rows wider than one CTA and enough of them to fill the GPU:
# per-tensor FP8 (and current scaling's quantizing pass) and RMSNorm's per-row
# FP8 take the two passes (fwd_add_stats, then fwd_apply quantizing). As one
# tensor of 300 rows, and under vmap as three of 100 rows, whose CTAs merge
# into three amax.
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=dname)
@pytest.mark.parametrize("quant", ["tensor", "row", "current"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_fp8_with_residual_many_rows(kind, quant, dtype, platform):
    key = case_key(("addmany8", kind, quant, dname(dtype)))
    n, hidden = 100, 65536
    x = random(key, (3, n, hidden), dtype, scale=2.0, offset=0.5)
    r = (random(key + 1, (3, n, hidden), dtype, scale=1.5) * jnp.array([0.5, 4.0, 1.0])[:, None, None]).astype(dtype)
    gamma, beta = _params(kind, hidden, dtype, key)
    scales = np.array([300.0, 20.0, 90.0], np.float32)
    f = _fp8_fn(kind, quant)
    x_, r_, g_, b_ = put(platform, x, r, gamma, beta)
    if quant == "tensor":
        one = lambda x, r, s: f(x, g_, b_, residual=r, scale=s)
    else:
        one = lambda x, r, s: f(x, g_, b_, residual=r)
    poison(platform, 8 * x.size + 1024)
    whole = jax.jit(one)(x_.reshape(-1, hidden), r_.reshape(-1, hidden), scales[0])
    h_ref = ref_add(x, r, dtype)
    what = f"{kind} {quant} {dname(dtype)} residual {3 * n}x{hidden}"
    np.testing.assert_array_equal(f64(whole[2]), f64(h_ref.reshape(-1, hidden)), err_msg=what + " h")
    _check_fp8_outputs(kind, quant, h_ref.reshape(-1, hidden), gamma, beta, whole[:2], E4M3, what, scale=scales[0])
    poison(platform, 8 * x.size + 1024)
    got = jax.jit(jax.vmap(one))(x_, r_, scales)
    for i in range(3):
        np.testing.assert_array_equal(f64(got[2][i]), f64(h_ref[i]), err_msg=f"{what} vmapped tensor {i} h")
        _check_fp8_outputs(kind, quant, h_ref[i], gamma, beta, (got[0][i], got[1][i]), E4M3,
                           f"{what} vmapped tensor {i}", scale=scales[i])


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_saturates(kind, fmt, platform):
    x = random(3, (8, 512), jnp.bfloat16, scale=3.0)
    gamma, beta = _params(kind, 512, jnp.bfloat16, 3)
    m = FP8_MAX[np.dtype(fmt)]
    x_, g_, b_ = put(platform, x, gamma, beta)
    q, amax = _fp8_fn(kind, "tensor", out_dtype=fmt)(x_, g_, b_, scale=np.float32(m))  # |y| > 1 saturates
    y = _ref_y(kind, x, gamma, beta)
    qf = f64(q)
    assert np.isfinite(qf).all()
    big = np.abs(y) * m > m * 1.01
    assert big.sum() > 100
    np.testing.assert_array_equal(qf[big], np.sign(y[big]) * m)
    assert np.abs(qf).max() == m
    np.testing.assert_allclose(float(amax), np.abs(y).max(), rtol=2e-5)


@pytest.mark.parametrize("quant", ["row", "group"])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_zero_rows_and_scale_ub(kind, quant, platform):
    x = np.array(random(4, (6, 256), jnp.float32, scale=2.0))
    x[1] = 0.0
    x[4] = 1e-30  # tiny but not zero
    gamma, _ = _params(kind, 256, jnp.float32, 4)
    beta = None
    kw = dict(group_size=16) if quant == "group" else {}
    y = _ref_y(kind, x, gamma, beta)
    # Without a bound: zero rows get the floor scale and quantize to zeros.
    x_, g_ = put(platform, jnp.asarray(x), gamma)
    q, s = _fp8_fn(kind, quant, **kw)(x_, g_, None)
    s, qf = f64(s), f64(q)
    assert np.isfinite(s).all() and np.isfinite(qf).all()
    assert (s[1] == np.float32(MIN_SCALE)).all() and (qf[1] == 0).all()
    # With a bound below some rows' natural scale: those scales are the bound and saturate.
    natural = np.abs(y).max(-1) / 448
    ub = float(np.median(natural[[0, 2, 3, 5]]))
    q, s = _fp8_fn(kind, quant, scale_ub=ub, **kw)(x_, g_, None)
    s, qf = f64(s), f64(q)
    if quant == "row":
        np.testing.assert_allclose(s, ref_scales(np.abs(y).max(-1), E4M3, np.float32(ub)), rtol=2e-5)
        assert (s <= np.float32(ub)).all() and (s == np.float32(ub)).sum() >= 2
        want, err = np.clip(y / s[:, None], -448, 448), y_error(y) / s[:, None]
    else:
        yg = y.reshape(6, -1, 16)
        np.testing.assert_allclose(s, ref_scales(np.abs(yg).max(-1), E4M3, np.float32(ub)), rtol=2e-5)
        assert (s <= np.float32(ub)).all() and (s == np.float32(ub)).sum() >= 2
        want = np.clip(yg / s[..., None], -448, 448).reshape(6, 256)
        err = (y_error(y) / s[..., None] + 0 * yg).reshape(6, 256)
    assert (np.abs(qf) == 448).any()
    assert_fp8_close(q, want, E4M3, f"{kind} {quant} scale_ub", err)


@pytest.mark.parametrize("quant", ["tensor", "row", "group", "current"])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_nan_is_never_hidden(kind, quant, platform):
    x = np.array(random(5, (4, 64), jnp.float32))
    x[2, 3] = np.nan
    gamma, beta = _params(kind, 64, jnp.float32, 5)
    kw = dict(scale=np.float32(1.0)) if quant == "tensor" else ({"group_size": 16} if quant == "group" else {})
    x_, g_, b_ = put(platform, jnp.asarray(x), gamma, beta)
    q, s = _fp8_fn(kind, quant)(x_, g_, b_, **kw)
    qf, s = f64(q), f64(s)
    if quant == "current":  # the tensor's scale is NaN: so is all of q
        assert np.isnan(s) and np.isnan(qf).all()
        return
    assert np.isnan(qf[2]).all() and np.isfinite(np.delete(qf, 2, 0)).all()
    if quant == "tensor":
        assert np.isnan(s)
    else:
        assert np.isnan(s[2]).all() and np.isfinite(np.delete(s, 2, 0)).all()


# The FP8 outputs on a slice of a split hidden dim, as each device runs them
# (the statistics kernel, then the apply_fp8 kernel with the statistics; per
# row a measuring pass first), here on one device with no mesh axes: against
# float64, on the kernels' paths (one CTA, clusters, unaligned streaming).
SLICE_CASES = [("tensor", 0, (5, 7)), ("tensor", 0, (16, 4096)), ("tensor", 0, (3, 40001)),
               ("tensor", 0, (2, 65536)), ("row", 0, (2, 3, 1000)), ("row", 0, (3, 40001)),
               ("row", 0, (2, 65536)), ("group", 16, (5, 1008)), ("group", 128, (4, 4096)),
               ("group", 181, (3, 40001)), ("group", 128, (2, 65536))]


@pytest.mark.parametrize("quant, group, shape", SLICE_CASES, ids=lambda v: sid(v) if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_hidden_slice_path(kind, dtype, quant, group, shape, platform):
    from jax_rmsnorm import _primitives as prim

    key = case_key(("slice", kind, quant, shape))
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    gamma, beta = _params(kind, shape[-1], dtype, key)
    fmt = E4M3 if quant != "row" else E5M2
    fused = prim.FusedSpec(quant=quant, out_dtype=np.dtype(fmt), group_size=group)
    scale = np.float32(37.5)

    def run(x, g, b):
        y, _, _, _, qs, _, _ = prim.norm_fwd_fused(
            x, g, b, None, jnp.asarray(scale), None, kind=kind, eps=EPS[kind], zero_centered_gamma=False,
            has_gamma=True, has_beta=kind == "layer", fused=fused, on_hidden_slice="cuda" if platform == "gpu" else "cpu")
        return y, qs

    x_, g_, b_ = put(platform, x, gamma, beta)
    poison(platform, 8 * x.size + 1024)
    hlo = jax.jit(run).lower(x_, g_, b_).as_text()
    assert f"jrn_{kind}_norm_stats" in hlo and f"jrn_{kind}_norm_apply_fp8" in hlo
    outs = jax.jit(run)(x_, g_, b_)
    _check_fp8_outputs(kind, quant, x, gamma, beta, outs, fmt, f"{kind} {dname(dtype)} {shape} slice {quant}",
                       scale=scale, group=group)


# ---------------------------------------------------------------------------
# straight-through gradients


@pytest.mark.parametrize("quant", ["tensor", "row", "group", "current"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_grad_straight_through(kind, dtype, quant, platform):
    shape = (6, 1024)
    key = case_key((kind, quant))
    x = random(key, shape, dtype, offset=0.2)
    r = random(key + 1, shape, dtype)
    gamma, beta = _params(kind, 1024, dtype, key)
    # Cotangent weights exactly representable in FP8 (JAX hands the FP8 output
    # an FP8 cotangent) and in x's dtype.
    w = random(key + 6, shape, jnp.float32).astype(E4M3).astype(jnp.float32)
    wh = random(key + 7, shape, jnp.float32)
    kw = dict(scale=np.float32(8.0)) if quant == "tensor" else ({"group_size": 128} if quant == "group" else {})
    fn = _fp8_fn(kind, quant, **kw)

    def loss(x, r, g, b):
        q, s, h = fn(x, g, b, residual=r)
        return jnp.sum(q.astype(jnp.float32) * w) + jnp.sum(h.astype(jnp.float32) * wh) + jnp.sum(s)

    def ref_loss(x, r, g, b):
        h = (x + r).astype(dtype).astype(jnp.float32)
        y = _jnp_norm(kind, h, g, b)
        return jnp.sum(y * w) + jnp.sum(h * wh)

    argnums = (0, 1, 2) if kind == "rms" else (0, 1, 2, 3)
    args = put(platform, x, r, gamma, beta)
    got = jax.jit(jax.grad(loss, argnums))(*args)
    want = jax.grad(ref_loss, argnums)(*[None if a is None else jnp.asarray(a, jnp.float32) for a in args])
    for n, (gv, wv, a) in enumerate(zip(got, want, args)):
        assert gv.dtype == a.dtype
        wv = f64(wv)
        assert_close(gv, wv, dtype, f"{kind} {quant} {dname(dtype)} grad {n}",
                     scale=max(1.0, np.abs(wv).max(), np.sqrt(6) if n >= 2 else 1.0))

    # Without a residual: the plain norm's gradient with q's cotangent (up to
    # rounding: on a GPU the FP8 kernel's row statistics are summed in another
    # order than the plain kernel's).
    g1 = jax.grad(lambda x, g: jnp.sum(fn(x, g, args[3])[0].astype(jnp.float32) * w), (0, 1))(args[0], args[2])
    plain = (lambda x, g: jrn.rms_norm(x, g)) if kind == "rms" else (lambda x, g: jrn.layer_norm(x, g, args[3]))
    g2 = jax.grad(lambda x, g: jnp.sum(plain(x, g).astype(jnp.float32) * w), (0, 1))(args[0], args[2])
    for n, (a, b) in enumerate(zip(g1, g2)):
        assert_close(a, f64(b), dtype, f"{kind} {quant} {dname(dtype)} grad {n} without residual",
                     scale=max(1.0, np.abs(f64(b)).max()))


# ---------------------------------------------------------------------------
# vmap, jit, empty inputs


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_fused(kind, platform):
    B, R, H = 3, 4, 256
    xs = random(20, (B, R, H), jnp.float32)
    rs = random(21, (B, R, H), jnp.float32)
    gs = random(22, (B, H), jnp.float32, offset=1.0)
    scales = jnp.array([1.0, 30.0, 400.0], jnp.float32)
    xs, rs, gs, scales = put(platform, xs, rs, gs, scales)
    add = (lambda x, r, g: jrn.add_rms_norm(x, r, g)) if kind == "rms" else (lambda x, r, g: jrn.add_layer_norm(x, r, g))
    t = (lambda x, g, s, r: jrn.rms_norm_fp8(x, g, scale=s, residual=r)) if kind == "rms" else \
        (lambda x, g, s, r: jrn.layer_norm_fp8(x, g, scale=s, residual=r))
    row = (lambda x, g: jrn.rms_norm_fp8_rowwise(x, g)) if kind == "rms" else (lambda x, g: jrn.layer_norm_fp8_rowwise(x, g))
    grp = (lambda x, g: jrn.rms_norm_fp8_groupwise(x, g, group_size=16)) if kind == "rms" else \
        (lambda x, g: jrn.layer_norm_fp8_groupwise(x, g, group_size=16))
    cur = (lambda x, g, r: jrn.rms_norm_fp8_current(x, g, residual=r)) if kind == "rms" else \
        (lambda x, g, r: jrn.layer_norm_fp8_current(x, g, residual=r))
    cur_t = (lambda x, g: jrn.rms_norm_fp8_current(x, g, transpose=True)) if kind == "rms" else \
        (lambda x, g: jrn.layer_norm_fp8_current(x, g, transpose=True))
    cases = [
        (add, (xs, rs, gs), (0, 0, 0)), (add, (xs, rs[0], gs[0]), (0, None, None)),
        (add, (xs[0], rs, gs[0]), (None, 0, None)),
        (t, (xs, gs, scales, rs), (0, 0, 0, 0)), (t, (xs, gs[0], scales[1], rs), (0, None, None, 0)),
        (t, (jnp.swapaxes(xs, 0, 1), gs[0], scales, rs[0]), (1, None, 0, None)),
        (row, (xs, gs), (0, 0)), (row, (jnp.moveaxis(xs, 0, 2), gs[0]), (2, None)),
        (grp, (xs, gs), (0, 0)), (grp, (xs, gs[0]), (0, None)),
        (cur, (xs, gs, rs), (0, 0, 0)), (cur, (jnp.swapaxes(xs, 0, 1), gs[0], rs[0]), (1, None, None)),
        (cur_t, (xs, gs), (0, 0)), (cur_t, (jnp.moveaxis(xs, 0, 2), gs[0]), (2, None)),
    ]
    for f, args, in_axes in cases:
        got = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)
        for i in range(B):
            want = f(*[a if ax is None else jnp.take(a, i, axis=ax) for a, ax in zip(args, in_axes)])
            for n, (g_, w_) in enumerate(zip(got, want)):
                if f is add and n == 0:
                    # y: on a GPU one example alone takes the decode-time kernel
                    # (fwd_decode), the batch with a gamma per example another;
                    # their row sums differ in order and rounding. h is exact.
                    np.testing.assert_allclose(f64(g_[i]), f64(w_), rtol=1e-5, atol=1e-6, err_msg=f"{in_axes}")
                else:
                    np.testing.assert_array_equal(f64(g_[i]), f64(w_), err_msg=f"{in_axes}")


def test_vmap_of_grad_fused(platform):
    xs = random(30, (3, 4, 64), jnp.float32)
    rs = random(31, (3, 4, 64), jnp.float32)
    g = random(32, (64,), jnp.float32, offset=1.0)
    xs, rs, g = put(platform, xs, rs, g)

    def loss(x, r, g):
        y, h = jrn.add_rms_norm(x, r, g)
        q, a, h2 = jrn.rms_norm_fp8(h, g, scale=4.0, residual=x)
        return jnp.sum(y * jnp.arange(64.0)) + jnp.sum(h ** 2) + jnp.sum(q.astype(jnp.float32)) + jnp.sum(h2)

    grad = jax.grad(loss, (0, 1, 2))
    got = jax.jit(jax.vmap(grad, in_axes=(0, 0, None)))(xs, rs, g)
    for i in range(3):
        want = grad(xs[i], rs[i], g)
        for a, b in zip(got, want):
            np.testing.assert_allclose(f64(a[i]), f64(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_empty_inputs(kind, platform):
    (x,) = put(platform, jnp.zeros((0, 3, 32), jnp.bfloat16))
    g = jnp.ones((32,), jnp.float32)
    if kind == "rms":
        y, h = jrn.add_rms_norm(x, x, g)
        q, amax = jrn.rms_norm_fp8(x, g, scale=1.0)
        q2, rs = jrn.rms_norm_fp8_rowwise(x, g)
        q3, gs = jrn.rms_norm_fp8_groupwise(x, g, group_size=16)
        dx, dr, dg = jax.grad(lambda x, r, g: jnp.sum(jrn.add_rms_norm(x, r, g)[0].astype(jnp.float32)), (0, 1, 2))(x, x, g)
    else:
        y, h = jrn.add_layer_norm(x, x, g)
        q, amax = jrn.layer_norm_fp8(x, g, scale=1.0)
        q2, rs = jrn.layer_norm_fp8_rowwise(x, g)
        q3, gs = jrn.layer_norm_fp8_groupwise(x, g, group_size=16)
        dx, dr, dg = jax.grad(lambda x, r, g: jnp.sum(jrn.add_layer_norm(x, r, g)[0].astype(jnp.float32)), (0, 1, 2))(x, x, g)
    assert y.shape == h.shape == q.shape == x.shape and q.dtype == E4M3
    assert float(amax) == 0.0 and rs.shape == (0, 3) and gs.shape == (0, 3, 2)
    assert dx.shape == x.shape and not np.asarray(dg).any()


def test_fused_export_roundtrip(platform):
    from jax import export

    def f(x, r, g):
        y, h = jrn.add_layer_norm(x, r, g)
        q, s = jrn.rms_norm_fp8_rowwise(h, g)
        return jnp.sum(y) + jnp.sum(q.astype(jnp.float32) * s[:, None])

    fn = jax.jit(jax.value_and_grad(f, (0, 1, 2)))
    x, r, g = put(platform, random(1, (4, 32), jnp.float32), random(2, (4, 32), jnp.float32),
                  random(3, (32,), jnp.float32, offset=1.0))
    target = {"cpu": "cpu", "gpu": "cuda"}[platform]
    exp = export.export(fn, platforms=[target], disabled_checks=jrn.export_checks())(x, r, g)
    got, want = export.deserialize(exp.serialize()).call(x, r, g), fn(x, r, g)
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(w))


# ---------------------------------------------------------------------------
# bad input

_x = jnp.ones((4, 32), jnp.bfloat16)
_g = jnp.ones((32,), jnp.float32)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: jrn.add_rms_norm(_x, jnp.ones((4, 31), jnp.bfloat16)), ValueError, "residual must have x's shape"),
    (lambda: jrn.add_rms_norm(_x, jnp.ones((4, 32), jnp.float16)), TypeError, "residual must have x's dtype"),
    (lambda: jrn.add_layer_norm(_x, _x, _g, h_dtype=jnp.float16), TypeError, "h_dtype must be"),
    (lambda: jrn.add_rms_norm(jnp.ones((4, 32), jnp.int32), _x), TypeError, "x must be float32"),
    (lambda: jrn.add_rms_norm(_x, _x, jnp.ones((31,))), ValueError, "gamma must have shape"),
    (lambda: jrn.rms_norm_fp8(_x, _g, scale=1.0, h_dtype=jnp.float32), ValueError, "h_dtype is only meaningful"),
    (lambda: jrn.rms_norm_fp8(_x, _g, scale=1.0, out_dtype=jnp.bfloat16), TypeError, "out_dtype must be float8"),
    (lambda: jrn.rms_norm_fp8(_x, _g, scale=1.0, out_dtype=jnp.float8_e4m3fnuz), TypeError, "out_dtype"),
    (lambda: jrn.rms_norm_fp8(_x, _g, scale=None), TypeError, "scale is required"),
    (lambda: jrn.layer_norm_fp8(_x, _g, scale=jnp.ones((2,))), ValueError, "scale must be a scalar"),
    (lambda: jrn.rms_norm_fp8(_x, _g, scale=jnp.ones((), jnp.bfloat16)), TypeError, "scale must be float32"),
    (lambda: jrn.rms_norm_fp8_rowwise(_x, _g, scale_ub=0.0), ValueError, "scale_ub must be > 0"),
    (lambda: jrn.rms_norm_fp8_current(_x, _g, out_dtype=jnp.int8), TypeError, "out_dtype must be float8"),
    (lambda: jrn.rms_norm_fp8_current(_x, _g, transpose=1), TypeError, "transpose must be a bool"),
    (lambda: jrn.layer_norm_fp8_current(_x, _g, residual=_x.astype(jnp.float16)), TypeError, "residual must"),
    (lambda: jrn.rms_norm_fp8_rowwise(_x, _g, scale_ub="1"), TypeError, "scale_ub must be a Python number"),
    (lambda: jrn.layer_norm_fp8_rowwise(_x, _g, out_dtype=jnp.float32), TypeError, "out_dtype"),
    (lambda: jrn.rms_norm_fp8_groupwise(_x, _g, group_size=24), ValueError, "group_size must divide the hidden size 32"),
    (lambda: jrn.rms_norm_fp8_groupwise(_x, _g, group_size=0), ValueError, "group_size"),
    (lambda: jrn.layer_norm_fp8_groupwise(_x, _g, group_size=16.0), TypeError, "group_size must be an int"),
    (lambda: jrn.rms_norm_fp8_groupwise(_x, _g, residual=_x[:, :16]), ValueError, "residual must have x's shape"),
])
def test_fused_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_fp8_transpose_grad_is_straight_through(platform):
    # 16 rows: with q_t or without, the same kernels make rstd (saved for the backward)
    x = random(40, (16, 96), jnp.bfloat16)
    g = random(41, (96,), jnp.float32, offset=1.0)
    w = random(42, (16, 96), jnp.float32).astype(E4M3).astype(jnp.float32)
    x, g = put(platform, x, g)
    via_t = jax.grad(lambda x, g: jnp.sum(jrn.rms_norm_fp8_current(x, g, transpose=True)[2].astype(jnp.float32) * w.T),
                     (0, 1))(x, g)
    via_q = jax.grad(lambda x, g: jnp.sum(jrn.rms_norm_fp8_current(x, g)[0].astype(jnp.float32) * w), (0, 1))(x, g)
    for a, b in zip(via_t, via_q):
        np.testing.assert_array_equal(f64(a), f64(b))


# The transposed copy of current scaling. On the GPU, hidden a multiple of 16
# and rows (of each tensor) of 4 without a residual take quantize_tiles, which
# writes q and q_t together in 128 x 128-byte tiles (whole ones, partial ones
# on either side); with a residual the tiled transpose of q, and other shapes
# the byte-wise one. Rows that are a multiple of 16, 8 or only 4 write q_t's
# rows in 16-, 8- or 4-byte stores: 24 x 2064 and 1096 x 144 take 8 bytes,
# 4 x 48, 3 x 4 x 400 and 1092 x 256 take 4, and each ends within a block of
# 16 rows. The byte-wise transpose's 64 x 64 tiles end part-way in both
# directions at 260 x 130, 33 x 4097 and 203 x 136 (203 rows: no multiple of 4).
# Under vmap each tensor has its own scale and q_t.
@pytest.mark.parametrize("shape", [(16, 16), (128, 128), (272, 48), (3, 48, 400), (1040, 4096), (256, 16),
                                   (16, 2064), (7, 5), (1, 16), (16, 1), (260, 130), (33, 4097),
                                   (24, 2064), (1096, 144), (4, 48), (3, 4, 400), (1092, 256), (203, 136)],
                         ids=sid)
@pytest.mark.parametrize("residual", [False, True], ids=["x", "residual"])
@pytest.mark.parametrize("kind", KINDS)
def test_fp8_current_transpose(kind, residual, shape, platform):
    gpu_routing_case(platform, shape, [(16, 16), (7, 5), (16, 1), (3, 48, 400), (1040, 4096), (203, 136)])
    key = case_key(("t", kind, residual, shape))
    dtype = jnp.bfloat16
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    r = random(key + 1, shape, dtype) if residual else None
    gamma, beta = _params(kind, shape[-1], dtype, key)
    x_, r_, g_, b_ = put(platform, x, r, gamma, beta)
    f = _fp8_fn(kind, "current", transpose=True)
    poison(platform, 16 * x.size + 1024)
    outs = jax.jit(lambda x, r, g, b: f(x, g, b, residual=r))(x_, r_, g_, b_)
    q, si, qt = outs[0], outs[1], outs[-1]
    rows = math.prod(shape[:-1])
    what = f"{kind} {shape} {'residual' if residual else ''}"
    assert qt.shape == (shape[-1], rows) and qt.dtype == q.dtype, what
    np.testing.assert_array_equal(np.asarray(qt).view(np.uint8), np.asarray(q).reshape(rows, -1).T.view(np.uint8),
                                  err_msg=what)
    y = _ref_y(kind, f64(outs[2]) if residual else x, gamma, beta)  # h (bf16) is what is normalized
    m = FP8_MAX[np.dtype(E4M3)]
    assert_fp8_close(q, np.clip(y / float(si), -m, m), E4M3, what, y_error(y) / float(si))
    # two tensors under vmap: each its own scale_inv and q_t
    (x2,) = put(platform, random(key + 2, shape, dtype, scale=0.5))
    qs, sis, qts = jax.jit(jax.vmap(lambda x: f(x, g_, b_)))(jnp.stack([x_, x2]))
    assert qts.shape == (2, shape[-1], rows), what
    for i, xi in enumerate((x_, x2)):
        np.testing.assert_array_equal(np.asarray(qts[i]).view(np.uint8),
                                      np.asarray(qs[i]).reshape(rows, -1).T.view(np.uint8), err_msg=what)
        np.testing.assert_allclose(float(sis[i]), float(f(xi, g_, b_)[1]), rtol=1e-6, err_msg=what)
