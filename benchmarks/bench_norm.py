"""Bandwidth benchmark: jax_rmsnorm kernels vs XLA's fusion of the jnp version.

Prints a table: op, dtype, shape, microseconds, achieved TB/s, % of a
device-to-device copy measured in the same run, % of the stream that moves
the op's tensors in the same pattern (the copy for a forward; XLA's x + dy,
two reads and one write, for a backward), XLA's time and TB/s for the jnp
version, and the speed-up over XLA. Every result is checked against the jnp
reference before it is timed.

Bytes counted are the ones that must move: forward = x read + y written (+ the
parameters read and the statistics written); backward = x + dy read + dx
written (+ statistics and gamma read, dgamma/dbeta written). XLA's backward is
jax.vjp of the jnp function (it recomputes the statistics, as a model does).

    python benchmarks/bench_norm.py                       # bf16, the standard sizes
    python benchmarks/bench_norm.py --dtype float32 --hidden 4096 16384 --plot tbps.png
    # the plot of several runs' printed tables (a later log's rows replace an earlier one's):
    python benchmarks/bench_norm.py --replot run1.log run2.log --plot tbps.png
    # latency at decode-time rows, the residual add's y and h (against jnp's x + r, then the norm) too:
    python benchmarks/bench_norm.py --rows 1 16 64 256 --hidden 4096 8192 --ops rms_fwd ln_fwd add_rms add_ln

In latency mode (--rows) every op, XLA's and the copy are chained --chain
times in one program, so "% of copy" compares with a kernel that only reads x
and writes -x at the same size (one launch a step, as for the ops); a single
timed copy would be mostly host dispatch there. Each of our steps follows one
of ours there, which our decode kernel's early launch shortens (RESULTS.md
table 3); in a model a norm follows XLA's kernels, as chain_trace.py --mix has it.
Each latency row also gives the host's dispatch of a call an op (ours / XLA's)
and says "host-bound" where that reaches 80% of the time measured. The
chained backward returns its dgammas stacked into one array: with one output
buffer a step it was host-bound on an H200, at 12-19 us an op for ours and
XLA's alike against 2.5-7 us of GPU time (RESULTS.md 1zh), and 3.3-8 us a
step stacked (1zj). chain_trace.py's GPU time is the measure of the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn

OPS = ["rms_fwd", "rms_bwd", "ln_fwd", "ln_bwd", "add_rms", "add_ln"]


def jnp_rms(x, g, eps=1e-6):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * g.astype(jnp.float32)
    return y.astype(x.dtype)


def jnp_layer(x, g, b, eps=1e-5):
    xf = x.astype(jnp.float32)
    m = jnp.mean(xf, -1, keepdims=True)
    v = jnp.mean(jnp.square(xf - m), -1, keepdims=True)
    y = (xf - m) * jax.lax.rsqrt(v + eps) * g.astype(jnp.float32) + b.astype(jnp.float32)
    return y.astype(x.dtype)


def _median_seconds(calls, iters, reps):
    """Median over reps of the seconds per call of each of ``calls`` (each
    ``call(i)``), timing iters calls back to back. The calls are timed in turn
    within every repetition: at a few us per op, a machine's drift between
    processes and over a run moved single cells by up to 1.5 us, and timing
    all of one first put that drift into the comparison."""
    for call in calls:
        jax.block_until_ready(call(0))  # compile
        for i in range(2):  # warm-up
            jax.block_until_ready(call(i))
    times = [[] for _ in calls]
    for _ in range(reps):
        for k, call in enumerate(calls):
            t0 = time.perf_counter()
            for i in range(iters):
                out = call(i)
            jax.block_until_ready(out)
            times[k].append((time.perf_counter() - t0) / iters)
    return [statistics.median(ts) for ts in times]


def _dispatch_seconds(call, reps):
    """Median seconds for ``call(i)`` to return (not to finish), each call
    made with the device idle: the host's dispatch of one call. Where it comes
    near the seconds per call that _median_seconds times, calls back to back
    wait on the host, and the timing is the host's, not the GPU's
    (benchmarks/chain_trace.py gives the GPU's)."""
    out, times = call(0), []
    for i in range(3 * reps):
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        out = call(i)
        times.append(time.perf_counter() - t0)
    jax.block_until_ready(out)
    return statistics.median(times)


def _rotated(fn, arg_sets):
    """call(i): fn applied to input set i (rotating)."""
    return lambda i: fn(*arg_sets[i % len(arg_sets)])


def bench(fn, arg_sets, iters, reps, one_program=True):
    """Median seconds per application of fn over the rotated input sets.

    one_program=True (the default): each timed call is one jit that applies fn
    once to every input set, one after the other, as ops run inside a model's
    program; the time per application is the call's time over the number of
    sets. Host dispatch between executables stays out of the kernels' time (on
    an H100 this changed the 2^27-element bf16 figures by 0-3%, for our ops,
    XLA's and the copy alike). one_program=False times one call per set."""
    if one_program:
        multi = jax.jit(lambda sets: [fn(*a) for a in sets])
        return _median_seconds([lambda i: multi(arg_sets)], iters, reps)[0] / len(arg_sets)
    return _median_seconds([_rotated(fn, arg_sets)], iters, reps)[0]


def copy_seconds(xs, dev, iters, reps):
    """The copy reference: the faster of XLA's x -> -x and a device-to-device
    copy of the buffer (device_put with may_alias=False), seconds per call."""
    t = bench(lambda x: -x, [(x,) for x in xs], iters, reps)
    try:
        memcpy = lambda x: jax.device_put(x, dev, may_alias=False)
        t = min(t, bench(memcpy, [(x,) for x in xs], iters, reps, one_program=False))
    except TypeError:  # older JAX without may_alias
        pass
    return t


def stream2_seconds(xs, ys, iters, reps):
    """The backward's own reference: XLA's x + y, which moves the bytes of the
    backward's tensors in the same pattern (two tensors read, one written),
    seconds per call. A copy reads one tensor for each one written; on an
    H100 that mix runs faster than two reads for one write."""
    return bench(lambda x, y: x + y, list(zip(xs, ys)), iters, reps)


def chained(fn, n, mode, stack=False):
    """fn applied n times back to back in one jit (unrolled, no loop overhead):
    the output feeds the next application through an optimization barrier, so
    that each application is compiled on its own, as a norm between a model's
    matmuls is. Without the barrier XLA fused a chain of 50 jnp RMSNorms of
    16x4096 into one kernel (1 us a norm on an H100). `mode`: "fwd" (y is the
    next x), "bwd" (dx the next dy; dgamma is returned too, or XLA would drop
    its reduction as dead code) or "add" (the residual add: y is the next x
    and h the next residual, as in a stack of residual blocks). `stack`: the
    backward's dgammas returned as one array (one output buffer a call, and
    one more small kernel) instead of one buffer a step, which set the host's
    time a call (RESULTS.md 1zj)."""
    def run(*args):
        args, kept = list(args), []
        for _ in range(n):
            out = fn(*args)
            if mode == "bwd":
                kept.append(out[1])
                args[0] = jax.lax.optimization_barrier(out[0].astype(args[0].dtype))
            elif mode == "add":
                args[0], args[1] = jax.lax.optimization_barrier(
                    (out[0].astype(args[0].dtype), out[1].astype(args[1].dtype)))
            else:
                args[0] = jax.lax.optimization_barrier(out.astype(args[0].dtype))
        return tuple(args), (jnp.stack(kept) if stack and kept else kept)

    return jax.jit(run)


def rel_err(a, b):
    a = np.asarray(a, np.float32).ravel()
    b = np.asarray(b, np.float32).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def read_logs(paths):
    """The rows that earlier runs of this script printed, one an op, dtype and
    shape, each with its own log's copy and x + dy figures for that shape; a
    later log's row replaces an earlier one's, so that a run repeated for some
    shapes (one disturbed, say) takes their place. For --replot."""
    rows = {}
    for path in paths:
        ops, streams = {}, {}
        for line in open(path):
            f = line.split()
            if len(f) >= 5 and f[0] == "copy":  # copy DTYPE MxH us TB/s (...)
                streams[(f[1], f[2], "copy")] = float(f[4])
            elif len(f) >= 7 and f[:3] == ["x", "+", "dy"]:  # x + dy DTYPE MxH us TB/s (...)
                streams[(f[3], f[4], "sol")] = float(f[6])
            elif len(f) >= 10 and f[0] in OPS and f[9].endswith("x"):  # op DTYPE MxH us TB/s % % xla-us xla-TB/s Nx
                m, h = (int(v) for v in f[2].split("x"))
                ops[(f[0], f[1], f[2])] = dict(op=f[0], dtype=f[1], m=m, h=h, us=float(f[3]), tbps=float(f[4]),
                                               xla_us=float(f[7]), xla_tbps=float(f[8]), speedup=float(f[9][:-1]))
        for (_, dtype, shape), r in ops.items():
            r["copy_tbps"] = streams.get((dtype, shape, "copy"), float("nan"))
            r["sol_tbps"] = streams.get((dtype, shape, "sol"), float("nan"))
        rows.update(ops)
    return sorted(rows.values(), key=lambda r: (OPS.index(r["op"]), r["dtype"], r["h"]))


def plot(rows, ops, path):
    """A PNG of TB/s against hidden size, one panel an op: ours, XLA's, the copy
    (and XLA's x + dy for a backward), from rows as main() prints them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = [r for r in rows if r["op"] == op]
        hs = [r["h"] for r in rs]
        ax.plot(hs, [r["tbps"] for r in rs], "o-", label="jax_rmsnorm")
        ax.plot(hs, [r["xla_tbps"] for r in rs], "s--", label="XLA (jnp)")
        ax.plot(hs, [r["copy_tbps"] for r in rs], ":", color="gray", label="copy")
        if op.endswith("bwd"):
            ax.plot(hs, [r["sol_tbps"] for r in rs], "-.", color="gray", label="x + dy (2 reads, 1 write)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {rs[0]['dtype'] if rs else ''}")
        ax.set_xlabel("hidden")
        ax.set_ylabel("TB/s")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--param-dtype", default=None, help="gamma/beta dtype (default: x's)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024, 4096, 8192, 16384, 65536, 262144])
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
    ap.add_argument("--plot", default=None, help="write a PNG of TB/s against hidden size")
    ap.add_argument("--replot", nargs="+", default=None, metavar="LOG",
                    help="measure nothing: plot (--plot) the tables these earlier runs printed")
    args = ap.parse_args()
    if args.replot:
        if not args.plot:
            ap.error("--replot needs --plot PATH")
        rows = read_logs(args.replot)
        if not rows:
            ap.error(f"no table rows in {' '.join(args.replot)}")
        dtypes = sorted({r["dtype"] for r in rows})
        if len(dtypes) > 1:
            ap.error(f"--replot: the logs hold rows of several dtypes ({', '.join(dtypes)}); plot one at a time")
        plot(rows, [op for op in args.ops if any(r["op"] == op for r in rows)], args.plot)
        return

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
            copy_t = _median_seconds([_rotated(neg, [(x,) for x in xs])], max(2, args.iters // 4),
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
                calls = [_rotated(chained(ours, args.chain, mode, stack=True), sets),
                         _rotated(chained(xla, args.chain, mode, stack=True), xla_sets)]
                t, tx = _median_seconds(calls, max(2, args.iters // 4), args.reps)
                t, tx = t / args.chain, tx / args.chain
                host, xla_host = (_dispatch_seconds(c, args.reps) / args.chain for c in calls)
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

    if args.plot:
        plot(rows_out, args.ops, args.plot)


if __name__ == "__main__":
    main()
