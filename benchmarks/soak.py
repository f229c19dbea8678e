"""Soak: Pipe-SGD on 4 workers for 20,000 steps; memory, file descriptors and speed stay flat.

    python benchmarks/soak.py                                 # 20,000 steps (~1.2 min here)
    python benchmarks/soak.py --steps 2000 --json soak.json --plot soak.png

What it runs. `run_training` of the `laptop` preset (MLP 64-64-10 on digits, 4 workers, batch 32
each, no link emulation) as `pipe` of width 2 for --steps steps, in a launcher process of its
own: the launcher forks the 4 workers, as `pipesgd train` does.

What it measures, from outside. A sampler thread in this process reads, every --interval
seconds, /proc/PID/status (VmRSS) and the entries of /proc/PID/fd of the launcher and of each
worker (the launcher's children that run the same program). Warm-up is the first 10% of the
steps; "after warm-up" is the first sample taken after rank 0 ends that step, "end" the last
one before it ends its last step, so the collection of the results afterwards (all the spans
of all the ranks, pickled to the launcher) is not counted. Throughput is steps/s of rank 0 in
--windows equal windows of steps, from the summary's loss_curve wall times.

Checks (printed as PASS / FAIL lines):
    memory       resident memory of every process grows by < 5% from after warm-up to the end
    descriptors  every process has as many open fds at the end as after warm-up
    throughput   the slowest window after warm-up runs at >= 0.7x the median window. Why
                 0.7: the 4 workers share 2 cores with whatever else runs; on the shared
                 2-core VM (load average 5 to 16) the slowest window of three 20,000-step runs
                 was 0.83x to 0.90x its median, so 0.7 leaves room for that noise and still
                 catches a slowdown that grows with the run (a list scanned every step)
    trace        trace.json loads, and each rank kept the spans of at most HEAD_STEPS +
                 TAIL_STEPS (+ width, for stragglers) steps (trace.Timeline)

What to expect: the workers' memory still grows by ~90 bytes a step (1.1% over 18,000 steps):
each keeps its loss and the end time of every step in two lists of Python floats, which
WorkerResult hands back. Before the Timeline was bounded, the spans added ~1.7 KB a step
(+20% over the same run) and trace.json was 47 MB.

A measurement, not a test: the script exits 0 whatever the verdicts (1 only if the run itself
failed). --json FILE writes the samples, the windows and the verdicts; --plot FILE draws
resident memory and throughput against time (needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.trace import Timeline

RSS_BOUND = 0.05  # relative growth of resident memory after warm-up
THROUGHPUT_BOUND = 0.7  # slowest window after warm-up / median window
WARMUP_FRACTION = 0.1


# --- reading a process from outside --------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    """Resident memory of process `pid` in KiB (VmRSS), or None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None  # a zombie: no VmRSS line


def open_fds(pid: int) -> int | None:
    """Number of file descriptors process `pid` has open, or None once it has exited."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None


def children(pid: int) -> list[int]:
    """Child processes of `pid`: /proc/PID/task/*/children where the kernel has it, else a scan
    of every /proc/*/stat for its parent id."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    found: set[int] = set()
    try:
        for tid in tasks:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update(int(c) for c in f.read().split())
        return sorted(found)
    except FileNotFoundError:  # CONFIG_PROC_CHILDREN off (or the thread just ended)
        return children_by_scan(pid)


def children_by_scan(pid: int) -> list[int]:
    """Child processes of `pid`, from the parent id in every /proc/*/stat."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # "pid (comm) state ppid ...": comm may hold spaces, so split after ")"
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.add(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    return sorted(found)


def cmdline(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None


class Sampler(threading.Thread):
    """Samples (perf_counter s, RSS KiB, fds) of the launcher and its workers every `interval`
    seconds. A worker is a child running the launcher's own program (fork keeps the command
    line), which leaves out helpers such as multiprocessing's resource tracker."""

    def __init__(self, launcher: int, interval: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.launcher, self.interval = launcher, interval
        self.samples: dict[int, list[tuple[float, int, int]]] = {launcher: []}
        self.started_at: dict[int, float] = {}  # pid -> when it was first seen
        self._done = threading.Event()  # (not _stop: Thread has one)

    def run(self) -> None:
        program = cmdline(self.launcher)
        while not self._done.is_set():
            pids = [self.launcher] + [
                c for c in children(self.launcher) if c in self.samples or cmdline(c) == program
            ]
            for pid in pids:
                now = time.perf_counter()  # CLOCK_MONOTONIC: the clock the workers' spans use
                rss, fds = rss_kib(pid), open_fds(pid)
                if rss is None or fds is None:
                    continue
                self.samples.setdefault(pid, []).append((now, rss, fds))
                self.started_at.setdefault(pid, now)
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


# --- the run -------------------------------------------------------------------------------


def _launcher(cfg: TrainConfig, answer: str) -> None:
    """The launcher process: train, then hand back what the samples are matched against."""
    from pipesgd_ref.commands.train import run_training

    summary, results = run_training(cfg, progress=False, log=lambda *_: None)
    ends = results[0].step_end  # perf_counter s: the clock of the samples
    Path(answer).write_text(json.dumps({
        "summary": summary,
        "origin_s": ends[0] - summary["loss_curve"][0]["wall_time_s"],  # loss_curve's zero
        "spans_per_rank": [len(r.events) for r in results],
        "steps_traced_per_rank": [len({e["args"]["step"] for e in r.events}) for r in results],
    }))  # fmt: skip


def throughput_windows(wall_times: list[float], n_windows: int) -> list[dict]:
    """Steps/s in n_windows equal windows of steps; wall_times[t]: end of step t, from the
    start of the run (loss_curve's wall_time_s)."""
    n = len(wall_times)
    n_windows = max(1, min(n_windows, n))
    bounds = [round(k * n / n_windows) for k in range(n_windows + 1)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        t0 = wall_times[a - 1] if a > 0 else 0.0  # the window starts when step a-1 ended
        t1 = wall_times[b - 1]
        out.append({"first_step": a, "last_step": b - 1, "start_s": t0, "end_s": t1,
                    "steps_per_s": (b - a) / max(t1 - t0, 1e-9)})  # fmt: skip
    return out


def process_rows(sampler: Sampler, warm_at: float, end_at: float) -> list[dict]:
    """Per process: resident memory and fds after warm-up and at the end of training."""
    workers = sorted((p for p in sampler.samples if p != sampler.launcher),
                     key=lambda p: (sampler.started_at[p], p))  # fmt: skip
    named = [("launcher", sampler.launcher)]
    # Started one after another in rank order: start order is rank order.
    named += [(f"worker {k}", pid) for k, pid in enumerate(workers)]
    rows = []
    for name, pid in named:
        samples = sampler.samples[pid]
        steady = [s for s in samples if warm_at <= s[0] <= end_at]
        row = {"process": name, "pid": pid, "samples": len(steady)}
        if steady:
            (_, rss0, fd0), (_, rss1, fd1) = steady[0], steady[-1]
            row.update(rss_warm_kib=rss0, rss_end_kib=rss1, rss_max_kib=max(s[1] for s in steady),
                       rss_growth=(rss1 - rss0) / rss0, fds_warm=fd0, fds_end=fd1,
                       fds_max=max(s[2] for s in steady))  # fmt: skip
        rows.append(row)
    return rows


def verdicts(
    rows: list[dict], windows: list[dict], trace: dict, n_warm_windows: int, width: int
) -> list:
    """(check, passed or None when not measured, detail) for each check."""
    out = []
    measured = [r for r in rows if r["samples"] >= 2]
    if len(measured) < len(rows) or not measured:
        out.append(("memory", None, f"too few samples after warm-up on "
                    f"{[r['process'] for r in rows if r['samples'] < 2]} (run longer, or lower "
                    f"--interval)"))  # fmt: skip
    if not measured:
        out.append(("descriptors", None, "no process sampled twice after warm-up"))
    if measured:
        worst = max(measured, key=lambda r: r["rss_growth"])
        out.append(("memory", worst["rss_growth"] < RSS_BOUND,
                    f"largest RSS growth after warm-up {worst['rss_growth']:+.2%} "
                    f"({worst['process']}); bound {RSS_BOUND:.0%}"))  # fmt: skip
        changed = [f"{r['process']} {r['fds_warm']} -> {r['fds_end']}" for r in measured
                   if r["fds_end"] != r["fds_warm"]]  # fmt: skip
        out.append(("descriptors", not changed,
                    "fd count unchanged on every process" if not changed
                    else "fd count changed: " + ", ".join(changed)))  # fmt: skip
    steady = windows[n_warm_windows:]
    if len(steady) >= 2:
        rates = [w["steps_per_s"] for w in steady]
        ratio = min(rates) / statistics.median(rates)
        out.append(("throughput", ratio >= THROUGHPUT_BOUND,
                    f"slowest window after warm-up {ratio:.2f}x the median "
                    f"({min(rates):.0f} vs {statistics.median(rates):.0f} steps/s; max/min "
                    f"{max(rates) / min(rates):.2f}); bound {THROUGHPUT_BOUND}x"))  # fmt: skip
    else:
        out.append(("throughput", None, "fewer than 2 windows after warm-up"))
    # + width: the trim looks at the oldest span only, and a comm span lags by up to width steps
    cap = Timeline.HEAD_STEPS + Timeline.TAIL_STEPS + width
    most = max(trace["steps_traced_per_rank"])
    out.append(("trace", trace["loads"] and most <= cap,
                f"trace.json {trace['mb']:.1f} MB, {trace['spans']} spans, loads: "
                f"{trace['loads']}; at most {most} steps traced per rank (cap {cap}), "
                f"{trace['gaps']} rank(s) marked 'steps not traced'"))  # fmt: skip
    return out


def plot(path: str, sampler: Sampler, rows: list[dict], windows: list[dict], origin: float,
         warm_at: float) -> None:  # fmt: skip
    from pipesgd_ref.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        print("--plot: matplotlib is not installed; no figure")
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for row in rows:
        s = sampler.samples[row["pid"]]
        top.plot([t - origin for t, _, _ in s], [r / 1024 for _, r, _ in s], label=row["process"])
    top.axvline(warm_at - origin, color="gray", linestyle=":", label="end of warm-up")
    top.set_ylabel("resident memory (MiB)")
    top.legend(fontsize=7)
    rates = [w["steps_per_s"] for w in windows]  # each held from its window's start to end
    bottom.step([windows[0]["start_s"]] + [w["end_s"] for w in windows], rates + rates[-1:],
                where="post")  # fmt: skip
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("rank 0 steps/s")
    bottom.set_xlabel("time since the first step (s)")
    save_figure(fig, path)


def soak(cfg: TrainConfig, interval: float) -> tuple[dict, Sampler, float, dict]:
    """Train `cfg` in a launcher process while sampling it; return (what the launcher handed
    back, the sampler, seconds from fork to exit, figures of trace.json)."""
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        if not cfg.out:
            cfg = cfg.replace(out=tmp)
        answer = Path(tmp) / "answer.json"
        # fork: the launcher starts before the sampler thread, so nothing half-held is copied
        launcher = mp.get_context("fork").Process(target=_launcher, args=(cfg, str(answer)),
                                                  name="soak-launcher")  # fmt: skip
        started = time.perf_counter()
        launcher.start()
        sampler = Sampler(launcher.pid, interval)
        sampler.start()
        launcher.join()
        sampler.stop()
        took = time.perf_counter() - started
        if launcher.exitcode != 0 or not answer.is_file():
            raise RuntimeError(f"the launcher failed (exit code {launcher.exitcode}); see above")
        run = json.loads(answer.read_text())
        text = (Path(cfg.out) / "trace.json").read_text()
    try:
        events, loads = json.loads(text)["traceEvents"], True
    except ValueError:
        events, loads = [], False
    trace = {"loads": loads, "mb": len(text) / 1e6,
             "spans": sum(e["ph"] == "X" for e in events),
             "gaps": sum(e["name"] == "steps not traced" for e in events),
             "spans_per_rank": run["spans_per_rank"],
             "steps_traced_per_rank": run["steps_traced_per_rank"]}  # fmt: skip
    return run, sampler, took, trace


def print_tables(rows: list[dict], windows: list[dict], n_warm_windows: int) -> None:
    header = (f"{'process':<9} {'pid':>7} {'samples':>7} {'RSS warm MiB':>12} {'RSS end MiB':>11} "
              f"{'RSS max MiB':>11} {'growth':>7} {'fds warm/end':>12}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for r in rows:
        if not r["samples"]:
            print(f"{r['process']:<9} {r['pid']:>7} {0:>7}   (no sample after warm-up)")
            continue
        mib = [r[k] / 1024 for k in ("rss_warm_kib", "rss_end_kib", "rss_max_kib")]
        print(f"{r['process']:<9} {r['pid']:>7} {r['samples']:>7} {mib[0]:12.1f} "
              f"{mib[1]:11.1f} {mib[2]:11.1f} {r['rss_growth']:+7.2%} "
              f"{r['fds_warm']:>6}/{r['fds_end']:<5}")  # fmt: skip
    print(f"\n{'window':>6} {'steps':>13} {'time s':>13} {'steps/s':>8}")
    for k, w in enumerate(windows):
        mark = "  (warm-up)" if k < n_warm_windows else ""
        steps = f"{w['first_step']}..{w['last_step']}"
        print(f"{k:>6} {steps:>13} {w['start_s']:6.1f}..{w['end_s']:<6.1f} "
              f"{w['steps_per_s']:8.0f}{mark}")  # fmt: skip
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--width", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--windows", type=int, default=10, help="throughput windows")
    ap.add_argument("--out", default="", help="keep summary.json and trace.json here")
    ap.add_argument("--json", dest="json_path", default=None, help="write all the figures here")
    ap.add_argument("--plot", default=None, help="RSS and throughput against time (PNG)")
    args = ap.parse_args(argv)
    cfg = TrainConfig.preset("laptop").replace(
        algo="pipe", width=args.width, world_size=args.world_size, steps=args.steps, out=args.out
    )
    print(f"soak: pipe (width {cfg.width}) on {cfg.world_size} workers, {cfg.steps} steps "
          f"of an MLP (hidden {','.join(map(str, cfg.hidden))}) on {cfg.dataset}, batch "
          f"{cfg.batch_size} per worker, samples every {args.interval} s")  # fmt: skip
    try:
        run, sampler, took, trace = soak(cfg, args.interval)
    except RuntimeError as e:
        print(f"soak: {e}")
        return 1

    summary = run["summary"]
    wall = [p["wall_time_s"] for p in summary["loss_curve"]]
    n = len(wall)
    n_warm = max(1, round(WARMUP_FRACTION * n))
    origin = run["origin_s"]
    warm_at, end_at = origin + wall[n_warm - 1], origin + wall[-1]
    windows = throughput_windows(wall, args.windows)
    n_warm_windows = sum(w["last_step"] < n_warm for w in windows)
    rows = process_rows(sampler, warm_at, end_at)

    print(f"{n} steps in {wall[-1]:.1f} s of training ({took:.1f} s with start-up and the "
          f"summary): iteration {summary['iter_time_s'] * 1e3:.2f} ms (median), final loss "
          f"{summary['final_train_loss']:.4f}, test accuracy "
          f"{summary['test_accuracy']:.4f}")  # fmt: skip
    print(f"warm-up: steps 0..{n_warm - 1} ({wall[n_warm - 1]:.1f} s)\n")
    print_tables(rows, windows, n_warm_windows)
    checks = verdicts(rows, windows, trace, n_warm_windows, cfg.width)
    for name, passed, detail in checks:
        word = "n/a " if passed is None else ("PASS" if passed else "FAIL")
        print(f"{word} {name}: {detail}")

    if args.plot:
        plot(args.plot, sampler, rows, windows, origin, warm_at)
    if args.json_path:
        payload = {
            "config": {"algo": cfg.algo, "width": cfg.width, "world_size": cfg.world_size,
                       "steps": cfg.steps, "hidden": list(cfg.hidden), "dataset": cfg.dataset,
                       "batch_size": cfg.batch_size},
            "interval_s": args.interval, "warmup_steps": n_warm,
            "bounds": {"rss_growth": RSS_BOUND, "slowest_window_over_median": THROUGHPUT_BOUND},
            "iter_time_s": summary["iter_time_s"], "training_s": wall[-1], "total_s": took,
            "processes": rows, "windows": windows, "trace": trace,
            "checks": [{"check": c, "passed": p, "detail": d} for c, p, d in checks],
            # (seconds since the first step, RSS KiB, fds) of every sample, per process
            "samples": {r["process"]: [(t - origin, rss, fds) for t, rss, fds
                                       in sampler.samples[r["pid"]]] for r in rows},
        }  # fmt: skip
        Path(args.json_path).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
