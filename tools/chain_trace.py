"""Where a chain of decode-time norms spends its time: kernels or the gaps between them.

bench_norm.py's latency mode times --chain dependent norms in one program and
divides; this script runs the same chains under JAX's profiler and reads the
GPU's kernel records, so a step's time splits into the kernel itself and the
gap before the next one starts. Ours and XLA's jnp version (and the x -> -x
copy the latency mode compares with) are traced in turn:

    python tools/chain_trace.py --rows 16 64 --hidden 8192 --ops rms_fwd ln_fwd
    python tools/chain_trace.py --mix --ops add_rms add_ln   # beside XLA's kernels; the residual add
    python tools/chain_trace.py --rows 1 16 64 --hidden 4096 --ops rms_bwd ln_bwd --names   # the backward
    JAX_RMSNORM_PDL=0 python tools/chain_trace.py ...   # our kernels without early launch
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python tools/chain_trace.py ...   # no CUDA graphs

Columns: kernels a step, us a step (first kernel's start to the last one's end,
over the chain), the kernels' own us a step (sum of durations), the median gap
between one kernel's end and the next one's start, and the host launch calls
seen (graph launches against single kernel launches).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import pathlib
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax.profiler import ProfileData

import jax_rmsnorm as jrn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))  # its helpers
from common import chained, jnp_layer, jnp_rms


def _trace(call, args):
    """Kernel records (name, start_ns, end_ns) of one traced call of ``call``
    on the first GPU, in start order, and counts of the host's launch calls."""
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        jax.block_until_ready(call(*args))
        jax.profiler.stop_trace()
        data = ProfileData.from_file(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)[0])
        kernels, host = [], collections.Counter()
        for plane in data.planes:
            if plane.name == "/device:GPU:0":
                for line in plane.lines:
                    if line.name.startswith("Stream"):
                        kernels += [(e.name, e.start_ns, e.end_ns) for e in line.events
                                    if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
            elif plane.name.startswith("/host"):
                for line in plane.lines:
                    for e in line.events:
                        if "GraphLaunch" in e.name or "LaunchKernel" in e.name:
                            host["graph" if "Graph" in e.name else "kernel"] += 1
    return sorted(kernels, key=lambda k: k[1]), host


def _summary(kernels, steps):
    """(kernels a step, us a step from the first start to the last end, the
    kernels' own us a step, the median gap in us), or None without records."""
    if not kernels:
        return None
    span = (kernels[-1][2] - kernels[0][1]) / steps / 1e3
    busy = sum(e - s for _, s, e in kernels) / steps / 1e3
    gaps = [kernels[i + 1][1] - kernels[i][2] for i in range(len(kernels) - 1)]
    return len(kernels) / steps, span, busy, statistics.median(gaps) / 1e3 if gaps else 0.0


def _then_twice(f, mode):
    """``f`` followed by XLA's 2 * y, its own kernel (y alone where ``f``, in
    mode "add", also returns h)."""
    twice = lambda y: (jax.lax.optimization_barrier(y) * 2).astype(y.dtype)
    if mode == "fwd":
        return lambda *a: twice(f(*a))

    def step(*a):
        y, h = f(*a)
        return twice(y), h

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--hidden", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--ops", nargs="+", default=["rms_fwd", "ln_fwd"],
                    choices=["rms_fwd", "ln_fwd", "add_rms", "add_ln", "rms_bwd", "ln_bwd"],
                    help="add_rms / add_ln: the residual add + norm (y the next x, h the next residual), "
                         "against jnp's x + r, then the norm; rms_bwd / ln_bwd: the backward from saved "
                         "statistics (dx the next dy, dgamma kept), against jax.vjp of the jnp norm, as "
                         "bench_norm.py's latency mode chains them")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chain", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3, help="traced calls per chain; the median step is printed")
    ap.add_argument("--names", action="store_true",
                    help="print the kernels of each chain: how many, their median us, their names")
    ap.add_argument("--mix", action="store_true",
                    help="follow each norm with XLA's 2 * y (its own kernel), as a model's other ops "
                         "follow a norm: the gaps are then between our kernel and XLA's, both ways")
    args = ap.parse_args()
    dt = jnp.dtype(args.dtype)
    print(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}  XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"{'chain':11} {'shape':>12} {'k/step':>6} {'us/step':>8} {'kernel us':>9} {'gap us':>7}  host launches")
    for h in args.hidden:
        for m in args.rows:
            k = jax.random.split(jax.random.key(m * 7 + h), 4)
            x = jax.random.normal(k[0], (m, h), jnp.float32).astype(dt)
            g = (1 + 0.1 * jax.random.normal(k[1], (h,), jnp.float32)).astype(dt)
            b = (0.1 * jax.random.normal(k[2], (h,), jnp.float32)).astype(dt)
            r = jax.random.normal(k[3], (m, h), jnp.float32).astype(dt)
            # name -> (fn, chained mode, its arguments)
            fns = {"copy": (lambda x: -x, "fwd", (x,))}
            for op in args.ops:
                if op == "rms_fwd":
                    fns["rms ours"] = (lambda x: jrn.rms_norm(x, g), "fwd", (x,))
                    fns["rms xla"] = (lambda x: jnp_rms(x, g), "fwd", (x,))
                elif op == "ln_fwd":
                    fns["ln ours"] = (lambda x: jrn.layer_norm(x, g, b), "fwd", (x,))
                    fns["ln xla"] = (lambda x: jnp_layer(x, g, b), "fwd", (x,))
                elif op == "rms_bwd":
                    rstd = jrn.rms_norm_fwd(x, g)[1]
                    fns["rmsbwd ours"] = (lambda dy, x, rs: jrn.rms_norm_bwd(dy, x, rs, g), "bwd", (r, x, rstd))
                    fns["rmsbwd xla"] = (lambda dy, x: jax.vjp(lambda x, gg: jnp_rms(x, gg), x, g)[1](dy), "bwd",
                                         (r, x))
                elif op == "ln_bwd":
                    _, mean, rstd = jrn.layer_norm_fwd(x, g, b)
                    fns["lnbwd ours"] = (lambda dy, x, mu, rs: jrn.layer_norm_bwd(dy, x, mu, rs, g), "bwd",
                                         (r, x, mean, rstd))
                    fns["lnbwd xla"] = (lambda dy, x: jax.vjp(lambda x, gg, bb: jnp_layer(x, gg, bb), x, g, b)[1](dy),
                                        "bwd", (r, x))
                elif op == "add_rms":
                    fns["addrms ours"] = (lambda x, r: jrn.add_rms_norm(x, r, g), "add", (x, r))
                    fns["addrms xla"] = (lambda x, r: (jnp_rms(x + r, g), x + r), "add", (x, r))
                else:
                    fns["addln ours"] = (lambda x, r: jrn.add_layer_norm(x, r, g, b), "add", (x, r))
                    fns["addln xla"] = (lambda x, r: (jnp_layer(x + r, g, b), x + r), "add", (x, r))
            if args.mix:
                fns = {name: (_then_twice(f, mode), mode, fargs) for name, (f, mode, fargs) in fns.items()}
            for name, (fn, mode, fargs) in fns.items():
                call = chained(fn, args.chain, mode)
                for _ in range(3):
                    jax.block_until_ready(call(*fargs))
                runs = [_trace(call, fargs) for _ in range(args.runs)]
                sums = sorted((s for s in (_summary(kr, args.chain) for kr, _ in runs) if s), key=lambda s: s[1])
                if not sums:
                    print(f"{name:11} {m:>5}x{h:<6} no kernel records (is the profiler's CUPTI available?)")
                    continue
                per, span, busy, gap = sums[len(sums) // 2]
                host = dict(runs[0][1])
                print(f"{name:11} {m:>5}x{h:<6} {per:6.1f} {span:8.2f} {busy:9.2f} {gap:7.2f}  {host}", flush=True)
                if args.names:
                    durations = collections.defaultdict(list)
                    for kname, start, end in runs[0][0]:
                        durations[kname].append((end - start) / 1e3)
                    for kname, ds in sorted(durations.items(), key=lambda kv: -len(kv[1]))[:4]:
                        print(f"{'':24}{len(ds):4} x {statistics.median(ds):6.2f} us  {kname[:100]}")


if __name__ == "__main__":
    main()
