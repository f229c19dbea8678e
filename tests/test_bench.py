"""`pipesgd bench allreduce`: runs, verifies its sums, writes JSON; joins a job from the
environment. (Figures are checked by reading them, never by timing assertions.)"""

import json
import os
import subprocess
import sys

import pytest

from pipesgd_ref.bench import bus_factor
from pipesgd_ref.cli import main
from pipesgd_ref.launch import free_port
from pipesgd_ref.timing import ring_allreduce_time


def test_bench_allreduce_writes_verified_rows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=2", "--sizes=4KB,64KB", "--reps=2",
               "--no-gloo", f"--json={out}"])  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    assert [r["size_bytes"] for r in result["rows"]] == [4000, 64000]
    assert all(r["verified"] and r["time_s"] > 0 for r in result["rows"])
    assert "busbw GB/s" in capsys.readouterr().out


def test_bench_times_gloo_in_turn_with_ours(tmp_path, capsys):
    """Where torch is installed: gloo's AllReduce in the same workers, side by side with ours."""
    pytest.importorskip("torch.distributed", reason="gloo is optional: torch is not installed")
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=3", "--sizes=12KB,1MB", "--reps=2",
               f"--json={out}"])  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["gloo"] is True
    for row in result["rows"]:
        assert row["verified"] and row["gloo_time_s"] > 0
        assert row["gloo_busbw"] == pytest.approx(
            row["size_bytes"] / row["gloo_time_s"] * bus_factor(3)
        )
    assert "ours/gloo" in capsys.readouterr().out


def test_bench_emulated_link_prints_the_model(capsys):
    rc = main(["bench", "allreduce", "--world-size=3", "--sizes=12KB", "--reps=2",
               "--latency=1ms", "--bandwidth=1Gbit"])  # fmt: skip
    assert rc == 0
    assert "latency 1.00 ms" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes=3"], "multiples of 4 bytes"),
        (["--sizes=1XB"], "expected a size"),
        (["--bandwidth=3Mb"], "ambiguous"),
        (["--latency=-1ms"], "latency"),
        (["--world-size=0"], "--world-size >= 1"),
        (["--codec=zip"], "--codec must be none, trunc16, bf16 or q8"),
    ],
)
def test_bench_bad_input(argv, message, capsys):
    assert main(["bench", "allreduce", *argv]) == 2
    assert message in capsys.readouterr().err


def test_model_helpers():
    assert bus_factor(4) == 1.5 and bus_factor(1) == 1.0
    assert ring_allreduce_time(4, 4_000_000, 2e-3, 100e6, 0.0) == pytest.approx(0.012 + 0.06)


@pytest.mark.timeout(120)
def test_join_from_torchrun_style_environment():
    """Three processes started by hand with RANK/WORLD_SIZE/MASTER_* join one job."""
    port = free_port()
    procs = []
    for rank in range(3):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "PIPESGD_JOB_TOKEN": "test-token"}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pipesgd_ref", "bench", "allreduce", "--sizes=4KB",
             "--reps=2", "--timeout=20"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    outs = [p.communicate(timeout=90) for p in procs]
    for rank, (p, (_out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank}: {err}"
    assert "3 ranks (joined from the environment)" in outs[0][0] and "yes" in outs[0][0]
    assert outs[1][0] == ""  # only rank 0 prints the table
