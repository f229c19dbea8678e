"""The benchmarks run end to end at their quick size. (Their figures are read by people, never
asserted: a timing error on a busy machine is a measurement, not a failure.)"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
def test_timing_model_accuracy_quick(tmp_path):
    out = tmp_path / "accuracy.json"
    cmd = [sys.executable, str(BENCHMARKS / "timing_model_accuracy.py"), "--quick", "--json", out]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=55)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"timing_model_accuracy.py --quick exited {done.returncode}\n{log}"
    summary = re.search(r"^overall: median \|error\| [\d.]+%, worst [\d.]+%", done.stdout, re.M)
    assert summary, f"no 'overall: median |error| ..., worst ...' line in the output\n{log}"
    assert re.search(r"^targets \(.*\): (met|NOT met)$", done.stdout, re.M), (
        f"no 'targets (...): met / NOT met' verdict in the output\n{log}"
    )
    rows = json.loads(out.read_text())["rows"]
    # --quick: p = 2, two networks, one model, every method of timing.COMPARE_RUNS
    assert len(rows) == 2 * 6, f"expected 12 rows (2 networks x 6 methods), got {len(rows)}"
    failed = [f"{r['network']} {r['method']}: {r['failed']}" for r in rows if r.get("failed")]
    assert not failed, "runs failed:\n" + "\n".join(failed)
    for r in rows:
        assert r["measured_s"] > 0 and r["predicted_s"] > 0, (
            f"{r['network']} {r['method']}: measured {r['measured_s']} s, predicted "
            f"{r['predicted_s']} s; both must be positive"
        )


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_merges_passes_into_the_fastest_run_against_the_merged_calibration():
    """The default grid's two passes (no processes: made-up rows and calibrations): a point
    keeps its fastest run of both passes, predicted from its block's merged calibration (the
    median of its calibrations, figure by figure)."""
    from pipesgd_ref import timing
    from pipesgd_ref.timing import Calibration

    grid = load_benchmark("timing_model_accuracy")

    def cal(t_comp):
        return Calibration(n_params=10_000, t_comp=t_comp, t_update=1e-4, alpha=1e-4,
                           bandwidth=125e6, gamma=1e-10, cores=2,
                           t_comp_shared=(t_comp, 2 * t_comp))  # fmt: skip

    slow, fast = cal(0.02), cal(0.01)
    merged = timing.merged_calibration([slow, fast])

    def row(measured_s, c):
        pred = timing.predict("sync", 2, c)
        return {"world_size": 2, "algo": "sync", "codec": "none", "measured_s": measured_s,
                "measured_all_s": [measured_s], "predicted_s": pred.iter_time_s,
                "error": pred.iter_time_s / measured_s - 1}  # fmt: skip

    got = grid.merge_passes([row(0.030, slow), row(0.025, fast), row(0.028, slow)], merged, 2)
    want = timing.predict("sync", 2, merged).iter_time_s
    between = [timing.predict("sync", 2, c).iter_time_s for c in (fast, slow)]
    assert between[0] < want < between[1], "the merge is neither calibration"
    assert got["measured_s"] == 0.025 and got["measured_all_s"] == [0.030, 0.025, 0.028]
    assert got["predicted_s"] == pytest.approx(want), "from the merged calibration"
    assert got["error"] == pytest.approx((want - 0.025) / 0.025)
    assert [q["measured_s"] for q in got["passes"]] == [0.030, 0.025, 0.028]
    failed = {"world_size": 2, "algo": "sync", "codec": "none", "failed": "OSError: boom"}
    assert grid.merge_passes([failed, row(0.03, slow)], merged, 2)["measured_s"] == 0.03
    assert grid.merge_passes([failed, failed], merged, 2)["failed"], "failed in every pass"
    only = row(0.03, slow)
    assert grid.merge_passes([only], merged, 2) is only, "one pass: the row as it was"


def test_grid_calibrates_a_block_again_when_its_calibrations_disagree():
    """Two calibrations of a block whose predictions differ by more than 10% for some method
    (one likely ran in a slow stretch) call for a third; within 10%, or one alone, do not."""
    import dataclasses

    from pipesgd_ref.timing import Calibration

    grid = load_benchmark("timing_model_accuracy")
    base = Calibration(n_params=10_000, t_comp=0.01, t_update=1e-4, alpha=1e-4,
                       bandwidth=125e6, gamma=1e-10, cores=2, t_comp_shared=(0.01, 0.02),
                       codecs={"trunc16": (2.0, 1e-9, 1e-9), "q8": (4.0, 1e-9, 1e-9)})  # fmt: skip
    near = dataclasses.replace(base, t_comp=0.0105, t_comp_shared=(0.0105, 0.021))
    slow = dataclasses.replace(base, t_comp=0.013, t_comp_shared=(0.013, 0.026))
    assert not grid.calibrations_disagree([base, near], 2, 2)
    assert grid.calibrations_disagree([base, slow], 2, 2)
    assert grid.calibrations_disagree([slow, base, near], 2, 2), "any two of them"
    assert not grid.calibrations_disagree([slow], 2, 2), "one alone agrees with itself"


def test_soak_short(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(BENCHMARKS / "soak.py"), "--steps", "300", "--interval", "0.05",
           "--json", out]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"soak.py --steps 300 exited {done.returncode}\n{log}"
    for check in ("memory", "descriptors", "throughput", "trace"):
        assert re.search(rf"^(PASS|FAIL|n/a ) {check}: ", done.stdout, re.M), (
            f"no 'PASS/FAIL {check}: ...' line in the output\n{log}"
        )
    report = json.loads(out.read_text())
    names = [p["process"] for p in report["processes"]]
    assert names == ["launcher", "worker 0", "worker 1", "worker 2", "worker 3"], (
        f"expected the launcher and 4 workers to be sampled, got {names}\n{log}"
    )
    assert len(report["windows"]) == 10, f"expected 10 throughput windows\n{log}"
    assert report["trace"]["loads"], f"trace.json of the run did not load\n{log}"


@pytest.mark.slow
def test_kernels_gpu_in_the_simulator(tmp_path):
    """No GPU here: the script runs its checks in Numba's CUDA simulator at tiny sizes (the
    session's conftest sets NUMBA_ENABLE_CUDASIM=1, which the subprocess inherits)."""
    import os

    out = tmp_path / "kernels.json"
    cmd = [sys.executable, str(BENCHMARKS / "kernels_gpu.py"), "--n", "16", "--elements", "300",
           "--reps", "1", "--json", out]  # fmt: skip
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"kernels_gpu.py exited {done.returncode}\n{log}"
    assert "simulator" in done.stdout and "FAIL" not in done.stdout, log
    kernels = json.loads(out.read_text())["kernels"]
    names = " ".join(k["kernel"] for k in kernels)
    for kernel in ("dense_forward", "dense_backward", "add_into", "sgd_step", "q8 encode"):
        assert kernel in names, f"{kernel} missing from {names}"
    assert all(k["ok"] for k in kernels)


def test_kernels_gpu_without_a_gpu_says_why():
    import os

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    cmd = [sys.executable, str(BENCHMARKS / "kernels_gpu.py"), "--n", "16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if "CUDA kernels on" in done.stdout:  # a machine with a GPU: nothing to check here
        return
    assert done.returncode == 0 and "nothing to time here: no usable CUDA GPU" in done.stdout, (
        done.stdout + done.stderr
    )


@pytest.mark.parametrize("flag", ["--passes", "--repeats"])
def test_timing_model_accuracy_refuses_fewer_than_one_pass_or_repeat(flag):
    cmd = [sys.executable, str(BENCHMARKS / "timing_model_accuracy.py"), flag, "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=55)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--passes and --repeats must be at least 1" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "timing models against" not in done.stdout


@pytest.mark.slow
def test_ps_link_model_quick(tmp_path):
    out = tmp_path / "ps_link.json"
    cmd = [sys.executable, str(BENCHMARKS / "ps_link_model.py"), "--workers", "2", "--steps",
           "5", "--repeats", "1", "--json", out]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"ps_link_model.py exited {done.returncode}\n{log}"
    assert re.search(r"^M = \d+ bytes; worst \|error\| [\d.]+%$", done.stdout, re.M), (
        f"no 'M = ... bytes; worst |error| ...%' line in the output\n{log}"
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["pulls"] for r in rows] == ["sequential", "shared"], f"one row per order\n{log}"
    for r in rows:
        assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["t_comp_s"] > 0, (
            f"{r['pulls']}: measured {r['measured_s']} s, predicted {r['predicted_s']} s, "
            f"t_c {r['t_comp_s']} s; all must be positive"
        )
        # the model pays at least the link: 2 alpha + (p + 1) M / B (the measured figure is
        # read, not asserted)
        floor = 2 * r["latency_s"] + (r["world_size"] + 1) * 4 * r["n_params"] / r["bandwidth"]
        assert r["predicted_s"] > floor, f"{r['pulls']}: the model is below the link\n{log}"
