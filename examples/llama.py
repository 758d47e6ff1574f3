"""A small Llama-style language model trained with jax_rmsnorm's RMSNorm.

Embedding, pre-norm blocks of causal self-attention (rotary positions) and a
SwiGLU MLP, a final RMSNorm, tied output projection; byte-level tokens of a
small synthetic text; AdamW from optax. Runs on the CPU by default in well
under a few minutes, on a GPU with `--device gpu`, and sharded with
`--mesh data=2,model=4` (batch over `data`, attention heads and MLP over
`model`) through jax.jit and NamedSharding.

    python examples/llama.py
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/llama.py --mesh data=2,model=4
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_rmsnorm.flax as jrn_flax


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    mlp: int = 344
    seq: int = 64
    dtype: str = "float32"
    norm: str = "jax_rmsnorm"  # or "flax" (flax.linen.RMSNorm), "none" (identity, for ablations)


def Norm(cfg: Config, name: str):
    """The model's RMSNorm: this library's, flax's own, or none."""
    if cfg.norm == "jax_rmsnorm":
        return jrn_flax.RMSNorm(dtype=cfg.dtype, name=name)
    if cfg.norm == "flax":
        return nn.RMSNorm(dtype=cfg.dtype, name=name)
    return lambda x: x


def rope(x, positions):
    """Rotary position embedding over the last axis of (batch, seq, heads, head_dim)."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions[:, None].astype(jnp.float32) * freqs[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)


class Attention(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        hd = c.hidden // c.heads
        dense = lambda n, name: nn.DenseGeneral(n, use_bias=False, dtype=c.dtype, name=name)
        q = dense((c.heads, hd), "q")(x)
        k = dense((c.heads, hd), "k")(x)
        v = dense((c.heads, hd), "v")(x)
        pos = jnp.arange(x.shape[1])
        q, k = rope(q, pos), rope(k, pos)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(hd)
        mask = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        probs = jax.nn.softmax(jnp.where(mask, logits, -1e30), -1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        return nn.DenseGeneral(c.hidden, axis=(-2, -1), use_bias=False, dtype=c.dtype, name="o")(out)


class Block(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x):
        c = self.cfg
        x = x + Attention(c, name="attn")(Norm(c, "attn_norm")(x))
        h = Norm(c, "mlp_norm")(x)
        gate = nn.Dense(c.mlp, use_bias=False, dtype=c.dtype, name="gate")(h)
        up = nn.Dense(c.mlp, use_bias=False, dtype=c.dtype, name="up")(h)
        return x + nn.Dense(c.hidden, use_bias=False, dtype=c.dtype, name="down")(jax.nn.silu(gate) * up)


class Llama(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, tokens):
        c = self.cfg
        embed = nn.Embed(c.vocab, c.hidden, dtype=c.dtype, name="embed")
        x = embed(tokens)
        for i in range(c.layers):
            x = Block(c, name=f"block_{i}")(x)
        x = Norm(c, "final_norm")(x)
        return embed.attend(x).astype(jnp.float32)


def corpus(n_bytes: int, seed: int = 0) -> np.ndarray:
    """Byte tokens of sentences from a small grammar: learnable structure."""
    rng = np.random.default_rng(seed)
    subjects = ["the kernel", "a norm", "the model", "each row", "the gradient", "our library"]
    verbs = ["reads", "writes", "scales", "reduces", "normalizes", "shards"]
    objects = ["the tensor once", "every row", "its statistics", "the hidden axis", "gamma", "the residual"]
    out = []
    while sum(map(len, out)) < n_bytes:
        out.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}. ")
    return np.frombuffer("".join(out).encode(), np.uint8)[:n_bytes].astype(np.int32)


def parse_mesh(spec: str | None, devices):
    if not spec:
        return None
    axes = dict(part.split("=") for part in spec.split(","))
    if set(axes) != {"data", "model"}:
        raise SystemExit("--mesh takes data=N,model=M")
    shape = (int(axes["data"]), int(axes["model"]))
    if shape[0] * shape[1] > len(devices):
        raise SystemExit(f"--mesh {spec} needs {shape[0] * shape[1]} devices, JAX sees {len(devices)}")
    # Auto axes: jit partitions the program from the parameters' and the batch's shardings.
    return jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=devices[: shape[0] * shape[1]])


def param_spec(path, leaf):
    """Megatron-style tensor parallelism over `model`; the rest replicated."""
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if name.endswith(("q/kernel", "k/kernel", "v/kernel")):
        return P(None, "model", None)
    if name.endswith("o/kernel"):
        return P("model", None, None)
    if name.endswith(("gate/kernel", "up/kernel")):
        return P(None, "model")
    if name.endswith("down/kernel"):
        return P("model", None)
    return P()


def optimizer(steps, lr):
    """AdamW with a warm-up and cosine decay over `steps`."""
    warmup = min(20, steps // 4)
    return optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1)), weight_decay=0.01)


def train_step(apply, opt):
    """A jitted step of `opt` on the next-token loss of `apply(params, tokens)`:
    (params, opt_state, tokens) -> (params, opt_state, loss)."""
    def loss_fn(params, tokens):
        logits = apply(params, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--mesh", default=None, help="e.g. data=2,model=4")
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)

    devices = jax.devices(args.device)
    with jax.default_device(devices[0]):
        return train(args, devices)


def train(args, devices):
    cfg = Config()
    mesh = parse_mesh(args.mesh, devices)
    data = corpus(200_000)
    model = Llama(cfg)
    opt = optimizer(args.steps, args.lr)

    params = model.init(jax.random.key(0), jnp.zeros((1, cfg.seq), jnp.int32))
    if mesh is not None:
        shardings = jax.tree_util.tree_map_with_path(lambda p, l: NamedSharding(mesh, param_spec(p, l)), params)
        params = jax.device_put(params, shardings)
        batch_sharding = NamedSharding(mesh, P("data", None))
    opt_state = opt.init(params)
    step = train_step(model.apply, opt)

    rng = np.random.default_rng(1)
    t0, first, loss = time.perf_counter(), None, None
    for i in range(args.steps):
        starts = rng.integers(0, len(data) - cfg.seq - 1, args.batch)
        tokens = jnp.asarray(np.stack([data[s:s + cfg.seq + 1] for s in starts]))
        if mesh is not None:
            tokens = jax.device_put(tokens, batch_sharding)
        params, opt_state, loss = step(params, opt_state, tokens)
        if i % 10 == 0 or i == args.steps - 1:
            loss = float(loss)
            first = loss if first is None else first
            done = (i + 1) / args.steps
            bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
            sys.stdout.write(f"\r[{bar}] step {i + 1:4d}/{args.steps}  loss {loss:.3f}")
            sys.stdout.flush()
    where = f"mesh {dict(mesh.shape)}" if mesh is not None else devices[0].platform
    print(f"\n{args.steps} steps on {where} in {time.perf_counter() - t0:.1f}s: loss {first:.3f} -> {loss:.3f}")
    if not loss < first:
        raise SystemExit("loss did not go down")
    return loss


if __name__ == "__main__":
    main()
