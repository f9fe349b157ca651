"""sgpu's pytest plugin in users' own suites: the --sgpu-backend/--sgpu-node options and the
sgpu_sim fixture choose where calls run; a test that fails by a failed call gets a report
section with the failure table and the run folder; a suite that never uses sgpu sees
nothing of it, not even an import (it is loaded here with -p sgpu_pytest, as the pytest11
entry point loads it where sgpu is installed)."""

import os
import subprocess
import sys
import textwrap


def run_suite(tmp_path, source: str, *options: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if k not in ("SGPU_BACKEND", "SGPU_SIM")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "sgpu_pytest", *options, "test_suite.py"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)


def test_a_suite_chooses_its_backend_and_nodes_without_code_changes(tmp_path):
    done = run_suite(tmp_path, """
        import os
        import sgpu
        import torch

        def kind():
            return torch.cuda.get_device_name(sgpu.device())

        def test_the_sessions_node():
            assert os.environ["SGPU_BACKEND"] == "sim"
            got = sgpu.distributed(gpus=2, tracking=False)(kind).distributed()
            assert got == ["NVIDIA H200"] * 2

        def test_a_node_of_its_own(sgpu_sim):
            sgpu_sim(node="2xA10")
            assert sgpu.distributed(gpus=2, tracking=False)(kind).distributed() == ["NVIDIA A10"] * 2

        def test_a_fault_plan_of_its_own(sgpu_sim):
            sgpu_sim(faults="rank=1:exit=3@start")
            try:
                sgpu.distributed(gpus=2, tracking=False)(kind).distributed()
            except sgpu.DistributedError as error:
                assert error.root_cause.rank == 1
            else:
                raise AssertionError("the plan did not act")
        """, "--sgpu-backend", "sim", "--sgpu-node", "2xH200")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 passed" in done.stdout


def test_a_failed_call_puts_its_table_and_run_folder_in_the_report(tmp_path):
    done = run_suite(tmp_path, """
        import sgpu

        def fails():
            if sgpu.get_global_rank() == 1:
                raise ValueError("rank 1 is unhappy")
            return 0

        def test_training():
            sgpu.distributed(gpus=2, tracking=False)(fails).distributed()
        """, "--sgpu-backend", "sim")
    assert done.returncode == 1
    section = done.stdout[done.stdout.index("- sgpu call -"):]
    assert "root cause: rank 1" in section and "ValueError: rank 1 is unhappy" in section
    assert "run folder: " in section


def test_the_plugin_is_inert_in_a_suite_that_does_not_use_sgpu(tmp_path):
    done = run_suite(tmp_path, """
        import sys

        def test_plain():
            assert "torch" not in sys.modules and "sgpu" not in sys.modules

        def test_failing():
            raise ValueError("an ordinary failure")
        """)
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout
    assert "sgpu" not in done.stdout


def test_where_the_flag_chose_the_backend_the_advice_names_the_flag(tmp_path):
    suite = """
        import sgpu

        def zero():
            return 0

        def test_training():
            sgpu.distributed(gpus=2, tracking=False)(zero).distributed()

        def test_the_variable_set_by_the_test(monkeypatch):
            monkeypatch.setenv("SGPU_BACKEND", "cuda")
            sgpu.distributed(gpus=2, tracking=False)(zero).distributed()
        """
    # No GPU here: neither cuda nor auto finds one, and the advice is to simulate them.
    done = run_suite(tmp_path, suite, "--sgpu-backend", "cuda", "-k", "training")
    assert done.returncode == 1 and "1 failed" in done.stdout
    assert ("Run on a GPU node, or pass --sgpu-backend sim (this session's --sgpu-backend "
            "cuda, which sets SGPU_BACKEND, decides the backend here, whatever backend says) "
            "to simulate one") in done.stdout
    assert "SGPU_BACKEND=sim" not in done.stdout
    done = run_suite(tmp_path, suite, "--sgpu-backend", "auto")
    assert done.returncode == 1 and "2 failed" in done.stdout
    assert ("To run on simulated GPUs, pass --sgpu-backend sim (this session's --sgpu-backend "
            "auto, which sets SGPU_BACKEND") in done.stdout
    assert "set SGPU_BACKEND=sim (SGPU_BACKEND=auto" not in done.stdout
    # Where the test itself set the variable, the advice names the variable, as sgpu says it.
    assert "set SGPU_BACKEND=sim (SGPU_BACKEND=cuda decides the backend here" in done.stdout
