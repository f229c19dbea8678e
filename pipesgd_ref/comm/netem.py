"""Link emulation: make one machine behave like a cluster with a chosen network.

On one machine every worker talks over loopback, which moves gigabytes per second with a few
microseconds of latency: far from the 1-10 Gbit/s Ethernet of the paper's cluster, so
communication would look free and Pipe-SGD would have nothing to hide. This module slows each
link down to a chosen latency `alpha` and `bandwidth` B, so the timing models
(timing/iteration.py) can be checked against measurements on a laptop.

Each direction of a link is the standard alpha-beta link (`LinkSpec`):

    message_time(b) = alpha + b / B          (seconds for one message of b bytes)

Links are full duplex: each direction of each link has its own `LinkEmulator`, so a rank can
send to its right neighbour while receiving from its left one at full bandwidth both ways.
A parameter server is the exception: its p links are one network card, one wire each way
(`ServerNIC`), or the emulation would give it p times the bandwidth of one NIC.
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
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import CommError
from pipesgd_ref.units import (
    MAX_SECONDS,
    format_bandwidth,
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_latency,
)

__all__ = [
    "LinkEmulator",
    "LinkSpec",
    "LinkTooSlow",
    "ServerNIC",
    "frame_problem",
    "link_of",
    "too_slow_advice",
    "wait_until",
]

# ---------------------------------------------------------------------------------------------
# The link and its emulation.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSpec:
    """One direction of an emulated link: its latency alpha and bandwidth B (every link is
    full duplex), and the timeout no single frame on it may exceed."""

    latency: float = 0.0  # alpha: seconds from the last byte leaving to it arriving, per message
    bandwidth: float = math.inf  # B: bytes/s per direction; inf = no bandwidth limit
    # The --timeout of the links this spec paces: a frame whose message_time exceeds it could
    # never arrive in time, so LinkEmulator.schedule refuses it (LinkTooSlow) instead of sleeping
    # past every deadline of the receiver. inf: no such bound (a bare spec, tests, benchmarks).
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
    ) -> LinkSpec:
        """The link of command-line text, e.g. from_strings("50us", "1Gbit"); None = ideal.
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


def link_of(cfg: TrainConfig) -> LinkSpec:
    """The emulated link of a run: cfg.latency and cfg.bandwidth, bounded by cfg.timeout (every
    frame slower than that is refused when it is sent, LinkEmulator.schedule). The one place a
    config's link is parsed; ValueError on text that is no latency or bandwidth."""
    return LinkSpec.from_strings(cfg.latency, cfg.bandwidth, timeout=cfg.timeout)


def frame_problem(link: LinkSpec, nbytes: int, timeout: float, what: str = "a frame") -> str | None:
    """None when one message of `nbytes` crosses an idle `link` within `timeout`
    seconds; otherwise the sentence that says so, naming the frame, the link and the timeout.

    Why an error and not a slow run: every wait on a peer gives up after --timeout without
    data, and an emulated frame holds its receiver (wait_until) for its whole message_time, so a
    frame slower than the timeout can only end in a timeout that blames a healthy peer."""
    seconds = link.message_time(nbytes)  # alpha + b / B
    if seconds <= timeout:
        return None
    return (
        f"{what} of {format_bytes(nbytes)} takes {format_seconds(seconds)} on the emulated link "
        f"(--latency {format_seconds(link.latency)}, --bandwidth "
        f"{format_bandwidth(link.bandwidth)}), more than --timeout {timeout:g} s, so it "
        f"could never arrive in time; {too_slow_advice(link.latency, seconds - link.latency)}"
    )


def too_slow_advice(latency_s: float, serialization_s: float) -> str:
    """What to change when a frame is too slow: the larger of its two terms (the latency
    alpha, the serialization b / B), then the timeout."""
    if serialization_s >= latency_s:
        return "raise --bandwidth (1Gbit, not 1Kbit?), or raise --timeout"
    return "lower --latency (50us, not 50s?), or raise --timeout"


def LinkTooSlow(message: str):  # noqa: N802 - reads as the exception it makes
    """The CommError of a frame slower than its link's timeout: a worker reports it in one
    line, and the job stops instead of sleeping past every deadline."""

    return CommError(message, origin=None)


class LinkEmulator:
    """Sender-side pacing of ONE direction of one link. Used by exactly one sending thread.

    The wire is a single server: a message departs when both it and the wire are ready, holds the
    wire for b / B seconds, and arrives `latency` after its last byte left. `schedule` returns that
    arrival time; the caller sends the real bytes at once, and the receiver `wait_until`s it.
    """

    def __init__(
        self,
        link: LinkSpec,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.link = link
        self._clock = clock
        self._sleep = sleep
        # The time the last scheduled byte leaves the wire; -inf: the wire has never been used.
        self.wire_free = -math.inf

    def free_now(self) -> bool:
        """True when `schedule` would not wait: no emulation, or the wire is idle."""
        return not self.link.enabled or self.wire_free <= self._clock()

    def schedule(self, nbytes: int) -> float:
        """Wait while the wire is busy, book it for `nbytes`; return the arrival time (clock()).

        Returns 0.0 ("not emulated") at once for an ideal link, without reading the clock.
        """
        link = self.link
        if not link.enabled:
            return 0.0
        if link.message_time(nbytes) > link.timeout:
            # A frame on the wire honours the timeout: refuse it now rather than book (and make
            # the receiver sleep) longer than any peer waits. check_link_against_timeout
            # (runtime/preflight.py) finds this before a run starts; this guards every frame.
            problem = frame_problem(link, nbytes, link.timeout)
            assert problem is not None  # the frame takes longer than the timeout
            raise LinkTooSlow(problem)
        now = self._clock()
        depart = max(now, self.wire_free)
        if depart > now:
            # Backpressure: the previous message still occupies the wire, as a full socket
            # buffer would block a real sender.
            self._sleep(depart - now)
        # Book the wire from the *scheduled* departure, not from the clock after the sleep: an
        # oversleep then shortens the next wait instead of drifting the whole timeline.
        self.wire_free = depart + nbytes / link.bandwidth  # serialization: b / B
        # alpha after the last byte left; the next message may serialize during this latency.
        return self.wire_free + link.latency


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


# ---------------------------------------------------------------------------------------------
# The parameter server's network card: p links, one wire each way.
# ---------------------------------------------------------------------------------------------


class ServerNIC:
    """The parameter server's network card under link emulation: one wire in, one wire out.

    Why: each Link (comm/links.py) paces only its own direction, so p emulated client links would
    give the server p times the bandwidth of one NIC and hide exactly the bottleneck of a
    parameter server (its one link carries p pushes in and p pulls out per round).

    Out: every client link sends through one shared LinkEmulator (the server is one thread,
    which is all a LinkEmulator asks). In: a push's sender paced it on its own link only, so
    after it arrives it is queued once more on the server's ingress wire:

        start  = max(departure on the worker's link, when the ingress wire is free)
        arrive = start + b / B + alpha            # the push is usable only then

    where departure = deliver_at - (alpha + b / B) undoes the sender's own link time. Pushes
    take the wire in the order they departed, as on a real card: ps-async reads them in that
    order (whichever link is readable first); ps-sync reads them in worker order (its sum must
    be in that order), so `arrive_in_round` places each among every push of the round that
    departed before it (`departure`), read or not: a worker that pushes last must not hold up
    on the emulated wire the pushes that left before it.

    `links`: the server's Links (each with its LinkSpec `spec` and `emulator`), in worker
    order; `header_bytes`: the frame header every message carries (wire.HEADER_BYTES). A frame
    here is a wire.Frame: its `nbytes` (payload) and `deliver_at` are read.
    """

    def __init__(self, links: list, header_bytes: int):
        # Every client link has the same spec; without links, an ideal one (never emulated).
        self.link: LinkSpec = links[0].spec if links else LinkSpec()
        self.enabled = bool(links) and self.link.enabled
        self.header_bytes = header_bytes
        self.ingress_free = -math.inf
        self.round_end: float | None = None  # where the ingress wire is free after a round
        self.n_links = len(links)
        self.egress = LinkEmulator(self.link) if self.enabled else None
        if self.enabled:
            for link in links:
                link.emulator = self.egress  # the pulls share the server's one outgoing wire

    def book(self, n_messages: int, nbytes: int) -> float:
        """Book the outgoing wire for `n_messages` payloads of `nbytes` sent at once, sharing
        it: equal messages sharing a wire fairly all arrive together, when the last byte has
        crossed. Returns that emulated arrival time (0.0 when not emulated), once only one
        message's own link time is left, so that no receiver waits longer on a frame than one
        message takes (its wait is capped at that, plus a margin)."""
        if not self.enabled:
            return 0.0
        size = nbytes + self.header_bytes
        assert self.egress is not None  # enabled
        arrive = self.egress.schedule(n_messages * size)
        one = self.link.message_time(size)
        wait_until(arrive - one, max_wait=n_messages * one + 1.0)
        return arrive

    def wire_time(self, frame) -> float:
        """b / B of a frame on the ingress wire, header included."""
        return (frame.nbytes + self.header_bytes) / self.link.bandwidth

    def departure(self, frame) -> float:
        """When a push left its worker: its deliver_at less its own link's alpha + b / B."""
        return frame.deliver_at - self.link.latency - self.wire_time(frame)

    def arrive(self, frame) -> None:
        """Wait until `frame` (its payload already read) has crossed the ingress wire, queued
        behind the pushes read before it (ps-async: read in the order they departed)."""
        if not self.enabled or not frame.deliver_at:
            return
        self.ingress_free = max(self.departure(frame), self.ingress_free) + self.wire_time(frame)
        self._wait(frame, self.ingress_free + self.link.latency)

    def arrive_in_round(self, frames: list, i: int) -> None:
        """Wait until push `frames[i]` (its payload already read) has crossed the ingress wire,
        queued behind every push of the round that departed before it (`round_arrival`)."""
        if self.enabled and frames[i].deliver_at:
            self._wait(frames[i], self.round_arrival(frames, i))

    def round_arrival(self, frames: list, i: int) -> float:
        """When push `frames[i]` has crossed the ingress wire: the round's pushes take the wire
        in the order they departed, from where the last round left it. `frames` holds the
        headers read so far (None: not yet); the caller has read every header that was
        readable, so every push that departed before push i is among them, and the pushes
        that depart later do not move its arrival. Once every header is known, the wire's
        booking to the round's end is kept for `end_round`."""
        free = self.ingress_free
        order = sorted((self.departure(f), j) for j, f in enumerate(frames) if f is not None)
        arrive = math.nan
        for departed, j in order:
            free = max(departed, free) + self.wire_time(frames[j])
            if j == i:
                arrive = free + self.link.latency
        if all(f is not None for f in frames):
            self.round_end = free
        return arrive

    def end_round(self) -> None:
        """The round's pushes have all crossed: the next round queues behind them."""
        if self.enabled and self.round_end is not None:
            self.ingress_free, self.round_end = self.round_end, None

    def _wait(self, frame, arrive: float) -> None:
        # At most every worker's push is queued ahead: a bogus deliver_at cannot stall us longer.
        one = self.link.message_time(frame.nbytes + self.header_bytes)
        wait_until(arrive, max_wait=self.n_links * one + 1.0)
