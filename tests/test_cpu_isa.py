"""The CPU kernels' AVX2 version gives the baseline's results bit for bit (see
with_isa in csrc/cpu/norm_cpu.h): tests/cpu_isa_outputs.py runs once in each,
in processes of their own (JAX_RMSNORM_CPU_ISA is read once), and every output
is compared."""
import os

import numpy as np
import pytest

from jax_rmsnorm import _ffi
from reference import run_script

SCRIPT = os.path.join(os.path.dirname(__file__), "cpu_isa_outputs.py")


def _outputs(isa, path):
    run_script(SCRIPT, str(path), env={**os.environ, "JAX_RMSNORM_CPU_ISA": isa, "JAX_PLATFORMS": "cpu"})
    return np.load(path)


def test_cpu_isa_bit_identical(tmp_path):
    if _ffi.cpu_isa() == "baseline":
        pytest.skip("the CPU kernels run in the baseline set here (no AVX2, or JAX_RMSNORM_CPU_ISA=baseline)")
    base = _outputs("baseline", tmp_path / "baseline.npz")
    avx2 = _outputs("avx2", tmp_path / "avx2.npz")
    assert (str(base["isa"]), str(avx2["isa"])) == ("baseline", "avx2")
    names = [k for k in base.files if k != "isa"]
    assert len(names) > 50 and sorted(avx2.files) == sorted(base.files)
    differ = [k for k in names if not np.array_equal(base[k], avx2[k])]
    assert not differ, f"AVX2 differs from the baseline in {differ}"

