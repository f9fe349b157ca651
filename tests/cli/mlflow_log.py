"""A rank that logs with MLflow's own client, as the reference notebook's training
function does: no MLflow set-up of its own, only what `sgpu run` gives every rank
(MLFLOW_RUN_ID, MLFLOW_TRACKING_URI and what that store needs)."""
import os

import mlflow

rank = int(os.environ["RANK"])
for step in range(3):
    mlflow.log_metric(f"loss_rank{rank}", rank + step / 10, step=step)
print(f"rank {rank}: logged into {mlflow.active_run().info.run_id}", flush=True)
