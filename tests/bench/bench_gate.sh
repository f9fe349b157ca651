#!/usr/bin/env bash
# The communication regression gate (ci/bench-compare --counters-only) on bench_parallel's
# DDP row, 2 simulated ranks: a run with nothing changed passes; the same run with DDP's
# buckets made small (more all-reduces of the same bytes) fails, naming the collectives per
# step and the predicted communication time, though no timing is compared.
#   bench_gate.sh BENCH_PARALLEL WORKDIR
set -uo pipefail
bench=$1 work=$2
mkdir -p "$work"
run() {  # run OUT.json [VAR=VALUE...]
  local out=$1
  shift
  env SGPU_BACKEND=sim "$@" "$bench" --benchmark_filter='mlp_ddp/2/' \
    --benchmark_out="$out" --benchmark_out_format=json >"$out.log" 2>&1 \
    || { echo "FAIL: bench_parallel $* exited $?:"; cat "$out.log"; exit 1; }
}
run "$work/baseline.json"
run "$work/unchanged.json"
run "$work/small_buckets.json" SGPU_BENCH_BUCKET_BYTES=1024
source "$(dirname "$0")/gate_expect.sh"
expect 0 '0 counter\(s\) changed' "$work/baseline.json" "$work/unchanged.json"
expect 1 'collectives_per_step: 1 -> [0-9.]+ +CHANGED \(compared exactly\)' \
  "$work/baseline.json" "$work/small_buckets.json"
expect 1 'model_comm_ms_per_step: .*CHANGED' "$work/baseline.json" "$work/small_buckets.json"
# The bytes a step moves are the same whatever the buckets: not a changed counter.
if "$compare" --counters-only "$work/baseline.json" "$work/small_buckets.json" | grep -q comm_bytes_per_step; then
  echo "FAIL: comm_bytes_per_step changed with the bucket size"
  failures=$((failures + 1))
fi
exit $((failures > 0))
