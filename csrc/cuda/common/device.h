// The current GPU as the plans see it (host code only: the Python module's
// describe_plan(device="current") reads it too).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "../../plan/plan.h"

namespace jrn::cuda {

// An attribute of the current device, asked once per device (-1 where it
// cannot be read).
template <cudaDeviceAttr A>
inline int device_attribute() {
  static int cache[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return -1;
  if (cache[dev] == 0) {
    int v = 0;
    cache[dev] = cudaDeviceGetAttribute(&v, A, dev) == cudaSuccess && v > 0 ? v : -1;
  }
  return cache[dev];
}

// Whether the current device runs thread block clusters (compute capability
// 9.0 or newer).
inline bool has_clusters() { return device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9; }

// The current device as the plans see it.
inline plan::Device this_device() {
  plan::Device d;
  d.sms = std::max(device_attribute<cudaDevAttrMultiProcessorCount>(), 0);
  d.cc_major = std::max(device_attribute<cudaDevAttrComputeCapabilityMajor>(), 0);
  d.cc_minor = std::max(device_attribute<cudaDevAttrComputeCapabilityMinor>(), 0);
  d.smem_optin = std::max(device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(), 0);
  // Double data rate: two transfers a clock (kHz) of the bus (bits).
  const int64_t khz = device_attribute<cudaDevAttrMemoryClockRate>();
  const int64_t bits = device_attribute<cudaDevAttrGlobalMemoryBusWidth>();
  d.dram_gbps = khz > 0 && bits > 0 ? static_cast<int>(2 * khz * bits / 8 / 1000000) : 0;
  // JAX_RMSNORM_DRAM_GBPS (a positive integer, read once; _ffi.py refuses
  // others at import) stands in for it: the tests run the plans that depend
  // on the memory's bandwidth (stats_ahead) on the GPU at hand.
  static const int dram_gbps = [] {
    const char* v = std::getenv("JAX_RMSNORM_DRAM_GBPS");
    return v ? std::atoi(v) : 0;
  }();
  if (dram_gbps > 0) d.dram_gbps = dram_gbps;
  return d;
}

}  // namespace jrn::cuda
