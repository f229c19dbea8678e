"""Calibrations of the same setup made minutes apart, merged; and a point's passes, merged.

The accuracy grid's rules (benchmarks/timing_model_accuracy.py): when to calibrate once more
(`calibrations_disagree`), how calibrations merge (`merged_calibration`: the median, figure by
figure), and how one point's passes combine against the prediction (`merge_passes`).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from pipesgd_ref.timing.figures import Calibration
from pipesgd_ref.timing.iteration import COMPARE_RUNS, Prediction, predict

# A block whose calibrations predict some method's iteration further apart than this (slowest
# over fastest) gets one more calibration, and its merge is the median of three.
CAL_SPREAD = 1.10


def merged_calibration(cals: list[Calibration]) -> Calibration:
    """Calibrations of the same (model, batch, world size, link) made minutes apart, merged
    figure by figure into their median (the mean of two).

    Why the median and not the fastest: the runs a calibration predicts are measured as the
    fastest of their passes, one run each; every compute figure of one calibration is already
    the fastest of two launches (best_of), the same statistic. The fastest over the passes as
    well would be the fastest of four against runs that are the fastest of two: predictions
    biased fast (benchmarks/RESULTS.md: the accuracy grid's bias with either merge). A
    busy-compute or codec figure that only some
    calibrations have comes from those that have it; shared-compute tables of different
    lengths are not merged (the first one's is kept)."""
    if not cals:
        raise ValueError("merged_calibration needs at least one calibration")
    first = cals[0]
    if any(c.n_params != first.n_params or c.bandwidth != first.bandwidth for c in cals):
        raise ValueError("calibrations of different models or links cannot be merged")
    mid = statistics.median

    def typical(name: str):
        values = [getattr(c, name) for c in cals if getattr(c, name) is not None]
        return mid(values) if values else None

    def table(name: str) -> tuple:
        """A per-k table, element by element; the first one's where they differ in length."""
        tables = [getattr(c, name) for c in cals]
        if all(tables) and len({len(t) for t in tables}) == 1:
            return tuple(mid(v) for v in zip(*tables, strict=True))
        return getattr(first, name)

    busy_codecs = [k for c in cals for k in c.t_comp_busy]  # those that only some have, too
    busy = {k: mid([c.t_comp_busy[k] for c in cals if k in c.t_comp_busy]) for k in busy_codecs}
    codecs = {}
    for name in sorted({name for c in cals for name in c.codecs}):
        have = [c.codecs[name] for c in cals if name in c.codecs]
        codecs[name] = (have[0][0], mid(h[1] for h in have), mid(h[2] for h in have))
    return replace(
        first,
        t_comp=typical("t_comp"),
        t_update=typical("t_update"),
        alpha=typical("alpha"),
        gamma=typical("gamma"),
        copy=typical("copy"),
        loop_bandwidth=typical("loop_bandwidth"),
        t_comp_shared=table("t_comp_shared"),
        t_comp_lockstep=table("t_comp_lockstep"),
        t_comp_cpu=table("t_comp_cpu"),
        t_comp_busy=busy,
        alpha_busy=typical("alpha_busy"),
        backward_units=_backward_units(cals),
        codecs=codecs,
        source={
            **first.source,
            "merged": f"the median of {len(cals)} calibrations, figure by figure "
            "(merged_calibration)",
        },
    )


def _backward_units(cals: list[Calibration]) -> tuple:
    """The backward's profile, each unit's fraction the median over the calibrations that
    measured the same units; the first one's where they differ."""
    have = [c.backward_units for c in cals if c.backward_units]
    if not have or len({tuple(b for b, _ in units) for units in have}) != 1:
        return cals[0].backward_units
    return tuple(
        (unit[0][0], statistics.median(f for _, f in unit)) for unit in zip(*have, strict=True)
    )


def calibrations_disagree(
    cals: list[Calibration], world_size: int, width: int, spread: float = CAL_SPREAD
) -> bool:
    """Whether a block's calibrations (two or more) predict the iteration of some method of
    the grid more than `spread` apart, the slowest prediction over the fastest: one of them
    then likely ran in a slow stretch of the machine, and the median of two (their mean) would
    carry half of it into every prediction of the block."""
    if len(cals) < 2:
        return False
    for algo, codec in COMPARE_RUNS:
        times = [predict(algo, world_size, c, codec, width).iter_time_s for c in cals]
        if max(times) > spread * min(times):
            return True
    return False


def against(pred: Prediction, measured_s: float) -> dict:
    """A point's prediction beside its measured iteration: the fields a row keeps of it."""
    return {
        "predicted_s": pred.iter_time_s,
        "error": (pred.iter_time_s - measured_s) / measured_s,
        "bound": pred.bound,
        "prediction": pred.to_dict(),
    }


def merge_passes(runs: list[dict], cal: Calibration, width: int) -> dict:
    """One point's rows, one a pass, merged: the fastest measured run of them all against the
    prediction from `cal` (the block's calibrations merged by merged_calibration).
    With one pass, the row as it was. Failed only when every pass failed."""
    if len(runs) == 1:
        return runs[0]
    done = [r for r in runs if not r.get("failed")]
    if not done:
        return runs[-1]
    best = min(done, key=lambda r: r["measured_s"])
    pred = predict(best["algo"], best["world_size"], cal, best["codec"], width)
    return {
        **best,
        "measured_all_s": [t for r in done for t in r["measured_all_s"]],
        **against(pred, best["measured_s"]),
        "passes": [
            {k: r.get(k) for k in ("measured_s", "predicted_s", "error", "failed")} for r in runs
        ],
    }
