"""End-to-end: forward+backward step time of the Llama-style example model
with jax_rmsnorm's RMSNorm, with flax.linen.RMSNorm, and with no norm at all
(the difference to the last is what the norms cost in the step), same run.

    python benchmarks/bench_model.py                  # hidden 4096, seq 4096, 4 layers, bf16
    python benchmarks/bench_model.py --layers 2 --seq 2048

On a GPU the step's time is also appended to benchmarks/results/<gpu>.csv as
op "model_step": ours as us, flax's as xla_us (see common.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib
import statistics
import sys
import time

import jax
import optax

from common import add_csv_arguments, csv_path, write_rows

_spec = importlib.util.spec_from_file_location(
    "llama", pathlib.Path(__file__).resolve().parent.parent / "examples" / "llama.py")
llama = importlib.util.module_from_spec(_spec)
sys.modules["llama"] = llama  # dataclasses look their module up
_spec.loader.exec_module(llama)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--mlp", type=int, default=11008)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=10)
    add_csv_arguments(ap)
    args = ap.parse_args()

    base = llama.Config(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers,
                        mlp=args.mlp, seq=args.seq, dtype="bfloat16")
    tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq + 1), 0, args.vocab)
    print(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}  {dataclasses.asdict(base)} batch {args.batch}")
    results = {}
    for norm in ("jax_rmsnorm", "flax", "none"):
        cfg = dataclasses.replace(base, norm=norm)
        model = llama.Llama(cfg)
        params = model.init(jax.random.key(1), tokens[:, :8])

        def loss_fn(params, tokens):
            logits = model.apply(params, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        step = jax.jit(jax.value_and_grad(loss_fn))
        loss, grads = step(params, tokens)
        jax.block_until_ready(grads)
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            jax.block_until_ready(step(params, tokens))
            times.append(time.perf_counter() - t0)
        results[norm] = (statistics.median(times), float(loss))
        print(f"{norm:12s} step {results[norm][0] * 1e3:8.2f} ms   loss {float(loss):.4f}", flush=True)
        del params, grads

    ours, flax_t, none = results["jax_rmsnorm"][0], results["flax"][0], results["none"][0]
    print(f"\nspeed-up of the step with jax_rmsnorm over flax.linen.RMSNorm: {flax_t / ours:.3f}x")
    print(f"norms' share of the step (step minus the step without norms): jax_rmsnorm "
          f"{(ours - none) * 1e3:.2f} ms ({100 * (ours - none) / ours:.1f}%), flax "
          f"{(flax_t - none) * 1e3:.2f} ms ({100 * (flax_t - none) / flax_t:.1f}%)")
    options = f"layers={args.layers} heads={args.heads} mlp={args.mlp} batch={args.batch} vocab={args.vocab}"
    row = dict(op="model_step", dtype="bfloat16", param_dtype="float32", options=options, rows=args.batch * args.seq,
               hidden=args.hidden, us=ours * 1e6, xla_us=flax_t * 1e6, ratio=flax_t / ours)
    dev = jax.devices()[0]
    write_rows(csv_path(args, dev), [row], dev, "bench_model.py", args.commit)


if __name__ == "__main__":
    main()
