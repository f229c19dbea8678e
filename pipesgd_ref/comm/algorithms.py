"""AllReduce algorithms besides the ring, as schedules: which peer a rank talks to at each step,
which elements it sends, which it receives, and whether it adds or copies them.

The ring (comm/schedule.py) takes 2(p-1) steps whatever the message: right for large messages,
where only the bytes matter, and slow for small ones, where every step's latency does. MPICH
chooses by size (Thakur, Rabenseifner and Gropp, 2005); the two algorithms it uses below the
ring are written here:

    recursive doubling ("rd"), for small messages: log2(p) steps; at step k rank v exchanges
        the WHOLE array with rank v xor 2^k and adds. Latency-optimal, sends n per step.
    Rabenseifner ("rab"), for medium ones: a reduce-scatter by recursive halving (log2(p)
        steps; at each, a rank keeps half of its current range, sends the other half to its
        partner and adds the half it receives), after which rank v holds the complete sum of
        chunk v; then an all-gather by recursive doubling (log2(p) steps, the ranges grow back).
        2 log2(p) steps, and the ring's 2(p-1)/p n elements on the wire per rank.

p not a power of two: with p2 the largest power of two <= p and e = p - p2, the first 2e ranks
pair up before the algorithm: even rank 2i sends its array to 2i+1, which adds it, and sits
out; the p2 ranks left run the algorithm as virtual ranks 0..p2-1; at the end 2i+1 sends the
result back to 2i. Two more steps, n more elements each.

Bitwise agreement: every element's sum is computed by one rank and copied to the others
(Rabenseifner), or by two partners as a + b and b + a, which IEEE addition makes the same bits
(recursive doubling). So every rank ends with the same bits, as with the ring, and `simulate`
(the whole schedule in one process, p copies in lock step) is the oracle of the real ones:
the same hops, the same order of additions. `op="mean"` divides by p where a rank completes a
range (after the last adding step), before the result is copied on.

Costs (alpha-beta; M bytes, B bandwidth, gamma s per byte added), with f = 1 when p is not a
power of two (the fold and the copy back), else 0, and q = log2(p2):

    rd:   (q + 2f) alpha + (q + 2f) M/B + (q + f) M gamma
    rab:  (2q + 2f) alpha + (2 (p2-1)/p2 + 2f) M/B + ((p2-1)/p2 + f) M gamma

`cost` evaluates them; tests/test_algorithms.py checks the step counts and the bytes on the
critical path against the schedules themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesgd_ref.comm.schedule import chunk_bounds

ALGORITHMS = ("rd", "rab")


@dataclass(frozen=True)
class Hop:
    """What one rank does at one step: exchange with `peer`. `send` and `recv` are [start,
    stop) element ranges (None: nothing that way); `add`: the received elements are added into
    recv's range (else they replace it); `finish`: after this step the rank holds the complete
    sum of `finish` (where "mean" divides)."""

    peer: int
    send: tuple[int, int] | None
    recv: tuple[int, int] | None
    add: bool
    finish: tuple[int, int] | None = None


def split(p: int) -> tuple[int, int]:
    """(p2, e): the largest power of two p2 <= p, and e = p - p2 ranks folded away."""
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def virtual_rank(rank: int, p: int) -> int | None:
    """The rank's place among the p2 that run the algorithm; None for a folded (even) rank."""
    _, e = split(p)
    if rank < 2 * e:
        return rank // 2 if rank % 2 else None
    return rank - e


def real_rank(v: int, p: int) -> int:
    _, e = split(p)
    return 2 * v + 1 if v < e else v + e


def schedule(algo: str, rank: int, p: int, n: int) -> list[Hop | None]:
    """The steps of `rank` (None: idle at that step); every rank has the same number of steps,
    and at each step a hop's peer has the mirror hop."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; choose from {', '.join(ALGORITHMS)}")
    if p == 1:
        return []
    p2, e = split(p)
    whole = (0, n)
    v = virtual_rank(rank, p)
    core = _rd(v, p2, n, p) if algo == "rd" else _rab(v, p2, n, p)
    if not e:
        return core
    if v is None:  # folded: give the array away, sit out, take the result back
        return [
            Hop(rank + 1, whole, None, False),
            *[None] * len(core),
            Hop(rank + 1, None, whole, False),
        ]
    if rank < 2 * e:  # the odd partner of a folded rank
        return [Hop(rank - 1, None, whole, True), *core, Hop(rank - 1, whole, None, False)]
    return [None, *core, None]


def _rd(v: int | None, p2: int, n: int, p: int) -> list[Hop | None]:
    steps = p2.bit_length() - 1
    if v is None:
        return [None] * steps
    hops: list[Hop | None] = []
    for k in range(steps):
        last = k == steps - 1
        peer = real_rank(v ^ (1 << k), p)
        hops.append(Hop(peer, (0, n), (0, n), True, (0, n) if last else None))
    return hops


def _rab(v: int | None, p2: int, n: int, p: int) -> list[Hop | None]:
    steps = p2.bit_length() - 1
    if v is None:
        return [None] * (2 * steps)
    bounds = chunk_bounds(n, p2)

    def elements(lo: int, hi: int) -> tuple[int, int]:  # chunks [lo, hi) as elements
        return bounds[lo][0], bounds[hi - 1][1]

    hops: list[Hop | None] = []
    lo, hi = 0, p2
    for k in range(steps):  # reduce-scatter by recursive halving: masks p2/2, p2/4, ..., 1
        mask = p2 >> (k + 1)
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        last = k == steps - 1
        hops.append(
            Hop(real_rank(v ^ mask, p), elements(*give), elements(*keep), True,
                elements(*keep) if last else None)
        )  # fmt: skip
        lo, hi = keep
    for k in range(steps):  # all-gather by recursive doubling: masks 1, 2, ..., p2/2
        mask = 1 << k
        width = hi - lo
        their = (lo + width, hi + width) if not v & mask else (lo - width, hi - width)
        hops.append(Hop(real_rank(v ^ mask, p), elements(lo, hi), elements(*their), False))
        lo, hi = min(lo, their[0]), max(hi, their[1])
    return hops


def simulate(algo: str, arrays: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """`algo` by hand in one process: p copies in lock step, each step's sends taken before
    its receives land, the receives added (np.add(received, own)) or copied as the schedule
    says. Checks that every hop has its mirror (sizes, directions), as a real run needs."""
    if op not in ("sum", "mean"):
        raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    p = len(arrays)
    bufs = [np.array(a, copy=True) for a in arrays]
    n = bufs[0].size if p else 0
    plans = [schedule(algo, r, p, n) for r in range(p)]
    for step in range(len(plans[0]) if plans else 0):
        hops = [plan[step] for plan in plans]
        sent = {}
        for r, hop in enumerate(hops):
            if hop is not None and hop.send is not None:
                sent[r] = bufs[r][slice(*hop.send)].copy()
        for r, hop in enumerate(hops):
            if hop is None:
                continue
            mirror = hops[hop.peer]
            if mirror is None or mirror.peer != r:
                raise AssertionError(f"{algo}: step {step}: rank {r} -> {hop.peer} has no mirror")
            if hop.recv is not None:
                got = sent.get(hop.peer)
                dst = bufs[r][slice(*hop.recv)]
                if got is None or got.size != dst.size:
                    raise AssertionError(
                        f"{algo}: step {step}: rank {r} expects {dst.size} elements"
                    )
                if hop.add:
                    np.add(got, dst, out=dst)
                else:
                    dst[...] = got
            if hop.finish is not None and op == "mean":
                done = bufs[r][slice(*hop.finish)]
                done /= done.dtype.type(p)
    return bufs


def cost(algo: str, p: int, nbytes: float, alpha: float, bandwidth: float, gamma: float = 0.0):
    """The alpha-beta time of `algo` on p ranks for nbytes (module docstring)."""
    if p == 1:
        return 0.0
    p2, e = split(p)
    q, f = p2.bit_length() - 1, 1 if e else 0
    wire = nbytes / bandwidth
    if algo == "rd":
        return (q + 2 * f) * (alpha + wire) + (q + f) * nbytes * gamma
    if algo == "rab":
        share = (p2 - 1) / p2
        return (2 * q + 2 * f) * alpha + (2 * share + 2 * f) * wire + (share + f) * nbytes * gamma
    raise ValueError(f"unknown algorithm {algo!r}; choose from {', '.join(ALGORITHMS)}")
