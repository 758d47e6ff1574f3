"""Runs a Flax or Equinox checkout's own normalization tests with this
library's modules swapped in for the ones they replace.

    python tools/upstream_norm_tests.py flax    PATH/TO/flax    [--original] [--norm-only] [pytest args...]
    python tools/upstream_norm_tests.py equinox PATH/TO/equinox [--original] [--norm-only] [pytest args...]

PATH is a checkout of the version that is installed (its ``tests/`` and
``pyproject.toml`` are what is used; the installed package is what they
test). pytest runs in the checkout, with the checkout's own configuration
(its warning filters, its conftest.py and global JAX settings, Equinox's
jaxtyping/beartype checks), on the files that test the replaced modules:

    flax:    tests/linen/linen_test.py (NormalizationTest: LayerNorm/RMSNorm,
             masks, several axes, the norm equivalence tests),
             tests/nnx/nn/normalization_test.py (NNX vs linen),
             tests/nnx/nn/linear_test.py (NNX layer graphs and parameter metadata)
    equinox: tests/test_nn.py

The whole files run; other tests in them are unaffected by the swap.
``--norm-only`` keeps the tests that build a LayerNorm or RMSNorm (and the
other norms' tests of the same classes). With ``--original`` nothing is
swapped (the upstream modules, for comparison).

The swap: this file is also the pytest plugin (``-p upstream_norm_tests``).
At ``pytest_configure`` (after the checkout's conftest has set its JAX
options, and after jaxtyping has installed its import hook, so that Equinox
is still instrumented) it sets ``flax.linen.LayerNorm``/``RMSNorm``,
``flax.nnx.LayerNorm``/``RMSNorm`` or ``equinox.nn.LayerNorm``/``RMSNorm`` to
jax_rmsnorm's modules, so that a test module's ``nn.LayerNorm(...)``, at
import or inside a test, builds ours. The one addition to the checkout's
warning filters: ``ignore::jax_rmsnorm.FallbackWarning``. Both projects turn
every warning into an error, and our modules warn once where they run the
replaced module's own code (a mask, non-trailing axes); that warning is the
documented behaviour, not a failure. At the end the plugin prints how many
calls took the kernels and how many the fallback (without pytest-xdist's
``-n``, where the counts stay in the workers).
"""

from __future__ import annotations

import importlib
import os
import pathlib
import shlex
import subprocess
import sys

FILES = {
    "flax": ["tests/linen/linen_test.py", "tests/nnx/nn/normalization_test.py", "tests/nnx/nn/linear_test.py"],
    "equinox": ["tests/test_nn.py"],
}
# pytest -k of --norm-only: the tests that build LayerNorm/RMSNorm.
NORM_ONLY = {
    "flax": "NormalizationTest or layernorm or rmsnorm or TestLayersSameGraph or TestLayersParamsMetadata",
    "equinox": "layer_norm or rms_norm",
}
# (upstream namespace, ours) per project.
SWAPS = {
    "flax": [("flax.linen", "jax_rmsnorm.flax"), ("flax.nnx", "jax_rmsnorm.flax.nnx")],
    "equinox": [("equinox.nn", "jax_rmsnorm.equinox")],
}
NAMES = ("LayerNorm", "RMSNorm")
ENV = "JAX_RMSNORM_UPSTREAM_SWAP"

# ---------------------------------------------------------------------------
# the pytest plugin


def pytest_configure(config):
    project = os.environ.get(ENV)
    if not project:
        return
    for target, ours in SWAPS[project]:
        target_mod, ours_mod = importlib.import_module(target), importlib.import_module(ours)
        for name in NAMES:
            setattr(target_mod, name, getattr(ours_mod, name))
    import jax_rmsnorm
    from jax_rmsnorm import _modules

    if hasattr(jax_rmsnorm, "FallbackWarning"):  # absent before the fallbacks existed
        config.addinivalue_line("filterwarnings", "ignore::jax_rmsnorm.FallbackWarning")
    if hasattr(_modules, "calls"):
        _modules.calls.clear()  # module calls (traces) on each path, counted by _modules
    config._upstream_swap = (project, jax_rmsnorm.__file__)


def pytest_report_header(config):
    swap = getattr(config, "_upstream_swap", None)
    if swap is None:
        return "upstream_norm_tests: nothing swapped (the upstream modules)"
    project, where = swap
    pairs = ", ".join(f"{t}.{n} -> {o}.{n}" for t, o in SWAPS[project] for n in NAMES)
    return f"upstream_norm_tests: {pairs} (jax_rmsnorm from {where})"


def pytest_terminal_summary(terminalreporter):
    if getattr(terminalreporter.config, "_upstream_swap", None) is None:
        return
    from jax_rmsnorm import _modules

    if not hasattr(_modules, "calls"):
        return
    if hasattr(terminalreporter.config, "workerinput") or terminalreporter.config.getoption("numprocesses", None):
        terminalreporter.write_line("upstream_norm_tests: calls not counted under pytest-xdist")
        return
    terminalreporter.write_line(f"upstream_norm_tests: module calls on the kernels: {_modules.calls['kernel']}, "
                                f"on the replaced module's code: {_modules.calls['fallback']}")


# ---------------------------------------------------------------------------
# the command


def main(argv):
    usage = "usage: upstream_norm_tests.py {flax,equinox} CHECKOUT [--original] [--norm-only] [pytest args...]"
    if len(argv) < 2 or argv[0] not in FILES:
        sys.exit(usage)
    project, checkout, rest = argv[0], pathlib.Path(argv[1]).resolve(), argv[2:]
    original, norm_only = "--original" in rest, "--norm-only" in rest
    rest = [a for a in rest if a not in ("--original", "--norm-only")]
    if norm_only:
        rest = ["-k", NORM_ONLY[project]] + rest
    missing = [f for f in FILES[project] if not (checkout / f).is_file()]
    if missing or not (checkout / "pyproject.toml").is_file():
        sys.exit(f"{checkout} is not a {project} checkout: missing {missing or ['pyproject.toml']}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).resolve().parent)]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop(ENV, None)
    if not original:
        env[ENV] = project
    cmd = [sys.executable, "-m", "pytest", "-p", "upstream_norm_tests", "-p", "no:cacheprovider",
           *FILES[project], *rest]
    print(shlex.join(cmd), f"(in {checkout})", flush=True)
    return subprocess.call(cmd, cwd=checkout, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
