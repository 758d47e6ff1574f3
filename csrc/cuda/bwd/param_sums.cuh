// dgamma/dbeta after the dx kernel: bwd_reduce over the slots' partial rows,
// or bwd_columns straight from x and dy.
#pragma once

#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

// dgamma/dbeta[g, col] = sum over the slots' partial rows, in a fixed order.
// One launch sums, for every column, the `n` rows first, first + step, ...,
// first + (n - 1) * step of each part (part p starts at slot p * part_rows):
// the first launch sums the slots in parts of kReduceRows rows and leaves each
// part's sum in the part's first row (in place: a CTA reads and writes only
// its own part and columns), the second adds those; with few slots one launch
// sums them all straight into dgamma/dbeta. Each thread loads its rows'
// CV-column packs all at once (a part is one round trip to memory, not one
// per row), then the threads of a column are added in a fixed tree.
struct ReduceStep {
  int64_t part_rows;  // the slot distance between parts (gridDim.z / outputs parts)
  int64_t step;       // the slot distance between the rows a part sums
  int64_t n;          // rows per part (the last part may have fewer)
  int64_t total;      // slots in use: rows at or past it are absent
  bool final;         // write dgamma/dbeta, not the part's first row
};

template <class P, int CV>
__global__ void __launch_bounds__(kReduceLanes* kReduceSplit) bwd_reduce(BwdArgs a, SlotLayout l, ReduceStep s) {
  __shared__ float part[kReduceSplit][CV][kReduceLanes + 1];
  early_launch_wait();  // launched early (reduce_slots): the slots are the previous kernel's
  const int64_t H = a.shape.hidden;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kReduceLanes + threadIdx.x) * CV;
  const int outs = a.param_outputs();
  const int out = static_cast<int>(blockIdx.z % outs);
  const int64_t first = static_cast<int64_t>(blockIdx.z / outs) * s.part_rows;
  float sum[CV] = {};
  if (col < H) {
    for (int64_t k0 = 0; k0 < s.n; k0 += kReduceSplit * kReduceUnroll) {
      float v[kReduceUnroll][CV];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        const int64_t k = k0 + u * kReduceSplit + threadIdx.y, slot = first + k * s.step;
        if (k < s.n && slot < s.total) {
          load_pack<CV>(slot_row(a, l, slot, out) + col, v[u]);
        } else {
#pragma unroll
          for (int j = 0; j < CV; ++j) v[u][j] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < CV; ++j) sum[j] += v[u][j];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < CV; ++j) part[threadIdx.y][j][threadIdx.x] = sum[j];
  __syncthreads();
#pragma unroll
  for (int half = kReduceSplit / 2; half > 0; half >>= 1) {
    if (threadIdx.y < half) {
#pragma unroll
      for (int j = 0; j < CV; ++j) part[threadIdx.y][j][threadIdx.x] += part[threadIdx.y + half][j][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y != 0 || col >= H) return;
  float total[CV];
#pragma unroll
  for (int j = 0; j < CV; ++j) total[j] = part[0][j][threadIdx.x];
  if (!s.final) {
    store_pack<CV>(slot_row(a, l, first, out) + col, total);
    return;
  }
  store_pack<CV>(static_cast<P*>(a.param_output(out)) + blockIdx.y * H + col, total);
}

// dgamma/dbeta straight from x and dy, for groups of few rows (the caller
// passes no workspace; see cuda_slots in _primitives.py). Each CTA owns
// kColLanes packs of columns; its kColSplit rows of threads take every
// kColSplit-th row, kColUnroll rows' loads in flight at once, and the CTA adds
// its rows of threads in shared memory, in a fixed order. At decode-time row
// counts this replaces the slots' float32 partials, as large as the gradient
// itself when every row is its own slot, and the one or two reduction passes
// over them.
template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kColLanes* kColSplit) bwd_columns(BwdArgs a) {
  constexpr int kCols = kColLanes * VEC;  // the CTA's columns
  __shared__ float part[2][kColSplit][kCols];
  const int64_t H = a.shape.hidden, rpg = a.shape.rows_per_group();
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * rpg;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const int64_t col = col0 + threadIdx.x * VEC;
  float dg[VEC] = {}, db[VEC] = {};
  if (col < H)
    add_column_sums<K, T, VEC, kColUnroll, int64_t>(a, row0, rpg, static_cast<int64_t>(threadIdx.y), kColSplit, col,
                                                    dg, db);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    part[0][threadIdx.y][threadIdx.x * VEC + j] = dg[j];
    if constexpr (K == NormKind::kLayer) part[1][threadIdx.y][threadIdx.x * VEC + j] = db[j];
  }
  __syncthreads();
  // One thread a column and output: the rows of threads in order.
  const int t = threadIdx.y * kColLanes + threadIdx.x, c = t % kCols, out = t / kCols;
  if (out < a.param_outputs() && col0 + c < H) {
    const float total = ordered_sum(&part[a.param_which(out)][0][c], kColSplit, kCols);
    static_cast<P*>(a.param_output(out))[blockIdx.y * H + col0 + c] = from_float<P>(total);
  }
  // Launched early (param_sums), it ran beside the dx kernel; it ends only
  // after that kernel has, so that what comes next sees dx.
  early_launch_wait();
}

}  // namespace
}  // namespace jrn::cuda
