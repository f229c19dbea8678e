"""Every PIPESGD_FAULT kind acts or is refused: wire faults under one host's shared-memory group
are a ConfigError before any AllReduce; kill as PID 1 of a PID namespace still ends the process;
under rd and rab a truncated or closed frame from rank 1 is blamed on rank 1 (comm/mesh.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from pipesgd_ref.comm import shm_group
from pipesgd_ref.comm.sender import Sender, own_stall
from pipesgd_ref.comm.wire import Frame, Kind
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError, PeerTimeout, WorkerFailed
from pipesgd_ref.runtime import faults


def _train(tmp_path, monkeypatch, fault: str, **more):
    monkeypatch.setenv(faults.ENV, fault)
    cfg = TrainConfig.preset("tiny").replace(
        algo="sync", steps=8, timeout=2.0, out=str(tmp_path), eval_every=0,
        checkpoint_every=0, world_size=2, **more,
    )  # fmt: skip
    with pytest.raises(WorkerFailed) as failed:
        run_training(cfg, progress=False, log=lambda line: None)
    return failed.value


def test_refused_without_frames():
    group = SimpleNamespace(group=object())
    faults.refuse_without_frames(SimpleNamespace(group=None))  # links carry frames: acts
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.ENV, "truncate@1:3")
        faults.refuse_without_frames(SimpleNamespace(group=None))
        with pytest.raises(ConfigError, match=r"truncate@1:3 .*--allreduce ring"):
            faults.refuse_without_frames(group)
        mp.setenv(faults.ENV, "kill@1:3")  # a process fault acts anywhere
        faults.refuse_without_frames(group)


@pytest.mark.timeout(60)
def test_wire_fault_under_the_group_is_a_config_error_exit_2(tmp_path):
    env = {**os.environ, faults.ENV: "garbage@1:3"}
    pipesgd = os.path.join(os.path.dirname(sys.executable), "pipesgd")
    cmd = [pipesgd, "train", "--preset", "tiny", "--steps", "10", "--no-progress"]
    cmd += ["--out", str(tmp_path), "--overwrite"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=50)
    if "shared-memory group" not in run.stderr and run.returncode == 0:
        pytest.skip("this machine forms no shared-memory group (comm/shm_group.py)")
    assert run.returncode == 2, run.stderr
    assert "garbage@1:3 acts on a frame" in run.stderr and "--transport tcp" in run.stderr
    # refused by the command before any worker starts: one line, no rank's
    assert run.stderr.startswith("pipesgd: error: PIPESGD_FAULT: garbage@1:3"), run.stderr
    assert run.stderr.count("\n") == 1 and "rank 0:" not in run.stderr, run.stderr


def test_kill_as_pid_1_ends_the_process():
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare on this machine")
    code = (
        "import os; from pipesgd_ref.runtime import faults\n"
        "print('pid', os.getpid(), flush=True)\n"
        "faults.at_step(0, 0)\n"
        "print('survived', flush=True)\n"
    )
    env = {**os.environ, faults.ENV: "kill@0:0"}
    run = subprocess.run([unshare, "--pid", "--fork", sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    if "pid 1" not in run.stdout:
        pytest.skip(f"unshare --pid not permitted here: {run.stderr.strip()[-200:]}")
    assert "survived" not in run.stdout
    assert run.returncode == faults.KILL_EXIT_STATUS, (run.returncode, run.stderr)
    assert faults.ANNOUNCE in run.stderr


def test_a_stuck_send_with_nothing_queued_names_this_rank():
    mine, theirs = socket.socketpair()
    try:
        link = SimpleNamespace(transport="unix", sock=mine, peer=0)
        error = PeerTimeout("could not hand data to rank 0", origin=0, link=link)
        assert own_stall(1, 2.0, error).origin == 1  # rank 0 read everything: ours
        mine.sendall(b"x" * 1000)  # unread by rank 0: it is the holdup
        assert own_stall(1, 2.0, error) is error
        shm = SimpleNamespace(transport="shm", sock=mine, peer=0)
        error = PeerTimeout("x", origin=0, link=shm)
        assert own_stall(1, 2.0, error) is error
    finally:
        mine.close()
        theirs.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("action", ["truncate", "close"])
@pytest.mark.parametrize("allreduce", ["rd", "rab"])
def test_rd_and_rab_blame_the_rank_that_failed(allreduce, action, tmp_path, monkeypatch):
    error = _train(tmp_path, monkeypatch, f"{action}@1:3", transport="tcp", allreduce=allreduce)
    assert error.cause == 1, str(error)
    assert "point to rank 1" in str(error).splitlines()[0], str(error)
    assert "to rank 0" not in str(error), str(error)


def test_a_stuck_send_on_shared_memory_names_this_rank_once_every_slot_is_released():
    mine, theirs = socket.socketpair()
    try:
        link = SimpleNamespace(transport="shm", sock=mine, peer=0, _sent=5, _consumed_out=[5])
        error = PeerTimeout("could not hand data to rank 0", origin=0, link=link)
        assert own_stall(1, 2.0, error).origin == 1  # rank 0 released every slot: ours
        link._consumed_out = [4]  # a slot rank 0 has not released: it is the holdup
        assert own_stall(1, 2.0, error) is error
    finally:
        mine.close()
        theirs.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("allreduce", ["rd", "rab"])
def test_rd_and_rab_over_shared_memory_blame_the_rank_that_failed(allreduce, tmp_path, monkeypatch):
    """The mesh's links over shm: the truncated frame never fills its slot, so rank 1's stuck
    sender is seen by every slot released, not by the socket's queue alone."""
    error = _train(tmp_path, monkeypatch, "truncate@1:3", transport="shm", allreduce=allreduce)
    assert error.cause == 1, str(error)
    assert "point to rank 1" in str(error).splitlines()[0], str(error)
    assert "to rank 0 for" not in str(error), str(error)


STOP_AS_PID_1 = """
import os, threading, time
from pipesgd_ref.runtime import faults
def tick():  # a sending thread's heartbeats, as it were
    while True:
        os.write(1, b"tick\\n")
        time.sleep(0.02)
threading.Thread(target=tick, daemon=True).start()
time.sleep(0.1)
print("pid", os.getpid(), flush=True)
faults.at_step(0, 0)
print("survived", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_stop_as_pid_1_freezes_every_thread():
    """SIGSTOP to itself is ignored as PID 1 too: stop freezes the process instead, no thread
    writes again, and SIGKILL from outside the namespace ends it (--kill-child: unshare's)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare on this machine")
    env = {**os.environ, faults.ENV: "stop@0:0"}
    cmd = [unshare, "--pid", "--fork", "--kill-child", sys.executable, "-c", STOP_AS_PID_1]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)  # the freeze comes 0.1 s in: a loaded machine has time to get there
        assert proc.poll() is None, proc.communicate(timeout=10)  # frozen, not gone
        first = os.read(proc.stdout.fileno(), 1 << 16).decode()  # what it wrote so far
        if "pid 1" not in first:
            proc.kill()
            pytest.skip(f"unshare --pid not permitted here: {proc.communicate()[1][-200:]!r}")
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        proc.kill()
        out, err = proc.communicate(timeout=20)
    assert out.decode() == "", f"a thread ran after the freeze: {out.decode()[:200]!r}"
    assert "survived" not in first and faults.ANNOUNCE in err.decode()


class _HungLink:
    """A link whose sending never finishes (a sender stuck as a truncated frame leaves it)."""

    transport, rank, peer = "unix", 2, 3

    def __init__(self, sock):
        self.sock, self.release = sock, threading.Event()

    def send_without_waiting(self, frame, payload):
        return None

    def may_send_inline(self, frame, n):
        return False

    def send(self, frame, payload):
        self.release.wait(10.0)


def test_every_collectives_final_wait_on_a_hung_sender_names_this_rank():
    """The wait a ring AllReduce ends with (Sender.flush), not only a mesh hop's: a sending
    thread that hangs while the peer has read everything is this rank's fault; with bytes the
    peer left unread, the peer's."""
    mine, theirs = socket.socketpair()
    link = _HungLink(mine)
    sender = Sender(link)
    try:
        sender.put(Frame(kind=Kind.DATA), memoryview(b"x" * 64))
        with pytest.raises(PeerTimeout) as stuck:
            sender.flush(0.3)
        assert stuck.value.origin == 2 and "stuck in this rank" in str(stuck.value)
        mine.sendall(b"y" * 1000)  # unread by rank 3: now it is the holdup
        with pytest.raises(PeerTimeout) as slow:
            sender.flush(0.3)
        assert slow.value.origin == 3 and "could not hand data to rank 3" in str(slow.value)
    finally:
        link.release.set()
        sender.stop()
        mine.close()
        theirs.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("action", ["kill", "stop", "nan", "inf"])
def test_process_faults_act_under_the_shared_memory_group(action, tmp_path, monkeypatch):
    """The defaults on one host (--transport auto --allreduce auto: the shared-memory group,
    which sends no frame): every process fault still happens, and the job names rank 1, a
    stopped rank by the group's timeout."""
    error = _train(tmp_path, monkeypatch, f"{action}@1:3", transport="auto", allreduce="auto")
    assert error.cause == 1, str(error)
    assert "point to rank 1" in str(error).splitlines()[0], str(error)
    if shm_group.supported():
        assert "shared memory" in str(error), str(error)  # it was the group that saw it
