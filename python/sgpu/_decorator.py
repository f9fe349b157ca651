"""@sgpu.distributed: run a function on every GPU of the node and gather what each rank
returns, through the C++ launcher (python/native/module.cc, src/launcher/).

    @distributed(gpus=8, gpu_type="H100")
    def train(epochs):
        ...
        return sgpu.get_global_rank()

    train.distributed(3)          # [0, 1, ..., 7], in rank order
    handle = train.launch(3)      # handle.result(), .cancel(), .done(), .run_dir
    train(3)                      # a plain call, here in this process
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import os
import pickle
import socket
import sys
import threading
import time
import types
from typing import Any, Callable, Optional

from sgpu import errors

_UNSET = object()

# The Python types each kind of option in the option table takes (NOTE [The option table]
# in src/contract/option_table.h: the keywords, their kinds and what each must be are its).
_KINDS = {
    "int": int,
    "str": str,
    "bool": bool,
    "seconds": (int, float),
    "timeout": (int, float, type(None)),
    "ranks": (list, tuple, type(None)),
}


@functools.cache
def _option_types() -> dict:
    """keyword: (accepted types, what it must be), from the C++ option table."""
    from sgpu import _native

    return {name: (_KINDS[kind], what) for name, kind, what in _native.option_table()}


def _check_options(options: dict) -> dict:
    """The keywords checked as the decorator is applied: their types here (Python's own
    refusals: a bool where a number goes), their values by the C++ checks a call makes."""
    from sgpu import _native

    checked = {}
    for key, value in options.items():
        types = _option_types()
        if key not in types:
            known = ", ".join(types)
            raise errors.ConfigError(f"unknown option {key}=...; the options are {known}")
        kinds, what = types[key]
        if isinstance(value, bool) and kinds is not bool:  # a bool is an int to Python
            raise errors.ConfigError(f"{key} must be {what}, got {value!r}")
        if not isinstance(value, kinds):
            raise errors.ConfigError(f"{key} must be {what}, got {value!r}")
        checked[key] = value
    if checked.get("console_ranks") is not None:
        ranks = list(checked["console_ranks"])
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise errors.ConfigError(f"console_ranks must be a list of ints, got {ranks!r}")
        checked["console_ranks"] = ranks
    if "runs_dir" in checked:
        checked["runs_dir"] = str(checked["runs_dir"])
    _native.check_options(checked)
    return checked


def _largest_captures(function: Callable, args: tuple, kwargs: dict, count: int = 3) -> str:
    """The largest objects a call carries (arguments, closure cells, globals the function
    names), largest first, as 'name (N bytes)'."""
    import cloudpickle

    candidates: dict[str, Any] = {}
    for index, value in enumerate(args):
        candidates[f"argument {index}"] = value
    for key, value in kwargs.items():
        candidates[f"argument {key}"] = value
    code = getattr(function, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, function.__closure__ or ()):
            try:
                candidates[f"captured {name}"] = cell.cell_contents
            except ValueError:
                pass
        names = set()
        stack = [code]
        while stack:
            current = stack.pop()
            names.update(current.co_names)
            stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
        for name in names:
            value = function.__globals__.get(name, _UNSET)
            if value is not _UNSET and not isinstance(value, types.ModuleType):
                candidates[f"global {name}"] = value
    sizes = []
    for label, value in candidates.items():
        try:
            sizes.append((len(cloudpickle.dumps(value)), label))
        except Exception:
            continue
    sizes.sort(reverse=True)
    return ", ".join(f"{label} ({size:,} bytes)" for size, label in sizes[:count])


def _console(stream: int, line: str) -> None:
    out = sys.stdout if stream == 1 else sys.stderr
    try:
        out.write(line)
        out.flush()
    except Exception:  # a closed console must not stop the call
        pass


def _with_remote_exception(error: errors.DistributedError, max_bytes: int) -> BaseException:
    """The root-cause rank's own exception, unpickled, with `error` as its cause, when it is
    an Exception; else `error`. A rank that ended by SystemExit (sys.exit), KeyboardInterrupt
    or another BaseException fails the call with `error`, whose row says what it raised:
    raised as itself here, it would end the caller, or interrupt it, as if it were its own.
    The rank's traceback goes into the error's message and its row."""
    from sgpu import _native

    root = error.root_cause
    if root is None or root.kind != "exception":
        return error
    rank_dir = f"{error.run_dir}/rank-{root.rank}"
    record = _native.read_error(rank_dir)
    remote = "".join(record["traceback"]) if record else ""
    if remote:  # said in the message unless its stderr tail showed it already
        rows = [
            dataclasses.replace(row, traceback=remote) if row.rank == root.rank else row
            for row in error.ranks
        ]
        message = str(error)
        if remote.rstrip() not in root.stderr_tail:
            message += f"\n\nrank {root.rank}'s traceback:\n{remote.rstrip()}"
        error = type(error)(message, rows, error.run_dir, error.collectives)
    try:
        pickled = _native.read_exception(rank_dir, max_bytes)
        original = pickle.loads(pickled) if pickled is not None else None
    except Exception:
        original = None
    if not isinstance(original, Exception):
        return error
    original.__cause__ = error
    return original


def fork_server_command() -> list:
    """The Python fork server for this interpreter (sgpu/_fork_server.py): it preloads torch
    and the modules SGPU_FORK_SERVER_PRELOAD names (comma-separated)."""
    from sgpu import _native

    extra = _native.setting_text("SGPU_FORK_SERVER_PRELOAD").split(",")
    preload = ",".join(["torch"] + [name for name in extra if name])
    return [sys.executable, "-m", "sgpu._fork_server", preload]


# Modules a rank's function may import that cost seconds to import and leave no thread and
# no state of the process's environment behind: its fork server imports them once, before
# it forks the ranks of a call whose function imports them, so that no rank pays for them.
# (torch the server imports from the start.)
_SERVER_IMPORTS = ("mlflow",)


def _server_imports(function) -> list:
    """The modules of _SERVER_IMPORTS that `function` imports (an import statement in its
    code or in a function nested in it)."""
    import dis

    found = set()
    codes = [getattr(function, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        for instruction in dis.get_instructions(code):
            if instruction.opname == "IMPORT_NAME":
                found.add(str(instruction.argval).split(".")[0])
        codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return [name for name in _SERVER_IMPORTS if name in found]


def _notebook_path() -> str:
    """The path of the notebook this kernel runs, when the kernel knows it: Jupyter's
    server says it in JPY_SESSION_NAME, VS Code in __vsc_ipynb_file__; else ""."""
    if "ipykernel" not in sys.modules:
        return ""
    path = os.environ.get("JPY_SESSION_NAME", "")
    if not path:
        try:
            from IPython import get_ipython

            shell = get_ipython()
            path = shell.user_ns.get("__vsc_ipynb_file__", "") if shell is not None else ""
        except Exception:
            path = ""
    return str(path)


def _notebook_name() -> str:
    """The name of the notebook this kernel runs (_notebook_path), without its folder and
    its .ipynb; else ""."""
    name = os.path.basename(_notebook_path())
    return name[:-len(".ipynb")] if name.endswith(".ipynb") else name


def _show_link_in_notebook(name: str, link: str) -> None:
    """In a notebook, the call's MLflow run as a link under the cell (the console line the
    C++ core writes says the same in plain text)."""
    if not link or "ipykernel" not in sys.modules:
        return
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display

        if get_ipython() is None:
            return
        import html
        import pathlib

        if link.startswith(("http://", "https://")):  # the run's page on the server
            href = link
        elif pathlib.Path(link).is_dir():  # the run's folder in a file store
            href = pathlib.Path(link).absolute().as_uri()
        else:  # a database: its run is a page once `mlflow ui` serves the database
            import re

            found = re.search(r"\(experiment (\S+), run (\S+); (mlflow ui [^)]*)\)", link)
            if found is None:
                display(HTML(f"sgpu: {html.escape(name)} is tracked in {html.escape(link)}"))
                return
            experiment, run, command = found.groups()
            page = f"http://127.0.0.1:5000/#/experiments/{experiment}/runs/{run}"
            display(HTML(f"sgpu: {html.escape(name)} is tracked in MLflow run {html.escape(run)}: "
                         f"run <code>{html.escape(command)}</code>, then open "
                         f'<a href="{html.escape(page)}" target="_blank">{html.escape(page)}</a>'))
            return
        display(HTML(f'sgpu: {html.escape(name)} is tracked in MLflow run '
                     f'<a href="{html.escape(href)}" target="_blank">{html.escape(link)}</a>'))
    except Exception:  # a display that fails must not stop the call
        pass


class Handle:
    """A call in flight (DistributedFunction.launch). Thread-safe."""

    def __init__(self, call, name: str, max_bytes: int):
        self._call = call
        self._name = name
        self._max_bytes = max_bytes
        self._outcome: Optional[tuple] = None  # ("ok", results) or ("error", exception)

    @property
    def run_dir(self) -> str:
        """The call's run folder (kept after a failure, or with keep_run_dir=True)."""
        return self._call.run_dir

    @property
    def gpu_type(self) -> str:
        return self._call.gpu_type

    @property
    def tracking_link(self) -> str:
        """Where the call's MLflow run is shown; empty when untracked."""
        return self._call.tracking_link

    def done(self) -> bool:
        return self._outcome is not None or self._call.wait_for(0)

    def cancel(self) -> None:
        """Tears the ranks down; result() then raises sgpu.CancelledError. No-op once done."""
        self._call.cancel()

    def result(self, timeout: Optional[float] = None) -> list:
        """Each rank's return value, in rank order. Raises the root-cause rank's exception
        (from a DistributedError), or DistributedError, sgpu.TimeoutError, CancelledError;
        the builtin TimeoutError when `timeout` seconds pass first (the call keeps running).
        KeyboardInterrupt while waiting cancels the call and is raised once it is down."""
        if self._outcome is None:
            self._wait(timeout)
            self._settle()
        kind, value = self._outcome
        if kind == "error":
            try:
                raise value
            finally:
                # The raise puts this frame in the error's traceback, and the error is kept
                # in self._outcome: without this, handle and error hold each other (and the
                # call's resources) until the cyclic collector runs, as
                # concurrent.futures.Future breaks the same cycle.
                self = None  # noqa: PLW0642
                value = None
        return value

    def memory_stats(self, timeout: Optional[float] = None) -> list:
        """Each rank's device memory figures at its end (dicts with torch.cuda.memory_stats()'s
        keys), in rank order, once the call is done, whether it succeeded or failed; an empty
        dict for a rank that left none. Waits as result() does, without raising the call's
        error."""
        if self._outcome is None:
            self._wait(timeout)
        return [dict(stats) for stats in self._call.memory_stats()]

    def comm_stats(self, timeout: Optional[float] = None) -> list:
        """Each rank's collectives in rank order, once the call is done, whether it succeeded or
        failed: {group: {op: {"count", "bytes", "seconds", "predicted_seconds", "platform"}}},
        bytes in nccl-tests' terms (an all-reduce's buffer, an all-gather's whole output, a
        reduce-scatter's whole input); predicted_seconds what the collective model gives for
        them on the platform (a simulated node's, or SGPU_PLATFORM's; "" and 0 for none).
        Waits as result() does, without raising the call's error."""
        if self._outcome is None:
            self._wait(timeout)
        return list(self._call.comm_stats())

    def compute_stats(self, timeout: Optional[float] = None) -> list:
        """Each rank's compute estimate in rank order, once the call is done, whether it
        succeeded or failed: {"platform", "count", "flops", "bytes", "predicted_seconds",
        "exposed_collective_seconds", "unvalidated_seconds", "ops": {op: {...the same}},
        "steps": [...the marks of sgpu.step()]},
        what the operators each rank ran on its GPU would take on the platform, how much
        later its collectives end the step than its compute alone, and how much of the
        time is in matmul and attention kernels of a dtype the platform's kernel model was
        not held to measured runs of, in shape-only compute (sim_compute="shapes"); an empty
        "ops" for a rank computing values. Waits as result() does, without raising."""
        if self._outcome is None:
            self._wait(timeout)
        return list(self._call.compute_stats())

    def _wait(self, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._call.wait_for(0.1):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{self._name} is still running after {timeout} s; "
                        "call result() again, or cancel()"
                    )
        except KeyboardInterrupt:
            self._call.cancel()
            while True:
                try:
                    while not self._call.wait_for(0.1):
                        pass
                    break
                except KeyboardInterrupt:  # a second Ctrl-C while the ranks go down
                    continue
            raise

    def _settle(self) -> None:
        try:
            raw = self._call.results()
        except errors.DistributedError as error:
            # Kept without its traceback, whose frames (this one) hold the handle: result()
            # raises it with one of its own.
            error = error.with_traceback(None)
            self._outcome = ("error", _with_remote_exception(error, self._max_bytes))
            return
        values = []
        for rank in range(len(raw)):
            # One rank's record at a time, dropped once decoded: results are never held
            # twice over (a record, and what it decodes to, for every rank).
            data, raw[rank] = raw[rank], None
            try:
                with memoryview(data) as view:
                    values.append(_result_of(view))
                del data
            except Exception as error:
                try:
                    self._call.raise_bad_result(rank, f"{type(error).__name__}: {error}")
                except errors.DistributedError as bad:
                    self._outcome = ("error", bad.with_traceback(None))
                    return
        self._call.results_taken()
        self._outcome = ("ok", values)


def _storage_here(data: bytes):
    """A tensor's storage from a rank's result, where this process can hold it: on the GPU
    it was on where this process sees GPUs (a node, or the simulated node), else on the CPU."""
    import io

    import torch

    where = None if torch.cuda.is_available() else "cpu"
    return torch.load(io.BytesIO(data), weights_only=False, map_location=where)


class _ResultUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _storage_here
        return super().find_class(module, name)


class _ViewReader:
    """A file over a buffer, for pickle.Unpickler, that copies only what is read."""

    def __init__(self, view: memoryview):
        self._view = view.cast("B")
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else min(self._at + size, len(self._view))
        part, self._at = bytes(self._view[self._at:end]), end
        return part

    def readinto(self, buffer) -> int:
        size = min(len(buffer), len(self._view) - self._at)
        memoryview(buffer).cast("B")[:size] = self._view[self._at:self._at + size]
        self._at += size
        return size

    def readline(self) -> bytes:
        rest = self._view[self._at:]
        end = bytes(rest).find(b"\n")  # protocol 0's text opcodes only
        return self.read(len(rest) if end < 0 else end + 1)


def _result_of(view: memoryview):
    """A rank's result, unpickled; a tensor it returned from its GPU comes to this
    process's (_storage_here)."""
    return _ResultUnpickler(_ViewReader(view)).load()


def _source_name() -> str:
    """What the call's MLflow run names as its source (mlflow.source.name): the notebook a
    kernel runs (_notebook_path), else the script (sys.argv[0], as MLflow's own client names
    it), else the interpreter (python -c, a REPL)."""
    notebook = _notebook_path()
    if notebook:
        return notebook
    script = sys.argv[0] if sys.argv else ""
    if script and script != "-c" and os.path.exists(script):
        return os.path.abspath(script)
    return sys.executable


class _EveryNode:
    """Every simulated node of one call, each a native call of its own in this process
    (NOTE [Every node on one machine] in src/cli/local_nodes.h): node 0 hosts the nodes'
    store on a loopback port free when it looked, and gathers every rank's result; the
    figures are each node's ranks', in node order. Stands where one node's call would."""

    def __init__(self, options: dict, nodes: tuple, start: Callable):
        count, gpus = nodes
        self._gpus = gpus
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            endpoint = f"127.0.0.1:{probe.getsockname()[1]}"
        calls: list = [None] * count
        failures: list = [None] * count

        def start_node(rank: int) -> None:
            try:
                calls[rank] = start(dict(options, nnodes=count, node_rank=rank, gpus=gpus,
                                         rdzv_endpoint=endpoint))
            except BaseException as error:  # noqa: BLE001 - raised below, in the caller
                failures[rank] = error

        # A node's start returns once every node has joined: they start side by side.
        threads = [threading.Thread(target=start_node, args=(rank,), name=f"sgpu node {rank}")
                   for rank in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._calls = [call for call in calls if call is not None]
        failed = [error for error in failures if error is not None]
        if failed:
            for call in self._calls:
                call.cancel()
            for call in self._calls:
                while not call.wait_for(0.1):
                    pass
            raise failures[0] if failures[0] is not None else failed[0]

    @property
    def run_dir(self) -> str:
        return self._calls[0].run_dir

    @property
    def gpu_type(self) -> str:
        return self._calls[0].gpu_type

    @property
    def tracking_link(self) -> str:
        return self._calls[0].tracking_link

    def wait_for(self, seconds: float) -> bool:
        return all([call.wait_for(seconds) for call in self._calls])

    def cancel(self) -> None:
        for call in self._calls:
            call.cancel()

    def results(self) -> list:
        try:
            return self._calls[0].results()
        except errors.DistributedError as error:
            # Every node says the same root cause; the root rank's own node also holds its
            # exception's record (its run folder), so that the rank's exception is raised.
            root = error.root_cause
            node = root.rank // self._gpus if root is not None else 0
            if 0 < node < len(self._calls):
                try:
                    self._calls[node].results()
                except errors.DistributedError as theirs:
                    raise theirs.with_traceback(None) from None
            raise

    def results_taken(self) -> None:
        self._calls[0].results_taken()

    def raise_bad_result(self, rank: int, why: str) -> None:
        self._calls[0].raise_bad_result(rank, why)

    def memory_stats(self) -> list:
        return [stats for call in self._calls for stats in call.memory_stats()]

    def comm_stats(self) -> list:
        return [stats for call in self._calls for stats in call.comm_stats()]

    def compute_stats(self) -> list:
        return [stats for call in self._calls for stats in call.compute_stats()]


class DistributedFunction:
    """A function with its distributed options. Calling it runs it here, once;
    .distributed(...) runs it on every rank and returns their results; .launch(...) starts
    that and returns a Handle."""

    def __init__(self, function: Callable, options: dict):
        import inspect

        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            name = getattr(function, "__qualname__", repr(function))
            raise errors.ConfigError(
                f"{name} is a coroutine function (async def): a rank runs a plain function. "
                f"Wrap it: def run(*args): return asyncio.run({name}(*args)), and distribute "
                "that")
        self._function = function
        self._options = _check_options(options)
        functools.update_wrapper(self, function)

    def __call__(self, *args, **kwargs):
        return self._function(*args, **kwargs)

    def distributed(self, *args, **kwargs) -> list:
        return self.launch(*args, **kwargs).result()

    def launch(self, *args, **kwargs) -> Handle:
        import cloudpickle

        from sgpu import _native

        options = dict(self._options)
        function = self._function
        name = options.pop("name", None) or getattr(function, "__name__", "function")
        qualified = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', name)}"
        max_bytes = options.get("max_payload_bytes", _native.DEFAULT_MAX_PAYLOAD_BYTES)
        try:
            body = cloudpickle.dumps((function, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise errors.ConfigError(
                f"cannot pickle {qualified} and its arguments for the ranks: {error}"
            ) from error
        if len(body) > max_bytes:
            raise errors.ConfigError(
                f"{qualified} and its arguments take {len(body):,} bytes pickled, over "
                f"max_payload_bytes ({max_bytes:,}); the largest: "
                f"{_largest_captures(function, args, kwargs)}. Load large data inside the "
                "function (from a file or volume), or raise max_payload_bytes"
            )
        header = {"sys_path": [p for p in sys.path if p], "max_payload_bytes": max_bytes}
        filename = getattr(getattr(function, "__code__", None), "co_filename", "")
        if filename:
            header["filename"] = filename
            if not os.path.exists(filename):  # a notebook cell: its lines live here only
                header["sources"] = {filename: linecache.getlines(filename)}
        payload = pickle.dumps((header, body), protocol=pickle.HIGHEST_PROTOCOL)
        options["name"] = name
        parent = ""
        mlflow = sys.modules.get("mlflow")
        if mlflow is not None and options.get("tracking", True):
            active = mlflow.active_run()
            if active is not None:  # nested under it, in its store
                parent = active.info.run_id
                options.setdefault("tracking_uri", mlflow.get_tracking_uri())
        if not parent and "experiment" not in options and not os.environ.get(
                "MLFLOW_EXPERIMENT_NAME") and not os.environ.get("MLFLOW_EXPERIMENT_ID"):
            notebook = _notebook_name()
            if notebook:  # as on Databricks, the notebook's own experiment
                options["experiment"] = notebook
        start = functools.partial(
            _native.start,
            command=[sys.executable, "-m", "sgpu._worker"],
            payload=payload,
            function_name=qualified,
            console=_console,
            parent_run_id=parent,
            fork_server=fork_server_command(),
            source_name=_source_name(),
            server_imports=_server_imports(self._function),
        )
        nodes = _native.nodes_here(options)
        if nodes is None:
            call = start(options)
        elif _native.sim_fold(options):  # one launch: node 0's ranks stand for every node's
            call = start(dict(options, nnodes=nodes[0], gpus=nodes[1]))
        else:
            call = _EveryNode(options, nodes, start)
        _show_link_in_notebook(name, call.tracking_link)
        return Handle(call, name, max_bytes)

    def __repr__(self) -> str:
        return f"<sgpu.distributed {self._function!r} {self._options!r}>"


def distributed(function: Optional[Callable] = None, **options):
    """@distributed(gpus=8, gpu_type="H100", timeout=10800, ...): see DistributedFunction.

    The options mirror sgpu::Options in C++ (timeout in seconds, None for none) and the
    same environment variables override them (SGPU_BACKEND, SGPU_SIM, SGPU_SIM_FAULTS,
    SGPU_RUNS_DIR, SGPU_TRACKING=off, MLFLOW_TRACKING_URI, ...)."""
    if function is not None:
        return DistributedFunction(function, options)
    return lambda f: DistributedFunction(f, options)
