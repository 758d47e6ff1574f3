"""Numerics at the edges of float32: RMSNorm of rows whose sum of squares
overflows float32 (RMS up to the float32 maximum), and float32 LayerNorm of
rows far from zero, against float64 references, through every forward kernel
family on the GPU (the shapes below take each one; see describe_plan)."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from jax_rmsnorm._ffi import describe_plan
from reference import assert_close, case_key, f64, put, random, ref_add, ref_backward, ref_forward

ULP = 2.0 ** -23  # float32's relative spacing at 1

# (rows, hidden): each takes a different forward kernel family on an H100
# (decode, regs, regs in clusters or slices, stream, unaligned); the CPU runs
# the small ones.
SHAPES = [(4, 1024), (64, 4096), (2048, 4096), (300, 16384), (64, 65536), (16, 262144), (16, 4093)]
CPU_SHAPES = {(4, 1024), (64, 4096), (16, 4093)}
# With a residual: also the wide rows of many rows (statistics, then y).
RESIDUAL_SHAPES = [(4, 1024), (2048, 4096), (300, 65536), (16, 262144)]


def _shapes(shapes):
    return [pytest.param(s, id="x".join(map(str, s))) for s in shapes]


def _skip_large_on_cpu(platform, shape):
    if platform == "cpu" and tuple(shape) not in CPU_SHAPES:
        pytest.skip("one CPU kernel for every shape: the small shapes cover it")


def _assert_ulps(out, ref, size, ulps, what):
    """|out - ref| <= ulps float32 ulps of `size` (elementwise); NaN never passes."""
    out = f64(out)
    assert np.isfinite(out).all(), f"{what}: non-finite values"
    if out.size == 0:
        return
    err = np.abs(out - ref)
    bound = ulps * ULP * size
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), (
        f"{what}: error {err[worst]:.3g} at {worst} is {err[worst] / (ULP * size[worst]):.1f} ulps "
        f"(got {out[worst]}, expected {ref[worst]})")


def _far_rows(key, shape, offset):
    """float32 rows of unit spread around `offset`, as float64 too."""
    x = random(key, shape, jnp.float32, offset=offset)
    return x, f64(x)


@pytest.mark.parametrize("offset", [1e6, -3e7])
@pytest.mark.parametrize("shape", _shapes(SHAPES))
def test_layer_norm_far_from_zero(platform, shape, offset):
    """y within a few float32 ulps of the normalized value for rows offset by
    up to 3e7 times their spread (the float32 mean alone is off by up to 1)."""
    _skip_large_on_cpu(platform, shape)
    key = case_key(("far", shape, offset))
    x, x64 = _far_rows(key, shape, offset)
    gamma = random(key + 1, shape[-1:], jnp.float32, scale=0.5, offset=1.0)
    beta = random(key + 2, shape[-1:], jnp.float32)
    y, mean, rstd = jrn.layer_norm_fwd(*put(platform, x, gamma, beta))
    ref, ref_mean, ref_rstd = ref_forward("layer", x64, gamma, beta, eps=1e-5)
    xhat = (x64 - ref_mean[:, None]) * ref_rstd[:, None]
    size = np.abs(xhat * f64(gamma)) + np.abs(f64(beta)) + 1.0
    _assert_ulps(y, ref, size, 16, f"y {describe_plan('fwd', 'layer', shape, 'float32')}")
    # The stored mean is the float32 nearest the row's (within an ulp).
    _assert_ulps(mean, ref_mean, np.abs(ref_mean), 1, "mean")
    _assert_ulps(rstd, ref_rstd, ref_rstd, 8, "rstd")


@pytest.mark.parametrize("shape", _shapes(RESIDUAL_SHAPES))
def test_add_layer_norm_far_from_zero(platform, shape):
    _skip_large_on_cpu(platform, shape)
    key = case_key(("far-add", shape))
    x, _ = _far_rows(key, shape, 1e6)
    residual = random(key + 1, shape, jnp.float32)
    gamma = random(key + 2, shape[-1:], jnp.float32, scale=0.5, offset=1.0)
    beta = random(key + 3, shape[-1:], jnp.float32)
    y, h = jrn.add_layer_norm(*put(platform, x, residual, gamma, beta))
    h64 = f64(ref_add(x, residual, jnp.float32))
    np.testing.assert_array_equal(f64(h), h64)
    ref, ref_mean, ref_rstd = ref_forward("layer", h64, gamma, beta, eps=1e-5)
    xhat = (h64 - ref_mean[:, None]) * ref_rstd[:, None]
    size = np.abs(xhat * f64(gamma)) + np.abs(f64(beta)) + 1.0
    plan = describe_plan("fwd", "layer", shape, "float32", residual=True)
    _assert_ulps(y, ref, size, 16, f"y {plan}")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rms", [1e20, 1e30, 6e37, 1.7e38])
@pytest.mark.parametrize("shape", _shapes(SHAPES))
def test_rms_norm_huge_rows(platform, shape, rms, dtype):
    """Rows whose squares overflow float32 (RMS above about 1.8e19 / sqrt(hidden))
    normalize as any other: y against float64 within the dtype's rounding; rstd
    to float32 while normal (for an RMS above 2^126 it is subnormal or zero)."""
    _skip_large_on_cpu(platform, shape)
    key = case_key(("huge", shape, rms, np.dtype(dtype).name))
    # Uniform in [-a, a] (RMS a / sqrt(3)): finite up to the float32 maximum.
    u = jax.random.uniform(jax.random.key(key), shape, jnp.float32, -1.0, 1.0)
    x = (u * np.float32(rms * np.sqrt(3.0))).astype(dtype)
    assert np.isfinite(f64(x)).all()
    gamma = random(key + 1, shape[-1:], dtype, scale=0.5, offset=1.0)
    y, rstd = jrn.rms_norm_fwd(*put(platform, x, gamma))
    ref, _, ref_rstd = ref_forward("rms", x, gamma)
    # One rounding to the output dtype, a few float32 roundings before it.
    ulps = 16 if dtype == jnp.float32 else 2.0 ** 15
    _assert_ulps(y, ref, np.abs(ref) + 1e-3, ulps, f"y {describe_plan('fwd', 'rms', shape, np.dtype(dtype).name)}")
    tiny = float(np.finfo(np.float32).tiny)
    normal = ref_rstd >= tiny
    _assert_ulps(np.asarray(rstd)[normal], ref_rstd[normal], ref_rstd[normal], 8, "rstd")
    # Below float32's normal range: on its subnormal grid (two steps), or zero
    # where the platform flushes subnormals.
    sub = f64(rstd)[~normal]
    assert ((np.abs(sub - ref_rstd[~normal]) <= 2 * 2.0 ** -149) | (sub == 0)).all(), "subnormal rstd"


@pytest.mark.parametrize("shape", _shapes([(4, 1024), (16, 4093)]))
def test_rms_norm_one_huge_element(platform, shape):
    """A row of zeros but for one element at the float32 maximum: y is 0 and
    +-sqrt(hidden) * gamma there."""
    _skip_large_on_cpu(platform, shape)
    rows, hidden = shape
    x = np.zeros(shape, np.float32)
    cols = np.arange(rows) * 7 % hidden
    x[np.arange(rows), cols] = np.float32(3.4e38) * np.where(np.arange(rows) % 2, -1, 1)
    y = jrn.rms_norm(*put(platform, jnp.asarray(x)))
    want = np.zeros(shape)
    want[np.arange(rows), cols] = np.sqrt(hidden) * np.where(np.arange(rows) % 2, -1, 1)
    _assert_ulps(y, want, np.abs(want) + 1.0, 16, "y")


# (rows, hidden): each takes a different backward kernel family for float32
# LayerNorm on an H100 (bwd_decode writing dgamma itself and into a slot a
# row, slices of one CTA and of clusters of 2 and 8, regs, stream, unaligned
# plain, wide and clustered).
GRAD_SHAPES = [(1, 4096), (4, 1024), (300, 256), (2048, 4096), (300, 16384), (64, 65536), (16, 262144),
               (16, 4093), (64, 6001), (64, 8191)]
GRAD_CPU_SHAPES = {(4, 1024), (16, 4093)}


@pytest.mark.parametrize("params", [True, False], ids=["params", "no-params"])
@pytest.mark.parametrize("shape", _shapes(GRAD_SHAPES))
def test_layer_norm_grad_far_from_zero(platform, shape, params):
    """The backward centres each row on its exact mean again (the stored
    float32 mean is off by up to half its ulp: 0.03 at 1e6, against a spread
    of 1), so the gradients of rows far from zero are as accurate as any."""
    if platform == "cpu" and tuple(shape) not in GRAD_CPU_SHAPES:
        pytest.skip("one CPU kernel for every shape: the small shapes cover it")
    key = case_key(("far-grad", shape))
    x, x64 = _far_rows(key, shape, 1e6)
    gamma = random(key + 1, shape[-1:], jnp.float32, scale=0.5, offset=1.0) if params else None
    beta = random(key + 2, shape[-1:], jnp.float32) if params else None
    dy = random(key + 3, shape, jnp.float32)
    x, gamma, beta, dy = put(platform, x, gamma, beta, dy)
    _, vjp = jax.vjp(jrn.layer_norm, *((x, gamma, beta) if params else (x,)))
    grads = vjp(dy)
    want = ref_backward("layer", dy, x64, gamma, eps=1e-5)
    for got, ref, what in zip(grads, want, ("dx", "dgamma", "dbeta")):
        assert_close(got, ref, jnp.float32, what, scale=max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", _shapes(SHAPES))
def test_signed_zero_gamma(platform, shape, dtype, kind):
    """A gamma of -0 gives y = x_hat * -0, a zero of the opposite sign to
    x_hat as in jnp (the kernels add zero_centered's 1 only where it is
    asked for: adding +0 would turn -0 into +0)."""
    _skip_large_on_cpu(platform, shape)
    rows, hidden = shape
    x = random(case_key((shape, "signed zero")), shape, dtype)
    gamma = jnp.ones((hidden,), dtype).at[::7].set(-0.0)
    fn = jrn.rms_norm if kind == "rms" else jrn.layer_norm
    y = np.asarray(jnp.asarray(fn(*put(platform, x, gamma)), jnp.float32))
    xs = f64(x)
    centred = xs if kind == "rms" else xs - xs.mean(axis=-1, keepdims=True)
    cols = np.arange(0, hidden, 7)
    clear = np.abs(centred[:, cols]) > 1e-3  # x_hat's sign certain in float32
    assert clear.mean() > 0.9
    zeros = y[:, cols]
    assert (zeros == 0).all(), "y is not zero where gamma is -0"
    assert (np.signbit(zeros) == (centred[:, cols] > 0))[clear].all(), "y's zero has the wrong sign"
    assert np.isfinite(y).all() and (y[:, 1] != 0).any()
