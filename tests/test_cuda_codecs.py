"""The CUDA codecs (pipesgd_ref/codecs/cuda_kernels.py) against the NumPy reference, bit for bit:
the wire byte for byte (q8's scale included), decode and decode-add bit for bit, NaN payloads
and the sign of zero included.

The kernels run in Numba's CUDA simulator here (tests/conftest.py sets NUMBA_ENABLE_CUDASIM=1),
where a simulated thread costs 0.1 to 1 ms: sizes stay at a few thousand. With
PIPESGD_GPU_TESTS=1 on a machine with an NVIDIA GPU the same tests run on it, and so do the
`gpu` tests at 4M elements. What the simulator cannot show (it computes with NumPy) is checked
on the compiled code: the PTX of every kernel has no fused multiply-add.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.codecs import BACKENDS, CODECS, get_codec
from pipesgd_ref.codecs.reference import q8_scale
from pipesgd_ref.ops.cuda_support import gpu_problem, simulated
from strategies import seeds

_PROBLEM = gpu_problem()
needs_cuda = pytest.mark.skipif(_PROBLEM is not None, reason=f"CUDA cannot run: {_PROBLEM}")
if _PROBLEM is None:
    from numba import cuda

# (codec, stochastic): every way a codec can round
VARIANTS = [(name, False) for name in CODECS] + [("q8", True)]
ids = [n + ("-stochastic" if s else "") for n, s in VARIANTS]

F32_MAX = float(np.finfo(np.float32).max)

# Bit patterns the codecs treat specially (codecs/__init__.py, "Special values"): zeros,
# denormals and rounding ties, the top of the range, Inf, quiet and signaling NaNs (payload in
# the low half).
SPECIAL_BITS = [
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00018000, 0x007FFFFF, 0x00800000,
    0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF,
    0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF80FFFF, 0x7FBFFFFF,
]  # fmt: skip
FINITE_SPECIALS = [b for b in SPECIAL_BITS if (b & 0x7FFFFFFF) < 0x7F800000]

# 0, 1, both sides of a warp (32), of the simulator's grid (64) and of a block (256), odd sizes.
sizes = st.one_of(
    st.sampled_from([0, 1, 2, 31, 32, 33, 63, 64, 65, 255, 257, 1001, 3001]),
    st.integers(0, 300),
)
KINDS = ("random", "specials", "zeros", "denormals")


def f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def make_values(name: str, kind: str, n: int, seed: int, magnitude: float) -> np.ndarray:
    """The input of one example. random: q8 gets normal values of one magnitude (random bits
    would put a NaN in almost every chunk, which then is simply all NaN); the 16-bit codecs and
    none get uniformly random bit patterns (every sign, exponent, NaN payload). specials: the
    same with SPECIAL_BITS sprinkled in (for q8 a NaN or Inf in one example of two). zeros:
    +-0 only (q8's scale 0). denormals: exponent 0 only (q8's denormal or underflowing scale)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    if kind == "zeros":
        return f32(bits & 0x80000000)
    if kind == "denormals":
        return f32(bits & rng.choice(np.array([0x807FFFFF, 0x800000FF], np.uint32)))
    if name == "q8":
        x = (rng.normal(size=n) * magnitude).astype(np.float32)
    else:
        x = f32(bits)
    if kind == "specials" and n:
        pool = SPECIAL_BITS if (name != "q8" or rng.random() < 0.5) else FINITE_SPECIALS
        where = rng.integers(0, n, size=min(n, 8))
        x[where] = f32(rng.choice(np.array(pool, np.uint32), size=where.size))
    return x


def make_dst(n: int, seed: int) -> np.ndarray:
    """A partial sum to add into: normal values and a few NaNs with payloads (quiet and
    signaling), which the add must keep (quieted) as NumPy does. No Inf: Inf + -Inf makes a
    new NaN whose bits are the platform's (x86 0xFFC00000, the GPU 0x7FFFFFFF), not NumPy's."""
    rng = np.random.default_rng(seed)
    dst = rng.normal(size=n).astype(np.float32)
    if n:
        where = rng.integers(0, n, size=min(n, 3))
        nans = np.array([0x7FC01234, 0xFFC00001, 0x7F800F00], np.uint32)
        dst[where] = f32(rng.choice(nans, size=where.size))
    return dst


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str, x=None) -> None:
    """Equal as bits (NaN payloads and the sign of zero included); shows the first miss."""
    g = got.view(np.uint32) if got.dtype == np.float32 else got
    w = want.view(np.uint32) if want.dtype == np.float32 else want
    assert g.shape == w.shape, f"{what}: shape {g.shape}, want {w.shape}"
    if not np.array_equal(g, w):
        i = int(np.flatnonzero(g != w)[0])
        width = 8 if g.dtype == np.uint32 else 2
        hint = ""
        if x is not None and g.dtype == np.uint32 and i < x.size:
            hint = f" (input value bits 0x{int(x.view(np.uint32)[i]):08X})"
        raise AssertionError(
            f"{what}: {int(np.sum(g != w))} of {g.size} differ; first at {i}: "
            f"got 0x{int(g[i]):0{width}X}, want 0x{int(w[i]):0{width}X}{hint}"
        )


def check_against_numpy(name: str, stochastic: bool, x: np.ndarray, dst: np.ndarray, seed=0):
    """Encode, decode and decode-add on the device and with NumPy; all bitwise equal. Decode
    and add read the reference's wire, so each is checked on its own."""
    n = x.size
    ref = get_codec(name, "numpy", stochastic=stochastic, seed=seed)
    dev = get_codec(name, "cuda", stochastic=stochastic, seed=seed)
    what = f"cuda {name}{' stochastic' if stochastic else ''} at length {n}"

    want = np.empty(ref.wire_bytes(n), np.uint8)
    ref.encode(x, want)
    d_x = cuda.to_device(x)
    d_wire = cuda.device_array(dev.wire_bytes(n), np.uint8)
    dev.encode(d_x, d_wire)
    assert_same_bits(d_wire.copy_to_host(), want, f"{what}: encode (wire bytes)")
    if stochastic:  # a second call continues the generator's stream as NumPy's does, also after
        # a first call that drew nothing (scale 0): 0.75 makes this one draw (unless NaN)
        x2 = np.append(x[::-1], np.float32(0.75))
        want2 = np.empty(ref.wire_bytes(n + 1), np.uint8)
        ref.encode(x2, want2)
        d_wire2 = cuda.device_array(dev.wire_bytes(n + 1), np.uint8)
        dev.encode(cuda.to_device(x2), d_wire2)
        assert_same_bits(d_wire2.copy_to_host(), want2, f"{what}: second encode (wire bytes)")

    d_ref_wire = cuda.to_device(want)
    decoded = np.empty(n, np.float32)
    ref.decode(want, decoded)
    d_out = cuda.device_array(n, np.float32)
    dev.decode(d_ref_wire, d_out)
    assert_same_bits(d_out.copy_to_host(), decoded, f"{what}: decode", x)

    # Where dst and the decoded value are both NaN, NumPy's result is one of the two, quieted,
    # and which one depends on its SIMD code path (compilers treat an add as commutative):
    # there any NaN passes. One NaN operand gives that NaN, quieted, everywhere: bitwise.
    both_nan = np.isnan(dst) & np.isnan(decoded)
    d_dst = cuda.to_device(dst)
    with np.errstate(invalid="ignore", over="ignore"):
        ref.add_decoded_into(want, dst)
    dev.add_decoded_into(d_ref_wire, d_dst)
    got = d_dst.copy_to_host()
    assert np.all(np.isnan(got[both_nan])), f"{what}: add_decoded_into of NaN + NaN is not NaN"
    got[both_nan] = dst[both_nan]
    assert_same_bits(got, dst, f"{what}: add_decoded_into", x)


# --- the codecs, bitwise against NumPy --------------------------------------------------------


@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize("name,stochastic", VARIANTS, ids=ids)
@given(
    n=sizes,
    seed=seeds,
    kind=st.sampled_from(KINDS),
    magnitude=st.integers(-30, 30).map(lambda e: 10.0**e),
)
@settings(max_examples=12)
def test_cuda_equals_numpy_bitwise(name, stochastic, n, seed, kind, magnitude):
    x = make_values(name, kind, n, seed, magnitude)
    check_against_numpy(name, stochastic, x, make_dst(n, seed + 1), seed=seed)


@needs_cuda
@pytest.mark.parametrize("name", ["none", "trunc16", "bf16"])
def test_every_special_value_bitwise(name):
    x = f32(SPECIAL_BITS * 3)  # 63 values: past one simulated warp
    check_against_numpy(name, False, x, make_dst(x.size, 1))


Q8_CHUNKS = {
    "empty": [],
    "zeros": [0.0, -0.0, 0.0],
    "float32 max": [F32_MAX, -F32_MAX, 1.0],
    "NaN": [1.0, np.nan, -2.0, 0.0],
    "Inf": [1.0, np.inf, -2.0, 0.0],
    "-Inf": [1.0, -np.inf, -2.0, 0.0],
    "denormal scale": f32([200, 0x80000000 | 190, 3, 0x80000000 | 1]).tolist(),
    "scale underflows": f32([10, 0x80000000 | 7]).tolist(),
    "ties": [127, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.4999999, -127],
}


@pytest.mark.slow  # 2-9 s: kept out of the fast subset (under 3 minutes)
@needs_cuda
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("chunk", list(Q8_CHUNKS), ids=list(Q8_CHUNKS))
def test_q8_scale_on_the_device_is_q8_scale(chunk, stochastic):
    """The kernel writes q8_scale's formula a second time (a kernel cannot call host code):
    both must agree at every edge, and so must the codes and the decoded values."""
    x = np.array(Q8_CHUNKS[chunk], np.float32)
    check_against_numpy("q8", stochastic, x, make_dst(x.size, 2), seed=3)
    dev = get_codec("q8", "cuda")
    wire = cuda.device_array(dev.wire_bytes(x.size), np.uint8)
    dev.encode(cuda.to_device(x), wire)
    got = wire.copy_to_host()[:4].view(np.float32)
    want = np.array([q8_scale(np.abs(x).max() if x.size else np.float32(0))], np.float32)
    assert_same_bits(got, want, f"q8 scale of the {chunk} chunk {x}")


@needs_cuda
def test_add_keeps_nan_operands_as_numpy_does():
    """With one NaN operand NumPy's add returns it, quieted, payload and sign kept; a GPU add
    would return the canonical NaN 0x7FFFFFFF. Wires written by hand: a signaling-NaN code,
    which no encoder writes, must still come out quiet. (No position has two NaN operands:
    NumPy's pick between them depends on its code path.)"""
    nan_dst = f32([0x7FC01234, 0x7F800F00, 0x3F800000, 0x3F800000, 0x3F800000])
    finite_dst = f32([0x3F800000, 0xBF800000, 0x00000001, 0x80000000, 0x7F7FFFFF])

    def q8_wire(scale_bits: int) -> np.ndarray:
        codes = np.array([1, 0, -3, 0, 5], np.int8).view(np.uint8)
        return np.concatenate([f32([scale_bits]).view(np.uint8), codes])

    cases = [  # (codec, wire, dst): the NaNs of dst and of the wire never meet
        (
            "none",
            f32([0x3F800000, 0x40000000, 0x7F800001, 0xFFC00007, 0x7FC00000]).view(np.uint8),
            nan_dst,
        ),
        ("trunc16", np.array([0x3F80, 0x4000, 0x7F81, 0xFFC3, 0x0001], np.uint16), nan_dst),
        ("q8", q8_wire(0x3F800000), nan_dst),  # scale 1: dst's NaNs stay, quieted
        ("q8", q8_wire(0x7FC00000), finite_dst),  # NaN scale: every sum is the scale
        ("q8", q8_wire(0xFF800ABC), finite_dst),  # a signaling NaN scale: quieted
    ]
    for name, wire, dst in cases:
        wire = wire.view(np.uint8)
        ref, dev = get_codec(name), get_codec(name, "cuda")
        want = dst.copy()
        with np.errstate(invalid="ignore"):
            ref.add_decoded_into(wire, want)
        got = cuda.to_device(dst)
        dev.add_decoded_into(cuda.to_device(wire), got)
        assert_same_bits(got.copy_to_host(), want, f"cuda {name} add_decoded_into, NaN operands")
        decoded = np.empty(dst.size, np.float32)
        with np.errstate(invalid="ignore"):
            ref.decode(wire, decoded)
        d_out = cuda.device_array(dst.size, np.float32)
        dev.decode(cuda.to_device(wire), d_out)
        assert_same_bits(d_out.copy_to_host(), decoded, f"cuda {name} decode, NaN codes")


# --- the codec object ------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("name", CODECS)
def test_cuda_codec_is_the_codec(name):
    assert "cuda" in BACKENDS
    ref, dev = get_codec(name), get_codec(name, "cuda")
    assert repr(dev) == f"Codec({name!r}, backend='cuda')"
    assert dev.ratio == ref.ratio
    assert all(dev.wire_bytes(n) == ref.wire_bytes(n) for n in (0, 1, 7, 4099))


@needs_cuda
@pytest.mark.parametrize("name", CODECS)
def test_wrong_buffers_are_refused(name):
    codec = get_codec(name, "cuda")
    x = cuda.to_device(np.ones(5, np.float32))
    good = cuda.device_array(codec.wire_bytes(5), np.uint8)
    with pytest.raises(ValueError, match=r"src must be .* float32 device array, got a host"):
        codec.encode(np.ones(5, np.float32), good)
    with pytest.raises(ValueError, match=r"out must be .* uint8 device array .* got a host"):
        codec.encode(x, np.empty(codec.wire_bytes(5), np.uint8))
    with pytest.raises(ValueError, match=r"out has .* bytes.*wire_bytes\(5\)"):
        codec.encode(x, cuda.device_array(codec.wire_bytes(5) + 1, np.uint8))
    with pytest.raises(ValueError, match="src must be a 1-D C-contiguous float32 device array"):
        codec.encode(cuda.to_device(np.ones(5, np.float64)), good)
    big = cuda.device_array(codec.wire_bytes(5) + 4, np.uint8)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        codec.encode(x, big[1 : 1 + codec.wire_bytes(5)])
    codec.encode(x, big[4 : 4 + codec.wire_bytes(5)])  # aligned slices are fine
    with pytest.raises(ValueError, match="dst must be a 1-D C-contiguous float32 device array"):
        codec.add_decoded_into(good, np.ones(5, np.float32))


def test_kernels_have_no_fused_multiply_add():
    """An FMA rounds a * b + c once; NumPy rounds the product, then the sum. NVVM contracts by
    default, so a kernel with an `fma` in its PTX would differ from NumPy in the last bit on a
    GPU while passing every simulated test. Compiled for cc 9.0 without a GPU, in a subprocess
    without the simulator."""
    script = textwrap.dedent(
        """
        import json
        from pipesgd_ref.codecs import cuda_kernels
        from pipesgd_ref.ops.cuda_support import compile_kernels
        ptx = compile_kernels(cuda_kernels.KERNELS, cc=(9, 0))
        print(json.dumps([k for k, p in ptx.items() if "fma." in p]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, f"compiling cuda_kernels.KERNELS failed:\n{proc.stderr[-3000:]}"
    with_fma = proc.stdout.strip().splitlines()[-1]
    assert with_fma == "[]", f"kernels with a fused multiply-add in their PTX: {with_fma}"


# --- on a real GPU, at training sizes ---------------------------------------------------------


def _real_gpu_or_skip() -> None:
    if os.environ.get("PIPESGD_GPU_TESTS") != "1":
        pytest.skip(
            "4M-element GPU test: set PIPESGD_GPU_TESTS=1 on a machine with an NVIDIA GPU to run "
            "it (the simulator would take hours at this size)"
        )
    if simulated():
        pytest.skip("NUMBA_ENABLE_CUDASIM is set: unset it to run the GPU tests on the GPU")
    if _PROBLEM is not None:
        pytest.skip(_PROBLEM)


@pytest.mark.gpu
@pytest.mark.parametrize("name,stochastic", VARIANTS, ids=ids)
@pytest.mark.parametrize("kind", ["random", "specials", "zeros"])
def test_gpu_equals_numpy_bitwise_at_4m(name, stochastic, kind):
    _real_gpu_or_skip()
    n = 4 * 2**20 + 3  # many blocks, q8's two-pass max, and a ragged end
    x = make_values(name, kind, n, seed=11, magnitude=1e-3)
    check_against_numpy(name, stochastic, x, make_dst(n, 12), seed=13)
