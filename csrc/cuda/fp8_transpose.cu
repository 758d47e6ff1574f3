// The FP8 transpose: out[b, c, r] = in[b, r, c] for bytes, the transposed copy
// q_t that current scaling returns for the next matmul's backward; and
// quantize_tiles, current scaling's quantizing pass, which writes q and q_t
// together through transpose16's tiles (below).
//
// transpose16: columns a multiple of 16 and rows of 4 (the shapes of LLM
// activations: a hidden size in sixteens, tokens in fours). A CTA moves a
// tile of 128 x 128 bytes: 16-byte loads of the input's rows into shared
// memory, then each thread reads a 16 x 4 block of
// 32-bit words (16 input rows, 4 columns), turns it into 4 x 16 with byte
// permutes (8 PRMT per 4 x 4 block) and writes four 16-byte pieces of output
// rows; the 8 lanes that share output rows write a whole 128-byte line. The
// tile's word columns are XOR-swizzled with the row's 16-row block, so that
// those 8 lanes, reading 8 different 16-row blocks of one column, hit
// different banks.
//
// transpose1: any other shape, a byte at a time through a 64 x 64 tile.
#include "common/async_copy.cuh"
#include "common/cluster.cuh"
#include "common/fp8.cuh"
#include "common/launch.cuh"
#include "common/norm_math.cuh"
#include "common/reduce.cuh"
#include "common/vec_io.cuh"
#include "launch.h"

namespace jrn::cuda {
namespace {

constexpr int kVT = 128;        // transpose16's tile: rows and columns (bytes)
constexpr int kVThreads = 256;  // its threads: 32 word columns x 8 blocks of 16 rows
constexpr int kWords = kVT / 4;

// Bytes b of w0..w3 as one word (byte j from w_j), for b = 0..3.
__device__ __forceinline__ void transpose4x4(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t (&o)[4]) {
  const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
  const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
  o[0] = __byte_perm(lo01, lo23, 0x5410);
  o[1] = __byte_perm(lo01, lo23, 0x7632);
  o[2] = __byte_perm(hi01, hi23, 0x5410);
  o[3] = __byte_perm(hi01, hi23, 0x7632);
}

// A tile of 128 x 128 bytes: [row][16-byte piece], pieces swizzled by (row / 16) % 8.
using Tile = uint4[kVT][kWords / 4];

__device__ __forceinline__ uint4& tile_piece(Tile& tile, int r, int piece) { return tile[r][piece ^ ((r >> 4) & 7)]; }

// The tile (rows r0.., columns c0.. of a rows x cols byte matrix) written
// transposed to `out` (cols x rows), by thread t of kVThreads. cols is a
// multiple of 16 and rows of 4 S: each output row starts on a 4 S-byte
// boundary (S = 4, 2 or 1: rows % 16, 8 or 4 == 0), and the 16 bytes a
// thread writes there go in 4 / S stores, up to the matrix's end (the last
// 16-row block may be cut there, after a multiple of 4 S rows).
template <int S>
__device__ __forceinline__ void store_transposed(const Tile& tile, uint8_t* out, int64_t rows, int64_t cols,
                                                 int64_t r0, int64_t c0, int t) {
  static_assert(S == 4 || S == 2 || S == 1, "store_transposed: 1, 2 or 4 words a store");
  // Word column w (columns 4w..4w+3 of the tile), rows 16 rb..16 rb + 15.
  const int rb = t & 7, w = (t >> 5) * 4 + ((t >> 3) & 3);
  const int64_t gc = c0 + 4 * w, gr = r0 + 16 * rb;
  if (gc >= cols || gr >= rows) return;  // a multiple of 16 columns: a word column is all in or all out
  const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
  uint32_t x[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int r = 16 * rb + j;
    x[j] = words[r * kWords + (((w >> 2) ^ rb) << 2) + (w & 3)];  // tile_piece's swizzle: (r >> 4) & 7 == rb
  }
  uint32_t o[4][4];  // [column b][word k]: rows 4k..4k+3 of column 4w + b
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint32_t p[4];
    transpose4x4(x[4 * k], x[4 * k + 1], x[4 * k + 2], x[4 * k + 3], p);
#pragma unroll
    for (int b = 0; b < 4; ++b) o[b][k] = p[b];
  }
#pragma unroll
  for (int b = 0; b < 4; ++b) {
#pragma unroll
    for (int k = 0; k < 4; k += S) {
      if (S == 4 || gr + 4 * k < rows)
        store_words<S>(out + (gc + b) * rows + gr + 4 * k, *reinterpret_cast<const uint32_t(*)[S]>(&o[b][k]));
    }
  }
}

// Words a store of the transposed rows (plan.h).
using plan::transposed_store_words;

template <int S>
__global__ void __launch_bounds__(kVThreads) transpose16(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols) {
  __shared__ Tile tile;
  const int64_t off = static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVT;
  const int t = static_cast<int>(threadIdx.x);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVT; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kVT) {
#pragma unroll
    for (int i = 0; i < kVT * kVT / 16 / kVThreads; ++i) {
      const int v = i * kVThreads + t, r = v / (kVT / 16), piece = v % (kVT / 16);
      const int64_t gr = r0 + r, gc = c0 + piece * 16;
      if (gr < rows && gc < cols) tile_piece(tile, r, piece) = *reinterpret_cast<const uint4*>(in + off + gr * cols + gc);
    }
    __syncthreads();
    store_transposed<S>(tile, out + off, rows, cols, r0, c0, t);
    __syncthreads();  // the tile is rewritten next
  }
}

// Current scaling's quantizing pass on the statistics its measuring pass
// wrote (a.mean, a.rstd) and scale_inv in a.amax: q = saturate(y /
// scale_inv[t]) row-major into a.y and, with TR > 0, through the tile
// transposed into a.qt, for each tensor t (blockIdx.z) of rows_per_tensor()
// rows. x is read once and q's bytes are not read back, as they are when the
// transpose runs after the quantizing pass. Thread t holds 16 columns of the
// tile (piece t % 8) in 4 of its rows, loaded together; hidden is a multiple
// of 16. TR: no q_t (0), or store_transposed's words a store (the rows of a
// tensor a multiple of 4 TR).
template <NormKind K, class T, class P, int TR>
__global__ void __launch_bounds__(kVThreads, sizeof(T) == 2 ? 3 : 2) quantize_tiles(FwdArgs a) {
  __shared__ Tile tile;
  // The tile's columns' scale (gamma, 1 + gamma or 1) and shift (beta or 0),
  // read from here by each row: held in registers they cost a CTA an SM.
  __shared__ float scale_of[kVT], shift_of[kVT];
  constexpr int kRowsPerPass = kVThreads / (kVT / 16), kRowsEach = kVT / kRowsPerPass;
  const int64_t H = a.shape.hidden, rows = a.rows_per_tensor();
  const int64_t tensor = blockIdx.z, c0 = static_cast<int64_t>(blockIdx.x) * kVT;
  const int t = static_cast<int>(threadIdx.x), piece = t % (kVT / 16), r_first = t / (kVT / 16);
  const int64_t col = c0 + 16 * piece;
  const bool col_in = col < H;
  const float mul = 1.f / a.amax[tensor];
  const int64_t base = tensor * rows * H;
  const T* x = static_cast<const T*>(a.x) + base;
  uint8_t* q = static_cast<uint8_t*>(a.y) + base;
  if (t < kVT) {
    const int64_t poff = a.shape.param_offset(tensor * rows);  // a tensor's rows share their parameters
    const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
    const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
    float sc[1] = {1.f}, sh = 0.f;
    if (c0 + t < H) {
      load_scale<1>(gamma, c0 + t, a.zero_centered, sc);
      if (beta) sh = to_float(beta[c0 + t]);
    }
    scale_of[t] = sc[0];
    shift_of[t] = sh;
  }
  __syncthreads();
  const float* mean_of = K == NormKind::kLayer ? a.mean + tensor * rows : nullptr;
  const float* rstd_of = a.rstd + tensor * rows;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVT; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kVT) {
    // The rows' x as loaded (widened one row at a time, below): all in flight together.
    Pack<T, 16> raw[kRowsEach];
    bool in[kRowsEach];
#pragma unroll
    for (int i = 0; i < kRowsEach; ++i) {
      const int64_t gr = r0 + r_first + i * kRowsPerPass;
      in[i] = col_in && gr < rows;
      if (in[i]) load_raw(x + gr * H + col, raw[i]);
    }
#pragma unroll
    for (int i = 0; i < kRowsEach; ++i) {
      if (!in[i]) continue;
      const int r = r_first + i * kRowsPerPass;
      const float mean = K == NormKind::kLayer ? mean_of[r0 + r] : 0.f, rstd = rstd_of[r0 + r];
      float v[16];
      unpack(raw[i], v);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        v[j] = (v[j] - mean) * rstd * scale_of[16 * piece + j];
        if constexpr (K == NormKind::kLayer) v[j] += shift_of[16 * piece + j];
        v[j] *= mul;
      }
      uint32_t w[4];
      fp8_words<16>(v, a.fp8, w);
      store_words<4>(q + (r0 + r) * H + col, w);
      if constexpr (TR) tile_piece(tile, r, piece) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if constexpr (TR) {
      __syncthreads();
      store_transposed<TR>(tile, static_cast<uint8_t*>(a.qt) + base, rows, H, r0, c0, t);
      __syncthreads();  // the tile is rewritten next
    }
  }
}

// Tiles of a batch of rows x cols matrices: (column tiles, row tiles, batch).
inline ffi::Error tile_grid(int64_t batch, int64_t rows, int64_t cols, int tile, dim3* grid) {
  const int64_t tiles_c = ceil_div(cols, tile), tiles_r = ceil_div(rows, tile);
  if (batch > 65535 || tiles_c > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: the transpose is too large");
  *grid = dim3(static_cast<unsigned>(tiles_c), static_cast<unsigned>(std::min<int64_t>(tiles_r, 65535)),
               static_cast<unsigned>(batch));
  return ffi::Error::Success();
}

// transpose1's tile: 64 x 64 bytes, moved by 32 x 8 threads, 16 bytes each
// way. The bytes a thread loads are all in flight before any is stored: a
// byte at a time, it takes that many for the loads to keep HBM busy. The
// tile's rows are padded to 17 words, so that the 32 lanes reading down one
// of its columns read 32 different banks.
constexpr int kTile = 64, kTileRows = 8, kTilePitch = kTile + 4;
constexpr int kTileEach = kTile / kTileRows * (kTile / 32);

__global__ void __launch_bounds__(32 * kTileRows, 5)
    transpose1(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTilePitch];
  const int64_t off = static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int cn = static_cast<int>(std::min<int64_t>(kTile, cols - c0));  // the tile's columns in the matrix
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    const int rn = static_cast<int>(std::min<int64_t>(kTile, rows - r0));  // and its rows
    const uint8_t* src = in + off + r0 * cols + c0;
    uint8_t v[kTileEach];
#pragma unroll
    for (int i = 0; i < kTileEach; ++i) {  // row ty + 8 (i / 2), column tx + 32 (i % 2)
      const int r = ty + kTileRows * (i / 2), c = tx + 32 * (i % 2);
      if (r < rn && c < cn) v[i] = src[static_cast<int64_t>(r) * cols + c];
    }
#pragma unroll
    for (int i = 0; i < kTileEach; ++i) tile[ty + kTileRows * (i / 2)][tx + 32 * (i % 2)] = v[i];
    __syncthreads();
    uint8_t* dst = out + off + c0 * rows + r0;
#pragma unroll
    for (int i = 0; i < kTileEach; ++i) {  // output row (the input's column) ty + 8 (i / 2), byte tx + 32 (i % 2)
      const int c = ty + kTileRows * (i / 2), r = tx + 32 * (i % 2);
      if (r < rn && c < cn) dst[static_cast<int64_t>(c) * rows + r] = tile[r][c];
    }
    __syncthreads();  // the tile is rewritten next
  }
}

}  // namespace

ffi::Error launch_transpose8(cudaStream_t stream, const void* in, void* out, int64_t batch, int64_t rows,
                             int64_t cols) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const int words = transposed_store_words(rows);
  const bool vec = words > 0 && cols % 16 == 0 && aligned16(in) && aligned16(out);
  dim3 grid;
  JRN_RETURN_IF_ERROR(tile_grid(batch, rows, cols, vec ? kVT : kTile, &grid));
  if (vec) {
    with_constant<4, 2, 1>(words, [&](auto s) {
      transpose16<decltype(s)::value><<<grid, kVThreads, 0, stream>>>(src, dst, rows, cols);
    });
    return check_launch("transpose16");
  }
  transpose1<<<grid, dim3(32, kTileRows), 0, stream>>>(src, dst, rows, cols);
  return check_launch("transpose1");
}

template <NormKind K, class T, class P>
ffi::Error launch_quantize_tiles(cudaStream_t stream, const FwdArgs& a) {
  dim3 grid;
  JRN_RETURN_IF_ERROR(tile_grid(a.tensors, a.rows_per_tensor(), a.shape.hidden, kVT, &grid));
  const int words = transposed_store_words(a.rows_per_tensor());
  if (a.qt) {
    with_constant<4, 2, 1>(words, [&](auto s) {
      quantize_tiles<K, T, P, decltype(s)::value><<<grid, kVThreads, 0, stream>>>(a);
    });
  } else if constexpr (K == NormKind::kRms) {
    quantize_tiles<K, T, P, 0><<<grid, kVThreads, 0, stream>>>(a);
  } else {
    return ffi::Error::Internal("jax_rmsnorm: quantize_tiles without q_t takes RMSNorm only");
  }
  return check_launch("quantize_tiles");
}

#define JRN_INSTANTIATE_QUANTIZE_TILES(K, T, P) \
  template ffi::Error launch_quantize_tiles<K, T, P>(cudaStream_t, const FwdArgs&);
JRN_FOR_EACH_INSTANCE(JRN_INSTANTIATE_QUANTIZE_TILES)

}  // namespace jrn::cuda
