"""`pipesgd predict` (pipesgd_ref/commands/predict.py): its table, sweeps, answers, files and
errors.

The command is driven through its own parser (add_parser on a fresh subparsers object), as the
CLI drives it. Most tests give --params and --t-comp, so nothing but a few per-byte costs is
timed (well under a second); one times a model, one calibrates on this machine.
"""

from __future__ import annotations

import argparse
import json
import re

import pytest

from pipesgd_ref import timing
from pipesgd_ref.commands import predict as predict_cmd
from pipesgd_ref.commands.predict_scenario import parse_codecs, parse_count
from pipesgd_ref.commands.predict_sweep import PAYS, crossings
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.timing import COMPARE_RUNS, Calibration

LABELS = [timing.run_label(algo, codec) for algo, codec in COMPARE_RUNS]
FAST = ["--params", "1M", "--t-comp", "50ms"]  # 4 MB of gradient, nothing to time but bytes


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pipesgd")
    sub = parser.add_subparsers(dest="command", required=True)
    predict_cmd.add_parser(sub)
    return parser.parse_args(["predict", *argv])


def run(argv: list[str], capsys) -> str:
    rc = predict_cmd.cmd_predict(parse(argv))
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


def table_rows(out: str) -> dict[str, list[str]]:
    """{label: cells} of the first table (between its dashes and the blank line after)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line) == {"-"}) + 1
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        rows[line.split()[0]] = line.split()
    return rows


def sweep_rows(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("sweep of"))
    dashes = next(i for i in range(start, len(lines)) if set(lines[i]) == {"-"})
    rows = []
    for line in lines[dashes + 1 :]:
        if not line.strip():
            break
        rows.append(line)
    return rows


# --- one prediction --------------------------------------------------------------------------


def test_prints_every_run_with_its_parts(capsys):
    out = run(FAST, capsys)
    rows = table_rows(out)
    assert list(rows) == LABELS, f"runs in the table: {list(rows)}"
    assert "1,000,000 parameters" in out and "M = 4.0 MB" in out
    assert "a cluster: each worker its own machine of 1 core" in out
    for label in LABELS:
        assert rows[label][-1].endswith("x"), rows[label]
    assert rows["ps-sync"][-1] == "1.00x"
    assert "pipe over sync:" in out and "ps-sync vs sync:" in out


def test_speedups_match_the_models(tmp_path, capsys):
    path = tmp_path / "p.json"
    out = run([*FAST, "--world-size", "8", "--bandwidth", "10Gbit", "--json", str(path)], capsys)
    assert f"wrote {path}" in out
    payload = json.loads(path.read_text())
    assert payload["world_size"] == 8 and payload["mode"] == "cluster"
    cal = Calibration.from_dict(payload["calibration"])
    assert cal.n_params == 10**6 and cal.t_comp == 0.05 and cal.bandwidth == 1.25e9
    assert cal.cores == 8, "a cluster of one-core workers: cores = p"
    preds = timing.predict_all(8, cal)
    base = preds["ps-sync"].iter_time_s
    for label, pred in preds.items():
        got = payload["runs"][label]
        assert got["iter_time_s"] == pytest.approx(pred.iter_time_s, rel=1e-12), label
        assert got["speedup_vs_ps-sync"] == pytest.approx(base / pred.iter_time_s), label
        printed = float(table_rows(out)[label][-1].rstrip("x"))
        assert printed == pytest.approx(base / pred.iter_time_s, abs=0.006), label


def test_network_flags_reach_the_calibration(tmp_path, capsys):
    path = tmp_path / "p.json"
    argv = [*FAST, "--latency", "1ms", "--hop-cost", "20us", "--bandwidth", "125MB/s"]
    run([*argv, "--cores-per-worker", "2", "--json", str(path)], capsys)
    cal = json.loads(path.read_text())["calibration"]
    assert cal["alpha"] == pytest.approx(1.02e-3) and cal["bandwidth"] == 125e6
    assert cal["cores"] == 8, "4 workers of 2 cores each"


def test_codecs_choose_the_compressed_runs(capsys):
    assert list(table_rows(run([*FAST, "--codecs", "bf16"], capsys))) == [
        "ps-sync",
        "ps-async",
        "sync",
        "ddp",
        "pipe",
        "pipe+bf16",
    ]
    assert list(table_rows(run([*FAST, "--codecs", "none"], capsys))) == LABELS[:5]


def test_overrides_of_the_measured_times(tmp_path, capsys):
    path = tmp_path / "p.json"
    run(["--model", "softmax", "--t-comp", "7ms", "--t-update", "1ms", "--json", str(path)], capsys)
    cal = json.loads(path.read_text())["calibration"]
    assert cal["n_params"] == 650, "softmax on digits: 64 x 10 weights + 10 biases"
    assert (cal["t_comp"], cal["t_update"]) == (7e-3, 1e-3)
    assert cal["source"]["t_comp"] == "--t-comp 7ms"


def test_a_model_is_timed_here(capsys):
    out = run(["--model", "mlp", "--hidden", "32", "--batch-size", "16"], capsys)
    assert "mlp 32 on digits, batch 16 per worker (2,410 parameters)" in out
    assert list(table_rows(out)) == LABELS


@pytest.mark.slow
def test_this_machine_calibrates_here(tmp_path, capsys):
    """--this-machine starts p = 2 processes (a few seconds)."""
    path = tmp_path / "p.json"
    argv = ["--this-machine", "--world-size", "2", "--model", "softmax", "--json", str(path)]
    out = run(argv, capsys)
    assert "this machine:" in out and "shared by 2 worker processes" in out
    payload = json.loads(path.read_text())
    assert payload["mode"] == "this-machine"
    cal = payload["calibration"]
    assert len(cal["t_comp_shared"]) == 2 and cal["alpha"] >= 50e-6
    assert len(cal["t_comp_lockstep"]) == 2, "the slowest rank of each step, same launches"
    assert all(s <= w for s, w in zip(cal["t_comp_shared"], cal["t_comp_lockstep"], strict=True))
    assert payload["network"]["hop_s"] == pytest.approx(cal["alpha"] - 50e-6)


# --- sweeps ----------------------------------------------------------------------------------


def test_bandwidth_sweep_rows_and_answers(tmp_path, capsys):
    path = tmp_path / "s.json"
    out = run([*FAST, "--sweep", "bandwidth=100Mbit..100Gbit", "--json", str(path)], capsys)
    rows = sweep_rows(out)
    assert len(rows) == 13, "\n".join(rows)
    assert rows[0].startswith("100 Mbit/s") and rows[-1].startswith("100 Gbit/s")
    assert rows[4].startswith("1 Gbit/s"), "geomspace's 999.99.. Mbit/s reads as 1 Gbit/s"
    header = out.splitlines()[out.splitlines().index(rows[0]) - 2]
    assert header.split() == ["bandwidth", *LABELS, "pipe/sync", "pipe/ddp"]
    assert "where does pipelining stop paying? pipelining stops paying at bandwidth" in out
    assert "where does PS fall behind?" in out

    # the answer is where the models say: pipe under 1.1x faster at stops_at, over just below
    sweep = json.loads(path.read_text())["sweep"]
    assert sweep["key"] == "bandwidth" and len(sweep["values"]) == 13
    assert all(len(times) == 13 for times in sweep["iter_time_s"].values())
    stops = sweep["answers"]["pipelining"]["stops_at"]
    cal = Calibration.from_dict(json.loads(path.read_text())["calibration"])

    def gain(bandwidth: float) -> float:
        c = cal.with_network(bandwidth=bandwidth)
        return timing.predict("sync", 4, c).iter_time_s / timing.predict("pipe", 4, c).iter_time_s

    assert gain(stops) < PAYS <= gain(stops * (1 - 1e-9)), f"stops_at {stops}"
    assert f"{stops * 8 / 1e9:.3g} Gbit/s" in out


def test_bandwidth_sweep_says_where_pipe_stops_beating_ddp(tmp_path, capsys):
    path = tmp_path / "s.json"
    argv = [*FAST, "--bucket-size", "1MB", "--sweep", "bandwidth=100Mbit..100Gbit"]
    out = run([*argv, "--json", str(path)], capsys)
    assert "pipe over ddp (buckets of 1.0 MB, all-reduced during the backward):" in out
    assert "where does Pipe-SGD stop beating ddp? Pipe-SGD stops beating ddp at bandwidth" in out
    payload = json.loads(path.read_text())
    assert payload["bucket_size"] == 1_000_000
    answer = payload["sweep"]["answers"]["ddp"]
    cal = Calibration.from_dict(payload["calibration"])
    assert cal.backward_units == (), "--params: the backward's profile is assumed"

    def gain(bandwidth: float) -> float:
        c = cal.with_network(bandwidth=bandwidth)
        ddp = timing.predict("ddp", 4, c, bucket_size=1_000_000).iter_time_s
        return ddp / timing.predict("pipe", 4, c).iter_time_s

    stops = answer["stops_at"]
    assert gain(stops) < PAYS <= gain(stops * (1 - 1e-9)), f"stops_at {stops}"
    # the pipe/ddp column is that gain at each row
    rows = sweep_rows(out)
    for v, row in zip(payload["sweep"]["values"], rows, strict=True):
        assert float(row.split()[-1].rstrip("x")) == pytest.approx(gain(v), abs=0.006)


def test_a_timed_model_predicts_ddp_from_its_measured_backward(tmp_path, capsys):
    path = tmp_path / "p.json"
    run(["--model", "mlp", "--hidden", "32,64", "--batch-size", "16", "--json", str(path)], capsys)
    units = Calibration.from_dict(json.loads(path.read_text())["calibration"]).backward_units
    assert [b for b, _ in units] == [(64 * 10 + 10) * 4, (32 * 64 + 64) * 4, (64 * 32 + 32) * 4]
    fractions = [f for _, f in units]
    assert all(0 < f <= 1 for f in fractions) and fractions == sorted(fractions)


def test_world_size_sweep(tmp_path, capsys):
    out = run([*FAST, "--sweep", "world_size=2..64", "--out", str(tmp_path)], capsys)
    rows = sweep_rows(out)
    assert [int(r.split()[0]) for r in rows] == [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert "where does PS fall behind? ps-sync is behind sync over the whole sweep" in out
    payload = json.loads((tmp_path / "predict.json").read_text())
    # a cluster grows its cores with its workers: no sharing at p = 64 either
    t64 = payload["sweep"]["iter_time_s"]["sync"][-1]
    cal = Calibration.from_dict({**payload["calibration"], "cores": 64})
    assert t64 == pytest.approx(timing.predict("sync", 64, cal).iter_time_s, rel=1e-12)


def test_latency_sweep_finds_where_ps_gets_ahead(capsys):
    # a tiny gradient: latency is all, and the ring pays 2(p-1) of it to PS's 2
    argv = ["--params", "1000", "--t-comp", "1ms", "--world-size", "16"]
    out = run([*argv, "--sweep", "latency=1us..10ms"], capsys)
    assert len(sweep_rows(out)) == 13
    match = re.search(r"ps-sync falls behind sync \(slower\) below latency ([\d.]+ \w+)", out)
    assert match, out


def test_plot_is_written(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "fig" / "sweep.png"
    out = run([*FAST, "--sweep", "latency=10us..1ms", "--plot", str(png)], capsys)
    assert png.stat().st_size > 1000 and f"figure: {png}" in out
    out = run([*FAST, "--sweep", "world_size=2..8", "--out", str(tmp_path)], capsys)
    assert (tmp_path / "predict_sweep.png").stat().st_size > 1000
    assert (tmp_path / "predict.json").is_file()


def test_no_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    import pipesgd_ref.plots

    monkeypatch.setattr(pipesgd_ref.plots, "pyplot", lambda: None)
    rc = predict_cmd.cmd_predict(
        parse([*FAST, "--sweep", "world_size=2..4", "--out", str(tmp_path)])
    )
    assert rc == 0
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "predict_sweep.png").exists() and (tmp_path / "predict.json").exists()


# --- the helpers -----------------------------------------------------------------------------


def test_crossings_bisect_to_the_change():
    # f(v) = v crosses 3 between 2 and 4: on floats at 3 (to 1e-12), on integers at 3
    [(v, state)] = crossings(lambda v: v, [1.0, 2.0, 4.0, 8.0], 3.0)
    assert v == pytest.approx(3.0, rel=1e-9) and state is True
    assert crossings(lambda v: v, [1, 2, 4, 8], 3.0, integer=True) == [(3.0, True)]

    # down, then up again: 1/v falls under 0.3 past 3.33 (first integer 4), v/20 reaches it at 6
    def f(v):
        return max(1 / v, v / 20)

    changes = crossings(f, [1, 2, 4, 8, 16], 0.3, integer=True)
    assert changes == [(4.0, False), (6.0, True)]
    assert crossings(lambda v: 5.0, [1.0, 10.0], 3.0) == []


@pytest.mark.parametrize(
    "text, n",
    [("300000", 300_000), ("300_000", 300_000), ("3e5", 300_000), ("25M", 25_000_000),
     ("300k", 300_000), ("1.5G", 1_500_000_000), ("1", 1)],
)  # fmt: skip
def test_parse_count(text, n):
    assert parse_count(text) == n


@pytest.mark.parametrize("text", ["abc", "0", "-5", "1.5", "2.5K5", "inf", "nan", "", "M"])
def test_parse_count_rejects(text):
    with pytest.raises(ConfigError, match="--params expects a whole parameter count >= 1"):
        parse_count(text)


@pytest.mark.parametrize("text", ["1e30", "2e13", "100000G"])
def test_parse_count_refuses_more_than_any_model(text):
    """--params 1e30 once printed 10^23 s without a word (issue 29, 17)."""
    with pytest.raises(ConfigError, match=f"--params {text}: more than 1e\\+13 parameters"):
        parse_count(text)
    assert parse_count("1e13") == 10**13


def test_parse_codecs():
    assert parse_codecs("trunc16,q8") == ("trunc16", "q8")
    assert parse_codecs(" q8 , q8,bf16") == ("q8", "bf16")
    assert parse_codecs("none") == parse_codecs("") == ()


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*FAST, "--codecs", "trunc16,fp8"], "unknown codec 'fp8' in --codecs"),
        ([*FAST, "--world-size", "0"], "--world-size must be >= 1"),
        ([*FAST, "--width", "0"], "--width must be >= 1"),
        ([*FAST, "--cores-per-worker", "0"], "--cores-per-worker must be >= 1"),
        ([*FAST, "--bandwidth", "fast"], "--bandwidth: cannot read 'fast': expected a bandwidth"),
        ([*FAST, "--bandwidth", "1Gb"], "write Gbit for bits or GB for bytes"),
        ([*FAST, "--latency=-1ms"], "--latency: latency must be finite and >= 0"),
        ([*FAST, "--hop-cost", "soon"], "--hop-cost: cannot read 'soon'"),
        (["--params", "25M"], "--params needs --t-comp"),
        (["--params", "25M", "--t-comp", "0"], "--t-comp must be > 0"),
        (["--params", "lots", "--t-comp", "1ms"], "--params expects a whole parameter count"),
        ([*FAST, "--hidden", "512"], "--params replaces the model: drop --hidden"),
        ([*FAST, "--this-machine"], "drop --this-machine, or give --model/--hidden"),
        (["--this-machine", "--cores-per-worker", "2"], "--cores-per-worker describes a cluster"),
        ([*FAST, "--sweep", "speed=1..2"], "--sweep: cannot sweep 'speed'"),
        ([*FAST, "--sweep", "world_size=8..2"], "1 <= LOW < HIGH"),
        ([*FAST, "--plot", "x.png"], "--plot draws a sweep: add --sweep"),
        ([*FAST, "--bucket-size", "32 bananas"], "--bucket-size: unknown size unit"),
        (["--model", "vgg"], "model must be one of softmax, mlp, cnn, resnet, got 'vgg'"),
        (["--hidden", "512,abc"], "expects a comma-separated list of integers"),
        (["--batch-size", "100000"], "cannot build the model to time it"),
    ],
)
def test_bad_input_says_what_to_do(argv, message):
    with pytest.raises(ConfigError) as info:
        predict_cmd.cmd_predict(parse(argv))
    assert message in str(info.value), f"{argv}: {info.value}"


def test_every_flag_has_help():
    parser = argparse.ArgumentParser(prog="pipesgd")
    p = predict_cmd.add_parser(parser.add_subparsers())
    for action in p._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_ps_pulls_shared_predicts_the_conventional_server(capsys):
    """--ps-pulls shared: all p pulls share the server's link, 2 p M / B a round instead of
    (p + 1) M / B; only ps-sync changes."""
    base = ["--world-size", "4", "--bandwidth", "1Gbit", "--latency", "0", *FAST]
    sequential = table_rows(run(base, capsys))
    shared = table_rows(run([*base, "--ps-pulls", "shared"], capsys))
    ms = lambda cells: float(cells[1])  # noqa: E731 - "447.85 ms": the iteration time column
    # 4 MB at 125 MB/s = 32 ms per message: (p + 1) = 5 of them against 2p = 8
    assert ms(shared["ps-sync"]) - ms(sequential["ps-sync"]) == pytest.approx(3 * 32, abs=2)
    for label in LABELS[1:]:  # (gamma and the codecs are timed anew by each call)
        assert ms(shared[label]) == pytest.approx(ms(sequential[label]), rel=0.05), label
