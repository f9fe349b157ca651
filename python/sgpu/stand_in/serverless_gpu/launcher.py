"""serverless_gpu.launcher: the decorator."""

from sgpu.stand_in import distributed, not_offered  # noqa: F401


def __getattr__(name: str):
    if name.startswith("_"):  # probes of tools (IPython, pickling) stay AttributeErrors
        raise AttributeError(name)
    raise not_offered("serverless_gpu.launcher", name)
