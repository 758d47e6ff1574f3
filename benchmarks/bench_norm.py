"""Bandwidth benchmark: jax_rmsnorm kernels vs XLA's fusion of the jnp version.

Prints a table: op, dtype, shape, microseconds, achieved TB/s, % of a
device-to-device copy measured in the same run, % of the stream that moves
the op's tensors in the same pattern (the copy for a forward; XLA's x + dy,
two reads and one write, for a backward), XLA's time and TB/s for the jnp
version, and the speed-up over XLA. Every result is checked against the jnp
reference before it is timed. On a GPU the rows are also appended to
benchmarks/results/<gpu>.csv (see common.py; benchmarks/report.py makes the
tables and plots).

Bytes counted are the ones that must move: forward = x read + y written (+ the
parameters read and the statistics written); backward = x + dy read + dx
written (+ statistics and gamma read, dgamma/dbeta written). XLA's backward is
jax.vjp of the jnp function (it recomputes the statistics, as a model does).

    python benchmarks/bench_norm.py                       # bf16, the standard sizes
    python benchmarks/bench_norm.py --dtype float32 --hidden 4096 16384
    # latency at decode-time rows, the residual add's y and h (against jnp's x + r, then the norm) too:
    python benchmarks/bench_norm.py --rows 1 16 64 256 --hidden 4096 8192 --ops rms_fwd ln_fwd add_rms add_ln

In latency mode (--rows) every op, XLA's and the copy are chained --chain
times in one program, so "% of copy" compares with a kernel that only reads x
and writes -x at the same size (one launch a step, as for the ops); a single
timed copy would be mostly host dispatch there. Each latency row also gives
the host's dispatch of a call an op (ours / XLA's) and says "host-bound" where
that reaches 80% of the time measured; tools/chain_trace.py gives the GPU's
own time of each kernel in such a chain.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from common import (add_csv_arguments, bench, chained, copy_seconds, csv_path, dispatch_seconds, jnp_layer, jnp_rms,
                    median_seconds, rel_err, rotated, stream2_seconds, write_rows)

OPS = ["rms_fwd", "rms_bwd", "ln_fwd", "ln_bwd", "add_rms", "add_ln"]

# Powers of two, and the hidden sizes of public LLMs between them.
HIDDEN = [1024, 2560, 2880, 3584, 4096, 5120, 7168, 8192, 12288, 16384, 18432, 25600, 65536, 262144]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--param-dtype", default=None, help="gamma/beta dtype (default: x's)")
    ap.add_argument("--hidden", type=int, nargs="+", default=HIDDEN)
    ap.add_argument("--elements", type=int, default=1 << 27, help="rows * hidden")
    ap.add_argument("--rows", type=int, nargs="+", default=None,
                    help="fixed row counts (latency mode: each timed call runs the op --chain times "
                         "back to back, unrolled inside one jit, so dispatch overhead is amortized)")
    ap.add_argument("--chain", type=int, default=50, help="ops per call in latency mode")
    ap.add_argument("--ops", nargs="+", default=["rms_fwd", "rms_bwd", "ln_fwd", "ln_bwd"],
                    choices=OPS,
                    help="add_rms / add_ln: the residual add + norm (y and h), against XLA's jnp composition")
    ap.add_argument("--zero-centered", action="store_true")
    ap.add_argument("--sets", type=int, default=3, help="input sets rotated between calls")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    add_csv_arguments(ap)
    args = ap.parse_args()

    dt = jnp.dtype(args.dtype)
    pdt = jnp.dtype(args.param_dtype or args.dtype)
    zc = args.zero_centered
    dev = jax.devices()[0]
    print(f"device: {dev.device_kind}  jax {jax.__version__}  x {dt.name}  params {pdt.name}  zero_centered={zc}")

    shapes = ([(r, h) for h in args.hidden for r in args.rows] if args.rows
              else [(max(1, args.elements // h), h) for h in args.hidden])
    rows_out = []
    print(f"{'op':8} {'dtype':9} {'shape':>14} {'us':>9} {'TB/s':>6} {'%copy':>6} {'%same':>6} {'xla us':>9} "
          f"{'xla TB/s':>8} {'vs xla':>7}")
    for (m, h) in shapes:
        keys = jax.random.split(jax.random.key(m * 31 + h), 4 * args.sets)
        xs = [jax.random.normal(keys[4 * i], (m, h), jnp.float32).astype(dt) for i in range(args.sets)]
        dys = [jax.random.normal(keys[4 * i + 1], (m, h), jnp.float32).astype(dt) for i in range(args.sets)]
        g = (1.0 + 0.1 * jax.random.normal(keys[2], (h,), jnp.float32)).astype(pdt)
        b = (0.1 * jax.random.normal(keys[3], (h,), jnp.float32)).astype(pdt)
        s, ps = dt.itemsize, pdt.itemsize
        if args.rows:  # latency mode: the copy chained as the ops are, one x -> -x kernel a step
            neg = chained(lambda x: -x, args.chain, "fwd")
            copy_t = median_seconds([rotated(neg, [(x,) for x in xs])], max(2, args.iters // 4),
                                     args.reps)[0] / args.chain
        else:
            copy_t = copy_seconds(xs, dev, args.iters, args.reps)
        copy_bw = 2 * m * h * s / copy_t
        stream2_bw = None
        if not args.rows and any(op.endswith("bwd") for op in args.ops):
            stream2_t = stream2_seconds(xs, dys, args.iters, args.reps)
            stream2_bw = 3 * m * h * s / stream2_t
        for op in args.ops:
            kind = "rms" if "rms" in op else "layer"
            mode = "add" if op.startswith("add_") else op[-3:]
            gref = (g.astype(jnp.float32) + 1).astype(pdt) if zc else g
            ref = (lambda x, gg=gref: jnp_rms(x, gg)) if kind == "rms" else (lambda x, gg=gref: jnp_layer(x, gg, b))
            nstat = 1 if kind == "rms" else 2
            # A forward's parameters read and statistics written:
            fwd_side = (nstat - (kind == "rms")) * h * ps + h * ps + nstat * 4 * m
            if mode == "add":  # dy stands in for the residual; h in x's dtype
                ours = jax.jit(lambda x, r: jrn.add_rms_norm(x, r, g, zero_centered_gamma=zc)) if kind == "rms" else \
                    jax.jit(lambda x, r: jrn.add_layer_norm(x, r, g, b, zero_centered_gamma=zc))
                xla = jax.jit(lambda x, r, ref=ref: (ref(x + r), x + r))
                sets = xla_sets = list(zip(xs, dys))
                got, want = ours(*sets[0]), xla(*sets[0])
                err = max(rel_err(got[0], want[0]), rel_err(got[1], want[1]))
                nbytes = 4 * m * h * s + fwd_side
            elif mode == "fwd":
                ours = jax.jit(lambda x: jrn.rms_norm(x, g, zero_centered_gamma=zc)) if kind == "rms" else \
                    jax.jit(lambda x: jrn.layer_norm(x, g, b, zero_centered_gamma=zc))
                xla = jax.jit(ref)
                sets = xla_sets = [(x,) for x in xs]
                err = rel_err(ours(xs[0]), xla(xs[0]))
                nbytes = 2 * m * h * s + fwd_side
            else:
                if kind == "rms":
                    _, rstds = zip(*[jrn.rms_norm_fwd(x, g, zero_centered_gamma=zc) for x in xs])
                    ours = jax.jit(lambda dy, x, r: jrn.rms_norm_bwd(dy, x, r, g, zero_centered_gamma=zc))
                    sets = list(zip(dys, xs, rstds))
                    xla = jax.jit(lambda dy, x: jax.vjp(lambda x, gg: jnp_rms(x, gg), x, gref)[1](dy))
                else:
                    _, means, rstds = zip(*[jrn.layer_norm_fwd(x, g, b, zero_centered_gamma=zc) for x in xs])
                    ours = jax.jit(lambda dy, x, mu, r: jrn.layer_norm_bwd(dy, x, mu, r, g, zero_centered_gamma=zc))
                    sets = list(zip(dys, xs, means, rstds))
                    xla = jax.jit(lambda dy, x: jax.vjp(lambda x, gg, bb: jnp_layer(x, gg, bb), x, gref, b)[1](dy))
                xla_sets = [(dy, x) for dy, x in zip(dys, xs)]
                got, want = ours(*sets[0]), xla(*xla_sets[0])
                err = max(rel_err(got[0], want[0]), rel_err(got[1], want[1]))
                nbytes = 3 * m * h * s + nstat * 4 * m + h * ps + nstat * h * ps
            if args.rows:  # latency mode: time --chain dependent applications per call
                # One chain per call: with the rotated sets in one program, XLA
                # ran the independent chains' jnp norms side by side.
                calls = [rotated(chained(ours, args.chain, mode, stack=True), sets),
                         rotated(chained(xla, args.chain, mode, stack=True), xla_sets)]
                t, tx = median_seconds(calls, max(2, args.iters // 4), args.reps)
                t, tx = t / args.chain, tx / args.chain
                host, xla_host = (dispatch_seconds(c, args.reps) / args.chain for c in calls)
            else:
                t = bench(ours, sets, args.iters, args.reps)
                tx = bench(xla, xla_sets, args.iters, args.reps)
            tol = 2e-2 if dt != jnp.float32 else 1e-4
            if not err < tol:
                raise SystemExit(f"{op} {m}x{h}: result differs from the jnp reference (rel err {err:.2e})")
            bw, bwx = nbytes / t, nbytes / tx
            sol_bw = stream2_bw if op.endswith("bwd") else copy_bw
            row = dict(op=op, dtype=dt.name, m=m, h=h, us=t * 1e6, tbps=bw / 1e12, pct_copy=100 * bw / copy_bw,
                       pct_sol=100 * bw / sol_bw if sol_bw else float("nan"),
                       xla_us=tx * 1e6, xla_tbps=bwx / 1e12, speedup=tx / t, copy_tbps=copy_bw / 1e12,
                       sol_tbps=(sol_bw or float("nan")) / 1e12)
            rows_out.append(row)
            # Latency mode: the host's dispatch an op, ours / XLA's; "host-bound"
            # where it is 80% or more of the time measured (_dispatch_seconds).
            note = ""
            if args.rows:
                bound = "  host-bound" if max(host / t, xla_host / tx) >= 0.8 else ""
                note = f"  dispatch {host * 1e6:.1f} / {xla_host * 1e6:.1f} us{bound}"
            print(f"{op:8} {dt.name:9} {m:>6}x{h:<7} {row['us']:9.1f} {row['tbps']:6.2f} {row['pct_copy']:5.0f}% "
                  f"{row['pct_sol']:5.0f}% {row['xla_us']:9.1f} {row['xla_tbps']:8.2f} {row['speedup']:6.2f}x{note}",
                  flush=True)
        how = "x -> -x chained as the ops are" if args.rows else "best of x -> -x and a D2D copy"
        print(f"{'copy':8} {dt.name:9} {m:>6}x{h:<7} {copy_t * 1e6:9.1f} {copy_bw / 1e12:6.2f}  ({how}; read + write)")
        if stream2_bw:
            print(f"{'x + dy':8} {dt.name:9} {m:>6}x{h:<7} {stream2_t * 1e6:9.1f} {stream2_bw / 1e12:6.2f}  "
                  "(XLA's x + dy: two reads, one write; the backward's pattern)")
        del xs, dys

    print("\nmarkdown:\n")
    print("| op | dtype | rows x hidden | us | TB/s | % of copy | % of same pattern | XLA us | XLA TB/s | vs XLA |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['op']} | {r['dtype']} | {r['m']}x{r['h']} | {r['us']:.1f} | {r['tbps']:.2f} | "
              f"{r['pct_copy']:.0f}% | {r['pct_sol']:.0f}% | {r['xla_us']:.1f} | {r['xla_tbps']:.2f} | {r['speedup']:.2f}x |")

    options = " ".join(["zero_centered"] * zc + [f"latency chain={args.chain}"] * bool(args.rows))
    for r in rows_out:
        r.update(dtype=dt.name, param_dtype=pdt.name, options=options, rows=r["m"], hidden=r["h"], ratio=r["speedup"])
    write_rows(csv_path(args, dev), rows_out, dev, "bench_norm.py", args.commit)


if __name__ == "__main__":
    main()
