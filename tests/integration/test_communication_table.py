"""benchmarks/communication_table.py (issue #56 item 5): the ``communication`` table's runs and configs, and its
table and figure built from tiny CSVs written in the runner's real format (``reproduce.write_csv`` of merged
per-round rows)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
COMPRESSORS = ("none", "bf16", "uniform8", "qsgd4", "topk1_ef")


@pytest.fixture(scope="module")
def reproduce():
    return load_script("benchmarks/reproduce.py")


def test_56_communication_lists_60_runs_each_its_config_with_one_compressor(reproduce):
    """2 tasks × 2 rules × 5 uplinks × seeds 0-2, seed 0 first; each run is its task × rule example with the
    uplink's Compression half (its draw seed the run's seed) and nothing else changed; Shakespeare 200 rounds,
    Fashion-MNIST 100, validation every 10."""
    runs = reproduce.TABLES["communication"]()
    assert [r.name for r in runs] == [f"{t}_{r}_{c}_seed{s}" for s in (0, 1, 2) for t in ("shakespeare", "fmnist")
                                      for r in ("fedavg", "fedadam") for c in COMPRESSORS]
    want = {"bf16": ({"class_path": "lightning_fed.communication.BFloat16"}, False),
            "uniform8": ({"class_path": "lightning_fed.communication.UniformQuantization",
                          "init_args": {"bits": 8}}, False),
            "qsgd4": ({"class_path": "lightning_fed.communication.QSGD", "init_args": {"levels": 7}}, False),
            "topk1_ef": ({"class_path": "lightning_fed.communication.TopK", "init_args": {"fraction": 0.01}}, True)}
    examples = {(t, r): yaml.safe_load((ROOT / "examples" / f"communication_{t}_{r}.yaml").read_text())
                for t in ("shakespeare", "fmnist") for r in ("fedavg", "fedadam")}
    for run in runs:
        task, rule, c, seed = (run.labels[k] for k in ("task", "rule", "compressor", "seed"))
        example = examples[task, rule]
        assert run.rounds == {"shakespeare": 200, "fmnist": 100}[task] and run.phases[0].val_every == 10
        assert run.config["seed_everything"] == run.config["data"]["init_args"]["seed"] == seed
        trainer = dict(run.config["trainer"])
        halves = trainer.pop("client_algorithms", None)
        assert trainer == example["trainer"] and run.config["model"] == example["model"]
        if c == "none":
            assert halves is None
            continue
        (half,) = halves
        compressor, feedback = want[c]
        assert half == {"class_path": "lightning_fed.communication.Compression", "init_args": {
            "compressor": compressor, "seed": seed, **({"error_feedback": True} if feedback else {})}}


def _write_run_csv(reproduce, run, accuracies: list[float], bytes_per_round: float) -> None:
    """A finished run's CSV as ``execute`` writes it: the ledger's totals every round, val_acc every 10th."""
    rows = [{"round": r, "round_train_loss": 1.0 / r, "total_bytes_up": bytes_per_round * r}
            for r in range(1, run.rounds + 1)]
    for i, acc in enumerate(accuracies):
        rows[10 * (i + 1) - 1]["val_acc"] = acc
    rows[-1]["val_acc"] = accuracies[-1]
    reproduce.write_csv(rows, run.csv_path)


def test_56_communication_table_from_csvs(reproduce, tmp_path, monkeypatch):
    """Final val_acc (%), MB uploaded over the run and MB uploaded when val_acc first reached the task's target
    (70 % on Fashion-MNIST): mean ± sample std over the finished seeds; a seed that never reached it is counted
    apart; a row without CSVs shows 0/3 and –."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    runs = {r.name: r for r in reproduce.TABLES["communication"]()}
    # FedAdam + top-1 % on Fashion-MNIST, 100 rounds: seed 0 reaches 70 % at round 20, seed 1 at round 30, seed 2 never
    curves = {0: [0.5, 0.72] + [0.8] * 8, 1: [0.5, 0.6, 0.71] + [0.75] * 7, 2: [0.5] * 9 + [0.65]}
    for seed, curve in curves.items():
        _write_run_csv(reproduce, runs[f"fmnist_fedadam_topk1_ef_seed{seed}"], curve, 1e6 + 0.5e6 * seed)
    text = reproduce.make_table("communication")
    row = next(line for line in text.splitlines() if line.startswith("| FedAdam | top-1 % + EF | 3/3"))
    finals = [80.0, 75.0, 65.0]
    megabytes = [100.0, 150.0, 200.0]
    reached = [20.0, 45.0]  # 20 rounds × 1 MB, 30 rounds × 1.5 MB
    assert row == (f"| FedAdam | top-1 % + EF | 3/3 | {statistics.mean(finals):.2f} ± {statistics.stdev(finals):.2f} | "
                   f"{statistics.mean(megabytes):.2f} ± {statistics.stdev(megabytes):.2f} | "
                   f"{statistics.mean(reached):.2f} ± {statistics.stdev(reached):.2f} (2 of 3) |")
    assert "| FedAvg | none (float32) | 0/3 | – | – | – |" in text
    assert "MB uploaded to reach 70 %" in text and "MB uploaded to reach 45 %" in text


def test_56_communication_figure_from_csvs(reproduce, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    runs = reproduce.TABLES["communication"]()
    for run in runs[:2]:  # Shakespeare FedAvg none and bf16, seed 0
        _write_run_csv(reproduce, run, [0.1 * i for i in range(1, 21)], 3.3e7 / (1 + (run.labels["compressor"] != "none")))
    path = reproduce.communication_runs.figure(runs, reproduce.communication_rows, tmp_path / "communication.png",
                                               dpi=30)
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
