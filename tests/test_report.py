"""`lightning-fed report` (issue #50 item 4): results out of real run folders. Three tiny federated fits write
TensorBoard event files and, for the same runs, a CSVLogger's metrics.csv: two seeds of one setting (client lr 0.1)
and one run of another (lr 0.3). The report's numbers are checked against metrics.csv read with the csv module and
NumPy (final = last round, best = max, or min for a loss, first round reaching it; mean and std with ddof=1)."""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import TensorDataset

from helpers import SmallClassifier, classification_dataset, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.cli import EXIT_BAD_ARGUMENT, main
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.report import ReportError, plot_report, report, validation_metrics, write_csv

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
#: (version, seed, client lr): two seeds of lr 0.1, one run of lr 0.3
RUNS = ((0, 0, 0.1), (1, 1, 0.1), (2, 0, 0.3))


class AccClassifier(SmallClassifier):
    """SmallClassifier that also logs its validation accuracy (a metric that grows)."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(tensorboard root, {version: metrics.csv rows})`` of the three fits."""
    root = tmp_path_factory.mktemp("report")
    train, val = classification_dataset(n=60, n_val=30, seed=0)
    train = TensorDataset(*train.tensors)  # no `targets`: no per-class partition figures drawn (half the fits' time)
    rows = {}
    for version, seed, lr in RUNS:
        L.seed_everything(seed, verbose=False)
        dm = FederatedDataModule(train, val_dataset=val, partitioner=IIDPartitioner(num_clients=4, seed=0),
                                 clients_per_round=2, batch_size=10, seed=seed, eval_clients_per_round="all",
                                 eval_fraction=0.25)
        loggers = [TensorBoardLogger(root / "tb", version=version, default_hp_metric=False),
                   CSVLogger(root / "csv", version=version)]
        trainer = FederatedTrainer(max_epochs=ROUNDS, callbacks=[FedAvg()],
                                   **(quiet_trainer_kwargs(root) | {"logger": loggers}))
        trainer.fit(AccClassifier(lr=lr), datamodule=dm)
        with open(loggers[1].log_dir + "/metrics.csv") as f:
            rows[version] = list(csv.DictReader(f))
    return root / "tb", rows


def _curve(rows: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    kept = [r for r in rows if r.get(metric, "") != ""]
    return np.array([int(r["step"]) for r in kept]), np.array([float(r[metric]) for r in kept])


def _expected(rows: list[dict], metric: str, minimize: bool) -> dict:
    rounds, values = _curve(rows, metric)
    i = int(np.argmin(values) if minimize else np.argmax(values))
    return {"final": values[-1], "final_round": int(rounds[-1]), "best": values[i], "best_round": int(rounds[i])}


METRICS = ("val_acc", "val_loss", "fed_val_acc/weighted", "fed_val_loss/worst10")


def test_each_runs_final_and_best_value_and_round_are_read_from_its_logs(runs):
    tb, rows = runs
    result = report([tb])
    assert [r.name for r in result.runs] == ["version_0", "version_1", "version_2"]
    assert all(r.settings_source == "hparams session" for r in result.runs)
    # default: every validation metric logged (metrics.csv's val_* and fed_val_* columns), val_* first
    columns = list(rows[0][0])
    assert result.metrics == sorted(c for c in columns if c.startswith("val_")) + sorted(
        c for c in columns if c.startswith(("fed_val_", "fed_personal_val_")))
    assert len(result.metrics) == 2 + 2 * 6 * 2  # fed_personal_* too: every method logs it (#50 item 3)
    for run, (version, _, _) in zip(result.runs, RUNS):
        for metric in METRICS:
            minimize = "loss" in metric
            assert result.minimized[metric] is minimize
            expected = _expected(rows[version], metric, minimize)
            assert expected["final_round"] == ROUNDS - 1
            assert run.summary(metric, minimize) == pytest.approx(expected, rel=1e-7)
    # the printed table: one row per run under the metric's heading, 4 significant digits
    text = result.text.splitlines()
    block = text.index("val_loss (best = min)")
    e = _expected(rows[1], "val_loss", True)
    assert text[block + 3].split() == ["version_1", f"{e['final']:.4g}", str(ROUNDS - 1), f"{e['best']:.4g}",
                                       str(e["best_round"])]


def test_runs_equal_but_for_seeds_are_grouped_with_mean_and_std_over_seeds(runs):
    tb, rows = runs
    result = report([tb], metrics=["val_acc", "fed_val_loss/weighted"])
    assert [[r.name for r in g.runs] for g in result.groups] == [["version_0", "version_1"], ["version_2"]]
    assert [r.seeds for r in result.groups[0].runs] == [{"global_seed": 0, "partitioner/seed": 0, "seed": 0},
                                                        {"global_seed": 1, "partitioner/seed": 0, "seed": 1}]
    # the groups are told apart by what differs: the client learning rate (the model's and the optimizer's)
    assert result.groups[0].label == "client_optimizer/lr=0.1, model/lr=0.1"
    assert result.groups[1].label == "client_optimizer/lr=0.3, model/lr=0.3"
    for metric in ("val_acc", "fed_val_loss/weighted"):
        minimize = "loss" in metric
        final = np.array([_expected(rows[v], metric, minimize)["final"] for v in (0, 1)])
        best = np.array([_expected(rows[v], metric, minimize)["best"] for v in (0, 1)])
        got = result.groups[0].summary(metric, minimize)
        assert got["n"] == 2 and got["final_round"] == ROUNDS - 1
        assert got["final"] == pytest.approx(final.mean(), rel=1e-12)
        assert got["final_std"] == pytest.approx(final.std(ddof=1), rel=1e-9, abs=1e-15)
        assert got["best"] == pytest.approx(best.mean(), rel=1e-12)
        assert got["best_std"] == pytest.approx(best.std(ddof=1), rel=1e-9, abs=1e-15)
        alone = result.groups[1].summary(metric, minimize)
        assert alone["n"] == 1 and math.isnan(alone["final_std"])
        assert alone["final"] == pytest.approx(_expected(rows[2], metric, minimize)["final"], rel=1e-7)
    text = result.text.splitlines()
    line = next(s for s in text[text.index("fed_val_loss/weighted (best = min)"):] if "group 1 (n=2)" in s)
    final = np.array([_expected(rows[v], "fed_val_loss/weighted", True)["final"] for v in (0, 1)])
    assert f"{final.mean():.4g} ± {final.std(ddof=1):.4g}" in line
    assert "group 1 (n=2): client_optimizer/lr=0.1, model/lr=0.1" in text


def test_the_best_rule_can_be_overridden(runs):
    tb, rows = runs
    result = report([tb], metrics=["val_loss", "val_acc"], maximize=["val_loss"], minimize=["val_acc"])
    run = result.runs[0]
    assert run.summary("val_loss", result.minimized["val_loss"]) == pytest.approx(
        _expected(rows[0], "val_loss", minimize=False), rel=1e-7)
    assert run.summary("val_acc", result.minimized["val_acc"]) == pytest.approx(
        _expected(rows[0], "val_acc", minimize=True), rel=1e-7)
    assert "val_loss (best = max)" in result.text
    with pytest.raises(ReportError, match="--minimize and --maximize both name val_acc"):
        report([tb], metrics=["val_acc"], maximize=["val_acc"], minimize=["val_acc"])


def _copy_run(src: Path, dst: Path, config: str) -> None:
    """A run folder as `lightning-fed fit` leaves it: the event file, and the config it saved."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if "tfevents" in f.name:
            shutil.copy(f, dst / f.name)
    (dst / "config.yaml").write_text(config)


CONFIG = """seed_everything: {seed}
trainer:
  max_epochs: 3
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: runs, version: {version}}}
model:
  class_path: lightning_fed.models.mnist.MNISTMLP
  init_args: {{hidden: 16, lr: {lr}}}
data:
  class_path: lightning_fed.datamodules.tasks.mnist.MNISTDataModule
  init_args:
    seed: {seed}
    partitioner:
      class_path: lightning_fed.datamodules.IIDPartitioner
      init_args: {{num_clients: 4, seed: {partition_seed}}}
"""


def test_a_saved_config_yaml_gives_the_settings_and_its_seeds(runs, tmp_path):
    tb, rows = runs
    for name, seed, partition_seed, lr in (("a", 0, 0, 0.05), ("b", 1, 1, 0.05), ("c", 2, 0, 0.05),
                                           ("d", 0, 0, 0.2)):
        version = {"a": 0, "b": 1, "c": 2, "d": 0}[name]
        _copy_run(tb / "lightning_logs" / f"version_{version}", tmp_path / name,
                  CONFIG.format(seed=seed, partition_seed=partition_seed, lr=lr, version="null"))
    result = report([tmp_path], metrics=["val_acc"])
    assert [[r.name for r in g.runs] for g in result.groups] == [["a", "b", "c"], ["d"]]
    assert result.groups[0].runs[1].seeds == {"seed_everything": 1, "data.init_args.seed": 1,
                                              "data.init_args.partitioner.init_args.seed": 1}
    assert result.groups[0].label == "model.init_args.lr=0.05" and result.groups[1].label == "model.init_args.lr=0.2"
    final = np.array([_expected(rows[v], "val_acc", False)["final"] for v in (0, 1, 2)])
    got = result.groups[0].summary("val_acc", False)
    assert got["n"] == 3 and got["final"] == pytest.approx(final.mean(), rel=1e-12)
    assert got["final_std"] == pytest.approx(final.std(ddof=1), rel=1e-9)
    # a setting that is not a seed keeps runs apart unless --ignore leaves it out (with the keys below it)
    (tmp_path / "b" / "config.yaml").write_text(CONFIG.format(seed=1, partition_seed=1, lr=0.05, version=7))
    apart = report([tmp_path], metrics=["val_acc"])
    assert [[r.name for r in g.runs] for g in apart.groups] == [["a", "c"], ["b"], ["d"]]
    assert apart.groups[1].label == "model.init_args.lr=0.05, trainer.logger.init_args.version=7"
    together = report([tmp_path], metrics=["val_acc"], ignore=["trainer.logger"])
    assert [[r.name for r in g.runs] for g in together.groups] == [["a", "b", "c"], ["d"]]


def test_csv_has_a_row_per_run_and_per_group(runs, tmp_path):
    tb, rows = runs
    result = report([tb], metrics=["val_acc", "val_loss"])
    write_csv(result, tmp_path / "out.csv")
    with open(tmp_path / "out.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["kind"], r["name"], r["group"], r["n"]) for r in table] == [
        ("run", "version_0", "group 1", "1"), ("run", "version_1", "group 1", "1"), ("group", "group 1", "group 1", "2"),
        ("run", "version_2", "group 2", "1"), ("group", "group 2", "group 2", "1")]
    for row, version in ((table[0], 0), (table[1], 1), (table[3], 2)):
        for metric in ("val_acc", "val_loss"):
            e = _expected(rows[version], metric, "loss" in metric)
            assert float(row[f"{metric}/final"]) == pytest.approx(e["final"], rel=1e-7)
            assert float(row[f"{metric}/best"]) == pytest.approx(e["best"], rel=1e-7)
            assert int(row[f"{metric}/best_round"]) == e["best_round"]
            assert int(row[f"{metric}/final_round"]) == ROUNDS - 1
            assert row[f"{metric}/final_std"] == ""
        assert row["path"] == str(tb / "lightning_logs" / f"version_{version}")
    best = np.array([_expected(rows[v], "val_loss", True)["best"] for v in (0, 1)])
    assert float(table[2]["val_loss/best"]) == pytest.approx(best.mean(), rel=1e-12)
    assert float(table[2]["val_loss/best_std"]) == pytest.approx(best.std(ddof=1), rel=1e-9, abs=1e-15)
    assert table[2]["val_loss/best_round"] == "" and table[4]["val_loss/best_std"] == ""
    assert table[0]["seeds"] == "global_seed=0, partitioner/seed=0, seed=0"
    assert table[4]["settings"] == "client_optimizer/lr=0.3, model/lr=0.3"


def test_plot_draws_the_group_mean_with_a_band_or_each_run(runs, tmp_path):
    tb, rows = runs
    result = report([tb], metrics=["val_acc", "val_loss"])
    fig = plot_report(result)
    acc, loss = fig.axes
    assert acc.get_ylabel() == "val_acc" and loss.get_xlabel() == "round"
    mean = np.mean([_curve(rows[v], "val_loss")[1] for v in (0, 1)], axis=0)
    line = loss.lines[0]
    np.testing.assert_array_equal(line.get_xdata(), np.arange(ROUNDS))
    np.testing.assert_allclose(line.get_ydata(), mean, rtol=1e-12)
    assert len(loss.collections) == 1  # one ± std band: group 2 has one run
    np.testing.assert_allclose(loss.lines[1].get_ydata(), _curve(rows[2], "val_loss")[1], rtol=1e-7)
    by_run = plot_report(result, by="run")
    assert [ln.get_label() for ln in by_run.axes[0].lines] == ["version_0", "version_1", "version_2"]
    fig.savefig(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _error(args, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(["report", *args])
    assert info.value.code == EXIT_BAD_ARGUMENT == 2
    return capsys.readouterr().err


def test_bad_folders_and_metrics_are_refused_in_one_line(runs, tmp_path, capsys):
    tb, _ = runs
    (tmp_path / "empty" / "version_0").mkdir(parents=True)
    (tmp_path / "empty" / "version_0" / "hparams.yaml").write_text("lr: 0.1\n")
    err = _error([str(tb), str(tmp_path / "empty")], capsys)
    assert err.splitlines() == [f"error: RUNS {tmp_path / 'empty'}: no TensorBoard event files (events.out.tfevents.*) "
                                "in it or below it (give a run's log folder, e.g. runs/lightning_logs/version_0, or a "
                                "folder above it)"]
    assert _error([str(tmp_path / "nowhere")], capsys).strip() == f"error: RUNS {tmp_path / 'nowhere'}: no such folder"
    err = _error([str(tb), "--metrics", "val_acc", "val_accuracy"], capsys)
    assert len(err.splitlines()) == 1
    assert err.startswith("error: --metrics val_accuracy: no run logged it. Did you mean val_acc")
    assert "The runs logged: epoch, fed_clients_dropped, fed_eval_clients, fed_personal_val_acc/mean," in err
    assert "round_train_loss" in err and "val_loss" in err


@pytest.mark.slow  # ~12 s of CPU importing torch and Lightning in a subprocess; main() is tested in-process above
def test_the_command_prints_writes_csv_and_plot(runs, tmp_path):
    """`python -m lightning_fed.cli report ...`, as a person runs it."""
    tb, rows = runs
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "lightning_fed.cli", "report", str(tb), "--metrics", "val_acc",
                           "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "r.png"), "--plot_by", "run"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].startswith("3 run(s) in 2 group(s)")
    e = _expected(rows[2], "val_acc", False)
    assert ["version_2", f"{e['final']:.4g}", str(ROUNDS - 1), f"{e['best']:.4g}", str(e["best_round"])] in [
        line.split() for line in out]
    assert out[-2:] == [f"csv: {tmp_path / 'r.csv'}", f"plot: {tmp_path / 'r.png'}"]
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 1 + 3 + 2


def test_validation_metrics_default():
    assert validation_metrics(["val_loss", "fed_personalized_val_acc/mean", "fed_val_acc/p10", "round_clients",
                               "train_loss", "fed_eval_clients"]) == [
        "val_loss", "fed_personalized_val_acc/mean", "fed_val_acc/p10"]


def test_help_lists_report(capsys):
    """`lightning-fed --help` names `report` (handled by `main` before the CLI's parser) with its usage."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (0, None)
    listing = capsys.readouterr().out.split("subcommands:", 1)[1]
    assert re.search(r"^\s{2,}report\s+Final and best metrics of finished runs", listing, re.M), listing
