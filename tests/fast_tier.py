"""The fast GPU tier: ``pytest -m "gpu and not slow" tests``.

conftest.py marks every test run on the GPU (its ``platform`` parameter is
"gpu") with ``gpu``, and with ``slow`` unless this table selects it. The
selection runs every kernel family at least once: for each test, a predicate
over its parameters (dtypes by name) and the families those cases take on an
sm_90 GPU (csrc/plan routes them: jax_rmsnorm._ffi.describe_plan). A GPU test
not named here runs only in the whole suite (``pytest -m gpu tests``).
"""

BF16 = "bfloat16"


def _bf16(p):
    return p.get("dtype") == BF16


FAST = {
    # -- plain norms, forward and backward --------------------------------
    # bf16 every shape family: rank 1-4 and hidden 1 (scalar loads), 16x4096
    # and 4x12288 (fwd_decode, bwd_decode), 10000x64 (fwd_regs, bwd_regs with
    # slots), 3x40001 (fwd_stream, bwd_stream: unaligned and wide),
    # 2x65536 and 1x262144 (fwd_slices and bwd_slices in clusters); float32
    # at 262144 (wider than any cluster: the streaming kernels).
    "test_values.py::test_forward_backward": lambda p: _bf16(p) or (
        p["dtype"] == "float32" and p["shape"] in [(1, 262144), (2, 65536)]),
    # Both sides of fwd_decode's bounds (2 x SMs rows of 2048 packs; its
    # four-packs variant; rows split into parts; one pack a thread) and of
    # bwd_decode's (192 / 193 rows, 128 of narrow rows, clusters of 8 a row).
    "test_values.py::test_decode_row_bounds": lambda p: _bf16(p) and (
        (p["packs"] == 2048 and p["rows"] > 200) or (p["rows"], p["packs"]) in [
            (2, 2056), (1, 37), (4, 512), (4, 513), (1, 1), (2, 1), (37, 100), (120, 1025), (192, 129),
            (193, 129), (8, 2048), (9, 2048), (3, 1001)]),
    # LayerNorm's float32-parameter instance of fwd_regs (CTAs of 128, P32).
    "test_values.py::test_layer_float32_params_paths": lambda p: _bf16(p) and p["hidden"] in (2048, 4096, 8200),
    # fwd_decode and bwd_decode launched early, each reading the previous step.
    "test_values.py::test_chained_decode": lambda p: _bf16(p) and p["shape"] == (16, 4096),
    "test_values.py::test_chained_backward": lambda p: _bf16(p) and p["shape"] in [(16, 4096), (128, 16384)],
    # fwd_unaligned and bwd_unaligned: several rows a CTA (13), one CTA of 2-4
    # packs a thread, a cluster (32767), slots over more than 512 rows
    # (1500x1002), and past their bound the streaming kernels (32769).
    "test_values.py::test_unaligned_widths": lambda p: _bf16(p) and p["shape"] in [
        (257, 13), (300, 1001), (200, 4097), (50, 12290), (12, 32767), (10, 32769), (1500, 1002)],
    # A kernel's opt-in shared-memory limit across launches.
    "test_values.py::test_shared_memory_limit_order": None,
    # Persistent slots walking several rows each: fwd_regs / bwd_regs CTAs of
    # 160 threads, bwd_slices in a cluster of four, fwd_slices in clusters.
    "test_values.py::test_many_rows_per_slot": lambda p: _bf16(p) and p["shape"] in [
        (3000, 1024), (1000, 5120), (500, 16392), (300, 49152)],
    # dgamma/dbeta by the column kernel and by the slots' partial rows.
    "test_values.py::test_dgamma_both_paths": lambda p: p["shape"] == (300, 8192),
    # A cluster of 16 walking rows of unlike magnitudes.
    "test_values.py::test_rows_of_unlike_scales": lambda p: p["shape"] == (72, 262144),
    # LayerNorm's one-pass statistics and shifted sums, one case per family.
    "test_values.py::test_layer_norm_backward_far_from_zero": lambda p: _bf16(p),
    "test_values.py::test_layer_norm_statistics_far_from_zero": lambda p: p["hidden"] in (4096, 262144),
    # Parameter groups (vmap over gamma) in the wide-row kernels.
    "test_values.py::test_forward_per_group_wide_rows": lambda p: (
        _bf16(p) and p["hidden"] == 65536 and p["variant"] == "plain"),
    "test_values.py::test_dgamma_per_group_wide_rows": lambda p: _bf16(p) and p["hidden"] == 65536,
    "test_values.py::test_explicit_bwd_matches_grad": None,
    "test_values.py::test_nan_stays_in_its_row": None,
    "test_values.py::test_empty_inputs": None,
    # -- residual add -----------------------------------------------------
    # fwd_decode's residual variants, fwd_regs, fwd_stream and fwd_slices.
    "test_fused.py::test_add_norm_forward": lambda p: _bf16(p) and p["shape"] in [(16, 4096), (3, 40001), (2, 65536)],
    "test_fused.py::test_add_norm_forward_unaligned": lambda p: _bf16(p) and p["shape"] in [(300, 1001), (10, 32769)],
    "test_fused.py::test_add_norm_decode_bounds": lambda p: _bf16(p) and (
        (p["packs"] == 2048 and p["rows"] > 200) or (p["rows"], p["packs"]) in [(4, 1024), (4, 1025)]),
    # Wide rows: two passes (fwd_add_stats, then fwd_apply) where they fill
    # the GPU, else fwd_regs in a cluster a row.
    "test_fused.py::test_add_norm_forward_many_rows": lambda p: _bf16(p),
    # The statistics kernel with the residual (h in one pass), then the apply.
    "test_fused.py::test_add_norm_hidden_slice_path": lambda p: _bf16(p) and p["shape"] in [(700, 4096), (3, 40001)],
    # The backward adding dh: bwd_regs, bwd_slices in clusters, slots.
    "test_fused.py::test_add_norm_grad": lambda p: _bf16(p) and p["shape"] in [(4, 1000), (2, 65536)],
    "test_fused.py::test_add_norm_grad_many_rows": lambda p: p["shape"] == (3000, 4096),
    # -- FP8 output -------------------------------------------------------
    # Per tensor and per row: one-warp CTAs (37x1024), fwd_regs, fwd_stream,
    # clusters; per row also the 512-thread CTA holding x * gamma (4x12288).
    "test_fused.py::test_fp8_tensor": lambda p: _bf16(p) and p["fmt"] == "float8_e4m3fn" and p["shape"] in [
        (37, 1024), (16, 4096), (3, 40001), (2, 65536)],
    "test_fused.py::test_fp8_rowwise": lambda p: _bf16(p) and p["fmt"] == "float8_e4m3fn" and p["shape"] in [
        (37, 1024), (16, 4096), (3, 40001), (2, 65536), (4, 12288)],
    # Current scaling: the amax pass, then the quantizing pass.
    "test_fused.py::test_fp8_current": lambda p: _bf16(p) and p["fmt"] == "float8_e4m3fn" and p["shape"] in [
        (16, 4096), (2, 65536)],
    # Per group: shuffles in fwd_regs (16, 128), fwd_slices (16384, clusters),
    # the streaming kernel (groups of 24).
    "test_fused.py::test_fp8_groupwise": lambda p: _bf16(p) and p["fmt"] == "float8_e4m3fn" and (
        p["group"], p["shape"]) in [(128, (4, 4096)), (16, (2, 65536)), (24, (3, 72)), (128, (5, 16384))],
    # Many rows a slot: every quantization in one-warp CTAs (1024), per row
    # and per group in CTAs of 384 threads (12288).
    "test_fused.py::test_fp8_many_rows": lambda p: p["shape"] == (10000, 1024) or (
        p["shape"] == (700, 12288) and p["quant"] in ("row", "group")),
    # The residual with every quantization; its two passes at wide rows.
    "test_fused.py::test_fp8_with_residual": None,
    "test_fused.py::test_fp8_with_residual_many_rows": lambda p: _bf16(p) and p["quant"] == "tensor",
    # apply_fp8 on a slice of a split hidden dim (per row: a measuring pass first).
    "test_fused.py::test_fp8_hidden_slice_path": lambda p: _bf16(p) and (p["quant"], p["shape"]) in [
        ("tensor", (16, 4096)), ("row", (2, 65536)), ("group", (4, 4096))],
    # q_t: quantize_tiles (q and q_t from one read), the tiled transpose after
    # a residual, and the byte-wise transpose.
    "test_fused.py::test_fp8_current_transpose": lambda p: p["kind"] == "rms" and p["shape"] in [
        (1040, 4096), (260, 130)],
    # fwd_unaligned's FP8 outputs.
    "test_fused.py::test_fp8_unaligned": lambda p: _bf16(p) and p["shape"] == (300, 1001),
    "test_fused.py::test_fp8_grad_straight_through": lambda p: _bf16(p),
    "test_fused.py::test_fp8_one_warp_per_example_params": lambda p: p["quant"] == "tensor",
    "test_fused.py::test_vmap_fused": None,
    "test_fused.py::test_fused_empty_inputs": None,
    # -- FP8 input (fwd_fp8_regs, the streaming kernel, clusters) ---------
    "test_fp8_input.py::test_forward": lambda p: _bf16(p) and p["fmt"] == "float8_e4m3fn" and p["case"] in [
        ((16, 4096), 128), ((3, 40000), 8), ((2, 65536), 128), ((4, 4096), None)],
    "test_fp8_input.py::test_residual": None,
    "test_fp8_input.py::test_grads": lambda p: p["group"] == 16,
    # -- statistics and apply (the hidden-sharded building blocks) --------
    "test_sharding.py::test_stats_kernels_against_float64": lambda p: (p["rows"], p["hidden"]) in [
        (2049, 4096), (515, 333)],
    "test_sharding.py::test_stats_and_apply": lambda p: _bf16(p),
    "test_sharding.py::test_apply_wide_rows": lambda p: _bf16(p),
    "test_sharding.py::test_stats_and_apply_gradients": None,
    # -- several GPUs (skipped on one): sharded jit, and the NVLink kernel --
    "test_sharding.py::test_sharded_jit_matches_unsharded": lambda p: (
        _bf16(p) and p["kind"] == "rms" and p["layout"] in ("rows", "hidden") and p["axis_type"].name == "Auto"),
    "test_sharding.py::test_all_reduce_rms_norm_nvlink_chain": None,
    # -- transforms and modules -------------------------------------------
    "test_transforms.py::test_vmap_of_grad_is_per_example": lambda p: p["in_axes"] == (0, 0, 0),
    "test_transforms.py::test_checkpoint_and_model_value_and_grad": None,
    "test_modules.py::test_nnx_matches_flax": None,
    "test_export.py::test_export_roundtrip_with_grad": None,
}


def _plain(v):
    """A parameter as the predicates see it: dtypes by name."""
    try:
        if isinstance(v, type) and not issubclass(v, (int, float, str, tuple)):
            import numpy as np
            return np.dtype(v).name
    except TypeError:
        pass
    return v


def is_fast(item) -> bool:
    """Whether a GPU test item belongs to the fast tier."""
    key = f"{item.path.name}::{item.originalname}"
    if key not in FAST:
        return False
    pick = FAST[key]
    return pick is None or bool(pick({k: _plain(v) for k, v in item.callspec.params.items()}))
