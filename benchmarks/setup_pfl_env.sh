#!/usr/bin/env bash
# Issue #33.1: an environment with Apple's pfl-research (pfl 0.6.0) for benchmarks/pfl_compare.py, WITHOUT a second
# torch: a venv of the same Python as the project's .venv, whose site-packages is linked to the project's .venv by a
# .pth file (so pfl sees the very same torch, lightning and lightning_fed), plus pfl installed with --no-deps and only
# the small packages that `import pfl, pfl.model.pytorch` needs. pfl is not a dependency of lightning_fed.
#
#   bash benchmarks/setup_pfl_env.sh                       # creates benchmarks/.venv-pfl (gitignored), idempotent
#   OMP_NUM_THREADS=1 benchmarks/.venv-pfl/bin/python benchmarks/pfl_compare.py --quick
#
# Environment: BASE_VENV (default ./.venv, made by `bash scripts/test.sh` or scripts/train_shakespeare.sh),
# PFL_VENV (default benchmarks/.venv-pfl).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_VENV="${BASE_VENV:-$ROOT/.venv}"
PFL_VENV="${PFL_VENV:-$ROOT/benchmarks/.venv-pfl}"
PFL_VERSION=0.6.0
# What `import pfl, pfl.model.pytorch` needs beyond torch/numpy/scipy/packaging; each is installed only when the
# base venv lacks it (the project already depends on dp-accounting; multiprocess/dill come with `datasets`), with
# --no-deps too, so nothing already in the base venv (torch above all) is downloaded or replaced.
PFL_IMPORT_DEPS=(prv-accountant==0.2.0 dp-accounting==0.6.0 multiprocess==0.70.19 dill==0.4.1)

if [ ! -x "$BASE_VENV/bin/python" ]; then
    echo "setup_pfl_env: no $BASE_VENV/bin/python; create the project's venv first (bash scripts/test.sh)" >&2
    exit 1
fi
BASE_SITE="$("$BASE_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
BASE_PY="$("$BASE_VENV/bin/python" -c 'import sys; print(sys._base_executable)')"

if [ ! -x "$PFL_VENV/bin/python" ]; then
    echo "setup_pfl_env: creating $PFL_VENV with $BASE_PY"
    "$BASE_PY" -m venv "$PFL_VENV"
fi
PFL_SITE="$("$PFL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# The .pth line appends the base venv's site-packages to sys.path (after the pfl venv's own), so packages installed
# here win and torch & co. come from the base venv. The base venv's own .pth files (editable lightning_fed) are
# processed too, since site.addsitedir handles a directory's .pth files: use an `import` line for that.
echo "import site; site.addsitedir('$BASE_SITE')" > "$PFL_SITE/zz_base_venv.pth"

if ! "$PFL_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('pfl') != '$PFL_VERSION')" 2>/dev/null; then
    "$PFL_VENV/bin/python" -m pip install --quiet --no-deps "pfl==$PFL_VERSION"
fi
missing=()
for req in "${PFL_IMPORT_DEPS[@]}"; do
    name="${req%%==*}"
    if ! "$PFL_VENV/bin/python" -c "import importlib.metadata as m; m.version('$name')" 2>/dev/null; then
        missing+=("$req")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    "$PFL_VENV/bin/python" -m pip install --quiet --no-deps "${missing[@]}"
fi

OMP_NUM_THREADS=1 "$PFL_VENV/bin/python" - <<'PY'
import importlib.metadata as m
import torch, lightning, lightning_fed, pfl, pfl.model.pytorch  # noqa: F401
print(f"setup_pfl_env: ok - pfl {m.version('pfl')}, torch {torch.__version__} ({torch.__file__}), "
      f"lightning {lightning.__version__}, lightning_fed from {lightning_fed.__file__}")
PY
