"""Parameter server: the server loop (sync and async) and the worker's client, over the star.

Roles (shared/PAPER.md section 1). A job of p workers has p + 1 ranks: rank 0 is a dedicated
server that holds the authoritative weights and never computes a gradient; ranks 1..p are the
workers (worker i = rank i + 1, so it draws minibatch (i, step) as the oracles' rank i does).
Every worker has one link to the server (`comm.server`); the server has one per worker
(`comm.clients[rank]`): the star of `init_process_group(spec, star=True)`.

Wire protocol: every message is one frame of transport.py (Kind.DATA, Op.NONE: a star link
carries nothing else, so the direction says what a frame is), after the start.

    start  worker -> server   Kind.CONTROL, JSON {ready: rank}: set up, ready for step 0
           server -> worker   Kind.CONTROL, JSON {start: true}, once every worker is ready
                              (ParameterServer.start_together, PSClient.wait_for_start): all
                              workers start step 0 at once, so the run's clock starts with
                              training, not while one worker is still setting up
    push   worker -> server   seq = version of the weights the gradient was computed on
                              src = the worker's rank, total_len = n (params),
                              part = the codec's id (index in codecs.CODECS; 0 = none)
                              codec none: dtype float32, payload n + 1 elements, the gradient,
                              then the worker's minibatch loss (so the server can report the
                              loss of every update without a second message per push)
                              codec trunc16 / bf16 / q8: dtype uint8, payload
                                  [codec.encode(gradient): codec.wire_bytes(n) bytes]
                                  [loss: 4 bytes, float32, native (little-endian) order]
                              the loss is never encoded: it travels exactly as with none
    pull   server -> worker   seq = version of the weights (= updates applied so far)
                              src = 0, total_len = n (params),
                              part = the pull codec's id (index in codecs.CODECS; 0 = none)
                              pull codec none: dtype of the weights, payload the n weights,
                              received straight into the worker's parameter buffer
                              pull codec trunc16 / bf16 / q8: dtype uint8, payload
                                  [pull_codec.encode(weights): pull_codec.wire_bytes(n) bytes]
                              received into a code buffer, then decoded into the worker's
                              parameter buffer
    abort  server -> worker   Kind.ABORT, JSON {origin, reason}: the server failed (a worker
                              died, hung, or sent a bad frame); every worker still waiting
                              raises PeerAborted naming the rank at fault

Both sides check every header (kind, version, dtype, length, codec) before reading its payload,
so a worker that is out of step (or encodes with another codec) gets an error naming it, and a
worker that expects another pull codec than the server sends gets one naming the server (rank
0), never wrong numbers.

Compressed pushes (--codec, shared/PAPER.md section 3). The pushes are compressed with --codec;
the pulls stay full-precision unless --codec-pull says otherwise (below). A worker applies error
feedback (--error-feedback, before encoding: Worker.feed_back), then encodes its whole
gradient as one code. The server decodes every push: ps-sync decode-adds each into the float32
sum in worker order (codec.add_decoded_into, which is bitwise `sum += decode(codes)`), then
divides by p; ps-async decodes into one buffer and applies it. The oracle is therefore the
uncompressed one with every worker's gradient replaced by decode(encode(gradient)), bitwise.

Compressed pulls (--codec-pull, float32 weights only). The server encodes its whole weight
vector as one code per pull message (q8: so ONE scale, max|w| / 127, for the whole vector; no
per-layer or per-chunk scales), and each worker decodes it into its parameter buffer and computes
its next gradient on decode(encode(w)). The encoding is computed once per version and shared by
every pull of that version (ps-sync: once per step for the p pulls; the codecs here are
deterministic, so that is the same bytes as one encode per message). The server keeps and
updates its own full-precision weights: they are the answer, and every update is applied to
them exactly (w <- w - lr * g), never to decoded weights. Workers start on the exact w_0 built
from the seed (nothing is pulled before step 0), so the oracle is the one above with every
gradient after a worker's first computed on decode(encode(w)) of the weights it pulled. A pull
shrinks from 4n to wire_bytes(n) bytes (+ 48 header).

Schedules.

    ps-sync, step t (version t):
        every worker:  g_i = grad f(w_t; minibatch (i, t));  push(g_i, seq=t);  pull(w_{t+1})
        server:        avg = (g_0 + g_1 + ... + g_{p-1}) / p   # received and summed in worker
                                                                 # order: reference.average_gradient
                       w_{t+1} = w_t - lr_t * avg;  pull to every worker (seq = t + 1)
    ps-async, in arrival order (version u = updates applied so far):
        every worker:  loop: g = grad f(w_v; next own minibatch); push(g, seq=v); pull(w, v')
        server:        whichever push arrives first: staleness = u - v (updates applied since
                       that worker pulled), w <- w - lr_u * g, u <- u + 1, pull to that worker
                       only (seq = u); stop after p * steps updates.
    The recorded arrival order, replayed by reference.async_ps_sgd, gives the same weights and
    the same staleness list: that is the oracle.

Cost (alpha-beta, shared/PAPER.md section 3; M = 4n bytes, plus 48 header bytes a frame).
The server's one link carries p * M in (pushes) and p * M out (pulls) per round, so it is the
bottleneck as p grows. With a codec of ratio r a push is wire_bytes(n) + 4 ~ M / r bytes: in
the formulas below each push's M becomes M / r (e.g. (p + 1) M / B reads p M / B + M / (r B)),
the pulls' M stays 4n (with --codec-pull of ratio r', M / r' too), and the server's t_u gains p
decode passes (plus one encode per version with --codec-pull; each worker one decode per pull).
PAPER.md writes the sync round as two separate phases, all pushes in, then all pulls out:

    ps-sync (phases):     T_it = t_c + 2 alpha + 2 p M / B + p M gamma + t_u

That is what a server pays when all p pulls finish together (p flows sharing its link fairly).
This server sends the pulls one after another, so worker 0 has its weights after M / B, computes
and pushes while the other pulls are still going out, and the full-duplex link takes that push
in meanwhile: only the last worker's pull, compute and push are on the critical path:

    ps-sync (this code):  T_it = t_c + 2 alpha + (p + 1) M / B + p M gamma + t_u

`pulls="shared"` (--ps-pulls=shared) sends the p pulls of a version all at once instead, as a
server answering every worker's request at the same time over one NIC does (the conventional
server, and PAPER.md's model): they share the link, so all arrive together after p M / B, all
workers compute at once, and their p pushes queue on the ingress wire for p M / B more:

    ps-sync (shared):     T_it = t_c + 2 alpha + 2 p M / B + p M gamma + t_u
    ps-async:             rate = min(p / (t_c + 2 alpha + 2 M / B),  B / M)   updates/s

(measured under emulation: tests/test_ps.py. With full-duplex links the push of one update and
the pull of another overlap, so the server's async bound is B / M; PAPER.md section 3 writes
B / (2M), the figure for a half-duplex link.)

Link emulation. Each transport Link paces only its own direction, so p emulated client links
would give the server p times the bandwidth of one NIC and hide exactly the bottleneck above.
`ServerNIC` makes the server's links share one wire each way: its pulls share one sender-side
LinkEmulator, and its pushes are re-timed on arrival through one ingress queue, in the order
they left their workers (ps-sync reads them in worker order, for its sum, but a worker that
pushes last must not hold up on the emulated wire the pushes that left before it).
"""

from __future__ import annotations

import logging
import math
import select
import selectors
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from pipesgd_ref.comm.netem import LinkEmulator, wait_until
from pipesgd_ref.comm.transport import (
    ABORT_LINGER_SECONDS,
    CODE_OF_DTYPE,
    HEADER_BYTES,
    POLL_SECONDS,
    Frame,
    Kind,
    Link,
    Op,
    as_bytes,
)
from pipesgd_ref.errors import (
    CollectiveMismatch,
    CommError,
    PeerAborted,
    PeerTimeout,
    ProtocolError,
)
from pipesgd_ref.logs import trace

log = logging.getLogger("pipesgd.ps")

# A worker waits this much longer than the server does on any one worker, so that when a worker
# hangs, the server's verdict (an ABORT naming it) reaches the others before they give up on the
# server themselves (in ps-sync every worker's pull waits for the slowest worker's push).
VERDICT_MARGIN_S = 2.0
_CODES = CODE_OF_DTYPE[np.dtype(np.uint8)]  # header dtype of codes (compressed pushes, pulls)

# How ps-sync's server sends the p pulls of a version over its one link (module docstring).
PULL_ORDERS = ("sequential", "shared")
Apply = Callable[[int, np.ndarray], None]  # apply(version, grads): update the weights in place
OnUpdate = Callable[[int, np.ndarray, float], None]  # (version, weights after it, loss)


def worker_of(rank: int) -> int:
    """Worker index of a rank: rank 0 is the server, worker i is rank i + 1."""
    return rank - 1


def _who(rank: int) -> str:
    return f"worker {worker_of(rank)} (rank {rank})"


@dataclass
class ServerLog:
    """What the server saw: one entry per applied update, in the order applied."""

    arrival_order: list[int] = field(default_factory=list)  # worker index of each gradient
    staleness: list[int] = field(default_factory=list)  # updates since that worker's pull
    losses: list[float] = field(default_factory=list)  # the loss that came with the push(es)
    update_end: list[float] = field(default_factory=list)  # perf_counter after the pull(s)
    # --skip-nonfinite: (ps-sync step or ps-async update, [ranks]) of the pushes left out
    skipped: list[tuple[int, list[int]]] = field(default_factory=list)


class ServerNIC:
    """The server's network card under link emulation: one wire in, one wire out.

    Out: every client link sends through one shared LinkEmulator (the server is one thread,
    which is all a LinkEmulator asks). In: a push's sender paced it on its own link only, so
    after it arrives it is queued once more on the server's ingress wire:

        start  = max(departure on the worker's link, when the ingress wire is free)
        arrive = start + b / B + alpha            # the push is usable only then

    where departure = deliver_at - (alpha + b / B) undoes the sender's own link time. Pushes
    take the wire in the order they departed, as on a real card: ps-async reads them in that
    order (whichever link is readable first); ps-sync reads them in worker order (its sum must
    be in that order), so `arrive_in_round` places each among every push of the round that
    departed before it (`departure`), read or not.
    """

    def __init__(self, links: list[Link]):
        self.model = links[0].model if links else None
        self.enabled = bool(links) and self.model.enabled
        self.ingress_free = -math.inf
        self.round_end: float | None = None  # where the ingress wire is free after a round
        self.n_links = len(links)
        self.egress = LinkEmulator(self.model) if self.enabled else None
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
        size = nbytes + HEADER_BYTES
        arrive = self.egress.schedule(n_messages * size)
        one = self.model.message_time(size)
        wait_until(arrive - one, max_wait=n_messages * one + 1.0)
        return arrive

    def wire_time(self, frame: Frame) -> float:
        """b / B of a frame on the ingress wire, header included."""
        return (frame.nbytes + HEADER_BYTES) / self.model.bandwidth

    def departure(self, frame: Frame) -> float:
        """When a push left its worker: its deliver_at less its own link's alpha + b / B."""
        return frame.deliver_at - self.model.latency - self.wire_time(frame)

    def arrive(self, frame: Frame) -> None:
        """Wait until `frame` (its payload already read) has crossed the ingress wire, queued
        behind the pushes read before it (ps-async: read in the order they departed)."""
        if not self.enabled or not frame.deliver_at:
            return
        self.ingress_free = max(self.departure(frame), self.ingress_free) + self.wire_time(frame)
        self._wait(frame, self.ingress_free + self.model.latency)

    def arrive_in_round(self, frames: list[Frame | None], i: int) -> None:
        """Wait until push `frames[i]` (its payload already read) has crossed the ingress wire,
        queued behind every push of the round that departed before it (`round_arrival`)."""
        if self.enabled and frames[i].deliver_at:
            self._wait(frames[i], self.round_arrival(frames, i))

    def round_arrival(self, frames: list[Frame | None], i: int) -> float:
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
                arrive = free + self.model.latency
        if all(f is not None for f in frames):
            self.round_end = free
        return arrive

    def end_round(self) -> None:
        """The round's pushes have all crossed: the next round queues behind them."""
        if self.enabled and self.round_end is not None:
            self.ingress_free, self.round_end = self.round_end, None

    def _wait(self, frame: Frame, arrive: float) -> None:
        # At most every worker's push is queued ahead: a bogus deliver_at cannot stall us longer.
        max_wait = self.n_links * self.model.message_time(frame.nbytes + HEADER_BYTES) + 1.0
        wait_until(arrive, max_wait=max_wait)


class ParameterServer:
    """Rank 0's loop: receive pushes, update the weights, send pulls.

    `params` is the authoritative weight vector; `apply(version, grads)` updates it in place
    (the algorithm's optimizer step). `codec` (pipesgd_ref.codecs, or None for none): how the
    workers encode their pushes. `pull_codec` (likewise): how the server encodes the weights it
    pulls back (whole vector, one code; `params` stays full precision). The server never
    allocates in its loop: one receive buffer (n + 1 elements, or the codes and the loss), for
    sync one sum buffer, with a codec one decode buffer, and with a pull codec one code buffer.
    """

    def __init__(
        self,
        clients: dict[int, Link],
        params: np.ndarray,
        timeline=None,
        codec=None,
        pull_codec=None,
        pulls: str = "sequential",
        skip_nonfinite: bool = False,
    ):
        if pulls not in PULL_ORDERS:
            raise ValueError(f"pulls must be one of {', '.join(PULL_ORDERS)}, got {pulls!r}")
        self.pulls = pulls
        self.skip_nonfinite = skip_nonfinite  # leave out pushes with NaN/Inf (else: workers
        # check their own gradient before pushing, and stop the job naming themselves)
        if not clients:
            raise CommError(
                "rank 0: no worker links; a parameter server job needs world_size >= 2 and "
                "the star links (launch_local(..., star=True))"
            )
        if params.dtype not in CODE_OF_DTYPE or params.ndim != 1:
            raise ValueError(f"params must be a flat float32/float64 array, got {params.dtype}")
        self.links = [clients[r] for r in sorted(clients)]  # index = worker index
        self.n_workers = len(self.links)
        self.params = params
        self.n = params.size
        self.dtype_code = CODE_OF_DTYPE[params.dtype]
        self.timeline = timeline or _NoTimeline()  # trace.Timeline, or none
        self.codec, self.codec_id = _codec_and_id(codec, params.dtype)
        # recv_buf: one push, as it arrives; grads: the pushed gradient as float32 values (a
        # view of recv_buf without a codec, a decode buffer with one); loss_buf: the loss.
        self.recv_buf, self.grads, self.loss_buf, self.codes = _push_buffers(
            self.n, params.dtype, self.codec
        )
        self.push_code = CODE_OF_DTYPE[self.recv_buf.dtype]
        # Pulls: the weights themselves, or (pull codec) their codes, encoded once per version.
        self.pull_codec, self.pull_codec_id = _codec_and_id(pull_codec, params.dtype)
        self.pull_codes = _pull_codes(self.n, self.pull_codec)
        self.pull_code = self.dtype_code if self.pull_codes is None else _CODES
        self._encoded_version: int | None = None  # the version now in pull_codes
        self.nic = ServerNIC(self.links)
        self.log = ServerLog()
        self._sending_to: Link | None = None  # a failure mid-send leaves this link half-sent

    # --- one push, one pull --------------------------------------------------------------
    def _recv_push(
        self, link: Link, version: int, phase: str, round_frames: list | None = None
    ) -> float:
        """Receive one push from `link` into recv_buf; its loss. ps-sync passes the headers of
        its round read so far (`round_frames`, indexed by worker, this push's among them):
        the push then waits for its emulated arrival behind every push of the round that
        departed before it; otherwise behind the pushes read before it."""
        doing = f"{phase} (the push of worker {worker_of(link.peer)})"
        i = self.links.index(link) if round_frames else None
        frame = round_frames[i] if round_frames else self._push_header(link, version, phase)
        with self.timeline.span("recv", "server", version):
            link.recv_payload_into(frame, as_bytes(self.recv_buf), doing)  # checks nbytes
            if round_frames:
                self.nic.arrive_in_round(round_frames, i)
            else:
                self.nic.arrive(frame)
        trace("%s | rank %d -> 0 | push of version %d | %d bytes", phase, link.peer, version,
              frame.nbytes)  # fmt: skip
        return float(self.loss_buf[0])

    def _push_header(self, link: Link, version: int, phase: str) -> Frame:
        """Read and check the header of one push from `link` (its payload stays unread)."""
        doing = f"{phase} (the push of worker {worker_of(link.peer)})"
        frame = link.recv_header(doing)
        if frame.kind != Kind.DATA:
            raise ProtocolError(
                f"rank 0: expected a push from {_who(link.peer)} during {doing}, got a "
                f"{Kind(frame.kind).name} frame",
                origin=link.peer,
            )
        got = (frame.seq, frame.dtype, frame.total_len, frame.part)
        if got != (version, self.push_code, self.n, self.codec_id):
            raise CollectiveMismatch(
                f"rank 0: {_who(link.peer)} pushed a gradient of {frame.total_len} elements "
                f"(dtype code {frame.dtype}, codec {_codec_name(frame.part)}) computed on "
                f"version {frame.seq} during {doing}; the server expected {self.n} elements "
                f"(code {self.push_code}, codec {_codec_name(self.codec_id)}) on version "
                f"{version}: are both running the same model, method and codec?",
                origin=link.peer,
            )
        return frame

    def _read_started_headers(self, frames: list[Frame | None], version: int, phase: str) -> None:
        """Read the header of every push of this round that has begun to arrive (its link is
        readable): those pushes departed already, so they go onto the ingress wire before any
        push that departs later (ServerNIC.arrive_in_round). Only under link emulation."""
        if not self.nic.enabled:
            return
        waiting = [i for i, f in enumerate(frames) if f is None]
        if not waiting:
            return
        readable, _, _ = select.select([self.links[i].sock for i in waiting], [], [], 0)
        for i in waiting:
            if self.links[i].sock in readable:
                frames[i] = self._push_header(self.links[i], version, phase)

    def _pull_payload(self, version: int) -> np.ndarray:
        """What a pull of `version` carries: the weights, or (pull codec) their codes."""
        if self.pull_codec is None:
            return self.params
        if self._encoded_version != version:  # one encode per version, whole vector
            self.pull_codec.encode(self.params, self.pull_codes)
            self._encoded_version = version
        return self.pull_codes

    def _send_pull(
        self, link: Link, version: int, phase: str, deliver_at: float | None = None
    ) -> None:
        doing = f"{phase} (the pull of worker {worker_of(link.peer)})"
        payload = self._pull_payload(version)
        frame = Frame(kind=Kind.DATA, op=Op.NONE, dtype=self.pull_code, seq=version, src=0,
                      part=self.pull_codec_id, total_len=self.n)  # fmt: skip
        self._sending_to = link
        link.send(frame, as_bytes(payload), doing, deliver_at=deliver_at)
        self._sending_to = None
        trace("%s | rank 0 -> %d | pull of version %d | %d bytes", phase, link.peer, version,
              payload.nbytes)  # fmt: skip

    # --- the two schedules ---------------------------------------------------------------
    def start_together(self) -> None:
        """Wait until every worker has said it is ready (PSClient.wait_for_start), then tell
        them all to start: the job's clock starts with training on every worker, not while
        one of them is still setting up."""
        with self._aborting_on_error():
            for link in self.links:
                link.recv_json(Kind.CONTROL, f"the start (is {_who(link.peer)} ready?)")
            for link in self.links:
                link.send_json(Kind.CONTROL, {"start": True}, "the start")

    def run_sync(
        self,
        steps: int,
        apply: Apply,
        on_update: OnUpdate | None = None,
        start: int = 0,
        entering: Callable[[int], bool] | None = None,
    ) -> ServerLog:
        """ps-sync: every step, all p pushes, one averaged update, p pulls; steps start ..
        steps - 1 (start > 0: a resumed run, whose weights are the checkpoint's w_start).
        entering(t), when given, is asked before round t: False ends the run there (a stop
        signal, on which the workers agree: lifetime.py)."""
        total = np.empty(self.n, self.params.dtype)  # preallocated: the loop allocates nothing
        self._encoded_version = None  # a run starts with no codes (versions restart at 1)
        with self._aborting_on_error():
            for t in range(start, steps):
                if entering is not None and not entering(t):
                    break
                phase = f"ps-sync step {t}"
                total.fill(0)
                loss = 0.0
                # The sum in worker order 0..p-1, as reference.average_gradient sums ranks:
                # the same additions in the same order give bitwise the oracle's average
                # (with a codec: of the decoded gradients; decode-add is `+= decode(codes)`).
                bad = []
                # Headers first, where pushes have begun to arrive: the emulated ingress wire
                # takes the pushes in the order they departed, not the order summed.
                frames: list[Frame | None] = [None] * self.n_workers
                for i, link in enumerate(self.links):
                    frames[i] = frames[i] or self._push_header(link, t, phase)
                    self._read_started_headers(frames, t, phase)
                    push_loss = self._recv_push(link, t, phase, frames)
                    if self.skip_nonfinite and not self._push_finite(push_loss):
                        bad.append(link.peer)  # left out of the sum and of the mean
                        continue
                    loss += push_loss
                    if self.codec is None:
                        total += self.grads
                    elif self.skip_nonfinite:  # decoded already, to be checked
                        total += self.grads  # bitwise add_decoded_into
                    else:
                        self.codec.add_decoded_into(self.codes, total)
                self.nic.end_round()
                good = self.n_workers - len(bad)  # all left out: total stays 0, no change
                total /= max(good, 1)
                loss = loss / good if good else math.nan
                if bad:
                    self._skip(t, bad)
                with self.timeline.span("server", "server", t):
                    apply(t, total)  # w_{t+1} = w_t - lr_t * avg: the sync point of the job
                    # p * M out over the server's one link: one after another, or all at
                    # once sharing it (every pull then arrives when the last byte has left)
                    at = None
                    if self.pulls == "shared":
                        nbytes = self._pull_payload(t + 1).nbytes
                        at = self.nic.book(self.n_workers, nbytes)
                    for link in self.links:
                        self._send_pull(link, t + 1, phase, deliver_at=at)
                self._record(None, 0, loss)
                if on_update is not None:
                    on_update(t, self.params, loss)
        return self.log

    def run_async(
        self,
        pushes_per_worker: int,
        apply: Apply,
        on_update: OnUpdate | None = None,
        start: int = 0,
        stop_at: Callable[[], int | None] | None = None,
    ) -> ServerLog:
        """ps-async: apply each push the moment it arrives; pull back to its worker only.
        start > 0: a resumed run, whose weights are a checkpoint's after start * p updates;
        each worker then has pushes_per_worker - start pushes to go. stop_at(), when given,
        says the step no worker begins once a signal stopped the job (lifetime.py): each
        worker then pushes up to it, and no more is waited for."""
        p = self.n_workers
        left = [pushes_per_worker - start] * p  # pushes still to come from each worker
        version = start * p  # updates applied so far
        pulled = [version] * p  # version of the weights each worker holds (computes on)
        waiting_since = [time.monotonic()] * p  # when each worker got its weights
        selector = selectors.DefaultSelector()
        self._encoded_version = None
        with self._aborting_on_error(), selector:
            for i, link in enumerate(self.links):
                if left[i]:
                    selector.register(link.sock, selectors.EVENT_READ, i)
            stopping = False
            while any(left):
                if not stopping and stop_at is not None and (end := stop_at()) is not None:
                    stopping = True  # worker i runs steps start .. end - 1, and no more
                    for i, link in enumerate(self.links):
                        done = pushes_per_worker - start - left[i]
                        before = left[i]
                        left[i] = max(0, min(end, pushes_per_worker) - start - done)
                        if before and not left[i]:
                            selector.unregister(link.sock)
                    if not any(left):
                        break
                # Wait on every worker's link at once: whichever push comes first is applied
                # first (a link's bytes are read only by Link, so "readable" means a frame).
                ready = selector.select(timeout=POLL_SECONDS)
                for key, _ in ready:
                    i = key.data
                    link = self.links[i]
                    phase = f"ps-async update {version}"
                    loss = self._recv_push(link, pulled[i], phase)
                    staleness = version - pulled[i]  # updates applied since i pulled
                    applied = not self.skip_nonfinite or self._push_finite(loss)
                    with self.timeline.span("server", "server", version):
                        if applied:
                            if self.codec is not None and not self.skip_nonfinite:
                                self.codec.decode(self.codes, self.grads)
                            apply(version, self.grads)  # w <- w - lr_u * g, stale
                            version += 1
                        else:  # --skip-nonfinite: no update, its weights go back as they are
                            self._skip(version, [link.peer])
                        self._send_pull(link, version, phase)
                    pulled[i] = version
                    waiting_since[i] = time.monotonic()
                    left[i] -= 1
                    if not left[i]:
                        selector.unregister(link.sock)
                    if applied:
                        self._record(i, staleness, loss)
                        if on_update is not None:
                            on_update(version - 1, self.params, loss)
                self._check_silence(left, waiting_since, version)
        return self.log

    def _push_finite(self, loss: float) -> bool:
        """--skip-nonfinite: whether the push just received (and its loss) are finite; with a
        codec the push is decoded into self.grads first (the check needs values)."""
        if self.codec is not None:
            self.codec.decode(self.codes, self.grads)
        with np.errstate(over="ignore", invalid="ignore"):
            if math.isfinite(loss) and math.isfinite(float(np.add.reduce(self.grads))):
                return True
        return math.isfinite(loss) and bool(np.all(np.isfinite(self.grads)))  # an overflow?

    def _skip(self, when: int, ranks: list[int]) -> None:
        self.log.skipped.append((when, ranks))
        log.warning("rank 0: %s: NaN/Inf in the push of %s; left out (--skip-nonfinite)",
                    when, ", ".join(_who(r) for r in ranks))  # fmt: skip

    def _record(self, worker: int | None, staleness: int, loss: float) -> None:
        if worker is not None:
            self.log.arrival_order.append(worker)
            self.log.staleness.append(staleness)
        self.log.losses.append(loss)
        self.log.update_end.append(time.perf_counter())

    def _check_silence(self, left: list[int], waiting_since: list[float], version: int) -> None:
        """Async: a worker that died closes its link (readable: PeerClosed); one that hangs
        only falls silent, while the others go on. Each worker's push is due within the
        timeout of the moment it was sent its weights."""
        now = time.monotonic()
        for i, link in enumerate(self.links):
            if left[i] and now - waiting_since[i] > link.timeout:
                raise PeerTimeout(
                    f"rank 0: no push from {_who(link.peer)} for {link.timeout:.1f} s during "
                    f"ps-async (update {version}; it has {left[i]} pushes to go); is rank "
                    f"{link.peer} alive (stopped, hung, or overloaded)? raise --timeout to "
                    f"wait longer",
                    origin=link.peer,
                )

    # --- failure ---------------------------------------------------------------------------
    @contextmanager
    def _aborting_on_error(self):
        """On any error, tell every worker why before failing, so that each one's error names
        the rank at fault instead of only "rank 0 closed the connection"."""
        try:
            yield
        except Exception as error:
            self._abort_workers(error)
            raise

    def _abort_workers(self, error: BaseException) -> None:
        told = 0
        for link in self.links:
            if link is self._sending_to:
                continue  # a frame is stuck half-sent: another header would garble the stream
            told += link.send_abort(error, default_origin=0)
        if told:
            # Keep the sockets open a moment: closing one with unread pushes in it sends a
            # reset, which can reach a worker before (and instead of) the reason.
            time.sleep(ABORT_LINGER_SECONDS)


class PSClient:
    """A worker's end of the star: push (gradient, loss) to the server, pull the weights.

    Compute writes the gradient into `grads`. Without a codec, `grads` is a view of the push
    buffer whose last element carries the loss: the push goes out from that buffer with no copy.
    With a codec (pipesgd_ref.codecs, float32 only), push encodes `grads` into the push buffer,
    [codes: wire_bytes(n)][loss: float32], and sends that. Pulls are received straight into
    the caller's parameter buffer; with a `pull_codec` (float32 only) into a code buffer,
    then decoded into it (the worker then computes on decode(encode(w))).
    """

    def __init__(self, link: Link, n_params: int, dtype=np.float32, codec=None, pull_codec=None):
        self.link = link
        link.timeout += VERDICT_MARGIN_S  # see VERDICT_MARGIN_S
        self.rank = link.rank
        self.n = n_params
        self.dtype_code = CODE_OF_DTYPE[np.dtype(dtype)]  # of the pulled weights
        self.codec, self.codec_id = _codec_and_id(codec, np.dtype(dtype))
        self.push_buf, self.grads, self._loss, self.codes = _push_buffers(
            n_params, np.dtype(dtype), self.codec
        )
        self.push_code = CODE_OF_DTYPE[self.push_buf.dtype]
        self.pull_codec, self.pull_codec_id = _codec_and_id(pull_codec, np.dtype(dtype))
        self.pull_codes = _pull_codes(n_params, self.pull_codec)
        self.pull_code = self.dtype_code if self.pull_codes is None else _CODES
        self.version = 0  # version of the weights this worker holds

    def wait_for_start(self, doing: str) -> None:
        """Tell the server this worker is ready, and wait until every worker is
        (ParameterServer.start_together)."""
        self.link.send_json(Kind.CONTROL, {"ready": self.rank}, doing)
        self.link.recv_json(Kind.CONTROL, doing, frame=self._header_from_server(doing))

    def _header_from_server(self, doing: str) -> Frame:
        frame = self.link.recv_header(doing)
        if frame.kind == Kind.ABORT:  # the server failed: pass on its story
            origin, reason = self.link.read_abort(frame, doing)
            raise PeerAborted(
                f"rank {self.rank}: the parameter server (rank 0) stopped during {doing}: {reason}",
                origin=origin,
            )
        return frame

    def push(self, loss: float, doing: str) -> None:
        """Send `grads` (filled by compute; encoded here if there is a codec) and `loss`,
        computed on version self.version."""
        if self.codec is not None:
            self.codec.encode(self.grads, self.codes)
        self._loss[0] = loss
        frame = Frame(kind=Kind.DATA, op=Op.NONE, dtype=self.push_code, seq=self.version,
                      src=self.rank, part=self.codec_id, total_len=self.n)  # fmt: skip
        self.link.send(frame, as_bytes(self.push_buf), doing)

    def pull(
        self, params: np.ndarray, doing: str, expect: int | None = None, same_ok: bool = False
    ) -> int:
        """Receive the server's weights into `params`; return (and remember) their version.

        The version must be newer than the one pushed (the server applied our gradient), and
        equal to `expect` when given (sync: exactly one update per step). `same_ok`: the push
        may have been left out (ps-async with --skip-nonfinite), so the same version may
        come back."""
        frame = self._header_from_server(doing)
        if frame.kind != Kind.DATA:
            raise ProtocolError(
                f"rank {self.rank}: expected weights from the server during {doing}, got a "
                f"{Kind(frame.kind).name} frame",
                origin=0,
            )
        stale = frame.seq < self.version if same_ok else frame.seq <= self.version
        bad_version = stale or (expect is not None and frame.seq != expect)
        got = (frame.dtype, frame.total_len, frame.part)
        if bad_version or got != (self.pull_code, self.n, self.pull_codec_id):
            newer = f"a version {'>=' if same_ok else '>'} {self.version}"
            want = f"version {expect}" if expect is not None else newer
            raise CollectiveMismatch(
                f"rank {self.rank}: the parameter server (rank 0) sent version {frame.seq} of "
                f"{frame.total_len} elements (dtype code {frame.dtype}, pull codec "
                f"{_codec_name(frame.part)}) during {doing}; this worker expected {want} of "
                f"{self.n} (code {self.pull_code}, pull codec "
                f"{_codec_name(self.pull_codec_id)}): are both running the same model, method "
                f"and --codec-pull?",
                origin=0,
            )
        if self.pull_codec is None:
            self.link.recv_payload_into(frame, as_bytes(params), doing)  # checks nbytes
        else:
            self.link.recv_payload_into(frame, as_bytes(self.pull_codes), doing)
            self.pull_codec.decode(self.pull_codes, params)
        self.version = frame.seq
        return frame.seq


def _codec_and_id(codec, dtype: np.dtype):
    """(codec, id in the header's `part`): (None, 0) for no codec or codec "none"."""
    if codec is None or codec.name == "none":
        return None, 0
    from pipesgd_ref.codecs import CODECS  # here: only compressed messages need the codecs

    if dtype != np.float32:
        raise ValueError(
            f"codec {codec.name} encodes float32 values; the weights are {dtype} (use "
            f"codec none, or float32 weights)"
        )
    return codec, CODECS.index(codec.name)


def _codec_name(codec_id: int) -> str:
    from pipesgd_ref.codecs import CODECS

    return CODECS[codec_id] if 0 <= codec_id < len(CODECS) else f"id {codec_id}"


def _push_buffers(n: int, dtype: np.dtype, codec):
    """(wire buffer, gradient values, loss slot, codes) of one push; codes is None without a
    codec (the gradient and the loss are then views of the wire buffer itself)."""
    if codec is None:
        wire = np.empty(n + 1, dtype)  # gradient, then the loss
        return wire, wire[:n], wire[n:], None
    codes_bytes = codec.wire_bytes(n)
    wire = np.empty(codes_bytes + 4, np.uint8)  # codes, then the loss as a float32
    # The loss slot may be unaligned (q8: 4 + n code bytes); NumPy reads and writes it anyway.
    return wire, np.empty(n, np.float32), wire[codes_bytes:].view(np.float32), wire[:codes_bytes]


def _pull_codes(n: int, codec):
    """The code buffer of one compressed pull (wire_bytes(n) bytes), or None without a codec."""
    return None if codec is None else np.empty(codec.wire_bytes(n), np.uint8)


class _NoTimeline:
    def span(self, name: str, thread: str, step: int):
        return nullcontext()
