// Host side of a launch: cluster and early (programmatic dependent)
// launches, and the occupancy query of the persistent kernels.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "base.cuh"
#include "device.h"

namespace jrn::cuda {

// A launch configuration with thread block clusters of `cluster` CTAs along
// x and, with `early`, programmatic dependent launch (launch_early_clustered
// below): the one place that builds the launch attributes.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2] = {};
  ClusterLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, unsigned cluster, bool early = false) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (early) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    // A "cluster" of one CTA is a plain launch: with the cluster attribute the
    // occupancy query for clusters answered fewer CTAs an SM than registers
    // allow (docs/tuning.md, cluster-launch-one).
    if (cluster > 1) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs++].val.clusterDim = {cluster, 1, 1};
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // cfg points into attr
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Lets `kernel` run with clusters of `cluster` CTAs and `smem` bytes of
// dynamic shared memory (limits above the defaults must be asked for). The
// limit belongs to the kernel, not to a launch, so it is only ever raised:
// lowered for a launch with less shared memory, it would refuse a later
// launch with more whose configuration co_resident_clusters has cached
// ("invalid argument"; LayerNorm's bwd_unaligned at hidden 5000, then 4100,
// then 5000 again).
template <class... Params>
ffi::Error allow_cluster_launch(void (*kernel)(Params...), size_t smem, unsigned cluster) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, std::pair<size_t, bool>> allowed;  // smem, non-portable clusters
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_error(e, "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  auto& [most, non_portable] = allowed[{dev, reinterpret_cast<const void*>(kernel)}];
  if (cluster > 8 && !non_portable) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
    non_portable = true;
  }
  if (smem > 32 * 1024 && smem > most) {  // opt in well before 48 KB: static shared memory adds to it
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return cuda_error(e, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    most = smem;
  }
  return ffi::Error::Success();
}

// Launches `kernel` with thread block clusters of `cluster` CTAs along x.
template <class... Params, class... Args>
ffi::Error launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, unsigned cluster, const char* name, Args&&... args) {
  JRN_RETURN_IF_ERROR(allow_cluster_launch(kernel, smem, cluster));
  ClusterLaunch launch(grid, block, smem, stream, cluster);
  cudaError_t e = cudaLaunchKernelEx(&launch.cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) return cuda_error(e, name);
  return check_launch(name);
}

// ---- Programmatic dependent launch (compute capability 9.0 and newer).
// A kernel launched by launch_early may be scheduled while the kernel before
// it in the stream (or in XLA's CUDA graph) is still finishing, so a launch's
// start-up overlaps the previous kernel's tail. Such a kernel must call
// early_launch_wait() before it touches memory that kernel writes: it returns
// once the previous grid has completed and its writes are visible. A kernel
// that reads none of it may run on and call it only before it ends, so that
// its own completion still implies the previous kernel's (bwd_columns).
// Without the launch attribute (an older GPU, or JAX_RMSNORM_PDL=0) both
// instructions return at once.

// Lets the next kernel, where launch_early launched it, be scheduled now,
// while this one runs (without waiting for anything itself).
__device__ __forceinline__ void early_launch_now() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits for the previous grid (see above), then lets the next one be
// scheduled at once (early_launch_now).
__device__ __forceinline__ void early_launch_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  early_launch_now();
}

// Whether launch_early asks for the overlap: on compute capability 9.0 and
// newer (the devices has_clusters() names), unless JAX_RMSNORM_PDL=0 is in
// the environment (read once).
inline bool early_launch_enabled() {
  static const bool allowed = [] {
    const char* v = std::getenv("JAX_RMSNORM_PDL");
    return !(v && std::string(v) == "0");
  }();
  return allowed && has_clusters();
}

// Launches `kernel`, which calls early_launch_wait() as described above, with
// programmatic dependent launch where early_launch_enabled(): in XLA's CUDA
// graphs it shortens the gap between two of our kernels, such as a dx kernel
// and bwd_reduce after it (not between ours and XLA's; docs/tuning.md,
// early-launch).
// With `cluster` > 1 (a device with clusters, at most 8, dividing grid.x) the
// launch also takes thread block clusters of that many CTAs along x.
template <class... Params, class... Args>
ffi::Error launch_early_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned cluster,
                                  cudaStream_t stream, const char* name, Args&&... args) {
  ClusterLaunch launch(grid, block, 0, stream, cluster, early_launch_enabled());
  cudaError_t e = cudaLaunchKernelEx(&launch.cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) return cuda_error(e, name);
  return check_launch(name);
}

template <class... Params, class... Args>
ffi::Error launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* name,
                        Args&&... args) {
  return launch_early_clustered(kernel, grid, block, 1, stream, name, std::forward<Args>(args)...);
}

// How many clusters of `kernel` (launched as launch_clustered would) fit on
// the current device at once. Asked once per device and configuration.
template <class... Params>
ffi::Error co_resident_clusters(void (*kernel)(Params...), dim3 block, size_t smem, unsigned cluster,
                                int* count) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, unsigned, size_t, unsigned>, int> cache;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_error(e, "cudaGetDevice");
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), block.x * block.y, smem, cluster);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) {
    *count = it->second;
    return ffi::Error::Success();
  }
  JRN_RETURN_IF_ERROR(allow_cluster_launch(kernel, smem, cluster));
  ClusterLaunch launch(dim3(cluster), block, smem, nullptr, cluster);
  int n = 0;
  if (cluster > 1) {
    e = cudaOccupancyMaxActiveClusters(&n, kernel, &launch.cfg);
    if (e != cudaSuccess) return cuda_error(e, "cudaOccupancyMaxActiveClusters");
  } else {
    int per_sm = 0, sms = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(block.x * block.y), smem);
    if (e != cudaSuccess) return cuda_error(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return cuda_error(e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    n = per_sm * sms;
  }
  if (n < 1) return ffi::Error::Internal("jax_rmsnorm: a kernel configuration does not fit on this GPU");
  cache.emplace(key, n);
  *count = n;
  return ffi::Error::Success();
}

inline ffi::Error too_many_rows() { return ffi::Error::InvalidArgument("jax_rmsnorm: too many rows"); }

// The launch of rows of `tpr` threads each (threadIdx.x), rows_per_cta of
// them a CTA (threadIdx.y).
inline ffi::Error row_grid(int64_t rows, int tpr, int cta_threads, dim3* grid, dim3* block) {
  const int rpb = rows_per_cta(tpr, cta_threads);
  const int64_t blocks = ceil_div(rows, rpb);
  if (blocks > INT32_MAX) return too_many_rows();
  *grid = dim3(static_cast<unsigned>(blocks));
  *block = dim3(tpr, rpb);
  return ffi::Error::Success();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// gamma and beta (those given) 16-byte aligned, as the kernels' packs of
// parameters need.
inline bool params_aligned16(const FwdArgs& a) {
  return (!a.gamma || aligned16(a.gamma)) && (!a.beta || aligned16(a.beta));
}

}  // namespace jrn::cuda
