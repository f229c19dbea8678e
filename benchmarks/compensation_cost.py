"""What each staleness compensation costs per step, measured against the timing model's charge.

    python benchmarks/compensation_cost.py [--hidden 1024,1024] [--batch-size 352]

On the compare preset's model (default) and one worker's batch, times (median of repeats) in
this process:
- the step itself: a worker's loss_and_grad and the SGD update (t_comp + t_u);
- each compensation's own work per step: the calls pipe_worker makes on pipe.py's
  `PipeCompensation` in a step with one step in flight (width 2): for dc and dc-adaptive the copy
  of w_t and `DelayCompensation.correct`, for predict the copy of this worker's gradient and
  `predicted_weights`;
and prints each as milliseconds and as a share of the step, beside what the timing model
charges (timing.compensation_passes x gamma x M, gamma timed here with np.add). Memory: the
extra vectors of n float32 each keeps. Prints the table and nothing else.
"""

from __future__ import annotations

import argparse

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.compensation import PipeCompensation
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import compensation_passes
from pipesgd_ref.timing.measure import median_time, time_gamma_and_copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="1024,1024")
    ap.add_argument("--batch-size", type=int, default=352)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    cfg = TrainConfig.preset("compare").replace(hidden=args.hidden, batch_size=args.batch_size)
    worker = Worker.build(cfg, 0, cfg.world_size)
    w = worker.params
    g = np.empty_like(w)
    worker.loss_and_grad(0, g)
    n = w.size

    def step() -> None:
        worker.loss_and_grad(1, g)
        worker.model.backend.sgd_step(w.copy(), g, 1e-9)

    t_step = median_time(step, args.repeats)
    gamma, _ = time_gamma_and_copy(n)
    works = {}
    for kind in ("dc", "dc-adaptive", "predict"):
        stale = PipeCompensation(cfg.replace(compensation=kind), worker)
        stale.computed(0, g)  # step 0's slot filled, as in a run: step 1 applies it

        def work(stale=stale) -> None:  # pipe_worker's calls at step 1 (in flight: step 0)
            stale.weights_for([0])  # predict: w - lr * this worker's g_0
            stale.computed(1, g)  # dc: w_1 kept; predict: this worker's g_1 kept
            stale.applied(0, g)  # dc: the corrected gradient of step 0

        works[kind] = work

    extra_vectors = {"dc": 2, "dc-adaptive": 3, "predict": 3}  # kept x width, + MS, + w^
    print(f"compare preset model: {n:,} parameters ({4 * n / 1e6:.1f} MB), batch "
          f"{cfg.batch_size}; a step (loss_and_grad + update): {t_step * 1e3:.2f} ms; gamma "
          f"{gamma * 1e9:.3f} ns/B")  # fmt: skip
    head = (f"{'compensation':<13} {'measured ms':>11} {'of a step':>9} {'model ms':>9} "
            f"{'passes':>6} {'extra MB':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for kind, fn in works.items():
        t = median_time(fn, args.repeats)
        passes = compensation_passes(kind, 2)
        model = passes * gamma * 4 * n
        print(f"{kind:<13} {t * 1e3:>11.3f} {t / t_step:>9.1%} {model * 1e3:>9.3f} {passes:>6} "
              f"{extra_vectors[kind] * 4 * n / 1e6:>8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
