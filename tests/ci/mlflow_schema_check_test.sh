#!/usr/bin/env bash
# ci/mlflow-schema on copies of the kept schema, all in one check (MLflow creates its
# database once): the kept file passes; each edit of a copy (a column dropped, a table
# renamed, an index added, the revision changed) fails the check, which names the file.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
check=$top/ci/mlflow-schema
kept=$top/src/tracking/sqlite/mlflow_schema.sql
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
copies=() names=()
mutate() {  # mutate NAME SED-EXPRESSION: a copy, edited, that must fail the check
  local name=$1 expression=$2 copy=$work/$1.sql
  sed "$expression" "$kept" >"$copy"
  if cmp -s "$copy" "$kept"; then
    echo "FAIL: $name: the edit changed nothing"; failures=$((failures + 1)); return
  fi
  copies+=("$copy") names+=("$name")
}
mutate column-dropped '/^\tsource_version VARCHAR(50),$/d'
mutate table-renamed 's/^CREATE TABLE "latest_metrics"/CREATE TABLE "latest_metric"/'
mutate index-added '$a CREATE INDEX extra ON metrics (step);'
mutate revision-changed "s/VALUES ('dc11669786a5')/VALUES ('000000000000')/"
if output=$("$check" --kept "$kept" "${copies[@]}" 2>&1); then
  echo "FAIL: the check passed with edited copies"; failures=$((failures + 1))
fi
if [[ $output == *"$kept is not the pinned MLflow's schema"* ||
      $output != *"src/tracking/sqlite/mlflow_schema.sql is the pinned MLflow's schema"* ]]; then
  echo "FAIL: the kept schema does not pass: $output"; failures=$((failures + 1))
fi
for i in "${!copies[@]}"; do
  if [[ $output != *"${copies[$i]} is not the pinned MLflow's schema"* ]]; then
    echo "FAIL: ${names[$i]}: the check did not name the file: $output"; failures=$((failures + 1))
  else
    echo "ok: ${names[$i]} is caught"
  fi
done
exit $((failures > 0))
