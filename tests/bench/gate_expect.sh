# What the regression gates' scripts share (sourced): `expect STATUS PATTERN BASE NEW` runs
# ci/bench-compare --counters-only BASE NEW, prints what it said, and counts a failure in
# $failures unless it exited STATUS with PATTERN in its output.
compare=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/ci/bench-compare
failures=0
expect() {
  local want=$1 pattern=$2
  shift 2
  local output status
  output=$("$compare" --counters-only "$@" 2>&1)
  status=$?
  if [[ $status -ne $want ]] || ! grep -qE "$pattern" <<<"$output"; then
    echo "FAIL: bench-compare --counters-only $* exited $status (want $want), output lacks /$pattern/:"
    echo "$output"
    failures=$((failures + 1))
  else
    echo "ok: bench-compare --counters-only $(basename "$2") -> $status"
    echo "$output" | sed 's/^/    /'
  fi
}
