"""Seconds per test file from a pytest log run with ``--durations=0`` (issue #52): the order in which
``scripts/test.sh`` hands whole files to the xdist workers, longest first (the root ``conftest.py`` reads it).

    bash scripts/test.sh --durations=0 > /tmp/test.log 2>&1
    python scripts/file_durations.py /tmp/test.log > tests/durations.txt

Each line of the output is ``<seconds> <file>``: the sum of the file's setup, call and teardown times in the log
(pytest lists only those of 5 ms and more), longest first, with a ``#`` header saying how many files were summed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

#: ``12.34s call     tests/x/test_y.py::test_z[param]`` (pytest's ``--durations`` lines).
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?)::")


def file_seconds(lines) -> dict[str, float]:
    """``{file: seconds}`` summed over the ``--durations`` lines among ``lines`` (other lines are skipped).

    >>> file_seconds(["1.50s call     tests/a.py::test_x", "0.25s setup    tests/a.py::test_x",
    ...               "3.00s call     tests/b.py::test_y[1]", "== 2 passed =="])
    {'tests/a.py': 1.75, 'tests/b.py': 3.0}
    """
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        match = LINE.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
    return dict(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="a pytest log with --durations=0")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        seconds = file_seconds(f)
    if not seconds:
        sys.exit(f"{args.log}: no --durations lines (run pytest with --durations=0)")
    print(f"# seconds per test file (setup + call + teardown), {len(seconds)} files, from a --durations=0 run; "
          "scripts/file_durations.py writes it")
    for name, total in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{total:.2f} {name}")


if __name__ == "__main__":
    main()
