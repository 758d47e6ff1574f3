// fwd_columns: the per-group output's columnwise copy q_t (transpose=True),
// after the rowwise kernel has written the rows' statistics (and h): y again
// from x (or h), quantized down each column in groups of group_size rows by
// the group's scale rule, into q_t (tensors, hidden, rows per tensor) and
// its scales (tensors, hidden, rows per tensor / group_size).
//
// A CTA takes a tile of whole groups of rows (of one tensor; the most that
// fit in kColumnMinRows, or one group where it is larger) by
// kColumnTileCols columns. It reads the tile along its rows in 16-byte packs
// and keeps y in shared memory as float32; then a thread takes a run of one
// column's rows whose codes fill about the 32-byte sector a store fills
// (whole groups where they are smaller; a part of a group where the group
// is a multiple of it, the parts' maxima meeting in shared memory), finds
// each group's scale and writes the run's codes, which lie consecutively in
// q_t's row for that column.
#pragma once

#include "../common/block_scale.cuh"
#include "../common/launch.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

constexpr int kColumnThreads = 256;
constexpr int kColumnTileCols = 64;
constexpr int kColumnPitch = kColumnTileCols + 1;  // a column's floats fall in distinct banks
constexpr int kColumnMinRows = 128;                // a tile's rows: the most whole groups in this, or one group
constexpr int kColumnMaxGroup = 256;               // (the Python checks refuse larger groups with transpose=True)

// The rows of a tile for groups of g rows, and the rows of a thread's run
// (the sector's 32 FP8 or 64 NVFP4 codes: whole groups where they are
// smaller, a part of a group where it is a multiple of it, else a group).
inline __host__ __device__ int column_tile_rows(int g) { return g >= kColumnMinRows ? g : kColumnMinRows / g * g; }
inline __host__ __device__ int column_run(int g, bool nvfp4) {
  const int sector = nvfp4 ? 64 : 32;
  return g <= sector ? sector / g * g : g % sector == 0 ? sector : g;
}
// Dynamic shared memory: the tile's y, then a float for each run of each
// column (the parts' maxima).
inline size_t column_smem(int g, bool nvfp4) {
  const int rows = column_tile_rows(g), run = column_run(g, nvfp4);
  return sizeof(float) * (static_cast<size_t>(rows) * kColumnPitch + (rows + run - 1) / run * kColumnTileCols);
}

template <NormKind K, class T, class P>
__global__ void __launch_bounds__(kColumnThreads) fwd_columns(FwdArgs a, int tiles_per_tensor, bool packs) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int kPitch = kColumnPitch;
  extern __shared__ float tile[];  // [tile_rows][kPitch]: y; then [runs][kColumnTileCols]: the runs' maxima

  const int64_t H = a.shape.hidden, R = a.rows_per_tensor();
  const int G = static_cast<int>(a.group_size);  // at most kColumnMaxGroup (the launcher)
  const bool nvfp4 = a.group_scale == GroupScale::kNvfp4;
  const int tile_rows = column_tile_rows(G);
  const int64_t t = blockIdx.x / tiles_per_tensor;
  const int64_t r_in = static_cast<int64_t>(blockIdx.x % tiles_per_tensor) * tile_rows;  // in tensor t
  const int64_t r0 = t * R + r_in;                                                      // of all rows
  const int n_rows = static_cast<int>(R - r_in < tile_rows ? R - r_in : tile_rows);  // whole groups
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kColumnTileCols;
  const int n_cols = static_cast<int>(H - c0 < kColumnTileCols ? H - c0 : kColumnTileCols);

  // y of the tile, as the rowwise kernels make it from the stored statistics:
  // (x - mean) * rstd * scale (+ beta), of h with a residual. Packs where
  // every row and parameter is aligned to them (`packs`, from the launcher),
  // else single elements.
  const void* src = a.residual ? a.h : a.x;
  const bool src_f32 = a.residual && a.h_f32;
  auto y_of = [&]<int N>(int r, int c, float (&v)[N]) {
    const int64_t row = r0 + r, col = c0 + c;
    if (src_f32) {
      load_pack<N>(static_cast<const float*>(src) + row * H + col, v);
    } else {
      load_pack<N>(static_cast<const T*>(src) + row * H + col, v);
    }
    const int64_t poff = a.shape.param_offset(row);
    const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
    const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
    scale_shift<N>(v, K == NormKind::kLayer ? a.mean[row] : 0.f, a.rstd[row], gamma, beta, col, a.zero_centered);
#pragma unroll
    for (int j = 0; j < N; ++j) tile[r * kPitch + c + j] = v[j];
  };
  if (packs) {
    constexpr int kPerRow = kColumnTileCols / VEC;
    const int n_packs = n_cols / VEC;
    for (int i = threadIdx.x; i < n_rows * kPerRow; i += kColumnThreads) {
      const int r = i / kPerRow, p = i % kPerRow;
      if (p < n_packs) {
        float v[VEC];
        y_of(r, p * VEC, v);
      }
    }
  } else {
    for (int i = threadIdx.x; i < n_rows * kColumnTileCols; i += kColumnThreads) {
      const int r = i / kColumnTileCols, c = i % kColumnTileCols;
      if (c < n_cols) {
        float v[1];
        y_of(r, c, v);
      }
    }
  }
  __syncthreads();

  // Item i: column i % kColumnTileCols, run i / kColumnTileCols (a warp's
  // lanes on 32 columns: distinct banks). A group of `parts` runs takes the
  // max of its runs' maxima, stored first; its first run stores the scale.
  const int run = column_run(G, nvfp4);
  const int parts = G > run ? G / run : 1;
  const int runs = (n_rows + run - 1) / run;
  float* const run_max = tile + tile_rows * kPitch;  // [runs][kColumnTileCols]
  auto max_of = [&](int c, int first, int last) {
    float gm = 0.f;
    for (int r = first; r < last; ++r) gm = max_abs(gm, tile[r * kPitch + c]);
    return gm;
  };
  if (parts > 1) {
    for (int i = threadIdx.x; i < runs * kColumnTileCols; i += kColumnThreads) {
      const int c = i % kColumnTileCols, first = (i / kColumnTileCols) * run;
      run_max[i] = c < n_cols ? max_of(c, first, first + run) : 0.f;
    }
    __syncthreads();
  }
  const GroupGlobal global = group_global(a, r0);
  const int step = min(G, run);  // rows a group covers in a run
  for (int i = threadIdx.x; i < runs * kColumnTileCols; i += kColumnThreads) {
    const int c = i % kColumnTileCols, k = i / kColumnTileCols, first = k * run;
    if (c >= n_cols) continue;
    const int64_t qrow = t * H + c0 + c;  // q_t's row
    const int last = min(first + run, n_rows);
    for (int g0 = first; g0 < last; g0 += step) {
      float gm = 0.f;
      if (parts > 1) {
        for (int p = k / parts * parts; p < (k / parts + 1) * parts; ++p)
          gm = max_abs(gm, run_max[p * kColumnTileCols + c]);
      } else {
        gm = max_of(c, g0, g0 + G);
      }
      const int64_t group = qrow * (R / G) + (r_in + g0) / G;
      const GroupCode code = group_scale(a, a.qt_scales, group, gm, global, k % parts == 0);
      auto codes = [&]<int N>(std::integral_constant<int, N>) {
        for (int r = g0; r < g0 + step; r += N) {
          float v[N];
#pragma unroll
          for (int j = 0; j < N; ++j) v[j] = tile[(r + j) * kPitch + c];
          store_codes<N>(a, a.qt, qrow * R + r_in + r, v, global, code);
        }
      };
      if (G % 8 == 0) {
        codes(std::integral_constant<int, 8>{});
      } else {  // FP8 codes in groups of a multiple of 4 rows (launch_columns)
        codes(std::integral_constant<int, 4>{});
      }
    }
  }
}

// Launches fwd_columns over every tile of rows (within each tensor) and of
// columns.
template <NormKind K, class T, class P>
ffi::Error launch_columns(cudaStream_t stream, const FwdArgs& a) {
  if (a.shape.rows == 0 || a.shape.hidden == 0) return ffi::Error::Success();
  const bool nvfp4 = a.group_scale == GroupScale::kNvfp4;
  if (a.group_size % (nvfp4 ? 8 : 4) != 0 || a.group_size > kColumnMaxGroup)
    return ffi::Error::InvalidArgument(
        "jax_rmsnorm: fwd_columns needs groups of a multiple of 4 rows (8 for NVFP4), at most " +
        std::to_string(kColumnMaxGroup));
  const int g = static_cast<int>(a.group_size);
  const int64_t tile_rows = column_tile_rows(g);
  const int64_t tiles = (a.rows_per_tensor() + tile_rows - 1) / tile_rows;
  const int64_t blocks = tiles * std::max<int64_t>(1, a.tensors);
  const int64_t chunks = (a.shape.hidden + kColumnTileCols - 1) / kColumnTileCols;
  if (blocks > INT32_MAX || chunks > 65535)
    return ffi::Error::InvalidArgument("jax_rmsnorm: fwd_columns: too many rows or columns for one launch");
  constexpr int kVec = 16 / sizeof(T);
  const void* src = a.residual ? a.h : a.x;
  const bool packs = a.shape.hidden % kVec == 0 && aligned16(src) && params_aligned16(a);
  // (a "cluster" of one CTA: a plain launch, its shared memory asked for)
  return launch_clustered(fwd_columns<K, T, P>, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks)),
                          dim3(kColumnThreads), column_smem(g, nvfp4), stream, 1, "fwd_columns", a,
                          static_cast<int>(tiles), packs);
}

}  // namespace
}  // namespace jrn::cuda
