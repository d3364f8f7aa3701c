#!/usr/bin/env bash
# Create ./.venv (once) with torch, torchvision and lightning_fed installed; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, torchvision" 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "torch==2.14.1" "torchvision==0.29.1"
fi
.venv/bin/pip install -q -e ".[test]"
