#!/usr/bin/env bash
# What one call on a GPU machine runs: build, GPU tests, benchmarks, sanitizers.
# The benchmarks append their rows to benchmarks/results/<gpu>.csv (bring that file back).
# Usage: bash tools/device_run.sh [tests|tests:I/N|tests-fast|bench|bench-between|bench-fused|bench-block|bench-fp8in|bench-extra|bench-unaligned|ncu-wide|ncu-block|dist|sanitize|memcheck|racecheck]... ; logs go to $OUT (or ./out).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
JAX_RMSNORM_CUDA_ARCHITECTURES=${JAX_RMSNORM_CUDA_ARCHITECTURES:-90} \
  python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import jax, jax_rmsnorm as j; print('cuda built:', j.cuda_built(), jax.devices())"
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)  # the test steps' processes, with pytest-xdist
for step in "$@"; do
  case $step in
    tests|tests:*)  # the whole GPU suite, 8 processes where pytest-xdist is installed; tests:I/N its part I of N
      # (tests:1/2, then tests:2/2 on the warm machine: on an H200 a fresh build and the whole suite overran
      # one call's 600 s)
      shard=(); log=tests_gpu
      if [ "$step" != tests ]; then part=${step#tests:}; shard=(--shard "$part"); log=tests_gpu_${part/\//of}; fi
      XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -rs tests -m gpu "${shard[@]}" "${par[@]}" 2>&1 |
        tee "$OUT/$log.log" | tail -15 ;;
    tests-fast)  # every kernel family once (CONTRIBUTING.md)
      XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -rs tests -m "gpu and not slow" --durations=10 \
        "${par[@]}" 2>&1 | tee "$OUT/tests_fast.log" | tail -25 ;;
    dist) python3 benchmarks/bench_dist.py 2>&1 | tee "$OUT/bench_dist.log" ;;
    bench)  # the README's tables: plain norms and fused ops, bf16
      { python3 benchmarks/bench_norm.py
        python3 benchmarks/bench_fused.py
      } 2>&1 | tee "$OUT/bench.log" | grep -v '^|' ;;
    bench-between)  # more widths between the default ones
      { python3 benchmarks/bench_norm.py --reps 5 --hidden 2048 3072 5120 6144 12288 20480 24576 32768 49152 98304 131072
        python3 benchmarks/bench_fused.py --reps 5 --ops ln_fp8 ln_fp8_row rms_fp8 rms_fp8_row \
          --hidden 2048 6144 12288 24576 32768 49152 131072
      } 2>&1 | tee "$OUT/bench_between.log" | grep -v '^|' ;;
    bench-fused)  # residual add + norm, FP8 output (e4m3, and e5m2 at two widths)
      { python3 benchmarks/bench_fused.py
        python3 benchmarks/bench_fused.py --ops rms_fp8 rms_fp8_row rms_fp8_group --fp8 e5m2 --hidden 4096 16384
      } 2>&1 | tee "$OUT/bench_fused.log" | grep -v '^|' ;;
    bench-block)  # the block-scaled outputs (MXFP8, NVFP4; rowwise and with the columnwise copy), bf16
      python3 benchmarks/bench_fused.py --ops rms_mxfp8 ln_mxfp8 rms_nvfp4 ln_nvfp4 rms_mxfp8_t ln_mxfp8_t \
        rms_nvfp4_t ln_nvfp4_t add_rms_mxfp8_t 2>&1 | tee "$OUT/bench_block.log" | grep -v '^|' ;;
    bench-slice)  # the FP8 outputs on one device of a split hidden dim, and the fused kernels, same run
      { python3 benchmarks/bench_fused.py --ops rms_fp8 ln_fp8 rms_fp8_row rms_fp8_group add_rms_fp8 --hidden 4096 16384
        python3 benchmarks/bench_fused.py --ops rms_fp8 ln_fp8 rms_fp8_row rms_fp8_group add_rms_fp8 --hidden 4096 16384 \
          --hidden-slice
      } 2>&1 | tee "$OUT/bench_slice.log" | grep -v '^|' ;;
    ncu-decode)  # kernel times of ours and XLA's forward at decode-time rows (graph nodes profiled too)
      for shape in "16 4096" "64 8192" "256 4096"; do
        read -r r hd <<< "$shape"
        ncu --clock-control none --cache-control none --graph-profiling node \
          --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__warps_launched.sum,launch__grid_size,launch__block_size \
          python3 tools/profile_ops.py rms_fwd xla_rms_fwd ln_fwd xla_ln_fwd --rows "$r" --hidden "$hd" --calls 3 \
          > "$OUT/ncu_decode_${r}x$hd.txt" 2>&1
        grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|inst_executed|warps_launched|grid_size|block_size" \
          "$OUT/ncu_decode_${r}x$hd.txt" | head -80
      done ;;
    ncu-wide)  # the kernels of the widest rows, forward and backward: CTAs, clusters, registers, occupancy.
      # Run after another GPU step: as the first process on the GPU, ncu has failed at start-up
      # ("no supported devices found for platform CUDA").
      KERNELS=fwd_slices COUNT=1 bash tools/ncu_run.sh 512 262144 rms_fwd ln_fwd
      KERNELS=bwd_ COUNT=2 bash tools/ncu_run.sh 512 262144 rms_bwd ln_bwd ;;
    ncu-block)  # where the block-scaled forward spends its instructions and its warps wait: executed SASS by
      # opcode, each pipe's instructions as a share of its peak (ComputeWorkloadAnalysis tabulates the rest), the
      # stall reasons, the lines with most stall samples. BLOCK_OPS, BLOCK_KERNEL and BLOCK_HIDDEN (one
      # or more widths; rows a multiple of 32, about 2^25 elements) choose, e.g. the columnwise copy's kernel:
      # BLOCK_OPS="rms_mxfp8_t ln_mxfp8_t" BLOCK_KERNEL=fwd_tiles BLOCK_HIDDEN="4096 16384". The rest (per op and
      # width its details, raw metrics, SASS lines' counts and samples) goes into $OUT/ncu_<kernel>.tgz (one
      # archive a kernel, so both kernels' profiles come back from one call; the reports stay in /tmp/ncu_reps).
      kn=${BLOCK_KERNEL:-fwd_slices}; nd=/tmp/ncu_$kn; rm -rf "$nd"; mkdir -p "$nd" /tmp/ncu_reps
      pipes=$(printf 'sm__inst_executed_pipe_%s.avg.pct_of_peak_sustained_active,' alu fma fmaheavy lsu xu)
      for hd in ${BLOCK_HIDDEN:-4096}; do rows=$((2 ** 25 / hd / 32 * 32)); for op in ${BLOCK_OPS:-rms_mxfp8 rms_nvfp4}; do
        n="${op}_$hd"
        XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 ncu --clock-control none --kernel-name "regex:$kn" \
          --launch-skip 1 --launch-count 1 --section SourceCounters --section SpeedOfLight --section WarpStateStats \
          --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
          --metrics "${pipes%,}" \
          -f -o "/tmp/ncu_reps/$n" python3 tools/profile_ops.py "$op" --rows "$rows" --hidden "$hd" --calls 2 \
          > "$nd/run_$n.log" 2>&1
        rep=/tmp/ncu_reps/$n.ncu-rep
        [ -f "$rep" ] || { echo "== $op ${rows}x$hd: no report (run_$n.log):"; tail -5 "$nd/run_$n.log"; continue; }
        ncu --import "$rep" --page details --print-details all > "$nd/details_$n.txt" 2>/dev/null
        ncu --import "$rep" --page raw --csv > "$nd/raw_$n.csv" 2>/dev/null
        ncu --import "$rep" --page source --csv --print-source sass > "$nd/src_$n.csv" 2>/dev/null
        echo "== $op ${rows}x$hd"
        grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Warp Cycles Per Issued|Achieved Occupancy|Stall [A-Z]|Issue Slots Busy|pipe_" \
          "$nd/details_$n.txt" | sed -n 1,30p
        python3 tools/sass_summary.py --executed "$nd/src_$n.csv" $((rows * hd)) --dump "$nd/lines_$n.txt" | sed -n 1,30p
      done; done
      tar czf "$OUT/ncu_$kn.tgz" -C /tmp "ncu_$kn" ;;
    bench-unaligned)  # widths that are not a multiple of 8
      { python3 benchmarks/bench_norm.py --hidden 1001 2050 4097 4100 8191 8201 12290 14001 16383
        python3 benchmarks/bench_norm.py --hidden 4100 --param-dtype float32 --ops rms_fwd ln_fwd
        python3 benchmarks/bench_fused.py --hidden 1001 2050 4097 4100 12290 --ops add_rms add_ln
      } 2>&1 | tee "$OUT/bench_unaligned.log" | grep -v '^|' ;;
    bench-fp8in)  # FP8 input, per group of 128 and per tensor
      python3 benchmarks/bench_fused.py --ops fp8in_rms fp8in_ln fp8in_rms_tensor --hidden 1024 4096 8192 16384 65536 \
        2>&1 | tee "$OUT/bench_fp8in.log" | grep -v '^|' ;;
    bench-extra)  # other dtypes, float32 params, Gemma scale, decode-time row counts
      { python3 benchmarks/bench_norm.py --dtype float32 --hidden 4096 16384
        python3 benchmarks/bench_norm.py --dtype float16 --hidden 4096 16384
        python3 benchmarks/bench_norm.py --param-dtype float32 --hidden 4096 16384
        python3 benchmarks/bench_norm.py --zero-centered --hidden 4096 16384 --ops rms_fwd rms_bwd
        python3 benchmarks/bench_norm.py --rows 1 16 256 --hidden 4096 8192 --ops rms_fwd rms_bwd ln_fwd ln_bwd --iters 400 --reps 11
      } 2>&1 | tee "$OUT/bench_extra.log" | grep -v '^|' ;;
    sanitize|memcheck|racecheck)  # one process per shape (see tests/sanitize.py), SAN_JOBS at a time
      # (default 1). Each line is printed as its shape ends, so a call cut off at its limit keeps the
      # finished ones; SAN_SHAPES="a b" runs those shapes only, SAN_TIMEOUT (300 s) caps a shape (racecheck
      # of 64x262144 needs more than 190 s alone). JAX_RMSNORM_DRAM_GBPS=4917 runs an H200's plans on an H100
      # (the backward's stats_ahead). The logs are tarred into $OUT.
      tools=$step; [ "$step" = sanitize ] && tools="memcheck racecheck"
      mkdir -p /tmp/sanitize
      # compute-sanitizer itself has segfaulted (exit 139, no summary, nothing from the script) under
      # several jobs at a time, and run clean on the same shape again: such a shape runs once more.
      for tool in $tools; do
        for shape in ${SAN_SHAPES:-$(python3 tests/sanitize.py --list)}; do echo "$tool $shape"; done
      done | XLA_PYTHON_CLIENT_ALLOCATOR=platform xargs -P "${SAN_JOBS:-1}" -L 1 sh -c \
        'tool=$0 shape=$1 log=/tmp/sanitize/$0_$1.log
         run() { timeout "${SAN_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 \
           python3 tests/sanitize.py $shape > $log 2>&1; }
         run; rc=$?; again=""
         [ $rc = 139 ] && ! grep -q SUMMARY $log && { run; rc=$?; again=" (sanitizer crashed, run again)"; }
         echo "$tool $shape exit $rc$again $(grep -h SUMMARY $log)"' |
        tee "$OUT/sanitize.txt"
      tar czf "$OUT/sanitize_logs.tgz" -C /tmp sanitize ;;
  esac
done
