"""timing/load.py: other programs' CPU time, from /proc/stat less this process tree's own.

The arithmetic runs on made-up /proc/stat readings; one test spins a busy child process and
sees it counted as another program's (it has not ended, so it is not yet this tree's own):
neither depends on the machine being quiet.
"""

import subprocess
import sys

import pytest

from pipesgd_ref.timing import load

STAT = """cpu  {u} 10 {s} 9000 50 0 5 {st} 0 0
cpu0 {u0} 5 100 4500 25 0 3 0 0 0
cpu1 {u1} 5 100 4500 25 0 2 0 0 0
intr 12 0 0
ctxt 499
"""


def stat(u0: int, u1: int, steal: int = 0) -> str:
    return STAT.format(u=u0 + u1, s=200, st=steal, u0=u0, u1=u1)


def test_busy_seconds_sums_all_but_idle_and_iowait_in_clock_ticks():
    text = stat(300, 500, steal=7)
    # aggregate: user 800 + nice 10 + system 200 + irq 0 + softirq 5 + steal 7 = 1022 ticks
    assert load.busy_seconds(text, hz=100) == pytest.approx(10.22)
    assert load.busy_seconds(text, cpus={0}, hz=100) == pytest.approx((300 + 5 + 100 + 3) / 100)
    assert load.busy_seconds(text, cpus={0, 1}, hz=100) == pytest.approx(
        (300 + 5 + 100 + 3 + 500 + 5 + 100 + 2) / 100
    )
    assert load.busy_seconds(text, cpus={7}, hz=100) == pytest.approx(10.22), "none: aggregate"


def test_others_are_the_busy_time_less_this_process_trees_own():
    """Over 2 s the cores were busy 1.5 s; this tree used 0.5 s: others used 1 s, half a core."""
    a = load.CpuSample(busy_s=10.0, own_s=3.0, at=100.0)
    b = load.CpuSample(busy_s=11.5, own_s=3.5, at=102.0)
    got = load.others_between(a, b)
    assert got["window_s"] == 2.0 and got["others_cores"] == pytest.approx(0.5)
    assert got["own_cores"] == pytest.approx(0.25) and got["busy_cores"] == pytest.approx(0.75)
    # our own time above the ticks counted (accounting differs by a tick): no negative load
    assert load.others_between(a, load.CpuSample(10.1, 3.5, 102.0))["others_cores"] == 0.0
    assert load.others_between(None, b) is None and load.others_between(b, a) is None


def test_a_quiet_window_reads_stat_twice_around_its_sleep():
    readings = iter([stat(100, 100), stat(160, 140)])  # +100 ticks: 1 s of CPU in 0.5 s
    slept = []
    got = load.quiet_window(0.5, read_stat=lambda: next(readings), sleep=slept.append)
    assert slept == [0.5] and len(got["loadavg"]) == 3
    # the window is the monotonic time between the readings, not the sleep asked for: the
    # fake sleep took none, so the figure is large; here only its sign and keys matter
    assert got["others_cores"] > 0 and set(got) >= {"window_s", "own_cores", "busy_cores"}


def test_without_proc_stat_nothing_is_measured_and_nothing_warned():
    def unreadable() -> str:
        raise FileNotFoundError("/proc/stat")

    got = load.quiet_window(0.0, read_stat=unreadable, sleep=lambda _: None)
    assert "others_cores" not in got
    figures = load.report(got, None, got)
    assert figures["warning"] is None
    assert load.describe(figures) == "load: not measured (no /proc/stat here)"


def test_busy_warning_names_each_window_over_the_limit():
    quiet = {"others_cores": 0.05, "loadavg": [0.3, 0.2, 0.1]}
    busy = {"others_cores": 0.9, "loadavg": [2.5, 1.0, 0.5]}
    assert load.report(quiet, quiet, quiet)["warning"] is None
    assert load.report(quiet, {"others_cores": 0.25}, quiet)["warning"] is None, "at: not over"
    figures = load.report(busy, {"others_cores": 0.4}, quiet)
    warning = figures["warning"]
    assert figures["limit_cores"] == load.OTHERS_LIMIT == 0.25
    assert warning.startswith("WARNING") and "unreliable" in warning, warning
    assert "0.90 cores before" in warning and "0.40 cores during" in warning
    assert "after" not in warning.split(";")[0], "a quiet window is not named"
    line = load.describe(figures)
    assert "0.90 cores before, 0.40 cores during, 0.05 cores after" in line, line
    assert "load average 2.50 before, 0.30 after" in line, line


@pytest.mark.skipif(load.sample() is None, reason="no /proc/stat here")
def test_a_busy_child_that_has_not_ended_counts_as_another_program():
    """A child spinning for the whole window: its CPU time is in /proc/stat, and not yet in
    getrusage's children (it has not been waited for), so it is counted as others' load. On a
    busy machine it still gets a good share of a core; 0.3 leaves room for that."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        got = load.quiet_window(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert got["others_cores"] >= 0.3, got
