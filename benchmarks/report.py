"""Builds the benchmark tables and plots from the recorded rows.

Reads benchmarks/results/*.csv (one file a GPU; the rows bench_norm.py,
bench_fused.py, bench_dist.py and bench_model.py append, columns as in
common.py's FIELDS) and writes:

- README.md: the performance tables, in place of the lines between
  ``<!-- results:begin -->`` and ``<!-- results:end -->``;
- benchmarks/RESULTS.md: every GPU's current tables, the method and the commands,
  and the same-call A/B comparisons of benchmarks/results/ab/*.csv (one file a
  comparison: columns AB_FIELDS; the median of each cell's rounds);
- benchmarks/tbps_<gpu>_bf16.png: TB/s against the hidden size, ours, XLA's
  and the copy's, one panel an op (needs matplotlib).

A cell (GPU, op, dtypes, options, shape) takes its newest row: the latest
date, and on the same date the later row in the file. Only rows with no
options (the scripts' defaults) and the other dtypes' rows go into tables;
the CSVs keep the rest.

    python benchmarks/report.py            # rewrite the three
    python benchmarks/report.py --check    # exit 1 where README.md or RESULTS.md differs from what the CSVs give
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

PLAIN = {"rms_fwd": "RMSNorm fwd", "rms_bwd": "RMSNorm bwd", "ln_fwd": "LayerNorm fwd", "ln_bwd": "LayerNorm bwd"}
# The fused ops, in bench_fused.py's order, with what each measures.
FUSED = {
    "add_rms": "residual add + RMSNorm",
    "add_ln": "residual add + LayerNorm",
    "add_rms_fwdbwd": "add + RMSNorm, forward and backward",
    "add_ln_fwdbwd": "add + LayerNorm, forward and backward",
    "rms_fp8": "RMSNorm, FP8 out, given scale",
    "ln_fp8": "LayerNorm, FP8 out, given scale",
    "rms_fp8_row": "RMSNorm, FP8 out, per-row scales",
    "ln_fp8_row": "LayerNorm, FP8 out, per-row scales",
    "rms_fp8_group": "RMSNorm, FP8 out, per-group scales",
    "ln_fp8_group": "LayerNorm, FP8 out, per-group scales",
    "rms_fp8_group_t": "the same RMSNorm + columnwise copy (128x1)",
    "ln_fp8_group_t": "the same LayerNorm + columnwise copy (128x1)",
    "rms_fp8_current": "RMSNorm, FP8 out, current scaling",
    "rms_fp8_current_t": "the same + transposed copy",
    "ln_fp8_current": "LayerNorm, FP8 out, current scaling",
    "ln_fp8_current_t": "the same + transposed copy",
    "add_rms_fp8": "add + RMSNorm, FP8 out, given scale",
    "add_rms_fp8_row": "add + RMSNorm, FP8 out, per-row scales",
    "fp8in_rms": "RMSNorm of FP8 x, per-group scales",
    "fp8in_ln": "LayerNorm of FP8 x, per-group scales",
    "fp8in_rms_tensor": "RMSNorm of FP8 x, one scale",
    "rms_mxfp8": "RMSNorm, MXFP8 out (E8M0 scale per 32)",
    "ln_mxfp8": "LayerNorm, MXFP8 out",
    "rms_mxfp8_t": "RMSNorm, MXFP8 out + columnwise copy",
    "ln_mxfp8_t": "LayerNorm, MXFP8 out + columnwise copy",
    "rms_nvfp4": "RMSNorm, NVFP4 out (E4M3 scale per 16)",
    "ln_nvfp4": "LayerNorm, NVFP4 out",
    "rms_nvfp4_t": "RMSNorm, NVFP4 out + columnwise copy",
    "ln_nvfp4_t": "LayerNorm, NVFP4 out + columnwise copy",
    "add_rms_mxfp8_t": "add + RMSNorm, MXFP8 out + columnwise copy",
}
# The README's columns: the plain norms, then the fused ops most models use.
README_FUSED = {"add_rms": "add + RMSNorm", "rms_fp8": "RMSNorm → FP8", "rms_fp8_row": "FP8 per row",
                "rms_fp8_group": "FP8 per group"}
FLOATS = ("us", "tbps", "pct_copy", "copy_tbps", "xla_us", "ratio")
# An A/B file's columns: two trees built and timed in one run on one GPU, one
# row per cell and round (before/after: the trees' commits).
AB_FIELDS = ("gpu", "date", "before", "after", "op", "dtype", "param_dtype", "options", "rows", "hidden", "round",
             "before_us", "after_us")


# ---------------------------------------------------------------------------
# reading


def read_results(results_dir):
    """{gpu key (the file's stem): its rows in file order}, numbers parsed."""
    out = {}
    for path in sorted(pathlib.Path(results_dir).glob("*.csv")):
        rows = []
        with open(path, newline="") as f:
            for line, r in enumerate(csv.DictReader(f), start=2):
                try:
                    r["rows"], r["hidden"] = int(r["rows"]), int(r["hidden"])
                    for k in FLOATS:
                        r[k] = float(r[k]) if r.get(k) not in (None, "") else None
                except (KeyError, ValueError) as e:
                    raise SystemExit(f"{path}:{line}: not a results row ({e})") from e
                r["order"] = len(rows)
                rows.append(r)
        if rows:
            out[path.stem] = rows
    return out


def current(rows):
    """The newest row of each cell: {(op, dtype, param_dtype, options, rows, hidden): row}."""
    cells = {}
    for r in sorted(rows, key=lambda r: (r["date"], r["order"])):
        cells[(r["op"], r["dtype"], r["param_dtype"], r["options"], r["rows"], r["hidden"])] = r
    return cells


def _select(cells, ops, dtype="bfloat16", params="bfloat16", options=""):
    return [r for (op, dt, pdt, opt, _, _), r in cells.items()
            if op in ops and dt == dtype and pdt == params and opt == options]


def _gpu_name(rows):
    names = [r["gpu"] for r in rows if r["gpu"]]
    return max(set(names), key=lambda n: (names.count(n), n)) if names else "unknown GPU"


# ---------------------------------------------------------------------------
# tables


def _cell(r, pct=True):
    """us (% of the copy, speed-up over XLA)."""
    if r is None:
        return ""
    inside = [f"{r['pct_copy']:.0f}%"] if pct and r["pct_copy"] is not None else []
    if r["ratio"] is not None:
        inside.append(f"{r['ratio']:.2f}x")
    return f"{r['us']:.1f}" + (f" ({', '.join(inside)})" if inside else "")


def _tbps_cell(r):
    """TB/s (speed-up over XLA), for the README."""
    if r is None or r["tbps"] is None:
        return ""
    return f"{r['tbps']:.2f} ({r['ratio']:.2f}x)" if r["ratio"] is not None else f"{r['tbps']:.2f}"


def _table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _span(rows):
    """'date' or 'first to last' of some rows, and their commits in order of date."""
    dates = sorted({r["date"] for r in rows})
    commits = []
    for r in sorted(rows, key=lambda r: (r["date"], r["order"])):
        if r["commit"] not in commits:
            commits.append(r["commit"])
    return (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"), commits


def _by_width(rows):
    """{hidden: {op: row}} and the rows count of each hidden size."""
    grid, count = {}, {}
    for r in rows:
        grid.setdefault(r["hidden"], {})[r["op"]] = r
        count[r["hidden"]] = r["rows"]
    return grid, count


def _copy_tbps(ops):
    return next((r["copy_tbps"] for r in ops.values() if r["copy_tbps"] is not None), None)


def plain_table(cells):
    rows = _select(cells, PLAIN)
    grid, count = _by_width(rows)
    body = []
    for h in sorted(grid):
        copy = _copy_tbps(grid[h])
        body.append([f"{count[h]}x{h}", "" if copy is None else f"{copy:.2f}"] +
                    [_cell(grid[h].get(op)) for op in PLAIN])
    return rows, _table(["rows x hidden", "copy TB/s"] + [f"`{op}`" for op in PLAIN], body)


def _ops_by_width(rows, labels, label_of):
    """One row an op (or variant), one column a hidden size."""
    widths = sorted({r["hidden"] for r in rows})
    grid = {}
    for r in rows:
        grid.setdefault(label_of(r), {})[r["hidden"]] = r
    order = sorted(grid, key=lambda k: (labels.index(k[0]) if k[0] in labels else len(labels), k))
    body = [[f"`{k[0]}`", k[1]] + [_cell(grid[k].get(h)) for h in widths] for k in order]
    return widths, body


def fused_table(cells):
    rows = _select(cells, FUSED)
    widths, body = _ops_by_width(rows, list(FUSED), lambda r: (r["op"], FUSED[r["op"]]))
    return rows, _table(["op", "what"] + [str(h) for h in widths], body)


def _variant(r):
    parts = [r["dtype"] if r["param_dtype"] == r["dtype"] else f"{r['dtype']} / {r['param_dtype']} params"]
    if r["options"]:
        parts.append(r["options"].replace("_", "-"))
    return ", ".join(parts)


def other_table(cells):
    rows = [r for (op, dt, pdt, opt, _, _), r in cells.items()
            if op in PLAIN and opt in ("", "zero_centered") and (dt, pdt, opt) != ("bfloat16", "bfloat16", "")]
    widths, body = _ops_by_width(rows, list(PLAIN), lambda r: (r["op"], _variant(r)))
    return rows, _table(["op", "x, parameters"] + [str(h) for h in widths], body)


def readme_block(results):
    """The README's lines between the markers: a table and a plot a GPU."""
    out = ["Each cell: TB/s of ours (the speed-up over XLA's fusion of the same jnp code; for the fused",
           "ops, over the jnp composition). `copy`: a device-to-device copy measured in the same run.",
           "bf16 x and parameters, rows x hidden = 2^27 elements. Made by `python benchmarks/report.py`",
           "from `benchmarks/results/`; [benchmarks/RESULTS.md](benchmarks/RESULTS.md) has the times."]
    for key, rows in results.items():
        cells = current(rows)
        grid, _ = _by_width(_select(cells, PLAIN))
        fused, _ = _by_width(_select(cells, README_FUSED))
        if not grid:
            continue
        measured = [r for h in grid for r in list(grid[h].values()) + list(fused.get(h, {}).values())]
        span, _ = _span(measured)
        body = []
        for h in sorted(grid):
            if "rms_fwd" not in grid[h]:  # widths measured for the backward alone: RESULTS.md has them
                continue
            copy = _copy_tbps(grid[h])
            ops = dict(grid[h], **fused.get(h, {}))
            body.append([str(h), "" if copy is None else f"{copy:.2f}"] +
                        [_tbps_cell(ops.get(op)) for op in list(PLAIN) + list(README_FUSED)])
        out += ["", f"**{_gpu_name(rows)}** ({span}; `python benchmarks/bench_norm.py`, "
                    "`python benchmarks/bench_fused.py`):", ""]
        out += _table(["hidden", "copy"] + list(PLAIN.values()) + list(README_FUSED.values()), body)
        out += ["", f"![TB/s against hidden size, {_gpu_name(rows)}](benchmarks/{plot_name(key)})"]
    return out


RESULTS_HEAD = (  # (a paragraph or bullet a line: RESULTS.md stays short)
    "# Benchmark results\n"
    "\n"
    "Current numbers of every GPU, made by `python benchmarks/report.py` from "
    "`benchmarks/results/<gpu>.csv` (every row, with its commit, date and source; a cell shows its "
    "newest): do not edit this file.\n"
    "\n"
    "How it measures ([docs/performance.md](../docs/performance.md) has the details):\n"
    "\n"
    "- Every tensor has 2^27 elements (256 MiB in bf16, beyond L2); three input sets rotate. Each op is "
    "checked against jnp, warmed up, then the median of 7 repetitions of 20 calls is taken.\n"
    "- Bytes counted are those the op must move: forward = x read + y written (+ parameters, statistics);"
    " backward = x and dy read + dx written (+ statistics, parameters and their gradients); a fused op "
    "its own inputs and outputs once each.\n"
    "- \"copy\": the faster of XLA's `-x` and a device-to-device copy of the tensor, in the same run.\n"
    "- XLA: the same jnp code compiled by XLA (`jax.vjp` of it for a backward); for a fused op, the "
    "unfused jnp composition (for block-scaled outputs: the norm, then `jax.nn`'s quantizer).\n"
    "\n"
    "Commands: [README.md](README.md) in this folder (each run appends to `results/<gpu>.csv`).\n"
)


def results_md(results, ab_dir=None):
    out = RESULTS_HEAD.rstrip("\n").split("\n")
    for key, rows in results.items():
        cells = current(rows)
        out += ["", f"## {_gpu_name(rows)}"]
        for title, build, what in (
                ("Plain norms, bf16", plain_table, "µs (% of the copy, speed-up over XLA)"),
                ("Fused ops, bf16, e4m3, groups of 128", fused_table,
                 "µs (% of the copy on the op's own bytes, speed-up over the jnp composition), by hidden size"),
                ("Other dtypes and options", other_table, "µs (% of the copy, speed-up over XLA), by hidden size")):
            used, table = build(cells)
            if not used:
                continue
            span, commits = _span(used)
            out += ["", f"### {title}", "", f"{what}. Measured {span}; commits {', '.join(commits)}.", ""]
            out += table
    if ab_dir is not None:
        out += ab_tables(ab_dir)
    return "\n".join(out) + "\n"


def ab_tables(ab_dir):
    """RESULTS.md's A/B section: per file, each cell's median over its rounds
    before and after, and the change; the plain norms by shape, the other ops
    by name."""
    out = []
    for path in sorted(pathlib.Path(ab_dir).glob("*.csv")):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            continue
        missing = set(AB_FIELDS) - set(rows[0])
        if missing:
            raise SystemExit(f"{path}: not an A/B file (no {', '.join(sorted(missing))})")
        cells = {}
        for r in rows:
            key = (r["op"], r["dtype"], r["param_dtype"], r["options"], f"{r['rows']}x{r['hidden']}")
            cells.setdefault(key, []).append((float(r["before_us"]), float(r["after_us"])))

        def change(key):
            b = statistics.median(v[0] for v in cells[key])
            a = statistics.median(v[1] for v in cells[key])
            return f"{b:.1f} → {a:.1f} ({(a / b - 1) * 100:+.1f}%)"

        rounds = max(len(v) for v in cells.values())
        out += ["", f"### {path.stem}: {', '.join(sorted({r['before'] for r in rows}))} → "
                    f"{', '.join(sorted({r['after'] for r in rows}))}", "",
                f"{_gpu_name(rows)}, {min(r['date'] for r in rows)}; µs, median of up to {rounds} rounds "
                f"(before → after, change).", ""]
        shapes = sorted({k[1:] for k in cells if k[0] in PLAIN}, key=lambda k: (k[0] != "bfloat16", k[1:3], int(k[3].split("x")[1])))
        head = ["x, params, options, shape"] + list(PLAIN.values())
        if shapes:
            out += _table(head, [[" ".join(filter(None, k))] + [change((op,) + k) if (op,) + k in cells else ""
                                                                for op in PLAIN] for k in shapes])
        others = sorted(k for k in cells if k[0] not in PLAIN)
        if others:
            pairs = [others[i:i + 2] for i in range(0, len(others), 2)]
            out += ([""] if shapes else []) + _table(["op", "change", "op", "change"],
                                 [sum(([f"{k[0]} {k[4]}", change(k)] for k in p), []) + ["", ""] * (2 - len(p))
                                  for p in pairs])
    return ["", "## A/B comparisons"] + out if out else []


def replace_block(text, block, name="README.md"):
    """``text`` with the lines between the markers replaced by ``block``."""
    lines = text.split("\n")
    try:
        b, e = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise SystemExit(f"{name} has no {BEGIN} and {END} lines to put the tables between") from None
    if e < b:
        raise SystemExit(f"{name}: {END} comes before {BEGIN}")
    return "\n".join(lines[:b + 1] + block + lines[e:])


# ---------------------------------------------------------------------------
# plots


def plot_name(key):
    return f"tbps_{key}_bf16.png"


def plot(rows, path):
    """TB/s against the hidden size, one panel a plain op: ours, XLA's and the copy's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = current(rows)
    grid, _ = _by_width(_select(cells, PLAIN))
    ops = [op for op in PLAIN if any(op in grid[h] for h in grid)]
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        rs = [grid[h][op] for h in sorted(grid) if op in grid[h]]
        hs = [r["hidden"] for r in rs]
        ax.plot(hs, [r["tbps"] for r in rs], "o-", label="jax_rmsnorm")
        ax.plot(hs, [r["tbps"] / r["ratio"] for r in rs], "s--", label="XLA (jnp)")
        ax.plot(hs, [r["copy_tbps"] for r in rs], ":", color="gray", label="copy")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{PLAIN[op]}, bf16")
        ax.set_xlabel("hidden")
        ax.set_ylabel("TB/s")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle(_gpu_name(rows))
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=HERE / "results", type=pathlib.Path, help="the folder of CSVs")
    ap.add_argument("--readme", default=HERE.parent / "README.md", type=pathlib.Path)
    ap.add_argument("--out", default=HERE / "RESULTS.md", type=pathlib.Path, help="the RESULTS.md to write")
    ap.add_argument("--plots", default=HERE, type=pathlib.Path, help="the folder of the PNGs")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 where README.md or RESULTS.md differs from what the CSVs give")
    args = ap.parse_args(argv)

    results = read_results(args.results)
    if not results:
        raise SystemExit(f"no rows in {args.results}/*.csv")
    outputs = {args.readme: replace_block(args.readme.read_text(), readme_block(results), str(args.readme)),
               args.out: results_md(results, args.results / "ab")}
    if args.check:
        stale = [str(p) for p, text in outputs.items() if not p.exists() or p.read_text() != text]
        if stale:
            print("not what benchmarks/results/ gives (run python benchmarks/report.py): " + ", ".join(stale))
            return 1
        return 0
    for path, text in outputs.items():
        path.write_text(text)
        print(f"wrote {path}")
    if not args.no_plots:
        for key, rows in results.items():
            if _select(current(rows), PLAIN):
                plot(rows, args.plots / plot_name(key))
                print(f"wrote {args.plots / plot_name(key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
