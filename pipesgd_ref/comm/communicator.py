"""The Communicator: what a method holds for its rank in the job.

Every method's loop (methods/) gets one, from init_process_group (comm/rendezvous.py) or
join_mpi (comm/mpi.py), and hands it to the collectives (comm/collectives.py) or the parameter
server's ends (comm/ps.py). It holds:

    rank, world_size, timeout       who this rank is, and how long any one wait may take
    left, right                     the ring's links: receive from rank - 1, send to rank + 1
    server, clients                 the star's links (parameter server): worker -> rank 0
    mesh                            links to the peers of recursive doubling and Rabenseifner
                                    (comm/mesh.py), by peer rank: each used both ways
    seq                             collectives issued so far: every rank issues the same
                                    sequence, and every frame carries its number
    scratch                         one receive buffer, reused by every collective
    bytes_sent                      what this rank has handed to its peers: every frame on the
                                    right link and the mesh links (headers included), and the
                                    bytes it wrote into the shared-memory group for the others
    allreduces                      the tally of the AllReduces it ran (comm/collectives.py):
                                    calls and payload bytes sent per (algorithm, transport,
                                    dtype, message bytes); `allreduce_ran` lists it

and what the ring does when a collective fails: `abort` tells both neighbours why (an ABORT
naming the rank at fault) before anything is closed, `check_news` raises the news a neighbour
sent back, and `explain` tells a neighbour's death apart from a neighbour that only passed
another rank's failure on. Together they give every rank of a failing ring the same cause.
A rank that stops on a signal says so as it closes (`tell_stopped`): a stop, not a failure,
which stops the peers that hear it too (runtime/lifetime.py).
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, TypeGuard

import numpy as np

from pipesgd_ref.comm.activity import current
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.wire import ABORT_LINGER_SECONDS, POLL_SECONDS, News
from pipesgd_ref.errors import CommError, PeerAborted, PeerClosed
from pipesgd_ref.runtime import lifetime

if TYPE_CHECKING:
    from pipesgd_ref.comm.shm_group import ShmGroup

# A left neighbour that closed in the middle of a frame may have died, or may have failed
# because of another rank without being able to say so (its frame to us was stuck half sent):
# news naming that rank is waited for this long (at most half the timeout) on the other link.
CAUSE_WAIT_SECONDS = 1.0


class Communicator:
    """A rank's place in the job: its ring neighbours and the collective sequence number.

    `spec`: the JobSpec this rank joined with (comm/rendezvous.py; MPI's jobs make one too):
    its rank, world size and timeout. `left`, `right`: the ring links (None when alone);
    `bind_host`: the interface its listeners used. The star links of a parameter server,
    when asked for, are set by init_process_group: `server` on a worker, `clients` on rank 0.
    """

    def __init__(self, spec, left: Link | None, right: Link | None, bind_host: str = ""):
        self.spec = spec
        self.rank = spec.rank
        self.world_size = spec.world_size
        self.timeout = spec.timeout
        self.left = left  # we receive from rank - 1
        self.right = right  # we send to rank + 1
        self.seq = 0  # collectives issued so far; every rank must issue the same sequence
        self.bind_host = bind_host
        self.server: Link | None = None  # star links (parameter server): worker -> rank 0
        self.clients: dict[int, Link] = {}  # on rank 0: one link per worker rank
        self.mesh: dict[int, Link] = {}  # peer rank -> link (comm/mesh.py), when asked for
        # one host's shared-memory group (comm/shm_group.py), when formed
        self.group: ShmGroup | None = None
        # What `auto` chooses by, the same on every rank (set at rendezvous: comm/choose.py):
        # the figures rank 0 read, and the slowest transport among the job's links.
        self.auto_models: dict | None = None
        self.auto_transport: str | None = None
        self._scratch: np.ndarray | None = None  # see scratch()
        # (algorithm, transport, dtype, message bytes) -> [calls, payload bytes sent]
        self.allreduces: dict[tuple[str, str, np.dtype, int], list[int]] = {}

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @property
    def transports(self) -> dict[str, str]:
        """The transport of each link: {"left": "shm", "right": "shm", "server": ...}."""
        links = {"left": self.left, "right": self.right, "server": self.server}
        links.update({f"client {r}": link for r, link in self.clients.items()})
        links.update({f"mesh {r}": link for r, link in self.mesh.items()})
        return {name: link.transport for name, link in links.items() if link is not None}

    def scratch(self, n: int, dtype) -> np.ndarray:
        """A receive buffer of n elements, kept for the next collective: a fresh one would be
        mapped, page-faulted and zeroed by the kernel on every call (milliseconds per 4 MB).
        Grows to the largest n asked for; one collective at a time uses it."""
        dtype = np.dtype(dtype)
        nbytes = n * dtype.itemsize
        if self._scratch is None or self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes].view(dtype)

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has sent to its peers, by every algorithm: the frames on the ring's
        right link and on every mesh link (headers, heartbeats and the rendezvous hello
        included), and the bytes it wrote into one host's shared-memory group for the others
        to read (comm/shm_group.py: no headers there). The left link carries no data, only
        news of a failure; the star's links are the parameter server's (methods/ps.py)."""
        links = (self.right, *self.mesh.values())
        sent = sum(link.bytes_sent for link in links if link is not None)
        return sent + (self.group.bytes_written if self.group is not None else 0)

    def count_allreduce(self, algorithm: str, transport: str, dtype, nbytes: int, sent: int):
        """Tally one AllReduce of `nbytes` of `dtype` (a numpy dtype) that `algorithm` ran over
        `transport`, this rank handing `sent` payload bytes to its peers (comm/collectives.py).
        Once per call: the key is the dtype itself (its name is computed, in Python)."""
        key = (algorithm, transport, dtype, nbytes)
        tally = self.allreduces.get(key)
        if tally is None:
            tally = self.allreduces[key] = [0, 0]
        tally[0] += 1
        tally[1] += sent

    def allreduce_ran(self, dtype: str = "float32") -> list[dict]:
        """The AllReduces of `dtype` this rank ran, one entry per (message bytes, algorithm,
        transport), by size: {"bytes", "algorithm", "transport", "calls", "bytes_sent" (payload
        bytes, headers not counted)}. float32, the default, is the gradients' (the models'
        weights are float32; the runtime's own small AllReduces, the --skip-nonfinite flags,
        the options' agreement and a joined job's summary gather, are float64, and a barrier
        reduces no data)."""
        wanted = np.dtype(dtype)
        return [
            {"bytes": n, "algorithm": a, "transport": t, "calls": calls, "bytes_sent": sent}
            for (a, t, d, n), (calls, sent) in sorted(self.allreduces.items(), key=_by_size)
            if d == wanted
        ]

    @property
    def bytes_received(self) -> int:
        return self.left.bytes_received if self.left else 0

    def abort(self, error: BaseException) -> bool:
        """Tell both neighbours (and every mesh peer) that this collective failed, and why (an
        ABORT naming the rank at fault), before anything is closed, so the news goes round the
        ring both ways and every rank's error names the rank at fault: a neighbour that sees
        this rank close finds the news before the close (Link.take_news), never only the
        close. Best effort: the job is failing anyway. True when the news was sent on some link."""
        told = False
        broken = getattr(error, "link", None)  # the link the error happened on
        # Left first: this rank never sends data on it, so the news goes out at once; the right
        # link may first have to finish the frame on the wire.
        for link in (self.left, self.right, *self.mesh.values()):
            if link is not broken and _between_frames(link):
                told = link.send_abort(error, default_origin=self.rank) or told
        return told

    def tell_stopped(self, signum: int, step: int | None) -> bool:
        """Tell every peer (ring and star) that this rank stops on signal `signum` before
        `step`: a stop, not a failure. The ranks of a joined job are signalled one by one, and
        a peer still running would otherwise take this rank's close for a crash; hearing this,
        it stops with the signal's code too (Link.read_abort). True when told on some link."""
        reason = f"rank {self.rank} stopped by {signal.Signals(signum).name}"
        if step is not None:
            reason += f" before step {step}"
        news = News(self.rank, reason, signum, step)
        links = (self.left, self.right, self.server, *self.clients.values(), *self.mesh.values())
        told = self.group is not None and self.group.tell(news)  # the group waits on no link
        return any([link.send_news(news) for link in links if _between_frames(link)]) or told

    def check_news(self) -> None:
        """Raise PeerAborted if the right neighbour has sent news of a failure back along the
        ring (it arrives on the right link, which otherwise carries nothing towards this
        rank). Called while this rank waits on its left neighbour, so news travels both ways
        round the ring, not only with the data."""
        right = self.right
        if right is None:
            return
        try:
            news = right.take_news(0.0)
        except PeerClosed:
            return  # gone without news: it finished, or its own send will tell (Link.send)
        if news is not None:
            source = f"news from rank {right.peer}"
            raise PeerAborted(news.cannot_finish(self.rank, current(), source), origin=news.origin)

    def explain(self, error: CommError) -> CommError:
        """The error to report for `error`: itself, unless the left neighbour closed the
        connection in the middle of a frame, and news naming another rank arrives on the
        right link within CAUSE_WAIT_SECONDS. A neighbour that passes a failure on sends its
        ABORT between frames, before it closes; one that closes mid-frame died, unless its
        frame to us was stuck (then it told its left neighbour, and the news comes round)."""
        link = error.link if isinstance(error, PeerClosed) else None
        right = self.right
        if link is not self.left or link is None or not link.mid_frame or right is None:
            return error
        deadline = time.monotonic() + min(CAUSE_WAIT_SECONDS, self.timeout / 2)
        while (left := deadline - time.monotonic()) > 0:
            try:
                news = right.take_news(min(left, POLL_SECONDS))
            except PeerClosed:
                return error  # the right neighbour is gone too: no news can come
            if news is not None:
                source = (
                    f"news from rank {right.peer}, after rank {link.peer} closed the connection "
                    f"mid-frame"
                )
                text = news.cannot_finish(self.rank, error.doing, source)
                return PeerAborted(text, origin=news.origin)
        return error

    def close(self) -> None:
        """Close every link; a rank that stops on a signal first tells its peers so
        (`tell_stopped`) and gives the news a moment to arrive before the close does."""
        stopped = lifetime.stop_to_tell()
        if stopped is not None and self.tell_stopped(*stopped):
            time.sleep(ABORT_LINGER_SECONDS)
        if self.group is not None:  # no one waits on a rank that has gone
            self.group.close()
            self.group = None
        links = (self.left, self.right, self.server, *self.clients.values(), *self.mesh.values())
        for link in links:
            if link is not None:
                link.close()
        self.left = self.right = self.server = None
        self.clients, self.mesh = {}, {}

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank {self.rank} of {self.world_size})"


def _by_size(item) -> tuple:
    (algorithm, transport, _, nbytes), _ = item
    return nbytes, algorithm, transport


def _between_frames(link: Link | None) -> TypeGuard[Link]:
    """Whether one more frame (news) may go out on `link` now: it exists, and its sending
    thread, cancelled, has no frame stuck half-sent (another header would garble the stream)."""
    if link is None:
        return False
    sender = link._sender
    return sender is None or sender.cancel(wait=1.0)
