// fwd_tiles (sm_90+): the per-group output with its columnwise copy from one
// read of x. A cluster takes a slab of kTileRows consecutive rows (within one
// tensor and one parameter group), each CTA `width` of its columns, which
// one bulk copy a row brings into shared memory, where they stay: the rows'
// sums cross the cluster through distributed shared memory, and each CTA
// then quantizes its part of the slab twice from the held x, along the rows
// (q: a warp a run of 32 packs, each lane a pack, its scale and shift held
// in registers; a group takes group_size / VEC lanes) and down the columns
// (q_t: a pair of lanes two columns, each lane half the rows, so that the
// pair's stores fill whole 32-byte sectors; the block formats' scales go by
// rows to a workspace that the launcher transposes). Both passes form y with
// norm_value, so q and q_t code the same float32 values. Each CTA pushes its
// rows' partial sums into every other CTA's shared memory (push_slot), once
// (LayerNorm's around a shift that every CTA of the cluster finds alike): no
// cluster barrier between the sums and the passes, no remote loads.
//
// The tile's rows have a fixed pitch of kTileCols columns (a CTA's columns
// past that, in the cuts of 2 * kTileCols, in a second block of rows): the
// loads of a row's successive rows take immediate offsets.
#pragma once

#include "../common/block_scale.cuh"
#include "../common/cluster.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

// y of one element as scale_shift_packs forms it: (x - mean) * rstd *
// scale, plus shift where there is one (adding a shift of 0 would turn a -0
// into +0). RMSNorm passes mean 0 (x - 0 is x, exactly; the compiler drops it).
__device__ __forceinline__ float norm_value(float x, float mean, float rstd, float scale, float shift,
                                            bool has_shift) {
  const float y = (x - mean) * rstd * scale;
  return has_shift ? y + shift : y;
}

template <NormKind K, class T, class P>
__global__ void __launch_bounds__(kTileThreads, kTileMinCtas) fwd_tiles(FwdArgs a, int width, float inv_h) {
#ifdef JRN_NO_CLUSTERS
  __trap();  // sm_90+ only (bulk copies, clusters): the plans send nothing older here
#else
  constexpr int VEC = 16 / sizeof(T);
  constexpr int S = kTileRows, W = kTileCols;
  constexpr int kWarps = kTileThreads / 32;
  static_assert(S == 32 && S % kWarps == 0, "fwd_tiles: a lane of the first warp copies each row");
  static_assert(VEC == 8, "fwd_tiles: 16-bit x (a pack of h is four words)");
  // A CTA's partials: two floats a row (RMSNorm: the sum of squares and its
  // scaled twin; LayerNorm: sum(d) and sum(d^2), d = x - the row's shift).
  constexpr int kSlot = 2 * S;
  static_assert((kMaxCluster - 1) * kSlot / 4 <= kTileThreads, "fwd_tiles: a thread pushes 16 bytes of a slot");
  using Vec = Pack<T, VEC>;
  extern __shared__ uint4 dyn[];
  const int blocks = (width + W - 1) / W;  // blocks of S rows of W columns
  const int cluster = cluster_ctas();
  constexpr int kParams = K == NormKind::kLayer ? 2 : 1;  // gamma (and beta)
  T* const tile = reinterpret_cast<T*>(dyn);                          // [blocks][S][W]: x
  P* const params = reinterpret_cast<P*>(tile + blocks * S * W);      // [kParams][width]: as given
  float* const slots = reinterpret_cast<float*>(params + kParams * width);  // [cluster][kSlot]: row sums
  __shared__ alignas(16) float mean_of[S], rstd_of[S];
  __shared__ float shift_of[S];                     // LayerNorm
  __shared__ alignas(8) uint64_t landed[2], pushed;  // x's rows, by half; the other CTAs' sums
  // x of row r, column c (c % W + W <= the pitch: a pack or a column pair never straddles blocks).
  auto at = [&](int r, int c) { return tile + (c / W) * (S * W) + r * W + c % W; };

  const int64_t H = a.shape.hidden;
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / cluster) * S;
  const int col0 = rank * width;                                   // hidden < 2^31
  const int n_cols = min(width, static_cast<int>(H) - col0);      // whole groups, at least one (the plan's cut)
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);

  // The slab's columns, a row a lane of the first warp (a copy a block),
  // counted by half of the rows: the first half's sums start while the
  // second lands. The parameters of the slab's group come with the second.
  const int64_t poff = a.shape.param_offset(row0) + col0;
  const bool has_gamma = a.gamma != nullptr, has_beta = K == NormKind::kLayer && a.beta != nullptr;
  const unsigned param_bytes = static_cast<unsigned>((has_gamma + has_beta) * n_cols * sizeof(P));
  if (threadIdx.x == 0) {
    mbar_init(&landed[0]);
    mbar_init(&landed[1]);
    if (cluster > 1) arm_pushed<kSlot>(&pushed, cluster);
  }
  __syncthreads();
  if (cluster > 1) cluster_arrive_relaxed();  // (waited for before the first push)
  if (warp == 0) {
    const int half = lane / (S / 2);
    if (lane % (S / 2) == 0) mbar_expect(&landed[half], static_cast<unsigned>(S / 2 * n_cols * sizeof(T)) + (half ? param_bytes : 0u));
    __syncwarp();
    const T* src = static_cast<const T*>(a.x) + (row0 + lane) * H + col0;
    for (int c = 0; c < n_cols; c += W)
      bulk_copy(at(lane, c), src + c, static_cast<unsigned>(min(W, n_cols - c) * sizeof(T)), &landed[half]);
    if (lane == S / 2 && has_gamma)
      bulk_copy(params, static_cast<const P*>(a.gamma) + poff, n_cols * sizeof(P), &landed[1]);
    if (lane == S / 2 + 1 && has_beta)
      bulk_copy(params + width, static_cast<const P*>(a.beta) + poff, n_cols * sizeof(P), &landed[1]);
    if (a.residual)
      bulk_prefetch_l2(static_cast<const T*>(a.residual) + (row0 + lane) * H + col0,
                       static_cast<unsigned>(n_cols * sizeof(T)));
  }
  // LayerNorm's shift of each row, the same in every CTA of the cluster: the
  // median of the row's first, middle and last elements (of h, with a
  // residual), loaded by lanes 3i, 3i + 1, 3i + 2 of the warp that takes the
  // row in the sums (its i-th); the loads land while x's copies do.
  if constexpr (K == NormKind::kLayer) {
    static_assert(3 * (S / kWarps) <= 32, "fwd_tiles: a lane loads one element of a row's shift");
    float e = 0.f;
    if (lane < 3 * (S / kWarps)) {
      const int64_t at_e = (row0 + warp + lane / 3 * kWarps) * H + (lane % 3 == 0 ? 0 : lane % 3 == 1 ? H / 2 : H - 1);
      e = to_float(static_cast<const T*>(a.x)[at_e]);
      if (a.residual) e = to_float(from_float<T>(e + to_float(static_cast<const T*>(a.residual)[at_e])));
    }
#pragma unroll
    for (int i = 0; i < S / kWarps; ++i) {
      const float m = median3(__shfl_sync(0xffffffffu, e, 3 * i), __shfl_sync(0xffffffffu, e, 3 * i + 1),
                              __shfl_sync(0xffffffffu, e, 3 * i + 2));
      if (lane == 0) shift_of[warp + i * kWarps] = m;
    }
    __syncwarp();
  }
  // The effective scale (gamma, 1 + gamma or 1) and shift (beta or 0) of N
  // columns from c (aligned to N), from the staged parameters.
  auto scale_shift_of = [&](int c, auto& sc, auto& sh) {
    constexpr int N = sizeof(sc) / sizeof(float);
    using PN = Pack<P, N>;
    effective_scale<N>(has_gamma, a.zero_centered, [&](float(&g)[N]) { unpack(*reinterpret_cast<const PN*>(params + c), g); }, sc);
    if (has_beta) unpack(*reinterpret_cast<const PN*>(params + width + c), sh);
  };
  // The first touch of row r (a warp walks r = warp + k * kWarps): the
  // second half's rows wait for their copies.
  static_assert(S / 2 % kWarps == 0, "fwd_tiles: a warp's rows split evenly between the halves");
  auto second_half = [&](int r) {
    if (r - warp == S / 2) mbar_wait(&landed[1], 0);
  };
  mbar_wait(&landed[0], 0);

  // Row r's packs that this lane takes (lanes along the row), each as floats.
  auto for_packs = [&](int r, auto&& f) {
    for (int c0 = 0; c0 < n_cols; c0 += W) {
      const T* row = at(r, c0);
      const int n = min(W, n_cols - c0);
      for (int c = lane * VEC; c < n; c += 32 * VEC) {
        float v[VEC];
        unpack<true>(*reinterpret_cast<const Vec*>(row + c), v);
        f(v);
      }
    }
  };
  // The sums' pass over row r: for_packs, or with a residual the packs of
  // h = x + residual, rounded to T, as they are formed; each is stored to
  // a.h and in place of x in the tile, so that everything after reads h. A
  // lane's residual loads of a block of the row are in flight together
  // (their rows were prefetched into L2 with x's copies).
  auto first_pass = [&](int r, auto&& f) {
    if (!a.residual) {
      for_packs(r, f);
      return;
    }
    constexpr int kPacks = W / (32 * VEC);
    const T* res = static_cast<const T*>(a.residual) + (row0 + r) * H + col0;
    T* h = static_cast<T*>(a.h) + (row0 + r) * H + col0;
    for (int c0 = 0; c0 < n_cols; c0 += W) {
      const int n = min(W, n_cols - c0);
      Vec rv[kPacks];
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int c = c0 + lane * VEC + k * 32 * VEC;
        if (c - c0 < n) load_raw(res + c, rv[k]);
      }
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int c = c0 + lane * VEC + k * 32 * VEC;
        if (c - c0 >= n) continue;
        float v[VEC], w[VEC];
        unpack<true>(*reinterpret_cast<const Vec*>(at(r, c)), v);
        unpack<true>(rv[k], w);
        uint32_t words[VEC / 2];
#pragma unroll
        for (int j = 0; j < VEC / 2; ++j) {
          words[j] = pack2<T>(v[2 * j] + w[2 * j], v[2 * j + 1] + w[2 * j + 1]);
          widen2<T>(words[j], v[2 * j], v[2 * j + 1]);  // h as stored
        }
        *reinterpret_cast<uint4*>(at(r, c)) = make_uint4(words[0], words[1], words[2], words[3]);
        store_words(h + c, words);
        f(v);
      }
    }
  };
  // The rows' sums: a warp a row at a time; add(acc, v, r) takes a pack of
  // row r, finish(acc, r) the thread's sums, which go to this CTA's slot and
  // are pushed to the other CTAs' (push_slot). The sums of every CTA, added
  // in rank order (the same in every CTA), then reach thread r < S as
  // total(sum, r).
  auto sums = [&](auto add, auto finish, auto total) {
    for (int r = warp; r < S; r += kWarps) {
      second_half(r);
      float acc[2] = {0.f, 0.f};
      first_pass(r, [&](const float(&v)[VEC]) { add(acc, v, r); });
      finish(acc, r);
      warp_sum<2>(acc, 32);
      if (lane == 0) *reinterpret_cast<float2*>(slots + rank * kSlot + 2 * r) = make_float2(acc[0], acc[1]);
    }
    __syncthreads();
    if (cluster > 1) {
      cluster_wait();  // every CTA's mbarrier is armed
      push_slot<kSlot>(slots + rank * kSlot, &pushed, cluster, rank);
    }
    if (threadIdx.x < S) {
      const int r = static_cast<int>(threadIdx.x);
      if (cluster > 1) mbar_wait<true>(&pushed, 0);
      float sum[2] = {0.f, 0.f};
      for (int q = 0; q < cluster; ++q) {
        const float2 part = *reinterpret_cast<const float2*>(slots + q * kSlot + 2 * r);
        sum[0] += part.x;
        sum[1] += part.y;
      }
      total(sum, r);
    }
    __syncthreads();
  };
  if constexpr (K == NormKind::kRms) {
    // sum(x^2) and its scaled twin (scaled_sq_of: the row read again where
    // the squares overflowed).
    sums(
        [](float(&acc)[2], const float(&v)[VEC], int) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[0] += v[j] * v[j];
        },
        [&](float(&acc)[2], int r) {
          acc[1] = scaled_sq_of(acc[0], [&] {
            float sum = 0.f;
            for_packs(r, [&](const float(&v)[VEC]) { add_scaled_sq(sum, v); });
            return sum;
          });
        },
        [&](const float(&sum)[2], int r) {
          rstd_of[r] = rms_rstd(sum[0], sum[1], a.eps, [&](float t) { return t * inv_h; });
          if (rank == 0) a.rstd[row0 + r] = rstd_of[r];
        });
  } else {
    // sum(d) and sum(d^2), d = x - the row's shift, in one pass (as fwd_regs
    // and fwd_slices): the shift lies among the row's values, so the squares
    // keep the spread of rows far from zero.
    sums([&](float(&acc)[2], const float(&v)[VEC], int r) { add_row_sums<K>(acc, v, shift_of[r]); },
         [](float(&)[2], int) {},
         [&](const float(&sum)[2], int r) {
           const float2 mean_m2 = shifted_mean_m2_of(sum, shift_of[r], sum[0] * inv_h);
           mean_of[r] = mean_m2.x;
           rstd_of[r] = rsqrtf(mean_m2.y * inv_h + a.eps);
           if (rank == 0) a.mean[row0 + r] = mean_of[r], a.rstd[row0 + r] = rstd_of[r];
         });
  }
  if (cluster > 1) cluster_arrive_relaxed();  // this CTA's exchange is done (waited for before it exits)

  const GroupGlobal global = group_global(a, row0);  // the slab lies in one tensor
  auto mean = [&](int r) { return K == NormKind::kLayer ? mean_of[r] : 0.f; };

  // Both passes, with NVFP4's and MXFP8's rule and group size compile-time
  // constants (as fwd_slices' block-rule loops: docs/tuning.md,
  // block-rule-loops); per-group FP8 (kRule < 0) reads them at run time.
  auto passes = [&](auto rule) {
    constexpr int kRule = decltype(rule)::value;
    const int G = static_cast<int>(rule_group_size<kRule>(a));  // 16 or 32 (the plan)
    const Pow2Groups groups(G, VEC);

    // Along the rows: a warp takes runs of 32 packs (lane l the l-th), rows
    // warp, warp + kWarps, ...; a group's G / VEC lanes are adjacent. Lanes
    // past the columns run on the run's first pack (the shuffles) and store
    // nothing; a group's lanes are all past or none (whole groups).
    {
      void* const scales = group_scales(a);
      for (int c0 = 0; c0 < n_cols; c0 += 32 * VEC) {
        const bool valid = c0 + lane * VEC < n_cols;
        const int c = valid ? c0 + lane * VEC : c0;
        float sc[VEC], sh[VEC] = {};
        scale_shift_of(c, sc, sh);
        const T* src = at(warp, c);
        int64_t e = (row0 + warp) * H + col0 + c;  // q's element
#pragma unroll
        for (int i = 0; i < S / kWarps; ++i, e += kWarps * H) {
          const int r = warp + i * kWarps;
          float y[VEC];
          unpack<true>(*reinterpret_cast<const Vec*>(src + i * kWarps * W), y);
          float gm = 0.f;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            y[j] = norm_value(y[j], mean(r), rstd_of[r], sc[j], sh[j], has_beta);
            gm = max_abs(gm, y[j]);
          }
          gm = groups.max_over_lanes(gm);
          const GroupCode code = group_scale<kRule>(a, scales, groups.index(e), gm, global, valid && groups.leader());
          if (valid) store_group<VEC, kRule>(a, e, y, global, code);
        }
      }
    }

    // Down the columns: lanes 2i and 2i + 1 take columns c and c + 1, rows 0-15
    // and 16-31 each, read as words of two x. q_t is (tensors, hidden, rows
    // per tensor), its scales (tensors, hidden, rows per tensor / G): element
    // e's scale is e / G. A pair's 16 codes a column and lane fill a 32-byte
    // sector (FP8) or half of one (NVFP4). Groups of 32 rows span the pair
    // (their max crosses it; each lane then stores one column's scale), groups
    // of 16 are a lane's. The block formats' scales go by rows instead, to
    // the workspace a.qt_scales_ws, (tensors, rows per tensor / G, hidden):
    // a warp's in whole sectors where q_t's would be a byte a sector; the
    // launcher transposes them into q_t's scales after.
    {
      constexpr int kHalf = S / 2;
      const int h = lane & 1;
      const int64_t R = a.rows_per_tensor(), t = a.tensor_of(row0);
      const int64_t first = (t * H + col0) * R + (row0 - t * R);  // q_t's element of column col0, row row0
      const int c_first = 2 * static_cast<int>(threadIdx.x / 2);
      int64_t e0 = first + c_first * R + h * kHalf;  // q_t's element of this lane's first code of column c
      // s0: column c's scale, s_step further a column (by rows, 1; in q_t's
      // layout, R / G: R is whole tiles, so whole groups).
      const bool by_rows = a.qt_scales_ws != nullptr;
      void* const qts = by_rows ? a.qt_scales_ws : a.qt_scales;
      const int64_t s_step = by_rows ? 1 : groups.index(R);
      int64_t s0 = by_rows ? (t * groups.index(R) + groups.index(row0 - t * R + h * kHalf)) * H + col0 + c_first
                           : groups.index(e0);
      for (int c = c_first; c < n_cols; c += kTileThreads, e0 += kTileThreads * R, s0 += kTileThreads * s_step) {
        const T* src = at(h * kHalf, c);
        float sc[2], sh[2] = {};
        scale_shift_of(c, sc, sh);
        float y0[kHalf], y1[kHalf];
#pragma unroll
        for (int j = 0; j < kHalf; j += 4) {
          const float4 rs = *reinterpret_cast<const float4*>(rstd_of + h * kHalf + j);
          const float4 ms =
              K == NormKind::kLayer ? *reinterpret_cast<const float4*>(mean_of + h * kHalf + j) : float4{};
          const float rsk[4] = {rs.x, rs.y, rs.z, rs.w}, msk[4] = {ms.x, ms.y, ms.z, ms.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            float lo, hi;
            widen2<T>(*reinterpret_cast<const uint32_t*>(src + (j + k) * W), lo, hi);
            y0[j + k] = norm_value(lo, msk[k], rsk[k], sc[0], sh[0], has_beta);
            y1[j + k] = norm_value(hi, msk[k], rsk[k], sc[1], sh[1], has_beta);
          }
        }
        float g0 = 0.f, g1 = 0.f;
#pragma unroll
        for (int j = 0; j < kHalf; ++j) g0 = max_abs(g0, y0[j]), g1 = max_abs(g1, y1[j]);
        if (G == S) {  // (n_cols a multiple of 32: every lane of the warp is here)
          g0 = abs_max(g0, __shfl_xor_sync(0xffffffffu, g0, 1));
          g1 = abs_max(g1, __shfl_xor_sync(0xffffffffu, g1, 1));
        }
        const int64_t e1 = e0 + R, s1 = s0 + s_step;  // column c + 1's first code and scale
        const GroupCode k0 = group_scale<kRule>(a, qts, s0, g0, global, G != S || h == 0);
        store_codes<kHalf, kRule>(a, a.qt, e0, y0, global, k0);
        const GroupCode k1 = group_scale<kRule>(a, qts, s1, g1, global, G != S || h == 1);
        store_codes<kHalf, kRule>(a, a.qt, e1, y1, global, k1);
      }
    }
  };
  with_block_rule<-1>(a.group_scale, passes);
  if (cluster > 1) cluster_wait();
#endif
}

}  // namespace
}  // namespace jrn::cuda
