"""The ``lightning-fed`` entry point's fast help (lightning_fed/console.py): ``fit --help`` from the cache prints
exactly what the live rendering printed at the same width, without importing torch, Lightning or jsonargparse; a
changed key (width, a source file, a dependency) is not served from the cache. Not a timed test: the times are in
the module's docstring and the issue (#50 item 6)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fed import console

ROOT = Path(__file__).resolve().parents[1]

#: The console script as pip writes it, run in a fresh interpreter: prints the help, then (on stderr) which of the
#: heavy packages were imported.
SCRIPT = """
import sys
from lightning_fed.console import main
sys.argv[0] = "lightning-fed"
main()
sys.stdout.flush()
print(sorted(m for m in ("torch", "lightning", "jsonargparse", "lightning_fed.cli") if m in sys.modules),
      file=sys.stderr)
"""


@pytest.fixture
def help_env(tmp_path, monkeypatch):
    """An empty cache folder and a fixed width (argparse reads ``COLUMNS``), here and in the subprocesses."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "97")
    monkeypatch.delenv(console.CACHE_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["lightning-fed", "fit", "--help"])
    return tmp_path / "cache" / "lightning_fed" / "help"


def _fast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_fit_help_from_the_cache_is_the_live_rendering_without_heavy_imports(help_env, capsys):
    with pytest.raises(SystemExit) as info:
        console.main()  # an empty cache: rendered live (lightning_fed.cli.main), printed and stored
    assert info.value.code == 0
    live = capsys.readouterr().out
    assert live.startswith("usage: lightning-fed [options] fit ") and "--trainer.max_epochs" in live
    assert max(map(len, live.splitlines()[:5])) <= 97  # argparse formats for COLUMNS - 2
    assert [p.read_text() for p in help_env.iterdir()] == [live]

    out = _fast("fit", "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == live
    assert out.stderr.strip() == "[]"


def test_a_changed_key_is_not_served_from_the_cache(help_env, tmp_path):
    key = console.help_key("fit", "lightning-fed", 97)
    help_env.mkdir(parents=True)
    (help_env / f"{key}.txt").write_text("the stored text\n")
    out = _fast("fit", "--help")
    assert (out.returncode, out.stdout, out.stderr.strip()) == (0, "the stored text\n", "[]")

    # every part of the key changes it: the width, the subcommand, the program, a dependency's install
    assert len({key, console.help_key("fit", "lightning-fed", 96), console.help_key("test", "lightning-fed", 97),
                console.help_key("fit", "cli.py", 97),
                console.help_key("fit", "lightning-fed", 97, dependencies=console.HELP_DEPENDENCIES[1:])}) == 5
    # and so does any change to a source file of the package (here a copy of it)
    copy = tmp_path / "lightning_fed"
    shutil.copytree(console._PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = console.help_key("fit", "lightning-fed", 97, package=copy)
    assert before == console.help_key("fit", "lightning-fed", 97, package=copy)
    (copy / "trainer.py").write_text((copy / "trainer.py").read_text() + "\n# a changed docstring or signature\n")
    assert console.help_key("fit", "lightning-fed", 97, package=copy) != before


@pytest.mark.parametrize("argv", [["fit", "--help", "--config", "a.yaml"], ["fit"], ["--help"], ["partition", "-h"]])
def test_only_a_bare_subcommand_help_takes_the_fast_path(argv):
    assert console.help_subcommand(argv) is None

