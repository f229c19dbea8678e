"""Link emulation: make one machine behave like a cluster with a chosen network.

On one machine every worker talks over loopback, which moves gigabytes per second with a few
microseconds of latency: far from the 1-10 Gbit/s Ethernet of the paper's cluster, so
communication would look free and Pipe-SGD would have nothing to hide. This module slows each
link down to a chosen latency `alpha` and `bandwidth` B, so the timing models of
shared/PAPER.md can be checked against measurements on a laptop.

The model is the standard alpha-beta link, per direction:

    message_time(b) = alpha + b / B          (seconds for one message of b bytes)

Links are full duplex: each direction of each link has its own `LinkEmulator`, so a rank can
send to its right neighbour while receiving from its left one at full bandwidth both ways.
Consecutive messages on one direction pipeline: the latency of message i overlaps the
serialization of message i+1, so k back-to-back messages of b bytes arrive at alpha + k b / B.

How it works, per message:

    sender:    deliver_at = emulator.schedule(nbytes)   # wait while the wire is busy
               send header(deliver_at) + bytes          # real bytes go out at once
    receiver:  receive the bytes, then wait_until(deliver_at, max_wait)

The real loopback transfer happens *during* the emulated time, so the measured time equals the
emulated one whenever the real transfer is faster (it is, on loopback, by far); a real transfer
slower than the emulated link shows through unchanged.

Clock assumption: `deliver_at` is a `time.monotonic()` reading of the sender, compared with the
receiver's clock. On one Linux machine all processes share that clock (CLOCK_MONOTONIC). Across
hosts the clocks differ by an arbitrary offset, which is why `wait_until` never sleeps longer
than `max_wait`: emulation is for single-machine runs, and across real hosts it must be off.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MAX_SECONDS",
    "LinkEmulator",
    "LinkModel",
    "LinkTooSlow",
    "frame_problem",
    "too_slow_advice",
    "format_bandwidth",
    "format_bytes",
    "format_seconds",
    "parse_bandwidth",
    "parse_latency",
    "parse_size",
    "wait_until",
]

# ---------------------------------------------------------------------------------------------
# Parsing: the units people write on command lines ("50us", "1Gbit", "125MB/s", "16MB").
# ---------------------------------------------------------------------------------------------

_LATENCY_EXAMPLES = "expected a latency like 50us, 1ms, 0.2s (a plain number is seconds)"
_BANDWIDTH_EXAMPLES = (
    "expected a bandwidth like 1Gbit, 10Gbit, 125MB (bits: bit, Kbit, Mbit, Gbit, Tbit, Mbps; "
    "bytes: B, KB, MB, GB, KiB, MiB, GiB; optional '/s'; a plain number is bytes/s; "
    "or 'unlimited')"
)
_SIZE_EXAMPLES = "expected a size like 4KB, 1MB, 64MB, 1MiB or 4096 (a plain number is bytes)"

# The longest latency (and --timeout) accepted: about 11.6 days. Not a network any more, and far
# inside what time.sleep and queue waits accept (int64 nanoseconds: 292 years; a latency of
# 1e12 s there is an OverflowError deep inside a worker, not a message).
MAX_SECONDS = 1e6

# A number (sign allowed so that "-1ms" reports "negative", not "unreadable"), then a unit.
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*?)\s*$")

# Divisors, not factors: 50 / 1e6 rounds to the float 5e-05 that people expect, 50 * 1e-6 does not.
_UNITS_PER_SECOND = {
    "": 1.0,
    "s": 1.0,
    "ms": 1e3,
    "us": 1e6,
    "\u00b5s": 1e6,  # MICRO SIGN, what most keyboards type
    "\u03bcs": 1e6,  # GREEK SMALL LETTER MU, what some fonts and editors produce
    "ns": 1e9,
}

# Byte units: SI prefixes are powers of 1000 (as disks and network specs use them),
# binary prefixes (KiB, MiB, ...) powers of 1024.
_BYTES_PER_UNIT = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "kB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}

# Bit units, as tc and network specs write them: kilo..tera are powers of 1000.
_BIT_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def _split(text: str | float, examples: str) -> tuple[float, str]:
    """Number and unit of `text`; a number passed as a number has the empty unit."""
    if isinstance(text, bool):  # bool is an int subclass; True is not a quantity
        raise ValueError(f"cannot read {text!r}: {examples}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        match = _QUANTITY.match(str(text))
        if match is None:
            raise ValueError(f"cannot read {text!r}: {examples}")
        value, unit = float(match.group(1)), match.group(2)
    if math.isnan(value):
        raise ValueError(f"cannot read {text!r} (not a number): {examples}")
    return value, unit


def parse_latency(text: str | float) -> float:
    """Seconds in `text`: "0", "50us", "50µs", "1ms", "0.5s", "2e-3" (plain number = seconds)."""
    value, unit = _split(text, _LATENCY_EXAMPLES)
    if unit not in _UNITS_PER_SECOND:
        raise ValueError(f"unknown latency unit {unit!r} in {text!r}: {_LATENCY_EXAMPLES}")
    seconds = value / _UNITS_PER_SECOND[unit]
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"latency must be finite and >= 0, got {text!r}: {_LATENCY_EXAMPLES}")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"latency {text!r} is {seconds:.3g} s per message, more than the {MAX_SECONDS:.0e} s "
            f"(11.6 days) this emulator accepts: is the unit right? {_LATENCY_EXAMPLES}"
        )
    return seconds


def _bytes_per_second_unit(unit: str, text: str | float) -> float:
    """Bytes/s of one `unit` ("Gbit", "Mbps", "MB", "MiB/s", ...)."""
    if unit.endswith("/s"):
        unit = unit[:-2]
    lower = unit.lower()
    for bits in ("bit", "bps"):
        # bit units are case-insensitive ("Mbit", "mbit", "MBit"): no one means millibits.
        if lower.endswith(bits) and lower[: -len(bits)] in _BIT_PREFIX:
            return _BIT_PREFIX[lower[: -len(bits)]] / 8
    if unit in _BYTES_PER_UNIT:
        return float(_BYTES_PER_UNIT[unit])
    if lower in ("kb", "mb", "gb", "tb"):
        # "Mb" is megabits to some and megabytes to others: make the person say which.
        prefix = unit[0].upper()
        raise ValueError(
            f"ambiguous bandwidth unit {unit!r} in {text!r}: write {prefix}bit for bits "
            f"or {prefix}B for bytes (e.g. 1Gbit == 125MB)"
        )
    raise ValueError(f"unknown bandwidth unit {unit!r} in {text!r}: {_BANDWIDTH_EXAMPLES}")


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second in `text`: "1Gbit" -> 125e6, "125MB/s" -> 125e6, "unlimited" -> inf.

    Bits: bit, Kbit, Mbit, Gbit, Tbit (any case; also bps, Kbps, Mbps, Gbps). Bytes: B, KB, MB,
    GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024). A "/s" suffix is optional;
    a plain number is bytes/s; "inf" or "unlimited" is math.inf (no bandwidth limit).
    """
    if isinstance(text, str) and text.strip().lower() in ("inf", "unlimited"):
        return math.inf
    value, unit = _split(text, _BANDWIDTH_EXAMPLES)
    bytes_per_second = value * _bytes_per_second_unit(unit, text)
    if not bytes_per_second > 0:
        raise ValueError(f"bandwidth must be > 0, got {text!r}: {_BANDWIDTH_EXAMPLES}")
    return bytes_per_second


def parse_size(text: str | int) -> int:
    """Bytes in `text`: "4KB" -> 4000, "1MiB" -> 1048576, "1.5MB" -> 1500000, "4096" -> 4096."""
    value, unit = _split(text, _SIZE_EXAMPLES)
    if unit not in _BYTES_PER_UNIT:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}: {_SIZE_EXAMPLES}")
    nbytes = value * _BYTES_PER_UNIT[unit]
    if nbytes < 0 or not math.isfinite(nbytes):
        raise ValueError(f"size must be finite and >= 0, got {text!r}: {_SIZE_EXAMPLES}")
    if nbytes != round(nbytes):
        raise ValueError(f"size {text!r} is not a whole number of bytes: {_SIZE_EXAMPLES}")
    return int(round(nbytes))


# ---------------------------------------------------------------------------------------------
# Formatting, for logs and benchmark tables.
# ---------------------------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    """SI size: 812 -> "812 B", 4000 -> "4.0 KB", 16e6 -> "16.0 MB", 0.125 -> "0.125 B"."""
    if 0 < abs(n) < 1:  # a bandwidth of a few bits per second
        return f"{n:.3g} B"
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """Human time: 5e-5 -> "50 us", 1.2e-3 -> "1.20 ms", 2.5 -> "2.50 s"."""
    if s != 0 and abs(s) < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.0f} us"
    if abs(s) < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def format_bandwidth(bps: float) -> str:
    """Bytes/s as people quote links: 125e6 -> "1 Gbit/s (125.0 MB/s)"; inf -> "unlimited"."""
    if math.isinf(bps):
        return "unlimited"
    bits = bps * 8
    value, unit = bits, "bit"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(bits) >= scale:
            value, unit = bits / scale, prefix + "bit"
            break
    return f"{value:.3g} {unit}/s ({format_bytes(bps)}/s)"


# ---------------------------------------------------------------------------------------------
# The link model and its emulation.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkModel:
    """One direction of a link under the alpha-beta model (every link is full duplex)."""

    latency: float = 0.0  # alpha: seconds from the last byte leaving to it arriving, per message
    bandwidth: float = math.inf  # B: bytes/s per direction; inf = no bandwidth limit
    # The --timeout of the links this model paces: a frame whose message_time exceeds it could
    # never arrive in time, so LinkEmulator.schedule refuses it (LinkTooSlow) instead of sleeping
    # past every deadline of the receiver. inf: no such bound (a bare model, tests, benchmarks).
    timeout: float = math.inf

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency) and 0 <= self.latency <= MAX_SECONDS):
            raise ValueError(
                f"latency must be finite, >= 0 and <= {MAX_SECONDS:.0e} seconds, got "
                f"{self.latency!r}"
            )
        if not self.bandwidth > 0:  # also rejects NaN
            raise ValueError(f"bandwidth must be > 0 bytes/s (or inf), got {self.bandwidth!r}")
        if not self.timeout > 0:  # also rejects NaN
            raise ValueError(f"timeout must be > 0 seconds (or inf), got {self.timeout!r}")

    @property
    def enabled(self) -> bool:
        """Whether this link is slower than an ideal one (otherwise emulation is skipped)."""
        return self.latency > 0 or math.isfinite(self.bandwidth)

    def message_time(self, nbytes: int) -> float:
        """Seconds for one message of `nbytes` on an idle link."""
        # alpha + b / B  (the alpha-beta model; b / inf == 0 for an unlimited link)
        return self.latency + nbytes / self.bandwidth

    @classmethod
    def from_strings(
        cls, latency: str | None, bandwidth: str | None, timeout: float = math.inf
    ) -> LinkModel:
        """Model from command-line text, e.g. from_strings("50us", "1Gbit"); None = ideal.
        `timeout`: the links' --timeout, which no single frame may exceed (see `timeout`)."""
        return cls(
            latency=0.0 if latency is None else parse_latency(latency),
            bandwidth=math.inf if bandwidth is None else parse_bandwidth(bandwidth),
            timeout=timeout,
        )

    def __str__(self) -> str:
        return (
            f"latency {format_seconds(self.latency)}, bandwidth {format_bandwidth(self.bandwidth)}"
        )


def frame_problem(
    model: LinkModel, nbytes: int, timeout: float, what: str = "a frame"
) -> str | None:
    """None when one message of `nbytes` crosses an idle link of `model` within `timeout`
    seconds; otherwise the sentence that says so, naming the frame, the link and the timeout.

    Why an error and not a slow run: every wait on a peer gives up after --timeout without
    data, and an emulated frame holds its receiver (wait_until) for its whole message_time, so a
    frame slower than the timeout can only end in a timeout that blames a healthy peer."""
    seconds = model.message_time(nbytes)  # alpha + b / B
    if seconds <= timeout:
        return None
    return (
        f"{what} of {format_bytes(nbytes)} takes {format_seconds(seconds)} on the emulated link "
        f"(--latency {format_seconds(model.latency)}, --bandwidth "
        f"{format_bandwidth(model.bandwidth)}), more than --timeout {timeout:g} s, so it "
        f"could never arrive in time; {too_slow_advice(model.latency, seconds - model.latency)}"
    )


def too_slow_advice(latency_s: float, serialization_s: float) -> str:
    """What to change when a frame is too slow: the larger of its two terms (the latency
    alpha, the serialization b / B), then the timeout."""
    if serialization_s >= latency_s:
        return "raise --bandwidth (1Gbit, not 1Kbit?), or raise --timeout"
    return "lower --latency (50us, not 50s?), or raise --timeout"


def LinkTooSlow(message: str):  # noqa: N802 - reads as the exception it makes
    """The CommError of a frame slower than its link's timeout (comm/transport.py defines
    CommError and imports this module, hence the late import). A CommError: a worker reports
    it in one line, and the job stops instead of sleeping past every deadline."""
    from pipesgd_ref.comm.transport import CommError

    return CommError(message, origin=None)


class LinkEmulator:
    """Sender-side pacing of ONE direction of one link. Used by exactly one sending thread.

    The wire is a single server: a message departs when both it and the wire are ready, holds the
    wire for b / B seconds, and arrives `latency` after its last byte left. `schedule` returns that
    arrival time; the caller sends the real bytes at once, and the receiver `wait_until`s it.
    """

    def __init__(
        self,
        model: LinkModel,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        self._clock = clock
        self._sleep = sleep
        # The time the last scheduled byte leaves the wire; -inf: the wire has never been used.
        self.wire_free = -math.inf

    def free_now(self) -> bool:
        """True when `schedule` would not wait: no emulation, or the wire is idle."""
        return not self.model.enabled or self.wire_free <= self._clock()

    def schedule(self, nbytes: int) -> float:
        """Wait while the wire is busy, book it for `nbytes`; return the arrival time (clock()).

        Returns 0.0 ("not emulated") at once for an ideal link, without reading the clock.
        """
        model = self.model
        if not model.enabled:
            return 0.0
        if model.message_time(nbytes) > model.timeout:
            # A frame on the wire honours the timeout: refuse it now rather than book (and make
            # the receiver sleep) longer than any peer waits. check_link_against_timeout
            # (config.py) finds this before a run starts; this is the guard of every frame.
            raise LinkTooSlow(frame_problem(model, nbytes, model.timeout))
        now = self._clock()
        depart = max(now, self.wire_free)
        if depart > now:
            # Backpressure: the previous message still occupies the wire, as a full socket
            # buffer would block a real sender.
            self._sleep(depart - now)
        # Book the wire from the *scheduled* departure, not from the clock after the sleep: an
        # oversleep then shortens the next wait instead of drifting the whole timeline.
        self.wire_free = depart + nbytes / model.bandwidth  # serialization: b / B
        # alpha after the last byte left; the next message may serialize during this latency.
        return self.wire_free + model.latency


def wait_until(
    deliver_at: float,
    max_wait: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Receiver side: sleep until `deliver_at` (a sender's clock() time); return seconds slept.

    deliver_at == 0.0 means "not emulated" and returns at once. Never sleeps longer than
    `max_wait`: a sender on another host has another monotonic clock, and a bogus deliver_at
    must not stall the receiver.
    """
    if deliver_at == 0.0:
        return 0.0
    if max_wait < 0:
        raise ValueError(f"max_wait must be >= 0 seconds, got {max_wait!r}")
    delay = min(deliver_at - clock(), max_wait)
    if delay <= 0:
        return 0.0  # already arrived: the real transfer took longer than the emulated one
    sleep(delay)
    return delay
