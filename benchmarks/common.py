"""What the benchmark scripts share: the timers, the jnp references they
compare with, and the CSV rows they record.

Timing: every op is compiled and warmed up, then ``reps`` repetitions of
``iters`` calls back to back are timed and the median is taken; the input
sets rotate between calls (``bench``). The copy reference is the faster of
XLA's ``-x`` and a device-to-device copy, measured in the same run.

Recording: each script appends one row per measured cell to a CSV
(``FIELDS``): by default ``benchmarks/results/<gpu>.csv`` when it runs on a
GPU, nowhere on the CPU; ``--csv PATH`` names another file and ``--no-csv``
writes none. ``benchmarks/report.py`` builds the tables and plots from those
files.
"""

from __future__ import annotations

import csv
import datetime
import pathlib
import re
import statistics
import subprocess
import time

import numpy as np
import jax
import jax.numpy as jnp

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"

# One CSV row per measured cell. us and xla_us: microseconds per call of ours
# and of the XLA reference (the jnp version, or the jnp composition of a
# fused op); ratio = xla_us / us. tbps: TB/s on the bytes the op must move;
# pct_copy: that against the copy measured in the same run (copy_tbps).
# options: the settings that differ from the script's defaults ("" for none).
# source: the script, or where an imported row came from.
FIELDS = ("op", "dtype", "param_dtype", "options", "rows", "hidden", "us", "tbps", "pct_copy", "copy_tbps",
          "xla_us", "ratio", "commit", "date", "gpu", "source")


# ---------------------------------------------------------------------------
# jnp references


def jnp_add(x, r):
    """The residual add the fused ops replace: h = x + r summed in float32, in x's dtype."""
    return (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(x.dtype)


def jnp_rms(x, g, eps=1e-6):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps) * g.astype(jnp.float32)
    return y.astype(x.dtype)


def jnp_layer(x, g, b, eps=1e-5):
    xf = x.astype(jnp.float32)
    m = jnp.mean(xf, -1, keepdims=True)
    v = jnp.mean(jnp.square(xf - m), -1, keepdims=True)
    y = (xf - m) * jax.lax.rsqrt(v + eps) * g.astype(jnp.float32) + b.astype(jnp.float32)
    return y.astype(x.dtype)


def rel_err(a, b):
    a = np.asarray(a, np.float32).ravel()
    b = np.asarray(b, np.float32).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---------------------------------------------------------------------------
# timers


def median_seconds(calls, iters, reps, wait_all=False):
    """Median over reps of the seconds per call of each of ``calls`` (each
    ``call(i)``), timing iters calls back to back. The calls are timed in turn
    within every repetition, so that a machine's drift over a run falls on
    all of them alike rather than into their comparison. The timing waits for
    the last call's output, which on one stream means every call's; calls
    that may run on several streams (device-to-device copies) need
    ``wait_all``, which keeps every output and waits for them all."""
    for call in calls:
        jax.block_until_ready(call(0))  # compile
        for i in range(2):  # warm-up
            jax.block_until_ready(call(i))
    times = [[] for _ in calls]
    for _ in range(reps):
        for k, call in enumerate(calls):
            t0 = time.perf_counter()
            outs = []
            for i in range(iters):
                out = call(i)
                if wait_all:
                    outs.append(out)
            jax.block_until_ready(outs if wait_all else out)
            times[k].append((time.perf_counter() - t0) / iters)
    return [statistics.median(ts) for ts in times]


def dispatch_seconds(call, reps):
    """Median seconds for ``call(i)`` to return (not to finish), each call
    made with the device idle: the host's dispatch of one call. Where it comes
    near the seconds per call that median_seconds times, calls back to back
    wait on the host, and the timing is the host's, not the GPU's."""
    out, times = call(0), []
    for i in range(3 * reps):
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        out = call(i)
        times.append(time.perf_counter() - t0)
    jax.block_until_ready(out)
    return statistics.median(times)


def rotated(fn, arg_sets):
    """call(i): fn applied to input set i (rotating)."""
    return lambda i: fn(*arg_sets[i % len(arg_sets)])


def bench(fn, arg_sets, iters, reps, one_program=True, wait_all=False):
    """Median seconds per application of fn over the rotated input sets.

    one_program=True (the default): each timed call is one jit that applies fn
    once to every input set, one after the other, as ops run inside a model's
    program; the time per application is the call's time over the number of
    sets, and host dispatch between executables stays out of it.
    one_program=False times one call per set (``wait_all``: median_seconds)."""
    if one_program:
        multi = jax.jit(lambda sets: [fn(*a) for a in sets])
        return median_seconds([lambda i: multi(arg_sets)], iters, reps)[0] / len(arg_sets)
    return median_seconds([rotated(fn, arg_sets)], iters, reps, wait_all)[0]


def copy_seconds(xs, dev, iters, reps):
    """The copy reference: the faster of XLA's x -> -x and a device-to-device
    copy of the buffer (device_put with may_alias=False), seconds per call.
    The copies are timed to the end of every one of them: the runtime may
    spread them over several streams, where waiting for the last one alone
    left others running (copy rates above the memory's peak)."""
    t = bench(lambda x: -x, [(x,) for x in xs], iters, reps)
    try:
        memcpy = lambda x: jax.device_put(x, dev, may_alias=False)
        t = min(t, bench(memcpy, [(x,) for x in xs], iters, reps, one_program=False, wait_all=True))
    except TypeError:  # older JAX without may_alias
        pass
    return t


def stream2_seconds(xs, ys, iters, reps):
    """The backward's own reference: XLA's x + y, which moves the bytes of the
    backward's tensors in the same pattern (two tensors read, one written),
    seconds per call."""
    return bench(lambda x, y: x + y, list(zip(xs, ys)), iters, reps)


def chained(fn, n, mode, stack=False):
    """fn applied n times back to back in one jit (unrolled, no loop overhead):
    the output feeds the next application through an optimization barrier, so
    that each application is compiled on its own, as a norm between a model's
    matmuls is (without it XLA fuses a chain of jnp norms into one kernel).
    `mode`: "fwd" (y is the next x), "bwd" (dx the next dy; dgamma is
    returned too, or XLA would drop its reduction as dead code) or "add" (the
    residual add: y is the next x and h the next residual). `stack`: the
    backward's dgammas returned as one array (one output buffer a call)
    instead of one buffer a step, whose dispatch would otherwise set the time
    of a call."""
    def run(*args):
        args, kept = list(args), []
        for _ in range(n):
            out = fn(*args)
            if mode == "bwd":
                kept.append(out[1])
                args[0] = jax.lax.optimization_barrier(out[0].astype(args[0].dtype))
            elif mode == "add":
                args[0], args[1] = jax.lax.optimization_barrier(
                    (out[0].astype(args[0].dtype), out[1].astype(args[1].dtype)))
            else:
                args[0] = jax.lax.optimization_barrier(out.astype(args[0].dtype))
        return tuple(args), (jnp.stack(kept) if stack and kept else kept)

    return jax.jit(run)


# ---------------------------------------------------------------------------
# CSV rows


def gpu_key(device_kind: str) -> str:
    """The results file's name for a device: its model in lower case
    ("NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200")."""
    for word in re.findall(r"[A-Za-z0-9]+", device_kind):
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", word) and word.upper() != "NVIDIA":
            return word.lower()
    return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_") or "device"


def add_csv_arguments(ap):
    ap.add_argument("--csv", default=None, metavar="PATH",
                    help="append the measured rows to this CSV (default on a GPU: benchmarks/results/<gpu>.csv)")
    ap.add_argument("--no-csv", action="store_true", help="record no rows")
    ap.add_argument("--commit", default=None,
                    help="the commit the rows are measured at (default: git's HEAD, '+dirty' with local changes)")


def csv_path(args, device):
    """Where this run's rows go (None: nowhere)."""
    if args.no_csv:
        return None
    if args.csv:
        return pathlib.Path(args.csv)
    if device.platform == "gpu":
        return RESULTS_DIR / f"{gpu_key(device.device_kind)}.csv"
    return None


def git_commit() -> str:
    """The checkout's HEAD (short), with '+dirty' where tracked files differ;
    'unknown' outside a git checkout."""
    root = pathlib.Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _fmt(v):
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return ""
    return f"{v:.5g}" if isinstance(v, float) else str(v)


def write_rows(path, rows, device, source, commit=None):
    """Appends ``rows`` (dicts of FIELDS' measured columns) to the CSV at
    ``path`` (created with its header), with the commit, today's date (UTC),
    the device and ``source`` filled in. Returns the path, or None."""
    if path is None or not rows:
        return None
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    common = dict(commit=commit or git_commit(), date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                  gpu=device.device_kind, source=source)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        for r in rows:
            out = {k: _fmt(r.get(k)) for k in FIELDS}
            out.update(common)
            w.writerow(out)
    print(f"appended {len(rows)} rows to {path}")
    return path
