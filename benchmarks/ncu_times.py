"""Kernel times from an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`)
of `profile_ops.py OP... --shapes S1,S2,... --calls N`: one table row per shape and op,
the median of calls 2..N (the first one cold) and every call, in microseconds.

    python3 benchmarks/ncu_times.py ncu.csv --ops rms_fwd ln_fwd --shapes 16x4096,64x8192 --calls 5 \\
        --kernels fwd_decode

Each (shape, op) must launch exactly one kernel matching --kernels per call, in
profile_ops.py's order (shapes, then ops, then calls).
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics


def kernels(path: str, pattern: str) -> list[dict]:
    """The profiled launches whose name matches `pattern`, in launch order."""
    lines = [line for line in open(path) if line.startswith('"')]
    by_id: dict[str, dict] = {}
    for row in csv.DictReader(lines):
        k = by_id.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row["Grid Size"]})
        k[row["Metric Name"]] = row["Metric Value"]
    return [k for k in by_id.values() if re.search(pattern, k["name"])]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--ops", nargs="+", required=True)
    p.add_argument("--shapes", required=True)
    p.add_argument("--calls", type=int, required=True)
    p.add_argument("--kernels", default=".", help="regex of the kernel names to count")
    a = p.parse_args()
    ks = kernels(a.csv, a.kernels)
    cells = [(s, op) for s in a.shapes.split(",") for op in a.ops]
    if len(ks) != len(cells) * a.calls:
        raise SystemExit(f"{len(ks)} launches match {a.kernels!r}, expected {len(cells)} x {a.calls}")
    print("| op shape | median us (calls 2..) | grid | every call |")
    for i, (shape, op) in enumerate(cells):
        mine = ks[i * a.calls:(i + 1) * a.calls]
        us = [float(k["gpu__time_duration.sum"].replace(",", "")) / 1000 for k in mine]
        print(f"| {op} {shape} | {statistics.median(us[1:]):.2f} | {mine[0]['grid'].replace(' ', '')} | "
              + " ".join(f"{t:.2f}" for t in us))


if __name__ == "__main__":
    main()
