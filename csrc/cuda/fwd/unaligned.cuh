// fwd_unaligned: the forward without FP8, or with per-tensor or per-row FP8
// (with or without a residual), of rows whose width is not a multiple of a
// 16-byte pack (x and y or q themselves 16-byte aligned, and the residual and
// h). Each row then starts at its own offset from a 16-byte boundary: its
// elements before the first boundary (`head`, fewer than a pack) and after
// the last (`tail`) are taken one by one by the row's first threads, and the
// others in 16-byte packs, up to kRegItems a thread, held as fwd_regs holds
// a row. Gamma and beta, whose offset from the packs changes row to row, are
// loaded in the widest loads (of 4, 2 or 1 elements; L1 hits) that the row's
// offset keeps aligned. Rows in single elements throughout were bound by
// instructions (docs/tuning.md, unaligned-fits).
#pragma once

#include "common.cuh"

namespace jrn::cuda {
namespace {
using namespace ::jrn::fwd;

template <NormKind K, Quant Q, class T, class P>
__global__ void __launch_bounds__(kMaxRowThreads) fwd_unaligned(FwdArgs a) {
  static_assert(Q == Quant::kNone || Q == Quant::kTensor || Q == Quant::kRow, "fwd_unaligned: no per-group FP8");
  constexpr int VEC = 16 / sizeof(T);
  __shared__ float smem[kRowSumSmem];
  const int64_t H = a.shape.hidden;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < a.shape.rows;
  // Per-tensor FP8: the scale and amax loaded with x, as in fwd_regs.
  float tensor_scale = 0.f, amax_seen = 0.f;
  if (Q == Quant::kTensor && valid && !a.no_output) tensor_scale = a.scale[a.tensor_of(row)];
  if (Q == Quant::kTensor && valid && a.amax) amax_seen = load_seen(a.amax + a.tensor_of(row));
  const int64_t start = row * H;  // the row's first element
  auto [head, body, tail] = cut_row<VEC>(start, H);
  // An empty asm that the compiler cannot see through: the cut stays in three
  // registers rather than being worked out again at its uses.
  asm("" : "+r"(head), "+r"(body), "+r"(tail));
  const int tid = static_cast<int>(threadIdx.x);
  auto pack = [&](int i) { return tid + i * static_cast<int>(blockDim.x); };  // the row's pack that item i holds
  auto column = [&](int i) { return head + pack(i) * VEC; };                  // its first column
  const T* x = static_cast<const T*>(a.x) + start;
  // Thread t takes the head's element t and the tail's element t, where they
  // exist (the launcher gives a row at least VEC threads).
  const bool has_head = valid && tid < head, has_tail = valid && tid < tail;
  const int tail_col = head + body * VEC + tid;

  float v[kRegItems][VEC];
  bool in[kRegItems];
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    in[i] = valid && pack(i) < body;
    if (in[i]) {
      load_pack<VEC>(x + column(i), v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
  }
  float eh[1] = {0.f}, et[1] = {0.f};  // the head's element and the tail's
  if (has_head) load_pack<1>(x + tid, eh);
  if (has_tail) load_pack<1>(x + tail_col, et);
  if (a.residual) {  // h = x + residual, stored, then normalized as stored
    // A float32 residual or h lies on 32-byte boundaries where a 16-bit
    // row's packs lie on 16-byte ones: the same packs.
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) add_residual<VEC, T>(v[i], a.residual, a.residual_f32, start + column(i));
    }
    if (has_head) add_residual<1, T>(eh, a.residual, a.residual_f32, start + tid);
    if (has_tail) add_residual<1, T>(et, a.residual, a.residual_f32, start + tail_col);
    void* h = a.no_output ? nullptr : a.h;  // current scaling's measuring pass writes no h
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
      if (in[i]) store_h_as<VEC, T>(h, a.h_f32, start + column(i), v[i]);
    }
    if (has_head) store_h_as<1, T>(h, a.h_f32, start + tid, eh);
    if (has_tail) store_h_as<1, T>(h, a.h_f32, start + tail_col, et);
  }

  // RMSNorm: the sum of squares and its scaled twin (scaled_sq_of).
  // LayerNorm: the mean of the row's sum, then in one reduction the sum of
  // squares and (float32 x) the residue of the row centred on it; centred
  // again on the residue, the row loses nothing to the first sum's
  // rounding (RowMean).
  constexpr int kSq = K == NormKind::kLayer && sizeof(T) < 4 ? 1 : 2;
  float sq[kSq] = {};
  float mean = 0.f;
  if constexpr (K == NormKind::kLayer) {
    float sum[1] = {held_sum(v, eh[0] + et[0])};
    row_sum<1>(sum, smem);
    mean = sum[0] / static_cast<float>(H);
    center_held(v, in, mean);
    if (has_head) eh[0] -= mean;
    if (has_tail) et[0] -= mean;
    if constexpr (kSq == 2) sq[kSq - 1] = held_sum(v, eh[0] + et[0]);
    sq[0] = center_held(v, in, 0.f) + eh[0] * eh[0] + et[0] * et[0];
  } else {
    sq[0] = center_held(v, in, 0.f) + eh[0] * eh[0] + et[0] * et[0];  // zeros past the row
    sq[kSq - 1] = scaled_sq_of(sq[0], [&] {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) add_scaled_sq(s, v[i]);
      add_scaled_sq(s, eh);
      add_scaled_sq(s, et);
      return s;
    });
  }
  row_sum<kSq>(sq, smem);
  float rstd;
  if constexpr (K == NormKind::kLayer && kSq == 2) {
    const float rest = sq[kSq - 1] / static_cast<float>(H);
    center_held(v, in, rest);
    if (has_head) eh[0] -= rest;
    if (has_tail) et[0] -= rest;
    mean += rest;
    rstd = rsqrtf(fmaxf(sq[0] - sq[kSq - 1] * rest, 0.f) / static_cast<float>(H) + a.eps);
  } else if constexpr (K == NormKind::kLayer) {
    rstd = rsqrtf(sq[0] / static_cast<float>(H) + a.eps);
  } else {
    rstd = rms_rstd(sq[0], sq[kSq - 1], a.eps, H);
  }
  // With FP8 the rows past the end go on: their threads take part in the
  // warp's and the CTA's max below.
  if (Q == Quant::kNone && !valid) return;
  if (Q == Quant::kTensor && a.scale_inverted && valid && !a.no_output) tensor_scale = 1.f / tensor_scale;

  const int64_t poff = a.shape.param_offset(row);
  const P* gamma = a.gamma ? static_cast<const P*>(a.gamma) + poff : nullptr;
  const P* beta = K == NormKind::kLayer && a.beta ? static_cast<const P*>(a.beta) + poff : nullptr;
  // The packs' parameters in loads of W elements, the widest that the
  // parameters' offset from the packs (the same for every pack of the row)
  // keeps aligned: 4, 2 or 1.
  const auto params_at = reinterpret_cast<uintptr_t>(gamma ? gamma + head : nullptr) |
                         reinterpret_cast<uintptr_t>(beta ? beta + head : nullptr);
  const int width = param_width<P>(params_at);
#pragma unroll
  for (int i = 0; i < kRegItems; ++i) {
    if (in[i]) {
      with_constant<4, 2, 1>(width, [&](auto w) {
        scale_shift_by<decltype(w)::value>(v[i], rstd, gamma, beta, column(i), a.zero_centered);
      });
    }
  }
  // The packs not held, and the head's and tail's elements where absent,
  // stay zeros (never centred or scaled): they add nothing to the max below.
  if (has_head) scale_shift<1>(eh, 0.f, rstd, gamma, beta, tid, a.zero_centered);  // the mean is already off
  if (has_tail) scale_shift<1>(et, 0.f, rstd, gamma, beta, tail_col, a.zero_centered);
  // y, or q = y * mul: the per-tensor scale, or 1 / the row's scale.
  auto store = [&](float mul) {
    if constexpr (Q == Quant::kNone) {
      T* y = static_cast<T*>(a.y) + start;
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        if (in[i]) store_pack<VEC>(y + column(i), v[i]);
      }
      if (has_head) store_pack<1>(y + tid, eh);
      if (has_tail) store_pack<1>(y + tail_col, et);
    } else {
#pragma unroll
      for (int i = 0; i < kRegItems; ++i) {
        if (in[i]) store_q<VEC>(a, start + column(i), v[i], mul);
      }
      if (has_head) store_q<1>(a, start + tid, eh, mul);
      if (has_tail) store_q<1>(a, start + tail_col, et, mul);
    }
  };
  if constexpr (Q == Quant::kNone) {
    store(1.f);
  } else {
    float m = max_abs(max_abs(0.f, eh[0]), et[0]);  // max |y| of this thread's columns
#pragma unroll
    for (int i = 0; i < kRegItems; ++i) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = max_abs(m, v[i][j]);
    }
    if constexpr (Q == Quant::kTensor) {
      if (!a.no_output) store(tensor_scale);
      if (a.amax) merge_amax(a, row, m, amax_seen, smem);
    } else {
      float mm[1] = {m};
      row_sum<1>(mm, smem, AbsMaxOp{});
      const float scale = quant_scale(mm[0], a.fp8, a.scale_ub);
      store(1.f / scale);
      if (valid && tid == 0) a.qscale[row] = scale;
    }
  }
  if (valid && tid == 0) {
    a.rstd[row] = rstd;
    if constexpr (K == NormKind::kLayer) a.mean[row] = mean;
  }
}


}  // namespace
}  // namespace jrn::cuda
