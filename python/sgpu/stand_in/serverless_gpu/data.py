"""serverless_gpu.data: volume datasets and DCP checkpoint storage (sgpu.data,
sgpu.checkpoint)."""

from sgpu.checkpoint import VolumeReader as UCVolumeReader  # noqa: F401
from sgpu.checkpoint import VolumeWriter as UCVolumeWriter  # noqa: F401
from sgpu.data import DataLoader  # noqa: F401
from sgpu.data import VolumeDataset as UCVolumeDataset  # noqa: F401
from sgpu.stand_in import not_offered


def __getattr__(name: str):
    if name.startswith("_"):  # probes of tools (IPython, pickling) stay AttributeErrors
        raise AttributeError(name)
    raise not_offered("serverless_gpu.data", name)
