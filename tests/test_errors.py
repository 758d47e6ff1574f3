"""Bad input raises a clear Python error at trace time, naming the argument
and what it takes; NumPy values pass where Python's do."""

import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jax_rmsnorm as jrn

x = jnp.ones((4, 8), jnp.bfloat16)
g = jnp.ones((8,), jnp.float32)
q8 = jnp.ones((4, 8), jnp.float8_e4m3fn)
stats = jnp.ones((4,), jnp.float32)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: jrn.rms_norm(jnp.float32(1.0)), ValueError, "x must have rank >= 1"),
    (lambda: jrn.rms_norm(jnp.ones((4, 8), jnp.int32)), TypeError, "x must be float32, bfloat16 or float16"),
    (lambda: jrn.layer_norm(jnp.ones((4, 8), jnp.complex64)), TypeError, "x must be float32"),
    (lambda: jrn.rms_norm(jnp.ones((4, 0))), ValueError, "hidden size"),
    (lambda: jrn.rms_norm(None), TypeError, "x must be an array, got NoneType None"),
    (lambda: jrn.layer_norm("abc"), TypeError, "x must be an array, got str 'abc'"),
    (lambda: jrn.rms_norm(x, jnp.ones((7,))), ValueError, r"gamma must have shape \(8,\)"),
    (lambda: jrn.rms_norm(x, jnp.ones((1, 8))), ValueError, "gamma must have shape"),
    (lambda: jrn.rms_norm(x, jnp.ones((8,), jnp.int32)), TypeError,
     "gamma must be float32, bfloat16 or float16, got int32"),
    (lambda: jrn.layer_norm(x, g, jnp.ones((8,), jnp.int8)), TypeError,
     "beta must be float32, bfloat16 or float16, got int8"),
    (lambda: jrn.layer_norm(x, g, jnp.ones((9,), jnp.float32)), ValueError, "beta must have shape"),
    (lambda: jrn.rms_norm(x, g, eps=-1e-6), ValueError, "eps must be a finite number >= 0"),
    (lambda: jrn.rms_norm(x, g, eps=float("nan")), ValueError, "eps must be a finite number >= 0, got nan"),
    (lambda: jrn.layer_norm(x, g, eps=float("inf")), ValueError, "eps must be a finite number >= 0, got inf"),
    (lambda: jrn.rms_norm(x, g, eps="small"), TypeError, "eps must be a Python number, got str"),
    (lambda: jrn.rms_norm(x, g, eps=True), TypeError, "eps must be a Python number, got bool True"),
    (lambda: jrn.rms_norm(x, g, eps=np.True_), TypeError, "eps must be a Python number, got bool"),
    (lambda: jrn.layer_norm(x, g, eps=jnp.float32(1e-5)), TypeError,
     "eps must be a Python number, got a float32 array of shape"),
    (lambda: jrn.rms_norm_bwd(x, x, jnp.ones((4, 1)), g), ValueError, r"rstd must be float32 of shape \(4,\)"),
    (lambda: jrn.rms_norm_bwd(x, x, jnp.ones((4,), jnp.bfloat16), g), ValueError, "rstd must be float32"),
    (lambda: jrn.rms_norm_bwd(x.astype(jnp.float32), x, jnp.ones((4,)), g), ValueError, "dy must have x's shape"),
    (lambda: jrn.layer_norm_bwd(x, x, jnp.ones((5,)), jnp.ones((4,)), g), ValueError, "mean must be float32"),
    # sizes
    (lambda: jrn.rms_norm_apply(x, stats, g, hidden_size=10 ** 30), ValueError,
     r"hidden_size \(the whole row's length, at least x's slice of it\) must be from 8 to 2\*\*31 - 1, got 10{30}\b"),
    (lambda: jrn.rms_norm_apply(x, stats, g, hidden_size=4), ValueError, "hidden_size .* must be from 8 .*, got 4"),
    (lambda: jrn.layer_norm_apply(x, jnp.ones((4, 2)), hidden_size=8.0), TypeError,
     "hidden_size must be an int .*, got float 8.0"),
    (lambda: jrn.rms_norm_apply(x, stats, hidden_size=True), TypeError, "hidden_size must be an int .*, got bool"),
    (lambda: jrn.rms_norm_fp8_groupwise(x, group_size=10 ** 30), ValueError,
     r"group_size \(the columns per scale\) must be from 1 to 2\*\*31 - 1"),
    (lambda: jrn.rms_norm_fp8_groupwise(x, group_size=0), ValueError, "group_size .* must be from 1"),
    (lambda: jrn.layer_norm_fp8_groupwise(x, group_size=3), ValueError, "group_size must divide the hidden size 8"),
    (lambda: jrn.rms_norm_fp8_groupwise(x, group_size="8"), TypeError, "group_size must be an int .*, got str"),
    # bool options
    (lambda: jrn.rms_norm_fp8_current(x, transpose="yes"), TypeError,
     r"transpose must be a bool \(True or False\), got str 'yes'"),
    (lambda: jrn.rms_norm_fp8_current(x, transpose=1), TypeError, "transpose must be a bool .*, got int 1"),
    # axis names
    (lambda: jrn.rms_norm(x, g, axis_name=3), TypeError,
     r"axis_name must be a mesh axis name \(a str\) or a tuple of them, got int 3"),
    (lambda: jrn.add_layer_norm(x, x, axis_name=("model", None)), TypeError, "axis_name must be a mesh axis name"),
    (lambda: jrn.layer_norm(x, axis_name="model"), ValueError,
     "axis_name 'model' is not a mesh axis here: call this inside shard_map"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# Every function that takes zero_centered_gamma, called with x (and what else it needs).
ZC_FUNCTIONS = {
    "rms_norm": lambda **kw: jrn.rms_norm(x, g, **kw),
    "layer_norm": lambda **kw: jrn.layer_norm(x, g, g, **kw),
    "rms_norm_fwd": lambda **kw: jrn.rms_norm_fwd(x, g, **kw),
    "layer_norm_fwd": lambda **kw: jrn.layer_norm_fwd(x, g, **kw),
    "rms_norm_bwd": lambda **kw: jrn.rms_norm_bwd(x, x, stats, g, **kw),
    "layer_norm_bwd": lambda **kw: jrn.layer_norm_bwd(x, x, stats, stats, g, **kw),
    "rms_norm_apply": lambda **kw: jrn.rms_norm_apply(x, stats, g, hidden_size=8, **kw),
    "layer_norm_apply": lambda **kw: jrn.layer_norm_apply(x, jnp.ones((4, 2)), g, hidden_size=8, **kw),
    "add_rms_norm": lambda **kw: jrn.add_rms_norm(x, x, g, **kw),
    "add_layer_norm": lambda **kw: jrn.add_layer_norm(x, x, g, **kw),
    "rms_norm_fp8": lambda **kw: jrn.rms_norm_fp8(x, g, scale=1.0, **kw),
    "layer_norm_fp8": lambda **kw: jrn.layer_norm_fp8(x, g, scale=1.0, **kw),
    "rms_norm_fp8_current": lambda **kw: jrn.rms_norm_fp8_current(x, g, **kw),
    "layer_norm_fp8_current": lambda **kw: jrn.layer_norm_fp8_current(x, g, **kw),
    "rms_norm_fp8_rowwise": lambda **kw: jrn.rms_norm_fp8_rowwise(x, g, **kw),
    "layer_norm_fp8_rowwise": lambda **kw: jrn.layer_norm_fp8_rowwise(x, g, **kw),
    "rms_norm_fp8_groupwise": lambda **kw: jrn.rms_norm_fp8_groupwise(x, g, group_size=4, **kw),
    "layer_norm_fp8_groupwise": lambda **kw: jrn.layer_norm_fp8_groupwise(x, g, group_size=4, **kw),
    "rms_norm(fp8 x)": lambda **kw: jrn.rms_norm(q8, g, x_scale=1.0, **kw),
}
# ... and eps (the backward halves take none).
EPS_FUNCTIONS = {k: f for k, f in ZC_FUNCTIONS.items() if not k.endswith("_bwd")}


@pytest.mark.parametrize("value, shown", [("no", "str 'no'"), (0, "int 0"), (None, "NoneType None"),
                                          (jnp.array(True), r"a bool array of shape \(\)"),
                                          (np.array([True]), r"a bool array of shape \(1,\)")])
@pytest.mark.parametrize("fn", list(ZC_FUNCTIONS))
def test_zero_centered_gamma_must_be_a_bool(fn, value, shown):
    with pytest.raises(TypeError, match=rf"zero_centered_gamma must be a bool \(True or False\), got {shown}"):
        ZC_FUNCTIONS[fn](zero_centered_gamma=value)


@pytest.mark.parametrize("value, exc, match", [
    (True, TypeError, "eps must be a Python number, got bool True"),
    (float("nan"), ValueError, "eps must be a finite number >= 0, got nan"),
    (-1.0, ValueError, "eps must be a finite number >= 0, got -1.0"),
    (jnp.float32(0.1), TypeError, "eps must be a Python number, got a float32 array"),
])
@pytest.mark.parametrize("fn", list(EPS_FUNCTIONS))
def test_eps_must_be_a_finite_number(fn, value, exc, match):
    with pytest.raises(exc, match=match):
        EPS_FUNCTIONS[fn](eps=value)


def test_numpy_values_where_python_ones_go():
    # NumPy bools, ints and floats are taken as the Python values they hold.
    same = [
        (jrn.rms_norm(x, g, zero_centered_gamma=True), jrn.rms_norm(x, g, zero_centered_gamma=np.True_)),
        (jrn.layer_norm(x, eps=1e-3), jrn.layer_norm(x, eps=np.float32(1e-3))),
        (jrn.rms_norm_fp8_current(x, transpose=True), jrn.rms_norm_fp8_current(x, transpose=np.bool_(True))),
        (jrn.rms_norm_fp8_groupwise(x, group_size=4), jrn.rms_norm_fp8_groupwise(x, group_size=np.int64(4))),
        (jrn.rms_norm_fp8(x, scale=2.0), jrn.rms_norm_fp8(x, scale=np.float32(2.0))),
        (jrn.rms_norm_apply(x, stats, hidden_size=8), jrn.rms_norm_apply(x, stats, hidden_size=np.int32(8))),
    ]
    for a, b in same:
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(u.astype(jnp.float32)), np.asarray(v.astype(jnp.float32)))


# FP8 scales given as Python or NumPy numbers: finite and > 0.
BAD_SCALES = [-1.0, 0, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), np.float32(-2.0), np.float64("nan")]


@pytest.mark.parametrize("scale", BAD_SCALES, ids=repr)
@pytest.mark.parametrize("fn", ["rms_norm_fp8", "layer_norm_fp8"])
def test_fp8_scale_number_must_be_finite_and_positive(fn, scale):
    with pytest.raises(ValueError, match="scale must be finite and > 0, got"):
        getattr(jrn, fn)(x, g, scale=scale)


@pytest.mark.parametrize("scale", BAD_SCALES, ids=repr)
@pytest.mark.parametrize("fn", ["rms_norm", "layer_norm", "add_rms_norm"])
def test_x_scale_number_must_be_finite_and_positive(fn, scale):
    args = (q8, jnp.ones((4, 8), jnp.bfloat16)) if fn == "add_rms_norm" else (q8,)
    with pytest.raises(ValueError, match="x_scale must be finite and > 0, got"):
        getattr(jrn, fn)(*args, x_scale=scale)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: jrn.rms_norm_fp8(x, scale=True), TypeError, "scale must be a float32 array or a Python number, got bool"),
    (lambda: jrn.rms_norm_fp8(x, scale=1 + 2j), TypeError, "scale must be float32, got complex64"),
    (lambda: jrn.rms_norm_fp8(x, scale=jnp.ones((), jnp.bfloat16)), TypeError, "scale must be float32, got bfloat16"),
    (lambda: jrn.rms_norm_fp8(x, scale=jnp.ones((2,))), ValueError, "scale must be a scalar"),
    (lambda: jrn.rms_norm_fp8(x, scale=None), TypeError, "scale is required"),
    (lambda: jrn.rms_norm_fp8(x), TypeError, "missing a required argument: 'scale'"),
    (lambda: jrn.rms_norm(q8, x_scale="1"), TypeError, "x_scale must be an array, got str"),
    (lambda: jrn.rms_norm_fp8_rowwise(x, scale_ub=float("nan")), ValueError, "scale_ub must be > 0"),
])
def test_bad_scale(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_traced_scale_is_used_as_it_is():
    # A scale inside jit is not known at trace time: it is not checked, and
    # q = saturate(y * scale) takes it as it is (the docstrings say so).
    y = jrn.rms_norm(x, g).astype(jnp.float32)
    run = jax.jit(lambda s: jrn.rms_norm_fp8(x, g, scale=s)[0].astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(run(jnp.float32(0.0))), 0.0)
    np.testing.assert_allclose(np.asarray(run(jnp.float32(-2.0))), -2.0 * np.asarray(y), rtol=2 ** -3)
    assert np.isnan(np.asarray(run(jnp.float32(np.nan)))).all()
    q = jax.jit(lambda s: jrn.rms_norm(q8, x_scale=s, dtype=jnp.float32))(jnp.float32(-1.0))
    np.testing.assert_allclose(np.asarray(q), np.asarray(jrn.rms_norm(q8, x_scale=1.0, dtype=jnp.float32)) * -1.0)


def test_all_reduce_rms_norm_arguments():
    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:1]), ("model",))
    on_mesh = lambda f: jax.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P())
    p = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(TypeError, match="axis_name must be a mesh axis name .*, got int 3"):
        on_mesh(lambda p: jrn.all_reduce_rms_norm(p, axis_name=3))(p)
    with pytest.raises(ValueError, match="axis_name 'data' is not a mesh axis here"):
        on_mesh(lambda p: jrn.all_reduce_rms_norm(p, axis_name="data"))(p)
    with pytest.raises(TypeError, match="scatter must be a bool .*, got str 'no'"):
        on_mesh(lambda p: jrn.all_reduce_rms_norm(p, axis_name="model", scatter="no"))(p)
    with pytest.raises(TypeError, match="zero_centered_gamma must be a bool"):
        on_mesh(lambda p: jrn.all_reduce_rms_norm(p, axis_name="model", zero_centered_gamma="no"))(p)
    with pytest.raises(TypeError, match="eps must be a Python number"):
        on_mesh(lambda p: jrn.all_reduce_rms_norm(p, axis_name="model", eps=True))(p)
    y = on_mesh(lambda p: jrn.all_reduce_rms_norm(p, g, axis_name=["model"], scatter=np.False_))(p)
    np.testing.assert_allclose(np.asarray(y), np.asarray(jrn.rms_norm(p, g)), rtol=1e-6)


def test_module_options_checked():
    flax_linen = pytest.importorskip("flax.linen")
    import jax_rmsnorm.flax as jlinen
    m = jlinen.RMSNorm(zero_centered_gamma="no")
    with pytest.raises(TypeError, match="zero_centered_gamma must be a bool"):
        m.init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0, got nan"):
        jlinen.LayerNorm(epsilon=float("nan")).init(jax.random.key(0), x)
    assert flax_linen  # the module under test subclasses it


def test_float64_rejected_under_x64():
    with jax.enable_x64(True):
        with pytest.raises(TypeError, match="got float64"):
            jrn.rms_norm(jnp.ones((2, 4), jnp.float64))
        with pytest.raises(TypeError, match="gamma must be float32, bfloat16 or float16, got float64"):
            jrn.rms_norm(jnp.ones((2, 4), jnp.float32), jnp.ones((4,), jnp.float64))


def test_errors_raise_under_jit_at_trace_time():
    with pytest.raises(ValueError, match="gamma must have shape"):
        jax.jit(jrn.rms_norm)(x, jnp.ones((3,), jnp.float32))
    with pytest.raises(TypeError, match="zero_centered_gamma must be a bool"):
        jax.jit(partial(jrn.layer_norm, zero_centered_gamma="no"))(x)


@pytest.mark.parametrize("name,value,message", [
    ("JAX_RMSNORM_CPU_ISA", "sse9", "JAX_RMSNORM_CPU_ISA='sse9': expected one of baseline, avx2 (or unset)"),
    ("JAX_RMSNORM_DRAM_GBPS", "fast", "JAX_RMSNORM_DRAM_GBPS='fast': expected a positive integer, GB/s (or unset)"),
    ("JAX_RMSNORM_DRAM_GBPS", "0", "JAX_RMSNORM_DRAM_GBPS='0': expected a positive integer"),
])
def test_environment_settings_checked(name, value, message):
    """A setting read from the environment is checked at import, by name."""
    env = {**os.environ, name: value, "JAX_PLATFORMS": "cpu"}
    # From /: the installed package, not the source tree's.
    p = subprocess.run([sys.executable, "-c", "import jax_rmsnorm"], env=env, capture_output=True, text=True,
                       timeout=300, cwd="/")
    assert p.returncode != 0 and message in p.stderr, p.stderr[-2000:]
