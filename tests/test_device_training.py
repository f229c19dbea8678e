"""--device cuda: device-resident training, checked against the CPU run.

In Numba's CUDA simulator (tests/conftest.py sets NUMBA_ENABLE_CUDASIM=1): the kernels run on
the CPU at about a millisecond per simulated thread here, so the models are tiny (8 features,
3 classes, hidden (8,) or none, batch 8, 5 steps). With PIPESGD_GPU_TESTS=1 the same tests run
on a real GPU, and the `gpu` test below trains a real-sized model as well.

    training    sync and pipe on the device end with the CPU run's weights (float32 tolerance:
                GPU matmuls add in another order); the parent process spawned the workers and
                never imported numba.cuda
    device ring device_allreduce == the host ring, bitwise, over real processes, lengths 0, 1,
                p + 1 and odd ones, several segments per chunk; a device rank and host ranks
                in one ring; a codec (on the host copy) as the host's compressed ring
    worker      Worker on the device: batch staging, the finiteness check on the device,
                zeroing, the mean of the good ranks, weights and checkpoints back on the host
    no GPU      `pipesgd train --device cuda` without a GPU: exit 2 and one line saying why
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.runtime.preflight import check_config

REPO = Path(__file__).resolve().parents[1]
GPU_TESTS = os.environ.get("PIPESGD_GPU_TESTS") == "1"
TINY_DATA = "synthetic:samples=64,features=8,classes=3,seed=0"
RTOL, ATOL = 1e-5, 1e-6  # float32: GPU matmuls sum in another order than NumPy's
# Ring jobs in this process's children: fork is quick, but a child forked from a process that
# holds a CUDA context (a real GPU, after the in-process tests) cannot use CUDA: spawn there.
START = "spawn" if GPU_TESTS else "fork"


def tiny(**changes) -> TrainConfig:
    base = dict(dataset=TINY_DATA, model="mlp", hidden=(8,), world_size=2, batch_size=8,
                steps=5, lr=0.1, eval_every=0, target_accuracy=0.5, timeout=120.0)  # fmt: skip
    return TrainConfig(**{**base, **changes})


def assert_weights_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    diff = np.abs(got.astype(np.float64) - want)
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL), (
        f"{what}: the device run's final weights differ from the CPU run's beyond float32 "
        f"tolerance (rtol {RTOL}, atol {ATOL}): max |diff| {diff.max():.3g} at index "
        f"{int(diff.argmax())} (device {got.flat[diff.argmax()]}, cpu {want.flat[diff.argmax()]})"
    )


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


# --- training: the device run ends where the CPU run does --------------------------------------

# Runs `pipesgd train` (cli.main) and records, at the moment the workers are launched, the
# start method, which numba.cuda modules this (parent) process has imported, and whether it
# holds a CUDA context (asked of the driver; only where numba.cuda is real and imported).
SPY = r"""
import json, os, sys
import pipesgd_ref.runtime.launch as launch

def cuda_context():
    if "numba.cuda" not in sys.modules or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    from numba.cuda.cudadrv.driver import driver
    with driver.get_active_context() as active:
        return active.devnum is not None

def imported():
    return sorted(m for m in sys.modules if m.startswith("numba.cuda"))

seen = {}
real = launch.launch_local
def spy(*args, **kwargs):
    seen.update(start_method=kwargs.get("start_method"), imported=imported(),
                context=cuda_context())
    return real(*args, **kwargs)
launch.launch_local = spy
from pipesgd_ref.commands.cli import main
rc = main(sys.argv[1:])
seen.update(imported_after=imported(), context_after=cuda_context())
print("SPY " + json.dumps(seen))
sys.exit(rc)
"""


def _cli_args(cfg: TrainConfig, out: Path) -> list[str]:
    args = ["train", "--preset", "tiny", "--no-progress", "--log-level", "WARNING"]
    for key, value in cfg.to_dict().items():
        if key in ("out",):
            continue
        if isinstance(value, list):
            value = ",".join(map(str, value))
        args.append(f"--{key}={value}")
    return [*args, f"--out={out}"]


@pytest.mark.slow
def test_cli_train_sync_on_the_device_matches_the_cpu(tmp_path):
    """`pipesgd train --device cuda` (sync, MLP 8-8-3): the CPU run's weights; the workers
    were spawned, and the launching process never made a CUDA context (in the simulator it
    never even imports numba.cuda; on a GPU it asks the driver whether one is there, which
    makes none), before or after."""
    cfg = tiny(algo="sync")
    _, cpu = run_training(cfg, progress=False, log=lambda _: None)
    out = tmp_path / "gpu"
    run = subprocess.run([sys.executable, "-c", SPY, *_cli_args(cfg.replace(device="cuda"), out)],
                         capture_output=True, text=True, timeout=300, cwd=REPO,
                         env=_env())  # fmt: skip
    assert run.returncode == 0, f"pipesgd train --device cuda failed:\n{run.stderr[-3000:]}"
    spy = json.loads(next(line[4:] for line in run.stdout.splitlines() if line.startswith("SPY ")))
    assert spy["start_method"] == "spawn", f"--device cuda must spawn its workers, got {spy}"
    assert not spy["context"] and not spy["context_after"], f"the launcher made a context: {spy}"
    if not GPU_TESTS:
        assert spy["imported"] == [], f"the launcher imported {spy['imported']} before launching"
        assert spy["imported_after"] == [], f"the launcher imported {spy['imported_after']}"
    with np.load(out / "checkpoint.npz") as z:
        gpu_params = z["params"]
    assert_weights_close(gpu_params, cpu[0].params, "sync")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params_identical_on_all_ranks"]
    assert summary["config"]["device"] == "cuda"


@pytest.mark.slow
def test_pipe_on_the_device_matches_the_cpu():
    """run_training(device="cuda"), Pipe-SGD width 2 (softmax regression): the CPU run's
    weights and losses; two threads per worker issue device work (compute; the ring)."""
    cfg = tiny(algo="pipe", width=2, model="softmax", hidden=())
    _, cpu = run_training(cfg, progress=False, log=lambda _: None)
    summary, gpu = run_training(cfg.replace(device="cuda"), progress=False, log=lambda _: None)
    assert all(isinstance(r.params, np.ndarray) for r in gpu), "results must be host arrays"
    assert_weights_close(gpu[0].params, cpu[0].params, "pipe")
    assert np.allclose(gpu[0].losses, cpu[0].losses, rtol=RTOL, atol=ATOL)
    assert summary["params_identical_on_all_ranks"]


@pytest.mark.slow
def test_ddp_on_the_device_matches_the_cpu():
    """run_training(device="cuda"), ddp with a bucket per layer (MLP 8-8-3): the CPU run's
    weights and losses; the comm thread all-reduces device views of the gradient while the
    backward's kernels go on."""
    cfg = tiny(algo="ddp", width=1, bucket_size="0")
    _, cpu = run_training(cfg, progress=False, log=lambda _: None)
    summary, gpu = run_training(cfg.replace(device="cuda"), progress=False, log=lambda _: None)
    assert_weights_close(gpu[0].params, cpu[0].params, "ddp")
    assert np.allclose(gpu[0].losses, cpu[0].losses, rtol=RTOL, atol=ATOL)
    assert summary["params_identical_on_all_ranks"]


# --- the device ring -----------------------------------------------------------------------------

LENGTHS = (0, 1, 4, 7, 11)  # 0, 1, p + 1 (p = 3), odd, odd with several segments per chunk


def _values(rank: int, n: int) -> np.ndarray:
    # Random floats, not integers: the order of the additions shows in the bits.
    return np.random.default_rng((rank, n)).normal(size=n).astype(np.float32)


def _ring_job(comm):
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.collectives import allreduce
    from pipesgd_ref.comm.device_ring import device_allreduce
    from pipesgd_ref.ops import cuda_ops

    out = {}
    for n in LENGTHS:
        # segment_bytes 8: two float32 per segment, so chunks of 3-4 elements travel as
        # several frames and the pinned slots wrap around
        seg = 8 if n == 11 else 1 << 20
        for op in ("sum", "mean") if n in (7, 11) else ("mean",):
            host = allreduce(comm, _values(comm.rank, n), op, segment_bytes=seg)
            dev = cuda_ops.to_device(_values(comm.rank, n))
            device_allreduce(comm, dev, op, segment_bytes=seg)
            out[f"{op} {n}"] = (host, cuda_ops.to_host(dev))
    # one ring of both kinds: rank 0 on the host, the others on the device
    x = _values(comm.rank, 7)
    if comm.rank == 0:
        mixed = allreduce(comm, x, "mean")
    else:
        mixed = cuda_ops.to_host(device_allreduce(comm, cuda_ops.to_device(x), "mean"))
    out["mixed mean 7"] = (allreduce(comm, _values(comm.rank, 7), "mean"), mixed)
    # a codec: the compressed ring on a host copy, bitwise the host's compressed ring
    codec = get_codec("trunc16", "numpy")
    dev = cuda_ops.to_device(_values(comm.rank, 7))
    device_allreduce(comm, dev, "mean", codec=codec)
    out["trunc16 mean 7"] = (allreduce(comm, _values(comm.rank, 7), "mean", codec=codec),
                             cuda_ops.to_host(dev))  # fmt: skip
    return out


@pytest.mark.slow
def test_device_ring_is_bitwise_the_host_ring():
    from pipesgd_ref.comm.schedule import simulate_allreduce
    from pipesgd_ref.runtime.launch import launch_local

    p = 3
    results = launch_local(p, _ring_job, (), start_method=START, timeout=60.0)
    for key in results[0]:
        op, n = key.split()[-2], int(key.split()[-1])
        oracle = simulate_allreduce([_values(r, n) for r in range(p)], op)[0]
        for rank, result in enumerate(results):
            host, dev = result[key]
            assert dev.dtype == np.float32 and dev.shape == (n,)
            assert np.array_equal(dev.view(np.uint32), host.view(np.uint32)), (
                f"{key}: rank {rank}'s device ring differs from the host ring: device {dev}, "
                f"host {host}, max |diff| {np.abs(dev - host).max() if n else 0}"
            )
            if "trunc16" not in key:
                assert np.array_equal(dev, oracle), f"{key}: rank {rank}: {dev} != {oracle}"


def _many_segments_job(comm, n, segment_bytes):
    from types import SimpleNamespace

    from pipesgd_ref.comm.collectives import allreduce
    from pipesgd_ref.comm.device_ring import device_allreduce
    from pipesgd_ref.ops import cuda_ops

    # The simulator's device arrays wrap NumPy arrays (`_ary`): adding those directly keeps
    # the staging logic under test (the slots, their reuse, the frames) without simulated
    # kernels, which would take minutes at this size.
    ops = SimpleNamespace(add_into=lambda dst, src: np.add(dst._ary, src._ary, out=dst._ary))
    x = _values(comm.rank, n)
    dev = device_allreduce(comm, cuda_ops.to_device(x), "mean", ops=ops,
                           segment_bytes=segment_bytes)  # fmt: skip
    return allreduce(comm, x.copy(), "mean", segment_bytes=segment_bytes), cuda_ops.to_host(dev)


@pytest.mark.skipif(GPU_TESTS, reason="reads the simulator's device arrays directly")
def test_device_ring_with_many_segments_per_chunk():
    """4 ranks, 1M float32 in 64 KiB segments: 62 segments a chunk, so the pinned slots are
    reused many times within each step; bitwise the host ring's result."""
    from pipesgd_ref.runtime.launch import launch_local

    results = launch_local(4, _many_segments_job, (1_000_000, 64 << 10), start_method="fork",
                           timeout=60.0)  # fmt: skip
    for rank, (host, dev) in enumerate(results):
        assert np.array_equal(dev.view(np.uint32), host.view(np.uint32)), f"rank {rank}"


def test_device_allreduce_refuses_host_arrays():
    from pipesgd_ref.comm.device_ring import device_allreduce

    with pytest.raises(ValueError, match="device array"):
        device_allreduce(None, np.zeros(3, np.float32))


# --- the worker on the device --------------------------------------------------------------------


@pytest.mark.slow
def test_worker_on_the_device(tmp_path):
    """The pieces the loops use, on one process: the same gradient as the CPU (batch staged
    through pinned buffers), NaN caught by the device-side sum, zeroing, the mean of the good
    ranks, and weights and checkpoints that come back as host arrays."""
    from pipesgd_ref.errors import TrainingDiverged
    from pipesgd_ref.models.layout import on_device
    from pipesgd_ref.runtime import checkpoint
    from pipesgd_ref.runtime.worker import Worker

    cfg = tiny(model="softmax", hidden=(), device="cuda", out=str(tmp_path))
    cpu = Worker.build(cfg, 1, 2)
    host_grads = cpu.new_buffer()
    cpu_loss = cpu.loss_and_grad(3, host_grads)
    dev = Worker.build(cfg, 1, 2)
    assert not dev.on_device and isinstance(dev.params, np.ndarray), "build must not touch a GPU"
    dev.to_device(1)
    from numba import cuda

    assert dev.on_device and dev.gpu == 1 % len(cuda.gpus)  # the simulator has one GPU: 1 mod 1
    grads = dev.new_buffer()
    assert on_device(grads) and on_device(dev.params)
    loss = dev.loss_and_grad(3, grads)
    assert np.isclose(loss, cpu_loss, rtol=RTOL)
    assert np.allclose(dev.host(grads), host_grads, rtol=RTOL, atol=ATOL)
    assert dev.gradient_ok(grads, 3, loss, rank=1)
    assert dev.model.accuracy(dev.params, dev.data.X_test, dev.data.y_test) == cpu.model.accuracy(
        cpu.params, cpu.data.X_test, cpu.data.y_test
    )

    dev.mean_of_good(grads, 4, 1)  # 4 ranks, one left out: x * 4/3 (float32), as on the host
    want = host_grads.copy()
    want *= np.float32(4 / 3)
    assert np.allclose(dev.host(grads), want, rtol=RTOL, atol=ATOL)

    grads[5] = np.nan  # what PIPESGD_FAULT=nan does to a device gradient
    with pytest.raises(TrainingDiverged, match=r"rank 1 .*step 3 has 1 NaN/Inf"):
        dev.gradient_ok(grads, 3, loss, rank=1)
    skipping = Worker.build(cfg.replace(skip_nonfinite=True), 1, 2)
    skipping.to_device(1)
    assert not skipping.gradient_ok(grads, 3, loss, rank=1)
    dev.zero(grads)
    assert not np.any(dev.host(grads))

    params = dev.params_host()
    assert isinstance(params, np.ndarray) and np.array_equal(params, cpu.params)
    dev.save_checkpoint(7, {6: dev.new_buffer()})
    saved, next_step, pending, *_ = checkpoint.load(tmp_path, cfg)
    assert next_step == 7 and np.array_equal(saved, cpu.params) and list(pending) == [6]


def test_config_device():
    assert TrainConfig().device == "cpu"
    with pytest.raises(ConfigError, match="device must be cpu or cuda"):
        TrainConfig(device="tpu")
    with pytest.raises(ConfigError, match="--device cuda trains with the ring methods"):
        check_config(TrainConfig(device="cuda", algo="ps-sync"))


# --- no GPU ---------------------------------------------------------------------------------------


@pytest.mark.slow  # 2-9 s: kept out of the fast subset (under 3 minutes)
def test_no_gpu_is_one_line_and_exit_2():
    """Without the simulator and with every GPU hidden, `--device cuda` stops before any worker
    starts: exit status 2 and one line that says why and what to do."""
    run = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "train", "--preset", "tiny", "--device", "cuda",
         "--algo", "sync", "--steps", "3", "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env=_env(NUMBA_ENABLE_CUDASIM=None, CUDA_VISIBLE_DEVICES=""),
    )  # fmt: skip
    assert run.returncode == 2, f"exit {run.returncode}; stderr:\n{run.stderr}"
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{run.stderr}"
    assert lines[0].startswith("pipesgd: error: --device cuda: no usable CUDA GPU"), lines[0]
    assert "NUMBA_ENABLE_CUDASIM=1" in lines[0] and "--device cpu" in lines[0]
    assert "workers" not in run.stdout, "nothing may start without a GPU"


# --- a real GPU -----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_TESTS, reason="needs a real CUDA GPU: run with PIPESGD_GPU_TESTS=1")
@pytest.mark.parametrize("algo", ["sync", "ddp", "pipe"])
def test_real_gpu_training_matches_the_cpu(algo):
    """digits, MLP 64-64-10, 2 workers x batch 32, 30 steps, on the GPU: the CPU run's weights
    within a looser float32 tolerance (30 steps of differently rounded matmuls)."""
    cfg = TrainConfig(dataset="digits", model="mlp", hidden=(64,), world_size=2, batch_size=32,
                      steps=30, lr=0.05, algo=algo, eval_every=0)  # fmt: skip
    _, cpu = run_training(cfg, progress=False, log=lambda _: None)
    summary, gpu = run_training(cfg.replace(device="cuda"), progress=False, log=lambda _: None)
    assert summary["params_identical_on_all_ranks"]
    assert np.allclose(gpu[0].params, cpu[0].params, rtol=1e-3, atol=1e-4)


def _big_ring_job(comm, n):
    from pipesgd_ref.comm.collectives import allreduce
    from pipesgd_ref.comm.device_ring import device_allreduce
    from pipesgd_ref.ops import cuda_ops

    x = _values(comm.rank, n)
    dev = device_allreduce(comm, cuda_ops.to_device(x), "mean")
    return allreduce(comm, x.copy(), "mean"), cuda_ops.to_host(dev)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_TESTS, reason="needs a real CUDA GPU: run with PIPESGD_GPU_TESTS=1")
def test_real_gpu_device_ring_is_bitwise_the_host_ring():
    """16 MB over 4 spawned ranks (several 2 MiB segments per chunk): bitwise the host ring."""
    from pipesgd_ref.runtime.launch import launch_local

    for host, dev in launch_local(4, _big_ring_job, (4 << 20,), start_method="spawn"):
        assert np.array_equal(dev.view(np.uint32), host.view(np.uint32))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo", ["sync", "pipe"])
def test_the_cnn_on_the_device_matches_the_cpu(algo):
    """--model cnn --device cuda (digits 8 x 8, two tiny conv layers, 2 workers, 2 steps):
    im2col, the matmuls, col2im and max-pooling as CUDA kernels, the CPU run's weights within
    float32 tolerance."""
    cfg = tiny(algo=algo, width=1 if algo == "sync" else 2, dataset="digits", model="cnn",
               channels=(2, 3), kernels=(3, 3), hidden=(4,), steps=2, batch_size=4)  # fmt: skip
    _, cpu = run_training(cfg, progress=False, log=lambda _: None)
    _, gpu = run_training(cfg.replace(device="cuda"), progress=False, log=lambda _: None)
    assert_weights_close(gpu[0].params, cpu[0].params, f"cnn {algo}")
