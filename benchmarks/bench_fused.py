"""Bandwidth benchmark of the fused variants: residual add + norm, and norm +
FP8 quantization (per tensor, per row, per group), against the unfused jnp
composition compiled by XLA and against this library's plain norm.

Prints a table: op, dtype, shape, microseconds, TB/s on the fused op's own
byte count, % of a copy measured in the same run, the jnp composition's time
and the speed-up over it, and the plain norm's time (``jrn.rms_norm`` /
``jrn.layer_norm`` on the same x) with the ratio plain / fused. Every result
is checked against the jnp composition before it is timed. On a GPU the rows
are also appended to benchmarks/results/<gpu>.csv (see common.py).

Bytes counted are the ones the fused op must move: inputs read once (x, the
residual, the parameters) and outputs written once (y or q, h, the statistics,
amax or the scales); for ``*_fp8_current`` too, although it reads x twice (the
tensor's amax is needed before anything is quantized; ``_t`` adds the
transposed copy q_t). ``*_fp8_group_t``: per group of ``--group`` columns
with the columnwise copy (q_t quantized down the rows in groups of as many
rows, its scales: 1x128 blocks with their 128x1 copy). ``add_rms_fwdbwd``
times ``jax.vjp`` of the fused add + norm, forward and backward in one jit
(as in a training step), returning y, h, dx and dgamma: the forward's bytes
plus the backward's (dy, dh and h read, dx written: the gradient of both x
and the residual, returned once since it is one array); its jnp counterpart is ``jax.vjp`` of the composition. h is
returned because dh is an input: h has a consumer (the next block's residual
add), so a model writes it. ``--fwdbwd-drop-h`` times the older definition
without h, where XLA need not write it and recomputes x + r in the backward.
With ``--hidden-slice`` the FP8 outputs (per tensor, row or group, with or
without the residual) and the residual add + norm (``add_rms``, ``add_ln``)
take the path each device runs when the hidden dim is split across devices,
here on one device with no mesh axes: the statistics kernel (with the
residual, ``*_add_stats``: h and its statistics in one pass), then the apply
or apply_fp8 kernel (per row: a measuring pass, then the quantizing one).
``fp8in_rms`` / ``fp8in_ln`` normalize an FP8 x with one scale per group of
``--group`` columns into ``--dtype`` (``_tensor``: one scale for the tensor):
q and the scales read, y written; the jnp composition dequantizes and
normalizes in one XLA fusion.

    python benchmarks/bench_fused.py                          # bf16, standard sizes, on the default device
    python benchmarks/bench_fused.py --quick --device cpu     # tiny sizes: checks it runs end to end
    python benchmarks/bench_fused.py --ops rms_fp8 rms_fp8_row --hidden 4096 8192
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from bench_norm import HIDDEN
from common import (add_csv_arguments, bench, copy_seconds, csv_path, jnp_add, jnp_layer, jnp_rms, rel_err,
                    write_rows)

FP8 = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
OPS = ["add_rms", "add_ln", "add_rms_fwdbwd", "add_ln_fwdbwd", "rms_fp8", "ln_fp8", "rms_fp8_row", "ln_fp8_row",
       "rms_fp8_group", "ln_fp8_group", "rms_fp8_group_t", "ln_fp8_group_t", "rms_fp8_current", "rms_fp8_current_t",
       "ln_fp8_current", "ln_fp8_current_t",
       "add_rms_fp8", "add_rms_fp8_row", "fp8in_rms", "fp8in_ln", "fp8in_rms_tensor",
       "rms_mxfp8", "ln_mxfp8", "rms_nvfp4", "ln_nvfp4", "rms_mxfp8_t", "ln_mxfp8_t", "rms_nvfp4_t", "ln_nvfp4_t",
       "add_rms_mxfp8_t"]
# Block-scaled outputs: (block size, jax.nn quantizer mode). NVFP4's global
# scale is given (what the norm's caller would pass); bytes: codes (half a
# byte each for NVFP4) and one scale byte per block. ``_t``: with the
# columnwise copy (transpose=True), q_t and its scales counted once more;
# ``add_``: with the residual add (r read, h written).
BLOCK = {"mxfp8": 32, "nvfp4": 16}
NVFP4_GLOBAL = 1.0 / (6 * 448)


def jnp_norm32(kind, x, g, b):
    """The norm in float32, not rounded (what the FP8 compositions quantize)."""
    xf = x.astype(jnp.float32)
    if kind == "rms":
        return xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6) * g.astype(jnp.float32)
    m = jnp.mean(xf, -1, keepdims=True)
    v = jnp.mean(jnp.square(xf - m), -1, keepdims=True)
    return (xf - m) * jax.lax.rsqrt(v + 1e-5) * g.astype(jnp.float32) + b.astype(jnp.float32)


def quantize(y, mode, fmt, scale=None, group=128):
    """The jnp quantization the fused ops replace: (q, amax or scales)."""
    m = FP8_MAX[fmt]
    if mode == "tensor":
        return jnp.clip(y * scale, -m, m).astype(FP8[fmt]), jnp.max(jnp.abs(y))
    if mode == "current":
        s = jnp.maximum(jnp.max(jnp.abs(y)) / m, 1e-12)
        return jnp.clip(y * (1.0 / s), -m, m).astype(FP8[fmt]), s
    if mode == "row":
        s = jnp.maximum(jnp.max(jnp.abs(y), -1) / m, 1e-12)
        return jnp.clip(y * (1.0 / s)[..., None], -m, m).astype(FP8[fmt]), s
    yg = y.reshape(y.shape[:-1] + (-1, group))
    s = jnp.maximum(jnp.max(jnp.abs(yg), -1) / m, 1e-12)
    return jnp.clip(yg * (1.0 / s)[..., None], -m, m).astype(FP8[fmt]).reshape(y.shape), s


def block_quantize(y, mode, fmt):
    """jax.nn's quantizer (the one scaled_dot_general uses): (codes, scales)."""
    from jax._src.cudnn import scaled_matmul_stablehlo as sm

    codes = FP8[fmt] if mode == "mxfp8" else jnp.float4_e2m1fn
    cfg = sm.BlockScaleConfig(mode=mode, block_size=BLOCK[mode], data_type=codes,
                              scale_type=jnp.float8_e8m0fnu if mode == "mxfp8" else jnp.float8_e4m3fn,
                              global_scale=jnp.float32(NVFP4_GLOBAL) if mode == "nvfp4" else None,
                              infer_only=False)
    return sm.quantize(y, cfg)


def dequantize(q, s, group):
    """q * s in float32, per group of columns (group None: s is one scalar)."""
    if group is None:
        return q.astype(jnp.float32) * s
    qf = q.astype(jnp.float32).reshape(q.shape[:-1] + (-1, group))
    return (qf * s[..., None]).reshape(q.shape)


def hidden_slice_call(kind, mode, fmt, group, scale, g, b):
    """(x, r) -> the FP8 output (mode None: y of the residual add + norm) as
    one device of a split hidden dim makes it (see --hidden-slice), in the
    public functions' output order."""
    from jax_rmsnorm import _primitives as prim

    def call(x, r):
        fused = prim.FusedSpec(residual=r is not None, h_dtype=x.dtype if r is not None else None, quant=mode,
                               out_dtype=None if mode is None else np.dtype(FP8[fmt]),
                               group_size=group if mode == "group" else 0)
        q, _, _, h, qs, _, _ = prim.norm_fwd_fused(
            x, g, b, r, jnp.asarray(scale, jnp.float32), None, kind=kind, eps=1e-6 if kind == "rms" else 1e-5,
            zero_centered_gamma=False, has_gamma=True, has_beta=kind == "layer", fused=fused,
            on_hidden_slice="cpu" if jax.default_backend() == "cpu" else "cuda")
        if mode is None:
            return q, h
        return (q, qs, h) if r is not None else (q, qs)
    return call


def block_of(op):
    """The block-scaled format an op emits ("mxfp8", "nvfp4"), else None."""
    return next((b for b in BLOCK if f"_{b}" in op), None)


def make(op, g, b, fmt, group, zc_scale, keep_h=True, hidden_slice=False):
    """(ours, jnp composition, plain norm, kind, uses residual, fp8 mode or None, backward)."""
    kind = "layer" if "ln" in op else "rms"
    residual = op.startswith("add_")
    mode = None
    if "fp8" in op:
        mode = "current" if "_current" in op else ("row" if op.endswith("_row") else (
            "group" if op.endswith(("_group", "_group_t")) else "tensor"))
    plain = (jax.jit(lambda x: jrn.rms_norm(x, g)) if kind == "rms" else jax.jit(lambda x: jrn.layer_norm(x, g, b)))
    block = block_of(op)
    if block:  # x (and r) -> (codes, scales) (h), against the norm then jax.nn's quantizer
        kw = dict(out_dtype=FP8[fmt]) if block == "mxfp8" else dict(global_scale=NVFP4_GLOBAL)
        fn = {("rms", "mxfp8"): jrn.rms_norm_mxfp8, ("layer", "mxfp8"): jrn.layer_norm_mxfp8,
              ("rms", "nvfp4"): jrn.rms_norm_nvfp4, ("layer", "nvfp4"): jrn.layer_norm_nvfp4}[kind, block]
        if op.endswith("_t"):
            kw["transpose"] = True
        ours = lambda x, r: fn(x, g, residual=r, **kw) if kind == "rms" else fn(x, g, b, residual=r, **kw)

        def comp(x, r):
            h = jnp_add(x, r) if residual else x
            y = jnp_norm32(kind, h, g, b)
            out = (*block_quantize(y, block, fmt), *((h,) if residual else ()))
            return (*out, *block_quantize(y.T, block, fmt)) if op.endswith("_t") else out

        if residual:
            return jax.jit(ours), jax.jit(comp), plain, kind, True, block, False
        return (jax.jit(lambda x: ours(x, None)), jax.jit(lambda x: comp(x, None)), plain, kind, False, block,
                False)
    if op.startswith("fp8in"):  # (q, x_scale) -> y in g's dtype
        gs = None if op.endswith("_tensor") else group
        norm = jrn.rms_norm if kind == "rms" else partial(jrn.layer_norm, beta=b)
        ours = jax.jit(lambda q, s: norm(q, g, x_scale=s, group_size=gs, dtype=g.dtype))

        def comp(q, s):
            x = dequantize(q, s, gs)
            return (jnp_rms(x, g) if kind == "rms" else jnp_layer(x, g, b)).astype(g.dtype)

        return ours, jax.jit(comp), plain, kind, False, None, False
    if op.endswith("_fwdbwd"):
        fused = (lambda x, r, g: jrn.add_rms_norm(x, r, g)) if kind == "rms" else \
            (lambda x, r, g: jrn.add_layer_norm(x, r, g, b))

        def comp(x, r, g):
            h = jnp_add(x, r)
            return (jnp_rms(h, g) if kind == "rms" else jnp_layer(h, g, b)), h

        # (dy, dh, x, r) -> (y, h, dx, dgamma): forward and backward in one
        # jit, y and h outputs as in a model (y feeds the next matmul, h the
        # next residual add, which is where dh comes from). The residual's
        # gradient is the same array as x's (h = x + r): returning it too
        # would make XLA copy one of the two outputs.
        def step(norm):
            def f(dy, dh, x, r):
                (y, h), vjp = jax.vjp(norm, x, r, g)
                dx, _, dg = vjp((dy, dh))
                return (y, h, dx, dg) if keep_h else (y, dx, dg)
            return jax.jit(f)

        return step(fused), step(comp), plain, kind, residual, mode, True

    kw = {}
    if mode == "tensor":
        kw["scale"] = zc_scale
    if mode == "group":
        kw["group_size"] = group
    if op.endswith("_t"):  # (the block-scaled ops' are above)
        kw["transpose"] = True
    if mode:
        kw["out_dtype"] = FP8[fmt]
    if kind == "rms":
        base = {None: jrn.add_rms_norm, "tensor": jrn.rms_norm_fp8, "row": jrn.rms_norm_fp8_rowwise,
                "group": jrn.rms_norm_fp8_groupwise, "current": jrn.rms_norm_fp8_current}[mode]
        call = lambda x, r: (base(x, r, g) if mode is None else base(x, g, residual=r, **kw)) if residual \
            else base(x, g, **kw)
    else:
        base = {None: jrn.add_layer_norm, "tensor": jrn.layer_norm_fp8, "row": jrn.layer_norm_fp8_rowwise,
                "group": jrn.layer_norm_fp8_groupwise, "current": jrn.layer_norm_fp8_current}[mode]
        call = lambda x, r: (base(x, r, g, b) if mode is None else base(x, g, b, residual=r, **kw)) if residual \
            else base(x, g, b, **kw)
    if hidden_slice and (mode in ("tensor", "row", "group") or (mode is None and residual)):
        call = hidden_slice_call(kind, mode, fmt, group, zc_scale, g, b)

    def comp(x, r):
        h = jnp_add(x, r) if residual else x
        if mode is None:
            return (jnp_rms(h, g) if kind == "rms" else jnp_layer(h, g, b)), h
        y = jnp_norm32(kind, h, g, b)
        q, s = quantize(y, mode, fmt, zc_scale, group)
        out = (q, s, h) if residual else (q, s)
        if op.endswith("_group_t"):  # y^T quantized along the rows
            return (*out, *quantize(y.reshape(-1, y.shape[-1]).T, mode, fmt, zc_scale, group))
        return (*out, q.reshape(-1, q.shape[-1]).T) if op.endswith("_current_t") else out

    if residual:
        return jax.jit(call), jax.jit(comp), plain, kind, residual, mode, False
    return jax.jit(lambda x: call(x, None)), jax.jit(lambda x: comp(x, None)), plain, kind, residual, mode, False


def nbytes(op, m, h, s, ps, kind, residual, mode, backward, group):
    params = (1 if kind == "rms" else 2) * h * ps
    stats = (1 if kind == "rms" else 2) * 4 * m
    if op.startswith("fp8in"):  # q and its scales read (one a row when per tensor), y written
        scales = 4 * m * (1 if op.endswith("_tensor") else h // group)
        return m * h + scales + m * h * s + params + stats
    if backward:  # forward: x, r read, h, y written; backward: dy, dh, h read, dx written
        return 8 * m * h * s + 3 * params + 2 * stats
    out = m * h * (1 if mode else s)
    if mode in BLOCK:  # codes and one byte of scale a block (twice with the columnwise copy)
        out = m * h * (1 if mode == "mxfp8" else 0.5) + m * (h // BLOCK[mode])
        return m * h * s * (3 if residual else 1) + out * (2 if op.endswith("_t") else 1) + params
    qs = {None: 0, "tensor": 4, "current": 4, "row": 4 * m, "group": 4 * m * (h // group)}[mode]
    out *= 2 if op.endswith("_t") else 1  # q and q_t
    qs *= 2 if op.endswith("_group_t") else 1  # and q_t's scales
    return m * h * s * (2 if residual else 1) + (m * h * s if residual else 0) + out + params + stats + qs


def check(op, got, want, dt, mode, fmt):
    """Relative errors of every output against the jnp composition."""
    errs = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        errs.append(rel_err(a.astype(jnp.float32), b.astype(jnp.float32)))
    tol = 2e-2 if dt != jnp.float32 else 1e-4
    if mode:  # one FP8 step of rounding, somewhere (E2M1: a step is half the value)
        tol = max(tol, 0.5 if mode == "nvfp4" else 0.13 if fmt == "e4m3" else 0.26)
    if not max(errs) < tol:
        raise SystemExit(f"{op}: result differs from the jnp composition (rel errs {errs})")
    return max(errs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--param-dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="gamma and beta (default: x's dtype)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[h for h in HIDDEN if h <= 65536])
    ap.add_argument("--elements", type=int, default=1 << 27, help="rows * hidden")
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--fp8", default="e4m3", choices=list(FP8))
    ap.add_argument("--group", type=int, default=128, help="group size of *_fp8_group")
    ap.add_argument("--device", default=None, choices=["cpu", "gpu"], help="default: JAX's default device")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few iterations (a smoke run)")
    ap.add_argument("--sets", type=int, default=3, help="input sets rotated between calls")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hidden-slice", action="store_true",
                    help="FP8 outputs, and add_rms / add_ln, on the path of one device of a split hidden dim (see above)")
    ap.add_argument("--fwdbwd-drop-h", action="store_true",
                    help="*_fwdbwd without h among the outputs (XLA need not write h then)")
    add_csv_arguments(ap)
    args = ap.parse_args()
    if args.param_dtype and any(op.startswith("fp8in") for op in args.ops):
        # They write y in the parameters' dtype, so their bytes would change too.
        print("--param-dtype: the fp8in ops are left out")
        args.ops = [op for op in args.ops if not op.startswith("fp8in")]
    if args.quick:
        args.hidden, args.elements, args.iters, args.reps = [256, 1024], 1 << 14, 2, 2

    dev = jax.devices(args.device)[0] if args.device else jax.devices()[0]
    dt = jnp.dtype(args.dtype)
    pdt = jnp.dtype(args.param_dtype) if args.param_dtype else dt
    print(f"device: {dev.device_kind}  jax {jax.__version__}  x {dt.name}  params {pdt.name}  fp8 {args.fp8}")
    print(f"{'op':16} {'shape':>14} {'us':>9} {'TB/s':>6} {'%copy':>6} {'jnp us':>9} {'vs jnp':>7} "
          f"{'plain us':>9} {'plain/fused':>11}")
    rows_out = []
    with jax.default_device(dev):
        for h in args.hidden:
            m = max(1, args.elements // h)
            keys = jax.random.split(jax.random.key(m * 31 + h), 3 * args.sets + 2)
            xs = [jax.random.normal(keys[3 * i], (m, h), jnp.float32).astype(dt) for i in range(args.sets)]
            rs = [jax.random.normal(keys[3 * i + 1], (m, h), jnp.float32).astype(dt) for i in range(args.sets)]
            dys = [jax.random.normal(keys[3 * i + 2], (m, h), jnp.float32).astype(dt) for i in range(args.sets)]
            g = (1.0 + 0.1 * jax.random.normal(keys[-2], (h,), jnp.float32)).astype(pdt)
            b = (0.1 * jax.random.normal(keys[-1], (h,), jnp.float32)).astype(pdt)
            s = dt.itemsize
            copy_t = copy_seconds(xs, dev, args.iters, args.reps)
            copy_bw = 2 * m * h * s / copy_t
            plain_t = {}  # the plain norm's time, once a kind
            for op in args.ops:
                if ((op.endswith(("_group", "_group_t")) or op.startswith("fp8in")) and h % args.group) or (
                        op.endswith("_group_t") and m % args.group) or (
                        (blk := block_of(op)) and (h % BLOCK[blk] or (op.endswith("_t") and m % BLOCK[blk]))):
                    continue
                ours, xla, plain, kind, residual, mode, backward = make(op, g, b, args.fp8, args.group,
                                                                      jnp.float32(100.0), not args.fwdbwd_drop_h,
                                                                      args.hidden_slice)
                if op.startswith("fp8in"):  # FP8 inputs: x quantized per group (or per tensor)
                    mode_in = "current" if op.endswith("_tensor") else "group"
                    sets = [quantize(x.astype(jnp.float32), mode_in, args.fp8, group=args.group) for x in xs]
                elif backward:
                    sets = list(zip(dys, rs, xs, rs))  # dh: another random tensor
                elif residual:
                    sets = list(zip(xs, rs))
                else:
                    sets = [(x,) for x in xs]
                err = check(op, ours(*sets[0]), xla(*sets[0]), dt, mode, args.fp8)
                t = bench(ours, sets, args.iters, args.reps)
                tx = bench(xla, sets, args.iters, args.reps)
                if kind not in plain_t:
                    plain_t[kind] = bench(plain, [(x,) for x in xs], args.iters, args.reps)
                tp = plain_t[kind]
                nb = nbytes(op, m, h, s, s, kind, residual, mode, backward, args.group)
                bw = nb / t
                row = dict(op=op, dtype=dt.name, m=m, h=h, us=t * 1e6, tbps=bw / 1e12, pct_copy=100 * bw / copy_bw,
                           xla_us=tx * 1e6, speedup=tx / t, plain_us=tp * 1e6, plain_ratio=tp / t, err=err,
                           copy_tbps=copy_bw / 1e12)
                rows_out.append(row)
                print(f"{op:16} {m:>6}x{h:<7} {row['us']:9.1f} {row['tbps']:6.2f} {row['pct_copy']:5.0f}% "
                      f"{row['xla_us']:9.1f} {row['speedup']:6.2f}x {row['plain_us']:9.1f} {row['plain_ratio']:10.2f}x",
                      flush=True)
            print(f"{'copy':16} {m:>6}x{h:<7} {copy_t * 1e6:9.1f} {copy_bw / 1e12:6.2f}  (read + write of x)")
            del xs, rs, dys

    print("\nmarkdown:\n")
    print("| op | dtype | rows x hidden | us | TB/s | % of copy | jnp us | vs jnp | plain norm us | plain / fused |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['op']} | {r['dtype']} | {r['m']}x{r['h']} | {r['us']:.1f} | {r['tbps']:.2f} | "
              f"{r['pct_copy']:.0f}% | {r['xla_us']:.1f} | {r['speedup']:.2f}x | {r['plain_us']:.1f} | "
              f"{r['plain_ratio']:.2f}x |")

    options = []
    if args.fp8 != "e4m3":
        options.append(f"fp8={args.fp8}")
    if args.group != 128:
        options.append(f"group={args.group}")
    options += ["hidden_slice"] * args.hidden_slice + ["drop_h"] * args.fwdbwd_drop_h
    for r in rows_out:
        r.update(param_dtype=pdt.name, options=" ".join(options), rows=r["m"], hidden=r["h"], ratio=r["speedup"])
    write_rows(csv_path(args, dev), rows_out, dev, "bench_fused.py", args.commit)


if __name__ == "__main__":
    main()
