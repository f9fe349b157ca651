"""The reference for bench_tracking: MLflow's own Python client logging COUNT metrics into
a run with log_batch (1000 per request, MLflow's limit), timed without the import.
Usage: mlflow_log_batch.py URI COUNT; prints seconds=<the time the logging took>."""
import sys
import time

from mlflow import MlflowClient
from mlflow.entities import Metric

uri, count = sys.argv[1], int(sys.argv[2])
client = MlflowClient(tracking_uri=uri)
run = client.create_run("0", run_name="python log_batch reference")
stamp = int(time.time() * 1000)
metrics = [Metric("loss", i * 0.5, stamp, i) for i in range(count)]
start = time.perf_counter()
for i in range(0, count, 1000):
    client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000], synchronous=True)
elapsed = time.perf_counter() - start
client.set_terminated(run.info.run_id)
print(f"seconds={elapsed:.6f}", flush=True)
