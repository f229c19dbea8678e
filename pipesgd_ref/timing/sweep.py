"""The axes of `pipesgd predict --sweep`: a range of one scenario parameter, as prediction inputs.

The predictions themselves are in timing/iteration.py; a sweep re-predicts them at each value (a
Calibration's `with_network`, or another world size).
"""

from __future__ import annotations

import math

import numpy as np

from pipesgd_ref.units import parse_bandwidth, parse_latency


def sweep_values(spec: str) -> tuple[str, list[float]]:
    """'bandwidth=100Mbit..100Gbit' -> ('bandwidth', [bytes/s ...], log-spaced, 13 points);
    'world_size=2..64' -> ('world_size', [2, 3, 4, ..., 64] in powers of two and between)."""
    if "=" not in spec or ".." not in spec:
        raise ValueError(
            f"cannot read sweep {spec!r}: expected KEY=LOW..HIGH, e.g. bandwidth=100Mbit..100Gbit "
            f"or world_size=2..64"
        )
    key, rng = spec.split("=", 1)
    key = key.strip().replace("-", "_")
    lo_text, hi_text = rng.split("..", 1)
    lo: float
    hi: float
    if key == "world_size":
        try:
            lo, hi = int(lo_text), int(hi_text)
        except ValueError:
            raise ValueError(
                f"cannot read sweep {spec!r}: world_size needs whole numbers, e.g. world_size=2..64"
            ) from None
        if not 1 <= lo < hi:
            raise ValueError(f"world_size sweep needs 1 <= LOW < HIGH, got {lo}..{hi}")
        powers = {2**k for k in range(1, 20) if lo < 2**k < hi}
        between = {3 * 2**k for k in range(0, 20) if lo < 3 * 2**k < hi}
        vals = sorted({lo, hi} | powers | between)
        return key, [float(v) for v in vals]
    parse = {"bandwidth": parse_bandwidth, "latency": parse_latency}.get(key)
    if parse is None:
        raise ValueError(f"cannot sweep {key!r}: choose bandwidth, latency or world_size")
    lo, hi = parse(lo_text), parse(hi_text)
    if not 0 < lo < hi < math.inf:
        raise ValueError(f"{key} sweep needs 0 < LOW < HIGH, finite; got {lo_text}..{hi_text}")
    return key, list(np.geomspace(lo, hi, 13))
