#!/usr/bin/env bash
# ci/mlflow-schema on copies of the kept schema: the kept file passes; each edit of a copy
# (a column dropped, a table renamed, an index added, the revision changed) fails the
# check, which names the file.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
check=$top/ci/mlflow-schema
kept=$top/src/tracking/sqlite/mlflow_schema.sql
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
"$check" --kept "$kept" >/dev/null || { echo "FAIL: the kept schema does not pass"; failures=$((failures + 1)); }
mutate() {  # mutate NAME SED-EXPRESSION: the copy, edited, must fail the check
  local name=$1 expression=$2 copy=$work/$1.sql output
  sed "$expression" "$kept" >"$copy"
  if cmp -s "$copy" "$kept"; then
    echo "FAIL: $name: the edit changed nothing"; failures=$((failures + 1)); return
  fi
  if output=$("$check" --kept "$copy" 2>&1); then
    echo "FAIL: $name: the edited schema passed"; failures=$((failures + 1))
  elif [[ $output != *"$copy is not the pinned MLflow's schema"* ]]; then
    echo "FAIL: $name: the check did not name the file: $output"; failures=$((failures + 1))
  else
    echo "ok: $name is caught"
  fi
}
mutate column-dropped '/^\tsource_version VARCHAR(50),$/d'
mutate table-renamed 's/^CREATE TABLE "latest_metrics"/CREATE TABLE "latest_metric"/'
mutate index-added '$a CREATE INDEX extra ON metrics (step);'
mutate revision-changed "s/VALUES ('dc11669786a5')/VALUES ('000000000000')/"
exit $((failures > 0))
