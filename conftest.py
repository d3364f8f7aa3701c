"""Repo-root pytest configuration: the doctests of the ``lightning_fed`` package, and the order of the test files.

``pyproject.toml`` runs ``--doctest-modules`` over ``testpaths = ["tests", "lightning_fed"]``, so every
``>>>`` example in a docstring of the package is a test. This file is loaded for both paths.
"""

import os
from pathlib import Path

# Small examples on a small machine: one intra-op thread (and identical numbers across machines).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# ``python -m`` entry points: importing them is harmless, but they hold no examples and are scripts, not API.
collect_ignore_glob = ["lightning_fed/**/__main__.py"]

#: Seconds per test file of a ``--durations=0`` run (``scripts/file_durations.py`` writes it).
DURATIONS = Path(__file__).parent / "tests" / "durations.txt"


def file_seconds(path=None) -> dict:
    """``{test file: seconds}`` from ``path`` (default :data:`DURATIONS`; ``<seconds> <file>`` lines, ``#`` comments);
    empty when it is missing."""
    path = DURATIONS if path is None else path
    if not path.is_file():
        return {}
    pairs = (line.split(None, 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {name.strip(): float(seconds) for seconds, name in pairs}


def pytest_collection_modifyitems(config, items):
    """The longest test files first (issue #52). ``scripts/test.sh`` gives each xdist worker whole files
    (``--dist loadfile --no-loadscope-reorder``) in this order, and a worker holds its next file while it runs one:
    in pytest-xdist's own order (most tests first) the few-test files that start processes (up to a minute each)
    came last, and one core idled while the other ran them. Files not in ``tests/durations.txt`` go after those in
    it, in collection order; the tests of a file keep pytest's order."""
    seconds = file_seconds()
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::", 1)[0], i)

    def key(item):
        name = item.nodeid.split("::", 1)[0]
        return (name not in seconds, -seconds.get(name, 0.0), first[name])

    items.sort(key=key)
