"""The ResNet's training step on the CPU: loss_and_grad + the SGD update, per backend.

    python benchmarks/resnet_step.py [--batch 32] [--depth 8] [--channels 16,32,64]
                                     [--backends numpy,numba] [--repeats 30] [--profile]

On digits (8 x 8 images, 10 classes) by default, one process, one minibatch reused (the data
are not what is timed): the median of --repeats steps after two warm-up steps (Numba compiles
on the first), the fastest, and the samples per second the median gives. The running
statistics are updated as in training (buffers passed). With --profile, each backend's step
is also split by op (the backend's ops wrapped with a timer; the rest of the step is Python
between them): where a faster step would come from.

Prints the table and nothing else; the figures are this machine's, at the time of the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np

from pipesgd_ref.data import load_dataset
from pipesgd_ref.models import ResNet
from pipesgd_ref.ops import OP_NAMES, Backend, get_backend


def timed_backend(name: str, spent: Counter) -> Backend:
    """The backend `name` with every op wrapped to add its seconds to spent[op]."""
    inner = get_backend(name)
    wrapped = Backend.__new__(Backend)
    wrapped.name = name

    def timer(op: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[op] += time.perf_counter() - start
            return out

        return timed

    for op in OP_NAMES:
        setattr(wrapped, op, timer(op, getattr(inner, op)))
    return wrapped


def step_times(model: ResNet, X, y, repeats: int, warm=None) -> list[float]:
    """Seconds of each of `repeats` steps (loss_and_grad with the buffers, then sgd_step);
    `warm()`, if given, is called between the warm-up and the timed steps."""
    w = model.init_params(0)
    g, buffers = np.empty_like(w), model.init_buffers()
    ops = model.backend

    def step() -> None:
        model.loss_and_grad(w, X, y, g, buffers=buffers)
        ops.sgd_step(w, g, 1e-3)  # a small lr: the weights stay finite over any repeats

    for _ in range(2):  # warm-up: Numba's compilation, the scratch buffers
        step()
    if warm is not None:
        warm()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--channels", default="16,32,64")
    ap.add_argument("--backends", default="numpy,numba")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="split each step by op")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.batch < 2:
        ap.error("--repeats must be >= 1 and --batch >= 2 (batch norm needs two samples)")
    data = load_dataset(args.dataset)
    channels = tuple(int(c) for c in args.channels.split(","))
    X, y = data.X_train[: args.batch], data.y_train[: args.batch]
    print(f"ResNet step (loss_and_grad + sgd_step) on {data.name} {data.image_shape}, "
          f"batch {len(y)}, depth {args.depth}, channels {channels}: median of "
          f"{args.repeats}")  # fmt: skip
    print(f"{'backend':<8} {'median ms':>10} {'min ms':>8} {'samples/s':>10}")
    profiles = {}
    for name in args.backends.split(","):
        model = ResNet(data.image_shape, data.n_classes, args.depth, channels, backend=name)
        times = step_times(model, X, y, args.repeats)
        median = statistics.median(times)
        print(f"{name:<8} {median * 1e3:10.2f} {min(times) * 1e3:8.2f} {len(y) / median:10.0f}")
        if args.profile:
            spent: Counter = Counter()
            model = ResNet(data.image_shape, data.n_classes, args.depth, channels,
                           backend=timed_backend(name, spent))  # fmt: skip
            total = sum(step_times(model, X, y, args.repeats, warm=spent.clear))
            profiles[name] = (spent, total)
    print(f"({model!r})")
    for name, (spent, total) in profiles.items():
        print(f"\n{name}: ms per step by op (the rest of the step: Python between the ops)")
        for op, seconds in spent.most_common():
            print(f"  {op:<26} {seconds / args.repeats * 1e3:8.3f}  {seconds / total:6.1%}")
        rest = total - sum(spent.values())
        print(f"  {'(the rest)':<26} {rest / args.repeats * 1e3:8.3f}  {rest / total:6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
