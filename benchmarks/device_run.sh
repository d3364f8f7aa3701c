#!/usr/bin/env bash
# Issue #33.5: on the GPU machine (offline; its python3 holds torch and lightning), from the repository root:
# install the carried wheels of benchmarks/device_wheels.sh into benchmarks/.device-site (--no-index --no-deps),
# then run the GPU suite (plain / sequential / vectorized / pfl / k processes, host syncs, the main job) and the
# two-process comparison with pfl on the GPU, writing their CSVs to $OUT (or benchmarks/results/ without $OUT).
#   run(command="bash benchmarks/device_run.sh", carry=["benchmarks/.device-wheels", "data/shakespeare"],
#       timeout_s=560)
# Budget: at most 420 + 110 s of commands (the suite writes its CSV after every workload, so a suite stopped by its
# time limit keeps the workloads it finished); SUITE_ARGS="--quick" for a check, e.g. "--workloads mlp,cnn" to trim.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${DEVICE_PYTHON:-python3}"
SITE="$PWD/benchmarks/.device-site"
for wheel in benchmarks/.device-wheels/*.whl; do  # one by one: a wheel for another Python is skipped, not fatal
    [ -e "$wheel" ] || continue
    "$PY" -m pip install --quiet --no-index --no-deps --upgrade --target "$SITE" "$wheel" 2>/dev/null \
        || echo "device_run: $(basename "$wheel") does not install with $PY (skipped)"
done
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONWARNINGS=ignore
OUT_DIR="${OUT:-benchmarks/results}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, lightning, lightning_fed; print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())"
"$PY" -c "import pfl, pfl.model.pytorch; print('pfl imports')" || echo "pfl does not import: its rows are skipped"
OMP_NUM_THREADS=4 timeout 420 "$PY" benchmarks/gpu_suite.py --device cuda --data-dir data ${SUITE_ARGS:-} \
    --out "$OUT_DIR/gpu_suite.csv" || echo "gpu_suite exited with $?"
timeout 110 "$PY" benchmarks/pfl_processes.py --device cuda --cohorts 10 --rounds 4 --repeats 1 \
    --out "$OUT_DIR/pfl_processes_gpu.csv" || echo "pfl_processes exited with $?"
