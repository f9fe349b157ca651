"""`sgpu run -- python script.py`: a program's ranks keep a function's promises. What a rank
started dies with the caller and with the program; torchrun's error files (@record) fill
the failure table; the fault plan acts, or the call says it did not."""

import os
import signal
import subprocess

import pytest

from conftest import processes_with_marker, wait_until
from sgpu_cli import SGPU, needs_cli
from sgpu_cli import sgpu_run as run

pytestmark = needs_cli


def test_what_a_rank_started_dies_when_sgpu_run_is_killed(tmp_path):
    marker = f"SGPU_TEST_MARKER={os.getpid()}-run-killed"
    child = run(tmp_path, """
        import subprocess, time
        subprocess.Popen(["sleep", "1000"])
        time.sleep(1000)
        """, "--gpus", "2", env={"SGPU_TEST_MARKER": marker.split("=", 1)[1]}, wait=False)
    # sgpu run, and for each rank its supervisor, the program and its sleep
    assert wait_until(lambda: len(processes_with_marker(marker)) == 7), processes_with_marker(marker)
    child.kill()
    child.communicate()
    assert wait_until(lambda: processes_with_marker(marker) == [], limit=10), processes_with_marker(marker)


def test_a_programs_ranks_know_their_places_through_the_rank_helpers(tmp_path):
    code, out, err = run(tmp_path, """
        import os, sgpu
        print("place", sgpu.get_global_rank(), sgpu.get_local_rank(), sgpu.get_world_size(),
              sgpu.get_local_world_size(), sgpu.get_node_rank(), os.environ["RANK"], sgpu.device())
        """, "--gpus", "3", env={"SGPU_TRACKING": "off"})
    assert code == 0, err
    places = sorted(line.split("place ", 1)[1] for line in out.splitlines() if "place " in line)
    # A Python program's cuda devices are the simulated GPUs (docs/simulation.md, "CUDA on sim").
    assert places == [f"{r} {r} 3 3 0 {r} cuda:{r}" for r in range(3)], out


@pytest.mark.parametrize("flags, fails, kept", [((), False, False), (("--keep-run-dir",), False, True),
                                                ((), True, True)])
def test_a_successful_launch_removes_its_run_folder_unless_asked_to_keep_it(tmp_path, flags, fails, kept):
    runs = tmp_path / "runs"
    code, _, err = run(tmp_path, f"""
        import os, sys
        print("logged", flush=True)
        sys.exit(3 if {fails} and os.environ["RANK"] == "1" else 0)  # rank 1 logs before it fails
        """, "--gpus", "2", "--log-dir", str(runs), *flags, env={"SGPU_TRACKING": "off"})
    assert code == (3 if fails else 0), err
    folders = list(runs.iterdir())
    assert len(folders) == (1 if kept else 0), folders
    if kept:
        assert (folders[0] / "rank-1" / "stdout.log").read_text() == "logged\n"


def test_what_a_program_left_behind_dies_when_it_ends(tmp_path):
    marker = f"SGPU_TEST_MARKER={os.getpid()}-run-orphans"
    code, out, err = run(tmp_path, """
        import subprocess
        # in a session of its own: out of the rank's process group
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        print("left a sleep behind")
        """, "--gpus", "2", env={"SGPU_TEST_MARKER": marker.split("=", 1)[1]})
    assert code == 0, err
    assert out.count("left a sleep behind") == 2
    assert wait_until(lambda: processes_with_marker(marker) == [], limit=10), processes_with_marker(marker)


def test_a_ranks_torchrun_error_file_fills_the_failure_table(tmp_path):
    code, _, err = run(tmp_path, """
        import os, time
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            if os.environ["RANK"] == "1":
                raise ValueError("rank one's data is bad")
            time.sleep(30)

        main()
        """, "--gpus", "2")
    assert code == 1
    assert "rank 1" in err and "threw ValueError: rank one's data is bad" in err
    assert "<- root cause" in err


@pytest.mark.parametrize("plan, expect, code", [
    ("rank=1:exit=3@start", "code 3", 3),
    ("rank=0:segv@after=300ms", "SIGSEGV", 128 + signal.SIGSEGV),
    ("rank=1:throw@start", "threw", 1),
])
def test_start_and_timed_faults_act_on_a_program(tmp_path, plan, expect, code):
    rc, _, err = run(tmp_path, """
        import time
        time.sleep(20)
        """, "--gpus", "2", env={"SGPU_SIM_FAULTS": plan})
    assert rc == code, err
    assert expect in err and "<- root cause" in err


COLLECTIVES = """
    import sgpu, torch, torch.distributed as dist
    dist.init_process_group({backend!r})
    for _ in range(4):
        t = torch.ones(2)
        dist.all_reduce(t)
    dist.destroy_process_group()
    print("done", t.tolist())
"""


def test_collective_faults_act_in_a_python_program_on_the_sgpu_backend(tmp_path):
    rc, _, err = run(tmp_path, COLLECTIVES.format(backend="sgpu"), "--gpus", "2",
                     env={"SGPU_SIM_FAULTS": "rank=1:segv@collective=2"})
    assert rc == 128 + signal.SIGSEGV, err
    assert "rank 1" in err and "SIGSEGV" in err


def test_a_fault_that_never_acts_fails_the_call_instead_of_being_ignored(tmp_path):
    # gloo's collectives are not sgpu's: the planned fault cannot act
    rc, out, err = run(tmp_path, COLLECTIVES.format(backend="gloo"), "--gpus", "2",
                       env={"SGPU_SIM_FAULTS": "rank=1:segv@collective=2"})
    assert out.count("done") == 2
    assert rc != 0
    assert "the fault plan did not act" in err
    assert "rank=1:segv@collective=2: rank 1 ran fewer than 2 collectives" in err


def test_mlflow_and_sgpu_logging_in_a_scripts_ranks_both_arrive_once(tmp_path):
    database = "sqlite:///" + str(tmp_path / "mlflow.db")
    # MLflow's own log_metric is one SQLite transaction a point, taken in turn by 8 ranks,
    # so fewer of those: on a loaded machine 8 x 300 of them took past two minutes.
    points = {"mlflow": 50, "sgpu": 300}
    code, _, err = run(tmp_path, f"""
        import os, mlflow, sgpu
        rank = int(os.environ["RANK"])
        for step in range({points["mlflow"]}):
            mlflow.log_metric(f"mlflow/r{{rank}}", float(step), step=step)
        for step in range({points["sgpu"]}):
            sgpu.log_metric(f"sgpu/r{{rank}}", float(step), step=step)
        """, "--gpus", "8", env={"MLFLOW_TRACKING_URI": database}, timeout=300)
    assert code == 0, err
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=database)
    (run_,) = client.search_runs(experiment_ids=["0"])
    assert run_.info.status == "FINISHED" and run_.info.run_name == "script.py"
    for rank in range(8):
        for source, count in points.items():
            key = f"{source}/r{rank}"
            history = client.get_metric_history(run_.info.run_id, key)
            assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(count)], key


def test_the_run_of_a_caller_killed_outright_is_ended_killed_by_the_next_sync(tmp_path):
    database = "sqlite:///" + str(tmp_path / "mlflow.db")
    runs = tmp_path / "runs"
    marker = f"SGPU_TEST_MARKER={os.getpid()}-run-sigkill-tracked"
    child = run(tmp_path, """
        import os, time
        print("up", flush=True)
        time.sleep(1000)
        """, "--gpus", "2", "--log-dir", str(runs),
                env={"MLFLOW_TRACKING_URI": database, "SGPU_TEST_MARKER": marker.split("=", 1)[1]},
                wait=False)
    assert wait_until(lambda: len(processes_with_marker(marker)) == 5), processes_with_marker(marker)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=database)

    def status():
        return [r.info.status for r in client.search_runs(experiment_ids=["0"])]

    def sync():
        return subprocess.run([SGPU, "tracking", "sync", "--log-dir", str(runs)],
                              capture_output=True, text=True, timeout=60)

    synced = sync()  # the caller lives: its record is locked, and left alone
    assert synced.returncode == 0, synced.stderr
    assert status() == ["RUNNING"]
    child.kill()
    child.communicate()
    assert wait_until(lambda: processes_with_marker(marker) == [], limit=10)
    assert status() == ["RUNNING"]  # nobody was left to end it
    synced = sync()
    assert synced.returncode == 0, synced.stderr
    assert "left running by a caller that died" in synced.stderr + synced.stdout
    (ended,) = client.search_runs(experiment_ids=["0"])
    assert ended.info.status == "KILLED"
    assert ended.info.end_time >= ended.info.start_time
    assert sync().returncode == 0 and status() == ["KILLED"]  # ended once; nothing left pending
    assert not list(runs.glob("*/tracking-pending.json"))


def test_a_hung_programs_verdict_names_the_rank_and_quotes_its_python_stack(tmp_path):
    runs = tmp_path / "runs"
    code, _, err = run(tmp_path, """
        import torch, torch.distributed as dist, sgpu
        dist.init_process_group("sgpu")
        for step in range(3):
            dist.all_reduce(torch.ones(4))
        """, "--gpus", "3", "--hang-timeout", "3", "--log-dir", str(runs),
                       env={"SGPU_SIM_FAULTS": "rank=1:hang@collective=2", "SGPU_TRACKING": "off"})
    assert code == 124, err
    assert ("rank 1 never entered collective #2 (all_reduce of 4 float32 (sum)): "
            "ranks 0, 2 have waited in it for") in err, err
    quoted = err.split("the stack of rank 1 (pid ", 1)[1]
    assert "Python:" in quoted and 'script.py", line 5 in <module>' in quoted, err
    (folder,) = runs.iterdir()
    stacks = (folder / "stacks.txt").read_text()
    for rank in range(3):  # every program's, the waiting ones in their all_reduce
        assert f"rank {rank} (pid " in stacks, stacks
    assert stacks.count('script.py", line 5 in <module>') == 3, stacks


def test_a_program_that_does_not_import_sgpu_is_not_asked_for_stacks(tmp_path):
    code, _, err = run(tmp_path, """
        import time
        time.sleep(60)
        """, "--gpus", "2", "--timeout", "3", env={"SGPU_TRACKING": "off"})
    assert code == 124, err
    # Not signalled (the signal would have killed it): both still ran at the deadline.
    assert err.count("still running at the deadline") == 2, err
    assert "every live rank's stacks" not in err, err


def test_a_runs_folder_that_fills_up_is_said_and_never_crashes_the_caller(tmp_path, small_filesystem):
    """Logs that fill the folder stop there, said once a rank, and the call succeeds (the
    collective rings were allocated up front: a sparse ring on a full filesystem was a
    SIGBUS for the caller reading it); a folder already full fails the ranks, naming it."""
    small = small_filesystem("2m")
    body = """
        import torch, torch.distributed as dist, sgpu
        dist.init_process_group("sgpu")
        dist.all_reduce(torch.ones(4))
        for line in range(20000):
            print(f"line {line:05d} " + "x" * 90)
        dist.all_reduce(torch.ones(4))
        print("end", flush=True)
        """
    code, out, err = run(tmp_path, body, "--gpus", "2", "--log-dir", str(small),
                         env={"SGPU_TRACKING": "off"})
    assert code == 0, err
    for rank in range(2):
        assert out.count(f"[rank {rank}] line ") == 20000 and f"[rank {rank}] end" in out
        assert err.count(f"sgpu: rank {rank}'s log {small}/") == 1, err
    assert "stdout.log is incomplete from here: No space left on device" in err, err
    with open(small / "filler", "wb", buffering=0) as filler:  # what room is left, taken
        try:
            while filler.write(b"\0" * 4096):
                pass
        except OSError:
            pass
    code, out, err = run(tmp_path, body, "--gpus", "2", "--log-dir", str(small),
                         env={"SGPU_TRACKING": "off"})
    assert code == 1, err
    assert "cannot allocate the collective ring" in err and "No space left on device" in err, err


@pytest.mark.parametrize("timeout", ["1e10", "inf", "1e400", "9.3e15", "none", "30"])
def test_any_long_enough_timeout_lets_a_quick_program_finish(tmp_path, timeout):
    code, out, err = run(tmp_path, "print('done')", "--gpus", "2", "--timeout", timeout,
                         "--hang-timeout", timeout, env={"SGPU_TRACKING": "off"})
    assert code == 0, err
    assert out.count("done") == 2


@pytest.mark.parametrize(
    "timeout, says",
    [
        ("nan", 'takes seconds or none, got "nan"'),
        ("abc", 'takes seconds or none, got "abc"'),
        (" 5", 'takes seconds or none, got " 5"'),
        ("0", "must be positive, got 0 ms; use --timeout none for no deadline"),
        ("-5", "must be positive, got -5000 ms; use --timeout none for no deadline"),
    ],
)
def test_a_timeout_that_is_no_positive_number_is_refused(tmp_path, timeout, says):
    code, _, err = run(tmp_path, "print('done')", "--gpus", "1", "--timeout", timeout,
                       env={"SGPU_TRACKING": "off"})
    assert code == 2, err
    assert f"--timeout {says}" in err


def test_an_unknown_flag_is_named_with_the_one_meant(tmp_path):
    done = subprocess.run([SGPU, "run", "--gpu", "2", "--", "echo", "hi"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown flag --gpu (did you mean --gpus?)" in done.stderr
    assert "arguments not expected" not in done.stderr
