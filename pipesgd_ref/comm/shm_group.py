"""One host's shared-memory group: every rank writes its array once, then reads what it needs.

The ring moves a message in 2(p-1) hops, each a frame, a wake-up and a copy; on one host every
rank can instead map one region and see every other rank's array where it lies. Two algorithms
use it (MPICH, NCCL and DeepSpeed's CPU AllReduce name them the same way):

    oneshot   each rank copies its piece into its slot, and once all p slots are full
              (one synchronisation) sums the whole piece itself, reading all p slots.
              1 synchronisation, reads p M per rank: best for small messages.
    twoshot   the same copy in; then each rank sums one p-th of the piece into the shared
              sums (the reduce-scatter); once all p shares are there (the second
              synchronisation) each rank copies the whole sum out (the all-gather).
              2 synchronisations, reads about 2 M + M/p per rank: best for larger ones.

Region layout (one anonymous memfd, mapped by all p ranks):

    offset   size               what
    0        512                news line: origin + 1 of a failure or a stop, its signal and
                                step, the reason (comm/wire.py's News)
    512      8 p (to 64)        every rank's pid (to tell a dead rank from a slow one)
    ...      2 x p x 64         control lines: [parity][rank] = gen, reduced, seq, op, dtype,
                                total length, piece, closed (u64 each; written by its rank only)
    ...      2 x (p+1) x SLOT   slots: [parity][rank], SLOT_BYTES each, and [parity][p]
                                the twoshot's sums (each rank writes its share)

A message longer than one slot goes in pieces; piece number g (counted over the job) uses
parity g mod 2 and each rank raises its `gen` to g once its slot is written. Why two parities
are enough, with no third synchronisation: a rank rewrites parity g mod 2 only at piece g + 2,
after it saw every rank arrive at piece g + 1, and a rank arrives at g + 1 only after it has
finished reading piece g.

Bitwise the ring's result: element i of chunk c (the ring's chunk_bounds) is summed in the
ring's order, x_c + x_{c+1} + ... + x_{c-1} (ranks mod p), and "mean" divides the sum once,
as the ring's owner does. So the ring's one-process simulation (comm/schedule.py) is the oracle
of both algorithms, every rank ends with the same bits, and a method's results do not depend on
which algorithm `auto` picked for a message.

Agreement and failure, as on the ring: each rank writes its collective's (seq, op, dtype,
length) beside `gen`, and a waiter compares them (CollectiveMismatch naming both ranks). A
rank that fails in a collective writes the abort line (every waiter raises PeerAborted naming
it), one that closes its communicator marks its lines closed, one that dies is found by its
pid, and a wait with no progress for `timeout` seconds is a PeerTimeout naming the ranks still
awaited.

Waiting: spin briefly, yielding the core (os.sched_yield: other ranks may share it), then
sleep in the kernel on the missing rank's word (a futex, comm/futex.py), which that rank wakes
when it writes it: a long wait takes no core from the ranks still working or computing.
Stores are ordered by x86-64's memory model (TSO): the slot's bytes are
written before `gen`, and read after it, without fences; the group is used only there.

How the ranks share the region: rank 0 makes it and passes its file descriptor along the ring's
unix sockets (SCM_RIGHTS) once the ring is up, each rank mapping it and passing it on; nothing
is named, and the kernel frees it when the last rank exits (comm/shm.py does the same per link).
"""

from __future__ import annotations

import mmap
import os
import platform
import time
from functools import lru_cache

import numpy as np

from pipesgd_ref.comm import futex, shm
from pipesgd_ref.comm.activity import current, doing
from pipesgd_ref.comm.schedule import chunk_bounds
from pipesgd_ref.comm.wire import CODE_OF_DTYPE, News, Op
from pipesgd_ref.errors import (
    CollectiveMismatch,
    CommError,
    PeerAborted,
    PeerClosed,
    PeerTimeout,
    RendezvousError,
)
from pipesgd_ref.runtime import lifetime

SLOT_BYTES = 512 << 10  # one rank's piece per parity: p + 1 pieces of both parities stay
# in the last-level cache (measured: 16 MB in 5.2 ms at 512 KiB against 8-12 ms at 2-4 MiB)
LINE = 8  # u64 fields per control line (64 bytes: one cache line)
GEN, REDUCED, SEQ, OP, DTYPE, LENGTH, PIECE, CLOSED = range(LINE)
ABORT_BYTES = 512  # the news line: origin + 1, signal, step + 1 (u64 each), then the reason
NEWS_AT = 24
SPIN_SECONDS = 50e-6  # yield-and-look this long before sleeping on a futex
LIVENESS_SECONDS = 0.05  # while sleeping, look this often for dead or closed ranks
ALGORITHMS = ("oneshot", "twoshot")


def supported() -> bool:
    """Whether this machine orders plain stores as the group needs (x86-64: TSO)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _pid_bytes(p: int) -> int:
    return -(-8 * p // 64) * 64


def region_bytes(p: int) -> int:
    return ABORT_BYTES + _pid_bytes(p) + 2 * p * LINE * 8 + 2 * (p + 1) * SLOT_BYTES


class ShmGroup:
    """This rank's view of the group's region (module docstring): its control lines, slots and
    the collectives on them."""

    def __init__(self, region: mmap.mmap, rank: int, p: int, timeout: float):
        self.region, self.rank, self.p, self.timeout = region, rank, p, timeout
        raw = np.frombuffer(region, np.uint8)
        self.abort_line = raw[:ABORT_BYTES]
        ctrl = ABORT_BYTES + _pid_bytes(p)
        self.pids = raw[ABORT_BYTES : ABORT_BYTES + 8 * p].view(np.uint64)
        ctrl_end = ctrl + 2 * p * LINE * 8
        self.lines = raw[ctrl:ctrl_end].view(np.uint64).reshape(2, p, LINE)
        self._base = self.lines.ctypes.data  # where the control words lie (futex addresses)
        # [parity][rank]: each rank's piece; [parity][p]: twoshot's sums, each rank its share
        self.slots = raw[ctrl_end:].reshape(2, p + 1, SLOT_BYTES)
        self.gen = int(self.lines[0, rank, GEN])  # pieces this rank has done (0 when new)
        # Bytes this rank wrote into the region for the others to read (its pieces, and
        # twoshot's shares of the sums): what it "sent" through shared memory.
        self.bytes_written = 0

    def introduce(self) -> None:
        """Write this rank's pid; wait until every rank has written its own."""
        self.pids[self.rank] = os.getpid()
        deadline = time.monotonic() + self.timeout
        while (missing := [q for q in range(self.p) if not self.pids[q]]) and (
            time.monotonic() < deadline
        ):
            time.sleep(1e-3)
        if missing:
            raise PeerTimeout(
                f"rank {self.rank}: rank(s) {', '.join(map(str, missing))} did not map the "
                f"shared-memory group within {self.timeout:.1f} s",
                origin=missing[0],
                doing=current(),
            )

    # --- the collectives ------------------------------------------------------------------

    def allreduce(self, flat: np.ndarray, op: Op, seq: int, algo: str) -> int:
        """Sum (or mean) `flat` in place across the group with `algo`, piece by piece. Returns
        the bytes this rank wrote into the region for the others to read (`bytes_written`)."""
        per = SLOT_BYTES // flat.itemsize
        bounds = _bounds(flat.size, self.p)  # the ring's chunks: its order of additions
        written = 0  # elements
        for a in range(0, max(flat.size, 1), per):
            b = min(a + per, flat.size)
            with doing(f"allreduce #{seq} ({algo}, shared memory, elements {a}..{b})"):
                if algo == "oneshot":
                    written += self._oneshot(flat, a, b, op, seq, bounds)
                else:
                    written += self._twoshot(flat, a, b, op, seq, bounds)
        self.bytes_written += written * flat.itemsize
        return written * flat.itemsize

    def _arrive(self, flat: np.ndarray, a: int, b: int, op: Op, seq: int) -> tuple[int, np.ndarray]:
        """Write this rank's piece into its slot and say so; returns (piece, the p rows)."""
        g = self.gen + 1
        par = g % 2
        rows = self.slots[par, :, : (b - a) * flat.itemsize].view(flat.dtype)  # p + 1 rows
        rows[self.rank] = flat[a:b]
        line = self.lines[par, self.rank]
        line[SEQ], line[OP], line[DTYPE] = seq, int(op), CODE_OF_DTYPE[flat.dtype]
        line[LENGTH], line[PIECE] = flat.size, a
        self._publish(par, GEN, g)  # last: the slot and description are there before anyone looks
        self.gen = g
        self._wait(GEN, g)
        return g, rows

    def _oneshot(self, flat, a, b, op, seq, bounds) -> int:
        """One piece [a, b) by oneshot; returns the elements written for the others: the
        piece, into this rank's slot."""
        _, rows = self._arrive(flat, a, b, op, seq)
        for c, (s, e) in enumerate(bounds):
            s, e = max(s, a), min(e, b)
            if s < e:
                self._ordered_sum(rows, s - a, e - a, c, flat[s:e], op)
        return b - a

    def _twoshot(self, flat, a, b, op, seq, bounds) -> int:
        """One piece [a, b) by twoshot; returns the elements written for the others: the
        piece, into this rank's slot, and this rank's share of the sums."""
        g, rows = self._arrive(flat, a, b, op, seq)
        work = _bounds(b - a, self.p)  # who sums what of this piece
        s0, e0 = work[self.rank]
        sums = rows[self.p]
        for c, (s, e) in enumerate(bounds):  # my share, cut where the ring's order changes
            s, e = max(s - a, s0), min(e - a, e0)
            if s < e:
                self._ordered_sum(rows, s, e, c, sums[s:e], op)
        self._publish(g % 2, REDUCED, g)
        self._wait(REDUCED, g)
        flat[a:b] = sums
        return (b - a) + (e0 - s0)

    def _ordered_sum(self, rows, s: int, e: int, first: int, out: np.ndarray, op: Op) -> None:
        """out = rows[first][s:e] + rows[first + 1][s:e] + ... (mod p): the ring's order for
        chunk `first`; "mean" divides the sum once, as the ring's owner does."""
        p = self.p
        np.add(rows[first, s:e], rows[(first + 1) % p, s:e], out=out)
        for k in range(2, p):
            np.add(out, rows[(first + k) % p, s:e], out=out)
        if op == Op.ALLREDUCE_MEAN:
            out /= out.dtype.type(p)

    # --- waiting ----------------------------------------------------------------------------

    def _wait(self, field: int, g: int) -> None:
        """Until every rank's `field` of piece g's lines reaches g; then check they describe
        the same collective as ours."""
        lines = self.lines[g % 2]
        column = lines[:, field]
        if column.min() < g:
            self._wait_slowly(column, g, field)
        if field == GEN:
            self._check_agree(lines)

    def _wait_slowly(self, column: np.ndarray, g: int, field: int) -> None:
        """Spin a moment (a peer that is about to arrive is seen without a system call), then
        sleep in the kernel on the first missing rank's word (futex): the core goes to the
        ranks still working, and the word's writer wakes us. Every LIVENESS_SECONDS the sleep
        ends anyway, to look for dead or closed ranks and the timeout."""
        start = now = time.monotonic()
        seen, progress, look = int(column.sum()), now, now + LIVENESS_SECONDS
        while column.min() < g:
            self._check_abort()
            now = time.monotonic()
            if now - start < SPIN_SECONDS:
                os.sched_yield()
                continue
            if (total := int(column.sum())) != seen:
                seen, progress = total, now
            if now > look:
                look = now + LIVENESS_SECONDS
                self._check_alive(column, g)
                if now - progress > self.timeout:
                    raise self._timed_out(column, g, field)
            q = int(np.argmin(column))
            value = int(column[q])
            if value < g:
                futex.wait(self._address(g % 2, q, field), value, LIVENESS_SECONDS)

    def _address(self, par: int, rank: int, field: int) -> int:
        """The address of a control word in this process (a futex is the word itself)."""
        return self._base + ((par * self.p + rank) * LINE + field) * 8

    def _publish(self, par: int, field: int, g: int) -> None:
        """Set this rank's word to g (after everything it announces is written), and wake the
        ranks asleep on it."""
        self.lines[par, self.rank, field] = g
        futex.wake(self._address(par, self.rank, field))

    def _wake_everyone(self) -> None:
        for par in range(2):
            for q in range(self.p):
                for field in (GEN, REDUCED):
                    futex.wake(self._address(par, q, field))

    def _awaited(self, column: np.ndarray, g: int) -> list[int]:
        return [q for q in range(self.p) if int(column[q]) < g]

    def _check_alive(self, column: np.ndarray, g: int) -> None:
        for q in self._awaited(column, g):
            closed = bool(self.lines[0, q, CLOSED] or self.lines[1, q, CLOSED])
            pid = int(self.pids[q])
            if closed or not _alive(pid):
                how = "closed its communicator" if closed else f"failed: its process {pid} exited"
                raise PeerClosed(
                    f"rank {self.rank}: rank {q} {how} during {current()}; it failed or "
                    f"stopped (its own error says why)",
                    origin=q,
                    doing=current(),
                )

    def _timed_out(self, column: np.ndarray, g: int, field: int) -> PeerTimeout:
        late = self._awaited(column, g)
        names = ", ".join(map(str, late))
        what = "wrote its piece" if field == GEN else "summed its share"
        return PeerTimeout(
            f"rank {self.rank}: rank(s) {names} never {what} in the shared-memory group within "
            f"{self.timeout:.1f} s during {current()}; is it alive, or in another collective? "
            f"raise --timeout to wait longer",
            origin=late[0],
            doing=current(),
        )

    def _check_agree(self, lines: np.ndarray) -> None:
        mine = lines[self.rank, SEQ : PIECE + 1]
        if (lines[:, SEQ : PIECE + 1] == mine).all():  # one comparison for all ranks
            return
        for q in range(self.p):
            if q != self.rank and not np.array_equal(lines[q, SEQ : PIECE + 1], mine):
                theirs = lines[q]
                raise CollectiveMismatch(
                    f"rank {self.rank}: rank {q} is in collective #{int(theirs[SEQ])} (op "
                    f"{int(theirs[OP])}, dtype code {int(theirs[DTYPE])}, {int(theirs[LENGTH])} "
                    f"elements) while this rank is in #{int(mine[0])} (op {int(mine[1])}, dtype "
                    f"code {int(mine[2])}, {int(mine[3])} elements), {current()}: every rank "
                    f"must call the same collectives in the same order, with the same dtype "
                    f"and length",
                    origin=q,
                    doing=current(),
                )

    # --- failure ------------------------------------------------------------------------------

    def _check_abort(self) -> None:
        words = self.abort_line[:NEWS_AT].view(np.uint64)
        if not words[0]:
            return
        reason = bytes(self.abort_line[NEWS_AT:]).rstrip(b"\0").decode(errors="replace")
        signum, step = int(words[1]), int(words[2])
        news = News(int(words[0]) - 1, reason, signum, step - 1 if step else None)
        if signum:  # a rank stopped on a signal: this one stops as if it had received it
            lifetime.heard_stop(signum)
        text = news.cannot_finish(self.rank, current(), "news from the shared-memory group")
        raise PeerAborted(text, origin=news.origin, doing=current())

    def abort(self, error: BaseException) -> None:
        """Tell every rank of the group that a collective failed (the first story stays)."""
        origin = getattr(error, "origin", None)
        self.tell(News(self.rank if origin is None else origin, str(error)))

    def tell(self, news: News) -> bool:
        """Write `news` (a failure, or a stop on a signal: Communicator.tell_stopped) where every
        waiting rank looks, and wake them; the first story stays. True when written."""
        if self.abort_line is None:
            return False
        words = self.abort_line[:NEWS_AT].view(np.uint64)
        if words[0]:
            return False
        text = news.reason.encode()[: ABORT_BYTES - NEWS_AT]
        self.abort_line[NEWS_AT:] = 0
        self.abort_line[NEWS_AT : NEWS_AT + len(text)] = np.frombuffer(text, np.uint8)
        words[1], words[2] = news.signal, 0 if news.step is None else news.step + 1
        assert news.origin is not None  # tell_stopped's news names this rank
        words[0] = news.origin + 1  # last: the story is there before anyone reads it
        self._wake_everyone()  # whoever sleeps on a word looks at the abort line now
        return True

    def close(self) -> None:
        """Mark this rank gone, so no one waits on it for the whole timeout."""
        if self.lines is not None:
            self.lines[:, self.rank, CLOSED] = 1
            self._wake_everyone()
        self.lines = self.slots = self.abort_line = self.pids = None  # type: ignore[assignment]  # closed: views dropped so the mapping can close


@lru_cache(maxsize=64)
def _bounds(n: int, p: int) -> tuple[tuple[int, int], ...]:
    """chunk_bounds, kept: a training run reduces the same sizes every step."""
    return tuple(chunk_bounds(n, p))


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


# --- forming the group along the ring ---------------------------------------------------------


def wanted(spec, addrs: list[dict]) -> bool:
    """Whether this job (a rendezvous JobSpec) forms a shared-memory group: its AllReduce
    may use it (auto, oneshot, twoshot), every rank is on this host, the links are shared
    memory and not emulated (the group bypasses links). Every rank computes the same answer from
    the table; an explicit oneshot or twoshot that cannot have it is an error saying why."""
    if spec.allreduce not in ("auto", *ALGORITHMS):
        return False
    why = None
    if len({a["node"] for a in addrs}) > 1:
        why = "every rank on one host"
    elif len({a.get("pidns", "") for a in addrs}) > 1:  # containers sharing a host's network
        why = "every rank in one PID namespace (each checks the others' pids for liveness)"
    elif spec.transport not in ("shm", "auto"):
        why = "--transport shm or auto (this job's links are " + spec.transport + ")"
    elif spec.link.enabled:
        why = "links that are not emulated (the group bypasses the links)"
    elif not supported():
        why = "an x86-64 machine (its stores are ordered as the group needs)"
    if why is not None and spec.allreduce != "auto":
        raise RendezvousError(f"rank {spec.rank}: --allreduce {spec.allreduce} needs {why}")
    return why is None


def form(comm) -> ShmGroup:
    """Share one region among all ranks of `comm`, whose ring links are all shared memory
    (unix sockets under them): rank 0 makes it and passes its descriptor to the right; every
    other rank receives it from the left, maps it and passes it on. Each rank then writes its
    pid, and waits for everyone's (the group is formed when all p have mapped it)."""
    p, rank, timeout = comm.world_size, comm.rank, comm.timeout
    size = region_bytes(p)
    with doing("forming the shared-memory group"):
        if rank == 0:
            fd = os.memfd_create("pipesgd-group", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)  # sparse: pages are backed when first written
        else:
            fd = shm.recv_fd(comm.left.sock, rank, comm.left.peer, timeout)
        try:
            if os.fstat(fd).st_size != size:
                raise CommError(
                    f"rank {rank}: rank {comm.left.peer}'s shared-memory group region has the "
                    f"wrong size (another version of pipesgd, or another world size?)"
                )
            region = mmap.mmap(fd, size)
            if rank < p - 1:
                shm.send_region(comm.right.sock, fd)
        finally:
            os.close(fd)  # the mapping keeps the memory alive
        group = ShmGroup(region, rank, p, comm.timeout)
        group.introduce()
    return group
