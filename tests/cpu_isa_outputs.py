"""Writes the CPU kernels' outputs for a fixed set of inputs to an .npz file, as
raw bits: tests/test_cpu_isa.py runs it once per instruction set
(JAX_RMSNORM_CPU_ISA) and compares the files bit for bit.

    JAX_RMSNORM_CPU_ISA=avx2 python tests/cpu_isa_outputs.py OUT.npz
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_rmsnorm as jrn
from jax_rmsnorm import _ffi


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def rand(key, shape, dtype, offset=0.0):
    return (jax.random.normal(jax.random.key(key), shape, jnp.float32) + offset).astype(dtype)


def outputs():
    out = {}
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        for rows, hidden in ((37, 1003), (130, 4096)):
            name = f"{jnp.dtype(dtype).name}_{rows}x{hidden}"
            x = rand(1, (rows, hidden), dtype, offset=0.5)
            dy = rand(2, (rows, hidden), dtype)
            g = rand(3, (hidden,), dtype, offset=1.0)
            b = rand(4, (hidden,), dtype)
            y, vjp = jax.vjp(lambda x, g: jrn.rms_norm(x, g), x, g)
            out.update({f"rms_y_{name}": y, **{f"rms_d{i}_{name}": d for i, d in enumerate(vjp(dy))}})
            y, vjp = jax.vjp(lambda x, g, b: jrn.layer_norm(x, g, b, zero_centered_gamma=True), x, g, b)
            out.update({f"ln_y_{name}": y, **{f"ln_d{i}_{name}": d for i, d in enumerate(vjp(dy))}})
            out[f"rms_stats_{name}"] = jrn.rms_norm_stats(x)
            out[f"ln_stats_{name}"] = jrn.layer_norm_stats(x)
    # The fused variants, bf16.
    rows, hidden = 37, 1024
    x, r = rand(5, (rows, hidden), jnp.bfloat16, 0.3), rand(6, (rows, hidden), jnp.bfloat16)
    dy = rand(7, (rows, hidden), jnp.bfloat16)
    g, b = rand(8, (hidden,), jnp.float32, 1.0), rand(9, (hidden,), jnp.float32)
    (y, h), vjp = jax.vjp(lambda x, r, g: jrn.add_rms_norm(x, r, g, h_dtype=jnp.float32), x, r, g)
    out.update({"add_rms_y": y, "add_rms_h": h})
    out.update({f"add_rms_d{i}": d for i, d in enumerate(vjp((dy, dy.astype(jnp.float32))))})
    out.update(dict(zip(("add_ln_y", "add_ln_h"), jrn.add_layer_norm(x, r, g, b))))
    out.update(dict(zip(("fp8_q", "fp8_amax"), jrn.rms_norm_fp8(x, g, scale=jnp.float32(3.0)))))
    out.update(dict(zip(("ln_fp8_q", "ln_fp8_amax"), jrn.layer_norm_fp8(x, g, b, scale=jnp.float32(2.0),
                                                                          residual=r))))
    out.update(dict(zip(("row_q", "row_s"), jrn.rms_norm_fp8_rowwise(x, g, out_dtype=jnp.float8_e5m2))))
    out.update(dict(zip(("ln_row_q", "ln_row_s"), jrn.layer_norm_fp8_rowwise(x, g, b))))
    out.update(dict(zip(("group_q", "group_s"), jrn.rms_norm_fp8_groupwise(x, g, group_size=128))))
    out.update(dict(zip(("cur_q", "cur_s", "cur_qt"), jrn.rms_norm_fp8_current(x, g, transpose=True))))
    xq = rand(10, (rows, hidden), jnp.float8_e4m3fn)
    xs = jnp.abs(rand(11, (rows, hidden // 16), jnp.float32)) + 0.1
    out["fp8_in_y"] = jrn.rms_norm(xq, g, x_scale=xs, group_size=16, dtype=jnp.bfloat16)
    stats = jrn.layer_norm_stats(x)
    out["ln_apply"] = jrn.layer_norm_apply(x, stats, g, b, hidden_size=hidden)
    return {k: bits(v) for k, v in out.items()}


if __name__ == "__main__":
    np.savez(sys.argv[1], isa=np.array(_ffi.cpu_isa()), **outputs())
