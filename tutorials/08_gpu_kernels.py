# %% [markdown]
# # 08 · GPU kernels: from a NumPy matmul to a tiled CUDA kernel and a ring-reduction kernel
#
# **A number to start with.** The MLP that `benchmarks/kernels_gpu.py --train` trains on a GPU,
# 64 -> 2048 -> 2048 -> 2048 -> 10 (8.5M parameters) at a batch of 512, costs per step:
#
#     forward    2·B·Σ n_in·n_out = 2 · 512 · 8,540,160                        =  8.7 GFLOP
#     backward   dW of every layer (8.7) + dA of every layer but the first (8.6) = 17.4 GFLOP
#     together                                                                  = 26.1 GFLOP
#
# An H200 does about 67 TFLOP/s in float32 (without tensor cores): 26.1 GFLOP / 67 TFLOP/s =
# 0.39 ms of arithmetic. But a matmul written naively fetches both operands of every
# multiply-add from global memory: 13.1 G multiply-adds x 8 bytes = 104 GB, which at the H200's
# 4.8 TB/s takes 22 ms, 56 times the arithmetic. The arithmetic is not the problem; feeding it
# is. A tiled kernel loads each operand tile into the block's shared memory once and reuses it
# TILE times, cutting global traffic by TILE (16 here: 6.5 GB, 1.4 ms): that is the whole idea
# of this tutorial. (Caches soften the naive figure on a real GPU, and cuBLAS goes further than
# shared-memory tiles; `benchmarks/kernels_gpu.py` measures both against each other.)
#
# You will:
# 1. see where this tutorial runs: a real GPU, or Numba's CUDA simulator (CPU threads);
# 2. write the matmul as loops, then as a naive CUDA kernel (one thread per output), and check
#    it against NumPy;
# 3. read the package's tiled kernel (`ops/cuda_matmul.py: matmul_tiled_kernel`) and check it
#    too, counting the global-memory reads each one makes;
# 4. run the package's ring AllReduce on device arrays (`comm.device_ring.device_allreduce`,
#    what `--device cuda` runs): only the chunks in flight cross to the host, the additions are
#    a kernel, and the result is bitwise the CPU ring's;
# 5. on a GPU, time naive against tiled.
#
# Run it with `python tutorials/08_gpu_kernels.py`. Without a GPU it runs everything in
# Numba's simulator, at tiny sizes: the simulator executes every thread as Python
# (milliseconds each), checking indexing and barriers, not speed. Takes about 2 s here on two
# cores without a GPU, the same with `PIPESGD_TUTORIAL_SMALL=1` (the sizes depend only on
# whether a GPU is present).

# %%
import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

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

from pipesgd_ref.comm.device_ring import device_allreduce  # noqa: E402
from pipesgd_ref.comm.rendezvous import JobSpec, init_process_group, new_token  # noqa: E402
from pipesgd_ref.comm.schedule import simulate_allreduce  # noqa: E402
from pipesgd_ref.exercises import check  # noqa: E402
from pipesgd_ref.ops import cuda_ops, numpy_ops  # noqa: E402
from pipesgd_ref.ops.cuda_support import TILE, launch_2d  # noqa: E402
from pipesgd_ref.runtime.launch import free_port  # noqa: E402

where = cuda.get_current_device().name if ON_GPU else "Numba's CUDA simulator (no GPU here)"
print(f"running on: {where}")

# %% [markdown]
# The opening number, from the layer sizes. A dense layer of n_in -> n_out at batch B is one
# (B, n_in) x (n_in, n_out) product forward, 2·B·n_in·n_out FLOP (a multiply and an add per
# term); backward needs two of the same size, dW = A^T dZ and dA = dZ W^T, except that the first
# layer's dA (the gradient of the input) is never needed.

# %%
layers, batch = (64, 2048, 2048, 2048, 10), 512
pairs = list(zip(layers, layers[1:], strict=False))
n_params = sum(n_in * n_out + n_out for n_in, n_out in pairs)
forward = sum(2 * batch * n_in * n_out for n_in, n_out in pairs)
backward = 2 * forward - 2 * batch * layers[0] * layers[1]  # dW everywhere, dA but the first
step_flop = forward + backward
H200_FLOPS, H200_BYTES_PER_S = 67e12, 4.8e12  # float32 without tensor cores; HBM3e
naive_bytes = step_flop / 2 * 8  # one multiply-add per 2 FLOP, two float32 operands each
print(f"{n_params:,} parameters; forward {forward / 1e9:.1f} + backward {backward / 1e9:.1f} = "
      f"{step_flop / 1e9:.1f} GFLOP a step: {step_flop / H200_FLOPS * 1e3:.2f} ms of arithmetic, "
      f"{naive_bytes / H200_BYTES_PER_S * 1e3:.0f} ms of naive reads ({naive_bytes / 1e9:.0f} "
      f"GB), {naive_bytes / TILE / H200_BYTES_PER_S * 1e3:.1f} ms tiled")  # fmt: skip
assert round(step_flop / 1e9, 1) == 26.1 and round(naive_bytes / 1e9) == 104  # the prose above

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
# `cuda_ops.dense_forward` launches `matmul_tiled_kernel` (its docstring: ops/cuda_matmul.py).
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
# ## 4. The ring AllReduce on the device
#
# In a ring AllReduce (tutorial 02) each rank, at every reduce-scatter step, receives a chunk
# from its left neighbour and adds it into its own copy. With `--device cuda` the gradient lives
# on the GPU and `comm.device_ring.device_allreduce` runs the same ring (the same chunks, frames
# and order of additions as `ring.ring_allreduce`), with only the chunks in flight crossing the
# PCIe bus:
#
#     reduce-scatter, per segment:  socket -> pinned host slot -> device scratch (H2D)
#                                   cuda_ops.add_into(array[s:e], scratch)   on the device
#                                   array[s:e] -> the pinned slot (D2H) -> socket
#     all-gather, per segment:      socket -> pinned slot -> array[s:e] (H2D) -> socket
#
# Pinned (page-locked) buffers are copied by DMA at full PCIe speed, so the ring allocates them
# once and reuses them. Per rank: M bytes device to host and 2(p−1)/p · M host to device, beside
# the 2(p−1)/p · M bytes on the wire, and (p−1)/p · M additions on the GPU.
#
# Here the p ranks are threads of this process, each with its own `Communicator` over real
# loopback TCP sockets (tutorials 02 and 07 use processes; a forked process cannot use the CUDA
# context this process already holds, and threads share it). TCP is asked for by name
# (`transport="tcp"`): it is the socket path drawn above, and JobSpec's default, auto, would
# link ranks on one host through shared memory (tutorial 13, section 2). One precaution
# belongs to the simulator alone: it runs a kernel by swapping the module's `cuda` for a
# stand-in, so two threads must not launch at once; `ops` is the cuda backend with its
# `add_into` behind a lock (on a GPU the lock costs a few microseconds a launch, and the
# kernels still queue in order).

# %%
p, n = 3, (50 if not ON_GPU else 1_000_003)
grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(p)]
launch_lock = threading.Lock()


def locked_add_into(dst, src) -> None:
    with launch_lock:
        cuda_ops.add_into(dst, src)


ops = SimpleNamespace(add_into=locked_add_into)
port, token = free_port(), new_token()
summed: list = [None] * p
failures: list = []


def rank_main(rank: int) -> None:
    try:
        spec = JobSpec(rank, p, master_port=port, token=token, transport="tcp")  # the sockets
        with init_process_group(spec) as comm:
            on_device = cuda.to_device(grads[rank])  # this rank's gradient, on the GPU
            device_allreduce(comm, on_device, "sum", ops=ops)
            summed[rank] = on_device.copy_to_host()
    except Exception as e:  # re-raised below, in the main thread
        failures.append((rank, e))


ranks = [threading.Thread(target=rank_main, args=(r,)) for r in range(p)]
for thread in ranks:
    thread.start()
for thread in ranks:
    thread.join()
if failures:
    raise failures[0][1]
want = simulate_allreduce(grads, "sum")  # the CPU ring, in one process: the oracle
for r in range(p):
    assert np.array_equal(summed[r].view(np.uint32), want[r].view(np.uint32)), (
        f"rank {r}: the device ring's sum differs from the CPU ring's, max |diff| "
        f"{np.abs(summed[r] - want[r]).max():.3g}"
    )
print(f"device_allreduce of {n:,} floats over {p} ranks: bitwise the CPU ring's on every rank")

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

# %% [markdown]
# ## Summary
#
# - A training step of the benchmark MLP is 26 GFLOP: 0.4 ms of float32 arithmetic on an H200,
#   but 22 ms if every multiply-add fetched its two operands from global memory. Matmuls on a
#   GPU are bounded by how well they reuse what they load.
# - The naive kernel (one thread per output, a dot product from global memory) is correct and
#   easy to check; the tiled kernel (`matmul_tiled_kernel`) stages TILE x TILE tiles of each
#   operand in shared memory between two `cuda.syncthreads()` barriers and reads global memory
#   TILE times less. Both equal `numpy_ops.dense_forward`, the definition, to float32 rounding.
# - `device_allreduce` runs the ring of `comm.ring` on device arrays: the same schedule and order
#   of additions, chunks staged through reused pinned buffers, the additions a kernel. Its sum is
#   bitwise the CPU ring's on every rank.
# - Numba's simulator runs every CUDA thread as a Python thread: it checks indexing, barriers and
#   results at tiny sizes, never speed.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Redo the opening number for a batch of 64 and of 4096. On an H200, how many times
# longer than the arithmetic does the tiled kernel's global traffic (the naive reads divided
# by TILE) take, at batch 512? Why is it the same at every batch, and what TILE would make the
# two equal?
#
# <details><summary>Hint</summary>
#
# Every term of the step's FLOP count is proportional to the batch, and so are the naive
# reads (8 bytes per multiply-add, one multiply-add per 2 FLOP: 4 bytes per FLOP), so the
# batch cancels. Traffic time over arithmetic time is 4·(67 TFLOP/s) / (TILE·4.8 TB/s).
#
# </details>

# %%
answer = None  # your answer: the tiled kernel's traffic time over its arithmetic time, H200
check("08.1", answer)

# %% [markdown]
# **2.** In `naive_matmul`, swap the roles of the grid's axes (`i, j = cuda.grid(2)`). The
# result stays right; on a GPU, time it: which accesses stop being coalesced, and why does it
# matter?
#
# <details><summary>Hint</summary>
#
# A warp is 32 threads with consecutive x indices. With x along the columns j, the warp's
# threads read W[k, j], W[k, j+1], ...: neighbouring addresses, one wide memory transaction.
# With x along the rows i, they read X[i, k], X[i+1, k], ... a row length apart, and W[k, j]
# is the same address for all: many transactions where one would do. Use `best_of` of
# section 5.
#
# </details>

# %% [markdown]
# **3.** Count the global reads of the tiled kernel at B = 20, n_in = 18, n_out = 13 by hand
# (in elements read from global memory; section 3 prints the figure when it runs in the
# simulator), and explain why the ratio to the naive kernel's reads is far below TILE at this
# size.
#
# <details><summary>Hint</summary>
#
# The output has ⌈20/16⌉·⌈13/16⌉ tiles; each walks ⌈18/16⌉ steps along n_in, and each step
# loads one TILE x TILE tile of X and one of W, padding included. The padded edges are read
# (as zeros) though they hold no data, and at these sizes most of each tile is padding.
#
# </details>

# %%
answer = None  # your answer: the tiled kernel's global reads (elements) at B=20, 18 -> 13
check("08.3", answer)

# %% [markdown]
# **4.** Count the PCIe copies of one `device_allreduce` call in section 4's table, per rank,
# for p = 4: how many chunks go device to host, and how many host to device? They make up
# M bytes device to host and 2(p−1)/p · M host to device (comm/device_ring.py). Which of
# them could two ranks on the same GPU skip?
#
# <details><summary>Hint</summary>
#
# Step 0 sends this rank's own chunk: one D2H. Each reduce-scatter step receives a chunk
# (H2D into the scratch) and, after the addition, the sum leaves for the next rank (D2H),
# up to and including the complete chunk that starts the all-gather; each all-gather step
# receives a chunk (H2D into the array) and forwards the same pinned slot. Two ranks on one
# GPU could copy device to device instead (CUDA IPC), skipping the host on both sides.
#
# </details>

# %%
answer = None  # your answer: (chunks device to host, chunks host to device) per rank, p = 4
check("08.4", answer)

# %% [markdown]
# **5.** Pass `codec=get_codec("trunc16")` (from `pipesgd_ref.codecs`) to `device_allreduce` in
# section 4. The result is no longer the oracle's: compare it with
# `comm.schedule.simulate_compressed_allreduce`. Where does the codec run, host or device, and
# why (comm/device_ring.py's docstring)?
#
# <details><summary>Hint</summary>
#
# With a codec the compressed ring runs on a host copy of the whole array: one D2H and one
# H2D of M bytes per call. Compressed codes cannot be added, so every reduce-scatter hop
# decodes, adds and re-encodes a partial sum, and the project's codecs do that on the host.
# The result should equal the compressed simulation bitwise, not the uncompressed oracle.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 08
# (on the site, the page "Solutions to the exercises").
