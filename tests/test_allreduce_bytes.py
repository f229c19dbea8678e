"""What each AllReduce algorithm is counted as sending, and what a training run says ran.

Every algorithm's bytes per rank (the communicator's tally, payload only) equal the cost
model's figure, comm/choose.py's `sent_volume` times the message bytes, when p is a power of two
and divides the message; at any p they equal what the rank's own schedule sends (the ring's
chunks, rd's and rab's send ranges, the group's piece and share). `Communicator.bytes_sent`
counts the same payload plus a 48-byte header per frame on links (heartbeats are headers
alone), and exactly the payload in the shared-memory group. `pipesgd train` names the algorithm
and transport that carried the gradients in summary.json and its last lines, never "auto".
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipesgd_ref.comm import algorithms, choose
from pipesgd_ref.comm.collectives import allreduce
from pipesgd_ref.comm.schedule import all_gather_chunks, chunk_bounds, reduce_scatter_chunks
from pipesgd_ref.comm.wire import HEADER
from pipesgd_ref.commands.cli import main
from pipesgd_ref.runtime.launch import launch_local

# Two jobs run every algorithm: one over tcp links with the mesh (ring, rd, rab), one on shared
# memory with the group (the ring's slot hop, oneshot, twoshot).
JOBS = {
    "links": dict(transport="tcp", allreduce="rd", algos=("ring", "rd", "rab")),
    "group": dict(transport="shm", allreduce="twoshot", algos=("ring", "oneshot", "twoshot")),
}


def _every_algorithm_job(comm, n: int, algos: tuple[str, ...]):
    """One float32 AllReduce of n elements by each of `algos`, then a float64 one (a control
    AllReduce: not the gradients'); per algorithm the change of comm.bytes_sent, and the
    tally of what ran."""
    deltas = {}
    for algo in algos:
        x = np.full(n, comm.rank + 1, np.float32)
        before = comm.bytes_sent
        allreduce(comm, x, algorithm=algo)
        deltas[algo] = comm.bytes_sent - before
        assert np.all(x == comm.world_size * (comm.world_size + 1) / 2), algo
    allreduce(comm, np.zeros(comm.world_size), algorithm="ring")
    return deltas, comm.allreduce_ran(), comm.allreduce_ran("float64")


def _run(p: int, n: int, job: str):
    kw = dict(JOBS[job])
    algos = kw.pop("algos")
    return launch_local(p, _every_algorithm_job, (n, algos), start_method="fork", timeout=10.0,
                        job_timeout=60.0, **kw)  # fmt: skip


def schedule_bytes(algo: str, rank: int, p: int, n: int, itemsize: int = 4) -> int:
    """The payload bytes `rank` sends in one AllReduce of n elements, from its schedule."""
    if algo == "ring":
        bounds = chunk_bounds(n, p)
        sent = [reduce_scatter_chunks(rank, s, p)[0] for s in range(p - 1)]
        sent += [all_gather_chunks(rank, s, p)[0] for s in range(p - 1)]
        elements = sum(bounds[c][1] - bounds[c][0] for c in sent)
    elif algo in algorithms.ALGORITHMS:
        hops = algorithms.schedule(algo, rank, p, n)
        elements = sum(h.send[1] - h.send[0] for h in hops if h is not None and h.send)
    else:  # the group: its piece into its slot; twoshot also its share of the sums
        s, e = chunk_bounds(n, p)[rank]
        elements = n + (e - s if algo == "twoshot" else 0)
    return elements * itemsize


def check_counts(p: int, n: int, formula: bool) -> None:
    """Run both jobs; check every rank's tally and bytes_sent for every algorithm."""
    nbytes = 4 * n
    for job, spec in JOBS.items():
        for rank, (deltas, ran, control) in enumerate(_run(p, n, job)):
            by_algo = {entry["algorithm"]: entry for entry in ran}
            assert sorted(by_algo) == sorted(spec["algos"]), ran
            for algo, entry in by_algo.items():
                where = f"rank {rank} of {p}, {algo} ({job})"
                assert (entry["bytes"], entry["calls"]) == (nbytes, 1), where
                assert entry["transport"] == spec["transport"], where
                assert entry["bytes_sent"] == schedule_bytes(algo, rank, p, n), where
                if formula:  # the cost model's figure, exactly
                    assert entry["bytes_sent"] == choose.sent_volume(algo, p) * nbytes, where
                headers = deltas[algo] - entry["bytes_sent"]
                if algo in ("oneshot", "twoshot"):
                    assert headers == 0, f"{where}: no frames in the group, {headers} B more"
                else:  # a header per frame (heartbeats: headers alone)
                    assert headers > 0 and headers % HEADER.size == 0, f"{where}: {headers}"
            assert [(c["algorithm"], c["bytes"]) for c in control] == [("ring", 8 * p)], control


@pytest.mark.timeout(120)
def test_bytes_sent_equal_the_cost_models_volume():
    """p = 4 (a power of two, no fold) and n a multiple of p: every rank's count is the
    formula's, for every algorithm."""
    check_counts(4, 1000, formula=True)


@pytest.mark.timeout(120)
def test_bytes_sent_follow_each_ranks_schedule_at_any_p():
    """p = 3 (rd and rab fold rank 0 into rank 1) and n = 1001, which p does not divide: the
    ranks send different amounts, each its own schedule's."""
    check_counts(3, 1001, formula=False)


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def _check_ran(summary: dict, algorithm: str | None, transport: str) -> dict:
    """The one entry of allreduce_ran: the algorithm and transport named, a call per step, and
    the formula's bytes (the tiny preset's 650 weights: p = 2 divides them)."""
    (entry,) = summary["allreduce_ran"]
    p = summary["world_size"]
    assert entry["algorithm"] in choose.NAMES and entry["algorithm"] != "auto", entry
    if algorithm is not None:
        assert entry["algorithm"] == algorithm, entry
    assert entry["transport"] == transport, entry
    assert entry["calls"] == summary["steps"], entry
    want = entry["calls"] * choose.sent_volume(entry["algorithm"], p) * entry["bytes"]
    assert entry["bytes_sent"] == want > 0, entry
    # everything rank 0 sent: the gradients' payload, plus the barrier and the headers
    assert summary["bytes_sent_per_rank"][0] >= entry["bytes_sent"], summary
    return entry


def test_train_names_the_allreduce_that_ran(tmp_path, capsys):
    """The default run (auto: one host's shared-memory group) names the algorithm auto chose;
    --allreduce ring --transport tcp names ring over tcp. Both on the first and last lines."""
    argv = ["train", "--preset=tiny", "--no-progress", "--steps=12"]
    assert main([*argv, f"--out={tmp_path / 'auto'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    entry = _check_ran(_summary(tmp_path / "auto"), None, "shm")
    assert "allreduce auto (chosen per message size" in lines[0], lines[0]
    assert any(f"reduced by {entry['algorithm']} over shm" in line for line in lines), lines

    assert main([*argv, "--allreduce=ring", "--transport=tcp", f"--out={tmp_path / 'tcp'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = _summary(tmp_path / "tcp")
    _check_ran(summary, "ring", "tcp")
    assert any("reduced by ring over tcp" in line for line in lines), lines
    # ring over tcp: the frames' headers and the rendezvous hello on top of the payload
    assert summary["bytes_sent_per_rank"][0] > summary["allreduce_ran"][0]["bytes_sent"]
