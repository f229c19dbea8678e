"""Per-rank timelines -> a Chrome trace, and the timing figures of a run.

`Timeline`: spans of work (compute, allreduce, update, push/pull) per thread of one rank, in
microseconds of a clock shared by the processes of one machine (perf_counter is
CLOCK_MONOTONIC on Linux); they become the Chrome trace (`chrome_trace`) and the timing
medians of summary.json.

The trace (trace.json) opens in https://ui.perfetto.dev or chrome://tracing: one process row
per rank (pid = rank), one thread row per activity (compute, comm, server), spans of type
"X" in microseconds since the first event. Pipe-SGD's overlap is visible at a glance: the
comm row of a pipe run is busy while the compute row is.

A long run's timeline keeps only its first and last steps (`Timeline`); the
trace marks where the middle was left out with an instant event ("steps not traced").
"""

from __future__ import annotations

import bisect
import itertools
import statistics
import threading
import time
from collections import deque
from contextlib import contextmanager

THREAD_IDS = {"compute": 1, "comm": 2, "server": 3}


class Timeline:
    """Spans of work on one rank, as Chrome trace events (ph "X", microseconds).

    Bounded, so that a long run's memory stays flat: it keeps every span of the first
    HEAD_STEPS steps (start-up, warm-up, fill) and of the last TAIL_STEPS steps recorded
    (steady state, drain), by the step number a span carries, and counts in `dropped` the
    spans of the middle it let go. A span costs a few hundred bytes and a step has three or
    four, so 20,000 steps would otherwise grow each worker by tens of MB (and hidden_fraction's
    work with it). A run of up to TAIL_STEPS steps keeps every span; the medians of
    summary.json then come from at most HEAD_STEPS + TAIL_STEPS steps, mostly steady state.
    """

    HEAD_STEPS = 100
    TAIL_STEPS = 2000
    SPANS_PER_STEP = 16  # a guard: spans that all carry one step number stay bounded too

    def __init__(self, rank: int):
        self.rank = rank
        self.dropped = 0  # spans of the middle of the run that were let go
        self.newest = -1  # the highest step number recorded past the head
        # (name, thread, start s, end s, step): tuples while the run goes on, dicts at the end
        self._head: list[tuple] = []
        self._tail: deque[tuple] = deque()
        # Two threads record (compute and comm) and the trim pops, so one lock; with it a
        # span still records a little faster than the dict per span of before (measured).
        self._lock = threading.Lock()

    @contextmanager
    def span(self, name: str, thread: str, step: int):
        start = time.perf_counter()
        try:
            yield
        finally:
            self._record((name, thread, start, time.perf_counter(), step))

    def _record(self, span: tuple) -> None:
        step = span[4]
        with self._lock:
            if step < self.HEAD_STEPS and len(self._head) < self.HEAD_STEPS * self.SPANS_PER_STEP:
                self._head.append(span)
                return
            self.newest = max(self.newest, step)
            tail = self._tail
            tail.append(span)
            # Oldest first: spans arrive in about step order (a comm span lags a step or two;
            # one that lags by more than the tail is dropped at once).
            while tail and (
                tail[0][4] <= self.newest - self.TAIL_STEPS
                or len(tail) > self.TAIL_STEPS * self.SPANS_PER_STEP
            ):
                tail.popleft()
                self.dropped += 1

    @property
    def events(self) -> list[dict]:
        """The kept spans as Chrome trace events: the head's, then the tail's, each in the
        order they ended (built anew on each call: read it once, when the run is over)."""
        with self._lock:
            spans = [*self._head, *self._tail]
        return [
            {
                "name": name,
                "ph": "X",
                "pid": self.rank,
                "tid": thread,
                "ts": start * 1e6,
                "dur": (end - start) * 1e6,
                "args": {"step": step},
            }
            for name, thread, start, end, step in spans
        ]


def chrome_trace(events: list[dict], labels: dict[int, str] | None = None) -> dict:
    """Events with ts in absolute microseconds -> a Chrome trace dict (ts from 0)."""
    origin = min((e["ts"] for e in events), default=0.0)
    out = []
    for e in events:
        out.append({**e, "ts": e["ts"] - origin, "tid": THREAD_IDS.get(e["tid"], 9)})
    ranks = sorted({e["pid"] for e in events})
    for rank in ranks:  # metadata rows: names instead of numbers in the viewer
        name = (labels or {}).get(rank, f"rank {rank}")
        out.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": name}})
        for thread, tid in THREAD_IDS.items():
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": rank,
                    "tid": tid,
                    "args": {"name": thread},
                }
            )
    for rank, first, last, ts in step_gaps(events):  # a line across the rank: "not here"
        out.append(
            {
                "name": "steps not traced",
                "ph": "i",
                "s": "p",
                "pid": rank,
                "tid": THREAD_IDS["compute"],
                "ts": ts - origin,
                "args": {"first_step": first, "last_step": last},
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def step_gaps(events: list[dict]) -> list[tuple[int, int, int, float]]:
    """(rank, first, last, ts) of each run of steps first..last with no span on that rank (the
    middle a bounded Timeline let go); ts: the start of the rank's first span after the gap."""
    gaps = []
    for rank in sorted({e["pid"] for e in events}):
        first_ts: dict[int, float] = {}  # step -> its earliest span start on this rank
        for e in events:
            if e["pid"] == rank:
                step = e["args"]["step"]
                first_ts[step] = min(first_ts.get(step, e["ts"]), e["ts"])
        steps = sorted(first_ts)
        for before, after in itertools.pairwise(steps):
            if after > before + 1:
                gaps.append((rank, before + 1, after - 1, first_ts[after]))
    return gaps


def median_duration(events: list[dict], names: tuple[str, ...]) -> float | None:
    """Median length in seconds of the spans called one of `names` (None if there are none)."""
    durations = [e["dur"] / 1e6 for e in events if e["name"] in names]
    return statistics.median(durations) if durations else None


def hidden_fraction(events: list[dict], comm_names: tuple[str, ...]) -> float | None:
    """Share of communication time that overlapped computation on the same rank:
    sum over comm spans of |span ∩ compute spans| / sum of comm span lengths.

    Cost O(n log n) per rank: the compute spans are merged into disjoint intervals with a
    running total of their lengths, so |[a, b] ∩ busy| = busy_before(b) - busy_before(a),
    two binary searches per comm span, where a pairwise scan of the spans would grow as the
    square of the steps."""
    total = hidden = 0.0
    for rank in {e["pid"] for e in events}:
        mine = [e for e in events if e["pid"] == rank]
        busy = _merged((e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == "compute")
        for e in mine:
            if e["name"] not in comm_names:
                continue
            a, b = e["ts"], e["ts"] + e["dur"]
            total += b - a
            hidden += _busy_before(busy, b) - _busy_before(busy, a)
    return hidden / total if total > 0 else None


def _merged(intervals) -> tuple[list[float], list[float], list[float]]:
    """(start, end) pairs, any order -> disjoint sorted intervals: (starts, ends, busy time
    before each). Overlapping spans count once: a moment of communication is hidden or not."""
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(intervals):
        if ends and a <= ends[-1]:  # overlaps (or touches) the previous one: extend it
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    before, acc = [], 0.0
    for a, b in zip(starts, ends, strict=True):
        before.append(acc)
        acc += b - a
    return starts, ends, before


def _busy_before(busy: tuple[list[float], list[float], list[float]], x: float) -> float:
    """Length of the merged intervals `busy` (from _merged) that lies before time x."""
    starts, ends, before = busy
    i = bisect.bisect_right(starts, x) - 1  # the last interval starting at or before x
    return before[i] + min(x, ends[i]) - starts[i] if i >= 0 else 0.0
