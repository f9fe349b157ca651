#!/usr/bin/env bash
# A short bench_collectives on 2 simulated ranks: every operation and data type runs through
# sgpu and through the floor (and Open MPI, where built), every first result is correct
# (the binary exits 1 otherwise), and the JSON and the table hold every row, with the
# collective model's prediction for the simulated node beside each sgpu row. Then `sgpu
# model fit` fits a platform to the run, which predicts the run's times again. Speed is not
# checked.
#   collectives_smoke.sh BENCH_COLLECTIVES PYTHON WORKDIR
set -euo pipefail
bench=$1 python=$2 work=$3
mkdir -p "$work"
"$bench" --backend sim --gpus 2 --min-bytes 8 --max-bytes 64K --warmup 1 --iters 2 \
  --timeout 300 --benchmark_out="$work/smoke.json" --benchmark_out_format=json \
  --table "$work/smoke.txt"
"$python" - "$work/smoke.json" "$work/smoke.txt" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
# Google Benchmark names them <op>/<dtype>/<bytes>/<who>/iterations:1/manual_time.
rows = {"/".join(b["name"].split("/")[:2 if b["name"].startswith("barrier/") else 4]): b
        for b in run["benchmarks"]}
errors = [n for n, b in rows.items() if b.get("error_occurred")]
assert not errors, f"failed rows: {errors}"
for op in ["allreduce", "allgather", "reducescatter", "broadcast", "alltoall"]:
    for dtype in ["float32", "bfloat16"]:
        for who in ["sgpu", "floor"]:
            # 8 B..64 KiB by doubling; split operations start where each rank gets an element.
            sizes = [int(n.split("/")[2]) for n in rows
                     if n.startswith(f"{op}/{dtype}/") and n.endswith("/" + who)]
            assert len(sizes) >= 13 and max(sizes) == 65536, (op, dtype, who, sorted(sizes))
for name, b in rows.items():
    assert b["wrong"] == 0 and b["ranks"] == 2, (name, b)
    if name.endswith("/sgpu") and not name.startswith("barrier"):
        assert b["busbw_GBps"] > 0 and b["vs_floor"] > 0, (name, b)
        # 2 of 8xH100's GPUs: h100-nvswitch's times, a few microseconds at these sizes.
        assert 1 < b["model_us"] < 100 and b["model_busbw_GBps"] > 0, (name, b)
assert "barrier/sgpu" in rows and "barrier/floor" in rows
# Open MPI's rows (float32 on sim), when the reference was built: one per sgpu row.
if run["context"].get("openmpi", "off") != "off":
    for name in [n for n in rows if n.endswith("/sgpu") and "/bfloat16/" not in n]:
        twin = name[:-len("/sgpu")] + "/openmpi"
        assert twin in rows, f"no {twin}"
        assert rows[twin]["wrong"] == 0 and rows[name]["vs_openmpi"] > 0, (twin, rows[name])
for key in ["sgpu_version", "sgpu_commit", "libtorch", "backend", "gpus", "interconnect"]:
    assert run["context"].get(key), f"context lacks {key}"
table = open(sys.argv[2]).read()
assert "allreduce" in table and "vs_floor" in table and "model(us)" in table, table
assert "# model: the collective model's time and busbw on h100-nvswitch" in table, table
print(f"smoke: {len(rows)} rows, all correct")
PY

# The fit: a platform from this run predicts each size's fastest sgpu time again.
sgpu=$(dirname "$bench")/sgpu
"$sgpu" model fit "$work/smoke.json" --name smoke-node -o "$work/smoke-node.json"
"$sgpu" model predict "$work/smoke-node.json" --ops all_reduce,all_gather --ranks 2 \
  --min-bytes 8 --max-bytes 64K >"$work/predicted.txt"
"$python" - "$work/smoke.json" "$work/predicted.txt" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
names = {"allreduce": "all_reduce", "allgather": "all_gather"}
fastest = {}
for b in run["benchmarks"]:
    parts = b["name"].split("/")
    if len(parts) < 4 or parts[3] != "sgpu" or parts[0] not in names:
        continue
    key = (names[parts[0]], int(parts[2]))
    fastest[key] = min(fastest.get(key, float("inf")), b["real_time"])  # microseconds
seen = 0
for line in open(sys.argv[2]):
    words = line.split()
    if line.startswith("#") or len(words) < 3 or (words[0], int(words[1])) not in fastest:
        continue
    want = fastest[(words[0], int(words[1]))]
    got = float(words[2])
    assert abs(got - want) <= 0.01 + 1e-3 * want, (words, want)
    seen += 1
assert seen == len(fastest), (seen, len(fastest))
print(f"fit: {seen} sizes predicted again")
PY
