#!/usr/bin/env bash
# Kernel times of the decode-time forward under Nsight Compute (the installed
# package), where chained timings are noisier than the differences:
#   bash tools/ncu_decode_times.sh
# XLA's fusions too (recorded inside its CUDA graphs; not at one row, where XLA runs
# two or three kernels a norm):
#   SHAPES=16x4096,32x8192 OPS="xla_rms_fwd xla_ln_fwd" KERNELS=^fusion bash tools/ncu_decode_times.sh
# The residual add + norm (XLA's composition returns y and h):
#   OPS="add_rms add_ln" KERNELS=fwd_ bash tools/ncu_decode_times.sh
#   OPS="xla_add_rms xla_add_ln" KERNELS=. PER_CALL=2 bash tools/ncu_decode_times.sh
# (XLA runs that composition as two kernels a call, h's and then y's, except
# at one row: PER_CALL=2 sums them, where ^fusion picked y's alone.
# ncu_times.py refuses a launch count other than PER_CALL kernels a call.)
# or, against a reference tree, in one device call:
#   ROUNDS=2 bash tools/ab_same_call.sh dist/ref bash tools/ncu_decode_times.sh
set -uo pipefail
SHAPES=${SHAPES:-1x4096,16x4096,32x4096,64x4096,1x8192,16x8192,32x8192,64x8192,128x4096}
OPS=${OPS:-rms_fwd ln_fwd}
csv=$(mktemp)
# shellcheck disable=SC2086
ncu --csv --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum \
  python3 tools/profile_ops.py $OPS --shapes "$SHAPES" --calls 5 > "$csv" 2> "$csv.err" ||
  { tail -20 "$csv.err"; exit 1; }
# shellcheck disable=SC2086
python3 tools/ncu_times.py "$csv" --ops $OPS --shapes "$SHAPES" --calls 5 --kernels "${KERNELS:-fwd_decode}" \
  --per-call "${PER_CALL:-1}"
