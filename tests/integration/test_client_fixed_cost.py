"""benchmarks/client_fixed_cost.py (issue #44.1): its argument checks, and a tiny run whose per-client split adds up
(the timer's and the profile's fixed cost per client are positive and the parts are reported per client)."""

from __future__ import annotations

import csv

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def fixed_cost():
    return load_script("benchmarks/client_fixed_cost.py")


@pytest.mark.parametrize("argv, match", [
    (["--workloads", "mlp,lstm"], "--workloads: unknown"),
    (["--steps", "1,x"], "comma-separated integers"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--cohort", "11", "--clients", "10"], "--cohort must be in [1, 10]"),
    (["--rounds", "1"], "--rounds must be >= 2"),
])
def test_bad_arguments_are_refused_by_name(fixed_cost, argv, match, capsys):
    with pytest.raises(SystemExit):
        fixed_cost.parse_args(argv)
    assert match in capsys.readouterr().err


def test_a_tiny_run_reports_the_per_client_parts(fixed_cost, tmp_path):
    """... and leaves Lightning's log level and torch's thread count as it found them (run in-process, it had left
    ``lightning.pytorch`` at ERROR: later tests' INFO records were lost)."""
    import logging

    import torch

    out = tmp_path / "fixed.csv"
    level, threads = logging.getLogger("lightning.pytorch").level, torch.get_num_threads()
    rows = fixed_cost.main(["--workloads", "mlp", "--steps", "2", "--clients", "4", "--cohort", "2", "--rounds", "3",
                            "--out", str(out)])
    (row,) = rows
    assert (logging.getLogger("lightning.pytorch").level, torch.get_num_threads()) == (level, threads)
    assert row["workload"] == "mlp" and row["steps"] == 2 and row["clients_measured"] == 4  # rounds 1 and 2, 2 each
    for key in ("timer_ms_per_client", "profile_ms_per_client", "start_client", "finish_client", "client_dataloader"):
        assert float(row[key]) > 0, key
    with out.open() as f:
        assert tuple(csv.DictReader(f).fieldnames) == fixed_cost.COLUMNS
