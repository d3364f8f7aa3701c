"""The old-path machinery (lightning_fed/_moved.py): the warning (once per old path, attributed to the line outside
the package that used it, naming the new path and 0.3.0), the name shims, and the rewriting of old paths in text.
The data modules' old module paths end to end: tests/integration/test_moved_modules.py."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lightning_fed import _moved

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(_moved, "_warned", set())


def test_the_old_paths_are_removed_in_0_3_0():
    assert _moved.REMOVED_IN == "0.3.0"
    assert len(_moved.MOVED_MODULES) == 32 and len(_moved.MOVED_NAMES) == 4


def test_a_moved_name_warns_once_at_the_line_that_used_it():
    getattr_ = _moved.moved_names("lightning_fed.server.aggregators.fedaware")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = getattr_("physical_memory_bytes")
        line = sys._getframe().f_lineno - 1
        again = getattr_("physical_memory_bytes")
    from lightning_fed.algorithms.fedaware import physical_memory_bytes

    assert first is again is physical_memory_bytes
    assert [(w.category, w.filename, w.lineno, str(w.message)) for w in caught] == [(
        DeprecationWarning, __file__, line,
        "`lightning_fed.server.aggregators.fedaware.physical_memory_bytes` moved to "
        "`lightning_fed.algorithms.fedaware.physical_memory_bytes`; the old path is removed in lightning_fed 0.3.0: "
        "import from `lightning_fed.algorithms.fedaware.physical_memory_bytes`.")]
    with pytest.raises(AttributeError, match="has no attribute 'FedAWARE'"):
        getattr_("FedAWARE")  # never moved from there


def test_new_paths_rewrites_whole_dotted_names_only():
    text = ("data: {class_path: lightning_fed.datamodules.shakespeare.datamodule.ShakespeareDataModule}\n"
            "partitioner: lightning_fed.datamodules.shakespeare.ShakespeareDataModule\n"
            "again: lightning_fed.datamodules.shakespeare.ShakespeareDataModule\n"
            "stage: lightning_fed.server.aggregators.fedaware.FedAWAREMinNorm\n"
            "kept: [my.lightning_fed.datamodules.iid.X, lightning_fed.datamodules.iid, "
            "lightning_fed.datamodules.iidx.X, lightning_fed.server.aggregators.fedaware.FedAWAREMinNormX]\n")
    new, replaced = _moved.new_paths(text)
    expected = text.replace("lightning_fed.datamodules.shakespeare.", "lightning_fed.datamodules.tasks.shakespeare.")
    expected = expected.replace("stage: lightning_fed.server.aggregators.fedaware.FedAWAREMinNorm\n",
                                "stage: lightning_fed.algorithms.fedaware.FedAWAREMinNorm\n")
    assert new == expected
    assert replaced == [
        ("lightning_fed.datamodules.shakespeare.datamodule.ShakespeareDataModule",
         "lightning_fed.datamodules.tasks.shakespeare.datamodule.ShakespeareDataModule"),
        ("lightning_fed.datamodules.shakespeare.ShakespeareDataModule",
         "lightning_fed.datamodules.tasks.shakespeare.ShakespeareDataModule"),
        ("lightning_fed.server.aggregators.fedaware.FedAWAREMinNorm",
         "lightning_fed.algorithms.fedaware.FedAWAREMinNorm")]


def test_python_m_of_an_old_path_warns_in_the_script():
    """``warn_moved`` from a ``__main__`` (what the old Shakespeare package's ``python -m`` shim does): attributed to
    ``__main__``, so Python's default filters show it to the user."""
    out = subprocess.run([sys.executable, "-c", "from lightning_fed._moved import warn_moved\n"
                          "warn_moved('a.old', 'a.new', depth=0)"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "<string>:2: DeprecationWarning: `a.old` moved to `a.new`" in out.stderr
