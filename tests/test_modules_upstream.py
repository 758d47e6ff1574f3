"""The behaviours that flax's and Equinox's own normalization tests check,
checked on this library's drop-ins against the modules they replace:
parameter trees and graph state, outputs and gradients, dtypes under the
promotion rules (strict included, as Equinox's suite runs), several reduction
axes, masks and other options that run the replaced module's own code (with
a one-time FallbackWarning), x64 on and off, float64 NumPy inputs.

Each test also pins the path its calls take (the kernels, or the fallback),
from the counts the modules keep. tools/upstream_norm_tests.py runs the
upstream suites themselves with these modules swapped in."""

import contextlib
import os
import warnings
from functools import partial

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from reference import TOL

flax_linen = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")

import jax_rmsnorm.equinox as jeqx  # noqa: E402
import jax_rmsnorm.flax as jlinen  # noqa: E402
import jax_rmsnorm.flax.nnx as jnnx  # noqa: E402
from jax_rmsnorm import FallbackWarning, _modules  # noqa: E402

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16


@pytest.fixture(autouse=True)
def fresh_warnings():
    # Each test sees its fallbacks' first (and only) warning.
    _modules._warned.clear()


@contextlib.contextmanager
def takes(path):
    """The module calls inside take ``path`` ("kernel" or "fallback") and no
    other; a kernel call warns nothing (flax's and Equinox's suites turn
    every warning into an error)."""
    before = _modules.calls.copy()
    with warnings.catch_warnings():
        if path == "kernel":
            warnings.simplefilter("error", FallbackWarning)
        yield
    taken = _modules.calls - before
    assert set(taken) == {path}, dict(taken)


def random(key, shape, dtype, scale=1.0, offset=0.0):
    """Test data from NumPy's generator (jax.random would compile per shape)."""
    v = np.random.default_rng(key).standard_normal(shape, np.float32) * scale + offset
    return jnp.asarray(v).astype(dtype)


def close(a, b, dtype=F32, scale=1.0):
    rtol, atol = TOL[np.dtype(dtype)]
    a, b = np.asarray(jnp.asarray(a, F32), np.float64), np.asarray(jnp.asarray(b, F32), np.float64)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(scale, np.abs(b).max()))


def spec(tree):
    """Paths, shapes and dtypes of a pytree's arrays."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(jax.tree_util.keystr(p), np.shape(v), np.dtype(v.dtype)) for p, v in leaves]


def perturbed(tree, key=2):
    """Non-trivial parameters of the same tree (each leaf in its dtype)."""
    leaves, treedef = jax.tree.flatten(tree)
    new = [(l.astype(F32) + 0.3 * random(key + i, l.shape, F32)).astype(l.dtype) for i, l in enumerate(leaves)]
    return jax.tree.unflatten(treedef, new)


def eqx_params(m, key=2):
    """The Equinox module m with non-trivial weight and bias (each in its
    dtype), the same for any module of the same shape and dtypes."""
    for i, attr in enumerate(("weight", "bias")):
        if getattr(m, attr) is not None:
            m = eqx.tree_at(lambda m: getattr(m, attr), m, perturbed(getattr(m, attr), key + 10 * i))
    return m


def sin_loss(y):
    return jnp.sum(jnp.sin(y.astype(F32)))


def linen_pair(name, x, mask=None, **kwargs):
    """Ours and flax's linen module on the same non-trivial parameters:
    ``(params, y, grads wrt (params, x))`` of each, jitted. The initial
    parameters are checked equal (names, shapes, dtypes, values)."""
    ours, theirs = getattr(jlinen, name)(**kwargs), getattr(flax_linen, name)(**kwargs)
    init = jax.jit(partial(theirs.init, mask=mask))(jax.random.key(0), x)
    mine = jax.jit(partial(ours.init, mask=mask))(jax.random.key(0), x)
    assert spec(mine) == spec(init)
    jax.tree.map(np.testing.assert_array_equal, mine, init)
    params = perturbed(init)
    out = []
    for m in (ours, theirs):
        apply = partial(m.apply, mask=mask)
        run = jax.jit(lambda p, x, apply=apply: (apply(p, x), jax.grad(lambda p, x: sin_loss(apply(p, x)), (0, 1))(p, x)))
        out.append((params, *run(params, x)))
    return out


def nnx_pair(name, num_features, x, call=lambda m, x: m(x), **kwargs):
    """Ours and flax's NNX module with the same non-trivial parameters:
    ``(module, y, grads wrt the parameters)`` of each, jitted; same state."""
    ours = getattr(jnnx, name)(num_features, rngs=nnx.Rngs(0), **kwargs)
    theirs = getattr(nnx, name)(num_features, rngs=nnx.Rngs(0), **kwargs)
    assert spec(nnx.state(ours, nnx.Param)) == spec(nnx.state(theirs, nnx.Param))
    state = perturbed(nnx.state(theirs, nnx.Param))
    out = []
    for m in (ours, theirs):
        nnx.update(m, state)
        graphdef, params, rest = nnx.split(m, nnx.Param, ...)
        f = lambda p, x: call(nnx.merge(graphdef, p, rest), x)
        y, g = jax.jit(lambda p, x: (f(p, x), jax.grad(lambda p: sin_loss(f(p, x)))(p)))(params, x)
        out.append((m, y, g))
    return out


def assert_same_results(got, want, exact=False, dtype=F32):
    (_, y, g), (_, y_ref, g_ref) = got, want
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    assert spec(g) == spec(g_ref)
    for a, b in zip([y] + jax.tree.leaves(g), [y_ref] + jax.tree.leaves(g_ref)):
        if exact:
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
        else:
            close(a, b, dtype, scale=1.0)


# ---------------------------------------------------------------------------
# several reduction axes, on the kernels

# (x shape, reduction_axes, feature_axes): trailing reduction axes, flattened
# into rows; feature axes among them (parameters broadcast over the others).
KERNEL_AXES = [
    ((6, 8), 1, 1),                      # the last axis written positively
    ((2, 3, 8), (-2, -1), (-2, -1)),     # parameters over both axes
    ((2, 3, 8), (1, 2), -1),             # parameters over the last, broadcast
    ((2, 3, 4), (0, 1, 2), -1),          # every axis: one row
    ((2, 3, 2, 4), (-3, -2, -1), (1, 3)),
]


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape, red, feat", KERNEL_AXES, ids=str)
def test_linen_several_axes_on_kernels(name, shape, red, feat):
    x = random(1, shape, F32, scale=2.0, offset=0.5)
    with takes("kernel"):
        got, want = linen_pair(name, x, reduction_axes=red, feature_axes=feat)
    assert_same_results(got, want)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape, red, feat", KERNEL_AXES[1:3], ids=str)
def test_nnx_several_axes_on_kernels(name, shape, red, feat):
    x = random(2, shape, F32, scale=2.0, offset=0.5)
    features = int(np.prod([shape[a] for a in ((feat,) if isinstance(feat, int) else feat)]))
    with takes("kernel"):
        got, want = nnx_pair(name, features, x, reduction_axes=red, feature_axes=feat)
    assert_same_results(got, want)


def test_equinox_several_axes_on_kernels():
    # shape=(8, 16): one flattened row of 128 per example.
    x = random(3, (5, 8, 16), F32, scale=2.0, offset=0.5)
    for name in ("LayerNorm", "RMSNorm"):
        ours, theirs = eqx_params(getattr(jeqx, name)((8, 16))), eqx_params(getattr(eqx.nn, name)((8, 16)))
        run = eqx.filter_jit(lambda m: (jax.vmap(m)(x), eqx.filter_grad(lambda m: sin_loss(jax.vmap(m)(x)))(m)))
        with takes("kernel"):
            y, g = run(ours)
        y_ref, g_ref = run(theirs)
        close(y, y_ref)
        ga, gb = (eqx.filter(t, eqx.is_array) for t in (g, g_ref))
        assert spec(ga) == spec(gb)
        for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
            close(a, b)


# ---------------------------------------------------------------------------
# what runs the replaced module's own code: the same results, one warning

# (module name, x shape, constructor kwargs, mask?, the warning's words)
LINEN_FALLBACKS = [
    ("LayerNorm", (3, 4, 5), {}, True, "a mask"),
    ("RMSNorm", (3, 4, 5), {}, True, "a mask"),
    ("LayerNorm", (2, 3, 4), {"reduction_axes": 1}, False, "trailing axes"),
    ("RMSNorm", (2, 3, 4), {"reduction_axes": (0, 1)}, False, "trailing axes"),
    ("LayerNorm", (2, 3, 4, 5), {"feature_axes": (1, 2)}, False, "feature axes outside"),
    ("LayerNorm", (2, 3, 4, 5), {"reduction_axes": -2, "feature_axes": (1, 3)}, False, "trailing axes"),
]


def _mask(shape):
    m = np.random.default_rng(7).random(shape) < 0.6
    m[..., :2] = True
    return jnp.asarray(m)


@pytest.mark.parametrize("name, shape, kwargs, masked, words", LINEN_FALLBACKS, ids=str)
def test_linen_fallback_same_as_flax_and_warns_once(name, shape, kwargs, masked, words):
    mask = _mask(shape) if masked else None
    x = random(4, shape, F32, scale=2.0, offset=0.5)
    with takes("fallback"), pytest.warns(FallbackWarning, match=f"flax.linen.{name}'s own code.*{words}"):
        got, want = linen_pair(name, x, mask=mask, **kwargs)
    assert_same_results(got, want, exact=True)
    # Warned once per process and reason; as in flax's own mask tests, NaN
    # where the mask is off stays out of the statistics.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        if masked:
            x = jnp.where(mask, x, jnp.nan)
        y = jax.jit(partial(getattr(jlinen, name)(**kwargs).apply, mask=mask))(got[0], x)
    np.testing.assert_array_equal(y, jax.jit(partial(getattr(flax_linen, name)(**kwargs).apply, mask=mask))(got[0], x))
    assert not masked or np.isfinite(np.asarray(y)[np.asarray(mask)]).all()


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_nnx_mask_falls_back(name):
    # nnx.RMSNorm takes the mask positionally too, nnx.LayerNorm by keyword only.
    x = random(5, (3, 4, 5), F32)
    mask = _mask(x.shape)
    call = (lambda m, x: m(x, mask)) if name == "RMSNorm" else (lambda m, x: m(x, mask=mask))
    with takes("fallback"), pytest.warns(FallbackWarning, match=f"flax.nnx.{name}'s own code.*a mask"):
        got, want = nnx_pair(name, 5, x, call=call)
    assert_same_results(got, want, exact=True)


def test_axis_index_groups_falls_back():
    # Within shard_map over 4 devices, statistics averaged within groups of 2.
    from jax.sharding import PartitionSpec as P

    devices = jax.devices("cpu")
    if len(devices) < 4:
        pytest.skip("needs 4 CPU devices")
    mesh = jax.sharding.Mesh(np.asarray(devices[:4]), ("model",))
    x = random(6, (6, 16), F32, scale=2.0, offset=0.5)
    params = perturbed(flax_linen.LayerNorm().init(jax.random.key(0), x[:, :4]))

    def run(mod):
        m = mod.LayerNorm(axis_name="model", axis_index_groups=[[0, 1], [2, 3]])
        f = jax.shard_map(lambda p, x: m.apply(p, x), mesh=mesh, in_specs=(P(), P(None, "model")),
                          out_specs=P(None, "model"), check_vma=False)
        return jax.jit(f)(params, x)

    with takes("fallback"), pytest.warns(FallbackWarning, match="axis_index_groups"):
        y = run(jlinen)
    np.testing.assert_array_equal(y, run(flax_linen))


def test_zero_centered_gamma_is_kernels_only():
    x = random(8, (3, 4, 5), F32)
    m = jlinen.LayerNorm(zero_centered_gamma=True)
    with pytest.raises(ValueError, match="zero_centered_gamma=True runs on jax_rmsnorm's kernels only, and a mask"):
        m.init(jax.random.key(0), x, mask=_mask(x.shape))
    with pytest.raises(TypeError, match="zero_centered_gamma must be a bool"):
        jnnx.RMSNorm(5, zero_centered_gamma="yes", rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="zero_centered_gamma must be a bool"):
        jeqx.LayerNorm(5, zero_centered_gamma=1)


# ---------------------------------------------------------------------------
# dtypes and promotion

# (x dtype, param_dtype, dtype): the output dtype is flax's rule's.
FLAX_DTYPES = [(BF16, F32, None), (F32, BF16, None), (F16, BF16, None), (F32, F32, BF16), (BF16, BF16, F32),
               (F16, F32, F16)]


@pytest.mark.parametrize("x_dtype, param_dtype, dtype", FLAX_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_flax_dtypes_as_flax(name, x_dtype, param_dtype, dtype):
    x = random(9, (4, 3, 16), x_dtype, scale=2.0, offset=0.3)
    coarse = max((x_dtype, param_dtype, dtype or F32), key=lambda d: TOL[np.dtype(d)][0])
    kw = dict(param_dtype=param_dtype, dtype=dtype)
    with takes("kernel"):
        got, want = linen_pair(name, x, **kw)
    assert_same_results(got, want, dtype=coarse)
    with takes("kernel"):
        got, want = nnx_pair(name, 16, x, **kw)
    assert_same_results(got, want, dtype=coarse)


def test_nnx_promote_dtype_is_applied():
    # flax.nnx's normalization tests pass promote_dtype=lambda a, **kw: a to
    # match linen: ours then computes exactly as our linen module does.
    x = random(10, (10, 5), F32)
    for dtype, param_dtype in [(F16, F32), (F32, F16), (None, F16)]:
        m = jnnx.LayerNorm(5, dtype=dtype, param_dtype=param_dtype, promote_dtype=lambda a, **kw: a,
                           rngs=nnx.Rngs(0))
        lin = jlinen.LayerNorm(dtype=dtype, param_dtype=param_dtype)
        np.testing.assert_array_equal(m(x), lin.apply(lin.init(jax.random.key(0), x), x))
    seen = []

    def promote(arrays, *, dtype=None):
        seen.append(([a.dtype for a in arrays if a is not None], dtype))
        return tuple(None if a is None else a.astype(F16) for a in arrays)
    m = jnnx.RMSNorm(5, promote_dtype=promote, rngs=nnx.Rngs(0))
    with takes("kernel"):
        y = m(x)
    assert seen == [([np.dtype(F32), np.dtype(F32)], None)] and y.dtype == F16
    ref = nnx.RMSNorm(5, promote_dtype=promote, rngs=nnx.Rngs(0))(x)
    close(y, ref, F16)


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_equinox_strict_promotion_dtypes(name):
    # Equinox's suite runs with strict dtype promotion and rank promotion
    # raising. The arithmetic is in the promotion of x and float32, the
    # output in x's dtype: an integer x gives an integer output.
    cases = [(F32, None), (BF16, None), (F16, BF16), (BF16, F16), (jnp.int32, None)]
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        for x_dtype, w_dtype in cases:
            x = (random(11, (3, 2, 8), F32, scale=3.0, offset=1.0)).astype(x_dtype)
            ours, theirs = (eqx_params(getattr(m, name)((2, 8), dtype=w_dtype)) for m in (jeqx, eqx.nn))
            fwd = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))
            with takes("kernel"):
                y = fwd(ours, x)
            y_ref = fwd(theirs, x)
            assert y.dtype == y_ref.dtype == x.dtype
            if x_dtype == jnp.int32:
                assert np.abs(np.asarray(y) - np.asarray(y_ref)).max() <= 1  # rounding toward zero of close values
                continue
            close(y, y_ref, x_dtype)
            grad = eqx.filter_jit(eqx.filter_grad(lambda m, x: sin_loss(jax.vmap(m)(x))))
            with takes("kernel"):
                g = grad(ours, x)
            g_ref = grad(theirs, x)
            tol = max((x_dtype, w_dtype or F32), key=lambda d: TOL[np.dtype(d)][0])
            for a, b in zip(jax.tree.leaves(eqx.filter(g, eqx.is_array)), jax.tree.leaves(eqx.filter(g_ref, eqx.is_array))):
                assert a.dtype == b.dtype
                close(a, b, tol, scale=np.abs(np.asarray(b, np.float32)).max())


def test_float64_numpy_input_with_x64_off():
    # A NumPy float64 x is float32 to JAX with x64 off: the kernels take it.
    x = np.asarray(random(12, (3, 16), F32, scale=2.0), np.float64)
    with takes("kernel"):
        lin = jlinen.LayerNorm()
        y = lin.apply(lin.init(jax.random.key(0), x), x)
        y_nnx = jnnx.RMSNorm(16, rngs=nnx.Rngs(0))(x)
        y_eqx = jeqx.LayerNorm(16)(x[0])
    ref = flax_linen.LayerNorm().apply(lin.init(jax.random.key(0), x), x)
    assert y.dtype == ref.dtype == F32
    close(y, ref)
    ref_nnx = nnx.RMSNorm(16, rngs=nnx.Rngs(0))(x)
    assert y_nnx.dtype == ref_nnx.dtype
    close(y_nnx, ref_nnx)
    close(y_eqx, eqx.nn.LayerNorm(16)(x[0]))


def test_x64_on():
    # float64 arrays run the replaced modules' own code; float32 x with a
    # float64 Equinox weight (its default under x64) runs the kernels, as
    # Equinox casts the weight to float32.
    with jax.enable_x64(True):
        x64 = np.asarray(random(13, (3, 16), F32, scale=2.0, offset=0.5), np.float64)
        x32 = jnp.asarray(x64, F32)
        with takes("fallback"), pytest.warns(FallbackWarning, match="x of dtype float64"):
            lin = jlinen.RMSNorm()
            p = lin.init(jax.random.key(0), x64)
            y = lin.apply(p, x64)
        assert y.dtype == jnp.float64
        np.testing.assert_array_equal(y, flax_linen.RMSNorm().apply(p, x64))
        with takes("fallback"), pytest.warns(FallbackWarning, match="scale of dtype float64"):
            lin = jlinen.LayerNorm(param_dtype=jnp.float64)
            p = lin.init(jax.random.key(0), x32)
            y = lin.apply(p, x32)
        np.testing.assert_array_equal(y, flax_linen.LayerNorm(param_dtype=jnp.float64).apply(p, x32))
        with takes("fallback"), pytest.warns(FallbackWarning, match="x of dtype float64"):
            y = jnnx.LayerNorm(16, rngs=nnx.Rngs(0))(x64)
        np.testing.assert_array_equal(y, nnx.LayerNorm(16, rngs=nnx.Rngs(0))(x64))
        with takes("fallback"), pytest.warns(FallbackWarning, match="equinox.nn.RMSNorm's own code.*float64"):
            y = jax.vmap(jeqx.RMSNorm(16))(x64)
        np.testing.assert_array_equal(y, jax.vmap(eqx.nn.RMSNorm(16))(x64))
        with takes("kernel"):
            m = jeqx.RMSNorm(16)
            assert m.weight.dtype == jnp.float64
            y = jax.vmap(m)(x32)
        assert y.dtype == F32
        close(y, jax.vmap(eqx.nn.RMSNorm(16))(x32))


# ---------------------------------------------------------------------------
# constructors, state and graphs


def test_equinox_constructor_and_fields():
    # Every argument Equinox's modules take, positionally and by keyword,
    # elementwise_affine (deprecated upstream, still accepted) included.
    for args, kwargs in [((8, 1e-3, False, True, BF16), {}), ((8,), {"use_weight": True, "use_bias": False})]:
        for name in ("LayerNorm", "RMSNorm"):
            ours, theirs = getattr(jeqx, name)(*args, **kwargs), getattr(eqx.nn, name)(*args, **kwargs)
            assert spec(eqx.filter(ours, eqx.is_array)) == spec(eqx.filter(theirs, eqx.is_array))
            assert (ours.shape, ours.eps, ours.use_weight, ours.use_bias) == (
                theirs.shape, theirs.eps, theirs.use_weight, theirs.use_bias)
    with pytest.warns(UserWarning, match="elementwise_affine=.... is deprecated"):
        m = jeqx.LayerNorm(8, elementwise_affine=False)
    assert m.weight is None and m.bias is None and not m.use_weight
    x = random(14, (8,), F32)
    y, state = m(x, "state", key=jax.random.key(0))
    assert state == "state"
    close(y, eqx.nn.LayerNorm(8, use_weight=False, use_bias=False)(x))
    with pytest.raises(ValueError, match="must satisfy the invariant `shape == x.shape`"):
        m(jnp.ones((2, 8)))


def test_nnx_graph_and_metadata():
    # Modules of one configuration share a graph whatever their initializers
    # (flax's TestLayersSameGraph); parameter metadata is kept.
    for name, inits in (("LayerNorm", ("scale_init", "bias_init")), ("RMSNorm", ("scale_init",))):
        cls = getattr(jnnx, name)
        a = cls(3, rngs=nnx.Rngs(0), **{k: nnx.initializers.zeros for k in inits})
        b = cls(3, rngs=nnx.Rngs(0), **{k: nnx.initializers.ones for k in inits})
        assert nnx.graphdef(a) == nnx.graphdef(b)
        m = cls(3, rngs=nnx.Rngs(0), scale_metadata={"tag": "s"})
        ref = getattr(nnx, name)(3, rngs=nnx.Rngs(0), scale_metadata={"tag": "s"})
        assert m.scale.get_metadata()["tag"] == ref.scale.get_metadata()["tag"] == "s"
        assert spec(nnx.state(m)) == spec(nnx.state(ref))


def test_kernel_path_under_jit_and_vmap():
    # The path is chosen at trace time: jit and vmap keep the kernels.
    x = random(15, (2, 3, 4, 8), F32)
    lin = jlinen.LayerNorm(reduction_axes=(-2, -1))
    p = perturbed(lin.init(jax.random.key(0), x[0]))
    with takes("kernel"):
        y = jax.jit(jax.vmap(partial(lin.apply, p)))(x)
    close(y, jax.vmap(partial(flax_linen.LayerNorm(reduction_axes=(-2, -1)).apply, p))(x))


# ---------------------------------------------------------------------------
# tools/upstream_norm_tests.py


def test_upstream_tool_swaps_the_modules(tmp_path):
    # A stand-in for a flax checkout, with flax's setting that every warning
    # is an error and a module built at import, as flax's parameterized
    # tests do: the tool's plugin must have swapped the names by then, and
    # a fallback's warning is the one warning it lets through.
    import pathlib

    from reference import run_script

    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    files = {
        "tests/linen/linen_test.py": (
            "import jax, jax.numpy as jnp\nfrom flax import linen as nn\nimport jax_rmsnorm.flax\n"
            "AT_IMPORT = nn.LayerNorm(reduction_axes=1)\n"
            "def test_linen():\n"
            "    assert type(AT_IMPORT) is nn.LayerNorm is jax_rmsnorm.flax.LayerNorm\n"
            "    x = jnp.ones((2, 3, 4))\n"
            "    AT_IMPORT.init(jax.random.key(0), x)\n"
            "    nn.RMSNorm().init(jax.random.key(0), x)\n"),
        "tests/nnx/nn/normalization_test.py": (
            "from flax import nnx\nimport jax_rmsnorm.flax.nnx\n"
            "def test_nnx():\n    assert nnx.RMSNorm is jax_rmsnorm.flax.nnx.RMSNorm\n"),
        "tests/nnx/nn/linear_test.py": (
            "import warnings, pytest\n"
            "def test_other_warnings_still_errors():\n"
            "    with pytest.raises(UserWarning):\n        warnings.warn('x')\n"),
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    tool = pathlib.Path(__file__).resolve().parent.parent / "tools" / "upstream_norm_tests.py"
    # Only the tool's own plugin: others installed here (xdist, benchmark
    # plugins) may warn at start-up, which this stand-in's settings make errors.
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    out = run_script(tool, "flax", str(tmp_path), "-q", env=env)
    assert "3 passed" in out, out
    assert "module calls on the kernels: 1, on the replaced module's code: 1" in out, out
