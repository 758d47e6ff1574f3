// Asynchronous copies global -> shared memory (sm_90+): bulk copies counted
// by mbarriers, per-thread cp.async, and the two-stage ring of the
// persistent kernels.
#pragma once

#include <cstdint>

#include "base.cuh"

namespace jrn::cuda {

// Clusters and bulk copies exist from sm_90 on; the launchers check
// has_clusters() first, so the older architectures' builds never reach the
// helpers below that need them (they trap if they do).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define JRN_NO_CLUSTERS 1
#endif
// The body of such a helper: compiled from sm_90 on, a trap before (bodies
// with preprocessor lines, such as #pragma, keep an #ifdef instead).
#ifdef JRN_NO_CLUSTERS
#define JRN_SM90(...) __trap()
#else
#define JRN_SM90(...) __VA_ARGS__
#endif

// ---- Bulk copies global -> shared (the tensor memory accelerator, sm_90+):
// one thread moves a contiguous run of bytes (a multiple of 16, both ends
// 16-byte aligned); an mbarrier counts the bytes in and completes its phase
// when all have landed. Only kernels launched after has_clusters() use these.

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Initializes `bar` for one arriving thread, visible to the copy engine once
// the CTA has synchronized.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  JRN_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(bar)) : "memory");
           asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
// Arms `bar` for `bytes` and starts copying them from `src` (global) to `dst` (shared).
__device__ __forceinline__ void mbar_expect(uint64_t* bar, unsigned bytes) {
  JRN_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
                        "r"(bytes) : "memory"));
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  JRN_SM90(asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                        ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory"));
}

// Asks L2 to fetch `bytes` (a multiple of 16, 16-byte aligned) from global
// memory ahead of a later copy; nothing lands in shared memory.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  JRN_SM90(asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory"));
}

// Orders this thread's earlier shared-memory accesses (and, after a barrier,
// the CTA's) before later bulk copies into the same bytes.
__device__ __forceinline__ void fence_async_smem() {
  JRN_SM90(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}
// Waits for the phase of `bar` with the given parity to complete. CLUSTER:
// the phase's bytes were stored by other CTAs of the cluster (st.async), so
// the wait acquires at cluster scope.
#define JRN_TRY_WAIT(SEM)                                                                       \
  "{\n .reg .pred p;\n mbarrier.try_wait.parity" SEM ".shared::cta.b64 p, [%1], %2;\n" \
  " selp.u32 %0, 1, 0, p;\n}\n"
template <bool CLUSTER = false>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  JRN_SM90(unsigned done = 0; do {
    if constexpr (CLUSTER) {
      asm volatile(JRN_TRY_WAIT(".acquire.cluster") : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } else {
      asm volatile(JRN_TRY_WAIT("") : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    }
  } while (!done));
}
#undef JRN_TRY_WAIT

// Columns of CTA `rank`'s slice of a row of `hidden` columns cut into
// slices of `width` (fwd_slices, bwd_slices): the last ranks' may be short,
// or empty.
__device__ __forceinline__ int64_t slice_columns(int rank, int64_t width, int64_t hidden) {
  return std::max<int64_t>(std::min<int64_t>(width, hidden - rank * width), 0);
}

// Per-thread asynchronous copies global -> shared (cp.async; compiled, like
// the bulk copies, from sm_90 on), for a thread that alone reads what it
// copies: 16 bytes a copy, bypassing L1. The copies issued since the last
// commit form a group; cp_async_wait<N> returns once at most the newest N of
// this thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  JRN_SM90(asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory"));
}
__device__ __forceinline__ void cp_async_commit() { JRN_SM90(asm volatile("cp.async.commit_group;\n" ::: "memory")); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  JRN_SM90(asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"));
}

// Two shared-memory stages filled by bulk copies, for kernels that walk rows:
// thread 0 fills a stage with N contiguous runs of `bytes` each, and every
// thread waits for a stage before reading it. The caller makes sure no thread
// still reads a stage when it is refilled (a barrier in between).
struct BulkStages {
  uint64_t* landed;     // two mbarriers in shared memory: stage st has arrived
  unsigned phases = 0;  // bit st: the parity of stage st's next phase

  // Every thread of the CTA calls it (it holds a barrier).
  __device__ __forceinline__ explicit BulkStages(uint64_t* bars) : landed(bars) {
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      mbar_init(&landed[0]);
      mbar_init(&landed[1]);
    }
    __syncthreads();
  }
  template <int N>
  __device__ __forceinline__ void fill(int st, void* const (&dst)[N], const void* const (&src)[N], unsigned bytes) {
    fence_async_smem();
    mbar_expect(&landed[st], N * bytes);
#pragma unroll
    for (int i = 0; i < N; ++i) bulk_copy(dst[i], src[i], bytes, &landed[st]);
  }
  __device__ __forceinline__ void wait(int st) {
    mbar_wait(&landed[st], (phases >> st) & 1u);
    phases ^= 1u << st;
  }
  // Between a row's reduction and the refill of the stage the previous row
  // was read from: row_sum's barrier orders those reads first, but a CTA of
  // one warp reduces by shuffles alone and takes a barrier here (without it,
  // racecheck reported the refill's bulk writes against the earlier reads;
  // __syncwarp compiles to nothing on sm_90).
  __device__ __forceinline__ void order_refill_after_reduction() const {
    if (blockDim.x <= 32) __syncthreads();
  }
};
}  // namespace jrn::cuda
