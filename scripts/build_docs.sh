#!/usr/bin/env bash
# Build the API reference site (README guide pages, docs/*.md, the API from the docstrings) into ./site with
# `mkdocs build --strict`: a cross-reference to a lightning_fed object that does not exist, a docstring section
# griffe cannot parse or a broken link in the pages fails the build. Installs the pinned "docs" extra of
# pyproject.toml into the venv first when any of it is missing or at another version. Run by .ci/run.
# Every link of the built site must work opened from disk (scripts/docs_hooks.py checks them after the build).
#   bash scripts/build_docs.sh            # then open site/index.html (search: python -m http.server -d site)
#   VENV_PYTHON=/path/to/python bash scripts/build_docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV_PYTHON:-.venv/bin/python}
missing=$("$PY" - <<'PYEOF'
import importlib.metadata as md, re
# the "docs" extra of pyproject.toml (read as text: tomllib needs Python 3.11, the project supports 3.10)
block = re.search(r"^docs = \[(.*?)^\]", open("pyproject.toml").read(), re.S | re.M).group(1)
for req in re.findall(r'^\s*"([^"]+)"', block, re.M):
    name, version = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", req).groups()
    try:
        ok = md.version(name) == version
    except md.PackageNotFoundError:
        ok = False
    if not ok:
        print(req)
PYEOF
)
if [ -n "$missing" ]; then
  echo "build_docs: installing $(echo $missing)"
  # shellcheck disable=SC2086  # one requirement per word
  "$PY" -m pip install -q $missing  # byte-compiled at install (see setup_env.sh)
fi
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --clean --site-dir site "$@"
