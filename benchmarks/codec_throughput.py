"""Codec throughput: encode, decode and decode-add of every codec, against a plain memory copy.

    python benchmarks/codec_throughput.py

For 1 MB, 16 MB and 64 MB of float32 input, times (median of repeats) each pass of each codec
on both backends, and np.copyto of the same float32 bytes as the reference rate. Rates are in
GB/s of float32 input processed (4n bytes / time, whatever the wire size), and as a fraction of
the copy's rate. In the ring (equation (2) of docs/paper.md) a hop of M/p bytes costs one decode-add
and one encode on top of its M/(r p B) wire time: compression pays off only while those passes
run well above the link rate B (1 Gb/s = 0.125 GB/s). Prints the table and nothing else.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from pipesgd_ref.codecs import CODECS, get_codec

SIZES_MB = (1, 16, 64)
REPEATS = {1: 30, 16: 7, 64: 5}  # fewer at the large sizes: the whole run stays under a minute
VARIANTS = [(name, False) for name in CODECS] + [("q8", True)]  # q8 stochastic too


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: compiles (or loads from cache) the Numba loops, faults the pages in
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    rng = np.random.default_rng(0)
    header = (
        f"{'size':>6} {'backend':>7} {'codec':>9}   {'encode GB/s':>16} {'decode GB/s':>16} "
        f"{'add_decoded GB/s':>16}"
    )
    print("GB/s of float32 input processed (x: fraction of np.copyto's rate on the same bytes)")
    print(header)
    print("-" * len(header))
    for mb in SIZES_MB:
        n = mb * (1 << 20) // 4
        nbytes = 4 * n
        reps = REPEATS[mb]
        x = rng.normal(size=n).astype(np.float32)
        values = np.empty_like(x)
        copy_s = median_seconds(partial(np.copyto, values, x), reps)
        copy_rate = nbytes / copy_s / 1e9
        print(f"{mb:>4}MB {'-':>7} {'memcpy':>9}   {copy_rate:>9.2f} (1.00)")
        for backend in ("numpy", "numba"):
            for name, stochastic in VARIANTS:
                codec = get_codec(name, backend, stochastic=stochastic)
                wire = np.empty(codec.wire_bytes(n), np.uint8)
                codec.encode(x, wire)
                passes = (
                    partial(codec.encode, x, wire),
                    partial(codec.decode, wire, values),
                    partial(codec.add_decoded_into, wire, values),
                )
                cells = []
                for fn in passes:
                    rate = nbytes / median_seconds(fn, reps) / 1e9
                    cells.append(f"{rate:>9.2f} ({rate / copy_rate:.2f})")
                label = "q8-stoch" if stochastic else name
                print(f"{mb:>4}MB {backend:>7} {label:>9}   " + " ".join(f"{c:>16}" for c in cells))
        print()


if __name__ == "__main__":
    main()
