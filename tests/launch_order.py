"""Run in a process of its own by test_values.test_shared_memory_limit_order:
LayerNorm's backward (float16) at widths whose kernel is the same but whose
dynamic shared memory is not, larger, then smaller, then larger again. A
kernel's shared-memory limit must not fall with the smaller launch (a fresh
process, so no earlier launch has raised it already)."""
import pathlib
import sys

import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_values import _check  # noqa: E402

# bwd_unaligned two packs a thread: 320 threads at 5000, 256 at 4100 (60 and
# 48 KB); three packs a thread: 512 at 12290, 352 at 8201 (144 and 99 KB).
for i, shape in enumerate([(600, 5000), (600, 4100), (600, 5000), (520, 12290), (600, 8201), (520, 12290)]):
    _check("layer", jnp.float16, shape, "gpu", jnp.float16, False, True, 100 + i)
    print("ok", shape)
