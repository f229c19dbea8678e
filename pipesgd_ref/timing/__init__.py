"""How long one iteration takes, predicted and measured.

    models.py     the analytic models of shared/PAPER.md section 3, their derivation, and one
                  function per method (sync, pipe, ps_sync, ps_async) behind `predict`
    calibrate.py  the figures the models read (t_comp, t_u, alpha, B, gamma, codecs, ...),
                  measured on this machine by timing this process and launching workers
    sweep.py      the ranges `pipesgd predict --sweep` re-predicts over

The model API is here: `from pipesgd_ref.timing import predict, ring_allreduce_time`.
Calibration launches processes, so it is imported on its own:
`from pipesgd_ref.timing.calibrate import calibrate`.
"""

from pipesgd_ref.timing.models import (
    ALGOS,
    COMPARE_RUNS,
    Calibration,
    Prediction,
    compensation_passes,
    compute_time,
    describe,
    pipe,
    predict,
    predict_all,
    ps_async,
    ps_cpu_bound,
    ps_sync,
    ps_sync_core_bound,
    ps_worker_step,
    ring_allreduce_time,
    ring_terms,
    run_label,
    shared_compute,
    speedups,
    step_cpu,
    sync,
    workers_on_timed_core,
)
from pipesgd_ref.timing.sweep import sweep_values

__all__ = [
    "ALGOS",
    "COMPARE_RUNS",
    "Calibration",
    "Prediction",
    "compensation_passes",
    "compute_time",
    "describe",
    "pipe",
    "predict",
    "predict_all",
    "ps_async",
    "ps_cpu_bound",
    "ps_sync",
    "ps_sync_core_bound",
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
