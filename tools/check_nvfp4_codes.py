"""Checks the arithmetic of the NVFP4 kernels' first try (csrc/cuda/common/block_scale.cuh)
on every float32 it can meet, with NumPy standing in for the device's float32:

- nvfp4_word_near: for every t in [0, 16) (1.1e9 values), the code read from
  the bits equals E2M1 rounded to nearest even wherever the guard does not
  flag t, and the guard flags every t less than 16 ulps from a rounding boundary
  (the first try's t is within 8 ulps of jax.nn's quotient).
- nvfp4_scale: every boundary of E4M3's rounding has its low 18 bits zero, so
  the scale's guard (16 ulps around those) covers them all.

    python tools/check_nvfp4_codes.py    # about 30 s; needs ml_dtypes

Run it after changing either function's arithmetic.
"""
import sys

import numpy as np
import ml_dtypes


def code_near(t):
    """nvfp4_word_near's magnitude code and guard for t >= 0 (float32)."""
    v = np.maximum(t, (t * np.float32(0.5) + np.float32(0.5)).astype(np.float32))  # one rounding, as fmaf
    x = v.view(np.uint32).astype(np.uint64) + 0x200010
    return np.minimum((x >> 22) - 252, 7), (x & 0x3fffe0) == 0


def main():
    failures = 0
    end = int(np.float32(16).view(np.uint32))
    wrong = flagged = 0
    for lo in range(0, end, 1 << 25):
        t = np.arange(lo, min(lo + (1 << 25), end), dtype=np.uint32).view(np.float32)
        mag, near = code_near(t)
        ref = t.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 7
        wrong += int(((mag != ref) & ~near).sum())
        flagged += int(near.sum())
    print(f"E2M1 codes: {end} values, {flagged} sent to the divisions, {wrong} wrong elsewhere")
    failures += wrong
    for b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        around = (np.float32(b).view(np.uint32).astype(np.int64) + np.arange(-15, 16)).astype(np.uint32)
        missed = int((~code_near(around.view(np.float32))[1]).sum())
        if missed:
            print(f"E2M1 guard: {missed} of the 31 values less than 16 ulps from {b} not flagged")
        failures += missed
    e4m3 = np.arange(0, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # 0 to 448
    mids = (e4m3[:-1] + e4m3[1:]) / 2
    assert (mids.astype(np.float32).astype(np.float64) == mids).all(), "midpoints exact in float32"
    off = int((mids.astype(np.float32).view(np.uint32) & 0x3ffff != 0).sum())
    print(f"E4M3 boundaries: {len(mids)}, {off} with low 18 bits not zero")
    failures += off
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
