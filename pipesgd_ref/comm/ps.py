"""Parameter server: the two ends of the star, the worker's client and the server's links.

What the server does with the pushes (the sync and async loops, their cost, their oracles) is
the algorithm, in methods/ps.py and methods/ps_server.py; this module is how the bytes move.

Roles. A job of p workers has p + 1 ranks: rank 0 is a dedicated server that holds the
authoritative weights and never computes a gradient; ranks 1..p are the workers (worker i =
rank i + 1, so it draws minibatch (i, step) as the oracles' rank i does). Every worker has one
link to the server (`comm.server`, its end: `PSClient`); the server has one per worker
(`comm.clients[rank]`, its end: `ServerLinks`): the star of `init_process_group(spec,
star=True)`.

The messages (start, push, pull, abort), their headers and the checks on arrival:
comm/ps_wire.py.

The server's one link. Under link emulation its p links are one network card (netem.ServerNIC):
the pulls share one outgoing wire, the pushes are re-timed on arrival through one ingress queue
in the order they left their workers. ps-sync sends the p pulls of a version in one of
PULL_ORDERS: "sequential" (one after another) or "shared" (all at once sharing the wire:
--ps-pulls=shared); methods/ps_server.py says what each costs.
"""

from __future__ import annotations

import select
import selectors
import time
from contextlib import contextmanager, nullcontext

import numpy as np

from pipesgd_ref.comm.activity import current, doing
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.netem import ServerNIC
from pipesgd_ref.comm.ps_wire import CODES, codec_and_id, codec_name, pull_codes, push_buffers
from pipesgd_ref.comm.wire import (
    ABORT_LINGER_SECONDS,
    CODE_OF_DTYPE,
    HEADER_BYTES,
    POLL_SECONDS,
    Frame,
    Kind,
    Op,
    as_bytes,
)
from pipesgd_ref.errors import (
    CollectiveMismatch,
    CommError,
    PeerAborted,
    PeerClosed,
    PeerTimeout,
    ProtocolError,
)
from pipesgd_ref.logs import trace

# A worker waits this much longer than the server does on any one worker, so that when a worker
# hangs, the server's verdict (an ABORT naming it) reaches the others before they give up on the
# server themselves (in ps-sync every worker's pull waits for the slowest worker's push).
VERDICT_MARGIN_S = 2.0

# ps-async over links without a socket (MPI): the pause between two looks at every worker's
# link, short beside a push's compute, so the first push to arrive is read within it.
POLL_PAUSE_S = 200e-6

# How ps-sync's server sends the p pulls of a version over its one link (module docstring).
PULL_ORDERS = ("sequential", "shared")


def worker_of(rank: int) -> int:
    """Worker index of a rank: rank 0 is the server, worker i is rank i + 1."""
    return rank - 1


def worker_name(rank: int) -> str:
    """How messages name a worker: 'worker i (rank r)'."""
    return f"worker {worker_of(rank)} (rank {rank})"


class ServerLinks:
    """The server's end of the star: its p links in worker order, and the buffers of one push.

    Receiving a push checks its header, reads its payload into the receive buffer (n + 1
    elements, or the codes and the loss) and waits out its emulated arrival; the gradient is
    then `gradient()` (decoded on first use, with a codec) and the loss is returned. Sending a
    pull sends the weights, or (pull codec) their codes, encoded once per version into one code
    buffer. Nothing here allocates per message. On any error inside `aborting_on_error`, every
    worker is told why (an ABORT) before the error propagates.

    `clients`: rank -> Link (from init_process_group(star=True)); `params`: the server's
    weights (what a pull sends); `codec`, `pull_codec` (pipesgd_ref.codecs, or None for none):
    how pushes and pulls are encoded; `pulls`: one of PULL_ORDERS; `n_stats`: the model's
    buffers each push carries after its loss (`stats`: the last push's, as it arrived).
    """

    def __init__(
        self,
        clients: dict[int, Link],
        params: np.ndarray,
        timeline=None,
        codec=None,
        pull_codec=None,
        pulls: str = "sequential",
        n_stats: int = 0,
    ):
        if pulls not in PULL_ORDERS:
            raise ValueError(f"pulls must be one of {', '.join(PULL_ORDERS)}, got {pulls!r}")
        if not clients:
            raise CommError(
                "rank 0: no worker links; a parameter server job needs world_size >= 2 and "
                "the star links (launch_local(..., star=True))"
            )
        if params.dtype not in CODE_OF_DTYPE or params.ndim != 1:
            raise ValueError(f"params must be a flat float32/float64 array, got {params.dtype}")
        self.pulls = pulls
        self.links = [clients[r] for r in sorted(clients)]  # index = worker index
        self.n_workers = len(self.links)
        self.params = params
        self.n = params.size
        self.timeline = timeline or _NoTimeline()  # a Timeline (spans of work), or none
        self.codec, self.codec_id = codec_and_id(codec, params.dtype)
        # recv_buf: one push, as it arrives; grads: the pushed gradient as float32 values (a
        # view of recv_buf without a codec, a decode buffer with one); loss_buf: the loss.
        self.recv_buf, self.grads, self.loss_buf, self.codes, self.stats = push_buffers(
            self.n, params.dtype, self.codec, n_stats
        )
        self.push_code = CODE_OF_DTYPE[self.recv_buf.dtype]
        self._decoded = True  # whether grads holds the push last received
        # Pulls: the weights themselves, or (pull codec) their codes, encoded once per version.
        self.pull_codec, self.pull_codec_id = codec_and_id(pull_codec, params.dtype)
        self.pull_codes = pull_codes(self.n, self.pull_codec)
        self.pull_code = CODE_OF_DTYPE[params.dtype] if self.pull_codes is None else CODES
        self._encoded_version: int | None = None  # the version now in pull_codes
        self.nic = ServerNIC(self.links, header_bytes=HEADER_BYTES)
        self._round: list[Frame | None] = []  # ps-sync: the headers of the round read so far
        self._selector: selectors.BaseSelector | None = None  # ps-async: the links waited on
        self._polled: set[int] | None = None  # ... or, links without a socket: those polled
        self.pulled_at = [time.monotonic()] * self.n_workers  # when each worker got weights
        self._sending_to: Link | None = None  # a failure mid-send leaves this link half-sent

    def rank_of(self, i: int) -> int:
        return self.links[i].peer

    def new_run(self) -> None:
        """A run starts (its versions restart): no pull codes are cached yet."""
        self._encoded_version = None

    # --- the start -----------------------------------------------------------------------
    def start_together(self) -> None:
        """Wait until every worker has said it is ready (PSClient.wait_for_start), then tell
        them all to start: the job's clock starts with training on every worker, not while
        one of them is still setting up."""
        with self.aborting_on_error():
            for link in self.links:
                with doing(f"the start (is {worker_name(link.peer)} ready?)"):
                    link.recv_json(Kind.CONTROL)
            with doing("the start"):
                for link in self.links:
                    link.send_json(Kind.CONTROL, {"start": True})

    # --- pushes ----------------------------------------------------------------------------
    def receive(self, i: int, version: int, phase: str) -> float:
        """Receive worker i's push, computed on `version`; its loss. Under emulation it waits
        behind the pushes read before it (ps-async reads them in the order they arrive)."""
        frame = self._push_header(self.links[i], version, phase)
        with self.timeline.span("recv", "server", version):
            self._read_payload(i, frame, phase)
            self.nic.arrive(frame)
        return float(self.loss_buf[0])

    def begin_round(self) -> None:
        """ps-sync: a round of p pushes begins (one from every worker, read in worker order)."""
        self._round = [None] * self.n_workers

    def receive_in_round(self, i: int, version: int, phase: str) -> float:
        """receive() for ps-sync's round: under emulation the push waits for its arrival
        behind every push of the round that departed before it, read or not (the server reads
        in worker order, for its sum; the emulated wire takes them in the order they left)."""
        frames = self._round
        frame = frames[i] = frames[i] or self._push_header(self.links[i], version, phase)
        self._read_started_headers(version, phase)
        with self.timeline.span("recv", "server", version):
            self._read_payload(i, frame, phase)
            self.nic.arrive_in_round(frames, i)
        return float(self.loss_buf[0])

    def end_round(self) -> None:
        """ps-sync: the round's pushes have all crossed; the next round queues behind them."""
        self.nic.end_round()

    def gradient(self) -> np.ndarray:
        """The gradient of the push last received, as values (decoded now, with a codec)."""
        if not self._decoded:
            self.codec.decode(self.codes, self.grads)
            self._decoded = True
        return self.grads

    def add_gradient_into(self, total: np.ndarray) -> None:
        """total += the push last received (with a codec, decoded and added in one pass:
        codec.add_decoded_into is bitwise `total += decode(codes)`)."""
        if self._decoded:
            total += self.grads
        else:
            self.codec.add_decoded_into(self.codes, total)

    def _read_payload(self, i: int, frame: Frame, phase: str) -> None:
        link = self.links[i]
        with doing(f"{phase} (the push of worker {worker_of(link.peer)})"):
            link.recv_payload_into(frame, as_bytes(self.recv_buf))  # checks nbytes
        self._decoded = self.codec is None
        what = "%s | rank %d -> 0 | push of version %d | %d bytes"
        trace(what, phase, link.peer, frame.seq, frame.nbytes)

    def _push_header(self, link: Link, version: int, phase: str) -> Frame:
        """Read and check the header of one push from `link` (its payload stays unread)."""
        with doing(f"{phase} (the push of worker {worker_of(link.peer)})"):
            frame = link.recv_header()
            if frame.kind == Kind.ABORT:  # the worker stopped on a signal (Communicator.close)
                news = link.read_abort(frame)
                source = f"news from rank {link.peer}"
                raise PeerAborted(news.cannot_finish(0, current(), source), origin=news.origin)
            if frame.kind != Kind.DATA:
                raise ProtocolError(
                    f"rank 0: expected a push from {worker_name(link.peer)} during "
                    f"{current()}, got a {Kind(frame.kind).name} frame",
                    origin=link.peer,
                )
            got = (frame.seq, frame.dtype, frame.total_len, frame.part)
            if got != (version, self.push_code, self.n, self.codec_id):
                raise self._push_mismatch(link, frame, version)
        return frame

    def _push_mismatch(self, link: Link, frame: Frame, version: int) -> CollectiveMismatch:
        return CollectiveMismatch(
            f"rank 0: {worker_name(link.peer)} pushed a gradient of {frame.total_len} "
            f"elements (dtype code {frame.dtype}, codec {codec_name(frame.part)}) computed "
            f"on version {frame.seq} during {current()}; the server expected {self.n} elements "
            f"(code {self.push_code}, codec {codec_name(self.codec_id)}) on version "
            f"{version}: are both running the same model, method and codec?",
            origin=link.peer,
        )

    def _read_started_headers(self, version: int, phase: str) -> None:
        """Read the header of every push of this round that has begun to arrive (its link is
        readable): those pushes departed already, so they go onto the ingress wire before any
        push that departs later (ServerNIC.arrive_in_round). Only under link emulation."""
        if not self.nic.enabled:
            return
        frames = self._round
        waiting = [i for i, f in enumerate(frames) if f is None]
        if not waiting:
            return
        readable, _, _ = select.select([self.links[i].sock for i in waiting], [], [], 0)
        for i in waiting:
            if self.links[i].sock in readable:
                frames[i] = self._push_header(self.links[i], version, phase)

    # --- ps-async: whichever push comes first --------------------------------------------
    @contextmanager
    def watching(self, workers: list[int]):
        """Wait on these workers' links at once (ready(), drop()) while the body runs."""
        if any(self.links[i].sock is None for i in workers):
            # Links without a socket (MPI's, comm/mpi.py) cannot be selected on: ready() asks
            # each one in turn whether a frame has arrived.
            self._polled = set(workers)
            self.pulled_at = [time.monotonic()] * self.n_workers
            try:
                yield self
            finally:
                self._polled = None
            return
        with selectors.DefaultSelector() as selector:
            self._selector = selector
            for i in workers:
                selector.register(self.links[i].sock, selectors.EVENT_READ, i)
            self.pulled_at = [time.monotonic()] * self.n_workers
            try:
                yield self
            finally:
                self._selector = None

    def ready(self) -> list[int]:
        """The watched workers whose push has begun to arrive (within POLL_SECONDS). A link's
        bytes are read only by Link, so "readable" means a frame."""
        if self._polled is not None:
            deadline = time.monotonic() + POLL_SECONDS
            while not (ready := [i for i in sorted(self._polled) if self.links[i].has_frame()]):
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_PAUSE_S)
            return ready
        assert self._selector is not None  # inside watching()
        return [key.data for key, _ in self._selector.select(timeout=POLL_SECONDS)]

    def drop(self, i: int) -> None:
        """Stop watching worker i (it has no push to come)."""
        if self._polled is not None:
            self._polled.discard(i)
            return
        sock, selector = self.links[i].sock, self._selector  # watching(): a selector
        if selector is not None and sock in selector.get_map():
            selector.unregister(sock)

    def check_silence(self, left: list[int], version: int) -> None:
        """ps-async: a worker that died closes its link (readable: PeerClosed); one that hangs
        only falls silent, while the others go on. Each worker's push is due within the
        timeout of the moment it was sent its weights."""
        now = time.monotonic()
        for i, link in enumerate(self.links):
            if left[i] and now - self.pulled_at[i] > link.timeout:
                raise PeerTimeout(
                    f"rank 0: no push from {worker_name(link.peer)} for {link.timeout:.1f} s "
                    f"during ps-async (update {version}; it has {left[i]} pushes to go); is "
                    f"rank {link.peer} alive (stopped, hung, or overloaded)? raise --timeout to "
                    f"wait longer",
                    origin=link.peer,
                )

    # --- pulls -----------------------------------------------------------------------------
    def send_pull(self, i: int, version: int, phase: str, deliver_at: float | None = None) -> None:
        """Send `version` of the weights (or their codes) to worker i."""
        link = self.links[i]
        payload = self._pull_payload(version)
        frame = Frame(
            Kind.DATA, Op.NONE, self.pull_code, version, part=self.pull_codec_id, total_len=self.n
        )
        self._sending_to = link
        with doing(f"{phase} (the pull of worker {worker_of(link.peer)})"):
            link.send(frame, as_bytes(payload), deliver_at=deliver_at)
        self._sending_to = None
        self.pulled_at[i] = time.monotonic()
        what = "%s | rank 0 -> %d | pull of version %d | %d bytes"
        trace(what, phase, link.peer, version, payload.nbytes)

    def send_pulls(self, version: int, phase: str) -> None:
        """Send `version` to every worker: p * M out over the server's one link, one after
        another ("sequential"), or all at once sharing it ("shared": every pull then arrives
        when the last byte has left)."""
        at = None
        if self.pulls == "shared":
            at = self.nic.book(self.n_workers, self._pull_payload(version).nbytes)
        for i in range(self.n_workers):
            self.send_pull(i, version, phase, deliver_at=at)

    def _pull_payload(self, version: int) -> np.ndarray:
        """What a pull of `version` carries: the weights, or (pull codec) their codes."""
        if self.pull_codec is None:
            return self.params
        if self._encoded_version != version:  # one encode per version, whole vector
            self.pull_codec.encode(self.params, self.pull_codes)
            self._encoded_version = version
        return self.pull_codes

    # --- failure ---------------------------------------------------------------------------
    @contextmanager
    def aborting_on_error(self):
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

    def __init__(
        self, link: Link, n_params: int, dtype=np.float32, codec=None, pull_codec=None, n_stats=0
    ):
        self.link = link
        link.timeout += VERDICT_MARGIN_S  # see VERDICT_MARGIN_S
        self.rank = link.rank
        self.n = n_params
        self.dtype_code = CODE_OF_DTYPE[np.dtype(dtype)]  # of the pulled weights
        self.codec, self.codec_id = codec_and_id(codec, np.dtype(dtype))
        self.push_buf, self.grads, self._loss, self.codes, self._stats = push_buffers(
            n_params, np.dtype(dtype), self.codec, n_stats
        )
        self.push_code = CODE_OF_DTYPE[self.push_buf.dtype]
        self.pull_codec, self.pull_codec_id = codec_and_id(pull_codec, np.dtype(dtype))
        self.pull_codes = pull_codes(n_params, self.pull_codec)
        self.pull_code = self.dtype_code if self.pull_codes is None else CODES
        self.version = 0  # version of the weights this worker holds

    def wait_for_start(self) -> None:
        """Tell the server this worker is ready, and wait until every worker is
        (ServerLinks.start_together)."""
        self.link.send_json(Kind.CONTROL, {"ready": self.rank})
        with self._telling_the_server():
            self.link.recv_json(Kind.CONTROL, frame=self._header_from_server())

    @contextmanager
    def _telling_the_server(self):
        """While receiving from the server: a failure it cannot know of (a bad frame or an
        unexpected one from it, its silence) is told to it (ABORT naming the rank at fault,
        the server itself for what it sent) before this worker fails, so the server passes
        that story on to every worker instead of taking this worker's exit for the cause. Not
        after the server's own news or its close: it knows, or is gone. Our pushes are whole
        by then: the news cannot cut into one."""
        try:
            yield
        except (PeerAborted, PeerClosed):
            raise
        except CommError as error:
            if self.link.send_abort(error, default_origin=self.rank):
                time.sleep(ABORT_LINGER_SECONDS)  # a close now could overtake the news
            raise

    def _header_from_server(self) -> Frame:
        frame = self.link.recv_header()
        if frame.kind == Kind.ABORT:  # the server failed (or stopped): pass on its story
            news = self.link.read_abort(frame)
            raise PeerAborted(
                f"rank {self.rank}: the parameter server (rank 0) stopped during {current()}: "
                f"{news.reason}",
                origin=news.origin,
            )
        return frame

    def push(self, loss: float, stats=None) -> None:
        """Send `grads` (filled by compute; encoded here if there is a codec), `loss` and the
        model's buffers `stats` (n_stats of them), computed on version self.version."""
        if self.codec is not None:
            self.codec.encode(self.grads, self.codes)
        self._loss[0] = loss
        if stats is not None:
            self._stats[...] = stats
        frame = Frame(
            Kind.DATA,
            Op.NONE,
            self.push_code,
            self.version,
            src=self.rank,
            part=self.codec_id,
            total_len=self.n,
        )
        self.link.send(frame, as_bytes(self.push_buf))

    def pull(self, params: np.ndarray, *, expect: int | None = None, same_ok: bool = False) -> int:
        """Receive the server's weights into `params`; return (and remember) their version.

        The version must be newer than the one pushed (the server applied our gradient), and
        equal to `expect` when given (sync: exactly one update per step). `same_ok`: the push
        may have been left out (ps-async with --skip-nonfinite), so the same version may
        come back."""
        with self._telling_the_server():
            frame = self._header_from_server()
            if frame.kind != Kind.DATA:
                raise ProtocolError(
                    f"rank {self.rank}: expected weights from the server during {current()}, got a "
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
                    f"{codec_name(frame.part)}) during {current()}; this worker expected {want} of "
                    f"{self.n} (code {self.pull_code}, pull codec "
                    f"{codec_name(self.pull_codec_id)}): are both running the same model, method "
                    f"and --codec-pull?",
                    origin=0,
                )
            if self.pull_codec is None:
                self.link.recv_payload_into(frame, as_bytes(params))  # checks nbytes
            else:
                self.link.recv_payload_into(frame, as_bytes(self.pull_codes))
                self.pull_codec.decode(self.pull_codes, params)
            self.version = frame.seq
            return frame.seq


class _NoTimeline:
    def span(self, name: str, thread: str, step: int):
        return nullcontext()
