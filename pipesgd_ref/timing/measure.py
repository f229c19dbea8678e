"""What one process times by itself: t_comp and t_u of a model, gamma, the copy cost, codecs.

Each figure is the median of a few timed calls after an untimed warm-up (`median_time`), on
the run's own model and batch (`time_compute`, in one BLAS thread as in a worker; with the
backward's profile, when each layer's gradient is ready: `time_compute_profile`) or on arrays
of the gradient's size.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.runtime.worker import Worker


def median_time(fn, reps: int, warmup: int = 2) -> float:
    """The median seconds of `reps` calls of fn(), after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def usable_cores() -> int:
    """Cores this process may run on (taskset/cgroup-aware where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def time_compute(cfg, reps: int = 10) -> tuple[int, float, float]:
    """(n_params, t_comp, t_update) of cfg's model and batch size, timed in this process."""
    n, t_comp, t_update, _ = time_compute_profile(cfg, reps)
    return n, t_comp, t_update


def time_compute_profile(cfg, reps: int = 10) -> tuple[int, float, float, tuple]:
    """(n_params, t_comp, t_update, backward_units) of cfg's model and batch size, timed in
    this process; t_update is cfg's optimiser rule (`time_update`). backward_units: per unit
    of the model's `grad_units()`, in the order the backward writes them (last layer first),
    (bytes, the fraction of the loss_and_grad call elapsed when its `ready` callback ran), each
    the median over the same `reps` timed calls that give t_comp (Calibration.backward_units;
    the ddp prediction reads it)."""
    w = Worker.build(cfg.replace(resume=""), 0, cfg.world_size)
    grads = np.empty_like(w.params)
    itemsize = grads.dtype.itemsize
    step = iter(range(10**9))
    with _one_blas_thread():  # as in a worker (jobenv.pin_to_core): one core, one BLAS thread
        for _ in range(2):  # warm-up, untimed (as median_time)
            w.loss_and_grad(next(step), grads, ready=lambda lo, hi, loss: None)
        times, marks = [], []  # per call: its seconds, and (bytes, seconds in) per unit
        for _ in range(reps):
            ready: list[tuple[int, float]] = []
            start = time.perf_counter()
            w.loss_and_grad(next(step), grads, ready=_recorder(ready, start, itemsize))
            times.append(time.perf_counter() - start)
            marks.append(ready)
        t_update = time_update(SGD.of(cfg), w.model.backend, w.params, grads, reps)
    units = tuple(
        (nbytes, statistics.median(call[i][1] / t for call, t in zip(marks, times, strict=True)))
        for i, (nbytes, _) in enumerate(marks[0])
    )
    return w.model.n_params, statistics.median(times), t_update, units


def time_update(rule: SGD, ops, params: np.ndarray, grads: np.ndarray, reps: int = 10) -> float:
    """t_u: the median seconds of one update by the run's own optimiser `rule`
    (methods/optimizer.py) with the backend `ops`, on copies of `params` and `grads` (lr 1e-12:
    the weights barely move). Each op of the rule is one pass over the n parameters:

        plain SGD      sgd_step                                    1 pass
        momentum M     scale (M v), add_into (+ d), sgd_step       3 passes
        + weight decay sgd_step (d = g + wd w) first               one more
        + nesterov     sgd_step (d = d + M v) before the last      one more (5 with both)

    so t_u grows with the rule as the workers' and the server's updates do."""
    params, scratch = params.copy(), grads.copy()  # the rule leaves d in its scratch
    velocity = np.zeros_like(params) if rule.momentum else None
    return median_time(lambda: rule.step(ops, params, scratch, 1e-12, velocity), reps)


def _recorder(into: list, start: float, itemsize: int):
    """A backward's `ready(lo, hi, loss)` callback that appends (bytes, seconds since start)."""

    def ready(lo: int, hi: int, loss: float) -> None:
        into.append(((hi - lo) * itemsize, time.perf_counter() - start))

    return ready


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(1)
    except ImportError:  # without threadpoolctl, BLAS decides (as in the workers)
        from contextlib import nullcontext

        return nullcontext()


def time_gamma_and_copy(n: int, reps: int = 5) -> tuple[float, float]:
    """(gamma, copy) in s per byte: dst += src, and a memory copy (a socket moves every byte
    through at least one copy on each side)."""
    a = np.ones(max(n, 1024), np.float32)
    b = np.ones_like(a)
    gamma = median_time(lambda: np.add(a, b, out=a), reps) / a.nbytes
    copy = median_time(lambda: np.copyto(a, b), reps) / a.nbytes
    return gamma, copy


def time_codecs(n: int, backend: str = "numpy", names=("trunc16", "bf16", "q8"), reps: int = 5):
    """{codec: (r, encode s/byte, decode-add s/byte)} on an n-element gradient."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    acc = np.zeros_like(x)
    out = {}
    for name in names:
        codec = get_codec(name, backend)
        codes = np.empty(codec.wire_bytes(n), np.uint8)
        e = median_time(lambda c=codec, b=codes: c.encode(x, b), reps) / (4 * n)
        d = median_time(lambda c=codec, b=codes: c.add_decoded_into(b, acc), reps) / (4 * n)
        out[name] = (4 * n / codec.wire_bytes(n), e, d)
    return out


def measure_gamma(nbytes: int = 16 << 20, reps: int = 5) -> float:
    """Seconds per byte of the reduction step (dst += src, float32) on this machine."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.add(b, a, out=a)
        times.append(time.perf_counter() - start)
    return min(times) / nbytes
