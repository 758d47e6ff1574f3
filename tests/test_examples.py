"""The examples train: a few steps each, on the CPU (the mesh run with 8 host devices)."""

import os
import pathlib

import pytest

from reference import run_script

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
pytest.importorskip("flax")
pytest.importorskip("optax")


def _run(script, *args, env=None):
    return run_script(EXAMPLES / script, *args, env=env)


def test_train_step_example():
    assert "loss" in _run("train_step.py", "--steps", "20")


def test_llama_example_single_device():
    assert "steps on cpu" in _run("llama.py", "--steps", "30")


def test_llama_example_on_a_mesh_matches_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    single = _run("llama.py", "--steps", "12")
    sharded = _run("llama.py", "--steps", "12", "--mesh", "data=2,model=4", env=env)
    assert "mesh {'data': 2, 'model': 4}" in sharded
    # the same losses, to the printed precision
    last = lambda s: s.strip().splitlines()[-1].split("loss")[-1]
    assert last(single) == last(sharded)
