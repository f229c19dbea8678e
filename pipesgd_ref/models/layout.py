"""One flat parameter vector, viewed as per-layer arrays.

Every model keeps all its parameters in ONE contiguous 1-D array and looks at slices of it as
matrices and vectors. Gradients live in a second flat array with the same layout. Why: the
collective (ring AllReduce, parameter server) then sees one array and chunks it however it likes,
with no per-layer bookkeeping on the wire; production systems call this a fused tensor.

    flat params: [ W0 (n_in x h0) | b0 (h0) | W1 (h0 x h1) | b1 (h1) | ... ]
                   ^ views: W0 = flat[0 : n_in*h0].reshape(n_in, h0), etc. No copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np


@dataclass(frozen=True)
class Slot:
    """Where one named tensor lives in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return prod(self.shape)


class ParamLayout:
    """The ordered list of named tensors in a flat vector, and views into any such vector."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]]):
        slots, offset = [], 0
        for name, shape in shapes:
            slots.append(Slot(name, tuple(shape), offset))
            offset += prod(shape)
        self.slots: tuple[Slot, ...] = tuple(slots)
        self.size = offset  # total number of parameters, n

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Views (not copies) of `flat` as the named tensors: writing a view writes `flat`.
        `flat` is a NumPy array or a Numba CUDA device array (whose slices and reshapes are
        device views just the same)."""
        if flat.ndim != 1 or flat.shape[0] != self.size:
            raise ValueError(
                f"expected a flat vector of {self.size} parameters, got shape {flat.shape}"
            )
        # flags["C_CONTIGUOUS"]: NumPy's flags and a Numba device array's (a dict) both take it
        if not flat.flags["C_CONTIGUOUS"]:
            raise ValueError("the flat parameter vector must be contiguous (views need it)")
        return {s.name: flat[s.offset : s.offset + s.size].reshape(s.shape) for s in self.slots}

    def span(self, *names: str) -> tuple[int, int]:
        """(lo, hi): the range of the flat vector the named tensors fill, which must be
        neighbours in the layout (a layer's weights and bias)."""
        slots = sorted((s for s in self.slots if s.name in names), key=lambda s: s.offset)
        if len(slots) != len(names):
            raise KeyError(f"no tensor named {sorted(set(names) - {s.name for s in slots})}")
        for a, b in zip(slots[:-1], slots[1:], strict=True):
            if a.offset + a.size != b.offset:
                raise ValueError(f"{a.name} and {b.name} are not neighbours in the layout")
        return slots[0].offset, slots[-1].offset + slots[-1].size

    def __repr__(self) -> str:
        parts = ", ".join(f"{s.name}{list(s.shape)}" for s in self.slots)
        return f"ParamLayout({self.size} params: {parts})"


def on_device(array) -> bool:
    """Whether `array` is a Numba CUDA device array (a GPU's, or the simulator's): one that
    has `copy_to_host` and is not a NumPy array. Host arrays (pinned ones included) are not."""
    return not isinstance(array, np.ndarray) and hasattr(array, "copy_to_host")


def buckets(
    units: list[tuple[int, int]], cap_bytes: float, itemsize: int = 4
) -> list[tuple[int, int]]:
    """Group a backward pass's gradient units into the buckets a ddp step all-reduces.

    `units`: the (lo, hi) ranges of the flat gradient in the order the backward writes them
    (a model's `grad_units()`: last layer first, each range just below the one before). A bucket
    takes units in that order until it holds at least `cap_bytes`; the last one takes what is
    left. Each bucket is again one contiguous range (lo, hi), so the ring all-reduces it as a
    view of the gradient, with no copy. A cap of 0 gives one bucket per unit; a cap above the
    gradient, one bucket: synchronous SGD with its AllReduce at the end of the backward.

        units   [L2: 41 KB] [L1: 4.2 MB] [L0: 266 KB]     (the compare preset's MLP)
        32 KB   [L2]        [L1]         [L0]             3 buckets
        1 MB    [L2 + L1 ...............] [L0]            2 buckets
    """
    out: list[tuple[int, int]] = []
    lo = hi = None
    below = None  # where the unit before began: the next one must end there
    for u_lo, u_hi in units:
        if below is not None and u_hi != below:
            raise ValueError(f"unit {(u_lo, u_hi)} does not end where the one before starts")
        below = u_lo
        if hi is None:
            hi = u_hi
        lo = u_lo
        if (hi - lo) * itemsize >= cap_bytes:
            out.append((lo, hi))
            lo = hi = None
    if lo is not None and hi is not None:  # set together
        out.append((lo, hi))
    return out
