"""Ring AllReduce: every rank ends with the sum (or mean) of every rank's array.

p ranks in a ring; rank r sends to its right neighbour r+1 and receives from its left one r-1.
The array (n numbers, M bytes) is cut into p chunks of about n/p numbers:

    reduce-scatter, ring steps s = 0 .. p-2:
        rank r sends chunk (r - s) mod p and receives chunk (r - s - 1) mod p, adding it into
        its own copy. After p-1 ring steps rank r holds the complete sum of chunk (r + 1) mod p.
    all-gather, ring steps s = 0 .. p-2:
        rank r sends chunk (r + 1 - s) mod p, complete, and receives chunk (r - s) mod p,
        which overwrites its own copy.

Cost per rank: 2(p-1) messages, 2(p-1)/p * M bytes sent (the same for any p: bandwidth
optimal), (p-1)/p * M bytes of additions:

    T_ring = 2(p-1) * (alpha + M / (p B)) + (p-1)/p * M * gamma

Chunk c is summed in one fixed order, x_c + x_{c+1} + ... + x_{c-1} (by rank, round the ring
from c), by one rank each step, and the all-gather copies the result's bytes: every rank ends
with the same bits, whatever the timing. `simulate` runs the same schedule in one process.
(The "ring step" here is one of the 2(p-1) exchanges; the training step is one iteration t.)
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from pipesgd_ref.core.wire import Link, exchange


def chunk_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """[start, stop) of each of p chunks of n numbers; sizes differ by at most one, the larger
    ones first (n = 10, p = 4: 3, 3, 2, 2)."""
    base, extra = divmod(n, p)
    starts = [c * base + min(c, extra) for c in range(p + 1)]
    return list(pairwise(starts))


def ring_allreduce(rank: int, p: int, left: Link, right: Link, x: np.ndarray, mean=True):
    """x = the sum over the ranks (the mean when `mean`), in place, on every rank."""
    if p == 1:
        return x
    bounds = chunk_bounds(x.size, p)
    inbox = np.empty(bounds[0][1] - bounds[0][0], x.dtype)  # the largest chunk, reused
    for s in range(p - 1):  # --- reduce-scatter
        send, recv = (rank - s) % p, (rank - s - 1) % p
        (a, b), (c, d) = bounds[send], bounds[recv]
        got = inbox[: d - c]
        exchange(right, left, s, (send, x[a:b]), (recv, got))
        mine = x[c:d]
        np.add(got, mine, out=mine)  # the running sum arrives, our own term joins
        if s == p - 2 and mean:
            mine /= mine.dtype.type(p)  # the chunk's owner scales it, once
    for s in range(p - 1):  # --- all-gather: complete chunks go round, straight into place
        send, recv = (rank + 1 - s) % p, (rank - s) % p
        (a, b), (c, d) = bounds[send], bounds[recv]
        exchange(right, left, p - 1 + s, (send, x[a:b]), (recv, x[c:d]))
    return x


def simulate(arrays: list[np.ndarray], mean: bool = True) -> list[np.ndarray]:
    """The same schedule in one process, all p ranks in lock step: the same chunks, the same
    additions in the same order, so its results are bitwise the real ring's."""
    p = len(arrays)
    x = [a.copy() for a in arrays]
    bounds = chunk_bounds(x[0].size, p)
    for s in range(p - 1):  # reduce-scatter: every rank sends, then every rank adds
        sent = [x[r][slice(*bounds[(r - s) % p])].copy() for r in range(p)]
        for r in range(p):
            mine = x[r][slice(*bounds[(r - s - 1) % p])]
            np.add(sent[(r - 1) % p], mine, out=mine)
            if s == p - 2 and mean:
                mine /= mine.dtype.type(p)
    for s in range(p - 1):  # all-gather
        sent = [x[r][slice(*bounds[(r + 1 - s) % p])].copy() for r in range(p)]
        for r in range(p):
            x[r][slice(*bounds[(r - s) % p])] = sent[(r - 1) % p]
    return x
