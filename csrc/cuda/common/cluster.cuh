// Sums over the CTAs of a thread block cluster (one row split across it):
// pulled through distributed shared memory (cluster_sum) or pushed
// (ClusterPush, for the persistent kernels; push_slot, a slab's rows at once).
#pragma once

#include <cooperative_groups.h>

#include "async_copy.cuh"
#include "reduce.cuh"

namespace jrn::cuda {

#ifndef JRN_NO_CLUSTERS
// The address of this CTA's shared variable at `p` in rank q's shared memory
// (a shared::cluster address, for st.async).
__device__ __forceinline__ unsigned cluster_addr(const void* p, int q) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(p)), "r"(q));
  return r;
}
// Stores 16 bytes at `dst` (shared::cluster, aligned to 16), counting them
// on the mbarrier at `bar` (of the same CTA).
__device__ __forceinline__ void st_async16(unsigned dst, float a, float b, float c, float d, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(dst), "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(__float_as_uint(c)),
               "r"(__float_as_uint(d)), "r"(bar) : "memory");
}
#endif

// ---- Reductions over the CTAs of a thread block cluster (one row split
// across the cluster). Each CTA passes its row_sum result; every thread gets
// the cluster-wide sum, added in rank order (the same in every CTA).
// `xchg` is the caller's __shared__ float[2][M]; consecutive calls alternate
// `parity`, so one cluster barrier per call suffices: a slot is rewritten only
// after the next barrier, which every reader of the old value has passed.
// Before exiting, a kernel must cluster-sync once more (cluster_done) so that
// no CTA leaves while another still reads its shared memory. Kernels that
// walk many rows per cluster (fwd_slices, bwd_slices) take ClusterPush below
// instead; cluster_sum stays for those with one row per cluster, where the
// push was not measured.


template <int M, class Op = SumOp>
__device__ __forceinline__ void cluster_sum(float (&v)[M], float (*xchg)[M], int parity, Op op = {}) {
#ifdef JRN_NO_CLUSTERS
  __trap();
#else
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) xchg[parity][m] = v[m];
  }
  cluster.sync();
  // Lane q reads rank q's partials; a butterfly over the warp adds them in the
  // same order in every warp of every CTA.
  const int lane = threadIdx.x % 32;
  const float* remote = lane < static_cast<int>(cluster.num_blocks())
                            ? cluster.map_shared_rank(&xchg[parity][0], lane)
                            : nullptr;
#pragma unroll
  for (int m = 0; m < M; ++m) v[m] = remote ? remote[m] : 0.f;  // 0: identity of sum and max
  warp_sum<M>(v, 32, op);
#endif
}


// The same cluster-wide sum with the partials pushed instead of pulled:
// each CTA stores its M partials into slot `rank` of every CTA's exchange
// (st.async from lane q to rank q, which counts the bytes on the receiving
// CTA's mbarrier), and each CTA's threads wait on their own mbarrier and read the
// slots from their own shared memory. No cluster barrier a row and no remote
// loads. `parity` alternates as for cluster_sum: a CTA pushes into buffer p
// again only after the exchange of buffer p ^ 1, which takes every CTA's
// push of it, and each CTA pushes after the CTA barrier of its row_sum,
// which follows its threads' reads of the buffer. Every thread of the
// cluster constructs it (it holds a cluster barrier, so that no push lands
// before the mbarriers are initialized); a kernel using it ends with
// cluster_done(), as with cluster_sum (docs/tuning.md, cluster-push).
template <int M>
struct ClusterPush {
  float (*slots)[kMaxCluster][M];  // __shared__ float[2][kMaxCluster][M]
  uint64_t* bars;                  // __shared__ uint64_t[2]
  int size, rank;
  unsigned phases = 0;  // bit p: the parity of buffer p's next phase

  __device__ __forceinline__ ClusterPush(float (*s)[kMaxCluster][M], uint64_t* b, int cluster_size, int my_rank)
      : slots(s), bars(b), size(cluster_size), rank(my_rank) {
    if (size <= 1) return;
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      mbar_init(&bars[0]);
      mbar_init(&bars[1]);
    }
    JRN_SM90(cooperative_groups::this_cluster().sync());
  }
  // The two halves of sum(), for callers that combine the slots their own
  // way (LayerNorm's slice means in fwd_slices). push: this CTA's M partials
  // to every CTA of the cluster.
  __device__ __forceinline__ void push(const float (&v)[M], int parity) {
#ifdef JRN_NO_CLUSTERS
    __trap();
#else
    // Lane q of the first warp pushes to rank q in one store (M = 2: 8
    // bytes; M = 4: 16, the slots aligned to 16 bytes), or M = 3 in three.
    static_assert(M >= 1 && M <= 4, "ClusterPush: one to four values a row");
    if (threadIdx.y == 0 && threadIdx.x < size) {
      if (threadIdx.x == 0) mbar_expect(&bars[parity], static_cast<unsigned>(size * M * sizeof(float)));
      const int q = static_cast<int>(threadIdx.x);
      const unsigned rslot = cluster_addr(&slots[parity][rank][0], q), rbar = cluster_addr(&bars[parity], q);
      if constexpr (M == 1 || M == 3) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
                       ::"r"(rslot + 4u * m), "r"(__float_as_uint(v[m])), "r"(rbar) : "memory");
        }
      } else if constexpr (M == 2) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n"
                     ::"r"(rslot), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[M - 1])), "r"(rbar) : "memory");
      } else {
        st_async16(rslot, v[0], v[1], v[2], v[3], rbar);
      }
    }
#endif
  }
  // take: waits for every CTA's push of buffer `parity`; lane q of each warp
  // gets rank q's partials (0 for lanes past the cluster).
  __device__ __forceinline__ void take(float (&v)[M], int parity) {
    mbar_wait<true>(&bars[parity], (phases >> parity) & 1u);
    phases ^= 1u << parity;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = lane < size ? slots[parity][lane][m] : 0.f;
  }
  // Every thread gets the cluster-wide result of op over the CTAs' partials
  // v, added by a butterfly in the same order in every warp of every CTA (as
  // cluster_sum does). A cluster of one leaves v as it is.
  template <class Op = SumOp>
  __device__ __forceinline__ void sum(float (&v)[M], int parity, Op op = {}) {
    if (size <= 1) return;
    push(v, parity);
    take(v, parity);
    warp_sum<M>(v, 32, op);
  }
};

// A block of partials pushed to every other CTA of the cluster (fwd_tiles:
// a slab's row sums, N floats a CTA): this CTA's N floats at `mine`, its slot
// of the exchange, are stored at the same offset of rank q's shared memory
// for every q != rank, 16 bytes a thread (threads t < (size - 1) * N / 4),
// st.async counting them on rank q's `bar` (armed there by arm_pushed).
template <int N>
__device__ __forceinline__ void push_slot(const float* mine, uint64_t* bar, int size, int rank) {
#ifdef JRN_NO_CLUSTERS
  __trap();
#else
  static_assert(N % 4 == 0, "push_slot: whole 16-byte chunks");
  constexpr int kChunks = N / 4;
  const int t = static_cast<int>(threadIdx.x);
  if (t >= (size - 1) * kChunks) return;
  const int j = t / kChunks, k = t % kChunks;
  const int q = j < rank ? j : j + 1;  // every rank but this one
  const float4 v = reinterpret_cast<const float4*>(mine)[k];
  st_async16(cluster_addr(mine + 4 * k, q), v.x, v.y, v.z, v.w, cluster_addr(bar, q));
#endif
}
// Initializes this CTA's `bar` and arms it for the other CTAs' push_slot<N>
// (one thread; the cluster then passes a barrier before any CTA pushes). The
// receiver waits with mbar_wait<true>(bar, 0).
template <int N>
__device__ __forceinline__ void arm_pushed(uint64_t* bar, int size) {
  mbar_init(bar);
  mbar_expect(bar, static_cast<unsigned>((size - 1) * N * sizeof(float)));
}

__device__ __forceinline__ void cluster_done() {
  JRN_SM90(cooperative_groups::this_cluster().sync());
}

// A cluster barrier in two halves, for a kernel with work between them:
// arrive, relaxed (ordering no memory accesses: mbarrier inits are published
// by their own fence, exchanges by st.async's mbarriers), then wait. Every
// thread of every CTA calls both.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  JRN_SM90(asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"));
}
__device__ __forceinline__ void cluster_wait() {
  JRN_SM90(asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"));
}

// The CTAs of this CTA's cluster (1 without clusters).
__device__ __forceinline__ int cluster_ctas() {
#ifdef JRN_NO_CLUSTERS
  return 1;
#else
  return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
#endif
}
}  // namespace jrn::cuda
