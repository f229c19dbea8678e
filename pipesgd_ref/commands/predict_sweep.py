"""`pipesgd predict --sweep KEY=LOW..HIGH`: every run's predicted iteration time along one knob
(bandwidth, latency, world_size), and the three questions of a sweep, each located exactly by
bisecting the timing models between the rows:

    where does pipelining stop paying?  the first value past which pipe is under PAYS = 1.1x
                                        faster than sync (a smaller gain is not worth staleness)
    where does Pipe-SGD stop beating    the same against ddp, synchronous SGD whose buckets
    ddp?                                all-reduce during the backward (the pipe/ddp column)
    where does PS fall behind?          where ps-sync turns slower than sync
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from pipesgd_ref.commands.predict_scenario import Scenario
from pipesgd_ref.plots import method_style
from pipesgd_ref.units import format_bandwidth, format_seconds

# pipe must beat sync by this factor to be worth its staleness (docs/paper.md, section 5)
PAYS = 1.1


def crossings(
    f: Callable[[float], float], values: list[float], threshold: float, integer: bool = False
) -> list[tuple[float, bool]]:
    """Where `f(v) >= threshold` changes along the sorted `values`: [(v, state from v on)].

    Each change between two neighbouring values is located by bisection (the models are cheap):
    on integers to the first value of the new state, otherwise geometrically (the sweeps are
    log-spaced) to a relative 1e-12."""
    out = []
    states = [bool(f(v) >= threshold) for v in values]  # bool: numpy's is not JSON
    for lo, hi, s_lo, s_hi in zip(values[:-1], values[1:], states[:-1], states[1:], strict=True):
        if s_lo == s_hi:
            continue
        if integer:
            lo, hi = int(lo), int(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if (f(mid) >= threshold) == s_lo else (lo, mid)
        else:
            while hi / lo > 1 + 1e-12:
                geo = math.sqrt(lo * hi)  # the geometric midpoint
                if geo in (lo, hi):  # no float strictly between: done
                    break
                lo, hi = (geo, hi) if (f(geo) >= threshold) == s_lo else (lo, geo)
        out.append((float(hi), bool(s_hi)))
    return out


def _intervals(values, first_state: bool, changes) -> list[tuple[float, float]]:
    """[lo, hi) ranges of `values` where the state holds, from its first value and changes."""
    out: list[tuple[float, float]] = []
    start, state = values[0], first_state  # start: where the state last began to hold
    for v, new in changes:
        if state and not new:
            out.append((start, v))
        if new and not state:
            start = v
        state = new
    if state:
        out.append((start, values[-1]))
    return out


def format_value(key: str, v: float) -> str:
    """A swept value as people write it: 1 Gbit/s, 50 us, 8."""
    if key == "bandwidth":  # 9 digits: geomspace's 999.9999 Mbit/s is 1 Gbit/s, not "1e+03 Mbit"
        return format_bandwidth(float(f"{v:.9g}")).split(" (")[0]
    if key == "latency":
        return format_seconds(v)
    return f"{int(v)}" if v == int(v) else f"{v:g}"


def answer_questions(scenario: Scenario, key: str, values: list[float]) -> dict:
    """The questions of a sweep, each as {"text": ..., and the figures behind it}."""

    def over(rival: str):  # pipe's speedup over `rival`
        def gain(v):
            preds = scenario.predict(key, v)
            return preds[rival].iter_time_s / preds["pipe"].iter_time_s

        return gain

    def lag(v):  # ps-sync's slowdown against sync
        preds = scenario.predict(key, v)
        return preds["ps-sync"].iter_time_s / preds["sync"].iter_time_s

    return {
        "pipelining": _pipelining(over("sync"), key, values),
        "ddp": _pipelining(over("ddp"), key, values, DDP_WORDS),
        "ps": _ps_behind(lag, key, values),
    }


# How `_pipelining` words its answer: against sync (pipelining pays or not), and against ddp.
SYNC_WORDS = {
    "rival": "sync",
    "question": "where does pipelining stop paying?",
    "stops": "pipelining stops paying",
    "pays": "it pays over",
    "to_the_end": "pipelining pays to the end of the sweep",
    "never": "pipelining never pays here",
}
DDP_WORDS = {
    "rival": "ddp",
    "question": "where does Pipe-SGD stop beating ddp?",
    "stops": "Pipe-SGD stops beating ddp",
    "pays": f"{PAYS:.1f}x or more over",
    "to_the_end": "Pipe-SGD beats ddp to the end of the sweep",
    "never": "Pipe-SGD never beats ddp by that here",
}


def _pipelining(
    gain: Callable[[float], float], key: str, values: list[float], words: dict = SYNC_WORDS
) -> dict:
    """Where pipe's speedup over a rival (`gain`; sync, or ddp with DDP_WORDS) is PAYS or
    more, and where it stops being."""
    rival = words["rival"]
    gains = [gain(v) for v in values]
    best = max(range(len(values)), key=gains.__getitem__)
    pay_changes = crossings(gain, values, PAYS, key == "world_size")
    pays = _intervals(values, gains[0] >= PAYS, pay_changes)
    stops = next((v for v, state in pay_changes if not state), None)
    most = f"most {gains[best]:.2f}x at {key} {format_value(key, values[best])}"
    if stops is not None:
        where = ", ".join(f"{format_value(key, a)}..{format_value(key, b)}" for a, b in pays)
        text = (
            f"{words['stops']} at {key} {format_value(key, stops)}: from there pipe is "
            f"under {PAYS:.1f}x faster than {rival} ({words['pays']} {where}; {most})"
        )
    elif pays:
        text = (
            f"{words['to_the_end']}: pipe is {PAYS:.1f}x or more faster "
            f"than {rival} from {key} {format_value(key, pays[-1][0])} on ({most})"
        )
    else:
        text = (
            f"{words['never']}: pipe is under {PAYS:.1f}x faster than {rival} everywhere ({most})"
        )
    return {
        "question": words["question"],
        "threshold": PAYS,
        "stops_at": stops,
        "pays": pays,
        "changes": pay_changes,
        "peak": {"value": values[best], "speedup": gains[best]},
        "gains": gains,
        "text": text,
    }


def _ps_behind(lag: Callable[[float], float], key: str, values: list[float]) -> dict:
    """Where ps-sync's time over sync's (`lag`) is above 1: the parameter server behind."""
    lags = [lag(v) for v in values]
    # the state "ps-sync is slower" is lag > 1, i.e. not (1 / lag >= 1)
    ahead = crossings(lambda v: 1 / lag(v), values, 1.0, key == "world_size")
    ps_changes = [(v, not not_slower) for v, not_slower in ahead]
    behind = _intervals(values, lags[0] > 1, ps_changes)
    phrases = [
        f"ps-sync falls behind sync (slower) at {key} {format_value(key, v)} and above"
        if slower
        else f"ps-sync falls behind sync (slower) below {key} {format_value(key, v)}, ahead "
        "from there"
        for v, slower in ps_changes
    ]
    if not phrases:
        phrases = [
            f"ps-sync is behind sync over the whole sweep ({min(lags):.2f}x to "
            f"{max(lags):.2f}x slower)"
            if lags[0] > 1
            else f"ps-sync stays ahead of sync over the whole sweep (at most {max(lags):.2f}x "
            "its time)"
        ]
    return {
        "question": "where does PS fall behind?",
        "falls_behind_at": next((v for v, slower in ps_changes if slower), None),
        "behind": behind,
        "changes": ps_changes,
        "text": "; ".join(phrases),
    }


def format_sweep(key: str, values: list[float], rows: list[dict]) -> str:
    """One row per swept value: every run's iteration time, and pipe's speedup over sync and
    (where ddp is predicted) over ddp."""
    labels = list(rows[0])
    rivals = [r for r in ("sync", "ddp") if r in labels]
    widths = [max(len(label), 9) for label in labels]
    columns = list(zip(labels, widths, strict=True))
    head = f"{key:<12} " + " ".join(f"{lb:>{w}}" for lb, w in columns)
    head += "".join(f" {'pipe/' + r:>9}" for r in rivals)
    lines = [head, "-" * len(head)]
    for v, preds in zip(values, rows, strict=True):
        cells = " ".join(f"{format_seconds(preds[lb].iter_time_s):>{w}}" for lb, w in columns)
        pipe = preds["pipe"].iter_time_s
        gains = "".join(f" {preds[r].iter_time_s / pipe:>8.2f}x" for r in rivals)
        lines.append(f"{format_value(key, v):<12} {cells}{gains}")
    return "\n".join(lines)


def plot_sweep(
    key: str, values: list[float], rows: list[dict], answers: dict, path, title: str = ""
) -> Path | None:
    """Iteration time against the swept value (log-log), one line per run, the answers as
    dotted verticals. Returns the path written, or None without matplotlib."""
    from pipesgd_ref.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    scale, unit = {
        "bandwidth": (8e-9, "bandwidth (Gbit/s)"),
        "latency": (1e6, "latency (us)"),
        "world_size": (1.0, "world size p"),
    }[key]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [v * scale for v in values]
    for label in rows[0]:
        times_ms = [preds[label].iter_time_s * 1e3 for preds in rows]
        ax.plot(xs, times_ms, marker="o", ms=3, label=label, **method_style(label))
    ax.set_xscale("log", base=2 if key == "world_size" else 10)
    ax.set_yscale("log")
    ax.set_xlabel(unit)
    ax.set_ylabel("predicted iteration time (ms)")
    pays = {True: "pipelining pays from here", False: "pipelining stops paying"}
    marks = [(v, pays[state], "tab:red") for v, state in answers["pipelining"]["changes"]]
    beats = {True: "pipe beats ddp from here", False: "pipe stops beating ddp"}
    marks += [(v, beats[state], "tab:purple") for v, state in answers["ddp"]["changes"]]
    behind = {True: "ps-sync slower than sync from here", False: "ps-sync ahead from here"}
    marks += [(v, behind[slower], "tab:gray") for v, slower in answers["ps"]["changes"]]
    for v, text, color in marks:
        if v is not None:
            ax.axvline(v * scale, ls=":", color=color)
            top = ax.get_ylim()[1]
            ax.text(v * scale, top, f" {text}", color=color, fontsize=8, rotation=90, va="top")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, path)
