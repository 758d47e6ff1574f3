"""Bad input raises a clear Python error at trace time, naming the argument."""

import pytest
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn

x = jnp.ones((4, 8), jnp.bfloat16)
g = jnp.ones((8,), jnp.float32)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: jrn.rms_norm(jnp.float32(1.0)), ValueError, "x must have rank >= 1"),
    (lambda: jrn.rms_norm(jnp.ones((4, 8), jnp.int32)), TypeError, "x must be float32, bfloat16 or float16"),
    (lambda: jrn.layer_norm(jnp.ones((4, 8), jnp.complex64)), TypeError, "x must be float32"),
    (lambda: jrn.rms_norm(jnp.ones((4, 0))), ValueError, "hidden size"),
    (lambda: jrn.rms_norm(x, jnp.ones((7,))), ValueError, r"gamma must have shape \(8,\)"),
    (lambda: jrn.rms_norm(x, jnp.ones((1, 8))), ValueError, "gamma must have shape"),
    (lambda: jrn.rms_norm(x, jnp.ones((8,), jnp.float16)), TypeError, "gamma must be float32 or x's dtype"),
    (lambda: jrn.layer_norm(x, g, jnp.ones((8,), jnp.bfloat16)), TypeError, "beta must have gamma's dtype"),
    (lambda: jrn.layer_norm(x, g, jnp.ones((9,), jnp.float32)), ValueError, "beta must have shape"),
    (lambda: jrn.rms_norm(x, g, eps=-1e-6), ValueError, "eps must be a finite number >= 0"),
    (lambda: jrn.rms_norm(x, g, eps=float("nan")), ValueError, "eps"),
    (lambda: jrn.rms_norm(x, g, eps="small"), TypeError, "eps must be a Python number"),
    (lambda: jrn.rms_norm_bwd(x, x, jnp.ones((4, 1)), g), ValueError, r"rstd must be float32 of shape \(4,\)"),
    (lambda: jrn.rms_norm_bwd(x, x, jnp.ones((4,), jnp.bfloat16), g), ValueError, "rstd must be float32"),
    (lambda: jrn.rms_norm_bwd(x.astype(jnp.float32), x, jnp.ones((4,)), g), ValueError, "dy must have x's shape"),
    (lambda: jrn.layer_norm_bwd(x, x, jnp.ones((5,)), jnp.ones((4,)), g), ValueError, "mean must be float32"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_float64_rejected_under_x64():
    with jax.enable_x64(True):
        with pytest.raises(TypeError, match="got float64"):
            jrn.rms_norm(jnp.ones((2, 4), jnp.float64))


def test_errors_raise_under_jit_at_trace_time():
    with pytest.raises(ValueError, match="gamma must have shape"):
        jax.jit(jrn.rms_norm)(x, jnp.ones((3,), jnp.float32))
