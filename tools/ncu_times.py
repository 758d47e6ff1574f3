"""Kernel times from an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`)
of `profile_ops.py OP... --shapes S1,S2,... --calls N`: one table row per shape and op,
the median of calls 2..N (the first one cold) and every call, in microseconds.

    python3 tools/ncu_times.py ncu.csv --ops rms_fwd ln_fwd --shapes 16x4096,64x8192 --calls 5 \\
        --kernels fwd_decode

Each (shape, op) must launch exactly --per-call kernels (default 1) matching
--kernels per call, in profile_ops.py's order (shapes, then ops, then calls).
With more than one (XLA's composition of the residual add and the norm: a
kernel for h, then one for y), a call's time is the sum of its kernels', and
the row names them:

    python3 tools/ncu_times.py ncu.csv --ops xla_add_rms --shapes 16x4096 --calls 5 --kernels . \
        --per-call 2
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
    p.add_argument("--per-call", type=int, default=1, help="kernels a call, summed")
    a = p.parse_args()
    ks = kernels(a.csv, a.kernels)
    cells = [(s, op) for s in a.shapes.split(",") for op in a.ops]
    per_call = a.per_call
    if len(ks) != len(cells) * a.calls * per_call:
        raise SystemExit(f"{len(ks)} launches match {a.kernels!r}, expected {len(cells)} x {a.calls}"
                         + (f" x {per_call}" if per_call > 1 else ""))
    print("| op shape | median us (calls 2..) | grid | every call |" + (" kernels a call |" if per_call > 1 else ""))
    for i, (shape, op) in enumerate(cells):
        mine = ks[i * a.calls * per_call:(i + 1) * a.calls * per_call]
        calls = [mine[c * per_call:(c + 1) * per_call] for c in range(a.calls)]
        us = [sum(float(k["gpu__time_duration.sum"].replace(",", "")) / 1000 for k in call) for call in calls]
        grids = " + ".join(k["grid"].replace(" ", "") for k in calls[0])
        names = " + ".join(k["name"].removeprefix("void ").split("(")[0].split("<")[0].split("::")[-1]
                           for k in calls[0])
        print(f"| {op} {shape} | {statistics.median(us[1:]):.2f} | {grids} | " + " ".join(f"{t:.2f}" for t in us)
              + (f" | {names} |" if per_call > 1 else ""))


if __name__ == "__main__":
    main()
