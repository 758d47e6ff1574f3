"""Counts the SASS instructions of the CUDA module's kernels by opcode, from
`cuobjdump -sass` (run where the CUDA toolkit is), to see what a kernel spends
its instructions on:

    cuobjdump -sass $(python3 -c "import jax_rmsnorm._jax_rmsnorm_cuda as m; print(m.__file__)") \
        | python3 tools/sass_summary.py fwd_regs bwd_slices

Without a GPU, one source file's kernels can be read from a cubin that nvcc
builds alone (flags as CMakeLists.txt gives them; JAX's FFI headers from jaxlib;
the forward's are in csrc/cuda/units/fwd_{rms,layer}_{f32,bf16,f16}.cu, the
backward's in csrc/cuda/units/bwd_{f32,bf16,f16}.cu, by normalization and type
of x):

    nvcc -std=c++20 -O3 --expt-relaxed-constexpr -DNDEBUG -arch=sm_90 -cubin -Xptxas -v \
        -isystem $(python3 -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")/include \
        -I csrc -I csrc/cuda csrc/cuda/units/fwd_rms_bf16.cu -o fwd_rms_bf16.cubin
    cuobjdump -sass fwd_rms_bf16.cubin | python3 tools/sass_summary.py fwd_regs

Where the toolkit has nvcc but neither cuobjdump nor nvdisasm (which cuobjdump
runs), the PyPI wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm hold
both (13.2 read nvcc 13.0's sm_90 cubins); put their bin/ folder on PATH.

With --waits, it lists instead, for each kernel, the global loads whose value
an instruction uses before the kernel's first wide (64- or 128-bit) global
load or bulk copy is issued: there each warp waits a memory round trip before
its data loads go out (a scale or a statistic loaded first and spilled,
inverted or moved to a uniform register). Kernels that must read a value
first (a row's shift, say) show up too; it is a list to read, not a verdict:
    cuobjdump -sass fwd_rms_bf16.cubin | python3 tools/sass_summary.py --waits fwd_

With --executed, it reads instead Nsight Compute's per-instruction counts of
one profiled launch (the SourceCounters section, exported as the source
page's CSV) and sums the executed warp instructions by opcode; given the
launch's element count (rows * hidden), also thread instructions an element.
--dump FILE writes every executed instruction as "address count SASS", in
code order, to see which part of a kernel the counts come from. Where the page
has warp stall samples (the WarpStateStats section profiled too), it also
prints the 20 lines with most samples, and the dump reads "address count
samples SASS":
    ncu --kernel-name regex:fwd_ --launch-skip 1 --launch-count 1 --section SourceCounters \
        -o rep python3 tools/profile_ops.py ln_fwd --rows 32768 --hidden 4096 --calls 2
    ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv
    python3 tools/sass_summary.py --executed src.csv 134217728 [--dump lines.txt]
"""

from __future__ import annotations

import collections
import csv
import re
import subprocess
import sys


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        return out.split("\n")
    except OSError:
        return names


PREDICATE = r"(?:@!?U?P\w+\s+)?"  # an instruction's guard, if any
WIDE_LOAD = re.compile("^" + PREDICATE + r"(?:LDG\.E\.(?:64|128)|LDGSTS|UBLKCP)")
GLOBAL_LOAD = re.compile("^" + PREDICATE + r"LDG\S*\s+(R\d+)")


def early_waits(code):
    """(load index, use index, use) for each global load used before the first wide load."""
    first = next((i for i, ins in enumerate(code) if WIDE_LOAD.match(ins)), None)
    if first is None:
        return []
    pending, waits = {}, []
    for i, ins in enumerate(code[:first]):
        m = GLOBAL_LOAD.match(ins)
        if m:
            pending[m.group(1)] = i
            continue
        op, _, args = ins.partition(" ")
        ops = [a.strip() for a in args.split(",")]
        # A store's first operand is its address; other instructions write their first.
        sources = ops if op.startswith("ST") else ops[1:]
        for reg, at in list(pending.items()):
            if any(re.search(rf"\b{reg}\b", a) for a in sources):
                waits.append((at, i, ins))
                del pending[reg]
        if not op.startswith(("ST", "BRA", "ISETP")) and ops and ops[0] in pending:
            del pending[ops[0]]  # overwritten before any use
    return waits


def opcode(ins):
    return re.sub("^" + PREDICATE, "", ins).split(" ")[0].split(".")[0]


STALLS = "Warp Stall Sampling (All Samples)"


def executed(args):
    """--executed SRC.CSV [ELEMENTS] [--dump FILE]: executed instructions by opcode."""
    dump = None
    if "--dump" in args:
        at = args.index("--dump")
        dump = args.pop(at + 1)
        del args[at]
    path, elems = args[0], float(args[1]) if len(args) > 1 else 0.0
    with open(path, newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    at = next((i for i, r in enumerate(rows) if "Source" in (c.strip() for c in r)), None)
    if at is None:
        sys.exit(f"sass_summary: {path} has no source page (no row naming a 'Source' column)")
    head = [c.strip() for c in rows[at]]
    src, count, addr = head.index("Source"), head.index("Instructions Executed"), head.index("Address")
    stall = head.index(STALLS) if STALLS in head else None

    def number(r, i):  # a cell's count, None where it holds none
        try:
            return float(r[i].replace(",", ""))
        except (IndexError, ValueError):
            return None

    by_op, lines, stalls = collections.Counter(), [], []
    for r in rows[at + 1:]:
        n = number(r, count)
        k = (number(r, stall) or 0.0) if stall is not None else None  # a line without samples: 0
        if n:
            by_op[opcode(r[src].strip())] += n
            lines.append(f"{r[addr].strip()} {n:.0f} " + (f"{k:.0f} " if k is not None else "") + r[src].strip())
            if k:
                stalls.append((k, r[addr].strip(), r[src].strip()))
    total = sum(by_op.values())
    per = (lambda n: f"  {n * 32 / elems:6.2f} an element") if elems else (lambda n: "")
    print(f"{total:14,.0f} warp instructions" + per(total))
    for op, n in by_op.most_common(40):
        print(f"{n:14,.0f} {100 * n / total:5.1f}%  {op:8s}" + per(n))
    if stalls:
        all_samples = sum(k for k, _, _ in stalls)
        print(f"{all_samples:14,.0f} stall samples; the lines with most:")
        for k, a, ins in sorted(stalls, reverse=True)[:20]:
            print(f"{k:14,.0f} {100 * k / all_samples:5.1f}%  {a} {ins}")
    if dump:
        with open(dump, "w") as f:
            f.write("\n".join(lines) + "\n")


def main():
    args = sys.argv[1:]
    if "--executed" in args:
        args.remove("--executed")
        return executed(args)
    waits = "--waits" in args
    pats = [a for a in args if a != "--waits"]
    funcs, cur = {}, None
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if cur and m:
            funcs[cur].append(m.group(1))
    names = list(funcs)
    for name, pretty in zip(names, demangle(names)):
        if pats and not any(p in pretty for p in pats):
            continue
        code = funcs[name]
        if waits:
            found = early_waits(code)
            if found:
                print(pretty[:150])
                for at, use, ins in found:
                    print(f"        load at {at}, used at {use}: {ins[:60]}")
            continue
        c = collections.Counter(opcode(ins) for ins in code)
        print(f"{len(code):6d}  {pretty[:150]}")
        print("        " + " ".join(f"{k}:{v}" for k, v in c.most_common(18)))


if __name__ == "__main__":
    main()
