"""A Python rank: `python -m sgpu._worker`, started by the C++ launcher for every rank.

It takes the rank's guards (lifeline, parent-death signal, crash backtraces), reads the
staged call (cloudpickle: the function, its arguments and the caller's sys.path), binds
the device (the simulated backend's start faults act here), runs the function, and
writes rank-<N>/result.bin, or error.json with the traceback and exception.bin with the
pickled exception. It ends as a C++ rank ends: the rank logger closed, output flushed,
_exit.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
import types

import _sgpu_rank_env as _rank_env


def _qualified_type(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _write_error(native, error: BaseException, rank: int) -> None:
    import cloudpickle

    # From the function down: the worker's own frame is no help to the reader.
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    lines = traceback.format_exception(type(error), error, tb or error.__traceback__)
    try:
        pickled = cloudpickle.dumps(error)
    except Exception:  # an exception that does not pickle still has its traceback
        pickled = None
    message = str(error)
    if isinstance(error, SystemExit):
        message = (f"the function called sys.exit({error.code!r}); a rank's function ends by "
                   "returning its result, or by raising an Exception to fail the call")
    elif not isinstance(error, Exception):
        message = (f"{message + ': ' if message else ''}the rank ended by "
                   f"{type(error).__name__}, which fails the call (raised in the caller, it "
                   "would act there as its own)")
    native.write_error(_qualified_type(error), message, lines, pickled)
    sys.stderr.write(f"sgpu: rank {rank} failed:\n{''.join(lines)}")


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(
        _with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
    )
    if code.co_filename == "<dynamic-code>":
        code = code.replace(co_filename=filename)
    return code.replace(co_consts=consts)


def _restore_sources(function, header: dict) -> None:
    """cloudpickle names the code of functions it carries by value "<dynamic-code>": the
    function, and the functions of the same module it uses, get their file back (and
    linecache its lines, for a notebook cell's file that exists only in the caller), so
    that tracebacks show where they are."""
    for filename, lines in header.get("sources", {}).items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    filename = header.get("filename")
    if not filename or not isinstance(function, types.FunctionType):
        return
    module = function.__module__
    seen = set()
    stack = [function]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.__code__ = _with_filename(current.__code__, filename)
        for value in current.__globals__.values():
            if isinstance(value, types.FunctionType) and value.__module__ == module:
                if value.__code__.co_filename == "<dynamic-code>":
                    stack.append(value)




def main() -> None:
    from sgpu import _native, _runtime, _stacks

    _native.enter_rank()
    rank = _runtime.get_global_rank()
    _stacks.arm_python_stacks(_native)
    # A rank forked from the fork server keeps the server's torch thread count otherwise.
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    code = 0
    try:
        import pickle

        import cloudpickle  # after the guards: an import that hangs is still torn down

        # The header first: the caller's sys.path must be in place before the function,
        # which may name modules by reference, is unpickled.
        header, body = pickle.loads(_native.read_call())
        for entry in reversed(header["sys_path"]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        _runtime.install_process_group_hook()
        function, args, kwargs = cloudpickle.loads(body)
        _restore_sources(function, header)
        _native.bind_device()
        _runtime.device_bound()  # cuda on sim, once torch is imported
        if os.environ.get(_rank_env.SIM_COMPUTE) == "shapes":  # the launcher's choice
            from sgpu import _shapes  # torch's fake tensors only where they are used

            with _shapes.shapes_only():
                result = function(*args, **kwargs)
        else:
            result = function(*args, **kwargs)
        try:
            data = cloudpickle.dumps(result)
        except Exception as error:
            raise TypeError(
                f"rank {rank}'s result ({type(result).__qualname__}) cannot be pickled: {error}; "
                "return plain data (numbers, lists, dicts, tensors)"
            ) from error
        _native.write_result(data, header["max_payload_bytes"])
    except BaseException as error:  # noqa: BLE001 - every failure becomes the rank's record
        code = 1
        try:
            _write_error(_native, error, rank)
        except BaseException:
            traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _native.end_rank(code)


if __name__ == "__main__":
    main()
