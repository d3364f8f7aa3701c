#!/usr/bin/env bash
# Issue #33.5: on the GPU machine (offline; its python3 holds torch and lightning), from the repository root:
# install the carried wheels of benchmarks/device_wheels.sh into benchmarks/.device-site (--no-index --no-deps),
# then run the GPU suite (plain / sequential / vectorized / pfl / k processes, host syncs, the main job) and the
# two-process comparison with pfl on the GPU, writing their CSVs to $OUT (or benchmarks/results/ without $OUT).
#   run(command="set -o pipefail; PYTHONUNBUFFERED=1 bash benchmarks/device_run.sh 2>&1 | tee $OUT/device_run.log",
#       carry=["benchmarks/.device-wheels", "data/shakespeare"], timeout_s=570)
# Budget: at most 150 + 95 + 35 + 90 + 85 + 40 s of commands (T1..T6 change them); SUITE_ARGS="--quick" for a check.
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
DEVICE="${DEVICE:-cuda}"  # DEVICE=cpu SUITE_ARGS=--quick: a dry run of this script on a machine without CUDA
# In order of what issue #33's GPU targets need, each stage with its own time limit and output in $OUT (a stage stopped
# by its limit keeps the workloads it finished): (1) plain / sequential / vectorized / pfl and the host syncs per
# local step, cohort 10, three workloads; (2) the same at cohort 50 for the MLP and CNN (vectorization's room); (3) the
# main job; (4) k processes sharing the GPU; (5) two processes against pfl's two; (6) where the sequential executor's
# time goes per step on the GPU: overhead.py's cProfile of it on the MLP (the top functions, as text). Times on one
# H200 (2026-11-27): (1) 125 s, (2) 85 s with one repeat, (3) 18 s, (4) ~20 s a run, (5) 77 s.
suite() { local limit=$1; shift; OMP_NUM_THREADS=4 timeout "$limit" "$PY" benchmarks/gpu_suite.py --device "$DEVICE" \
    --data-dir data ${SUITE_ARGS:-} "$@" || echo "gpu_suite $* exited with $?"; }
suite "${T1:-150}" --variants plain,sequential,vectorized,pfl,host_syncs --out "$OUT_DIR/gpu_suite.csv"
suite "${T2:-95}" --workloads mlp,cnn --cohort "${C2:-50}" --repeats 1 --variants plain,sequential,vectorized,pfl \
    --out "$OUT_DIR/gpu_suite_c50.csv"
suite "${T3:-35}" --variants main_job --out "$OUT_DIR/gpu_suite_main_job.csv"
suite "${T4:-90}" --workloads mlp,cnn --repeats 1 --variants ddp,ddp_vectorized --out "$OUT_DIR/gpu_suite_ddp.csv"
timeout "${T5:-85}" "$PY" benchmarks/pfl_processes.py --device "$DEVICE" --cohorts "${C4:-10}" --rounds 4 --repeats 1 \
    ${PROC_ARGS:-} --out "$OUT_DIR/pfl_processes_gpu.csv" || echo "pfl_processes exited with $?"
OMP_NUM_THREADS=4 timeout "${T6:-40}" "$PY" benchmarks/overhead.py --model cnn --cnn-arch mlp256 --device "$DEVICE" \
    --samples-per-client "${S6:-600}" --rounds 3 --repeats 1 --only lightning --profile /tmp/sequential.prof \
    --profile-top 45 > "$OUT_DIR/profile_sequential_mlp.txt" 2>&1 || echo "overhead.py --profile exited with $?"
