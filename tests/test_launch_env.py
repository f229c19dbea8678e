"""The launcher's small contracts: a job described by the environment says what is missing
(as torch's env:// does: "MASTER_ADDR expected, but not set") instead of waiting out a timeout
for a store at a default address; a world size below 1 is named as such; and a fixed
--master-port can be used again right after a clean run (its closed connections linger in
TIME_WAIT for about 60 s, which must not make the port look busy).
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipesgd_ref.errors import LaunchError
from pipesgd_ref.runtime.jobenv import default_bind, detect_env
from pipesgd_ref.runtime.launch import free_port, launch_local

REPO = Path(__file__).resolve().parents[1]
ADDR, PORT = {"MASTER_ADDR": "10.0.0.7"}, {"MASTER_PORT": "23456"}
# (rank variables, the launcher's name) for each convention detect_env reads
CONVENTIONS = [
    ({"RANK": "1", "WORLD_SIZE": "2"}, "torchrun"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "Open MPI"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "MPICH/Hydra"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "SLURM"),
]
IDS = [source for _, source in CONVENTIONS]


@pytest.mark.parametrize("ranks, source", CONVENTIONS, ids=IDS)
@pytest.mark.parametrize(
    "given, missing",
    [
        (PORT, "MASTER_ADDR"),
        (ADDR, "MASTER_PORT"),
        ({}, "MASTER_ADDR and MASTER_PORT"),
        ({"MASTER_ADDR": ""} | PORT, "MASTER_ADDR"),  # empty: as good as not set
    ],
    ids=["no-addr", "no-port", "neither", "empty-addr"],
)
def test_a_rank_without_the_stores_address_is_an_error(ranks, source, given, missing):
    with pytest.raises(LaunchError) as info:
        detect_env(ranks | given)
    text = str(info.value)
    assert text.startswith(f"{source} job: {missing} expected, but not set: "), text
    assert "same on every rank" in text, text  # says what to set, not only what is wrong
    if source == "Open MPI":
        assert "mpirun -x MASTER_ADDR=" in text, text


@pytest.mark.parametrize("ranks, source", CONVENTIONS, ids=IDS)
def test_the_stores_address_when_given(ranks, source):
    job = detect_env(ranks | ADDR | PORT)
    assert (job.rank, job.world_size, job.source) == (1, 2, source)
    assert (job.master_addr, job.master_port) == ("10.0.0.7", 23456)


def test_pipesgd_master_port_stands_in_for_master_port():
    job = detect_env({"RANK": "0", "WORLD_SIZE": "2", "PIPESGD_MASTER_PORT": "31000"} | ADDR)
    assert job.master_port == 31000
    with pytest.raises(LaunchError, match="^torchrun job: MASTER_ADDR expected, but not set"):
        detect_env({"RANK": "0", "WORLD_SIZE": "2", "PIPESGD_MASTER_PORT": "31000"})


@pytest.mark.parametrize("size", ["0", "-3"])
@pytest.mark.parametrize("ranks, source", CONVENTIONS, ids=IDS)
def test_a_world_size_below_1_is_named_as_such(ranks, source, size):
    rank_var, size_var = list(ranks)
    env = {rank_var: "0", size_var: size} | ADDR | PORT
    with pytest.raises(LaunchError) as info:
        detect_env(env)
    text = str(info.value)
    assert text.startswith(f"{source} job: {size_var}={size}, but the world size must be at "
                           f"least 1"), text  # fmt: skip
    assert "outside 0.." not in text, text


@pytest.mark.timeout(120)
def test_train_under_a_rank_without_master_addr_is_one_line_and_exit_2(tmp_path):
    """`RANK=0 WORLD_SIZE=2 pipesgd train`, no MASTER_*: one line and rc 2 at once, not a
    rendezvous timeout at 127.0.0.1:29500."""
    launchers = ("MASTER_", "PIPESGD_MASTER", "OMPI_", "PMI_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launchers)}
    path = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env |= {"RANK": "0", "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--world-size=2",
         "--steps=3", "--timeout=60", "--no-progress", f"--out={tmp_path / 'out'}"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("pipesgd: error: torchrun job: MASTER_ADDR and MASTER_PORT "
                                  "expected, but not set"), done.stderr  # fmt: skip
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert elapsed < 50, f"took {elapsed:.1f} s: it waited for a store (--timeout 60)"
    assert not (tmp_path / "out").exists()


def _nothing(comm):
    return comm.rank


@pytest.mark.timeout(120)
def test_a_fixed_master_port_is_free_again_right_after_a_clean_run():
    """The store closes its connections first, so they sit in TIME_WAIT on the store's port
    for about 60 s after the job; the next job on that port must start at once anyway (the
    probe and the store bind with SO_REUSEADDR, as torchrun's store does)."""
    port = free_port()
    for run in range(3):
        start = time.monotonic()
        assert launch_local(2, _nothing, start_method="fork", master_port=port,
                            timeout=10.0) == [0, 1], f"run {run}"  # fmt: skip
        assert time.monotonic() - start < 30, f"run {run} took {time.monotonic() - start:.1f} s"


def _joined_ranks(
    tmp_path, *per_rank: list[str], envs: tuple[dict, ...] = ()
) -> list[subprocess.CompletedProcess]:
    """One `pipesgd train` per argument list, each a rank of one torchrun-style job on a free
    port of the loopback (rank r's environment plus envs[r], when given); their completed
    processes, in rank order."""
    launchers = ("MASTER_", "PIPESGD_", "OMPI_", "PMI_", "SLURM_", "RANK", "WORLD_SIZE", "LOCAL_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launchers)}
    path = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env |= {"WORLD_SIZE": str(len(per_rank)), "MASTER_ADDR": "127.0.0.1", "PYTHONPATH": path}
    env |= {"MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipesgd_ref",
                "train",
                "--preset=tiny",
                "--timeout=60",
                "--no-progress",
                f"--out={tmp_path / f'out{rank}'}",
                *args,
            ],
            env=env | {"RANK": str(rank)} | (envs[rank] if envs else {}),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank, args in enumerate(per_rank)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "rank1, named",
    [
        (["--lr=0.5"], "--lr 0.1 on rank 0 vs 0.5 on rank 1"),
        (["--steps=61"], "--steps 60 on rank 0 vs 61 on rank 1"),
        # Issue 41: these changed the collective the options check itself ran through (an 8 s
        # wait, then errors about pieces or frame sizes); the store compares them first.
        (["--allreduce=ring"], "--allreduce auto on rank 0 vs ring on rank 1"),
        (["--transport=tcp"], "--transport auto on rank 0 vs tcp on rank 1"),
        (
            ["--allreduce=rd", "--transport=tcp"],
            "--allreduce auto on rank 0 vs rd on rank 1; "
            "--transport auto on rank 0 vs tcp on rank 1",
        ),  # fmt: skip
    ],
)
def test_joined_ranks_started_with_different_options_are_refused_on_every_rank(
    tmp_path, rank1, named
):
    """Issue 29, 8: ranks given another --lr trained on to different weights, and other --steps
    failed in an AllReduce that never named --steps; now every rank refuses at once, naming the
    option and each rank's value, and nothing is written."""
    for rank, done in enumerate(_joined_ranks(tmp_path, [], rank1)):
        assert done.returncode == 2, (rank, done.stderr)
        assert done.stderr.startswith(
            "pipesgd: error: the ranks of this job were started with different options: " + named
        ), (rank, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out0" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_auto_figures_are_rank_0s_read_once_and_a_bad_file_is_one_line(tmp_path):
    """Issue 41: auto's figures were read on each rank, so each host's own fit gave its ranks
    other choices, and a malformed file was a traceback per rank. Rank 0 reads them at
    rendezvous and hands them to every rank: a bad file on rank 1's side changes nothing, and
    a bad one on rank 0's is one line naming the file on every rank, exit 2, before any link."""
    bad = tmp_path / "models.json"
    bad.write_text('{"models": {"shm": {"ring": {"alpha": "fast"')  # truncated
    env = {"PIPESGD_ALLREDUCE_MODELS": str(bad)}
    (tmp_path / "good").mkdir(), (tmp_path / "bad").mkdir()
    trained = _joined_ranks(tmp_path / "good", [], [], envs=({}, env))
    for rank, done in enumerate(trained):
        assert done.returncode == 0, (rank, done.stderr[-2000:])
    assert (tmp_path / "good" / "out0" / "summary.json").is_file()
    for rank, done in enumerate(_joined_ranks(tmp_path / "bad", [], [], envs=(env, {}))):
        assert done.returncode == 2, (rank, done.stderr)
        assert done.stderr.startswith(f"pipesgd: error: AllReduce models file {bad} is not JSON")
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


def test_the_differences_name_each_option_and_each_ranks_value():
    from pipesgd_ref.config import TrainConfig
    from pipesgd_ref.runtime.agreement import PER_RANK, differences, shared_options

    base = TrainConfig()
    other = base.replace(out="/elsewhere", timeout=30.0, hidden=(32, 16))
    assert not set(PER_RANK) & set(shared_options(base))
    text = differences([shared_options(base), shared_options(other), shared_options(base)])
    assert text == "--hidden 64 on ranks 0 and 2 vs 32,16 on rank 1"


# --- where a joined rank's listeners bind ----------------------------------------------------


@pytest.mark.parametrize(
    "addr, bind",
    [("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"),
     ("127.0.1.1", "127.0.1.1"), ("10.0.0.7", "0.0.0.0"), ("rank0.example", "0.0.0.0")],
)  # fmt: skip
def test_listeners_bind_the_loopback_address_master_addr_names(addr, bind):
    assert default_bind(addr) == bind


@pytest.mark.timeout(60)
def test_a_job_on_127_0_0_2_listens_there_only(monkeypatch):
    """MASTER_ADDR=127.0.0.2: the store and every data listener bind 127.0.0.2, never all
    interfaces (issue 29, item 10), and the job forms."""
    from pipesgd_ref.comm import rendezvous, store
    from pipesgd_ref.runtime import jobenv

    port, bound, errors = free_port(), [], []
    real_listen = rendezvous.listen

    def recording(host, port_, what, rank):
        sock = real_listen(host, port_, what, rank)
        bound.append((what, sock.getsockname()[0]))
        return sock

    def rank_of_thread():  # each thread is one rank of the joined job
        rank = int(threading.current_thread().name.removeprefix("rank"))
        return jobenv.JobEnv(rank, 2, "127.0.0.2", port, "t", "torchrun")

    monkeypatch.setattr(rendezvous, "listen", recording)  # the data links' listeners
    monkeypatch.setattr(store, "listen", recording)  # the store's
    monkeypatch.setattr(jobenv, "detect_env", rank_of_thread)
    comms = {}

    def join(rank):
        try:
            comms[rank] = jobenv.join_from_env(timeout=10.0)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=join, args=(r,), name=f"rank{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for comm in comms.values():
        comm.close()
    assert not errors and len(comms) == 2, errors
    assert len(bound) == 3 and {host for _, host in bound} == {"127.0.0.2"}, bound


@pytest.mark.parametrize("addr", ["::1", "[::1]", "fe80::1"])
def test_an_ipv6_master_addr_is_refused_in_one_line(addr):
    with pytest.raises(LaunchError, match="IPv6 address.*IPv4 only") as info:
        detect_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": addr} | PORT)
    assert "\n" not in str(info.value)
