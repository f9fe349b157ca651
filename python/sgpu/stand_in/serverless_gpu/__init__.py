"""sgpu's stand-in for Databricks' `serverless_gpu` (sgpu/stand_in): @distributed runs the
function on this node's GPUs, simulated on sim."""

from sgpu.stand_in import distributed, not_offered
from serverless_gpu import compute, data, launcher, runtime  # noqa: F401
from serverless_gpu.compute import GPUType  # noqa: F401

__all__ = ["GPUType", "compute", "data", "distributed", "launcher", "runtime"]


def __getattr__(name: str):
    if name.startswith("_"):  # probes of tools (IPython, pickling) stay AttributeErrors
        raise AttributeError(name)
    raise not_offered("serverless_gpu", name)
