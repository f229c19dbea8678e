"""The benchmarks run end to end at their quick size. (Their figures are read by people, never
asserted: a timing error on a busy machine is a measurement, not a failure.)"""

import json
import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


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
