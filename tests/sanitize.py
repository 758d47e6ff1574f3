"""Runs every CUDA kernel path once on small inputs and checks the results, for
compute-sanitizer (memcheck, racecheck). Run with the platform allocator so
each buffer is its own allocation and out-of-bounds accesses are caught:

    XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool memcheck python tests/sanitize.py

Arguments such as `2x40001 300x65536` run those shapes of the two lists below
alone; `--list` prints them all. tools/device_run.sh runs each shape in its
own process: compute-sanitizer (CUDA 13) itself crashed (SIGSEGV, no report) after
several hundred kernels in one process, at a different shape each time.
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn

# (rows, hidden): register kernels (aligned and not), streaming kernels (aligned
# and not), more rows than dgamma slots; rows of every offset from a 16-byte
# boundary (300x4097: fwd_unaligned, for the plain forward and per-tensor and
# per-row FP8, one CTA a row; 5x127: several rows a CTA). 203x136: current
# scaling's q_t from the byte-wise transpose, its 64 x 64 tiles cut in both
# directions (203 rows: no multiple of 4). 1x2048: the decode-time backward's
# one row, whose dgamma/dbeta its dx kernel writes (bwd_decode); 4x4096,
# 9x1000, 128x2048, 96x16384 (16 rows of threads a column CTA) and
# 128x16384 (CTAs of 512 threads, four packs a thread) take it with its
# column CTAs, which sum dgamma/dbeta through shared memory; 1x8192 and
# 8x16384 split each row across a cluster of 8 CTAs. The block-scaled
# outputs' columnwise copies take fwd_tiles at 128x2048 (clusters of two
# CTAs), 96x16384 (of sixteen) and 64x20480 (ten CTAs of 2048 columns, each
# holding two blocks of rows). 768x768: fwd_columns' tiles of groups of 96
# rows (whole groups short of 128) and of one group of 256.
SHAPES = [(3, 1), (5, 127), (9, 1000), (4, 4096), (3, 12288), (2, 40001), (2, 65536), (5000, 64), (300, 4097),
          (203, 136), (1, 2048), (128, 2048), (96, 16384), (128, 16384), (1, 8192), (8, 16384), (64, 20480),
          (768, 768)]
# The persistent kernels (bwd_slices, fwd_slices: wide rows, and FP8 outputs)
# with several rows per slot, so that each shared-memory stage is refilled and
# waited on again (bf16); at 16384 the backward's clusters fold their dgamma
# sums through distributed shared memory. At 65536, rows enough (two a SM on
# an H100) for the two-pass forward of the residual add (fwd_add_stats,
# fwd_apply), which also normalizes with given statistics.
# At 262144, clusters of 16 CTAs exchange each row's sums (ClusterPush) for
# several rows in turn. At 1024 (bf16), LayerNorm's per-tensor and per-group
# FP8 with parameters in x's dtype (gamma and beta held across rows) take CTAs
# of one warp, 32 a SM; at 1040 (groups of 16) a row leaves part of its CTA's
# threads without a pack.
# At 12288 a row takes one CTA of 384 threads, at 24576 a cluster of two
# (the row spread evenly over the CTAs, row_threads); at 12288 LayerNorm's
# plain forward takes one CTA of fwd_slices, and at 8200 and 12288 its
# backward (16-bit x) a cluster of two (slices of 513 and 512 packs at 8200);
# at 16392 and 24576 that backward takes a cluster of four (slices of 513
# and 512 packs at 16392). RMSNorm's backward takes one CTA of 192 threads
# with EARLY at 6144 and a cluster of two CTAs of 192 at 11264 (of 160 at
# 8200); at 24576 LayerNorm's plain forward in a cluster of two reads its
# parameters from L2, at 65536 (a cluster of four) it stages them. At 4097
# the backward takes bwd_unaligned, its slots walking rows of one offset from
# a 16-byte boundary (RMSNorm of 16-bit x four packs a thread); at 12290 one
# CTA of three packs a thread, at 14001 one of four; at 601 four packs a
# thread for both kinds (16-bit x), several rows a CTA; at 6001 LayerNorm
# three packs a thread in 256 threads.
MANY_ROWS = [(9000, 1024), (3000, 1040), (2000, 4096), (1100, 4097), (520, 12290), (520, 14001), (2000, 601), (800, 6001),
             (1000, 6144), (600, 8200), (500, 11264), (700, 12288), (600, 16384), (400, 16392), (300, 24576),
             (300, 65536), (64, 262144)]


def check(a, b, tol):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.isfinite(a).all()
    err = np.abs(a - b) - tol * (1.0 + np.abs(b))
    assert (err <= 0).all(), float(err.max())


def wide_rows(h):
    """The residual add + norm (dy as the residual) and the normalization with
    given statistics of whole rows (two passes for rows wider than one CTA)."""
    return [
        lambda x, r, g: jrn.add_rms_norm(x, r, g),
        lambda x, r, g: jrn.add_layer_norm(x, r, g, g),
        lambda x, r, g: (jrn.rms_norm_apply(x, jrn.rms_norm_stats(x), g, hidden_size=h),),
        lambda x, r, g: (jrn.layer_norm_apply(x, jrn.layer_norm_stats(x)[None], g, g, hidden_size=h),),
    ]


def fp8_outputs(h):
    """FP8 outputs without a residual (fwd_slices: per tensor from 256 packs a
    row, all of them for rows wider than one CTA): per tensor (also two
    tensors under vmap), current (RMSNorm, whose measuring pass is x_amax;
    LayerNorm, measured by x_amax at widths that are not a multiple of a
    pack; both with the transposed copy), per row, per group (RMSNorm's
    in fwd_slices from rows of one whole CTA: 16384 in bf16)."""
    calls = [
        lambda x, r, g: jrn.rms_norm_fp8(x, g, scale=20.0),
        lambda x, r, g: jax.vmap(lambda x: jrn.rms_norm_fp8(x, g, scale=20.0))(x.reshape(2, -1, h))
        if x.shape[0] % 2 == 0 else jrn.rms_norm_fp8(x, g, scale=20.0),
        lambda x, r, g: jrn.layer_norm_fp8_current(x, g, g),  # measured by x_amax at 4097, 127 (rows cut)
        lambda x, r, g: jrn.rms_norm_fp8_current(x, g),  # measured by x_amax (its rows cut at 16-byte boundaries at 4097, 127)
        lambda x, r, g: jrn.layer_norm_fp8_current(x, g, g, transpose=True),  # quantize_tiles where rows % 4 == 0 (4x4096, 5000x64: 4- and 8-byte stores of q_t)
        lambda x, r, g: jrn.rms_norm_fp8_current(x, g, transpose=True),
        lambda x, r, g: jrn.rms_norm_fp8_rowwise(x, g),
        lambda x, r, g: jrn.layer_norm_fp8_rowwise(x, g, g),  # its row max pushed after the sums
    ]
    groups = [gs for gs in (16, 128) if h % gs == 0]
    # Block-scaled, with the columnwise copy
    # (fwd_columns) where the rows are whole blocks.
    blocks = [lambda x, r, g: jrn.rms_norm_mxfp8(x, g, transpose=x.shape[0] % 32 == 0)] if h % 32 == 0 else []
    if h % 16 == 0:
        blocks.append(lambda x, r, g: jrn.rms_norm_nvfp4(x, g, global_scale=0.01, transpose=x.shape[0] % 16 == 0))
    return (calls + [lambda x, r, g, gs=gs: jrn.layer_norm_fp8_groupwise(x, g, g, group_size=gs) for gs in groups]
            + [lambda x, r, g, gs=gs: jrn.rms_norm_fp8_groupwise(x, g, group_size=gs) for gs in groups] + blocks)


def compare(calls, x, r, g, tol):
    """Each call on the GPU against this library's CPU kernels, with a
    tolerance by the output's dtype (FP8 and E2M1 codes, E8M0 scales: one
    step; a value at a rounding boundary may round either way)."""
    cpu = jax.devices("cpu")[0]
    on_cpu = lambda *a: [jax.device_put(v, cpu) for v in a]
    for f in calls:
        got, want = f(x, r, g), f(*on_cpu(x, r, g))
        for a, b in zip(got, want):
            t = {np.dtype(jnp.float8_e4m3fn): 0.13, np.dtype(jnp.float8_e5m2): 0.26,
                 np.dtype(jnp.float4_e2m1fn): 0.5, np.dtype(jnp.float8_e8m0fnu): 1.0,
                 np.dtype(jnp.float32): max(tol, 1e-4)}.get(np.dtype(a.dtype), 3e-2)
            check(a.astype(jnp.float32), b.astype(jnp.float32), t)


def block_scaled(x, r, g):
    """The block-scaled outputs fp8_outputs leaves out (LayerNorm's, and both
    with a residual), with the columnwise copy where the rows are whole
    blocks: run for the sanitizers alone (tests/test_block_scaled.py checks
    their values)."""
    m, h = x.shape
    calls = []
    if h % 32 == 0:
        calls += [lambda: jrn.layer_norm_mxfp8(x, g, g, transpose=m % 32 == 0),
                  lambda: jrn.rms_norm_mxfp8(x, g, residual=r, transpose=m % 32 == 0),
                  lambda: jrn.layer_norm_mxfp8(x, g, g, residual=r)]
    if h % 16 == 0:
        calls += [lambda: jrn.layer_norm_nvfp4(x, g, g, global_scale=0.01, transpose=m % 16 == 0),
                  lambda: jrn.rms_norm_nvfp4(x, g, global_scale=0.01, residual=r)]
    for gs in (96, 256):  # fwd_columns: groups that 128 rows do not hold
        if h % gs == 0 and m % gs == 0:
            calls.append(lambda gs=gs: jrn.rms_norm_fp8_groupwise(x, g, group_size=gs, transpose=True))
    for f in calls:
        jax.block_until_ready(f())


def fused(x, r, g, tol):
    """The fused variants (residual add, FP8 per tensor / current / row / group
    with a residual and without; FP8 input for bf16 x), GPU against this
    library's CPU kernels (FP8 within one FP8 step), and the fused add's
    gradient."""
    h = x.shape[-1]
    calls = [
        lambda x, r, g: jrn.add_layer_norm(x, r, g, g, h_dtype=jnp.float32),
        lambda x, r, g: jrn.rms_norm_fp8(x, g, scale=20.0, residual=r),
        lambda x, r, g: jrn.layer_norm_fp8_current(x, g, g, residual=r),
        lambda x, r, g: jrn.rms_norm_fp8_rowwise(x, g, residual=r),
    ] + [lambda x, r, g, gs=gs: jrn.layer_norm_fp8_groupwise(x, g, g, group_size=gs, residual=r)
         for gs in (16, 128, 24) if h % gs == 0]
    if x.dtype == jnp.bfloat16:
        # FP8 input: per tensor, per group of 16 (the raw-code kernel where the
        # row fits), with a residual (the general kernels), groups of 3 (scalar loads)
        q = (x.astype(jnp.float32) * 16).astype(jnp.float8_e4m3fn)
        on = lambda a, like: jax.device_put(a, next(iter(like.devices())))  # where x is
        calls.append(lambda x, r, g: [jrn.layer_norm(on(q, x), g, g, x_scale=0.0625, dtype=jnp.float32)])
        for gs in (16, 3):
            if h % gs == 0:
                s = jnp.full(x.shape[:-1] + (h // gs,), 0.0625, jnp.float32)
                calls.append(lambda x, r, g, gs=gs, s=s: [jrn.rms_norm(on(q, x), g, x_scale=on(s, x), group_size=gs)])
                calls.append(lambda x, r, g, gs=gs, s=s: jrn.add_rms_norm(on(q, x), r, g, x_scale=on(s, x),
                                                                          group_size=gs))
    compare(calls + fp8_outputs(h), x, r, g, tol)
    block_scaled(x, r, g)
    cpu = jax.devices("cpu")[0]
    on_cpu = lambda *a: [jax.device_put(v, cpu) for v in a]
    loss = lambda x, r, g: sum(jnp.sum(v.astype(jnp.float32)) for v in jrn.add_rms_norm(x, r, g))
    for a, b in zip(jax.grad(loss, (0, 1, 2))(x, r, g), jax.grad(loss, (0, 1, 2))(*on_cpu(x, r, g))):
        check(a, b, tol)


def main():
    assert jax.devices()[0].platform == "gpu", "needs a GPU"
    if sys.argv[1:]:
        chosen = {tuple(int(v) for v in a.split("x")) for a in sys.argv[1:]}
        assert chosen <= set(SHAPES + MANY_ROWS), f"unknown shapes {chosen - set(SHAPES + MANY_ROWS)}"
        SHAPES[:] = [s for s in SHAPES if s in chosen]
        MANY_ROWS[:] = [s for s in MANY_ROWS if s in chosen]
    for m, h in SHAPES:
        for dt in (jnp.bfloat16, jnp.float32):
            k = jax.random.split(jax.random.key(m + h), 3)
            x = jax.random.normal(k[0], (m, h), jnp.float32).astype(dt)
            dy = jax.random.normal(k[1], (m, h), jnp.float32).astype(dt)
            g = (1 + 0.1 * jax.random.normal(k[2], (h,))).astype(jnp.float32)
            tol = 3e-2 if dt == jnp.bfloat16 else 1e-4
            for kind in ("rms", "layer"):
                f = (lambda x, g: jrn.rms_norm(x, g)) if kind == "rms" else (lambda x, g: jrn.layer_norm(x, g, g))
                y, vjp = jax.vjp(f, x, g)
                yc, vjpc = jax.vjp(f, jax.device_put(x, jax.devices("cpu")[0]), jax.device_put(g, jax.devices("cpu")[0]))
                check(y, yc, tol)
                for a, b in zip(vjp(dy), vjpc(jax.device_put(dy, jax.devices("cpu")[0]))):
                    check(a, b, tol)
            # distributed building blocks: slice statistics, forward with given
            # statistics, backward with given row coefficients
            cpu = jax.devices("cpu")[0]
            for kind in ("rms", "layer"):
                def split(x, g, kind=kind):
                    xs = jnp.split(x, 2, -1) if h % 2 == 0 else [x]
                    gs = jnp.split(g, 2) if h % 2 == 0 else [g]
                    if kind == "rms":
                        total = sum(jrn.rms_norm_stats(s) for s in xs)
                        ys = [jrn.rms_norm_apply(s, total, gg, hidden_size=h) for s, gg in zip(xs, gs)]
                    else:
                        st = jnp.stack([jrn.layer_norm_stats(s) for s in xs])
                        ys = [jrn.layer_norm_apply(s, st, gg, gg, hidden_size=h) for s, gg in zip(xs, gs)]
                    return jnp.concatenate(ys, -1)
                y, vjp = jax.vjp(split, x, g)
                yc, vjpc = jax.vjp(split, jax.device_put(x, cpu), jax.device_put(g, cpu))
                check(y, yc, tol)
                for a, b in zip(vjp(dy), vjpc(jax.device_put(dy, cpu))):
                    check(a, b, tol)
            # per-example parameters (parameter groups) under vmap
            xs = x[: (m // 2) * 2].reshape(2, m // 2, h) if m >= 2 else x[None]
            gs = jnp.stack([g] * xs.shape[0])
            jax.block_until_ready(jax.vmap(jax.grad(lambda x, g: jrn.rms_norm(x, g).astype(jnp.float32).sum(), (0, 1)))(xs, gs))
            fused(x, dy, g, tol)
        print(f"ok {m}x{h}", flush=True)
    for m, h in MANY_ROWS:
        k = jax.random.split(jax.random.key(m + h), 3)
        x, dy = (jax.random.normal(kk, (m, h), jnp.float32).astype(jnp.bfloat16) for kk in k[:2])
        g = (1 + 0.1 * jax.random.normal(k[2], (h,))).astype(jnp.float32)
        cpu = jax.devices("cpu")[0]
        for f in (lambda x, g: jrn.rms_norm(x, g), lambda x, g: jrn.layer_norm(x, g, g)):
            y, vjp = jax.vjp(f, x, g)
            yc, vjpc = jax.vjp(f, jax.device_put(x, cpu), jax.device_put(g, cpu))
            check(y, yc, 3e-2)
            for a, b in zip(vjp(dy), vjpc(jax.device_put(dy, cpu))):
                check(a, b, 3e-2)
        compare(fp8_outputs(h), x, dy, g, 3e-2)
        # bf16 parameters: LayerNorm's per-tensor and per-group FP8 (held in
        # registers where one CTA takes the row) and, across a cluster, its plain
        # forward (gamma and beta staged in shared memory)
        compare([lambda x, r, g: jrn.layer_norm_fp8(x, g, g, scale=20.0),
                 lambda x, r, g: jrn.layer_norm_fp8_current(x, g, g),
                 lambda x, r, g: (jrn.layer_norm(x, g, g),)]
                + [lambda x, r, g, gs=gs: jrn.layer_norm_fp8_groupwise(x, g, g, group_size=gs)
                   for gs in (16, 128) if h % gs == 0], x, dy, g.astype(jnp.bfloat16), 3e-2)
        compare(wide_rows(h), x, dy, g, 3e-2)
        print(f"ok {m}x{h} (many rows per slot)", flush=True)
    print("sanitize run: all paths ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print(" ".join(f"{m}x{h}" for m, h in SHAPES + MANY_ROWS))
    else:
        main()
