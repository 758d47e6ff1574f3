"""jax.export: a function using the norms serializes and runs again."""

import numpy as np
import jax
import jax.numpy as jnp
from jax import export

import jax_rmsnorm as jrn
from reference import put, random


def test_export_roundtrip_with_grad(platform):
    def f(x, g, b):
        return jnp.sum(jrn.layer_norm(x, g, b) ** 2) + jnp.sum(jrn.rms_norm(x, g))

    fn = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    x, g, b = put(platform, random(1, (4, 32), jnp.float32), random(2, (32,), jnp.float32, offset=1.0),
                  random(3, (32,), jnp.float32))
    target = {"cpu": "cpu", "gpu": "cuda"}[platform]
    exp = export.export(fn, platforms=[target], disabled_checks=jrn.export_checks())(x, g, b)
    restored = export.deserialize(exp.serialize())
    got, want = restored.call(x, g, b), fn(x, g, b)
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(w))
