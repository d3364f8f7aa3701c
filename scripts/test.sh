#!/usr/bin/env bash
# Set up the environment and run the test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
# one process per core (pytest-xdist; PYTEST_WORKERS=0 runs in this process), each test file in one worker
# (module fixtures built once), the longest files first (conftest.py's order from tests/durations.txt, kept by
# --no-loadscope-reorder), one OpenMP thread each; the 20 slowest tests listed at the end of every log (#52)
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} .venv/bin/python -m pytest -q -m "not slow" \
  -n "${PYTEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder --durations=20 "$@"
