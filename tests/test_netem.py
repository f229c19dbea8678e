"""Link emulation: unit parsing and formatting, and the alpha-beta pacing of LinkEmulator.

The pacing tests run on a fake clock whose sleep advances it, so they are exact and instant;
one real-clock test checks that the emulation actually sleeps as long as the link says.
"""

from __future__ import annotations

import math
import time

import pytest

from pipesgd_ref.comm.netem import LinkEmulator, LinkSpec, wait_until
from pipesgd_ref.units import (
    format_bandwidth,
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_latency,
    parse_size,
)

# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("0", 0.0),
        (0, 0.0),
        (0.25, 0.25),
        ("50us", 5e-5),
        ("50µs", 5e-5),  # MICRO SIGN
        ("50μs", 5e-5),  # GREEK SMALL LETTER MU
        ("1ms", 1e-3),
        ("1.5 ms", 1.5e-3),
        ("0.5s", 0.5),
        ("2e-3", 2e-3),
        ("100ns", 1e-7),
        (" 3ms ", 3e-3),
    ],
)
def test_parse_latency(text, seconds):
    assert parse_latency(text) == seconds


@pytest.mark.parametrize("text", ["", "-1ms", "ms", "1 parsec", "1m", "abc", -0.5, "inf"])
def test_parse_latency_rejects_with_examples(text):
    with pytest.raises(ValueError, match="expected a latency like 50us, 1ms, 0.2s"):
        parse_latency(text)


@pytest.mark.parametrize(
    "text, bytes_per_second",
    [
        ("1Gbit", 125e6),
        ("1gbit", 125e6),
        ("10Gbit", 1.25e9),
        ("100Mbit", 12.5e6),
        ("100mbit/s", 12.5e6),
        ("8Kbit", 1000.0),
        ("8kbit", 1000.0),
        ("8bit", 1.0),
        ("1Tbit", 125e9),
        ("8Kbps", 1000.0),
        ("1Gbps", 125e6),
        ("100Mbps", 12.5e6),
        ("125MB", 125e6),
        ("125MB/s", 125e6),
        ("1.5 GB/s", 1.5e9),
        ("2KB", 2000.0),
        ("2kB", 2000.0),
        ("1KiB", 1024.0),
        ("1MiB", 1048576.0),
        ("1GiB/s", 1024.0**3),
        ("512B", 512.0),
        ("4096", 4096.0),
        (1e9, 1e9),
        ("inf", math.inf),
        ("unlimited", math.inf),
        (math.inf, math.inf),
    ],
)
def test_parse_bandwidth(text, bytes_per_second):
    assert parse_bandwidth(text) == pytest.approx(bytes_per_second, rel=1e-12)


@pytest.mark.parametrize("text", ["0", "0Gbit", "-1Gbit", -5.0, "", "1 furlong", "Gbit"])
def test_parse_bandwidth_rejects_with_examples(text):
    with pytest.raises(ValueError, match="expected a bandwidth like 1Gbit, 10Gbit, 125MB"):
        parse_bandwidth(text)


def test_parse_bandwidth_asks_bits_or_bytes():
    with pytest.raises(ValueError, match="ambiguous.*Mbit.*MB"):
        parse_bandwidth("100Mb")


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("4KB", 4000),
        ("1MB", 1_000_000),
        ("16MB", 16_000_000),
        ("64MB", 64_000_000),
        ("1MiB", 1_048_576),
        ("4096", 4096),
        (4096, 4096),
        ("1.5MB", 1_500_000),
        ("0", 0),
        ("1 GiB", 1024**3),
    ],
)
def test_parse_size(text, nbytes):
    got = parse_size(text)
    assert got == nbytes and isinstance(got, int)


@pytest.mark.parametrize("text", ["-1KB", "1.5B", "4Kbit", "MB", "", "lots"])
def test_parse_size_rejects_with_examples(text):
    with pytest.raises(ValueError, match="expected a size like 4KB, 1MB"):
        parse_size(text)


# --- formatting ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (812, "812 B"), (4000, "4.0 KB"), (16e6, "16.0 MB"), (2.5e9, "2.5 GB")],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    "s, text", [(5e-5, "50 us"), (1.2e-3, "1.20 ms"), (2.5, "2.50 s"), (0.0, "0 us")]
)
def test_format_seconds(s, text):
    assert format_seconds(s) == text


@pytest.mark.parametrize(
    "bps, text",
    [
        (125e6, "1 Gbit/s (125.0 MB/s)"),
        (1.25e9, "10 Gbit/s (1.2 GB/s)"),
        (12.5e6, "100 Mbit/s (12.5 MB/s)"),
        (math.inf, "unlimited"),
    ],
)
def test_format_bandwidth(bps, text):
    assert format_bandwidth(bps) == text


def test_format_parse_round_trip():
    for text in ("1Gbit", "10Gbit", "100Mbit"):
        bps = parse_bandwidth(text)
        assert parse_bandwidth(format_bandwidth(bps).split(" (")[0].replace(" ", "")) == bps


# --- the link spec ---------------------------------------------------------------------------


def test_link_spec():
    ideal = LinkSpec()
    assert not ideal.enabled and ideal.message_time(10**9) == 0.0
    link = LinkSpec.from_strings("50us", "1Gbit")
    assert link.enabled
    assert link == LinkSpec(latency=5e-5, bandwidth=125e6)
    # alpha + b / B: 50 us + 125 MB at 125 MB/s
    assert link.message_time(125_000_000) == pytest.approx(1.00005)
    assert LinkSpec.from_strings(None, None) == ideal
    assert LinkSpec.from_strings("1ms", None).enabled
    assert LinkSpec.from_strings(None, "1Gbit").enabled
    assert "50 us" in str(link) and "1 Gbit/s" in str(link)


@pytest.mark.parametrize("latency, bandwidth", [(-1.0, math.inf), (0.0, 0.0), (math.nan, 1.0)])
def test_link_spec_rejects_nonsense(latency, bandwidth):
    with pytest.raises(ValueError):
        LinkSpec(latency=latency, bandwidth=bandwidth)


class FakeClock:
    """A clock that moves only when someone sleeps: pacing becomes exact and instant."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, f"asked to sleep a negative time: {seconds}"
        self.sleeps.append(seconds)
        self.now += seconds


LATENCY, BANDWIDTH, NBYTES = 0.005, 100e6, 1_000_000  # 5 ms; 100 MB/s; 1 MB takes 10 ms


def make_emulator(clock: FakeClock) -> LinkEmulator:
    return LinkEmulator(LinkSpec(LATENCY, BANDWIDTH), clock=clock, sleep=clock.sleep)


def test_one_message_arrives_after_latency_plus_serialization():
    clock = FakeClock()
    t0 = clock.now
    deliver_at = make_emulator(clock).schedule(NBYTES)
    assert clock.sleeps == [], "an idle wire must not delay the sender"
    expected = LinkSpec(LATENCY, BANDWIDTH).message_time(NBYTES)
    assert deliver_at - t0 == pytest.approx(expected), (
        f"one message of {NBYTES} B: expected arrival after {expected} s, got {deliver_at - t0} s"
    )
    assert wait_until(deliver_at, max_wait=1.0, clock=clock, sleep=clock.sleep) == pytest.approx(
        expected
    )
    assert clock.now == pytest.approx(t0 + expected)


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_back_to_back_messages_pipeline(k):
    clock = FakeClock()
    emulator = make_emulator(clock)
    t0 = clock.now
    arrivals = [emulator.schedule(NBYTES) - t0 for _ in range(k)]
    for i, got in enumerate(arrivals, start=1):
        # latency + i b / B: latency is paid once, overlapping the next serialization
        expected = LATENCY + i * NBYTES / BANDWIDTH
        assert got == pytest.approx(expected), f"message {i} of {k}: expected {expected}, got {got}"
    # the sender was held back while the wire was busy: it left the last message at (k-1) b / B
    assert clock.now - t0 == pytest.approx((k - 1) * NBYTES / BANDWIDTH)


def test_message_after_idle_wire_departs_now():
    clock = FakeClock()
    emulator = make_emulator(clock)
    emulator.schedule(NBYTES)
    clock.sleep(1.0)  # the wire went idle long ago
    t1 = clock.now
    n_sleeps = len(clock.sleeps)
    deliver_at = emulator.schedule(NBYTES)
    assert len(clock.sleeps) == n_sleeps, "the sender must not wait for an idle wire"
    assert deliver_at - t1 == pytest.approx(LATENCY + NBYTES / BANDWIDTH)


def test_latency_only_link():
    clock = FakeClock()
    emulator = LinkEmulator(LinkSpec(latency=LATENCY), clock=clock, sleep=clock.sleep)
    t0 = clock.now
    assert [emulator.schedule(10**9) - t0 for _ in range(3)] == pytest.approx([LATENCY] * 3)
    assert clock.sleeps == []


def test_disabled_link_costs_nothing():
    def no_clock() -> float:
        raise AssertionError("a disabled link must not read the clock")

    def no_sleep(seconds: float) -> None:
        raise AssertionError("a disabled link must not sleep")

    emulator = LinkEmulator(LinkSpec(), clock=no_clock, sleep=no_sleep)
    assert [emulator.schedule(n) for n in (0, 1, 10**9)] == [0.0, 0.0, 0.0]
    assert wait_until(0.0, max_wait=1.0, clock=no_clock, sleep=no_sleep) == 0.0


def test_wait_until_clamps_and_skips_the_past():
    clock = FakeClock()
    # a deliver_at far in the future (another host's clock) waits at most max_wait
    assert wait_until(clock.now + 1e6, max_wait=0.5, clock=clock, sleep=clock.sleep) == 0.5
    assert clock.sleeps == [0.5]
    # a deliver_at already past (the real transfer was slower) does not wait
    assert wait_until(clock.now - 1.0, max_wait=0.5, clock=clock, sleep=clock.sleep) == 0.0
    assert clock.sleeps == [0.5]
    with pytest.raises(ValueError, match="max_wait"):
        wait_until(clock.now + 1.0, max_wait=-1.0, clock=clock, sleep=clock.sleep)


def test_real_clock_two_messages():
    """On the real clock: 2 x 1 MB at 100 MB/s with 5 ms latency arrive after 5 + 20 ms."""
    emulator = LinkEmulator(LinkSpec(LATENCY, BANDWIDTH))
    t0 = time.monotonic()
    deliver_at = [emulator.schedule(NBYTES) for _ in range(2)][-1]
    wait_until(deliver_at, max_wait=1.0)
    elapsed = time.monotonic() - t0
    expected = LATENCY + 2 * NBYTES / BANDWIDTH
    # generous: a shared machine oversleeps now and then
    assert abs(elapsed - expected) < 0.008, (
        f"expected {expected * 1e3:.1f} ms, took {elapsed * 1e3:.1f} ms"
    )


# --- the timeout of a link: no frame may take longer (issue 18) ---------------------------


def test_parse_latency_refuses_what_no_sleep_can_take():
    # 1e12 s would reach time.sleep inside a worker: an OverflowError, not a message
    with pytest.raises(ValueError, match=r"latency '1e12s' is 1e\+12 s per message, more than"):
        parse_latency("1e12s")
    with pytest.raises(ValueError, match="latency must be finite, >= 0 and <= 1e\\+06"):
        LinkSpec(latency=1e12)
    assert parse_latency("1e6s") == 1e6


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.nan])
def test_link_spec_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
        LinkSpec(latency=0.001, timeout=timeout)


def test_link_spec_from_strings_carries_the_timeout():
    link = LinkSpec.from_strings("1ms", "1Gbit", timeout=3.0)
    assert link.timeout == 3.0 and LinkSpec.from_strings("1ms", "1Gbit").timeout == math.inf
    assert str(link) == str(LinkSpec.from_strings("1ms", "1Gbit"))  # logs unchanged


def test_frame_problem_names_frame_link_and_timeout():
    from pipesgd_ref.comm.netem import frame_problem

    link = LinkSpec.from_strings("0", "1Kbit")  # 125 B/s
    assert frame_problem(link, 125, timeout=1.0) is None  # exactly 1 s: in time
    problem = frame_problem(link, 1300, timeout=3.0, what="a ring segment")
    assert problem.startswith("a ring segment of 1.3 KB takes 10.40 s on the emulated link")
    assert "--bandwidth 1 Kbit/s" in problem and "more than --timeout 3 s" in problem
    assert "raise --bandwidth" in problem
    slow = frame_problem(LinkSpec.from_strings("10s", None), 48, timeout=3.0)
    assert "--latency 10.00 s" in slow and "lower --latency" in slow


def test_a_frame_slower_than_the_timeout_is_refused_without_sleeping():
    """A frame on the wire honours the timeout: with --bandwidth 1bit --timeout 3 the sender
    raises a CommError (one line in the job's report) at once, rather than sleep for hours."""
    from pipesgd_ref.errors import CommError

    clock = FakeClock()
    emulator = LinkEmulator(LinkSpec(0.0, 1 / 8, timeout=3.0), clock=clock, sleep=clock.sleep)
    with pytest.raises(CommError, match=r"a frame of 1.3 KB takes .* more than --timeout 3 s"):
        emulator.schedule(1300)
    assert clock.sleeps == [] and emulator.wire_free == -math.inf, "nothing booked or slept"
    fast = LinkEmulator(LinkSpec(0.0, 1000.0, timeout=3.0), clock=clock, sleep=clock.sleep)
    assert fast.schedule(2000) == pytest.approx(clock.now + 2.0)  # 2 s: within the timeout


def test_a_train_run_on_a_link_slower_than_its_timeout_stops_in_bounded_time(capsys):
    """End to end: each worker's first ring frame (1.3 KB at 125 B/s: 10.8 s) is refused by
    the emulator, so the job ends within seconds, naming the link, not a hung peer."""
    from pipesgd_ref.commands.cli import main

    start = time.monotonic()
    rc = main(
        ["train", "--preset=tiny", "--steps=3", "--no-progress", "--bandwidth=1Kbit", "--timeout=5"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert "more than --timeout 5 s" in err and "1 Kbit/s" in err, err
    assert time.monotonic() - start < 30
