"""jax_rmsnorm: RMSNorm and LayerNorm for JAX as XLA FFI custom calls.

CUDA kernels on NVIDIA GPUs and C++ kernels on the CPU, forward and backward,
under ``jit``, ``grad``, ``jvp`` (and derivatives of any order), ``vmap`` and
``checkpoint``, partitioned over a mesh
under sharded ``jit`` and usable inside ``shard_map``. See the README for the API
and docs/api.md for its full semantics.
"""

from ._api import (
    all_reduce_rms_norm,
    layer_norm,
    layer_norm_apply,
    layer_norm_stats,
    layer_norm_bwd,
    layer_norm_fwd,
    rms_norm,
    rms_norm_bwd,
    rms_norm_apply,
    rms_norm_fwd,
    rms_norm_stats,
)
from ._ffi import cuda_built, export_checks
from ._modules import FallbackWarning
from ._fused import (
    add_layer_norm,
    add_rms_norm,
    layer_norm_fp8,
    layer_norm_fp8_current,
    layer_norm_fp8_groupwise,
    layer_norm_fp8_rowwise,
    layer_norm_mxfp8,
    layer_norm_nvfp4,
    rms_norm_fp8,
    rms_norm_fp8_current,
    rms_norm_fp8_groupwise,
    rms_norm_fp8_rowwise,
    rms_norm_mxfp8,
    rms_norm_nvfp4,
)

__version__ = "0.1.0"

__all__ = [
    "rms_norm",
    "layer_norm",
    "rms_norm_fwd",
    "rms_norm_bwd",
    "layer_norm_fwd",
    "layer_norm_bwd",
    "rms_norm_stats",
    "rms_norm_apply",
    "layer_norm_stats",
    "layer_norm_apply",
    "all_reduce_rms_norm",
    "add_rms_norm",
    "add_layer_norm",
    "rms_norm_fp8",
    "layer_norm_fp8",
    "rms_norm_fp8_current",
    "layer_norm_fp8_current",
    "rms_norm_fp8_rowwise",
    "layer_norm_fp8_rowwise",
    "rms_norm_fp8_groupwise",
    "layer_norm_fp8_groupwise",
    "rms_norm_mxfp8",
    "layer_norm_mxfp8",
    "rms_norm_nvfp4",
    "layer_norm_nvfp4",
    "cuda_built",
    "export_checks",
    "FallbackWarning",
]
