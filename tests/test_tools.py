"""The lab tools under tools/ run on the CPU or on recorded output: the A/B
timer of our ops alone (bench_ours.py), the op runner Nsight Compute attaches
to (profile_ops.py), and the readers of Nsight Compute's CSVs and of SASS."""

import pathlib
import subprocess
import sys

from reference import run_script

TOOLS = pathlib.Path(__file__).resolve().parent.parent / "tools"
OURS = TOOLS / "bench_ours.py"


def test_bench_ours_cells():
    cells = ("rms_fwd:256,1024", "ln_bwd:1024", "add_ln:256", "ln_fp8_row:1024", "rms_fp8_group:1024")
    out = run_script(OURS, "--elements", "8192", "--reps", "2", *cells)
    for op, count in (("rms_fwd", 2), ("ln_bwd", 1), ("add_ln", 1), ("ln_fp8_row", 1), ("rms_fp8_group", 1)):
        assert len([line for line in out.splitlines() if line.startswith(f"| {op} bfloat16/")]) == count, out
    out = run_script(OURS, "--elements", "8192", "--reps", "2", "--dtype", "float32", "ln_fwd:512")
    assert "| ln_fwd float32/float32 | 16x512 |" in out, out


def test_profile_ops_runs():
    """profile_ops.py (what Nsight Compute attaches to) runs every op it
    names, ours and XLA's compositions, at two shapes in one process."""
    tool = TOOLS / "profile_ops.py"
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
    tool = TOOLS / "ncu_times.py"
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
    script = TOOLS / "sass_summary.py"
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
    script = TOOLS / "sass_summary.py"
    out = subprocess.run([sys.executable, str(script), "--executed", str(src), "16384", "--dump", str(dump)],
                         capture_output=True, text=True, check=True).stdout
    first, fadd, ldg = out.splitlines()[:3]
    assert first.split()[0] == "6,144" and first.split()[-3] == "12.00", out  # 6144 * 32 / 16384
    assert fadd.split()[0] == "4,096" and "FADD" in fadd and "8.00" in fadd, out
    assert ldg.split()[0] == "2,048" and "LDG" in ldg, out
    assert dump.read_text().splitlines() == ["0x10 2048 @P0 LDG.E.128 R4, [R2.64]", "0x20 3072 FADD R4, R4, R5",
                                             "0x30 1024 FADD R6, R4, R5"]


def test_sass_summary_stall_samples(tmp_path):
    # With the source page's stall samples: the lines with most are listed, and the dump carries them.
    src = tmp_path / "src.csv"
    src.write_text('"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)"\n'
                   '"0x10","LDS.128 R4, [R2]","1,024","30"\n'
                   '"0x20","FADD R4, R4, R5","1,024","90"\n'
                   '"0x30","BRA 0x10","64",""\n'
                   '"0x40","EXIT","32","0"\n')
    dump = tmp_path / "lines.txt"
    script = TOOLS / "sass_summary.py"
    out = subprocess.run([sys.executable, str(script), "--executed", str(src), "--dump", str(dump)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    at = next(i for i, line in enumerate(out) if "stall samples" in line)
    assert out[at].split()[0] == "120", out
    assert out[at + 1].split()[:3] == ["90", "75.0%", "0x20"] and out[at + 2].split()[:3] == ["30", "25.0%", "0x10"], out
    assert len(out) == at + 3, out  # the lines without samples are not listed
    assert dump.read_text().splitlines() == ["0x10 1024 30 LDS.128 R4, [R2]", "0x20 1024 90 FADD R4, R4, R5",
                                             "0x30 64 0 BRA 0x10", "0x40 32 0 EXIT"]


def test_sass_summary_without_source_page(tmp_path):
    # A CSV without the source page's header (ncu wrote an error instead) is refused by name, not a traceback.
    src = tmp_path / "src.csv"
    src.write_text("==ERROR== Could not open report file 'x.ncu-rep'.\n")
    out = subprocess.run([sys.executable, str(TOOLS / "sass_summary.py"), "--executed", str(src)],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "no source page" in out.stderr and "Traceback" not in out.stderr, out


def test_pytest_shard_parts():
    """conftest.py's --shard I/N: the N parts of a selection are disjoint and
    make it whole; a part past N is refused."""
    here = pathlib.Path(__file__).resolve().parent

    def collected(*extra):
        run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "test_plan.py", "-m", "not gpu", *extra], cwd=here, capture_output=True, text=True)
        return run.returncode, {line for line in run.stdout.splitlines() if "::" in line}

    rc, whole = collected()
    assert rc == 0 and len(whole) >= 6, whole
    parts = [collected("--shard", f"{i}/3")[1] for i in (1, 2, 3)]
    assert all(parts) and set().union(*parts) == whole and sum(map(len, parts)) == len(whole), parts
    assert collected("--shard", "4/3")[0] != 0
