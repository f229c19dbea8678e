"""`pipesgd bench allreduce`: runs, verifies its sums, writes JSON; joins a job from the
environment. (Figures are checked by reading them, never by timing assertions.)"""

import json
import math
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


def test_bench_emulated_link_prints_the_model(tmp_path, capsys):
    """On an emulated link the table's model column is the alpha-beta prediction with the
    link's alpha and B; every printed figure is a positive, finite number, one row per size
    asked for, and the printed table and the JSON say the same."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=3", "--sizes=12KB,24KB", "--reps=2",
               "--latency=1ms", "--bandwidth=1Gbit", f"--json={out}"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "latency 1.00 ms" in printed
    result = json.loads(out.read_text())
    assert result["link"] == {"latency_s": 1e-3, "bandwidth_Bps": 125e6}
    assert result["gloo"] is False, "an emulated link is not compared with gloo"
    gamma = result["gamma_s_per_byte"]
    assert 0 < gamma < math.inf and 0 < result["p2p_bandwidth_Bps"] < math.inf
    rows = result["rows"]
    assert [r["size_bytes"] for r in rows] == [12_000, 24_000], "one row per size asked for"
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["size", "time", "ms"])
    table = lines[header + 1 : header + 1 + len(rows)]
    for row, line in zip(rows, table, strict=True):
        size = row["size_bytes"]
        want = ring_allreduce_time(3, size, 1e-3, 125e6, gamma)
        assert row["predicted_s"] == want, f"{size} B: the model column is the alpha-beta model"
        assert row["algbw"] == pytest.approx(size / row["time_s"])
        assert row["busbw"] == pytest.approx(row["algbw"] * bus_factor(3))
        assert row["verified"] and row["wire_bytes"] > 0
        # size (2 fields), time ms, algbw, busbw, of link, model ms, verified, sent MB
        fields = line.split()
        assert len(fields) == 9 and fields[7] == "yes", f"a row of the table: {line!r}"
        time_ms, algbw, busbw, model_ms, sent_mb = (float(fields[i]) for i in (2, 3, 4, 6, 8))
        for name, value in [("time ms", time_ms), ("model ms", model_ms), ("sent MB", sent_mb)]:
            assert 0 < value < math.inf, f"{size} B: {name} printed as {value}"
        assert 0 <= algbw < math.inf and 0 <= busbw < math.inf, line
        assert time_ms == pytest.approx(row["time_s"] * 1e3, abs=0.006), "table = JSON"
        assert model_ms == pytest.approx(want * 1e3, abs=0.006), "table = JSON"
        assert sent_mb == pytest.approx(row["wire_bytes"] / 1e6, abs=0.006), "table = JSON"


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
