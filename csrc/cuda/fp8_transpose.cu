// The FP8 transpose: out[b, c, r] = in[b, r, c] for bytes, the transposed copy
// q_t that current scaling returns for the next matmul's backward.
//
// transpose16: rows and columns multiples of 16 (the shapes of LLM
// activations). A CTA moves a tile of 128 x 128 bytes: 16-byte loads of the
// input's rows into shared memory, then each thread reads a 16 x 4 block of
// 32-bit words (16 input rows, 4 columns), turns it into 4 x 16 with byte
// permutes (8 PRMT per 4 x 4 block) and writes four 16-byte pieces of output
// rows; the 8 lanes that share output rows write a whole 128-byte line. The
// tile's word columns are XOR-swizzled with the row's 16-row block, so that
// those 8 lanes, reading 8 different 16-row blocks of one column, hit
// different banks.
//
// transpose1: any other shape, a byte at a time through a 32 x 33 tile.
#include "device_utils.cuh"
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

__global__ void __launch_bounds__(kVThreads) transpose16(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols) {
  __shared__ uint4 tile[kVT][kWords / 4];  // [row][16-byte piece], pieces swizzled by (row / 16) % 8
  const int64_t off = static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kVT;
  const int t = static_cast<int>(threadIdx.x);
  // Output side: word column w (columns 4w..4w+3 of the tile), rows 16 rb..16 rb + 15.
  const int rb = t & 7, w = (t >> 5) * 4 + ((t >> 3) & 3);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kVT; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kVT) {
#pragma unroll
    for (int i = 0; i < kVT * kVT / 16 / kVThreads; ++i) {
      const int v = i * kVThreads + t, r = v / (kVT / 16), piece = v % (kVT / 16);
      const int64_t gr = r0 + r, gc = c0 + piece * 16;
      if (gr < rows && gc < cols)
        tile[r][piece ^ ((r >> 4) & 7)] = *reinterpret_cast<const uint4*>(in + off + gr * cols + gc);
    }
    __syncthreads();
    const int64_t gc = c0 + 4 * w, gr = r0 + 16 * rb;
    if (gc < cols && gr < rows) {  // both multiples of 16: a block is all in or all out
      const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
      uint32_t x[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int r = 16 * rb + j;
        x[j] = words[r * kWords + (((w >> 2) ^ rb) << 2) + (w & 3)];
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
      for (int b = 0; b < 4; ++b)
        *reinterpret_cast<uint4*>(out + off + (gc + b) * rows + gr) = make_uint4(o[b][0], o[b][1], o[b][2], o[b][3]);
    }
    __syncthreads();  // the tile is rewritten next
  }
}

constexpr int kTile = 32, kTileRows = 8;

__global__ void __launch_bounds__(kTile* kTileRows)
    transpose1(const uint8_t* in, uint8_t* out, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t off = static_cast<int64_t>(blockIdx.z) * rows * cols;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = in[off + r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[off + c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // the tile is rewritten next
  }
}

}  // namespace

ffi::Error launch_transpose8(cudaStream_t stream, const void* in, void* out, int64_t batch, int64_t rows,
                             int64_t cols) {
  if (batch > 65535) return ffi::Error::InvalidArgument("jax_rmsnorm: the transpose is too large");
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const bool vec = rows % 16 == 0 && cols % 16 == 0 && aligned16(in) && aligned16(out);
  const int tile = vec ? kVT : kTile;
  const int64_t tiles_c = (cols + tile - 1) / tile, tiles_r = (rows + tile - 1) / tile;
  if (tiles_c > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: the transpose is too large");
  const dim3 grid(static_cast<unsigned>(tiles_c), static_cast<unsigned>(std::min<int64_t>(tiles_r, 65535)),
                  static_cast<unsigned>(batch));
  if (vec) {
    transpose16<<<grid, kVThreads, 0, stream>>>(src, dst, rows, cols);
    return check_launch("transpose16");
  }
  transpose1<<<grid, dim3(kTile, kTileRows), 0, stream>>>(src, dst, rows, cols);
  return check_launch("transpose1");
}

}  // namespace jrn::cuda
