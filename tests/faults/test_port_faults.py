"""Strangers at the door while a job forms, for every method: a rank with the wrong job token,
and a second job started on the same port.

Job A's ranks are started one short (so its rendezvous store stays open, deterministically);
then, on A's port: a second local job (`pipesgd train --master-port=P`) must stop at once with
the busy-port error and start no workers; a process claiming A's last rank with another token
must be refused with the reason; then A's real last rank joins and A finishes as if nothing had
happened.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from jobs import clean_env, train_cmd
from procs import stop_sessions

from pipesgd_ref.runtime.launch import free_port

REFUSAL_BOUND_S = 20.0  # start-up of a Python process on a loaded 2-core machine, and the answer


def _wait_listening(port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"job A's rendezvous store never listened on {port}")


def _start(argv, env, log: Path):
    f = open(log, "w+")  # read back (and closed) by _output
    return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True), f  # fmt: skip


def _output(f) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo", ["sync", "pipe", "ps-sync", "ps-async"])
def test_wrong_token_and_second_job_on_the_port_leave_the_job_unharmed(algo, tmp_path):
    port = free_port()
    n = 5 if algo.startswith("ps") else 4
    job = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
                    PIPESGD_JOB_TOKEN="job-a-token")  # fmt: skip
    argv = train_cmd(tmp_path / "a", f"--algo={algo}", "--timeout=60")
    procs, files = [], []
    try:
        for r in range(n - 1):  # one short: the store waits for rank n - 1
            p, f = _start(argv, job | {"RANK": str(r)}, tmp_path / f"a{r}.log")
            procs.append(p)
            files.append(f)
        _wait_listening(port, 60)

        # A second job on the same port: refused at once, naming the port.
        start = time.monotonic()
        second = subprocess.run(
            train_cmd(tmp_path / "b", f"--algo={algo}", f"--master-port={port}"),
            env=clean_env(), capture_output=True, text=True, timeout=REFUSAL_BOUND_S + 30,
        )  # fmt: skip
        took = time.monotonic() - start
        assert second.returncode == 2, second.stderr[-2000:]
        assert str(port) in second.stderr and "in use" in second.stderr, second.stderr
        assert took < REFUSAL_BOUND_S, f"the busy port took {took:.1f} s to report"
        assert not (tmp_path / "b" / "summary.json").exists()

        # A process with another job's token claiming A's missing rank: refused, with why.
        start = time.monotonic()
        stray = subprocess.run(
            argv, env=job | {"RANK": str(n - 1), "PIPESGD_JOB_TOKEN": "job-b-token"},
            capture_output=True, text=True, timeout=REFUSAL_BOUND_S + 30,
        )  # fmt: skip
        took = time.monotonic() - start
        assert stray.returncode == 2, stray.stderr[-2000:]
        assert "wrong job token" in stray.stderr, stray.stderr[-2000:]
        assert took < REFUSAL_BOUND_S, f"the stray was answered after {took:.1f} s"

        # A's real last rank: the job forms and finishes.
        p, f = _start(argv, job | {"RANK": str(n - 1)}, tmp_path / f"a{n - 1}.log")
        procs.append(p)
        files.append(f)
        for p in procs:
            p.wait(timeout=120)
        outputs = [_output(f) for f in files]
        files.clear()
        for r, (p, out) in enumerate(zip(procs, outputs, strict=True)):
            assert p.returncode == 0, f"rank {r}:\n{out[-3000:]}"
        summary = json.loads((tmp_path / "a" / "summary.json").read_text())
        assert summary["algo"] == algo and summary["steps"] == 30
        assert "refused a connection" in outputs[0] and "wrong job token" in outputs[0]
    finally:
        stop_sessions(procs)
        for f in files:
            f.close()
