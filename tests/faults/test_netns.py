"""A real network between "hosts": 4 network namespaces joined by veth pairs and a bridge, each
rank in its own namespace with its own address, every link shaped by the kernel (tc: netem
delay and rate where the kernel has netem, else tbf rate). Ring AllReduce and `pipe` training
run across it, and their times must match, within TOLERANCE,

    the timing model of that network (docs/paper.md, section 3: timing.ring_allreduce_time,
    timing.predict), and
    the project's own link emulation of the same latency and bandwidth on loopback.

The network is benchmarks/netns_cluster.py's (read it for how each figure is obtained). It
needs root and iproute2, which CI has; elsewhere the tests skip and say why. The network is
torn down on every path (a fixture finalizer, registered before it is built); the whole file
takes 30-60 s on the shared 2-core machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import netns_cluster as nc  # noqa: E402  (a script beside the benchmarks, not in the package)

TOLERANCE = 0.15
WORLD_SIZE = 4
RATE_BPS = 100e6  # 100 Mbit/s: the wire dominates (see netns_cluster's docstring)
SIZES = [1_000_000, 4_000_000]  # 0.13 and 0.51 s of wire per AllReduce at 100 Mbit/s
REPS, WARMUP = 5, 1
JOB_TIMEOUT = 60.0  # s one job may take before it is killed (5-25 s on a loaded machine)


@pytest.fixture(scope="module")
def cluster(request):
    reason = nc.missing_requirements()
    if reason:
        pytest.skip(f"a real network of namespaces {reason}")
    nc.cleanup_leftovers()
    c = nc.NetnsCluster(WORLD_SIZE, RATE_BPS)
    request.addfinalizer(c.down)  # first: a build that fails half-way is removed too
    c.up()
    return c


@pytest.fixture(scope="module")
def allreduce(cluster):
    """(rows, network) of the AllReduce across the namespaces, modelled and emulated: once,
    for the tests below."""
    return nc.compare_allreduce(cluster, SIZES, REPS, WARMUP, JOB_TIMEOUT)


def explain(cluster, net) -> str:
    return (
        f"\nnetwork: {cluster.describe()}\nmodel: alpha {net.alpha * 1e6:.0f} us per hop, "
        f"B {net.bandwidth / 1e6:.2f} MB/s, gamma {net.gamma * 1e9:.2f} ns/B; emulated with "
        f"--latency {net.latency} --bandwidth {net.bandwidth:.0f}"
    )


@pytest.mark.slow
def test_allreduce_across_namespaces_matches_the_model(cluster, allreduce):
    rows, net = allreduce
    table = nc.format_table(rows) + explain(cluster, net)
    print(table)  # the figures, with -s or on failure
    for r in rows:
        assert abs(r.error) <= TOLERANCE, (
            f"ring AllReduce of {r.what} across {WORLD_SIZE} namespaces took "
            f"{r.measured_s * 1e3:.1f} ms, the model of the shaped network says "
            f"{r.model_s * 1e3:.1f} ms: {r.error:+.1%}, beyond +-{TOLERANCE:.0%}\n{table}"
        )


@pytest.mark.slow
def test_allreduce_across_namespaces_matches_the_emulation(cluster, allreduce):
    rows, net = allreduce
    table = nc.format_table(rows) + explain(cluster, net)
    for r in rows:
        assert abs(r.ratio - 1) <= TOLERANCE, (
            f"ring AllReduce of {r.what}: {r.measured_s * 1e3:.1f} ms across the namespaces, "
            f"{r.emulated_s * 1e3:.1f} ms on loopback with the project's emulation of the same "
            f"link (ratio {r.ratio:.3f}, beyond 1 +- {TOLERANCE:.0%})\n{table}"
        )


@pytest.mark.slow
def test_pipe_training_across_namespaces(cluster, allreduce):
    _, net = allreduce
    row, across, emulated = nc.compare_training(cluster, net, timeout=JOB_TIMEOUT)
    assert across["params_identical_on_all_ranks"], (
        "the 4 ranks across the namespaces ended with different weights"
    )
    table = nc.format_table([row]) + explain(cluster, net)
    print(table)
    assert abs(row.error) <= TOLERANCE, (
        f"`pipe` across the namespaces: iteration {row.measured_s * 1e3:.1f} ms, "
        f"timing.predict {row.model_s * 1e3:.1f} ms ({row.error:+.1%}, beyond "
        f"+-{TOLERANCE:.0%})\n{table}"
    )
    assert abs(row.ratio - 1) <= TOLERANCE, (
        f"`pipe`: iteration {row.measured_s * 1e3:.1f} ms across the namespaces, "
        f"{row.emulated_s * 1e3:.1f} ms on loopback with the project's emulation of the same "
        f"link (ratio {row.ratio:.3f}, beyond 1 +- {TOLERANCE:.0%})\n{table}"
    )
    # Same config, same deterministic schedule: the same weights whoever carries the bytes.
    assert across["final_train_loss"] == emulated["final_train_loss"], (
        f"final train loss {across['final_train_loss']!r} across the namespaces, "
        f"{emulated['final_train_loss']!r} emulated: the same run should give the same numbers"
    )


def test_skip_reason_is_stated_without_root(monkeypatch):
    """Where the tests above cannot run they say why (this one runs everywhere)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = nc.missing_requirements()
    assert reason and "root" in reason, f"expected a reason naming root, got {reason!r}"


def test_tcp_goodput_counts_headers_and_acks():
    # 1448 payload bytes per 1514-byte frame, plus half a 66-byte ACK: 100 Mbit/s -> 11.70 MB/s
    assert nc.tcp_goodput(100e6) == pytest.approx(100e6 / 8 * 1448 / (1514 + 33))
    assert nc.tcp_goodput(100e6, mtu=9000) > nc.tcp_goodput(100e6)
