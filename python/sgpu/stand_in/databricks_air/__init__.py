"""sgpu's stand-in for `databricks.air` (the newer SDK): distributed(num_accelerators=8,
accelerator_type="GPU_8xH100")."""

import re

from sgpu.errors import ConfigError
from sgpu.stand_in import distributed as _distributed
from sgpu.stand_in import not_offered


def distributed(num_accelerators: int = None, accelerator_type: str = None, **options):
    gpu_type = None
    if accelerator_type is not None:
        found = re.fullmatch(r"GPU_(?:(\d+)x)?([A-Za-z0-9]+)", str(accelerator_type))
        if not found:
            raise ConfigError(f"accelerator_type={accelerator_type!r} is not of the form "
                              "GPU_8xH100 or GPU_H100")
        gpu_type = found.group(2)
        if num_accelerators is None and found.group(1):
            num_accelerators = int(found.group(1))
    return _distributed(gpus=num_accelerators, gpu_type=gpu_type, **options)


def __getattr__(name: str):
    if name.startswith("_"):  # probes of tools (IPython, pickling) stay AttributeErrors
        raise AttributeError(name)
    raise not_offered("databricks.air", name)
