"""benchmarks/shakespeare_async_table.py (issue #54 item 6): FedBuff's runs, and the table at equal simulated time
built from tiny CSVs written in the runner's real format (``reproduce.write_csv`` of merged per-round rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reproduce():
    return load_script("benchmarks/reproduce.py")


def test_54_fedbuff_runs_are_alg1_for_1000_steps_with_the_seed_in_the_dispatches(reproduce):
    """Three seeds of the example, 1,000 server steps validated every 50; the server step is Alg. 1's (uniform mean,
    SGD η_g = 1); a seed also seeds the dispatches."""
    runs = reproduce.TABLES["shakespeare_async"]()
    assert [r.name for r in runs] == ["fedbuff_seed0", "fedbuff_seed1", "fedbuff_seed2"]
    assert [(p.until, p.val_every) for p in runs[0].phases] == [(1000, 50)]
    example = yaml.safe_load((ROOT / "examples" / "shakespeare_async_fedbuff.yaml").read_text())
    assert example["trainer"]["callbacks"] == [{"class_path": "lightning_fed.callbacks.FedAvg",
                                                "init_args": {"lr": 1.0, "weighting": "uniform"}}]
    assert [r.config["data"]["init_args"]["asynchronous"]["seed"] for r in runs] == [0, 1, 2]


def _csv(reproduce, path, steps, seconds_per_step, accuracies, staleness):
    """A run's merged rows: one a step with its clock, clients and staleness; val_acc every 2 steps."""
    rows = [{"round": r, "clock/elapsed_seconds": r * seconds_per_step, "round_clients": 10.0,
             **({"async/staleness_mean": staleness} if staleness else {}),
             **({"val_acc": accuracies[r // 2 - 1]} if r % 2 == 0 else {})} for r in range(1, steps + 1)]
    reproduce.write_csv(rows, path)


def test_54_table_compares_at_equal_simulated_time(reproduce, tmp_path):
    """Hours to each target (the first validation at or above it), val_acc at 1 simulated hour (the last validation
    at or before 3,600 s), the final val_acc, updates per simulated hour and mean staleness — figures by hand."""
    table = load_script("benchmarks/shakespeare_async_table.py")
    runs = [reproduce.Run("shakespeare_async", "fedbuff_seed0", {}, (reproduce.Phase(8, 2),), results_dir=tmp_path)]
    sync = [reproduce.Run("shakespeare_clock", "fedadam_seed0", {}, (reproduce.Phase(8, 2),), results_dir=tmp_path)]
    # FedBuff: a step every 900 s; validations at 1,800 / 3,600 / 5,400 / 7,200 s
    _csv(reproduce, runs[0].csv_path, 8, 900.0, [0.30, 0.36, 0.41, 0.46], 9.0)
    # synchronous: a round every 1,000 s; validations at 2,000 / 4,000 / 6,000 / 8,000 s
    _csv(reproduce, sync[0].csv_path, 8, 1000.0, [0.35, 0.39, 0.40, 0.44], None)
    text = table.table(runs, {"fedadam": sync, "fedavg": []}, reproduce.read_csv, reproduce.series,
                       reproduce.mean_std, reproduce.target_cells)
    lines = text.splitlines()
    rows = [line.split(" | ")[1:] for line in lines[2:5]]
    # seeds, hours to 35/40/45 %, val_acc at 1 h, final, updates an hour (80 updates / 2 h, / 8000/3600 h), staleness
    assert rows[0] == ["1 of 1", "1.00", "1.50", "2.00", "36.00", "46.00", "40.00", "9.00 |"]
    assert rows[1] == ["1 of 1", "0.56", "1.67", "– (0 of 1)", "35.00", "44.00", "36.00", "0.00 |"]
    assert rows[2] == ["0 of 0", "–", "–", "–", "–", "–", "–", "– |"]
    assert lines[5:] == ["", "![validation accuracy against simulated hours, per run](../docs/images/shakespeare_time.png)"]


def test_54_writing_either_section_draws_the_time_figure_from_the_csvs(reproduce, tmp_path, monkeypatch):
    """``reproduce.py table shakespeare_clock|shakespeare_async --write`` draws ``docs/images/shakespeare_time.png``
    beside the README from the committed CSVs: one line per finished run (the runs of the CSVs written here)."""
    import matplotlib

    monkeypatch.setattr(reproduce, "RESULTS", tmp_path / "results")
    _csv(reproduce, tmp_path / "results" / "shakespeare_clock" / "fedavg_seed0.csv", 8, 1000.0,
         [0.35, 0.39, 0.40, 0.44], None)
    _csv(reproduce, tmp_path / "results" / "shakespeare_async" / "fedbuff_seed1.csv", 8, 900.0,
         [0.30, 0.36, 0.41, 0.46], 9.0)
    readme = tmp_path / "repo" / "examples" / "README.md"
    readme.parent.mkdir(parents=True)
    readme.write_text(f"intro\n{reproduce.BEGIN}\n{reproduce.END}\n")
    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", _counting(matplotlib.axes.Axes.plot, drawn))
    reproduce.write_tables(readme, ["shakespeare_clock"])
    png = tmp_path / "repo" / "docs" / "images" / "shakespeare_time.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(drawn) == 2
    assert readme.read_text().count("../docs/images/shakespeare_time.png") == 1


def _counting(plot, drawn):
    def wrapper(self, *args, **kwargs):
        drawn.append(args)
        return plot(self, *args, **kwargs)
    return wrapper
