"""The examples train: a few steps each, on the CPU (the mesh run with 8 host devices)."""

import os
import pathlib
import sys

import pytest

from reference import run_script

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
pytest.importorskip("flax")
pytest.importorskip("optax")


def _run(script, *args, env=None):
    return run_script(EXAMPLES / script, *args, env=env)


def _import_llama_fp8():
    """examples/llama_fp8.py as a module (it imports llama.py beside it)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import llama_fp8
    finally:
        sys.path.remove(str(EXAMPLES))
    return llama_fp8


def test_train_step_example():
    assert "loss" in _run("train_step.py", "--steps", "20")


def test_llama_example_single_device():
    assert "steps on cpu" in _run("llama.py", "--steps", "30")


def test_llama_example_on_a_mesh_matches_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    single = _run("llama.py", "--steps", "4")
    sharded = _run("llama.py", "--steps", "4", "--mesh", "data=2,model=4", env=env)
    assert "mesh {'data': 2, 'model': 4}" in sharded
    # the same losses, to the printed precision
    last = lambda s: s.strip().splitlines()[-1].split("loss")[-1]
    assert last(single) == last(sharded)


def _final_loss(out):
    return float(out.strip().splitlines()[-1].split("-> ")[1].split(",")[0])


def test_llama_fp8_example_tracks_bf16():
    """Projections fed FP8 by the norms: the loss goes down as in the bf16 run."""
    fp8 = _final_loss(_run("llama_fp8.py", "--steps", "12", "--batch", "8"))
    bf16 = _final_loss(_run("llama_fp8.py", "--steps", "12", "--batch", "8", "--recipe", "bf16"))
    assert abs(fp8 - bf16) < 0.05 * bf16, (fp8, bf16)


def test_llama_fp8_backward_is_the_high_precision_one():
    """The FP8 projection's custom backward gives the gradients of the bf16
    recipe (the norm's backward kernel and float32 matmuls), for both norms."""
    import numpy as np
    import jax
    import jax.numpy as jnp

    llama_fp8 = _import_llama_fp8()
    k = jax.random.split(jax.random.key(7), 5)
    x = jax.random.normal(k[0], (2, 8, 64), jnp.float32)
    gamma = 1.0 + 0.1 * jax.random.normal(k[1], (64,), jnp.float32)
    kernels = (jax.random.normal(k[2], (64, 32)) / 8, jax.random.normal(k[3], (64, 48)) / 8)
    cts = (jax.random.normal(k[4], (2, 8, 32)), jax.random.normal(k[4], (2, 8, 48)))
    for how in ("jax_rmsnorm", "flax"):
        grads = {}
        for recipe in ("rowwise", "bf16"):
            outs, vjp = jax.vjp(lambda *a: llama_fp8.project(recipe, how, *a), x, gamma, kernels)
            assert [o.shape for o in outs] == [c.shape for c in cts]
            grads[recipe] = jax.tree.leaves(vjp(cts))
        for got, want in zip(grads["rowwise"], grads["bf16"]):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_llama_fp8_model_sizes(capsys):
    """--hidden must divide into --heads (and, for MXFP8, into blocks of 32);
    the CPU has no jax.nn.scaled_matmul, which --recipe mxfp8 says."""
    llama_fp8 = _import_llama_fp8()
    with pytest.raises(SystemExit):
        llama_fp8.main(["--hidden", "100", "--heads", "3"])
    assert "--hidden (100) must be a multiple of --heads (3)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        llama_fp8.main(["--hidden", "48", "--heads", "4", "--recipe", "mxfp8"])
    assert "and of 32 for --recipe mxfp8" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="needs jax.nn.scaled_matmul"):
        llama_fp8.main(["--recipe", "mxfp8", "--steps", "1"])
