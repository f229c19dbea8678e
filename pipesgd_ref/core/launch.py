"""Start the ranks of a job on one host, wire them up, and collect what each returns.

    processes (default)   one process per rank (forked), TCP over loopback: real processes,
                          real sockets, what a job across hosts does, on one machine
    threads               one thread per rank in this process, linked by socketpairs: a
                          debugger (pdb, an IDE) sees and steps through every rank

The wiring: a ring rank dials its right neighbour (the link it sends on) and accepts its left
one (the link it receives on); a parameter server's worker dials the server. A dialler says
who it is in a 4-byte hello, since connections are accepted in whatever order they come.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import struct
import threading
import traceback

from pipesgd_ref.core.methods import Rank, pipe_worker, ps_sync, sync_worker
from pipesgd_ref.core.model import Problem
from pipesgd_ref.core.wire import Link

METHODS = {"sync": sync_worker, "pipe": pipe_worker, "ps-sync": ps_sync}
HELLO = struct.Struct("!I")


def links_of(algo: str, n: int) -> list[tuple[int, int]]:
    """(dialler, listener) of every link of a job of n ranks."""
    if algo == "ps-sync":
        return [(i, 0) for i in range(1, n)]  # a star: every worker dials the server
    return [(r, (r + 1) % n) for r in range(n)]  # a ring: every rank dials its right


def rank_of(r: int, prob: Problem, algo: str, out: dict, inn: dict) -> Rank:
    """Rank r with its links: out[peer] the link it dialled, inn[peer] the one it accepted."""
    if algo == "ps-sync":
        if r == 0:
            return Rank(r, prob, workers=[inn[i] for i in sorted(inn)])
        return Rank(r, prob, server=out[0])
    n = prob.world_size
    return Rank(r, prob, left=inn[(r - 1) % n], right=out[(r + 1) % n])


def launch(prob: Problem, algo: str, threads: bool = False, timeout: float = 60.0) -> list:
    """Run `algo` on prob.world_size workers (ps-sync: one more rank, the server); return each
    rank's result (methods.Rank.result), rank 0 first. A failed rank: RuntimeError naming it,
    with its own error. `timeout`: how long a rank waits for a peer (threads: forever)."""
    n = prob.world_size + (algo == "ps-sync")
    pairs = links_of(algo, n)
    if threads:
        return _in_threads(prob, algo, n, pairs)
    listeners = []
    for _ in range(n):  # made before any rank starts: a dial never finds no one listening
        sock = socket.create_server(("127.0.0.1", 0))
        sock.settimeout(timeout)
        listeners.append(sock)
    fork = mp.get_context("fork")  # the children get the data and code already loaded here
    pipes, procs = [], []
    for r in range(n):
        mine, theirs = fork.Pipe(duplex=False)
        args = (r, prob, algo, pairs, listeners, timeout, theirs)
        procs.append(fork.Process(target=_process, args=args, name=f"rank-{r}", daemon=True))
        procs[-1].start()
        pipes.append(mine)
        theirs.close()
    for sock in listeners:
        sock.close()
    results = []
    for r, (pipe, proc) in enumerate(zip(pipes, procs, strict=True)):
        try:
            results.append(pipe.recv())
        except EOFError:  # it died without a word: killed, or out of memory
            proc.join()
            results.append(f"rank {r} died (exit code {proc.exitcode})")
        proc.join()
    return _checked(results)


def _process(r, prob, algo, pairs, listeners, timeout, pipe) -> None:
    """The body of rank r's process: dial, accept, run the method, send the result home."""
    try:
        out = {}
        for me, peer in pairs:
            if me == r:
                out[peer] = socket.create_connection(listeners[peer].getsockname(), timeout)
                out[peer].sendall(HELLO.pack(r))
        inn = {}
        for _ in [p for p in pairs if p[1] == r]:
            sock, _ = listeners[r].accept()
            sock.settimeout(timeout)
            (peer,) = HELLO.unpack(sock.recv(HELLO.size, socket.MSG_WAITALL))
            inn[peer] = sock
        for sock in listeners:
            sock.close()
        dialled = {p: Link(s, r, p, timeout) for p, s in out.items()}
        accepted = {p: Link(s, r, p, timeout) for p, s in inn.items()}
        pipe.send(_run(rank_of(r, prob, algo, dialled, accepted), algo))
    except BaseException:
        pipe.send(f"rank {r} failed:\n{traceback.format_exc()}")


def _run(me: Rank, algo: str) -> dict:
    """Run the method; whatever happens, end this rank's links, so that a peer waiting on them
    fails at once, naming this rank, rather than waiting out its timeout."""
    try:
        return METHODS[algo](me)
    finally:
        for link in [me.left, me.right, me.server, *me.workers]:
            if link is not None:
                link.shut()


def _in_threads(prob: Problem, algo: str, n: int, pairs: list) -> list:
    """Every rank a thread of this process, each link a socketpair, no timeouts (a debugger
    may hold any rank as long as it likes)."""
    out: list[dict[int, Link]] = [{} for _ in range(n)]
    inn: list[dict[int, Link]] = [{} for _ in range(n)]
    for a, b in pairs:
        sa, sb = socket.socketpair()
        out[a][b], inn[b][a] = Link(sa, a, b, None), Link(sb, b, a, None)
    results: list = [None] * n

    def body(r: int) -> None:
        try:
            results[r] = _run(rank_of(r, prob, algo, out[r], inn[r]), algo)
        except BaseException:
            results[r] = f"rank {r} failed:\n{traceback.format_exc()}"

    ranks = [threading.Thread(target=body, args=(r,), name=f"rank-{r}") for r in range(n)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    for link in [*(x for d in out for x in d.values()), *(x for d in inn for x in d.values())]:
        link.sock.close()
    return _checked(results)


def _checked(results: list) -> list:
    """The results, or one RuntimeError with every failed rank's error."""
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError("\n".join(failed))
    return results
