"""Flax linen, Flax NNX and Equinox drop-ins: same parameters as the modules
they replace, same outputs and gradients given the same parameters."""

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from reference import TOL, put, random

flax_linen = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")

import jax_rmsnorm.equinox as jeqx  # noqa: E402
import jax_rmsnorm.flax as jlinen  # noqa: E402
import jax_rmsnorm.flax.nnx as jnnx  # noqa: E402


def _close(a, b, dtype):
    rtol, atol = TOL[np.dtype(dtype)]
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(1.0, np.abs(b).max()))


def _same_tree(a, b):
    """Same parameter names (paths), shapes and dtypes; container classes may differ."""
    def spec(t):
        leaves = jax.tree_util.tree_flatten_with_path(t)[0]
        return [(jax.tree_util.keystr(path), v.shape, v.dtype) for path, v in leaves]
    assert spec(a) == spec(b)


LINEN_CASES = [
    ("RMSNorm", {}),
    ("RMSNorm", {"use_scale": False}),
    ("RMSNorm", {"param_dtype": jnp.bfloat16, "epsilon": 1e-5}),
    ("RMSNorm", {"dtype": jnp.bfloat16}),
    ("LayerNorm", {}),
    ("LayerNorm", {"use_bias": False}),
    ("LayerNorm", {"use_scale": False, "epsilon": 1e-3}),
    ("LayerNorm", {"dtype": jnp.float32, "param_dtype": jnp.bfloat16}),
]


@pytest.mark.parametrize("name, kwargs", LINEN_CASES)
@pytest.mark.parametrize("xdtype", [jnp.float32, jnp.bfloat16])
def test_linen_matches_flax(name, kwargs, xdtype, platform):
    ours, theirs = getattr(jlinen, name)(**kwargs), getattr(flax_linen, name)(**kwargs)
    (x,) = put(platform, random(1, (3, 5, 48), xdtype, scale=2.0, offset=0.3))
    params = theirs.init(jax.random.key(0), x)
    _same_tree(ours.init(jax.random.key(0), x), params)
    # perturb the parameters so scale/bias are not trivial
    params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(2), p.shape, p.dtype), params)
    y, y_ref = ours.apply(params, x), theirs.apply(params, x)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    _close(y, y_ref, y_ref.dtype)
    loss = lambda m: lambda p, x: jnp.sum(jnp.sin(m.apply(p, x).astype(jnp.float32)))
    g, g_ref = jax.grad(loss(ours), (0, 1))(params, x), jax.grad(loss(theirs), (0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        _close(a, b, jnp.promote_types(a.dtype, xdtype) if a.dtype != jnp.float32 else xdtype)


@pytest.mark.parametrize("name, kwargs", [("RMSNorm", {}), ("RMSNorm", {"use_scale": False}),
                                          ("LayerNorm", {}), ("LayerNorm", {"dtype": jnp.bfloat16})])
def test_nnx_matches_flax(name, kwargs, platform):
    ours = getattr(jnnx, name)(48, rngs=nnx.Rngs(0), **kwargs)
    theirs = getattr(nnx, name)(48, rngs=nnx.Rngs(0), **kwargs)
    _same_tree(nnx.state(ours, nnx.Param), nnx.state(theirs, nnx.Param))
    (x,) = put(platform, random(3, (4, 48), jnp.bfloat16, scale=2.0))
    y, y_ref = ours(x), theirs(x)
    assert y.dtype == y_ref.dtype
    _close(y, y_ref, y_ref.dtype)
    grad = lambda m: nnx.grad(lambda m: jnp.sum(jnp.sin(m(x).astype(jnp.float32))))(m)
    for a, b in zip(jax.tree.leaves(grad(ours)), jax.tree.leaves(grad(theirs))):
        _close(a, b, jnp.bfloat16)


@pytest.mark.parametrize("name, shape, kwargs", [
    ("RMSNorm", 32, {}), ("RMSNorm", 32, {"use_bias": False}), ("RMSNorm", (4, 8), {}),
    ("LayerNorm", 32, {}), ("LayerNorm", 32, {"use_weight": False, "use_bias": False}),
    ("LayerNorm", (2, 16), {"eps": 1e-3}),
])
def test_equinox_matches_equinox(name, shape, kwargs, platform):
    ours, theirs = getattr(jeqx, name)(shape, **kwargs), getattr(eqx.nn, name)(shape, **kwargs)
    _same_tree(eqx.filter(ours, eqx.is_array), eqx.filter(theirs, eqx.is_array))
    full = (6,) + ((shape,) if isinstance(shape, int) else tuple(shape))
    (x,) = put(platform, random(4, full, jnp.float32, scale=2.0, offset=0.5))
    # the same non-trivial parameters in both
    def with_params(m):
        params, static = eqx.partition(m, eqx.is_array)
        leaves, treedef = jax.tree.flatten(params)
        new = [0.5 + jax.random.uniform(jax.random.key(i), l.shape) for i, l in enumerate(leaves)]
        return eqx.combine(jax.tree.unflatten(treedef, new), static)

    ours, theirs = with_params(ours), with_params(theirs)
    y, y_ref = jax.vmap(ours)(x), jax.vmap(theirs)(x)
    _close(y, y_ref, jnp.float32)
    y1, state = ours(x[0], "state")
    assert state == "state"
    _close(y1, y_ref[0], jnp.float32)
    loss = lambda m, x: jnp.sum(jnp.sin(jax.vmap(m)(x)))
    g, g_ref = eqx.filter_grad(loss)(ours, x), eqx.filter_grad(loss)(theirs, x)
    for a, b in zip(jax.tree.leaves(eqx.filter(g, eqx.is_array)), jax.tree.leaves(eqx.filter(g_ref, eqx.is_array))):
        _close(a, b, jnp.float32)
    with pytest.raises(ValueError, match="must satisfy the invariant"):  # Equinox's own error
        ours(x)


def test_zero_centered_gamma_option():
    x = random(5, (3, 16), jnp.float32)
    m = jeqx.RMSNorm(16, use_bias=False, zero_centered_gamma=True)
    m = eqx.tree_at(lambda m: m.weight, m, jnp.full((16,), 0.5))
    ref = eqx.tree_at(lambda m: m.weight, eqx.nn.RMSNorm(16, use_bias=False), jnp.full((16,), 1.5))
    _close(jax.vmap(m)(x), jax.vmap(ref)(x), jnp.float32)
    lin = jlinen.RMSNorm(zero_centered_gamma=True)
    p = {"params": {"scale": jnp.full((16,), 0.5)}}
    _close(lin.apply(p, x), flax_linen.RMSNorm().apply({"params": {"scale": jnp.full((16,), 1.5)}}, x), jnp.float32)


@pytest.mark.parametrize("api", ["linen", "nnx"])
@pytest.mark.parametrize("name", ["RMSNorm", "LayerNorm"])
def test_axis_name_features_split_matches_flax(api, name):
    # Inside shard_map with the features split over "model" (4 CPU devices):
    # flax averages its statistics over the axis; ours combines the kernels'
    # per-row statistics over it. Same outputs and gradients.
    from functools import partial
    from jax.sharding import PartitionSpec as P

    devices = jax.devices("cpu")
    if len(devices) < 4:
        pytest.skip("needs 4 CPU devices")
    mesh = jax.sharding.Mesh(np.asarray(devices[:4]), ("model",))
    x = random(6, (6, 64), jnp.float32, scale=2.0, offset=0.7)
    kwargs = dict(axis_name="model", use_fast_variance=False) if name == "LayerNorm" else dict(axis_name="model")
    if api == "linen":
        mods = [getattr(m, name)(**kwargs) for m in (jlinen, flax_linen)]
        params = flax_linen.LayerNorm().init(jax.random.key(0), x)["params"] if name == "LayerNorm" else {
            "scale": jnp.ones((64,))}
        params = jax.tree.map(lambda p: p + random(7, p.shape, p.dtype, scale=0.3), params)
        calls = [lambda p, xs, m=m: m.apply({"params": p}, xs) for m in mods]
    else:
        params = {k: random(8 + i, (64,), jnp.float32, scale=0.3, offset=1.0)
                  for i, k in enumerate(["scale", "bias"][:2 if name == "LayerNorm" else 1])}

        def call_nnx(p, xs, cls):
            m = cls(16, rngs=nnx.Rngs(0), **kwargs)  # this device's 16 features
            for k, v in p.items():
                getattr(m, k)[...] = v
            return m(xs)
        calls = [partial(call_nnx, cls=getattr(m, name)) for m in (jnnx, nnx)]
    results = []
    for call in calls:
        run = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=(P("model"), P(None, "model")),
                                    out_specs=P(None, "model"), check_vma=False))
        loss = lambda p, x: jnp.sum(jnp.sin(run(p, x)))
        results.append((run(params, x), jax.grad(loss, (0, 1))(params, x)))
    (y, g), (y_ref, g_ref) = results
    _close(y, y_ref, jnp.float32)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        _close(a, b, jnp.float32)
