"""sgpu's pytest plugin, loaded by pytest through the `pytest11` entry point (or
`-p sgpu_pytest`). A module of its own beside the package, so that loading it imports
nothing of sgpu or torch: a suite that never uses sgpu is not touched.

    pytest --sgpu-backend sim --sgpu-node 8xH100      # the suite's calls, without code changes

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


def pytest_addoption(parser) -> None:
    group = parser.getgroup("sgpu", "sgpu: distributed calls on real or simulated GPUs")
    group.addoption("--sgpu-backend", choices=["sim", "cuda", "auto"], default=None,
                    help="the backend of every sgpu call in the session (SGPU_BACKEND)")
    group.addoption("--sgpu-node", default=None, metavar="SPEC",
                    help='the simulated node of every call, as "8xH100" (SGPU_SIM)')


def pytest_configure(config) -> None:
    # Set for the whole session, so that ranks and subprocesses see them too.
    if config.getoption("sgpu_backend"):
        os.environ["SGPU_BACKEND"] = config.getoption("sgpu_backend")
    if config.getoption("sgpu_node"):
        os.environ["SGPU_SIM"] = config.getoption("sgpu_node")


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
    if error is None or not backend or os.environ.get("SGPU_BACKEND") != backend:
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
