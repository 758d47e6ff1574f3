"""The benchmark scripts run on the CPU at tiny sizes: each op they time is
first checked against its jnp reference (a script exits with an error where
they differ), and the rows they measure go to the CSV they are given. The
report script turns such CSVs into the README's and RESULTS.md's tables, the
same tables every time; the committed ones are what the committed CSVs give."""

import csv
import pathlib
import sys

import pytest

from reference import run_script

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import common  # noqa: E402  (benchmarks/common.py)
import report  # noqa: E402  (benchmarks/report.py)

FUSED = BENCH / "bench_fused.py"


def _fused(*args):
    return run_script(FUSED, "--quick", "--device", "cpu", *args)


def _rows(out, op):
    return [line for line in out.splitlines() if line.startswith(f"| {op} |")]


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("args, ops", [
    ((), ("ln_fp8_row", "rms_fp8_group", "add_rms", "rms_fp8_current_t")),
    (("--dtype", "float16"), ("ln_fp8", "add_rms_fp8_row", "ln_fp8_group")),
    (("--hidden-slice",), ("rms_fp8", "ln_fp8_row")),
], ids=["bf16", "fp16", "hidden-slice"])
def test_bench_fused_quick(args, ops):
    out = _fused(*args, "--ops", *ops)
    for op in ops:
        assert len(_rows(out, op)) == 2, (op, out[-2000:])  # the two --quick hidden sizes


def test_bench_fused_param_dtype():
    out = _fused("--param-dtype", "float32", "--ops", "ln_fp8_row", "fp8in_rms")
    assert "params float32" in out and "the fp8in ops are left out" in out
    assert len(_rows(out, "ln_fp8_row")) == 2 and not _rows(out, "fp8in_rms")


def test_bench_fused_group_columnwise():
    # rows a multiple of the group (128): 32768 elements at 256 columns; none at 1024 (32 rows)
    out = run_script(FUSED, "--device", "cpu", "--elements", "32768", "--hidden", "256", "1024", "--iters", "2",
                     "--reps", "2", "--no-csv", "--ops", "rms_fp8_group_t", "ln_fp8_group_t")
    for op in ("rms_fp8_group_t", "ln_fp8_group_t"):
        assert [r.split("|")[3].strip() for r in _rows(out, op)] == ["128x256"], (op, out[-2000:])


@pytest.mark.parametrize("mode", [("--elements", "4096"), ("--rows", "2", "8", "--chain", "3")],
                         ids=["bandwidth", "latency"])
def test_bench_norm_runs(mode):
    """bench_norm.py checks each op against XLA's jnp version before timing it,
    in both modes (latency: a chain of dependent applications, the residual
    add's y and h feeding the next one). On the CPU it writes no CSV unless told."""
    ops = ("rms_fwd", "ln_bwd", "add_rms", "add_ln")
    out = run_script(BENCH / "bench_norm.py", "--hidden", "256", "--iters", "2", "--reps", "2", *mode, "--ops", *ops)
    shapes = ("16x256",) if mode[0] == "--elements" else ("2x256", "8x256")
    for op in ops:
        for shape in shapes:
            assert any(line.startswith(f"| {op} | bfloat16 | {shape} |") for line in out.splitlines()), out[-2000:]
            if mode[0] == "--rows":  # the host's dispatch an op, ours / XLA's
                assert any(line.startswith(op) and shape in line and " dispatch " in line
                           for line in out.splitlines()), out[-2000:]
    assert "appended" not in out


def test_bench_norm_csv(tmp_path):
    """--csv appends one row per op and shape, with the run's settings; a
    second run appends to the same file under the one header."""
    path = tmp_path / "cpu.csv"
    common_args = ("--iters", "2", "--reps", "2", "--elements", "4096", "--csv", str(path), "--commit", "abc1234")
    run_script(BENCH / "bench_norm.py", "--hidden", "256", "512", "--ops", "rms_fwd", "ln_bwd", *common_args)
    run_script(BENCH / "bench_norm.py", "--hidden", "256", "--ops", "rms_fwd", "--zero-centered",
               "--param-dtype", "float32", *common_args)
    rows = _csv(path)
    assert path.read_text().count("op,dtype,") == 1
    assert [(r["op"], r["rows"], r["hidden"], r["options"]) for r in rows] == [
        ("rms_fwd", "16", "256", ""), ("ln_bwd", "16", "256", ""), ("rms_fwd", "8", "512", ""),
        ("ln_bwd", "8", "512", ""), ("rms_fwd", "16", "256", "zero_centered")]
    for r in rows:
        assert r["dtype"] == "bfloat16" and r["commit"] == "abc1234" and r["source"] == "bench_norm.py", r
        assert float(r["us"]) > 0 and float(r["xla_us"]) > 0 and float(r["copy_tbps"]) > 0, r
        assert abs(float(r["ratio"]) - float(r["xla_us"]) / float(r["us"])) < 0.01 * float(r["ratio"]) + 1e-3, r
        assert len(r["date"]) == 10 and r["gpu"], r
    assert [r["param_dtype"] for r in rows] == ["bfloat16"] * 4 + ["float32"]


def test_bench_fused_csv(tmp_path):
    path = tmp_path / "cpu.csv"
    _fused("--ops", "add_rms", "rms_fp8_group", "--group", "64", "--csv", str(path))
    rows = _csv(path)
    assert [(r["op"], r["hidden"], r["options"], r["source"]) for r in rows] == [
        (op, h, "group=64", "bench_fused.py") for h in ("256", "1024") for op in ("add_rms", "rms_fp8_group")]
    assert all(float(r["pct_copy"]) > 0 and float(r["xla_us"]) > 0 for r in rows), rows


def test_bench_model_csv(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    path = tmp_path / "cpu.csv"
    out = run_script(BENCH / "bench_model.py", "--hidden", "64", "--heads", "2", "--mlp", "128", "--layers", "1",
                     "--seq", "16", "--vocab", "64", "--steps", "2", "--csv", str(path))
    (row,) = _csv(path)
    assert "speed-up of the step" in out
    assert (row["op"], row["rows"], row["hidden"], row["source"]) == ("model_step", "16", "64", "bench_model.py")
    assert "layers=1" in row["options"] and float(row["us"]) > 0 and float(row["xla_us"]) > 0


def test_bench_dist_csv(tmp_path):
    """The residual add's table on two CPU devices (conftest's host devices)."""
    path = tmp_path / "cpu.csv"
    run_script(BENCH / "bench_dist.py", "--devices", "2", "--rows", "64", "--hidden", "256", "--add-only",
               "--iters", "2", "--reps", "2", "--csv", str(path))
    rows = _csv(path)
    assert [(r["op"], r["options"]) for r in rows] == [
        ("add_rms", "mesh=rows devices=2"), ("add_rms_fwdbwd", "mesh=rows devices=2"),
        ("add_rms", "mesh=hidden devices=2"), ("add_rms_fwdbwd", "mesh=hidden devices=2")]


@pytest.mark.parametrize("kind, key", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GH200 480GB", "gh200"),
                                       ("cpu", "cpu")])
def test_gpu_key(kind, key):
    assert common.gpu_key(kind) == key


def test_default_csv_only_on_a_gpu():
    class Args:
        csv, no_csv = None, False

    class Device:
        platform, device_kind = "gpu", "NVIDIA H200"

    assert common.csv_path(Args, Device) == BENCH / "results" / "h200.csv"
    Device.platform = "cpu"
    assert common.csv_path(Args, Device) is None
    Args.csv = "x.csv"
    assert common.csv_path(Args, Device) == pathlib.Path("x.csv")
    Args.no_csv = True
    assert common.csv_path(Args, Device) is None


# ---------------------------------------------------------------------------
# report.py


def _row(op, hidden, us, ratio, date="2026-01-02", dtype="bfloat16", params="bfloat16", options="", pct=90.0,
         commit="c1", gpu="NVIDIA H200"):
    rows = (1 << 27) // hidden
    return dict(op=op, dtype=dtype, param_dtype=params, options=options, rows=rows, hidden=hidden, us=us,
                tbps=round(2.0 * (1 << 27) * 2 / (us * 1e-6) / 1e12, 3), pct_copy=pct, copy_tbps=3.8,
                xla_us=round(us * ratio, 1), ratio=ratio, commit=commit, date=date, gpu=gpu, source="test")


def _write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, common.FIELDS)
        w.writeheader()
        w.writerows(rows)


README = "# t\n\nintro\n\n<!-- results:begin -->\nold table\n<!-- results:end -->\n\nafter\n"


def _report(tmp_path, *extra):
    out = tmp_path / "RESULTS.md"
    code = report.main(["--results", str(tmp_path / "results"), "--readme", str(tmp_path / "README.md"),
                        "--out", str(out), "--no-plots", *extra])
    return code, (tmp_path / "README.md").read_text(), out.read_text() if out.exists() else None


def test_report_tables(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text(README)
    _write(tmp_path / "results" / "h200.csv", [
        _row("rms_fwd", 1024, 140.0, 1.10, date="2026-01-01"),
        _row("rms_fwd", 1024, 138.8, 1.09),                      # newer: replaces the row above
        _row("rms_bwd", 1024, 211.0, 1.73),
        _row("rms_fwd", 4096, 139.6, 1.10),
        _row("add_rms", 4096, 302.7, 1.35),
        _row("rms_fp8_group", 4096, 121.5, 2.05, commit="c2", date="2026-01-03"),
        _row("rms_fwd", 4096, 150.0, 1.00, options="latency chain=50"),  # options: kept out of the tables
        _row("rms_fwd", 4096, 269.9, 1.05, dtype="float32", params="float32"),
        _row("rms_fwd", 4096, 137.3, 1.10, options="zero_centered"),
        _row("rms_bwd", 5120, 212.0, 1.90),  # a width without the forward: RESULTS.md only
    ])
    _write(tmp_path / "results" / "h100.csv", [_row("ln_bwd", 1024, 300.3, 3.28, gpu="NVIDIA H100 80GB HBM3")])
    code, readme, results = _report(tmp_path)
    assert code == 0
    # The README: everything outside the markers kept; one table a GPU, H100 first (file order).
    assert readme.startswith("# t\n\nintro\n\n<!-- results:begin -->\n") and readme.endswith(
        "<!-- results:end -->\n\nafter\n") and "old table" not in readme
    assert readme.index("**NVIDIA H100 80GB HBM3**") < readme.index("**NVIDIA H200**")
    assert "**NVIDIA H200** (2026-01-02 to 2026-01-03;" in readme
    h200 = readme[readme.index("**NVIDIA H200**"):]
    assert "| 1024 | 3.80 | 3.87 (1.09x) | 2.54 (1.73x) |  |  |  |  |  |  |" in h200
    assert "| 4096 | 3.80 | 3.85 (1.10x) |  |  |  | 1.77 (1.35x) |  |  | 4.42 (2.05x) |" in h200
    assert "![TB/s against hidden size, NVIDIA H200](benchmarks/tbps_h200_bf16.png)" in h200
    assert "| 5120 |" not in h200 and "| 26214x5120 | 3.80 |  | 212.0 (90%, 1.90x) |" in results
    # RESULTS.md: the times, the dates and commits of each table.
    assert "| 131072x1024 | 3.80 | 138.8 (90%, 1.09x) | 211.0 (90%, 1.73x) |  |  |" in results
    assert "| `rms_fp8_group` | RMSNorm, FP8 out, per-group scales | 121.5 (90%, 2.05x) |" in results
    assert "Measured 2026-01-02 to 2026-01-03; commits c1, c2." in results
    assert "| `rms_fwd` | float32 | 269.9 (90%, 1.05x) |" in results
    assert "| `rms_fwd` | bfloat16, zero-centered | 137.3 (90%, 1.10x) |" in results
    assert "150.0" not in results and "140.0" not in results
    # The same CSVs give the same files, and --check says so.
    assert _report(tmp_path)[1:] == (readme, results)
    assert _report(tmp_path, "--check")[0] == 0
    (tmp_path / "RESULTS.md").write_text(results.replace("138.8", "138.9"))
    assert _report(tmp_path, "--check")[0] == 1


def test_report_ab_section(tmp_path):
    (tmp_path / "results" / "ab").mkdir(parents=True)
    (tmp_path / "README.md").write_text(README)
    _write(tmp_path / "results" / "h100.csv", [_row("rms_fwd", 1024, 140.0, 1.10, gpu="NVIDIA H100 80GB HBM3")])
    ab = [dict(gpu="NVIDIA H100 80GB HBM3", date="2026-01-05", before="aaa", after="bbb", op=op, dtype="bfloat16",
               param_dtype="bfloat16", options="", rows=rows, hidden=hidden, round=k, before_us=b, after_us=a)
          for op, rows, hidden, k, b, a in [
              ("rms_fwd", 32768, 4096, 1, 200.0, 190.0), ("rms_fwd", 32768, 4096, 2, 210.0, 196.0),
              ("rms_fwd", 32768, 4096, 3, 900.0, 192.0),     # an outlier: the median keeps it out
              ("ln_bwd", 131072, 1024, 1, 300.0, 306.0),
              ("add_rms", 32768, 4096, 1, 380.0, 380.0)]]
    with open(tmp_path / "results" / "ab" / "tree.csv", "w", newline="") as f:
        w = csv.DictWriter(f, report.AB_FIELDS)
        w.writeheader()
        w.writerows(ab)
    code, _, results = _report(tmp_path)
    assert code == 0
    section = results[results.index("## A/B comparisons"):]
    assert "### tree: aaa → bbb" in section and "NVIDIA H100 80GB HBM3, 2026-01-05" in section
    # Rows by width: 1024 before 4096; cells the median of the rounds.
    assert section.index("131072x1024") < section.index("32768x4096")
    assert "| bfloat16 bfloat16 32768x4096 | 210.0 → 192.0 (-8.6%) |  |  |  |" in section
    assert "| bfloat16 bfloat16 131072x1024 |  |  |  | 300.0 → 306.0 (+2.0%) |" in section
    assert "| add_rms 32768x4096 | 380.0 → 380.0 (+0.0%) |  |  |" in section
    (tmp_path / "results" / "ab" / "bad.csv").write_text("op,us\nrms_fwd,1\n")
    with pytest.raises(SystemExit, match="not an A/B file"):
        _report(tmp_path)


def test_report_needs_markers(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text("# no markers\n")
    _write(tmp_path / "results" / "h200.csv", [_row("rms_fwd", 1024, 138.8, 1.09)])
    with pytest.raises(SystemExit, match="no <!-- results:begin -->"):
        _report(tmp_path)


def test_report_rejects_a_bad_row(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text(README)
    bad = _row("rms_fwd", 1024, 138.8, 1.09)
    bad["us"] = "fast"
    _write(tmp_path / "results" / "h200.csv", [bad])
    with pytest.raises(SystemExit, match="h200.csv:2: not a results row"):
        _report(tmp_path)


def test_report_plot(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text(README)
    _write(tmp_path / "results" / "h200.csv", [_row("rms_fwd", h, 140.0, 1.1) for h in (1024, 4096)])
    assert report.main(["--results", str(tmp_path / "results"), "--readme", str(tmp_path / "README.md"),
                        "--out", str(tmp_path / "R.md"), "--plots", str(tmp_path)]) == 0
    assert (tmp_path / "tbps_h200_bf16.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_committed_tables_are_the_csvs():
    """README.md's and benchmarks/RESULTS.md's tables are what report.py makes
    of benchmarks/results/*.csv (after new rows: python benchmarks/report.py)."""
    assert report.main(["--check"]) == 0
    assert len((BENCH / "RESULTS.md").read_text().splitlines()) <= 200
