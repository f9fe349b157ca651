#!/usr/bin/env bash
# A short bench_collectives on 2 simulated ranks: every operation and data type runs through
# sgpu and through the floor (and Open MPI, where built), every first result is correct
# (the binary exits 1 otherwise), and the JSON and the table hold every row. Speed is not
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
assert "allreduce" in table and "vs_floor" in table, table
print(f"smoke: {len(rows)} rows, all correct")
PY
