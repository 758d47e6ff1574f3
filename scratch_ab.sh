#!/bin/bash
# A/B: bwd_slices with dh in the ring (new) against HEAD (old).
OUT=${OUT:-out}
run() {
  tag=$1
  python3 benchmarks/bench_fused.py --ops add_rms_fwdbwd add_ln_fwdbwd --hidden 4096 16384 --reps 5 2>&1 | grep -v '^|' | tee "$OUT/fused_$tag.log"
  python3 benchmarks/bench_norm.py --ops rms_bwd ln_bwd --hidden 1024 4096 16384 65536 --reps 5 2>&1 | grep -v '^|' | tee "$OUT/norm_$tag.log"
}
bash benchmarks/device_run.sh || exit 1
python3 -m pytest -q tests/test_fused.py tests/test_values.py -k "gpu and (grad or many_rows)" 2>&1 | tail -4
run new
cp csrc/cuda/norm_bwd.cu /tmp/new_bwd.cu; cp scratch_old_bwd.cu csrc/cuda/norm_bwd.cu
JAX_RMSNORM_CUDA_ARCHITECTURES=90 python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build_old.log" 2>&1 || { tail -30 "$OUT/build_old.log"; exit 1; }
run old
cp /tmp/new_bwd.cu csrc/cuda/norm_bwd.cu
