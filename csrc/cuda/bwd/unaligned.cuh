// bwd_unaligned: the backward of widths that are no multiple of a pack.
#pragma once

#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

// One element of a row taken on its own by bwd_unaligned (a head or tail
// element): its column, effective scale and dgamma/dbeta sums over the
// slot's rows, its x and dy in the next row (loaded a row ahead), and the
// current row's xhat, g and dy.
struct LoneColumn {
  int col;
  bool has;
  float scale, dg, db, nx, nd, xh, g, d;
};

template <class P>
__device__ __forceinline__ LoneColumn lone_column(const P* gamma, int col, bool has, bool zero_centered) {
  LoneColumn e{col, has, 1.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (has) {
    float s[1];
    load_scale<1>(gamma, col, zero_centered, s);
    e.scale = s[0];
  }
  return e;
}

// Loads the element's x and dy of the row from `start` (`in`: it exists).
template <class T>
__device__ __forceinline__ void lone_load(LoneColumn& e, bool in, const BwdArgs& a, int64_t start) {
  if (!in) return;
  e.nx = to_float(static_cast<const T*>(a.x)[start + e.col]);
  e.nd = to_float(static_cast<const T*>(a.dy)[start + e.col]);
}

// The element's part of the row sums and of dgamma/dbeta, from the x and dy
// loaded last (`in`: the row is valid and the element exists). Centred rows
// (kCentred) add to dgamma in lone_dx, after the row's shift is known.
template <NormKind K, class T>
__device__ __forceinline__ void lone_sums(LoneColumn& e, bool in, float mean, float rstd, float (&acc)[3]) {
  e.xh = e.g = e.d = 0.f;
  if (!in) return;
  e.xh = (e.nx - mean) * rstd;
  e.g = e.nd * e.scale;
  e.d = e.nd;
  acc[0] += e.g * e.xh;
  acc[1] += e.g;
  acc[2] += e.xh;
  if constexpr (!kCentred<K, T>) e.dg += e.nd * e.xh;
  if constexpr (K == NormKind::kLayer) e.db += e.nd;
}

// The element's dx, in the row from `start` (a valid row).
template <NormKind K, class T>
__device__ __forceinline__ void lone_dx(const BwdArgs& a, LoneColumn& e, int64_t start, float rstd, RowCoefs c) {
  if (!e.has) return;
  if constexpr (kCentred<K, T>) {
    e.xh += c.nb;
    e.dg += e.d * e.xh;
  }
  float out[1] = {rstd * (e.g - c.c2 - e.xh * c.c1)};
  if (a.dh) add_dh<1, T>(a, start + e.col, out);
  store_pack<1>(static_cast<T*>(a.dx) + start + e.col, out);
}

__device__ __forceinline__ void lone_store(const LoneColumn& e, float* wg, float* wb) {
  if (wg) wg[e.col] = e.dg;
  if (wb) wb[e.col] = e.db;
}

// The plain backward of rows whose width is not a multiple of a 16-byte pack
// (x, dy, dx and dh 16-byte aligned), as fwd_unaligned takes their forward:
// each row's elements before its first 16-byte boundary (`head`) and after
// its last (`tail`) one by one in the row's first 2 * VEC threads, the rest
// in 16-byte packs, ITEMS a thread. Each thread keeps its columns' dgamma/
// dbeta sums over the slot's rows: a slot walks rows `l.used` apart, and the
// launcher makes l.used * hidden a multiple of the pack, so that every row
// of a slot starts at the same offset from a 16-byte boundary and each
// thread keeps the same columns. The slot's sums are stored one float at a
// time, once.
//
// The sums sit in shared memory beside the scales (each thread reads and
// writes only its own), and a thread takes a head or a tail element, not
// both, so that the plain instances fit 96 registers and two CTAs of 288-320
// threads share an SM. The plan sizes a row by its whole packs, hidden / VEC.
// Each row's x, dy and statistics are loaded while the row before is reduced
// and written (docs/tuning.md, unaligned-plan).
//
// ITEMS: the packs a thread holds: kRegItems, kUnalignedWideItems or
// kUnalignedWidestItems in one CTA (plan: unaligned-wide-items,
// unaligned-four-from-packs).
//
// CLUSTERED: rows wider than one CTA takes (up to 32775 elements of 16-bit
// x). A slot is then a cluster of `cluster_size` (2-4) one-row CTAs, each
// with its own range of the row's packs; the row sums go through
// ClusterPush, and rank 0 takes the head and tail. It is an instance of its
// own: with the cluster size a run-time value the plain widths lost
// (unaligned-max-cluster).
template <NormKind K, class T, class P, bool CLUSTERED, int ITEMS>
__global__ void __maxnreg__(CLUSTERED ? 112 : ITEMS == 2 ? 96 : 128)
    bwd_unaligned(BwdArgs a, SlotLayout l, int cluster_size) {
  constexpr int VEC = 16 / sizeof(T);
  const int cluster = CLUSTERED ? cluster_size : 1;
  using Vec = Pack<T, VEC>;
  __shared__ float smem[kRowSumSmem];
  __shared__ alignas(8) float xchg[2][kMaxCluster][kGradSums<K, T>];
  __shared__ alignas(8) uint64_t pushed[2];
  const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
  const int64_t group_row0 = static_cast<int64_t>(blockIdx.y) * rpg;
  // A slot is a row of threads of a CTA, or a cluster of one-row CTAs, each
  // CTA (`rank`) holding its own range of the row's packs.
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t slot0 = static_cast<int64_t>(blockIdx.x / cluster) * blockDim.y;  // the CTA's first slot
  const int64_t slot = slot0 + threadIdx.y;
  const auto [head, body, tail] = cut_row<VEC>((group_row0 + slot) * H, H);  // the same on each of the slot's rows
  const int tid = static_cast<int>(threadIdx.x), tpr = static_cast<int>(blockDim.x);
  const int first = rank * tpr * ITEMS;  // the CTA's first pack
  auto pack = [&](int i) { return first + tid + i * tpr; };  // the row's pack that item i holds
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + blockIdx.y * H : nullptr;
  ClusterPush<kGradSums<K, T>> exchange(xchg, pushed, cluster, rank);

  // The thread's columns' effective scale and dgamma (dbeta) sums, in shared
  // memory (the registers have no room for them): float4 q of pack i of
  // array `arr` (kScale, kDg, kDb) at
  // cols[(((arr * rpb + threadIdx.y) * ITEMS + i) * VEC / 4 + q) * tpr + tid],
  // used by this thread alone.
  extern __shared__ float4 cols[];
  const int rpb = static_cast<int>(blockDim.y);
  auto col_at = [&](int arr, int i, int q) -> float4& {
    return cols[(((arr * rpb + static_cast<int>(threadIdx.y)) * ITEMS + i) * (VEC / 4) + q) * tpr + tid];
  };
  enum { kScale, kDg, kDb };
  auto read_cols = [&](int arr, int i, float(&v)[VEC]) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      const float4 f = col_at(arr, i, q);
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  };
  auto write_cols = [&](int arr, int i, const float(&v)[VEC]) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) col_at(arr, i, q) = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  };
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int p = pack(i);
    float sc[VEC], zero[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      sc[j] = 1.f;
      zero[j] = 0.f;
      // Element by element: gamma's packs are not aligned to these columns.
      if (p < body) {
        float one[1];
        load_scale<1>(gamma, head + p * VEC + j, a.zero_centered, one);
        sc[j] = one[0];
      }
    }
    write_cols(kScale, i, sc);
    write_cols(kDg, i, zero);
    if constexpr (K == NormKind::kLayer) write_cols(kDb, i, zero);
  }
  // The head and tail elements: the first threads of rank 0.
  // Threads [0, head) of rank 0 take the head's elements, threads
  // [VEC, VEC + tail) the tail's: one such element a thread at most (the
  // launcher gives a row at least 2 * VEC threads).
  const bool takes_tail = tid >= VEC;
  const int lone = takes_tail ? tid - VEC : tid;  // the element's index in the head or tail
  LoneColumn e = lone_column(gamma, takes_tail ? head + body * VEC + lone : lone,
                             rank == 0 && lone < (takes_tail ? tail : head), a.zero_centered);

  // The current row's packs and the next row's, as stored, and the next
  // row's statistics.
  Vec cx[ITEMS], cd[ITEMS], nx[ITEMS], nd[ITEMS];
  float next_rstd = 0.f, next_mean = 0.f;
  auto load_row = [&](int64_t r) {
    const bool in = r < rpg;
    const int64_t start = (group_row0 + r) * H;
    if (in) {
      next_rstd = a.rstd[group_row0 + r];
      if constexpr (K == NormKind::kLayer) next_mean = a.mean[group_row0 + r];
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = pack(i);
      if (in && p < body) {
        load_raw(static_cast<const T*>(a.x) + start + head + p * VEC, nx[i]);
        load_raw(static_cast<const T*>(a.dy) + start + head + p * VEC, nd[i]);
      }
    }
    lone_load<T>(e, in && e.has, a, start);
  };
  load_row(slot);

  // Every thread of the block runs the same number of iterations (row_sum
  // holds barriers); rows past the group's end are masked.
  int buf = 0;  // the exchange's buffer for this row
  for (int64_t base = slot0; base < rpg; base += l.used, buf ^= 1) {
    const int64_t r = base + threadIdx.y;
    const bool valid = r < rpg;
    const int64_t row = group_row0 + r;
    const float rstd = valid ? next_rstd : 0.f;
    const float mean = valid ? next_mean : 0.f;

    float acc[3] = {0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      cx[i] = nx[i];
      cd[i] = nd[i];
      if (valid && pack(i) < body) {
        float xv[VEC], d[VEC], sc[VEC];
        unpack(cx[i], xv);
        unpack(cd[i], d);
        read_cols(kScale, i, sc);
        add_grad_sums_of<VEC>(acc, xv, d, sc, mean);
      }
    }
    grad_sums_scaled(acc, rstd);
    lone_sums<K, T>(e, valid && e.has, mean, rstd, acc);
    load_row(r + l.used);  // in flight during the reduction and the stores
    grad_row_sums<K, T>(acc, smem, CLUSTERED ? &exchange : nullptr, buf);
    const RowCoefs c = row_coefs<K, T>(a, row, valid, acc);
    if (!valid) continue;
    T* dx = static_cast<T*>(a.dx) + row * H;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = pack(i);
      if (p < body) {
        const int col = head + p * VEC;
        float xv[VEC], d[VEC], sc[VEC], out[VEC], dg[VEC], db[VEC];
        unpack(cx[i], xv);
        unpack(cd[i], d);
        read_cols(kScale, i, sc);
        read_cols(kDg, i, dg);
        if constexpr (K == NormKind::kLayer) read_cols(kDb, i, db);
        grad_dx<K, T>(out, dg, db, xv, d, sc, mean, rstd, c);
        write_cols(kDg, i, dg);
        if constexpr (K == NormKind::kLayer) write_cols(kDb, i, db);
        if (a.dh) add_dh<VEC, T>(a, row * H + col, out);
        store_pack<VEC>(dx + col, out);
      }
    }
    lone_dx<K, T>(a, e, row * H, rstd, c);
  }

  if (CLUSTERED) cluster_done();
  if (a.workspace == nullptr || slot >= l.used) return;
  float* wg = a.dgamma ? slot_row(a, l, slot, 0) : nullptr;
  float* wb = K == NormKind::kLayer && a.dbeta ? slot_row(a, l, slot, a.dgamma ? 1 : 0) : nullptr;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int p = pack(i);
    if (p < body) {
      float dg[VEC], db[VEC];
      read_cols(kDg, i, dg);
      if constexpr (K == NormKind::kLayer) read_cols(kDb, i, db);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (wg) wg[head + p * VEC + j] = dg[j];
        if (wb) wb[head + p * VEC + j] = db[j];
      }
    }
  }
  if (e.has) lone_store(e, wg, wb);
}

}  // namespace
}  // namespace jrn::cuda
