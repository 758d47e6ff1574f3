"""Where the time of the residual add + RMSNorm goes at wide rows: ours, two
jnp spellings of it (the add in float32 as bench_fused.py does, and in x's
dtype), XLA's first pass alone (h and the row sums of squares), and our
normalization with given statistics (h -> y) and statistics (h -> sum h^2)
alone, next to a copy. bf16, medians of one-program timings (bench_norm.bench).

    python benchmarks/bench_wide_residual.py            # 512x262144 and 2048x65536
"""
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from bench_norm import bench, copy_seconds, jnp_rms, rel_err


def main():
    dev = jax.devices()[0]
    print(dev.device_kind)
    for rows, hidden in [(512, 262144), (2048, 65536)]:
        keys = jax.random.split(jax.random.key(0), 5)
        xs = [jax.random.normal(k, (rows, hidden), jnp.float32).astype(jnp.bfloat16) for k in keys[:2]]
        rs = [jax.random.normal(k, (rows, hidden), jnp.float32).astype(jnp.bfloat16) for k in keys[2:4]]
        g = (1 + 0.1 * jax.random.normal(keys[4], (hidden,))).astype(jnp.bfloat16)
        sets = [(x, r, g) for x, r in zip(xs, rs)]

        def first_pass(x, r):
            h = x + r
            hf = h.astype(jnp.float32)
            return h, jnp.sum(hf * hf, -1)

        def jnp_f32_add(x, r, g):
            h = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(x.dtype)
            return jnp_rms(h, g), h

        h0, ss0 = jax.jit(first_pass)(xs[0], rs[0])
        ours = jax.jit(lambda x, r, g: jrn.add_rms_norm(x, r, g))
        for u, v in zip(ours(*sets[0]), jax.jit(jnp_f32_add)(*sets[0])):
            if rel_err(u, v) > 2e-2:
                raise SystemExit("add_rms_norm differs from the jnp composition")
        timed = {
            "ours add_rms_norm": (ours, sets),
            "jnp, add in float32": (jnp_f32_add, sets),
            "jnp, add in bf16": (lambda x, r, g: (jnp_rms(x + r, g), x + r), sets),
            "XLA first pass (h, sum h^2)": (lambda x, r, g: first_pass(x, r), sets),
            "ours apply (h -> y)": (lambda h, s, g: jrn.rms_norm_apply(h, s, g, hidden_size=hidden),
                                    [(h0, ss0, g)] * 2),
            "ours stats (h -> sum h^2)": (jrn.rms_norm_stats, [(h0,)] * 2),
        }
        c = copy_seconds(xs, dev, 20, 5)
        print(f"\n{rows}x{hidden}: copy of x {c * 1e6:.1f} us ({2 * xs[0].nbytes / c / 1e12:.2f} TB/s)")
        for name, (fn, arg_sets) in timed.items():
            print(f"  {name:30s} {bench(fn, arg_sets, 20, 5) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
