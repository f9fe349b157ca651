"""Notebooks written for Databricks' serverless GPUs, executed unchanged on simulated GPUs:
the example notebooks cell by cell in a fresh kernel (nbclient, as `jupyter execute` runs
them), and `serverless_gpu`/`databricks.air` from sgpu's stand-ins only where no real
package of that name is installed (NOTE [Stand-in imports])."""

import importlib
import os
import pathlib
import subprocess
import sys
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

import sgpu

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebooks"


def execute(notebook: nbformat.NotebookNode, folder: pathlib.Path) -> nbformat.NotebookNode:
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    return notebook


@pytest.mark.parametrize("name", ["train_on_gpus.ipynb", "data_and_checkpoints.ipynb"])
def test_the_example_notebooks_run_unchanged_on_simulated_gpus(name, tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUME", str(tmp_path / "volume"))
    done = execute(nbformat.read(NOTEBOOKS / name, as_version=4), tmp_path)
    errors = [o for cell in done.cells for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors


def code_notebook(*sources: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(s))
                                           for s in sources])


def test_an_installed_serverless_gpu_wins_over_the_stand_in(tmp_path, monkeypatch):
    real = tmp_path / "site" / "serverless_gpu"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = execute(code_notebook("import serverless_gpu\nprint(serverless_gpu.REAL, serverless_gpu.__file__)"),
                   tmp_path)
    assert done.cells[0].outputs[0].text == f"True {real / '__init__.py'}\n"


def python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)


def test_the_stand_ins_are_found_and_can_be_turned_off():
    found = python("""
        import serverless_gpu, serverless_gpu.launcher, databricks.air
        print(serverless_gpu.__file__, serverless_gpu.launcher.distributed is serverless_gpu.distributed)
        """)
    assert found.returncode == 0, found.stderr
    assert "sgpu/stand_in/serverless_gpu/__init__.py True" in found.stdout
    off = python("import serverless_gpu", SGPU_SERVERLESS_GPU="off")
    assert "ModuleNotFoundError: No module named 'serverless_gpu'" in off.stderr


def test_the_stand_ins_take_on_and_off_as_sgpus_other_variables_do():
    on = ["on", "1", "true", "yes", "ON", "True", ""]  # empty: unset, as the option table reads it
    off = ["off", "0", "false", "no", "OFF", "False"]
    found = python(f"""
        import importlib.util, os
        for value in {on + off!r}:
            os.environ["SGPU_SERVERLESS_GPU"] = value
            print(importlib.util.find_spec("serverless_gpu") is not None)
        """)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["True"] * len(on) + ["False"] * len(off)
    at_start = python("import serverless_gpu", SGPU_SERVERLESS_GPU="0")
    assert "ModuleNotFoundError: No module named 'serverless_gpu'" in at_start.stderr
    # Any other value is refused where a stand-in is imported; an interpreter that imports
    # none runs as ever.
    plain = python("print('ran')", SGPU_SERVERLESS_GPU="maybe")
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "ran\n", "")
    refused = python("import serverless_gpu", SGPU_SERVERLESS_GPU="maybe")
    assert ('sgpu: SGPU_SERVERLESS_GPU=maybe is neither on nor off: "off" (or 0, false, no) or '
            '"on" (or 1, true, yes); the stand-ins for serverless_gpu and databricks.air stay '
            'off\n') in refused.stderr
    assert "ModuleNotFoundError: No module named 'serverless_gpu'" in refused.stderr


def test_a_module_the_stand_in_does_not_offer_raises_not_offered_where_imported(tmp_path):
    from sgpu.stand_in import NotOfferedError

    with pytest.raises(NotOfferedError, match=r"^serverless_gpu\.ray_launch is part of Databricks' "
                                               r"serverless GPU API that sgpu's stand-in for "
                                               r"serverless_gpu does not offer"):
        import serverless_gpu.ray_launch  # noqa: F401
    with pytest.raises(NotOfferedError, match=r"^databricks\.air\.jobs is part of Databricks"):
        importlib.import_module("databricks.air.jobs")
    # An installed package's missing module is its own affair.
    real = tmp_path / "site" / "serverless_gpu"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("")
    done = python("import serverless_gpu.ray_launch",
                  PYTHONPATH=f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    assert "ModuleNotFoundError: No module named 'serverless_gpu.ray_launch'" in done.stderr


def test_the_stand_ins_check_what_databricks_checks(monkeypatch):
    from serverless_gpu import distributed, runtime
    from serverless_gpu.compute import GPUType

    import databricks.air as air

    def where():
        return runtime.get_global_rank(), runtime.get_world_size(), runtime.get_local_rank()

    assert distributed(gpus=2, gpu_type=GPUType.H100, remote=False, tracking=False)(where) \
        .distributed() == [(0, 2, 0), (1, 2, 1)]
    assert air.distributed(num_accelerators=2, accelerator_type="GPU_2xH100", tracking=False)(where) \
        .distributed() == [(0, 2, 0), (1, 2, 1)]
    with pytest.raises(sgpu.AcceleratorMismatchError, match="H100"):
        distributed(gpus=2, gpu_type=GPUType.H100, sim_node="2xA10", tracking=False)(where).distributed()
    # Remote GPUs are simulated nodes on sim: A10s one a node, as Databricks provisions them.
    assert distributed(gpus=2, gpu_type=GPUType.A10, remote=True, tracking=False)(
        lambda: where() + (sgpu.get_node_rank(), __import__("torch").cuda.device_count())
    ).distributed() == [(0, 2, 0, 0, 1), (1, 2, 0, 1, 1)]
    monkeypatch.setenv("SGPU_BACKEND", "cuda")
    with pytest.raises(sgpu.ConfigError, match="remote=True asks Databricks to provision remote GPUs"):
        distributed(gpus=2, remote=True)
    monkeypatch.setenv("SGPU_BACKEND", "sim")
    with pytest.raises(sgpu.ConfigError, match="accelerator_type='TPU_v5' is not of the form"):
        air.distributed(accelerator_type="TPU_v5")
    with pytest.raises(ImportError, match="serverless_gpu.ray_launch is part of Databricks"):
        from serverless_gpu import ray_launch  # noqa: F401
    import serverless_gpu

    with pytest.raises(sgpu.Error, match="serverless_gpu.compute.TPU is part of Databricks"):
        serverless_gpu.compute.TPU  # noqa: B018
    assert str(GPUType.H100) == "H100" and GPUType.A10 == "A10"


def test_a_notebooks_run_is_in_its_own_experiment_and_shown_as_a_page(tmp_path, monkeypatch):
    import mlflow

    database = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", database)
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "churn model.ipynb"))  # as Jupyter's server
    call = """
        from serverless_gpu import distributed
        print(distributed(gpus=1)(lambda: 1).distributed())
        """
    done = execute(code_notebook(call), tmp_path)
    shown = "".join(o.get("data", {}).get("text/html", "") for o in done.cells[0].outputs)
    assert "run <code>mlflow ui --backend-store-uri " + database + "</code>, then open" in shown
    assert 'href="http://127.0.0.1:5000/#/experiments/' in shown
    # The reader finds the database through MLFLOW_TRACKING_URI, as the call did: a
    # set_tracking_uri() here would outlive the test in this process.
    assert len(mlflow.search_runs(experiment_names=["churn model"])) == 1
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "chosen")  # wins, as on Databricks
    execute(code_notebook(call), tmp_path)
    assert len(mlflow.search_runs(experiment_names=["chosen"])) == 1
    assert len(mlflow.search_runs(experiment_names=["churn model"])) == 1
