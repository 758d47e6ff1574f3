"""Every global setting a JAX user may set: each public function, its
gradient, vmap, shard_map and sharded jit, and the Flax/Equinox modules run
under the setting, jitted and op by op, and give what they give without it.
Under debug_nans/debug_infs only a real NaN/inf raises."""

import contextlib
from functools import partial

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_rmsnorm as jrn
from reference import device, random

E4M3 = jnp.float8_e4m3fn

# Each setting as a context manager; "all" stacks every one that a program
# may keep on at once. Its transfer guard leaves device-to-host transfers
# allowed: debug_nans/debug_infs read every output back to the host to look
# for NaNs (JAX's own check, which "disallow" refuses on a GPU).
SETTINGS = {
    "disable_jit": lambda: jax.disable_jit(),
    "enable_checks": lambda: jax.enable_checks(True),
    "debug_nans": lambda: jax.debug_nans(True),
    "debug_infs": lambda: jax.debug_infs(True),
    "rank_promotion_raise": lambda: jax.numpy_rank_promotion("raise"),
    "dtype_promotion_strict": lambda: jax.numpy_dtype_promotion("strict"),
    "x64": lambda: jax.enable_x64(True),
    "x32": lambda: jax.enable_x64(False),
    "transfer_guard": lambda: jax.transfer_guard("disallow"),
    "all": lambda: _stacked("enable_checks", "debug_nans", "debug_infs", "rank_promotion_raise",
                            "dtype_promotion_strict", "x64", extra=_guard_to_device()),
}


@contextlib.contextmanager
def _stacked(*names, extra=None):
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(SETTINGS[name]())
        if extra is not None:
            stack.enter_context(extra)
        yield


@contextlib.contextmanager
def _guard_to_device():
    with jax.transfer_guard_host_to_device("disallow"), jax.transfer_guard_device_to_device("disallow"):
        yield


def _arrays(where, *specs):
    """Arrays of (shape, dtype[, offset]) specs, seeded by position, put on
    ``where``: a platform's first device, or a mesh (replicated over it)."""
    out = [random(10 + i, s[0], s[1], scale=1.5, offset=s[2] if len(s) > 2 else 0.0)
           for i, s in enumerate(specs)]
    dest = NamedSharding(where, P()) if isinstance(where, jax.sharding.Mesh) else device(where)
    return [jax.device_put(a, dest) for a in out]


def _vjp(f, argnums, args, cts):
    """f's outputs and the cotangents of the arguments ``argnums`` for the
    output cotangents ``cts``."""
    def part(*diff):
        full = list(args)
        for i, d in zip(argnums, diff):
            full[i] = d
        return f(*full)

    out, vjp = jax.vjp(part, *(args[i] for i in argnums))
    return out, vjp(cts)


def _mesh(platform, n=2):
    devices = jax.devices(platform)
    if len(devices) < n:
        pytest.skip(f"needs {n} {platform} devices, {len(devices)} visible")
    return jax.sharding.Mesh(np.asarray(devices[:n]), ("model",))


# ---------------------------------------------------------------------------
# the cases: (function, the arguments it is differentiated in, arguments) on
# a platform; the arguments are device arrays made before the setting is entered

H = 32


def _plain(platform):
    x, g, b = _arrays(platform, ((3, 5, H), jnp.bfloat16, 0.5), ((H,), jnp.float32, 1.0), ((H,), jnp.float32))
    f = lambda x, g, b: (jrn.rms_norm(x, g, zero_centered_gamma=True), jrn.layer_norm(x, g, b, eps=1e-3))
    return f, (0, 1, 2), (x, g, b)


def _mixed_params(platform):
    # Parameters narrower than x and of unlike dtypes (widened inside).
    x, g, b = _arrays(platform, ((4, H), jnp.float32, 0.5), ((H,), jnp.bfloat16, 1.0), ((H,), jnp.float16))
    f = lambda x, g, b: (jrn.rms_norm(x, g), jrn.layer_norm(x, g, b), jrn.add_rms_norm(x, x, g)[0])
    return f, (0, 1, 2), (x, g, b)


def _halves(platform):
    x, g, b, dy = _arrays(platform, ((6, H), jnp.float16, 0.5), ((H,), jnp.float16, 1.0), ((H,), jnp.float16),
                          ((6, H), jnp.float16))

    def f(x, g, b, dy):
        y, rstd = jrn.rms_norm_fwd(x, g, eps=1e-5)
        ly, mean, lrstd = jrn.layer_norm_fwd(x, g, b)
        return (y, rstd, jrn.rms_norm_bwd(dy, x, rstd, g), ly, mean, lrstd,
                jrn.layer_norm_bwd(dy, x, mean, lrstd, g, zero_centered_gamma=True))
    return f, (), (x, g, b, dy)


def _vmap(platform):
    xs, gs, bs = _arrays(platform, ((3, 4, H), jnp.float32), ((3, H), jnp.float32, 1.0), ((H,), jnp.float32))
    f = jax.vmap(lambda x, g, b: (jrn.rms_norm(x, g), jrn.layer_norm(x, g, b)), in_axes=(0, 0, None))
    return f, (0, 1, 2), (xs, gs, bs)


def _stats_apply(platform):
    # A row in two slices by hand: their statistics summed (RMSNorm) or
    # stacked (LayerNorm). The slices are arguments: the transpose of a slice
    # inside would make a padding constant in an eager call.
    x0, x1, g0, g1, b1 = _arrays(platform, ((2, 3, H // 2), jnp.bfloat16), ((2, 3, H // 2), jnp.bfloat16),
                                 ((H // 2,), jnp.float32, 1.0), ((H // 2,), jnp.float32, 1.0), ((H // 2,), jnp.float32))

    def f(x0, x1, g0, g1, b1):
        ss = jrn.rms_norm_stats(x0) + jrn.rms_norm_stats(x1)
        stacked = jnp.stack([jrn.layer_norm_stats(x0), jrn.layer_norm_stats(x1)])
        return (jrn.rms_norm_apply(x0, ss, g0, hidden_size=H),
                jrn.layer_norm_apply(x1, stacked, g1, b1, hidden_size=H),
                jrn.layer_norm_apply(x1, jrn.layer_norm_stats(x1), g1, b1, hidden_size=H // 2))
    return f, (0, 1, 2, 3, 4), (x0, x1, g0, g1, b1)


def _fused_add(platform):
    x, r, g, b = _arrays(platform, ((4, H), jnp.bfloat16), ((4, H), jnp.float32), ((H,), jnp.bfloat16, 1.0),
                         ((H,), jnp.bfloat16))
    f = lambda x, r, g, b: (jrn.add_rms_norm(x, r, g, h_dtype=jnp.float32), jrn.add_layer_norm(x, x, g, b))
    return f, (0, 1, 2, 3), (x, r, g, b)


def _fp8_out(platform):
    x, g, b, s = _arrays(platform, ((4, H), jnp.bfloat16), ((H,), jnp.bfloat16, 1.0), ((H,), jnp.bfloat16),
                         ((), jnp.float32, 4.0))

    def f(x, g, b, s):
        return (jrn.rms_norm_fp8(x, g, scale=s), jrn.layer_norm_fp8(x, g, b, scale=2.0, out_dtype=jnp.float8_e5m2),
                jrn.rms_norm_fp8_current(x, g, transpose=True), jrn.layer_norm_fp8_current(x, g, b, residual=x),
                jrn.rms_norm_fp8_rowwise(x, g, scale_ub=10.0), jrn.layer_norm_fp8_rowwise(x, g, b),
                jrn.rms_norm_fp8_groupwise(x, g, group_size=16), jrn.layer_norm_fp8_groupwise(x, g, b, group_size=8))
    return f, (0, 1, 2), (x, g, b, s)


def _fp8_in(platform):
    x, g, xs, r = _arrays(platform, ((4, H), jnp.bfloat16), ((H,), jnp.float32, 1.0), ((4, 2), jnp.float32, 2.0),
                          ((4, H), jnp.bfloat16))
    q = x.astype(E4M3)

    def f(q, g, xs, r):
        return (jrn.rms_norm(q, g, x_scale=xs, group_size=16, dtype=jnp.float32), jrn.layer_norm(q, g, x_scale=0.5),
                jrn.add_rms_norm(q, r, g, x_scale=0.5))
    return f, (1, 2, 3), (q, g, xs, r)


def _shard_map(platform):
    mesh = _mesh(platform)
    x, p, g, b = _arrays(mesh, ((4, H), jnp.float32, 0.5), ((4, H), jnp.float32), ((H,), jnp.float32, 1.0),
                         ((H,), jnp.float32))

    @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, "model"), P(), P("model"), P("model")),
             out_specs=(P(None, "model"),) * 3 + (P(),) * 2)
    def f(x, p, g, b):
        return (jrn.rms_norm(x, g, axis_name="model"), jrn.layer_norm(x, g, b, axis_name="model"),
                jrn.add_layer_norm(x, x, g, b, axis_name="model")[0],
                jrn.all_reduce_rms_norm(p, axis_name="model"),
                jrn.all_reduce_rms_norm(p, axis_name="model", method="scatter"))
    return f, (0, 1, 2, 3), (x, p, g, b)


def _sharded_jit(platform):
    # Rows over "model" for RMSNorm, the hidden dim over it for LayerNorm and
    # the per-row FP8 output: the partitioning rules' statistics merges.
    mesh = _mesh(platform)
    x, g, b = _arrays(mesh, ((4, H), jnp.float32, 0.5), ((H,), jnp.float32, 1.0), ((H,), jnp.float32))
    rows, cols = NamedSharding(mesh, P("model", None)), NamedSharding(mesh, P(None, "model"))

    def f(x, g, b):
        xr, xc = jax.lax.with_sharding_constraint(x, rows), jax.lax.with_sharding_constraint(x, cols)
        return (jrn.rms_norm(xr, g), jrn.layer_norm(xc, g, b), jrn.layer_norm_fp8_rowwise(xc, g, b),
                jrn.add_layer_norm(xc, xc, g, b))
    return f, (0, 1, 2), (x, g, b)


def _linen(platform):
    import jax_rmsnorm.flax as jlinen
    x, s, bias = _arrays(platform, ((3, H), jnp.bfloat16), ((H,), jnp.float32, 1.0), ((H,), jnp.float32))
    # With dtype given: flax's own rule promotes x and the parameters
    # otherwise, which dtype_promotion_strict refuses (tested below).
    rms, ln = jlinen.RMSNorm(dtype=jnp.bfloat16), jlinen.LayerNorm(dtype=jnp.float32)

    def f(x, s, bias):
        return rms.apply({"params": {"scale": s}}, x), ln.apply({"params": {"scale": s, "bias": bias}}, x)
    return f, (0, 1, 2), (x, s, bias)


def _nnx(platform):
    from flax import nnx
    import jax_rmsnorm.flax.nnx as jnnx
    (x,) = _arrays(platform, ((3, H), jnp.float32, 0.5))
    with jax.default_device(device(platform)):
        mods = jnnx.RMSNorm(H, rngs=nnx.Rngs(0)), jnnx.LayerNorm(H, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(mods)
    f = lambda x, state: tuple(m(x) for m in nnx.merge(graphdef, state))
    return f, (0, 1), (x, state)


def _equinox(platform):
    import jax_rmsnorm.equinox as jeqx
    import equinox as eqx
    (x,) = _arrays(platform, ((3, H), jnp.float32, 0.5))
    with jax.default_device(device(platform)):
        mods = jeqx.RMSNorm(H), jeqx.LayerNorm(H), jeqx.RMSNorm((4, H // 4), use_bias=False)
    params, static = eqx.partition(mods, eqx.is_array)

    def f(x, params):
        rms, ln, rms2 = eqx.combine(params, static)
        return jax.vmap(rms)(x), jax.vmap(ln)(x), jax.vmap(rms2)(x.reshape(3, 4, H // 4))
    return f, (0, 1), (x, params)


CASES = {"plain": _plain, "mixed_params": _mixed_params, "fwd_bwd": _halves, "vmap": _vmap,
         "stats_apply": _stats_apply, "add_norm": _fused_add, "fp8_out": _fp8_out, "fp8_in": _fp8_in,
         "shard_map": _shard_map, "sharded_jit": _sharded_jit, "linen": _linen, "nnx": _nnx, "equinox": _equinox}


def _assert_same(got, want, what):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert jax.tree.structure(got) == jax.tree.structure(want), what
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves)):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what} output {i}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        fp8 = np.dtype(a.dtype).itemsize == 1
        # FP8 codes may move one step where op-by-op rounding of y differs in its last bit.
        rtol, atol = (2.0 ** -3, 2.0 ** -9) if fp8 else (1e-5, 1e-6)
        np.testing.assert_allclose(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)),
                                   rtol=rtol, atol=atol, err_msg=f"{what} output {i}")


# Each setting jitted; op by op too where that runs differently: the transfer
# guard (eager calls' transfers) alone, and "all", which stacks the checks of
# every op's output (enable_checks, debug_nans, debug_infs). Under disable_jit
# the two are the same.
RUNS = [(s, "jit") for s in SETTINGS] + [(s, "eager") for s in ("transfer_guard", "all")]

_BASELINES = {}


def _baseline(case, platform):
    """A case's function, arguments and output cotangents (ones), and its
    outputs and gradients without any setting: made once a process."""
    if (case, platform) not in _BASELINES:
        f, argnums, args = CASES[case](platform)
        outs = jax.jit(f)(*args)
        cts = jax.tree.map(jnp.ones_like, outs)
        want = jax.jit(partial(_vjp, f, argnums))(args, cts)
        _BASELINES[case, platform] = f, argnums, args, cts, want
    return _BASELINES[case, platform]


@pytest.mark.parametrize("setting, mode", RUNS)
@pytest.mark.parametrize("case", list(CASES))
def test_setting(case, setting, mode, platform):
    if case in ("linen", "nnx", "equinox"):
        pytest.importorskip("equinox" if case == "equinox" else "flax")
    f, argnums, args, cts, want = _baseline(case, platform)
    run = partial(_vjp, f, argnums)
    # On the platform's device, as a program there runs: the replaced Flax
    # module's own promote_dtype makes eager conversions on the default device.
    with jax.default_device(device(platform)), SETTINGS[setting]():
        got = jax.jit(run)(args, cts) if mode == "jit" else run(args, cts)
        jax.block_until_ready(got)
    _assert_same(got, want, f"{case} under {setting} ({mode})")


# ---------------------------------------------------------------------------
# debug_nans / debug_infs raise for real NaNs and infs only


def _special_cases(platform, special):
    """(function, finite arguments, arguments whose output holds ``special``)."""
    x, g = _arrays(platform, ((4, H), jnp.float16), ((H,), jnp.float16, 1.0))
    zeros = jnp.zeros_like(x)  # zero rows: rstd = rsqrt(eps), y = 0
    if special == "nan":
        bad = (x.at[1, 3].set(jnp.nan), g)
    else:  # a scale that takes y past float16's largest value
        bad = (x, g.at[5].set(60000.0))

    def f(x, g):
        outs = (jrn.rms_norm(x, g), jrn.layer_norm(x, g), jrn.rms_norm_fp8_current(x, g),
                jrn.layer_norm_fp8_rowwise(x, g))
        return outs, jax.grad(lambda x, g: jnp.sum(jrn.layer_norm(x, g).astype(jnp.float32)), (0, 1))(x, g)
    return f, [(x, g), (zeros, g)], bad


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("special", ["nan", "inf"])
def test_debug_specials_raise_only_for_real_ones(special, mode, platform):
    f, finite, bad = _special_cases(platform, special)
    run = jax.jit(f) if mode == "jit" else f
    setting = jax.debug_nans(True) if special == "nan" else jax.debug_infs(True)
    with setting:
        for args in finite:
            jax.block_until_ready(run(*args))
        with pytest.raises(FloatingPointError, match=special):
            jax.block_until_ready(run(*bad))


# ---------------------------------------------------------------------------
# dtype_promotion_strict in the Flax modules: their output dtype is the
# promotion of x and the parameters (flax's rule), so they raise where that
# promotion is implicit, as flax's own modules do, and nowhere else


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", ["RMSNorm", "LayerNorm"])
def test_flax_strict_promotion_as_flax(name, x_dtype, param_dtype):
    flax_linen = pytest.importorskip("flax.linen")
    from flax import nnx
    import jax_rmsnorm.flax as jlinen
    import jax_rmsnorm.flax.nnx as jnnx

    x = random(1, (3, H), x_dtype)
    calls = {}
    for api, mod in (("flax", flax_linen), ("ours", jlinen)):
        m = getattr(mod, name)(param_dtype=param_dtype)
        params = m.init(jax.random.key(0), x)
        calls["linen", api] = partial(m.apply, params, x)
    for api, mod in (("flax", nnx), ("ours", jnnx)):
        calls["nnx", api] = getattr(mod, name)(H, param_dtype=param_dtype, rngs=nnx.Rngs(0))
    for kind in ("linen", "nnx"):
        results = []
        for api in ("flax", "ours"):
            with jax.numpy_dtype_promotion("strict"):
                try:
                    results.append(calls[kind, api](x) if kind == "nnx" else calls[kind, api]())
                except jax.dtypes.TypePromotionError:
                    results.append(None)
        # flax's linen modules also raise with bf16 x and parameters (an
        # implicit promotion inside): ours, which make none, do not.
        theirs, ours = results
        assert (ours is None) == (x_dtype != param_dtype), (kind, ours)
        if theirs is not None:
            assert ours is not None and ours.dtype == theirs.dtype
