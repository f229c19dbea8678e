"""Pipe-SGD against synchronous AllReduce SGD: iteration time over a sweep of emulated links.

    python benchmarks/pipeline_speedup.py        # 4 workers, MLP 256-2048-1024-10, batch 512
    python benchmarks/pipeline_speedup.py --steps 30 --bandwidths 1Gbit,5Gbit

For each bandwidth it trains both methods for a few steps (same seed, same data) on 4 local
worker processes whose links are emulated (--latency, 100 us by default, and the given
bandwidth), and prints the steady-state median iteration time of each, their ratio, pipe's
comm_hidden_fraction, and the alpha-beta expectation: sync = t_comp + T_ring, pipe =
max(t_comp, T_ring) (equations (3) and (4) of docs/paper.md), with t_comp measured in the
sync run and T_ring from the formula. Where T_ring is about t_comp, the pipe/sync ratio
approaches its limit of 0.5.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.units import parse_bandwidth, parse_latency


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidths", default="100Mbit,300Mbit,600Mbit,1Gbit,3Gbit,10Gbit")
    ap.add_argument("--latency", default="100us")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--hidden", default="2048,1024")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    base = TrainConfig(
        dataset="synthetic:samples=8192,features=256,classes=10",
        model="mlp", hidden=tuple(int(h) for h in args.hidden.split(",")),
        world_size=args.world_size, batch_size=args.batch_size, lr=0.05, steps=args.steps,
        latency=args.latency, eval_every=0,
    )  # fmt: skip
    rows = []
    quiet = lambda *_: None  # noqa: E731
    print(f"{'bandwidth':>10} {'T_ring ms':>10} {'t_comp ms':>10} {'sync ms':>9} {'pipe ms':>9} "
          f"{'pipe/sync':>10} {'model':>7} {'hidden':>7}")  # fmt: skip
    for text in args.bandwidths.split(","):
        bandwidth = parse_bandwidth(text)
        results = {}
        for algo in ("sync", "pipe"):
            cfg = base.replace(algo=algo, bandwidth=text)
            results[algo], worker_results = run_training(cfg, progress=False, log=quiet)
        p = base.world_size
        n_params = worker_results[0].params.size
        M = 4 * n_params
        t_ring = ring_allreduce_time(p, M, parse_latency(args.latency), bandwidth)
        t_comp = results["sync"]["t_comp_s"]
        sync_ms, pipe_ms = (
            results["sync"]["iter_time_s"] * 1e3,
            results["pipe"]["iter_time_s"] * 1e3,
        )
        model_ratio = max(t_comp, t_ring) / (t_comp + t_ring)
        hidden = results["pipe"]["comm_hidden_fraction"]
        rows.append({"bandwidth": text, "n_params": n_params, "t_ring_s": t_ring,
                     "t_comp_s": t_comp, "sync_iter_s": sync_ms / 1e3, "pipe_iter_s": pipe_ms / 1e3,
                     "ratio": pipe_ms / sync_ms, "model_ratio": model_ratio,
                     "comm_hidden_fraction": hidden})  # fmt: skip
        line = f"{text:>10} {t_ring * 1e3:10.1f} {t_comp * 1e3:10.1f} {sync_ms:9.1f} "
        line += f"{pipe_ms:9.1f} {pipe_ms / sync_ms:10.2f} {model_ratio:7.2f} {hidden:7.2f}"
        print(line, flush=True)
    print(f"{n_params} parameters ({M / 1e6:.1f} MB of gradient), {p} workers, latency "
          f"{args.latency}, {args.steps} steps each")  # fmt: skip
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
