"""Argument checks and the configuration of one call, shared by the public
functions of ``_api`` and ``_fused``.

One helper per kind of argument. Each runs at trace time on shapes and
dtypes only, returns the argument in the form the kernels take, and raises a
``TypeError`` or ``ValueError`` that names the argument.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import jax
import jax.numpy as jnp

X_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
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


def axes_tuple(axis_name):
    """A mesh axis name, or a tuple or list of them, as a tuple."""
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def dtype_name(dt) -> str:
    return np.dtype(dt).name


def as_array(v, name):
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
        try:
            v = jnp.asarray(v)
        except TypeError as e:
            raise TypeError(f"{name} must be an array, got {type(v).__name__}") from e
    return v


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


def check_param(p, name, x, dtype_of=None):
    """gamma or beta: None, or ``(hidden,)`` in float32 or x's dtype (with
    ``dtype_of``: in that array's dtype)."""
    if p is None:
        return None
    p = as_array(p, name)
    hidden = x.shape[-1]
    if p.shape != (hidden,):
        raise ValueError(f"{name} must have shape ({hidden},) to match x's hidden size, got {p.shape}")
    if dtype_of is not None:
        if p.dtype != dtype_of.dtype:
            raise TypeError(f"{name} must have gamma's dtype {dtype_name(dtype_of.dtype)}, "
                            f"got {dtype_name(p.dtype)}")
    elif p.dtype not in (jnp.float32, x.dtype):
        raise TypeError(f"{name} must be float32 or x's dtype {dtype_name(x.dtype)}, "
                        f"got {dtype_name(p.dtype)}")
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


def check_scale(scale):
    """The given per-tensor FP8 scale: a float32 scalar."""
    if scale is None:
        raise TypeError("scale is required: the per-tensor float32 scale (q = y * scale)")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return jnp.float32(scale)
    scale = as_array(scale, "scale")
    if scale.dtype != jnp.float32:
        raise TypeError(f"scale must be float32, got {dtype_name(scale.dtype)}")
    if scale.shape != ():
        raise ValueError(f"scale must be a scalar (one scale per tensor), got shape {scale.shape}")
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
    if x_scale is None:
        raise TypeError("x_scale is required with an FP8 x: a float32 scalar (one scale for the tensor) "
                        "or one scale per group of group_size columns")
    if isinstance(x_scale, (int, float)) and not isinstance(x_scale, bool):
        x_scale = jnp.float32(x_scale)
    x_scale = as_array(x_scale, "x_scale")
    if x_scale.dtype != jnp.float32:
        raise TypeError(f"x_scale must be float32, got {dtype_name(x_scale.dtype)}")
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


def _number(v, name, what):
    """``v`` as a float: a Python number, not a traced value, string or bool."""
    if isinstance(v, (str, bytes, bool)) or isinstance(v, jax.core.Tracer):
        raise TypeError(f"{name} must be {what}, got {type(v).__name__}")
    try:
        return float(v)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be {what}, got {type(v).__name__}") from err


def check_eps(eps):
    """eps: a finite Python number >= 0."""
    e = _number(eps, "eps", "a Python number")
    if not (e >= 0.0 and math.isfinite(e)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return e


def check_scale_ub(scale_ub):
    """The upper bound of per-row or per-group scales: None (no bound) or a number > 0."""
    if scale_ub is None:
        return math.inf
    v = _number(scale_ub, "scale_ub", "a Python number or None")
    if not v > 0.0:
        raise ValueError(f"scale_ub must be > 0, got {scale_ub!r}")
    return v


def _check_int(v, name, what, shown):
    """``v`` as an int (not a bool); ``shown``: how the error shows it."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be {what}, got {shown}")
    return int(v)


def check_group_size(group_size, x):
    """Columns per scale: an int >= 1 that divides the hidden size."""
    g = _check_int(group_size, "group_size", "an int", type(group_size).__name__)
    if g < 1 or x.shape[-1] % g != 0:
        raise ValueError(f"group_size must be >= 1 and divide the hidden size {x.shape[-1]}, got {g}")
    return g


def check_hidden_size(hidden_size, x):
    """The whole row's length, at least x's slice of it."""
    hidden = _check_int(hidden_size, "hidden_size", "an int (the whole row's length)", repr(hidden_size))
    if hidden < x.shape[-1]:
        raise ValueError(f"hidden_size ({hidden}) must be at least x's slice of the hidden dim "
                         f"({x.shape[-1]})")
    return hidden


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
