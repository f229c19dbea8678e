"""Rank-tagged logging: worker lines reach the parent, tagged, under fork, spawn and forkserver."""

from __future__ import annotations

import io
import logging
import multiprocessing
import re

import pytest

from pipesgd_ref.logs import (
    LOGGER_NAME,
    WorkerLogging,
    configure_parent_logging,
    get_logger,
    trace,
    trace_enabled,
)

WORLD_SIZE = 3
JOIN_TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def fresh_pipesgd_logger():
    """Leave the "pipesgd" logger as the test found it (no handlers, propagating, level unset)."""
    logger = logging.getLogger(LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    for handler in list(logger.handlers):  # start clean, whatever earlier tests configured
        logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True
    yield logger
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handlers, level, propagate = saved
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def _worker(worker_logging: WorkerLogging, rank: int) -> None:
    """Top level, so spawn and forkserver children can import it."""
    worker_logging.worker_init(rank)
    get_logger("test_worker").info("hello from worker %d", rank)
    get_logger("test_worker").debug("below the level: never shown")


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_worker_lines_reach_the_parent_tagged(start_method):
    if start_method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{start_method} is not available on this platform")
    stream = io.StringIO()
    configure_parent_logging("INFO", stream=stream)
    worker_logging = WorkerLogging.start(start_method, level="INFO")
    run_workers_and_check(start_method, worker_logging, stream)


def test_fork_without_fork_default_falls_back_to_the_queue(monkeypatch):
    """multiprocessing_logging refuses to install unless the *global* start method is fork; then
    fork workers use the queue route, and must drop the handlers they inherited (no doubles)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("fork is not available on this platform")
    stream = io.StringIO()
    configure_parent_logging("INFO", stream=stream)
    with monkeypatch.context() as patch:
        patch.setattr(multiprocessing, "get_start_method", lambda *args, **kwargs: "spawn")
        worker_logging = WorkerLogging.start("fork", level="INFO")
    assert worker_logging.queue is not None, "expected the queue route"
    run_workers_and_check("fork", worker_logging, stream)


def run_workers_and_check(start_method: str, worker_logging: WorkerLogging, stream) -> None:
    try:
        ctx = multiprocessing.get_context(start_method)
        workers = [
            ctx.Process(target=_worker, args=(worker_logging, rank), name=f"rank-{rank}")
            for rank in range(WORLD_SIZE)
        ]
        for w in workers:
            w.start()
        get_logger().info("parent line while workers run")
        for w in workers:
            w.join(JOIN_TIMEOUT_S)
        for rank, w in enumerate(workers):
            assert w.exitcode == 0, f"rank {rank} ({start_method}) exited with {w.exitcode}"
    finally:
        worker_logging.stop()
    worker_logging.stop()  # idempotent

    lines = stream.getvalue().splitlines()
    for rank in range(WORLD_SIZE):
        mine = [line for line in lines if f"hello from worker {rank}" in line]
        assert len(mine) == 1, (
            f"{start_method}: expected 1 line from rank {rank}, got {len(mine)}; all lines: {lines}"
        )
        assert re.search(rf"\[rank {rank}\] INFO hello from worker {rank}$", mine[0]), mine[0]
    assert not any("never shown" in line for line in lines), lines
    parent = [line for line in lines if "parent line" in line]
    assert len(parent) == 1 and "[main] INFO parent line" in parent[0], lines
    assert len(lines) == WORLD_SIZE + 1, f"{start_method}: unexpected lines: {lines}"
    # after stop() the parent logs straight to its own handler again
    (handler,) = logging.getLogger(LOGGER_NAME).handlers
    assert isinstance(handler, logging.StreamHandler) and handler.stream is stream


def test_parent_lines_are_tagged_main():
    stream = io.StringIO()
    configure_parent_logging("DEBUG", stream=stream)
    get_logger(__name__).debug("from the parent")
    (line,) = stream.getvalue().splitlines()
    assert re.fullmatch(r"\S+ \S+ \[main\] DEBUG from the parent", line), line


def test_configure_is_idempotent(fresh_pipesgd_logger):
    first, second = io.StringIO(), io.StringIO()
    configure_parent_logging("INFO", stream=first)
    configure_parent_logging("warning", stream=second)
    assert len(fresh_pipesgd_logger.handlers) == 1
    get_logger().info("filtered out")
    get_logger().warning("once")
    assert first.getvalue() == ""
    assert second.getvalue().count("once") == 1
    assert fresh_pipesgd_logger.level == logging.WARNING


@pytest.mark.parametrize("level", ["LOUD", "", "verbose", None, 2.5])
def test_bad_levels_name_the_choices(level):
    with pytest.raises(ValueError, match="DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        configure_parent_logging(level)
    with pytest.raises(ValueError, match="DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        WorkerLogging.start("spawn", level=level)


def test_bad_start_method():
    with pytest.raises(ValueError, match="fork, spawn or forkserver"):
        WorkerLogging.start("thread")


def test_get_logger_names():
    assert get_logger().name == "pipesgd"
    assert get_logger("comm.ring").name == "pipesgd.comm.ring"
    assert get_logger("pipesgd_ref.comm.ring").name == "pipesgd.comm.ring"


def test_trace_only_when_enabled(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    monkeypatch.delenv("PIPESGD_TRACE", raising=False)
    assert not trace_enabled()
    trace("iter %d | rank %d -> %d | chunk %d | %s", 3, 0, 1, 2, "1.2 MB")
    assert caplog.records == []

    monkeypatch.setenv("PIPESGD_TRACE", "1")
    assert trace_enabled()
    trace("iter %d | rank %d -> %d | chunk %d | %s", 3, 0, 1, 2, "1.2 MB")
    (record,) = caplog.records
    assert record.name == "pipesgd.trace"
    assert record.getMessage() == "iter 3 | rank 0 -> 1 | chunk 2 | 1.2 MB"
    assert record.funcName == "test_trace_only_when_enabled", "trace should report its caller"

    monkeypatch.setenv("PIPESGD_TRACE", "0")
    assert not trace_enabled()
