// all_reduce_rms_norm's "nvlink" method: the sum over the devices of one
// process of each device's partial sum, and the RMSNorm of that sum, in one
// kernel per device that reaches its peers' memory directly (NVLink / PCIe
// peer access) instead of an all-reduce followed by a norm. Two kernels:
// the two-pass kernel below, and for small calls a push kernel (further
// down).
//
// Two-pass: each device of the group owns a contiguous 1/n of the rows. For each of
// its rows a CTA loads the row's partial sums from all n devices, adds them
// in rank order in float32, rounds the sum to x's dtype (as psum's result
// is), normalizes it, and writes y and rstd into every device's outputs.
// Across the group, each partial sum is read once and each output row is
// written once into each device: per device, as many bytes over NVLink as
// a ring all-reduce sends, and no pass of a norm kernel after it.
//
// Its devices meet at two barriers per call, kept in a small signal block
// that each device of a group owns (allocated once, peer-accessible):
// - start: CTA b of each device publishes its buffers' addresses and raises
//   its flag on every peer; it goes on once every peer's CTA b has. The
//   partial sums of all peers are then complete (written by kernels before
//   this one on their streams) and their addresses known.
// - end: after its rows are written, CTA b raises its end flag on every peer
//   and waits for theirs. A device's kernel thus ends only when no peer
//   still reads its partial sums or writes its outputs.
// Flags hold a per-CTA call count (the epoch), so they never need
// resetting.
//
// Push: calls of at most kPushBytes / (n - 1) a partial sum (decode-time
// row counts) take a kernel with no barrier (`all_reduce_rms_push`): each
// device stores its partial sum into a buffer of every peer and computes
// every row from the copies it receives, which it recognizes by their data.
//
// For both, every device must run the same calls with the same rows (SPMD,
// as inside shard_map), one call after another on each device (XLA's
// stream, or a command buffer that keeps their order: the Python side
// refuses XLA_FLAGS' CONCURRENT scheduling mode), and CTA b of every device
// must be resident at once: the grid is at most what fits the SMs at once.
// A wait longer than kWaitNs traps (a CUDA error in the program) rather
// than hang.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/async_copy.cuh"
#include "common/cluster.cuh"
#include "common/fp8.cuh"
#include "common/launch.cuh"
#include "common/norm_math.cuh"
#include "common/reduce.cuh"
#include "common/vec_io.cuh"

namespace jrn::cuda {
namespace {

constexpr int kMaxRanks = 8;
constexpr int kMaxCtas = 1024;  // resident CTAs of one device, at most
constexpr int kItems = 4;      // packs a thread
constexpr int kMaxThreads = 512;  // hidden up to 512 * kItems packs (16384 in bf16)
constexpr unsigned long long kWaitNs = 20ull * 1000 * 1000 * 1000;
// The push kernel (small calls): each device's buffer holds kPushSlots
// slots of n regions, one a source rank, of kPushBytes each. A 32-bit word
// equal to kEmpty marks an element not yet written: senders store kEmpty
// as 0 (in 16-bit x, two -0.0s become two +0.0s; in float32 a denormal of
// -4.6e-41 becomes 0), so no written word holds it.
constexpr int64_t kPushBytes = 512 * 1024;
constexpr int kPushSlots = 3;
constexpr unsigned kEmpty = 0x80008000u;

// A device's buffers for one call, as its peers see them.
struct Buffers {
  const void* x;
  void* y;
  float* rstd;
};

// One device's signal block (device memory, zeroed once).
struct Signals {
  unsigned start[kMaxCtas][kMaxRanks];
  unsigned end[kMaxCtas][kMaxRanks];
  unsigned epoch[kMaxCtas];  // calls CTA b of this device has finished
  Buffers bufs;
  unsigned push_calls;  // push kernels this device has finished (its slot: push_calls % kPushSlots)
  unsigned push_done;   // CTAs of the current push kernel that have finished
};

struct Group {
  int n = 0;
  Signals* sig[kMaxRanks] = {};
  void* push[kMaxRanks] = {};  // each device's push buffer
};

struct ArArgs {
  Signals* sig[kMaxRanks];  // every rank's signal block, by rank
  void* push[kMaxRanks];    // every rank's push buffer, by rank
  Buffers mine;
  const void* gamma;
  int64_t rows;
  int hidden;
  int rank, n;
  float eps;
  bool zero_centered;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void store_release_sys(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire_sys(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Calls poll() until it returns true. A wait longer than kWaitNs prints
// which rank waited for which and traps (a CUDA error in the program) rather
// than hang.
template <class Poll>
__device__ __forceinline__ void wait_for(Poll poll, const char* kernel, int rank, int peer) {
  if (poll()) return;
  const unsigned long long t0 = global_ns();
  while (!poll()) {
    if (global_ns() - t0 > kWaitNs) {
      printf("jax_rmsnorm: all_reduce_rms_norm (%s): rank %d waited %llu s for rank %d; trapping\n", kernel, rank,
             kWaitNs / 1000000000ull, peer);
      __trap();
    }
  }
}

// Thread t < n raises flag[blockIdx.x][rank] on rank t to `epoch`, then
// waits for flag[blockIdx.x][t] of its own block to reach it; then the CTA
// meets. Prior writes of the whole CTA are ordered before the flags: the
// barrier orders them before thread t's release, and a release is
// cumulative, so the peer that acquires the flag sees them. (A
// __threadfence_system() before the release as well is not needed, and
// cost time: docs/tuning.md, all-reduce-meet.)
__device__ void meet(const ArArgs& a, unsigned (Signals::*flags)[kMaxCtas][kMaxRanks], unsigned epoch) {
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < a.n) {
    store_release_sys(&(a.sig[t]->*flags)[blockIdx.x][a.rank], epoch);
    const unsigned* mine = &(a.sig[a.rank]->*flags)[blockIdx.x][t];
    wait_for([&] { return static_cast<int>(load_acquire_sys(mine) - epoch) >= 0; }, "nvlink", a.rank, t);
  }
  __syncthreads();
}

// One row of the all-reduced norm, computed by a CTA: load(r, p, raw)
// fills pack p of rank r's partial sum; the n are added in rank order in
// float32 and rounded to x's dtype (as psum's result is), then normalized;
// store(p, y) writes pack p of y. Returns the row's rstd.
template <class T, class P, class Load, class Store>
__device__ __forceinline__ float norm_row(const ArArgs& a, float* smem, Load load, Store store) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Pack<T, VEC>;
  const int t = static_cast<int>(threadIdx.x);
  const int nvec = a.hidden / VEC;
  float v[kItems][VEC];
  float ss[1] = {0.f};
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = t + i * static_cast<int>(blockDim.x);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    if (p >= nvec) continue;
    V raw[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (r < a.n) load(r, p, raw[r]);
    }
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (r < a.n) {
        float f[VEC];
        unpack(raw[r], f);
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[i][j] += f[j];
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      v[i][j] = to_float(from_float<T>(v[i][j]));  // the sum as x's dtype holds it
      ss[0] += v[i][j] * v[i][j];
    }
  }
  row_sum<1>(ss, smem);
  const float rstd = rsqrtf(ss[0] / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int p = t + i * static_cast<int>(blockDim.x);
    if (p >= nvec) continue;
    float y[VEC];
    float s[VEC];
    load_scale<VEC>(static_cast<const P*>(a.gamma), static_cast<int64_t>(p) * VEC, a.zero_centered, s);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = v[i][j] * rstd * s[j];
    store(p, y);
  }
  return rstd;
}

template <class T, class P>
__global__ void __launch_bounds__(kMaxThreads) all_reduce_rms(ArArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Pack<T, VEC>;
  __shared__ float smem[kRowSumSmem];
  __shared__ Buffers peer[kMaxRanks];
  __shared__ unsigned epoch_s;
  const int t = static_cast<int>(threadIdx.x);
  Signals* own = a.sig[a.rank];
  if (t == 0) {
    epoch_s = own->epoch[blockIdx.x] + 1;
    own->bufs = a.mine;  // the same values from every CTA of this call
  }
  __syncthreads();
  const unsigned epoch = epoch_s;
  meet(a, &Signals::start, epoch);
  if (t < a.n) {
    const volatile Buffers* b = &a.sig[t]->bufs;
    peer[t] = Buffers{b->x, b->y, b->rstd};
  }
  __syncthreads();

  const int64_t lo = a.rows * a.rank / a.n, hi = a.rows * (a.rank + 1) / a.n;
  for (int64_t row = lo + blockIdx.x; row < hi; row += gridDim.x) {
    const int64_t at = row * a.hidden;
    const float rstd = norm_row<T, P>(
        a, smem,
        [&](int r, int p, V& raw) {
          const uint4* src = reinterpret_cast<const uint4*>(static_cast<const T*>(peer[r].x) + at) + p;
          *reinterpret_cast<uint4*>(&raw) = __ldcg(src);
        },
        [&](int p, const float(&y)[VEC]) {
#pragma unroll
          for (int r = 0; r < kMaxRanks; ++r) {
            if (r < a.n) store_pack<VEC>(static_cast<T*>(peer[r].y) + at + static_cast<int64_t>(p) * VEC, y);
          }
        });
    if (t < a.n) peer[t].rstd[row] = rstd;
  }

  meet(a, &Signals::end, epoch);
  if (t == 0) own->epoch[blockIdx.x] = epoch;
}

__device__ __forceinline__ uint4 load_volatile(const uint4* p) {
  uint4 w;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w)
               : "l"(p)
               : "memory");
  return w;
}
__device__ __forceinline__ void store_volatile(uint4* p, uint4 w) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z),
               "r"(w.w)
               : "memory");
}
__device__ __forceinline__ unsigned not_empty(unsigned w) { return w == kEmpty ? 0u : w; }
__device__ __forceinline__ uint4 not_empty(uint4 w) {
  return uint4{not_empty(w.x), not_empty(w.y), not_empty(w.z), not_empty(w.w)};
}
__device__ __forceinline__ bool written(uint4 w) {
  return w.x != kEmpty && w.y != kEmpty && w.z != kEmpty && w.w != kEmpty;
}

// The push kernel, for small calls (launch() says which): no barrier. Each CTA
// stores its rows of this device's partial sum into the current slot of
// every peer's buffer (in its region for this rank), then, for each of its
// rows, waits until every peer's copy has arrived in its own buffer (no
// word is kEmpty), sums and normalizes the row, and writes y and rstd into
// this device only: every device computes every row, as one-shot
// all-reduces do. Each device reads the same values (its own x with kEmpty
// stored as 0, like its pushes) in rank order, so every device's y is the
// same. A CTA marks what it read kEmpty again, for the slot's next use.
// That use is kPushSlots calls later: a peer writes it only after reading
// this device's pushes of a later call, which start after this kernel
// has ended. The last CTA to finish moves the device to the next slot.
template <class T, class P>
__global__ void __launch_bounds__(kMaxThreads) all_reduce_rms_push(ArArgs a) {
  constexpr int VEC = 16 / sizeof(T);
  using V = Pack<T, VEC>;
  __shared__ float smem[kRowSumSmem];
  __shared__ unsigned slot_s;
  const int t = static_cast<int>(threadIdx.x);
  Signals* own = a.sig[a.rank];
  if (t == 0) slot_s = own->push_calls % kPushSlots;
  __syncthreads();
  const int64_t slot = slot_s;
  const int nvec = a.hidden / VEC;
  // Rank `from`'s region of the slot in device `on`'s buffer, as packs.
  auto region = [&](int on, int from) {
    return reinterpret_cast<uint4*>(static_cast<char*>(a.push[on]) + (slot * a.n + from) * kPushBytes);
  };
  const uint4* x = static_cast<const uint4*>(a.mine.x);

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    for (int p = t; p < nvec; p += static_cast<int>(blockDim.x)) {
      const int64_t at = row * nvec + p;
      const uint4 w = not_empty(x[at]);
#pragma unroll
      for (int r = 0; r < kMaxRanks; ++r) {
        if (r < a.n && r != a.rank) store_volatile(region(r, a.rank) + at, w);
      }
    }
  }

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const float rstd = norm_row<T, P>(
        a, smem,
        [&](int r, int p, V& raw) {
          const int64_t at = row * nvec + p;
          uint4 w;
          if (r == a.rank) {
            w = not_empty(x[at]);
          } else {
            uint4* src = region(a.rank, r) + at;
            wait_for(
                [&] {
                  w = load_volatile(src);
                  return written(w);
                },
                "nvlink, push", a.rank, r);
            *src = uint4{kEmpty, kEmpty, kEmpty, kEmpty};
          }
          *reinterpret_cast<uint4*>(&raw) = w;
        },
        [&](int p, const float(&y)[VEC]) {
          store_pack<VEC>(static_cast<T*>(a.mine.y) + row * a.hidden + static_cast<int64_t>(p) * VEC, y);
        });
    if (t == 0) a.mine.rstd[row] = rstd;
  }

  __syncthreads();
  if (t == 0) {
    __threadfence();
    if (atomicAdd(&own->push_done, 1u) == gridDim.x - 1) {
      own->push_done = 0;
      own->push_calls += 1;
    }
  }
}

__global__ void fill_empty(unsigned* p, int64_t words) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = kEmpty;
}

std::mutex groups_mu;
std::map<std::vector<int>, Group>& groups() {
  static auto* g = new std::map<std::vector<int>, Group>;
  return *g;
}

// Restores the calling thread's current device when it goes out of scope.
struct DeviceGuard {
  int dev = -1;
  DeviceGuard() { cudaGetDevice(&dev); }
  ~DeviceGuard() {
    if (dev >= 0) cudaSetDevice(dev);
  }
};

// Lets the calling thread make calls that stream capture forbids (cudaMalloc,
// synchronizing a stream of its own) while it is in scope. The handler is
// compatible with command buffers, so its first call, which sets its group
// up, may come while XLA captures a CUDA graph; nothing set up here is
// enqueued on the captured stream.
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t err;
  RelaxedCapture() { err = cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() {
    if (err == cudaSuccess) cudaThreadExchangeStreamCaptureMode(&mode);
  }
};

// What setup_group has allocated, by device: freed on scope exit unless
// handed to the group (keep()), so that a failed set-up leaks nothing and a
// later call can try again.
class Allocations {
 public:
  ~Allocations() {
    if (held_.empty()) return;
    for (const auto& [device, ptr] : held_) {
      if (cudaSetDevice(device) == cudaSuccess) cudaFree(ptr);
    }
    cudaGetLastError();  // the error reported is the set-up's, not a failure to free
  }
  ffi::Error alloc(int device, int64_t bytes, void** ptr, const char* what) {
    const cudaError_t e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) return cuda_error(e, what);
    held_.emplace_back(device, *ptr);
    return ffi::Error::Success();
  }
  void keep() { held_.clear(); }

 private:
  std::vector<std::pair<int, void*>> held_;
};

// Zeroes a signal block and marks every word of a push buffer kEmpty, on a
// stream of its own (the current device's), and waits for it.
ffi::Error init_buffers(void* sig, void* push, int64_t push_bytes) {
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_error(e, "all_reduce_rms_norm: cudaStreamCreate");
  e = cudaMemsetAsync(sig, 0, sizeof(Signals), s);
  if (e == cudaSuccess) {
    fill_empty<<<256, 256, 0, s>>>(static_cast<unsigned*>(push), push_bytes / 4);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  const cudaError_t d = cudaStreamDestroy(s);
  if (e == cudaSuccess) e = d;
  if (e != cudaSuccess) return cuda_error(e, "all_reduce_rms_norm: setting up the signals and push buffers");
  return ffi::Error::Success();
}

ffi::Error setup_group(const std::vector<int>& ordinals, Group* out) {
  const int n = static_cast<int>(ordinals.size());
  RelaxedCapture relaxed;
  if (relaxed.err != cudaSuccess)
    return cuda_error(relaxed.err, "all_reduce_rms_norm: cudaThreadExchangeStreamCaptureMode");
  DeviceGuard guard;
  Allocations allocs;  // freed before the guard restores the device
  Group g;
  g.n = n;
  int sms = -1;
  for (int i = 0; i < n; ++i) {
    const int d = ordinals[i];
    cudaError_t e = cudaSetDevice(d);
    if (e != cudaSuccess) return cuda_error(e, "all_reduce_rms_norm: cudaSetDevice");
    int count = 0;
    e = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, d);
    if (e != cudaSuccess) return cuda_error(e, "all_reduce_rms_norm: cudaDeviceGetAttribute");
    if (sms >= 0 && count != sms)
      return ffi::Error::InvalidArgument(
          "jax_rmsnorm: all_reduce_rms_norm(method='nvlink') needs GPUs of one kind; device " + std::to_string(d) +
          " has " + std::to_string(count) + " SMs, device " + std::to_string(ordinals[0]) + " " +
          std::to_string(sms));
    sms = count;
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      int can = 0;
      e = cudaDeviceCanAccessPeer(&can, d, ordinals[j]);
      if (e != cudaSuccess) return cuda_error(e, "all_reduce_rms_norm: cudaDeviceCanAccessPeer");
      if (!can)
        return ffi::Error::InvalidArgument("jax_rmsnorm: all_reduce_rms_norm(method='nvlink'): device " +
                                           std::to_string(d) + " cannot access device " +
                                           std::to_string(ordinals[j]) +
                                           "'s memory (no peer access); use method='psum'");
      e = cudaDeviceEnablePeerAccess(ordinals[j], 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clears it
      } else if (e != cudaSuccess) {
        return cuda_error(e, "all_reduce_rms_norm: cudaDeviceEnablePeerAccess");
      }
    }
    const int64_t push_bytes = kPushSlots * n * kPushBytes;
    void* p = nullptr;
    void* q = nullptr;
    JRN_RETURN_IF_ERROR(allocs.alloc(d, sizeof(Signals), &p, "all_reduce_rms_norm: cudaMalloc (signals)"));
    JRN_RETURN_IF_ERROR(allocs.alloc(d, push_bytes, &q, "all_reduce_rms_norm: cudaMalloc (push buffer)"));
    JRN_RETURN_IF_ERROR(init_buffers(p, q, push_bytes));
    g.sig[i] = static_cast<Signals*>(p);
    g.push[i] = q;
  }
  allocs.keep();
  *out = g;
  return ffi::Error::Success();
}

// Every CTA must be resident at once (they wait for their peers'), so the
// grid is at most what fits the device, from the occupancy: two CTAs an SM
// where they fit (docs/tuning.md, all-reduce-grid). Every device of a group
// is of one kind (setup_group), so each gets the same grid.
template <class T, class P>
ffi::Error launch(cudaStream_t stream, const ArArgs& a) {
  const int nvec = a.hidden / (16 / static_cast<int>(sizeof(T)));
  const int threads = std::max(32, pow2_ceil(ceil_div(nvec, kItems)));
  if (threads > kMaxThreads) return ffi::Error::InvalidArgument("jax_rmsnorm: all_reduce_rms_norm: hidden too large");
  // The push kernel sends n - 1 copies of x from each device (the two-pass-fits
  // kernel about two), so it takes calls of at most kPushBytes / (n - 1)
  // bytes a partial sum: at 8192 bf16 a row, up to 32 rows on 2 GPUs and 10
  // on 4 (docs/tuning.md, all-reduce-push). JRN_AR_PUSH_BYTES (read once) sets that
  // limit instead, at most kPushBytes (0: never).
  static const int64_t push_env = [] {
    const char* v = std::getenv("JRN_AR_PUSH_BYTES");
    return v ? std::atoll(v) : -1;
  }();
  const int64_t push_limit = std::min<int64_t>(push_env >= 0 ? push_env : kPushBytes / (a.n - 1), kPushBytes);
  const bool push = a.rows * a.hidden * static_cast<int64_t>(sizeof(T)) <= push_limit;
  auto kernel = push ? all_reduce_rms_push<T, P> : all_reduce_rms<T, P>;
  int resident = 0;
  JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, dim3(threads), 0, 1, &resident));
  const int64_t most = std::min<int64_t>(resident, kMaxCtas);
  const unsigned ctas = static_cast<unsigned>(std::min<int64_t>(most, push ? a.rows : ceil_div(a.rows, a.n)));
  kernel<<<ctas, threads, 0, stream>>>(a);
  return check_launch(push ? "all_reduce_rms_norm (nvlink, push)" : "all_reduce_rms_norm (nvlink)");
}

// This device's rank and group in `group_table` (rows of n device
// ordinals, rank order), the group set up on first use.
ffi::Error find_group(int32_t device, ffi::Span<const int64_t> group_table, int64_t n, Group* g, int* rank) {
  if (n < 2 || n > kMaxRanks || group_table.size() % n != 0)
    return ffi::Error::InvalidArgument("jax_rmsnorm: all_reduce_rms_norm: bad device groups");
  std::vector<int> mine;
  *rank = -1;
  for (size_t row = 0; row < group_table.size() / n && *rank < 0; ++row) {
    for (int r = 0; r < n; ++r) {
      if (group_table[row * n + r] == device) {
        *rank = r;
        for (int k = 0; k < n; ++k) mine.push_back(static_cast<int>(group_table[row * n + k]));
        break;
      }
    }
  }
  if (*rank < 0)
    return ffi::Error::InvalidArgument("jax_rmsnorm: all_reduce_rms_norm: device " + std::to_string(device) +
                                       " is in none of the groups");
  std::lock_guard<std::mutex> lock(groups_mu);
  auto it = groups().find(mine);
  if (it == groups().end()) {
    JRN_RETURN_IF_ERROR(setup_group(mine, g));
    groups()[mine] = *g;
  } else {
    *g = it->second;
  }
  return ffi::Error::Success();
}

}  // namespace

// The handler: x (rows..., hidden) this device's partial sum, gamma
// (hidden,) or a placeholder; y like x and rstd (rows...) float32, each the
// whole result on every device. `groups`: rows of n device ordinals in rank
// order, one row for each group that sums together.
ffi::Error all_reduce_rms_norm(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer gamma_buf,
                               ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> rstd,
                               ffi::Span<const int64_t> group_table, int64_t n, float eps, bool zero_centered,
                               bool has_gamma) {
  const ffi::AnyBuffer* gamma = has_gamma ? &gamma_buf : nullptr;
  Group g;
  int rank = 0;
  JRN_RETURN_IF_ERROR(find_group(device, group_table, n, &g, &rank));
  const auto dims = x.dimensions();
  const int64_t hidden = dims.size() == 0 ? 1 : dims.back();
  const int64_t rows = hidden ? static_cast<int64_t>(x.element_count()) / hidden : 0;
  if (rows == 0) return ffi::Error::Success();  // the same on every device: none launches
  ArArgs a{};
  for (int r = 0; r < n; ++r) {
    a.sig[r] = g.sig[r];
    a.push[r] = g.push[r];
  }
  a.mine = Buffers{x.untyped_data(), y->untyped_data(), static_cast<float*>(rstd->untyped_data())};
  a.gamma = gamma ? gamma->untyped_data() : nullptr;
  a.rows = rows;
  a.hidden = static_cast<int>(hidden);
  a.rank = rank;
  a.n = static_cast<int>(n);
  a.eps = eps;
  a.zero_centered = zero_centered;
  const bool f32_gamma = gamma && gamma->element_type() == ffi::DataType::F32;
  switch (x.element_type()) {
    case ffi::DataType::BF16:
      return f32_gamma ? launch<__nv_bfloat16, float>(stream, a)
                       : launch<__nv_bfloat16, __nv_bfloat16>(stream, a);
    case ffi::DataType::F16:
      return f32_gamma ? launch<__half, float>(stream, a) : launch<__half, __half>(stream, a);
    case ffi::DataType::F32:
      return launch<float, float>(stream, a);
    default:
      return ffi::Error::InvalidArgument("jax_rmsnorm: all_reduce_rms_norm: x must be float32, bfloat16 or float16");
  }
}

// Whether every pair of the visible GPUs has peer access, and there are at
// least two (all_reduce_rms_norm's "auto" takes the kernel only then).
bool peer_access_everywhere() {
  static const bool ok = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    for (int i = 0; i < count; ++i) {
      for (int j = 0; j < count; ++j) {
        int can = 0;
        if (i != j && (cudaDeviceCanAccessPeer(&can, i, j) != cudaSuccess || !can)) {
          cudaGetLastError();
          return false;
        }
      }
    }
    return count >= 2;
  }();
  return ok;
}

}  // namespace jrn::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaAllReduceRmsNorm, ::jrn::cuda::all_reduce_rms_norm,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()
                                  .Arg<::xla::ffi::AnyBuffer>()
                                  .Ret<::xla::ffi::AnyBuffer>()
                                  .Ret<::xla::ffi::AnyBuffer>()
                                  .Attr<::xla::ffi::Span<const int64_t>>("groups")
                                  .Attr<int64_t>("n")
                                  .Attr<float>("eps")
                                  .Attr<bool>("zero_centered_gamma")
                                  .Attr<bool>("has_gamma"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});
