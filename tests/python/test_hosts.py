"""`sgpu run` over hosts of their own, under the engines clusters run. Each host is a
network namespace this test creates, with its own address, host name and /etc/hosts; on
them a real Slurm cluster (Debian's slurmctld, one slurmd per host, munge), and Open MPI's
mpirun inside a Slurm allocation. The program is started once per node by the engine, as on
a cluster, be it `sgpu run` or a program that calls the C++ or Python decorator; sgpu
takes the node's place from the engine's variables. Everything the test
starts is stopped, and every namespace removed, after every outcome.

These tests need root (CI runs as root) and the cluster's packages (ci/setup installs
them); where either is missing they are skipped, and ci/test prints why."""

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from conftest import processes_with_marker, wait_until
from test_nodes import SLEEPER, script  # every rank sleeps but CRASH_RANK, which exits 7
from sgpu_cli import NODES_CALLER, SGPU, needs_cli

pytestmark = needs_cli
DDP_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "cli", "ddp_train.py")

class Hosts:
    """Hosts h0, h1, ...: network namespaces with an address, a host name and an /etc/hosts
    each, joined by a bridge that lives in a namespace of its own (the root namespace gets
    no address or route on their network), removed after every outcome."""

    def __init__(self, tmp_path, count):
        self.prefix = f"sgpu{os.getpid() % 100000}"
        self.names = [f"{self.prefix}-h{i}" for i in range(count)]
        self.bridge = f"{self.prefix}-br"
        self.made = []
        self.hosts_file = tmp_path / "hosts"
        self.addresses = [f"10.213.0.{i + 1}" for i in range(count)]
        lines = ["127.0.0.1 localhost", "::1 localhost", "::ffff:127.0.0.1 localhost"]
        for i, address in enumerate(self.addresses):
            lines += [f"{address} h{i}", f"::ffff:{address} h{i}"]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        try:
            self.ip("netns", "add", self.bridge)
            self.made.append(self.bridge)
            self.ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            self.ip("-n", self.bridge, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                self.ip("netns", "add", name)
                self.made.append(name)
                self.ip("-n", self.bridge, "link", "add", f"v{i}", "type", "veth", "peer", "name",
                        "eth0", "netns", name)
                self.ip("-n", self.bridge, "link", "set", f"v{i}", "master", "br0", "up")
                self.ip("-n", name, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
                self.ip("-n", name, "link", "set", "eth0", "up")
                self.ip("-n", name, "link", "set", "lo", "up")
        except OSError:
            self.remove()
            raise

    @staticmethod
    def ip(*args):
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def command(self, host, command):
        """`command` on host `host`: its network, its host name, its /etc/hosts. (Not `ip
        netns exec`, which remounts /sys, where slurmd then finds no cgroup filesystem.)"""
        return ["nsenter", f"--net=/run/netns/{self.names[host]}", "unshare", "--uts", "--mount",
                "sh", "-c", f'hostname h{host} && mount --bind {self.hosts_file} /etc/hosts && exec "$@"',
                "sh", *command]

    def remove(self):
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.made = []


@pytest.fixture
def hosts(tmp_path):
    made = []

    def make(count):
        if os.geteuid() != 0:
            pytest.skip("network namespaces for hosts need root (CI runs as root)")
        try:
            made.append(Hosts(tmp_path, count))
        except OSError as e:
            pytest.skip(f"cannot create network namespaces here: {e}")
        return made[-1]

    yield make
    for host_set in made:
        host_set.remove()


class Slurm:
    """A Slurm cluster on `hosts`: munged (its socket is a file, so one serves every host),
    slurmctld on h0 and a slurmd on each host, all run as root by this test, not systemd,
    from a configuration and state folder of their own. `srun`/`salloc` start on h0, as a
    user's would on the login node."""

    DAEMONS = ("munged", "slurmctld", "slurmd")

    def __init__(self, hosts):
        self.hosts = hosts
        self.count = len(hosts.names)
        # Short: munge's socket and slurmd's are Unix sockets in here (108 bytes at most).
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="sgpu-slurm-"))
        self.daemons = []
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = self.dir / "munge.sock"
        self.conf = self.dir / "slurm.conf"
        nodes = "\n".join(f"NodeName=h{i} NodeAddr={address} CPUs=2 State=UNKNOWN"
                          for i, address in enumerate(hosts.addresses))
        self.conf.write_text(textwrap.dedent(f"""\
            ClusterName=sgpu
            SlurmctldHost=h0({hosts.addresses[0]})
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            AuthInfo=socket={socket_path}
            CredType=cred/munge
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            SelectType=select/linear
            MpiDefault=none
            StateSaveLocation={self.dir}/state
            SlurmdSpoolDir={self.dir}/spool-%n
            SlurmctldPidFile={self.dir}/slurmctld.pid
            SlurmdPidFile={self.dir}/slurmd-%n.pid
            SlurmctldLogFile={self.dir}/slurmctld.log
            SlurmdLogFile={self.dir}/slurmd-%n.log
            SlurmdParameters=config_overrides
            ReturnToService=2
            """) + nodes + "\nPartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        try:
            self.start(["munged", "-F", "-f", f"--socket={socket_path}", f"--key-file={key}",
                        f"--pid-file={self.dir}/munged.pid", f"--log-file={self.dir}/munged.log",
                        f"--seed-file={self.dir}/munged.seed"])
            if not wait_until(lambda: socket_path.exists(), limit=10):
                raise OSError(f"munged made no socket: {self.log('munged')}")
            self.start(hosts.command(0, ["slurmctld", "-D", "-i"]))
            for host in range(self.count):
                self.start(hosts.command(host, ["slurmd", "-D", "-N", f"h{host}"]))
            if not wait_until(self.idle, limit=30):
                raise OSError(f"the cluster's nodes did not come up: {self.sinfo()}\n"
                              f"{self.log('slurmctld')}")
        except BaseException:
            self.stop()
            raise

    def start(self, command):
        self.daemons.append(subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))

    def log(self, name) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text()[-2000:] if path.exists() else f"(no {path.name})"

    def sinfo(self) -> str:
        done = subprocess.run(self.hosts.command(0, ["sinfo", "-h", "-o", "%T %D"]), env=self.env,
                              capture_output=True, text=True, timeout=20)
        return (done.stdout + done.stderr).strip()

    def idle(self) -> bool:
        return self.sinfo() == f"idle {self.count}"

    def popen(self, command, env=None):
        """`command` (srun ..., salloc ...) on h0, its output captured."""
        return subprocess.Popen(self.hosts.command(0, command), env=dict(self.env, **(env or {})),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self):
        for daemon in reversed(self.daemons):
            daemon.terminate()
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self.daemons = []
        # A step's slurmstepd is a daemon of its own (its parent is init), and one whose step
        # was still running when slurmd went stays: everything the cluster started carries
        # its configuration in the environment.
        mine = f"SLURM_CONF={self.conf}"
        for pid in processes_with_marker(mine):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        wait_until(lambda: processes_with_marker(mine) == [], limit=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def slurm(hosts):
    made = []

    def make(count):
        missing = [d for d in Slurm.DAEMONS if shutil.which(d) is None]
        if missing:
            pytest.skip(f"no {', '.join(missing)} here (ci/setup installs slurmctld, slurmd, "
                        "slurm-client and munge)")
        made.append(Slurm(hosts(count)))
        return made[-1]

    yield make
    for cluster in made:
        cluster.stop()


def left(marker) -> list[str]:
    """What still runs of the launch marked `marker`, by command line."""
    found = []
    for pid in processes_with_marker(f"SGPU_TEST_MARKER={marker}"):
        try:
            found.append(pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return found


def finish(child, timeout=180):
    out, err = child.communicate(timeout=timeout)
    return child.returncode, out, err


def sgpu_pid(marker, place):
    """The pid of the sgpu (not a rank) of the launch marked `marker` whose environment
    holds `place` ("SLURM_NODEID=1")."""
    for pid in processes_with_marker(f"SGPU_TEST_MARKER={marker}"):
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            comm = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "sgpu" and place.encode() in environ:
            return pid
    return None


def sgpu_env(tmp_path, marker, **extra):
    return {"SGPU_TRACKING": "off", "SGPU_TEST_MARKER": marker,
            "SGPU_RUNS_DIR": str(tmp_path / "runs"), **extra}


# --- The plain contract, on namespace hosts ---------------------------------------------------


def launch_on_hosts(hosts, tmp_path, count, program, env=None, gpus=2):
    marker = f"{os.getpid()}-hosts"
    children = []
    for node in range(count):
        command = [SGPU, "run", "--backend", "sim", "--gpus", str(gpus), "--nnodes", str(count),
                   "--node-rank", str(node), "--rdzv-endpoint", "h0:29500", "--rdzv-timeout", "60",
                   "--", *program]
        node_env = dict(os.environ, SGPU_TRACKING="off", SGPU_TEST_MARKER=marker,
                        SGPU_RUNS_DIR=str(tmp_path / f"runs-{node}"), **(env or {}))
        children.append(subprocess.Popen(hosts.command(node, command), env=node_env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return children, marker


def test_on_namespace_hosts_ddp_trains_and_the_store_listens_on_node_0s_address(tmp_path, hosts):
    host_set = hosts(2)
    children, _ = launch_on_hosts(host_set, tmp_path, 2, [sys.executable, DDP_SCRIPT])
    node0 = children[0]

    def store_addresses():
        # The listening sockets of node 0's network namespace, through its sgpu's /proc.
        try:
            with open(f"/proc/{node0.pid}/net/tcp") as table:
                rows = [line.split() for line in table.readlines()[1:]]
        except OSError:
            return []
        return [row[1] for row in rows if row[3] == "0A" and row[1].endswith(f":{29500:04X}")]

    assert wait_until(lambda: store_addresses() != [] or node0.poll() is not None, limit=60)
    listening = store_addresses()
    results = [finish(child) for child in children]
    assert [code for code, _, _ in results] == [0, 0], results
    node0_address = socket.inet_aton(host_set.addresses[0])[::-1].hex().upper()
    assert listening == [f"{node0_address}:{29500:04X}"], listening  # not 0.0.0.0 or loopback
    agreed = sorted(re.findall(r"rank (\d): parameters agree", results[0][1] + results[1][1]))
    assert agreed == ["0", "1", "2", "3"], results


def test_on_namespace_hosts_a_crash_on_node_1_ends_every_rank_of_three(tmp_path, hosts):
    host_set = hosts(3)
    children, marker = launch_on_hosts(host_set, tmp_path, 3, script(tmp_path, SLEEPER),
                                       env={"CRASH_RANK": "3"})
    results = [finish(child) for child in children]
    ended = time.time()
    assert [code for code, _, _ in results] == [7, 7, 7], results
    crashed = float(re.search(r"crashing at ([0-9.]+)", results[1][2]).group(1))
    assert ended - crashed < 10, f"{ended - crashed:.2f} s"
    assert "root cause: rank 3 (node 1 h1" in results[0][2], results[0][2]
    assert "node 0 (h0) shows every rank of the launch" in results[2][2], results[2][2]
    assert left(marker) == []


# --- Under Slurm ---------------------------------------------------------------------------


def srun(nodes, *command):
    return ["srun", f"-N{nodes}", "--ntasks-per-node=1", "--label", *command]


def by_node(output, tag) -> dict[int, str]:
    """An engine's merged output split back into each node's lines; `tag` matches a line
    with two groups, its node and its text."""
    lines: dict[int, list[str]] = {}
    for line in output.splitlines():
        tagged = re.match(tag, line)
        if tagged:
            lines.setdefault(int(tagged.group(1)), []).append(tagged.group(2))
    return {node: "\n".join(text) for node, text in lines.items()}


def by_task(output) -> dict[int, str]:
    """srun --label's output ("1: text"), by task (one task per node)."""
    return by_node(output, r"\s*(\d+): (.*)$")


def test_under_srun_a_crash_on_node_1_ends_every_rank_on_every_node_with_that_root_cause(tmp_path, slurm):
    cluster = slurm(3)
    marker = f"{os.getpid()}-srun-crash"
    command = srun(3, SGPU, "run", "--backend", "sim", "--gpus", "2", "--", *script(tmp_path, SLEEPER))
    child = cluster.popen(command, env=sgpu_env(tmp_path, marker, CRASH_RANK="3"))
    code, out, err = finish(child)
    ended = time.time()
    assert code == 7, (out, err)
    tasks = by_task(err)
    crashed = float(re.search(r"crashing at ([0-9.]+)", tasks[1]).group(1))
    # srun itself leaves the other tasks running (no -K): sgpu ends them.
    assert ended - crashed < 10, f"{ended - crashed:.2f} s"
    assert "root cause: rank 3 (node 1 h1" in tasks[0], tasks[0]
    assert re.search(r"^  3 +1 +\d+ +exited with code 7  <- root cause$", tasks[0], re.M), tasks[0]
    assert "node 0 (h0) shows every rank of the launch" in tasks[2], tasks[2]
    assert left(marker) == []


def kill_node_1s_sgpu(cluster, command, tmp_path, marker, place):
    """Starts `command` (an engine's launch of `sgpu run` on two nodes), kills node 1's
    sgpu (the one whose environment holds `place`) once every rank runs, and returns the
    launch's (exit code, stdout, stderr) and the seconds from the kill to its end."""
    child = cluster.popen(command, env=sgpu_env(tmp_path, marker))
    # Both sgpus, each with its fork server and two ranks.
    assert wait_until(lambda: len(processes_with_marker(f"SGPU_TEST_MARKER={marker}")) >= 8
                      or child.poll() is not None, limit=60)
    victim = sgpu_pid(marker, place)
    assert victim is not None, finish(child)
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    code, out, err = finish(child, timeout=60)
    return code, out, err, time.time() - killed


def test_under_srun_killing_one_nodes_sgpu_ends_the_rest(tmp_path, slurm):
    cluster = slurm(2)
    marker = f"{os.getpid()}-srun-kill"
    command = srun(2, SGPU, "run", "--backend", "sim", "--gpus", "2", "--", *script(tmp_path, SLEEPER))
    code, out, err, seconds = kill_node_1s_sgpu(cluster, command, tmp_path, marker, "SLURM_NODEID=1")
    assert code != 0, (out, err)
    assert "node 1 has not been heard from" in by_task(err).get(0, ""), err
    assert seconds < 15, f"{seconds:.2f} s"
    assert wait_until(lambda: left(marker) == [], limit=10), left(marker)


def test_under_srun_the_decorators_return_every_ranks_result_on_every_node(tmp_path, slurm):
    cluster = slurm(2)
    env = {"SGPU_TRACKING": "off", "SGPU_RUNS_DIR": str(tmp_path / "runs")}
    code, out, err = finish(cluster.popen(srun(2, NODES_CALLER, "2"), env=env))
    assert code == 0, (out, err)
    expected = [f"result {r}: rank {r} of 4 on node {r // 2}, sum of ranks 6" for r in range(4)]
    for node, lines in by_task(out).items():
        assert [line for line in lines.splitlines() if line.startswith("result")] == expected, out

    caller = script(tmp_path, """
        import sgpu, torch, torch.distributed as dist

        @sgpu.distributed(gpus=2)
        def place():
            dist.init_process_group("sgpu")
            total = torch.tensor([float(sgpu.get_global_rank())])
            dist.all_reduce(total)
            return sgpu.get_global_rank(), sgpu.get_node_rank(), total.item()

        print("results", place.distributed())
        """)
    code, out, err = finish(cluster.popen(srun(2, *caller), env=env))
    assert code == 0, (out, err)
    tasks = by_task(out)
    for node in (0, 1):
        assert f"results {[(r, r // 2, 6.0) for r in range(4)]!r}" in tasks[node], out


def test_under_srun_a_crash_in_a_distributed_function_ends_every_node_with_it(tmp_path, slurm):
    cluster = slurm(3)
    marker = f"{os.getpid()}-srun-caller"
    child = cluster.popen(srun(3, NODES_CALLER, "2"), env=sgpu_env(tmp_path, marker, CRASH_RANK="3"))
    code, out, err = finish(child)
    assert code == 1, (out, err)  # the callers' own status for a DistributedError
    tasks = by_task(err)
    assert "root cause: rank 3 (node 1 h1" in tasks[0], err
    assert "crashed on purpose" in tasks[0] and "crashed on purpose" in tasks[2], err
    assert "node 0 (h0) shows every rank of the launch" in tasks[2], err
    assert left(marker) == []


# --- Under Open MPI's mpirun, in a Slurm allocation (mpirun starts its daemons with srun) ---


def mpirun(nodes, *command):
    return ["salloc", f"-N{nodes}", "mpirun", "-npernode", "1", "--allow-run-as-root",
            "--tag-output", *command]


def by_rank(output) -> dict[int, str]:
    """mpirun --tag-output's output ("[1,0]<stderr>:text"), by MPI rank (one per node)."""
    return by_node(output, r"\[\d+,(\d+)\]<std(?:out|err)>:(.*)$")


@pytest.mark.parametrize("engine", ["srun", "mpirun"])
def test_under_an_engine_sgpu_takes_each_nodes_place_and_ddp_trains_across_hosts(tmp_path, slurm,
                                                                                   engine):
    cluster = slurm(2)
    # Node 0: srun's first host; mpirun's own (whatever the srun step of its daemons says).
    launch, split, node0 = {"srun": (srun, by_task, "h0"),
                            "mpirun": (mpirun, by_rank, cluster.hosts.addresses[0])}[engine]
    code, out, err = finish(cluster.popen(launch(2, SGPU, "info")))
    assert code == 0, (out, err)
    name = {"srun": "Slurm", "mpirun": "Open MPI"}[engine]
    for node in (0, 1):
        assert re.search(rf"node {node} of 2, node 0 at {node0}:\d+ \({name}\)",
                         split(out)[node]), (out, err)

    marker = f"{os.getpid()}-{engine}"
    command = launch(2, SGPU, "run", "--backend", "sim", "--gpus", "2", "--", sys.executable, DDP_SCRIPT)
    code, out, err = finish(cluster.popen(command, env=sgpu_env(tmp_path, marker)))
    assert code == 0, (out, err)
    agreed = sorted(re.findall(r"rank (\d): parameters agree", out))
    assert agreed == ["0", "1", "2", "3"], (out, err)
    # mpirun's own srun of its daemons outlives salloc by a moment.
    assert wait_until(lambda: left(marker) == [], limit=10), left(marker)


def test_under_mpirun_a_crash_on_node_1_ends_every_rank_with_that_root_cause(tmp_path, slurm):
    cluster = slurm(2)
    marker = f"{os.getpid()}-mpirun-crash"
    command = mpirun(2, SGPU, "run", "--backend", "sim", "--gpus", "2", "--", *script(tmp_path, SLEEPER))
    code, out, err = finish(cluster.popen(command, env=sgpu_env(tmp_path, marker, CRASH_RANK="3")))
    ended = time.time()
    assert code == 7, (out, err)
    nodes = by_rank(err)
    crashed = float(re.search(r"crashing at ([0-9.]+)", nodes[1]).group(1))
    assert ended - crashed < 10, f"{ended - crashed:.2f} s"
    assert "root cause: rank 3 (node 1 h1" in nodes[0], (out, err)
    # mpirun's own srun of its daemons outlives salloc by a moment.
    assert wait_until(lambda: left(marker) == [], limit=10), left(marker)


def test_under_mpirun_killing_one_nodes_sgpu_ends_the_rest(tmp_path, slurm):
    cluster = slurm(2)
    marker = f"{os.getpid()}-mpirun-kill"
    command = mpirun(2, SGPU, "run", "--backend", "sim", "--gpus", "2", "--", *script(tmp_path, SLEEPER))
    code, out, err, seconds = kill_node_1s_sgpu(cluster, command, tmp_path, marker,
                                                "OMPI_COMM_WORLD_RANK=1")
    assert code != 0, (out, err)
    assert seconds < 15, f"{seconds:.2f} s"
    # mpirun, which sees its process killed, or sgpu's heartbeat, whichever is first, ends
    # node 0's ranks: none is left on any node.
    assert wait_until(lambda: left(marker) == [], limit=10), left(marker)


def test_the_cpp_decorator_under_mpirun_and_by_the_plain_contract(tmp_path, slurm):
    cluster = slurm(2)
    env = {"SGPU_TRACKING": "off", "SGPU_RUNS_DIR": str(tmp_path / "runs")}
    expected = [f"result {r}: rank {r} of 4 on node {r // 2}, sum of ranks 6" for r in range(4)]
    code, out, err = finish(cluster.popen(mpirun(2, NODES_CALLER, "2"), env=env))
    assert code == 0, (out, err)
    for node, lines in by_rank(out).items():
        assert [line for line in lines.splitlines() if line.startswith("result")] == expected, out
    # No engine: torchrun's variables on each host, as a scheduler that drives torchrun sets.
    children = []
    for node in range(2):
        node_env = dict(os.environ, PET_NNODES="2", PET_NODE_RANK=str(node), PET_MASTER_ADDR="h0",
                        PET_MASTER_PORT="29500", **env)
        children.append(subprocess.Popen(cluster.hosts.command(node, [NODES_CALLER, "2"]),
                                         env=node_env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True))
    for child in children:
        code, out, err = finish(child)
        assert code == 0, (out, err)
        assert [line for line in out.splitlines() if line.startswith("result")] == expected, out
