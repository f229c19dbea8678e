"""The CUDA kernels on a GPU: checked against NumPy, timed, and set against their roofline.

    python benchmarks/kernels_gpu.py [--n 4096] [--elements 16M] [--reps 20] [--json FILE]
                                     [--train] [--train-steps 30]

For each kernel it prints the median time over --reps launches (after a warm-up, timed with CUDA
events), its rate, and the fraction of a roofline measured on the same GPU in the same run:

    dense forward / backward   GFLOP/s (2 n^3 per product) against cuBLAS float32 through CuPy
                               (goal: the register-tiled kernel reaches 25% of cuBLAS)
    add_into, scale, sgd_step  GB/s of bytes read + written, against a device-to-device copy of
    and the codecs             the same bytes (goal: 70%)
    im2col, col2im, max-pool   GB/s of the bytes each reads and writes on a --window map,
                               against a device-to-device copy (goal: 70%)
    batch norm, average pool   the ResNet's: GB/s of the least traffic each needs on the same
                               map (batch norm: read once, write xhat and Y; its two-stage
                               sums read the map three times, so the goal is 50%)

Every kernel's output is first checked against the NumPy reference (ops/numpy_ops.py and the
NumPy codecs); a mismatch is printed as FAIL and the script exits 1. With --train it also times
`pipesgd train --device cuda` on an MLP of 8.5M parameters and on a CNN (TRAIN_MODELS) against
the Numba CPU backend on the same machine, in samples per second, and the ResNet's step
(loss_and_grad + sgd_step on the model itself, depth 8, channels 16, 32, 64) on the GPU against
Numba on the CPU, its loss and gradient first checked against NumPy's.

Without a GPU it says why and exits 0. In Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) it
runs at tiny sizes as a smoke test (tests/test_benchmarks_smoke.py): the checks mean something,
the times do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pipesgd_ref.ops import cuda_support, numpy_ops


def _events_time(fn, reps: int, warmup: int = 2) -> float:
    """Median seconds of fn() over reps calls, each bracketed by CUDA events."""
    from numba import cuda

    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(reps):
        if cuda_support.simulated():  # the simulator has no event timer: wall time
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
            continue
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def _cupy():
    try:
        import cupy

        return cupy
    except Exception:  # absent, or without a usable CUDA runtime: cuBLAS is then not compared
        return None


def _row(kernel, time_s, rate, unit, roofline, fraction, goal, ok) -> dict:
    return {"kernel": kernel, "time_s": time_s, "rate": rate, "unit": unit,
            "roofline": roofline, "fraction": fraction, "goal": goal, "ok": bool(ok)}  # fmt: skip


def count(text: str) -> int:
    """Elements in "16M" (2^20), "64K" (2^10) or "4096"."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def dense_rows(n: int, reps: int, rng) -> list[dict]:
    """Forward (X @ W + b) and backward (X^T dY, dY W^T, db) at n x n, checked, timed, and
    compared with cuBLAS (CuPy's matmul on the same device memory) when CuPy is installed."""
    from pipesgd_ref.ops import cuda_ops as ops

    X, W, dY = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(3))
    b = rng.standard_normal(n, dtype=np.float32)
    dX, dW, Y = (ops.empty((n, n)) for _ in range(3))
    db = ops.empty(n)
    dXd, Wd, dYd, bd = (ops.to_device(a) for a in (X, W, dY, b))
    want = np.empty((n, n), np.float32)
    numpy_ops.dense_forward(X, W, b, want)
    ops.dense_forward(dXd, Wd, bd, Y)
    fwd_ok = np.allclose(ops.to_host(Y), want, rtol=1e-3, atol=1e-3 * np.sqrt(n))
    want_dW, want_db, want_dX = np.empty_like(want), np.empty(n, np.float32), np.empty_like(want)
    numpy_ops.dense_backward(X, W, dY, want_dW, want_db, want_dX)
    ops.dense_backward(dXd, Wd, dYd, dW, db, dX)
    tol = dict(rtol=1e-3, atol=1e-3 * np.sqrt(n))
    bwd_ok = (np.allclose(ops.to_host(dW), want_dW, **tol) and np.allclose(ops.to_host(dX),
              want_dX, **tol) and np.allclose(ops.to_host(db), want_db, **tol))  # fmt: skip
    t_fwd = _events_time(lambda: ops.dense_forward(dXd, Wd, bd, Y), reps)
    t_bwd = _events_time(lambda: ops.dense_backward(dXd, Wd, dYd, dW, db, dX), reps)
    flops_fwd, flops_bwd = 2.0 * n**3, 4.0 * n**3
    ref_fwd = ref_bwd = None
    cp = _cupy()
    if cp is not None and not cuda_support.simulated():
        cX, cW, cdY = (cp.asarray(a) for a in (dXd, Wd, dYd))
        ref_fwd = _events_time(lambda: cp.matmul(cX, cW), reps)
        ref_bwd = _events_time(lambda: (cp.matmul(cX.T, cdY), cp.matmul(cdY, cW.T)), reps)
    rows = []
    measured = [("dense_forward", t_fwd, flops_fwd, ref_fwd, fwd_ok),
                ("dense_backward", t_bwd, flops_bwd, ref_bwd, bwd_ok)]  # fmt: skip
    for name, t, flops, ref, ok in measured:
        fraction = (ref / t) if ref else None
        rows.append(_row(f"{name} {n}x{n}", t, flops / t / 1e9, "GFLOP/s", "cuBLAS (CuPy)",
                         fraction, 0.25, ok))  # fmt: skip
    return rows


def memory_rows(n: int, reps: int, rng) -> list[dict]:
    """Elementwise ops and codecs on n float32 elements against a device-to-device copy."""
    from numba import cuda

    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.ops import cuda_ops as ops

    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    dx, dy = ops.to_device(x), ops.to_device(y)
    copy_dst = ops.empty(n)
    t_copy = _events_time(lambda: copy_dst.copy_to_device(dx), reps)
    copy_rate = 2 * 4 * n / t_copy  # bytes read + written per second

    rows = [_row(f"copy (d2d) {n:,}", t_copy, copy_rate / 1e9, "GB/s", "itself", 1.0, None, True)]

    def row(name: str, fn, nbytes: int, ok: bool) -> None:
        t = _events_time(fn, reps)
        fraction = nbytes / t / copy_rate
        rows.append(_row(f"{name} {n:,}", t, nbytes / t / 1e9, "GB/s", "d2d copy", fraction,
                         0.7, ok))  # fmt: skip

    d = ops.to_device(x)  # add_into: dst += src, read 2, write 1
    ops.add_into(d, dy)
    row("add_into", lambda: ops.add_into(d, dy), 3 * 4 * n, np.array_equal(ops.to_host(d), x + y))
    d = ops.to_device(x)
    ops.scale(d, 0.5)
    row("scale", lambda: ops.scale(d, 1.0), 2 * 4 * n,
        np.array_equal(ops.to_host(d), x * np.float32(0.5)))  # fmt: skip
    d = ops.to_device(x)
    ops.sgd_step(d, dy, 0.1)
    want = x.copy()
    numpy_ops.sgd_step(want, y, 0.1)
    row("sgd_step", lambda: ops.sgd_step(d, dy, 0.0), 3 * 4 * n,
        np.allclose(ops.to_host(d), want, rtol=1e-6, atol=1e-7))  # fmt: skip
    for name in ("trunc16", "bf16", "q8"):
        host, dev = get_codec(name, "numpy"), get_codec(name, "cuda")
        wire = host.wire_bytes(n)
        codes_h = np.empty(wire, np.uint8)
        host.encode(x, codes_h)
        codes_d = cuda.device_array(wire, np.uint8)
        dev.encode(dx, codes_d)
        row(f"{name} encode", lambda dev=dev, c=codes_d: dev.encode(dx, c), 4 * n + wire,
            np.array_equal(codes_d.copy_to_host(), codes_h))  # fmt: skip
        out_h = np.empty(n, np.float32)
        host.decode(codes_h, out_h)
        out_d = ops.empty(n)
        dev.decode(codes_d, out_d)
        row(f"{name} decode", lambda dev=dev, c=codes_d, o=out_d: dev.decode(c, o), wire + 4 * n,
            np.array_equal(ops.to_host(out_d), out_h))  # fmt: skip
        acc_h = y.copy()
        host.add_decoded_into(codes_h, acc_h)
        acc_d = ops.to_device(y)
        dev.add_decoded_into(codes_d, acc_d)
        ok = np.array_equal(ops.to_host(acc_d), acc_h)
        row(f"{name} decode-add", lambda dev=dev, c=codes_d, a=acc_d: dev.add_decoded_into(c, a),
            wire + 2 * 4 * n, ok)  # fmt: skip
    return rows


def window_rows(batch: int, side: int, channels: int, reps: int, rng) -> list[dict]:
    """The CNN's window ops on a (batch, side, side, channels) NHWC map (a 5 x 5 im2col, its
    col2im, a 2 x 2 max-pool and its backward): checked bitwise against NumPy, timed, and set
    against a device-to-device copy of the bytes each moves (read + written)."""
    from pipesgd_ref.ops import cuda_ops as ops

    k, pad = 5, 2
    X = rng.standard_normal((batch, side, side, channels), dtype=np.float32)
    rows_n, cols_n = batch * side * side, k * k * channels
    cols_h = np.empty((rows_n, cols_n), np.float32)
    numpy_ops.im2col(X, k, k, 1, pad, cols_h)
    Xd, cols_d = ops.to_device(X), ops.empty((rows_n, cols_n))
    copy_src, copy_dst = ops.empty(cols_h.size), ops.empty(cols_h.size)
    t_copy = _events_time(lambda: copy_dst.copy_to_device(copy_src), reps)
    copy_rate = 2 * cols_h.nbytes / t_copy
    rows = [_row(f"copy (d2d) {cols_h.nbytes >> 20} MB", t_copy, copy_rate / 1e9, "GB/s",
                 "itself", 1.0, None, True)]  # fmt: skip

    def row(name: str, fn, nbytes: int, ok: bool) -> None:
        t = _events_time(fn, reps)
        rows.append(_row(name, t, nbytes / t / 1e9, "GB/s", "d2d copy", nbytes / t / copy_rate,
                         0.7, ok))  # fmt: skip

    ops.im2col(Xd, k, k, 1, pad, cols_d)
    row("im2col 5x5", lambda: ops.im2col(Xd, k, k, 1, pad, cols_d), X.nbytes + cols_h.nbytes,
        np.array_equal(ops.to_host(cols_d), cols_h))  # fmt: skip
    dX_h, dX_d = np.empty_like(X), ops.empty(X.shape)
    numpy_ops.col2im(cols_h, k, k, 1, pad, dX_h)
    ops.col2im(cols_d, k, k, 1, pad, dX_d)
    row("col2im 5x5", lambda: ops.col2im(cols_d, k, k, 1, pad, dX_d), X.nbytes + cols_h.nbytes,
        np.array_equal(ops.to_host(dX_d), dX_h))  # fmt: skip
    half = side // 2
    Y_h = np.empty((batch, half, half, channels), np.float32)
    arg_h = np.empty(Y_h.shape, np.int32)
    numpy_ops.maxpool_forward(X, 2, 2, Y_h, arg_h)
    Y_d, arg_d = ops.empty(Y_h.shape), ops.to_device(np.zeros(Y_h.shape, np.int32))
    ops.maxpool_forward(Xd, 2, 2, Y_d, arg_d)
    same = np.array_equal(ops.to_host(Y_d), Y_h) and np.array_equal(arg_d.copy_to_host(), arg_h)
    row("maxpool 2x2", lambda: ops.maxpool_forward(Xd, 2, 2, Y_d, arg_d),
        X.nbytes + Y_h.nbytes + arg_h.nbytes, same)  # fmt: skip
    dY = rng.standard_normal(Y_h.shape, dtype=np.float32)
    dXp_h = np.empty_like(X)
    numpy_ops.maxpool_backward(dY, arg_h, 2, 2, dXp_h)
    dY_d, dXp_d = ops.to_device(dY), ops.empty(X.shape)
    ops.maxpool_backward(dY_d, arg_d, 2, 2, dXp_d)
    row("maxpool backward", lambda: ops.maxpool_backward(dY_d, arg_d, 2, 2, dXp_d),
        dY.nbytes + arg_h.nbytes + X.nbytes, np.array_equal(ops.to_host(dXp_d), dXp_h))  # fmt: skip
    return rows


def norm_rows(batch: int, side: int, channels: int, reps: int, rng) -> list[dict]:
    """The ResNet's batch norm (training forward, backward) and global average pooling
    (forward, backward) on a (batch, side, side, channels) NHWC map: checked against NumPy
    within float32 rounding (two-stage sums against NumPy's pairwise ones), timed, and set
    against a device-to-device copy of the least bytes each op must move."""
    from pipesgd_ref.ops import cuda_ops as ops

    N, C = batch * side * side, channels
    X = rng.standard_normal((N, C), dtype=np.float32) * 2 + 1
    dY = rng.standard_normal((N, C), dtype=np.float32)
    gamma, beta = rng.standard_normal(C, dtype=np.float32), rng.standard_normal(C, dtype=np.float32)
    want = [np.empty_like(X), np.empty_like(X), np.empty(C, np.float32), np.empty(C, np.float32)]
    numpy_ops.batchnorm_forward(X, gamma, beta, 1e-5, *want)
    want_b = [np.empty_like(X), np.empty(C, np.float32), np.empty(C, np.float32)]
    numpy_ops.batchnorm_backward(dY, want[1], gamma, want[3], 1e-5, *want_b)
    Xd, dYd, gd, bd = (ops.to_device(a) for a in (X, dY, gamma, beta))
    got = [ops.empty((N, C)), ops.empty((N, C)), ops.empty(C), ops.empty(C)]
    got_b = [ops.empty((N, C)), ops.empty(C), ops.empty(C)]
    ops.batchnorm_forward(Xd, gd, bd, 1e-5, *got)
    ops.batchnorm_backward(dYd, got[1], gd, got[3], 1e-5, *got_b)
    scale = np.sqrt(N)  # the sums' rounding grows with the number of rows

    def close(g, w) -> bool:
        return np.allclose(ops.to_host(g), w, rtol=1e-3, atol=1e-4 * scale)

    fwd_ok = all(close(g, w) for g, w in zip(got, want, strict=True))
    bwd_ok = all(close(g, w) for g, w in zip(got_b, want_b, strict=True))
    copy_src, copy_dst = ops.empty(X.size), ops.empty(X.size)
    t_copy = _events_time(lambda: copy_dst.copy_to_device(copy_src), reps)
    copy_rate = 2 * X.nbytes / t_copy
    rows = []

    def row(name: str, fn, nbytes: int, goal: float, ok: bool) -> None:
        t = _events_time(fn, reps)
        rows.append(_row(name, t, nbytes / t / 1e9, "GB/s", "d2d copy", nbytes / t / copy_rate,
                         goal, ok))  # fmt: skip

    row("batchnorm forward", lambda: ops.batchnorm_forward(Xd, gd, bd, 1e-5, *got),
        3 * X.nbytes, 0.5, fwd_ok)  # fmt: skip
    row("batchnorm backward", lambda: ops.batchnorm_backward(dYd, got[1], gd, got[3], 1e-5,
        *got_b), 3 * X.nbytes, 0.5, bwd_ok)  # fmt: skip
    M = X.reshape(batch, side, side, C)
    P_h = np.empty((batch, C), np.float32)
    numpy_ops.global_avgpool_forward(M, P_h)
    Md, P_d = ops.to_device(M), ops.empty((batch, C))
    ops.global_avgpool_forward(Md, P_d)
    row("avgpool forward", lambda: ops.global_avgpool_forward(Md, P_d), X.nbytes + P_h.nbytes,
        0.7, np.allclose(ops.to_host(P_d), P_h, rtol=1e-4, atol=1e-5))  # fmt: skip
    dM_h, dM_d = np.empty_like(M), ops.empty(M.shape)
    numpy_ops.global_avgpool_backward(P_h, dM_h)
    ops.global_avgpool_backward(P_d, dM_d)
    row("avgpool backward", lambda: ops.global_avgpool_backward(P_d, dM_d), X.nbytes + P_h.nbytes,
        0.7, np.allclose(ops.to_host(dM_d), dM_h, rtol=1e-4, atol=1e-6))  # fmt: skip
    return rows


def resnet_rows(batch: int, reps: int) -> list[dict]:
    """The ResNet's training step (loss_and_grad with the running statistics, then sgd_step)
    on 8 x 8 images, depth 8, channels 16, 32, 64: on the GPU (CUDA events) and with the Numba
    CPU backend (wall time), after one step's loss and gradient are checked against NumPy."""
    from pipesgd_ref.models import ResNet
    from pipesgd_ref.ops import cuda_ops as ops

    rng = np.random.default_rng(1)
    X = rng.standard_normal((batch, 64), dtype=np.float32)
    y = rng.integers(0, 10, batch)
    models = {name: ResNet((1, 8, 8), 10, 8, (16, 32, 64), backend=name)
              for name in ("numpy", "numba", "cuda")}  # fmt: skip
    w = models["numpy"].init_params(0)
    g_ref = np.empty_like(w)
    loss_ref = models["numpy"].loss_and_grad(w, X, y, g_ref)
    wd, gd, bd = ops.to_device(w), ops.empty(w.shape), ops.to_device(models["cuda"].init_buffers())
    Xd, yd = ops.to_device(X), ops.to_device(y)
    loss = models["cuda"].loss_and_grad(wd, Xd, yd, gd, buffers=bd)
    ok = abs(loss - loss_ref) < 1e-3 * max(1.0, abs(loss_ref)) and np.allclose(
        ops.to_host(gd), g_ref, rtol=1e-2, atol=1e-4)  # fmt: skip

    def gpu_step() -> None:
        models["cuda"].loss_and_grad(wd, Xd, yd, gd, buffers=bd)
        ops.sgd_step(wd, gd, 1e-3)

    t_gpu = _events_time(gpu_step, reps)
    cpu, g_cpu, b_cpu = w.copy(), np.empty_like(w), models["numba"].init_buffers()

    def cpu_step() -> None:
        models["numba"].loss_and_grad(cpu, X, y, g_cpu, buffers=b_cpu)
        models["numba"].backend.sgd_step(cpu, g_cpu, 1e-3)

    for _ in range(2):  # Numba compiles on the first
        cpu_step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        cpu_step()
        times.append(time.perf_counter() - start)
    t_cpu = statistics.median(times)
    return [{"run": f"resnet {label} (batch {batch})", "iter_time_s": t, "samples_per_s": batch / t,
             "ok": bool(ok)} for label, t in (("cpu (numba)", t_cpu), ("cuda", t_gpu))]  # fmt: skip


TRAIN_MODELS = {
    # an MLP of 8.5M parameters (64 -> 2048 x 3 -> 10): wide enough to be worth a GPU
    "mlp": dict(hidden=(2048, 2048, 2048), batch_size=512),
    # a CNN on the digits' 8 x 8 images with 32 and 64 channels: the convolutions' work per
    # parameter, at a batch that fills the GPU
    "cnn": dict(model="cnn", channels=(32, 64), kernels=(3, 3), hidden=(256,), batch_size=512),
}


def train_rows(steps: int) -> list[dict]:
    """`pipesgd train --device cuda` on each of TRAIN_MODELS against the Numba CPU backend,
    one worker each: iteration time and samples per second."""
    from pipesgd_ref.commands.train import run_training
    from pipesgd_ref.config import TrainConfig

    rows = []
    for model, changes in TRAIN_MODELS.items():
        base = TrainConfig.preset("laptop").replace(world_size=1, steps=steps, eval_every=0,
                                                    **changes)  # fmt: skip
        for label, cfg in (("cpu (numba)", base.replace(backend="numba")),
                           ("cuda", base.replace(device="cuda"))):  # fmt: skip
            summary, _ = run_training(cfg, progress=False, log=lambda line: None)
            rate = cfg.batch_size * cfg.world_size / summary["iter_time_s"]
            rows.append({"run": f"{model} {label}", "iter_time_s": summary["iter_time_s"],
                         "samples_per_s": rate})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="matrix side for the dense kernels")
    parser.add_argument("--elements", default="16M", help="elements for the memory-bound kernels")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--window", type=int, nargs=3, default=(64, 28, 16),
                        metavar=("BATCH", "SIDE", "CHANNELS"),
                        help="the NHWC map of the window ops (default 64 28 16)")  # fmt: skip
    parser.add_argument("--train", action="store_true", help="also time --device cuda training")
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--resnet-batch", type=int, default=512,
                        help="the ResNet step's batch with --train (default 512)")  # fmt: skip
    parser.add_argument("--json", dest="json_path", help="write every figure to this file")
    args = parser.parse_args(argv)
    problem = cuda_support.gpu_problem()
    if problem is not None:
        print(f"kernels_gpu: nothing to time here: {problem}")
        return 0
    from numba import cuda

    elements = count(args.elements)
    if cuda_support.simulated():
        where = "Numba's CUDA simulator (times are not GPU times)"
    else:
        name = cuda.get_current_device().name
        where = name.decode() if isinstance(name, bytes) else str(name)
    print(f"CUDA kernels on {where}; median of {args.reps} launches after warm-up")
    rng = np.random.default_rng(0)
    rows = dense_rows(args.n, args.reps, rng) + memory_rows(elements, args.reps, rng)
    rows += window_rows(*args.window, args.reps, rng)
    rows += norm_rows(*args.window, args.reps, rng)
    print(f"{'kernel':<28} {'time ms':>10} {'rate':>14} {'of roofline':>12} {'goal':>6}  check")
    for r in rows:
        frac = f"{r['fraction']:.0%}" if r["fraction"] is not None else "n/a"
        goal = f"{r['goal']:.0%}" if r["goal"] else ""
        print(f"{r['kernel']:<28} {r['time_s'] * 1e3:10.3f} {r['rate']:9.1f} {r['unit']:<5}"
              f"{frac:>11} {goal:>6}  {'ok' if r['ok'] else 'FAIL'}")  # fmt: skip
    if _cupy() is None and not cuda_support.simulated():
        print("cuBLAS not compared: CuPy is not installed (pip install cupy-cuda12x)")
    result = {"device": where, "kernels": rows}
    if args.train:
        result["train"] = train_rows(args.train_steps)
        result["train"] += resnet_rows(args.resnet_batch, args.reps)
        for r in result["train"]:
            check = "" if "ok" not in r else ("  ok" if r["ok"] else "  FAIL")
            print(f"train {r['run']:<12} iteration {r['iter_time_s'] * 1e3:8.2f} ms  "
                  f"{r['samples_per_s']:10.0f} samples/s{check}")  # fmt: skip
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    checked = rows + [r for r in result.get("train", []) if "ok" in r]
    return 0 if all(r["ok"] for r in checked) else 1


if __name__ == "__main__":
    sys.exit(main())
