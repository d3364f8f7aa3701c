#!/usr/bin/env bash
# The main job: federated FedAdam on real Shakespeare (CPU, offline), logged to runs/ for TensorBoard.
# The paper's configuration (examples/shakespeare_fedadam.yaml) shortened to a few minutes on 2 CPU cores:
# 60 rounds instead of 1500, validation on 2,000 held-out sequences every 10 rounds.
# Any extra arguments go to `lightning-fed fit` (e.g. --trainer.max_epochs 1500 for the full run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# glibc malloc: keep freed large blocks in the heap rather than mapping fresh memory at every step (faster on CPU, the
# same numbers; docs/guide/speed-benchmarks.md); values already in the environment win
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}" MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}"
# one torch thread unless the environment says otherwise: the LSTM's small steps gain little from a second thread
# (16 s vs 15 s for the first round on an idle 2-core machine) and lose 10-30x when other work shares the cores
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "lightning_fed main job: torch uses OMP_NUM_THREADS=${OMP_NUM_THREADS} thread(s) (set OMP_NUM_THREADS to change)"
exec .venv/bin/lightning-fed fit --config examples/shakespeare_fedadam.yaml \
  --trainer.max_epochs 60 --trainer.check_val_every_n_epoch 10 --data.max_eval_samples 2000 "$@"
