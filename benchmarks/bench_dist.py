"""Multi-device benchmark: sharded normalization and all_reduce_rms_norm.

For each layout, the norm of a global (rows, hidden) bf16 array under jit with
NamedSharding over all visible devices: the forward (y and rstd), the backward
from the saved rstd (dx, dgamma), both in one program with dy an input, and
both in one program with dy coming back through a matmul (the gradients of
sum(c * z^2) / 2, z = norm(x) @ w, as in a model); ours against XLA's own
partitioning of the jnp version, both checked against the unsharded result
first:

  rows    x sharded over its rows (data/sequence parallel)
  hidden  x sharded over its hidden dim (tensor parallel over hidden)

Then the residual add + RMSNorm (add_rms_norm: y and h from x and the
residual; forward, and forward + backward with the cotangents of y and h as
inputs) in both layouts, against XLA's partitioning of the jnp version.

Then all_reduce_rms_norm (by its default method, reduce-scatter, normalize,
all-gather, and on GPUs the one kernel that reads the peers' partial sums)
against psum followed by the norm (ours, and the jnp one), inside
shard_map: forward only, forward+backward, and forward after the row-parallel
matmul that makes the partial sums.

    python benchmarks/bench_dist.py                    # all devices, 16384 rows a device, hidden 8192
    python benchmarks/bench_dist.py --rows 8192 --hidden 4096 --devices 2
    python benchmarks/bench_dist.py --devices 4 --pieces-only   # one GPU: one device's kernels of 4
    python benchmarks/bench_dist.py --all-reduce-only
    python benchmarks/bench_dist.py --all-reduce-only --ar-rows 1 16 256 --ar-chain 32   # decode-time latency
    python benchmarks/bench_dist.py --add-only         # only the residual add + norm table
    python benchmarks/bench_dist.py --kernels          # device time of each kernel (profiler trace)

On GPUs the layout tables' rows (ours against XLA's partitioning) are also
appended to benchmarks/results/<gpu>.csv, with the layout and the device
count among their options (see common.py).
"""

from __future__ import annotations

import argparse

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_rmsnorm as jrn
from common import add_csv_arguments, bench, csv_path, jnp_add, jnp_rms, rel_err, write_rows


def step(norm):
    """y, dx, dgamma of one forward + backward in one program."""
    def run(x, g, dy):
        y, vjp = jax.vjp(norm, x, g)
        dx, dg = vjp(dy)
        return y, dx, dg
    return jax.jit(run)


def layer_step(norm):
    """Gradients (x, gamma, w) of sum(c * z^2) / 2, z = norm(x, g) @ w, in one
    program: dy = (c * z) @ w^T reaches the norm's backward through the
    matmul and depends on the forward's y, as from the layers above in a
    model. (With dy an input of the program, or a loss linear in z, dy is
    known before the forward runs, and XLA fuses the forward's passes with
    the backward's row sums, which a model's training step cannot.)"""
    def loss(x, g, w, c):
        z = jnp.dot(norm(x, g), w, preferred_element_type=jnp.float32)
        return 0.5 * jnp.sum(c * z * z)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def jnp_rms_fwd(x, g, eps=1e-6):
    xf = x.astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(xf * xf, -1) + eps)
    return (xf * rstd[..., None] * g.astype(jnp.float32)).astype(x.dtype), rstd


def jnp_rms_bwd(dy, x, rstd, g):
    xf, gdy = x.astype(jnp.float32), dy.astype(jnp.float32) * g.astype(jnp.float32)
    xhat = xf * rstd[..., None]
    c = jnp.mean(gdy * xhat, -1, keepdims=True)
    dx = rstd[..., None] * (gdy - xhat * c)
    dg = jnp.sum(dy.astype(jnp.float32) * xhat, axis=tuple(range(x.ndim - 1)))
    return dx.astype(x.dtype), dg.astype(g.dtype)


def pieces(xl, dyl, gl, H, args):
    """What one device runs for the hidden layout, kernel by kernel, on its
    (rows, H / devices) slice, against XLA's fusion of the same jnp step and a
    copy of the slice, all measured here on one device."""
    from jax_rmsnorm import _checks, _core, _primitives  # the two backward kernels of the hidden layout
    eps = 1e-6
    ss = jrn.rms_norm_stats(xl)
    rstd = jax.lax.rsqrt(ss / H + eps)
    coef = jnp.zeros(ss.shape, jnp.float32)  # RMSNorm: one coefficient a row
    cfg = _checks.Config(_primitives.RMS, eps, False)
    f32 = lambda a: a.astype(jnp.float32)

    def xla_apply(x, s, g):
        return (f32(x) * jax.lax.rsqrt(s / H + eps)[:, None] * f32(g)).astype(x.dtype)

    def xla_grad_sums(dy, x, r, g):
        return jnp.sum(f32(dy) * f32(g) * f32(x) * r[:, None], -1)

    def xla_bwd_given(dy, x, r, g, c):
        xhat = f32(x) * r[:, None]
        dx = r[:, None] * (f32(dy) * f32(g) - xhat * c[:, None])
        return dx.astype(x.dtype), jnp.sum(f32(dy) * xhat, 0).astype(g.dtype)

    rows = {  # name: (ours, XLA's, arguments, tensor passes)
        "stats (read x)": (jrn.rms_norm_stats, lambda x: jnp.sum(f32(x) * f32(x), -1), (xl,), 1),
        "apply (x -> y)": (lambda x, s, g: jrn.rms_norm_apply(x, s, g, hidden_size=H), xla_apply, (xl, ss, gl), 2),
        "plain fwd (x -> y)": (lambda x, g: jrn.rms_norm_fwd(x, g), jnp_rms_fwd, (xl, gl), 2),
        "plain bwd (x, dy -> dx)": (jrn.rms_norm_bwd, jnp_rms_bwd, (dyl, xl, rstd, gl), 3),
        "grad stats (read x, dy)": (lambda dy, x, r, g: _core.grad_sums(dy, x, None, r, g, cfg), xla_grad_sums,
                                    (dyl, xl, rstd, gl), 2),
        "bwd given (x, dy -> dx)": (lambda dy, x, r, g, c: _core.backward(dy, x, None, r, g, None, cfg, coef=c)[:2],
                                    xla_bwd_given, (dyl, xl, rstd, gl, coef), 3),
    }
    copy_t = bench(lambda x: -x, [(xl,)], args.iters, args.reps, one_program=False)
    copy_bw = 2 * xl.nbytes / copy_t
    print(f"\nhidden layout, one device's kernels on its {xl.shape} slice "
          f"(copy of the slice: {copy_t * 1e6:.1f} µs, {copy_bw / 1e12:.2f} TB/s)")
    print("\n| kernel | ours µs | ours TB/s | % of copy | XLA µs | ours vs XLA |")
    print("|---|---|---|---|---|---|")
    for name, (ours, xla, a, passes) in rows.items():
        ours, xla = jax.jit(ours), jax.jit(xla)
        errs = [rel_err(u, v) for u, v in zip(jax.tree.leaves(ours(*a)), jax.tree.leaves(xla(*a)))]
        if max(errs) > 2e-2:
            raise SystemExit(f"{name}: ours and XLA's differ: {errs}")
        t, tx = (bench(f, [a], args.iters, args.reps, one_program=False) for f in (ours, xla))
        bw = passes * xl.nbytes / t
        print(f"| {name} | {t * 1e6:.1f} | {bw / 1e12:.2f} | {100 * bw / copy_bw:.0f}% | {tx * 1e6:.1f} | {tx / t:.2f}x |")


TABLE_HEAD = "\n| layout | mesh | part | ours ms | XLA ms | ours vs XLA |\n|---|---|---|---|---|---|"


def layouts(devices):
    """(layout, mesh shape, x's spec, put) for x sharded over its rows and
    over its hidden dim, across all of ``devices``."""
    n = len(devices)
    for layout, shape, spec in [("rows", (n, 1), P("data", None)), ("hidden", (1, n), P(None, "model"))]:
        mesh = jax.sharding.Mesh(np.asarray(devices).reshape(shape), ("data", "model"),
                                 axis_types=(AxisType.Auto,) * 2)
        yield layout, shape, spec, lambda a, s, mesh=mesh: jax.device_put(a, NamedSharding(mesh, s))


# The layout tables' parts, as CSV op names (after "rms_" or "add_rms").
PART_OPS = {"fwd": "_fwd", "bwd": "_bwd", "fwd+bwd, one program": "_fwdbwd", "fwd+bwd with a matmul": "_layer_step"}
RECORDED = []  # the CSV rows of this run


def table_row(label, shape, f_ours, f_xla, arg_sets, ref, args, op="rms"):
    """Checks ours and XLA's against the unsharded ``ref``, times both, prints
    the row and keeps it for the CSV (``op``: "rms" or "add_rms")."""
    times = {}
    for name, fn in (("ours", f_ours), ("xla", f_xla)):
        errs = [rel_err(a, b) for a, b in zip(fn(*arg_sets[0]), ref)]
        if max(errs) > 2e-2:
            raise SystemExit(f"{label} {name}: results differ from the unsharded ones: {errs}")
        times[name] = bench(fn, arg_sets, args.iters, args.reps, one_program=False)
    layout, part = label.split(" ", 1)
    print(f"| {layout} | {shape[0]}x{shape[1]} | {part} | {times['ours'] * 1e3:.3f} | "
          f"{times['xla'] * 1e3:.3f} | {times['xla'] / times['ours']:.2f}x |")
    x = arg_sets[0][0]
    suffix = PART_OPS[part.split(" (")[0]]
    name = op if (op, suffix) == ("add_rms", "_fwd") else op + suffix  # bench_fused.py's names
    RECORDED.append(dict(op=name, dtype=x.dtype.name, param_dtype=x.dtype.name,
                         options=f"mesh={layout} devices={shape[0] * shape[1]}", rows=x.shape[0], hidden=x.shape[1],
                         us=times["ours"] * 1e6, xla_us=times["xla"] * 1e6, ratio=times["xla"] / times["ours"]))


def add_table(devices, xs, dys, g, args):
    """add_rms_norm against h = x + residual and the jnp norm, sharded by
    rows and by the hidden dim: the forward, and forward + backward in one
    program (dy and dh inputs; gradients of x, residual and gamma)."""

    def jnp_add_rms(x, r, g):
        h = jnp_add(x, r)
        return jnp_rms(h, g), h

    def both(fn):
        def run(x, r, g, dy, dh):
            (y, h), vjp = jax.vjp(fn, x, r, g)
            return (y, h) + vjp((dy, dh))
        return jax.jit(run)

    ours_f = lambda x, r, g: jrn.add_rms_norm(x, r, g)
    variants = {"fwd": (jax.jit(ours_f), jax.jit(jnp_add_rms), 3),
                "fwd+bwd, one program": (both(ours_f), both(jnp_add_rms), 5)}
    rs, dhs = xs[::-1], dys[::-1]  # residuals: the other x; dh: the other dy
    unsharded = (xs[0], rs[0], g, dys[0], dhs[0])
    want = {part: f_ours(*unsharded[:nargs]) for part, (f_ours, _, nargs) in variants.items()}
    print("\nresidual add + RMSNorm (add_rms_norm: y and h), sharded by rows or by the hidden dim")
    print(TABLE_HEAD)
    for layout, shape, spec, put in layouts(devices):
        gs = put(g, P(spec[1]))
        sets = [(put(x, spec), put(r, spec), gs, put(dy, spec), put(dh, spec))
                for x, r, dy, dh in zip(xs, rs, dys, dhs)]
        for part, (f_ours, f_xla, nargs) in variants.items():
            table_row(f"{layout} {part}", shape, f_ours, f_xla, [a[:nargs] for a in sets], want[part], args,
                      op="add_rms")


def kernel_times(programs, calls=10):
    """Device time per call of each kernel of each program on the first GPU,
    read from a jax.profiler trace: where the hidden layout's time goes
    (ours against XLA's fusions), the collectives included. Then, for every
    GPU, the share of the traced span its streams spent in kernels: near
    100% on every GPU means the kernels' own time sets the pace, a low share
    on some GPU that it waited for its launches (the host sets the pace)."""
    import collections
    import glob
    import tempfile
    for name, (fn, a) in programs.items():
        jax.block_until_ready(fn(*a))
        logdir = tempfile.mkdtemp()
        with jax.profiler.trace(logdir):
            for _ in range(calls):
                out = fn(*a)
            jax.block_until_ready(out)
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        total = collections.Counter()
        busy = {}
        for plane in jax.profiler.ProfileData.from_file(path).planes:
            if ":GPU:" not in plane.name:
                continue
            events = [ev for line in plane.lines if line.name.startswith("Stream") for ev in line.events]
            if events:
                first = min(ev.start_ns for ev in events)
                last = max(ev.start_ns + ev.duration_ns for ev in events)
                busy[plane.name.rsplit("/", 1)[-1]] = (sum(ev.duration_ns for ev in events), last - first)
            if plane.name.endswith("GPU:0"):
                for ev in events:
                    total[ev.name] += ev.duration_ns
        if not total:
            raise SystemExit("--kernels: no GPU kernels in the profiler trace (it reads GPU 0)")
        print(f"\n{name}: {sum(total.values()) / calls / 1e3:.1f} µs of kernels a call")
        for kernel, ns in total.most_common(8):
            print(f"  {ns / calls / 1e3:8.1f} µs  {kernel[:100]}")
        print("  in kernels: " + ", ".join(f"{gpu} {k / span:.0%} of {span / calls / 1e3:.1f} µs a call"
                                           for gpu, (k, span) in sorted(busy.items())))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=0,
                    help="rows of x, all devices together (default: 16384 a device, so that each device's "
                         "share stays far above L2 and a program's time is its kernels', not its launch)")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ar-rows", type=int, nargs="+", default=[8192],
                    help="rows of each device's partial sum (several: one all-reduce table each)")
    ap.add_argument("--ar-chain", type=int, default=0,
                    help="time all_reduce_rms_norm as N steps in one program, each step's y the next "
                         "step's partial sum (decode-time latency without a launch per call)")
    ap.add_argument("--devices", type=int, default=0, help="how many devices (default: all)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--pieces-only", action="store_true",
                    help="only the per-device kernel table (the slice is hidden / devices wide)")
    ap.add_argument("--all-reduce-only", action="store_true", help="only the all_reduce_rms_norm table")
    ap.add_argument("--add-only", action="store_true", help="only the residual add + norm table")
    ap.add_argument("--kernels", action="store_true",
                    help="only the device time of each kernel of the hidden layout's programs "
                         "(with --all-reduce-only --ar-chain N: of each chain too)")
    ap.add_argument("--k-local", type=int, default=1024,
                    help="each device's share of the contraction dim of the matmul before all_reduce_rms_norm")
    add_csv_arguments(ap)
    args = ap.parse_args()
    run(args)
    write_rows(csv_path(args, jax.devices()[0]), RECORDED, jax.devices()[0], "bench_dist.py", args.commit)


def run(args):

    devices = jax.devices()
    n = args.devices or len(devices)
    if n > len(devices) and not args.pieces_only:
        raise SystemExit(f"--devices {n}: only {len(devices)} visible")
    devices = devices[:n]
    M, H = args.rows or 16384 * n, args.hidden
    dt = jnp.bfloat16
    if args.pieces_only:
        print(f"{devices[0].device_kind} (one device; the slice one of {n} devices holds), "
              f"x = ({M}, {H}) {jnp.dtype(dt).name}, JAX {jax.__version__}")
    else:
        print(f"{n} x {devices[0].device_kind}, x = ({M}, {H}) {jnp.dtype(dt).name}, JAX {jax.__version__}")
    keys = jax.random.split(jax.random.key(0), 6)
    xs = [jax.random.normal(k, (M, H), jnp.float32).astype(dt) for k in keys[:2]]
    dys = [jax.random.normal(k, (M, H), jnp.float32).astype(dt) for k in keys[2:4]]
    g = (1.0 + 0.1 * jax.random.normal(keys[4], (H,), jnp.float32)).astype(dt)

    # One device's slice of the hidden layout.
    slice_args = (xs[0][:, :H // n], dys[0][:, :H // n], g[:H // n], H, args)
    if args.pieces_only:
        pieces(*slice_args)
        return
    if args.all_reduce_only:
        all_reduce_table(devices, dt, g, H, keys, args)
        return
    if args.add_only:
        add_table(devices, xs, dys, g, args)
        return

    ours = step(lambda x, g: jrn.rms_norm(x, g))
    xla = step(lambda x, g: jnp_rms(x, g))
    want = ours(xs[0], g, dys[0])  # unsharded, on one device

    # Forward (y and the saved statistic), backward (from the saved statistic,
    # as a training step runs it after the layers above), and both in one
    # program. In the last, XLA may fuse the forward's output pass with the
    # backward's row sums because dy is an input of the same program: a
    # training step cannot (dy comes from the layers above).
    ours_fb = (jax.jit(lambda x, g: jrn.rms_norm_fwd(x, g)),
               jax.jit(lambda dy, x, r, g: jrn.rms_norm_bwd(dy, x, r, g)))
    xla_fb = (jax.jit(jnp_rms_fwd), jax.jit(jnp_rms_bwd))
    want_fwd = ours_fb[0](xs[0], g)
    want_bwd = ours_fb[1](dys[0], xs[0], want_fwd[1], g)

    K = 128  # columns of the matmul after the norm in the layer_step rows
    w = (jax.random.normal(keys[5], (H, K), jnp.float32) / np.sqrt(H)).astype(dt)
    c = jax.random.normal(jax.random.fold_in(keys[5], 1), (M, K), jnp.float32)
    ours_layer, xla_layer = layer_step(lambda x, g: jrn.rms_norm(x, g)), layer_step(jnp_rms)
    want_layer = ours_layer(xs[0], g, w, c)

    if not args.kernels:
        print(TABLE_HEAD)
    for layout, shape, spec, put in layouts(devices):
        sets = [(put(x, spec), put(g, P(spec[1])), put(dy, spec)) for x, dy in zip(xs, dys)]
        rstd = put(want_fwd[1], P(spec[0]))
        parts = {
            "fwd": (ours_fb[0], xla_fb[0], [(x, g) for x, g, _ in sets], want_fwd),
            "bwd": (ours_fb[1], xla_fb[1], [(dy, x, rstd, g) for x, g, dy in sets], want_bwd),
            "fwd+bwd, one program": (ours, xla, sets, want),
            f"fwd+bwd with a matmul (x {K})": (
                ours_layer, xla_layer,
                [(x, g, put(w, P(spec[1], None)), put(c, P(spec[0], None))) for x, g, _ in sets], want_layer),
        }
        if args.kernels:
            if layout == "hidden":
                kernel_times({f"{layout} {part}, {name}": (fn, arg_sets[0])
                              for part, (f_ours, f_xla, arg_sets, _) in parts.items()
                              for name, fn in (("ours", f_ours), ("XLA", f_xla))})
            continue
        for part, (f_ours, f_xla, arg_sets, ref) in parts.items():
            table_row(f"{layout} {part}", shape, f_ours, f_xla, arg_sets, ref, args)

    if args.kernels:
        return
    pieces(*slice_args)
    add_table(devices, xs, dys, g, args)

    all_reduce_table(devices, dt, g, H, keys, args)


def all_reduce_table(devices, dt, g, H, keys, args):
    """all_reduce_rms_norm against psum + norm, each device holding a partial
    sum of the whole (R, H), for each R of --ar-rows: given as an input
    ("fwd", "fwd+bwd"), and made in the program by a row-parallel matmul
    (a @ w, the contraction dim split over the devices), as in a model
    ("matmul + fwd"). As an input, psum first copies it (an all-reduce works
    in place and may not overwrite a program input); the matmul's output it
    reduces where it lies. With --ar-chain N, only the latency of one step of
    N chained in one program (each step's y the next one's partial sum, as
    layers follow each other in a decode step)."""
    n = len(devices)
    mesh = jax.sharding.Mesh(np.asarray(devices), ("model",), axis_types=(AxisType.Auto,))
    variants = {
        "all_reduce_rms_norm (auto)": lambda p, g: jrn.all_reduce_rms_norm(p, g, axis_name="model"),
        "all_reduce_rms_norm (scatter)": lambda p, g: jrn.all_reduce_rms_norm(p, g, axis_name="model",
                                                                              method="scatter"),
        "psum + rms_norm": lambda p, g: jrn.rms_norm(jax.lax.psum(p, "model"), g),
        "psum + jnp norm": lambda p, g: jnp_rms(jax.lax.psum(p, "model"), g),
    }
    if devices[0].platform == "gpu":  # peer access: GPUs only
        variants["all_reduce_rms_norm (nvlink)"] = lambda p, g: jrn.all_reduce_rms_norm(
            p, g, axis_name="model", method="nvlink")
    gr = jax.device_put(g, NamedSharding(mesh, P()))

    def on_mesh(fn, nargs=2):
        return jax.shard_map(fn, mesh=mesh, in_specs=(P("model"),) * (nargs - 1) + (P(),), out_specs=P("model"))

    def chain(fn, steps):
        def run(p, g):
            for _ in range(steps):
                p = jax.lax.optimization_barrier(fn(p, g).astype(p.dtype))
            return p
        return jax.jit(on_mesh(run))

    shard = NamedSharding(mesh, P("model"))
    K = args.k_local
    for R in args.ar_rows:
        parts = [jax.device_put(jax.random.normal(k, (n * R, H), jnp.float32).astype(dt), shard) for k in keys[:2]]
        if args.ar_chain:
            print(f"\nall-reduce + RMSNorm over {n} devices, each holding a partial sum of shape ({R}, {H}): "
                  f"one step of {args.ar_chain} chained in one program")
            print("\n| op | rows a device | us a step |")
            print("|---|---|---|")
        else:  # the matmul's operands, and the table
            mk = jax.random.split(keys[5], 4)
            acts = [jax.device_put(jax.random.normal(k, (n * R, K), jnp.float32).astype(dt), shard) for k in mk[:2]]
            ws = [jax.device_put((jax.random.normal(k, (n * K, H), jnp.float32) / np.sqrt(n * K)).astype(dt), shard)
                  for k in mk[2:]]
            print(f"\nall-reduce + RMSNorm over {n} devices, each holding a partial sum of shape ({R}, {H}); "
                  f"matmul + fwd: that partial sum made as ({R}, {K}) @ ({K}, {H}) on each device")
            print("\n| op | fwd ms | fwd+bwd ms | matmul + fwd ms |")
            print("|---|---|---|---|")
        ref = ref_mm = None
        for name, fn in variants.items():
            fwd = jax.jit(on_mesh(fn))
            out = fwd(parts[0], gr)
            if ref is None:
                ref = out
            elif rel_err(out, ref) > 2e-2:
                raise SystemExit(f"{name} differs from all_reduce_rms_norm")
            if args.ar_chain:
                steps = chain(fn, args.ar_chain)
                t = bench(steps, [(p, gr) for p in parts], args.iters, args.reps, one_program=False)
                print(f"| {name} | {R} | {t / args.ar_chain * 1e6:.1f} |")
                if args.kernels:
                    kernel_times({f"{name}, {R} rows, {args.ar_chain} steps": (steps, (parts[0], gr))})
                continue
            both = jax.jit(on_mesh(lambda p, g, fn=fn: jax.grad(
                lambda p: jnp.sum(fn(p, g).astype(jnp.float32) ** 2))(p)))
            mm = jax.jit(on_mesh(lambda a, w, g, fn=fn: fn(a @ w, g), 3))
            out_mm = mm(acts[0], ws[0], gr)
            if ref_mm is None:
                ref_mm = out_mm
            elif rel_err(out_mm, ref_mm) > 2e-2:
                raise SystemExit(f"{name} after the matmul differs from all_reduce_rms_norm")
            t_f = bench(fwd, [(p, gr) for p in parts], args.iters, args.reps, one_program=False)
            t_b = bench(both, [(p, gr) for p in parts], args.iters, args.reps, one_program=False)
            t_m = bench(mm, [(a, w, gr) for a, w in zip(acts, ws)], args.iters, args.reps, one_program=False)
            print(f"| {name} | {t_f * 1e3:.3f} | {t_b * 1e3:.3f} | {t_m * 1e3:.3f} |")


if __name__ == "__main__":
    main()
