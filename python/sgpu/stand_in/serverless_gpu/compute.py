"""serverless_gpu.compute: GPU types, a str enum that sgpu's gpu_type takes everywhere."""

import enum

from sgpu.stand_in import not_offered


class GPUType(enum.StrEnum):
    H100 = "H100"
    A10 = "A10"


def __getattr__(name: str):
    if name.startswith("_"):  # probes of tools (IPython, pickling) stay AttributeErrors
        raise AttributeError(name)
    raise not_offered("serverless_gpu.compute", name)
