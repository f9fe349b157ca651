"""@sgpu.distributed on simulated ranks: results, errors, options, handles."""

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sgpu
from conftest import alive, distributed_error, processes_with_marker, wait_until
from sgpu_cli import SGPU, needs_cli
from sgpu import distributed


def whoami(scale):
    return (sgpu.get_global_rank(), sgpu.get_world_size(), sgpu.get_local_rank(), scale * sgpu.global_rank())


def test_results_come_back_in_rank_order():
    fn = distributed(gpus=4, gpu_type="H100")(whoami)
    assert fn.distributed(10) == [(r, 4, r, 10 * r) for r in range(4)]


def test_a_plain_call_runs_here():
    fn = distributed(gpus=4)(whoami)
    assert fn(3) == (0, 1, 0, 0)


def test_positional_and_keyword_arguments_and_closures_travel():
    offset = 7

    @distributed(gpus=2)
    def add(a, *, b):
        return a + b + offset + sgpu.get_global_rank()

    assert add.distributed(1, b=2) == [10, 11]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ranks=st.integers(1, 8), size=st.integers(0, 3 << 20), seed=st.integers(0, 2**31))
def test_each_rank_returns_what_it_computed(ranks, size, seed):
    data = bytes((seed + i) % 251 for i in range(min(size, 4096))) * (size // 4096 + 1)
    data = data[:size]

    @distributed(gpus=ranks, tracking=False)
    def echo(blob):
        rank = sgpu.get_global_rank()
        return rank, len(blob), blob[rank::97]

    assert echo.distributed(data) == [(r, size, data[r::97]) for r in range(ranks)]


def test_a_ranks_exception_is_raised_as_itself_with_the_remote_traceback():
    @distributed(gpus=3)
    def fail_on_two():
        if sgpu.get_global_rank() == 2:
            raise ValueError("rank two refuses")
        time.sleep(30)

    with pytest.raises(ValueError, match="rank two refuses") as caught:
        fail_on_two.distributed()
    cause = caught.value.__cause__
    assert isinstance(cause, sgpu.DistributedError)
    assert cause.root_cause.rank == 2
    assert cause.root_cause.kind == "exception"
    assert cause.root_cause.exception_type == "ValueError"
    # the function's own file and line, not the worker's frames
    assert f'File "{__file__}"' in cause.root_cause.traceback
    assert 'raise ValueError("rank two refuses")' in cause.root_cause.traceback
    assert "_worker.py" not in cause.root_cause.traceback
    assert 'raise ValueError("rank two refuses")' in str(cause)
    assert [row.kind for row in cause.ranks] == ["terminated", "terminated", "exception"]


@pytest.mark.parametrize("ending, kind, said", [
    ("sys.exit(0)", "SystemExit", "called sys.exit(0)"),
    ("sys.exit(3)", "SystemExit", "called sys.exit(3)"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt", "ended by KeyboardInterrupt"),
    ("raise GeneratorExit", "GeneratorExit", "ended by GeneratorExit"),
])
def test_a_rank_that_ends_by_a_base_exception_fails_the_call_and_not_the_caller(
        ending, kind, said):
    namespace = {"sgpu": sgpu, "sys": sys}
    exec(textwrap.dedent(f"""
        def ends():
            if sgpu.get_global_rank() == 1:
                {ending}
            return sgpu.get_global_rank()
        """), namespace)
    fn = distributed(gpus=2, tracking=False)(namespace["ends"])
    with pytest.raises(sgpu.DistributedError) as caught:
        fn.distributed()
    root = caught.value.root_cause
    assert (root.rank, root.kind, root.exception_type) == (1, "exception", kind)
    assert said in root.message


@pytest.mark.parametrize("fails", [False, True])
def test_a_finished_call_holds_no_store_and_its_handle_goes_with_its_last_reference(
        fails, tmp_path, monkeypatch):
    """A handle kept after its call holds no connection to the MLflow database, and, without
    the cyclic collector, a failed call's error does not keep its handle (and what the call
    holds) alive once the caller lets go of both."""
    import gc
    import weakref

    database = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")

    @distributed(gpus=2)
    def maybe_fail():
        if fails:
            raise ValueError("planned")
        return sgpu.get_global_rank()

    def descriptors():
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                found.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # the listing's own
                pass
        return sorted(found)

    distributed(gpus=2)(sgpu.get_global_rank).distributed()  # the fork server, once
    before = descriptors()
    gc.disable()
    try:
        handle = maybe_fail.launch()
        values = None
        try:
            values = handle.result()  # not inside an assert, whose rewriting keeps handle.result
        except ValueError:
            pass
        assert values == (None if fails else [0, 1])
        assert not [d for d in descriptors() if d.startswith(str(database))], descriptors()
        gone = weakref.ref(handle)
        del handle
        assert gone() is None, "the handle is kept alive by a reference cycle"
        assert descriptors() == before
    finally:
        gc.enable()


def test_a_runs_folder_too_full_for_the_call_is_an_sgpu_error_naming_it(small_filesystem):
    small = small_filesystem("1m")
    fn = distributed(gpus=2, runs_dir=str(small), tracking=False)(lambda blob: len(blob))
    with pytest.raises(sgpu.Error, match="No space left on device") as caught:
        fn.distributed(b"x" * (2 << 20))
    assert type(caught.value) is sgpu.Error
    assert f"cannot stage the call in its run folder: cannot write {small}/" in str(caught.value)
    assert "runs_dir" in str(caught.value)
    assert fn.distributed(b"x" * 1000) == [1000, 1000]  # the next call that fits runs


def test_an_exception_that_does_not_pickle_still_names_its_rank():
    class Local(Exception):
        def __reduce__(self):
            raise TypeError("no")

    @distributed(gpus=2)
    def raise_local():
        if sgpu.get_global_rank() == 1:
            raise Local("odd one")
        time.sleep(30)

    with pytest.raises(sgpu.DistributedError) as caught:
        raise_local.distributed()
    assert caught.value.root_cause.rank == 1
    assert "odd one" in str(caught.value)


def test_an_unpicklable_result_names_the_rank():
    @distributed(gpus=2)
    def lock_on_one():
        import threading

        return threading.Lock() if sgpu.get_global_rank() == 1 else 0

    with pytest.raises(TypeError, match="rank 1's result") as caught:
        lock_on_one.distributed()
    assert caught.value.__cause__.root_cause.rank == 1


@pytest.mark.parametrize(
    "options, match",
    [
        ({"gpus": 0}, "gpus must be at least 1"),
        ({"gpus": "2"}, "gpus must be a positive int"),
        ({"timeout": -1}, "timeout=None"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"colour": "red"}, "unknown option colour"),
        ({"start_method": "spawn"}, "start_method"),
        ({"console_ranks": [0, 9], "gpus": 2}, "console_ranks names rank 9"),
        ({"backend": "tpu"}, "tpu"),
        ({"timeout": True}, "timeout must be seconds"),
        ({"timeout": float("nan")}, r"timeout must be seconds \(a positive number.*, got nan"),
        ({"gpus": 0}, "gpus must be at least 1, got 0"),
        ({"hang_timeout": 0}, "hang_timeout must be positive, got 0 ms; use hang_timeout=None"),
        ({"rdzv_timeout": -1.0}, "rdzv_timeout must be positive seconds"),
        ({"max_payload_bytes": 0}, "max_payload_bytes must be positive"),
        ({"teardown_grace": -1}, "teardown_grace must not be negative"),
        ({"recorder_entries": -1}, "recorder_entries is out of range"),
        ({"hang_timeout": False}, "hang_timeout must be seconds"),
        ({"teardown_grace": float("nan")}, "teardown_grace must be seconds"),
        ({"teardown_grace": True}, "teardown_grace must be seconds"),
    ],
)
def test_bad_options_are_config_errors_before_anything_starts(options, match, monkeypatch):
    monkeypatch.delenv("SGPU_BACKEND")  # it would override backend=
    monkeypatch.setenv("SGPU_SIM", "8xH100")
    with pytest.raises(sgpu.ConfigError, match=match):
        distributed(**options)(whoami).distributed(1)


def test_a_bad_value_is_refused_as_the_decorator_is_applied():
    # The C++ checks of a call, run by the decorator itself: no call is needed to see them.
    with pytest.raises(sgpu.ConfigError, match="gpus must be at least 1, got 0"):
        distributed(gpus=0)(whoami)
    with pytest.raises(sgpu.ConfigError,
                       match='start_method must be "auto", "fork-server" or "exec", got "spawn"'):
        distributed(start_method="spawn")(whoami)
    assert distributed(gpus=2, timeout=None, hang_timeout=None)(whoami) is not None


def test_a_gpu_type_the_node_lacks_is_a_mismatch_before_anything_starts(sgpu_sandbox):
    with pytest.raises(sgpu.AcceleratorMismatchError, match="A10"):
        distributed(gpus=2, gpu_type="A10", sim_node="8xH100")(whoami).distributed(1)
    assert not (sgpu_sandbox / "runs").exists() or not any((sgpu_sandbox / "runs").iterdir())


def test_too_many_gpus_is_a_mismatch():
    with pytest.raises(sgpu.AcceleratorMismatchError, match="gpus=2"):
        distributed(gpus=3, sim_node="2xH100")(whoami).distributed(1)


def test_a_payload_over_the_limit_names_its_largest_parts():
    big = b"x" * 200_000

    @distributed(gpus=1, max_payload_bytes=100_000)
    def uses_big(small):
        return len(big) + len(small)

    with pytest.raises(sgpu.ConfigError, match=r"max_payload_bytes.*the largest: captured big \(2\d\d,\d\d\d bytes\)"):
        uses_big.distributed(b"y")


def test_a_result_over_the_limit_is_result_too_large_in_the_decorators_words():
    @distributed(gpus=2, max_payload_bytes=100_000)
    def returns_big():
        return b"r" * 200_000

    with pytest.raises(sgpu.ResultTooLarge,
                       match=r"exceeds the limit of 100000 bytes; raise max_payload_bytes or "
                             r"return less"):
        returns_big.distributed()


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(timeout=st.one_of(st.floats(min_value=5, max_value=1e300), st.just(float("inf")),
                         st.sampled_from([1e10, 2**63 / 1000, 1e18, 9.3e15])),
       hang=st.one_of(st.none(), st.floats(min_value=5, max_value=1e300),
                      st.just(float("inf"))),
       grace=st.one_of(st.floats(min_value=0, max_value=1e300), st.just(float("inf"))))
def test_any_long_enough_deadline_lets_a_quick_call_finish(timeout, hang, grace):
    """Past what the clocks hold, a timeout is none and a grace the longest there is: never a
    deadline that wrapped around into the past."""
    fn = distributed(gpus=2, tracking=False, timeout=timeout, hang_timeout=hang,
                     teardown_grace=grace)(whoami)
    assert fn.distributed(1) == [(0, 2, 0, 0), (1, 2, 1, 1)]


def test_the_deadline_raises_sgpu_timeout_error_naming_the_running_ranks():
    @distributed(gpus=2, timeout=6, teardown_grace=0.5)  # long enough for rank 0 to start under load
    def sleeps():
        if sgpu.get_global_rank() == 1:
            time.sleep(60)
        return 0

    with pytest.raises(sgpu.TimeoutError, match="ranks still running: 1") as caught:
        sleeps.distributed()
    assert [row.kind for row in caught.value.ranks] == ["ok", "timed_out"]


def test_a_handle_waits_cancels_and_reports(sgpu_sandbox):
    pids = sgpu_sandbox / "pids"
    pids.mkdir()

    @distributed(gpus=2)
    def sleeps(folder):
        import pathlib
        import subprocess

        child = subprocess.Popen(["sleep", "1000"])
        (pathlib.Path(folder) / str(sgpu.get_global_rank())).write_text(f"{os.getpid()} {child.pid}")
        time.sleep(60)

    handle = sleeps.launch(str(pids))
    assert handle.run_dir.startswith(str(sgpu_sandbox / "runs"))
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.3)
    assert not handle.done()
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(p) for f in pids.iterdir() for p in f.read_text().split()]
    assert len(alive(started)) == 4  # two ranks, a sleep each
    handle.cancel()
    with pytest.raises(sgpu.CancelledError):
        handle.result()
    assert handle.done()
    assert alive(started) == []


def test_ranks_output_reaches_python_streams(capsys):
    @distributed(gpus=2, tracking=False)
    def speak():
        print(f"hello from {sgpu.get_global_rank()}")
        print("to stderr", file=sys.stderr)

    speak.distributed()
    out, err = capsys.readouterr()
    assert "[rank 0] hello from 0\n" in out and "[rank 1] hello from 1\n" in out
    assert err.count("to stderr") == 2


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(line=st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")))
def test_any_bytes_a_rank_writes_reach_the_console_as_python_would_show_them(line, capsys):
    capsys.readouterr()

    @distributed(gpus=1, tracking=False)
    def write(data):
        sys.stdout.buffer.write(b"<" + data + b">\n")
        sys.stdout.buffer.flush()

    write.distributed(line)
    out, err = capsys.readouterr()
    assert "[rank 0] <" + line.decode("utf-8", "replace") + ">\n" in out
    assert "UnicodeDecodeError" not in err


@pytest.mark.parametrize(
    "plan, kind, rank",
    [
        ("rank=1:exit=3@start", "exit_code", 1),
        ("rank=0:segv@start", "signal", 0),
        ("rank=2:abort@after=200ms", "signal", 2),
        ("rank=1:throw@start", "exception", 1),
    ],
)
def test_the_fault_plan_acts_on_python_ranks(plan, kind, rank):
    @distributed(gpus=3, sim_faults=plan)
    def naps():
        time.sleep(5)
        return 0

    # a thrown fault comes back as the exception the rank raised, from the DistributedError
    with pytest.raises(Exception) as caught:
        naps.distributed()
    error = distributed_error(caught.value)
    assert error.root_cause.rank == rank
    assert error.root_cause.kind == kind


@pytest.mark.parametrize("method", ["fork-server", "exec"])
def test_keyboard_interrupt_cancels_the_call_and_reaches_the_caller(tmp_path, method):
    marker = f"{os.getpid()}-interrupt-{method}"
    expected = 4 if method == "fork-server" else 3  # the caller, its server, 2 ranks
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(
        """
        import sys, time, sgpu

        @sgpu.distributed(gpus=2, tracking=False)
        def sleeps():
            time.sleep(60)

        try:
            sleeps.distributed()
        except KeyboardInterrupt:
            print("KeyboardInterrupt reached the caller", flush=True)
            sys.exit(42)
        """
    ))
    env = dict(os.environ, SGPU_TEST_MARKER=marker, SGPU_START_METHOD=method)
    child = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(processes_with_marker(f"SGPU_TEST_MARKER={marker}")) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with_marker(f"SGPU_TEST_MARKER={marker}")) == expected
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 42, out
    assert "KeyboardInterrupt reached the caller" in out
    assert processes_with_marker(f"SGPU_TEST_MARKER={marker}") == []


@pytest.mark.parametrize("method", ["fork-server", "exec"])
def test_a_caller_killed_takes_its_ranks_with_it(tmp_path, method):
    marker = f"{os.getpid()}-killed-{method}"
    # the caller, its server, two ranks and a sleep started by each
    expected = 6 if method == "fork-server" else 5
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(
        """
        import time, sgpu

        @sgpu.distributed(gpus=2, tracking=False)
        def sleeps():
            import subprocess
            subprocess.Popen(["sleep", "1000"])
            time.sleep(60)

        sleeps.distributed()
        """
    ))
    env = dict(os.environ, SGPU_TEST_MARKER=marker, SGPU_START_METHOD=method)
    child = subprocess.Popen([sys.executable, str(script)], env=env)
    deadline = time.monotonic() + 30
    while len(processes_with_marker(f"SGPU_TEST_MARKER={marker}")) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with_marker(f"SGPU_TEST_MARKER={marker}")) == expected
    child.kill()
    child.wait()
    deadline = time.monotonic() + 10
    while processes_with_marker(f"SGPU_TEST_MARKER={marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with_marker(f"SGPU_TEST_MARKER={marker}") == []


@pytest.mark.parametrize("own_handler", [False, True])
def test_a_caller_ended_with_sigterm_tears_its_ranks_down_and_ends_its_run_killed(tmp_path, own_handler):
    """A scheduler's stop, `kill`, a container's stop: the ranks are torn down (they get
    SIGTERM, so their last words are saved), the run ends KILLED, then the caller ends as
    SIGTERM would have ended it: by its own handler, or killed by the signal."""
    marker = f"{os.getpid()}-sigterm-{own_handler}"
    database = "sqlite:///" + str(tmp_path / "mlflow.db")
    script = tmp_path / "terminated.py"
    script.write_text(textwrap.dedent(
        f"""
        import signal, sys, time, sgpu

        if {own_handler}:
            def handler(signum, frame):
                print("the caller's own handler ran", flush=True)
                sys.exit(43)
            signal.signal(signal.SIGTERM, handler)

        @sgpu.distributed(gpus=2, name="terminated")
        def sleeps():
            sgpu.log_metric("before", 1.0)
            print("logged", flush=True)
            time.sleep(60)

        try:
            sleeps.distributed()
        except sgpu.CancelledError as error:
            print("cancelled:", error, flush=True)
            time.sleep(30)  # the signal, raised again, ends the caller first
        """
    ))
    env = dict(os.environ, SGPU_TEST_MARKER=marker, MLFLOW_TRACKING_URI=database)
    child = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    logs = tmp_path / "runs"

    def both_logged():
        return sum("logged" in log.read_text() for log in logs.glob("*/rank-*/stdout.log")) == 2

    assert wait_until(both_logged, limit=60)
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=60)
    if own_handler:
        assert child.returncode == 43, out
        assert "the caller's own handler ran" in out
    else:
        assert child.returncode == -signal.SIGTERM, out
    assert wait_until(lambda: processes_with_marker(f"SGPU_TEST_MARKER={marker}") == [], limit=10)
    import mlflow

    (run,) = mlflow.MlflowClient(tracking_uri=database).search_runs(experiment_ids=["0"])
    assert run.info.run_name == "terminated"
    assert run.info.status == "KILLED"
    assert run.info.end_time >= run.info.start_time
    assert run.data.metrics.get("before") == 1.0  # the ranks' spools were sent before it ended


def test_a_call_inside_a_rank_is_refused():
    @distributed(gpus=1)
    def nested():
        inner = distributed(gpus=1)(whoami)
        return inner.distributed(1)

    with pytest.raises(sgpu.ConfigError, match="inside a rank"):
        nested.distributed()


def test_results_decode_in_the_caller_with_pickle():
    @distributed(gpus=2)
    def makes_dict():
        return {"rank": sgpu.get_global_rank(), "nested": [1, (2, 3)]}

    assert makes_dict.distributed() == [{"rank": r, "nested": [1, (2, 3)]} for r in range(2)]
    assert pickle.loads(pickle.dumps(sgpu.errors.RankFailure(0, 0, 1, "ok", None, None, "", "", "", 0.0, False, "")))


def _call_and_report(queue):
    import mlflow

    fn = distributed(gpus=1)(whoami)
    fn.distributed(1)
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    queue.put(sorted(r.info.run_id for r in runs))


def test_callers_forked_from_a_caller_make_runs_of_their_own(tmp_path, monkeypatch):
    """A forked caller (a multiprocessing child, a pool) draws run ids the parent and its
    siblings never draw: each call is a run of its own in the one database."""
    import multiprocessing

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    distributed(gpus=1)(whoami).distributed(1)  # the parent has drawn before it forks
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=_call_and_report, args=(queue,)) for _ in range(2)]
    for child in children:
        child.start()
    distributed(gpus=1)(whoami).distributed(1)
    seen = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    import mlflow

    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 4 and len({r.info.run_id for r in runs}) == 4
    assert all(len(s) >= 2 for s in seen)


def test_large_results_are_held_at_most_half_again_their_size_in_the_caller(tmp_path):
    """Each rank's result record is decoded and dropped in turn, never held twice over."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""
        import resource, sgpu

        @sgpu.distributed(gpus=4, tracking=False, max_payload_bytes=1 << 30)
        def big():
            return bytes(64 << 20)

        def rss():
            with open("/proc/self/status") as status:
                return next(int(l.split()[1]) for l in status if l.startswith("VmRSS:")) * 1024

        big.distributed()  # the fork server and the first call's costs, before measuring
        before = rss()
        results = big.distributed()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(sum(map(len, results)), peak - before)
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=os.environ)
    assert done.returncode == 0, done.stderr
    size, grown = map(int, done.stdout.split()[-2:])
    assert size == 4 * (64 << 20)
    assert grown <= 1.5 * size, f"the caller grew by {grown / size:.2f}x the results"


def test_environment_overrides_are_named_and_invalid_values_refused(monkeypatch):
    monkeypatch.setenv("SGPU_BACKEND", "sim")
    with pytest.raises(sgpu.ConfigError, match='unknown backend "nccl"'):
        distributed(backend="nccl")(whoami).distributed(1)  # invalid whatever overrides it
    monkeypatch.setenv("SGPU_BACKEND", "tpu")
    with pytest.raises(sgpu.ConfigError, match='SGPU_BACKEND=tpu is not "auto", "cuda" or "sim"'):
        distributed()(whoami).distributed(1)
    monkeypatch.setenv("SGPU_BACKEND", "cuda")  # no GPU here: the advice names the variable
    with pytest.raises(sgpu.AcceleratorMismatchError) as caught:
        distributed(backend="sim")(whoami).distributed(1)
    assert "set SGPU_BACKEND=sim (SGPU_BACKEND=cuda decides the backend here" in str(caught.value)
    assert 'pass backend="sim"' not in str(caught.value)
    monkeypatch.setenv("SGPU_BACKEND", "sim")
    monkeypatch.setenv("SGPU_TRACKING", "maybe")
    with pytest.raises(sgpu.ConfigError, match="SGPU_TRACKING=maybe is neither on nor off"):
        distributed()(whoami).distributed(1)


def test_a_coroutine_function_is_refused_saying_what_to_do():
    async def fetch():
        return 1

    with pytest.raises(sgpu.ConfigError, match="coroutine function") as caught:
        distributed(gpus=1)(fetch).distributed()
    assert "asyncio.run" in str(caught.value)


def test_a_line_is_shown_whole_up_to_a_mebibyte_and_a_longer_one_cut_and_marked(capsys):
    @distributed(gpus=1, tracking=False, keep_run_dir=True)
    def long_lines():
        print("a" * 900_000)
        print("b" * (2 << 20))
        print("after")

    handle = long_lines.launch()
    handle.result()
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert "[rank 0] " + "a" * 900_000 in lines
    cut = next(line for line in lines if line.startswith("[rank 0] bbb"))
    assert cut == "[rank 0] " + "b" * (1 << 20) + (
        " [sgpu: line cut at 1 MiB; stdout.log in the run folder has all of it]")
    assert "[rank 0] after" in lines
    with open(os.path.join(handle.run_dir, "rank-0", "stdout.log")) as log:
        assert "b" * (2 << 20) + "\nafter\n" in log.read()


def test_a_database_that_cannot_be_made_says_where_else_to_record(monkeypatch, tmp_path):
    monkeypatch.chdir("/proc")  # a folder nothing can be created in, as a read-only one
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(sgpu.TrackingError) as caught:
        distributed(gpus=1)(whoami).distributed(1)
    message = str(caught.value)
    assert "cannot open the MLflow database /proc/mlflow.db" in message
    assert 'tracking_uri="sqlite:////path/mlflow.db"' in message
    assert "tracking=False" in message


def test_a_server_down_at_the_start_runs_the_call_and_says_its_metrics_are_not_kept(monkeypatch,
                                                                                      capfd):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")  # nothing listens there

    def logs(x):
        sgpu.log_metric("loss", x)
        return x

    assert distributed(gpus=2)(logs).distributed(0.5) == [0.5, 0.5]
    said = " ".join(capfd.readouterr().err.split())
    assert "this call runs untracked" in said
    assert "metrics and params its ranks log are not kept" in said
    assert "start the server before the call" in said


@needs_cli
def test_the_run_of_a_decorator_caller_killed_outright_is_ended_killed(tmp_path):
    """A caller killed by SIGKILL cannot end its call's run: the next sync finds its record
    no longer locked and ends the run KILLED, as for sgpu run."""
    import mlflow

    database = "sqlite:///" + str(tmp_path / "mlflow.db")
    runs = tmp_path / "runs"
    marker = f"SGPU_TEST_MARKER={os.getpid()}-decorator-sigkill"
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""
        import time, sgpu

        @sgpu.distributed(gpus=2)
        def sleeps():
            print("up", flush=True)
            time.sleep(1000)

        sleeps.distributed()
        """))
    env = dict(os.environ, MLFLOW_TRACKING_URI=database, SGPU_RUNS_DIR=str(runs),
               SGPU_TEST_MARKER=marker.split("=", 1)[1])
    child = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    import sqlite3

    def rows():  # read without MLflow's client, which would make the database if it were not
        if not (tmp_path / "mlflow.db").exists():
            return []
        try:
            with sqlite3.connect(tmp_path / "mlflow.db") as db:
                return [status for (status,) in db.execute("SELECT status FROM runs")]
        except sqlite3.OperationalError:  # made, its tables not yet
            return []

    # The caller and its two ranks, and the fork server unless ranks are exec'd.
    up = 3 if os.environ.get("SGPU_START_METHOD") == "exec" else 4
    assert wait_until(lambda: rows() == ["RUNNING"] and len(processes_with_marker(marker)) >= up,
                      limit=120), (rows(), processes_with_marker(marker))
    client = mlflow.MlflowClient(tracking_uri=database)

    def status():
        return [r.info.status for r in client.search_runs(experiment_ids=["0"])]

    child.kill()
    child.communicate()
    assert wait_until(lambda: processes_with_marker(marker) == [], limit=20)
    synced = subprocess.run([SGPU, "tracking", "sync", "--log-dir", str(runs)],
                            capture_output=True, text=True, timeout=60)
    assert synced.returncode == 0, synced.stderr
    assert "left running by a caller that died" in synced.stderr + synced.stdout
    assert status() == ["KILLED"]


def _start_daemon(marker, double_fork):
    """A process of the rank's that leaves its process group: a session of its own
    (Popen(start_new_session=True)), or a classic double-forked daemon."""
    env = dict(os.environ, SGPU_TEST_MARKER=marker)
    if not double_fork:
        subprocess.Popen(["sleep", "1000"], start_new_session=True, env=env)
        return
    subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess, sys
        if os.fork() == 0:
            os.setsid()
            subprocess.Popen(["sleep", "1000"])
        """)], env=env).wait()


@pytest.mark.parametrize("ending, double_fork, method", [
    ("returns", False, "fork-server"), ("returns", True, "fork-server"),
    ("times out", False, "fork-server"), ("returns", False, "exec"),
    ("times out", True, "exec")])
def test_no_process_a_rank_started_outlives_the_call(ending, double_fork, method):
    marker = f"{os.getpid()}-daemon-{ending.replace(' ', '-')}-{double_fork}-{method}"

    @distributed(gpus=2, tracking=False, start_method=method,
                 timeout=8 if ending == "times out" else 300, teardown_grace=1)
    def leaves_a_daemon():
        _start_daemon(marker, double_fork)
        if ending == "times out":
            time.sleep(1000)
        return sgpu.get_global_rank()

    if ending == "returns":
        assert leaves_a_daemon.distributed() == [0, 1]
    else:
        with pytest.raises(sgpu.TimeoutError):
            leaves_a_daemon.distributed()
    assert wait_until(lambda: processes_with_marker(f"SGPU_TEST_MARKER={marker}") == [],
                      limit=10), processes_with_marker(f"SGPU_TEST_MARKER={marker}")


def finds_mlflow_loaded() -> bool:
    import sys

    loaded = "mlflow" in sys.modules
    import mlflow  # noqa: F401 - as a function that logs does

    return loaded


def test_the_fork_server_imports_mlflow_for_a_function_that_imports_it():
    # mlflow costs seconds to import (it imports pandas and pyarrow): the ranks of a
    # function that imports it fork from a server that has, so no rank pays for it again.
    forked = os.environ.get("SGPU_START_METHOD") != "exec"
    assert distributed(gpus=2, tracking=False)(finds_mlflow_loaded).distributed() == [forked] * 2
