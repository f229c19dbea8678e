"""Rendezvous: how p processes that know only rank 0's address find each other.

    1. Every rank opens a listening socket for its data links (port 0: the OS picks a free one).
    2. Rank 0 also hosts a small store on MASTER_ADDR:MASTER_PORT.
    3. Every rank (rank 0 too) connects to the store and registers (token, rank, world size,
       its listening address, the options every rank must give alike). When all p have
       registered, the store compares their options (one that differs, --allreduce or
       --transport included, refuses every rank in one line naming it and the ranks: before any
       link, so the check cannot depend on what differs) and sends everyone the table of
       addresses, with the AllReduce figures rank 0 read (comm/choose.py), and closes.
    4. Each rank connects to its right neighbour (rank + 1 mod p) and accepts its left neighbour
       (rank - 1 mod p): the ring. Then the listeners close.

Transports (`JobSpec.transport`, `--transport`). Each link is one of
    tcp     a TCP connection: between hosts, and the path the tutorials teach
    unix    an AF_UNIX stream socket: peers on one host, no TCP/IP stack
    shm     an AF_UNIX socket for the headers, the payloads through shared slots (comm/shm.py)
    auto    the default, as NCCL and Open MPI choose their own: per link, from what the
            rendezvous learns, `SAME_HOST` for two ranks on one host, tcp across hosts
Every rank registers its host (`node_id`: the boot id and the network namespace, since a unix
socket reaches only its own namespace), its PID namespace (ranks in two, as containers sharing
a host's network are, cannot check each other's pids: no shared-memory group between them)
and, unless the job is tcp-only, a unix listener (an abstract address: no file to clean up);
both ends of a link derive its transport from the table, and the acceptor checks the
connector's claim. unix or shm asked for between two hosts is an error naming both ranks.

A per-job token travels in every HELLO and is compared in constant time. A connection with a
wrong token, a wrong or malformed field, or bytes that are not a frame is refused with a reason
and logged; one that says nothing within HELLO_TIMEOUT is dropped as a stranger. Hellos are read
concurrently (comm/hellos.py), so idle connections hold up no one, and rendezvous goes on waiting
for the real peer. A process without the token gets nothing: no address table, no rank.
What the token protects against depends on where it comes from:
    local jobs    a random 128-bit token (`new_token`), handed to the workers by the launcher:
                  no other process can join or learn the job's addresses
    PIPESGD_JOB_TOKEN   a secret the launcher or scheduler exports to every rank: the same, for
                  anyone who cannot read a rank's environment (the same user, or root, can)
    the default   sha256 of MASTER_ADDR and MASTER_PORT (runtime/jobenv.py), which anyone can
                  compute: it keeps jobs on different addresses or ports apart and turns away
                  programs that are not pipesgd, but keeps out no one who means to join
The token is not encryption: the links carry gradients in the clear.
Listeners bind to loopback unless another interface is asked for (`bind`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import select
import socket
import time
from dataclasses import dataclass, field

from pipesgd_ref.comm import choose, shm, shm_group
from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.hellos import HELLO_TIMEOUT, HelloReader, where
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.mesh import JOBS_WITH_MESH, mesh_peers
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.sockets import (
    connect,
    connect_unix,
    listen,
    listen_unix,
)
from pipesgd_ref.comm.store import Store, refuse, register, token_ok
from pipesgd_ref.comm.wire import Kind
from pipesgd_ref.errors import RendezvousError

log = logging.getLogger("pipesgd.rendezvous")
TRANSPORTS = ("auto", "tcp", "unix", "shm")
# The AllReduce algorithms a job may ask for (`--allreduce`; comm/choose.py): the ring, recursive
# doubling and Rabenseifner over links (comm/algorithms.py, comm/mesh.py), the shared-memory
# group's one-shot and two-shot (comm/shm_group.py), or `auto`: per message, the one whose
# calibrated model is fastest.
ALLREDUCE = ("auto", "ring", "rd", "rab", "oneshot", "twoshot")
# What `auto` picks between two ranks on one host: the fastest path (measured by
# `pipesgd bench allreduce --transport tcp,unix,shm`; benchmarks/RESULTS.md).
SAME_HOST = "shm"


def new_token() -> str:
    """A random job token: 128 bits, hex."""
    return secrets.token_hex(16)


@dataclass(frozen=True)
class JobSpec:
    """Everything a rank needs to join a job."""

    rank: int
    world_size: int
    master_addr: str = "127.0.0.1"  # where rank 0's store listens
    master_port: int = 29500  # the store's port
    token: str = ""  # the job token every connection must present
    bind: str = "127.0.0.1"  # interface for this rank's listeners; 0.0.0.0 = all
    timeout: float = 30.0  # seconds any single wait may take before it is an error
    link: LinkSpec = field(default_factory=LinkSpec)  # link emulation on every data link
    transport: str = "auto"  # auto | tcp | unix | shm: how data links are made (module doc)
    allreduce: str = "ring"  # the AllReduce algorithm (ALLREDUCE), or auto: chosen per message
    # Options every rank of the job must give alike, beyond these fields ({option: value}, as
    # a joined rank's command line gave them): compared by the store before any link is made.
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world_size - 1}")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.transport not in TRANSPORTS:
            choices = ", ".join(TRANSPORTS)
            raise ValueError(f"transport must be one of {choices}, got {self.transport!r}")
        if self.allreduce not in ALLREDUCE:
            choices = ", ".join(ALLREDUCE)
            raise ValueError(f"allreduce must be one of {choices}, got {self.allreduce!r}")


def link_transport(wanted: str, rank: int, peer: int, addrs: list[dict]) -> str:
    """The transport of the link between `rank` and `peer` (both ends compute the same)."""
    same_host = addrs[rank]["node"] == addrs[peer]["node"]
    if wanted == "auto":
        return SAME_HOST if same_host else "tcp"
    if wanted != "tcp" and not same_host:
        raise RendezvousError(
            f"rank {rank}: --transport {wanted} needs ranks {rank} and {peer} on one host, but "
            f"they are on {addrs[rank]['node']} and {addrs[peer]['node']}; use --transport "
            f"auto (tcp between hosts) or tcp"
        )
    return wanted


STRAGGLER_WAIT = 0.2  # s: how long a formed job waits for hellos being read before answering them


def _accept_peers(
    listeners: list[socket.socket], spec: JobSpec, expected: set[tuple[str, int]], addrs: list
) -> dict[tuple[str, int], Link]:
    """Accept connections (on the tcp listener, and the unix one when the job has it) until
    every expected (purpose, rank) has said hello with the job's token over the transport both
    ends derive from the table; refuse anything else (wrong token, unexpected rank, another
    transport, garbage) and keep waiting. Each connection reads its hello in a thread of its own
    (comm/hellos.py), so strangers that connect and say nothing hold up no one."""
    deadline = time.monotonic() + spec.timeout
    links: dict[tuple[str, int], Link] = {}
    hellos = HelloReader(
        spec.rank, lambda conn: Link(conn, spec.rank, -1, HELLO_TIMEOUT, spec=spec.link)
    )
    try:
        while len(links) < len(expected):
            if time.monotonic() > deadline:
                missing = sorted(expected - set(links), key=lambda k: k[1])
                names = ", ".join(f"rank {r} ({what})" for what, r in missing)
                raise RendezvousError(
                    f"rank {spec.rank}: {names} did not connect within {spec.timeout:.1f} s; "
                    f"did it crash? raise --timeout to wait longer"
                )
            ready, _, _ = select.select(listeners, [], [], 0.02)
            for listener in ready:
                hellos.accept(listener)
            said = hellos.take(0.0 if ready else 0.03)
            if said is not None:
                with doing("hello"):
                    _admit(*said, spec, expected, addrs, links)
        # The job formed. A connection that said hello meanwhile is refused with its reason
        # (a hello read a moment too late would otherwise see only a closed connection).
        hellos.settle(STRAGGLER_WAIT)
        while (said := hellos.take(0.0)) is not None:
            with doing("hello"):
                _admit(*said, spec, expected, addrs, links)
    finally:
        hellos.close()
    return links


def _admit(link: Link, hello: dict, addr, spec: JobSpec, expected, addrs, links: dict) -> None:
    """A connection that said `hello`: the peer `expected` of it joins `links` (welcomed, or,
    over shm, given this rank's region); anything else is refused."""
    key = (hello.get("purpose"), hello.get("rank"))
    reason, how = _peer_refusal(hello, key, link, spec, expected, links, addrs)
    if reason:
        log.warning("rank %d: refused a connection from %s:%s: %s", spec.rank, *where(addr), reason)
        refuse(link, reason, "hello")
        return
    peer = key[1]
    assert isinstance(peer, int)  # _peer_refusal admits a rank number only
    link.peer, link.timeout = peer, spec.timeout
    if how == "shm":  # the connector's region came right after its hello
        link = _shm_link(link, theirs=shm.recv_region(link.sock, spec.rank, peer, spec.timeout))
    else:
        link.send_json(Kind.WELCOME, {})
    links[key] = link


def _peer_refusal(hello, key, link, spec, expected, links, addrs) -> tuple[str | None, str]:
    """(why a peer's hello is refused, None when it is not; the link's transport)."""
    if not token_ok(hello.get("token"), spec.token):
        return "wrong job token", ""
    if not all(isinstance(part, (str, int)) for part in key):
        return f"a hello naming purpose {key[0]!r} and rank {key[1]!r}", ""
    if key not in expected or key in links:
        return f"unexpected {key[0]!r} connection from rank {key[1]!r}", ""
    how = link_transport(spec.transport, spec.rank, key[1], addrs)
    if (how == "tcp") != (link.transport == "tcp"):  # shm's headers travel on a unix socket
        return f"rank {key[1]} connected over {link.transport}, this rank expects {how}", how
    if how != "tcp" and hello.get("transport") != how:
        return (
            f"rank {key[1]} asks for transport {hello.get('transport')!r}, this rank "
            f"expects {how!r}; do all ranks run the same --transport?"
        ), how
    return None, how


def _shm_link(link: Link, theirs=None, ours=None) -> shm.ShmLink:
    """The shared-memory link over a unix link whose hello is done. Acceptor (`theirs` given,
    the connector's region): make ours, say WELCOME, hand ours over. Connector (`ours` given,
    sent after its hello): wait for WELCOME, then the acceptor's region."""
    if theirs is None:
        with doing("shm hello"):
            link.recv_json(Kind.WELCOME)
        theirs = shm.recv_region(link.sock, link.rank, link.peer, link.timeout)
    else:
        fd, ours = shm.new_region()
        with doing("hello"):
            link.send_json(Kind.WELCOME, {})
        try:
            shm.send_region(link.sock, fd)
        finally:
            os.close(fd)  # the peer has its own descriptor now; the mapping stays
    return shm.ShmLink(
        link.sock,
        link.rank,
        link.peer,
        link.timeout,
        ours,
        theirs,
        spec=link.spec,
        max_frame_bytes=link.max_frame_bytes,
    )


def init_process_group(
    spec: JobSpec, star: bool = False, store_sock: socket.socket | None = None
) -> Communicator:
    """Join the job described by `spec`; returns this rank's Communicator with its ring links
    ready, and with `star=True` also the links of a star around rank 0 (the parameter server):
    `comm.server` on ranks 1..p-1, `comm.clients[r]` on rank 0. Each link is of the transport
    `link_transport` derives from spec.transport and where the two ranks run. `store_sock`
    (rank 0): the store's listener, already bound by a launcher that holds the port from the
    moment it checked it (runtime/launch.py), so no other job can take it in between."""
    store = Store(spec, store_sock) if spec.rank == 0 else None
    if store is not None and spec.master_port == 0:  # port 0: the store picked one
        spec = dataclasses.replace(spec, master_port=store.port)
    listeners = [listen(spec.bind, 0, "data links", spec.rank)]
    if spec.transport != "tcp":
        listeners.append(listen_unix())
    unix = listeners[1].getsockname()[1:].decode() if len(listeners) > 1 else ""
    host = "" if spec.bind in ("", "0.0.0.0") else spec.bind
    opened: list[Link] = []
    try:
        addrs, models = register(spec, listeners[0].getsockname()[1], host, unix)
        if spec.world_size == 1:
            return Communicator(spec, None, None, host)
        grouped = shm_group.wanted(spec, addrs)  # one host's group serves auto: no mesh then
        mesh = spec.allreduce in JOBS_WITH_MESH and not (grouped and spec.allreduce == "auto")
        comm = _link_up(spec, star, listeners, addrs, host, opened, mesh)
        if grouped:
            comm.group = shm_group.form(comm)
        if spec.allreduce == "auto":  # (else a caller asking for auto reads them itself)
            comm.auto_models = {t: {a: tuple(m) for a, m in f.items()} for t, f in models.items()}
        comm.auto_transport = job_transport(spec, addrs, mesh)
        opened.clear()
        return comm
    finally:
        for link in opened:  # only when forming the job failed half way
            link.close()
        for listener in listeners:
            listener.close()
        if store is not None:
            store.thread.join(timeout=spec.timeout)


def job_transport(spec: JobSpec, addrs: list[dict], mesh: bool) -> str:
    """The slowest transport among the job's links (the ring's, and the mesh's when it has
    one), from the table every rank holds: the transport whose figures `auto` chooses by, the
    same on every rank (two hosts of two ranks each: tcp, though half the ring is shm)."""
    p = spec.world_size
    pairs = {(r, (r + 1) % p) for r in range(p)}
    if mesh:
        pairs |= {(r, q) for r in range(p) for q in mesh_peers(r, p)}
    return choose.slowest({link_transport(spec.transport, a, b, addrs) for a, b in pairs})


def _link_up(spec: JobSpec, star: bool, listeners, addrs, host: str, opened: list, mesh: bool):
    """Make this rank's links: to its right neighbour (and, `star`, a worker's to rank 0), and
    from its left neighbour (and rank 0's from every worker); in a job whose AllReduce may be
    rd or rab, one link to each of their peers (`comm.mesh`, comm/mesh.py: one connection per
    pair, used both ways, made by the lower rank). Connect first, then accept:
    connect() completes against the peer's listen backlog, so no rank waits for another to
    reach accept(); then both sides exchange hellos. `opened` collects every link made."""
    p, rank = spec.world_size, spec.rank
    targets = [("ring", (rank + 1) % p)]
    expected = {("ring", (rank - 1) % p)}
    if star and rank != 0:
        targets.append(("star", 0))
    if star and rank == 0:
        expected |= {("star", r) for r in range(1, p)}
    if mesh:  # rd / rab peers (comm/mesh.py): the lower connects
        targets += [("mesh", q) for q in sorted(mesh_peers(rank, p)) if q > rank]
        expected |= {("mesh", q) for q in mesh_peers(rank, p) if q < rank}
    outgoing, regions = {}, {}
    for key in targets:  # (purpose, peer)
        with doing(f"{key[0]} hello"):
            link, regions[key] = _say_hello(spec, *key, addrs)
        opened.append(link)
        outgoing[key] = link
    incoming = _accept_peers(listeners, spec, expected, addrs)
    opened.extend(incoming.values())
    for key, link in list(outgoing.items()):
        if regions[key] is not None:
            outgoing[key] = _shm_link(link, ours=regions[key])
        else:
            with doing(f"{key[0]} hello"):
                link.recv_json(Kind.WELCOME)
    comm = Communicator(spec, incoming[("ring", (rank - 1) % p)], outgoing[targets[0]], host)
    comm.server = outgoing.get(("star", 0))
    comm.clients = {r: link for (what, r), link in incoming.items() if what == "star"}
    both = {**incoming, **outgoing}
    comm.mesh = {r: link for (what, r), link in sorted(both.items()) if what == "mesh"}
    for link in comm.mesh.values():
        link.two_way = True
    return comm


def _say_hello(spec: JobSpec, purpose: str, peer: int, addrs: list):
    """(link to `peer`, this rank's shm region for it or None): connected over the transport
    both ends derive, hello said; over shm our region goes with the hello (the acceptor maps
    it if it accepts us, before it answers)."""
    how = link_transport(spec.transport, spec.rank, peer, addrs)
    what = f"rank {peer} ({purpose})"
    if how == "tcp":
        sock = connect(
            addrs[peer]["host"], addrs[peer]["port"], spec.rank, spec.timeout, peer, what
        )
    else:
        sock = connect_unix(addrs[peer]["unix"], spec.rank, spec.timeout, peer, what)
    link = Link(sock, spec.rank, peer, spec.timeout, spec=spec.link)
    hello = {"token": spec.token, "rank": spec.rank, "purpose": purpose, "transport": how}
    link.send_json(Kind.HELLO, hello)
    region = None
    if how == "shm":
        fd, region = shm.new_region()
        try:
            shm.send_region(sock, fd)
        finally:
            os.close(fd)
    return link, region
