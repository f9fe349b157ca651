"""serverless_gpu.runtime: where a rank is."""

from sgpu import _runtime
from sgpu.stand_in import not_offered


def get_global_rank(group=None) -> int:
    """The rank in the whole call, or in `group` (a torch.distributed process group)."""
    if group is not None:
        import torch.distributed as dist

        return dist.get_rank(group)
    return _runtime.get_global_rank()


get_local_rank = _runtime.get_local_rank
get_world_size = _runtime.get_world_size
get_local_world_size = _runtime.get_local_world_size
get_node_rank = _runtime.get_node_rank


def __getattr__(name: str):
    if name.startswith("_"):  # probes of tools (IPython, pickling) stay AttributeErrors
        raise AttributeError(name)
    raise not_offered("serverless_gpu.runtime", name)
