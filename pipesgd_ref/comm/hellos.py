"""Hellos: reading the first message of connections accepted before anyone knows who they are.

Any local process can connect to a rank's listeners (the store, the data listeners), so a
connection says who it is before anything else: a HELLO frame with the job token. A stranger that
connects and says nothing must not hold up the job's ranks: every accepted connection reads its
hello in a thread of its own, within HELLO_TIMEOUT, while the listener goes on accepting; what is
not a valid hello is dropped and logged as a stranger, never blamed on a rank of the job.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any

from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.wire import Kind
from pipesgd_ref.errors import CommError, PeerClosed, PeerTimeout, ProtocolError

log = logging.getLogger("pipesgd.rendezvous")
HELLO_TIMEOUT = 5.0  # a connection that has not said hello by then is dropped


def where(addr) -> tuple[str, object]:
    """(host, port) of an accepted connection's peer; a unix socket has no address."""
    return addr[:2] if isinstance(addr, tuple) else ("unix socket", "-")


def read_hello(link: Link) -> tuple[dict | None, str]:
    """(the hello of a just-accepted connection, ""), or (None, why it is not one): it sent
    none within the link's timeout, closed, or sent anything else."""
    try:
        with doing("hello"):
            hello = link.recv_json(Kind.HELLO)
        if isinstance(hello, dict):
            return hello, ""
        return None, "its hello is not a JSON object"
    except PeerTimeout:
        return None, f"it said no hello within {link.timeout:.1f} s"
    except PeerClosed:
        return None, "it closed the connection without a hello"
    except ProtocolError as e:  # the text after "rank R: bad frame from rank -1 during hello: "
        return None, f"it sent what is not a hello ({str(e).rsplit('hello: ', 1)[-1]})"
    except CommError as e:
        return None, str(e)


def drop_stranger(link: Link, addr, me: str, why: str, close=Link.close) -> None:
    """Log a connection that is not a rank of this job, and close it (`close(link)`)."""
    log.warning(
        "%s: dropped a connection from %s:%s, a stranger (not a rank of this job): %s",
        me,
        *where(addr),
        why,
    )
    close(link)


def _shut(link: Link) -> None:
    """End a wait on `link` in another thread (which then closes it)."""
    try:
        link.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class HelloReader:
    """Connections accepted on data listeners, each reading its hello in a thread of its own;
    `take` hands the (link, hello, addr) of those that said one, as they come."""

    def __init__(self, rank: int, make_link):
        self.rank = rank
        self.make_link = make_link  # socket -> Link (with this rank's link emulation)
        self.said: queue.Queue[tuple[Link, dict, Any]] = queue.Queue()
        self.lock = threading.Lock()
        self.pending: dict[Link, object] = {}  # accepted, hello still awaited: link -> addr
        self.closed = False

    def accept(self, listener: socket.socket) -> None:
        """Accept every connection waiting on `listener` (a real peer may be queued behind
        strangers) and read each one's hello in the background."""
        listener.setblocking(False)
        while True:
            try:
                conn, addr = listener.accept()
            except ConnectionAbortedError:  # gone before it was accepted (reset by the peer)
                continue
            except OSError:  # none left (EAGAIN), or none can be taken now (EMFILE): next round
                return
            conn.setblocking(True)
            link = self.make_link(conn)
            link.timeout = HELLO_TIMEOUT
            with self.lock:
                self.pending[link] = addr
            threading.Thread(
                target=self._read, args=(link, addr), name="rendezvous-hello", daemon=True
            ).start()

    def _read(self, link: Link, addr) -> None:
        hello, why = read_hello(link)
        with self.lock:
            if self.pending.pop(link, None) is None:  # close() took it: logged there
                link.close()
                return
            if hello is not None and not self.closed:
                self.said.put((link, hello, addr))
                return
        if hello is None:
            drop_stranger(link, addr, f"rank {self.rank}", why)
        else:
            link.close()  # it came after the job had formed: no rank was waiting for it

    def settle(self, wait: float) -> None:
        """Give connections already accepted up to `wait` seconds to finish reading their
        hellos, so that one which spoke just before the job formed is answered with a reason
        (by the caller, from `take`) rather than closed without a word."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with self.lock:
                if not self.pending:
                    return
            time.sleep(0.005)

    def take(self, wait: float) -> tuple[Link, dict, Any] | None:
        """The next (link, hello, addr) of a connection that said hello; None within `wait`."""
        try:
            return self.said.get(timeout=wait)
        except queue.Empty:
            return None

    def close(self) -> None:
        """The job formed (or failed): end the waits of connections that never said hello,
        logging each as a stranger, and close the links no one took."""
        with self.lock:
            self.closed = True
            pending, self.pending = list(self.pending.items()), {}
        for link, addr in pending:
            why = "it said no hello while the job formed"
            drop_stranger(link, addr, f"rank {self.rank}", why, close=_shut)
        while (said := self.take(0.0)) is not None:
            said[0].close()
