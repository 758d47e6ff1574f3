"""Distributed normalization: sharded jit (Auto and Explicit meshes), the
optimized HLO's communication, shard_map with axis_name, the stats/apply
building blocks and all_reduce_rms_norm. Each compares against the unsharded
result on the same platform."""

import os
import re
from functools import partial

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_rmsnorm as jrn
from reference import TOL, assert_close, f64, poison, random, ref_add, ref_backward, ref_forward


def _mesh(platform, data, model, axis_type=AxisType.Auto):
    devices = jax.devices(platform)
    if len(devices) < data * model:
        pytest.skip(f"needs {data * model} {platform} devices, {len(devices)} visible")
    return jax.sharding.Mesh(np.asarray(devices[: data * model]).reshape(data, model),
                             ("data", "model"), axis_types=(axis_type,) * 2)


def _loss(kind, zero_centered):
    def loss(x, g, b):
        if kind == "rms":
            y = jrn.rms_norm(x, g, zero_centered_gamma=zero_centered)
        else:
            y = jrn.layer_norm(x, g, b, zero_centered_gamma=zero_centered)
        return loss_of(y.astype(jnp.float32))
    return loss


def _close(got, want, dtype, scale=1.0):
    rtol, atol = TOL[np.dtype(dtype)]
    np.testing.assert_allclose(f64(got), f64(want), rtol=rtol, atol=atol * scale)


LAYOUTS = {
    # name: (mesh data, mesh model, x spec for rank-3 x (batch, seq, hidden))
    "rows": (2, 1, P("data", None, None)),
    "seq": (2, 1, P(None, "data", None)),
    "hidden": (1, 2, P(None, None, "model")),
    "rows+hidden": (2, 2, P("data", None, "model")),
    "2x4": (2, 4, P("data", None, "model")),
}


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_sharded_jit_matches_unsharded(platform, axis_type, layout, kind, dtype):
    data, model, spec = LAYOUTS[layout]
    mesh = _mesh(platform, data, model, axis_type)
    zero_centered = kind == "rms"
    x = random(1, (4, 6, 256), dtype, scale=2.0, offset=3.0)
    g = random(2, (256,), jnp.float32, scale=0.5)
    b = random(3, (256,), jnp.float32)
    f = jax.jit(jax.value_and_grad(_loss(kind, zero_centered), (0, 1, 2)))
    dev = jax.devices(platform)[0]
    want = f(*jax.device_put((x, g, b), dev))
    pspec = P(spec[-1])
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        gs, bs = (jax.device_put(a, NamedSharding(mesh, pspec)) for a in (g, b))
        got = f(xs, gs, bs)
        y = jax.jit(lambda x, g, b: jrn.layer_norm(x, g, b) if kind == "layer" else jrn.rms_norm(x, g))(
            xs, gs, bs)
    assert y.sharding.spec == NamedSharding(mesh, spec).spec or y.sharding.is_equivalent_to(
        NamedSharding(mesh, spec), y.ndim)
    ref_y = ref_forward(kind, x, g, b if kind == "layer" else None)[0]
    _close(y, ref_y, dtype)
    _close(got[0], want[0], jnp.float32, scale=10)
    _close(got[1][0], want[1][0], dtype)
    _close(got[1][1], want[1][1], jnp.float32, scale=50)
    if kind == "layer":
        _close(got[1][2], want[1][2], jnp.float32, scale=50)


def _collectives(hlo):
    """(op, element count) of every all-gather/all-reduce/all-to-all/collective-permute."""
    out = []
    for line in hlo.splitlines():
        m = re.search(r"= (\(?[^=]*?\)?) (all-gather|all-reduce|all-to-all|collective-permute|"
                      r"reduce-scatter)(-start)?\(", line)
        if not m:
            continue
        count = sum(int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
                    for dims in re.findall(r"\[([\d,]*)\]", m.group(1)))
        out.append((m.group(2), count))
    return out


def _hidden_sharded_hlo(axis_type, loss, n_x, seed, rows=64, hidden=1024):
    """The optimized HLO of value_and_grad(loss) on a 2 x 4 mesh, with its
    first ``n_x`` arguments (rows, hidden) split over ("data", "model") and the
    two parameters after them (hidden,) over "model"; and its collectives."""
    mesh = _mesh("cpu", 2, 4, axis_type)
    xs = [random(seed + i, (rows, hidden), jnp.float32) for i in range(n_x)]
    g = random(seed + n_x, (hidden,), jnp.float32)
    f = jax.jit(jax.value_and_grad(loss, tuple(range(n_x + 2))))
    with jax.set_mesh(mesh):
        args = ([jax.device_put(x, NamedSharding(mesh, P("data", "model"))) for x in xs]
                + [jax.device_put(g, NamedSharding(mesh, P("model")))] * 2)
        hlo = f.lower(*args).compile().as_text()
    return hlo, _collectives(hlo)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_hidden_sharded_hlo_moves_statistics_only(axis_type, kind):
    rows, hidden = 64, 1024
    hlo, comms = _hidden_sharded_hlo(axis_type, _loss(kind, False), 1, 4, rows, hidden)
    local_rows, local_hidden = rows // 2, hidden // 4
    # Statistics: a few floats a row (the gathered LayerNorm pairs are 2 per
    # row per device); dgamma/dbeta slices: the local hidden slice.
    limit = max(2 * local_rows * 4, 2 * local_hidden + 1)
    assert comms, "expected the all-reduce of the statistics"
    assert all(n <= limit for _, n in comms), (comms, limit)
    assert any(op == "all-reduce" for op, _ in comms)
    # The row statistics alone (XLA may add the loss's scalar to them): RMSNorm
    # moves one float a row forward and one backward, LayerNorm two.
    per_row = 1 if kind == "rms" else 2
    stats = [n for _, n in comms if n < local_hidden]
    assert stats and max(stats) <= per_row * local_rows + 1, (comms, per_row)
    assert "custom-call" in hlo and "jrn_" in hlo


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_rows_sharded_hlo_reduces_dgamma_only(kind):
    mesh = _mesh("cpu", 8, 1)
    x = random(6, (64, 512), jnp.float32)
    g = random(7, (512,), jnp.float32)
    f = jax.jit(jax.grad(_loss(kind, False), (0, 1, 2)))
    args = (jax.device_put(x, NamedSharding(mesh, P("data", None))),
            jax.device_put(g, NamedSharding(mesh, P())), jax.device_put(g, NamedSharding(mesh, P())))
    comms = _collectives(f.lower(*args).compile().as_text())
    assert all(op == "all-reduce" and n <= 2 * 512 for op, n in comms), comms
    assert comms  # the dgamma partials are summed over the rows' axis


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_shard_map_axis_name(platform, kind):
    n = 4 if platform == "cpu" else 2
    mesh = _mesh(platform, 2 if platform == "cpu" else 1, n)
    x = random(8, (8, 128), jnp.float32, offset=2.0)
    g = random(9, (128,), jnp.float32)
    b = random(10, (128,), jnp.float32)
    dev = jax.devices(platform)[0]
    loss = _loss(kind, False)
    want = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(*jax.device_put((x, g, b), dev))

    def local_loss(x, g, b):
        if kind == "rms":
            y = jrn.rms_norm(x, g, axis_name="model")
        else:
            y = jrn.layer_norm(x, g, b, axis_name="model")
        return y

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("data", "model"), P("model"), P("model")),
             out_specs=P("data", "model"))
    def sharded_y(x, g, b):
        return local_loss(x, g, b)

    y = sharded_y(x, g, b)
    _close(y, ref_forward(kind, x, g, b if kind == "layer" else None)[0], jnp.float32)

    # Gradients through the sharded norm, against jax.grad of the same loss.
    grads = jax.jit(jax.grad(lambda x, g, b: loss_of(sharded_y(x, g, b)), (0, 1, 2)))(x, g, b)
    ref_grads = jax.jit(jax.grad(lambda x, g, b: loss_of(
        jrn.rms_norm(x, g) if kind == "rms" else jrn.layer_norm(x, g, b)), (0, 1, 2)))(x, g, b)
    for got, ref in zip(grads, ref_grads):
        _close(got, ref, jnp.float32, scale=20)
    assert want is not None


def loss_of(y):
    # Elementwise only (no constants XLA would have to partition), and not
    # linear in y, so every element's gradient differs.
    return jnp.sum(jnp.sin(1.3 * y) + 0.25 * y * y)


def test_shard_map_dgamma_summed_over_data_axis():
    mesh = _mesh("cpu", 2, 4)
    x = random(11, (16, 64), jnp.float32)
    g = random(12, (64,), jnp.float32)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("data", "model"), P("model")), out_specs=P("model"))
    def dgamma(x, g):
        return jax.grad(lambda g: jax.lax.psum(loss_of(jrn.rms_norm(x, g, axis_name="model")),
                                               ("data", "model")))(g)

    want = jax.grad(lambda g: loss_of(jrn.rms_norm(x, g)))(g)
    _close(dgamma(x, g), want, jnp.float32, scale=20)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_stats_and_apply(platform, dtype):
    dev = jax.devices(platform)[0]
    x = jax.device_put(random(13, (3, 5, 96), dtype, scale=3.0, offset=5.0), dev)
    g = jax.device_put(random(14, (96,), jnp.float32), dev)
    b = jax.device_put(random(15, (96,), jnp.float32), dev)
    slices = jnp.split(x, 4, axis=-1)
    ss = jax.jit(jrn.rms_norm_stats)(x)
    np.testing.assert_allclose(f64(ss), (f64(x) ** 2).sum(-1), rtol=1e-5)
    st = jax.jit(jrn.layer_norm_stats)(x)
    xf = f64(x)
    np.testing.assert_allclose(f64(st[..., 0]), xf.mean(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f64(st[..., 1]), ((xf - xf.mean(-1, keepdims=True)) ** 2).sum(-1),
                               rtol=1e-4)

    total = sum(jrn.rms_norm_stats(s) for s in slices)
    y = jnp.concatenate([jrn.rms_norm_apply(s, total, gs, hidden_size=96)
                         for s, gs in zip(slices, jnp.split(g, 4))], -1)
    _close(y, ref_forward("rms", x, g)[0], dtype)
    gathered = jnp.stack([jrn.layer_norm_stats(s) for s in slices])
    y = jnp.concatenate([jrn.layer_norm_apply(s, gathered, gs, bs, hidden_size=96)
                         for s, gs, bs in zip(slices, jnp.split(g, 4), jnp.split(b, 4))], -1)
    _close(y, ref_forward("layer", x, g, b)[0], dtype)


# Rows wider than one CTA with given statistics take fwd_apply on a GPU (a
# row split across CTAs, no reduction); several rows, odd counts of them.
@pytest.mark.parametrize("shape", [(300, 65536), (3, 262144)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("platform", ["gpu"])
def test_apply_wide_rows(platform, dtype, shape):
    dev = jax.devices(platform)[0]
    h = shape[-1]
    x = jax.device_put(random(31, shape, dtype, scale=2.0, offset=0.5), dev)
    g = jax.device_put(random(32, (h,), dtype, scale=0.1, offset=1.0), dev)
    b = jax.device_put(random(33, (h,), dtype, scale=0.1), dev)
    xf = f64(x)
    ss = jax.device_put(jnp.asarray((xf ** 2).sum(-1), jnp.float32), dev)
    st = jax.device_put(jnp.asarray(np.stack([xf.mean(-1), ((xf - xf.mean(-1, keepdims=True)) ** 2).sum(-1)], -1),
                                    jnp.float32), dev)
    poison(platform, 2 * x.nbytes)
    y = jax.jit(lambda x, s, g: jrn.rms_norm_apply(x, s, g, hidden_size=h))(x, ss, g)
    _close(y, ref_forward("rms", x, g)[0], dtype)
    poison(platform, 2 * x.nbytes)
    y = jax.jit(lambda x, s, g, b: jrn.layer_norm_apply(x, s, g, b, hidden_size=h))(x, st, g, b)
    _close(y, ref_forward("layer", x, g, b)[0], dtype)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_stats_and_apply_gradients(platform, kind):
    dev = jax.devices(platform)[0]
    x, g, b = jax.device_put((random(16, (6, 64), jnp.float32, offset=1.0),
                              random(17, (64,), jnp.float32), random(18, (64,), jnp.float32)), dev)

    def composed(x, g, b):
        xs, gs, bs = (jnp.split(a, 2, axis=-1) for a in (x, g, b))
        if kind == "rms":
            total = jrn.rms_norm_stats(xs[0]) + jrn.rms_norm_stats(xs[1])
            ys = [jrn.rms_norm_apply(s, total, gg, hidden_size=64) for s, gg in zip(xs, gs)]
        else:
            st = jnp.stack([jrn.layer_norm_stats(s) for s in xs])
            ys = [jrn.layer_norm_apply(s, st, gg, bb, hidden_size=64) for s, gg, bb in zip(xs, gs, bs)]
        return loss_of(jnp.concatenate(ys, -1))

    def whole(x, g, b):
        return loss_of(jrn.rms_norm(x, g) if kind == "rms" else jrn.layer_norm(x, g, b))

    got = jax.jit(jax.grad(composed, (0, 1, 2)))(x, g, b)
    want = jax.jit(jax.grad(whole, (0, 1, 2)))(x, g, b)
    for a, w in zip(got, want):
        _close(a, w, jnp.float32, scale=20)
    # vmap over the building blocks
    vs = jax.vmap(jrn.rms_norm_stats)(x[None].repeat(2, 0))
    np.testing.assert_allclose(f64(vs[1]), (f64(x) ** 2).sum(-1), rtol=1e-5)


# Enough rows for many blocks and a partial last block, and every width class
# of the statistics kernels (threads per row from 16 to 256, one to several
# iterations of loads per thread, unaligned widths).
@pytest.mark.parametrize("rows,hidden,dtype", [(4099, 1000, jnp.bfloat16), (2049, 4096, jnp.bfloat16),
                                               (257, 4096, jnp.float32), (600, 2048, jnp.float16),
                                               (33, 16384, jnp.bfloat16), (515, 333, jnp.float32)])
def test_stats_kernels_against_float64(platform, rows, hidden, dtype):
    from jax_rmsnorm import _checks, _core, _primitives
    dev = jax.devices(platform)[0]
    x = random(rows, (rows, hidden), dtype, offset=3.0)
    # an outlier at a row's first element, one of those the LayerNorm shift is taken from
    x = jax.device_put(x.at[1, 0].set(3000.0), dev)
    dy = jax.device_put(random(rows + 1, (rows, hidden), dtype), dev)
    g = jax.device_put(random(rows + 2, (hidden,), dtype, scale=0.1, offset=1.0), dev)
    rstd = jax.device_put(jax.random.uniform(jax.random.key(3), (rows,), jnp.float32, 0.5, 1.5), dev)
    mean = jax.device_put(jax.random.uniform(jax.random.key(4), (rows,), jnp.float32, 2.5, 3.5), dev)
    xf, dyf, gf, rf, mf = (f64(a) for a in (x, dy, g, rstd, mean))
    poison(platform, 8 * rows)
    ss = f64(jax.jit(jrn.rms_norm_stats)(x))
    np.testing.assert_allclose(ss, (xf ** 2).sum(-1), rtol=2e-5)
    poison(platform, 8 * rows)
    st = f64(jax.jit(jrn.layer_norm_stats)(x))
    np.testing.assert_allclose(st[:, 0], xf.mean(-1), rtol=2e-5)
    np.testing.assert_allclose(st[:, 1], ((xf - xf.mean(-1, keepdims=True)) ** 2).sum(-1), rtol=1e-4)
    for kind, m in ((_primitives.RMS, None), (_primitives.LAYER, mean)):
        cfg = _checks.Config(kind, 1e-6, False)
        poison(platform, 8 * rows)
        got = f64(jax.jit(lambda dy, x, m, r, g: _core.grad_sums(dy, x, m, r, g, cfg))(dy, x, m, rstd, g))
        gdy = dyf * gf
        sums = [(gdy * (xf - (0 if m is None else mf[:, None])) * rf[:, None]).sum(-1), gdy.sum(-1)]
        # RMSNorm's backward needs (and all-reduces) one sum a row, LayerNorm's two
        if m is None:
            assert got.shape == (rows,)
            got, sums = got[:, None], sums[:1]
        else:
            assert got.shape == (rows, 2)
        for i, want in enumerate(sums):
            assert np.isfinite(got[:, i]).all()
            np.testing.assert_allclose(got[:, i], want, rtol=0, atol=2e-5 * np.abs(want).max(), err_msg=f"{kind} sum {i}")


def test_stats_apply_errors():
    x = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(ValueError, match="stats must be float32 of shape"):
        jrn.rms_norm_apply(x, jnp.ones((5,), jnp.float32), hidden_size=16)
    with pytest.raises(ValueError, match="hidden_size"):
        jrn.rms_norm_apply(x, jnp.ones((4,), jnp.float32), hidden_size=4)
    with pytest.raises(TypeError, match="hidden_size must be an int"):
        jrn.rms_norm_apply(x, jnp.ones((4,), jnp.float32), hidden_size=16.0)
    with pytest.raises(ValueError, match="stats must be float32"):
        jrn.layer_norm_apply(x, jnp.ones((4, 3), jnp.float32), hidden_size=16)
    with pytest.raises(ValueError, match="do not make up hidden_size"):
        jrn.layer_norm_apply(x, jnp.ones((3, 4, 2), jnp.float32), hidden_size=16)


@pytest.mark.parametrize("scatter,method", [(False, "auto"), (False, "scatter"), (False, "psum"), (True, "auto")])
@pytest.mark.parametrize("rows", [8, 6])
def test_all_reduce_rms_norm(platform, scatter, method, rows):
    if scatter and rows % 2:
        pytest.skip("scatter needs rows divisible by the axis size")
    n = 4 if platform == "cpu" else 2
    mesh = _mesh(platform, 1, n)
    if scatter and rows % n:
        pytest.skip("scatter needs rows divisible by the axis size")
    parts = random(19, (n, rows, 3, 64), jnp.float32)
    g = random(20, (64,), jnp.float32)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
    def fused(p, g):
        return jrn.all_reduce_rms_norm(p[0], g, axis_name="model", scatter=scatter, method=method)[None]

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
    def unfused(p, g):
        return jrn.rms_norm(jax.lax.psum(p[0], "model"), g)[None]

    got, want = fused(parts, g), unfused(parts, g)
    ref = ref_forward("rms", parts.sum(0), g)[0]
    if scatter:
        got = got.reshape(want.shape[1:])  # the shares, in device order, make up the rows
        _close(got, ref, jnp.float32)
    else:
        for d in range(n):
            _close(got[d], ref, jnp.float32)
        _close(got, want, jnp.float32)

    # Gradients agree with psum + rms_norm's.
    def loss(fn):
        return lambda p, g: loss_of(fn(p, g))
    if not scatter:
        ga = jax.jit(jax.grad(loss(fused), (0, 1)))(parts, g)
        gb = jax.jit(jax.grad(loss(unfused), (0, 1)))(parts, g)
        for a, b in zip(ga, gb):
            _close(a, b, jnp.float32, scale=20)


@pytest.mark.parametrize("n,method,fwd_ops", [
    (4, "auto", ["all-reduce"]), (4, "psum", ["all-reduce"]), (4, "scatter", ["all-gather", "reduce-scatter"]),
    (2, "auto", ["all-reduce"]), (2, "scatter", ["all-gather", "reduce-scatter"])])
def test_all_reduce_rms_norm_hlo(n, method, fwd_ops):
    """Forward alone: reduce-scatter + all-gather (1/n of the rows normalized
    per device) or one all-reduce, as the method says ("auto": the all-reduce).
    Forward and backward: one all-reduce and nothing else (the backward needs
    no communication), as psum + rms_norm."""
    mesh = _mesh("cpu", 1, n)
    on_mesh = partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
    fwd = on_mesh(lambda p, g: jrn.all_reduce_rms_norm(p, g, axis_name="model", method=method))
    step = on_mesh(lambda p, g: jax.grad(
        lambda p, g: jnp.sum(jrn.all_reduce_rms_norm(p, g, axis_name="model", method=method) ** 2), (0, 1))(p, g))
    p, g = jnp.ones((n * 16, 32), jnp.float32), jnp.ones((32,), jnp.float32)
    ops = sorted(op for op, _ in _collectives(jax.jit(fwd).lower(p, g).compile().as_text()))
    assert ops == fwd_ops, ops
    comms = _collectives(jax.jit(step).lower(p, g).compile().as_text())
    assert comms == [("all-reduce", 16 * 32)], comms


def test_all_reduce_rms_norm_errors():
    mesh = _mesh("cpu", 1, 4)

    @partial(jax.shard_map, mesh=mesh, in_specs=P("model"), out_specs=P("model"))
    def bad(p):
        return jrn.all_reduce_rms_norm(p[0], axis_name="model", scatter=True)[None]

    with pytest.raises(ValueError, match="multiple of the axis size"):
        jax.jit(bad)(jnp.ones((4, 6, 8), jnp.float32))

    @partial(jax.shard_map, mesh=mesh, in_specs=P("model"), out_specs=P("model"))
    def bad_method(p):
        return jrn.all_reduce_rms_norm(p[0], axis_name="model", method="ring")[None]

    with pytest.raises(ValueError, match="method must be one of"):
        jax.jit(bad_method)(jnp.ones((4, 8, 8), jnp.float32))


# all_reduce_rms_norm(method="nvlink"): one kernel a GPU sums the partial sums
# through peer access and normalizes. Each device's output holds rows that
# other devices computed and wrote, so comparing every device's whole output
# against the float64 reference checks every writer.
NVLINK_CASES = [
    # (devices, rows, hidden, dtype, gamma dtype or None, zero-centred)
    (2, 1, 64, jnp.float32, jnp.float32, False),
    (2, 7, 4096, jnp.bfloat16, jnp.bfloat16, False),
    (2, 300, 8192, jnp.bfloat16, jnp.float32, True),
    (2, 1000, 16384, jnp.bfloat16, jnp.bfloat16, False),
    (2, 513, 8192, jnp.float32, None, False),
    (2, 260, 1032, jnp.float16, jnp.float16, True),
    (4, 3, 4096, jnp.bfloat16, jnp.bfloat16, False),
    (4, 1001, 8192, jnp.bfloat16, jnp.bfloat16, False),
    (4, 64, 2048, jnp.float16, jnp.float32, False),
]


def _nvlink_total(parts, dtype):
    # The kernel normalizes the sum as x's dtype holds it, as psum's result.
    return jnp.asarray(f64(parts).sum(0), jnp.float32).astype(dtype)


def _nvlink_ref(parts, g, dtype, zero_centered):
    return ref_forward("rms", _nvlink_total(parts, dtype), g, zero_centered=zero_centered)[0]


@pytest.mark.parametrize("n,rows,hidden,dtype,gdtype,zc", NVLINK_CASES,
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_all_reduce_rms_norm_nvlink(platform, n, rows, hidden, dtype, gdtype, zc):
    if platform == "cpu":
        pytest.skip("a GPU method (the CPU's error is test_all_reduce_rms_norm_nvlink_errors)")
    mesh = _mesh(platform, 1, n)
    parts = random(rows * 7 + hidden, (n, rows, hidden), dtype, scale=2.0, offset=0.5)
    g = None if gdtype is None else random(hidden, (hidden,), gdtype, offset=0.0 if zc else 1.0)
    ref = _nvlink_ref(parts, g, dtype, zc)
    spec = (P("model"), P())
    norm = partial(jrn.all_reduce_rms_norm, axis_name="model", zero_centered_gamma=zc)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=P("model"))
    def fused(p, g):
        return norm(p[0], g, method="nvlink")[None]

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=P("model"))
    def unfused(p, g):
        return norm(p[0], g, method="psum")[None]

    poison(platform, 2 * parts.nbytes)
    got = fused(parts, g)
    assert got.shape == parts.shape and got.dtype == dtype
    for d in range(n):
        assert_close(got[d], ref, dtype, f"device {d}'s y")
    got2 = fused(parts, g)  # a second call: the barriers' counts go on
    np.testing.assert_array_equal(f64(got2), f64(got))
    if n == 2 or dtype == jnp.float32:
        # Over more devices, psum of 16-bit partial sums rounds at each step
        # of NCCL's ring: on 4 H100s one element of 8200192 (1001 x 8192,
        # bf16) near zero read -0.043 there against -0.0215 here (and in the
        # float64 reference above).
        _close(got[0], unfused(parts, g)[0], dtype)

    # Gradients (differentiated, the forward is psum + rms_norm, which saves
    # the sum the backward reads) against float64, from the cotangent the
    # loss gives the kernel's own y: the n devices' copies of y each add
    # theirs, rounded to y's dtype. (Against a jnp norm, a one-ulp difference
    # in y moved the gradient of the loss's sin by up to 3% at a few
    # elements.)
    y0 = f64(got[0])
    dy = jnp.asarray(n * (1.3 * np.cos(1.3 * y0) + 0.5 * y0), jnp.float32).astype(dtype)
    dx_ref, dg_ref, _ = ref_backward("rms", dy, _nvlink_total(parts, dtype), g, zero_centered=zc)
    grads = jax.jit(jax.grad(lambda p, g: loss_of(fused(p, g).astype(jnp.float32)),
                             (0, 1) if g is not None else 0))(parts, g)
    dparts = grads[0] if g is not None else grads
    for d in range(n):  # psum's transpose: every partial sum gets the whole gradient
        assert_close(dparts[d], dx_ref, dtype, f"device {d}'s dpartial")
    if g is not None:
        assert_close(grads[1], dg_ref, dtype, "dgamma", scale=max(1.0, np.abs(dg_ref).max(), np.sqrt(rows)))


def test_all_reduce_rms_norm_nvlink_groups_and_calls(platform):
    """A 2 x 2 mesh summing over "model" (two groups of two GPUs), two calls of
    different shapes in one program, and vmap (the vmapped axis as rows)."""
    if platform == "cpu":
        pytest.skip("a GPU method")
    mesh = _mesh(platform, 2, 2)
    a = random(31, (2, 2, 40, 4096), jnp.bfloat16)
    b = random(32, (2, 2, 3, 5, 1024), jnp.bfloat16)
    g = random(33, (4096,), jnp.bfloat16, offset=1.0)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("data", "model"), P("data", "model"), P()),
             out_specs=(P("data", "model"), P("data", "model")))
    def two(a, b, g):
        y = jrn.all_reduce_rms_norm(a[0, 0], g, axis_name="model", method="nvlink")
        z = jax.vmap(lambda r: jrn.all_reduce_rms_norm(r, None, axis_name="model", method="nvlink"))(b[0, 0])
        return y[None, None], z[None, None]

    y, z = two(a, b, g)
    for i in range(2):
        ry = _nvlink_ref(a[i], g, jnp.bfloat16, False)
        rz = _nvlink_ref(b[i], None, jnp.bfloat16, False)
        for j in range(2):
            assert_close(y[i, j], ry, jnp.bfloat16, f"group {i}, device {j}: y")
            assert_close(z[i, j], rz, jnp.bfloat16, f"group {i}, device {j}: z")


def test_all_reduce_rms_norm_nvlink_chain(platform):
    """Eight calls chained in one program, as the layers of a decode step: XLA
    may record them into a CUDA graph (the handler is compatible with command
    buffers) and replays it on later runs, so the program runs three times,
    on new inputs and then on the first again. Each step is checked against
    float64 from the step before's output."""
    if platform == "cpu":
        pytest.skip("a GPU method")
    n, rows, hidden, steps, dtype = 2, 6, 2048, 8, jnp.bfloat16
    mesh = _mesh(platform, 1, n)
    g = random(41, (hidden,), dtype, offset=1.0)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
    def chain(p, g):
        x, outs = p[0], []
        for _ in range(steps):
            x = jrn.all_reduce_rms_norm(x, g, axis_name="model", method="nvlink")
            outs.append(x)
        return jnp.stack(outs)[None]

    inputs = [random(42 + i, (n, rows, hidden), dtype, scale=2.0, offset=0.5) for i in range(2)]
    first = None
    for parts in inputs + inputs[:1]:
        got = chain(parts, g)
        assert got.shape == (n, steps, rows, hidden)
        prev = parts
        for k in range(steps):
            ref = _nvlink_ref(prev, g, dtype, False)
            for d in range(n):
                assert_close(got[d, k], ref, dtype, f"step {k}, device {d}")
            prev = got[:, k]
        if first is None:
            first = got
    np.testing.assert_array_equal(f64(got), f64(first))  # the first input again: the same bits


def _with_empty_words(a):
    """a with some 32-bit words set to the push kernel's empty mark
    (0x80008000: two -0.0s in 16-bit dtypes, a negative denormal in
    float32), which its senders store as 0."""
    bits = np.asarray(a).copy()
    if bits.dtype.itemsize == 4:
        bits.view(np.uint32).reshape(-1)[::97] = 0x80008000
    else:  # both halves of every 97th 32-bit word
        halves = bits.view(np.uint16).reshape(-1)
        halves[0:-1:194] = 0x8000
        halves[1::194] = 0x8000
    return jnp.asarray(bits)


def test_all_reduce_rms_norm_nvlink_dtypes_in_turn(platform):
    """Calls of three dtypes one after another in one program, run twice: the
    small ones take the push kernel (at most 512 KB a partial sum on 2 GPUs), whose
    buffers every dtype shares, the last the two-pass kernel. Partial sums
    hold the push kernel's empty mark, which must read as zero."""
    if platform == "cpu":
        pytest.skip("a GPU method")
    n = 2
    mesh = _mesh(platform, 1, n)
    shapes = [((n, 5, 64), jnp.float32), ((n, 3, 4096), jnp.bfloat16), ((n, 40, 1032), jnp.float16),
              ((n, 64, 8192), jnp.bfloat16), ((n, 2, 64), jnp.float32)]
    parts = [_with_empty_words(random(50 + i, shape, dt, scale=2.0, offset=0.5))
             for i, (shape, dt) in enumerate(shapes)]

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("model"),) * len(parts), out_specs=(P("model"),) * len(parts))
    def run(*ps):
        return tuple(jrn.all_reduce_rms_norm(p[0], None, axis_name="model", method="nvlink")[None] for p in ps)

    for _ in range(2):
        outs = run(*parts)
        for i, (p, (shape, dt)) in enumerate(zip(parts, shapes)):
            ref = _nvlink_ref(p, None, dt, False)
            for d in range(n):
                assert_close(outs[i][d], ref, dt, f"call {i} ({shape}, {dt.__name__}), device {d}")


def test_all_reduce_rms_norm_auto_takes_nvlink(platform):
    """On GPUs with peer access, "auto" lowers the forward to the one kernel
    (no all-reduce) and the differentiated forward to psum."""
    from jax_rmsnorm._primitives import nvlink_available
    if platform == "cpu" or not nvlink_available():
        pytest.skip("needs GPUs with peer access")
    mesh = _mesh(platform, 1, 2)
    on_mesh = partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
    fwd = on_mesh(lambda p, g: jrn.all_reduce_rms_norm(p, g, axis_name="model"))
    step = on_mesh(lambda p, g: jax.grad(
        lambda p, g: jnp.sum(jrn.all_reduce_rms_norm(p, g, axis_name="model") ** 2), (0, 1))(p, g))
    p, g = jnp.ones((2 * 16, 64), jnp.bfloat16), jnp.ones((64,), jnp.bfloat16)
    text = jax.jit(fwd).lower(p, g).as_text()
    assert "jrn_all_reduce_rms_norm" in text and "all_reduce" not in text.replace("jrn_all_reduce", "")
    text = jax.jit(step).lower(p, g).as_text()
    assert "jrn_all_reduce" not in text and "all_reduce" in text


def test_all_reduce_rms_norm_concurrent_command_buffers(monkeypatch):
    """The kernel's calls on one GPU must run one after another: with XLA_FLAGS
    asking XLA's command buffers to run independent kernels at once, "nvlink"
    raises and "auto" takes psum; the flag's last setting counts."""
    monkeypatch.setattr(jrn._api, "nvlink_available", lambda: True)
    mesh = _mesh("cpu", 1, 2)
    on_mesh = lambda method: partial(jax.shard_map, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))(
        lambda p, g: jrn.all_reduce_rms_norm(p, g, axis_name="model", method=method))
    p, g = random(43, (2 * 4, 64), jnp.bfloat16), random(44, (64,), jnp.bfloat16, offset=1.0)
    prims = lambda method: str(jax.make_jaxpr(on_mesh(method))(p, g))
    flag = "--xla_gpu_command_buffer_scheduling_mode="
    base = os.environ.get("XLA_FLAGS", "")
    assert "jrn_all_reduce_rms_norm" in prims("auto")
    for modes in [("CONCURRENT",), ("LHS", "concurrent")]:
        monkeypatch.setenv("XLA_FLAGS", " ".join([base] + [flag + m for m in modes]))
        with pytest.raises(ValueError, match="method='nvlink' needs the calls on one GPU.*CONCURRENT"):
            prims("nvlink")
        text = prims("auto")
        assert "jrn_all_reduce_rms_norm" not in text and "psum" in text
    monkeypatch.setenv("XLA_FLAGS", " ".join([base, flag + "CONCURRENT", flag + "SERIALIZE"]))
    assert "jrn_all_reduce_rms_norm" in prims("auto") and "jrn_all_reduce_rms_norm" in prims("nvlink")


def test_all_reduce_rms_norm_auto_fallback(monkeypatch):
    """Where the kernel applies but the program is lowered for the CPU, or
    exported, "auto" lowers to psum + rms_norm (the same bits as "psum")."""
    monkeypatch.setattr(jrn._api, "nvlink_available", lambda: True)
    mesh = _mesh("cpu", 2, 2)
    on_mesh = partial(jax.shard_map, mesh=mesh, in_specs=(P("data", "model"), P()), out_specs=P("data", "model"))
    norm = lambda method: jax.jit(on_mesh(lambda p, g: jrn.all_reduce_rms_norm(
        p[0, 0], g, axis_name="model", method=method)[None, None]))
    parts = random(41, (2, 2, 12, 64), jnp.bfloat16)
    g = random(42, (64,), jnp.bfloat16, offset=1.0)
    np.testing.assert_array_equal(f64(norm("auto")(parts, g)), f64(norm("psum")(parts, g)))
    vmapped = jax.jit(on_mesh(lambda p, g: jax.vmap(lambda r: jrn.all_reduce_rms_norm(r, g, axis_name="model"))(
        p[0, 0].reshape(3, 4, 64)).reshape(12, 64)[None, None]))
    np.testing.assert_array_equal(f64(vmapped(parts, g)), f64(norm("psum")(parts, g)))
    if not jrn._ffi.cuda_built():
        return
    from jax import export
    kernel = "custom_call @jrn_all_reduce_rms_norm"
    for platforms in [("cuda",), ("cuda", "cpu")]:
        exported = export.export(norm("auto"), platforms=platforms, disabled_checks=jrn.export_checks())(parts, g)
        assert kernel not in exported.mlir_module(), platforms  # portable: psum
    lowered = norm("auto").trace(parts, g).lower(lowering_platforms=("cuda",)).as_text()
    assert kernel in lowered


def test_all_reduce_rms_norm_nvlink_groups_attribute():
    """The kernel's call names its groups by device ordinal, in the order of
    axis_index: a 2 x 2 mesh summing over "model" is two groups of the
    devices of one "data" index; over "data", the other way; over both, one
    group. Lowered for CUDA on any machine (no GPU needed)."""
    if not jrn._ffi.cuda_built():
        pytest.skip("built without the CUDA module")
    mesh = _mesh("cpu", 2, 2)
    ids = np.vectorize(lambda d: d.local_hardware_id)(mesh.devices)
    on_mesh = partial(jax.shard_map, mesh=mesh, in_specs=(P("data", "model"), P()), out_specs=P("data", "model"))
    parts, g = jnp.ones((2, 2, 4, 64), jnp.bfloat16), jnp.ones((64,), jnp.bfloat16)
    for axes, want in [("model", ids), ("data", ids.T), (("data", "model"), ids.reshape(1, 4))]:
        f = jax.jit(on_mesh(lambda p, g: jrn.all_reduce_rms_norm(p[0, 0], g, axis_name=axes,
                                                                   method="nvlink")[None, None]))
        text = f.trace(parts, g).lower(lowering_platforms=("cuda",)).as_text()
        found = re.search(r"groups = dense<\[([0-9, ]+)\]>", text)
        assert found, text
        assert [int(v) for v in found.group(1).split(",")] == list(want.reshape(-1)), (axes, found.group(0))


def test_all_reduce_rms_norm_nvlink_errors():
    mesh = _mesh("cpu", 1, 4)

    def run(x, **kw):
        @partial(jax.shard_map, mesh=mesh, in_specs=P("model"), out_specs=P("model"))
        def f(p):
            return jrn.all_reduce_rms_norm(p[0], axis_name="model", method="nvlink", **kw)[None]
        return jax.jit(f)(x)

    with pytest.raises(ValueError, match="runs on CUDA GPUs only"):
        run(jnp.ones((4, 8, 64), jnp.float32))
    with pytest.raises(ValueError, match="hidden size to be a multiple of 8 .* got 100"):
        run(jnp.ones((4, 8, 100), jnp.bfloat16))
    with pytest.raises(ValueError, match="at most 8192 for float32, got 8196"):
        run(jnp.ones((4, 2, 8196), jnp.float32))


# ---------------------------------------------------------------------------
# the fused variants under sharded jit: the residual add + norm and the FP8
# outputs with a given per-tensor scale, per-row scales, or per-group scales
# whose groups the split keeps whole, split rows and the hidden dim; current
# scaling, and per-group scales a split would cut, split rows only (the hidden
# dim is gathered); per-tensor amax is the max over every device's rows


def _fused_cases():
    fp8 = jnp.float8_e4m3fn
    return {
        "add": lambda x, r, g: jrn.add_rms_norm(x, r, g),
        "add_layer": lambda x, r, g: jrn.add_layer_norm(x, r, g, g),
        "fp8_tensor": lambda x, r, g: jrn.rms_norm_fp8(x, g, scale=jnp.float32(3.0), out_dtype=fp8,
                                                       residual=r),
        "fp8_layer_tensor": lambda x, r, g: jrn.layer_norm_fp8(x, g, g, scale=jnp.float32(20.0),
                                                               out_dtype=jnp.float8_e5m2, zero_centered_gamma=True),
        "fp8_current": lambda x, r, g: jrn.rms_norm_fp8_current(x, g, out_dtype=fp8),
        # with the transposed copy, a fused output of its own
        "fp8_layer_current_t": lambda x, r, g: jrn.layer_norm_fp8_current(x, g, g, out_dtype=fp8, transpose=True),
        "fp8_row": lambda x, r, g: jrn.rms_norm_fp8_rowwise(x, g, out_dtype=fp8),
        # scale_ub below most rows' max / 448: clamped scales, saturated codes
        "fp8_row_ub": lambda x, r, g: jrn.rms_norm_fp8_rowwise(x, g, out_dtype=fp8, scale_ub=0.003, residual=r,
                                                               h_dtype=jnp.float32),
        "fp8_layer_row": lambda x, r, g: jrn.layer_norm_fp8_rowwise(x, g, g, out_dtype=fp8),
        "fp8_group": lambda x, r, g: jrn.rms_norm_fp8_groupwise(x, g, group_size=16, out_dtype=fp8),
        "fp8_layer_group": lambda x, r, g: jrn.layer_norm_fp8_groupwise(x, g, g, group_size=8, out_dtype=fp8,
                                                                        residual=r, scale_ub=0.004),
        # one group a row: a split of the hidden dim would cut it (gathered)
        "fp8_group_whole_row": lambda x, r, g: jrn.rms_norm_fp8_groupwise(x, g, group_size=64, out_dtype=fp8),
    }


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("case", list(_fused_cases()))
@pytest.mark.parametrize("layout", ["rows", "hidden"])
def test_fused_sharded_matches_unsharded(platform, axis_type, case, layout):
    fn = _fused_cases()[case]
    mesh = _mesh(platform, 2, 1, axis_type) if layout == "rows" else _mesh(platform, 1, 2, axis_type)
    spec = P("data", None) if layout == "rows" else P(None, "model")
    x = random(21, (8, 64), jnp.bfloat16, scale=2.0)
    r = random(22, (8, 64), jnp.bfloat16)
    g = random(23, (64,), jnp.float32)
    f = jax.jit(fn)
    dev = jax.devices(platform)[0]
    want = f(*jax.device_put((x, r, g), dev))
    with jax.set_mesh(mesh):
        got = f(jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(r, NamedSharding(mesh, spec)),
                jax.device_put(g, NamedSharding(mesh, P(spec[1]))))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        # Equal up to float32 summation order (and, split along the hidden
        # dim, float32 contraction: an FP8 code may then round the other way).
        if a.dtype.itemsize == 1:
            diff = np.abs(f64(a) - f64(b)) > 2e-2 + 2e-2 * np.abs(f64(b))
            assert diff.mean() < 0.01, (case, diff.sum())
            np.testing.assert_allclose(f64(a), f64(b), rtol=0.25, atol=2e-2)
        else:
            np.testing.assert_allclose(f64(a), f64(b), rtol=2e-2, atol=2e-2)
    if case == "fp8_row_ub":  # the bound took effect
        assert np.all(f64(got[1]) <= np.float32(0.003)) and np.any(np.abs(f64(got[0])) == 448.0)

    if "current" not in case:  # gradients through the fused backward (straight-through for FP8)
        def loss(x, r, g):
            out = fn(x, r, g)
            h = out[2] if len(out) == 3 else out[1] if case.startswith("add") else None
            total = loss_of(out[0].astype(jnp.float32))
            return total if h is None else total + loss_of(h.astype(jnp.float32))
        gf = jax.jit(jax.grad(loss, (0, 1, 2), allow_int=True))
        want_g = gf(*jax.device_put((x, r, g), dev))
        with jax.set_mesh(mesh):
            got_g = gf(jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(r, NamedSharding(mesh, spec)),
                       jax.device_put(g, NamedSharding(mesh, P(spec[1]))))
        for a, b in zip(got_g, want_g):
            np.testing.assert_allclose(f64(a), f64(b), rtol=3e-2, atol=3e-2)


def test_fused_rows_sharded_hlo():
    mesh = _mesh("cpu", 8, 1)
    x = random(24, (64, 512), jnp.bfloat16)
    g = random(25, (512,), jnp.float32)
    f = jax.jit(lambda x, r, g: jrn.rms_norm_fp8(x, g, scale=jnp.float32(2.0), residual=r))
    args = (jax.device_put(x, NamedSharding(mesh, P("data", None))),
            jax.device_put(x, NamedSharding(mesh, P("data", None))), jax.device_put(g, NamedSharding(mesh, P())))
    comms = _collectives(f.lower(*args).compile().as_text())
    # only the amax (one float) crosses devices
    assert comms and all(op == "all-reduce" and n <= 1 for op, n in comms), comms


def test_explicit_types_of_split_outputs():
    """Under explicit mesh axes an output's type says how the kernels split it
    (JAX 0.11 reshards an output to its type): per-group scales with the
    hidden dim where each slice holds whole groups, the columnwise copy and
    its scales with the rows; unsplit where the groups do not divide."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2,
                         devices=jax.devices("cpu")[:8])
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
    x, g = random(70, (64, 1024), jnp.bfloat16), random(71, (1024,), jnp.float32, offset=1.0)
    with jax.set_mesh(mesh):
        _, scales, _ = jrn.rms_norm_fp8_groupwise(put(x, None, "model"), put(g, "model"), group_size=32,
                                                  residual=put(x, None, "model"))
        assert jax.typeof(scales).sharding.spec == P(None, "model")
        _, _, q_t, q_t_scales = jrn.rms_norm_mxfp8(put(x, "data", None), put(g), transpose=True)
        assert jax.typeof(q_t).sharding.spec == P(None, "data") == jax.typeof(q_t_scales).sharding.spec
        narrow = put(x[:, :64], None, "model")  # 2 groups over 4 devices
        _, scales, _ = jrn.rms_norm_fp8_groupwise(narrow, None, group_size=32, residual=narrow)
        assert tuple(jax.typeof(scales).sharding.spec) in ((), (None, None))


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("case", ["tensor", "row", "group"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_fp8_hidden_sharded_hlo_moves_statistics_only(kind, case, axis_type):
    # FP8 output (after the residual add) with the hidden dim split: the
    # statistics, the amax or row maxima, and the dgamma slices cross devices;
    # no activation, and no group scale, does. Each slice is normalized and
    # quantized by the apply_fp8 kernel.
    rows, hidden = 64, 1024
    prefix = "rms_norm_fp8" if kind == "rms" else "layer_norm_fp8"
    norm = getattr(jrn, prefix + {"tensor": "", "row": "_rowwise", "group": "_groupwise"}[case])
    extra = () if kind == "rms" else (None,)
    kw = {"tensor": dict(scale=jnp.float32(4.0)), "row": {}, "group": dict(group_size=32)}[case]

    def loss(x, r, g, _):
        q, scales, h = norm(x, g, *extra, residual=r, **kw)
        return loss_of(q.astype(jnp.float32)) + loss_of(h.astype(jnp.float32)) + jnp.sum(scales)

    hlo, comms = _hidden_sharded_hlo(axis_type, loss, 2, 61, rows, hidden)
    local_rows, local_hidden = rows // 2, hidden // 4
    assert comms and any(op == "all-reduce" for op, _ in comms)
    assert all(n <= max(2 * local_rows * 4, 2 * local_hidden + 2) for _, n in comms), comms
    # h and its slice's statistics in one pass, then the apply_fp8 kernel
    assert "jrn_" + kind + "_norm_add_stats" in hlo and "jrn_" + kind + "_norm_apply_fp8" in hlo


def test_fp8_vmapped_scale_hidden_sharded():
    # A per-tensor scale per vmapped example, with vmapped gamma: each
    # example's amax over all of its rows (gathered) and its hidden slices
    # (combined by pmax); codes, amax and gradients as unsharded.
    mesh = _mesh("cpu", 2, 4)
    x = random(31, (3, 16, 256), jnp.bfloat16, scale=2.0)
    g = random(33, (3, 256), jnp.float32)
    s = jnp.array([1.0, 4.0, 9.0], jnp.float32)
    fn = jax.jit(jax.vmap(lambda x, g, s: jrn.rms_norm_fp8(x, g, scale=s)))
    grad = jax.jit(jax.grad(lambda x, g, s: loss_of(fn(x, g, s)[0].astype(jnp.float32)), (0, 1)))
    want, want_g = fn(x, g, s), grad(x, g, s)
    with jax.set_mesh(mesh):
        args = (jax.device_put(x, NamedSharding(mesh, P(None, "data", "model"))),
                jax.device_put(g, NamedSharding(mesh, P(None, "model"))), s)
        got, got_g = fn(*args), grad(*args)
    np.testing.assert_array_equal(f64(got[0]), f64(want[0]))
    np.testing.assert_allclose(f64(got[1]), f64(want[1]), rtol=1e-6)
    for a, b in zip(got_g, want_g):  # summation order: within a bf16 rounding of dx
        np.testing.assert_allclose(f64(a), f64(b), rtol=1e-2, atol=1e-3)


def _add_norm(kind, h_dtype, zero_centered):
    def fn(x, r, g, b):
        if kind == "rms":
            return jrn.add_rms_norm(x, r, g, h_dtype=h_dtype, zero_centered_gamma=zero_centered)
        return jrn.add_layer_norm(x, r, g, b, h_dtype=h_dtype, zero_centered_gamma=zero_centered)

    def loss(x, r, g, b):
        y, h = fn(x, r, g, b)
        return loss_of(y.astype(jnp.float32)) + loss_of(h.astype(jnp.float32))
    return fn, loss


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("h_dtype", [None, jnp.float32], ids=["h_x", "h_f32"])
def test_add_norm_hidden_sharded_matches_unsharded(platform, axis_type, kind, h_dtype):
    # rows and hidden split at once (2 x 4; on GPUs the hidden dim over 2),
    # rank-3 x, bf16 parameters (with h in float32 the kernels take them in
    # float32), zero-centered gamma
    mesh = _mesh(platform, 2, 4, axis_type) if platform == "cpu" else _mesh(platform, 1, 2, axis_type)
    x = random(41, (4, 6, 128), jnp.bfloat16, scale=2.0)
    r = random(42, (4, 6, 128), jnp.bfloat16)
    g = random(43, (128,), jnp.bfloat16)
    b = random(44, (128,), jnp.bfloat16)
    fn, loss = _add_norm(kind, h_dtype, True)
    f = jax.jit(lambda *a: (fn(*a), jax.grad(loss, (0, 1, 2, 3))(*a)))
    dev = jax.devices(platform)[0]
    want = f(*jax.device_put((x, r, g, b), dev))
    xs, ps = NamedSharding(mesh, P("data", None, "model")), NamedSharding(mesh, P("model"))
    with jax.set_mesh(mesh):
        got = f(jax.device_put(x, xs), jax.device_put(r, xs), jax.device_put(g, ps), jax.device_put(b, ps))
    (y, h), grads = got
    assert h.dtype == (h_dtype or jnp.bfloat16) and y.dtype == jnp.bfloat16
    assert y.sharding.spec == P("data", None, "model"), y.sharding
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == w.dtype and a.shape == w.shape
        assert np.all(np.isfinite(f64(a)))
        if a.ndim == 1:
            # dgamma/dbeta, sums over the rows: atol scaled by their size, as
            # in the value tests. On 2 H100s one column of 128 came out 0.088
            # against 0.116 (LayerNorm, h in float32), outside a flat 0.02.
            # The likely cause: the statistics differ in float32 summation
            # order, a y element near |y| = 4 rounds to the neighbouring bf16
            # value (0.03 away), and the row sum takes its cotangent's change whole.
            assert_close(a, f64(w), w.dtype, "dgamma/dbeta")
        else:
            # Same statistics up to float32 summation order: within bf16 rounding.
            np.testing.assert_allclose(f64(a), f64(w), rtol=2e-2, atol=2e-2)
    # h is x + residual, computed the same way on every device: exact
    np.testing.assert_array_equal(f64(h), f64(want[0][1]))


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_add_norm_hidden_sharded_hlo_moves_statistics_only(axis_type, kind):
    rows, hidden = 64, 1024
    hlo, comms = _hidden_sharded_hlo(axis_type, _add_norm(kind, None, False)[1], 2, 45, rows, hidden)
    local_rows, local_hidden = rows // 2, hidden // 4
    # No activation moves: statistics (RMSNorm one float a row each way,
    # LayerNorm's gathered pairs and two gradient sums a row) and the
    # dgamma/dbeta slices summed over the rows' axis (with the loss's scalars).
    assert comms and any(op == "all-reduce" for op, _ in comms)
    assert all(n <= max(2 * local_rows * 4, 2 * local_hidden + 2) for _, n in comms), comms
    # XLA may combine the loss's two scalars (of y and of h) with them.
    per_row = 1 if kind == "rms" else 2
    stats = [n for _, n in comms if n < local_hidden]
    assert stats and max(stats) <= per_row * local_rows + 2, comms
    assert "jrn_" + kind + "_norm_bwd_given_add" in hlo


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("dtype,h_dtype", [(jnp.float32, None), (jnp.bfloat16, None),
                                           (jnp.bfloat16, jnp.float32)], ids=["f32", "bf16", "bf16_h_f32"])
def test_add_norm_shard_map_axis_name(platform, kind, dtype, h_dtype):
    # The hidden dim split over "model" (on one GPU, an axis of size 1: the
    # same code path and kernels), against float64 references.
    n = 4 if platform == "cpu" else min(2, len(jax.devices(platform)))
    mesh = _mesh(platform, 2 if platform == "cpu" else 1, n)
    x = random(48, (8, 3, 128), dtype, scale=2.0, offset=0.5)
    r = random(49, (8, 3, 128), dtype)
    g = random(50, (128,), jnp.float32)
    b = random(51, (128,), jnp.float32)
    dy = random(52, (8, 3, 128), dtype)
    dh = random(53, (8, 3, 128), h_dtype or dtype)
    eps = 1e-5

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P("data", None, "model"),) * 2 + (P("model"),) * 2,
             out_specs=(P("data", None, "model"),) * 2)
    def fwd(x, r, g, b):
        if kind == "rms":
            return jrn.add_rms_norm(x, r, g, eps=eps, h_dtype=h_dtype, axis_name="model")
        return jrn.add_layer_norm(x, r, g, b, eps=eps, h_dtype=h_dtype, axis_name="model")

    y, h = fwd(x, r, g, b)
    want_h = ref_add(x, r, h_dtype or dtype)
    np.testing.assert_array_equal(f64(h), f64(want_h))
    want_y = ref_forward(kind, want_h, g, b if kind == "layer" else None, eps=eps)[0]
    assert y.dtype == dtype and h.dtype == (h_dtype or dtype)
    _close(y, want_y, dtype)

    # Gradients: the norm's dx at h plus dh, for both x and the residual.
    (_, vjp) = jax.vjp(fwd, x, r, g, b)
    gx, gr, gg, gb = jax.jit(vjp)((dy, dh))
    rdx, rdg, rdb = ref_backward(kind, dy, want_h, g, eps=eps)
    want_dx = rdx + f64(dh)
    scale = 20 if (h_dtype or dtype) == jnp.float32 else 2
    for got, want in ((gx, want_dx), (gr, want_dx)):
        assert got.dtype == dtype
        _close(got, want, dtype, scale=scale)
    np.testing.assert_allclose(f64(gg), rdg, rtol=1e-3 if dtype == jnp.float32 else 2e-2, atol=1e-3 * x.size)
    if kind == "layer":
        np.testing.assert_allclose(f64(gb), rdb, rtol=1e-3 if dtype == jnp.float32 else 2e-2, atol=1e-3 * x.size)
    else:
        assert not np.any(f64(gb))  # beta is not an input of the RMSNorm


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_add_norm_axis_name_vmapped(platform, kind):
    # vmap inside shard_map: the statistics kernel with the residual
    # (h and its statistics in one pass) batched; h exact, y as unsplit,
    # and a gradient through it
    mesh = _mesh(platform, 1, 2)
    x = random(61, (3, 5, 64), jnp.bfloat16, scale=2.0)
    r = random(62, (3, 5, 64), jnp.float32)
    g = random(63, (64,), jnp.bfloat16)
    b = random(64, (64,), jnp.bfloat16)

    def one(x, r, g, b, axis_name=None):
        if kind == "rms":
            return jrn.add_rms_norm(x, r, g, h_dtype=jnp.float32, axis_name=axis_name)
        return jrn.add_layer_norm(x, r, g, b, h_dtype=jnp.float32, axis_name=axis_name)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, None, "model"),) * 2 + (P("model"),) * 2,
             out_specs=(P(None, None, "model"),) * 2)
    def split(x, r, g, b):
        return jax.vmap(lambda a, c: one(a, c, g, b, "model"))(x, r)

    y, h = split(x, r, g, b)
    want_h = ref_add(x, r, jnp.float32)
    np.testing.assert_array_equal(f64(h), f64(want_h))
    want_y = np.stack([ref_forward(kind, want_h[i], g, b if kind == "layer" else None,
                                   eps=1e-6 if kind == "rms" else 1e-5)[0] for i in range(3)])
    _close(y, want_y, jnp.bfloat16)
    loss = lambda x, r: loss_of(split(x, r, g, b)[0].astype(jnp.float32))
    whole = lambda x, r: loss_of(jax.vmap(lambda a, c: one(a, c, g, b))(x, r)[0].astype(jnp.float32))
    dev = jax.devices(platform)[0]
    for got, want in zip(jax.jit(jax.grad(loss, (0, 1)))(x, r),
                         jax.jit(jax.grad(whole, (0, 1)))(*jax.device_put((x, r), dev))):
        np.testing.assert_allclose(f64(got), f64(want), rtol=2e-2, atol=2e-2)


def test_add_norm_axis_name_errors():
    q = jnp.ones((4, 16), jnp.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="axis_name is not supported with an FP8 x"):
        jrn.add_rms_norm(q, jnp.ones((4, 16), jnp.bfloat16), x_scale=jnp.float32(1.0), axis_name="model")
