"""sgpu's pytest plugin, loaded by pytest through the `pytest11` entry point (or
`-p sgpu_pytest`). A module of its own beside the package, so that loading it imports
nothing of sgpu or torch: a suite that never uses sgpu is not touched.

    pytest --sgpu-node 8xH100      # the session is a simulated node of 8 H100s

With --sgpu-node (and no --sgpu-backend other than sim), the session's process, every process
it starts and every sgpu call lives on that simulated node: torch.cuda.is_available() is True,
device_count() is 8, skip_if_lt_x_gpu(n) and RunIf(min_cuda_gpus=n) see them, and a test
gated on a GPU runs instead of skipping. The terminal summary says how many tests that ask
for a GPU ran, and which were still skipped and why. `sgpu sim -- pytest` does the same.
With --sgpu-backend cuda on a GPU node the same tests run on its GPUs.

    @pytest.mark.sgpu(gpus=4)           # the test function runs on 4 GPUs, as a distributed
    def test_all_reduce():              # function (sgpu.distributed's keywords), every rank
        ...                             # of it must pass

    def test_two_a10s(sgpu_sim):
        sgpu_sim(node="2xA10", faults="rank=1:segv@start")   # this test's own node and plan
        ...

A test that fails because an sgpu call failed gets an "sgpu call" section in its report: the
call's failure table (the root cause marked), the hang verdict when there is one, and the
run folder. Where --sgpu-backend chose the backend, the advice in a failed call's message
names the flag ("pass --sgpu-backend sim"), not the variable it sets.
"""

from __future__ import annotations

import os

import pytest

import _sgpu_rank_env as _rank_env


def pytest_addoption(parser) -> None:
    group = parser.getgroup("sgpu", "sgpu: distributed calls on real or simulated GPUs")
    group.addoption("--sgpu-backend", choices=["sim", "cuda", "auto"], default=None,
                    help="the backend of every sgpu call in the session (SGPU_BACKEND)")
    group.addoption("--sgpu-node", default=None, metavar="SPEC",
                    help='the simulated node of every call, as "8xH100" (SGPU_SIM)')


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Before any conftest imports torch: the session on its simulated node, when asked."""
    backend = early_config.known_args_namespace.sgpu_backend
    node = early_config.known_args_namespace.sgpu_node
    # Set for the whole session, so that ranks and subprocesses see them too.
    if backend:
        os.environ[_rank_env.BACKEND_SETTING] = backend
    if node:
        os.environ[_rank_env.SIM_NODE_SETTING] = node
        if backend in (None, _rank_env.SIM_BACKEND):
            import sgpu

            sgpu.simulate(node)


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "sgpu(gpus=N, **options): run the test function on N GPUs as a distributed "
        "function (sgpu.distributed's keywords); every rank must pass")
    _GPU_TESTS.update(ran=0, skipped={}, items=set())


_GPU_WORDS = ("cuda", "gpu", "nccl")
# The session's tests that ask for a GPU ("items", node ids), how many of them ran, and the
# reasons of those skipped, with their counts.
_GPU_TESTS: dict = {"ran": 0, "skipped": {}, "items": set()}


def _asks_for_gpu(item) -> bool:
    """Whether a test is gated on a GPU: the sgpu marker, a skipif whose condition or reason
    names cuda, a GPU or NCCL, or such a decorator on its function (skip_if_lt_x_gpu,
    requires_nccl, RunIf(min_cuda_gpus=...))."""
    if item.get_closest_marker("sgpu") is not None:
        return True
    for mark in item.iter_markers("skipif"):
        text = " ".join(str(a) for a in mark.args) + " " + str(mark.kwargs.get("reason", ""))
        if any(word in text.lower() for word in _GPU_WORDS):
            return True
    import inspect

    function = getattr(item, "function", None)
    try:
        lines = inspect.getsourcelines(function)[0] if function is not None else []
    except (OSError, TypeError):
        return False
    decorators = "".join(line for line in lines[:8] if line.lstrip().startswith("@"))
    return any(word in decorators.lower() for word in _GPU_WORDS)


def _gpu_skip_reason(report) -> str | None:
    """A skipped test's reason, where it names cuda, a GPU or NCCL."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    return reason if any(word in reason.lower() for word in _GPU_WORDS) else None


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _count_gpu_test(report)


def _count_gpu_test(report) -> None:
    reason = _gpu_skip_reason(report)
    if reason is not None:
        _GPU_TESTS["skipped"][reason] = _GPU_TESTS["skipped"].get(reason, 0) + 1
    elif report.when == "call" and report.nodeid in _GPU_TESTS["items"]:
        _GPU_TESTS["ran"] += 1


def pytest_collection_modifyitems(session, config, items) -> None:
    _GPU_TESTS["items"] = {item.nodeid for item in items if _asks_for_gpu(item)}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    tally = _GPU_TESTS
    if not tally["ran"] and not tally["skipped"]:
        return
    where = os.environ.get(_rank_env.BACKEND_SETTING) or "this machine"
    if where == _rank_env.SIM_BACKEND:
        from sgpu import _native

        where = f"the simulated node {_native.node_spec()}"
    skipped = sum(tally["skipped"].values())
    terminalreporter.write_sep("-", "sgpu: tests that ask for a GPU")
    terminalreporter.write_line(f"{tally['ran']} ran on {where}; {skipped} still skipped")
    for reason, count in sorted(tally["skipped"].items(), key=lambda pair: -pair[1]):
        terminalreporter.write_line(f"  {count} skipped: {reason}")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked sgpu(gpus=N, ...) runs as a distributed function on N GPUs."""
    mark = pyfuncitem.get_closest_marker("sgpu")
    if mark is None:
        return None
    import sgpu

    options = dict(mark.kwargs)
    if mark.args:
        options.setdefault("gpus", mark.args[0])
    options.setdefault("name", pyfuncitem.name)
    arguments = {name: pyfuncitem.funcargs[name]
                 for name in pyfuncitem._fixtureinfo.argnames}
    sgpu.distributed(**options)(pyfuncitem.obj).distributed(**arguments)
    return True


@pytest.fixture
def sgpu_sim(monkeypatch):
    """sgpu_sim(node="4xA10", faults=None): this test's calls run on a simulated node of
    that spec, under that fault plan (docs/simulation.md, "Fault injection"); restored after it."""

    def configure(node: str | None = None, faults: str | None = None) -> None:
        monkeypatch.setenv("SGPU_BACKEND", "sim")
        if node is not None:
            monkeypatch.setenv("SGPU_SIM", node)
        if faults is not None:
            monkeypatch.setenv("SGPU_SIM_FAULTS", faults)
        else:
            monkeypatch.delenv("SGPU_SIM_FAULTS", raising=False)

    return configure


def _sgpu_error(error: BaseException | None):
    """The sgpu.DistributedError (or other sgpu.Error) behind a test's exception: itself, or
    one of its causes, as a rank's own exception raised in the caller carries it."""
    import sys

    errors = sys.modules.get("sgpu.errors")
    if errors is None:  # sgpu was never imported: nothing of it failed
        return None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, errors.Error):
            return error
        error = error.__cause__ or error.__context__
    return None


def _advise_the_flag(error: BaseException | None, backend: str | None) -> None:
    """sgpu's advice to set SGPU_BACKEND, where the session's --sgpu-backend is what set it,
    rewritten to name the flag the user gave (sgpu sees only the variable the flag sets):
    "pass --sgpu-backend sim", not "set SGPU_BACKEND=sim"."""
    import re

    error = _sgpu_error(error)
    if error is None or not backend or os.environ.get(_rank_env.BACKEND_SETTING) != backend:
        return
    if len(error.args) != 1 or not isinstance(error.args[0], str):
        return
    advice = re.compile(r"set SGPU_BACKEND=(\w+) \(SGPU_BACKEND=" + re.escape(backend) +
                        r" decides the backend here, whatever ([^)]*) says\)")
    flag = (rf"pass --sgpu-backend \1 (this session's --sgpu-backend {backend}, which sets "
            r"SGPU_BACKEND, decides the backend here, whatever \2 says)")
    error.args = (advice.sub(flag, error.args[0]),)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.excinfo is not None:
        _advise_the_flag(call.excinfo.value, item.config.getoption("sgpu_backend"))
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.passed:
        return
    error = _sgpu_error(call.excinfo.value)
    if error is None:
        return
    lines = [str(error)]
    run_dir = getattr(error, "run_dir", None)
    if run_dir:
        lines.append(f"run folder: {run_dir}")
    report.sections.append(("sgpu call", "\n".join(lines)))
