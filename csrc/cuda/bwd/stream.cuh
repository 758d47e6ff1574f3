// bwd_stream: the backward's fallback, one CTA a slot.
#pragma once

#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::bwd;

// One CTA per slot, one row at a time, the row streamed twice. The slot's
// column sums live in its workspace row (each column always touched by the
// same thread, so no synchronization is needed for them).
template <NormKind K, class T, class P, int VEC>
__global__ void __launch_bounds__(kStreamThreads) bwd_stream(BwdArgs a, SlotLayout l) {
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden, nvec = H / VEC, rpg = a.shape.rows_per_group();
  const int64_t slot = blockIdx.x;
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + blockIdx.y * H : nullptr;
  const bool keep = a.workspace != nullptr;
  float* wg = keep && a.dgamma ? slot_row(a, l, slot, 0) : nullptr;
  float* wb = keep && a.dbeta ? slot_row(a, l, slot, a.dgamma ? 1 : 0) : nullptr;
  const float zero[VEC] = {};
  for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
    if (wg) store_pack<VEC>(wg + p * VEC, zero);
    if (wb) store_pack<VEC>(wb + p * VEC, zero);
  }

  for (int64_t r = slot; r < rpg; r += l.used) {
    const int64_t row = static_cast<int64_t>(blockIdx.y) * rpg + r;
    const T* x = static_cast<const T*>(a.x) + row * H;
    const T* dy = static_cast<const T*>(a.dy) + row * H;
    const float rstd = a.rstd[row];
    const float mean = K == NormKind::kLayer ? a.mean[row] : 0.f;
    float acc[3] = {0.f, 0.f, 0.f};
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x)
      add_grad_sums<VEC>(acc, x, dy, gamma, p * VEC, a.zero_centered, mean);
    grad_sums_scaled(acc, rstd);
    grad_row_sums<K, T>(acc, smem);
    const RowCoefs c = row_coefs<K, T>(a, row, true, acc);
    T* dx = static_cast<T*>(a.dx) + row * H;
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      float xv[VEC], d[VEC], s[VEC], out[VEC];
      load_pack<VEC>(x + p * VEC, xv);
      load_pack<VEC>(dy + p * VEC, d);
      load_scale<VEC>(gamma, p * VEC, a.zero_centered, s);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xh = kCentred<K, T> ? fmaf(xv[j] - mean, rstd, c.nb) : (xv[j] - mean) * rstd;
        out[j] = rstd * (d[j] * s[j] - c.c2 - xh * c.c1);
        xv[j] = d[j] * xh;  // reuse: this row's dgamma contribution
      }
      if (a.dh) add_dh<VEC, T>(a, row * H + p * VEC, out);
      store_pack<VEC>(dx + p * VEC, out);
      if (wg) add_to<VEC>(wg + p * VEC, xv);
      if (wb) add_to<VEC>(wb + p * VEC, d);
    }
  }
}

}  // namespace
}  // namespace jrn::cuda
