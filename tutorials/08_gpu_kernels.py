# %% [markdown]
# # 08 · GPU kernels: from a NumPy matmul to a tiled CUDA kernel and a ring-reduction kernel
#
# **A number to start with.** A dense layer of the 10M-parameter MLP in `benchmarks/
# kernels_gpu.py` multiplies 512 x 2048 activations by a 2048 x 2048 weight matrix: 4.3 GFLOP
# forward, twice that backward. An H200 does about 60 TFLOP/s in float32, so the arithmetic takes
# 0.2 ms; reading the operands naively (every multiply fetching both of its inputs from global
# memory, 4.8 TB/s) would take 8.6 GB / 4.8 TB/s = 1.8 ms. The arithmetic is not the problem;
# feeding it is. A tiled kernel loads each operand tile into the block's shared memory once and
# reuses it TILE times, cutting global traffic by TILE: that is the whole idea of this tutorial.
#
# You will:
# 1. see where this tutorial runs: a real GPU, or Numba's CUDA simulator (CPU threads);
# 2. write the matmul as loops, then as a naive CUDA kernel (one thread per output), and check
#    it against NumPy;
# 3. read the package's tiled kernel (`ops/cuda_ops.py: _matmul_tiled`) and check it too,
#    counting the global-memory reads each one makes;
# 4. run the reduce step of a ring AllReduce on the device: received chunks cross from the host
#    (a pinned buffer, as `--device cuda` does), and are added by a kernel; the result is bitwise
#    the CPU ring's;
# 5. on a GPU, time naive against tiled.
#
# Run it with `python tutorials/08_gpu_kernels.py` (set `PIPESGD_TUTORIAL_SMALL=1` for the quick
# version CI runs). Without a GPU it runs everything in the simulator, at tiny sizes: the
# simulator executes every thread as Python (milliseconds each), checking indexing and
# barriers, not speed.

# %%
import os
import subprocess
import sys
import time

import numpy as np

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: the same lessons, fewer sizes


def gpu_present() -> bool:
    """Ask a separate process: once numba.cuda is imported here, the simulator can no longer be
    switched on (NUMBA_ENABLE_CUDASIM is read at import)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0"):
        return False
    probe = "from numba import cuda; print(cuda.is_available())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return done.stdout.strip().endswith("True")


ON_GPU = gpu_present()
if not ON_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # before numba is imported below

from numba import cuda, float32  # noqa: E402  (after choosing GPU or simulator)

from pipesgd_ref.comm.schedule import chunk_bounds, reduce_scatter_chunks, simulate_allreduce
from pipesgd_ref.ops import cuda_ops, numpy_ops  # noqa: E402
from pipesgd_ref.ops.cuda_support import TILE, launch_2d  # noqa: E402

where = cuda.get_current_device().name if ON_GPU else "Numba's CUDA simulator (no GPU here)"
print(f"running on: {where}")

# %% [markdown]
# ## 1. The matmul as loops
#
# `numpy_ops.dense_forward` is the definition: Y = X @ W + b, with X (B, n_in), W (n_in, n_out).
# As loops, each output element is one dot product of a row of X with a column of W. Every
# multiply reads two numbers; B·n_out·n_in multiplies read 2·B·n_out·n_in numbers.

# %%
rng = np.random.default_rng(0)
B, n_in, n_out = (20, 18, 13) if not ON_GPU else (512, 1024, 1024)
X = rng.standard_normal((B, n_in), dtype=np.float32)
W = rng.standard_normal((n_in, n_out), dtype=np.float32)
b = rng.standard_normal(n_out, dtype=np.float32)

Y_ref = np.empty((B, n_out), np.float32)
numpy_ops.dense_forward(X, W, b, Y_ref)

Y_loops = np.zeros((B, n_out), np.float32)
for i in range(min(B, 4)):  # the plain loop, on a few rows: it is the same thing, slowly
    for j in range(n_out):
        Y_loops[i, j] = b[j] + sum(X[i, k] * W[k, j] for k in range(n_in))
assert np.allclose(Y_loops[:4], Y_ref[:4], rtol=1e-5, atol=1e-5)
print(f"loops == numpy_ops.dense_forward on {min(B, 4)} rows; reads: {2 * B * n_out * n_in:,}")

# %% [markdown]
# ## 2. The naive kernel: one thread per output element
#
# `cuda.grid(2)` gives each thread its (column, row); the grid covers the output in TILE x TILE
# blocks (`launch_2d`), and threads past the edge return. Each thread runs the dot product
# straight from global memory: correct, and as slow as the reads.

# %%


@cuda.jit
def naive_matmul(X, W, b, Y):
    """Y[i, j] = b[j] + sum_k X[i, k] W[k, j]: one thread per (i, j), reading global memory."""
    j, i = cuda.grid(2)  # x along columns: neighbouring threads read neighbouring W[k, j]
    if i < Y.shape[0] and j < Y.shape[1]:
        acc = float32(0.0)
        for k in range(X.shape[1]):
            acc += X[i, k] * W[k, j]
        Y[i, j] = acc + b[j]


dX, dW, db = cuda.to_device(X), cuda.to_device(W), cuda.to_device(b)
dY = cuda.device_array((B, n_out), np.float32)
grid, block = launch_2d(B, n_out)
t0 = time.perf_counter()
naive_matmul[grid, block](dX, dW, db, dY)
cuda.synchronize()
print(f"naive kernel: grid {grid} x block {block}, {time.perf_counter() - t0:.2f} s")
assert np.allclose(dY.copy_to_host(), Y_ref, rtol=1e-4, atol=1e-4)

# %% [markdown]
# ## 3. The tiled kernel
#
# `cuda_ops.dense_forward` launches `_matmul_tiled` (read its docstring in ops/cuda_ops.py).
# A block of TILE x TILE threads computes one TILE x TILE tile of Y. It walks the shared
# dimension in steps of TILE: each thread loads ONE element of the X tile and ONE of the W
# tile into shared memory, `cuda.syncthreads()` waits until the whole tile is there, then every
# thread does TILE multiply-adds from shared memory, and a second barrier keeps the next load
# from overwriting a tile someone still reads. Global reads fall from 2·B·n_out·n_in to
# 2·B·n_out·n_in / TILE. Edges are padded with zeros, so no shape needs to be a multiple of TILE.

# %%
dY2 = cuda_ops.empty((B, n_out))
t0 = time.perf_counter()
cuda_ops.dense_forward(dX, dW, db, dY2)
cuda.synchronize()
print(f"tiled kernel (TILE = {TILE}): {time.perf_counter() - t0:.2f} s")
assert np.allclose(cuda_ops.to_host(dY2), Y_ref, rtol=1e-4, atol=1e-4)
naive_reads = 2 * B * n_out * n_in


def tiles(length: int) -> int:
    return -(-length // TILE)


# each output tile loads one TILE x TILE tile of X and of W per step along n_in
tiled_reads = tiles(B) * tiles(n_out) * tiles(n_in) * 2 * TILE * TILE
ratio = naive_reads / tiled_reads
print(f"global reads: naive {naive_reads:,}, tiled {tiled_reads:,} ({ratio:.1f}x fewer; "
      f"{TILE}x at large sizes, less here: the padded edges are read too)")  # fmt: skip

# %% [markdown]
# ## 4. The ring's reduction on the device
#
# In a ring AllReduce (tutorial 02) each rank, at every reduce-scatter step, receives a chunk
# from its left neighbour and adds it into its own copy. With `--device cuda` the gradient lives
# on the GPU: the chunk to send goes device -> a pinned host buffer -> the socket, and the chunk
# received goes socket -> pinned buffer -> device, where a kernel adds it (`cuda_ops.add_into`:
# a grid-stride loop, one thread per element). Only chunks cross the PCIe bus, never the whole
# gradient. Here p "ranks" live in one process, their arrays on the device, and the socket is
# a copy through pinned memory; the additions happen in the ring's fixed order, so the result
# is bitwise `simulate_allreduce`'s (the CPU ring's).

# %%
p, n = 3, (50 if not ON_GPU else 1_000_003)
grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(p)]
on_device = [cuda.to_device(g) for g in grads]
bounds = chunk_bounds(n, p)
pinned = cuda.pinned_array(max(e - s for s, e in bounds), np.float32)  # reused every step
scratch = cuda_ops.empty(pinned.size)
for step in range(p - 1):
    sent = []
    for r in range(p):  # every rank copies its outgoing chunk to the host ("sends" it)
        s, e = bounds[reduce_scatter_chunks(r, step, p)[0]]
        sent.append(on_device[r][s:e].copy_to_host())
    for r in range(p):  # every rank receives its left neighbour's chunk and adds it on the GPU
        s, e = bounds[reduce_scatter_chunks(r, step, p)[1]]
        pinned[: e - s] = sent[(r - 1) % p]  # the socket wrote into the pinned buffer
        scratch[: e - s].copy_to_device(pinned[: e - s])
        cuda_ops.add_into(on_device[r][s:e], scratch[: e - s])
want = simulate_allreduce(grads)
for r in range(p):  # after p-1 steps rank r owns the complete sum of chunk (r + 1) mod p
    s, e = bounds[(r + 1) % p]
    got = on_device[r][s:e].copy_to_host()
    assert np.array_equal(got, want[r][s:e]), f"rank {r}: the device sum differs"
print(f"ring reduce-scatter of {n:,} floats over {p} device 'ranks': bitwise the CPU ring's")

# %% [markdown]
# ## 5. Timing (a GPU only)
#
# In the simulator every thread is a Python thread, so times say nothing about a GPU. On one,
# the tiled kernel should beat the naive one by several times at 1024 x 1024, and
# `python benchmarks/kernels_gpu.py` sets both against cuBLAS.

# %%
if ON_GPU:

    def best_of(fn, reps: int = 5) -> float:
        times = []
        for _ in range(reps):
            cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times)

    flops = 2.0 * B * n_out * n_in
    t_naive = best_of(lambda: naive_matmul[grid, block](dX, dW, db, dY))
    t_tiled = best_of(lambda: cuda_ops.dense_forward(dX, dW, db, dY2))
    print(f"naive {flops / t_naive / 1e9:.0f} GFLOP/s, tiled {flops / t_tiled / 1e9:.0f} GFLOP/s")
else:
    print("no GPU: timing skipped (the simulator's times mean nothing)")
print("all checks passed")
