#!/usr/bin/env bash
# Issue #33.5: fetch, here (online), the wheels that the offline GPU machine lacks, for benchmarks/device_run.sh there.
# The device image has Python 3.12 with torch, lightning, torchmetrics, torchvision, matplotlib, pandas, pyarrow
# (/work/.library/device/KINDS.md lists it); lightning_fed's CLI and pfl-research need these pure-Python wheels too:
#   jsonargparse[signatures] (the main job's `lightning-fed fit`), pfl 0.6.0 and what `import pfl.model.pytorch`
#   needs (prv-accountant, dp-accounting, multiprocess, dill). All --no-deps, for CPython 3.12 on x86-64 Linux.
#
#   bash benchmarks/device_wheels.sh          # -> benchmarks/.device-wheels/ (gitignored, ~1 MB)
# then carry it with the Shakespeare data to the device and run benchmarks/device_run.sh there:
#   run(command="bash benchmarks/device_run.sh", carry=["benchmarks/.device-wheels", "data/shakespeare"])
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${DEVICE_WHEELS:-$ROOT/benchmarks/.device-wheels}"
PY="${VENV_PYTHON:-$ROOT/.venv/bin/python}"
WHEELS=(
    jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0
    pfl==0.6.0 prv-accountant==0.2.0 dp-accounting==0.5.0 multiprocess==0.70.19 dill==0.4.1
)
mkdir -p "$DEST"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d "$DEST" "${WHEELS[@]}"
ls -1 "$DEST"
