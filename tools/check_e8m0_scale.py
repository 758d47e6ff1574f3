"""Checks mxfp8_scale's first try (csrc/cuda/common/block_scale.cuh) on every
float32 it takes, with NumPy's float32 division standing in for the device's
correctly rounded one: for gm normal with a biased exponent from 17 to 254,
e8m0_round_up(RN(gm / fp8_max)) equals gm's exponent less 8 (E4M3, 448 =
1.75 * 2^8) or 15 (E5M2, 57344 = 1.75 * 2^15), plus one where gm's mantissa
exceeds 1.75's (0x600000).

    python tools/check_e8m0_scale.py    # about 40 s

Run it after changing that arithmetic.
"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from reference import e8m0_round_up  # noqa: E402  (the tests' E8M0 rule, as norm_fused.h's)


def main():
    mant = np.arange(1 << 23, dtype=np.uint32)
    failures = 0
    for fmax, less in ((448.0, 8), (57344.0, 15)):
        for exp in range(17, 255):
            gm = ((np.uint32(exp) << 23) | mant).view(np.float32)
            ref = e8m0_round_up(gm / np.float32(fmax))
            fast = (exp - less + (mant > 0x600000)).astype(np.uint8)
            bad = int((ref != fast).sum())
            if bad:
                print(f"fp8_max {fmax}, exponent {exp}: {bad} floats differ")
            failures += bad
    print("ok" if failures == 0 else f"{failures} floats differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
