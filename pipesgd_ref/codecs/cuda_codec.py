"""`CudaCodec`: a codec whose buffers live on the GPU, running the kernels of cuda_kernels.py.

`get_codec(name, "cuda")` returns one: a `Codec` (codec.py), with the same wire layout and the
same `wire_bytes(n)`, whose encode / decode / add_decoded_into take Numba CUDA device arrays
(values: 1-D float32; wire: 1-D uint8 of wire_bytes(n)) and launch these kernels:

    codec     encode                           decode / add_decoded_into
    none      device-to-device copy            copy / f32_add_kernel
    trunc16   trunc16_encode_kernel            half16_decode_kernel / half16_add_kernel
    bf16      bf16_encode_kernel               (the same two)
    q8        abs_max_bits_kernel (1 or 2x),   q8_decode_kernel / q8_add_kernel
              then q8_codes_kernel

Cost per call: one pass over the n values, like the CPU rungs (q8 encode: the max-abs pass,
a second tiny pass over at most MAX_PARTIALS block maxima, then the codes pass). Launches are
asynchronous on the default stream: a call returns at once, and a later kernel or copy on that
stream (`copy_to_host`, which waits) sees the result. Stochastic q8 is the exception: it reads
max|x| back (a sync) and uploads n uniforms, drawn on the host (see `CudaCodec._q8_encode`).

Wire alignment: the kernels read the wire through float32 / uint16 views, so a device wire must
start at a 4-byte-aligned address (a fresh `cuda.device_array` is 256-aligned; slice framed
buffers at multiples of 4). CudaCodec checks it.

Like cuda_kernels.py, this module loads numba.cuda at import: only `get_codec(name, "cuda")`
imports it, when asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import cuda

from pipesgd_ref.codecs.codec import Codec
from pipesgd_ref.codecs.cuda_kernels import (
    MAX_PARTIALS,
    abs_max_bits_kernel,
    bf16_encode_kernel,
    f32_add_kernel,
    grid_for,
    half16_add_kernel,
    half16_decode_kernel,
    q8_add_kernel,
    q8_codes_kernel,
    q8_decode_kernel,
    trunc16_encode_kernel,
)
from pipesgd_ref.codecs.reference import q8_scale
from pipesgd_ref.ops.cuda_support import gpu_problem

if TYPE_CHECKING:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray


def _is_device_array(a) -> bool:
    """A Numba device array (real, or the simulator's stand-in; both set __cuda_ndarray__)."""
    return bool(getattr(a, "__cuda_ndarray__", False))


def _address(a) -> int:
    try:
        return a.__cuda_array_interface__["data"][0]
    except AttributeError:  # the simulator's device arrays wrap NumPy arrays
        return a.__array_interface__["data"][0]


def _describe(a) -> str:
    if _is_device_array(a):
        layout = "C-contiguous" if a.is_c_contiguous() else "non-contiguous"
        return f"a {layout} {a.dtype} device array of shape {tuple(a.shape)}"
    if isinstance(a, np.ndarray):
        return f"a host (NumPy) {a.dtype} array of shape {a.shape}"
    return f"a {type(a).__name__}"


class CudaCodec(Codec):
    """One codec whose buffers live on the GPU; get one with `get_codec(name, "cuda")`.

    As `codec.Codec` (same attributes, wire layout and `wire_bytes`), but the buffers are
    preallocated Numba device arrays: values 1-D C-contiguous float32, wire 1-D C-contiguous
    uint8 of exactly wire_bytes(n) bytes at a 4-byte-aligned address. Wrong buffers (host
    arrays included) raise ValueError. Calls are asynchronous on the default stream.
    """

    def __init__(self, name: str, stochastic: bool = False, seed: int = 0):
        problem = gpu_problem()
        if problem:  # now, not at the first launch deep inside the ring
            raise RuntimeError(f"codec backend 'cuda' cannot run here: {problem}")
        # q8's scratch: [max|x| bits, up to MAX_PARTIALS block maxima]. Allocated once, on the
        # first q8 encode, and reused: a device allocation costs more than a whole small encode.
        self._scratch: DeviceNDArray | None = None
        self._no_uniforms: DeviceNDArray | None = None
        super().__init__(name, "cuda", stochastic=stochastic, seed=seed)

    def _functions(self):
        return {
            "none": (self._none_encode, self._none_decode, self._none_add),
            "trunc16": (self._trunc16_encode, self._half16_decode, self._half16_add),
            "bf16": (self._bf16_encode, self._half16_decode, self._half16_add),
            "q8": (self._q8_encode, self._q8_decode, self._q8_add),
        }[self.name]

    # --- host-side launchers: views on the host, then one grid-stride launch each -------------

    @staticmethod
    def _none_encode(src, out) -> None:
        if src.size:
            out.view(np.float32).copy_to_device(src)  # device to device: the bytes as they are

    @staticmethod
    def _none_decode(src, out) -> None:
        if out.size:
            out.copy_to_device(src.view(np.float32))

    @staticmethod
    def _none_add(src, dst) -> None:
        if dst.size:
            f32_add_kernel[grid_for(dst.size)](src.view(np.float32), dst)

    @staticmethod
    def _trunc16_encode(src, out) -> None:
        if src.size:
            trunc16_encode_kernel[grid_for(src.size)](src.view(np.uint32), out.view(np.uint16))

    @staticmethod
    def _bf16_encode(src, out) -> None:
        if src.size:
            bf16_encode_kernel[grid_for(src.size)](src.view(np.uint32), out.view(np.uint16))

    @staticmethod
    def _half16_decode(src, out) -> None:
        if out.size:
            half16_decode_kernel[grid_for(out.size)](src.view(np.uint16), out.view(np.uint32))

    @staticmethod
    def _half16_add(src, dst) -> None:
        if dst.size:
            half16_add_kernel[grid_for(dst.size)](src.view(np.uint16), dst)

    def _q8_encode(self, src, out, rng: np.random.Generator | None = None) -> None:
        n = src.size
        if n == 0:  # the wire is the scale alone, that of an all-zero chunk (no zero-size launch)
            out.copy_to_device(np.array([q8_scale(np.float32(0))], np.float32).view(np.uint8))
            return
        if self._scratch is None:
            self._scratch = cuda.device_array(1 + MAX_PARTIALS, np.uint32)
            self._no_uniforms = cuda.device_array(0, np.float64)
        amax = self._scratch[:1]
        # Pass 1: one max per block; pass 2 (only when there are several): their max.
        blocks, threads = grid_for(n, MAX_PARTIALS)
        bits = src.view(np.uint32)
        if blocks == 1:
            abs_max_bits_kernel[1, threads](bits, amax)
        else:
            partials = self._scratch[1 : 1 + blocks]
            abs_max_bits_kernel[blocks, threads](bits, partials)
            abs_max_bits_kernel[1, threads](partials, amax)
        uniforms = self._no_uniforms
        if rng is not None:
            # Stochastic: the uniforms come from the codec's NumPy generator, the very stream the
            # NumPy and Numba backends draw (bitwise the same codes, for 8 bytes per value over
            # PCIe and one sync; a GPU generator, numba.cuda.random, would differ). The generator
            # is drawn only when the scale is positive, as in the reference: read max|x| first.
            scale = q8_scale(amax.copy_to_host().view(np.float32)[0])
            if scale > 0:
                uniforms = cuda.to_device(rng.random(n))
        q8_codes_kernel[grid_for(n)](
            src, amax, uniforms, out[:4].view(np.float32), out[4:].view(np.int8)
        )

    @staticmethod
    def _q8_decode(src, out) -> None:
        if out.size:
            codes, header = src[4:].view(np.int8), src[:4].view(np.float32)
            q8_decode_kernel[grid_for(out.size)](codes, header, out)

    @staticmethod
    def _q8_add(src, dst) -> None:
        if dst.size:
            codes, header = src[4:].view(np.int8), src[:4].view(np.float32)
            q8_add_kernel[grid_for(dst.size)](codes, header, dst)

    # --- buffer checks: device arrays, not host ones ------------------------------------------

    def _check_values(self, op: str, role: str, a) -> None:
        if not (
            _is_device_array(a) and a.dtype == np.float32 and a.ndim == 1 and a.is_c_contiguous()
        ):
            raise ValueError(
                f"{self.name} {op} (cuda): {role} must be a 1-D C-contiguous float32 device "
                f"array, got {_describe(a)}; copy host values over with "
                f"numba.cuda.to_device(x.reshape(-1)), or use the numpy or numba backend"
            )

    def _check_wire(self, op: str, role: str, a, n: int) -> None:
        want = self.wire_bytes(n)
        if not (
            _is_device_array(a) and a.dtype == np.uint8 and a.ndim == 1 and a.is_c_contiguous()
        ):
            raise ValueError(
                f"{self.name} {op} (cuda): {role} must be a 1-D C-contiguous uint8 device array "
                f"of wire_bytes({n}) = {want} bytes, got {_describe(a)}; allocate "
                f"numba.cuda.device_array(codec.wire_bytes({n}), np.uint8)"
            )
        if a.size != want:
            raise ValueError(
                f"{self.name} {op} (cuda): {role} has {a.size} bytes, but {n} float32 values "
                f"take wire_bytes({n}) = {want} bytes; allocate numba.cuda.device_array("
                f"codec.wire_bytes({n}), np.uint8), or slice the buffer to that length"
            )
        if _address(a) % 4:
            raise ValueError(
                f"{self.name} {op} (cuda): {role} starts at device address "
                f"0x{_address(a):x}, not a multiple of 4; the kernels read the wire as float32 / "
                f"uint16 words. Slice framed buffers at offsets that are multiples of 4 (a "
                f"fresh numba.cuda.device_array is aligned)"
            )
