"""`pipesgd compare --peers` (commands/compare_peers.py) where torch may be missing: the names,
the refusals, the one line that skips the peers without torch, and the peers' rows in
compare's table and checks (a stand-in peer: no torch, no processes). The torch peers
themselves: tests/test_torch_peer.py."""

import importlib.abc
import math
import sys

import pytest

from pipesgd_ref.commands import compare
from pipesgd_ref.commands.cli import main
from pipesgd_ref.commands.compare import format_table, run_compare
from pipesgd_ref.commands.compare_peers import available, peer_names, peer_note, peers_of
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.timing import Calibration
from pipesgd_ref.torch_peer import INSTALL, PEERS, torch_problem

CFG = TrainConfig.preset("compare").replace(
    hidden=(32,), bandwidth="inf", latency="0", world_size=2, steps=4, eval_every=2
)
RUNS = (("sync", "none"), ("ddp", "none"), ("pipe", "none"))


class HideTorch(importlib.abc.MetaPathFinder):
    """An import finder that finds no torch: `import torch` raises ImportError."""

    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None


@pytest.fixture
def no_torch(monkeypatch):
    """torch hidden from this process, as where it is not installed (whether or not it is)."""
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [HideTorch(), *sys.meta_path])


def test_peer_names():
    assert peer_names("torch") == ["torch-ddp", "torch-pipe"] == list(PEERS)
    assert peer_names("torch-pipe, torch-ddp") == ["torch-ddp", "torch-pipe"]
    assert peer_names("TORCH-PIPE") == ["torch-pipe"]
    assert peer_names(None) == peer_names("none") == peer_names("") == []
    with pytest.raises(ConfigError, match="unknown peer 'jax'.*torch, torch-ddp, torch-pipe"):
        peer_names("torch,jax")


def test_peers_are_refused_where_they_would_not_run():
    with pytest.raises(ConfigError, match="--study staleness"):
        peers_of("torch", "staleness", CFG)
    with pytest.raises(ConfigError, match="--comm mpi"):
        peers_of("torch", None, CFG.replace(comm="mpi"))
    assert peers_of(None, "staleness", CFG) == ()


def test_the_command_line_refuses_an_unknown_peer_in_one_line(capsys):
    assert main(["compare", "--quick", "--peers", "gloo"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown peer 'gloo'" in err, err


def test_without_torch_the_peers_are_skipped_in_one_line_saying_how_to_get_them(no_torch):
    problem = torch_problem()
    assert problem == f"torch is not installed; {INSTALL}"
    assert "pip install 'pipesgd_ref[torch]'" in problem  # the project's name (pyproject.toml)
    lines = []
    ran, skipped = available(["torch-ddp", "torch-pipe"], lines.append)
    assert ran == [] and skipped == {"torch-ddp": problem, "torch-pipe": problem}
    assert lines == [f"--peers: torch-ddp, torch-pipe skipped: {problem}"]
    assert available([], lines.append) == ([], {}) and len(lines) == 1, "no peers, no line"


@pytest.fixture(autouse=True)
def no_quiet_wait(monkeypatch):
    """compare's load windows without their second of sleep: nothing here is timed."""
    from pipesgd_ref.timing import load

    window = load.quiet_window
    monkeypatch.setattr(load, "quiet_window", lambda: window(0.0))


def calibration() -> Calibration:
    return Calibration(n_params=2410, t_comp=1e-3, t_update=1e-5, alpha=1e-4,
                       bandwidth=math.inf, gamma=1e-10, cores=2)  # fmt: skip


def fake_summary(algo: str, iter_ms: float, ttt: float | None = 0.5) -> dict:
    """What compare reads of a run's summary."""
    curve = [{"step": t, "wall_time_s": 0.01 * t, "loss": 1.0} for t in range(4)]
    return {
        "algo": algo, "iter_time_s": iter_ms / 1e3, "t_comp_s": iter_ms / 2e3,
        "time_to_target_s": ttt, "steps_to_target": 2 if ttt else None, "test_accuracy": 0.97,
        "comm_hidden_fraction": 0.5, "wall_time_s": 1.0, "loss_curve": curve,
        "eval_curve": [],
    }  # fmt: skip


def fake_train(cfg, progress, log, label):
    from types import SimpleNamespace

    return fake_summary(cfg.algo, {"sync": 40.0, "ddp": 30.0, "pipe": 20.0}[cfg.algo]), [
        SimpleNamespace(events=[])
    ]


def test_without_torch_compare_runs_on_with_no_peer_row(no_torch):
    lines = []
    report = run_compare(CFG, out=None, progress=False, log=lines.append, runs=RUNS,
                         calibration=calibration(), repeats=1, train=fake_train,
                         peers=("torch-ddp", "torch-pipe"))  # fmt: skip
    assert [r["run"] for r in report["table"]] == ["sync", "ddp", "pipe"]
    assert report["peers"]["ran"] == [] and set(report["peers"]["skipped"]) == set(PEERS)
    assert sum("skipped" in line and INSTALL in line for line in lines) == 1, lines


def test_a_peer_is_a_row_beside_ours_with_its_own_check(monkeypatch):
    """A stand-in peer: its row has no prediction (printed as -), our checks leave it out,
    and a line holds it against its counterpart (measured, not a bar)."""
    ran = []

    def peer_run(cfg, peer, out_dir, repeat):
        ran.append((peer, repeat))
        return fake_summary(peer, {"torch-ddp": 60.0, "torch-pipe": 50.0}[peer], None), []

    monkeypatch.setattr(compare, "available", lambda peers, log: (list(peers), {}))
    monkeypatch.setattr(compare, "run_peer_repeat", peer_run)
    monkeypatch.setattr(compare, "peer_note", lambda cfg, peers: "the peers' note")
    lines = []
    report = run_compare(CFG, out=None, progress=False, log=lines.append, runs=RUNS,
                         calibration=calibration(), repeats=2, train=fake_train,
                         peers=("torch-ddp", "torch-pipe"))  # fmt: skip
    assert ran == [("torch-ddp", 1), ("torch-pipe", 1), ("torch-ddp", 2), ("torch-pipe", 2)]
    rows = {r["run"]: r for r in report["table"]}
    assert list(rows) == ["sync", "ddp", "pipe", "torch-ddp", "torch-pipe"]
    peer = rows["torch-ddp"]
    assert peer["predicted_ms"] is None and peer["error"] is None and peer["t_comp_ms"] is None
    assert peer["iter_ms"] == pytest.approx(60.0)
    checks = {c["check"]: c for c in report["checks"]}
    assert "torch-ddp speedup over sync, measured vs predicted" not in checks
    assert checks["every run reaches the target"]["ok"], "a peer's miss is not ours"
    assert checks["ddp vs torch-ddp"]["iter_ratio"] == pytest.approx(2.0)
    assert checks["pipe vs torch-pipe"]["iter_ratio"] == pytest.approx(2.5)
    assert checks["pipe vs torch-pipe"]["ok"] is None
    table = format_table(report["table"], CFG)
    line = next(t for t in table.splitlines() if t.startswith("torch-pipe"))
    assert line.split()[1:4] == ["50.0", "-", "-"], line
    assert "the peers' note" in lines and report["peers"]["note"] == "the peers' note"


def test_the_note_says_when_the_peers_miss_the_emulated_link(monkeypatch):
    monkeypatch.setattr("pipesgd_ref.commands.compare_peers.torch_version", lambda: "9.9")
    plain = peer_note(CFG, ["torch-ddp"])
    assert "torch 9.9" in plain and "NOT the emulated link" not in plain
    emulated = peer_note(CFG.replace(latency="50us", bandwidth="1Gbit"), ["torch-ddp"])
    assert "NOT the emulated link" in emulated and "--latency 0 --bandwidth inf" in emulated
    assert peer_note(CFG, []) is None
