"""The backward's profile and ddp's buckets, as its prediction (timing/iteration.py, Eq. 12)
reads them: when each bucket of the gradient is ready, and the ring's schedule of the buckets.

A Calibration's `backward_units` is the measured profile: per unit of the model's gradient
(a layer's weights and bias, last layer first), (bytes, the fraction of t_comp elapsed when
the backward has written it). Where it was not measured (a JSON file from before it was, or
`pipesgd predict --params N --t-comp T`, which has no model to time), `units_of` assumes

    DEFAULT_UNITS layers of equal size; the forward takes FORWARD_SHARE = 1/3 of t_comp and
    the backward the other 2/3, each layer's backward equally long: layer i (i = 1..L, the
    last layer first) is ready at 1/3 + 2/3 i / L of t_comp.

(A dense layer's backward costs two products, dW and the input's gradient, for the forward's
one: the 2/3 share. The MLPs and CNN here are far from equal layers: `calibrate`, and
`pipesgd predict` given a model, measure their profiles instead.)
"""

from __future__ import annotations

from pipesgd_ref.models.layout import buckets
from pipesgd_ref.timing.figures import Calibration

FORWARD_SHARE = 1 / 3  # of t_comp, where the backward's profile was not measured
DEFAULT_UNITS = 10  # equal layers, where the backward's profile was not measured


def units_of(cal: Calibration) -> tuple[tuple[float, float], ...]:
    """The backward's units (bytes, fraction of t_comp when ready), last layer first: the
    measured ones, else the module docstring's assumption over the M gradient bytes."""
    if cal.backward_units:
        return tuple(cal.backward_units)
    layer = cal.grad_bytes / DEFAULT_UNITS
    back = 1 - FORWARD_SHARE
    return tuple(
        (layer, FORWARD_SHARE + back * i / DEFAULT_UNITS) for i in range(1, DEFAULT_UNITS + 1)
    )


def bucket_ready(units, cap_bytes: float) -> list[tuple[float, float]]:
    """ddp's buckets of `units` (bytes, fraction), grouped as methods/ddp.py groups them
    (models/layout.py `buckets`: units in the backward's order until a bucket holds at least
    `cap_bytes`): per bucket, in the order the ring all-reduces them, (bytes, the fraction of
    t_comp when its last unit is ready)."""
    total = sum(b for b, _ in units)
    ranges, hi = [], total  # the units as byte ranges of the flat gradient, top down
    for nbytes, _ in units:
        ranges.append((hi - nbytes, hi))
        hi -= nbytes
    ready = {lo: f for (lo, _), (_, f) in zip(ranges, units, strict=True)}
    # ranges of floats (the assumed units): `buckets` only compares and subtracts them
    return [(b_hi - b_lo, ready[b_lo]) for b_lo, b_hi in buckets(ranges, cap_bytes, 1)]


def schedule(
    fractions: list[float], t_comp: float, allreduce_s, cpu_s
) -> tuple[list[tuple[float, float]], float]:
    """([(start, end)] of each bucket on the ring, in order; when the backward ends).

    Bucket j is ready when the backward has done fractions[j] of t_comp, and starts when it is
    ready and the ring has finished bucket j - 1; it takes allreduce_s(j, beside) seconds
    (T_ar; `beside`: whether it starts while the backward runs). A bucket beside the backward
    shares the cores with it: its CPU work, cpu_s(j) (copies, reductions; 0 where it runs
    apart), is paid by both for the share of the bucket that overlaps, so the backward and
    that bucket each take that much longer, and the buckets ready later with them."""
    out: list[tuple[float, float]] = []
    free = stretch = 0.0  # when the ring is done with the bucket before; the backward's delay
    for j, f in enumerate(fractions):
        start = max(f * t_comp + stretch, free)
        end_of_backward = t_comp + stretch
        took = allreduce_s(j, start < end_of_backward)
        if start < end_of_backward and took > 0:
            extra = cpu_s(j) * min(1.0, (end_of_backward - start) / took)
            took += extra
            stretch += extra
        free = start + took
        out.append((start, free))
    return out, t_comp + stretch
