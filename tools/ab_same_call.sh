#!/usr/bin/env bash
# Same-call A/B on a lent GPU: builds a reference tree and this tree as wheels
# at once, then runs one benchmark command with each installed in turn, so the
# two are compared on the same machine in the same session.
#
#   git archive --prefix=ref/ main | tar x -C dist/     # here: the reference's sources (dist/ is ignored)
#   bash tools/ab_same_call.sh dist/ref python3 benchmarks/bench_fused.py --ops ln_fp8 --hidden 4096
#
# (pass dist as a carried path to the device). The benchmark's output goes to
# $OUT (or ./out) as bench_<label>_<round>.log and its tables' rows are
# printed; the build and install logs are kept apart and land in $OUT only
# where a step fails (a device call brings back few files).
set -uo pipefail
# Several references at once: dist/ref,dist/mid (each labelled by its folder's name).
[ $# -ge 2 ] || { echo "usage: $0 <reference source dir>[,<another>...] <command...>"; exit 2; }
IFS=, read -ra REFS <<< "$1"; shift
REPO=$(pwd)
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 JAX_RMSNORM_CUDA_ARCHITECTURES=${JAX_RMSNORM_CUDA_ARCHITECTURES:-90}
# WHEELS=dir keeps the wheels there (dir/<label>/*.whl), e.g. to install one
# of them again after the A/B and run its GPU tests.
WHL=${WHEELS:-$(mktemp -d)}; mkdir -p "$WHL"
LOGS=$(mktemp -d)
fail() { cp "$LOGS/$1.log" "$OUT/"; echo "$1 failed:"; tail -30 "$LOGS/$1.log"; exit 1; }
LABELS=()
for r in "${REFS[@]}"; do
  v=$(basename "$r"); LABELS+=("$v")
  ( cd "$r" && python3 -m pip wheel --no-build-isolation --no-deps . -w "$WHL/$v" > "$LOGS/build_$v.log" 2>&1 ) &
done
LABELS+=(new)
( python3 -m pip wheel --no-build-isolation --no-deps . -w "$WHL/new" > "$LOGS/build_new.log" 2>&1 ) &
wait
for v in "${LABELS[@]}"; do
  ls "$WHL/$v"/*.whl > /dev/null 2>&1 || fail "build_$v"
done
# ROUNDS=n runs the builds in turn n times (ref, new, ref, new, ...): drift
# over the call (clocks, temperature) then shows as the spread of one build.
for round in $(seq "${ROUNDS:-1}"); do
  for v in "${LABELS[@]}"; do
    python3 -m pip install --no-deps --force-reinstall "$WHL/$v"/*.whl > "$LOGS/install_$v.log" 2>&1 ||
      fail "install_$v"
    # From the repository root the scripts import the installed wheel: their
    # own folder, not the root, is first on sys.path.
    ( cd "$REPO" && "$@" ) > "$OUT/bench_${v}_$round.log" 2>&1
    echo "== $v (round $round)"
    grep "^| [a-z]" "$OUT/bench_${v}_$round.log" | grep -v "^| op "
  done
done
