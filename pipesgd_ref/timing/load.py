"""How busy the machine was with work this process did not cause: other programs' CPU time.

A timing is only as good as the cores it ran on. `pipesgd compare` measures, before it
calibrates and after its runs, how much CPU time the rest of the machine used:

    others = (busy CPU time of the cores this process may run on, from /proc/stat)
             - (CPU time of this process and of its children that have ended, from getrusage)

over a window, as cores' worth (others / window): 0 on a quiet machine, 1 when another program
kept one core busy the whole time. Over the whole comparison the same difference counts every
worker process it started (each has ended and been waited for by then). The load average
(os.getloadavg) is recorded beside it; it counts this comparison's own processes as well, so
only `others` decides the warning: above OTHERS_LIMIT cores on average, the timing figures
(calibration, iterations, times to target) are unreliable, because on shared cores another
program's work lands on the slowest rank of a step.

/proc/stat counts in clock ticks (USER_HZ, 100 a second): a figure over half a second is good
to a few hundredths of a core. Where /proc/stat is missing (not Linux), nothing is measured.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

OTHERS_LIMIT = 0.25  # cores' worth of other programs' CPU time, on average, past which we warn
QUIET_WINDOW_S = 0.5  # the window sampled before calibrating and after the runs
STAT_PATH = "/proc/stat"
# /proc/stat's columns after the cpu name: user nice system idle iowait irq softirq steal ...
# Busy: all but idle and iowait (guest time is inside user and nice already); steal, time the
# hypervisor gave another machine, is time our processes could not run, so it counts too.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuSample:
    """One reading: the busy CPU seconds of the cores counted, this process tree's own CPU
    seconds, and when (time.monotonic)."""

    busy_s: float
    own_s: float
    at: float


def busy_seconds(stat_text: str, cpus=None, hz: float | None = None) -> float:
    """The busy CPU seconds in /proc/stat's text, summed over the cpuN lines of `cpus` (None:
    the aggregate "cpu" line; a set none of whose lines is there: the aggregate too)."""
    hz = hz or _clock_ticks()
    total, found, aggregate = 0, False, 0
    for line in stat_text.splitlines():
        name, *cols = line.split()
        if not name.startswith("cpu"):
            continue
        busy = sum(int(cols[i]) for i in _BUSY_COLUMNS if i < len(cols))
        if name == "cpu":
            aggregate = busy
        elif cpus is not None and int(name[3:]) in cpus:
            total, found = total + busy, True
    return (total if found else aggregate) / hz


def own_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended and
    been waited for (and theirs, recursively)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def sample(
    read_stat: Callable[[], str] | None = None, own: Callable[[], float] = own_cpu_seconds
) -> CpuSample | None:
    """A reading now; None where /proc/stat cannot be read."""
    try:
        text = read_stat() if read_stat else _read(STAT_PATH)
    except OSError:
        return None
    return CpuSample(busy_seconds(text, _usable_cpus()), own(), time.monotonic())


def others_between(a: CpuSample | None, b: CpuSample | None) -> dict | None:
    """What other programs used between readings a and b: {"window_s", "others_cores" (their
    CPU seconds over the window: cores' worth), "own_cores", "busy_cores"}; None without both."""
    if a is None or b is None or b.at <= a.at:
        return None
    window = b.at - a.at
    busy, own = b.busy_s - a.busy_s, b.own_s - a.own_s
    return {
        "window_s": window,
        "others_cores": max(0.0, busy - own) / window,
        "own_cores": own / window,
        "busy_cores": busy / window,
    }


def quiet_window(seconds: float = QUIET_WINDOW_S, read_stat=None, sleep=time.sleep) -> dict:
    """Other programs' load over `seconds` while this process sleeps, with the load averages:
    {"others_cores", "window_s", ..., "loadavg": [1, 5, 15 min]} (no "others_cores" where
    /proc/stat cannot be read)."""
    first = sample(read_stat)
    sleep(seconds)
    got = others_between(first, sample(read_stat)) or {}
    return {**got, "loadavg": list(_loadavg())}


def busy_warning(load: dict, limit: float = OTHERS_LIMIT) -> str | None:
    """A warning when other programs used more than `limit` cores on average in any window of
    `load` ({name: a window's dict, e.g. "before", "during", "after"}); None otherwise."""
    busy = {
        name: w["others_cores"]
        for name, w in load.items()
        if isinstance(w, dict) and w.get("others_cores", 0.0) > limit
    }
    if not busy:
        return None
    where = ", ".join(f"{v:.2f} cores {name}" for name, v in busy.items())
    return (
        f"WARNING: the machine was busy with other work ({where}; the limit is {limit:g} of a "
        f"core on average): the timing figures here (calibration, iterations, times to target, "
        f"the checks) are unreliable, since another program's CPU time lands on the slowest "
        f"rank of every step; run again on a quiet machine"
    )


def report(before: dict, during: dict | None, after: dict, limit: float = OTHERS_LIMIT) -> dict:
    """A comparison's load figures: the windows before its calibration and after its runs
    (`quiet_window`), the whole comparison (`others_between`), the limit, and the warning
    (`busy_warning`: None on a quiet machine)."""
    figures = {"before": before, "during": during or {}, "after": after}
    return {**figures, "limit_cores": limit, "warning": busy_warning(figures, limit)}


def describe(figures: dict) -> str:
    """One line of `report`'s figures: other programs' cores before, during and after, and
    the 1-minute load averages (which count the comparison's own processes too)."""
    windows = ("before", "during", "after")
    parts = [
        f"{figures[k]['others_cores']:.2f} cores {k}"
        for k in windows
        if "others_cores" in figures.get(k, {})
    ]
    if not parts:
        return "load: not measured (no /proc/stat here)"
    averages = [
        f"{figures[k]['loadavg'][0]:.2f} {k}" for k in windows if figures.get(k, {}).get("loadavg")
    ]
    return (
        f"load: other programs used {', '.join(parts)} (limit {figures['limit_cores']:g} "
        f"cores); 1-minute load average {', '.join(averages)} (this comparison's own "
        f"processes included)"
    )


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _clock_ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 100.0


def _usable_cpus():
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return None


def _loadavg() -> tuple[float, ...]:
    try:
        return os.getloadavg()
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return ()
