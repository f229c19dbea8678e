"""How long one iteration takes, predicted and measured.

    iteration.py  docs/paper.md, section 3: an iteration's time derived (Eq. 1-12), and
                  one function per method (sync, pipe, ddp, ps_sync, ps_async), keyed by name in
                  `PREDICTORS` behind `predict`
    terms.py      the terms those functions share: the ring's T_ar, compute under core sharing,
                  the CPU bounds on shared cores
    figures.py    `Calibration`: the figures the predictions read (t_comp, t_u, alpha, B, gamma,
                  codecs, ...)
    calibrate.py  those figures measured on this machine, by timing this process and launching
                  workers (with measure.py, workers.py, network.py and merge.py beside it)
    emulated.py   one ring AllReduce on a run's emulated link, frame by frame as it is sent
    buckets.py    the backward's profile and ddp's buckets, as Eq. 12 reads them
    sweep.py      the ranges `pipesgd predict --sweep` re-predicts over

The prediction API is here: `from pipesgd_ref.timing import predict, ring_allreduce_time`.
Calibration launches processes, so it is imported on its own:
`from pipesgd_ref.timing.calibrate import calibrate`.
"""

from pipesgd_ref.timing.figures import Calibration, describe
from pipesgd_ref.timing.iteration import (
    ALGOS,
    COMPARE_RUNS,
    DEFAULT_BUCKET_BYTES,
    PREDICTORS,
    Prediction,
    ddp,
    pipe,
    predict,
    predict_all,
    ps_async,
    ps_sync,
    run_label,
    speedups,
    sync,
)
from pipesgd_ref.timing.sweep import sweep_values
from pipesgd_ref.timing.terms import (
    compensation_passes,
    compute_time,
    ps_async_cpu_bound,
    ps_cpu_bound,
    ps_sync_core_bound,
    ps_sync_cpu_bound,
    ps_worker_step,
    ring_allreduce_time,
    ring_terms,
    shared_compute,
    step_cpu,
    workers_on_timed_core,
)

__all__ = [
    "ALGOS",
    "COMPARE_RUNS",
    "DEFAULT_BUCKET_BYTES",
    "PREDICTORS",
    "Calibration",
    "Prediction",
    "compensation_passes",
    "compute_time",
    "ddp",
    "describe",
    "pipe",
    "predict",
    "predict_all",
    "ps_async",
    "ps_async_cpu_bound",
    "ps_cpu_bound",
    "ps_sync",
    "ps_sync_core_bound",
    "ps_sync_cpu_bound",
    "ps_worker_step",
    "ring_allreduce_time",
    "ring_terms",
    "run_label",
    "shared_compute",
    "speedups",
    "step_cpu",
    "sweep_values",
    "sync",
    "workers_on_timed_core",
]
