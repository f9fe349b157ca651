#!/usr/bin/env bash
# The regression gate on a shape-only step (bench/bench_shapes.py --json, then
# ci/bench-compare --counters-only): Llama's debug size under FSDP2 on 2 simulated H100s.
# A run with nothing changed passes; the same step with activation checkpointing turned on
# fails, naming its peak memory and its FLOPs (compared exactly) and its predicted compute
# time, though no timing is compared.
#   shapes_gate.sh PYTHON WORKDIR
set -uo pipefail
python=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work"
run() {  # run OUT.json CHECKPOINTING
  "$python" "$root/bench/bench_shapes.py" --gpus 2 --size debug --seq 512 --no-floor \
    --checkpointing "$2" --json "$1" >"$1.log" 2>&1 \
    || { echo "FAIL: bench_shapes.py --checkpointing $2 exited $?:"; cat "$1.log"; exit 1; }
}
run "$work/baseline.json" off
run "$work/unchanged.json" off
run "$work/checkpointed.json" on
cat "$work/baseline.json.log"
# The two runs compare by name: the checkpointed row is renamed to the baseline's.
sed -i "s#shapes/debug/fsdp2/bf16/ac/2#shapes/debug/fsdp2/bf16/2#" "$work/checkpointed.json"
source "$(dirname "$0")/gate_expect.sh"
expect 0 '0 counter\(s\) changed' "$work/baseline.json" "$work/unchanged.json"
expect 1 'memory_peak_bytes: .* CHANGED \(compared exactly\)' "$work/baseline.json" "$work/checkpointed.json"
expect 1 'flops_per_step: .* CHANGED \(compared exactly\)' "$work/baseline.json" "$work/checkpointed.json"
expect 1 'model_compute_ms_per_step: .*CHANGED' "$work/baseline.json" "$work/checkpointed.json"
exit $((failures > 0))
