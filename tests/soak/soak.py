"""The chaos soak: calls launched back to back and side by side (through the Python
decorator, the C++ one and sgpu run), with random world sizes,
payloads, fault plans and kills (of ranks, of the fork server, of the caller), CPU
oversubscription, a runs folder on a filesystem too small for the call, and DCP
checkpoints saved through sgpu.checkpoint with a rank dying mid-save, then resumed from;
after every call, its outcome is checked against the one its plan implies and nothing of
it may be left (process, zombie, descriptor, run folder), and after every round of calls
nothing of any call (a listening socket of the soak's processes, a shared-memory file);
at the end every tracked run has ended.

    soak.py --sgpu build/bin/sgpu [--cpp-caller build/bin/sgpu_soak_caller] --calls 40
            [--seed S] [--parallel 2] [--max-gpus 4]

Prints its counts (calls, faults, kills, outcomes) and every departure; exits 1 when there
was one. The seed it prints reproduces the same plans (not the same timings)."""

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from process_table import (alive, is_fork_server, processes, processes_with_marker,  # noqa: E402
                           wait_until)
MARKER = "SGPU_SOAK_MARKER"
SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGKILL: "SIGKILL"}
GONE_WITHIN = 15.0  # seconds a call's processes may take to go once its caller has its outcome
# Jobs whose calls are a decorator's, in one caller process: Python's (caller.py) and C++'s
# (tests/workers/soak_caller.cc).
DECORATORS = ("decorator", "cpp-decorator")


@dataclasses.dataclass
class Call:
    name: str
    world: int
    elements: int
    steps: int
    pause: float
    blob_bytes: int = 0
    chatter: int = 0  # lines each rank prints first (a program filling its runs folder)
    plan: str = ""
    action: str = ""  # the plan's action: exit, throw, segv, abort, hang, slow
    fault_rank: int = -1
    fault_code: int = 0
    kill: Optional[tuple] = None  # ("rank", r, sig), ("server", sig), ("caller", sig)
    full_disk: bool = False
    # One of the cases a user broke before: "sys_exit" (a rank ends by sys.exit), "daemon"
    # (each rank starts a process in a session of its own), "fork" (the caller makes the
    # call from a forked child of itself: its run id must be its own), "checkpoint" (2
    # ranks save a DCP checkpoint a step, `steps` of them; rank exit_rank ends itself with
    # exit code fault_code at write point die_at of save die_in_save; a second call,
    # NAME-resume, resumes from sgpu.checkpoint.latest()).
    case: str = ""
    exit_rank: int = -1
    die_in_save: int = 0
    die_at: str = ""  # VolumeWriter's on_write_point: staged, copied, published
    timeout: float = 240.0
    hang_timeout: float = 6.0
    dir: str = ""
    runs_dir: str = ""


@dataclasses.dataclass
class Job:
    id: int
    kind: str  # "decorator" (@sgpu.distributed in caller.py), "cpp-decorator" or "program" (sgpu run)
    calls: list
    dir: pathlib.Path
    marker: str


class Soak:
    def __init__(self, args):
        self.args = args
        self.random = random.Random(args.seed)  # the plans
        self.timing = random.Random()  # when a kill lands, not part of the plans
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="sgpu-soak-"))
        self.small = None  # the small filesystem, when this process may mount one
        self.store = self.root / "mlflow.db"
        self.counts = collections.Counter()
        self.problems = []
        self.expected_status = {}  # run name -> the MLflow status its run must end with
        self.lock = threading.Lock()
        self.baseline_sockets = set(listening_sockets(self.own_processes()))
        self.baseline_shm = shm_files()
        self.next_job = 0

    # --- plans -------------------------------------------------------------------------

    def plan_call(self, job: Job, index: int, last: bool) -> Call:
        r = self.random
        world = r.randint(1, self.args.max_gpus)
        call = Call(name=f"soak-{job.id}-{index}", world=world,
                    elements=r.choice([1, 7, 1024, 65536, 262144]),
                    steps=r.randint(3, 6), pause=r.choice([0.2, 0.4, 0.6]),
                    blob_bytes=r.choice([0, 100, 1 << 16, 1 << 20]) if job.kind in DECORATORS else 0)
        call.dir = str(job.dir / call.name)
        call.runs_dir = str(job.dir / "runs")
        roll = r.random()
        if job.kind == "decorator" and r.random() < 0.25:  # a quarter of Python's calls
            self.plan_checkpoint(call)
        elif roll < 0.25:
            # A call that succeeds, or one of the cases: a daemon left by every rank (which
            # must not outlive the call), a forked caller (Python's), a rank's sys.exit.
            cases = [""] + (["daemon"] if job.kind != "cpp-decorator" else []) + (
                ["sys_exit", "fork"] if job.kind == "decorator" else [])
            call.case = r.choice(cases)
            if call.case == "sys_exit":
                call.exit_rank = r.randrange(world)
        elif roll < 0.65:
            self.plan_fault(call)
        elif roll < 0.9 or not last:
            call.kill = ("rank", r.randrange(world), r.choice(list(SIGNALS)))
        elif job.kind in DECORATORS and r.random() < 0.4:
            call.kill = ("server", r.choice(list(SIGNALS)))
        else:
            call.kill = ("caller", r.choice(list(SIGNALS)))
        if self.small is not None and call.kill is None and not call.plan and \
                call.case != "checkpoint" and r.random() < 0.15:
            call.full_disk = True
            call.runs_dir = str(self.small / f"job-{job.id}")
            if job.kind in DECORATORS:
                call.blob_bytes = 3 << 20  # more to stage than the small filesystem holds
            else:
                call.chatter = 25000  # more log than it holds (2.9 MB a rank): the call goes on
        return call

    def plan_checkpoint(self, call: Call) -> None:
        """The checkpoint case, small: 2 ranks, a few elements each, 2 or 3 saves; the rank,
        the save and the write point it dies at (published: on the coordinator, rank 0,
        once `.metadata` is in place) drawn from the seed."""
        r = self.random
        call.case, call.world, call.blob_bytes = "checkpoint", 2, 0
        call.elements = r.choice([1, 7, 64])
        call.steps = r.randint(2, 3)
        call.exit_rank = r.randrange(call.world)
        call.die_in_save = r.randint(1, call.steps)
        call.die_at = r.choice(["staged", "copied"] + (["published"] if call.exit_rank == 0 else []))
        call.fault_code = r.randint(3, 60)

    def plan_fault(self, call: Call) -> None:
        r = self.random
        call.fault_rank = r.randrange(call.world)
        call.action = r.choice(["exit", "throw", "segv", "abort", "hang", "slow"])
        k = r.randint(1, call.steps)
        point = {"exit": f"@collective={k}", "throw": f"@collective={k}",
                 "segv": f"@collective={k}", "abort": "@after=300ms",
                 "hang": f"@collective={k}", "slow": ""}[call.action]
        if call.action == "exit":
            call.fault_code = r.randint(3, 60)
            action = f"exit={call.fault_code}"
        elif call.action == "slow":
            action = "slow=50ms"
        else:
            action = call.action
        if call.action == "hang" and call.world == 1:
            call.action, action, point = "exit", "exit=9", "@start"
            call.fault_code = 9
        call.plan = f"rank={call.fault_rank}:{action}{point}"

    # --- running -----------------------------------------------------------------------

    def environment(self, job: Job) -> dict:
        env = dict(os.environ)
        for name in ("SGPU_SIM_FAULTS", "SGPU_SIM", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME",
                     "MLFLOW_EXPERIMENT_ID", "SGPU_TRACKING"):
            env.pop(name, None)
        env.update({MARKER: job.marker, "SGPU_BACKEND": "sim",
                    "MLFLOW_TRACKING_URI": f"sqlite:///{self.store}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))})
        return env

    def run_job(self, job: Job) -> None:
        try:
            if job.kind in DECORATORS:
                self.run_decorator_job(job)
            else:
                for call in job.calls:
                    self.run_program_call(job, call)
        except Exception as error:  # the soak's own failure is a finding too
            self.problem(job, None, f"the soak itself failed: {error!r}")

    def run_decorator_job(self, job: Job) -> None:
        spec = job.dir / "job.json"
        spec.write_text(json.dumps({"calls": [dataclasses.asdict(c) for c in job.calls]}))
        caller = ([sys.executable, str(HERE / "caller.py")] if job.kind == "decorator"
                  else [self.args.cpp_caller])
        child = subprocess.Popen([*caller, str(spec)],
                                 env=self.environment(job), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        stderr = []
        threading.Thread(target=lambda: stderr.extend(child.stderr), daemon=True).start()
        first_descriptors = None
        server_killed = False
        chaos = None
        deadline = time.monotonic() + self.args.job_limit
        watchdog = threading.Timer(self.args.job_limit, child.kill)
        watchdog.start()
        try:
            for line in child.stdout:
                event = json.loads(line)
                if event["event"] == "ready":
                    first_descriptors = event["descriptors"]
                    continue
                call = job.calls[event["call"]]
                if event["event"] == "start":
                    chaos = self.start_chaos(job, call, child)
                    continue
                if chaos is not None:
                    chaos.join()
                self.check_decorator_outcome(job, call, event)
                if call.kill and call.kill[0] == "server":
                    server_killed = True
                now, then = event["descriptors"], first_descriptors
                if server_killed:  # its control socket went with it; the next server has another
                    now = {fd: link for fd, link in now.items() if not link.startswith("socket:")}
                    then = {fd: link for fd, link in then.items() if not link.startswith("socket:")}
                if now.keys() != then.keys():
                    opened = {fd: now[fd] for fd in now.keys() - then.keys()}
                    closed = {fd: then[fd] for fd in then.keys() - now.keys()}
                    self.problem(job, call, f"the caller holds {len(now)} descriptors after this "
                                            f"call, {len(then)} before the calls: new {opened}, "
                                            f"gone {closed}")
                if event["zombies"]:
                    self.problem(job, call, f"the caller has zombie children {event['zombies']}")
                self.check_ranks_gone(job, call)
            code = child.wait()
        finally:
            watchdog.cancel()
        if time.monotonic() > deadline:
            self.problem(job, None, f"the job did not end within {self.args.job_limit} s; killed")
        last = job.calls[-1]
        if last.kill and last.kill[0] == "caller":
            if chaos is not None:
                chaos.join()
            self.check_caller_killed(job, last, code, "".join(stderr))
        elif code != 0:
            self.problem(job, None, f"caller.py exited {code}: {''.join(stderr)[-2000:]}")
        self.check_nothing_left(job)

    def run_program_call(self, job: Job, call: Call) -> None:
        env = self.environment(job)
        if call.plan:
            env["SGPU_SIM_FAULTS"] = call.plan
        pathlib.Path(call.dir).mkdir(parents=True, exist_ok=True)
        runs = pathlib.Path(call.runs_dir)
        before = run_folders(runs)
        command = [self.args.sgpu, "run", "--gpus", str(call.world), "--backend", "sim",
                   "--timeout", str(int(call.timeout)), "--hang-timeout", str(int(call.hang_timeout)),
                   "--run-name", call.name, "--log-dir", call.runs_dir, "--",
                   sys.executable, str(HERE / "work.py"), call.dir, str(call.elements),
                   str(call.steps), str(call.pause), str(call.chatter),
                   "1" if call.case == "daemon" else "0"]
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        chaos = self.start_chaos(job, call, child)
        try:
            out, err = child.communicate(timeout=self.args.job_limit)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            self.problem(job, call, f"sgpu run did not end within {self.args.job_limit} s; killed")
        if chaos is not None:
            chaos.join()
        if call.kill and call.kill[0] == "caller":
            self.check_caller_killed(job, call, child.returncode, err)
        else:
            self.check_program_outcome(job, call, child.returncode, out, err)
        self.check_ranks_gone(job, call)
        self.check_nothing_left(job)
        kept = len(run_folders(runs) - before)
        failed = child.returncode != 0
        if kept != (1 if failed else 0):
            self.problem(job, call, f"{kept} run folders kept by a call that "
                                    f"{'failed' if failed else 'succeeded'}")

    # --- chaos -------------------------------------------------------------------------

    def start_chaos(self, job: Job, call: Call, child) -> Optional[threading.Thread]:
        self.counts["calls"] += 1
        self.counts[f"calls.{job.kind}"] += 1
        if call.case:
            self.counts[f"cases.{call.case}"] += 1
        if call.plan:
            self.counts[f"faults.{call.action}"] += 1
        if call.full_disk:
            self.counts["full_disk"] += 1
        if call.kill is None:
            return None
        thread = threading.Thread(target=self.kill, args=(job, call, child), daemon=True)
        thread.start()
        return thread

    @staticmethod
    def is_server(job: Job, child, pid: int) -> bool:
        """True for the fork server of the job's caller: Python's, or the C++ caller's own
        binary started as one (its ranks, forked from it, share its environment)."""
        if job.kind == "decorator":
            return is_fork_server(pid)
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        return ppid == child.pid and b"SGPU_ROLE=fork-server" in environ

    def kill(self, job: Job, call: Call, child) -> None:
        folder = pathlib.Path(call.dir)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if all((folder / f"rank-{r}.ready").exists() for r in range(call.world)):
                break
            time.sleep(0.02)
        else:
            self.problem(job, call, "the ranks never all joined, so the planned kill was not sent")
            return
        time.sleep(self.timing.uniform(0.0, 0.3))
        target, sig = call.kill[0], call.kill[-1]
        if target == "rank":
            pid = int((folder / f"rank-{call.kill[1]}.pid").read_text())
        elif target == "server":
            servers = [p for p in processes_of(job) if self.is_server(job, child, p)]
            if not servers:
                self.problem(job, call, "no fork server to kill")
                return
            pid = servers[0]
        else:
            pid = child.pid
        try:
            os.kill(pid, sig)
            self.counts[f"kills.{target}.{SIGNALS[sig]}"] += 1
        except ProcessLookupError:
            self.problem(job, call, f"the {target} to kill (pid {pid}) was gone already")

    # --- outcomes ----------------------------------------------------------------------

    def expectation(self, call: Call) -> dict:
        """What the call's plan implies: status, and for a failure its root-cause rank,
        kind, exit code or signal."""
        if call.full_disk:
            return {"status": "error"}  # a decorator's: the call cannot be staged
        if call.kill and call.kill[0] == "rank":
            return {"status": "failed", "rank": call.kill[1], "kind": "signal", "signal": int(call.kill[2])}
        if call.kill and call.kill[0] == "server":
            return {"status": "any"}
        if call.case == "checkpoint":  # the first call: its rank's os._exit mid-save
            return {"status": "failed", "rank": call.exit_rank, "kind": "exit_code",
                    "exit_code": call.fault_code}
        if call.case == "sys_exit":  # a DistributedError naming what the rank raised
            return {"status": "failed", "rank": call.exit_rank, "kind": "exception",
                    "exception_type": "SystemExit"}
        action = call.action
        if not call.plan or action == "slow":
            return {"status": "ok"}
        if action == "exit":
            return {"status": "failed", "rank": call.fault_rank, "kind": "exit_code",
                    "exit_code": call.fault_code}
        if action == "throw":
            return {"status": "failed", "rank": call.fault_rank, "kind": "exception"}
        if action == "segv":
            return {"status": "failed", "rank": call.fault_rank, "kind": "signal", "signal": 11}
        if action == "abort":
            return {"status": "failed", "rank": call.fault_rank, "kind": "signal", "signal": 6}
        if action == "hang":
            return {"status": "failed", "type": "HangError", "culprits": [call.fault_rank]}
        raise AssertionError(action)

    def check_decorator_outcome(self, job: Job, call: Call, event: dict) -> None:
        expected = self.expectation(call)
        status = event["status"]
        self.counts[f"outcomes.{status}"] += 1
        if expected["status"] == "any":
            self.expected_status[call.name] = {"ok": "FINISHED"}.get(status, "FAILED")
        elif status != expected["status"]:
            self.problem(job, call, f"ended {status}, not {expected['status']}: "
                                    f"{event.get('message', event.get('results'))}"[:3000])
            return
        if status == "ok":
            self.expected_status.setdefault(call.name, "FINISHED")
            results = event["results"]
            want = [{"rank": r, "world": call.world, "blob": crc_of(call.blob_bytes),
                     "bytes": call.blob_bytes} for r in range(call.world)]
            if results != want:
                self.problem(job, call, f"results {results}, not {want}")
            if event["run_dir"] and os.path.exists(event["run_dir"]):
                self.problem(job, call, f"a call that succeeded left its run folder {event['run_dir']}")
            return
        if status == "error":
            self.expected_status[call.name] = "FAILED"
            if call.full_disk and not (event["type"] == "Error" and str(self.small) in event["message"]
                                       and "No space left" in event["message"]):
                self.problem(job, call, f"a full runs folder raised {event['type']}: "
                                        f"{event['message']!r}, not an sgpu.Error naming "
                                        f"{self.small} and that it is full")
            return
        for key, value in expected.items():
            if key != "status" and event.get(key) != value:
                self.problem(job, call, f"{key} is {event.get(key)!r}, not {value!r}: "
                                        f"{event.get('message', '')[:3000]}")
                break
        self.expected_status.setdefault(call.name, "FAILED")  # a hang too: a rank failed to join
        if event["run_dir"] and not os.path.isdir(event["run_dir"]):
            self.problem(job, call, f"a call that failed did not keep its run folder {event['run_dir']}")
        if call.case == "checkpoint":
            self.check_checkpoint(job, call, event)

    def check_checkpoint(self, job: Job, call: Call, event: dict) -> None:
        """After a save a rank died in, latest() named the newest complete checkpoint, and
        the call that resumed from it loaded it and ended as an uninterrupted one would,
        its last save the newest checkpoint."""
        self.counts[f"checkpoint.died_{call.die_at}"] += 1
        # A save is complete once the coordinator has published its .metadata.
        newest = call.die_in_save - (call.die_at != "published")
        want = f"step-{newest:06d}" if newest else None
        death = f"rank {call.exit_rank} died at {call.die_at} of save {call.die_in_save}"
        if event.get("latest") != want:
            self.problem(job, call, f"{death}; latest() then named {event.get('latest')!r}, "
                                    f"not {want!r}")
        resumed = event.get("resumed") or {}
        self.expected_status[f"{call.name}-resume"] = "FINISHED"
        if resumed.get("status") != "ok":
            self.problem(job, call, f"{death}; the resume from {want!r} ended "
                                    f"{resumed.get('status')}: {resumed.get('message')}"[:3000])
            return
        values = checkpoint_values(call.world, call.steps)
        results = [{"rank": r, "world": call.world, "step": call.steps, "loaded": want or "",
                    "values": [float(values[r])] * call.elements} for r in range(call.world)]
        if resumed["results"] != results:
            self.problem(job, call, f"{death}; the resume returned {resumed['results']}, "
                                    f"not {results}"[:3000])
        if event.get("latest_after") != f"step-{call.steps:06d}":
            self.problem(job, call, f"after the resume latest() named "
                                    f"{event.get('latest_after')!r}, not 'step-{call.steps:06d}'")
        if resumed["run_dir"] and os.path.exists(resumed["run_dir"]):
            self.problem(job, call, f"the resume, which succeeded, left its run folder "
                                    f"{resumed['run_dir']}")

    def check_program_outcome(self, job: Job, call: Call, code: int, out: str, err: str) -> None:
        expected = self.expectation(call)
        self.counts[f"outcomes.{'ok' if code == 0 else 'failed'}"] += 1
        if call.full_disk:  # the logs stop where the folder filled, said once a rank; the call goes on
            said = err.count("is incomplete from here: No space left on device")
            if said != call.world:
                self.problem(job, call, f"{said} ranks said their log is incomplete, not "
                                        f"{call.world}: {err[-2000:]}")
            expected = {"status": "ok"}
        if expected["status"] == "ok":
            self.expected_status[call.name] = "FINISHED"
            if code != 0:
                self.problem(job, call, f"sgpu run exited {code}, not 0: {err[-3000:]}")
            elif out.count("'world': %d" % call.world) != call.world:
                self.problem(job, call, f"not every rank printed its result: {out[-2000:]}")
            return
        if expected.get("type") == "HangError":
            want, named = 124, f"rank {call.fault_rank} never entered"
        elif expected["kind"] == "signal":
            want, named = 128 + expected["signal"], f"rank {expected['rank']}"
        elif expected["kind"] == "exception":
            want, named = 1, f"rank {expected['rank']}"
        else:
            want, named = expected["exit_code"], f"rank {expected['rank']}"
        self.expected_status[call.name] = "FAILED"
        if code != want or named not in root_cause_line(err):
            self.problem(job, call, f"sgpu run exited {code} (wanted {want}, with {named!r} as the "
                                    f"root cause): {err[-3000:]}")

    def check_caller_killed(self, job: Job, call: Call, code: int, err: str) -> None:
        sig = call.kill[-1]
        self.counts[f"outcomes.caller_{SIGNALS[sig]}"] += 1
        # On SIGTERM the caller tears its ranks down and dies of the signal; sgpu run, a
        # C++ program, does the same.
        if code != -sig:
            self.problem(job, call, f"the caller killed with {SIGNALS[sig]} ended {code}: {err[-2000:]}")
        self.expected_status[call.name] = "KILLED"
        if sig == signal.SIGKILL:
            # Nobody was left to end its run: the next sync of its runs folder does, once the
            # ranks are gone (the next call there would too).
            self.check_ranks_gone(job, call)
            synced = subprocess.run([self.args.sgpu, "tracking", "sync", "--log-dir", call.runs_dir],
                                    env=self.environment(job), capture_output=True, text=True,
                                    timeout=120)
            if synced.returncode != 0 or "left running by a caller that died" not in synced.stdout:
                self.problem(job, call, f"sgpu tracking sync after the caller's death said "
                                        f"{synced.returncode}: {synced.stdout[-1000:]}{synced.stderr[-1000:]}")

    # --- what must not be left ---------------------------------------------------------

    def check_ranks_gone(self, job: Job, call: Call) -> None:
        pids = []
        for pid_file in pathlib.Path(call.dir).glob("**/rank-*.pid"):  # a resume's too
            pids.append(int(pid_file.read_text()))
        if not wait_until(lambda: alive(pids) == [], GONE_WITHIN):
            self.problem(job, call, f"ranks (or what they started) still run: {describe(alive(pids))}")
            for pid in alive(pids):
                try_kill(pid)

    def check_nothing_left(self, job: Job) -> None:
        """After the job's caller has ended: no process of the job's."""
        if not wait_until(lambda: processes_of(job) == [], GONE_WITHIN):
            left = processes_of(job)
            self.problem(job, None, f"processes left: {describe(left)}")
            for pid in left:
                try_kill(pid)

    def own_processes(self) -> list:
        """This soak's live processes: itself, what it started, and whatever carries one of
        its jobs' markers (a call's leftover, reparented away from the soak)."""
        return own_processes(os.getpid(), f"{MARKER}={os.getpid()}-")

    def check_round(self) -> None:
        """Between rounds, with no call running: no listening socket of the soak's own
        processes (another process of the machine may listen as it likes) and no
        shared-memory file that was not there before the soak."""
        sockets = {address: pids for address, pids in listening_sockets(self.own_processes()).items()
                   if address not in self.baseline_sockets}
        if sockets:
            said = ", ".join(f"{address} held by {describe(sorted(pids))}"
                             for address, pids in sorted(sockets.items()))
            self.problem(None, None, f"listening sockets left: {said}")
            self.baseline_sockets |= sockets.keys()
        shm = shm_files() - self.baseline_shm
        if shm:
            self.problem(None, None, f"shared-memory files left in /dev/shm: {sorted(shm)}")
            self.baseline_shm |= shm

    def check_tracking(self) -> None:
        if not self.store.exists():
            self.problem(None, None, f"no MLflow database at {self.store}")
            return
        with sqlite3.connect(self.store) as db:
            rows = dict(db.execute("SELECT name, status FROM runs"))
        for name, want in sorted(self.expected_status.items()):
            status = rows.get(name)
            self.counts[f"runs.{status}"] += 1
            if status != want:
                self.problem(None, None, f"run {name} is {status}, not {want}")

    def problem(self, job: Optional[Job], call: Optional[Call], text: str) -> None:
        where = []
        if job is not None:
            where.append(f"job {job.id} ({job.kind})")
        if call is not None:
            where.append(f"call {call.name} [world {call.world}, plan {call.plan or '-'}, "
                         f"kill {format_kill(call.kill)}{', full disk' if call.full_disk else ''}]")
        with self.lock:
            self.problems.append(f"{' '.join(where)}: {text}")
            print(f"soak: PROBLEM {self.problems[-1]}", flush=True)

    # --- the whole soak ----------------------------------------------------------------

    def mount_small(self) -> None:
        target = self.root / "small"
        target.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "sgpu-soak", str(target)],
                                 capture_output=True, text=True)
        if mounted.returncode == 0:
            self.small = target
        else:
            print(f"soak: no full-disk calls: cannot mount a small tmpfs here "
                  f"({mounted.stderr.strip() or 'mount failed'}); as root it can", flush=True)

    def run(self) -> int:
        print(f"soak: seed {self.args.seed}, {self.args.calls} calls, up to {self.args.parallel} side by "
              f"side, up to {self.args.max_gpus} ranks each, in {self.root}", flush=True)
        started = time.monotonic()
        self.mount_small()
        try:
            planned = 0
            while planned < self.args.calls:
                jobs = []
                for _ in range(self.random.randint(1, self.args.parallel)):
                    if planned >= self.args.calls:
                        break
                    job = self.new_job(min(self.random.randint(1, 3), self.args.calls - planned))
                    planned += len(job.calls)
                    jobs.append(job)
                busy = self.start_busy() if self.random.random() < 0.3 else []
                threads = [threading.Thread(target=self.run_job, args=(job,)) for job in jobs]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                for process in busy:
                    process.kill()
                    process.wait()
                self.counts["rounds"] += 1
                self.counts["rounds.side_by_side"] += len(jobs) > 1
                self.check_round()
            self.check_tracking()
        finally:
            if self.small is not None:
                subprocess.run(["umount", str(self.small)], check=False)
            if not self.problems and not self.args.keep:
                shutil.rmtree(self.root, ignore_errors=True)
        self.counts["seconds"] = round(time.monotonic() - started)
        print("soak: " + ", ".join(f"{key} {value}" for key, value in sorted(self.counts.items())))
        if self.problems:
            print(f"soak: {len(self.problems)} problems (seed {self.args.seed}; files in {self.root})")
            return 1
        print("soak: every outcome as planned, nothing left behind")
        return 0

    def new_job(self, calls: int) -> Job:
        self.next_job += 1
        kinds = ["decorator", "program"] + (["cpp-decorator"] if self.args.cpp_caller else [])
        kind = self.random.choice(kinds)
        job = Job(id=self.next_job, kind=kind, calls=[], dir=self.root / f"job-{self.next_job}",
                  marker=f"{os.getpid()}-{self.next_job}")
        job.dir.mkdir()
        for index in range(calls):
            job.calls.append(self.plan_call(job, index, index == calls - 1))
        return job

    def start_busy(self) -> list:
        """As many spinning processes as there are cores, beside the ranks."""
        self.counts["rounds.oversubscribed"] += 1
        return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 2)]


# --- reading the machine -------------------------------------------------------------


def processes_of(job: Job) -> list:
    """The live processes of the job: its caller and all the caller started (the marker)."""
    return processes_with_marker(f"{MARKER}={job.marker}")


def describe(pids) -> str:
    parts = []
    for pid in pids:
        try:
            command = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            command = "?"
        parts.append(f"{pid} ({command.strip()[:120]})")
    return ", ".join(parts) or "none"


def try_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def own_processes(root: int, marker_prefix: str) -> list:
    """The live processes `root` and its descendants, and every live process whose
    environment holds a variable that starts with `marker_prefix` ("NAME=value-"): what a
    soak's call started, even once its parent is gone and it was reparented."""
    table = [process for process in processes() if process.state != "Z"]
    children = collections.defaultdict(list)
    for process in table:
        children[process.ppid].append(process.pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children[pid])
    prefix = marker_prefix.encode()
    for process in table:
        if process.pid in found:
            continue
        try:
            environ = pathlib.Path(f"/proc/{process.pid}/environ").read_bytes()
        except OSError:
            continue
        if any(entry.startswith(prefix) for entry in environ.split(b"\0")):
            found.add(process.pid)
    return sorted(found & {process.pid for process in table})


def listening_sockets(pids) -> dict:
    """The TCP sockets in LISTEN state that the processes `pids` hold, as {"host:port":
    {pid, ...}}: their descriptors' socket inodes, found in the TCP tables of their network
    namespaces (/proc/PID/net/tcp and tcp6)."""
    holders = collections.defaultdict(set)  # socket inode -> pids
    namespaces = {}  # network namespace -> a pid in it, whose tables show it
    for pid in pids:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
            namespaces.setdefault(os.readlink(f"/proc/{pid}/ns/net"), pid)
        except OSError:  # gone, or not ours to read
            continue
        for fd in descriptors:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                holders[link[len("socket:["):-1]].add(pid)
    found = collections.defaultdict(set)
    for pid in namespaces.values():
        for table in ("tcp", "tcp6"):
            try:
                lines = pathlib.Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in holders:  # LISTEN, one of theirs
                    found[socket_address(fields[1])] |= holders[fields[9]]
    return dict(found)


def socket_address(text: str) -> str:
    """A /proc/net/tcp{,6} address ("0100007F:1F90": the host as 32-bit words in the
    machine's order, the port in hex) as "127.0.0.1:8080" or "[::1]:8080"."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[at:at + 4][::-1] if sys.byteorder == "little" else raw[at:at + 4]
                   for at in range(0, len(raw), 4))
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw)}:{int(port, 16)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{int(port, 16)}"


def shm_files() -> set:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def run_folders(runs: pathlib.Path) -> set:
    try:
        return {p.name for p in runs.iterdir() if p.is_dir()}
    except OSError:
        return set()


def root_cause_line(err: str) -> str:
    """The lines of sgpu run's report that name the root cause (its first lines)."""
    return "\n".join(line for line in err.splitlines() if "sgpu:" in line or "root cause" in line)


def checkpoint_values(world: int, steps: int) -> list:
    """Each rank's value after `steps` steps of the checkpoint case (work.checkpointed)."""
    values = [rank + 1 for rank in range(world)]
    for step in range(1, steps + 1):
        total = sum(values)
        values = [total + step * (rank + 1) for rank in range(world)]
    return values


def crc_of(size: int) -> int:
    import zlib

    return zlib.crc32(b"\x5a" * size)


def format_kill(kill) -> str:
    if kill is None:
        return "-"
    return " ".join([kill[0], *[str(k) for k in kill[1:-1]], SIGNALS[kill[-1]]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sgpu", required=True, help="the sgpu command")
    parser.add_argument("--cpp-caller", help="tests/workers/soak_caller.cc built: jobs through the "
                                             "C++ decorator too")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--parallel", type=int, default=2, help="most jobs side by side")
    parser.add_argument("--max-gpus", type=int, default=4, help="most ranks in a call")
    parser.add_argument("--job-limit", type=float, default=600.0, help="seconds a job may take")
    parser.add_argument("--keep", action="store_true", help="keep the soak's folder")
    return Soak(parser.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
