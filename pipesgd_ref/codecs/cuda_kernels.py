"""The codecs as CUDA kernels: the third rung (reference.py -> numba_cpu.py -> cuda_kernels.py).

Each kernel is one codec function of reference.py on device arrays, its loop in its docstring;
`CudaCodec` (cuda_codec.py) launches them. Every result is bitwise the NumPy reference's: the
codes byte for byte (the q8 scale included), the decoded and the added values bit for bit
(tests/test_cuda_codecs.py).

How "bitwise" survives the trip to the GPU, and why each rule is needed:
- Bit manipulation happens on uint32 / uint16 views of the same device memory (`.view` on the
  host before launch), with the constants of bits.py: the same integer operations.
- No fused multiply-add. NVVM contracts `a + b * c` into one FMA (rounded once) by default;
  NumPy rounds the product, then the sum. q8's decode-add multiplies with libdevice's
  `fmul_rn`, which is never contracted (tests/test_cuda_codecs.py checks the PTX for `fma`).
- NaN operands. With one NaN operand, NumPy's float add and multiply (x86-64, arm64) return
  that NaN with its quiet bit set, payload and sign kept; the GPU returns the canonical NaN
  0x7FFFFFFF. The add and q8 decode kernels return the NaN operand explicitly, so NaN payloads
  match too. With two NaN operands NumPy returns one of them, which one depending on its SIMD
  code path (compilers treat an add as commutative); the kernels keep dst's. NaNs made from
  non-NaN operands (Inf - Inf, 0 * Inf: never from a wire this module wrote) carry a platform's
  default bits, which differ even between NumPy builds (x86 0xFFC00000, arm64 0x7FC00000);
  those are not emulated.
- Exact rounding: float32 division is IEEE (`div.rn`: fastmath stays off), q8 rounds with
  libdevice's `rintf` (ties to even, as np.rint), denormals are kept (no flush-to-zero).

Kernels call libdevice directly. The one device function, `_quieted`, is compiled for the
current GPU when a kernel that calls it compiles; without a GPU the compile check
(tests/test_cuda_compile.py) answers for it (cuda_support.compile_kernels). The builtins min and
max are avoided: numba 0.68 cannot compile them without a GPU. Numba's simulator has no
libdevice: there `libdevice` below is a stand-in with the NumPy meaning of the four functions
used.

The module loads numba.cuda at import, so nothing imports it at module level: `get_codec(name,
"cuda")` does, when asked (by then the process has chosen a GPU or the simulator, whose switch
NUMBA_ENABLE_CUDASIM is read once, when numba.cuda first loads). It is `cuda_kernels`, not
`cuda`, because `cuda` is numba.cuda's name in here and in the tests.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, no_type_check

import numpy as np
from numba import cuda, types

from pipesgd_ref.codecs.bits import (
    ABS_MASK,
    HALF_SHIFT,
    INF_BITS,
    LOW_ONES,
    ONE,
    Q8_LEVELS,
    Q8_MAX_SCALE,
    QUIET16,
    QUIET32,
)
from pipesgd_ref.ops.cuda_support import THREADS_PER_BLOCK, launch_1d, simulated

if simulated():
    # The simulator runs kernels as Python on NumPy scalars and has no libdevice: these are the
    # NumPy meanings of the libdevice functions the kernels call (bit casts, exact rounding).
    libdevice: Any = SimpleNamespace(
        int_as_float=lambda bits: np.int32(bits).view(np.float32),
        float_as_int=lambda x: np.float32(x).view(np.int32),
        rintf=lambda x: np.rint(np.float32(x)),
        fmul_rn=lambda a, b: np.float32(a) * np.float32(b),
    )
else:
    from numba.cuda import libdevice as _libdevice

    libdevice = _libdevice


@cuda.jit(device=True)
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def _quieted(x):
    """A NaN x with its quiet bit set and its payload kept: the NaN NumPy returns for a NaN
    operand of an addition (a GPU's own addition would return its canonical NaN instead)."""
    return libdevice.int_as_float(np.int32(np.uint32(libdevice.float_as_int(x)) | QUIET32))


_Q8_NAN = np.float32(np.nan)  # the scale of a chunk holding NaN or Inf: q8_scale's NaN, same bits
_Q8_CLIP = 127.0  # codes -127..127, as Q8_LEVELS

# q8's max |x| pass 1 launches at most this many blocks (each grid-strides over its share), so
# pass 2 reduces at most MAX_PARTIALS block maxima in one block: 4 per thread at 256 threads.
# 1024 blocks of 256 threads still fill an H100/H200 (132 SMs x 2048 resident threads).
MAX_PARTIALS = 1024

# The simulator starts a Python thread per CUDA thread (about 0.1 to 1 ms each): there the grid
# is at most 2 blocks of 32 threads, which keeps a test example fast and makes the grid-stride
# loops wrap many times at test sizes. The kernels read the block size from cuda.blockDim.
_SIM_THREADS = 32
_SIM_BLOCKS = 2


def grid_for(n: int, max_blocks: int | None = None) -> tuple[int, int]:
    """(blocks, threads) for a grid-stride kernel over n elements (cuda_support.launch_1d; in
    the simulator, the small grid above); at most `max_blocks` blocks."""
    if simulated():
        blocks, threads = launch_1d(n, _SIM_THREADS)
        blocks = min(blocks, _SIM_BLOCKS)
    else:
        blocks, threads = launch_1d(n)
    return (blocks if max_blocks is None else min(blocks, max_blocks)), threads


# ---------------------------------------------------------------------------------------------
# Kernels. Each one is a grid-stride loop: thread t of a grid of T threads handles the elements
# t, t + T, t + 2T, ...; consecutive threads touch consecutive elements (coalesced accesses).


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def trunc16_encode_kernel(bits, out16):
    """trunc16 encode (reference.trunc16_encode), on the float32 bits as uint32:
        for i in range(n):
            h = bits[i] >> 16
            if bits[i] & 0x7FFFFFFF > 0x7F800000: h |= 0x0040      # NaN stays a (quiet) NaN
            out16[i] = h

    Optimisations: grid-stride loop, coalesced 4-byte reads and 2-byte writes, integer ops only.
    """
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        b = bits[i]
        h = b >> HALF_SHIFT
        if (b & ABS_MASK) > INF_BITS:
            h |= QUIET16
        out16[i] = h


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def bf16_encode_kernel(bits, out16):
    """bf16 encode (reference.bf16_encode): round to nearest, ties to even, on the bits:
        for i in range(n):
            b = bits[i]
            if b & 0x7FFFFFFF > 0x7F800000: out16[i] = (b >> 16) | 0x0040       # NaN, quiet
            else: out16[i] = (b + 0x7FFF + ((b >> 16) & 1)) >> 16           # carry = round up

    Optimisations: as trunc16. The NaN test comes first, so the addition never wraps (numba
    computes it in 64 bits anyway; the simulator in uint32).
    """
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        b = bits[i]
        if (b & ABS_MASK) > INF_BITS:
            out16[i] = (b >> HALF_SHIFT) | QUIET16
        else:
            out16[i] = (b + LOW_ONES + ((b >> HALF_SHIFT) & ONE)) >> HALF_SHIFT


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def half16_decode_kernel(src16, out_bits):
    """trunc16 / bf16 decode (reference.half16_decode), into the bits of the float32 output:
        for i in range(n): out_bits[i] = src16[i] << 16

    Optimisations: grid-stride loop, coalesced, integer ops only.
    """
    for i in range(cuda.grid(1), src16.size, cuda.gridsize(1)):
        out_bits[i] = np.uint32(src16[i]) << HALF_SHIFT


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def half16_add_kernel(src16, dst):
    """trunc16 / bf16 decode-add (reference.half16_add_decoded_into):
        for i in range(n): dst[i] += float32_from_bits(src16[i] << 16)

    NaN operands as NumPy: a NaN dst[i] stays, quieted; else a NaN decoded value is the result
    (quieted: a hand-made wire may hold a signaling NaN).
    Optimisations: fused (the decoded values live in a register, never in memory: one read of
    2 + 4 bytes and one write of 4 per element); the bit cast is free (a register move).
    """
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        v = np.uint32(src16[i]) << HALF_SHIFT  # the decoded value's bits
        d = dst[i]
        if d != d:  # NaN dst: NumPy returns the NaN operand, quieted (GPU: 0x7FFFFFFF)
            dst[i] = _quieted(d)
        elif (v & ABS_MASK) > INF_BITS:  # NaN decoded value: returned, quieted
            dst[i] = libdevice.int_as_float(np.int32(v | QUIET32))
        else:
            dst[i] = d + libdevice.int_as_float(np.int32(v))


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def f32_add_kernel(src, dst):
    """none decode-add (reference.none_add_decoded_into): for i in range(n): dst[i] += src[i].

    NaN operands as NumPy (dst first, then src, quieted). Optimisations: grid-stride, coalesced.
    """
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        d = dst[i]
        s = src[i]
        if d != d:
            dst[i] = _quieted(d)
        elif s != s:
            dst[i] = _quieted(s)
        else:
            dst[i] = d + s


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def abs_max_bits_kernel(bits, block_max):
    """q8's max |x|, as bits: block_max[b] = max(bits[i] & 0x7FFFFFFF for the i of block b).

    As a loop over the whole grid (B = number of blocks, T = threads per block):
        for b in range(B):
            block_max[b] = max(bits[i] & 0x7FFFFFFF for i in range(n) if (i // T) % B == b)
    Called twice: over the input (B <= MAX_PARTIALS blocks), then over those B maxima with one
    block (the max of the maxima); a single block writes the final max directly.
    The sign cleared, non-negative floats sort like their bit patterns (NaN above Inf), so an
    integer max is max|x| with NaN and Inf on top, as in the Numba rung; and an integer max
    is exact in any order, so the result does not depend on the grid.

    Optimisations: each thread first reduces its grid-stride share in a register (coalesced
    reads, no synchronisation); the block then combines its threads' values in shared memory,
    a tree of log2(T) halving steps, one cuda.syncthreads() per step. Candidate next steps:
    warp shuffles for the last 32 values (the simulator has none), or atomics for pass 2.
    """
    shared = cuda.shared.array(THREADS_PER_BLOCK, types.uint32)  # one value per thread
    tid = cuda.threadIdx.x
    m = np.uint32(0)
    for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
        a = bits[i] & ABS_MASK
        if a > m:  # not max(a, m): numba 0.68 cannot compile that without a GPU (see above)
            m = a
    shared[tid] = m
    cuda.syncthreads()  # every thread's value is in shared memory before the tree reads it
    stride = cuda.blockDim.x // 2  # blockDim.x is a power of two <= THREADS_PER_BLOCK
    while stride > 0:
        if tid < stride and shared[tid + stride] > shared[tid]:
            shared[tid] = shared[tid + stride]
        cuda.syncthreads()  # this level is complete before the next one reads it
        stride //= 2
    if tid == 0:
        block_max[cuda.blockIdx.x] = shared[0]


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def q8_codes_kernel(x, amax, uniforms, header, codes):
    """q8 codes (reference.q8_encode), from amax[0] = the bits of max|x|; writes the scale too:
        scale = q8_scale(float32_from_bits(amax[0]))   # NaN if Inf/NaN, else min(amax / 127, cap)
        header[0] = scale
        for i in range(n):
            if not scale > 0:  codes[i] = 0
            elif deterministic: codes[i] = clip(rint(x[i] / scale), -127, 127)
            else:              codes[i] = clip(floor(float64(x[i] / scale) + uniforms[i]), ...)
    Deterministic when `uniforms` is empty; stochastic when it holds n draws of U[0, 1).

    The scale is q8_scale's formula, written again here because a kernel cannot call host code;
    tests/test_cuda_codecs.py checks the two agree (zeros, denormals, float32 max, Inf, NaN).
    Optimisations: the scale is computed on the device from the max (every thread computes it,
    a broadcast read and one division), so deterministic encoding never waits for the host;
    grid-stride loop, coalesced 4-byte reads and 1-byte writes; the branches on the scale are
    the same for every thread (no divergence).
    """
    amax_bits = amax[0]
    if amax_bits >= INF_BITS:  # max|x| is Inf or NaN: the scale, and every decoded value, is NaN
        scale = _Q8_NAN
    else:
        scale = libdevice.int_as_float(np.int32(amax_bits)) / Q8_LEVELS  # Eq.: scale = max|x| / 127
        if scale > Q8_MAX_SCALE:  # so that 127 * scale stays finite
            scale = Q8_MAX_SCALE
    if cuda.grid(1) == 0:
        header[0] = scale
    stochastic = uniforms.size > 0
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        if not scale > 0:  # all zero, or NaN seen: x / scale would make codes from garbage
            codes[i] = 0
            continue
        if stochastic:  # floor(q + u), u ~ U[0, 1): unbiased, E[code] = q
            q = math.floor(np.float64(x[i] / scale) + uniforms[i])
        else:  # rint: to nearest, ties to even, as np.rint
            q = libdevice.rintf(x[i] / scale)
        if q > _Q8_CLIP:
            q = _Q8_CLIP
        elif q < -_Q8_CLIP:
            q = -_Q8_CLIP
        codes[i] = q


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def q8_decode_kernel(codes, header, out):
    """q8 decode (reference.q8_decode): for i in range(n): out[i] = float32(codes[i]) * header[0].

    A NaN scale is every result, quieted (NumPy's NaN rule; the GPU's product would be the
    canonical NaN). Optimisations: grid-stride loop, coalesced 1-byte reads and 4-byte writes;
    the scale is one broadcast read per thread.
    """
    scale = header[0]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        if scale != scale:
            out[i] = _quieted(scale)
        else:
            out[i] = np.float32(codes[i]) * scale


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def q8_add_kernel(codes, header, dst):
    """q8 decode-add (reference.q8_add_decoded_into):
        for i in range(n): dst[i] += float32(codes[i]) * header[0]   (the product rounded first)

    NaN operands as NumPy: a NaN dst[i] stays, quieted; else a NaN scale is the result.
    Optimisations: fused (the decoded value stays in a register); the product is libdevice's
    fmul_rn, so the compiler cannot contract it with the add into an FMA (one rounding, not
    NumPy's two); grid-stride loop, coalesced.
    """
    scale = header[0]
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        d = dst[i]
        if d != d:
            dst[i] = _quieted(d)
        elif scale != scale:
            dst[i] = _quieted(scale)
        else:
            dst[i] = d + libdevice.fmul_rn(np.float32(codes[i]), scale)


# Every kernel with one example signature, for the compile check (tests/test_cuda_compile.py).
KERNELS = [
    (trunc16_encode_kernel, "void(uint32[::1], uint16[::1])"),
    (bf16_encode_kernel, "void(uint32[::1], uint16[::1])"),
    (half16_decode_kernel, "void(uint16[::1], uint32[::1])"),
    (half16_add_kernel, "void(uint16[::1], float32[::1])"),
    (f32_add_kernel, "void(float32[::1], float32[::1])"),
    (abs_max_bits_kernel, "void(uint32[::1], uint32[::1])"),
    (
        q8_codes_kernel,
        "void(float32[::1], uint32[::1], float64[::1], float32[::1], int8[::1])",
    ),
    (q8_decode_kernel, "void(int8[::1], float32[::1], float32[::1])"),
    (q8_add_kernel, "void(int8[::1], float32[::1], float32[::1])"),
]
