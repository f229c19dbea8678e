"""How fast a running `pipesgd train` stops on each signal, and what it leaves.

For each way a job is stopped (SIGTERM, SIGINT to the launcher alone, Ctrl-C to the whole
process group, SIGHUP, SIGKILL to the launcher), start a local job of --world-size workers,
wait for its first periodic checkpoint, send the signal, and print: the launcher's exit code,
the seconds until it exited and until no process of the job was left, the lines it printed on
stderr, and the step of the checkpoint it left.

    python benchmarks/signal_timings.py [--algo pipe] [--world-size 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HOW = ("SIGTERM", "SIGINT", "Ctrl-C", "SIGHUP", "SIGKILL")


def job_pids(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def one(how: str, algo: str, world_size: int, folder: Path) -> dict:
    out = folder / f"{algo}-{how}-{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--model=mlp",
            "--hidden=32", f"--algo={algo}", f"--world-size={world_size}", "--steps=10000000",
            "--eval-every=0", "--checkpoint-every=100", "--no-progress", "--log-level=WARNING",
            f"--out={out}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.npz").is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{how}: the job ended or stalled: {proc.communicate()[1]}")
            time.sleep(0.05)
        time.sleep(1.0)
        sig = signal.SIGINT if how == "Ctrl-C" else getattr(signal, how)
        sent = time.monotonic()
        if how == "Ctrl-C":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        exited = time.monotonic() - sent
        while job_pids(str(out)) and time.monotonic() - sent < 60:
            time.sleep(0.02)
        gone = time.monotonic() - sent
        left = len(job_pids(str(out)))
    finally:
        for pid in job_pids(str(out)):
            os.kill(pid, signal.SIGKILL)
    with np.load(out / "checkpoint.npz") as z:
        step = int(z["next_step"])
    lines = len(err.strip().splitlines())
    return {"how": how, "rc": proc.returncode, "exited_s": exited, "gone_s": gone,
            "left": left, "stderr_lines": lines, "checkpoint": step}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algo", default="pipe")
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.algo}, {args.world_size} workers, tiny preset (MLP 32), {args.repeats} runs")
    print(f"{'signal':<8} {'rc':>4} {'launcher exits (s)':>19} {'all gone (s)':>13} "
          f"{'left':>5} {'stderr lines':>13}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for how in HOW:
            runs = [one(how, args.algo, args.world_size, Path(tmp)) for _ in range(args.repeats)]
            rcs = sorted({r["rc"] for r in runs})
            ex = [r["exited_s"] for r in runs]
            gone = [r["gone_s"] for r in runs]
            print(f"{how:<8} {','.join(map(str, rcs)):>4} "
                  f"{statistics.median(ex):>8.2f} (max {max(ex):.2f}) "
                  f"{statistics.median(gone):>6.2f} ({max(gone):.2f}) "
                  f"{max(r['left'] for r in runs):>5} "
                  f"{max(r['stderr_lines'] for r in runs):>13}")  # fmt: skip


if __name__ == "__main__":
    main()
