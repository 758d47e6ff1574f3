"""The fused benchmark runs on the CPU at tiny sizes (--quick): each op it
times is first checked against the jnp composition (the script exits with an
error where they differ), with the options its device runs use. So does
bench_ours.py, the A/B timer of our ops alone."""

import pathlib

import pytest

from reference import run_script

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench_fused.py"
OURS = BENCH.parent / "bench_ours.py"


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


def test_bench_ours_cells():
    cells = ("rms_fwd:256,1024", "ln_bwd:1024", "add_ln:256", "ln_fp8_row:1024", "rms_fp8_group:1024")
    out = run_script(OURS, "--elements", "8192", "--reps", "2", *cells)
    for op, count in (("rms_fwd", 2), ("ln_bwd", 1), ("add_ln", 1), ("ln_fp8_row", 1), ("rms_fp8_group", 1)):
        assert len([line for line in out.splitlines() if line.startswith(f"| {op} bfloat16/")]) == count, out
    out = run_script(OURS, "--elements", "8192", "--reps", "2", "--dtype", "float32", "ln_fwd:512")
    assert "| ln_fwd float32/float32 | 16x512 |" in out, out
