"""The codecs' wire layouts and bit constants, written once for every rung.

The reference (reference.py), the Numba loops (numba_cpu.py) and the CUDA kernels
(cuda_kernels.py) apply the same integer operations to the same bit patterns: these constants
are those operations' operands, so that "bitwise equal to the reference" starts from one source.

float32, as a uint32:   bit 31 sign | bits 30..23 exponent | bits 22..0 mantissa (22 = quiet bit)
its high half (16 bits): bit 15 sign | bits 14..7 exponent  | bits 6..0 mantissa  (6 = quiet bit)
"""

from __future__ import annotations

import numpy as np

# Per codec: (header bytes, bytes per value, nominal ratio r). wire_bytes(n) = header + per * n.
LAYOUT = {
    "none": (0, 4, 1.0),
    "trunc16": (0, 2, 2.0),
    "bf16": (0, 2, 2.0),
    "q8": (4, 1, 4.0),  # 4n / (4 + n) -> 4 for long chunks
}

# Bit patterns of float32 (as uint32) and of the 16-bit high half. Unsigned NumPy scalars, so the
# arithmetic stays unsigned in NumPy, in Numba's compiled loops and in the CUDA kernels alike.
ABS_MASK = np.uint32(0x7FFF_FFFF)  # everything but the sign: bits & ABS_MASK is |x|'s pattern
INF_BITS = np.uint32(0x7F80_0000)  # exponent all ones, mantissa 0; larger magnitudes are NaN
HALF_SHIFT = np.uint32(16)  # the shift between a float32 and its high half
LOW_ONES = np.uint32(0x7FFF)  # bf16 rounding: just under half of the dropped 16 bits
ONE = np.uint32(1)
QUIET16 = np.uint32(0x0040)  # float32's quiet-NaN bit (bit 22), as seen in the high half
QUIET32 = np.uint32(0x0040_0000)  # float32's quiet-NaN bit (bit 22)

Q8_LEVELS = np.float32(127)  # codes -127..127: symmetric, so -x encodes as -(code of x)
# The largest scale whose 127 multiple is finite; max|x| / 127 rounds up past it for
# max|x| = float32 max, and 127 * scale would then decode to Inf.
Q8_MAX_SCALE = np.nextafter(np.finfo(np.float32).max / Q8_LEVELS, np.float32(0))
