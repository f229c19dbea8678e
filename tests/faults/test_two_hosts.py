"""A job of two "hosts" with the defaults: `--transport auto`, `--allreduce auto`.

Each host is a UTS namespace of its own (`unshare --uts`, another hostname), so the rendezvous
sees two hosts of two ranks each: within a host the links are shared memory, between hosts tcp
(loopback underneath). Half the ring is shm and half tcp, and `auto` used to pick by each rank's
own right link: for a gradient between the two transports' crossover sizes (about 144-211 KB
and 0.53-1.18 MB for 4 ranks, the package's figures) one pair of ranks ran recursive doubling
and the other Rabenseifner, and every rank exited with a CollectiveMismatch. Now the job picks
by its slowest link, from the table every rank holds, with the figures rank 0 read.

Run at every size where the link algorithms cross, by either transport's figures, and on both
sides of each: every rank must end with the exact sum, and all four must have run the same
algorithm, the one the tcp figures pick. Needs root for the namespaces (CI runs as root);
elsewhere it skips and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipesgd_ref.comm import choose
from pipesgd_ref.comm.choose import LINK_ALGORITHMS
from pipesgd_ref.commands.bench_algorithms import crossovers
from pipesgd_ref.runtime.launch import free_port

REPO = Path(__file__).resolve().parents[2]
P = 4
HOSTS = ("host-a", "host-a", "host-b", "host-b")

# One rank: join the job the environment describes with the defaults, reduce each size once
# (rank r's array holds r + 1 + i, small integers: any order of adding gives the exact sum),
# and print what ran.
RANK = r"""
import json, sys
import numpy as np
from pipesgd_ref.comm.collectives import allreduce
from pipesgd_ref.runtime.jobenv import join_from_env

comm = join_from_env(timeout=30.0, transport="auto", allreduce="auto")
sizes = json.loads(sys.argv[1])
wrong = []
for nbytes in sizes:
    n = nbytes // 4
    x = (np.arange(n) % 97 + comm.rank + 1).astype(np.float32)
    allreduce(comm, x)
    want = (np.arange(n) % 97 * comm.world_size + comm.world_size * (comm.world_size + 1) // 2)
    if not np.array_equal(x, want.astype(np.float32)):
        wrong.append(nbytes)
ran = {e["bytes"]: e["algorithm"] for e in comm.allreduce_ran()}
print(json.dumps({"ran": ran, "wrong": wrong, "transport": comm.auto_transport}))
comm.close()
"""


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    done = subprocess.run(["unshare", "--uts", "true"], capture_output=True)
    return None if done.returncode == 0 else "needs root (unshare --uts)"


def _sizes() -> list[int]:
    """Every crossover of the link algorithms by the shm and the tcp figures, 1 KB either
    side, in whole float32s."""
    models = choose.job_models()
    link = {
        t: {a: {"alpha": f[0], "beta": f[1]} for a, f in algos.items() if a in LINK_ALGORITHMS}
        for t, algos in models.items()
        if t in ("shm", "tcp")
    }
    sizes = set()
    for changes in crossovers(link, P).values():
        for n, _, _ in changes:
            sizes |= {n - 1024, n + 1024}
    return sorted(s // 4 * 4 for s in sizes)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_two_host_job_with_the_defaults_agrees_at_every_crossing_size(tmp_path):
    why = _can_unshare()
    if why:
        pytest.skip(f"a job of two hosts in UTS namespaces {why}")
    sizes = _sizes()
    assert len(sizes) >= 8, f"expected two crossovers per transport, got sizes {sizes}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "PIPESGD_"))}
    env |= {
        "WORLD_SIZE": str(P),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        # The package's figures alone: no user file of this machine changes the choice.
        "PIPESGD_ALLREDUCE_MODELS": str(tmp_path / "none.json"),
    }
    procs = [
        subprocess.Popen(
            [
                "unshare",
                "--uts",
                "sh",
                "-c",
                f'hostname {host} && exec "$@"',
                "rank",
                sys.executable,
                "-c",
                RANK,
                json.dumps(sizes),
            ],
            env=env | {"RANK": str(rank), "RANK_HOSTNAME": host},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank, host in enumerate(HOSTS)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    reports = []
    for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{err[-3000:]}"
        reports.append(json.loads(out.strip().splitlines()[-1]))
    figures = choose.job_models()["tcp"]
    for rank, report in enumerate(reports):
        assert report["wrong"] == [], f"rank {rank}: wrong sums at {report['wrong']} bytes"
        assert report["transport"] == "tcp", f"rank {rank} chose by {report['transport']}"
        ran = {int(n): a for n, a in report["ran"].items()}
        want = {n: choose.pick(list(LINK_ALGORITHMS), P, n, figures) for n in sizes}
        assert ran == want, f"rank {rank} ran {ran}, the tcp figures pick {want}"
    # The sizes do cross: both sides of a crossover run different algorithms.
    assert len(set(reports[0]["ran"].values())) == 3, reports[0]["ran"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_pipesgd_train_on_two_hosts_with_the_defaults_trains(tmp_path):
    """`pipesgd train` itself, four ranks on two hosts, every option left to its default but
    the model: an MLP whose gradient (48,760 float32s, 195 KB) lies between the two
    transports' crossovers, where the job used to die on its first gradient."""
    why = _can_unshare()
    if why:
        pytest.skip(f"a job of two hosts in UTS namespaces {why}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "PIPESGD_"))}
    env |= {
        "WORLD_SIZE": str(P),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "PIPESGD_ALLREDUCE_MODELS": str(tmp_path / "none.json"),
    }
    train = [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--model=mlp",
             "--hidden=650", "--world-size=4", "--steps=20", "--eval-every=10",
             "--target-accuracy=0", "--no-progress", "--timeout=60"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [
                "unshare",
                "--uts",
                "sh",
                "-c",
                f'hostname {host} && exec "$@"',
                "rank",
                *train,
                f"--out={tmp_path / f'out{rank}'}",
            ],
            env=env | {"RANK": str(rank)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank, host in enumerate(HOSTS)
    ]
    try:
        outs = [p.communicate(timeout=170) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{err[-3000:]}"
    summary = json.loads((tmp_path / "out0" / "summary.json").read_text())
    ran = {e["algorithm"] for e in summary["allreduce_ran"] if e["bytes"] == 48_760 * 4}
    assert ran == {"rab"}, summary["allreduce_ran"]


# --- containers: one host, one network, two PID namespaces ------------------------------------


def _in_two_pid_namespaces(tmp_path, extra_env: dict) -> list[tuple[int, str]]:
    """`pipesgd train` as 2 joined ranks on one host and network, rank 1 in a PID namespace of
    its own with its own /proc (as two containers of one pod see each other), every option
    default: (exit status, stderr) of each. Rank 1 runs under a shell, so it is not PID 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "PIPESGD_"))}
    env |= {
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        **extra_env,
    }
    train = [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--steps=40",
             "--no-progress", "--timeout=60"]  # fmt: skip
    container = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$@"; exit $?', "r1"]
    procs = [
        subprocess.Popen(
            [*(container if rank else []), *train, f"--out={tmp_path / f'out{rank}'}"],
            env=env | {"RANK": str(rank)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, err) for p, (_, err) in zip(procs, outs, strict=True)]


def _can_unshare_pid() -> str | None:
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                          capture_output=True)  # fmt: skip
    return None if done.returncode == 0 else "needs root (unshare --pid --mount-proc)"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_in_two_pid_namespaces_train_with_the_defaults(tmp_path):
    """Issue 41: the shared-memory group formed across the two namespaces, and each rank
    looked for the other's pid in its own /proc: a live rank was declared dead ("its process N
    exited"). The group now forms only within one PID namespace; these ranks use shm links."""
    why = _can_unshare_pid()
    if why:
        pytest.skip(f"ranks in two PID namespaces {why}")
    for rank, (code, err) in enumerate(_in_two_pid_namespaces(tmp_path, {})):
        assert code == 0, f"rank {rank} exited {code}:\n{err[-3000:]}"
    summary = json.loads((tmp_path / "out0" / "summary.json").read_text())
    assert {e["transport"] for e in summary["allreduce_ran"]} == {"shm"}, summary["allreduce_ran"]
    assert not {e["algorithm"] for e in summary["allreduce_ran"]} & {"oneshot", "twoshot"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_killed_in_another_pid_namespace_is_named_long_before_the_timeout(tmp_path):
    """The other direction: a dead rank used to be missed (its pid, looked up in the wrong
    /proc, might be any process) until --timeout (60 s here). Its link closes, and rank 0
    names it within seconds."""
    why = _can_unshare_pid()
    if why:
        pytest.skip(f"ranks in two PID namespaces {why}")
    import time

    start = time.monotonic()
    (code0, err0), (code1, _) = _in_two_pid_namespaces(tmp_path, {"PIPESGD_FAULT": "kill@1:10"})
    took = time.monotonic() - start
    assert code1 == 128 + 9 or code1 == -9, f"rank 1 should have been killed, exit {code1}"
    assert code0 not in (0, None) and "rank 1" in err0, err0[-3000:]
    assert took < 40, f"rank 0 took {took:.0f} s to name the dead rank (timeout 60 s)\n{err0}"
