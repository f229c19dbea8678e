"""The parameter server's one link: emulated ps-sync iterations against timing.predict.

    python benchmarks/ps_link_model.py                 # 4 workers, 0.5 ms, 10 MB/s, MLP 64
    python benchmarks/ps_link_model.py --workers 2 --steps 8 --repeats 1   # a quick look

Trains ps-sync with each order of the server's pulls (--ps-pulls) on p + 1 local processes
whose links are emulated (--latency, --bandwidth), the server's p links sharing one wire each
way (comm/netem.py ServerNIC), and prints the steady-state median iteration beside the model
of timing.predict (methods/ps.py derives both):

    sequential   t_c + 2 alpha + (p + 1) M / B     the pulls leave one after another
    shared       t_c + 2 alpha + 2 p M / B         the pulls share the wire, then the pushes

t_c is the median compute span of the same run (so any sharing of the cores is in it), and the
calibration gives timing no core sharing of its own, no gamma and no t_u (a tiny model's sum
and update are microseconds); M = 4n, without the 48 header bytes of a frame (0.25% here).
Each configuration runs --repeats times and reports its fastest run (other load on the
machine only ever slows a run down). With p parallel links instead of one NIC the iteration
would be about t_c + 2 alpha + 2 M / B. Prints the table; --json FILE writes the rows.
Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pipesgd_ref import timing
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.ps import PULL_ORDERS
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.ps import ps_sync_worker
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.units import parse_bandwidth, parse_latency

WARMUP_STEPS = 2  # the first iterations pay the processes' start (first frames, caches)


def measure(cfg: TrainConfig, p: int, link: LinkSpec) -> tuple[float, float, int]:
    """(median iteration s, median compute span s, n_params) of one emulated ps-sync run."""
    results = launch_local(p + 1, ps_sync_worker, (cfg,), start_method="fork", star=True,
                           link=link, timeout=10, job_timeout=120)  # fmt: skip
    server = results[0]
    iteration = float(np.median(np.diff(server.step_end[WARMUP_STEPS:])))
    spans = [e["dur"] for r in results for e in r.events if e["name"] == "compute"]
    return iteration, float(np.median(spans)) / 1e6, server.params.size


def predicted(n_params: int, t_comp: float, p: int, link: LinkSpec, pulls: str):
    """timing.predict's ps-sync iteration on this link, with this run's t_c (a Prediction)."""
    cal = timing.Calibration(n_params=n_params, t_comp=t_comp, t_update=0.0,
                             alpha=link.latency, bandwidth=link.bandwidth, gamma=0.0,
                             cores=10**9)  # fmt: skip
    return timing.predict("ps-sync", p, cal, ps_pulls=pulls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4, help="p (the job runs p + 1 processes)")
    ap.add_argument("--latency", default="0.5ms")
    ap.add_argument("--bandwidth", default="10MB")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=64, help="the MLP's hidden width")
    ap.add_argument("--repeats", type=int, default=2, help="runs per order; the fastest counts")
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    if args.steps < WARMUP_STEPS + 2 or args.repeats < 1 or args.workers < 1:
        ap.error(f"--steps must be at least {WARMUP_STEPS + 2}, --repeats and --workers >= 1")
    p = args.workers
    latency, bandwidth = parse_latency(args.latency), parse_bandwidth(args.bandwidth)
    link = LinkSpec(latency=latency, bandwidth=bandwidth)
    base = TrainConfig.preset("tiny").replace(steps=args.steps, model="mlp",
                                              hidden=(args.hidden,))  # fmt: skip
    print(f"ps-sync, {p} workers, link {link}, {args.steps} steps, fastest of {args.repeats}")
    print(f"{'pulls':>10} {'measured ms':>12} {'t_c ms':>8} {'predicted ms':>13} {'error':>7}")
    rows = []
    for pulls in PULL_ORDERS:
        cfg = base.replace(ps_pulls=pulls)
        runs = [measure(cfg, p, link) for _ in range(args.repeats)]
        iteration, t_comp, n_params = min(runs)
        pred = predicted(n_params, t_comp, p, link, pulls)
        error = pred.iter_time_s / iteration - 1
        rows.append({"pulls": pulls, "world_size": p, "n_params": n_params,
                     "latency_s": link.latency, "bandwidth": link.bandwidth,
                     "measured_s": iteration, "measured_all_s": [r[0] for r in runs],
                     "t_comp_s": t_comp, "predicted_s": pred.iter_time_s,
                     "bound": pred.bound, "error": error})  # fmt: skip
        print(f"{pulls:>10} {iteration * 1e3:12.2f} {t_comp * 1e3:8.2f} "
              f"{pred.iter_time_s * 1e3:13.2f} {error * 100:+6.1f}%", flush=True)  # fmt: skip
    worst = max(abs(r["error"]) for r in rows)
    print(f"M = {4 * rows[0]['n_params']} bytes; worst |error| {worst * 100:.1f}%")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
