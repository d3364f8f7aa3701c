"""scripts/setup_env.sh (what CI runs first, issue #52): a fresh venv gets torch, torchvision and the package with the
test extras in one pip run without byte-compiling every installed module; a venv that has them runs no pip at all;
a changed pyproject.toml installs the package again (and only it).

The venv's ``python`` and ``pip`` are stand-ins (shell scripts): ``python -c`` answers the script's two checks from
marker files that the stand-in ``pip install`` writes, and every pip command line is recorded."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYTHON = """#!/usr/bin/env bash
# the setup script's checks: `import torch, torchvision`, and "is this checkout's lightning_fed the installed one"
case "$2" in
  *"import torch, torchvision"*) [ -e "$VENV/torch" ] ;;
  *find_spec*) [ -e "$VENV/package" ] ;;
  *) exit 2 ;;
esac
"""

PIP = """#!/usr/bin/env bash
echo "$*" >> "$VENV/pip.log"
case " $* " in *" torch==2.14.1 "*) touch "$VENV/torch" ;; esac
case " $* " in *" -e "*) touch "$VENV/package" ;; esac
"""


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup_env.sh", repo / "scripts")
    shutil.copy(ROOT / "pyproject.toml", repo)
    (repo / "lightning_fed").mkdir()
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name, text in (("python", PYTHON), ("pip", PIP)):
        (venv_bin / name).write_text(text)
        (venv_bin / name).chmod(0o755)
    return repo


def _setup(repo: Path) -> list[str]:
    """Runs the script; the pip command lines of this run."""
    log = repo / ".venv" / "pip.log"
    log.unlink(missing_ok=True)
    subprocess.run(["bash", "scripts/setup_env.sh"], cwd=repo, check=True, timeout=60,
                   env={"PATH": "/usr/bin:/bin", "VENV": str(repo / ".venv")})
    return log.read_text().splitlines() if log.exists() else []


def test_a_fresh_venv_installs_everything_in_one_pip_run_byte_compiled(tmp_path):
    """One pip run, compiled at install: with PYTHONDONTWRITEBYTECODE=1 set (as on this project's machines) no import
    writes a .pyc, so --no-compile would make every process compile torch & co. from source."""
    repo = _checkout(tmp_path)
    assert _setup(repo) == ["install -q --upgrade pip",
                            "install -q torch==2.14.1 torchvision==0.29.1 -e .[test,llm]"]
    stamp = (repo / ".venv" / ".lightning_fed-pyproject.sha256").read_text()
    assert stamp.endswith(f" {repo} [test,llm]\n")
    assert _setup(repo) == []  # all there: no pip


def test_a_changed_pyproject_reinstalls_only_the_package(tmp_path):
    repo = _checkout(tmp_path)
    _setup(repo)
    with open(repo / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    assert _setup(repo) == ["install -q -e .[test,llm]"]
    assert _setup(repo) == []
