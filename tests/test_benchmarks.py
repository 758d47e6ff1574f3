"""The fused benchmark runs on the CPU at tiny sizes (--quick): each op it
times is first checked against the jnp composition (the script exits with an
error where they differ), with the options its device runs use."""

import pathlib

import pytest

from reference import run_script

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fused.py"


def _run(*args):
    return run_script(BENCH, "--quick", "--device", "cpu", *args)


def _rows(out, op):
    return [line for line in out.splitlines() if line.startswith(f"| {op} |")]


@pytest.mark.parametrize("args, ops", [
    ((), ("ln_fp8_row", "rms_fp8_group", "add_rms", "rms_fp8_current_t")),
    (("--dtype", "float16"), ("ln_fp8", "add_rms_fp8_row")),
    (("--hidden-slice",), ("rms_fp8", "ln_fp8_row")),
], ids=["bf16", "fp16", "hidden-slice"])
def test_bench_fused_quick(args, ops):
    out = _run(*args, "--ops", *ops)
    for op in ops:
        assert len(_rows(out, op)) == 2, (op, out[-2000:])  # the two --quick hidden sizes


def test_bench_fused_param_dtype():
    out = _run("--param-dtype", "float32", "--ops", "ln_fp8_row", "fp8in_rms")
    assert "params float32" in out and "the fp8in ops are left out" in out
    assert len(_rows(out, "ln_fp8_row")) == 2 and not _rows(out, "fp8in_rms")
