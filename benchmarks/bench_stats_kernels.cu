// Standalone timing of the statistics kernels of the hidden-sharded layout
// (csrc/cuda/norm_stats.cu: x statistics, gradient statistics), bf16, 32768
// rows, hidden 1024-16384, next to a device-to-device copy and a minimal
// sum-of-squares kernel (the floor: fixed threads per row, two packs a thread
// loaded together, warp sums, one barrier). Launched back to back, two input
// sets alternating, median of 9 x 20 launches, microseconds. Build against a
// tree's csrc (the jaxlib FFI headers are only needed to compile):
//
//   INC=$(python3 -c "import jax.ffi as f; print(f.include_dir())")
//   nvcc -std=c++17 -arch=sm_90 -O3 -w --expt-relaxed-constexpr -I$INC -Icsrc -Icsrc/cuda \
//        benchmarks/bench_stats_kernels.cu -o /tmp/bench_stats && /tmp/bench_stats
//
// Two builds (-I of two trees) in one run give an A/B of the kernels alone.
#include "norm_stats.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace jrn;
using namespace jrn::cuda;

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                   \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

// Sum of squares of each row: TPR threads per row (one row per block), two
// 16-byte packs a thread per step, both loaded before either is summed.
template <int TPR>
__global__ void __launch_bounds__(TPR) floor_sumsq(const __nv_bfloat16* __restrict__ x, float* __restrict__ out,
                                                   int64_t H) {
  __shared__ float warp_sums[TPR / 32];
  const __nv_bfloat16* xr = x + static_cast<int64_t>(blockIdx.x) * H;
  const int64_t nvec = H / 8;
  float acc = 0.f;
  for (int64_t p = threadIdx.x; p < nvec; p += 2 * TPR) {
    uint4 u[2] = {};
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (p + k * TPR < nvec) u[k] = __ldg(reinterpret_cast<const uint4*>(xr) + p + k * TPR);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u[k]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        acc = fmaf(f.x, f.x, fmaf(f.y, f.y, acc));
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < TPR / 32; ++w) s += warp_sums[w];
    out[blockIdx.x] = s;
  }
}

template <class F>
static void time_it(const char* name, int64_t rows, int64_t H, F launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 10; ++i) launch(i % 2);
  std::vector<float> ts;
  for (int r = 0; r < 9; ++r) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) launch(i % 2);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000.f / 20);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  std::printf("| %ld x %ld | %-18s | %7.1f |\n", static_cast<long>(rows), static_cast<long>(H), name, ts[4]);
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
}

int main() {
  const int64_t rows = 32768;
  std::printf("| shape | kernel | us |\n|---|---|---|\n");
  for (int64_t H : {1024L, 2048L, 4096L, 8192L, 16384L}) {
    const size_t n = rows * H;
    std::vector<__nv_bfloat16> host(n + 8);
    for (size_t i = 0; i < host.size(); ++i)
      host[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1000) / 500.f - 1.f);
    void *x[2], *dy[2], *gamma, *dst;
    for (int k = 0; k < 2; ++k) {
      CK(cudaMalloc(&x[k], n * 2));
      CK(cudaMalloc(&dy[k], n * 2));
      CK(cudaMemcpy(x[k], host.data(), n * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dy[k], host.data() + 7, n * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&gamma, H * 2));
    CK(cudaMemcpy(gamma, host.data() + 3, H * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dst, n * 2));
    float *rstd, *mean, *out;
    CK(cudaMalloc(&rstd, rows * 4));
    CK(cudaMalloc(&mean, rows * 4));
    CK(cudaMalloc(&out, rows * 8));
    CK(cudaMemset(rstd, 0, rows * 4));
    CK(cudaMemset(mean, 0, rows * 4));
    auto args = [&](int k) {
      StatsArgs s;
      s.shape.rows = rows;
      s.shape.hidden = H;
      s.x = x[k];
      s.dy = dy[k];
      s.rstd = rstd;
      s.mean = mean;
      s.gamma = gamma;
      s.out = out;
      return s;
    };
    auto ok = [](ffi::Error e) {
      if (e.failure()) {
        std::printf("launch failed\n");
        std::exit(1);
      }
    };
    using BF = __nv_bfloat16;
    time_it("copy", rows, H, [&](int k) { CK(cudaMemcpyAsync(dst, x[k], n * 2, cudaMemcpyDeviceToDevice)); });
    time_it("x_stats rms", rows, H, [&](int k) { ok(launch_stats<NormKind::kRms, BF>(0, args(k))); });
    time_it("x_stats layer", rows, H, [&](int k) { ok(launch_stats<NormKind::kLayer, BF>(0, args(k))); });
    time_it("grad_stats rms", rows, H, [&](int k) { ok(launch_grad_stats<NormKind::kRms, BF, BF>(0, args(k))); });
    time_it("grad_stats layer", rows, H, [&](int k) { ok(launch_grad_stats<NormKind::kLayer, BF, BF>(0, args(k))); });
    const int tpr = static_cast<int>(std::min<int64_t>(256, H / 16));
    time_it("floor sum(x^2)", rows, H, [&](int k) {
      const auto* xp = static_cast<const BF*>(x[k]);
      if (tpr == 256) floor_sumsq<256><<<rows, 256>>>(xp, out, H);
      else if (tpr == 128) floor_sumsq<128><<<rows, 128>>>(xp, out, H);
      else floor_sumsq<64><<<rows, 64>>>(xp, out, H);
    });
    for (int k = 0; k < 2; ++k) {
      CK(cudaFree(x[k]));
      CK(cudaFree(dy[k]));
    }
    CK(cudaFree(gamma));
    CK(cudaFree(dst));
    CK(cudaFree(rstd));
    CK(cudaFree(mean));
    CK(cudaFree(out));
  }
  return 0;
}
