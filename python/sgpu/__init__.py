"""sgpu: run a function on every GPU of a node, real (cuda) or simulated (sim).

    import sgpu
    from sgpu import distributed

    @distributed(gpus=8, gpu_type="H100")
    def train(epochs):
        import torch.distributed as dist
        dist.init_process_group("sgpu")        # NCCL on cuda, the simulated transport on sim
        device = sgpu.device()
        ...
        return sgpu.get_global_rank()

    train.distributed(3)                       # [0, 1, ..., 7]

Each call is an MLflow run; inside the function, mlflow.log_metric and sgpu.log_metric
land in it. See docs/python.md.
"""

# The extension module is built into build/python/sgpu/, beside a copy of these sources;
# a development checkout may also put python/ itself on the path: both halves are found.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from sgpu._decorator import DistributedFunction, Handle, distributed  # noqa: E402
from sgpu._runtime import (  # noqa: E402
    compute_stats,
    device,
    flush_tracking,
    get_global_rank,
    get_local_rank,
    get_local_world_size,
    get_node_rank,
    get_world_size,
    global_rank,
    host_memory,
    is_rank,
    local_rank,
    local_world_size,
    log_metric,
    log_metrics,
    log_param,
    memory_stats,
    node_rank,
    register_backend,
    reset_peak_memory_stats,
    set_tag,
    step,
    world_size,
)
from sgpu._sim_cuda import simulate  # noqa: E402
from sgpu.errors import (  # noqa: E402
    AcceleratorMismatchError,
    CancelledError,
    CollectiveDiagnosis,
    ConfigError,
    DistributedError,
    Error,
    RankFailure,
    HangError,
    NotSimulatedError,
    ResultTooLarge,
    TimeoutError,
    TrackingError,
)

__version__ = "0.1.0"

# "sgpu" is a torch.distributed backend once torch is imported, here and in the ranks of
# `sgpu run -- python script.py` that import sgpu.
from sgpu import _runtime  # noqa: E402

_runtime.install_process_group_hook()
_runtime.arm_program_stacks()

__all__ = [
    "AcceleratorMismatchError",
    "CancelledError",
    "CollectiveDiagnosis",
    "ConfigError",
    "DistributedError",
    "DistributedFunction",
    "Error",
    "Handle",
    "RankFailure",
    "HangError",
    "NotSimulatedError",
    "ResultTooLarge",
    "TimeoutError",
    "TrackingError",
    "compute_stats",
    "device",
    "distributed",
    "flush_tracking",
    "get_global_rank",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_world_size",
    "global_rank",
    "host_memory",
    "is_rank",
    "local_rank",
    "local_world_size",
    "log_metric",
    "log_metrics",
    "log_param",
    "memory_stats",
    "node_rank",
    "register_backend",
    "reset_peak_memory_stats",
    "set_tag",
    "simulate",
    "step",
    "world_size",
]
