"""The dense layers' matrix products as CUDA kernels: C = op(A) @ op(B) (+ bias), and db.

Two rungs of one product, chosen by size in `matmul`:

    matmul_tiled_kernel            one thread per output, TILE x TILE tiles of both operands
                                   staged in shared memory: each element fetched from global
                                   memory is used TILE times (arithmetic intensity up by TILE)
    matmul_register_tiled_kernel   from REGISTER_TILED_FROM outputs: each thread keeps a 4 x 4
                                   micro-tile of C in registers, fed 16 multiply-adds from 8
                                   shared-memory reads, in 64 x 64 block tiles

Both read a transposed operand along its stored rows and transpose it on the way into shared
memory, so X^T dY and dY W^T read global memory as fast (coalesced) as X W, and one kernel
serves the forward product and both gradients. The bias is added in the epilogue (fused).
`column_sum_kernel` is the bias gradient, a deterministic tree reduction in shared memory.
The tiles are float32 in shared memory: these kernels take float32 only.
"""

from __future__ import annotations

from typing import no_type_check

from numba import cuda, float32

from pipesgd_ref.ops.cuda_support import TILE, launch, launch_2d


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def matmul_tiled_kernel(A, B, bias, C, trans_a, trans_b):
    """C = op(A) @ op(B) (+ bias), op(M) = M^T when its flag is set, else M.

    As a loop, with op(A) (M, K) and op(B) (K, N):
        for i in M, j in N: C[i, j] = (bias[j] if len(bias) else 0) + sum_k op(A)[i, k] op(B)[k, j]
    Used three ways: X @ W + b (forward), X^T @ dY (dW), dY @ W^T (dX); an empty `bias` means none.

    Optimisations: one thread per output element, one block per TILE x TILE output tile; tiles
    of op(A) and op(B) staged in shared memory (global reads cut by a factor TILE); coalesced
    global reads even for a transposed operand (threadIdx.x walks the stored rows; the transpose
    happens on the write into shared memory); zero padding at ragged edges, so no shape needs to
    be a multiple of TILE. The flags are the same for the whole grid: the branches on them never
    diverge within a warp, and one kernel serves all three products (one tile loop to read).
    """
    As = cuda.shared.array((TILE, TILE), float32)  # As[r, k] = op(A)[row0 + r, k0 + k]
    Bs = cuda.shared.array((TILE, TILE), float32)  # Bs[k, c] = op(B)[k0 + k, col0 + c]
    tx = cuda.threadIdx.x  # along columns of C: consecutive threads, consecutive addresses
    ty = cuda.threadIdx.y
    row0 = cuda.blockIdx.y * TILE
    col0 = cuda.blockIdx.x * TILE
    M, N = C.shape
    K = A.shape[0] if trans_a else A.shape[1]
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # Load phase: each thread fetches one element of each operand tile (0 past the edge).
        if trans_a:  # op(A)[r, k] = A[k, r]: read A[k0 + ty, row0 + tx] (coalesced), transpose
            k, r = k0 + ty, row0 + tx
            As[tx, ty] = A[k, r] if k < K and r < M else float32(0.0)
        else:
            r, k = row0 + ty, k0 + tx
            As[ty, tx] = A[r, k] if r < M and k < K else float32(0.0)
        if trans_b:  # op(B)[k, c] = B[c, k]: read B[col0 + ty, k0 + tx] (coalesced), transpose
            c, k = col0 + ty, k0 + tx
            Bs[tx, ty] = B[c, k] if c < N and k < K else float32(0.0)
        else:
            k, c = k0 + ty, col0 + tx
            Bs[ty, tx] = B[k, c] if k < K and c < N else float32(0.0)
        cuda.syncthreads()  # the whole tile is loaded before anyone reads it
        for kk in range(TILE):  # zero padding makes the ragged last tile harmless
            acc += As[ty, kk] * Bs[kk, tx]
        cuda.syncthreads()  # everyone is done with this tile before the next load overwrites it
    i, j = row0 + ty, col0 + tx
    if i < M and j < N:  # the epilogue: guard the store, fuse the bias
        if bias.shape[0] > 0:
            acc += bias[j]
        C[i, j] = acc


# Register tiling: the block tile, its depth, and each thread's micro-tile of C.
RT_BM = RT_BN = 64  # a block computes a 64 x 64 tile of C ...
RT_BK = 16  # ... from 64 x 16 and 16 x 64 tiles of the operands in shared memory ...
RT_TM = RT_TN = 4  # ... each of its 16 x 16 threads a 4 x 4 micro-tile, held in registers
RT_THREADS = RT_BM // RT_TM  # 16 threads a side: 256 a block
# elements of each operand tile that each thread loads
RT_LOADS = RT_BM * RT_BK // (RT_THREADS * RT_THREADS)
REGISTER_TILED_FROM = 64 * 64  # outputs from which dense ops use the register-tiled kernel


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def matmul_register_tiled_kernel(A, B, bias, C, trans_a, trans_b):
    """C = op(A) @ op(B) (+ bias): the same product as `matmul_tiled_kernel`, one rung up.

    The shared-memory tile cut global reads by TILE; what limits `matmul_tiled_kernel` next is
    shared memory itself: every multiply-add reads two floats from it. Here each thread computes an
    RT_TM x RT_TN micro-tile of C in registers (`acc`): per step kk of the block's depth it
    reads RT_TM floats of the A tile and RT_TN of the B tile into registers (`a`, `b`) and does
    RT_TM * RT_TN multiply-adds with them, so each shared read feeds RT_TN (or RT_TM) of them
    instead of one. The block tile grows to RT_BM x RT_BN with the same 256 threads, so each
    global read is reused RT_BM times too.

        block (bx, by): C[by*BM : by*BM + BM, bx*BN : bx*BN + BN]
        thread (tx, ty): rows by*BM + ty*TM + (0..TM-1), columns bx*BN + tx*TN + (0..TN-1)
        As[k, r] = op(A)[row0 + r, k0 + k]   (stored k-major: a thread's TM rows are adjacent)
        Bs[k, c] = op(B)[k0 + k, col0 + c]

    Loads: each of the 256 threads fetches RT_LOADS elements of each operand tile, consecutive
    threads consecutive addresses of the stored (row-major) operand whatever the transpose flag
    (0 past the edges). Two barriers per depth step, as in `matmul_tiled_kernel`. Sums run over
    k in the same order for every element (deterministic), not in `matmul_tiled_kernel`'s order:
    the two kernels agree to float32 rounding, not bitwise.
    """
    As = cuda.shared.array((RT_BK, RT_BM), float32)
    Bs = cuda.shared.array((RT_BK, RT_BN), float32)
    acc = cuda.local.array((RT_TM, RT_TN), float32)
    a = cuda.local.array(RT_TM, float32)
    b = cuda.local.array(RT_TN, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * RT_THREADS + tx
    row0 = cuda.blockIdx.y * RT_BM
    col0 = cuda.blockIdx.x * RT_BN
    M, N = C.shape
    K = A.shape[0] if trans_a else A.shape[1]
    for i in range(RT_TM):
        for j in range(RT_TN):
            acc[i, j] = float32(0.0)
    for k0 in range(0, K, RT_BK):
        for n in range(RT_LOADS):
            e = n * RT_THREADS * RT_THREADS + tid  # this thread's n-th element of the tile
            if trans_a:  # A is (K, M): walk its rows (r fastest): coalesced
                k, r = e // RT_BM, e % RT_BM
                As[k, r] = A[k0 + k, row0 + r] if k0 + k < K and row0 + r < M else float32(0.0)
            else:  # A is (M, K): walk its rows (k fastest): coalesced
                r, k = e // RT_BK, e % RT_BK
                As[k, r] = A[row0 + r, k0 + k] if row0 + r < M and k0 + k < K else float32(0.0)
            if trans_b:  # B is (N, K): k fastest
                c, k = e // RT_BK, e % RT_BK
                Bs[k, c] = B[col0 + c, k0 + k] if col0 + c < N and k0 + k < K else float32(0.0)
            else:  # B is (K, N): c fastest
                k, c = e // RT_BN, e % RT_BN
                Bs[k, c] = B[k0 + k, col0 + c] if k0 + k < K and col0 + c < N else float32(0.0)
        cuda.syncthreads()  # both tiles are loaded before anyone reads them
        for kk in range(RT_BK):
            for i in range(RT_TM):
                a[i] = As[kk, ty * RT_TM + i]
            for j in range(RT_TN):
                b[j] = Bs[kk, tx * RT_TN + j]
            for i in range(RT_TM):  # RT_TM * RT_TN multiply-adds from RT_TM + RT_TN reads
                for j in range(RT_TN):
                    acc[i, j] += a[i] * b[j]
        cuda.syncthreads()  # everyone is done with these tiles before the next load
    for i in range(RT_TM):
        r = row0 + ty * RT_TM + i
        for j in range(RT_TN):
            c = col0 + tx * RT_TN + j
            if r < M and c < N:
                value = acc[i, j]
                if bias.shape[0] > 0:
                    value += bias[c]
                C[r, c] = value


def matmul(A, B, bias, C, trans_a: bool, trans_b: bool) -> None:
    """C = op(A) @ op(B) (+ bias) with the kernel for its size: the register-tiled one from
    REGISTER_TILED_FROM outputs (where its 64 x 64 block tiles are mostly full), the
    shared-memory tiled one below (a small product would leave most of a 64 x 64 tile idle)."""
    M, N = C.shape
    if M * N >= REGISTER_TILED_FROM:
        grid = (max(1, -(-N // RT_BN)), max(1, -(-M // RT_BM)))
        geometry = (grid, (RT_THREADS, RT_THREADS))
        launch(matmul_register_tiled_kernel, geometry, A, B, bias, C, trans_a, trans_b)
    else:
        launch(matmul_tiled_kernel, launch_2d(M, N), A, B, bias, C, trans_a, trans_b)


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def column_sum_kernel(dY, db):
    """db[j] = sum_i dY[i, j] (the bias gradient).

    As a loop: for j in n_out: db[j] = 0; for i in B: db[j] += dY[i, j].

    Optimisations: a block owns TILE columns and has TILE x TILE threads; thread (ty, tx) sums
    rows ty, ty + TILE, ... of column col0 + tx (a row of threads reads a contiguous run of a
    row of dY: coalesced), then the TILE partial sums of each column are combined by a tree
    reduction in shared memory (log2(TILE) steps, fixed order: deterministic).
    """
    partial = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    j = cuda.blockIdx.x * TILE + tx
    B, N = dY.shape
    acc = float32(0.0)
    if j < N:
        for i in range(ty, B, TILE):
            acc += dY[i, j]
    partial[ty, tx] = acc
    cuda.syncthreads()
    half = TILE // 2  # TILE is a power of two: every step halves the rows still summing
    while half > 0:
        if ty < half:
            partial[ty, tx] += partial[ty + half, tx]
        cuda.syncthreads()  # this step's sums are written before the next step reads them
        half //= 2
    if ty == 0 and j < N:
        db[j] = partial[0, tx]


_M = "float32[:, ::1]"
_V = "float32[::1]"
# Every kernel with one example signature: tests/test_cuda_compile.py compiles each to PTX.
KERNELS = [
    (matmul_tiled_kernel, f"({_M}, {_M}, {_V}, {_M}, boolean, boolean)"),
    (matmul_register_tiled_kernel, f"({_M}, {_M}, {_V}, {_M}, boolean, boolean)"),
    (column_sum_kernel, f"({_M}, {_V})"),
]
