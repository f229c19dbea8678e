"""Jobs the tests start, and how they must end.

Two kinds. In one process, `launch_local` forks the ranks of a job function (`killed_job`,
`stopped_job`: a rank that dies or stops mid-AllReduce), and the test holds how the job failed:
who is blamed, how soon, and that no rank outlives it. On the command line, `python -m
pipesgd_ref train` runs as a launcher would start it (`train_cmd`), in an environment holding
only the launcher variables the test sets (`clean_env`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pipesgd_ref.comm.collectives import allreduce
from pipesgd_ref.errors import WorkerFailed
from pipesgd_ref.runtime.launch import launch_local

REPO = Path(__file__).resolve().parent.parent

# --- jobs of launch_local that must fail ------------------------------------------------------

TIMEOUT = 2.0  # the communication timeout inside the workers


def write_pid(pid_dir) -> None:
    (pid_dir / f"{os.getpid()}.pid").write_text(str(os.getpid()))


def assert_nothing_left_alive(pid_dir, expected: int) -> None:
    """No multiprocessing child, and none of the workers' pids exists any more."""
    assert mp.active_children() == [], f"workers still alive: {mp.active_children()}"
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
    assert len(pids) == expected, f"{len(pids)} of {expected} workers wrote their pid"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # signal 0: "does it exist?"


def run_failing(world_size: int, job, args: tuple, **kw) -> tuple[WorkerFailed, float]:
    """launch_local that must fail; returns the WorkerFailed and the wall time it took."""
    kw = dict(start_method="fork", timeout=TIMEOUT, job_timeout=20.0) | kw
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as info:
        launch_local(world_size, job, args, **kw)
    elapsed = time.monotonic() - start
    assert -1 not in info.value.errors, f"the job hit job_timeout: {info.value}"
    return info.value, elapsed


# Which rank an error blames: "rank R closed", "rank R failed", "no data from rank R"...
BLAME = re.compile(
    r"^rank \d+: (?:rank (\d+) (?:closed|failed|accepted no data)|no data from rank (\d+))"
)


def blamed(text: str) -> int | None:
    m = BLAME.match(text.strip())
    return int(m.group(1) or m.group(2)) if m else None


def assert_every_rank_blames_the_killed(failed, p: int, victim: int) -> None:
    """Every rank failed; the SIGKILLed `victim` by its exit code, each other one blaming it."""
    assert sorted(failed.errors) == list(range(p)), failed
    assert "died with exit code -9" in failed.errors[victim], failed.errors[victim]
    for rank in set(range(p)) - {victim}:
        text = failed.errors[rank]
        assert blamed(text) == victim, f"rank {rank} should blame rank {victim}: {text}"


def killed_job(comm, victim, n, reps, pid_dir):
    """Rank `victim` is SIGKILLed during the AllReduces that follow a warm-up."""
    write_pid(pid_dir)
    x = np.ones(n, np.float32)
    allreduce(comm, x)  # warm-up: every link is up and carrying data
    if comm.rank == victim:  # SIGKILL: no cleanup, no error message, sockets reset by the kernel
        threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(reps):
        allreduce(comm, x)


def stopped_job(comm, victim, n, pid_dir):
    """Rank `victim` stops itself (SIGSTOP) between two AllReduces."""
    write_pid(pid_dir)
    x = np.ones(n, np.float32)
    allreduce(comm, x)
    if comm.rank == victim:  # alive, sockets open, silent: only a timeout can tell
        os.kill(os.getpid(), signal.SIGSTOP)
    allreduce(comm, x)


# --- `pipesgd train` as a launcher starts it --------------------------------------------------

# tiny (digits, softmax regression) on 4 workers, 30 steps: each rank a few seconds
TRAIN_ARGS = ["--preset=tiny", "--world-size=4", "--steps=30", "--eval-every=10"]
# Variables a launcher may have left in the environment pytest runs in (say, inside an
# sbatch script or an mpirun): the jobs must see only the ones each test sets.
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL")
LAUNCHER_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PIPESGD_JOB_TOKEN",
}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }
    env["OMP_NUM_THREADS"] = "1"  # 4-5 ranks on a few cores: one BLAS thread each
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env | extra


def train_cmd(out: Path, *more: str) -> list[str]:
    """`python -m pipesgd_ref train` of TRAIN_ARGS and `more`, writing to `out`."""
    return [
        sys.executable,
        "-m",
        "pipesgd_ref",
        "train",
        *TRAIN_ARGS,
        *more,
        "--no-progress",
        f"--out={out}",
    ]
