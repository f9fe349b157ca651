"""The errors sgpu raises, mirroring the C++ ones (src/sgpu/errors.h).

    Error                       every sgpu error
      ConfigError               bad options; nothing was started
      AcceleratorMismatchError  the node cannot serve the request; nothing was started
      NotSimulatedError         code that needs a real GPU ran on simulated ones
      TrackingError             a metric, param or tag MLflow would refuse, or a store
                                that cannot be used
      ResultTooLarge            a rank's result over max_payload_bytes
      DistributedError          a rank failed; .ranks has one RankFailure per rank,
                                .root_cause the earliest failure
        TimeoutError            the call's deadline passed
        HangError               a collective was in flight longer than hang_timeout
        CancelledError          the call was cancelled (Handle.cancel, Ctrl-C)

A rank's own exception is raised as itself in the caller where it unpickles, with the
DistributedError (which carries the rank's traceback) as its __cause__.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


class Error(Exception):
    """Every error sgpu raises."""


class ConfigError(Error, ValueError):
    """Bad options: nothing was started."""


class AcceleratorMismatchError(Error):
    """The node cannot serve the request (GPU type or count): nothing was started."""


class TrackingError(Error):
    """A metric, param or tag MLflow would refuse, or a tracking store that cannot be used."""


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """What happened to one rank of a call that did not succeed.

    kind is one of "ok", "exception", "exit_code", "signal", "bad_result", "timed_out",
    "terminated" (torn down by sgpu after another rank failed, a timeout or a cancel).
    """

    rank: int
    local_rank: int
    pid: int
    kind: str
    exit_code: Optional[int]
    signal: Optional[int]
    exception_type: str
    message: str
    stderr_tail: str
    time: float
    root_cause: bool
    description: str
    traceback: str = ""  # the rank's Python traceback, when it raised


@dataclasses.dataclass(frozen=True)
class CollectiveDiagnosis:
    """What the ranks' collective recorders say of a call that hung, timed out or failed
    in a collective: the verdict (empty when they say nothing), the ranks it names as the
    cause, each rank's last collectives, and the stacks taken then."""

    verdict: str = ""
    culprits: tuple = ()
    table: str = ""
    culprit_stack: str = ""  # the first culprit's main thread (and Python threads)
    stacks: str = ""  # the file with every live rank's stacks, or ""


class DistributedError(Error):
    """A rank failed. .ranks: one RankFailure per rank, in rank order; .run_dir: the kept
    run folder (each rank's logs, result and error records); .collectives: what the
    collective recorders say (CollectiveDiagnosis)."""

    def __init__(
        self,
        message: str,
        ranks: list[RankFailure],
        run_dir: str,
        collectives: Optional[CollectiveDiagnosis] = None,
    ):
        super().__init__(message)
        self.ranks = ranks
        self.run_dir = run_dir
        self.collectives = collectives or CollectiveDiagnosis()

    @property
    def root_cause(self) -> Optional[RankFailure]:
        """The earliest failure; None for a timeout or cancel with no failed rank."""
        return next((row for row in self.ranks if row.root_cause), None)


class TimeoutError(DistributedError):  # noqa: A001 - sgpu.TimeoutError, as in C++
    """The call's deadline passed; the message names the ranks still running."""


class HangError(DistributedError):
    """A collective was in flight on some rank longer than hang_timeout; the message
    starts with the verdict (.collectives)."""


class CancelledError(DistributedError):
    """The call was cancelled: Handle.cancel(), or an interrupt."""


class NotSimulatedError(Error, NotImplementedError):
    """Code that needs a real GPU ran on simulated ones (CUDA on sim): a CUDA graph, CUDA
    IPC, NVML, torch.compile's GPU kernels. The message names the API; run it on cuda."""


class ResultTooLarge(Error):
    """A rank's result over max_payload_bytes (raised as itself, from the DistributedError,
    as a rank's own exceptions are)."""


_CLASSES = {
    "config": ConfigError,
    "mismatch": AcceleratorMismatchError,
    "tracking": TrackingError,
    "too_large": ResultTooLarge,
    "record": Error,
    "error": Error,
}
_DISTRIBUTED = {
    "distributed": DistributedError,
    "timeout": TimeoutError,
    "hang": HangError,
    "cancelled": CancelledError,
}


def _from_native(
    kind: str, message: str, rows: list, run_dir: str, collectives: Optional[dict] = None
) -> Error:
    """The Python error for an error of the C++ core (python/native/module.cc)."""
    if kind in _DISTRIBUTED:
        diagnosis = CollectiveDiagnosis(
            verdict=(collectives or {}).get("verdict", ""),
            culprits=tuple((collectives or {}).get("culprits", ())),
            table=(collectives or {}).get("table", ""),
            culprit_stack=(collectives or {}).get("culprit_stack", ""),
            stacks=(collectives or {}).get("stacks", ""),
        )
        return _DISTRIBUTED[kind](
            message, [RankFailure(**row) for row in rows], run_dir, diagnosis
        )
    return _CLASSES.get(kind, Error)(message)
