"""Times this library's ops alone, for same-call A/Bs of two builds
(tools/ab_same_call.sh): no XLA reference and no copy, so a call covers
many cells. Each op is checked once against the jnp reference (bench_norm's,
bench_fused's check) before it is timed, then timed as bench_norm times it
(3 rotated input sets, one program, median of --reps repetitions of 20
calls). Prints one row per cell: `| op dtype/param dtype | rows x hidden | us
| err ... |`.

Cells are `op:hidden,hidden,...`, rows = --elements // hidden. Ops:
rms_fwd, ln_fwd, rms_bwd, ln_bwd (as bench_norm), and bench_fused's forward
ops (add_rms, add_ln, rms_fp8, ln_fp8, rms_fp8_row, ln_fp8_row,
rms_fp8_group, ...; FP8 as e4m3, groups of 128).

    python3 tools/bench_ours.py ln_fwd:20480,24576 rms_fp8_row:12288
    python3 tools/bench_ours.py --dtype float32 ln_fwd:16384 ln_bwd:20480
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))  # its helpers
from bench_fused import OPS, check, make
from common import bench, jnp_layer, jnp_rms, rel_err

NORM_OPS = ["rms_fwd", "ln_fwd", "rms_bwd", "ln_bwd"]


def norm_case(op, xs, dys, g, b):
    """(jitted op, its input sets, relative error against jnp) for bench_norm's ops."""
    rms = op.startswith("rms")
    if op.endswith("fwd"):
        ours = jax.jit(lambda x: jrn.rms_norm(x, g)) if rms else jax.jit(lambda x: jrn.layer_norm(x, g, b))
        ref = jax.jit(lambda x: jnp_rms(x, g)) if rms else jax.jit(lambda x: jnp_layer(x, g, b))
        return ours, [(x,) for x in xs], rel_err(ours(xs[0]), ref(xs[0]))
    if rms:
        _, rstds = zip(*[jrn.rms_norm_fwd(x, g) for x in xs])
        ours = jax.jit(lambda dy, x, r: jrn.rms_norm_bwd(dy, x, r, g))
        sets = list(zip(dys, xs, rstds))
        want = jax.vjp(lambda x, gg: jnp_rms(x, gg), xs[0], g)[1](dys[0])
    else:
        _, means, rstds = zip(*[jrn.layer_norm_fwd(x, g, b) for x in xs])
        ours = jax.jit(lambda dy, x, mu, r: jrn.layer_norm_bwd(dy, x, mu, r, g))
        sets = list(zip(dys, xs, means, rstds))
        want = jax.vjp(lambda x, gg, bb: jnp_layer(x, gg, bb), xs[0], g, b)[1](dys[0])
    got = ours(*sets[0])
    return ours, sets, max(rel_err(got[0], want[0]), rel_err(got[1], want[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", nargs="+", help="op:hidden[,hidden...]")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--param-dtype", default=None, help="gamma/beta dtype (default: x's)")
    ap.add_argument("--elements", type=int, default=1 << 27, help="rows * hidden")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dt = jnp.dtype(args.dtype)
    pdt = jnp.dtype(args.param_dtype or args.dtype)
    for cell in args.cells:
        op, hs = cell.split(":")
        if op not in NORM_OPS + OPS or op.endswith("_fwdbwd") or op.startswith("fp8in"):
            raise SystemExit(f"bench_ours: unknown or unsupported op {op!r}")
        for h in map(int, hs.split(",")):
            m = max(1, args.elements // h)
            keys = jax.random.split(jax.random.key(m * 31 + h), 8)
            xs = [jax.random.normal(keys[i], (m, h), jnp.float32).astype(dt) for i in range(3)]
            others = [jax.random.normal(keys[3 + i], (m, h), jnp.float32).astype(dt) for i in range(3)]
            g = (1.0 + 0.1 * jax.random.normal(keys[6], (h,), jnp.float32)).astype(pdt)
            b = (0.1 * jax.random.normal(keys[7], (h,), jnp.float32)).astype(pdt)
            if op in NORM_OPS:
                ours, sets, err = norm_case(op, xs, others, g, b)
            else:  # others: the residuals of add_*
                ours, comp, _, _, residual, mode, _ = make(op, g, b, "e4m3", 128, jnp.float32(100.0))
                sets = list(zip(xs, others)) if residual else [(x,) for x in xs]
                err = check(op, ours(*sets[0]), comp(*sets[0]), dt, mode, "e4m3")
            t = bench(ours, sets, 20, args.reps)
            print(f"| {op} {dt.name}/{pdt.name} | {m}x{h} | {t * 1e6:.1f} | err {err:.2e} |", flush=True)
            del xs, others, sets


if __name__ == "__main__":
    main()
