"""Forward and backward values against the float64 NumPy reference, on every
platform present, for every dtype, shape family and parameter option."""

import pathlib

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from reference import (DTYPES, assert_close, bwd_decode_bounds, case_key, decode_bounds, decode_hidden, f64,
                       gpu_routing_case, poison, put, random, ref_add, ref_backward, ref_forward, run_script)

# Rank 1 to 4; hidden 1, 7, 127, 1000, 4096, 12288; many rows (several rows per
# dgamma slot); wide rows that take the streaming kernels (65536, 262144, and
# an unaligned 40001).
SHAPES = [(7,), (3, 1), (5, 127), (2, 3, 4, 1000), (16, 4096), (4, 12288), (10000, 64),
          (3, 40001), (2, 65536), (1, 262144)]
KINDS = ["rms", "layer"]
EPS = {"rms": 1e-6, "layer": 1e-5}


def _variants(kind, dtype):
    """(gamma dtype or None, zero_centered, with_beta) combinations to run."""
    out = [(dtype, False, True), (dtype, True, False), (None, False, False)]
    if dtype != jnp.float32:
        out.append((jnp.float32, False, True))  # mixed precision: float32 params
    if kind == "rms":
        out = [(g, zc, False) for g, zc, _ in out]
    else:
        out.append((None, False, True))  # shift without scale
    return out


def _run(kind, platform, x, gamma, beta, dy, zc):
    eps = EPS[kind]
    x, gamma, beta, dy = put(platform, x, gamma, beta, dy)
    poison(platform, 4 * x.size + 1024)
    if kind == "rms":
        fwd = jax.jit(lambda x, g: jrn.rms_norm_fwd(x, g, eps=eps, zero_centered_gamma=zc))
        y, rstd = fwd(x, gamma)
        mean = None
        loss = lambda x, g, b: jnp.sum(jrn.rms_norm(x, g, eps=eps, zero_centered_gamma=zc).astype(jnp.float32) * dy.astype(jnp.float32))
    else:
        fwd = jax.jit(lambda x, g, b: jrn.layer_norm_fwd(x, g, b, eps=eps, zero_centered_gamma=zc))
        y, mean, rstd = fwd(x, gamma, beta)
        loss = lambda x, g, b: jnp.sum(jrn.layer_norm(x, g, b, eps=eps, zero_centered_gamma=zc).astype(jnp.float32) * dy.astype(jnp.float32))
    poison(platform, 4 * x.size + 1024)
    argnums = tuple(i for i, a in enumerate((x, gamma, beta)) if a is not None)
    grads = jax.jit(jax.grad(loss, argnums=argnums))(x, gamma, beta)
    return y, mean, rstd, dict(zip(argnums, grads))


def _check(kind, dtype, shape, platform, gdtype, zc, with_beta, key):
    """Forward, statistics and gradients of one configuration against float64."""
    hidden = shape[-1]
    x = random(key, shape, dtype, scale=2.0, offset=0.5)
    dy = random(key + 1, shape, dtype)
    gamma = None if gdtype is None else random(key + 2, (hidden,), gdtype, scale=0.5, offset=1.0 if not zc else 0.0)
    beta = random(key + 3, (hidden,), gdtype or dtype, scale=0.5) if with_beta else None
    y, mean, rstd, grads = _run(kind, platform, x, gamma, beta, dy, zc)

    what = f"{kind} {np.dtype(dtype).name} {shape} gamma={gdtype and np.dtype(gdtype).name} zc={zc} beta={with_beta}"
    y_ref, mean_ref, rstd_ref = ref_forward(kind, x, gamma, beta, EPS[kind], zc)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close(y, y_ref, dtype, what + " y")
    assert rstd.dtype == jnp.float32 and rstd.shape == shape[:-1]
    assert_close(rstd, rstd_ref, jnp.float32, what + " rstd", scale=1e-3 * max(1.0, rstd_ref.max()))
    if kind == "layer":
        assert_close(mean, mean_ref, jnp.float32, what + " mean", scale=0.1 * max(1.0, float(np.abs(f64(x)).max())))

    dx_ref, dg_ref, db_ref = ref_backward(kind, dy, x, gamma, EPS[kind], zc)
    assert grads[0].dtype == x.dtype
    assert_close(grads[0], dx_ref, dtype, what + " dx")
    rows = int(np.prod(shape[:-1]))
    if gamma is not None:
        assert grads[1].dtype == gamma.dtype
        assert_close(grads[1], dg_ref, gamma.dtype, what + " dgamma",
                     scale=max(1.0, np.abs(dg_ref).max(), np.sqrt(rows)))
    if beta is not None:
        assert grads[2].dtype == beta.dtype
        assert_close(grads[2], db_ref, beta.dtype, what + " dbeta",
                     scale=max(1.0, np.abs(db_ref).max(), np.sqrt(rows)))


def _check_variants(kind, dtype, shape, platform, key):
    """_check of every _variants configuration, case keys key + (i,)."""
    for i, (gdtype, zc, with_beta) in enumerate(_variants(kind, dtype)):
        _check(kind, dtype, shape, platform, gdtype, zc, with_beta, case_key(key + (i,)))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_backward(kind, dtype, shape, platform):
    _check_variants(kind, dtype, shape, platform, (kind, shape))


# On a GPU the plain forward of at most two rows per SM, rows of up to 2048
# packs of 16 bytes, takes its own kernel (fwd_decode); one row more, or one
# pack more, takes the general one. So does the backward of at most 192 rows
# (128 of at most 128 packs: bwd_decode), which at one row writes
# dgamma/dbeta itself and at more sums them in further CTAs of the same
# launch. Both sides of each bound (decode_bounds, bwd_decode_bounds), every
# dtype and parameter variant.
@pytest.mark.parametrize("rows, packs", decode_bounds() + bwd_decode_bounds(), ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_decode_row_bounds(kind, dtype, rows, packs, platform):
    hidden = decode_hidden(packs, dtype)
    _check_variants(kind, dtype, (rows, hidden), platform, (kind, rows, hidden))


# On a GPU LayerNorm's plain forward of 16-bit x with float32 parameters, in
# rows of exactly 64 or 128 threads (hidden 1032-2048 and 3080-4096 in packs
# of 8), takes an instance of its own (one-pass statistics, CTAs of 128);
# 1024, 3072 and 4104 lie just outside it. Where there are more than two rows
# an SM, its rows of more than 256 threads (hidden 8200 and up) take the
# kernel that stages x in shared memory (fwd_slices), and so do rows of 256
# (8192) with plain gamma and beta; those plain ones stage gamma and beta as
# floats too, in clusters twice the natural size (kSliceStagedP32: 2 CTAs a
# row at 8192-16384, 4 at 24576, 8 at 65536, 16 at 131072).
# gamma and beta, zero-centred gamma and beta, gamma alone; enough rows for
# many CTAs.
@pytest.mark.parametrize("hidden", [1024, 1032, 2048, 3072, 3080, 3584, 4096, 4104, 8192, 8200, 10240, 12288, 16384,
                                    24576, 65536, 131072])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("platform", ["gpu"])
def test_layer_float32_params_paths(dtype, hidden, platform):
    forms = [(jnp.float32, False, True), (jnp.float32, True, True), (jnp.float32, False, False)]
    for i, (gdtype, zc, with_beta) in enumerate(forms):
        _check("layer", dtype, (300, hidden), platform, gdtype, zc, with_beta,
               case_key(("p32", hidden, np.dtype(dtype).name, i)))


# Decode-time forwards back to back in one program, each reading the y that
# the kernel before it has just written: ours after ours, and ours after XLA's
# |y| (exact in every dtype). With the residual add, each step also reads the
# h of the step before (the residual stream of a stack of blocks). On compute
# capability 9.0 and newer fwd_decode is launched to start while the kernel
# before it finishes (programmatic dependent launch) and must wait for that
# kernel's writes. Each step is checked against the float64 reference applied
# to the previous step's outputs as the device returned them.
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "add"])
@pytest.mark.parametrize("shape", [(16, 4096), (64, 8192), (1, 2048)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_chained_decode(kind, dtype, shape, residual, platform):
    steps, hidden = 8, shape[-1]
    key = case_key((kind, dtype, shape, residual))
    x = random(key, shape, dtype)
    r = random(key + 3, shape, dtype)
    gamma = random(key + 1, (hidden,), dtype, 0.1, 1.0)
    beta = random(key + 2, (hidden,), dtype, 0.1) if kind == "layer" else None
    x, r, gamma, beta = put(platform, x, r, gamma, beta)
    eps = EPS[kind]
    if residual:
        step = ((lambda v, h: jrn.add_rms_norm(v, h, gamma, eps=eps)) if kind == "rms" else
                (lambda v, h: jrn.add_layer_norm(v, h, gamma, beta, eps=eps)))
    else:
        norm = ((lambda v: jrn.rms_norm(v, gamma, eps=eps)) if kind == "rms" else
                (lambda v: jrn.layer_norm(v, gamma, beta, eps=eps)))
        step = lambda v, h: (norm(v), h)

    @jax.jit
    def chain(v, h):
        outs = [(v, h)]
        for i in range(steps):
            v, h = outs[-1]
            outs.append(step(jnp.abs(v) if i % 2 else v, h))
        return outs

    poison(platform, 8 * x.size * (steps + 1) + 1024)
    outs = chain(x, r)
    for i in range(steps):
        v, h = outs[i]
        v = jnp.abs(v) if i % 2 else v
        if residual:
            h_want = ref_add(v, h, dtype)
            assert_close(outs[i + 1][1], f64(h_want), dtype, f"{kind} h, step {i + 1} of {steps}")
            v = h_want
        want = ref_forward(kind, f64(v), f64(gamma), f64(beta), eps=eps)[0]
        assert_close(outs[i + 1][0], want, dtype, f"{kind} y, step {i + 1} of {steps}")


# Decode-time backwards back to back in one program, each step's dy the dx
# the step before wrote (every other step through XLA's |dx| first). On a GPU
# these take bwd_decode, launched early: it waits for the step before, and
# the next step must see the whole dx. At 16, 96 and 128 rows dgamma/dbeta
# come from the launch's column CTAs, beside the rows' (96x16384: 16 rows of
# threads a column CTA; 128x16384: CTAs of 512 threads, four packs a thread);
# at one row the row's CTA writes them itself.
# Each step is checked against the float64 reference applied to the previous
# step's dx as the device returned it.
@pytest.mark.parametrize("shape", [(16, 4096), (128, 8192), (96, 16384), (128, 16384), (1, 2048)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
def test_chained_backward(kind, dtype, shape, platform):
    steps, hidden = 8, shape[-1]
    key = case_key((kind, dtype, shape, "bwd chain"))
    x = random(key, shape, dtype)
    dy = random(key + 1, shape, dtype)
    gamma = random(key + 2, (hidden,), dtype, 0.1, 0.4)  # dx shrinks a little each step (no float16 overflow)
    x, dy, gamma = put(platform, x, dy, gamma)
    eps = EPS[kind]
    if kind == "rms":
        _, rstd = jrn.rms_norm_fwd(x, gamma, eps=eps)
        step = lambda d: jrn.rms_norm_bwd(d, x, rstd, gamma)
    else:
        _, mean, rstd = jrn.layer_norm_fwd(x, gamma, eps=eps)
        step = lambda d: jrn.layer_norm_bwd(d, x, mean, rstd, gamma)

    @jax.jit
    def chain(d):
        outs = [(d,)]
        for i in range(steps):
            d = outs[-1][0]
            outs.append(step(jnp.abs(d) if i % 2 else d))
        return outs

    poison(platform, 8 * x.size * (steps + 1) + 1024)
    outs = chain(dy)
    for i in range(steps):
        d = outs[i][0]
        d = jnp.abs(d) if i % 2 else d
        dx, dg, db = ref_backward(kind, f64(d), x, gamma, eps=eps)
        assert_close(outs[i + 1][0], dx, dtype, f"{kind} dx, step {i + 1} of {steps}")
        assert_close(outs[i + 1][1], dg, dtype, f"{kind} dgamma, step {i + 1} of {steps}")
        if kind == "layer":
            assert_close(outs[i + 1][2], db, dtype, f"{kind} dbeta, step {i + 1} of {steps}")


# On a GPU the plain forward of widths that are not a multiple of a 16-byte
# pack takes fwd_unaligned: each row starts at its own offset from a 16-byte
# boundary, its first and last elements taken one by one and the rest in
# packs, several rows a CTA where rows are narrow. Rows of more than 4096
# packs take the streaming kernel: 32767 and 32769 (16-bit x), 16383 and
# 16385 (float32) lie on both sides of that bound.
UNALIGNED = [(300, 9), (257, 13), (600, 127), (300, 1001), (200, 4097), (100, 4100), (50, 12290), (30, 16383),
             (20, 16385), (12, 32767), (10, 32769)]


# The backward at those widths takes bwd_unaligned, in one CTA a row (or
# several rows) with whole 16-byte packs between a row's head and tail
# elements (widths on both sides of each bound in brackets):
# - two packs a thread up to 1024 packs (8199 elements of 16-bit x, 4099 of
#   float32: 8193 / 8201, 4097 / 4101);
# - 16-bit x: four packs a thread from 64 packs (511 / 513), LayerNorm only
#   up to 96 (775 / 777), and LayerNorm three at 641-768 (5127 / 5129,
#   6149 / 6153);
# - three packs up to 1536 (12295 / 12297, float32 6147 / 6149), four up to
#   2048 (16391, 8195; LayerNorm up to 1792: 14343 / 14345);
# - then a cluster of 2 or 4 on sm_90 up to 4096 packs (32775 of 16-bit x and
#   16385 of float32 the last), and float32's 16389 takes the streaming kernel.
# Persistent slots sum dgamma/dbeta, each walking rows of one offset from a
# 16-byte boundary (rows 8 apart at odd widths, 4 at 1002 and 12290, 2 at 4100
# in 16-bit x). Groups of more than 512 rows get that workspace (smaller ones
# sum dgamma column by column, as UNALIGNED's shapes do).
UNALIGNED_MANY_ROWS = [(3000, 127), (3000, 511), (3000, 513), (2000, 775), (2000, 777), (1500, 1001),
                       (1500, 1002), (1100, 4097), (1000, 4100), (900, 4101), (800, 5127), (800, 5129),
                       (800, 6149), (800, 6153), (600, 8191), (600, 8193), (600, 8201), (520, 12290),
                       (520, 12295), (520, 12297), (520, 14343), (520, 14345), (520, 16385), (520, 16389),
                       (520, 32775)]


@pytest.mark.parametrize("shape", UNALIGNED + UNALIGNED_MANY_ROWS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_unaligned_widths(kind, dtype, shape, platform):
    _check_variants(kind, dtype, shape, platform, (kind, "unaligned") + shape)


# A kernel's opt-in shared-memory limit must survive a launch of the same
# kernel with less: tests/launch_order.py, in a process of its own.
@pytest.mark.parametrize("platform", ["gpu"])
def test_shared_memory_limit_order(platform):
    out = run_script(pathlib.Path(__file__).with_name("launch_order.py"))
    assert out.count("ok") == 6, out


# On a GPU the wide-row kernels are persistent: each CTA (or cluster) walks
# several rows through a two-stage shared-memory ring. These shapes have more
# rows than the GPU holds such slots at once (several rows per slot), so every
# stage and barrier phase is reused; SHAPES above has too few rows for that.
# At 20480 and 49152 a cluster's CTAs hold slices of 320 and 384 threads'
# packs (the row spread evenly over them, row_threads; in bf16 the plain
# forward takes fwd_slices above hidden 16384, RMSNorm's at 20480). At
# 3072 and 5120 (bf16) fwd_regs takes CTAs of two rows of 96 threads and of
# one row of 160, and the backward one CTA of 96 or 160 threads a row. At
# 8200 and 12288 (bf16) LayerNorm's backward takes a cluster of two a row
# (at 8200 slices of 513 and 512 packs), and at 12288 its plain forward one
# CTA of fwd_slices. At 16392 and 20480 (bf16) that backward takes a cluster
# of four a row (at 16392 slices of 513 and 512 packs). RMSNorm's backward
# (16-bit x) takes one CTA of 192 threads with EARLY at 6144, a cluster of
# two CTAs of 160 threads at 8200 and of 192 with EARLY at 11264. At 20480
# LayerNorm's plain forward reads its parameters from L2 in a cluster of two
# (staged in shared memory from clusters of four: 49152, 65536).
MANY_ROWS = [(3000, 1024), (2000, 3072), (3000, 4096), (1000, 5120), (1000, 6144), (1200, 8192), (600, 8200),
             (500, 11264), (800, 12288), (400, 16384), (500, 16392), (400, 20480), (300, 49152), (500, 65536),
             (72, 262144)]


@pytest.mark.parametrize("shape", MANY_ROWS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_many_rows_per_slot(kind, dtype, shape, platform):
    _check(kind, dtype, shape, platform, dtype, False, kind == "layer", case_key((kind, shape)))


# Every parameter variant (zero-centred, no beta, no gamma, float32
# parameters) where LayerNorm's plain forward takes one CTA of fwd_slices a
# row and its backward a cluster of two (bf16 and float16 x at 12288), and
# where its backward takes a cluster of four (20480), with more rows than
# CTAs resident: those launches' general, non-plain loops.
@pytest.mark.parametrize("shape", [(400, 12288), (300, 20480)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_many_rows_param_variants(kind, dtype, shape, platform):
    _check_variants(kind, dtype, shape, platform, ("variants", kind, shape))


# Rows of a cluster's walk whose sums differ by orders of magnitude: each
# row is scaled by 2^-5 .. 2^5 and, within it, each 16384-column block (one
# CTA's slice of a bf16 row in fwd_slices / bwd_slices) by 1, 2 or 3, drawn
# per row and block. A CTA that took a partial sum of another row, or of a
# stale exchange buffer, would be off by a large factor, not by sampling
# noise as with rows drawn alike.
@pytest.mark.parametrize("shape", [(500, 65536), (72, 262144)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", KINDS)
def test_rows_of_unlike_scales(kind, shape, platform):
    # The CPU's one kernel has no clusters nor CTA slices: its rows' independence
    # is in every other test.
    gpu_routing_case(platform, shape, [])
    rows, hidden = shape
    key = case_key(("unlike", kind, shape))
    # Drawn, not a pattern in the row index: a cluster walks rows a fixed
    # stride apart (the number of clusters), which a pattern could match.
    rng = np.random.default_rng(key)
    row_scale = 2.0 ** rng.integers(-5, 6, size=rows)
    block_scale = 1.0 + rng.integers(0, 3, size=(rows, -(-hidden // 16384)))
    scale = row_scale[:, None] * np.repeat(block_scale, 16384, axis=1)[:, :hidden]
    x = (f64(random(key, shape, jnp.float32)) * scale).astype(np.float32)
    x = jnp.asarray(x, jnp.bfloat16)
    dy = random(key + 1, shape, jnp.bfloat16)
    gamma = random(key + 2, (hidden,), jnp.bfloat16, scale=0.5, offset=1.0)
    beta = random(key + 3, (hidden,), jnp.bfloat16, scale=0.5) if kind == "layer" else None
    y, _, rstd, grads = _run(kind, platform, x, gamma, beta, dy, False)
    y_ref, _, rstd_ref = ref_forward(kind, x, gamma, beta, EPS[kind])
    assert_close(y, y_ref, jnp.bfloat16, f"{kind} {shape} y")
    # rstd spans 2^10 over the rows: compared row by row, relative.
    r, want = f64(rstd), rstd_ref
    assert np.isfinite(r).all() and np.allclose(r, want, rtol=1e-3, atol=0), np.abs(r / want - 1).max()
    # dx scales with rstd: each row divided by its rstd, then compared.
    dx_ref, _, _ = ref_backward(kind, dy, x, gamma, EPS[kind])
    assert_close(f64(grads[0]) / want[:, None], dx_ref / want[:, None], jnp.bfloat16, f"{kind} {shape} dx / rstd")


# The CUDA backward sums dgamma/dbeta one of two ways: small groups (at most
# plan_limits()'s column_rows rows and column_elems elements) in a column kernel straight
# from x and dy, larger ones through per-slot partial rows. Each shape here
# runs both ways, one kernel family per shape (registers, staged slices, a
# cluster, streamed, unaligned), with row counts that leave the column
# kernel's loops a partial tail.
BOTH_PATHS = [(300, 1024), (300, 8192), (100, 65536), (20, 262144), (40, 40001), (300, 127), (7, 3, 4096)]


@pytest.mark.parametrize("shape", BOTH_PATHS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("path", ["columns", "slots"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_dgamma_both_paths(kind, path, shape, platform, monkeypatch):
    from jax_rmsnorm import _ffi
    slots = _ffi.cuda_slots
    # Columns: no workspace; slots: the workspace of a group too large for
    # the columns (the plan's slot count for more rows, cut to these).
    forced = (lambda k, d, r, h, o: 0) if path == "columns" else (
        lambda k, d, r, h, o: min(slots(k, d, 1 << 20, h, o), max(r, 1)) if o else 0)
    monkeypatch.setattr(_ffi, "cuda_slots", forced)
    jax.clear_caches()
    try:
        for dtype, zc in ((jnp.bfloat16, False), (jnp.float32, True)):
            if path == "columns" and kind == "layer" and dtype == jnp.float32:
                continue  # float32 LayerNorm always takes slots (test_dgamma_path_choice)
            _check(kind, dtype, shape, platform, jnp.float32 if zc else dtype, zc, kind == "layer",
                   case_key((kind, shape, zc)))
    finally:
        jax.clear_caches()


def test_dgamma_path_choice():
    # Decode-time groups take the column kernel; a group as large as L2 or
    # larger takes slots (512 x 262144 read x and dy twice from DRAM).
    from jax_rmsnorm._ffi import cuda_slots
    assert cuda_slots("rms", jnp.bfloat16, 16, 4096, 1) == 0
    assert cuda_slots("layer", jnp.bfloat16, 512, 8192, 2) == 0
    assert cuda_slots("rms", jnp.float32, 512, 8192, 1) == 0
    assert cuda_slots("rms", jnp.bfloat16, 512, 262144, 1) > 0
    assert cuda_slots("rms", jnp.bfloat16, 513, 1024, 1) > 0
    assert cuda_slots("rms", jnp.bfloat16, 4096, 4096, 0) == 0  # no parameter gradient wanted
    # float32 LayerNorm centres each row in the dx kernels, which the column
    # sums cannot: slots at every size.
    assert cuda_slots("layer", jnp.float32, 1, 4096, 2) == 1
    assert cuda_slots("layer", jnp.float32, 16, 4096, 1) == 16
    assert cuda_slots("layer", jnp.float32, 16, 4096, 0) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_explicit_bwd_matches_grad(kind, platform):
    x = random(1, (6, 33), jnp.bfloat16)
    dy = random(2, (6, 33), jnp.bfloat16)
    gamma = random(3, (33,), jnp.float32, offset=1.0)
    x, dy, gamma = put(platform, x, dy, gamma)
    if kind == "rms":
        y, rstd = jrn.rms_norm_fwd(x, gamma)
        dx, dg = jrn.rms_norm_bwd(dy, x, rstd, gamma)
        _, vjp = jax.vjp(lambda x, g: jrn.rms_norm(x, g), x, gamma)
    else:
        y, mean, rstd = jrn.layer_norm_fwd(x, gamma)
        dx, dg, db = jrn.layer_norm_bwd(dy, x, mean, rstd, gamma)
        _, vjp = jax.vjp(lambda x, g: jrn.layer_norm(x, g), x, gamma)
        np.testing.assert_allclose(np.asarray(db), np.asarray(dy, np.float32).sum(0), rtol=1e-5, atol=1e-5)
    ex, eg = vjp(dy)
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(ex, np.float32))
    np.testing.assert_array_equal(np.asarray(dg), np.asarray(eg))


def test_check_grads_float32_cpu():
    from jax.test_util import check_grads
    x = random(5, (4, 9), jnp.float32)
    g = random(6, (9,), jnp.float32, offset=1.0)
    b = random(7, (9,), jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        check_grads(lambda x, g: jrn.rms_norm(x, g, eps=1e-3), (x, g), order=1, modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)
        check_grads(lambda x, g, b: jrn.layer_norm(x, g, b, eps=1e-3, zero_centered_gamma=True), (x, g, b),
                    order=1, modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)


def _check_layer_stats(x, platform, dtype=jnp.float32):
    """LayerNorm forward of rows x (float32 values, stored as `dtype`, the
    parameters too) against float64 of the stored values: rstd to 2e-4
    relative, the float32 mean, and y within `dtype`'s rounding (float32:
    of x - mean, ulp(3000) = 2.4e-4)."""
    hidden = x.shape[-1]
    x = jnp.asarray(x, dtype)
    gamma = random(hidden + 1, (hidden,), dtype, scale=0.5, offset=1.0)
    beta = random(hidden + 2, (hidden,), dtype, scale=0.5)
    xd, g, b = put(platform, x, gamma, beta)
    poison(platform, 4 * x.size + 1024)
    y, mean, rstd = jax.jit(lambda x, g, b: jrn.layer_norm_fwd(x, g, b, eps=1e-5))(xd, g, b)
    assert y.dtype == dtype
    y_ref, mean_ref, rstd_ref = ref_forward("layer", x, gamma, beta, 1e-5)
    assert np.isfinite(f64(rstd)).all() and np.allclose(f64(rstd), rstd_ref, rtol=2e-4, atol=0), (f64(rstd), rstd_ref)
    assert_close(mean, mean_ref, jnp.float32, "mean", scale=3000.0)
    assert_close(y, y_ref, dtype, "y", scale=50.0)


def _far_from_zero_rows(key, rows, hidden, spread):
    """Rows of N(0, 1), in turn: offset by 1000, with an outlier (-3000) in the
    middle, 5 plus `spread` times the noise, and halves at +-500."""
    x = np.array(random(key, (rows, hidden), jnp.float32))
    x[0::4] += 1000.0
    x[1::4, hidden // 2] = -3000.0
    x[2::4] = 5.0 + spread * x[2::4]
    x[3::4, : hidden // 2] += 500.0
    x[3::4, hidden // 2 :] -= 500.0
    return x


def _outliers_at_ends(key, rows, hidden):
    """Rows of N(0, 1) with an outlier (3000) in the first column of every
    other row and in the last column of the others."""
    x = np.array(random(key, (rows, hidden), jnp.float32))
    x[0::2, 0] = 3000.0
    x[1::2, -1] = 3000.0
    return x


# Hidden sizes of every forward kernel family: rows in registers (1000-12288),
# streamed (40001), staged slices on one SM or across a cluster (65536, 262144).
STATS_HIDDEN = [1000, 4096, 12288, 40001, 65536, 262144]


@pytest.mark.parametrize("hidden", STATS_HIDDEN)
def test_layer_norm_statistics_far_from_zero(hidden, platform):
    """Rows a variance taken as E[x^2] - E[x]^2 gets wrong in float32: a large
    common offset, an outlier inside the row, a tiny spread around a large mean,
    and a row whose halves lie far apart (+-500): nearly all its variance is
    between the slices where a cluster of CTAs splits the row."""
    _check_layer_stats(_far_from_zero_rows(hidden, 4, hidden, 1e-3), platform)


@pytest.mark.parametrize("hidden", [1000, 3072, 3080, 4096, 12288])
@pytest.mark.parametrize("dtype, rows", [(jnp.bfloat16, 4), (jnp.bfloat16, 600), (jnp.float32, 600)],
                         ids=["bfloat16-4", "bfloat16-600", "float32-600"])
def test_layer_norm_statistics_far_from_zero_rows(hidden, dtype, rows, platform):
    """The rows above, in turn, stored as `dtype` with parameters of the
    same type. On the GPU four rows take fwd_decode; 600 rows (more than two
    an SM on an H100 or H200) the register kernel, which takes both sums in
    one pass around a shift in rows of 128 threads or more (bf16 hidden 3080
    and up: 3080 is the first, with most last packs past the row's end;
    float32 1540 and up) and two passes below (bf16 1000 and 3072, float32
    1000)."""
    gpu_routing_case(platform, hidden, [1000, 3080])
    _check_layer_stats(_far_from_zero_rows(hidden + rows, rows, hidden, 0.1), platform, dtype)


@pytest.mark.parametrize("hidden", STATS_HIDDEN)
def test_layer_norm_outlier_at_row_ends(hidden, platform):
    """An outlier (3000 among N(0, 1)) in the first column of one row and the
    last of another. The one-pass GPU kernels take their sums around a shift
    near the row's mean; when it was the row's first element, the outlier's row
    cancelled in float32 (rstd off by 0.2% at 40001 and 65536, 4% at 262144,
    on an H100)."""
    _check_layer_stats(_outliers_at_ends(hidden + 3, 2, hidden), platform)


@pytest.mark.parametrize("hidden", [3080, 4096, 12288])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=lambda d: np.dtype(d).name)
def test_layer_norm_outlier_at_row_ends_many_rows(hidden, dtype, platform):
    """The outliers above in 600 rows (every other row's first column, the
    others' last), which on the GPU take the register kernel's one pass
    rather than fwd_decode."""
    _check_layer_stats(_outliers_at_ends(hidden + 5, 600, hidden), platform, dtype)


# One shape a backward kernel family on the GPU: bwd_decode's rows (4), one
# CTA a row (1024, 4096; 6144 in an EARLY CTA of 192 threads), clusters of 2,
# 8 and 16 (12288, 65536, 262144), unaligned (3080).
FAR_BWD_SHAPES = [(4, 4096), (600, 1024), (600, 4096), (400, 6144), (300, 12288), (264, 65536), (72, 262144),
                  (600, 3080)]


@pytest.mark.parametrize("shape", FAR_BWD_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_layer_norm_backward_far_from_zero(dtype, shape, platform):
    """LayerNorm's dx of rows whose mean is far from zero against float64 of
    the stored values: rows offset by 1000, halves at +-500, an outlier
    (-3000) in N(0, 1), and 5 + 0.1 N(0, 1), in turn. On the GPU the wider
    rows of 16-bit x sum dy * gamma * x and subtract mean * sum(dy * gamma)
    once a row (bwd_slices' LEAN); cancellation there would show here first.
    Each row is divided by its rstd (which spans 1 to 1/500 here), as dx is."""
    gpu_routing_case(platform, shape, [(4, 4096), (600, 3080)])
    rows, hidden = shape
    key = case_key(("far-bwd", np.dtype(dtype).name, shape))
    x = np.array(random(key, shape, jnp.float32))
    x[0::4] += 1000.0
    x[1::4, : hidden // 2] += 500.0
    x[1::4, hidden // 2 :] -= 500.0
    x[2::4, hidden // 3] = -3000.0
    x[3::4] = 5.0 + 0.1 * x[3::4]
    x = jnp.asarray(x, dtype)
    dy = random(key + 1, shape, dtype)
    gamma = random(key + 2, (hidden,), dtype, scale=0.5, offset=1.0)
    beta = random(key + 3, (hidden,), dtype, scale=0.5)
    _, _, _, grads = _run("layer", platform, x, gamma, beta, dy, False)
    _, _, rstd_ref = ref_forward("layer", x, gamma, beta, EPS["layer"])
    dx_ref, dg_ref, _ = ref_backward("layer", dy, x, gamma, EPS["layer"])
    what = f"layer {np.dtype(dtype).name} {shape}"
    assert_close(f64(grads[0]) / rstd_ref[:, None], dx_ref / rstd_ref[:, None], dtype, what + " dx / rstd")
    assert_close(grads[1], dg_ref, dtype, what + " dgamma", scale=max(1.0, np.abs(dg_ref).max(), np.sqrt(rows)))


@pytest.mark.parametrize("kind", KINDS)
def test_nan_stays_in_its_row(kind, platform):
    x = np.array(random(8, (4, 64), jnp.float32))
    x[2, 5] = np.nan
    (xd,) = put(platform, jnp.asarray(x))
    fn = jrn.rms_norm if kind == "rms" else jrn.layer_norm
    y = np.asarray(fn(xd))
    assert np.isnan(y[2]).all()
    assert np.isfinite(np.delete(y, 2, axis=0)).all()


@pytest.mark.parametrize("kind", KINDS)
def test_empty_inputs(kind, platform):
    (x,) = put(platform, jnp.zeros((0, 3, 8), jnp.bfloat16))
    gamma = jnp.ones((8,), jnp.float32)
    fn = jrn.rms_norm if kind == "rms" else jrn.layer_norm
    y = fn(x, gamma)
    assert y.shape == x.shape and y.dtype == x.dtype
    dx, dg = jax.grad(lambda x, g: fn(x, g).astype(jnp.float32).sum(), (0, 1))(x, gamma)
    assert dx.shape == x.shape and dg.shape == (8,) and not np.asarray(dg).any()
    if kind == "rms":
        _, rstd = jrn.rms_norm_fwd(x, gamma)
        assert rstd.shape == (0, 3)


# (4096, 1024): one slot per CTA; (600, 16384): rows of one 512-thread CTA,
# whose clusters fold their column sums into one workspace row on a GPU.
@pytest.mark.parametrize("shape", [(4096, 1024), (600, 16384)], ids=lambda s: "x".join(map(str, s)))
def test_dgamma_is_reproducible(shape, platform):
    x = random(9, shape, jnp.bfloat16)
    dy = random(10, shape, jnp.bfloat16)
    g = random(11, shape[-1:], jnp.float32)
    x, dy, g = put(platform, x, dy, g)
    f = jax.jit(lambda x, g, dy: jax.vjp(lambda x, g: jrn.layer_norm(x, g, g), x, g)[1](dy))
    a = f(x, g, dy)
    b = f(x, g, dy)
    for p, q in zip(a, b):
        np.testing.assert_array_equal(np.asarray(p, np.float32), np.asarray(q, np.float32))


# Per-example gamma and beta (vmapped) on rows that fill one 512-thread CTA,
# with more rows per group than slots: on a GPU the folded workspace rows of
# every group (grid y) must land in that group's dgamma/dbeta. At 65536 a
# cluster takes a row; each CTA stages its group's gamma slice in shared
# memory, which dx reads. At 4097 (bwd_unaligned) each slot walks rows of one
# offset from a 16-byte boundary, within its group; at 12290 a slot is one
# CTA of three packs a thread; at 16383 one of four for RMSNorm and, for
# LayerNorm, a cluster of two CTAs; at 24583 a cluster of four for both.
@pytest.mark.parametrize("dtype, hidden", [(jnp.bfloat16, 16384), (jnp.float32, 8192), (jnp.bfloat16, 65536),
                                           (jnp.bfloat16, 4097), (jnp.bfloat16, 12290), (jnp.bfloat16, 16383),
                                           (jnp.bfloat16, 24583)],
                         ids=["bfloat16-16384", "float32-8192", "bfloat16-65536", "bfloat16-4097", "bfloat16-12290",
                              "bfloat16-16383", "bfloat16-24583"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("platform", ["gpu"])
def test_dgamma_per_group_wide_rows(kind, dtype, hidden, platform):
    groups, rows = 3, 600 if hidden <= 16384 else 100
    x = random(21, (groups, rows, hidden), dtype, scale=2.0, offset=0.5)
    dy = random(22, (groups, rows, hidden), dtype)
    g = random(23, (groups, hidden), dtype, scale=0.5, offset=1.0)
    b = random(24, (groups, hidden), dtype, scale=0.5)
    x, dy, g, b = put(platform, x, dy, g, b)
    poison(platform, 4 * x.size + 1024)
    if kind == "rms":
        norm = lambda x, g, b: jrn.rms_norm(x, g, eps=EPS[kind])
    else:
        norm = lambda x, g, b: jrn.layer_norm(x, g, b, eps=EPS[kind])
    f = jax.jit(jax.vmap(lambda x, g, b, dy: jax.vjp(norm, x, g, b)[1](dy)))
    dx, dg, db = f(x, g, b, dy)
    for i in range(groups):
        dx_ref, dg_ref, db_ref = ref_backward(kind, dy[i], x[i], g[i], EPS[kind])
        assert_close(dx[i], dx_ref, dtype, f"group {i} dx")
        assert_close(dg[i], dg_ref, dtype, f"group {i} dgamma", scale=max(1.0, np.abs(dg_ref).max(), np.sqrt(rows)))
        if kind == "layer":
            assert_close(db[i], db_ref, dtype, f"group {i} dbeta", scale=max(1.0, np.abs(db_ref).max(), np.sqrt(rows)))


# Per-example gamma and beta (vmapped) in the wide forward, with more rows
# per group than clusters: on a GPU a cluster walks rows of several groups,
# and LayerNorm's CTAs stage their group's gamma and beta slices in shared
# memory, again each time the group changes (zero-centred gamma and no beta
# take the kernel that reads them from global memory).
@pytest.mark.parametrize("dtype, hidden", [(jnp.bfloat16, 65536), (jnp.float32, 65536), (jnp.bfloat16, 262144)],
                         ids=["bfloat16-65536", "float32-65536", "bfloat16-262144"])
@pytest.mark.parametrize("kind, variant", [("rms", "plain"), ("rms", "zero_centered"), ("layer", "plain"),
                                           ("layer", "zero_centered"), ("layer", "no_beta")])
@pytest.mark.parametrize("platform", ["gpu"])
def test_forward_per_group_wide_rows(kind, variant, dtype, hidden, platform):
    groups, rows = 3, 150 if hidden == 65536 else 40
    zc, with_beta = variant == "zero_centered", kind == "layer" and variant != "no_beta"
    key = case_key(("fwd-groups", kind, variant, np.dtype(dtype).name, hidden))
    x = random(key, (groups, rows, hidden), dtype, scale=2.0, offset=0.5)
    g = random(key + 1, (groups, hidden), dtype, scale=0.5, offset=0.0 if zc else 1.0)
    b = random(key + 2, (groups, hidden), dtype, scale=0.5)
    x, g, b = put(platform, x, g, b)
    poison(platform, 2 * x.size * x.dtype.itemsize + 1024)
    if kind == "rms":
        norm = lambda x, g, b: jrn.rms_norm(x, g, eps=EPS[kind], zero_centered_gamma=zc)
    else:
        norm = lambda x, g, b: jrn.layer_norm(x, g, b if with_beta else None, eps=EPS[kind], zero_centered_gamma=zc)
    y = jax.jit(jax.vmap(norm))(x, g, b)
    for i in range(groups):
        y_ref, _, _ = ref_forward(kind, x[i], g[i], b[i] if with_beta else None, EPS[kind], zero_centered=zc)
        assert_close(y[i], y_ref, dtype, f"group {i} y")
