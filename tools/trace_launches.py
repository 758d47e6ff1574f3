"""Which kernels a grid of normalizations launches on this GPU, with their grids.

Runs each case once under JAX's profiler and records the library's kernel
launches (name, grid, block) in order, as JSON. Two builds' records compared
(`--compare OLD NEW`) say whether a change of the launch code changed routing;
with `--plans` each case's record is printed beside the plan describe_plan
gives (the plan's kernel must be the launch's).

    PYTHONPATH=old python tools/trace_launches.py --out old.json
    PYTHONPATH=new python tools/trace_launches.py --out new.json
    python tools/trace_launches.py --compare old.json new.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile

OURS = re.compile(r"(fwd_|bwd_|x_amax|x_quantize|x_stats|grad_stats|quantize_tiles|transpose|amax_to_scale_inv)")


def cases():
    """(kind, op, dtype, parameter dtype, shape, options): the plain norms at
    LLM and odd widths, decode-time and many rows; the fused ops at fewer."""
    widths = [1000, 1024, 2048, 4096, 4100, 5120, 8192, 12288, 16384, 32768, 65536, 262144]
    many = lambda h: max(1024, (1 << 24) // h)
    for kind in ("rms", "layer"):
        for dt, pdt in (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
                        ("float32", "float32")):
            for h in widths:
                for rows in (16, many(h)):
                    for op in ("fwd", "bwd"):
                        yield kind, op, dt, pdt, (rows, h), {}
        for h in (1024, 4096, 16384):
            for rows in (1, 200):
                for op in ("fwd", "bwd"):
                    yield kind, op, "bfloat16", "bfloat16", (rows, h), {}
        for dt, pdt, ws in (("bfloat16", "bfloat16", (1024, 4096, 5120, 16384, 65536)),
                            ("bfloat16", "float32", (4096, 16384))):
            for h in ws:
                for rows in ((16, many(h)) if pdt == dt else (many(h),)):
                    for op in ("fp8_tensor", "fp8_row", "fp8_group", "fp8_current", "add", "add_fp8_tensor", "apply"):
                        yield kind, op, dt, pdt, (rows, h), {}
        for h in (2048, 8192):
            yield kind, "fwd", "bfloat16", "bfloat16", (4, 1024, h), {"vmap_params": True}
            yield kind, "bwd", "bfloat16", "bfloat16", (4, 1024, h), {"vmap_params": True}


def build(kind, op, dt, pdt, shape, opts):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import jax_rmsnorm as jrn

    x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32).astype(dt)
    h = shape[-1]
    g = (1.0 + 0.1 * jax.random.normal(jax.random.PRNGKey(1), (h,), jnp.float32)).astype(pdt)
    b = (0.1 * jax.random.normal(jax.random.PRNGKey(2), (h,), jnp.float32)).astype(pdt)
    layer = kind == "layer"
    pb = (g, b) if layer else (g,)
    if opts.get("vmap_params"):
        n = shape[0]
        pb = tuple(jnp.broadcast_to(p, (n, h)) for p in pb)
    if op == "fwd":
        f = jrn.layer_norm if layer else jrn.rms_norm
        if opts.get("vmap_params"):
            return jax.jit(jax.vmap(f)), (x, *pb)
        return jax.jit(f), (x, *pb)
    if op == "bwd":
        f = jrn.layer_norm if layer else jrn.rms_norm
        if opts.get("vmap_params"):
            f = jax.vmap(f)
        fn = jax.jit(lambda x, *p: jax.vjp(f, x, *p)[1](jnp.ones(x.shape, x.dtype)))
        return fn, (x, *pb)
    if op.startswith("fp8_"):
        q = op[4:]
        name = {"tensor": "fp8", "row": "fp8_rowwise", "group": "fp8_groupwise", "current": "fp8_current"}[q]
        f = getattr(jrn, ("layer_norm_" if layer else "rms_norm_") + name)
        kw = {"scale": 0.5} if q == "tensor" else {"transpose": True} if q == "current" else {}
        try:
            return jax.jit(lambda x, *p: f(x, *p, **kw)), (x, *pb)
        except TypeError:
            kw.pop("transpose", None)
            return jax.jit(lambda x, *p: f(x, *p, **kw)), (x, *pb)
    if op in ("add", "add_fp8_tensor"):
        f = jrn.add_layer_norm if layer else jrn.add_rms_norm
        kw = {"quant": "tensor", "scale": 0.5} if op == "add_fp8_tensor" else {}
        r = jax.random.normal(jax.random.PRNGKey(3), shape, jnp.float32).astype(dt)
        if kw:
            f8 = jrn.layer_norm_fp8 if layer else jrn.rms_norm_fp8
            return jax.jit(lambda x, r, *p: f8(x, *p, scale=0.5, residual=r)), (x, r, *pb)
        return jax.jit(lambda x, r, *p: f(x, r, *p)), (x, r, *pb)
    if op == "apply":
        if layer:
            st = jrn.layer_norm_stats(x)
            return jax.jit(lambda x, s, *p: jrn.layer_norm_apply(x, s, *p, hidden_size=h)), (x, st, *pb)
        st = jrn.rms_norm_stats(x)
        return jax.jit(lambda x, s, *p: jrn.rms_norm_apply(x, s, *p, hidden_size=h)), (x, st, *pb)
    raise ValueError(op)


def kernel_stats(event):
    """(grid, block) from the kernel event's stats, where the profiler gives them."""
    grid = block = None
    for name, value in getattr(event, "stats", ()):
        text = str(value)
        m = re.search(r"grid:(\d+),(\d+),(\d+)", text)
        if m:
            grid = tuple(int(v) for v in m.groups())
        m = re.search(r"block:(\d+),(\d+),(\d+)", text)
        if m:
            block = tuple(int(v) for v in m.groups())
    return grid, block


def trace_all(calls):
    """{key: [(kernel, grid, block, name)]} for `calls` {key: (fn, args)}, each
    already compiled, run once in one profiler session; a kernel belongs to
    the case whose host annotation spans its start."""
    import jax
    from jax.profiler import ProfileData, TraceAnnotation

    if not calls:
        return {}
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        for key, (fn, args) in calls.items():
            with TraceAnnotation("case:" + key):
                jax.block_until_ready(fn(*args))
        jax.profiler.stop_trace()
        data = ProfileData.from_file(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)[0])
    spans, kernels = [], []
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                if plane.name.startswith("/host") and e.name.startswith("case:"):
                    spans.append((e.start_ns, e.end_ns, e.name[5:]))
                elif plane.name == "/device:GPU:0" and OURS.search(e.name):
                    grid, block = kernel_stats(e)
                    base = re.sub(r"<.*", "", re.sub(r"^(void\s+)?", "", e.name)).split("::")[-1]
                    kernels.append((e.start_ns, base, grid, block, e.name[:300]))
    spans.sort()
    out = {key: [] for key in calls}
    for k in sorted(kernels):
        for start, end, key in spans:
            if start <= k[0] <= end:
                out[key].append(k[1:])
                break
    return out


def _key(kind, op, dt, pdt, shape, opts):
    return f"{kind} {op} {dt}/{pdt} {'x'.join(map(str, shape))}" + (" vmap_params" if opts else "")


def run(path, show_plans):
    import jax
    from jax_rmsnorm import _ffi

    records, calls = {}, {}
    for case in cases():
        key = _key(*case)
        try:
            fn, args = build(*case)
            jax.block_until_ready(fn(*args))  # compile and warm
            calls[key] = (fn, args)
        except Exception as e:  # a case the build does not take: recorded as such
            records[key] = [("error", None, None, f"{type(e).__name__}: {str(e)[:200]}")]
        if len(calls) >= 64:  # bounded device memory
            records.update(trace_all(calls))
            calls = {}
    records.update(trace_all(calls))
    if show_plans:
        for kind, op, dt, pdt, shape, opts in cases():
            if op in ("fwd", "bwd") and not opts:
                key = _key(kind, op, dt, pdt, shape, opts)
                plan = _ffi.describe_plan(op, kind, shape, dt, param_dtype=pdt)
                print(key, "|", [r[:3] for r in records.get(key, [])], "|", plan)
    with open(path, "w") as f:
        json.dump(records, f, indent=0)
    print(f"{len(records)} cases written to {path}")


def compare(old_path, new_path):
    old, new = json.load(open(old_path)), json.load(open(new_path))
    same = differ = 0
    for key in sorted(set(old) | set(new)):
        o = [tuple(map(lambda v: tuple(v) if isinstance(v, list) else v, r[:3])) for r in old.get(key, [])]
        n = [tuple(map(lambda v: tuple(v) if isinstance(v, list) else v, r[:3])) for r in new.get(key, [])]
        if o == n:
            same += 1
        else:
            differ += 1
            print("DIFFERS", key)
            print("   old:", o)
            print("   new:", n)
    print(f"{same} cases launch the same kernels with the same grids, {differ} differ")
    return differ


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--plans", action="store_true")
    ap.add_argument("--compare", nargs=2)
    a = ap.parse_args()
    if a.compare:
        sys.exit(1 if compare(*a.compare) else 0)
    run(a.out, a.plans)
