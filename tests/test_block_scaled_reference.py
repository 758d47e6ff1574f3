"""The NumPy reference of the block-scaled formats (tests/reference.py's
quantize_blocks) against jax.nn's own quantizer, bit for bit: the reference
the block-scaled outputs will be tested with."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp
import ml_dtypes

from reference import quantize_blocks

scaled_matmul = pytest.importorskip("jax._src.cudnn.scaled_matmul_stablehlo")


def _data(seed, shape):
    """Values over many binades, with an all-zero block and exact block maxima."""
    rng = np.random.default_rng(seed)
    y = rng.standard_normal(shape).astype(np.float32) * np.exp2(rng.integers(-20, 20, shape[:-1] + (1,)))
    y = y.astype(np.float32)
    y[0, :32] = 0.0
    y[1, :32] = 448.0 * np.exp2(np.arange(32) % 5 - 2)
    return y


def _jax(y, mode, code_dtype, block, global_scale=None):
    scale_type = jnp.float8_e8m0fnu if mode == "mxfp8" else jnp.float8_e4m3fn
    config = scaled_matmul.BlockScaleConfig(mode=mode, block_size=block, data_type=code_dtype, scale_type=scale_type,
                                            global_scale=global_scale, infer_only=False)
    y = jax.device_put(y, jax.devices("cpu")[0])
    q, s = jax.jit(lambda y: scaled_matmul.quantize(y, config))(y)
    return np.asarray(q), np.asarray(s)


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a


@pytest.mark.parametrize("code_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_mxfp8_matches_jax(code_dtype):
    y = _data(0, (6, 256))
    q, s = quantize_blocks(y, "mxfp8", code_dtype, 32)
    jq, js = _jax(y, "mxfp8", code_dtype, 32)
    np.testing.assert_array_equal(_bits(q), _bits(jq))
    np.testing.assert_array_equal(s, _bits(js))  # E8M0: the exponent byte
    assert s.shape == (6, 8) and q.dtype == np.dtype(code_dtype)


@pytest.mark.parametrize("global_scale", [1.0, 3.7e-4])
def test_nvfp4_matches_jax(global_scale):
    y = _data(1, (6, 256)) * np.float32(1e-3)
    g = jnp.float32(global_scale)
    q, s = quantize_blocks(y, "nvfp4", ml_dtypes.float4_e2m1fn, 16, global_scale=np.float32(global_scale))
    jq, js = _jax(y, "nvfp4", jnp.float4_e2m1fn, 16, g)
    np.testing.assert_array_equal(_bits(s), _bits(js))
    # Blocks whose scale rounds to 0 jax.nn's quantizer divides by zero; the
    # library (and so the reference) gives them codes +0. Elsewhere the same.
    zero = np.repeat(np.asarray(s, np.float32) == 0, 16, axis=-1)
    assert zero.any() and (~zero).any()
    np.testing.assert_array_equal(np.asarray(q, np.float32)[~zero], np.asarray(jq, np.float32)[~zero])
    assert (_bits(q)[zero] == 0).all()
    assert s.shape == (6, 16)


def test_reference_can_fail():
    # A one-exponent change in a block's scale is seen.
    y = _data(2, (2, 64))
    q, s = quantize_blocks(y, "mxfp8", jnp.float8_e4m3fn, 32)
    jq, js = _jax(y * np.float32(2.0), "mxfp8", jnp.float8_e4m3fn, 32)
    assert not np.array_equal(s, _bits(js))
