"""Writes digests of the CUDA backward's outputs for a fixed set of inputs, and
the plans that ran them, to an .npz file: tests/test_plan.py runs it under two
DRAM bandwidths (JAX_RMSNORM_DRAM_GBPS, read once a process), one on each side
of the plans' threshold for loading a row's statistics a row ahead
(bwd-slices-stats), and compares the outputs bit for bit (by their SHA-256:
the outputs are hundreds of MB).

    JAX_RMSNORM_DRAM_GBPS=4917 python tests/plan_dram_outputs.py OUT.npz
"""
import hashlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_rmsnorm as jrn
from jax_rmsnorm import _ffi

# (kind, rows, hidden, x dtype, gamma dtype): bwd_slices' late instance with
# several rows a CTA (rows well past the resident CTAs), both norms, 16-bit
# and float32 x, float32 gamma with 16-bit x.
CASES = [("rms", 12000, 4096, jnp.bfloat16, jnp.bfloat16), ("rms", 3000, 8192, jnp.bfloat16, jnp.float32),
         ("rms", 12000, 2048, jnp.float32, jnp.float32), ("layer", 12000, 2048, jnp.bfloat16, jnp.bfloat16),
         ("layer", 3000, 8192, jnp.float16, jnp.float16), ("layer", 12000, 1024, jnp.bfloat16, jnp.float32)]


def rand(key, shape, dtype, offset=0.0):
    return (jax.random.normal(jax.random.key(key), shape, jnp.float32) + offset).astype(dtype)


def outputs():
    out = {}
    for i, (kind, rows, hidden, dtype, pdtype) in enumerate(CASES):
        name = f"{kind}_{rows}x{hidden}_{jnp.dtype(dtype).name}_{jnp.dtype(pdtype).name}"
        out[f"plan_{name}"] = np.array(_ffi.describe_plan("bwd", kind, (rows, hidden), dtype, param_dtype=pdtype,
                                                          device="current"))
        # Rows of different means and spreads, so that a row's rstd (and
        # mean) used for another row's changes its outputs.
        x = (rand(4 * i, (rows, hidden), jnp.float32) * (1.0 + jnp.arange(rows)[:, None] % 7)
             + jnp.arange(rows)[:, None] % 5).astype(dtype)
        dy = rand(4 * i + 1, (rows, hidden), dtype)
        g = rand(4 * i + 2, (hidden,), pdtype, offset=1.0)
        if kind == "rms":
            _, vjp = jax.vjp(lambda x, g: jrn.rms_norm(x, g), x, g)
        else:
            b = rand(4 * i + 3, (hidden,), pdtype)
            _, vjp = jax.vjp(lambda x, g, b: jrn.layer_norm(x, g, b), x, g, b)
        for j, d in enumerate(vjp(dy)):
            d = np.asarray(d)
            out[f"d{j}_{name}"] = np.array(hashlib.sha256(d.tobytes()).hexdigest())
            f = d.astype(np.float32)
            out[f"finite_d{j}_{name}"] = np.array(bool(np.isfinite(f).all() and np.abs(f).max() > 0))
    return out


if __name__ == "__main__":
    np.savez(sys.argv[1], **outputs())
