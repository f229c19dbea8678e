"""The errors a user of the project meets, in one place.

Each one carries a message that says what went wrong and what to do about it, so the CLI
prints it as one line (exit status 2 for a bad input, 1 for a failed job) and no traceback.
Every layer raises these instead of reaching into another layer for them.

    ConfigError       a configuration a person wrote is wrong (an option, a file, a value)
      OutputError     an output path that cannot be used (--out, --json, --plot)
    DataError         a bad dataset spec, or a missing or corrupt data file
    JobError          an error inside a worker whose message says it all
      TrainingDiverged  the loss became NaN or Inf
    LaunchError       the job's environment is inconsistent, or workers failed
      WorkerFailed    one or more workers failed: which, and the rank most errors point to
    JobStopped        not a failure: a signal stopped the job (exit status 128 + signal)
    CommError         a communication failure, naming the rank it points at (`origin`)
      PeerTimeout, PeerClosed, ProtocolError, CollectiveMismatch, PeerAborted: its kinds
      RendezvousError   the job could not form (port busy, a rank never came, bad token)
"""

from __future__ import annotations

import signal
from typing import Any


class ConfigError(ValueError):
    """A configuration a person wrote is wrong; the message says what and how to fix it."""


class OutputError(ConfigError):
    """An output path that cannot be used; the message names it and says what to do."""


class Recurring(str):
    """A worker's error text, marked as one a restart would meet again (an OutputError: a full
    disk, an output path that cannot be used): --max-restarts does not retry it."""


def error_text(e: BaseException) -> str:
    """The text a worker reports for `e`: Recurring when a restart cannot help."""
    return Recurring(str(e)) if isinstance(e, OutputError) else str(e)


class DataError(ValueError):
    """A bad dataset spec or a missing / corrupt data file; the message says what to do."""


class JobError(RuntimeError):
    """An error inside a worker whose message says it all (no traceback is shown)."""


class TrainingDiverged(JobError):
    """The loss became NaN or Inf: the run stopped instead of training on garbage."""


class LaunchError(RuntimeError):
    """The job's environment is inconsistent, or workers failed; the message says which."""


class WorkerFailed(LaunchError):
    """One or more workers failed; `errors` maps rank -> its error text, `cause` is the rank
    most errors point to (None when they name no one)."""

    def __init__(self, errors: dict[int, str], summary: str, cause: int | None = None):
        super().__init__(summary)
        self.errors = errors
        self.cause = cause


class JobStopped(Exception):
    """The job was stopped by a signal (not a failure). `signum` is the signal; `results` the
    workers' results when every rank finished its last step, else None; `stop_at` the first
    step no rank ran (None where unknown); `rank` the worker that received the signal, when
    one did rather than the launcher (None)."""

    def __init__(
        self, signum: int, results=None, stop_at: int | None = None, rank: int | None = None
    ):
        super().__init__(f"stopped by {signal.Signals(signum).name}")  # (train.py says more)
        self.signum = signum
        self.results = results
        self.stop_at = stop_at
        self.rank = rank
        # A rank of `train --comm mpi` run alone: the launcher it told ends the job, with one
        # line for all the ranks and the signal's code (comm/mpi.py report_stop); exit 0 here.
        self.told_launcher = False
        # set by train.py: the config.TrainConfig of the run that was stopped (Any: config
        # imports this module)
        self.cfg: Any = None
        self.restarts: list[dict] = []  # and the restarts before it

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 SIGINT, 143 SIGTERM


class CommError(RuntimeError):
    """A communication failure; the message names the ranks and what to do.

    `origin` is the rank the failure points at (the silent or dead peer), when there is one.
    `link` is the comm.links.Link it happened on, when one Link raised it (None otherwise):
    that link is broken, so no news of the failure is sent on it. `doing` says what was under way.
    """

    def __init__(self, message: str, origin: int | None = None, link=None, doing: str = ""):
        super().__init__(message)
        self.origin = origin
        self.link = link
        self.doing = doing


class PeerTimeout(CommError):
    """A peer sent nothing for the whole timeout (stopped, hung, or far too slow)."""


class PeerClosed(CommError):
    """A peer closed its connection (it exited or crashed)."""


class ProtocolError(CommError):
    """A peer sent bytes that are not a valid frame (garbage, truncated, wrong version)."""


class CollectiveMismatch(CommError):
    """Two ranks are in different collectives (sequence, op, dtype or length differ)."""


class PeerAborted(CommError):
    """Another rank failed and the news reached this rank along the ring."""


class RendezvousError(CommError):
    """The job could not form (port busy, a rank never arrived, bad token, no shared memory)."""
