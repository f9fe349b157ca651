"""A soak job's caller: makes its calls back to back through @sgpu.distributed, in one
process (one fork server for them all), and says on stdout, one JSON line each, when a call
starts and how it ended, with this process's descriptors and zombie children after it.
The checkpoint case is two calls said as one: one whose rank dies in a save, and one that
resumes from the checkpoints it left.

    caller.py JOB.json"""

import json
import os
import pathlib
import sys

import cloudpickle

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "python")]
import work  # noqa: E402  (beside this file)
from process_table import zombie_children  # noqa: E402

cloudpickle.register_pickle_by_value(work)

import sgpu  # noqa: E402


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def descriptors() -> dict:
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own
            pass
    return found


def outcome_of(error: BaseException) -> dict:
    cause = error if isinstance(error, sgpu.DistributedError) else error.__cause__
    if not isinstance(cause, sgpu.DistributedError):
        return {"status": "error", "type": type(error).__name__, "message": str(error)}
    root = cause.root_cause
    found = {"status": "failed", "type": type(cause).__name__, "message": str(cause)[:4000]}
    if root is not None:
        found.update(rank=root.rank, kind=root.kind, exit_code=root.exit_code, signal=root.signal,
                     exception_type=root.exception_type)
    diagnosis = getattr(cause, "collectives", None)
    if diagnosis is not None:
        found["culprits"] = list(diagnosis.culprits)
    return found


def make(call: dict, options: dict) -> dict:
    """Makes the call; what it returned or raised, as the soak reads it."""
    return launch(options, work.work, call["dir"], call["elements"], call["steps"], call["pause"],
                  b"\x5a" * call["blob_bytes"], daemon=call["case"] == "daemon",
                  exit_rank=call["exit_rank"])


def make_checkpointed(call: dict, options: dict) -> dict:
    """The checkpoint case: the call whose rank dies in a save, then what latest() names,
    then a call that resumes from it and what latest() names after that; as the soak reads
    them (the resume's outcome under "resumed")."""
    from sgpu.checkpoint import latest

    root = os.path.join(call["dir"], "checkpoints")

    def newest():
        found = latest(root)
        return os.path.basename(found) if found else None

    found = launch(options, work.checkpointed, call["dir"], root, call["elements"], call["steps"],
                   call["exit_rank"], call["die_in_save"], call["die_at"], call["fault_code"])
    found["latest"] = newest()
    resume_dir = os.path.join(call["dir"], "resume")
    found["resumed"] = launch(dict(options, name=f"{call['name']}-resume"), work.checkpointed,
                              resume_dir, root, call["elements"], call["steps"])
    found["latest_after"] = newest()
    return found


def launch(options: dict, function, *args, **kwargs) -> dict:
    """Calls `function` through @sgpu.distributed(**options); what it returned or raised,
    as the soak reads it."""
    handle = decorated = None
    try:
        decorated = sgpu.distributed(**options)(function)
        handle = decorated.launch(*args, **kwargs)
        results = handle.result()
        found = {"status": "ok", "results": results}
    except sgpu.Error as error:  # every error sgpu raises, a rank's own re-raised included
        found = outcome_of(error)
    except Exception as error:  # a rank's own exception, raised as itself
        found = outcome_of(error)
    found["run_dir"] = handle.run_dir if handle is not None else ""
    del handle, decorated  # what the call holds goes with them
    return found


def in_a_forked_child(run) -> dict:
    """`run()` in a child forked from this caller (a multiprocessing fork child, a pool);
    what it returned, through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            found = run()
        except BaseException as error:  # noqa: BLE001 - the parent reports it
            found = {"status": "error", "type": type(error).__name__, "message": str(error)}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(found))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        text = got.read()
    os.waitpid(pid, 0)
    return json.loads(text) if text else {"status": "error", "type": "fork",
                                           "message": "the forked caller said nothing"}


def main() -> None:
    job = json.loads(pathlib.Path(sys.argv[1]).read_text())
    # The fork server first, so that every call's descriptors compare with the same start.
    sgpu.distributed(gpus=1, tracking=False, runs_dir=job["calls"][0]["runs_dir"] + "-warm-up")(
        sgpu.get_global_rank).distributed()
    if any(call["case"] == "checkpoint" for call in job["calls"]):
        from sgpu import checkpoint  # noqa: F401  (torch's checkpoint modules: before the count)
    say(event="ready", descriptors=descriptors())
    for index, call in enumerate(job["calls"]):
        options = dict(gpus=call["world"], timeout=call["timeout"], hang_timeout=call["hang_timeout"],
                       sim_faults=call["plan"], runs_dir=call["runs_dir"], name=call["name"])
        pathlib.Path(call["dir"]).mkdir(parents=True, exist_ok=True)
        say(event="start", call=index)
        if call["case"] == "fork":  # the call from a forked child of this caller
            found = in_a_forked_child(lambda: make(call, options))
        elif call["case"] == "checkpoint":
            found = make_checkpointed(call, options)
        else:
            found = make(call, options)
        say(event="end", call=index, descriptors=descriptors(), zombies=zombie_children(), **found)


if __name__ == "__main__":
    main()
