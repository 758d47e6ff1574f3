"""Counts the SASS instructions of the CUDA module's kernels by opcode, from
`cuobjdump -sass` (run where the CUDA toolkit is), to see what a kernel spends
its instructions on:

    cuobjdump -sass $(python3 -c "import jax_rmsnorm._jax_rmsnorm_cuda as m; print(m.__file__)") \
        | python3 benchmarks/sass_summary.py fwd_regs bwd_slices

Without a GPU, one source file's kernels can be read from a cubin that nvcc
builds alone (flags as CMakeLists.txt gives them; JAX's FFI headers from jaxlib):

    nvcc -std=c++20 -O3 --expt-relaxed-constexpr -DNDEBUG -arch=sm_90 -cubin -Xptxas -v \
        -isystem $(python3 -c "import jaxlib, os; print(os.path.dirname(jaxlib.__file__))")/include \
        -I csrc -I csrc/cuda csrc/cuda/norm_fwd.cu -o norm_fwd.cubin
    cuobjdump -sass norm_fwd.cubin | python3 benchmarks/sass_summary.py fwd_regs

Where the toolkit has nvcc but neither cuobjdump nor nvdisasm (which cuobjdump
runs), the PyPI wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm hold
both (13.2 read nvcc 13.0's sm_90 cubins); put their bin/ folder on PATH.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
        return out.split("\n")
    except OSError:
        return names


def main():
    pats = sys.argv[1:]
    funcs, cur = {}, None
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = collections.Counter()
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if cur and m:
            funcs[cur][m.group(1).split(".")[0]] += 1
    names = list(funcs)
    for name, pretty in zip(names, demangle(names)):
        if pats and not any(p in pretty for p in pats):
            continue
        c = funcs[name]
        print(f"{sum(c.values()):6d}  {pretty[:150]}")
        print("        " + " ".join(f"{k}:{v}" for k, v in c.most_common(18)))


if __name__ == "__main__":
    main()
