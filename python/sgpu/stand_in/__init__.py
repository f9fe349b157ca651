"""Stand-ins for the import names of Databricks' serverless GPU API, so that a notebook
written for it runs unchanged on sgpu (simulated GPUs in CI, or a node's own GPUs):
`serverless_gpu` (and its `launcher`, `compute`, `runtime` and `data` modules) and
`databricks.air`.

They are found by a finder that the interpreter's startup hook (_sgpu_startup.py) puts
last on sys.meta_path: only when no installed package has the name, so a real
`serverless_gpu` always wins. A name or module of theirs that sgpu does not offer
(`serverless_gpu.ray_launch`) raises NotOfferedError where it is used or imported.
SGPU_SERVERLESS_GPU takes on or off as sgpu's other on/off variables do ("off", 0, false
or no turns them off; "on", 1, true or yes, the default, keeps them); any other value is
said on stderr where a stand-in is imported, and leaves them off, since the hook runs in
every interpreter and must not stop one that never imports them.
"""

import os

import _sgpu_rank_env as _rank_env

import sgpu
from sgpu import _native
from sgpu.errors import ConfigError


class NotOfferedError(sgpu.Error, ImportError):
    """A name of Databricks' API that sgpu's stand-in does not offer."""


def not_offered(module: str, name: str) -> NotOfferedError:
    return NotOfferedError(
        f"{module}.{name} is part of Databricks' serverless GPU API that sgpu's stand-in for "
        f"{module} does not offer (it runs @distributed on this machine's GPUs, simulated or "
        "real). Keep it out of the code that runs under sgpu, or install the real package, "
        "which takes precedence over the stand-in")


def distributed(gpus: int = None, gpu_type=None, remote: bool = False, **options):
    """@distributed as serverless_gpu has it: `gpus`, `gpu_type` ("H100", "h100",
    GPUType.H100; checked against the node), and `remote` (False: this node's GPUs; True:
    GPUs Databricks provisions, which on the sim backend are simulated nodes in this process:
    one GPU a node for A10, as Databricks gives, else nodes of the simulated node's size)."""
    if remote and _native.backend_of(options) != _rank_env.SIM_BACKEND:
        raise ConfigError(
            "remote=True asks Databricks to provision remote GPUs, which sgpu does not do on "
            "GPUs: it runs on this node's GPUs (remote=False), and simulates remote nodes on "
            "the sim backend (backend=\"sim\" or SGPU_BACKEND=sim); for several real nodes, "
            "start the program under `sgpu run` on each, under Slurm or MPI (sgpu's "
            "docs/cli.md, 'Several nodes')")
    if remote and str(gpu_type or "").upper() == "A10" and "sim_node" not in options \
            and not os.environ.get(_rank_env.SIM_NODE_SETTING):
        options["sim_node"] = "1xA10"
    if gpus is not None:
        options["gpus"] = gpus
    if gpu_type is not None:
        options["gpu_type"] = str(gpu_type)
    return sgpu.distributed(**options)
