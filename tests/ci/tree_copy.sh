# What the ci/ checks' tests share, sourced by each: a copy of the tree to break, and the
# check's verdict on it. Before sourcing, set `check` (the script under test) and `paths`
# (the git pathspecs the copy holds).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fresh_copy() {  # the tree's files under `paths`, as they are in the working tree
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  (cd "$top" && git ls-files --cached --others --exclude-standard -- "${paths[@]}" |
     while read -r f; do [[ -f $f ]] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$work/tree")
}
expect() {  # expect STATUS PATTERN: run the check on the copy; `what` names the case
  local want=$1 pattern=$2 output status
  output=$("$check" --root "$work/tree" 2>&1)
  status=$?
  if [[ $status -ne $want ]] || ! grep -qE -- "$pattern" <<<"$output"; then
    echo "FAIL: ${what}: exited $status (want $want), output lacks /$pattern/:"
    echo "$output"
    failures=$((failures + 1))
  else
    echo "ok: $what"
  fi
}
