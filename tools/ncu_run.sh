#!/usr/bin/env bash
# Profiles chosen ops with Nsight Compute (after the build of device_run.sh):
#   bash tools/ncu_run.sh ROWS HIDDEN OP...   ; reports go to $OUT/ncu_OP_HIDDEN.txt
# KERNELS (a regex of kernel names), COUNT (launches profiled) and LIMIT (seconds
# an op) narrow it: each profiled launch is replayed once per counter pass (about
# 18) with its memory saved and restored, and at 2^27 elements four launches of
# rms_bwd at 10920x12290 did not finish in 120 s (2026-11-27, H100). E.g.
# KERNELS=bwd_unaligned COUNT=1 LIMIT=200 for that one kernel. EXTRA passes more
# arguments to profile_ops.py (e.g. EXTRA="--param-dtype float32"), TAG is
# added to the report's name (ncu_OP_HIDDEN_TAG.txt).
set -uo pipefail
# Without preallocation (profile_ops.py says why). With it set, and after a benchmark had run,
# the backward's profiles at 262144 started where they had failed at start-up ("no supported
# devices found for platform CUDA"); which of the two helped is not known.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
OUT=${OUT:-out}; mkdir -p "$OUT"
rows=$1; hidden=$2; shift 2
for op in "$@"; do
  report="$OUT/ncu_${op}_${hidden}${TAG:+_$TAG}.txt"
  timeout "${LIMIT:-120}" ncu --clock-control none --kernel-name regex:"${KERNELS:-fwd_|bwd_|stats|apply|reduce_cols|dgamma}" \
    --launch-skip 0 --launch-count "${COUNT:-4}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats \
    python3 tools/profile_ops.py "$op" --rows "$rows" --hidden "$hidden" --calls 2 ${EXTRA:-} \
    > "$report" 2>&1
  echo "$op${TAG:+ ($TAG)}: exit $?"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Cluster Size|Dynamic Shared Memory Per Block|Executed Instructions  |Issue Slots Busy|No Eligible|Warp Cycles Per Issued|L1/TEX Hit Rate|L2 Hit Rate|Shared Memory Configuration Size|Mem Busy|Max Bandwidth|L1/TEX Cache Throughput" \
    "$report" | head -60
done
