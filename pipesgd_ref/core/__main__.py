"""Train with the core from the command line, then check the result against the oracle.

python -m pipesgd_ref.core [--algo sync|pipe|ps-sync] [--world-size P] [--width K]
                           [--steps T] [--threads]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipesgd_ref.core.launch import METHODS, launch
from pipesgd_ref.core.methods import oracle
from pipesgd_ref.core.model import Problem, blobs


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description="Pipe-SGD, the lesson core: train and check")
    cli.add_argument("--algo", default="pipe", choices=sorted(METHODS))
    cli.add_argument("--world-size", type=int, default=4, help="workers (p)")
    cli.add_argument("--width", type=int, default=2, help="pipe's width K (staleness K - 1)")
    cli.add_argument("--steps", type=int, default=200)
    cli.add_argument("--threads", action="store_true", help="ranks as threads (a debugger)")
    args = cli.parse_args(argv)
    X, y = blobs()
    test = slice(1600, None)  # the last 400 rows are held out
    prob = Problem(X[:1600], y[:1600], 10, (64,), args.world_size, args.width, steps=args.steps)
    start = time.perf_counter()
    results = launch(prob, args.algo, threads=args.threads)
    wall = time.perf_counter() - start
    w = results[0]["params"]
    acc = prob.model().accuracy(w, X[test], y[test])
    losses = results[-1]["losses"]
    print(f"{args.algo}: {len(results)} ranks, {prob.steps} steps in {wall:.2f} s; loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}, test accuracy {acc:.3f}")  # fmt: skip
    same = all(np.array_equal(r["params"], w) for r in results)
    exact = np.array_equal(w, oracle(prob, args.algo))
    print(f"replicas identical: {same}; equal to the one-process oracle, bit for bit: {exact}")
    return 0 if same and exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
