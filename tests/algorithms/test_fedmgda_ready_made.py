"""FedMGDAPlus, the ready-made FedMGDA+ (its algorithm is checked against NumPy in tests/algorithms/test_fedmgda.py):
the CLI name, the run record, the logged metrics, resuming, and the refusal of a changed ε on resume."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset

from helpers import CHECKPOINT_DIR_REUSED, CLI_ARGS_UNDER_PYTEST, LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedMGDAMinNorm, FedProxClient
from lightning_fed.callbacks import FedMGDAPlus
from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fashion_mnist_hybrid_plus_fedmgda.yaml"


def _dm():
    x, y = regression_data(n=48, seed=4)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=4)


@pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)
def test_cli_resolves_the_short_name_and_its_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(args=["--config", str(EXAMPLE), "--server_optimizer", "FedMGDAPlus",
                             "--server_optimizer.epsilon", "0.25", "--server_optimizer.lr", "0.5"], run=False)
    server = cli.trainer.server_optimizer
    assert type(server) is FedMGDAPlus
    assert (server.lr, server.epsilon, server.normalize, server.weighting) == (0.5, 0.25, True, "uniform")
    assert server.aggregators == [server.min_norm] and server.min_norm.epsilon == 0.25


def test_defaults_repr_and_run_record(tmp_path):
    from lightning_fed.checkpoint import run_config

    server = FedMGDAPlus(client=[FedProxClient(mu=0.1)])
    assert repr(server) == ("FedMGDAPlus(lr=1.0, weighting='uniform', epsilon=1.0, normalize=True, "
                            "client=[FedProxClient(mu=0.1)])")
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(lr=0.05), datamodule=_dm())
    record = run_config(trainer)
    assert record["server_optimizer"] == "lightning_fed.algorithms.fedmgda.FedMGDAPlus"
    assert (record["server_optimizer.epsilon"], record["server_optimizer.normalize"],
            record["server_optimizer.weighting"]) == (1.0, True, "uniform")


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=0.0), "`lr` must be a finite number > 0"),
    (dict(epsilon=1.5), "`epsilon` must be a finite number in \\[0, 1\\]"),
    (dict(normalize="yes"), "`normalize` must be a bool"),
    (dict(weighting="mean"), "`weighting` must be one of"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedMGDAPlus(**kwargs)


def test_logs_the_min_norm_and_the_diversity_of_its_weights(tmp_path):
    logger = CSVLogger(str(tmp_path), name="run")
    server = FedMGDAPlus(lr=0.5)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger}
    FederatedTrainer(max_epochs=2, callbacks=[server], **kwargs).fit(LinearRegression(lr=0.05), datamodule=_dm())
    import csv

    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("fedmgda_min_norm_sq")]
    assert len(rows) == 2
    for row in rows:
        norm_sq = float(row["fedmgda_min_norm_sq"])
        assert 0 < norm_sq <= 1 and 1 <= float(row["fedmgda_support"]) <= 3
        # unit d_i: Σλ_i‖d_i‖² = 1, so FedMGDA+'s own λ-weighted D = 1/‖Σλ_i d_i‖ (round_gradient_diversity is the
        # raw updates' diversity of every method, issue #34: ≥ 1 and another number)
        assert float(row["fedmgda_weighted_diversity"]) == pytest.approx(1 / math.sqrt(norm_sq), rel=1e-5)
        assert float(row["round_gradient_diversity"]) >= 1.0
    assert np.isclose(server.last_weights.sum(), 1.0) and server.last_weights.shape == (3,)


def _fit(root: Path, ckpt_dir: Path, max_epochs: int, server: FedMGDAPlus, ckpt_path=None):
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    kwargs = quiet_trainer_kwargs(root) | {"enable_checkpointing": True}
    FederatedTrainer(max_epochs=max_epochs, callbacks=[server, checkpoint], **kwargs).fit(
        model, datamodule=_dm(), ckpt_path=ckpt_path)
    return model


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_resume_equals_uninterrupted_and_a_changed_epsilon_is_refused(tmp_path):
    import shutil

    full = _fit(tmp_path / "a", tmp_path / "ckpt_a", 4, FedMGDAPlus(lr=0.5, epsilon=0.2))
    _fit(tmp_path / "b", tmp_path / "ckpt_b", 2, FedMGDAPlus(lr=0.5, epsilon=0.2))
    two_rounds = tmp_path / "two_rounds.ckpt"
    shutil.copy(tmp_path / "ckpt_b" / "last.ckpt", two_rounds)
    resumed = _fit(tmp_path / "b", tmp_path / "ckpt_b", 4, FedMGDAPlus(lr=0.5, epsilon=0.2), ckpt_path=str(two_rounds))
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"configuration differs(.|\n)*server_optimizer.epsilon: 0.2 -> 0.5"):
        _fit(tmp_path / "c", tmp_path / "ckpt_c", 3, FedMGDAPlus(lr=0.5, epsilon=0.5), ckpt_path=str(two_rounds))


def test_its_reducer_is_a_stage_of_any_chain():
    stage = FedMGDAPlus(epsilon=0.3).min_norm
    assert isinstance(stage, FedMGDAMinNorm) and stage.kind == "reduce" and stage.epsilon == 0.3


def test_its_reducer_under_any_server_optimizer_logs_the_same_round_metrics(tmp_path):
    """The metrics are the stage's (``FedMGDAMinNorm.round_metrics``, as FedAWARE's), so a chain built by hand
    logs them too, with the same values as FedMGDAPlus (issue #41's review: no per-class logging)."""
    import csv

    from lightning_fed.callbacks import ServerOptimizer
    from lightning_fed.server.rules.sgd import SGD

    def logged(server, name):
        torch.manual_seed(0)
        logger = CSVLogger(str(tmp_path), name=name)
        kwargs = quiet_trainer_kwargs(tmp_path / name) | {"logger": logger}
        FederatedTrainer(max_epochs=2, callbacks=[server], **kwargs).fit(LinearRegression(lr=0.05), datamodule=_dm())
        with open(Path(logger.log_dir) / "metrics.csv") as f:
            return [{k: v for k, v in r.items() if k.startswith("fedmgda_")} for r in csv.DictReader(f)
                    if r.get("fedmgda_min_norm_sq")]

    ready = logged(FedMGDAPlus(lr=0.5, epsilon=0.3), "ready")
    by_hand = logged(ServerOptimizer(rule=SGD(0.5), aggregators=[FedMGDAMinNorm(epsilon=0.3)]), "by_hand")
    assert len(ready) == 2 and by_hand == ready
    assert set(ready[0]) == {"fedmgda_support", "fedmgda_weighted_diversity", "fedmgda_min_norm_sq"}
