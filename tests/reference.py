"""Float64 NumPy references, tolerances and device helpers for the tests."""

import subprocess
import sys
import zlib

import numpy as np
import jax
import jax.numpy as jnp


def _platforms():
    out = ["cpu"]
    try:
        if jax.devices("gpu"):
            out.append("gpu")
    except RuntimeError:
        pass
    return out


PLATFORMS = _platforms()

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]

# (rtol, atol) for results stored in each dtype, relative to the float64 reference.
TOL = {
    np.dtype(jnp.float32): (2e-5, 2e-5),
    np.dtype(jnp.bfloat16): (2e-2, 2e-2),
    np.dtype(jnp.float16): (3e-3, 3e-3),
}


def device(platform):
    return jax.devices(platform)[0]


def gpu_routing_case(platform, value, cpu_keeps):
    """Skips, on the CPU, a parameter that exists to steer the GPU's kernels
    (a store width, a tile's edge, a kernel family's range of widths): the
    CPU takes one code path for all of them, which ``cpu_keeps`` covers."""
    if platform == "cpu" and value not in cpu_keeps:
        import pytest
        pytest.skip("a GPU routing case; the CPU's path runs in the kept ones")


def put(platform, *arrays):
    dev = device(platform)
    return [None if a is None else jax.device_put(a, dev) for a in arrays]


def case_key(case):
    """A seed for one test case, the same in every run (Python's hash() of
    strings changes from process to process), so a failure reproduces."""
    return zlib.crc32(repr(case).encode()) % 1000


def random(key, shape, dtype, scale=1.0, offset=0.0):
    return (jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale + offset).astype(dtype)


def f64(a):
    """``a`` as a float64 NumPy array (JAX arrays by way of float32; a float64
    NumPy array as it is, for finite differences)."""
    if isinstance(a, np.ndarray) and a.dtype == np.float64:
        return a
    return None if a is None else np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def _as(xp, a):
    """``a`` for the math in ``xp``: float64 NumPy, or a jnp array as it is."""
    return f64(a) if xp is np else a


def ref_forward(kind, x, gamma=None, beta=None, eps=1e-6, zero_centered=False, xp=np):
    """(y, mean, rstd) in float64; with ``xp=jnp``, in jnp in the arrays' own
    dtypes (differentiable, for the forward-mode tests)."""
    x = _as(xp, x)
    mean = x.mean(-1, keepdims=True) if kind == "layer" else xp.zeros(x.shape[:-1] + (1,), x.dtype)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + eps)
    xhat = (x - mean) * rstd
    scale = 1.0 if gamma is None else _as(xp, gamma) + (1.0 if zero_centered else 0.0)
    y = xhat * scale + (0.0 if beta is None else _as(xp, beta))
    return y, mean[..., 0], rstd[..., 0]


def ref_backward(kind, dy, x, gamma=None, eps=1e-6, zero_centered=False, xp=np, mean=None, rstd=None):
    """(dx, dgamma, dbeta) in float64 (jnp with ``xp=jnp``, as ref_forward),
    statistics recomputed, or the given ``mean`` (LayerNorm) and ``rstd``."""
    dy, xf = _as(xp, dy), _as(xp, x)
    if rstd is None:
        _, mean, rstd = ref_forward(kind, x, None, None, eps, xp=xp)
    mean = 0.0 if mean is None else _as(xp, mean)[..., None]
    rstd = _as(xp, rstd)[..., None]
    xhat = (xf - mean) * rstd
    scale = 1.0 if gamma is None else _as(xp, gamma) + (1.0 if zero_centered else 0.0)
    g = dy * scale
    c1 = (g * xhat).mean(-1, keepdims=True)
    c2 = g.mean(-1, keepdims=True) if kind == "layer" else 0.0
    dx = rstd * (g - c2 - xhat * c1)
    axes = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(axes), dy.sum(axes)


def assert_close(out, ref, dtype, what, scale=None):
    """Elementwise |out - ref| <= atol * scale + rtol * |ref|; NaN never passes.

    `scale` widens atol for sums (dgamma/dbeta) whose size grows with the rows.
    """
    out = f64(out)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert np.isfinite(out).all(), f"{what}: non-finite values in output"
    rtol, atol = TOL[np.dtype(dtype)]
    if scale is None:
        scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    err = np.abs(out - ref)
    bound = atol * scale + rtol * np.abs(ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert (err <= bound).all(), (
        f"{what}: max error {err.max():.3g} at {worst}: got {out[worst]}, expected {ref[worst]}")


def poison(platform, nbytes):
    """Fills and frees device memory with NaN so that an unwritten output of the
    next computation is likely to read back as NaN instead of stale good data."""
    n = max(1, nbytes // 4)
    a = jax.device_put(jnp.full((n,), jnp.nan, jnp.float32), device(platform))
    a.block_until_ready()
    a.delete()


# ---------------------------------------------------------------------------
# fused variants: residual add and FP8 output

FP8_MAX = {np.dtype(jnp.float8_e4m3fn): 448.0, np.dtype(jnp.float8_e5m2): 57344.0}
# Relative rounding of each FP8 format (a full step: 3 / 2 mantissa bits) and
# its smallest subnormal (the absolute term near zero).
FP8_RTOL = {np.dtype(jnp.float8_e4m3fn): 2.0 ** -3, np.dtype(jnp.float8_e5m2): 2.0 ** -2}
FP8_ATOL = {np.dtype(jnp.float8_e4m3fn): 2.0 ** -9, np.dtype(jnp.float8_e5m2): 2.0 ** -16}
MIN_SCALE = 1e-12


def _sms():
    return getattr(jax.devices()[0], "core_count", 132) if jax.default_backend() == "gpu" else 132


def decode_bounds():
    """(rows, packs of 16 bytes) on both sides of the GPU forward's decode-time
    bounds (fwd_decode), read from the plan's limits: 2 x SMs rows; rows of
    kDecodeItems x kMaxRowThreads packs; the configuration of four packs a
    thread (more than SMs rows of more than kDecodeItems x kDecodeWideThreads
    packs); LayerNorm's plain rows split into parts at up to a quarter of the
    SMs (four parts of 37 packs: 9, 9, 9 and 10), RMSNorm's from CTAs of
    kDecodeSplitMinThreads threads; RMSNorm's rows with the residual add of
    at most kMaxRowThreads packs, one a thread; and 1001 elements, which are
    not whole packs and so not the kernel's."""
    from jax_rmsnorm._ffi import plan_limits
    lim, sms = plan_limits(), _sms()
    most = lim["fwd_decode_items"] * lim["fwd_max_row_threads"]
    wide = lim["fwd_decode_items"] * lim["fwd_decode_wide_threads"]
    split = lim["fwd_decode_items"] * lim["fwd_decode_split_min_threads"] // 2
    one = lim["fwd_max_row_threads"]
    return [(2 * sms, most), (2 * sms + 1, most), (2, most + 8), (3, 1001), (sms + 1, wide + 1),
            (1, 37), (sms // 4, 37), (sms // 4, most), (4, split), (4, split + 1), (4, one), (4, one + 1)]


def bwd_decode_bounds():
    """(rows, packs of 16 bytes) on both sides of the GPU backward's
    decode-time bounds (bwd_decode), read from the plan's limits: kDecodeMaxRows
    rows, kDecodeNarrowMaxRows of at most kDecodeNarrowPacks packs; rows of
    kDecodeMaxPacks packs; one pack a thread up to kDecodeOneItemPacks, two
    above; one row (dgamma/dbeta written by the dx kernel itself) and a row of
    one pack (one warp, 31 threads idle). At more than one row further CTAs of
    the launch sum dgamma/dbeta by columns, in CTAs of as many threads as the
    rows' (a warp at two rows of one pack; 37 rows over 16 rows of threads,
    100 packs over tiles of 8). Rows of more than kDecodeMaxThreads packs:
    CTAs of kDecodeMaxThreads threads with tiles of 16 rows of threads while
    rows and tiles fit one wave, then four packs a thread in CTAs of half as
    many with tiles of 32 rows of threads while they fit two, of 16 above
    (120 x 1025: a thread's third pack only in the first thread, its fourth in
    none). Up to kDecodePartsMaxRows rows of at least kDecodePartsPacks packs:
    each row split across a cluster of kDecodeParts CTAs (1025: the fifth CTA
    takes one pack, the last three none)."""
    from jax_rmsnorm._ffi import plan_limits
    lim, sms = plan_limits(), _sms()
    rows, narrow_rows, narrow = lim["bwd_decode_max_rows"], lim["bwd_decode_narrow_max_rows"], lim["bwd_decode_narrow_packs"]
    most, one, threads = lim["bwd_decode_max_packs"], lim["bwd_decode_one_item_packs"], lim["bwd_decode_max_threads"]
    part_rows, part_packs = lim["bwd_decode_parts_max_rows"], lim["bwd_decode_parts_packs"]
    # The last row counts of kDecodeMaxPacks packs whose rows and column tiles
    # fit one wave of CTAs of kDecodeMaxThreads (tiles of 16 rows of threads),
    # then two waves of CTAs of half as many (tiles of 32).
    wave1 = sms - -(-most // (threads // 16))
    wave2 = 2 * sms - -(-most // (threads // 2 // 32))
    return [(1, 1), (1, one), (1, one + 1), (1, most), (1, most + 1), (2, 1), (37, 100), (narrow_rows, one),
            (narrow_rows + 1, narrow), (narrow_rows + 1, one), (narrow_rows, most), (wave1 - 4, most), (wave1, most),
            (wave1 + 1, most), (wave2, most), (wave2 + 1, most), (120, threads + 1), (rows, narrow + 1),
            (rows + 1, narrow + 1), (rows, most), (1, threads - 1), (1, threads), (2, threads + 1),
            (part_rows, most), (part_rows + 1, most), (part_rows, part_packs)]


def decode_hidden(packs, dtype):
    """The hidden size of `packs` 16-byte packs of dtype (1001: itself)."""
    return packs * (16 // np.dtype(dtype).itemsize) if packs != 1001 else packs


def ref_add(x, residual, h_dtype):
    """h = x + residual summed in float32 and rounded to h_dtype (what the kernels store)."""
    s = np.asarray(jnp.asarray(x, jnp.float32)) + np.asarray(jnp.asarray(residual, jnp.float32))
    return jnp.asarray(s, jnp.float32).astype(h_dtype)


def ref_scales(amax, fmt, ub=np.inf):
    """Per-row / per-group scales from max |y|: max(min(amax / fp8_max, ub), MIN_SCALE)."""
    return np.maximum(np.minimum(amax / FP8_MAX[np.dtype(fmt)], ub), MIN_SCALE)


def assert_fp8_close(q, want, fmt, what, y_err=0.0):
    """q (FP8) against the unrounded, saturated float64 value `want`: within
    one FP8 step (relative) plus the smallest subnormal, plus `y_err` (the
    absolute error `want` inherits from the kernel's float32 computation of y,
    in q's units; may be an array broadcasting against `want`). NaN never passes."""
    fmt = np.dtype(fmt)
    assert np.dtype(q.dtype) == fmt, f"{what}: dtype {q.dtype} != {fmt}"
    got = f64(q)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite values in output"
    err = np.abs(got - want)
    bound = FP8_RTOL[fmt] * (np.abs(want) + y_err) + FP8_ATOL[fmt] + y_err
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert (err <= bound).all(), (
        f"{what}: max error {err.max():.3g} at {worst}: got {got[worst]}, expected {want[worst]}")


def y_error(y):
    """Absolute error allowed for a kernel's float32 y against the float64 one."""
    return 1e-5 * max(1.0, float(np.abs(y).max(initial=0.0)))


def run_script(path, *args, env=None):
    """stdout of `python path args...` run from / (so the installed package is
    imported, not the source tree), failing the test on a non-zero exit."""
    out = subprocess.run([sys.executable, str(path), *args], cwd="/", env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


# ---------------------------------------------------------------------------
# block-scaled quantization (MXFP8, NVFP4) as jax.nn's scaled_dot_general
# defines it: the reference for the block-scaled outputs' codes and scales.


def e8m0_round_up(s):
    """float32 scales as E8M0 exponents (uint8), rounded up to a power of two:
    the exponent, plus one where mantissa bits are set (not for the largest
    finite exponent, nor for subnormals of at most half the smallest normal)."""
    bits = np.asarray(s, np.float32).view(np.uint32)
    exp, mant = bits >> 23, bits & 0x7FFFFF
    up = (mant > 0) & (exp != 0xFE) & ~((exp == 0) & (mant <= 0x400000))
    return (exp + up).astype(np.uint8)


def e8m0_value(e):
    """The float32 value of E8M0 exponents (uint8): 2 ** (e - 127), with 0
    read as 2 ** -127 (so that an all-zero block divides by a nonzero scale)."""
    v = (np.asarray(e, np.uint32) << 23).view(np.float32)
    return np.where(v == 0, np.float32(2.0 ** -127), v).astype(np.float32)


def quantize_blocks(y, mode, code_dtype, block, global_scale=None):
    """Codes and scales of float32 ``y`` quantized in blocks of ``block``
    along its last axis: ``mode`` "mxfp8" (E8M0 scales, uint8 exponents
    here) or "nvfp4" (E4M3 scales of the values divided by the float32
    ``global_scale``), as jax.nn's quantizer makes them from finite blocks.
    Where that quantizer divides by zero or loses a NaN, the library's
    definitions (csrc/norm_fused.h): a block holding NaN or an infinity (of
    ``y``, or of ``y / global_scale``) gets a NaN scale (E8M0 0xff, E4M3 NaN)
    and NaN codes (E2M1, which has no NaN: +0); an NVFP4 block whose scale
    rounds to 0 gets codes +0."""
    import ml_dtypes
    y = np.asarray(y, np.float32)
    blocks = y.reshape(y.shape[:-1] + (y.shape[-1] // block, block))
    top = np.float32(float(ml_dtypes.finfo(code_dtype).max))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # the blocks redefined below
        if mode == "mxfp8":
            scales = e8m0_round_up(np.max(np.abs(blocks), -1, keepdims=True) / top)
            scaled = blocks / e8m0_value(scales)
        elif mode == "nvfp4":
            blocks = blocks / np.float32(global_scale)
            e4m3_max = np.float32(float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max))
            scales = np.clip(np.max(np.abs(blocks), -1, keepdims=True) / top, 0, e4m3_max).astype(
                ml_dtypes.float8_e4m3fn)
            scaled = blocks / scales.astype(np.float32)
        else:
            raise ValueError(f"mode must be 'mxfp8' or 'nvfp4', got {mode!r}")
        codes = np.clip(scaled, -top, top).astype(code_dtype)
    bad = ~np.isfinite(blocks).all(-1, keepdims=True)
    if mode == "mxfp8":
        scales = np.where(bad, np.uint8(0xFF), scales)
        codes = np.where(bad, np.array(np.nan, code_dtype), codes)
    else:
        scales = np.where(bad, np.array(np.nan, ml_dtypes.float8_e4m3fn), scales)
        codes = np.where(bad | (scales.astype(np.float32) == 0), np.zeros((), code_dtype), codes)
    return codes.reshape(y.shape), scales[..., 0]


def pow2_group_scales(y, fmt, group, ub=np.inf):
    """Per-group FP8 scales of float32 ``y`` rounded up to powers of two
    (power_of_two_scales): ref_scales of each group's max |y| in float32, its
    exponent plus one where mantissa bits are set; NaN stays NaN."""
    y = np.asarray(y, np.float32)
    amax = np.max(np.abs(y.reshape(y.shape[:-1] + (-1, group))), -1)
    s = np.maximum(np.minimum(amax / np.float32(FP8_MAX[np.dtype(fmt)]), np.float32(ub)),
                   np.float32(MIN_SCALE)).astype(np.float32)
    bits = s.view(np.uint32)
    up = ((bits & 0x7FFFFF) != 0) & ((bits & 0x7F800000) != 0x7F800000)
    return np.where(up, (bits & 0xFF800000) + 0x800000, bits).astype(np.uint32).view(np.float32)
