"""The "sgpu" process-group backend of torch.distributed: the group the call's backend makes
(Gloo with the fault plan on sim, NCCL on cuda), recorded in the rank's ring."""

from __future__ import annotations

import threading
from datetime import timedelta

from sgpu import _stacks

BACKEND_NAME = "sgpu"

# Set while torch makes a group that a program asked for as "nccl" (sgpu._sim_cuda): the
# simulated backend then holds it to NCCL's rules.
making_nccl = threading.local()


def _create_process_group(options, _backend_options=None):
    from sgpu import _native

    timeout = options.timeout
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    group = _native.make_process_group(
        options.store,
        options.group_rank,
        options.group_size,
        seconds,
        list(options.global_ranks_in_group or []),
        as_nccl=getattr(making_nccl, "on", False),
    )
    if not options.global_ranks_in_group:
        _stacks.arm_world_stacks(_native)
    return group


def register_backend() -> None:
    """Registers the "sgpu" backend with torch.distributed (once): the process group the
    call's backend makes, Gloo with the fault plan on sim and NCCL on cuda."""
    import torch.distributed as dist

    if not dist.is_available() or BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu", "cuda"]
    )
