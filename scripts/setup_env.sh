#!/usr/bin/env bash
# Create ./.venv (once) with torch, torchvision and lightning_fed installed; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# One pip run installs what is missing: torch + torchvision when they do not import, and the package (editable)
# with the extras the tests need (`llm`: transformers + peft, for the federated LoRA tests) when pyproject.toml or
# the extras changed or this checkout's package is not the one installed (an editable install follows code changes
# by itself). Modules are byte-compiled at install (pip's default), NOT with --no-compile: where the environment sets
# PYTHONDONTWRITEBYTECODE=1 (this project's machines do) no import ever writes a .pyc, so every process would compile
# torch, lightning, transformers, ... from source again (tried in #52: CI's tests 877 s -> 1,172 s).
install=()
if ! .venv/bin/python -c "import torch, torchvision" 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  install+=("torch==2.14.1" "torchvision==0.29.1")
fi
extras="test,llm"
stamp=.venv/.lightning_fed-pyproject.sha256
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $(pwd) [$extras]"
package=0
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
   || ! .venv/bin/python -c "import importlib.util as u, os, sys; s = u.find_spec('lightning_fed'); sys.exit(s is None or os.path.dirname(os.path.realpath(s.origin)) != os.path.realpath('lightning_fed'))" 2>/dev/null; then
  install+=(-e ".[$extras]")
  package=1
fi
if [ ${#install[@]} -gt 0 ]; then
  .venv/bin/pip install -q "${install[@]}"
fi
if [ "$package" = 1 ]; then
  echo "$want" > "$stamp"
fi
