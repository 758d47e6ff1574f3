"""A tiny pre-norm residual MLP trained with jax_rmsnorm's RMSNorm and jax.grad.

Runs on the CPU by default (`--device gpu` to use a GPU):

    python examples/train_step.py --steps 200
"""

import argparse
import time

import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn


def init(key, vocab, hidden, layers):
    keys = jax.random.split(key, 2 * layers + 2)
    params = {
        "embed": jax.random.normal(keys[0], (vocab, hidden)) * 0.02,
        "blocks": [
            {"norm": jnp.ones((hidden,)),
             "w1": jax.random.normal(keys[2 * i + 1], (hidden, 4 * hidden)) / jnp.sqrt(hidden),
             "w2": jax.random.normal(keys[2 * i + 2], (4 * hidden, hidden)) / jnp.sqrt(4 * hidden)}
            for i in range(layers)
        ],
        "final_norm": jnp.ones((hidden,)),
    }
    return params


def forward(params, tokens):
    h = params["embed"][tokens]                                   # (batch, seq, hidden)
    for blk in params["blocks"]:
        x = jrn.rms_norm(h, blk["norm"], eps=1e-6)                # pre-norm
        h = h + jax.nn.gelu(x @ blk["w1"]) @ blk["w2"]            # residual
    h = jrn.rms_norm(h, params["final_norm"], eps=1e-6)
    return h @ params["embed"].T                                  # tied output projection


def loss_fn(params, tokens):
    # Next-token prediction on a sequence whose rule the model can learn:
    # each token is (previous * 3 + 1) mod vocab.
    logits = forward(params, tokens[:, :-1])
    labels = tokens[:, 1:]
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))


def make_batch(key, batch, seq, vocab):
    tok = jax.random.randint(key, (batch, 1), 0, vocab)
    out = [tok]
    for _ in range(seq - 1):
        tok = (tok * 3 + 1) % vocab
        out.append(tok)
    return jnp.concatenate(out, axis=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args()

    vocab, hidden, layers, batch, seq = 64, 128, 2, 32, 16
    device = jax.devices(args.device)[0]
    with jax.default_device(device):
        params = init(jax.random.key(0), vocab, hidden, layers)

        @jax.jit
        def step(params, tokens):
            loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
            params = jax.tree.map(lambda p, g: p - args.lr * g, params, grads)
            return params, loss

        key = jax.random.key(1)
        t0 = time.perf_counter()
        first = None
        for i in range(args.steps):
            key, sub = jax.random.split(key)
            params, loss = step(params, make_batch(sub, batch, seq, vocab))
            if first is None:
                first = float(loss)
            if i % 25 == 0 or i == args.steps - 1:
                print(f"step {i:4d}  loss {float(loss):.4f}")
        print(f"{args.steps} steps on {device.platform} in {time.perf_counter() - t0:.1f}s: "
              f"loss {first:.3f} -> {float(loss):.3f}")
        if not float(loss) < first:
            raise SystemExit("loss did not go down")


if __name__ == "__main__":
    main()
