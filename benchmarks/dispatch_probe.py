"""Whether bench_norm.py's latency mode times the host or the GPU for the decode-time backward.

For chains of `chain` (default 50) dependent backwards of bf16 rows of 4096 (1, 16 and 64 rows),
ours and XLA's jnp vjp, built with bench_norm.py's `chained`: the time a call back to back (what the
latency mode divides by the chain) and the time for a call to return with the device idle (the
host's dispatch), with bench_norm.py's own timers. Where dispatch is as long as back to back, the
host sets the pace. Each chain is timed twice: with a dgamma output buffer a step (as
chain_trace.py builds it) and "stacked" (the dgammas returned as one array, as bench_norm.py's
latency mode has done since RESULTS.md 1zj, where this found that the buffers a call returns set
the host's time).

    python benchmarks/dispatch_probe.py [chain]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from bench_norm import _dispatch_seconds, _median_seconds, _rotated, chained, jnp_layer, jnp_rms

ITERS, REPS = 20, 7


def main():
    h = 4096
    chain = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    print("device", jax.devices()[0].device_kind, "chain", chain)
    for rows in (1, 16, 64):
        k = jax.random.split(jax.random.PRNGKey(rows), 4)
        xs = [jax.random.normal(jax.random.fold_in(k[0], i), (rows, h), jnp.bfloat16) for i in range(3)]
        dys = [jax.random.normal(jax.random.fold_in(k[1], i), (rows, h), jnp.bfloat16) for i in range(3)]
        g = jax.random.uniform(k[2], (h,), jnp.bfloat16, 0.5, 1.5)
        b = jax.random.normal(k[3], (h,), jnp.bfloat16)
        for kind in ("rms", "layer"):
            if kind == "rms":
                rs = [jrn.rms_norm_fwd(x, g)[1] for x in xs]
                ours = jax.jit(lambda dy, x, r: jrn.rms_norm_bwd(dy, x, r, g))
                sets = list(zip(dys, xs, rs))
                xla = jax.jit(lambda dy, x: jax.vjp(lambda x, gg: jnp_rms(x, gg), x, g)[1](dy))
            else:
                st = [jrn.layer_norm_fwd(x, g, b) for x in xs]
                ours = jax.jit(lambda dy, x, mu, r: jrn.layer_norm_bwd(dy, x, mu, r, g))
                sets = [(dy, x, s[1], s[2]) for dy, x, s in zip(dys, xs, st)]
                xla = jax.jit(lambda dy, x: jax.vjp(lambda x, gg, bb: jnp_layer(x, gg, bb), x, g, b)[1](dy))
            for name, fn, arg_sets in (("ours", ours, sets), ("xla", xla, list(zip(dys, xs)))):
                # The chain with a dgamma output buffer a step, and with its
                # dgammas returned as one array.
                for form, c in (("", chained(fn, chain, "bwd")), (" stacked", chained(fn, chain, "bwd", stack=True))):
                    call = _rotated(c, arg_sets)
                    loop = _median_seconds([call], ITERS, REPS)[0]  # compiles and warms up first
                    dispatch = _dispatch_seconds(call, REPS)
                    print(f"{kind:5s} {name + form:12s} {rows:3d}x{h}  loop/op {loop / chain * 1e6:6.2f} us  "
                          f"dispatch/op {dispatch / chain * 1e6:6.2f} us  (a call: {loop * 1e6:7.1f} / "
                          f"{dispatch * 1e6:7.1f} us)", flush=True)


if __name__ == "__main__":
    main()
