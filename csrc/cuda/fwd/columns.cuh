// fwd_columns: the per-group output's columnwise copy q_t (transpose=True),
// after the rowwise kernel has written the rows' statistics (and h): y again
// from x (or h), quantized down each column in groups of group_size rows by
// the group's scale rule, into q_t (tensors, hidden, rows per tensor) and
// its scales (tensors, hidden, rows per tensor / group_size).
//
// A CTA takes kColumnThreads consecutive columns of one group of rows, a
// thread a column: the rows' loads are coalesced across the warp, and each
// thread writes its column's codes of the group, consecutive bytes of q_t,
// four (eight NVFP4 codes) at a time. The group is read twice, for its max
// and for its codes; the second read is served by L1/L2.
#pragma once

#include "../common/block_scale.cuh"
#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

constexpr int kColumnThreads = 128;

template <NormKind K, class T, class P>
__global__ void __launch_bounds__(kColumnThreads) fwd_columns(FwdArgs a) {
  const int64_t H = a.shape.hidden, R = a.rows_per_tensor(), G = a.group_size;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * G;  // the group's first row (of all tensors')
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kColumnThreads + threadIdx.x;
  if (c >= H) return;
  const int64_t t = r0 / R;
  const float global = group_global(a, r0);

  // y of row r at column c, as the rowwise kernels make it from the stored
  // statistics: (x - mean) * rstd * scale (+ beta), of h with a residual.
  auto y_at = [&](int64_t r) {
    const int64_t idx = r * H + c;
    float v;
    if (a.residual) {
      v = a.h_f32 ? static_cast<const float*>(a.h)[idx] : to_float(static_cast<const T*>(a.h)[idx]);
    } else {
      v = to_float(static_cast<const T*>(a.x)[idx]);
    }
    const int64_t poff = a.shape.param_offset(r);
    const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
    const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
    float y[1] = {v};
    scale_shift<1>(y, K == NormKind::kLayer ? a.mean[r] : 0.f, a.rstd[r], gamma, beta, c, a.zero_centered);
    return y[0];
  };

  float gm = 0.f;
  for (int64_t j = 0; j < G; ++j) gm = max_abs(gm, y_at(r0 + j));
  const int64_t col = t * H + c;  // q_t's row
  const GroupCode code = group_scale_to(a, a.qt_scales, col * (R / G) + (r0 - t * R) / G, gm, global);
  const int64_t first = col * R + (r0 - t * R);  // q_t's element of row r0
  if (a.group_scale == GroupScale::kNvfp4) {
    for (int64_t j = 0; j < G; j += 8) {  // groups of 16: eight codes, four bytes
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = y_at(r0 + j + k);
      store_codes<8>(a, a.qt, first + j, v, global, code);
    }
  } else {
    for (int64_t j = 0; j < G; j += 4) {  // groups a multiple of 4 (the plan's condition)
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = y_at(r0 + j + k);
      store_codes<4>(a, a.qt, first + j, v, global, code);
    }
  }
}

// Launches fwd_columns over every group of rows and column.
template <NormKind K, class T, class P>
ffi::Error launch_columns(cudaStream_t stream, const FwdArgs& a) {
  if (a.shape.rows == 0 || a.shape.hidden == 0) return ffi::Error::Success();
  if (a.group_size % (a.group_scale == GroupScale::kNvfp4 ? 8 : 4) != 0)
    return ffi::Error::InvalidArgument("jax_rmsnorm: fwd_columns needs groups of a multiple of 4 rows (8 for NVFP4)");
  const int64_t blocks = a.shape.rows / a.group_size;
  const int64_t chunks = (a.shape.hidden + kColumnThreads - 1) / kColumnThreads;
  if (blocks > INT32_MAX || chunks > 65535)
    return ffi::Error::InvalidArgument("jax_rmsnorm: fwd_columns: too many rows or columns for one launch");
  fwd_columns<K, T, P><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(chunks)), kColumnThreads, 0,
                         stream>>>(a);
  return check_launch("fwd_columns");
}

}  // namespace
}  // namespace jrn::cuda
