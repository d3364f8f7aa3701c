"""The order in which ``scripts/test.sh`` hands test files to the xdist workers (issue #52): the root conftest.py
sorts the collected tests longest file first by ``tests/durations.txt``, which ``scripts/file_durations.py`` writes
from a ``--durations=0`` log."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def _root_conftest():
    """The root conftest.py as a module of its own (not the one pytest registered)."""
    spec = importlib.util.spec_from_file_location("_root_conftest_under_test", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_files_are_ordered_longest_first_and_a_files_tests_keep_their_order(tmp_path, monkeypatch):
    conftest = _root_conftest()
    durations = tmp_path / "durations.txt"
    durations.write_text("# header\n40.5 tests/b.py\n2.0 lightning_fed/x.py\n0.1 tests/a.py\n")
    monkeypatch.setattr(conftest, "DURATIONS", durations)
    ids = ["tests/a.py::test_2", "tests/a.py::test_1", "tests/new.py::test", "tests/b.py::test[1]",
           "lightning_fed/x.py::lightning_fed.x.f", "tests/b.py::test[0]", "tests/other.py::test"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        "tests/b.py::test[1]", "tests/b.py::test[0]",  # 40.5 s, in collection order within the file
        "lightning_fed/x.py::lightning_fed.x.f",  # 2.0 s
        "tests/a.py::test_2", "tests/a.py::test_1",  # 0.1 s
        "tests/new.py::test", "tests/other.py::test",  # not listed: last, in collection order
    ]


def test_without_a_durations_file_the_collection_order_is_kept(tmp_path, monkeypatch):
    conftest = _root_conftest()
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "missing.txt")
    items = [SimpleNamespace(nodeid=i) for i in ("tests/z.py::t", "tests/a.py::t", "tests/z.py::u")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/z.py::t", "tests/z.py::u", "tests/a.py::t"]  # a file's tests together


def test_file_durations_sums_setup_call_and_teardown_per_file(tmp_path, capsys):
    script = load_script("scripts/file_durations.py")
    log = tmp_path / "test.log"
    log.write_text("........ [100%]\n============ slowest durations ============\n"
                   "12.50s call     tests/integration/test_x.py::test_a[1-2]\n"
                   "0.50s setup    tests/integration/test_x.py::test_a[1-2]\n"
                   "3.25s call     tests/test_y.py::test_b\n"
                   "1.00s call     lightning_fed/z.py::lightning_fed.z.f\n"
                   "(2 durations < 0.005s hidden.  Use -vv to show these durations.)\n"
                   "3 passed in 20.00s\n")
    script.main([str(log)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# ")
    assert lines[1:] == ["13.00 tests/integration/test_x.py", "3.25 tests/test_y.py", "1.00 lightning_fed/z.py"]


def test_every_file_in_the_committed_durations_exists():
    """A renamed or removed test file shows here: write tests/durations.txt again (scripts/file_durations.py)."""
    seconds = _root_conftest().file_seconds()
    assert len(seconds) >= 20
    assert [name for name in seconds if not (ROOT / name).is_file()] == []
