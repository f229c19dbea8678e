"""Bad input never costs a run: every user error is one line and exit status 2.

Each case runs `python -m pipesgd_ref ...` in a fresh process (the exact stderr a user sees,
and a hang fails after TIMEOUT seconds instead of blocking) from an empty working folder
inside tmp_path, and asserts:

    - exit status 2
    - stderr is exactly one line, "pipesgd: error: ...", holding the case's words (the input it
      names), and no "Traceback" on either stream
    - nothing written: tmp_path holds after the run exactly what it held before
    - no process left: none in the command's process group, none working inside tmp_path

The table is the issue's list (issue 18) and more: someone who mistypes, someone who points
the tool at the wrong file, someone who wants it to crash. A word starting with "!" must NOT
appear in the line (a message that misleads, e.g. "does not exist" for a folder).
Placeholders: {tmp} is tmp_path, {port} a port the test holds open. Files to create are
{relative path: bytes | DIR | FIFO | LOCKED | a function of the path}; LOCKED is a folder whose
.pipesgd.lock this test holds (a live job).

Most cases fail before any worker starts; the whole file takes about a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from procs import processes

from pipesgd_ref.runtime.jobenv import ENV_CONVENTIONS

TIMEOUT = 60  # seconds a case may take before it counts as a hang
DIR, FIFO, LOCKED = "<dir>", "<fifo>", "<locked>"
TINY = "--preset tiny --no-progress"
# Variables that describe a job (torchrun, mpirun, srun) or inject faults: scrubbed from every
# case's environment, so only the case's own env decides.
JOB_VARS = {v for rank, size, _ in ENV_CONVENTIONS for v in (rank, size)} | {
    "MASTER_ADDR", "MASTER_PORT", "PIPESGD_MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "PIPESGD_FAULT", "PIPESGD_ALLOW_MANY_WORKERS", "TORCHELASTIC_USE_AGENT_STORE",
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    id: str
    argv: str  # after `pipesgd`, shell-quoted; {tmp} and {port} are filled in
    words: tuple[str, ...]  # the line must hold each ("!word": must not)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, object] = field(default_factory=dict)


def C(id: str, argv: str, *words: str, env=None, files=None) -> Case:  # noqa: N802 - a table row
    return Case(id, argv, words, env or {}, files or {})


# --- files a case points the tool at --------------------------------------------------------


def _idx(shape: tuple[int, ...], code: int = 0x08) -> bytes:
    """An IDX file by hand (data.read_idx's layout): 2 zero bytes, the type code, ndim, then
    ndim big-endian uint32 sizes and the items (uint8 zeros)."""
    head = bytes([0, 0, code, len(shape)]) + b"".join(n.to_bytes(4, "big") for n in shape)
    return head + bytes(int(np.prod(shape)))


def _mnist(n_train: int, n_test: int, rows: int = 28) -> dict[str, bytes]:
    return {
        "train-images-idx3-ubyte": _idx((n_train, rows, rows)),
        "train-labels-idx1-ubyte": _idx((n_train,)),
        "t10k-images-idx3-ubyte": _idx((n_test, rows, rows)),
        "t10k-labels-idx1-ubyte": _idx((n_test,)),
    }


def _in(folder: str, files: dict[str, object]) -> dict[str, object]:
    return {f"{folder}/{name}": content for name, content in files.items()}


def _tiny_params(fill: float = 0.0) -> np.ndarray:
    from pipesgd_ref.config import TrainConfig
    from pipesgd_ref.data import load_dataset
    from pipesgd_ref.models import build_model

    cfg = TrainConfig.preset("tiny")
    data = load_dataset(cfg.dataset)
    model = build_model(cfg.model, data.n_features, data.n_classes, cfg.hidden, cfg.backend)
    return np.full(model.n_params, fill, np.float32)


def _checkpoint(size: int | None = None, fill: float = 0.0, next_step: int = 10, **changes):
    """A writer of a checkpoint of the tiny preset with these config changes: `size` weights
    (default: the tiny model's) of value `fill`."""

    def write(path: Path) -> None:
        from pipesgd_ref.config import TrainConfig
        from pipesgd_ref.runtime.checkpoint import save

        cfg = TrainConfig.preset("tiny").replace(**changes)
        p = _tiny_params(fill) if size is None else np.full(size, fill, np.float32)
        save(path.parent, cfg, p, next_step, {})

    return write


def _truncated_checkpoint(path: Path) -> None:
    _checkpoint()(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _npz_without_keys(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, weights=np.zeros(3))


def _npz_with_bad_config(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, params=_tiny_params(), next_step=np.int64(3), pending_steps=np.zeros(0, int),
                 pending=np.zeros((0, 650), np.float32), config=np.array("{not json"))  # fmt: skip


def _zip_not_npz(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "not an array")


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
NON_UTF8 = b"lr = 0.1\n# caf\xe9 \xff\xfe\n"
CKPT = "ck/checkpoint.npz"

# --- the table ------------------------------------------------------------------------------
# fmt: off

TRAIN = [
    # the cases
    C("train-log-level-LOUD", f"train {TINY} --log-level LOUD", "--log-level", "LOUD"),
    C("train-synthetic-2e9-samples", f"train {TINY} --dataset=synthetic:samples=2000000000",
      "samples"),
    C("train-latency-1e12s", f"train {TINY} --latency=1e12s", "latency"),
    C("train-latency-10s-timeout-3", f"train {TINY} --latency=10s --timeout=3",
      "timeout", "!never finished"),
    C("train-bandwidth-1Kbit-timeout-3", f"train {TINY} --bandwidth=1Kbit --timeout=3",
      "timeout", "!never finished"),
    C("train-bandwidth-1bit-timeout-3", f"train {TINY} --bandwidth=1bit --timeout=3", "timeout"),
    # --comm mpi: MPI owns the wire, so link emulation is refused (comm/mpi.py)
    C("train-comm-mpi-latency", f"train {TINY} --comm=mpi --latency=1ms", "--comm mpi",
      "--latency 1ms", "MPI"),
    C("train-comm-mpi-bandwidth", f"train {TINY} --comm mpi --bandwidth 1Gbit", "--comm mpi",
      "1Gbit"),
    C("train-comm-tcp", f"train {TINY} --comm=tcp", "comm", "'tcp'", "sockets"),
    C("train-comm-mpi-wire-fault", f"train {TINY} --comm=mpi", "PIPESGD_FAULT", "garbage",
      env={"PIPESGD_FAULT": "garbage@1:3"}),
    C("bench-comm-mpi-latency", "bench allreduce --comm mpi --latency 1ms", "--comm mpi",
      "MPI"),
    C("bench-comm-mpi-codec", "bench allreduce --comm mpi --codec q8", "--comm mpi", "q8"),
    C("config-comm-mpi-latency", f"config {TINY} --comm=mpi --latency=50us", "--comm mpi"),
    C("train-config-dir", f"train {TINY} --config {{tmp}}/cfgdir.toml", "cfgdir",
      "!does not exist", files={"cfgdir.toml": DIR}),
    C("train-config-non-utf8", f"train {TINY} --config {{tmp}}/latin1.toml", "latin1.toml",
      files={"latin1.toml": NON_UTF8}),
    C("train-error-feedback-without-codec", f"train {TINY} --error-feedback", "codec"),
    C("train-width-3-with-sync", f"train {TINY} --algo=sync --width=3", "width"),
    C("train-fault-rank-outside-job", f"train {TINY} --world-size=4", "PIPESGD_FAULT",
      "kill@7:3", env={"PIPESGD_FAULT": "kill@7:3"}),
    C("train-RANK-without-MASTER_ADDR", f"train {TINY} --timeout=5", "MASTER_ADDR",
      env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29555"}),
    C("train-RANK-without-MASTER_PORT", f"train {TINY} --timeout=5", "MASTER_PORT",
      env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}),
    C("train-WORLD_SIZE-0", f"train {TINY}", "WORLD_SIZE", "!0..-1",
      env={"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}),
    C("train-world-size-100000", f"train {TINY} --world-size=100000", "100000",
      "--allow-many-workers"),
    # issue 29, 17: a JSON number is whole however large; each integer field has its bound
    C("train-json-steps-1e308", f"train {TINY} --config {{tmp}}/big.json", "steps", "1e+308",
      files={"big.json": b'{"steps": 1e308}'}),
    C("train-json-checkpoint-every-1e30", f"train {TINY} --config {{tmp}}/big.json",
      "checkpoint_every", files={"big.json": b'{"checkpoint_every": 1e30}'}),
    C("train-json-max-restarts-1e9", f"train {TINY} --config {{tmp}}/big.json", "max_restarts",
      "1,000", files={"big.json": b'{"max_restarts": 1e9}'}),
    C("train-json-seed-2-64", f"train {TINY} --config {{tmp}}/big.json", "seed",
      files={"big.json": b'{"seed": 18446744073709551616}'}),
    C("train-steps-10-12", f"train {TINY} --steps=1000000000000", "steps"),
    C("train-resume-truncated-checkpoint", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: _truncated_checkpoint}),
    C("train-resume-empty-checkpoint", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: b""}),
    C("train-resume-garbage-checkpoint", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: b"\x00garbage\xff" * 100}),
    C("train-resume-wrong-size-params", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: _checkpoint(size=10)}),
    C("train-resume-nonfinite-params", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: _checkpoint(fill=np.nan)}),
    C("train-resume-other-codec", f"train {TINY} --resume={{tmp}}/ck", "codec",
      files={CKPT: _checkpoint(codec="q8")}),
    C("train-resume-npz-without-keys", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: _npz_without_keys}),
    C("train-resume-npz-bad-config", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: _npz_with_bad_config}),
    C("train-resume-zip-not-npz", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: _zip_not_npz}),
    C("train-resume-checkpoint-is-a-dir", f"train {TINY} --resume={{tmp}}/ck", "checkpoint",
      files={CKPT: DIR}),
    C("train-resume-other-model", f"train {TINY} --resume={{tmp}}/ck", "model",
      files={CKPT: _checkpoint(size=10, model="mlp", hidden=(8,))}),
    C("train-resume-missing", f"train {TINY} --resume={{tmp}}/nothing-here", "nothing-here"),
    C("train-mnist-0-images", f"train {TINY} --dataset=mnist:{{tmp}}/m0", "MNIST",
      files=_in("m0", _mnist(0, 0))),
    C("train-mnist-0-test-images", f"train {TINY} --dataset=mnist:{{tmp}}/m1", "MNIST",
      files=_in("m1", _mnist(100, 0))),
    C("train-mnist-dir-is-a-file", f"train {TINY} --dataset=mnist:{{tmp}}/mfile", "mfile",
      files={"mfile": b"x"}),
    C("train-mnist-images-is-a-dir", f"train {TINY} --dataset=mnist:{{tmp}}/m2", "MNIST",
      files=_in("m2", {**_mnist(10, 10), "train-images-idx3-ubyte": DIR})),
    C("train-mnist-png-as-idx", f"train {TINY} --dataset=mnist:{{tmp}}/m3", "t10k-images",
      files=_in("m3", {**_mnist(10, 10), "t10k-images-idx3-ubyte": PNG})),
    # outputs, checked before any work
    C("train-out-is-a-file", f"train {TINY} --out={{tmp}}/afile", "--out", "afile",
      files={"afile": b"not a folder"}),
    C("train-out-under-a-file", f"train {TINY} --out={{tmp}}/afile/run", "--out", "afile",
      files={"afile": b"not a folder"}),
    C("train-out-unwritable", f"train {TINY} --out=/proc/1/pipesgd-run", "--out",
      "/proc/1/pipesgd-run"),
    C("train-out-earlier-run", f"train {TINY} --out={{tmp}}/done", "--out", "done",
      "--overwrite", files={"done/summary.json": b"{}"}),
    C("train-out-earlier-checkpoint", f"train {TINY} --out={{tmp}}/done", "--overwrite",
      files={"done/checkpoint.npz": _checkpoint()}),
    C("train-out-in-use", f"train {TINY} --out={{tmp}}/busy", "--out", "busy", "in use",
      files={"busy": LOCKED}),
    # issue 29 (14): a folder where a result file goes failed only after training
    C("train-out-checkpoint-is-a-folder", f"train {TINY} --out={{tmp}}/o --overwrite",
      "checkpoint.npz", "is a folder", "'", files={"o/checkpoint.npz": DIR}),
    C("train-out-trace-is-a-folder", f"train {TINY} --out={{tmp}}/o", "trace.json",
      "is a folder", "!.tmp", files={"o/trace.json": DIR}),
    C("reference-out-summary-is-a-folder", f"reference {TINY} --out={{tmp}}/o --overwrite",
      "summary.json", "is a folder", files={"o/summary.json": DIR}),
    C("compare-out-compare-json-is-a-folder",
      "compare --quick --no-progress --out {tmp}/o --overwrite", "compare.json", "is a folder",
      files={"o/compare.json": DIR}),
    C("train-out-name-too-long", f"train {TINY} --out={{tmp}}/{'x' * 300}", "--out"),
    C("train-out-unicode-under-a-file", f"train {TINY} --out={{tmp}}/ñame/rün", "ñame",
      files={"ñame": b"a file"}),
    # mistyped flags and values
    C("train-unknown-key", f"train {TINY} --lrr=0.1", "lrr", "lr"),
    C("train-positional-junk", f"train {TINY} fast", "fast"),
    C("train-flag-without-value", f"train {TINY} --lr", "--lr"),
    C("train-lr-comma-decimal", f"train {TINY} --lr=0,1", "lr", "0,1"),
    C("train-lr-nan", f"train {TINY} --lr=nan", "lr"),
    C("train-lr-inf", f"train {TINY} --lr=inf", "lr"),
    C("train-steps-float", f"train {TINY} --steps=10.5", "steps", "10.5"),
    C("train-steps-negative", f"train {TINY} --steps=-5", "steps"),
    C("train-world-size-0", f"train {TINY} --world-size=0", "world_size"),
    C("train-world-size-text", f"train {TINY} --world-size=four", "world_size", "four"),
    C("train-batch-size-huge", f"train {TINY} --batch-size=1000000", "1000000"),
    C("train-hidden-zero", f"train {TINY} --model=mlp --hidden=0", "hidden"),
    C("train-hidden-huge", f"train {TINY} --model=mlp --hidden=1000000000000", "hidden"),
    C("train-seed-negative", f"train {TINY} --seed=-1", "seed"),
    C("train-algo-unknown", f"train {TINY} --algo=allreduce", "algo", "allreduce"),
    C("train-codec-unknown", f"train {TINY} --codec=zip", "codec", "zip"),
    C("train-device-unknown", f"train {TINY} --device=tpu", "device", "tpu"),
    C("train-bandwidth-unreadable", f"train {TINY} --bandwidth=fast", "fast"),
    C("train-latency-negative", f"train {TINY} --latency=-1ms", "latency"),
    C("train-timeout-0", f"train {TINY} --timeout=0", "timeout"),
    C("train-timeout-inf", f"train {TINY} --timeout=inf --steps=3", "timeout"),
    # issue 29, 16: options that would do nothing
    C("train-fault-nan-at-ps-sync-server", f"train {TINY} --algo ps-sync", "nan@0:5",
      "parameter server", "nan@1:5", env={"PIPESGD_FAULT": "nan@0:5"}),
    C("train-fault-inf-at-ps-async-server", f"train {TINY} --algo ps-async", "inf@0:5",
      "parameter server", env={"PIPESGD_FAULT": "inf@0:5"}),
    C("train-ps-pulls-with-sync", f"train {TINY} --ps-pulls shared --algo sync", "--ps-pulls",
      "no server"),
    C("train-warmup-past-the-steps", f"train {TINY} --warmup-steps 1000 --steps 10",
      "--warmup-steps 1000", "--steps 10"),
    C("train-bind-without-a-job", f"train {TINY} --bind lo", "--bind lo", "local workers"),
    C("bench-bind-without-a-job", "bench allreduce --bind lo", "--bind lo", "local workers"),
    # issue 29, 15: a timeout shorter than a frame can take on a busy host fails a healthy job
    C("train-timeout-1e-9", f"train {TINY} --timeout=1e-9", "timeout", "1e-09", "busy host"),
    C("train-timeout-0.01", f"train {TINY} --timeout 0.01", "timeout", "0.01", "at least"),
    C("train-master-port-70000", f"train {TINY} --master-port=70000", "master_port"),
    C("train-master-port-in-use", f"train {TINY} --master-port={{port}}", "port"),
    C("train-skip-nonfinite-maybe", f"train {TINY} --skip-nonfinite=maybe", "maybe"),
    C("train-target-accuracy-2", f"train {TINY} --target-accuracy=2", "target_accuracy"),
    C("train-checkpoint-every-negative", f"train {TINY} --checkpoint-every=-1",
      "checkpoint_every"),
    C("train-preset-unknown", "train --preset huge", "huge"),
    C("train-preset-empty", "train --preset=", "preset"),
    C("train-dataset-empty", f"train {TINY} --dataset=", "dataset"),
    C("train-dataset-unicode", f"train {TINY} --dataset=ünïcødé", "ünïcødé"),
    C("train-config-png", f"train {TINY} --config {{tmp}}/pic.png", "pic.png",
      files={"pic.png": PNG}),
    C("train-config-png-named-toml", f"train {TINY} --config {{tmp}}/pic.toml", "pic.toml",
      files={"pic.toml": PNG}),
    C("train-config-json-list", f"train {TINY} --config {{tmp}}/list.json", "list.json",
      files={"list.json": b"[1, 2, 3]"}),
    C("train-config-empty-string", f"train {TINY} --config=", "config"),
    C("train-fault-malformed", f"train {TINY}", "PIPESGD_FAULT", env={"PIPESGD_FAULT": "kill"}),
    C("train-fault-unknown-action", f"train {TINY}", "explode",
      env={"PIPESGD_FAULT": "explode@1:2"}),
    C("train-fault-step-never-reached", f"train {TINY} --steps=20", "PIPESGD_FAULT",
      env={"PIPESGD_FAULT": "kill@1:500"}),
    C("train-RANK-not-a-number", f"train {TINY}", "RANK",
      env={"RANK": "zero", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}),
    C("train-RANK-outside-WORLD_SIZE", f"train {TINY}", "rank",
      env={"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}),
    C("train-RANK-without-WORLD_SIZE", f"train {TINY}", "WORLD_SIZE", env={"RANK": "0"}),
    C("train-MASTER_PORT-99999", f"train {TINY}", "MASTER_PORT",
      env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}),
    C("train-MASTER_ADDR-ipv6", f"train {TINY}", "MASTER_ADDR", "IPv6", "127.0.0.1",
      env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "::1", "MASTER_PORT": "29555"}),
    C("train-joined-world-size-mismatch", f"train {TINY} --world-size=4", "WORLD_SIZE",
      env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}),
]

REFERENCE = [
    C("reference-out-is-a-file", f"reference {TINY} --out={{tmp}}/afile", "afile",
      files={"afile": b"x"}),
    C("reference-out-under-a-file", f"reference {TINY} --out={{tmp}}/afile/r", "afile",
      files={"afile": b"x"}),
    C("reference-out-earlier-run", f"reference {TINY} --out={{tmp}}/done", "--overwrite",
      files={"done/summary.json": b"{}"}),
    C("reference-out-in-use", f"reference {TINY} --out={{tmp}}/busy", "in use",
      files={"busy": LOCKED}),
    C("reference-width-0", f"reference {TINY} --width=0", "width"),
    C("reference-lr-text", f"reference {TINY} --lr=fast", "lr", "fast"),
    C("reference-config-dir", f"reference {TINY} --config={{tmp}}/c.json", "c.json",
      "!does not exist", files={"c.json": DIR}),
    C("reference-synthetic-2e9-samples", f"reference {TINY} "
      "--dataset=synthetic:samples=2000000000", "samples"),
    C("reference-synthetic-unknown-option", f"reference {TINY} --dataset=synthetic:rows=5",
      "rows"),
    C("reference-mnist-0-images", f"reference {TINY} --dataset=mnist:{{tmp}}/m0", "MNIST",
      files=_in("m0", _mnist(0, 0))),
]

COMPARE = [
    # issue 29, 16: compare picks each run's method and codec; width 1 would be sync as pipe
    C("compare-width-1", "compare --quick --width 1", "--width 1", "sync"),
    C("compare-codec-q8", "compare --quick --codec q8", "--codec q8", "drop it"),
    C("compare-algo-sync", "compare --quick --algo sync", "--algo sync", "pipesgd train"),
    C("compare-out-is-a-file", "compare --quick --no-progress --out {tmp}/afile", "afile",
      files={"afile": b"x"}),
    C("compare-out-under-a-file", "compare --quick --no-progress --out {tmp}/afile/c", "afile",
      files={"afile": b"x"}),
    C("compare-out-unwritable", "compare --quick --no-progress --out /proc/1/pipesgd-cmp",
      "/proc/1/pipesgd-cmp"),
    C("compare-out-earlier-compare", "compare --quick --no-progress --out {tmp}/old",
      "compare.json", "--overwrite", files={"old/compare.json": b"{}"}),
    C("compare-out-earlier-run-inside", "compare --quick --no-progress --out {tmp}/old",
      "--overwrite", files={"old/pipe/summary.json": b"{}"}),
    C("compare-out-in-use", "compare --quick --no-progress --out {tmp}/busy", "in use",
      files={"busy": LOCKED}),
    C("compare-repeats-0", "compare --quick --no-progress --out {tmp}/c --repeats 0",
      "--repeats"),
    C("compare-repeats-text", "compare --quick --no-progress --out {tmp}/c --repeats two",
      "--repeats", "two"),
    C("compare-bandwidth-unreadable", "compare --quick --no-progress --out {tmp}/c "
      "--bandwidth=fast", "fast"),
    C("compare-world-size-100000", "compare --quick --no-progress --out {tmp}/c "
      "--world-size=100000", "--allow-many-workers"),
    C("compare-preset-unknown", "compare --preset nope --out {tmp}/c", "nope"),
    C("compare-fault-rank-outside", "compare --quick --no-progress --out {tmp}/c", "kill@9:1",
      env={"PIPESGD_FAULT": "kill@9:1"}),
]

CONFIG = [
    C("config-dir", "config --config {tmp}/d.toml", "d.toml", "!does not exist",
      files={"d.toml": DIR}),
    C("config-non-utf8", "config --config {tmp}/latin1.json", "latin1.json",
      files={"latin1.json": NON_UTF8}),
    C("config-png", "config --config {tmp}/pic.png", "pic.png", files={"pic.png": PNG}),
    C("config-yaml-suffix", "config --config {tmp}/run.yaml", "run.yaml",
      files={"run.yaml": b"lr: 0.1\n"}),
    C("config-toml-syntax", "config --config {tmp}/bad.toml", "bad.toml",
      files={"bad.toml": b"lr = = 0.1\n"}),
    C("config-toml-wrong-type", "config --config {tmp}/t.toml", "lr", "fast",
      files={"t.toml": b'lr = "fast"\n'}),
    C("config-toml-unknown-key", "config --config {tmp}/t.toml", "lrr",
      files={"t.toml": b"lrr = 0.1\n"}),
    C("config-json-empty", "config --config {tmp}/e.json", "e.json", files={"e.json": b""}),
    C("config-missing", "config --config {tmp}/nope.toml", "nope.toml"),
    C("config-without-value", "config --config", "--config"),
    C("config-unknown-key", "config --frobnicate=1", "frobnicate"),
    C("config-preset-unicode", "config --preset läptop", "läptop"),
]

PREDICT = [
    C("predict-params-1e30", "predict --params 1e30 --t-comp 200ms", "--params", "1e30"),
    C("predict-json-dir", "predict --json {tmp}/adir", "--json", "adir", files={"adir": DIR}),
    C("predict-json-under-a-file", "predict --json {tmp}/afile/p.json", "--json", "afile",
      files={"afile": b"x"}),
    C("predict-json-fifo", "predict --json {tmp}/pipe.json", "--json", "pipe.json",
      files={"pipe.json": FIFO}),
    C("predict-json-unwritable", "predict --json /proc/1/pipesgd/p.json", "--json"),
    C("predict-out-is-a-file", "predict --out {tmp}/afile", "--out", "afile",
      files={"afile": b"x"}),
    C("predict-plot-under-a-file", "predict --sweep bandwidth=1Gbit..10Gbit "
      "--plot {tmp}/afile/p.png", "--plot", "afile", files={"afile": b"x"}),
    C("predict-plot-unknown-suffix", "predict --sweep bandwidth=1Gbit..10Gbit "
      "--plot {tmp}/p.xyz", "--plot", "xyz"),
    C("predict-plot-without-sweep", "predict --plot {tmp}/p.png", "--plot", "--sweep"),
    C("predict-world-size-0", "predict --world-size 0", "--world-size"),
    C("predict-world-size-text", "predict --world-size four", "--world-size", "four"),
    C("predict-world-size-100000", "predict --world-size 100000", "--world-size", "100000"),
    C("predict-this-machine-100000", "predict --this-machine --world-size 100000", "100000"),
    C("predict-sweep-world-size-1e9", "predict --sweep world_size=2..1000000000", "--sweep"),
    C("predict-bandwidth-unreadable", "predict --bandwidth fast", "--bandwidth", "fast"),
    C("predict-latency-negative", "predict --latency=-1ms", "latency"),
    C("predict-sweep-junk", "predict --sweep junk", "--sweep", "junk"),
    C("predict-sweep-zero-bandwidth", "predict --sweep bandwidth=0bit..1Gbit", "--sweep"),
    C("predict-params-0", "predict --params 0 --t-comp 10ms", "--params"),
    C("predict-params-without-t-comp", "predict --params 25M", "--t-comp"),
    C("predict-codecs-unknown", "predict --codecs zip", "zip"),
    C("predict-width-0", "predict --width 0", "--width"),
    C("predict-model-unknown", "predict --model vgg", "vgg"),
    C("predict-dataset-unknown", "predict --dataset imagenet", "imagenet"),
    C("predict-ps-pulls-unknown", "predict --ps-pulls foo", "foo"),
    # staleness compensation and bounded staleness (methods/compensation.py)
    C("train-compensation-unknown", f"train {TINY} --compensation magic", "compensation",
      "magic"),
    C("train-compensation-sync", f"train {TINY} --algo sync --compensation dc",
      "--compensation dc", "sync"),
    C("train-compensation-predict-ps-async", f"train {TINY} --algo ps-async --compensation "
      "predict", "predict", "ps-async"),
    C("train-compensation-width-1", f"train {TINY} --width 1 --compensation predict",
      "--width 1"),
    C("train-compensation-cuda", f"train {TINY} --device cuda --compensation dc",
      "--device cuda"),
    C("train-dc-lambda-idle", f"train {TINY} --dc-lambda 0.1", "--dc-lambda"),
    C("train-dc-lambda-negative", f"train {TINY} --compensation dc --dc-lambda=-1",
      "dc_lambda"),
    C("train-dc-lambda-nan", f"train {TINY} --compensation dc --dc-lambda nan", "dc_lambda"),
    C("train-max-staleness-pipe", f"train {TINY} --max-staleness 2", "--max-staleness 2",
      "ps-async"),
    C("train-max-staleness-below-1", f"train {TINY} --algo ps-async --max-staleness=-2",
      "max_staleness"),
    C("compare-study-unknown", "compare --study speed", "--study", "speed"),
    C("compare-study-lrs-junk", "compare --study staleness --lrs 0.1,fast", "--lrs", "fast"),
    C("compare-study-lrs-negative", "compare --study staleness --lrs=-0.1", "--lrs"),
    C("compare-study-lrs-twice", "compare --study staleness --lrs 0.1,0.1", "more than once"),
    C("compare-lrs-without-study", "compare --lrs 0.1,0.2", "--lrs", "--study"),
    C("compare-study-repeats", "compare --study staleness --repeats 3", "--repeats"),
    # the convolutional net (models/cnn.py)
    C("train-cnn-on-synthetic", f"train {TINY} --model cnn --dataset synthetic", "cnn",
      "images"),
    C("train-cnn-even-kernel", f"train {TINY} --model cnn --kernels 4,4", "odd"),
    C("train-cnn-kernels-mismatch", f"train {TINY} --model cnn --channels 4,8,8 --kernels 3,3",
      "one kernel size per conv layer"),
    C("train-cnn-too-deep", f"train {TINY} --model cnn --channels 2,2,2,2 --kernels 3,3,3,3",
      "too small to pool"),
    C("train-dataset-mnist5k-options", f"train {TINY} --dataset mnist5k:x", "mnist5k"),
    C("train-transport-unknown", "train --transport rdma", "rdma"),
    C("train-mpi-with-a-transport", "train --comm mpi --transport shm", "--transport shm"),
    # --allreduce: a name, and an algorithm this job can run (runtime/preflight.py)
    C("train-allreduce-unknown", "train --allreduce butterfly", "allreduce", "butterfly",
      "ring", "twoshot"),
    C("train-allreduce-under-mpi", "train --comm mpi --allreduce rd", "--allreduce rd",
      "--comm mpi", "ring"),
    C("train-allreduce-with-a-codec", f"train {TINY} --codec q8 --allreduce rab",
      "--allreduce rab", "--codec q8", "compressed ring"),
    C("train-oneshot-on-an-emulated-link", f"train {TINY} --allreduce oneshot --latency 1ms",
      "--allreduce oneshot", "--latency 1ms", "bypassing the links"),
    C("train-twoshot-over-tcp", f"train {TINY} --allreduce twoshot --transport tcp",
      "--allreduce twoshot", "--transport tcp", "shm or auto"),
    C("train-allreduce-with-a-server", f"train {TINY} --algo ps-sync --allreduce rd",
      "--allreduce rd", "ps-sync", "drop --allreduce"),
    C("compare-allreduce-unknown", "compare --quick --allreduce tree", "allreduce", "tree"),
    # compare --comm mpi drops the preset's emulated link, but one asked for is refused
    C("compare-comm-mpi-latency", "compare --quick --comm mpi --latency 1ms", "--comm mpi",
      "--latency 1ms", "MPI"),
    C("compare-comm-mpi-transport", "compare --quick --comm mpi --transport unix",
      "--transport unix"),
    C("compare-comm-mpi-fault", "compare --quick --comm mpi", "PIPESGD_FAULT",
      "compare --comm mpi", env={"PIPESGD_FAULT": "kill@1:3"}),
    C("predict-unknown-flag", "predict --frobnicate", "--frobnicate"),
]

BENCH = [
    C("bench-timeout-0", "bench allreduce --timeout 0", "--timeout", "'0'"),
    C("bench-timeout-negative", "bench allreduce --timeout=-5", "--timeout", "-5"),
    C("bench-timeout-nan", "bench allreduce --timeout nan", "--timeout", "nan"),
    C("bench-timeout-inf", "bench allreduce --timeout inf", "--timeout", "inf"),
    C("bench-timeout-text", "bench allreduce --timeout soon", "--timeout", "soon"),
    C("bench-timeout-1ms", "bench allreduce --timeout 0.001", "--timeout", "0.001", "at least"),
    C("bench-json-dir", "bench allreduce --json {tmp}/adir", "--json", "adir",
      files={"adir": DIR}),
    C("bench-json-under-a-file", "bench allreduce --json {tmp}/afile/b.json", "--json",
      "afile", files={"afile": b"x"}),
    C("bench-json-unwritable", "bench allreduce --json /proc/1/pipesgd/b.json", "--json"),
    C("bench-json-name-too-long", f"bench allreduce --json {{tmp}}/{'b' * 250}.json", "--json"),
    C("bench-world-size-100000", "bench allreduce --world-size 100000", "100000",
      "--allow-many-workers"),
    C("bench-world-size-0", "bench allreduce --world-size 0", "--world-size"),
    C("bench-sizes-not-float32", "bench allreduce --sizes 3B", "sizes"),
    C("bench-sizes-empty", "bench allreduce --sizes ,", "--sizes"),
    C("bench-sizes-beyond-memory", "bench allreduce --sizes 100TB", "--sizes"),
    C("bench-sizes-unreadable", "bench allreduce --sizes big", "big"),
    C("bench-reps-0", "bench allreduce --reps 0", "--reps"),
    C("bench-codec-unknown", "bench allreduce --codec zip", "zip"),
    C("bench-transport-unknown", "bench allreduce --transport tcp,rdma", "--transport", "rdma"),
    C("bench-transport-twice", "bench allreduce --transport shm,tcp,shm", "--transport", "shm",
      "more than once"),
    C("bench-peers-unknown", "bench allreduce --peers gloo,nccl", "--peers", "nccl", "!'gloo'"),
    C("bench-peers-typo", "bench allreduce --peers=mpi_tcp", "--peers", "mpi_tcp", "mpi-tcp"),
    C("bench-peers-in-a-joined-rank", "bench allreduce --peers mpi", "--peers", "local",
      env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}),
    C("bench-transports-in-a-joined-rank", "bench allreduce --transport tcp,shm", "--transport",
      "one", env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": "29555"}),
    C("bench-latency-unreadable", "bench allreduce --latency soon", "soon"),
    C("bench-log-level-LOUD", "bench allreduce --log-level LOUD", "--log-level", "LOUD"),
    C("bench-bandwidth-1Kbit-timeout-3", "bench allreduce --bandwidth 1Kbit --timeout 3 "
      "--sizes 4KB --no-gloo", "timeout", "!never finished"),
    C("bench-fault-set", "bench allreduce --world-size 2", "PIPESGD_FAULT",
      env={"PIPESGD_FAULT": "kill@1:1"}),
    C("bench-WORLD_SIZE-0", "bench allreduce", "WORLD_SIZE",
      env={"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}),
    C("bench-missing-benchmark", "bench", "BENCHMARK"),
    C("bench-unknown-benchmark", "bench allgather", "allgather"),
    C("bench-extra-argument", "bench allreduce --lr=0.1", "--lr=0.1"),
]

TOP = [
    C("no-command", "", "COMMAND"),
    C("unknown-command", "trian --steps 5", "trian"),
    C("help-typo", "--hepl", "--hepl"),
]

# fmt: on
CASES = TRAIN + REFERENCE + COMPARE + CONFIG + PREDICT + BENCH + TOP


# --- the runner -----------------------------------------------------------------------------


def _make(tmp: Path, files: dict[str, object], stack: ExitStack) -> None:
    from pipesgd_ref.outputs import lock_out_dir

    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content in (DIR, LOCKED):
            path.mkdir(exist_ok=True)
            if content == LOCKED:  # this test is the live job holding the folder
                stack.enter_context(lock_out_dir(path))
        elif content == FIFO:
            os.mkfifo(path)
        elif callable(content):
            content(path)
        else:
            path.write_bytes(content)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def left_behind(group: int, root: Path) -> list[str]:
    """Live processes (not zombies) of the command's process group, or working in `root`."""
    return [
        f"pid {p.pid}: {p.cmdline() or '?'}"
        for p in processes()
        if p.alive
        and p.pid != os.getpid()
        and (p.group == group or (p.cwd() or "").startswith(str(root)))
    ]


def _wait(proc: subprocess.Popen, argv: list[str], group: int) -> tuple[bytes, bytes]:
    try:
        return proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"pipesgd {shlex.join(argv)} still ran after {TIMEOUT} s (a hang); "
                    f"stderr ends:\n{err.decode(errors='replace')[-2000:]}")  # fmt: skip


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def _case_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in JOB_VARS} | env


def run_pipesgd(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, process group) of `python -m pipesgd_ref argv`, in its
    own session (so a hang's whole group can be killed); a hang fails the test."""
    proc = subprocess.Popen([sys.executable, "-m", "pipesgd_ref", *argv], cwd=cwd,
                            env=_case_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    out, err = _wait(proc, argv, proc.pid)
    return proc.returncode, _text(out), _text(err), proc.pid


# A fork server: one interpreter that imports the package once (numpy, numba, sklearn: most of
# the half second a `python -m pipesgd_ref` takes to start) and forks a child per case. The
# child is what `python -m pipesgd_ref ARGV` is after its imports: its own session, working
# folder, environment, stdout and stderr, `raise SystemExit(main(argv))` with Python's own
# traceback for anything main lets out. 170 cases take about a third of the time this way;
# test_the_real_entry_point runs a sample of them through `python -m pipesgd_ref` itself.
FORK_SERVER = r"""
import json, os, sys, traceback
import pipesgd_ref.commands.bench, pipesgd_ref.commands.compare
import pipesgd_ref.commands.predict, pipesgd_ref.commands.train
from pipesgd_ref.commands.cli import main
from pipesgd_ref.data import load_dataset

load_dataset("digits")  # imports sklearn's loader
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            os.dup2(os.open(name, flags, 0o644), fd)
        try:
            rc = main(req["argv"])
        except SystemExit as e:
            rc = e.code
        except BaseException:
            traceback.print_exc()
            rc = 1
        if rc is not None and not isinstance(rc, int):
            print(rc, file=sys.stderr)
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc or 0)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class ForkServer:
    def __init__(self, io_dir: Path):
        self.io = io_dir
        self.proc = None
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.proc.stdout.readline().strip() == "ready", "the fork server did not start"

    def _line(self, argv: list[str]) -> str:
        line = self.proc.stdout.readline()
        if not line:  # the server itself is gone (killed from outside?): the next case restarts it
            status = self.proc.wait(timeout=10)
            self.proc = None
            pytest.fail(f"the fork server died (exit status {status}) running pipesgd "
                        f"{shlex.join(argv)}")  # fmt: skip
        return line

    def run(self, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str, int]:
        """As run_pipesgd, in a child of the fork server."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        out, err = self.io / "stdout", self.io / "stderr"
        req = {"argv": argv, "env": _case_env(env), "cwd": str(cwd), "out": str(out),
               "err": str(err)}  # fmt: skip
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = int(self._line(argv))
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            os.killpg(pid, signal.SIGKILL)
            self._line(argv)
            pytest.fail(f"pipesgd {shlex.join(argv)} still ran after {TIMEOUT} s (a hang); "
                        f"stderr ends:\n{_text(err.read_bytes())[-2000:]}")  # fmt: skip
        rc = int(self._line(argv))
        return rc, _text(out.read_bytes()), _text(err.read_bytes()), pid

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory):
    server = ForkServer(tmp_path_factory.mktemp("fork-server-io"))
    yield server
    server.close()


def check_case(case: Case, tmp_path: Path, run) -> None:
    """Run `case` with `run` (run_pipesgd or a ForkServer's run) and assert everything the
    module docstring lists."""
    cwd = tmp_path / "cwd"  # the command's working folder: must stay empty
    cwd.mkdir()
    with ExitStack() as stack:
        _make(tmp_path, case.files, stack)
        argv_text = case.argv.replace("{tmp}", str(tmp_path))
        if "{port}" in argv_text:  # a port in use: this test listens on it
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            argv_text = argv_text.replace("{port}", str(sock.getsockname()[1]))
        argv = shlex.split(argv_text)
        before = _tree(tmp_path)
        rc, out, err, group = run(argv, case.env, cwd)
        after = _tree(tmp_path)
    shown = f"pipesgd {shlex.join(argv)}" + (f" with {case.env}" if case.env else "")
    lines = err.splitlines()
    assert "Traceback" not in err and "Traceback" not in out, (
        f"{shown}: a traceback instead of one line:\n{err[-3000:]}"
    )
    assert rc == 2, f"{shown}: exit status {rc}, want 2; stderr:\n{err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("pipesgd: error: "), (
        f"{shown}: want one line 'pipesgd: error: ...' on stderr, got {len(lines)}:\n{err[-2000:]}"
    )
    line = lines[0]
    for word in case.words:
        if word.startswith("!"):
            assert word[1:] not in line, f"{shown}: the line says {word[1:]!r}, misleading: {line}"
        else:
            assert word in line, f"{shown}: the line does not name {word!r}: {line}"
    assert after == before, (
        f"{shown}: wrote {sorted(after - before)}, removed {sorted(before - after)}"
    )
    deadline = time.monotonic() + 5.0  # a process on its way out gets a moment
    while (stray := left_behind(group, tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not stray, f"{shown}: processes left behind: {stray}"


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(case: Case, tmp_path: Path, fork_server):
    check_case(case, tmp_path, fork_server.run)


# One case of each kind through the real entry point, `python -m pipesgd_ref`, start-up and all.
REAL = ("no-command", "train-log-level-LOUD", "train-config-non-utf8", "train-out-in-use",
        "train-resume-truncated-checkpoint", "reference-out-earlier-run", "compare-out-is-a-file",
        "config-dir", "predict-json-dir", "bench-timeout-0", "bench-json-dir")  # fmt: skip


@pytest.mark.slow  # 2-9 s: kept out of the fast subset (under 3 minutes)
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("case", [c for c in CASES if c.id in REAL], ids=lambda c: c.id)
def test_the_real_entry_point(case: Case, tmp_path: Path):
    check_case(case, tmp_path, run_pipesgd)


def test_the_table_is_large_and_covers_every_command():
    commands = {c.argv.split()[0] if c.argv else "" for c in CASES}
    assert {"train", "reference", "compare", "config", "predict", "bench"} <= commands
    assert len(CASES) >= 80 and len({c.id for c in CASES}) == len(CASES)


# --- inputs that are not errors: the run must end well ---------------------------------------


def _train_ok(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "run"
    rc, _, err, group = run_pipesgd(["train", *TINY.split(), f"--out={out}", *args], {}, tmp_path)
    assert rc == 0 and "Traceback" not in err, f"train {' '.join(args)}: rc {rc}:\n{err[-3000:]}"
    assert not left_behind(group, tmp_path)
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_one_step_is_a_run(tmp_path):
    """--steps 1 is not an error: it trains one step and writes summary.json (issue 18:
    it crashed in train._log_outcome after training, rc 1, no summary)."""
    summary = _train_ok(tmp_path, "--steps=1")
    assert summary["steps"] == 1


@pytest.mark.slow
def test_a_tiny_fraction_of_an_epoch_is_a_run(tmp_path):
    """--epochs 0.0001: fewer samples than one step; at least one step is run."""
    summary = _train_ok(tmp_path, "--epochs=0.0001")
    assert summary["steps"] >= 1


@pytest.mark.slow
def test_resume_with_one_step_left(tmp_path):
    first = tmp_path / "first"
    rc, _, err, _ = run_pipesgd(["train", *TINY.split(), "--algo=sync", "--steps=5",
                                 f"--out={first}"], {}, tmp_path)  # fmt: skip
    assert rc == 0, err[-3000:]
    summary = _train_ok(tmp_path, "--algo=sync", "--steps=6", f"--resume={first}")
    assert summary["steps"] == 1


# --- a closed stdout (`pipesgd ... | head -1`): results written, no traceback -------------------


def _run_with_closed_stdout(argv: list[str], cwd: Path) -> tuple[int, str]:
    """(exit status, stderr) of `python -m pipesgd_ref argv` whose stdout is a pipe nobody
    reads: its read end is closed before the command starts, so its first write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "pipesgd_ref", *argv], cwd=cwd,
                              env=_case_env({}), stdout=write_end, stderr=subprocess.PIPE,
                              timeout=TIMEOUT * 2)  # fmt: skip
    finally:
        os.close(write_end)
    return proc.returncode, _text(proc.stderr)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, written",
    [
        (["train", *TINY.split(), "--out=run"], ("run/summary.json", "run/trace.json")),
        (["config", *TINY.split()], ()),
        (["predict", "--json=p.json"], ("p.json",)),
    ],
    ids=["train", "config", "predict"],
)
def test_a_closed_stdout_loses_nothing(argv, written, tmp_path):
    """Issue 29 (5): `pipesgd train ... | head -1` gave a BrokenPipeError traceback and lost
    summary.json and trace.json. The output nobody reads is dropped; the command ends as it
    would have, its files written."""
    rc, err = _run_with_closed_stdout(argv, tmp_path)
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-3000:]
    for name in written:
        assert (tmp_path / name).is_file(), f"{name} missing; stderr:\n{err[-3000:]}"


# --- a full disk: one line naming the path and the space needed, no temporary file left -------


@pytest.fixture
def small_disk(tmp_path):
    """A function that mounts a tmpfs of `size` (e.g. "8k") at a new folder under tmp_path and
    returns it, unmounted again at the end: a disk that fills up for real. Mounting needs root
    (CAP_SYS_ADMIN); without it the test is skipped, saying so."""
    mounts = []

    def mount(size: str, name: str = "disk") -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill up ({done.stderr.strip()}): "
                        f"needs root")  # fmt: skip
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _one_line(rc: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("pipesgd: error: "), err[-3000:]
    assert [ln for ln in lines if ln.startswith("pipesgd: error")] == [lines[-1]], err
    for w in words:
        assert w in lines[-1], lines[-1]


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_full_disk_at_the_checkpoint_is_one_line_and_not_retried(small_disk, tmp_path):
    """Issue 29 (4): ENOSPC from the checkpoint write was a 43-line traceback that left
    checkpoint.npz.tmp, and --max-restarts 2 retried it twice. Two pages of disk: the lock fits,
    the checkpoint does not."""
    disk = small_disk("8k")
    argv = ["train", *TINY.split(), f"--out={disk / 'run'}", "--max-restarts=2",
            "--checkpoint-every=5"]  # fmt: skip
    rc, _, err, group = run_pipesgd(argv, {}, tmp_path)
    _one_line(rc, err, "checkpoint.npz", "disk is full", "it needs", "free")
    assert "restart" not in err, err  # the same disk would fail the same way
    assert not list(disk.rglob("*.tmp")) and not left_behind(group, tmp_path)


@pytest.mark.slow
def test_a_full_disk_after_training_is_one_line(small_disk, tmp_path):
    """ENOSPC from write_text_atomic after training (trace.json, 70 KB, on a 64 KiB disk): one
    line naming trace.json, and its temporary file removed."""
    disk = small_disk("64k")
    rc, _, err, _ = run_pipesgd(["train", *TINY.split(), f"--out={disk / 'run'}"], {}, tmp_path)
    _one_line(rc, err, "trace.json", "disk is full", "it needs")
    assert (disk / "run" / "summary.json").is_file()  # what fitted is kept
    assert not [p for p in (disk / "run").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", *TINY.split(), "--out={disk}/run"], (".pipesgd.lock", "disk is full")),
        (["train", *TINY.split(), "--out={disk}/run", "--overwrite"], (".pipesgd.lock",)),
        (["compare", "--quick", "--out={disk}/c"], (".pipesgd.lock", "disk is full")),
        (["predict", "--json={disk}/p.json"], ("p.json", "disk is full", "it needs")),
        (["bench", "allreduce", "--sizes=1000", "--json={disk}/b.json"], ("b.json", "it needs")),
    ],
    ids=["train", "overwrite", "compare", "predict", "bench"],
)
def test_an_already_full_disk_is_one_line(argv, words, small_disk, tmp_path):
    """ENOSPC from lock_out_dir (train, --overwrite, compare) and from predict's and bench's
    --json, on a disk already full."""
    disk = small_disk("16k")
    _fill(disk)
    argv = [a.replace("{disk}", str(disk)) for a in argv]
    rc, _, err, group = run_pipesgd(argv, {}, tmp_path)
    _one_line(rc, err, *words)
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]
    assert not left_behind(group, tmp_path)


# --- one rule for the modes of a run's files: the user's umask ----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_result_file_follows_the_umask(umask, tmp_path):
    """Issue 29 (21): summary.json and trace.json were 0600 (tempfile.mkstemp's), checkpoint.npz
    and the lock 0644. Now each is 0666 less the umask, as any file the user creates."""
    from pipesgd_ref.outputs import LOCK_FILE, lock_out_dir

    old = os.umask(umask)
    try:
        _train_ok(tmp_path)
        with lock_out_dir(tmp_path / "run"):
            lock_mode = (tmp_path / "run" / LOCK_FILE).stat().st_mode & 0o777
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "run").iterdir()}
    assert set(modes) == {"summary.json", "trace.json", "checkpoint.npz"}
    assert modes == dict.fromkeys(modes, want) and lock_mode == want, (modes, oct(lock_mode))


# --- leftovers of a killed run: removed at the next start ---------------------------------------


@pytest.mark.slow
def test_a_killed_runs_temporary_files_are_removed_at_the_next_start(tmp_path):
    """Issue 29 (18): SIGKILL of rank 0 during a checkpoint write left a 0-byte
    checkpoint.npz.tmp (and one of write_text_atomic's, a compare run's in its folder) for ever.
    The next run on the folder holds its lock, so no live job is writing them: they go."""
    run = tmp_path / "run"
    leftovers = ["checkpoint.npz.tmp", ".trace.json.0a1b2c3d.tmp", ".summary.json.x_y9ab2k.tmp",
                 "sync/checkpoint.npz.tmp", "sync/repeat-1/.speedup.png.tmp"]  # fmt: skip
    for name in leftovers:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(b"")
    (run / "notes.tmp").write_text("the user's own")  # not ours: kept
    rc, _, err, _ = run_pipesgd(["train", *TINY.split(), f"--out={run}"], {}, tmp_path)
    assert rc == 0, err[-3000:]
    assert not [n for n in leftovers if (run / n).exists()], err
    assert (run / "notes.tmp").exists() and "temporary file(s)" in err


# --- two local jobs started at once on one --master-port -------------------------------------


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _start_holding_the_port(argv: list[str], port: int, cwd: Path):
    """Start `pipesgd argv` and freeze its whole session (SIGSTOP) at a moment its launcher
    holds the store's port (it holds it from start until every rank has joined): the other
    job is then certain to meet the port taken, however the machine schedules the two. None
    when the job got past that moment before it was seen (the caller tries again)."""
    proc = subprocess.Popen([sys.executable, "-m", "pipesgd_ref", *argv], cwd=cwd,
                            env=_case_env({}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not _port_taken(port) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGSTOP)
    if _port_taken(port):
        return proc
    os.killpg(proc.pid, signal.SIGCONT)
    _wait(proc, argv, proc.pid)
    return None


@pytest.mark.slow
def test_two_jobs_started_at_once_on_one_master_port(tmp_path):
    """The launcher binds the store's port itself and hands it to rank 0, so the loser of the
    race learns at once, in one line, that the port is taken: none of its ranks starts, and
    none reaches the winner's store to be refused for a "wrong job token" (issue 29, item 20).
    The race is made certain: job a is frozen while it holds the port, job b runs meanwhile."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = {name: ["train", *TINY.split(), "--steps=20", f"--master-port={port}",
                   f"--out={tmp_path / name}"] for name in ("a", "b")}  # fmt: skip
    for _ in range(3):
        a = _start_holding_the_port(argv["a"], port, tmp_path)
        if a is not None:
            break
    assert a is not None, "job a never held the port long enough to be seen holding it"
    try:
        rc, _, err, group = run_pipesgd(argv["b"], {}, tmp_path)
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    out_a, err_a = _wait(a, argv["a"], a.pid)
    assert a.returncode == 0, _text(err_a)[-2000:]
    assert rc == 2, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesgd: error: "), err
    assert f"port {port} on 127.0.0.1 is in use" in lines[0] and "--master-port" in lines[0]
    assert "token" not in err, err
    for pgid in (group, a.pid):
        assert not left_behind(pgid, tmp_path)
