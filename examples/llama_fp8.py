"""The Llama-style model of llama.py trained with FP8 projections fed by its norms.

Each block's two norms emit their projections' FP8 input in the same kernel:
`jrn.rms_norm_fp8_rowwise` gives E4M3 codes and one scale per row, and the
q/k/v (attention) and gate/up (MLP) projections multiply them by their
weights quantized per tensor (current scaling): an FP8 x FP8 `jnp.dot` with
float32 accumulation, which XLA runs as a cuBLASLt FP8 GEMM on Hopper. The
backward is high precision: the norm's gradient from its backward kernel
(one forward kernel recomputes y), the projections' in float32.

Recipes (`--recipe`):
  rowwise  the above (default; any platform);
  mxfp8    `jrn.rms_norm_mxfp8` (E4M3 codes, an E8M0 scale per 32 columns)
           through `jax.nn.scaled_matmul` (GPUs only; on Hopper JAX
           dequantizes the operands and runs a cuBLASLt matmul), the weights
           quantized by the same block rule;
  bf16     no FP8: `jrn.rms_norm` and plain matmuls, the reference run.
`--norm flax` takes flax's RMSNorm followed by the quantization in jnp (the
unfused version of the same step). Prints the losses and the median step time.

    python examples/llama_fp8.py                        # CPU, rowwise FP8
    python examples/llama_fp8.py --device gpu --recipe bf16
    python examples/llama_fp8.py --device gpu --norm flax
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import flax.linen as nn

import jax_rmsnorm as jrn
from llama import Config, corpus, optimizer, rope, train_step

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = float(jnp.finfo(E4M3).max)
MX_BLOCK = 32


# ---- The norms, fused with the quantization (this library) or not (flax + jnp).

def norm(x, gamma, how):
    """RMSNorm of x's last axis, in x's dtype."""
    if how == "flax":
        return nn.RMSNorm(dtype=x.dtype).apply({"params": {"scale": gamma}}, x)
    return jrn.rms_norm(x, gamma)


def norm_rowwise(x, gamma, how):
    """(E4M3 codes, a float32 scale per row) of the norm's output."""
    if how == "flax":
        y = norm(x, gamma, how).astype(jnp.float32)
        scale = jnp.maximum(jnp.max(jnp.abs(y), -1) / E4M3_MAX, 1e-12)
        return (y / scale[..., None]).astype(E4M3), scale
    return jrn.rms_norm_fp8_rowwise(x, gamma)


def mx_quantize(v):
    """MXFP8 along the last axis: E4M3 codes and an E8M0 scale per 32 values,
    the scale amax / 448 rounded up to a power of two."""
    blocks = v.astype(jnp.float32).reshape(*v.shape[:-1], -1, MX_BLOCK)
    amax = jnp.max(jnp.abs(blocks), -1, keepdims=True)
    scale = jnp.exp2(jnp.ceil(jnp.log2(jnp.maximum(amax / E4M3_MAX, 2.0 ** -127))))
    q = jnp.clip(blocks / scale, -E4M3_MAX, E4M3_MAX).astype(E4M3).reshape(v.shape)
    return q, scale[..., 0].astype(jnp.float8_e8m0fnu)


def norm_mxfp8(x, gamma, how):
    if how == "flax":
        return mx_quantize(norm(x, gamma, how))
    return jrn.rms_norm_mxfp8(x, gamma)


# ---- A norm feeding projections: FP8 forward, high-precision backward.

def project(recipe, how, x, gamma, kernels):
    """The norm of x times each of `kernels` ((hidden, n) each), as float32."""
    if recipe == "bf16":
        y = norm(x, gamma, how)
        return tuple(jnp.dot(y, w, preferred_element_type=jnp.float32) for w in kernels)
    return _fp8_project(recipe, how, x, gamma, kernels)


def _fp8_matmuls(recipe, how, x, gamma, kernels):
    lead = x.shape[:-1]
    if recipe == "rowwise":
        q, row_scale = norm_rowwise(x, gamma, how)
        outs = []
        for w in kernels:  # per-tensor current scaling of the weight
            w_scale = jnp.maximum(jnp.max(jnp.abs(w)).astype(jnp.float32) / E4M3_MAX, 1e-12)
            w8 = (w.astype(jnp.float32) / w_scale).astype(E4M3)
            acc = jnp.dot(q, w8, preferred_element_type=jnp.float32)  # FP8 x FP8, float32 accumulation
            outs.append(acc * row_scale[..., None] * w_scale)
        return tuple(outs)
    q, scales = norm_mxfp8(x, gamma, how)
    lhs, lhs_scales = q.reshape(1, -1, q.shape[-1]), scales.reshape(1, -1, scales.shape[-1])
    outs = []
    for w in kernels:  # scaled_matmul contracts both operands' last axes
        w8, w_scales = mx_quantize(w.T)
        out = jax.nn.scaled_matmul(lhs, w8[None], lhs_scales, w_scales[None], preferred_element_type=jnp.float32)
        outs.append(out.reshape(*lead, w.shape[-1]))
    return tuple(outs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fp8_project(recipe, how, x, gamma, kernels):
    return _fp8_matmuls(recipe, how, x, gamma, kernels)


def _fp8_project_fwd(recipe, how, x, gamma, kernels):
    return _fp8_matmuls(recipe, how, x, gamma, kernels), (x, gamma, kernels)


def _fp8_project_bwd(recipe, how, res, cts):
    x, gamma, kernels = res
    y, norm_vjp = jax.vjp(lambda x, g: norm(x, g, how), x, gamma)
    y32 = y.astype(jnp.float32).reshape(-1, y.shape[-1])
    dy = sum(jnp.dot(ct, w.T.astype(jnp.float32)) for ct, w in zip(cts, kernels))
    dws = tuple(jnp.dot(y32.T, ct.reshape(-1, ct.shape[-1])).astype(w.dtype) for ct, w in zip(cts, kernels))
    dx, dgamma = norm_vjp(dy.astype(y.dtype))
    return dx, dgamma, dws


_fp8_project.defvjp(_fp8_project_fwd, _fp8_project_bwd)


# ---- The model, as functions of a parameter tree.

def init(cfg: Config, key):
    dense = lambda k, n_in, n_out: jax.random.normal(k, (n_in, n_out), jnp.float32) / np.sqrt(n_in)
    keys = iter(jax.random.split(key, 1 + 7 * cfg.layers))
    blocks = []
    for _ in range(cfg.layers):
        h, m = cfg.hidden, cfg.mlp
        blocks.append({"attn_norm": jnp.ones(h), "wq": dense(next(keys), h, h), "wk": dense(next(keys), h, h),
                       "wv": dense(next(keys), h, h), "wo": dense(next(keys), h, h), "mlp_norm": jnp.ones(h),
                       "wg": dense(next(keys), h, m), "wu": dense(next(keys), h, m), "wd": dense(next(keys), m, h)})
    embed = jax.random.normal(next(keys), (cfg.vocab, cfg.hidden), jnp.float32) * 0.02
    return {"embed": embed, "blocks": blocks, "final_norm": jnp.ones(cfg.hidden)}


def forward(cfg: Config, recipe, how, params, tokens):
    b, s = tokens.shape
    heads, hd = cfg.heads, cfg.hidden // cfg.heads
    x = params["embed"][tokens]
    pos = jnp.arange(s)
    mask = jnp.tril(jnp.ones((s, s), bool))
    for blk in params["blocks"]:
        q, k, v = project(recipe, how, x, blk["attn_norm"], (blk["wq"], blk["wk"], blk["wv"]))
        q, k, v = (t.reshape(b, s, heads, hd) for t in (q, k, v))
        q, k = rope(q, pos), rope(k, pos)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
        probs = jax.nn.softmax(jnp.where(mask, logits, -1e30), -1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, -1) @ blk["wo"]
        gate, up = project(recipe, how, x, blk["mlp_norm"], (blk["wg"], blk["wu"]))
        x = x + (jax.nn.silu(gate) * up) @ blk["wd"]
    return norm(x, params["final_norm"], how) @ params["embed"].T


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--recipe", default="rowwise", choices=["rowwise", "mxfp8", "bf16"])
    ap.add_argument("--norm", default="jax_rmsnorm", choices=["jax_rmsnorm", "flax"])
    ap.add_argument("--lr", type=float, default=3e-3)
    # The default model is tiny (a CPU run in seconds); on a GPU a step time
    # means something at LLM widths, e.g. --hidden 2048 --mlp 5632 --layers 4
    # --heads 16 --seq 512 --dtype bfloat16.
    for name in ("hidden", "mlp", "layers", "heads", "seq"):
        ap.add_argument(f"--{name}", type=int, default=getattr(Config, name))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the parameters' and activations' dtype")
    args = ap.parse_args(argv)
    if args.hidden % args.heads or (args.recipe == "mxfp8" and args.hidden % MX_BLOCK):
        ap.error(f"--hidden ({args.hidden}) must be a multiple of --heads ({args.heads})"
                 + (f" and of {MX_BLOCK} for --recipe mxfp8" if args.recipe == "mxfp8" else ""))
    device = jax.devices(args.device)[0]
    if args.recipe == "mxfp8" and not _scaled_matmul_runs(device):
        raise SystemExit(f"--recipe mxfp8 needs jax.nn.scaled_matmul, which JAX runs on GPUs only; it does not "
                         f"run on {device.device_kind}")
    with jax.default_device(device):
        return train(args, device)


def _scaled_matmul_runs(device):
    """Whether jax.nn.scaled_matmul compiles and runs on `device`."""
    if device.platform != "gpu":
        return False
    q = jax.device_put(jnp.ones((1, 128, 128), E4M3), device)
    s = jax.device_put(jnp.ones((1, 128, 128 // MX_BLOCK), jnp.float8_e8m0fnu), device)
    try:
        jax.block_until_ready(jax.nn.scaled_matmul(q, q, s, s, preferred_element_type=jnp.float32))
    except Exception:  # not lowered or not supported here: the message above says so
        return False
    return True


def train(args, device):
    cfg = Config(hidden=args.hidden, mlp=args.mlp, layers=args.layers, heads=args.heads, seq=args.seq)
    data = corpus(200_000)
    opt = optimizer(args.steps, args.lr)
    params = jax.tree.map(lambda p: p.astype(args.dtype), init(cfg, jax.random.key(0)))
    opt_state = opt.init(params)
    step = train_step(lambda p, tokens: forward(cfg, args.recipe, args.norm, p, tokens), opt)

    rng = np.random.default_rng(1)
    times, first, loss = [], None, None
    for i in range(args.steps):
        starts = rng.integers(0, len(data) - cfg.seq - 1, args.batch)
        tokens = jnp.asarray(np.stack([data[s:s + cfg.seq + 1] for s in starts]))
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        loss = float(loss)  # waits for the step
        times.append(time.perf_counter() - t0)
        first = loss if first is None else first
        if i % 10 == 0 or i == args.steps - 1:
            sys.stdout.write(f"\rstep {i + 1:4d}/{args.steps}  loss {loss:.3f}")
            sys.stdout.flush()
    step_ms = 1e3 * statistics.median(times[1:]) if len(times) > 1 else float("nan")
    print(f"\n{args.steps} steps on {device.platform}, recipe {args.recipe}, norm {args.norm}: "
          f"loss {first:.3f} -> {loss:.3f}, median step {step_ms:.2f} ms")
    if not loss < first:
        raise SystemExit("loss did not go down")
    return loss


if __name__ == "__main__":
    main()
