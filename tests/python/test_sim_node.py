"""Every process on one simulated node: `sgpu sim -- COMMAND`, sgpu.simulate(), a program's
ranks, and what sim refuses as a GPU node refuses it (CUDA_VISIBLE_DEVICES, device
ordinals, a rank that never picks its GPU)."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from sgpu_cli import SGPU, needs_cli, sgpu_run

SUITE = pathlib.Path(__file__).resolve().parents[1] / "gpu_suite"


def off_node_env(**extra) -> dict:
    """The test's environment without SGPU_BACKEND: a process started with it is on a node."""
    env = {k: v for k, v in os.environ.items() if k not in ("SGPU_BACKEND", "SGPU_SIM")}
    env.update(extra)
    return env


def python(code: str, *prefix, env=None, timeout=120):
    done = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


SHOW = """
import torch
print(torch.cuda.is_available(), torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
      torch.cuda.current_device() if torch.cuda.device_count() else None)
"""


@needs_cli
def test_sgpu_sim_puts_the_command_and_its_children_on_the_node():
    code, out, err = python(SHOW, SGPU, "sim", "--node", "2xA10+1xH100", "--", env=off_node_env())
    assert code == 0, err
    assert out.split("\n")[0] == ("True 3 ['NVIDIA A10', 'NVIDIA A10', 'NVIDIA H100 80GB HBM3'] 0")
    # A grandchild, started through a shell, is on the same node.
    done = subprocess.run([SGPU, "sim", "--node", "4xA10", "--", "sh", "-c",
                           f"{sys.executable} -c 'import torch; print(torch.cuda.device_count())'"],
                          env=off_node_env(), capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "4", done.stderr


def test_without_a_node_a_process_sees_no_gpu():
    code, out, err = python(SHOW, env=off_node_env())
    assert code == 0, err
    assert out.startswith("False 0 [] None"), out


@pytest.mark.parametrize("off", ["off", "0", "false", "no"])
def test_sim_cuda_off_in_any_of_its_words_leaves_a_process_on_the_node_without_gpus(off):
    on = off_node_env(SGPU_BACKEND="sim", SGPU_SIM="2xH100")
    code, out, err = python(SHOW, env=on)
    assert code == 0, err
    assert out.startswith("True 2"), out
    code, out, err = python(SHOW, env={**on, "SGPU_SIM_CUDA": off})
    assert code == 0, err
    assert out.startswith("False 0 [] None"), out


def test_sim_cuda_neither_on_nor_off_is_said_once_and_serves_nothing():
    code, out, err = python(SHOW + "\nimport sgpu\n",
                            env=off_node_env(SGPU_BACKEND="sim", SGPU_SIM_CUDA="maybe"))
    assert code == 0, err
    assert out.startswith("False 0 [] None"), out
    assert err.count("SGPU_SIM_CUDA=maybe is neither on nor off") == 1, err


def test_the_startup_hook_takes_the_option_tables_on_and_off_words(monkeypatch):
    import _sgpu_startup
    from sgpu import _native

    monkeypatch.setattr(_sgpu_startup, "ON_NODE", True)  # as in a process on the node
    monkeypatch.delenv("SGPU_ROLE", raising=False)
    for word in _sgpu_startup._ON + _sgpu_startup._OFF:
        monkeypatch.setenv("SGPU_SIM_CUDA", word)
        assert _native.environment_flag("sim_cuda", True) == (word in _sgpu_startup._ON), word
        assert _sgpu_startup._wanted() == (word in _sgpu_startup._ON), word  # its hook


@needs_cli
def test_a_bad_node_or_a_command_that_is_not_there_says_so():
    done = subprocess.run([SGPU, "sim", "--node", "3xZZ", "--", "true"], capture_output=True,
                          text=True, env=off_node_env())
    assert done.returncode == 2 and 'unknown GPU type "ZZ"' in done.stderr, done.stderr
    done = subprocess.run([SGPU, "sim", "--", "no-such-command-here"], capture_output=True,
                          text=True, env=off_node_env())
    assert done.returncode == 127 and "cannot run no-such-command-here" in done.stderr


def test_sgpu_simulate_puts_a_running_process_on_the_node():
    code, out, err = python("""
        import sgpu, torch
        print(torch.cuda.device_count())
        sgpu.simulate("2xA100")
        print(torch.cuda.device_count(), torch.cuda.get_device_name(1))
        try:
            sgpu.simulate("4xA10")
        except sgpu.ConfigError as error:
            print("refused:", error)
    """, env=off_node_env())
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "0" and lines[1] == "2 NVIDIA A100-SXM4-80GB", out
    assert "on the simulated node 2xA100 already" in lines[2], out


@pytest.mark.parametrize("visible, expect", [
    ("3,1", "True 2 ['NVIDIA A10', 'NVIDIA H100 80GB HBM3'] 0"),
    ("0,2,-1,1", "True 2 ['NVIDIA H100 80GB HBM3', 'NVIDIA A10'] 0"),
    ("", "False 0 [] None"),
])
def test_cuda_visible_devices_renumbers_and_hides_as_cuda_does(visible, expect):
    env = off_node_env(SGPU_BACKEND="sim", SGPU_SIM="2xH100+2xA10", CUDA_VISIBLE_DEVICES=visible)
    code, out, err = python(SHOW, env=env)
    assert code == 0, err
    assert out.strip() == expect


def test_a_call_asks_for_more_gpus_than_cuda_visible_devices_leaves():
    env = off_node_env(SGPU_BACKEND="sim", CUDA_VISIBLE_DEVICES="0,1", SGPU_TRACKING="off")
    code, out, err = python("""
        import sgpu
        try:
            sgpu.distributed(gpus=4)(lambda: 0).distributed()
        except sgpu.AcceleratorMismatchError as error:
            print("mismatch:", error)
        print(sgpu.distributed(gpus=2)(lambda: __import__("torch").cuda.device_count()).distributed())
    """, env=env)
    assert code == 0, err
    assert "mismatch:" in out and "2 x H100" in out, out
    assert out.strip().endswith("[2, 2]"), out


@pytest.mark.parametrize("make", ['torch.zeros(1, device="cuda:8")', 'torch.ones(1).to("cuda:100")',
                                  "torch.cuda.set_device(9)"])
def test_a_device_past_the_node_fails_as_cuda_fails(make):
    env = off_node_env(SGPU_BACKEND="sim")
    code, out, err = python(f"""
        import torch
        try:
            {make}
        except torch.AcceleratorError as error:
            print("refused:", str(error).splitlines()[0])
    """, env=env)
    assert code == 0, err
    assert out.strip() == "refused: CUDA error: invalid device ordinal", out


@needs_cli
def test_a_programs_ranks_start_on_cuda_0_until_they_set_their_device(tmp_path):
    code, out, err = sgpu_run(tmp_path, """
        import os, torch
        before = torch.cuda.current_device()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        print("devices", before, torch.cuda.current_device(), flush=True)
    """, "--gpus", "2", env={"SGPU_TRACKING": "off"})
    assert code == 0, err
    assert "[rank 0] devices 0 0" in out and "[rank 1] devices 0 1" in out, out


def suite(*arguments, prefix=(), timeout=600):
    command = [*prefix, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "sgpu_pytest", *arguments]
    return subprocess.run(command, cwd=SUITE, capture_output=True, text=True, timeout=timeout,
                          env=off_node_env(SGPU_TRACKING="off"))


def test_a_gpu_gated_suite_runs_on_the_simulated_node_with_nothing_skipped():
    done = suite("--sgpu-node", "8xH100", "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "7 ran on the simulated node 8xH100; 0 still skipped" in done.stdout, done.stdout
    assert "7 passed" in done.stdout and "skipped" not in done.stdout.split("\n")[-2]


def test_without_a_node_the_plugin_says_what_was_skipped_for_want_of_a_gpu():
    done = suite("test_cuda_gated.py")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 ran on this machine; 4 still skipped" in done.stdout, done.stdout
    assert "3 skipped: CUDA is not available" in done.stdout
    assert "1 skipped: needs 2 GPUs" in done.stdout


FRAMEWORK_GATES = """
from lightning.pytorch.utilities.testing import _runif_reasons
from deepspeed.accelerator import get_accelerator
reasons, _ = _runif_reasons(min_cuda_gpus=8)
print(reasons, get_accelerator().device_name(), get_accelerator().device_count())
"""


@needs_cli
def test_lightnings_and_deepspeeds_gpu_gates_see_the_node():
    """Lightning's RunIf(min_cuda_gpus=8) has no reason to skip, DeepSpeed's accelerator (what
    its DistributedTest's world_size is checked against) is cuda with 8 devices."""
    code, out, err = python(FRAMEWORK_GATES, SGPU, "sim", "--", env=off_node_env())
    assert code == 0, err
    assert out.strip().split("\n")[-1] == "[] cuda 8", out


@needs_cli
def test_a_planted_placement_bug_fails_on_the_node_as_on_a_gpu_node():
    """Ranks that never call set_device are all on cuda:0: NCCL's "Duplicate GPU detected"."""
    done = suite("planted_placement_bug.py", prefix=(SGPU, "sim", "--"))
    assert done.returncode == 1, done.stdout[-3000:]
    # Whichever rank meets the other first says so.
    assert re.search(r"Duplicate GPU detected : rank [01] and rank [01] both on CUDA device 0",
                     done.stdout), done.stdout[-3000:]


TWO_PROCESSES = """
import subprocess, sys, torch
GiB = 1 << 30
holder = subprocess.Popen([sys.executable, "-c", '''
import sys, torch
block = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
print("held", flush=True)
sys.stdin.readline()
'''], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "held"
free, total = torch.cuda.mem_get_info()
print("free", free / GiB, "of", total / GiB, "own", torch.cuda.memory_allocated(), flush=True)
try:
    torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError as error:
    print("oom", str(error).split(" Including")[0], flush=True)
print("cuda:1 free", torch.cuda.mem_get_info(1)[0] / GiB, flush=True)
holder.kill()
holder.wait()
block = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
print("after", torch.cuda.mem_get_info()[0] / GiB, flush=True)
print("holder", holder.pid)
"""


@pytest.mark.parametrize("how", ["sgpu sim", "SGPU_BACKEND=sim"])
def test_two_processes_on_one_gpu_share_its_capacity(how):
    """A process holding 3 GiB of a 4 GiB GPU leaves 1 GiB to the others: mem_get_info says so,
    a 2 GiB allocation fails with CUDA's text naming the holder, and once the holder is gone
    its memory is free again. The other GPU is untouched."""
    if how == "sgpu sim":
        if not os.access(SGPU, os.X_OK):
            pytest.skip("SGPU_CLI names no sgpu binary")
        code, out, err = python(TWO_PROCESSES, SGPU, "sim", "--node", "2xH100:4GiB", "--",
                                env=off_node_env())
    else:
        code, out, err = python(TWO_PROCESSES, env=off_node_env(SGPU_BACKEND="sim",
                                                                SGPU_SIM="2xH100:4GiB"))
    assert code == 0, err
    lines = out.splitlines()
    holder = lines[-1].split()[1]
    assert lines[0] == "free 1.0 of 4.0 own 0", out
    assert lines[1] == ("oom CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                        "capacity of 4.00 GiB of which 1024.00 MiB is free. Process "
                        f"{holder} has 3.00 GiB memory in use."), out
    assert lines[2] == "cuda:1 free 4.0", out
    assert lines[3] == "after 2.0", out


def test_softmax_from_half_to_float_runs_as_cuda_runs_it():
    """Autocast's float32 softmax of a half tensor (half_to_float, which the CPU's kernel
    refuses) and its backward, which hands the half input a half gradient."""
    code, out, err = python("""
        import torch
        x = torch.randn(4, 8, device="cuda", dtype=torch.half, requires_grad=True)
        y = torch.softmax(x, -1, dtype=torch.float32)
        y[:, 0].sum().backward()
        expect = torch.softmax(x.detach().cpu().float(), -1)
        print(y.dtype, x.grad.dtype, torch.allclose(y.detach().cpu(), expect),
              torch._log_softmax(x.detach(), 1, True).dtype)
    """, env=off_node_env(SGPU_BACKEND="sim"))
    assert code == 0, err
    assert out.strip() == "torch.float32 torch.float16 True torch.float32", out


def test_a_callers_results_on_the_node_land_on_its_simulated_gpus():
    """A caller on the node gets its ranks' cuda tensors on the GPUs they were on, as a
    caller on a GPU node does (off a node, they land on its CPU)."""
    body = """
        import sgpu, torch
        def f():
            import os, torch
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            return torch.full((2,), float(os.environ["LOCAL_RANK"]), device="cuda")
        print([f"{t.device} {t.tolist()}" for t in sgpu.distributed(gpus=2)(f).distributed()])
    """
    code, out, err = python(body, env=off_node_env(SGPU_BACKEND="sim", SGPU_TRACKING="off"))
    assert code == 0, err
    assert out.strip() == "['cuda:0 [0.0, 0.0]', 'cuda:1 [1.0, 1.0]']", out
