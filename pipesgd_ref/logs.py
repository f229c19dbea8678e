"""Rank-tagged logging: every worker's lines in one stream, under every start method.

    12:00:01,234 [main] INFO training 3 workers, width 2
    12:00:01,871 [rank 2] INFO iter 0 | loss 2.301

Workers are separate processes, and a log line written by a child to its own copy of a handler
can interleave mid-line with another's, or (for an in-memory stream) never reach the parent at
all. So every record travels to the parent, and only the parent writes:

    fork                multiprocessing_logging wraps the parent's handlers in a queue-backed
                        handler before the workers are forked; children inherit it.
    spawn, forkserver   the children start fresh (no handlers), so each installs a
                        logging.handlers.QueueHandler on a multiprocessing queue, and a
                        QueueListener thread in the parent hands the records to its loggers.

Usage (parent, then each worker):

    configure_parent_logging("INFO")
    worker_logging = WorkerLogging.start("spawn", level="INFO")
    ... Process(target=worker, args=(worker_logging, rank, ...)) ...
    def worker(worker_logging, rank, ...):
        worker_logging.worker_init(rank)        # first thing in the worker
        get_logger(__name__).info("ready")
    ... join the workers ...
    worker_logging.stop()

`trace(...)` is the opt-in communication trace (PIPESGD_TRACE=1), one line per hop:
    iter 3 | rank 0 -> 1 | chunk 2 | 1.2 MB
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import os
import sys
from typing import IO, Any

import multiprocessing_logging

__all__ = [
    "LOGGER_NAME",
    "WorkerLogging",
    "configure_parent_logging",
    "tag_log_lines",
    "get_logger",
    "trace",
    "trace_enabled",
    "progress_bar",
]

LOGGER_NAME = "pipesgd"
LOG_FORMAT = "%(asctime)s %(rank_tag)s %(levelname)s %(message)s"
MAIN_TAG = "[main]"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def get_logger(name: str | None = None) -> logging.Logger:
    """The package logger "pipesgd", or its child "pipesgd.<name>" (a module path is shortened:
    get_logger("pipesgd_ref.comm.ring") -> "pipesgd.comm.ring")."""
    if not name:
        return logging.getLogger(LOGGER_NAME)
    for prefix in ("pipesgd_ref.", LOGGER_NAME + "."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def _check_level(level: str | int) -> int:
    """Level number of a name ("info", "DEBUG") or number; ValueError naming the choices."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str) and level.strip().upper() in _LEVELS:
        return logging.getLevelName(level.strip().upper())
    raise ValueError(f"unknown log level {level!r}: expected one of {', '.join(_LEVELS)}")


class _DefaultTag(logging.Filter):
    """Give a record without a rank tag the parent's tag "[main]" (the format needs the field)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank_tag"):
            record.rank_tag = MAIN_TAG
        return True


class _RankTag(logging.Filter):
    """Tag every record that passes through with this worker's rank."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.tag = f"[rank {rank}]"

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank_tag = self.tag
        return True


class _ConsoleHandler(logging.StreamHandler):
    """The handler configure_parent_logging installs (its own class, so a second call finds it)."""


def configure_parent_logging(level: str | int = "INFO", stream: IO[str] | None = None) -> None:
    """Send the "pipesgd" logger's records to `stream` (default stderr), one tagged line each.

    Idempotent: a second call replaces the first one's handler (and its level and stream).
    The "pipesgd" logger then owns its output: it stops propagating to the root logger, so an
    application's own root handler does not print every line twice.
    """
    level_no = _check_level(level)
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        if isinstance(handler, _ConsoleHandler):
            logger.removeHandler(handler)
            handler.close()
    handler = _ConsoleHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(_DefaultTag())
    logger.addHandler(handler)
    logger.setLevel(level_no)
    logger.propagate = False


class _ToParentLoggers(logging.Handler):
    """Listener side: hand a worker's record to the parent's logger of the same name, so it meets
    the parent's handlers, filters and levels exactly as a record logged in the parent would."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


class WorkerLogging:
    """Carries worker records to the parent: created in the parent, handed to every worker.

    Picklable (spawn sends it to each child): its state is the start method, the level and the
    multiprocessing queue; the parent-only listener is left out of the pickle.
    """

    def __init__(self, start_method: str, level: int, queue: Any | None) -> None:
        self.start_method = start_method
        self.level = level
        self.queue = queue  # None when multiprocessing_logging carries the records (fork)
        self._listener: logging.handlers.QueueListener | None = None
        self._mp_handlers: list[multiprocessing_logging.MultiProcessingHandler] = []
        self._stopped = False

    @classmethod
    def start(cls, start_method: str, level: str | int = "INFO") -> WorkerLogging:
        """Parent side, before the workers start: set up the route for `start_method`."""
        if start_method not in ("fork", "spawn", "forkserver"):
            raise ValueError(
                f"unknown start method {start_method!r}: expected fork, spawn or forkserver"
            )
        level_no = _check_level(level)
        logger = logging.getLogger(LOGGER_NAME)
        if start_method == "fork":
            # multiprocessing_logging only works with fork: install_mp_handler checks the global
            # start method and refuses spawn and forkserver (children would not inherit its
            # handler). If the global default is not fork, fall back to the queue route below,
            # which works with every start method.
            try:
                multiprocessing_logging.install_mp_handler(logger)
            except AssertionError:
                pass
            else:
                self = cls(start_method, level_no, queue=None)
                self._mp_handlers = [
                    h
                    for h in logger.handlers
                    if isinstance(h, multiprocessing_logging.MultiProcessingHandler)
                ]
                return self
        # A queue of the workers' own context: a spawn queue cannot be handed to a fork child.
        queue = multiprocessing.get_context(start_method).Queue(-1)
        self = cls(start_method, level_no, queue)
        self._listener = logging.handlers.QueueListener(queue, _ToParentLoggers())
        self._listener.start()
        return self

    def worker_init(self, rank: int) -> None:
        """Worker side, first thing in the process: tag this process's records with its rank,
        set the level, and route records to the parent."""
        logger = logging.getLogger(LOGGER_NAME)
        logger.setLevel(self.level)
        # The parent is the one place that writes: never also print through a root handler.
        logger.propagate = False
        if self.queue is None:
            # fork + multiprocessing_logging: the inherited wrapper handlers already send to the
            # parent; tag records before they are pickled into its queue.
            for handler in logger.handlers:
                handler.addFilter(_RankTag(rank))
            return
        # Queue route. A forked child (fork fallback) inherited the parent's handlers: drop them,
        # or each line would be written twice (once here, once by the parent).
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        handler = logging.handlers.QueueHandler(self.queue)
        handler.addFilter(_RankTag(rank))
        logger.addHandler(handler)

    def stop(self) -> None:
        """Parent side, after the workers have exited: deliver what is queued, then stop.
        Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._listener is not None:
            self._listener.stop()  # handles every record queued before it, then joins
            self._listener = None
            assert self.queue is not None  # the listener read this queue
            self.queue.close()
            self.queue.join_thread()
        logger = logging.getLogger(LOGGER_NAME)
        for handler in self._mp_handlers:
            # close() waits until the queue is drained (and closes the wrapped handler, which for
            # a stream handler only unregisters it); then put the original handler back.
            logger.removeHandler(handler)
            handler.close()
            logger.addHandler(handler.sub_handler)
        self._mp_handlers = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Threads and the fork-only handlers stay in the parent; the child needs only the queue.
        state["_listener"] = None
        state["_mp_handlers"] = []
        return state


def trace_enabled() -> bool:
    """Whether the communication trace is on (PIPESGD_TRACE=1), read at each call."""
    return os.environ.get("PIPESGD_TRACE") == "1"


_trace_logger = logging.getLogger(LOGGER_NAME + ".trace")


def trace(fmt: str, *args: object) -> None:
    """One trace line when PIPESGD_TRACE=1, formatted only then:
    trace("iter %d | rank %d -> %d | chunk %d | %s", seq, rank, peer, chunk, "1.2 MB")"""
    if trace_enabled():
        _trace_logger.info(fmt, *args, stacklevel=2)


def tag_log_lines(rank: int) -> None:
    """Tag this process's log lines "[rank r]" instead of "[main]", as a local worker's are
    (a rank joined by torchrun, mpirun or srun logs through the parent's handlers)."""
    for handler in logging.getLogger(LOGGER_NAME).handlers:
        handler.addFilter(_RankTag(rank))


def progress_bar(total: int, label: str, enabled: bool = True):
    """The one progress bar of the commands: a tqdm bar of `total` steps named `label`, on
    stderr when it is a terminal (disable=None), a silent stand-in otherwise or when not
    `enabled`; gone from the screen once closed (leave=False), so the log lines stay."""
    from tqdm.auto import tqdm  # here: only a command that shows progress pays the import

    return tqdm(
        total=total, desc=label, unit="step", disable=None if enabled else True, leave=False
    )
