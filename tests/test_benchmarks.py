"""The fused benchmark runs on the CPU at tiny sizes (--quick): each op it
times is first checked against the jnp composition (the script exits with an
error where they differ), with the options its device runs use. So do
bench_ours.py, the A/B timer of our ops alone, and bench_norm.py."""

import math
import pathlib
import subprocess
import sys

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
    (("--dtype", "float16"), ("ln_fp8", "add_rms_fp8_row", "ln_fp8_group")),
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


@pytest.mark.parametrize("mode", [("--elements", "4096"), ("--rows", "2", "8", "--chain", "3")],
                         ids=["bandwidth", "latency"])
def test_bench_norm_runs(mode):
    """bench_norm.py checks each op against XLA's jnp version before timing it,
    in both modes (latency: a chain of dependent applications, the residual
    add's y and h feeding the next one)."""
    ops = ("rms_fwd", "ln_bwd", "add_rms", "add_ln")
    out = run_script(BENCH.parent / "bench_norm.py", "--hidden", "256", "--iters", "2", "--reps", "2", *mode,
                     "--ops", *ops)
    shapes = ("16x256",) if mode[0] == "--elements" else ("2x256", "8x256")
    for op in ops:
        for shape in shapes:
            assert any(line.startswith(f"| {op} | bfloat16 | {shape} |") for line in out.splitlines()), out[-2000:]
            if mode[0] == "--rows":  # the host's dispatch an op, ours / XLA's
                assert any(line.startswith(op) and shape in line and " dispatch " in line
                           for line in out.splitlines()), out[-2000:]


def test_bench_norm_read_logs(tmp_path):
    """--replot reads the tables that earlier runs printed: a later log's row
    of an op and shape replaces an earlier one's, with that log's copy and
    x + dy figures; the other rows stay."""
    script = BENCH.parent / "bench_norm.py"
    common = ("--iters", "2", "--reps", "2", "--elements", "4096", "--ops", "rms_fwd", "ln_bwd")
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text(run_script(script, "--hidden", "256", "512", *common))
    second.write_text(run_script(script, "--hidden", "512", *common))
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_norm
    finally:
        sys.path.pop(0)
    rows = bench_norm.read_logs([first, second])
    assert [(r["op"], r["m"], r["h"]) for r in rows] == [
        ("rms_fwd", 16, 256), ("rms_fwd", 8, 512), ("ln_bwd", 16, 256), ("ln_bwd", 8, 512)], rows

    def printed(log, op, shape):  # the op line's us, and the shape's copy TB/s, as the log has them
        lines = log.read_text().splitlines()
        us = next(float(l.split()[3]) for l in lines if l.split()[:1] == [op] and l.split()[2] == shape)
        copy = next(float(l.split()[4]) for l in lines if l.startswith("copy") and l.split()[2] == shape)
        return us, copy

    for r in rows:
        shape = f"{r['m']}x{r['h']}"
        want = printed(second if r["h"] == 512 else first, r["op"], shape)
        assert (r["us"], r["copy_tbps"]) == want, (r, want)
        assert not math.isnan(r["sol_tbps"]) and r["xla_us"] > 0, r  # the x + dy line was read


def test_bench_norm_replot_png(tmp_path):
    """--replot --plot writes the PNG of the tables read, measuring nothing."""
    pytest.importorskip("matplotlib")
    script = BENCH.parent / "bench_norm.py"
    log, png = tmp_path / "a.log", tmp_path / "t.png"
    log.write_text(run_script(script, "--hidden", "256", "--iters", "2", "--reps", "2", "--elements", "4096"))
    out = run_script(script, "--replot", str(log), "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "device:" not in out, out


def test_profile_ops_runs():
    """profile_ops.py (what Nsight Compute attaches to) runs every op it
    names, ours and XLA's compositions, at two shapes in one process."""
    tool = BENCH.parent / "profile_ops.py"
    names = ("rms_fwd", "ln_fwd", "add_rms", "add_ln", "xla_rms_fwd", "xla_ln_fwd", "xla_add_rms", "xla_add_ln")
    out = run_script(tool, *names, "--shapes", "4x256,3x1024", "--calls", "2")
    for name in names:
        for shape in ("4x256", "3x1024"):
            assert f"{name} {shape} ran 2 times" in out, out
    # Other dtypes: float16 x with float32 parameters.
    out = run_script(tool, "ln_fwd", "rms_fp8", "--shapes", "4x256", "--calls", "1", "--dtype", "float16",
                     "--param-dtype", "float32")
    for name in ("ln_fwd", "rms_fp8"):
        assert f"{name} 4x256 ran 1 times" in out, out


def test_ncu_times(tmp_path):
    """ncu_times.py reads an Nsight Compute CSV (one row a metric and launch;
    ncu's own lines and other kernels' launches skipped) into one row a shape
    and op: the median of calls 2.., and refuses a launch count that does not
    fit the shapes x ops x calls (x kernels a call) it was told."""
    header = '"ID","Kernel Name","Grid Size","Metric Name","Metric Unit","Metric Value"\n'
    rows, launch = [], 0
    for shape_us in ((9.0, 3.0, 5.0, 4.0), (7.0, 2.0, 2.5, 2.25)):  # two shapes of one op, 4 calls each
        for us in shape_us:
            rows.append(f'"{launch}","redzone_check","(8, 1, 1)","gpu__time_duration.sum","ns","1,000"\n')
            rows.append(f'"{launch + 1}","void fwd_decode<1>(FwdArgs)","(16, 4, 1)",'
                        f'"gpu__time_duration.sum","ns","{us * 1000:,.0f}"\n')
            launch += 2
    csv = tmp_path / "ncu.csv"
    csv.write_text("==PROF== Connected to process 1\n" + header + "".join(rows))
    tool = BENCH.parent / "ncu_times.py"
    out = run_script(tool, str(csv), "--ops", "ln_fwd", "--shapes", "16x4096,16x8192", "--calls", "4",
                     "--kernels", "fwd_decode")
    assert "| ln_fwd 16x4096 | 4.00 | (16,4,1) | 9.00 3.00 5.00 4.00" in out, out
    assert "| ln_fwd 16x8192 | 2.25 | (16,4,1) | 7.00 2.00 2.50 2.25" in out, out
    bad = subprocess.run([sys.executable, str(tool), str(csv), "--ops", "ln_fwd", "--shapes", "16x4096",
                          "--calls", "4", "--kernels", "fwd_decode"], capture_output=True, text=True)
    assert bad.returncode != 0 and "8 launches match" in bad.stderr, bad.stderr
    # The same launches as two kernels a call of one shape: each call's sum.
    two = run_script(tool, str(csv), "--ops", "ln_fwd", "--shapes", "16x4096", "--calls", "4",
                     "--kernels", "fwd_decode", "--per-call", "2")
    assert "| ln_fwd 16x4096 | 9.00 | (16,4,1) + (16,4,1) | 12.00 9.00 9.00 4.75 | fwd_decode + fwd_decode |" \
        in two, two


SASS = """
        code for sm_90
                Function : _Z6kernelPf
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R4, desc[UR8][R6.64] ;
        /*0020*/                   LDG.E.STRONG.SYS R5, desc[UR8][R6.64] ;
        /*0030*/                   MOV R5, RZ ;
        /*0040*/                   STL [R1], R4 ;
        /*0050*/              @P0 LDG.E.128.CONSTANT R16, desc[UR8][R16.64] ;
        /*0060*/                   FMUL R17, R16, R4 ;
        /*0070*/                   EXIT ;
                Function : _Z5otherPf
        /*0000*/              @P0 LDG.E.128.CONSTANT R16, desc[UR8][R16.64] ;
        /*0010*/                   LDG.E R4, desc[UR8][R6.64] ;
        /*0020*/                   FMUL R17, R16, R4 ;
        /*0030*/                   EXIT ;
"""


def test_sass_summary_waits():
    # The spilled load (STL of R4) is used before the 128-bit load; R5 is
    # overwritten unused; the second kernel issues its wide load first.
    script = BENCH.parent / "sass_summary.py"
    out = subprocess.run([sys.executable, str(script), "--waits"], input=SASS, capture_output=True, text=True,
                         check=True).stdout
    assert "load at 1, used at 4: STL [R1], R4" in out, out
    assert "R5" not in out and "other" not in out, out
    counts = subprocess.run([sys.executable, str(script), "kernel"], input=SASS, capture_output=True, text=True,
                            check=True).stdout
    assert counts.split()[0] == "8" and "LDG:3" in counts, counts


def test_sass_summary_executed(tmp_path):
    # Nsight Compute's source page as CSV: a preamble, then the header row.
    # Unexecuted lines (0) and lines without a count are left out.
    src = tmp_path / "src.csv"
    src.write_text('"Kernel","fwd"\n'
                   '"Address","Source","Instructions Executed"\n'
                   '"0x10","@P0 LDG.E.128 R4, [R2.64]","2,048"\n'
                   '"0x20","FADD R4, R4, R5","3,072"\n'
                   '"0x30","FADD R6, R4, R5","1,024"\n'
                   '"0x40","EXIT","0"\n'
                   '"0x50","","n/a"\n')
    dump = tmp_path / "lines.txt"
    script = BENCH.parent / "sass_summary.py"
    out = subprocess.run([sys.executable, str(script), "--executed", str(src), "16384", "--dump", str(dump)],
                         capture_output=True, text=True, check=True).stdout
    first, fadd, ldg = out.splitlines()[:3]
    assert first.split()[0] == "6,144" and first.split()[-3] == "12.00", out  # 6144 * 32 / 16384
    assert fadd.split()[0] == "4,096" and "FADD" in fadd and "8.00" in fadd, out
    assert ldg.split()[0] == "2,048" and "LDG" in ldg, out
    assert dump.read_text().splitlines() == ["0x10 2048 @P0 LDG.E.128 R4, [R2.64]", "0x20 3072 FADD R4, R4, R5",
                                             "0x30 1024 FADD R6, R4, R5"]
