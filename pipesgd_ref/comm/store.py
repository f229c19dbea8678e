"""The rendezvous store: rank 0's address book, and each rank's registration with it.

Rank 0 hosts the store on MASTER_ADDR:MASTER_PORT (`Store`). Every rank, rank 0 too, connects
and registers (`register`): its token, rank, world size, listening addresses, host and PID
namespace, and the options every rank of the job must give alike. When all p are in, the store
compares those options (`options_differ`) and answers everyone at once: the table of
addresses, with the AllReduce figures rank 0 read (comm/choose.py: `auto` chooses by these on
every rank), or one line every rank raises (options that differ, a models file that is
broken), or, when a rank never came, the reason the job did not form. comm/rendezvous.py makes
the links from the table.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from typing import TypeGuard

from pipesgd_ref.comm import choose
from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.agree import differences
from pipesgd_ref.comm.hellos import HELLO_TIMEOUT, drop_stranger, read_hello, where
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.sockets import connect, listen, node_id, pid_namespace
from pipesgd_ref.comm.wire import Kind
from pipesgd_ref.errors import CommError, ConfigError, RendezvousError

log = logging.getLogger("pipesgd.rendezvous")

__all__ = ["Store", "options_differ", "refuse", "register", "token_ok"]


def token_ok(presented: object, token: str) -> bool:
    return isinstance(presented, str) and hmac.compare_digest(presented.encode(), token.encode())


# --- the store on rank 0 ---------------------------------------------------------------------


class Store:
    """Rank 0's address book: collects p registrations, then hands everyone the table."""

    def __init__(self, spec, sock: socket.socket | None = None):
        self.spec = spec
        self.sock = sock or listen(spec.bind, spec.master_port, "rendezvous store", 0)
        self.port = self.sock.getsockname()[1]
        self.registered: dict[int, tuple[Link, dict]] = {}
        self.lock = threading.Lock()
        self.all_in = threading.Event()
        self.error: str | None = None  # the job did not form (a rank never joined)
        self.refusal: str | None = None  # it formed, but must not run: every rank raises this
        self.models: dict = {}
        if spec.allreduce == "auto" and spec.world_size > 1:
            try:  # read once, here: every rank chooses by these (comm/choose.py)
                self.models = choose.job_models()
            except ConfigError as e:
                self.refusal = str(e)
        self.thread = threading.Thread(target=self._serve, name="rendezvous-store", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            self._accept_until_all_in()
            self._answer_everyone()
        finally:
            self.sock.close()

    def _accept_until_all_in(self) -> None:
        """Take connections (each said hello in a thread of its own, `_handle`) until all p
        ranks have registered, or the timeout passes (then `error` says who never came)."""
        deadline = time.monotonic() + self.spec.timeout
        self.sock.settimeout(0.1)
        while not self.all_in.is_set():
            if time.monotonic() > deadline:
                with self.lock:
                    joined = sorted(self.registered)
                missing = sorted(set(range(self.spec.world_size)) - set(joined))
                self.error = (
                    f"rendezvous timed out after {self.spec.timeout:.1f} s: rank(s) "
                    f"{', '.join(map(str, missing))} never joined (joined: {joined}); start "
                    f"them with the same MASTER_ADDR, MASTER_PORT and job token, or raise "
                    f"--timeout"
                )
                return
            try:
                conn, addr = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(
                target=self._handle, args=(conn, addr), name="rendezvous-hello", daemon=True
            ).start()

    def _answer_everyone(self) -> None:
        """Every registered rank gets the table of addresses, or the reason the job failed."""
        with self.lock:
            links = dict(self.registered)
        if not self.error:
            options = [links[r][1].pop("options") for r in sorted(links)]
            self.refusal = options_differ(options) or self.refusal
        table = [links[r][1] for r in sorted(links)] if not self.error else []
        with doing("rendezvous"):
            for link, _ in links.values():
                try:
                    if self.error:
                        link.send_json(Kind.REFUSE, {"reason": self.error})
                    elif self.refusal:  # every rank says it in the same words, exit 2
                        link.send_json(Kind.CONTROL, {"refusal": self.refusal})
                    else:
                        link.send_json(Kind.CONTROL, {"addrs": table, "models": self.models})
                except CommError:
                    pass
                link.close()

    def _handle(self, conn: socket.socket, addr) -> None:
        """One connection: its hello registers a rank, or it is refused with the reason."""
        link = Link(conn, rank=0, peer=-1, timeout=HELLO_TIMEOUT)
        hello, why = read_hello(link)
        if hello is None:
            drop_stranger(link, addr, "rendezvous store", why)
            return
        reason = store_refusal(hello, self.spec)
        if reason is None:
            rank = hello["rank"]
            address = {
                "host": hello.get("host") or addr[0],  # bound to all interfaces: its source IP
                "port": hello["port"],
                "unix": hello.get("unix", ""),  # its unix listener ("": a tcp-only job)
                "node": hello.get("node") or addr[0],  # its host (node_id)
                "pidns": hello.get("pidns", ""),  # its PID namespace (pid_namespace)
                "options": hello.get("options", {}),  # compared, then dropped (options_differ)
            }
            with self.lock:  # checked and taken at once: two hellos of one rank race here
                if rank in self.registered or self.all_in.is_set():
                    reason = f"rank {rank} has already joined (two processes with one RANK?)"
                else:
                    link.peer, link.timeout = rank, self.spec.timeout
                    self.registered[rank] = (link, address)
                    if len(self.registered) == self.spec.world_size:
                        self.all_in.set()
        if reason:
            log.warning("rendezvous: refused a connection from %s:%s: %s", *where(addr), reason)
            refuse(link, reason, "rendezvous")


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def store_refusal(hello: dict, spec) -> str | None:
    """Why a registration is refused (None: it registers a rank). The token comes first: a
    process without it learns nothing about the job (not even which field it got wrong)."""
    if not token_ok(hello.get("token"), spec.token):
        return "wrong job token (this is a different job, or PIPESGD_JOB_TOKEN differs)"
    rank, size, port = hello.get("rank"), hello.get("world_size"), hello.get("port")
    if size != spec.world_size or not is_int(size):
        return f"world size {size!r} != the job's {spec.world_size}"
    if not is_int(rank) or not 0 <= rank < spec.world_size:
        return f"rank {rank!r} is outside 0..{spec.world_size - 1}"
    if not is_int(port) or not 1 <= port <= 65535:
        return f"rank {rank}: listening port {port!r} is not a port number in 1..65535"
    for name in ("host", "unix", "node", "pidns"):
        value = hello.get(name, "")
        if not isinstance(value, str) or len(value) > 255:
            return f"rank {rank}: {name} {value!r:.60} is not a string of at most 255 characters"
    options = hello.get("options", {})
    if not isinstance(options, dict) or len(json.dumps(options)) > MAX_OPTIONS_BYTES:
        return f"rank {rank}: options {options!r:.60} are not an object of at most 64 KB"
    return None


MAX_OPTIONS_BYTES = 1 << 16


def options_differ(options: list[dict]) -> str | None:
    """The store's check that the joined ranks were started alike (rank r's hello gave
    options[r]): None, or the one line every rank is refused with, naming each option that
    differs and the ranks on each side. Made before any link, so it cannot depend on what
    differs (a collective run by each rank's own --allreduce would fail instead)."""
    if all(o == options[0] for o in options):
        return None
    return (
        f"the ranks of this job were started with different options: {differences(options)}; "
        f"start every rank with the same options"
    )


def refuse(link: Link, reason: str, what: str) -> None:
    """Tell a connection why it is refused (best effort), and close it."""
    try:
        with doing(what):
            link.send_json(Kind.REFUSE, {"reason": reason})
    except CommError:
        pass
    link.close()


# --- joining ---------------------------------------------------------------------------------


def register(spec, data_port: int, host: str, unix: str) -> tuple[list[dict], dict]:
    """Register this rank (`spec`: its rendezvous JobSpec) with the store; (the table of
    every rank's addresses, the AllReduce figures rank 0 read). A refusal of the whole job is
    a ConfigError, the same line on every rank; a job that did not form, a RendezvousError."""
    sock = connect(
        spec.master_addr, spec.master_port, spec.rank, spec.timeout, 0, "the rendezvous store"
    )
    link = Link(sock, spec.rank, peer=0, timeout=spec.timeout)
    hello = {
        "token": spec.token,
        "rank": spec.rank,
        "world_size": spec.world_size,
        "host": host,
        "port": data_port,
        "unix": unix,
        "node": node_id(),
        "pidns": pid_namespace(),
        "purpose": "store",
        "options": {
            "allreduce": spec.allreduce,
            "transport": spec.transport,
            "latency": spec.link.latency,
            "bandwidth": str(spec.link.bandwidth),
            **spec.options,
        },
    }
    try:
        with doing("rendezvous"):
            link.send_json(Kind.HELLO, hello)
        # Wait a little longer than the store does, so its answer (which names the ranks that
        # never joined) arrives before this rank gives up on its own.
        link.timeout = spec.timeout + 2.0
        with doing("rendezvous (waiting for every rank to join)"):
            reply = link.recv_json(Kind.CONTROL)
    except CommError as e:
        raise RendezvousError(str(e)) from None
    finally:
        link.close()
    if "refusal" in reply:
        raise ConfigError(str(reply["refusal"]))
    return reply["addrs"], reply.get("models") or {}
