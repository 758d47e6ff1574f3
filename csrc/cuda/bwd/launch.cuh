// The backward's launcher: the FFI arguments as a plan::BwdProblem, its plan
// (csrc/plan), and the plan executed: the dx kernel it names, then
// dgamma/dbeta's sums (bwd_reduce over the slots, or bwd_columns). Nothing
// here chooses a kernel.
//
// The families (one header each): decode.cuh (decode-time rows), regs.cuh
// (narrow rows in registers), slices.cuh (persistent, bulk-copied stages;
// sm_90+), stream.cuh (the rest), unaligned.cuh (widths no multiple of a
// pack), param_sums.cuh (dgamma/dbeta after the dx kernel).
//
// Instantiated by the backward's units (csrc/cuda/units), one for each type
// of x, for both normalizations.
#pragma once

#include <algorithm>

#include "../common/launch.cuh"
#include "../launch.h"
#include "decode.cuh"
#include "param_sums.cuh"
#include "regs.cuh"
#include "slices.cuh"
#include "stream.cuh"
#include "unaligned.cuh"

namespace jrn::cuda {
namespace {

template <NormKind K, class T, class P>
plan::BwdProblem bwd_problem(const BwdArgs& a) {
  plan::BwdProblem p;
  p.kind = K;
  p.x = dtype_of<T>();
  p.param = dtype_of<P>();
  p.rows = a.shape.rows;
  p.hidden = a.shape.hidden;
  p.groups = a.shape.groups;
  p.gamma = a.gamma != nullptr;
  p.param_outputs = a.param_outputs();
  p.slots = a.workspace ? a.slots : 0;
  p.coef = a.coef != nullptr;
  p.dh = a.dh != nullptr;
  p.rows_aligned = aligned16(a.x) && aligned16(a.dy) && aligned16(a.dx) && (!a.dh || aligned16(a.dh));
  p.gamma_aligned = !a.gamma || aligned16(a.gamma);
  p.sums_aligned = aligned16(a.workspace) && (!a.dgamma || aligned16(a.dgamma)) && (!a.dbeta || aligned16(a.dbeta));
  return p;
}

// Adds the slots' partial rows into dgamma/dbeta (one or two launches).
// Each launch is early: bwd_reduce waits for the kernel before it, so the
// launch overlaps that kernel's tail (docs/tuning.md, early-launch).
template <class P, int CV>
ffi::Error reduce_slots(cudaStream_t stream, const BwdArgs& a, SlotLayout l) {
  const unsigned tiles = static_cast<unsigned>(ceil_div(a.shape.hidden, kReduceLanes * CV));
  const unsigned groups = static_cast<unsigned>(a.shape.groups), outs = static_cast<unsigned>(a.param_outputs());
  const dim3 block(kReduceLanes, kReduceSplit);
  auto launch = [&](dim3 grid, ReduceStep s) {
    return launch_early(bwd_reduce<P, CV>, grid, block, stream, "bwd_reduce", a, l, s);
  };
  const int64_t rows = l.used;
  if (rows <= kReduceRows) return launch(dim3(tiles, groups, outs), ReduceStep{0, 1, rows, l.used, true});
  // First pass: parts of kReduceRows slots, each summed into its first row.
  const int64_t parts = ceil_div(rows, kReduceRows);
  if (parts * outs > 65535) return ffi::Error::Internal("jax_rmsnorm: too many backward slots");
  JRN_RETURN_IF_ERROR(launch(dim3(tiles, groups, static_cast<unsigned>(parts * outs)),
                             ReduceStep{kReduceRows, 1, kReduceRows, l.used, false}));
  return launch(dim3(tiles, groups, outs), ReduceStep{0, kReduceRows, parts, l.used, true});
}

// dgamma/dbeta from what the dx kernel left: the slots' partial rows (`l`),
// or x and dy again where there is no workspace.
template <NormKind K, class T, class P>
ffi::Error run_param_sums(cudaStream_t stream, const BwdArgs& a, const plan::BwdPlan& p, SlotLayout l) {
  constexpr int kVec = 16 / sizeof(T);
  switch (p.sums) {
    case plan::ParamSums::kNone: return ffi::Error::Success();
    case plan::ParamSums::kColumns: {
      if (p.column_tiles > INT32_MAX) return ffi::Error::InvalidArgument("jax_rmsnorm: hidden size too large");
      // It reads only the backward's inputs, which the dx kernel does not
      // write, so it is launched early and runs beside that kernel; it waits
      // for the dx kernel only before it ends (docs/tuning.md, bwd-columns).
      const dim3 grid(static_cast<unsigned>(p.column_tiles), static_cast<unsigned>(a.shape.groups));
      const dim3 block(kColLanes, kColSplit);
      return p.sums_vec == kVec ? launch_early(bwd_columns<K, T, P, kVec>, grid, block, stream, "bwd_columns", a)
                                : launch_early(bwd_columns<K, T, P, 1>, grid, block, stream, "bwd_columns", a);
    }
    case plan::ParamSums::kReduce:
      return p.sums_vec == 4 ? reduce_slots<P, 4>(stream, a, l) : reduce_slots<P, 1>(stream, a, l);
  }
  return ffi::Error::Internal("jax_rmsnorm: unknown dgamma sums");
}

template <NormKind K, class T, class P, int VEC>
ffi::Error run_decode(cudaStream_t stream, const BwdArgs& a, const plan::BwdPlan& p) {
  if constexpr (plan::bwd_decode_exists({K, dtype_of<T>(), dtype_of<P>(), VEC})) {
    auto pick = [&](auto items) {
      constexpr int I = decltype(items)::value;
      return p.direct ? bwd_decode<K, T, P, VEC, I, true> : bwd_decode<K, T, P, VEC, I, false>;
    };
    auto kernel = p.items == 1 ? pick(Int<1>{}) : p.items == 2 ? pick(Int<2>{}) : pick(Int<4>{});
    BwdArgs b = a;
    const bool to_slots = p.sums == plan::ParamSums::kReduce;  // centred rows: a slot a row
    if (!to_slots) {
      b.workspace = nullptr;
      b.slots = p.splits;  // without a workspace `slots` carries the column tiles' rows of threads
    }
    JRN_RETURN_IF_ERROR(launch_early_clustered(kernel, dim3(static_cast<unsigned>(p.ctas)), dim3(p.threads),
                                               static_cast<unsigned>(p.cluster), stream, "bwd_decode", b));
    return to_slots ? run_param_sums<K, T, P>(stream, a, p, SlotLayout{a.shape.rows, a.slots}) : ffi::Error::Success();
  } else {
    return ffi::Error::Internal("jax_rmsnorm: bwd_decode moves 16-byte packs");
  }
}

template <NormKind K, class T, class P, int VEC>
ffi::Error run_slices(cudaStream_t stream, const BwdArgs& a, const plan::BwdPlan& p, SlotLayout* l) {
  if constexpr (plan::bwd_slices_exists({K, dtype_of<T>(), dtype_of<P>(), VEC})) {
    auto kernel = p.early ? (p.whole ? bwd_slices<K, T, P, VEC, true, true> : bwd_slices<K, T, P, VEC, true>)
                          : bwd_slices<K, T, P, VEC, false>;
    const int hw = p.cluster * p.fold;  // CTAs of a hardware cluster
    const size_t smem = static_cast<size_t>(p.smem);
    int resident = 0;
    JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, dim3(p.threads), smem, hw, &resident));
    const int64_t clusters = std::max<int64_t>(1, std::min<int64_t>(l->stride / p.fold, resident));
    l->used = clusters * p.fold;  // slots walking the rows
    JRN_RETURN_IF_ERROR(launch_clustered(
        kernel, dim3(static_cast<unsigned>(clusters * hw), static_cast<unsigned>(a.shape.groups)), dim3(p.threads),
        smem, stream, hw, "bwd_slices", a, *l, p.cluster, p.fold, p.stats_ahead));
    l->used = clusters;  // workspace rows written
    return ffi::Error::Success();
  } else {
    return ffi::Error::Internal("jax_rmsnorm: bwd_slices moves 16-byte packs");
  }
}

// The dx kernels of `VEC`-element packs, then dgamma/dbeta.
template <NormKind K, class T, class P, int VEC>
ffi::Error run_packs(cudaStream_t stream, const BwdArgs& a, const plan::BwdPlan& p) {
  if (p.kernel == plan::BwdKernel::kDecode) return run_decode<K, T, P, VEC>(stream, a, p);
  if (a.shape.groups > 65535) return ffi::Error::InvalidArgument("jax_rmsnorm: too many parameter groups");
  if (p.slots < 1 || (a.workspace && a.slots < 1))
    return ffi::Error::InvalidArgument("jax_rmsnorm: backward workspace is missing");
  SlotLayout l{p.slots, p.slots};
  const unsigned groups = static_cast<unsigned>(a.shape.groups);
  switch (p.kernel) {
    case plan::BwdKernel::kRegs:
      l.used = p.ctas * p.rows_per_cta;
      bwd_regs<K, T, P, VEC><<<dim3(static_cast<unsigned>(p.ctas), groups), dim3(p.threads, p.rows_per_cta), 0,
                               stream>>>(a, l);
      JRN_RETURN_IF_ERROR(check_launch("bwd_regs"));
      break;
    case plan::BwdKernel::kSlices: JRN_RETURN_IF_ERROR((run_slices<K, T, P, VEC>(stream, a, p, &l))); break;
    case plan::BwdKernel::kStream:
      bwd_stream<K, T, P, VEC><<<dim3(static_cast<unsigned>(p.slots), groups), p.threads, 0, stream>>>(a, l);
      JRN_RETURN_IF_ERROR(check_launch("bwd_stream"));
      break;
    default: return ffi::Error::Internal("jax_rmsnorm: the backward's plan names no dx kernel");
  }
  return run_param_sums<K, T, P>(stream, a, p, l);
}

template <NormKind K, class T, class P>
ffi::Error run_unaligned(cudaStream_t stream, const BwdArgs& a, const plan::BwdPlan& p) {
  if (a.shape.groups > 65535) return ffi::Error::InvalidArgument("jax_rmsnorm: too many parameter groups");
  const int64_t rpg = a.shape.rows_per_group();
  const int rpb = p.rows_per_cta;
  const dim3 block(p.threads, rpb);
  const size_t smem = static_cast<size_t>(p.smem);
  auto kernel = p.cluster > 1                          ? bwd_unaligned<K, T, P, true, kRegItems>
                : p.items == kUnalignedWideItems   ? bwd_unaligned<K, T, P, false, kUnalignedWideItems>
                : p.items == kUnalignedWidestItems ? bwd_unaligned<K, T, P, false, kUnalignedWidestItems>
                                                   : bwd_unaligned<K, T, P, false, kRegItems>;
  int resident = 0;  // slots: CTAs, or clusters
  JRN_RETURN_IF_ERROR(co_resident_clusters(kernel, block, smem, p.cluster, &resident));
  // Persistent slots, as many as are resident at once (and the workspace
  // holds), CTAs (or clusters) a multiple of `step` so that the slots are a
  // multiple of the rows' period.
  const int64_t step = p.period / std::gcd(static_cast<int64_t>(rpb), p.period);
  int64_t groups_of = std::min<int64_t>(resident, ceil_div(rpg, rpb));
  if (a.workspace) {
    groups_of = std::min<int64_t>(groups_of, a.slots / rpb) / step * step;
    if (groups_of == 0) {  // fewer slots than the period: single elements
      const plan::BwdPlan elements = plan::plan_bwd_elements(bwd_problem<K, T, P>(a), this_device());
      return run_packs<K, T, P, 1>(stream, a, elements);
    }
  } else {
    groups_of = ceil_div(groups_of, step) * step;
  }
  SlotLayout l{groups_of * rpb, a.workspace ? a.slots : groups_of * rpb};
  const dim3 grid(static_cast<unsigned>(groups_of * p.cluster), static_cast<unsigned>(a.shape.groups));
  if (p.cluster > 1) {
    JRN_RETURN_IF_ERROR(
        launch_clustered(kernel, grid, block, smem, stream, p.cluster, "bwd_unaligned (clusters)", a, l, p.cluster));
  } else {
    kernel<<<grid, block, smem, stream>>>(a, l, 1);
    JRN_RETURN_IF_ERROR(check_launch("bwd_unaligned"));
  }
  return run_param_sums<K, T, P>(stream, a, p, l);
}

}  // namespace

template <NormKind K, class T, class P>
ffi::Error launch_bwd(cudaStream_t stream, const BwdArgs& a) {
  constexpr int kVec = 16 / sizeof(T);
  // The primitives give centred rows' dgamma/dbeta a workspace at any size
  // (plan::workspace_slots): the column sums would miss each row's centring.
  if (plan::centres_rows(K, dtype_of<T>()) && a.param_outputs() > 0 && a.shape.rows > 0 && !a.workspace)
    return ffi::Error::InvalidArgument("jax_rmsnorm: float32 LayerNorm's backward needs its workspace");
  const plan::BwdPlan p = plan::plan_bwd(bwd_problem<K, T, P>(a), this_device());
  switch (p.kernel) {
    case plan::BwdKernel::kNone: return ffi::Error::Success();
    case plan::BwdKernel::kUnaligned: return run_unaligned<K, T, P>(stream, a, p);
    default:
      return p.key.vec == kVec ? run_packs<K, T, P, kVec>(stream, a, p) : run_packs<K, T, P, 1>(stream, a, p);
  }
}

}  // namespace jrn::cuda

// Used inside namespace jrn::cuda by the backward's units.
#define JRN_INSTANTIATE_BWD(K, T, P) template ffi::Error launch_bwd<K, T, P>(cudaStream_t, const BwdArgs&);
