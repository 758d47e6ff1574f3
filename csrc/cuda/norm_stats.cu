// Per-row statistics of a slice of the hidden dim, for normalization with the
// hidden dim split across devices (see StatsArgs):
//   x_stats:    RMSNorm sum(x^2); LayerNorm (mean, sum((x - mean)^2)), the
//               sums taken around a shift near the row's mean (layer_shift).
//   grad_stats: (sum(gdy * xhat), sum(gdy)), gdy = dy * scale.
// A block is (threads per row, rows per block), as row_sum expects.
#include "device_utils.cuh"
#include "launch.h"

namespace jrn::cuda {
namespace {

constexpr int kThreads = 256;
// Threads per row: a thread per kRowPacks packs of the row, up to kThreads.
// Each thread loads one pack (of x, and of dy) at a time. These kernels
// only read, so what hides the loads' latency is many resident threads: with
// one pack at a time (24-40 registers) an H100 holds 1536-2048 threads per
// SM. Measured on an H100 at 32768 rows of bf16 (hidden 4096 / 8192), x
// statistics took 98.4 / 188.2 us and gradient statistics 185.0 / 358.3 us
// this way, against 112.1 / 207.2 and 206.1 / 403.9 us with a quarter of the
// threads per row each loading four packs (two of x and two of dy at a time
// for gradients), and 96.5 / 183.1 and 182.9 / 354.8 us for XLA's own fusions
// of the same sums.
//
// The sums meet in the row's first thread only (row_sum_lead, one barrier),
// and RMSNorm's x statistics sum one value, not two. On an H200 (32768 rows
// of bf16, standalone back-to-back launches, old and new code in one run)
// that took RMSNorm x statistics at hidden 2048 / 4096 / 8192 from 39.1 /
// 79.4 / 132.2 to 36.9 / 69.1 / 127.5 us, LayerNorm's from 45.6 / 93.2 /
// 142.1 to 44.8 / 84.9 / 138.1, and gradient statistics at 4096 from 126.6
// to 123.8 (RMSNorm) and 142.5 to 134.9 us (LayerNorm). Loading a thread's
// two packs together was slower there (74.8 us for x at 4096; 148-198 us for
// gradients, whose registers rose from 32 to 45-80).
constexpr int kRowPacks = 2;

template <NormKind K, class T, int VEC>
__global__ void __launch_bounds__(kThreads) x_stats(StatsArgs a) {
  constexpr bool kLayer = K == NormKind::kLayer;
  constexpr int M = kLayer ? 2 : 1;  // LayerNorm: sum(d), sum(d^2); RMSNorm: sum(x^2)
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  const T* x = static_cast<const T*>(a.x) + row * H;
  const float shift = kLayer && valid ? layer_shift([&](int64_t c) { return to_float(x[c]); }, H) : 0.f;
  float acc[M] = {};
  for (int64_t p = threadIdx.x; valid && p < nvec; p += blockDim.x) {
    float v[VEC];
    load_pack<VEC>(x + p * VEC, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[j] - shift;
      acc[M - 1] += d * d;
      if constexpr (kLayer) acc[0] += d;
    }
  }
  row_sum_lead<M>(acc, smem);
  if (!valid || threadIdx.x != 0) return;
  if constexpr (kLayer) {
    const float m1 = acc[0] / static_cast<float>(H);
    a.out[2 * row] = shift + m1;
    a.out[2 * row + 1] = fmaxf(acc[1] - acc[0] * m1, 0.f);
  } else {
    a.out[row] = acc[0];
  }
}

template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kThreads) grad_stats(StatsArgs a) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  const T* x = static_cast<const T*>(a.x) + row * H;
  const T* dy = static_cast<const T*>(a.dy) + row * H;
  const P* gamma = a.gamma && valid ? static_cast<const P*>(a.gamma) + a.shape.param_offset(row)
                                    : nullptr;
  const float rstd = valid ? a.rstd[row] : 0.f;
  const float mean = K == NormKind::kLayer && valid ? a.mean[row] : 0.f;
  float acc[2] = {0.f, 0.f};
  for (int64_t p = threadIdx.x; valid && p < nvec; p += blockDim.x) {
    float xv[VEC], d[VEC], s[VEC];
    load_pack<VEC>(x + p * VEC, xv);
    load_pack<VEC>(dy + p * VEC, d);
    load_scale<VEC>(gamma, p * VEC, a.zero_centered, s);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float g = d[j] * s[j];
      acc[0] += g * (xv[j] - mean) * rstd;
      acc[1] += g;
    }
  }
  row_sum_lead<2>(acc, smem);
  if (valid && threadIdx.x == 0) {
    a.out[2 * row] = acc[0];
    a.out[2 * row + 1] = acc[1];
  }
}

// Threads per row scaled with the row's packs; several rows per block when narrow.
inline ffi::Error stats_grid(const StatsArgs& a, int64_t nvec, dim3* grid, dim3* block) {
  const int tpr = std::min(kThreads, pow2_ceil((nvec + kRowPacks - 1) / kRowPacks));
  const int rpb = kThreads / tpr;
  const int64_t blocks = (a.shape.rows + rpb - 1) / rpb;
  if (blocks > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: too many rows");
  *grid = dim3(static_cast<unsigned>(blocks));
  *block = dim3(tpr, rpb);
  return ffi::Error::Success();
}

}  // namespace

template <NormKind K, class T>
ffi::Error launch_stats(cudaStream_t stream, const StatsArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = a.shape.hidden % kVec == 0 && aligned16(a.x);
  dim3 grid, block;
  JRN_RETURN_IF_ERROR(stats_grid(a, a.shape.hidden / (vec ? kVec : 1), &grid, &block));
  if (vec) {
    x_stats<K, T, kVec><<<grid, block, 0, stream>>>(a);
  } else {
    x_stats<K, T, 1><<<grid, block, 0, stream>>>(a);
  }
  return check_launch("x_stats");
}

template <NormKind K, class T, class P>
ffi::Error launch_grad_stats(cudaStream_t stream, const StatsArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = a.shape.hidden % kVec == 0 && aligned16(a.x) && aligned16(a.dy) &&
                   (!a.gamma || aligned16(a.gamma));
  dim3 grid, block;
  JRN_RETURN_IF_ERROR(stats_grid(a, a.shape.hidden / (vec ? kVec : 1), &grid, &block));
  if (vec) {
    grad_stats<K, T, P, kVec><<<grid, block, 0, stream>>>(a);
  } else {
    grad_stats<K, T, P, 1><<<grid, block, 0, stream>>>(a);
  }
  return check_launch("grad_stats");
}

#define JRN_INSTANTIATE_GRAD_STATS(K, T, P) \
  template ffi::Error launch_grad_stats<K, T, P>(cudaStream_t, const StatsArgs&);
JRN_FOR_EACH_INSTANCE(JRN_INSTANTIATE_GRAD_STATS)
#define JRN_INSTANTIATE_STATS(K)                                                                \
  template ffi::Error launch_stats<K, float>(cudaStream_t, const StatsArgs&);                   \
  template ffi::Error launch_stats<K, __nv_bfloat16>(cudaStream_t, const StatsArgs&);           \
  template ffi::Error launch_stats<K, __half>(cudaStream_t, const StatsArgs&);
JRN_INSTANTIATE_STATS(NormKind::kRms)
JRN_INSTANTIATE_STATS(NormKind::kLayer)

}  // namespace jrn::cuda
