"""Every module of the package imports as the first import of a fresh interpreter: ``import lightning_fed`` is lazy
(issue #50 item 6), so no eager package ``__init__`` hides an import cycle any more (``lightning_fed.algorithms.<x>``
first did meet one). One forked child per module, after the third-party packages are imported once: ~1 min of CPU,
so marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, os, pathlib, sys, warnings
import numpy, torch, torchmetrics, jsonargparse, lightning.pytorch.cli  # once, before the forks
assert not any(m.startswith("lightning_fed.") for m in sys.modules)
bad = []
for path in sorted(pathlib.Path("lightning_fed").rglob("*.py")):
    if path.name == "__main__.py":
        continue
    name = path.with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
    pid = os.fork()
    if pid == 0:
        warnings.simplefilter("ignore")
        try:
            importlib.import_module(name)
        except BaseException as err:
            print(f"{name}: {type(err).__name__}: {err}", flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        bad.append(name)
print("failed:", bad)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks one child per module")
def test_every_module_imports_first():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "failed: []", out.stdout[-3000:]
