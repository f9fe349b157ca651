"""Calls tracked in an MLflow database (sqlite:///...): MLflow's own client, `mlflow server`
and the ranks' own mlflow.log_metric all work on the database sgpu writes."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import mlflow
import pytest

import sgpu
from conftest import wait_until
from sgpu import distributed


@pytest.fixture
def database(tmp_path, monkeypatch):
    uri = "sqlite:///" + str(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # no file store here
    return uri


def logs_both_ways(points):
    import mlflow

    rank = sgpu.get_global_rank()
    for step in range(max(points.values())):
        if step < points["mlflow"]:
            mlflow.log_metric(f"mlflow/r{rank}", float(step), step=step)
        if step < points["sgpu"]:
            sgpu.log_metric(f"sgpu/r{rank}", float(step), step=step)
    mlflow.log_param(f"p{rank}", rank)
    return rank


def test_mlflows_client_and_sgpus_logger_in_eight_ranks_lose_nothing(database):
    # MLflow's own log_metric is one SQLite transaction a point, taken in turn by 8 ranks,
    # so fewer of those than of sgpu's, which batches; the two still interleave.
    points = {"mlflow": 100, "sgpu": 1000}
    assert distributed(gpus=8, timeout=600)(logs_both_ways).distributed(points) == list(range(8))
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "logs_both_ways"
    client = mlflow.MlflowClient()
    for rank in range(8):
        for source, count in points.items():
            key = f"{source}/r{rank}"
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(count)], key
        assert run.data.params[f"p{rank}"] == str(rank)


READ_BACK = """
import json, mlflow
runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
client = mlflow.MlflowClient()
print(json.dumps([{
    "name": r.info.run_name, "status": r.info.status, "tags": r.data.tags,
    "params": r.data.params,
    "loss": sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, "loss")),
} for r in runs]))
"""


def read_back_in(folder, **variables) -> list:
    """The runs MLflow's own client finds in `folder` with no MLflow variable set but
    `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(variables)
    out = subprocess.run([sys.executable, "-c", READ_BACK], cwd=folder, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def logs_loss():
    import mlflow

    for step in range(5):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    return sgpu.get_global_rank()


def test_with_no_setting_a_call_lands_in_mlflows_default_database(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert distributed(gpus=2)(logs_loss).distributed() == [0, 1]
    assert (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    (run,) = read_back_in(tmp_path)
    assert run["name"] == "logs_loss" and run["status"] == "FINISHED"
    assert run["params"]["gpus"] == "2"
    # both ranks logged the same points
    assert sorted({tuple(point) for point in run["loss"]}) == [(s, 1.0 / (s + 1)) for s in range(5)]


def test_a_folder_whose_mlruns_holds_runs_keeps_using_it(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_URI",):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    distributed(gpus=1, tracking_uri="mlruns")(logs_loss).distributed()  # a file store here
    distributed(gpus=1)(logs_loss).distributed()  # MLflow's rule: ./mlruns has data, so it
    assert not (tmp_path / "mlflow.db").exists()
    assert len(read_back_in(tmp_path, MLFLOW_ALLOW_FILE_STORE="true")) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_ui_with_no_flags_lists_the_calls_runs(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    database = "sqlite:///mlflow.db"  # what the Python client uses here too, by default
    @distributed(gpus=2)
    def nested():
        import mlflow

        mlflow.log_metric("m", 1.0)
        return sgpu.get_global_rank()

    with mlflow.start_run(run_name="outer") as outer:
        assert nested.distributed() == [0, 1]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    log = open(tmp_path / "ui.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=log, cwd=tmp_path, env=env)
    try:
        base = f"http://127.0.0.1:{port}"

        def up():
            if server.poll() is not None:
                return True  # it ended: said below
            try:
                return urllib.request.urlopen(base + "/health", timeout=2).status == 200
            except OSError:
                return False

        # It starts in about 25 s on an idle machine, and has taken past a minute beside
        # ci/test's other tests and builds.
        assert wait_until(up, limit=180), "mlflow ui did not answer in 180 s"
        assert server.poll() is None, "mlflow ui ended:\n" + (tmp_path / "ui.log").read_text()
        request = urllib.request.Request(
            base + "/api/2.0/mlflow/runs/search", method="POST",
            data=json.dumps({"experiment_ids": ["0"]}).encode(),
            headers={"Content-Type": "application/json"})
        runs = json.load(urllib.request.urlopen(request, timeout=10))["runs"]
        by_name = {r["info"]["run_name"]: r for r in runs}
        assert set(by_name) == {"outer", "nested"}
        tags = {t["key"]: t["value"] for t in by_name["nested"]["data"]["tags"]}
        assert tags["mlflow.parentRunId"] == outer.info.run_id
        assert by_name["nested"]["info"]["status"] == "FINISHED"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def logs_out_of_order():
    import time

    points = [("loss", 10, 10.0), ("loss", 5, 5.0), ("same", 7, 1.0), ("same", 7, 2.0),
              ("later", 3, 3.0), ("later", 3, -1.0)]
    for key, step, value in points:
        sgpu.log_metric(key, value, step=step)
        time.sleep(0.005)  # timestamps in the order of the calls
    return 0


def test_the_latest_metric_is_mlflows_whatever_the_order_steps_arrive_in(database, tmp_path):
    """MLflow shows a key's point with the greatest (step, timestamp, value): the step-10 loss
    even when step 5 arrived last. The same points through MLflow's own client into a twin
    database leave the same latest values."""
    distributed(gpus=1)(logs_out_of_order).distributed()
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    client = mlflow.MlflowClient()
    history = [m for key in ("loss", "same", "later")
               for m in client.get_metric_history(run.info.run_id, key)]
    twin = mlflow.MlflowClient(tracking_uri="sqlite:///" + str(tmp_path / "twin.db"))
    twin_run = twin.create_run(twin.create_experiment("twin"))
    for m in sorted(history, key=lambda m: m.timestamp):  # in the order sgpu logged them
        twin.log_batch(twin_run.info.run_id, metrics=[m])
    keys = ("loss", "same", "later")
    ours = {k: client.get_run(run.info.run_id).data.metrics[k] for k in keys}
    theirs = {k: twin.get_run(twin_run.info.run_id).data.metrics[k] for k in keys}
    assert ours == theirs
    assert ours["loss"] == 10.0 and ours["same"] == 2.0


def test_a_calls_run_names_the_script_or_notebook_it_came_from(database, tmp_path, monkeypatch):
    # As MLflow's own client names a run's source: the script, not the interpreter; the
    # notebook a Jupyter kernel runs (JPY_SESSION_NAME).
    import sys
    import types

    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    monkeypatch.setattr(sys, "argv", [str(script)])
    distributed(gpus=1)(logs_loss).distributed()
    monkeypatch.setenv("JPY_SESSION_NAME", "/Workspace/Users/me/train.ipynb")
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))  # a kernel
    distributed(gpus=1)(logs_loss).distributed()
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list",
                              order_by=["attributes.start_time ASC"])
    assert [run.data.tags["mlflow.source.name"] for run in runs] == [
        str(script), "/Workspace/Users/me/train.ipynb"]
