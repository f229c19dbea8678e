"""The benchmarks run end to end at their quick size, and each report's figures agree with
each other and with its verdicts. (How well the figures come out is read by people, never
asserted: a timing error on a busy machine is a measurement, not a failure.)"""

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pipesgd_ref.timing import COMPARE_RUNS

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow
def test_timing_model_accuracy_quick(tmp_path):
    """The quick grid: one row per network and method, none failed, and a report whose figures
    agree with each other. How close the models come on a busy machine is read, not asserted:
    the verdict may be either, but it must be the one the printed figures give."""
    out = tmp_path / "accuracy.json"
    cmd = [sys.executable, str(BENCHMARKS / "timing_model_accuracy.py"), "--quick", "--json", out]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"timing_model_accuracy.py --quick exited {done.returncode}\n{log}"
    report = json.loads(out.read_text())
    rows = report["rows"]
    # --quick: p = 2, two networks, one model, every method of timing.COMPARE_RUNS
    n = len(COMPARE_RUNS)
    assert len(rows) == 2 * n, f"expected {2 * n} rows (2 networks x {n} methods), got {len(rows)}"
    failed = [f"{r['network']} {r['method']}: {r['failed']}" for r in rows if r.get("failed")]
    assert not failed, "runs failed:\n" + "\n".join(failed)
    for r in rows:
        assert_row_agrees(r, done.stdout, log)
    assert_verdict_agrees(rows, report["summary"], done.stdout, log)


def assert_row_agrees(r: dict, stdout: str, log: str) -> None:
    """Both times positive, the error the ratio of the two, and the printed row the JSON's."""
    where = f"{r['network']} {r['method']}"
    meas, pred = r["measured_s"], r["predicted_s"]
    assert meas > 0 and pred > 0, f"{where}: measured {meas} s, predicted {pred} s\n{log}"
    assert r["error"] == pytest.approx(pred / meas - 1, rel=1e-9, abs=1e-12), (
        f"{where}: error {r['error']} is not predicted / measured - 1 = {pred / meas - 1}"
    )
    printed = f" {meas * 1e3:8.2f} {pred * 1e3:8.2f} {r['error']:+7.1%}  {r['bound']}"
    head = rf"^\s*{r['world_size']}\s+{re.escape(r['network'])}\s.*\s{re.escape(r['method'])}\s*"
    assert re.search(head + re.escape(printed) + "$", stdout, re.M), (
        f"{where}: no printed row ending {printed!r}\n{log}"
    )


def assert_verdict_agrees(rows: list[dict], summary: dict, stdout: str, log: str) -> None:
    """The overall median and worst |error| are those of the rows, printed as such, and the
    verdict is theirs against the targets: each target's yes/no, "met" only when both are."""
    errors = [abs(r["error"]) for r in rows]
    overall, targets = summary["overall"], summary["targets"]
    assert overall["n"] == len(rows), overall
    assert overall["median_abs"] == pytest.approx(statistics.median(errors)), overall
    assert overall["worst_abs"] == pytest.approx(max(errors)), overall
    median, worst = overall["median_abs"], overall["worst_abs"]
    printed = f"overall: median |error| {median:.1%}, worst {worst:.1%}"
    assert re.search(rf"^{re.escape(printed)} ", stdout, re.M), f"no line {printed!r}\n{log}"
    met_median = overall["median_abs"] <= targets["median_abs"]
    met_worst = overall["worst_abs"] <= targets["worst_abs"]
    assert targets["met"] == (met_median and met_worst), (
        f"median {overall['median_abs']:.1%} against {targets['median_abs']:.0%}, worst "
        f"{overall['worst_abs']:.1%} against {targets['worst_abs']:.0%}: the JSON says met = "
        f"{targets['met']}\n{log}"
    )
    verdict = (
        f"targets (median |error| <= {targets['median_abs']:.0%}: "
        f"{'yes' if met_median else 'no'}; worst <= {targets['worst_abs']:.0%}: "
        f"{'yes' if met_worst else 'no'}): {'met' if targets['met'] else 'NOT met'}"
    )
    assert re.search(rf"^{re.escape(verdict)}$", stdout, re.M), (
        f"the verdict the figures give, {verdict!r}, is not the one printed\n{log}"
    )


@pytest.mark.slow
def test_soak_short(tmp_path):
    """2,000 steps of the soak, sampled every 10 ms. What a busy machine cannot change must
    pass: no descriptor opened and kept, resident memory within the 5% bound (a worker holds
    about 140 MB, so it takes a leak of some 4 KB a step to cross it in 1,800 steps; a flat run
    grows by about 0.1%), the trace bounded and loading. Throughput measures whatever else
    shares the cores: its verdict must be the one its own figures give, whichever it is.

    Why 2,000 steps: an idle machine runs a step in 0.35 ms, so 300 steps took 0.1 s and a
    sampler every 50 ms saw some workers once after warm-up, too few to measure anything."""
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(BENCHMARKS / "soak.py"), "--steps", "2000", "--interval", "0.01",
           "--json", out]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"soak.py --steps 2000 exited {done.returncode}\n{log}"
    for check in ("memory", "descriptors", "throughput", "trace"):
        assert re.search(rf"^(PASS|FAIL|n/a ) {check}: ", done.stdout, re.M), (
            f"no 'PASS/FAIL {check}: ...' line in the output\n{log}"
        )
    for check in ("memory", "descriptors", "trace"):
        assert re.search(rf"^PASS {check}: ", done.stdout, re.M), (
            f"the soak's {check} check did not pass over 2000 steps\n{log}"
        )
    report = json.loads(out.read_text())
    names = [p["process"] for p in report["processes"]]
    assert names == ["launcher", "worker 0", "worker 1", "worker 2", "worker 3"], (
        f"expected the launcher and 4 workers to be sampled, got {names}\n{log}"
    )
    assert len(report["windows"]) == 10, f"expected 10 throughput windows\n{log}"
    assert report["trace"]["loads"], f"trace.json of the run did not load\n{log}"

    # The windows tile the 2,000 steps, in order; the JSON's verdicts are the printed ones.
    spans = [(w["first_step"], w["last_step"]) for w in report["windows"]]
    assert spans == [(200 * k, 200 * k + 199) for k in range(10)], f"windows {spans}\n{log}"
    assert all(w["steps_per_s"] > 0 for w in report["windows"]), log
    verdicts = {c["check"]: c["passed"] for c in report["checks"]}
    for check, passed in verdicts.items():
        word = "n/a " if passed is None else ("PASS" if passed else "FAIL")
        assert re.search(rf"^{word} {check}: ", done.stdout, re.M), (
            f"{check}: the JSON says {passed}, the output does not say {word}\n{log}"
        )
    # Throughput's verdict from its figures: the slowest window after warm-up (the first 10%
    # of the steps: window 0) against the median of those windows.
    rates = [w["steps_per_s"] for w in report["windows"][1:]]
    ratio = min(rates) / statistics.median(rates)
    bound = report["bounds"]["slowest_window_over_median"]
    assert verdicts["throughput"] == (ratio >= bound), (
        f"throughput: slowest window {ratio:.2f}x the median, bound {bound}x, but the verdict "
        f"is {verdicts['throughput']}\n{log}"
    )


@pytest.mark.slow
def test_kernels_gpu_in_the_simulator(tmp_path):
    """No GPU here: the script runs its checks in Numba's CUDA simulator at tiny sizes (the
    session's conftest sets NUMBA_ENABLE_CUDASIM=1, which the subprocess inherits)."""
    import os

    out = tmp_path / "kernels.json"
    cmd = [sys.executable, str(BENCHMARKS / "kernels_gpu.py"), "--n", "16", "--elements", "300",
           "--reps", "1", "--window", "1", "4", "2", "--json", out]  # fmt: skip
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    log = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"kernels_gpu.py exited {done.returncode}\n{log}"
    assert "simulator" in done.stdout and "FAIL" not in done.stdout, log
    kernels = json.loads(out.read_text())["kernels"]
    names = " ".join(k["kernel"] for k in kernels)
    for kernel in ("dense_forward", "dense_backward", "add_into", "sgd_step", "q8 encode",
                   "im2col", "col2im", "maxpool 2x2", "maxpool backward"):  # fmt: skip
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
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
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


@pytest.mark.slow  # 2-9 s: kept out of the fast subset (under 3 minutes)
@pytest.mark.timeout(120)
def test_compensation_cost_small():
    """benchmarks/compensation_cost.py on a small model: one row per compensation, each with a
    positive measured and modelled time."""
    cmd = [sys.executable, str(BENCHMARKS / "compensation_cost.py"), "--hidden", "256",
           "--batch-size", "16", "--repeats", "3"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    kinds = ("dc", "dc-adaptive", "predict")
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1]]
    rows = [r for r in rows if r[0] in kinds]
    assert [r[0] for r in rows] == ["dc", "dc-adaptive", "predict"], done.stdout
    for r in rows:
        assert float(r[1]) > 0 and float(r[3]) > 0, r


def test_gpu_check_script_parses():
    """benchmarks/gpu_check.sh (run on a GPU machine only): the shell parses, its Python step
    compiles, and every name it imports from the package is where it looks for it (a module
    moved or renamed would otherwise fail only on the GPU machine)."""
    import ast
    import importlib

    script = BENCHMARKS / "gpu_check.sh"
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = script.read_text()
    body = text.split("<<'EOF'", 1)[1].split("\n", 1)[1].split("\nEOF\n", 1)[0]
    compile(body, "gpu_check.sh step 4", "exec")
    imported = [
        (node.module, alias.name)
        for node in ast.walk(ast.parse(body))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipesgd_ref")
        for alias in node.names
    ]
    assert imported, "gpu_check.sh's Python step imports nothing from the package?"
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), f"gpu_check.sh: {module}.{name}"


@pytest.mark.slow
def test_trace_lines_counts_one_iteration_of_the_core_and_the_product(tmp_path):
    """One steady-state pipe iteration traced on rank 0: the core's lines all lie in core/
    and number fewer than the product's on the same ring and tcp; every row traced some."""
    out = tmp_path / "lines.json"
    cmd = [sys.executable, str(BENCHMARKS / "trace_lines.py"), "--json", out]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    core, ring = rows["core (--lesson)"], rows["product, --allreduce ring --transport tcp"]
    assert all(f.startswith("core/") for f in core["per_file"]), core["per_file"]
    assert {"core/ring.py", "core/wire.py", "core/methods.py"} <= set(core["per_file"])
    assert "comm/ring.py" in ring["per_file"] and 0 < core["lines"] < ring["lines"]
    assert all(row["lines"] > 0 for row in rows.values())
