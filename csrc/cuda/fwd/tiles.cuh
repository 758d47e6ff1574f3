// fwd_tiles (sm_90+): the per-group output with its columnwise copy from one
// read of x. A cluster takes a slab of kTileRows consecutive rows (within one
// tensor and one parameter group), each CTA `width` of its columns, which
// one bulk copy a row brings into shared memory, where they stay: the rows'
// sums cross the cluster through distributed shared memory, and each CTA
// then quantizes its part of the slab twice from the held x, along the rows
// (q: a group of group_size columns takes group_size / VEC lanes, a pack
// each) and down the columns (q_t: a thread a column, its groups of
// group_size rows). y is formed as the rowwise kernels form it, so q and
// q_t code the same float32 values.
#pragma once

#include "../common/block_scale.cuh"
#include "../common/cluster.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

template <NormKind K, class T, class P>
__global__ void __launch_bounds__(kTileThreads, kTileMinCtas) fwd_tiles(FwdArgs a, int width, float inv_h) {
#ifdef JRN_NO_CLUSTERS
  __trap();  // sm_90+ only (bulk copies, clusters): the plans send nothing older here
#else
  constexpr int VEC = 16 / sizeof(T);
  constexpr int S = kTileRows;
  constexpr int kWarps = kTileThreads / 32;
  static_assert(S == 32, "fwd_tiles: a lane of the first warp copies each row");
  using Vec = Pack<T, VEC>;
  extern __shared__ uint4 dyn[];
  T* const tile = reinterpret_cast<T*>(dyn);                        // [S][width]: x
  float* const scale = reinterpret_cast<float*>(tile + S * width);  // [width]: gamma, 1 + gamma or 1
  float* const shift = scale + width;                               // [width]: beta (LayerNorm)
  __shared__ alignas(8) float part[2][S][2];  // this CTA's row sums, by round (LayerNorm takes two)
  __shared__ alignas(16) float mean_of[S], rstd_of[S];
  __shared__ alignas(8) uint64_t landed;

  const int64_t H = a.shape.hidden;
  const int cluster = cluster_ctas();
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / cluster) * S;
  const int col0 = rank * width;                                   // hidden < 2^31
  const int n_cols = min(width, static_cast<int>(H) - col0);      // whole groups, at least one (the plan's cut)
  const int n_packs = n_cols / VEC;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);

  // The slab's columns, a row a lane of the first warp.
  if (threadIdx.x == 0) mbar_init(&landed);
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) mbar_expect(&landed, static_cast<unsigned>(S * n_cols * sizeof(T)));
    __syncwarp();
    bulk_copy(tile + lane * width, static_cast<const T*>(a.x) + (row0 + lane) * H + col0,
              static_cast<unsigned>(n_cols * sizeof(T)), &landed);
  }
  // The parameters of the slab's group, as floats, while x lands.
  const int64_t poff = a.shape.param_offset(row0) + col0;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
  const bool has_beta = beta != nullptr;
  for (int c = static_cast<int>(threadIdx.x); c < n_cols; c += kTileThreads) {
    const float g = gamma ? to_float(gamma[c]) : 1.f;
    scale[c] = gamma && a.zero_centered ? g + 1.f : g;  // (g + 0 would turn a gamma of -0 into +0)
    if (has_beta) shift[c] = to_float(beta[c]);
  }
  mbar_wait(&landed, 0);

  auto read = [&](int r, int p, float (&v)[VEC]) {
    const Vec pk = reinterpret_cast<const Vec*>(tile + r * width)[p];  // one 16-byte load
    unpack(pk, v);
  };
  // One round of the rows' sums: a warp a row at a time, lanes along its
  // packs; add(acc, v, r) takes a pack of row r, finish(acc, r) the thread's
  // sums. The sums of every CTA of the cluster, added in rank order (the
  // same in every CTA), then reach thread r < S as total(sum, r).
  auto round = [&](int which, auto add, auto finish, auto total) {
    for (int r = warp; r < S; r += kWarps) {
      float acc[2] = {0.f, 0.f};
      for (int p = lane; p < n_packs; p += 32) {
        float v[VEC];
        read(r, p, v);
        add(acc, v, r);
      }
      finish(acc, r);
      warp_sum<2>(acc, 32);
      if (lane == 0) part[which][r][0] = acc[0], part[which][r][1] = acc[1];
    }
    cluster_arrive();
    cluster_wait();
    if (threadIdx.x < S) {
      const int r = static_cast<int>(threadIdx.x);
      float sum[2] = {0.f, 0.f};
      for (int q = 0; q < cluster; ++q) {
        const float* remote = cooperative_groups::this_cluster().map_shared_rank(&part[which][r][0], q);
        sum[0] += remote[0];
        sum[1] += remote[1];
      }
      total(sum, r);
    }
    __syncthreads();
  };
  auto no_finish = [](float(&)[2], int) {};
  if constexpr (K == NormKind::kRms) {
    // sum(x^2) and its scaled twin (scaled_sq_of: the row read again where
    // the squares overflowed).
    round(
        0, [](float(&acc)[2], const float(&v)[VEC], int) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[0] += v[j] * v[j];
        },
        [&](float(&acc)[2], int r) {
          acc[1] = scaled_sq_of(acc[0], [&] {
            float sum = 0.f;
            for (int p = lane; p < n_packs; p += 32) {
              float v[VEC];
              read(r, p, v);
              add_scaled_sq(sum, v);
            }
            return sum;
          });
        },
        [&](const float(&sum)[2], int r) {
          rstd_of[r] = rms_rstd(sum[0], sum[1], a.eps, [&](float t) { return t * inv_h; });
          if (rank == 0) a.rstd[row0 + r] = rstd_of[r];
        });
  } else {
    // The mean, then the squares of x less it (x is at hand: exact centring).
    round(
        0, [](float(&acc)[2], const float(&v)[VEC], int) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[0] += v[j];
        },
        no_finish, [&](const float(&sum)[2], int r) { mean_of[r] = sum[0] * inv_h; });
    round(
        1, [&](float(&acc)[2], const float(&v)[VEC], int r) {
          const float mean = mean_of[r];
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[0] += (v[j] - mean) * (v[j] - mean);
        },
        no_finish, [&](const float(&sum)[2], int r) {
          rstd_of[r] = rsqrtf(sum[0] * inv_h + a.eps);
          if (rank == 0) a.mean[row0 + r] = mean_of[r], a.rstd[row0 + r] = rstd_of[r];
        });
  }
  cluster_arrive();  // this CTA's remote reads are done (waited for before it exits)

  // y of the pack of row r from column c (a multiple of VEC), its scale and
  // shift read as float4s.
  auto y_pack = [&](int r, int c, float (&v)[VEC]) {
    read(r, c / VEC, v);
    const float mean = K == NormKind::kLayer ? mean_of[r] : 0.f, rstd = rstd_of[r];
#pragma unroll
    for (int k = 0; k < VEC; k += 4) {
      const float4 s4 = *reinterpret_cast<const float4*>(scale + c + k);
      const float sc[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) v[k + j] = (K == NormKind::kLayer ? v[k + j] - mean : v[k + j]) * rstd * sc[j];
      if (K == NormKind::kLayer && has_beta) {
        const float4 b4 = *reinterpret_cast<const float4*>(shift + c + k);
        const float b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) v[k + j] += b[j];
      }
    }
  };
  const int G = static_cast<int>(a.group_size);  // 16 or 32 (the plan)
  const int g_shift = __ffs(G) - 1;
  const GroupGlobal global = group_global(a, row0);  // the slab lies in one tensor

  // Along the rows: item i of the slab's S * n_packs packs is row i / n_packs,
  // pack i % n_packs; a group's G / VEC lanes are consecutive items of one
  // row (n_packs and the CTA a multiple of them). Every lane runs every step
  // (the shuffles), past the items too.
  {
    void* const scales = group_scales(a);
    const int lanes = G / VEC;  // 2 or 4
    const int items = S * n_packs;
    int r = static_cast<int>(threadIdx.x) / n_packs, p = static_cast<int>(threadIdx.x) % n_packs;
    const int r_step = kTileThreads / n_packs, p_step = kTileThreads % n_packs;
    const bool leader = (lane & (lanes - 1)) == 0;
    for (int i = static_cast<int>(threadIdx.x); i - static_cast<int>(threadIdx.x) < items; i += kTileThreads) {
      const bool valid = i < items;
      float y[VEC];
      y_pack(valid ? r : 0, p * VEC, y);
      float gm = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) gm = max_abs(gm, y[j]);
      gm = abs_max(gm, __shfl_xor_sync(0xffffffffu, gm, 1));
      if (lanes == 4) gm = abs_max(gm, __shfl_xor_sync(0xffffffffu, gm, 2));
      const int64_t e = (row0 + r) * H + col0 + p * VEC;  // q's element
      const GroupCode code = group_scale(a, scales, e >> g_shift, gm, global, valid && leader);
      if (valid) store_group<VEC>(a, e, y, global, code);
      r += r_step, p += p_step;
      if (p >= n_packs) p -= n_packs, ++r;
    }
  }

  // Down the columns: a thread a column, its groups of G rows. q_t is
  // (tensors, hidden, rows per tensor), its scales (tensors, hidden, rows per
  // tensor / G): element e's scale is e / G.
  const int64_t R = a.rows_per_tensor(), t = a.tensor_of(row0);
  const int64_t first = (t * H + col0) * R + (row0 - t * R);  // q_t's element of column col0, row row0
  auto column = [&]<int N>(std::integral_constant<int, N>, int c, int r0) {
    const float sc = scale[c], sh = K == NormKind::kLayer && has_beta ? shift[c] : 0.f;
    float y[N];
#pragma unroll
    for (int j = 0; j < N; j += 4) {
      const float4 rs4 = *reinterpret_cast<const float4*>(rstd_of + r0 + j);
      const float4 ms4 = K == NormKind::kLayer ? *reinterpret_cast<const float4*>(mean_of + r0 + j) : float4{};
      const float rs[4] = {rs4.x, rs4.y, rs4.z, rs4.w}, ms[4] = {ms4.x, ms4.y, ms4.z, ms4.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float v = to_float(tile[(r0 + j + k) * width + c]);
        y[j + k] = (K == NormKind::kLayer ? v - ms[k] : v) * rs[k] * sc;  // as y_pack
        if (K == NormKind::kLayer && has_beta) y[j + k] += sh;
      }
    }
    float gm = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j) gm = max_abs(gm, y[j]);
    const int64_t e = first + c * R + r0;
    const GroupCode code = group_scale(a, a.qt_scales, e >> g_shift, gm, global);
    store_codes<N>(a, a.qt, e, y, global, code);
  };
  for (int c = static_cast<int>(threadIdx.x); c < n_cols; c += kTileThreads) {
    if (G == 32) {
      column(std::integral_constant<int, 32>{}, c, 0);
    } else {
      column(std::integral_constant<int, 16>{}, c, 0);
      column(std::integral_constant<int, 16>{}, c, 16);
    }
  }
  cluster_wait();
#endif
}

}  // namespace
}  // namespace jrn::cuda
