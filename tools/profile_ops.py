"""Runs chosen ops a few times each, for a profiler (Nsight Compute) to
attach to: no timing here. Example, on a GPU machine:

    ncu --clock-control none --kernel-name regex:'fwd_|bwd_' --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        python3 tools/profile_ops.py rms_fp8 --rows 32768 --hidden 4096

At 2^27 elements a tensor, kernel replay (ncu's default) saves and restores the
device's memory around each pass: on an H100 (2026-11-25) four kernels of
2048x65536 with five sections had not finished in 200 s. Profile fewer rows
(still far beyond L2) or pass `--replay-mode application`: at 512x65536 (64
MiB a tensor) `bash tools/ncu_run.sh 512 65536 rms_fwd ln_fwd` (seven
sections, two kernels an op) finished both ops in about 100 s.

With sections that need several passes, set XLA_PYTHON_CLIENT_PREALLOCATE=false
as well: by default XLA takes 75% of the GPU's memory at start, and kernel
replay backs up device memory between passes. On an H100 (2026-11-27), eight
sections on `add_rms xla_add_rms --rows 16 --hidden 4096` without it had not
finished the first kernel when the call's time ran out, minutes later; ncu
warned "Backing up device memory in system memory".
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))  # its helpers
from common import jnp_layer, jnp_rms


def fp8_in(x):
    """(q, x_scale): x's e4m3 codes and a scale of one per group of 128."""
    return x.astype(jnp.float8_e4m3fn), jnp.ones(x.shape[:-1] + (x.shape[-1] // 128,), jnp.float32)


NVFP4_GLOBAL = 1.0 / (6 * 448)  # the global scale bench_fused.py gives the NVFP4 outputs


def ops(x, g, b, dy):
    r = jnp.float32(0.5)
    return {
        "rms_fwd": lambda: jrn.rms_norm_fwd(x, g),
        "ln_fwd": lambda: jrn.layer_norm_fwd(x, g, b),
        "rms_bwd": lambda: jrn.rms_norm_bwd(dy, x, jrn.rms_norm_fwd(x, g)[1], g),
        "ln_bwd": lambda: jrn.layer_norm_bwd(dy, x, *jrn.layer_norm_fwd(x, g, b)[1:], g),
        "rms_fp8": lambda: jrn.rms_norm_fp8(x, g, scale=r),
        "ln_fp8": lambda: jrn.layer_norm_fp8(x, g, b, scale=r),
        "rms_fp8_row": lambda: jrn.rms_norm_fp8_rowwise(x, g),
        "ln_fp8_row": lambda: jrn.layer_norm_fp8_rowwise(x, g, b),
        "rms_fp8_group": lambda: jrn.rms_norm_fp8_groupwise(x, g),
        "ln_fp8_group": lambda: jrn.layer_norm_fp8_groupwise(x, g, b),
        "rms_fp8_current": lambda: jrn.rms_norm_fp8_current(x, g),  # measuring pass, scale, quantizing pass
        "rms_fp8_current_t": lambda: jrn.rms_norm_fp8_current(x, g, transpose=True),  # and q_t
        "ln_fp8_current": lambda: jrn.layer_norm_fp8_current(x, g, b),
        "ln_fp8_current_t": lambda: jrn.layer_norm_fp8_current(x, g, b, transpose=True),
        "rms_mxfp8": lambda: jrn.rms_norm_mxfp8(x, g),
        "rms_mxfp8_t": lambda: jrn.rms_norm_mxfp8(x, g, transpose=True),  # and the columnwise copy
        "ln_mxfp8": lambda: jrn.layer_norm_mxfp8(x, g, b),
        "rms_nvfp4": lambda: jrn.rms_norm_nvfp4(x, g, global_scale=jnp.float32(NVFP4_GLOBAL)),
        "ln_nvfp4": lambda: jrn.layer_norm_nvfp4(x, g, b, global_scale=jnp.float32(NVFP4_GLOBAL)),
        "rms_nvfp4_t": lambda: jrn.rms_norm_nvfp4(x, g, global_scale=jnp.float32(NVFP4_GLOBAL), transpose=True),
        "ln_mxfp8_t": lambda: jrn.layer_norm_mxfp8(x, g, b, transpose=True),
        "ln_nvfp4_t": lambda: jrn.layer_norm_nvfp4(x, g, b, global_scale=jnp.float32(NVFP4_GLOBAL), transpose=True),
        "add_rms": lambda: jrn.add_rms_norm(x, dy, g),  # dy stands in for the residual
        "add_ln": lambda: jrn.add_layer_norm(x, dy, g, b),
        "add_rms_h32": lambda: jrn.add_rms_norm(x, dy, g, h_dtype=jnp.float32),  # h in float32
        "add_ln_h32": lambda: jrn.add_layer_norm(x, dy, g, b, h_dtype=jnp.float32),
        "rms_stats": lambda: jrn.rms_norm_stats(x),
        # FP8 x with a scale per group of 128 columns (made in the same program, by XLA's own kernels)
        "fp8in_rms": lambda: jrn.rms_norm(fp8_in(x)[0], g, x_scale=fp8_in(x)[1], group_size=128, dtype=x.dtype),
        "fp8in_ln": lambda: jrn.layer_norm(fp8_in(x)[0], g, b, x_scale=fp8_in(x)[1], group_size=128,
                                           dtype=x.dtype),
        "xla_rms_fwd": lambda: jnp_rms(x, g),  # XLA's fusion of the jnp norm
        "xla_ln_fwd": lambda: jnp_layer(x, g, b),
        "xla_add_rms": lambda: (jnp_rms(x + dy, g), x + dy),  # the residual add's composition: (y, h)
        "xla_add_ln": lambda: (jnp_layer(x + dy, g, b), x + dy),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ops", nargs="+")
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--shapes", default=None,
                   help="ROWSxHIDDEN,... instead of --rows/--hidden: each shape in turn, every op at each")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", help="x's (and dy's) dtype")
    p.add_argument("--param-dtype", default=None, help="gamma's and beta's dtype (default: x's)")
    a = p.parse_args()
    dtype = jnp.dtype(a.dtype)
    pdtype = jnp.dtype(a.param_dtype) if a.param_dtype else dtype
    shapes = ([tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")] if a.shapes
              else [(a.rows, a.hidden)])
    # Made on the host: no device kernels run before the ops profiled.
    rng = np.random.default_rng(0)
    put = lambda shape, dt, scale=1.0, offset=0.0: jax.device_put(
        (offset + scale * rng.standard_normal(shape, np.float32)).astype(dt))
    for rows, hidden in shapes:
        x, dy = put((rows, hidden), dtype), put((rows, hidden), dtype)
        g, b = put((hidden,), pdtype, 0.1, 1.0), put((hidden,), pdtype, 0.1)
        for name in a.ops:
            # The arrays are arguments: closed over, they were constants, and
            # XLA folded its jnp norms at compile time (no kernel ran).
            f = jax.jit(lambda x, g, b, dy, name=name: ops(x, g, b, dy)[name]())
            for _ in range(a.calls):
                jax.block_until_ready(f(x, g, b, dy))
            print(name, f"{rows}x{hidden}", "ran", a.calls, "times")


if __name__ == "__main__":
    main()
