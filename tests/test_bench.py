"""`pipesgd bench allreduce`: runs, verifies its sums, writes JSON; joins a job from the
environment. (Figures are checked by reading them, never by timing assertions.)"""

import json
import math
import os
import subprocess
import sys

import pytest

from pipesgd_ref.commands.bench import bus_factor
from pipesgd_ref.commands.cli import main
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.runtime.launch import free_port
from pipesgd_ref.timing import ring_allreduce_time


@pytest.mark.slow
def test_bench_allreduce_writes_verified_rows(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=2", "--sizes=4KB,64KB", "--reps=2",
               "--no-gloo", "--allreduce=ring", f"--json={out}"])  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    assert [r["size_bytes"] for r in result["rows"]] == [4000, 64000]
    assert all(r["verified"] and r["time_s"] > 0 for r in result["rows"])
    assert "busbw GB/s" in capsys.readouterr().out


def _table(printed: str, n_rows: int) -> list[list[str]]:
    """The printed table's rows, split into fields (the line after the header onwards)."""
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["row", "size", "time"])
    return [line.split() for line in lines[header + 1 : header + 1 + n_rows]]


def _check_row_figures(row: dict, p: int) -> None:
    """A row's figures are positive, finite and consistent with its time."""
    name, size = row["name"], row["size_bytes"]
    for key in ("time_s", "algbw", "busbw", "copy_Bps", "of_memory", "of_tcp"):
        assert 0 < row[key] < math.inf, f"{name} at {size} B: {key} = {row[key]}"
    assert row["verified"], f"{name} at {size} B: the first sum was not exact"
    assert row["algbw"] == pytest.approx(size / row["time_s"])
    assert row["busbw"] == pytest.approx(row["algbw"] * bus_factor(p))
    assert row["of_memory"] == pytest.approx(row["busbw"] / row["copy_Bps"])
    assert len(row["round_times_s"]) == 2 and row["time_s"] == min(row["round_times_s"]), (
        f"{name} at {size} B: the best of two rounds, got {row['time_s']} of {row['round_times_s']}"
    )


@pytest.mark.slow
def test_bench_rows_per_transport_and_peer(tmp_path, capsys):
    """Two transports and gloo (where torch is installed), in one run: one row of each per
    size, positive finite figures, t/peer the row's time over the fastest peer's, and the
    printed table says what the JSON says."""
    pytest.importorskip("torch.distributed", reason="gloo is optional: torch is not installed")
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=2", "--sizes=64KB", "--reps=2",
               "--transport=tcp,unix", "--allreduce=ring", "--peers=gloo",
               f"--json={out}"])  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["name"] for r in rows] == ["ring-tcp", "ring-unix", "gloo"]
    assert result["peers"] == ["gloo"] and result["skipped_peers"] == {}
    p2p = result["p2p_bandwidth_Bps"]
    gloo_s = rows[2]["time_s"]
    for row in rows:
        _check_row_figures(row, 2)
        assert row["of_tcp"] == pytest.approx(row["busbw"] / p2p)
        assert row["time_vs_best_peer"] == pytest.approx(row["time_s"] / gloo_s)
    assert rows[2]["time_vs_best_peer"] == 1.0 and rows[2]["wire_bytes"] is None
    assert rows[0]["predicted_s"] > 0 and rows[1]["predicted_s"] is None, "the model is TCP's"
    table = _table(capsys.readouterr().out, len(rows))
    for row, fields in zip(rows, table, strict=True):
        # row, size (2 fields), time ms, algbw, busbw, of mem, of TCP, model ms, verified,
        # sent MB, t/peer
        assert len(fields) == 12 and fields[0] == row["name"] and fields[9] == "yes", fields
        assert float(fields[3]) == pytest.approx(row["time_s"] * 1e3, abs=0.006), "table = JSON"
        assert float(fields[4]) == pytest.approx(row["algbw"] / 1e9, abs=6e-4), "table = JSON"
        assert float(fields[5]) == pytest.approx(row["busbw"] / 1e9, abs=6e-4), "table = JSON"
        assert fields[6] == f"{row['of_memory']:.0%}" and fields[7] == f"{row['of_tcp']:.0%}"
        assert float(fields[11]) == pytest.approx(row["time_vs_best_peer"], abs=0.006)
    assert table[1][8] == "-" and table[2][8] == "-" and table[2][10] == "-", "model, sent MB"


def test_rows_run_in_turns_and_keep_their_best_round(monkeypatch):
    """The schedule itself, with every row's job replaced by a stub that logs the call and
    returns figures: round 1 runs the rows in order at each size, round 2 in reverse; each row
    keeps its faster round; t/peer is over the faster peer. No process is started."""
    import pipesgd_ref.commands.bench as bench

    calls = []
    fake = {"ring-tcp": [4e-3, 3e-3], "ring-shm": [2e-3, 2.5e-3], "gloo": [5e-3, 6e-3],
            "mpi": [4e-3, 4e-3]}  # fmt: skip

    def figures(name: str, nbytes: int) -> dict:
        k = sum(1 for c in calls if c == (name, nbytes))
        calls.append((name, nbytes))
        out = {"times": [fake[name][k]] * 3, "verified": True}
        return {**out, "wire": nbytes} if name.startswith("ring-") else out

    monkeypatch.setattr(bench, "measure_p2p", lambda: (1e9, 1e-4))
    monkeypatch.setattr(bench, "measure_gamma", lambda: 1e-10)
    monkeypatch.setattr(bench, "peer_problem", lambda peer: None)
    monkeypatch.setattr(bench, "run_ring", lambda p, n, r, w, transport, *a: figures(
        f"ring-{transport}", n))  # fmt: skip
    monkeypatch.setattr(bench, "run_peer", lambda peer, p, n, *a: figures(peer, n))
    result = bench.bench_allreduce(4, [4000], transports=["tcp", "shm"], peers=["gloo", "mpi"],
                                   print_fn=lambda *a: None)  # fmt: skip
    order = ["ring-tcp", "ring-shm", "gloo", "mpi"]
    assert [name for name, _ in calls] == order + order[::-1], "in turns, reversed in round 2"
    got = {r["name"]: r for r in result["rows"]}
    for name, times in fake.items():
        assert got[name]["round_times_s"] == times and got[name]["time_s"] == min(times)
        assert got[name]["time_vs_best_peer"] == pytest.approx(min(times) / 4e-3), name
    assert got["ring-tcp"]["wire_bytes"] == 4000 and got["mpi"]["wire_bytes"] is None


@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_a_missing_peer_is_skipped_saying_why(monkeypatch, tmp_path, capsys):
    """torch and mpi4py made unimportable: both peers are skipped, one line each, the run
    goes on with the ring alone, and t/peer is "-"."""
    for module in ("torch", "torch.distributed", "mpi4py"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=2", "--sizes=4KB", "--reps=1",
               "--peers=gloo,mpi", "--transport=tcp", "--allreduce=ring",
               f"--json={out}"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "peer gloo skipped: torch is not installed" in printed
    assert "peer mpi skipped: mpi4py is not installed" in printed
    result = json.loads(out.read_text())
    assert result["peers"] == [] and sorted(result["skipped_peers"]) == ["gloo", "mpi"]
    assert [r["name"] for r in result["rows"]] == ["ring-tcp"]
    assert result["rows"][0]["time_vs_best_peer"] is None
    assert _table(printed, 1)[0][-1] == "-"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_open_mpi_peer_for_real(tmp_path):
    """Open MPI's Allreduce through mpi4py, as a child mpirun job of 2 ranks, over shared
    memory (its default on one host) and over TCP only: both rows verified, timed, and the
    faster of them is the best peer."""
    from pipesgd_ref.commands.bench_peers import peer_problem

    why = peer_problem("mpi")
    if why is not None:
        pytest.skip(f"the mpi peer cannot run here: {why}")
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "bench", "allreduce", "--world-size=2",
         "--sizes=4KB", "--reps=2", "--peers=mpi,mpi-tcp", "--transport=tcp",
         "--allreduce=ring", f"--json={out}"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert list(rows) == ["ring-tcp", "mpi", "mpi-tcp"] and result["peers"] == ["mpi", "mpi-tcp"]
    for row in rows.values():
        _check_row_figures(row, 2)
    best = min(rows["mpi"]["time_s"], rows["mpi-tcp"]["time_s"])
    assert min(rows["mpi"]["time_vs_best_peer"], rows["mpi-tcp"]["time_vs_best_peer"]) == 1.0
    assert rows["ring-tcp"]["time_vs_best_peer"] == pytest.approx(rows["ring-tcp"]["time_s"] / best)


@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_bench_emulated_link_prints_the_model(tmp_path, capsys):
    """On an emulated link the table's model column is the alpha-beta prediction with the
    link's alpha and B; every printed figure is a positive, finite number, one row per size
    asked for, and the printed table and the JSON say the same."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "allreduce", "--world-size=3", "--sizes=12KB,24KB", "--reps=2",
               "--latency=1ms", "--bandwidth=1Gbit", "--transport=tcp", "--allreduce=ring",
               f"--json={out}"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "latency 1.00 ms" in printed
    result = json.loads(out.read_text())
    assert result["link"] == {"latency_s": 1e-3, "bandwidth_Bps": 125e6}
    assert result["peers"] == [], "an emulated link is not compared with the peers"
    if "gloo" in result["skipped_peers"]:  # asked for by default
        assert "peer gloo skipped: the link is emulated" in printed
    gamma = result["gamma_s_per_byte"]
    assert 0 < gamma < math.inf and 0 < result["p2p_bandwidth_Bps"] < math.inf
    rows = result["rows"]
    assert [r["size_bytes"] for r in rows] == [12_000, 24_000], "one row per size asked for"
    for row, fields in zip(rows, _table(printed, len(rows)), strict=True):
        size = row["size_bytes"]
        want = ring_allreduce_time(3, size, 1e-3, 125e6, gamma)
        assert row["predicted_s"] == want, f"{size} B: the model column is the alpha-beta model"
        assert row["algbw"] == pytest.approx(size / row["time_s"])
        assert row["busbw"] == pytest.approx(row["algbw"] * bus_factor(3))
        assert row["verified"] and row["wire_bytes"] > 0
        # row, size (2 fields), time ms, algbw, busbw, of mem, of TCP, of link, model ms,
        # verified, sent MB, t/peer ("-": no peer)
        assert len(fields) == 13 and fields[10] == "yes", f"a row of the table: {fields}"
        assert fields[0] == "ring-tcp" and fields[12] == "-", fields
        assert fields[8] == f"{row['busbw'] / 125e6:.0%}", "of link: busbw over the link's B"
        time_ms, algbw, busbw, model_ms, sent_mb = (float(fields[i]) for i in (3, 4, 5, 9, 11))
        for name, value in [("time ms", time_ms), ("model ms", model_ms), ("sent MB", sent_mb)]:
            assert 0 < value < math.inf, f"{size} B: {name} printed as {value}"
        assert 0 <= algbw < math.inf and 0 <= busbw < math.inf, fields
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
        (["--transport=tcp,rdma"], "--transport: unknown 'rdma'"),
        (["--peers=gloo,nccl"], "--peers: unknown 'nccl'"),
        (["--peers=mpi,mpi"], "--peers names mpi more than once"),
    ],
)
def test_bench_bad_input(argv, message, capsys):
    assert main(["bench", "allreduce", *argv]) == 2
    assert message in capsys.readouterr().err


def _not_measured(monkeypatch):
    """Fail the test if any row would be measured (the refusals must come first)."""
    from pipesgd_ref.commands import bench

    def measured(*_a, **_k):
        raise AssertionError("a row was measured before the refusal")

    monkeypatch.setattr(bench, "measure_machine", measured)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--allreduce=oneshot", "--transport=tcp", "--peers=none"],
         "bench allreduce has nothing to run, every row is skipped: oneshot-tcp (the shared"),
        (["--fit", "--world-size=1"], "--fit needs --world-size >= 2"),
        (["--fit", "--sizes=64KB"], "--fit needs at least 2 different --sizes"),
        (["--fit", "--codec=q8"], "--fit fits the plain links auto chooses over"),
        (["--fit", "--latency=1ms"], "--fit fits the plain links auto chooses over"),
        (["--fit={tmp}"], "--fit {tmp} is a folder; give a file path"),
        (["--fit={tmp}/file/models.json"], "--fit {tmp}/file/models.json: {tmp}/file is a file"),
        (["--fit={tmp}/bad.json"], "AllReduce models file {tmp}/bad.json is not JSON"),
        (["--fit={tmp}/m.json", "--allreduce=auto"],
         "--fit fits the rows of the algorithms auto chooses among (ring, rd, rab, oneshot, "
         "twoshot), and --allreduce auto runs none; leave --allreduce out"),
        (["--sizes=8KB,8000"], "--sizes 8KB,8000 names 8.0 KB more than once; give each size once"),
        (["--fit", "--comm=mpi"],
         "--fit fits the rows of local ranks, and --comm mpi times the ring over MPI alone; "
         "drop --fit"),
    ],
)  # fmt: skip
def test_bench_refuses_what_it_cannot_run_or_fit_before_measuring(
    argv, message, tmp_path, monkeypatch, capsys
):
    """Issue 41: every row skipped crashed in print_table; a --fit target that could not be
    written, or a malformed models file there, was found only after the whole measurement; a
    fit of one rank or one size was written silently (alpha = beta = 0). Each is one line,
    exit 2, before any rank starts."""
    (tmp_path / "file").write_text("")
    (tmp_path / "bad.json").write_text('{"models": ')
    _not_measured(monkeypatch)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["bench", "allreduce", "--sizes=4KB,64KB", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesgd: error: " + message.replace("{tmp}", str(tmp_path))), err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_fit_in_a_job_from_the_environment_is_refused_not_ignored(monkeypatch, capsys):
    for key, value in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert main(["bench", "allreduce", "--fit"]) == 2
    assert capsys.readouterr().err == (
        "pipesgd: error: --fit fits the rows of local ranks, and a rank of a job from the "
        "environment times one algorithm; drop --fit (a fit is made on one host: `pipesgd "
        "bench allreduce --fit`)\n"
    )


def test_fit_into_an_unwritable_home_is_one_line_before_measuring(tmp_path, monkeypatch, capsys):
    """--fit without a path writes under ~/.cache: a home that is a file, or one that cannot
    be written, is said before any rank starts."""
    from pipesgd_ref.commands import bench_command

    _not_measured(monkeypatch)
    monkeypatch.delenv("PIPESGD_ALLREDUCE_MODELS", raising=False)
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))
    argv = ["bench", "allreduce", "--sizes=4KB,64KB", "--fit"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{home}/.cache/pipesgd/allreduce_models.json: {home} is a file, not a folder" in err
    home.unlink()
    home.mkdir()
    real_access = os.access
    monkeypatch.setattr(  # root may write anywhere: the check is os.access
        bench_command.os, "access", lambda p, m: str(p) != str(home) and real_access(p, m)
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"pipesgd: error: --fit {home}/.cache/pipesgd/allreduce_models.json: {home} is not "
        f"writable; choose another path\n"
    )


@pytest.mark.slow
def test_a_fit_with_nothing_to_fit_says_so_and_keeps_the_json(tmp_path, monkeypatch, capsys):
    """Rows that do not sum correctly fit nothing: one line, the models file left as it was,
    the measurement in --json."""
    from pipesgd_ref.commands import bench

    real = bench.run_ring

    def wrong(*a, **k):
        return {**real(*a, **k), "verified": False}

    monkeypatch.setattr(bench, "run_ring", wrong)
    out, models = tmp_path / "bench.json", tmp_path / "models.json"
    argv = ["bench", "allreduce", "--world-size=2", "--sizes=4KB,8KB", "--reps=1",
            "--warmup=0", "--rounds=1", "--allreduce=ring", "--transport=tcp", "--peers=none",
            f"--fit={models}", f"--json={out}"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"pipesgd: error: --fit: nothing to fit (no row of ring-tcp summed correctly at 2 "
        f"sizes or more), so {models} is left as it was\n"
    )
    assert not models.exists() and len(json.loads(out.read_text())["rows"]) == 2


@pytest.mark.slow
def test_a_fit_that_fails_after_measuring_keeps_the_json(tmp_path, monkeypatch, capsys):
    """--json is written before the fit: a fit that cannot be written loses no measurement."""
    from pipesgd_ref.commands import bench_algorithms

    def broken(*_a, **_k):
        raise ConfigError("the disk filled up")

    monkeypatch.setattr(bench_algorithms, "write_fit", broken)
    out = tmp_path / "bench.json"
    argv = ["bench", "allreduce", "--world-size=2", "--sizes=4KB,8KB", "--reps=1",
            "--warmup=0", "--rounds=1", "--allreduce=ring", "--transport=tcp", "--peers=none",
            f"--fit={tmp_path / 'models.json'}", f"--json={out}"]  # fmt: skip
    assert main(argv) == 2
    assert "the disk filled up" in capsys.readouterr().err
    rows = json.loads(out.read_text())["rows"]
    assert [r["size_bytes"] for r in rows] == [4000, 8000] and all(r["verified"] for r in rows)


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


def test_a_killed_mpi_peers_folder_is_removed_at_the_next_start(tmp_path):
    """Issue 29 (18): SIGKILL of `bench --peers mpi` left /tmp/pipesgd-bench-mpi-* behind. Each
    folder is named after its bench's pid: the next mpi peer removes those whose bench is gone,
    and leaves a live bench's and anything else alone."""
    from pipesgd_ref.commands.bench_peers import MPI_TMP_PREFIX, remove_stale_folders

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{MPI_TMP_PREFIX}{gone.pid}-abc123"
    live = tmp_path / f"{MPI_TMP_PREFIX}{os.getpid()}-def456"
    old_style = tmp_path / f"{MPI_TMP_PREFIX}k2j4h5g6"  # no pid in its name: not ours to judge
    for d in (dead, live, old_style):
        d.mkdir()
        (d / "figures.json").write_text("{}")
    assert remove_stale_folders(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.is_dir() and old_style.is_dir()


@pytest.mark.slow  # about 20 s: two runs of six rows
def test_bench_rows_per_algorithm_fit_and_auto_picks_by_the_fit(tmp_path, monkeypatch, capsys):
    """One row per algorithm at each size, all verified; --fit writes each algorithm's (alpha,
    beta); a second run reads that file: auto's row ran the algorithm whose fitted model is
    fastest at that size, its * marks that row, and each row's model column is its model."""
    from pipesgd_ref.comm import choose

    models = tmp_path / "models.json"
    monkeypatch.setenv("PIPESGD_ALLREDUCE_MODELS", str(models))
    argv = ["bench", "allreduce", "--world-size=2", "--sizes=4KB,64KB", "--reps=2",
            "--peers=none", "--transport=auto"]  # fmt: skip
    assert main([*argv, "--fit", f"--json={tmp_path / 'a.json'}"]) == 0
    fitted = json.loads(models.read_text())["models"]["shm"]
    assert sorted(fitted) == ["oneshot", "rab", "rd", "ring", "twoshot"], fitted
    assert all(m["alpha"] >= 0 and m["beta"] >= 0 for m in fitted.values()), fitted
    assert f"wrote {models}" in capsys.readouterr().out
    out = tmp_path / "b.json"
    assert main([*argv, f"--json={out}"]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    names = ["ring-auto", "rd-auto", "rab-auto", "oneshot-auto", "twoshot-auto", "auto-auto"]
    assert [r["name"] for r in rows] == names * 2
    figures = choose.fitted("shm")
    for r in rows:
        assert r["verified"], r
        want = choose.pick(choose.candidates(True), 2, r["size_bytes"], figures)
        if r["name"] == "auto-auto":
            assert r["algorithm"] == want, f"{r['size_bytes']} B: auto ran {r['algorithm']}"
            assert f"auto-auto ({want})" in printed
        else:
            assert r["algorithm"] == r["name"].split("-")[0]
        model = choose.model_time(r["algorithm"], 2, r["size_bytes"], *figures[r["algorithm"]])
        assert r["model_s"] == pytest.approx(model), r
    marked = [line.split()[0] for line in printed.splitlines() if line.split()[1:2] == ["*"]]
    assert len(marked) == 2, f"one row marked per size: {marked}"


def test_a_joined_rank_runs_one_algorithm(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert main(["bench", "allreduce", "--allreduce=ring,rd"]) == 2
    assert "runs one algorithm; give one" in capsys.readouterr().err
