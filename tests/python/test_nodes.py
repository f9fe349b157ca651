"""`sgpu run` over several nodes with torchrun's contract (--nnodes, --node-rank,
--rdzv-endpoint, or the PET_* variables): every node's sgpu on this machine's loopback, as
a scheduler would start them. The ranks take torchrun's global places and train together;
one failure, on any node, ends every rank on every node with that root cause; a node whose
sgpu is killed ends the others; a node that cannot serve the launch stops it before any
rank starts. The C++ and Python decorators, in a program started once per node, return
every rank's result on every node, as one MLflow run that every node's ranks log into."""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import processes_with_marker, wait_until
from sgpu_cli import NODES_CALLER, SGPU, needs_cli

pytestmark = needs_cli
DDP_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "cli", "ddp_train.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """One sgpu per node, all started at once; `nodes[k]` is node k's process."""

    def __init__(self, tmp_path, program, nnodes, gpus=2, per_node=None, env=None, flags=()):
        self.port = free_port()
        self.marker = f"{os.getpid()}-{self.port}"
        self.nodes = []
        for node in range(nnodes):
            node_flags = ["--nnodes", str(nnodes), "--node-rank", str(node),
                          "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-timeout", "60"]
            extra = (per_node or {}).get(node, {})
            node_env = dict(os.environ, SGPU_TRACKING="off", SGPU_TEST_MARKER=self.marker,
                            SGPU_RUNS_DIR=str(tmp_path / f"runs-{node}"), **(env or {}),
                            **extra.get("env", {}))
            command = [SGPU, "run", "--backend", "sim", "--gpus", str(extra.get("gpus", gpus)),
                       *extra.get("flags", node_flags), *flags, "--", *program]
            self.nodes.append(subprocess.Popen(command, env=node_env, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True))

    def finish(self, timeout=180):
        results = []
        for child in self.nodes:
            out, err = child.communicate(timeout=timeout)
            results.append((child.returncode, out, err))
        return results

    def ranks_left(self):
        return processes_with_marker(f"SGPU_TEST_MARKER={self.marker}")


def script(tmp_path, body) -> list[str]:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_a_ddp_script_trains_over_two_nodes_with_torchruns_places(tmp_path):
    places = script(tmp_path, """
        import os, sgpu
        names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
        print("place", *[os.environ[n] for n in names], sgpu.get_global_rank(), sgpu.get_node_rank())
        """)
    launch = Launch(tmp_path, places, nnodes=2, gpus=3)
    results = launch.finish()
    assert [code for code, _, _ in results] == [0, 0], results
    seen = sorted(line.split("place ", 1)[1] for _, out, _ in results for line in out.splitlines()
                  if "place " in line)
    port = str(launch.port)
    expected = sorted(f"{n * 3 + l} {l} 6 3 {n} {n} 2 6 127.0.0.1 {port} {n * 3 + l} {n}"
                      for n in range(2) for l in range(3))
    assert seen == expected, results
    # A real PyTorch DDP script: Gloo across the nodes, the same parameters everywhere.
    results = Launch(tmp_path, [sys.executable, DDP_SCRIPT], nnodes=2).finish()
    assert [code for code, _, _ in results] == [0, 0], results
    agreed = sorted(re.findall(r"rank (\d): parameters agree", results[0][1] + results[1][1]))
    assert agreed == ["0", "1", "2", "3"], results


def test_an_nccl_script_on_two_nodes_puts_each_rank_on_its_nodes_gpu(tmp_path):
    # The README's pattern: set_device(LOCAL_RANK), then "nccl". Ranks on two nodes share
    # local ranks, not GPUs.
    program = script(tmp_path, """
        import os, torch, torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        total = torch.ones(2, device="cuda")
        dist.all_reduce(total)
        print("sum", dist.get_rank(), total.tolist(), flush=True)
        dist.destroy_process_group()
        """)
    results = Launch(tmp_path, program, nnodes=2).finish()
    assert [code for code, _, _ in results] == [0, 0], results
    sums = sorted(line.split("sum ", 1)[1] for _, out, _ in results for line in out.splitlines()
                  if "sum " in line)
    assert sums == [f"{rank} [4.0, 4.0]" for rank in range(4)], results


def test_the_same_launch_from_torchruns_pet_variables(tmp_path):
    port = free_port()
    per_node = {node: {"flags": [], "env": {"PET_NNODES": "2", "PET_NODE_RANK": str(node),
                                             "PET_MASTER_ADDR": "127.0.0.1",
                                             "PET_MASTER_PORT": str(port)}} for node in range(2)}
    program = script(tmp_path, 'import os; print("place", os.environ["RANK"], os.environ["NODE_RANK"])')
    results = Launch(tmp_path, program, nnodes=2, per_node=per_node).finish()
    assert [code for code, _, _ in results] == [0, 0], results
    seen = sorted(line.split("place ", 1)[1] for _, out, _ in results for line in out.splitlines()
                  if "place " in line)
    assert seen == ["0 0", "1 0", "2 1", "3 1"], results


def test_one_command_simulates_every_node_of_the_launch(tmp_path):
    # NOTE [Every node on one machine]: no node rank and no endpoint on sim, and this sgpu
    # starts the other nodes itself. The ranks take torchrun's places on 3 nodes of 2.
    places = script(tmp_path, """
        import os
        names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK"]
        print("place", *[os.environ[n] for n in names], flush=True)
        """)
    env = dict(os.environ, SGPU_TRACKING="off", SGPU_RUNS_DIR=str(tmp_path / "runs"))
    done = subprocess.run([SGPU, "run", "--backend", "sim", "--nproc-per-node", "2", "--nnodes",
                           "3", "--", *places], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    seen = sorted(line.split("place ", 1)[1] for line in done.stdout.splitlines()
                  if "place " in line)
    assert seen == sorted(f"{n * 2 + l} {l} 6 2 {n} {n}" for n in range(3) for l in range(2))
    # A rank on the last node fails: every node ends, the command exits with its code and
    # names it the root cause, and nothing is left running.
    marker = f"{os.getpid()}-every-node"
    crash = script(tmp_path, """
        import os, time
        if os.environ["RANK"] == "4":
            os._exit(7)
        time.sleep(120)
        """)
    done = subprocess.run([SGPU, "run", "--backend", "sim", "--gpus", "2", "--nnodes", "3", "--",
                           *crash], env=dict(env, SGPU_TEST_MARKER=marker),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 7, done.stderr
    assert re.search(r"\b4 +2 +\d+ +exited with code 7 +<- root cause", done.stderr), done.stderr
    assert processes_with_marker(f"SGPU_TEST_MARKER={marker}") == []


def predicted_all_reduces(text: str) -> float:
    """The seconds the collectives line predicts for the all-reduces."""
    found = re.search(r"all_reduce \d+ calls, [^(]*\(([0-9.]+) s on h100-nvswitch\)", text)
    assert found, text
    return float(found.group(1))


def test_a_group_across_two_nodes_is_timed_on_the_network_between_them(tmp_path):
    # NOTE [The network between nodes]: 4 ranks, 2 on each of 2 nodes, all-reduce 64 MiB
    # three times. Each node's line predicts what `sgpu model predict --nodes 2` says: the
    # NVLS tree over 2 NICs a node, not NVLink.
    program = script(tmp_path, """
        import os, torch, torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        t = torch.ones(16 << 20, device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
        print("done", dist.get_rank(), flush=True)
        dist.destroy_process_group()
        """)
    shapes = {"SGPU_SIM_COMPUTE": "shapes"}
    results = Launch(tmp_path, program, nnodes=2, flags=("--gpu-type", "H100"), env=shapes).finish()
    assert [code for code, _, _ in results] == [0, 0], results
    model = subprocess.run([SGPU, "model", "predict", "h100-nvswitch", "--ops", "all_reduce",
                            "--min-bytes", "64M", "--max-bytes", "64M", "--ranks", "4",
                            "--nodes", "2"], capture_output=True, text=True, check=True).stdout
    row = next(line.split() for line in model.splitlines() if line.strip().startswith("all_reduce"))
    assert row[-1] == "nvls_tree/Simple", model
    for _, _, err in results:
        assert predicted_all_reduces(err) == pytest.approx(3 * float(row[2]) / 1e6, rel=1e-3), err
    # The same 4 ranks on one node: NVLink's NVLS, over three times faster.
    one = subprocess.run([SGPU, "run", "--backend", "sim", "--gpus", "4", "--gpu-type", "H100",
                          "--", *program], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, SGPU_TRACKING="off", **shapes))
    assert one.returncode == 0, one.stderr
    assert predicted_all_reduces(one.stderr) * 3 < predicted_all_reduces(results[0][2]), one.stderr



@pytest.mark.parametrize("members, nodes", [((0, 1), 1), ((0, 2), 2)])
def test_a_subgroup_is_timed_on_the_links_its_members_cross(tmp_path, members, nodes):
    # An HSDP mesh's two kinds of group on 2 nodes of 2: ranks 0 and 1 share a node and
    # NVLink; ranks 0 and 2 are on two nodes and cross on one NIC each.
    program = script(tmp_path, f"""
        import os, torch, torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        group = dist.new_group({list(members)})
        if dist.get_rank() in {list(members)}:
            dist.all_reduce(torch.ones(16 << 20, device="cuda"), group=group)
        print("done", flush=True)
        dist.destroy_process_group()
        """)
    done = subprocess.run([SGPU, "run", "--backend", "sim", "--nproc-per-node", "2", "--nnodes",
                           "2", "--gpu-type", "H100", "--sim-compute", "shapes", "--", *program],
                          env=dict(os.environ, SGPU_TRACKING="off"), capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    model = subprocess.run([SGPU, "model", "predict", "h100-nvswitch", "--ops", "all_reduce",
                            "--min-bytes", "64M", "--max-bytes", "64M", "--ranks", "2",
                            "--nodes", str(nodes)], capture_output=True, text=True,
                           check=True).stdout
    row = next(line.split() for line in model.splitlines() if line.strip().startswith("all_reduce"))
    # Node 0's line is rank 0's, a member of both groups.
    assert predicted_all_reduces(done.stderr) == pytest.approx(float(row[2]) / 1e6, abs=1e-6)


SLEEPER = """
    import os, sys, time
    rank = int(os.environ["RANK"])
    if os.environ.get("CRASH_RANK") == str(rank):
        time.sleep(2)
        print(f"crashing at {time.time():.3f}", file=sys.stderr, flush=True)
        os._exit(7)
    time.sleep(120)  # not in a collective: nothing but sgpu can end it
    """


def test_a_crash_on_one_node_ends_every_rank_on_every_node_with_that_root_cause(tmp_path):
    launch = Launch(tmp_path, script(tmp_path, SLEEPER), nnodes=3, env={"CRASH_RANK": "3"})
    results = launch.finish()
    ended = time.time()
    # The crashing rank is rank 3: node 1's second. Every node ends as it did.
    assert [code for code, _, _ in results] == [7, 7, 7], results
    crashed = float(re.search(r"crashing at ([0-9.]+)", results[1][2]).group(1))
    # Every sgpu has ended, and with it every rank, long before the others' sleep would
    # (torchrun's agents leave them running until its exit barrier).
    assert ended - crashed < 10, f"{ended - crashed:.2f} s"
    assert launch.ranks_left() == []
    table = results[0][2]
    assert "root cause: rank 3 (node 1" in table, table
    assert re.search(r"^  3 +1 +\d+ +exited with code 7  <- root cause$", table, re.M), table
    for rank in (0, 1, 2, 4, 5):  # node 0 shows every rank of the launch
        assert re.search(rf"^  {rank} +{rank // 2} +\d+ +terminated by sgpu", table, re.M), table
    assert "logs of node 1" in table and "logs of node 2" in table, table
    for code, _, err in results[1:]:
        assert "node 0 (127.0.0.1) shows every rank of the launch" in err, err
        assert "root cause: rank 3 (node 1" in err, err


@pytest.mark.parametrize("victim", [0, 1])
def test_a_node_whose_sgpu_is_killed_ends_the_others(tmp_path, victim):
    launch = Launch(tmp_path, script(tmp_path, SLEEPER), nnodes=2)
    assert wait_until(lambda: len(launch.ranks_left()) >= 2 * (1 + 2 * 2), limit=60), launch.ranks_left()
    launch.nodes[victim].send_signal(signal.SIGKILL)
    killed = time.time()
    results = launch.finish(timeout=60)
    ended = time.time()
    survivor = results[1 - victim]
    assert survivor[0] == 1, results
    expected = ("node 0's store at 127.0.0.1" if victim == 0 else "node 1 has not been heard from")
    assert expected in survivor[2], survivor[2]
    if victim == 0:  # in sgpu's own words, not c10d's warning with its C++ frames
        assert "node 0 (127.0.0.1) is gone; this node's ranks:" in survivor[2], survivor[2]
        assert "[c10d]" not in survivor[2] and "frame #" not in survivor[2], survivor[2]
    assert ended - killed < 15, f"{ended - killed:.2f} s"
    assert wait_until(lambda: launch.ranks_left() == [], limit=10), launch.ranks_left()


def test_a_node_that_cannot_serve_the_launch_stops_every_node_before_any_rank_starts(tmp_path):
    started = tmp_path / "started"
    program = script(tmp_path, f'open("{started}", "a").write("x")')
    launch = Launch(tmp_path, program, nnodes=2,
                    per_node={1: {"env": {"SGPU_SIM": "2xA10"}}}, flags=("--gpu-type", "H100"))
    results = launch.finish()
    assert [code for code, _, _ in results] == [3, 3], results
    assert "node 1 " in results[0][2] and "cannot serve the launch" in results[0][2], results[0][2]
    assert "H100" in results[1][2], results[1][2]
    assert not started.exists()


def test_nodes_that_disagree_on_the_launch_are_told_which_setting(tmp_path):
    launch = Launch(tmp_path, script(tmp_path, "pass"), nnodes=2, per_node={1: {"gpus": 3}})
    results = launch.finish()
    assert results[1][0] == 2, results
    assert "with 2 GPUs each" in results[1][2] and "--gpus" in results[1][2], results[1][2]
    assert results[0][0] != 0, results


def test_a_node_that_cannot_reach_node_0_says_where_it_looked(tmp_path):
    port = free_port()  # nothing listens there
    child = subprocess.run(
        [SGPU, "run", "--backend", "sim", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
         f"127.0.0.1:{port}", "--rdzv-timeout", "2", "--", sys.executable, "-c", "pass"],
        env=dict(os.environ, SGPU_TRACKING="off"), capture_output=True, text=True, timeout=60)
    assert child.returncode == 1, child
    assert f"cannot reach node 0's store at 127.0.0.1:{port} within 2 s" in child.stderr, child.stderr
    assert "--rdzv-endpoint" in child.stderr, child.stderr


def test_node_zero_listens_only_on_the_endpoints_address(tmp_path):
    # A name for one of this machine's own addresses other than 127.0.0.1.
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError:
        pytest.skip(f"this machine's name {host} does not resolve")
    port = free_port()
    program = script(tmp_path, "import time; time.sleep(30)")
    child = subprocess.Popen(
        [SGPU, "run", "--backend", "sim", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
         f"{host}:{port}", "--rdzv-timeout", "20", "--", *program],
        env=dict(os.environ, SGPU_TRACKING="off"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)

    def listening():
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.readlines()[1:]]
        return [row[1] for row in rows if row[3] == "0A" and int(row[1].split(":")[1], 16) == port]

    assert wait_until(lambda: listening() != [], limit=20), child
    hex_address = socket.inet_aton(address)[::-1].hex().upper()
    assert listening() == [f"{hex_address}:{port:04X}"], (listening(), address)
    child.kill()
    child.communicate()


# --- Distributed functions over several nodes -------------------------------------------


def per_node(program, nnodes, env=None):
    """`program` started once per node, placed by torchrun's PET_* variables (as Kubeflow's
    trainer starts it); each node's (exit code, stdout, stderr)."""
    port = free_port()
    children = []
    for node in range(nnodes):
        node_env = dict(os.environ, PET_NNODES=str(nnodes), PET_NODE_RANK=str(node),
                        PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), **(env or {}))
        children.append(subprocess.Popen(program, env=node_env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for child in children:
            out, err = child.communicate(timeout=180)
            results.append((child.returncode, out, err))
    finally:  # a node that never ended (the test failed): none outlives the test
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    return results


def expected_results(nnodes, gpus):
    world = nnodes * gpus
    return [f"result {r}: rank {r} of {world} on node {r // gpus}, sum of ranks {sum(range(world))}"
            for r in range(world)]


def test_a_cpp_distributed_function_on_two_nodes_returns_every_ranks_result_on_each(tmp_path):
    results = per_node([NODES_CALLER, "2"], 2, env={"SGPU_TRACKING": "off"})
    assert [code for code, _, _ in results] == [0, 0], results
    for _, out, _ in results:  # the ranks all-reduced across the nodes; results in rank order
        assert [line for line in out.splitlines() if line.startswith("result")] == \
            expected_results(2, 2), results


def test_a_crash_in_a_distributed_function_on_node_1_ends_every_node_with_it(tmp_path):
    marker = f"{os.getpid()}-caller-crash"
    started = time.time()
    results = per_node([NODES_CALLER, "2"], 2,
                       env={"SGPU_TRACKING": "off", "CRASH_RANK": "3", "SGPU_TEST_MARKER": marker})
    # The others sleep two minutes out of any collective: sgpu ended them.
    assert time.time() - started < 60, results
    assert [code for code, _, _ in results] == [1, 1], results
    table = results[0][2]
    assert "root cause: rank 3 (node 1" in table and "crashed on purpose" in table, table
    assert re.search(r"^  3 +1 +\d+ +threw std::runtime_error: rank 3 crashed on purpose  <- root cause$",
                     table, re.M), table
    assert "node 0 (127.0.0.1) shows every rank of the launch" in results[1][2], results[1][2]
    assert processes_with_marker(f"SGPU_TEST_MARKER={marker}") == []


PYTHON_CALLER = """
    import sgpu, torch, torch.distributed as dist

    @sgpu.distributed(gpus=2)
    def place(offset):
        dist.init_process_group("sgpu")
        total = torch.tensor([float(sgpu.get_global_rank())])
        dist.all_reduce(total)
        sgpu.log_metric(f"total_on_rank_{sgpu.get_global_rank()}", total.item())
        return sgpu.get_global_rank(), sgpu.get_node_rank(), total.item() + offset

    print("results", place.distributed(10))
    print("again", place.distributed(20))  # a second launch, on the same endpoint
    """


def test_the_python_decorator_on_two_nodes_returns_every_ranks_result_in_one_run(tmp_path):
    results = per_node(script(tmp_path, PYTHON_CALLER), 2)
    assert [code for code, _, _ in results] == [0, 0], results
    for _, out, err in results:
        lines = out.splitlines()
        assert "results " + repr([(r, r // 2, 16.0) for r in range(4)]) in lines, results
        # Each node's figures are its own ranks', and it says so.
        assert "sgpu: collectives (the most of any rank of this node): all_reduce 1 calls" in err, err
        assert "again " + repr([(r, r // 2, 26.0) for r in range(4)]) in lines, results
    import mlflow

    # One run per launch, node 0's (both nodes share this tracking store here), which node
    # 1's ranks logged into too.
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 2, [run.info.run_name for run in runs]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params["world_size"] == "4", run.data.params
        assert run.data.params["nnodes"] == "2", run.data.params
        logged = {key: value for key, value in run.data.metrics.items() if key.startswith("total_")}
        assert logged == {f"total_on_rank_{r}": 6.0 for r in range(4)}, run.data.metrics


def test_the_python_decorator_takes_the_contract_as_options(tmp_path):
    port = free_port()
    caller = script(tmp_path, f"""
        import os, sgpu

        @sgpu.distributed(gpus=2, nnodes=2, node_rank=int(os.environ["THIS_NODE"]),
                          rdzv_endpoint="127.0.0.1:{port}", rdzv_timeout=60, tracking=False)
        def place():
            return sgpu.get_global_rank(), sgpu.get_node_rank()

        print("results", place.distributed())
        """)
    children = [subprocess.Popen(caller, env=dict(os.environ, THIS_NODE=str(node)),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for node in range(2)]
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0, (out, err)
        assert "results " + repr([(r, r // 2) for r in range(4)]) in out.splitlines(), (out, err)
    import sgpu

    with pytest.raises(sgpu.ConfigError, match="rdzv_timeout must be positive"):
        sgpu.distributed(gpus=2, rdzv_timeout=0)(print)


def places_and_a_sum() -> tuple:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    total = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(total)
    dist.destroy_process_group()
    return tuple(int(os.environ[name]) for name in
                 ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")) + \
        (total[0].item(), str(total.device))


def test_a_distributed_function_over_more_gpus_than_a_node_runs_every_node_here():
    # 16 H100s are two simulated nodes of the spec's 8, both in this process, as torchrun
    # would place their ranks; the all-reduce crosses the network between them.
    import sgpu

    handle = sgpu.distributed(gpus=16, gpu_type="H100")(places_and_a_sum).launch()
    assert handle.result() == [(r, r % 8, r // 8, 16, 8, 16.0, f"cuda:{r % 8}") for r in range(16)]
    import mlflow

    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert run.info.status == "FINISHED"
    assert (run.data.params["world_size"], run.data.params["nnodes"]) == ("16", "2")
    assert len(handle.memory_stats()) == 16
    comm = handle.comm_stats()
    assert len(comm) == 16
    (all_reduce,) = [ops["all_reduce"] for ops in comm[0].values() if "all_reduce" in ops]
    # Timed across two nodes: slower than the same all-reduce among one node's 8 GPUs.
    one_node = sgpu.distributed(gpus=8, gpu_type="H100", tracking=False)(places_and_a_sum)
    within = one_node.launch()
    within.result()
    (inside,) = [ops["all_reduce"] for ops in within.comm_stats()[0].values() if "all_reduce" in ops]
    assert all_reduce["predicted_seconds"] > inside["predicted_seconds"] > 0


def test_nnodes_on_sim_runs_every_node_here_with_gpus_a_node():
    import sgpu

    got = sgpu.distributed(gpus=2, nnodes=3, tracking=False)(places_and_a_sum).distributed()
    assert [row[:5] for row in got] == [(r, r % 2, r // 2, 6, 2) for r in range(6)]


def test_gpus_that_are_not_whole_nodes_are_refused_with_what_to_pass():
    import sgpu

    with pytest.raises(sgpu.AcceleratorMismatchError,
                       match=r"12 GPUs requested on simulated nodes of 8 x H100.*pass gpus=8 or "
                             r"fewer for one node, a multiple of 8 for whole nodes, or nnodes"):
        sgpu.distributed(gpus=12, tracking=False)(places_and_a_sum).distributed()


def fails_on_rank_9() -> int:
    import sgpu

    if sgpu.get_global_rank() == 9:
        raise ValueError("rank 9 gives up")
    time.sleep(60)  # the others wait, to be torn down
    return sgpu.get_global_rank()


def test_a_crash_on_the_second_simulated_node_ends_every_node_with_it():
    import sgpu
    from conftest import distributed_error

    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        sgpu.distributed(gpus=16, tracking=False)(fails_on_rank_9).distributed()
    assert time.monotonic() - started < 50, "the other ranks were not torn down"
    assert isinstance(caught.value, ValueError) and "rank 9 gives up" in str(caught.value)
    error = distributed_error(caught.value)
    assert error.root_cause.rank == 9, str(error)


def fsdp_steps_on_a_mesh(width: int, hybrid: bool) -> dict:
    """Two FSDP2 steps of a small MLP sharded over every rank, or (hybrid) within each node
    and replicated across nodes; the rank's place, its shard and its memory peaks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    nodes, per_node = int(os.environ["GROUP_WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if hybrid:
        mesh = init_device_mesh("cuda", (nodes, per_node), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cuda", (nodes * per_node,))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(3)]).cuda()
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(16, width, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    seen = {"place": (dist.get_rank(), dist.get_world_size(), int(os.environ["GROUP_RANK"])),
            "shard": tuple(model[0].weight.to_local().shape),
            "peaks": (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())}
    dist.destroy_process_group()
    return seen


def recorded(handle) -> list:
    """Each rank's collectives per group and op: (count, bytes, predicted seconds)."""
    return [{group: {op: (t["count"], t["bytes"], t["predicted_seconds"]) for op, t in ops.items()}
             for group, ops in rank.items()} for rank in handle.comm_stats()]


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_folded_world_records_for_its_ranks_what_the_whole_world_records(hybrid, capfd):
    # NOTE [A folded world]: 2 simulated nodes of 2 GPUs, in shapes; folded, node 0's two
    # processes stand for all 4 ranks, and rank 3 runs too, a second of rank 1's place; each
    # records what it records with every rank there: its places, shards, collectives
    # (counts, bytes, predicted times) and peaks.
    import sgpu

    def launch(fold: bool):
        nodes = {"sim_node": "2xH100", "gpus": 4} if hybrid else {"gpus": 2, "nnodes": 2}
        return sgpu.distributed(**nodes, tracking=False, sim_compute="shapes", sim_fold=fold,
                                timeout=120)(
            fsdp_steps_on_a_mesh).launch(64, hybrid)

    whole = launch(False)
    every_rank = whole.result()
    assert [seen["place"] for seen in every_rank] == [(r, 4, r // 2) for r in range(4)]
    capfd.readouterr()
    folded = launch(True)
    ran = [0, 1, 3]
    assert folded.result() == [every_rank[r] for r in ran]
    assert recorded(folded) == [recorded(whole)[r] for r in ran]
    peaks = [stats["allocated_bytes.all.peak"] for stats in whole.memory_stats()]
    assert [stats["allocated_bytes.all.peak"] for stats in folded.memory_stats()] == \
        [peaks[r] for r in ran]
    assert "sgpu: 3 processes stood for 4 ranks: node 0's, each for its place on every one of " \
        "2 simulated nodes, and rank 3, which did what rank 1 did" in capfd.readouterr().err


def test_folding_is_refused_where_it_cannot_hold():
    import sgpu

    with pytest.raises(sgpu.ConfigError, match=r"sim_fold.* runs node 0's ranks for every node's, "
                                                r"which holds where tensors carry shapes only"):
        sgpu.distributed(gpus=2, nnodes=2, tracking=False, sim_fold=True)(
            places_and_a_sum).distributed()
    with pytest.raises(sgpu.ConfigError, match=r"sim_fold.* folds the nodes of a simulated world "
                                                r"on this machine"):
        sgpu.distributed(gpus=2, nnodes=2, node_rank=0, tracking=False, sim_compute="shapes",
                         sim_fold=True)(places_and_a_sum).distributed()


def test_one_command_folds_a_simulated_worlds_nodes_into_node_0s_ranks(tmp_path):
    # sgpu run --sim-fold: one launch, node 0's two ranks, each in its place among 6 ranks on
    # 3 nodes, its all-reduce over the whole world.
    places = script(tmp_path, """
        import os
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        dist.all_reduce(torch.ones(4, device="cuda"))
        names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "GROUP_RANK"]
        print("place", *[os.environ[n] for n in names], dist.get_world_size(), flush=True)
        dist.destroy_process_group()
        """)
    env = dict(os.environ, SGPU_TRACKING="off", SGPU_RUNS_DIR=str(tmp_path / "runs"))
    done = subprocess.run([SGPU, "run", "--backend", "sim", "--nproc-per-node", "2", "--nnodes",
                           "3", "--sim-compute", "shapes", "--sim-fold", "--", *places], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    seen = sorted(line.split("place ", 1)[1] for line in done.stdout.splitlines()
                  if "place " in line)
    assert seen == ["0 0 6 3 0 6", "1 1 6 3 0 6", "5 1 6 3 2 6"]
    assert "sgpu: 3 processes stood for 6 ranks: node 0's, each for its place on every one of " \
        "3 simulated nodes, and rank 5, which did what rank 1 did (--sim-fold)" in done.stderr
    assert "all_reduce 1 calls" in done.stderr


def reduces_more_on_the_last_node() -> int:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    # Each node's group: ranks 0 and 1, ranks 2 and 3.
    nodes = [dist.new_group([2 * node, 2 * node + 1]) for node in range(2)]
    node = nodes[int(os.environ["GROUP_RANK"])]
    calls = 2 if os.environ["GROUP_RANK"] == "1" else 1  # a node that does more
    for _ in range(calls):
        dist.all_reduce(torch.ones(4, device="cuda"), group=node)
    dist.destroy_process_group()
    return calls


def test_a_program_whose_nodes_do_not_run_alike_does_not_fold():
    # The last rank, a second of its place, did more than the first of that place: the call
    # fails saying where, rather than give node 0's figures for every node's.
    import sgpu

    with pytest.raises(sgpu.errors.Error,
                       match=r"the folded world does not hold: all_reduce: rank 1 called it 1 "
                             r"time \(16 bytes\) in its group ranks 0,1, rank 3 2 times \(32 "
                             r"bytes\) in its group ranks 2,3\. .* run it unfolded \(without "
                             r"sim_fold"):
        sgpu.distributed(gpus=2, nnodes=2, tracking=False, sim_compute="shapes", sim_fold=True,
                         timeout=120)(reduces_more_on_the_last_node).distributed()


def shards_unevenly(rows: int) -> int:
    """FSDP2 over every rank of a parameter of `rows` rows: the last rank's share is smaller
    where the rows do not divide by the world, as are its AdamW states."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    model = fully_shard(torch.nn.Linear(1024, rows, bias=False).cuda())
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    optimizer.step()
    share = model.weight.to_local().shape[0]
    dist.destroy_process_group()
    return share


def test_a_last_rank_with_uneven_shards_folds_with_memory_peaks_of_its_own(capfd):
    # The collectives of the last rank are those of rank 1 (FSDP2 pads what it gathers), but
    # its shard of 1,030 rows over 4 ranks is 256 rows where the others hold 258: it ran as
    # its own process, so its memory figures are its own (those the whole world gives it),
    # and the summary says how they differ rather than fail the call or give node 0's for it.
    import sgpu

    def launch(fold: bool):
        return sgpu.distributed(gpus=2, nnodes=2, tracking=False, sim_compute="shapes",
                                sim_fold=fold, timeout=120)(shards_unevenly).launch(1030)

    whole = [stats["allocated_bytes.all.peak"] for stats in launch(False).memory_stats()]
    capfd.readouterr()
    call = launch(True)
    assert call.result() == [258, 258, 256]
    peaks = [stats["allocated_bytes.all.peak"] for stats in call.memory_stats()]
    assert peaks == [whole[0], whole[1], whole[3]] and peaks[1] != peaks[2], (peaks, whole)
    summary = capfd.readouterr().err
    assert "sgpu: 3 processes stood for 4 ranks: node 0's, each for its place on every one of " \
        "2 simulated nodes, and rank 3, which called the collectives rank 1 called, with memory " \
        f"peaks of its own (allocated_bytes.all.peak {peaks[1]} on rank 1, {peaks[2]} on rank 3" \
        in summary, summary
    # Each rank's peaks, ranks 0 and 1 (alike) said once.
    gib = [(stats["reserved_bytes.all.peak"] / 2**30, stats["allocated_bytes.all.peak"] / 2**30)
           for stats in call.memory_stats()]
    assert "sgpu: peak memory of each rank's GPU, reserved and allocated: ranks 0-1 " \
        "%.2f and %.2f GiB; rank 3 %.2f and %.2f GiB\n" % (*gib[0], *gib[2]) in summary, summary


def fills_the_gpu() -> None:
    import torch

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if os.environ["LOCAL_RANK"] == "1":
        torch.empty(30 * 2**30, device="cuda")  # 120 GB of float32 on an 80 GB H100


def test_a_folded_rank_out_of_memory_is_named_with_the_ranks_it_stands_for():
    import sgpu
    from conftest import distributed_error

    with pytest.raises(Exception) as caught:
        sgpu.distributed(gpus=2, nnodes=2, tracking=False, sim_compute="shapes", sim_fold=True,
                         timeout=120)(fills_the_gpu).distributed()
    error = distributed_error(caught.value)
    assert error.root_cause.exception_type.endswith("OutOfMemoryError"), error.root_cause
    assert "CUDA out of memory. Tried to allocate 120.00 GiB" in error.root_cause.message
    assert re.search(r"root cause: rank (1 \(local rank 1, pid \d+, standing for local rank 1 of "
                     r"every one of 2 simulated nodes|3 \(local rank 1, pid \d+, the second of "
                     r"local rank 1's place, on the last of 2 simulated nodes) \(sim_fold\)\)",
                     str(error)), str(error)


@needs_cli
def test_a_fault_in_a_folded_world_acts_on_a_rank_that_runs_and_is_refused_on_one_that_does_not(
        tmp_path):
    # 2 nodes of 2 folded: ranks 0, 1 and 3 run, rank 2 only stands in the world. A fault on
    # rank 3 ends it at its first collective; one on rank 2 could never act: refused before
    # anything starts, in the folded world's words.
    program = script(tmp_path, """
        import os
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        dist.all_reduce(torch.ones(4, device="cuda"))
        dist.destroy_process_group()
        """)

    def run(rank: int):
        env = dict(os.environ, SGPU_TRACKING="off", SGPU_RUNS_DIR=str(tmp_path / "runs"),
                   SGPU_SIM_FAULTS=f"rank={rank}:exit=7@collective=1")
        return subprocess.run([SGPU, "run", "--backend", "sim", "--nproc-per-node", "2",
                               "--nnodes", "2", "--sim-compute", "shapes", "--sim-fold", "--",
                               *program], env=env, capture_output=True, text=True, timeout=180)

    last = run(3)
    assert last.returncode == 7, last.stderr
    assert re.search(r"root cause: rank 3 \(local rank 1, pid \d+, the second of local rank 1's "
                     r"place, on the last of 2 simulated nodes \(--sim-fold\)\) exited with code 7",
                     last.stderr), last.stderr
    standing = run(2)
    assert standing.returncode == 2, standing.stderr
    assert "the fault plan names rank 2, which does not run in this folded world: node 0's ranks " \
        "0 to 1 stand for every node's, and rank 3 runs as a second of its place (--sim-fold); " \
        "plan the fault on one of those, or run the world unfolded" in standing.stderr, \
        standing.stderr


def test_a_hang_in_a_folded_world_names_the_rank_that_runs_and_not_those_stood_for(tmp_path):
    # 2 nodes of 2 folded: ranks 0, 1 and 3 run, rank 2 only stands in the world, with no ring
    # of its own. Rank 1 hangs before its second all-reduce: the verdict names it alone.
    program = script(tmp_path, """
        import os
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        for _ in range(3):
            dist.all_reduce(torch.ones(4, device="cuda"))
        dist.destroy_process_group()
        """)
    env = dict(os.environ, SGPU_TRACKING="off", SGPU_RUNS_DIR=str(tmp_path / "runs"),
               SGPU_SIM_FAULTS="rank=1:hang@collective=2", SGPU_HANG_TIMEOUT="2")
    done = subprocess.run([SGPU, "run", "--backend", "sim", "--nproc-per-node", "2", "--nnodes",
                           "2", "--sim-compute", "shapes", "--sim-fold", "--", *program], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    assert " hung: rank 1 never entered collective #2 (all_reduce of 4 float32 (sum)): ranks 0, " \
        "3 have waited in it for " in done.stderr, done.stderr
    assert "Rank 2" not in done.stderr.split("each rank's last collectives")[0], done.stderr
