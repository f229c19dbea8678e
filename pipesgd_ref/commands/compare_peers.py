"""`pipesgd compare --peers torch`: PyTorch's DDP, and Pipe-SGD as a DDP hook, as rows of
compare's table beside the package's methods, measured in the same run.

    --peers torch               both rows: torch-ddp and torch-pipe
    --peers torch-ddp           one of them (a comma list names several)
    --peers none                none (the default)

Each peer trains the comparison's problem (the same model, initial weights, shards,
minibatches, batch, lr schedule, optimiser, steps and world size) in gloo ranks started as the
package's workers are, once per repeat, in the same passes as the package's methods
(torch_peer/ says how). Its row has no prediction (the timing model is the package's) and its
traffic does not pass through compare's emulated link: with --latency or --bandwidth the
table says so under it, and `--latency 0 --bandwidth inf` compares like with like.

Why compare, and not a `bench train`: compare is where the package already trains one problem
every way, in turns, with time to target and the test accuracy beside the iteration; a peer
there is one more row of the same table and of compare.json. `bench allreduce --peers gloo`
keeps timing torch's AllReduce alone.

Without torch the peers are skipped in one line that says how to install it; compare runs on.
torch is imported only by the peers' own ranks and by `torch_problem`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.outputs import write_json
from pipesgd_ref.torch_peer import PEERS, torch_problem

GROUPS = {"torch": PEERS}  # a name that stands for several peers
PAIRS = {"torch-ddp": "ddp", "torch-pipe": "pipe"}  # each peer's counterpart among our runs


def peer_names(text: str | None) -> list[str]:
    """--peers as a list of peers in PEERS' order; ConfigError for an unknown name."""
    if text is None or text.strip().lower() in ("", "none"):
        return []
    asked: set[str] = set()
    for name in (part.strip().lower() for part in text.split(",")):
        if name in GROUPS:
            asked.update(GROUPS[name])
        elif name in PEERS:
            asked.add(name)
        else:
            known = ", ".join([*GROUPS, *PEERS, "none"])
            raise ConfigError(f"--peers {text!r}: unknown peer {name!r}; use one of {known}")
    return [p for p in PEERS if p in asked]


def peers_of(text: str | None, study: str | None, cfg: TrainConfig) -> tuple[str, ...]:
    """compare's --peers, refused where its rows would not run: under --study, whose oracles
    time nothing, and under --comm mpi, whose ranks mpirun starts."""
    peers = tuple(peer_names(text))
    if peers and (study is not None or cfg.comm == "mpi"):
        flag = "--study staleness" if study is not None else "--comm mpi"
        raise ConfigError(
            f"--peers {text}: the peers train in local gloo ranks beside compare's own runs, "
            f"which {flag} does not make; drop --peers, or {flag}"
        )
    return peers


def available(peers: list[str], log: Callable[[str], None]) -> tuple[list[str], dict]:
    """(the peers that can run here, {peer: why not} for the others), the skip said in one
    line."""
    if not peers:
        return [], {}
    problem = torch_problem()
    if problem is None:
        return list(peers), {}
    log(f"--peers: {', '.join(peers)} skipped: {problem}")
    return [], {p: problem for p in peers}


def run_peer_repeat(
    cfg: TrainConfig, peer: str, out_dir: Path | None, repeat: int | None
) -> tuple[dict, list]:
    """One run of `peer`: its summary (written as out/PEER[/repeat-K]/summary.json) and, as
    the package's runs give their trace events, an empty list (the peers record none)."""
    from pipesgd_ref.torch_peer.ranks import run_peer

    summary, _ = run_peer(cfg, peer)
    if out_dir is not None:
        folder = out_dir / peer / (f"repeat-{repeat}" if repeat is not None else "")
        write_json(folder / "summary.json", summary)
    return summary, []


def peer_checks(rows: list[dict]) -> list[dict]:
    """Each peer against its counterpart among our runs (torch-ddp against ddp, torch-pipe
    against pipe), per iteration and in time to target: figures to read, not bars (ok None)."""
    by = {r["run"]: r for r in rows}
    out = []
    for peer, ours in PAIRS.items():
        if peer not in by or ours not in by:
            continue
        a, b = by[ours], by[peer]
        ratio = b["iter_ms"] / a["iter_ms"]
        ta, tb = a["time_to_target_s"], b["time_to_target_s"]
        sooner = tb / ta if ta and tb else None
        then = f", {sooner:.2f}x its time to the target" if sooner is not None else ""
        text = (
            f"{ours} iterates in {a['iter_ms']:.1f} ms, {peer} in {b['iter_ms']:.1f} ms: "
            f"{ratio:.2f}x {ours}'s time per iteration{then}; test accuracy "
            f"{a['test_accuracy']:.4f} against {b['test_accuracy']:.4f} (measured, not a bar)"
        )
        check = {"check": f"{ours} vs {peer}", "iter_ratio": ratio, "ratio": sooner}
        out.append({**check, "ok": None, "text": text})
    return out


def peer_note(cfg: TrainConfig, peers: list[str]) -> str | None:
    """The line under the table where a peer ran: what its rows are, and on which wire."""
    from pipesgd_ref.comm.netem import link_of

    if not peers:
        return None
    line = (
        f"{', '.join(peers)}: torch {torch_version()} DistributedDataParallel (gloo, CPU, one "
        f"thread a rank, buckets of {cfg.bucket_size}), torch-pipe with the Pipe-SGD hook of "
        f"pipesgd_ref/torch_peer/hook.py; no prediction (the timing model is ours)"
    )
    if cfg.compensation != "none":
        line += f"; torch-pipe runs without --compensation {cfg.compensation}"
    link = link_of(cfg)
    if not link.enabled:
        return line
    return (
        f"{line}; their traffic is gloo's over loopback TCP, NOT the emulated link ({link}) "
        f"that our rows run on: for like with like, add --latency 0 --bandwidth inf"
    )


def torch_version() -> str:
    import torch

    return torch.__version__
