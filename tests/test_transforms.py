"""jit, vmap (over x only, over the parameters too, nested), checkpoint, and
whole-model value_and_grad; each compared with a per-example loop or the
float64 reference."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_rmsnorm as jrn
from reference import assert_close, put, random, ref_backward, ref_forward

KINDS = ["rms", "layer"]


def _fn(kind):
    if kind == "rms":
        return lambda x, g, b: jrn.rms_norm(x, g, zero_centered_gamma=True)
    return lambda x, g, b: jrn.layer_norm(x, g, b)


def _loop(f, xs, gs, bs, in_axes):
    n = next(a.shape[ax] for a, ax in zip((xs, gs, bs), in_axes) if ax is not None)
    take = lambda a, ax, i: a if ax is None else jnp.take(a, i, axis=ax)
    return jnp.stack([f(take(xs, in_axes[0], i), take(gs, in_axes[1], i), take(bs, in_axes[2], i))
                      for i in range(n)])


# Hidden 23 is no multiple of a 16-byte pack: on a GPU each (example, row)
# then starts at its own offset from a 16-byte boundary, and so does each
# example's gamma and beta under vmap (fwd_unaligned).
@pytest.mark.parametrize("H", [24, 23])
@pytest.mark.parametrize("in_axes", [(0, None, None), (1, None, None), (2, None, None),
                                     (0, 0, 0), (None, 0, None), (1, 0, None)])
@pytest.mark.parametrize("kind", KINDS)
def test_vmap_forward(kind, in_axes, H, platform):
    f = _fn(kind)
    B, R = 3, 5
    shape = {0: (B, R, H), 1: (R, B, H), 2: (R, H, B), None: (R, H)}[in_axes[0]]
    xs = random(1, shape, jnp.float32)
    gs = random(2, (B, H) if in_axes[1] == 0 else (H,), jnp.float32, offset=1.0)
    bs = random(3, (B, H) if in_axes[2] == 0 else (H,), jnp.float32)
    xs, gs, bs = put(platform, xs, gs, bs)
    got = jax.jit(jax.vmap(f, in_axes=in_axes))(xs, gs, bs)
    want = _loop(f, xs, gs, bs, in_axes)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_axes", [(0, None, None), (0, 0, 0), (None, 0, 0)])
@pytest.mark.parametrize("kind", KINDS)
def test_vmap_of_grad_is_per_example(kind, in_axes, platform):
    f = _fn(kind)
    loss = lambda x, g, b: jnp.sum(f(x, g, b) * jnp.arange(x.shape[-1], dtype=x.dtype))
    grad = jax.grad(loss, argnums=(0, 1, 2))
    B, R, H = 4, 6, 40
    xs = random(4, (B, R, H) if in_axes[0] == 0 else (R, H), jnp.float32)
    gs = random(5, (B, H) if in_axes[1] == 0 else (H,), jnp.float32, offset=1.0)
    bs = random(6, (B, H) if in_axes[2] == 0 else (H,), jnp.float32)
    xs, gs, bs = put(platform, xs, gs, bs)
    got = jax.jit(jax.vmap(grad, in_axes=in_axes))(xs, gs, bs)
    for i in range(B):
        take = lambda a, ax: a if ax is None else a[i]
        want = grad(take(xs, in_axes[0]), take(gs, in_axes[1]), take(bs, in_axes[2]))
        for gi, wi in zip(got, want):
            np.testing.assert_allclose(np.asarray(gi[i]), np.asarray(wi), rtol=1e-4, atol=1e-5)


def test_nested_vmap(platform):
    f = lambda x, g: jrn.rms_norm(x, g)
    xs = random(7, (2, 3, 5, 16), jnp.float32)
    gs = random(8, (2, 3, 16), jnp.float32, offset=1.0)
    xs, gs = put(platform, xs, gs)
    got = jax.vmap(jax.vmap(f))(xs, gs)
    want, _, _ = ref_forward("rms", xs, None, None, 1e-6)
    want = want * np.asarray(gs)[:, :, None, :]
    assert_close(got, want, jnp.float32, "nested vmap")


def test_nested_vmap_of_grad_without_beta(platform):
    # LayerNorm without beta: the backward's absent dbeta stays unbatched
    # under each vmap (the gradient's linear map runs the backward kernel
    # under both vmaps at once).
    loss = lambda x, g: jnp.sum(jrn.layer_norm(x, g) * jnp.arange(x.shape[-1], dtype=x.dtype))
    xs = random(9, (2, 3, 5, 16), jnp.float32)
    gs = random(10, (2, 3, 16), jnp.float32, offset=1.0)
    xs, gs = put(platform, xs, gs)
    got = jax.jit(jax.vmap(jax.vmap(jax.grad(loss, (0, 1)))))(xs, gs)
    for i in range(2):
        for j in range(3):
            want = jax.grad(loss, (0, 1))(xs[i, j], gs[i, j])
            for a, w in zip(got, want):
                np.testing.assert_allclose(np.asarray(a[i, j]), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_grad_of_sum_over_vmap_sums_dgamma(platform):
    # Shared gamma under vmap: the cotangent of gamma sums over the batch.
    xs = random(9, (3, 4, 32), jnp.float32)
    g = random(10, (32,), jnp.float32, offset=1.0)
    xs, g = put(platform, xs, g)
    loss = lambda g: jnp.sum(jax.vmap(lambda x: jrn.layer_norm(x, g))(xs) ** 2)
    dg = jax.grad(loss)(g)
    dy = 2 * np.asarray(jrn.layer_norm(xs, g))
    _, dg_ref, _ = ref_backward("layer", dy, xs, g, 1e-5)
    assert_close(dg, dg_ref, jnp.float32, "dgamma", scale=10.0)


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_and_model_value_and_grad(kind, platform):
    norm = (lambda x, g: jrn.rms_norm(x, g)) if kind == "rms" else (lambda x, g: jrn.layer_norm(x, g))
    ref = ((lambda x, g: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g) if kind == "rms" else
           (lambda x, g: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5) * g))

    def model(params, x, norm):
        for w, g in params:
            h = jax.checkpoint(lambda x, g: norm(x, g))(x, g)
            x = x + jnp.tanh(h @ w)
        return jnp.mean(norm(x, params[0][1]) ** 2)

    H = 32
    params = [(random(11 + i, (H, H), jnp.float32, scale=0.2), random(20 + i, (H,), jnp.float32, offset=1.0))
              for i in range(3)]
    x = random(30, (8, H), jnp.float32)
    params = jax.device_put(params, jax.devices(platform)[0])
    (x,) = put(platform, x)
    v, gr = jax.jit(jax.value_and_grad(model), static_argnums=2)(params, x, norm)
    v_ref, gr_ref = jax.value_and_grad(model)(params, x, ref)
    np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(gr), jax.tree.leaves(gr_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_lowering_picks_the_platform_target():
    f = jax.jit(lambda x, g: jrn.rms_norm(x, g))
    x, g = jnp.ones((4, 8)), jnp.ones((8,))
    cpu_text = f.trace(x, g).lower(lowering_platforms=("cpu",)).as_text()
    assert "jrn_rms_norm_fwd" in cpu_text
    if jrn.cuda_built():
        cuda_text = f.trace(x, g).lower(lowering_platforms=("cuda",)).as_text()
        assert "jrn_rms_norm_fwd" in cuda_text
    else:
        with pytest.raises(RuntimeError, match="without its CUDA kernels"):
            f.trace(x, g).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("kind", KINDS)
def test_grad_inside_shard_map_rows_split(kind):
    # Rows split over 'data', parameters replicated: dgamma/dbeta are the sum
    # of every device's partial, and equal the unsharded gradients.
    from jax.sharding import PartitionSpec as P
    cpus = jax.devices("cpu")
    if len(cpus) < 4:
        pytest.skip("needs 4 CPU devices")
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=cpus[:4])
    norm = _fn(kind)
    x = random(40, (8, 3, 32), jnp.float32, offset=0.2)
    g = random(41, (32,), jnp.float32, offset=1.0)
    b = random(42, (32,), jnp.float32)
    w = random(43, (8, 3, 32), jnp.float32)
    local = lambda x, g, b, w: jax.lax.psum(jnp.sum(norm(x, g, b) * w), "data")
    grad = jax.jit(jax.shard_map(jax.grad(local, (0, 1, 2)), mesh=mesh,
                                 in_specs=(P("data"), P(), P(), P("data")), out_specs=(P("data"), P(), P())))
    got = grad(x, g, b, w)
    want = jax.grad(lambda x, g, b: jnp.sum(norm(x, g, b) * w), (0, 1, 2))(x, g, b)
    for a, e in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-5)
