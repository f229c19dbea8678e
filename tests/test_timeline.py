"""The bounded Timeline and the trace figures computed from it (both in trace.py).

A long run keeps the spans of its first HEAD_STEPS and last TAIL_STEPS steps, so its memory
stays flat; hidden_fraction is checked against the plain pairwise definition."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.trace import Timeline, chrome_trace, hidden_fraction, median_duration, step_gaps
from strategies import seeds


def record_pipe(timeline: Timeline, steps: int, width: int = 2) -> int:
    """Spans in the order a pipe worker of `width` records them (the AllReduce of step t ends
    during the compute of t + 1); returns how many were recorded."""
    s = width - 1
    n = 0
    for t in range(steps):
        with timeline.span("compute", "compute", t):
            pass
        if t >= 1:
            with timeline.span("allreduce", "comm", t - 1):
                pass
        n += 1 + (t >= 1)
        if t >= s:
            with timeline.span("update", "compute", t):
                pass
            n += 1
    with timeline.span("allreduce", "comm", steps - 1):
        pass
    for j in range(s):  # the drain
        with timeline.span("update", "compute", steps + j):
            pass
    return n + 1 + s


def steps_of(events: list[dict]) -> set[int]:
    return {e["args"]["step"] for e in events}


def test_a_short_run_keeps_every_span():
    timeline = Timeline(rank=3)
    n = record_pipe(timeline, Timeline.TAIL_STEPS)
    events = timeline.events
    assert len(events) == n and timeline.dropped == 0, (
        f"a run of {Timeline.TAIL_STEPS} steps must keep all {n} spans; kept {len(events)}, "
        f"dropped {timeline.dropped}"
    )
    assert steps_of(events) == set(range(Timeline.TAIL_STEPS + 1))  # + the drain step
    e = events[0]
    assert set(e) == {"name", "ph", "pid", "tid", "ts", "dur", "args"}, f"keys: {sorted(e)}"
    assert (e["ph"], e["pid"], e["tid"], e["args"]) == ("X", 3, "compute", {"step": 0})
    assert all(e["dur"] >= 0 for e in events)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_a_long_run_keeps_its_head_and_tail(monkeypatch, width):
    monkeypatch.setattr(Timeline, "HEAD_STEPS", 10)
    monkeypatch.setattr(Timeline, "TAIL_STEPS", 50)
    timeline = Timeline(rank=0)
    steps = 1000
    n = record_pipe(timeline, steps, width)
    events = timeline.events
    kept = steps_of(events)
    last = steps - 1 + (width - 1)  # the drain's last step
    assert len(events) + timeline.dropped == n, (
        f"every span is kept or counted as dropped: kept {len(events)} + dropped "
        f"{timeline.dropped} != recorded {n}"
    )
    assert set(range(10)) <= kept, f"head steps missing: {sorted(set(range(10)) - kept)}"
    tail = set(range(last - 50 + 1, last + 1))
    assert tail <= kept, f"tail steps missing: {sorted(tail - kept)}"
    # a comm span lags by up to `width` steps and the trim looks at the oldest span only
    assert len(kept) <= 10 + 50 + width, f"{len(kept)} steps kept, want <= {10 + 50 + width}"
    assert median_duration(events, ("compute",)) is not None


def test_memory_stays_flat_over_20000_steps():
    """The point of the bound: 20,000 steps of spans cost what ~2,100 do."""
    timeline = Timeline(rank=0)
    record_pipe(timeline, 500)  # allocator pools warmed up before the measurement
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        record_pipe(timeline, 20000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # ~130 B a span kept (a tuple of 5 and two floats): 2,100 steps x 3 spans ~ 0.8 MB; all
    # 60,000 spans would be ~8 MB as tuples (and ~40 MB as the dicts they used to be).
    assert grown < 1.5e6, f"the timeline grew by {grown / 1e6:.2f} MB over 20,000 steps"
    assert timeline.dropped > 50000


def test_spans_with_one_step_number_stay_bounded(monkeypatch):
    monkeypatch.setattr(Timeline, "TAIL_STEPS", 10)
    timeline = Timeline(rank=0)
    for _ in range(10 * Timeline.SPANS_PER_STEP + 100):
        with timeline.span("server", "server", 500):
            pass
    assert len(timeline.events) == 10 * Timeline.SPANS_PER_STEP
    assert timeline.dropped == 100


def test_two_threads_record_at_once(monkeypatch):
    """The compute and comm threads both record: nothing lost, nothing counted twice."""
    monkeypatch.setattr(Timeline, "HEAD_STEPS", 5)
    monkeypatch.setattr(Timeline, "TAIL_STEPS", 20)
    timeline = Timeline(rank=1)
    steps = 5000

    def record(thread: str) -> None:
        for t in range(steps):
            with timeline.span(thread, thread, t):
                pass

    threads = [threading.Thread(target=record, args=(name,)) for name in ("compute", "comm")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(timeline.events) + timeline.dropped == 2 * steps
    assert steps_of(timeline.events) >= set(range(5)) | set(range(steps - 20, steps))


def test_chrome_trace_marks_the_steps_left_out(monkeypatch):
    monkeypatch.setattr(Timeline, "HEAD_STEPS", 10)
    monkeypatch.setattr(Timeline, "TAIL_STEPS", 50)
    events = []
    for rank in (0, 1):
        timeline = Timeline(rank)
        record_pipe(timeline, 1000)
        events += timeline.events
    gaps = step_gaps(events)
    assert [(rank, first) for rank, first, _, _ in gaps] == [(0, 10), (1, 10)], gaps
    # kept: steps > 1000 - 50 (1000: the drain's), and maybe a straggler comm span of 950
    assert all(949 <= last <= 950 for _, _, last, _ in gaps), gaps
    marks = [e for e in chrome_trace(events)["traceEvents"] if e["name"] == "steps not traced"]
    assert len(marks) == 2 and all(e["ph"] == "i" and e["ts"] >= 0 for e in marks), marks

    full = Timeline(0)
    record_pipe(full, 40)  # < TAIL_STEPS
    assert step_gaps(full.events) == [], "a run that kept every step has no gap"


def pairwise_hidden_fraction(events: list[dict], comm_names: tuple[str, ...]) -> float | None:
    """The definition, as a plain double loop: for each comm span, its overlap with each
    compute span of the same rank."""
    total = hidden = 0.0
    for c in events:
        if c["name"] not in comm_names:
            continue
        a, b = c["ts"], c["ts"] + c["dur"]
        total += b - a
        for e in events:
            if e["pid"] == c["pid"] and e["tid"] == "compute":
                hidden += max(0.0, min(b, e["ts"] + e["dur"]) - max(a, e["ts"]))
    return hidden / total if total > 0 else None


@settings(max_examples=60)
@given(seed=seeds, ranks=st.integers(1, 3), steps=st.integers(0, 40))
def test_hidden_fraction_matches_the_pairwise_definition(seed, ranks, steps):
    """Compute spans follow one another (one thread); comm spans fall anywhere, overlapping
    none, some or several of them, or touching one at an end."""
    rng = np.random.default_rng(seed)
    events = []
    for rank in range(ranks):
        t = 0.0
        for step in range(steps):
            t += float(rng.integers(0, 3))  # gaps of 0 (back to back), 1 or 2
            dur = float(rng.integers(0, 5))
            events.append({"name": "compute", "pid": rank, "tid": "compute", "ts": t,
                           "dur": dur, "args": {"step": step}})  # fmt: skip
            t += dur
        for step in range(steps):
            events.append({"name": "allreduce", "pid": rank, "tid": "comm",
                           "ts": float(rng.integers(-2, int(t) + 3)),
                           "dur": float(rng.integers(0, 12)), "args": {"step": step}})  # fmt: skip
    got = hidden_fraction(events, ("allreduce",))
    want = pairwise_hidden_fraction(events, ("allreduce",))
    if want is None:
        assert got is None, f"no comm time: want None, got {got}"
    else:
        # integer-valued times: both sums are exact, in any order
        assert got == pytest.approx(want, abs=1e-12), f"hidden_fraction {got}, pairwise {want}"
