"""The CUDA launch plans (csrc/plan), pinned.

Which kernel, in which configuration, takes each problem of a grid on an H100
(132 SMs, compute capability 9.0), an H200 (the same, with faster memory) and
an A100 (108 SMs, 8.0): a routing change
shows up as a change of tests/golden/plans_<device>.txt in review. The plans
are plain C++ in the CPU module, so this runs everywhere. After an intended
routing change, regenerate the files and review their diff:

    python tests/test_plan.py --update
"""

from __future__ import annotations

import difflib
import os
import pathlib
import re
import sys

import numpy as np
import pytest

from jax_rmsnorm._ffi import PLAN_DEVICES, describe_plan
from reference import PLATFORMS, run_script

GOLDEN = pathlib.Path(__file__).parent / "golden"
TUNING = pathlib.Path(__file__).parents[1] / "docs" / "tuning.md"
ELEMENTS = 1 << 27  # the benchmarks' tensor size

# Widths: powers of two from 256 to 262144, the hidden sizes of public LLMs
# between them, and widths that are no multiple of a pack.
WIDTHS = [256, 1000, 1024, 2048, 2560, 2880, 3584, 4096, 4100, 5120, 7168, 8192, 12288, 16384, 18432, 25600,
          32768, 40001, 65536, 131072, 262144]
FEW_WIDTHS = [1024, 2048, 4096, 5120, 8192, 12288, 16384, 65536, 262144, 4100]
TYPES = [("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
         ("float16", "float32")]


def _rows(hidden, few):
    return few + [max(1, ELEMENTS // hidden)]


def cases(device):
    """(label, direction, kind, shape, dtype, options) for the device's grid."""
    full = device == "h100"
    for kind in ("rms", "layer"):
        for dtype, param in TYPES if full else TYPES[:3]:
            for hidden in WIDTHS if full else FEW_WIDTHS:
                for rows in _rows(hidden, [1, 16, 256] if full else [16]):
                    for direction in ("fwd", "bwd"):
                        yield "", direction, kind, (rows, hidden), dtype, dict(param_dtype=param)
        if not full:
            continue
        for dtype, param in [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
                             ("float32", "float32")]:
            for hidden in FEW_WIDTHS:
                for rows in _rows(hidden, [16]):
                    for quant in ("tensor", "row", "group", "current"):
                        if quant == "group" and hidden % 128:
                            continue
                        opts = dict(param_dtype=param, quant=quant)
                        if quant == "group":
                            opts["group_size"] = 128
                        if quant == "current":
                            opts["qt"] = True
                        yield "", "fwd", kind, (rows, hidden), dtype, opts
                    for quant in ("none", "tensor", "row"):
                        for h32 in (False, True):
                            yield "", "fwd", kind, (rows, hidden), dtype, dict(
                                param_dtype=param, quant=quant, residual=True, residual_f32=h32, h_f32=h32)
                    yield "", "bwd", kind, (rows, hidden), dtype, dict(param_dtype=param, dh=True)
        # The rest, on bf16 rows: parameters absent or zero-centred, vmapped
        # parameter groups, given statistics (hidden split across devices),
        # FP8 x, groups of 16, unaligned buffers.
        for hidden in FEW_WIDTHS:
            for rows in _rows(hidden, [16]):
                shape, dt = (rows, hidden), "bfloat16"
                yield "", "fwd", kind, shape, dt, dict(gamma=False, beta=False)
                yield "", "fwd", kind, shape, dt, dict(zero_centered=True)
                yield "", "fwd", kind, shape, dt, dict(given_stats=True)
                yield "", "fwd", kind, shape, dt, dict(aligned=False)
                if hidden % 128 == 0 and rows % 4 == 0:
                    yield "", "fwd", kind, shape, dt, dict(groups=4)
                    yield "", "fwd", kind, shape, dt, dict(fp8_x=True, x_group=128)
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=16)
                    # the block-scaled rules (MXFP8, NVFP4, power-of-two 1x128)
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=32, group_scale="e8m0")
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=16, group_scale="nvfp4")
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=16, group_scale="nvfp4",
                                                           aligned=False)
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=128, group_scale="pow2")
                    # with the columnwise copy: fwd_tiles, or fwd_columns after the rows
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=32, group_scale="e8m0", qt=True)
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=16, group_scale="nvfp4", qt=True)
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=128, group_scale="pow2", qt=True)
                    # and the residual add: fwd_tiles for x's dtype, not for float32 h
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=32, group_scale="e8m0", qt=True,
                                                           residual=True)
                    yield "", "fwd", kind, shape, dt, dict(quant="group", group_size=32, group_scale="e8m0", qt=True,
                                                           residual=True, residual_f32=True, h_f32=True)
                yield "", "bwd", kind, shape, dt, dict(gamma=False, param_outputs=0)
                yield "", "bwd", kind, shape, dt, dict(coef=True)
                yield "", "bwd", kind, shape, dt, dict(aligned=False)
                if rows % 4 == 0:
                    yield "", "bwd", kind, shape, dt, dict(groups=4)


def render(device):
    lines = []
    for _, direction, kind, shape, dtype, opts in cases(device):
        opts = dict(opts)
        param = opts.pop("param_dtype", dtype)
        key = " ".join(f"{k}={v}" for k, v in sorted(opts.items()))
        plan = describe_plan(direction, kind, shape, dtype, param_dtype=param, device=device, **opts)
        label = f"{direction} {kind} {dtype}/{param} {shape[0]}x{shape[1]}" + (f" {key}" if key else "")
        lines.append(f"{label}: {plan}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("device", sorted(PLAN_DEVICES))
def test_plans_match_golden(device):
    want_path = GOLDEN / f"plans_{device}.txt"
    got = render(device)
    want = want_path.read_text()
    if got != want:
        diff = "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "now"))[:60])
        pytest.fail(f"the {device} plans changed (review, then `python tests/test_plan.py --update`):\n{diff}")


@pytest.mark.parametrize("device", sorted(PLAN_DEVICES))
def test_plans_name_compiled_instances_and_tuning_entries(device):
    text = render(device)
    assert "no-such-instance" not in text, [l for l in text.splitlines() if "no-such-instance" in l][:5]
    if TUNING.exists():  # the source tree's docs (absent from an installed copy)
        anchors = set(re.findall(r"^### (\S+)", TUNING.read_text(), re.M))
        rules = set(re.findall(r"rule=([\w-]+)", text))
        assert rules <= anchors, sorted(rules - anchors)


def test_plan_examples():
    # A (32768, 4096) bf16 RMSNorm on an H100 takes fwd_regs: rows of 128
    # threads of four packs each, two rows a CTA.
    fwd = describe_plan("fwd", "rms", (32768, 4096), "bfloat16")
    assert fwd.startswith("fwd_regs[base] vec=8 threads=128 rows_per_cta=2"), fwd
    # Decode-time rows take fwd_decode; its backward bwd_decode with column tiles.
    assert describe_plan("fwd", "rms", (16, 4096), "bfloat16").startswith("fwd_decode[plain")
    assert describe_plan("bwd", "rms", (16, 4096), "bfloat16").startswith("bwd_decode[tiles]")
    # Rows a cluster wide take fwd_slices on an H100, which an A100 has not.
    assert describe_plan("fwd", "layer", (512, 262144), "bfloat16").startswith("fwd_slices[cluster_refill")
    assert not describe_plan("fwd", "layer", (512, 262144), "bfloat16", device="a100").startswith("fwd_slices")
    # Block-scaled outputs take the row-holding kernels, as per-group FP8 does;
    # NVFP4 in single elements (unaligned) streams.
    assert describe_plan("fwd", "rms", (32768, 4096), "bfloat16", quant="group", group_size=32,
                         group_scale="e8m0").startswith("fwd_slices")
    assert describe_plan("fwd", "rms", (4, 4096), "bfloat16", quant="group", group_size=16, group_scale="nvfp4",
                         aligned=False).startswith("fwd_stream")
    # LayerNorm's per-group outputs hold gamma and beta in registers where the
    # row fills its CTA's threads (4096: 128 x 4 packs), not where it does not
    # (2560: 96 threads for 80 x 4 packs).
    mx = dict(quant="group", group_size=32, group_scale="e8m0")
    assert describe_plan("fwd", "layer", (32768, 4096), "bfloat16", **mx).startswith("fwd_slices[held_params,whole]")
    assert describe_plan("fwd", "layer", (52428, 2560), "bfloat16", **mx).startswith("fwd_slices[base] ")


@pytest.mark.parametrize("group_scale,group_size", [("e8m0", 32), ("nvfp4", 16), ("float32", 32), ("pow2", 16)])
def test_tile_scales_workspace_agrees(group_scale, group_size):
    """The columnwise copy's scales go by rows through the workspace where
    the plan says so and only there: the primitive sizes the workspace by
    the same rule (_ffi.qt_scales_workspace) that the plan prints."""
    from jax_rmsnorm import _ffi

    plan = describe_plan("fwd", "rms", (32768, 4096), "bfloat16", quant="group", group_size=group_size,
                         group_scale=group_scale, qt=True)
    assert plan.startswith("fwd_tiles"), plan
    assert ("qt_scales=transpose8" in plan) == _ffi.qt_scales_workspace(group_scale), plan
    assert _ffi.qt_scales_workspace(group_scale) == (group_scale in ("e8m0", "nvfp4"))


def test_describe_plan_errors():
    with pytest.raises(ValueError, match="direction"):
        describe_plan("sideways", "rms", (4, 8), "float32")
    with pytest.raises(ValueError, match="kind"):
        describe_plan("fwd", "batch", (4, 8), "float32")
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        describe_plan("fwd", "rms", (4, 8), "float64")
    with pytest.raises(ValueError, match="quant"):
        describe_plan("fwd", "rms", (4, 8), "float32", quant="blocks")
    with pytest.raises(ValueError, match="group_scale"):
        describe_plan("fwd", "rms", (4, 32), "float32", quant="group", group_size=32, group_scale="e4m3")
    with pytest.raises(TypeError, match="unknown fwd option"):
        describe_plan("fwd", "rms", (4, 32), "float32", quant="group", group_scales="e8m0")
    with pytest.raises(ValueError, match="device must be 'current', one of"):
        describe_plan("fwd", "rms", (4, 8), "float32", device="b200")


def test_describe_plan_current_device():
    """device="current" plans for the GPU at hand, or says why it cannot."""
    if "gpu" in PLATFORMS:
        assert describe_plan("bwd", "rms", (32768, 4096), "bfloat16", device="current").startswith("bwd_")
    else:
        with pytest.raises(RuntimeError, match="device='current'"):
            describe_plan("bwd", "rms", (32768, 4096), "bfloat16", device="current")


@pytest.mark.parametrize("platform", ["gpu"])
def test_dram_bandwidth_plans_bit_identical(platform, tmp_path):
    """The backward's plans on either side of the DRAM bandwidth from which
    bwd_slices loads a row's statistics a row ahead (an H100's and an H200's,
    set by JAX_RMSNORM_DRAM_GBPS on the GPU at hand) take the row-ahead loads
    or not, and give the same bits."""
    script = pathlib.Path(__file__).parent / "plan_dram_outputs.py"
    runs = []
    for dev in ("h100", "h200"):
        path = tmp_path / f"{dev}.npz"
        run_script(script, str(path), env={**os.environ, "JAX_RMSNORM_DRAM_GBPS": str(PLAN_DEVICES[dev]["dram_gbps"])})
        runs.append(np.load(path))
    slow, fast = runs
    plans = [k for k in fast.files if k.startswith("plan_")]
    assert len(plans) == 6 and sorted(slow.files) == sorted(fast.files)
    for k in plans:
        assert "stats_ahead" not in str(slow[k]) and "bwd_slices[late,stats_ahead]" in str(fast[k]), (
            k, str(slow[k]), str(fast[k]))
    grads = [k for k in fast.files if k.startswith("d")]
    assert len(grads) == 15
    for k in grads:
        assert bool(fast["finite_" + k]) and bool(slow["finite_" + k]), f"{k}: not finite, or all zero"
        assert str(slow[k]) == str(fast[k]), f"{k}: the row-ahead statistics change the outputs"


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    GOLDEN.mkdir(exist_ok=True)
    for dev in sorted(PLAN_DEVICES):
        (GOLDEN / f"plans_{dev}.txt").write_text(render(dev))
        print("wrote", GOLDEN / f"plans_{dev}.txt")
