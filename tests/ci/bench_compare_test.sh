#!/usr/bin/env bash
# ci/bench-compare on small Google Benchmark runs: a regression beyond the tolerance exits
# 1 and names it; a change within tolerance, with one slow repetition, exits 0; a bad
# file exits 2.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
compare=$here/../../ci/bench-compare
data=$here/bench_compare
failures=0
expect() {  # expect STATUS PATTERN ARGS...
  local want=$1 pattern=$2
  shift 2
  local output status
  output=$("$compare" "$@" 2>&1)
  status=$?
  if [[ $status -ne $want ]] || ! grep -qE "$pattern" <<<"$output"; then
    echo "FAIL: bench-compare $* exited $status (want $want), output lacks /$pattern/ or is:"
    echo "$output"
    failures=$((failures + 1))
  else
    echo "ok: bench-compare $* -> $status"
  fi
}
expect 1 'allreduce/float32/1048576/sgpu .*-1[01]\.[0-9]%.*REGRESSION' \
  "$data/baseline.json" "$data/regressed.json"
expect 0 '0 regression' "$data/baseline.json" "$data/within_noise.json"
# The same runs pass with a tolerance above the drop.
expect 0 '0 regression' --tolerance 0.15 "$data/baseline.json" "$data/regressed.json"
# A changed machine is named.
expect 1 'sgpu_commit: aaaa -> bbbb' "$data/baseline.json" "$data/regressed.json"
expect 2 'cannot read' "$data/baseline.json" "$here/bench_compare_test.sh"
exit $((failures > 0))
