"""Reads runs back through MLflow's own Python client, for the tracking tests.

One JSON request per line on stdin, one JSON answer per line on stdout, so a test binary
pays MLflow's import once:
  {"uri": U, "runs": [ID, ...]}      -> {ID: {"info": ..., "params": ..., "tags": ...,
                                              "metrics": {KEY: [[step, value, ts], ...]}}}
  {"uri": U, "children": ID}         -> [child run ids]
  {"uri": U, "experiment": NAME}     -> experiment id or null
  {"migrate": DIR, "target": SQLITE} -> null, after `mlflow migrate-filestore` of DIR
Non-finite values are written as the strings "nan", "inf", "-inf".
"""
import json
import math
import os
import sys

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
# Answers go to the original stdout; whatever MLflow prints goes to stderr.
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
from mlflow import MlflowClient  # noqa: E402


def number(value):
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def read_run(client, run_id):
    run = client.get_run(run_id)
    metrics = {}
    for key in run.data.metrics:
        history = client.get_metric_history(run_id, key)
        metrics[key] = sorted([m.step, number(m.value), m.timestamp] for m in history)
    return {
        "info": {
            "status": run.info.status,
            "experiment_id": run.info.experiment_id,
            "run_name": run.info.run_name,
            "start_time": run.info.start_time,
            "end_time": run.info.end_time,
        },
        "params": run.data.params,
        "tags": run.data.tags,
        "metrics": metrics,
    }


def answer(request):
    if "migrate" in request:
        from pathlib import Path

        from mlflow.store.fs2db import migrate

        migrate(Path(request["migrate"]), request["target"], progress=False)
        return None
    client = MlflowClient(tracking_uri=request["uri"])
    if "runs" in request:
        return {run_id: read_run(client, run_id) for run_id in request["runs"]}
    if "children" in request:
        parent = client.get_run(request["children"])
        runs = client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{request['children']}'",
        )
        return sorted(r.info.run_id for r in runs)
    if "experiment" in request:
        experiment = client.get_experiment_by_name(request["experiment"])
        return experiment.experiment_id if experiment else None
    raise ValueError(f"unknown request {request}")


print(json.dumps({"ready": True}), file=answers, flush=True)
for line in sys.stdin:
    try:
        print(json.dumps({"ok": answer(json.loads(line))}), file=answers, flush=True)
    except Exception as error:  # the test shows what went wrong
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), file=answers, flush=True)
