"""Argument checks and the configuration of one call, shared by the public
functions of ``_api`` and ``_fused``.

One helper per kind of argument. Each runs at trace time on shapes and
dtypes only, returns the argument in the form the kernels take, and raises a
``TypeError`` or ``ValueError`` that names the argument.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import numpy as np
import jax
import jax.numpy as jnp

X_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# gamma and beta: any of X_DTYPES with any x (the kernels take them in x's
# dtype or float32; others are widened to float32, see _primitives.kernel_params).
PARAM_DTYPES = X_DTYPES
FP8_DTYPES = (jnp.float8_e4m3fn, jnp.float8_e5m2)
FP8_MAX = {np.dtype(jnp.float8_e4m3fn): 448.0, np.dtype(jnp.float8_e5m2): 57344.0}
# The output dtypes of the norm of an FP8 x.
OUT_DTYPES = (np.dtype(jnp.float32), np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True)
class Config:
    """What a norm call computes, besides its arrays."""
    kind: str
    eps: float
    zero_centered_gamma: bool


def config(kind, eps, zero_centered_gamma) -> Config:
    """The checked configuration of a norm call."""
    return Config(kind, check_eps(eps), check_bool(zero_centered_gamma, "zero_centered_gamma"))


def dtype_name(dt) -> str:
    return np.dtype(dt).name


def describe(v) -> str:
    """How an error shows a bad argument: an array by its dtype and shape,
    anything else by its type and value."""
    if hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, np.generic):
        return f"a {dtype_name(v.dtype)} array of shape {tuple(v.shape)}"
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def as_array(v, name):
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
        try:
            v = jnp.asarray(v)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be an array, got {describe(v)}") from e
    return v


# ---------------------------------------------------------------------------
# staging


def staged(fn):
    """Runs the public function ``fn`` inside ``jax.jit``: its arrays
    (JAX's, traced or not, and NumPy's) are the jit's arguments, every other
    argument (numbers, bools, dtypes, names, None) is static. An eager call
    then makes one dispatch and no host-to-device transfer of the library's
    own (its placeholders, constants and Python-number scales are compiled
    in), and so does its gradient; under ``jax.disable_jit()`` it runs
    eagerly. Checks still run at trace time. With an argument that is
    neither an array nor hashable, ``fn`` is called as it is."""

    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        signature.bind(*args, **kwargs)  # a missing or unknown argument: Python's own error, here
        leaves, tree = jax.tree.flatten((args, kwargs))
        dynamic = tuple(isinstance(v, (jax.Array, np.ndarray)) for v in leaves)
        # With each value's type: 1, 1.0 and True are equal keys, but not the same argument.
        static = tuple(None if d else (type(v), v) for d, v in zip(dynamic, leaves))
        try:
            jitted = _staged(fn, tree, static, dynamic)
        except TypeError:  # an unhashable argument
            return fn(*args, **kwargs)
        return jitted(*(v for d, v in zip(dynamic, leaves) if d))

    return call


@functools.lru_cache(maxsize=4096)
def _staged(fn, tree, static, dynamic):
    def body(*arrays):
        it = iter(arrays)
        leaves = [next(it) if d else s[1] for d, s in zip(dynamic, static)]
        args, kwargs = jax.tree.unflatten(tree, leaves)
        return fn(*args, **kwargs)

    body.__name__ = body.__qualname__ = fn.__name__
    return jax.jit(body)


def is_fp8(x) -> bool:
    """Whether ``x`` (an array) holds FP8 values this library reads."""
    return hasattr(x, "dtype") and np.dtype(x.dtype) in FP8_MAX


# ---------------------------------------------------------------------------
# arrays


def check_x(x, name="x", dtypes=X_DTYPES):
    """The normalized input: rank >= 1, one of ``dtypes``, hidden size >= 1."""
    x = as_array(x, name)
    if x.ndim < 1:
        raise ValueError(f"{name} must have rank >= 1 (normalized over its last axis), got a scalar")
    if x.dtype not in dtypes:
        names = [dtype_name(d) for d in dtypes]
        raise TypeError(f"{name} must be {', '.join(names[:-1])} or {names[-1]}, got {dtype_name(x.dtype)}")
    if x.shape[-1] < 1:
        raise ValueError(f"{name}'s last axis (the hidden size) must be >= 1, got shape {x.shape}")
    return x


def check_param(p, name, x):
    """gamma or beta: None, or ``(hidden,)`` in float32, bfloat16 or float16
    (any of them with any x)."""
    if p is None:
        return None
    p = as_array(p, name)
    hidden = x.shape[-1]
    if p.shape != (hidden,):
        raise ValueError(f"{name} must have shape ({hidden},) to match x's hidden size, got {p.shape}")
    if p.dtype not in PARAM_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {dtype_name(p.dtype)}")
    return p


def check_like(a, name, x):
    """An array of x's shape and dtype (dy)."""
    a = as_array(a, name)
    if a.shape != x.shape or a.dtype != x.dtype:
        raise ValueError(f"{name} must have x's shape {x.shape} and dtype {dtype_name(x.dtype)}, "
                         f"got {a.shape} {dtype_name(a.dtype)}")
    return a


def check_stat(s, name, x):
    """A per-row statistic: float32 of shape ``x.shape[:-1]``."""
    s = as_array(s, name)
    if s.shape != x.shape[:-1] or s.dtype != jnp.float32:
        raise ValueError(f"{name} must be float32 of shape {x.shape[:-1]} (x.shape[:-1]), "
                         f"got {s.shape} {dtype_name(s.dtype)}")
    return s


def check_residual(residual, x):
    """The residual: x's shape, x's dtype or float32."""
    residual = as_array(residual, "residual")
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {x.shape}, got {residual.shape}")
    if residual.dtype not in (x.dtype, jnp.float32):
        raise TypeError(f"residual must have x's dtype {dtype_name(x.dtype)} or float32, "
                        f"got {dtype_name(residual.dtype)}")
    return residual


def check_scale(scale, name, what):
    """A per-tensor FP8 scale: a float32 array, or a Python or NumPy number,
    which must be finite and > 0 and becomes a float32 scalar. A JAX array's
    values are not checked (they are not known at trace time); ``what`` says
    what the scale does, for the error of a missing one."""
    if scale is None:
        raise TypeError(f"{name} is required: {what}")
    if _is_number(scale):
        v = _number(scale, name, "a float32 array or a Python number")
        if not (v > 0.0 and math.isfinite(v)):
            raise ValueError(f"{name} must be finite and > 0, got {scale!r}")
        return jnp.float32(v)
    scale = as_array(scale, name)
    if scale.dtype != jnp.float32:
        raise TypeError(f"{name} must be float32, got {dtype_name(scale.dtype)}")
    return scale


def check_tensor_scale(scale, name="scale", what="the per-tensor float32 scale (q = y * scale)"):
    """A given per-tensor scale of an output (an FP8 output's ``scale``,
    NVFP4's ``global_scale``): a float32 scalar, as :func:`check_scale`."""
    scale = check_scale(scale, name, what)
    if scale.shape != ():
        raise ValueError(f"{name} must be a scalar (one scale per tensor), got shape {scale.shape}")
    return scale


def check_fp8_input(x, x_scale, group_size, dtype):
    """Checks an FP8 ``x`` and its scales. Returns ``(x, x_scale, group, typed)``:
    ``x`` checked, ``x_scale`` shaped ``x.shape[:-1] + (hidden // group,)`` (a
    per-tensor scale is broadcast to one per row, ``group = hidden``), and
    ``typed`` a stand-in of ``x``'s shape in the output dtype, for the other checks."""
    x = check_x(x, dtypes=FP8_DTYPES)
    hidden = x.shape[-1]
    out = check_dtype(jnp.bfloat16 if dtype is None else dtype, OUT_DTYPES,
                      "dtype (the output's, for an FP8 x) must be float32, bfloat16 or float16")
    x_scale = check_scale(x_scale, "x_scale", "with an FP8 x: a float32 scalar (one scale for the tensor) "
                                              "or one scale per group of group_size columns")
    if group_size is None:
        if x_scale.shape != ():
            raise ValueError(f"x_scale of shape {x_scale.shape} needs group_size (the columns per scale); "
                             "without group_size it must be a scalar")
        group = hidden
        x_scale = jnp.broadcast_to(x_scale, x.shape[:-1] + (1,))
    else:
        group = check_group_size(group_size, x)
        want = x.shape[:-1] + (hidden // group,)
        if x_scale.shape != want:
            raise ValueError(f"x_scale must have shape {want} (x.shape[:-1] + (hidden // group_size,)), "
                             f"got {x_scale.shape}")
    return x, x_scale, group, jax.ShapeDtypeStruct(x.shape, out)


def no_fp8_options(x_scale, group_size, dtype):
    """A float x takes none of an FP8 x's options."""
    for name, v in (("x_scale", x_scale), ("group_size", group_size), ("dtype", dtype)):
        if v is not None:
            raise ValueError(f"{name} is only for an FP8 x (float8_e4m3fn or float8_e5m2)")


# ---------------------------------------------------------------------------
# Python values


def _is_number(v) -> bool:
    """A Python or NumPy number (a value known at trace time), bools included."""
    return isinstance(v, (int, float, np.number, np.bool_))


def _number(v, name, what):
    """``v`` as a float: a Python or NumPy number, not a bool, an array (its
    value is on the device, or traced) or anything else."""
    if not _is_number(v) or isinstance(v, (bool, np.bool_)) or np.iscomplexobj(v):
        raise TypeError(f"{name} must be {what}, got {describe(v)}")
    return float(v)


def check_bool(v, name):
    """A bool option: Python's or NumPy's (not an array: it picks the kernel)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {describe(v)}")
    return bool(v)


def check_eps(eps):
    """eps: a finite Python number >= 0."""
    e = _number(eps, "eps", "a Python number")
    if not (e >= 0.0 and math.isfinite(e)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return e


def check_axis_name(axis_name, required=False):
    """A mesh axis name (str), or a tuple or list of them, bound where the
    call is traced (inside ``shard_map`` over that axis); as a tuple, or None
    when not given and not ``required``."""
    if axis_name is None and not required:
        return None
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    if not names or not all(isinstance(a, str) for a in names):
        raise TypeError(f"axis_name must be a mesh axis name (a str) or a tuple of them, got {describe(axis_name)}")
    for a in names:
        try:
            jax.lax.axis_size(a)
        except NameError as err:
            raise ValueError(f"axis_name {a!r} is not a mesh axis here: call this inside shard_map over a mesh "
                             f"with that axis") from err
    return names


def check_scale_ub(scale_ub):
    """The upper bound of per-row or per-group scales: None (no bound) or a number > 0."""
    if scale_ub is None:
        return math.inf
    v = _number(scale_ub, "scale_ub", "a Python number or None")
    if not v > 0.0:
        raise ValueError(f"scale_ub must be > 0, got {scale_ub!r}")
    return v


# The largest size a call takes (an int32, as the kernels count elements of a row).
MAX_SIZE = 2 ** 31 - 1


def check_size(v, name, what, least=1):
    """A size: a Python or NumPy int (not a bool) from ``least`` to MAX_SIZE."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int ({what}), got {describe(v)}")
    if not least <= v <= MAX_SIZE:
        raise ValueError(f"{name} ({what}) must be from {least} to 2**31 - 1, got {v}")
    return int(v)


def check_group_size(group_size, x):
    """Columns per scale: an int >= 1 that divides the hidden size."""
    g = check_size(group_size, "group_size", "the columns per scale")
    if x.shape[-1] % g != 0:
        raise ValueError(f"group_size must divide the hidden size {x.shape[-1]}, got {g}")
    return g


def check_block_size(x, block, fmt):
    """A block-scaled format's block of ``block`` columns (MXFP8's 32,
    NVFP4's 16) must divide x's hidden size."""
    if x.shape[-1] % block != 0:
        raise ValueError(f"x's hidden size must be a multiple of {block} for {fmt} (blocks of {block} columns, "
                         f"one scale each), got shape {x.shape}")
    return block


COLUMNWISE_MAX_BLOCK = 256  # rows a block of the columnwise copy, at most (the GPU holds a block's y)


def check_columnwise(x, block):
    """The columnwise copy (``transpose=True`` of per-group output) quantizes
    blocks of ``block`` rows: a multiple of 4 up to COLUMNWISE_MAX_BLOCK, and a
    tensor's rows must be a multiple of it."""
    if block % 4 != 0 or block > COLUMNWISE_MAX_BLOCK:
        raise ValueError(f"group_size must be a multiple of 4 up to {COLUMNWISE_MAX_BLOCK} for the columnwise copy "
                         f"(transpose=True quantizes blocks of group_size rows), got {block}")
    rows = math.prod(x.shape[:-1])
    if rows % block != 0:
        raise ValueError(f"x's rows (the product of all but its last dim: {rows}) must be a multiple of {block} "
                         f"for the columnwise copy (transpose=True quantizes blocks of {block} rows), got shape "
                         f"{x.shape}")


def check_hidden_size(hidden_size, x):
    """The whole row's length, at least x's slice of it."""
    return check_size(hidden_size, "hidden_size", "the whole row's length, at least x's slice of it",
                      least=x.shape[-1])


def check_dtype(value, allowed, what):
    """``value`` as a NumPy dtype, one of ``allowed``; ``what`` names the
    argument and the dtypes it takes."""
    try:
        dt = np.dtype(value)
    except TypeError as e:
        raise TypeError(f"{what}, got {value!r}") from e
    if dt not in allowed:
        raise TypeError(f"{what}, got {dt.name}")
    return dt


def check_h_dtype(h_dtype, x):
    """h's dtype: x's (None) or float32."""
    if h_dtype is None:
        return np.dtype(x.dtype)
    return check_dtype(h_dtype, (np.dtype(x.dtype), np.dtype(jnp.float32)),
                       f"h_dtype must be x's dtype {dtype_name(x.dtype)} or float32")


def check_out_dtype(out_dtype):
    """An FP8 output's dtype."""
    return check_dtype(out_dtype, FP8_MAX, "out_dtype must be float8_e4m3fn or float8_e5m2")
