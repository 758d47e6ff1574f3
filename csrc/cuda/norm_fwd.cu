// Forward kernels: y = (x - mean) * rstd * scale + beta, saving mean/rstd.
//
// Two shapes of kernel:
//  * fwd_regs: the row is read once into registers (up to 4 packs of 16 bytes
//    per thread): several rows per CTA, one CTA per row, or, for wide rows,
//    one thread block cluster per row (each CTA holds a slice; the row sums
//    are combined through distributed shared memory).
//  * fwd_stream: one CTA per row, the row streamed twice (the second read is
//    served mostly by L2); used for rows too wide or unaligned for the above.
//
// With `given_stats` (the hidden dim split across devices) both take mean and
// rstd from their inputs instead of the row and write only y.
#include "device_utils.cuh"
#include "launch.h"

namespace jrn::cuda {
namespace {

constexpr int kRegItems = 4;        // packs per thread in fwd_regs
constexpr int kMaxRowThreads = 1024;
constexpr int kStreamThreads = 512;
constexpr int kBlockThreads = 256;  // target CTA size for narrow rows
constexpr int kMaxCluster = 16;
constexpr int kClusterCtaThreads = 512;

template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads) fwd_regs(FwdArgs a, int cluster) {
  __shared__ float smem[kRowSumSmem];
  __shared__ float xchg[2][1];
  const int64_t H = a.shape.hidden;
  // With clusters, CTA `rank` of the cluster holds vectors [rank * slice, (rank + 1) * slice).
  const int rank = cluster > 1 ? static_cast<int>(blockIdx.x % cluster) : 0;
  const int64_t first = static_cast<int64_t>(rank) * blockDim.x * kRegItems;
  const int64_t row = static_cast<int64_t>(blockIdx.x / cluster) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  const T* x = static_cast<const T*>(a.x) + row * H;
  auto column = [&](int i) { return (first + static_cast<int64_t>(i) * blockDim.x + threadIdx.x) * VEC; };

  float v[kRegItems][VEC];
  float sum[1] = {0.f};
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t col = column(i);
    if (valid && col < H) {
      load_pack<VEC>(x + col, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum[0] += v[i][j];
  }
  float mean = 0.f;
  if constexpr (K == NormKind::kLayer) {
    row_sum<1>(sum, smem);
    if (cluster > 1) cluster_sum<1>(sum, xchg, 0);
    mean = sum[0] / static_cast<float>(H);
    if (a.given_stats && valid) mean = a.mean[row];
  }
  float ss[1] = {0.f};
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t col = column(i);
    if (col < H) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[i][j] -= mean;
        ss[0] += v[i][j] * v[i][j];
      }
    }
  }
  row_sum<1>(ss, smem);
  if (cluster > 1) {
    cluster_sum<1>(ss, xchg, 1);
    cluster_done();
  }
  const float rstd = a.given_stats ? (valid ? a.rstd[row] : 0.f) : rsqrtf(ss[0] / static_cast<float>(H) + a.eps);
  if (!valid) return;

  const int64_t poff = (row / a.shape.rows_per_group()) * H;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
  T* y = static_cast<T*>(a.y) + row * H;
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    const int64_t col = column(i);
    if (col < H) {
      float s[VEC], out[VEC];
      load_scale<VEC>(gamma, col, a.zero_centered, s);
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = v[i][j] * rstd * s[j];
      if (beta) {
        float b[VEC];
        load_pack<VEC>(beta + col, b);
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] += b[j];
      }
      store_pack<VEC>(y + col, out);
    }
  }
  if (threadIdx.x == 0 && rank == 0 && !a.given_stats) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}

template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kStreamThreads) fwd_stream(FwdArgs a) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * H;

  // LayerNorm sums are taken around a shift (the row's first element) so that
  // var = E[(x-k)^2] - E[x-k]^2 does not cancel catastrophically.
  const float shift = K == NormKind::kLayer ? to_float(x[0]) : 0.f;
  float acc[2] = {0.f, 0.f};
  for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
    float v[VEC];
    load_pack<VEC>(x + p * VEC, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[j] - shift;
      acc[0] += d;
      acc[1] += d * d;
    }
  }
  row_sum<2>(acc, smem);
  const float m1 = acc[0] / static_cast<float>(H);
  const float mean = K == NormKind::kLayer ? shift + m1 : 0.f;
  const float var = K == NormKind::kLayer ? fmaxf(acc[1] / static_cast<float>(H) - m1 * m1, 0.f)
                                          : acc[1] / static_cast<float>(H);
  const float rstd = a.given_stats ? a.rstd[row] : rsqrtf(var + a.eps);
  const float mean_used = a.given_stats && K == NormKind::kLayer ? a.mean[row] : mean;

  const int64_t poff = (row / a.shape.rows_per_group()) * H;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
  T* y = static_cast<T*>(a.y) + row * H;
  for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
    float v[VEC], s[VEC];
    load_pack<VEC>(x + p * VEC, v);
    load_scale<VEC>(gamma, p * VEC, a.zero_centered, s);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = (v[j] - mean_used) * rstd * s[j];
    if (beta) {
      float b[VEC];
      load_pack<VEC>(beta + p * VEC, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] += b[j];
    }
    store_pack<VEC>(y + p * VEC, v);
  }
  if (threadIdx.x == 0 && !a.given_stats) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}

template <NormKind K, class T, class P, int VEC>
ffi::Error launch_fwd_vec(cudaStream_t stream, const FwdArgs& a) {
  const int64_t nvec = a.shape.hidden / VEC;
  constexpr int64_t kCtaVecs = static_cast<int64_t>(kMaxRowThreads) * kRegItems;
  if (nvec <= kCtaVecs) {
    const int tpr = pow2_ceil((nvec + kRegItems - 1) / kRegItems);
    const int rpb = tpr >= kBlockThreads ? 1 : kBlockThreads / tpr;
    const int64_t blocks = (a.shape.rows + rpb - 1) / rpb;
    if (blocks > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: too many rows");
    fwd_regs<K, T, P, VEC><<<static_cast<unsigned>(blocks), dim3(tpr, rpb), 0, stream>>>(a, 1);
    return check_launch("fwd_regs");
  }
  // One cluster per row, of CTAs of at most kClusterCtaThreads threads (smaller
  // CTAs than the single-CTA path: more of them resident per SM).
  constexpr int64_t kClusterCtaVecs = static_cast<int64_t>(kClusterCtaThreads) * kRegItems;
  if (VEC > 1 && nvec <= kClusterCtaVecs * kMaxCluster && has_clusters()) {
    const int cluster = pow2_ceil((nvec + kClusterCtaVecs - 1) / kClusterCtaVecs);
    const int tpr = pow2_ceil((nvec + cluster * kRegItems - 1) / (cluster * kRegItems));
    const int64_t blocks = a.shape.rows * cluster;
    if (blocks > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: too many rows");
    return launch_clustered(fwd_regs<K, T, P, VEC>, dim3(static_cast<unsigned>(blocks)), dim3(tpr), 0,
                            stream, cluster, "fwd_regs (clusters)", a, cluster);
  }
  if (a.shape.rows > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: too many rows");
  fwd_stream<K, T, P, VEC><<<static_cast<unsigned>(a.shape.rows), kStreamThreads, 0, stream>>>(a);
  return check_launch("fwd_stream");
}

}  // namespace

template <NormKind K, class T, class P>
ffi::Error launch_fwd(cudaStream_t stream, const FwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec_ok = a.shape.hidden % kVec == 0 && aligned16(a.x) && aligned16(a.y) &&
                      (!a.gamma || aligned16(a.gamma)) && (!a.beta || aligned16(a.beta));
  return vec_ok ? launch_fwd_vec<K, T, P, kVec>(stream, a) : launch_fwd_vec<K, T, P, 1>(stream, a);
}

#define JRN_INSTANTIATE_FWD(K, T, P) \
  template ffi::Error launch_fwd<K, T, P>(cudaStream_t, const FwdArgs&);
JRN_FOR_EACH_INSTANCE(JRN_INSTANTIATE_FWD)

}  // namespace jrn::cuda
