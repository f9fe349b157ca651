"""What code inside a rank calls: its place in the call, its device, the "sgpu" process-group
backend for torch.distributed (sgpu._process_group) made known as torch is imported, and
logging into the call's MLflow run.

Outside a rank the helpers answer for a world of one: rank 0 of 1, on the CPU.
"""

from __future__ import annotations

import os
import sys

import _sgpu_rank_env as _rank_env

from sgpu._imports import after_import
from sgpu._process_group import BACKEND_NAME, register_backend  # noqa: F401 - sgpu's API
from sgpu._stacks import announce_stacks, arm_python_stacks

def is_rank() -> bool:
    """True inside a rank that sgpu started."""
    return os.environ.get(_rank_env.ROLE) == _rank_env.WORKER_ROLE


def _in_a_call() -> bool:
    """Inside a function's rank, or inside a program that `sgpu run` started as a rank (it
    has its rank's folder, not the role: the program may make calls of its own)."""
    return is_rank() or bool(os.environ.get(_rank_env.RANK_DIR))


def arm_program_stacks() -> None:
    """In the program a `sgpu run` rank supervises (not in what the program starts): its
    native and Python stacks on the caller's signals, then its pid in
    rank-N/stacks/program.pid, which tells the caller it may ask. Run by `import sgpu`."""
    rank_dir = os.environ.get(_rank_env.RANK_DIR, "")
    if is_rank() or not rank_dir or os.environ.get(_rank_env.SUPERVISOR_PID) != str(os.getppid()):
        return
    from sgpu import _native

    _native.arm_program_stacks()
    if arm_python_stacks(_native):  # else not announced: the Python signal would kill it
        announce_stacks(_native, rank_dir)


def _env_int(name: str, fallback: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if _in_a_call() and value else fallback


def get_global_rank() -> int:
    """This rank's place among all ranks of the call (torchrun's RANK)."""
    return _env_int("RANK", 0)


def get_local_rank() -> int:
    """This rank's place on its node (LOCAL_RANK); also its GPU's index on cuda."""
    return _env_int("LOCAL_RANK", 0)


def get_world_size() -> int:
    """How many ranks the call has (WORLD_SIZE)."""
    return _env_int("WORLD_SIZE", 1)


def get_local_world_size() -> int:
    """How many ranks run on this node (LOCAL_WORLD_SIZE)."""
    return _env_int("LOCAL_WORLD_SIZE", 1)


def get_node_rank() -> int:
    """This node's place among the call's nodes (NODE_RANK)."""
    return _env_int("NODE_RANK", 0)


global_rank = get_global_rank
local_rank = get_local_rank
world_size = get_world_size
local_world_size = get_local_world_size
node_rank = get_node_rank


def device():
    """The rank's torch.device: cuda:<its GPU> on the cuda backend, and on sim while its cuda
    devices are the simulated node's (SGPU_SIM_CUDA on, the default, in a Python rank);
    cpu otherwise, and outside a rank."""
    import torch

    if not _in_a_call():
        return torch.device("cpu")
    from sgpu import _native, _sim_cuda

    _sim_cuda.install()  # where the rank's backend serves cuda (sim), it does from here
    return torch.device(_native.rank_device())  # the backend's answer


def memory_stats() -> dict:
    """This rank's device memory figures, with torch.cuda.memory_stats()'s keys
    ("allocated_bytes.all.peak", "num_ooms", ...): the CUDA caching allocator's on cuda, the
    simulated device's on sim. Empty outside a rank, and on sim with SGPU_SIM_MEMORY=off."""
    if not is_rank():
        return {}
    from sgpu import _native

    return dict(_native.memory_stats())


def compute_stats() -> dict:
    """This rank's compute estimate so far, in shape-only compute (sim_compute="shapes";
    docs/simulation.md): {"platform", "count", "flops", "bytes", "predicted_seconds",
    "exposed_collective_seconds", "unvalidated_seconds", "ops": {op: {"count", "flops",
    "bytes", "predicted_seconds"}}, "steps": [{"end", "compute_end", "tokens",
    "model_flops"}] (the marks of step())}, what the operators it ran on its GPU would take on the
    node, how much later its collectives end the step so far than its compute alone, and
    how much of it is in kernels the platform's model was not held to (a dtype no measured
    run had; docs/simulation.md#the-compute-estimate). Take it
    before and after a step for that step's, in a function's rank or a program's that
    `sgpu run` started. Empty outside a rank, and all zeros for a rank computing values."""
    if not _in_a_call():
        return {}
    from sgpu import _native

    return dict(_native.compute_stats())


def step(tokens: float = 0, flops: float = 0) -> None:
    """Marks the end of a training step, for the compute estimate (sim_compute="shapes"):
    sgpu then predicts each step from the mark before it, the last one on its own line at
    the call's end ("sgpu: steps (...): 3 marked; the last 2.912 s on h100-nvswitch (compute
    2.601 s, exposed collectives 0.311 s), 5,630 tokens/s per GPU, MFU 36%; ...") and in the
    run (sgpu.step.predicted_seconds, .exposed_collective_seconds, .tokens_per_second,
    .mfu). `tokens`: what this rank's step processed (torchtitan's tokens per GPU: batch x
    sequence, over the tensor-parallel degree); `flops`: the model's FLOPs in this rank's
    step, for MFU (sgpu counts what ran, recomputation included, so it cannot know the
    model's own). Marks land in compute_stats()["steps"]. Nothing outside a rank."""
    if not _in_a_call():
        return
    from sgpu import _native

    _native.mark_step(float(tokens), float(flops))


def reset_peak_memory_stats() -> None:
    """Every ".peak" figure of this rank starts again from its current value, as
    torch.cuda.reset_peak_memory_stats() does. Nothing outside a rank."""
    if not is_rank():
        return
    from sgpu import _native

    _native.reset_peak_memory_stats()


class host_memory:
    """`with sgpu.host_memory():` the CPU tensors this thread allocates inside are host
    memory: on sim they do not count against the simulated device (on cuda, CPU tensors
    never do). For data loading and other buffers a GPU node keeps on the host."""

    def __enter__(self):
        if is_rank():
            from sgpu import _native

            _native.enter_host_memory()
            self._entered = True
        else:
            self._entered = False
        return self

    def __exit__(self, *exc):
        if self._entered:
            from sgpu import _native

            _native.exit_host_memory()
        return False


def _torch_imported(_torch) -> None:
    register_backend()
    _serve_cuda_on_sim()


def install_process_group_hook() -> None:
    """"sgpu" is a torch.distributed backend by the time code can name it: now when torch
    is imported, else right after its import. Once per process."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    after_import("torch", _torch_imported)


def _serve_cuda_on_sim() -> None:
    """In a rank of a sim launch, and in a process on a simulated node, torch's cuda devices
    become the node's GPUs (sgpu._sim_cuda) as soon as torch is imported; a function's rank
    waits until its device is bound (sgpu._worker)."""
    if is_rank() and not _bound:
        return
    from sgpu import _sim_cuda

    in_a_shapes_program = not is_rank() and os.environ.get(_rank_env.RANK_DIR) \
        and os.environ.get(_rank_env.SIM_COMPUTE) == "shapes"
    if _sim_cuda.wanted() and _sim_cuda.install() and in_a_shapes_program:
        from sgpu import _shapes

        _shapes.enter_for_program()


_bound = False


def device_bound() -> None:
    """A function's rank has bound its device (sgpu._worker): cuda may be served now."""
    global _bound
    _bound = True
    if "torch" in sys.modules:
        _serve_cuda_on_sim()


_hooked = False


def log_metric(key: str, value: float, step: int = 0) -> None:
    """Logs a metric into the call's run through the rank's logger (batched, spooled when the
    store is away); outside a rank, does nothing."""
    from sgpu import _native

    _native.log_metric(key, float(value), int(step))


def log_metrics(metrics: dict, step: int = 0) -> None:
    for key, value in metrics.items():
        log_metric(key, value, step)


def log_param(key: str, value) -> None:
    from sgpu import _native

    _native.log_param(key, str(value))


def set_tag(key: str, value) -> None:
    from sgpu import _native

    _native.set_tag(key, str(value))


def flush_tracking() -> bool:
    """Sends what the rank logged so far; False when some of it could not be sent yet."""
    from sgpu import _native

    return _native.flush_tracking()
