"""Per-rank timelines -> a Chrome trace, and the timing figures of a run.

The trace (trace.json) opens in https://ui.perfetto.dev or chrome://tracing: one process row
per rank (pid = rank), one thread row per activity (compute, comm, server), spans of type
"X" in microseconds since the first event. Pipe-SGD's overlap is visible at a glance: the
comm row of a pipe run is busy while the compute row is.
"""

from __future__ import annotations

import statistics

THREAD_IDS = {"compute": 1, "comm": 2, "server": 3}


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
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"name": thread}})  # fmt: skip
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def median_duration(events: list[dict], names: tuple[str, ...]) -> float | None:
    """Median length in seconds of the spans called one of `names` (None if there are none)."""
    durations = [e["dur"] / 1e6 for e in events if e["name"] in names]
    return statistics.median(durations) if durations else None


def hidden_fraction(events: list[dict], comm_names: tuple[str, ...]) -> float | None:
    """Share of communication time that overlapped computation on the same rank:
    sum over comm spans of |span ∩ compute spans| / sum of comm span lengths."""
    total = hidden = 0.0
    for rank in {e["pid"] for e in events}:
        mine = [e for e in events if e["pid"] == rank]
        busy = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == "compute")
        for e in mine:
            if e["name"] not in comm_names:
                continue
            a, b = e["ts"], e["ts"] + e["dur"]
            total += b - a
            hidden += sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy if x < b and y > a)
    return hidden / total if total > 0 else None
