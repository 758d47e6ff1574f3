// fwd_columns: the per-group output's columnwise copy q_t (transpose=True),
// after the rowwise kernel has written the rows' statistics (and h): y again
// from x (or h), quantized down each column in groups of group_size rows by
// the group's scale rule, into q_t (tensors, hidden, rows per tensor) and
// its scales (tensors, hidden, rows per tensor / group_size).
//
// A CTA takes a tile of kColumnTileRows rows (of one tensor) by
// kColumnTileCols columns. It reads the tile along its rows in 16-byte packs
// and keeps y in shared memory as float32; then a thread takes a run of one
// column's rows (whole groups, about the 32-byte sector a store fills),
// finds each group's scale and writes the run's codes, which lie
// consecutively in q_t's row for that column.
#pragma once

#include "../common/block_scale.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

constexpr int kColumnThreads = 256;
constexpr int kColumnTileRows = 128;
constexpr int kColumnTileCols = 64;

template <NormKind K, class T, class P>
__global__ void __launch_bounds__(kColumnThreads) fwd_columns(FwdArgs a, int tiles_per_tensor, bool packs) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int kPitch = kColumnTileCols + 1;  // a column's floats fall in distinct banks
  __shared__ float tile[kColumnTileRows * kPitch];

  const int64_t H = a.shape.hidden, R = a.rows_per_tensor(), G = a.group_size;
  const int64_t t = blockIdx.x / tiles_per_tensor;
  const int64_t r_in = static_cast<int64_t>(blockIdx.x % tiles_per_tensor) * kColumnTileRows;  // in tensor t
  const int64_t r0 = t * R + r_in;                                                          // of all rows
  const int n_rows = static_cast<int>(R - r_in < kColumnTileRows ? R - r_in : kColumnTileRows);             // whole groups
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

  // A thread a run of one column's rows: whole groups, 32 bytes of codes (64
  // rows of NVFP4) where the group size divides that, else as many whole
  // groups as fit in it (one at least), as far as the tile has rows.
  const bool nvfp4 = a.group_scale == GroupScale::kNvfp4;
  const int min_run = nvfp4 ? 64 : 32;
  const int run = static_cast<int>(G >= min_run ? G : (min_run / G) * G);
  const int runs = (n_rows + run - 1) / run;
  const GroupGlobal global = group_global(a, r0);
  for (int i = threadIdx.x; i < runs * kColumnTileCols; i += kColumnThreads) {
    const int c = i % kColumnTileCols, first = (i / kColumnTileCols) * run;
    if (c >= n_cols) continue;
    const int64_t qrow = t * H + c0 + c;  // q_t's row
    const int last = min(first + run, n_rows);
    for (int g0 = first; g0 < last; g0 += static_cast<int>(G)) {
      float gm = 0.f;
      for (int r = g0; r < g0 + G; ++r) gm = max_abs(gm, tile[r * kPitch + c]);
      const int64_t group = qrow * (R / G) + (r_in + g0) / G;
      const GroupCode code = group_scale(a, a.qt_scales, group, gm, global);
      auto codes = [&]<int N>(std::integral_constant<int, N>) {
        for (int r = g0; r < g0 + G; r += N) {
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
  if (a.group_size % (a.group_scale == GroupScale::kNvfp4 ? 8 : 4) != 0)
    return ffi::Error::InvalidArgument("jax_rmsnorm: fwd_columns needs groups of a multiple of 4 rows (8 for NVFP4)");
  const int64_t tiles = (a.rows_per_tensor() + kColumnTileRows - 1) / kColumnTileRows;
  const int64_t blocks = tiles * std::max<int64_t>(1, a.tensors);
  const int64_t chunks = (a.shape.hidden + kColumnTileCols - 1) / kColumnTileCols;
  if (blocks > INT32_MAX || chunks > 65535)
    return ffi::Error::InvalidArgument("jax_rmsnorm: fwd_columns: too many rows or columns for one launch");
  constexpr int kVec = 16 / sizeof(T);
  const void* src = a.residual ? a.h : a.x;
  const bool packs = a.shape.hidden % kVec == 0 && aligned16(src) && params_aligned16(a);
  fwd_columns<K, T, P><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks)), kColumnThreads, 0,
                         stream>>>(a, static_cast<int>(tiles), packs);
  return check_launch("fwd_columns");
}

}  // namespace
}  // namespace jrn::cuda
