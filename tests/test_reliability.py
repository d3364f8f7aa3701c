"""Failing clients, simulated unreliability, and bad input."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data, linear_weights, mse_grad
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg, FedYogi
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, NaturalIdPartitioner

RAISE_MARK = 999.0


class Fragile(LinearRegression):
    """An ordinary module that raises on a marked input (a bug that shows up only on some clients' data)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        if (x == RAISE_MARK).any():
            raise RuntimeError("corrupt sample")
        return F.mse_loss(self.linear(x).squeeze(-1), y)


def _faulty_module(num_clients=5, nan_clients=(1,), raise_clients=(3,), **kwargs):
    """Clients 0..N-1 by natural id; ``nan_clients`` hold a NaN input, ``raise_clients`` a marked input."""
    x, y = regression_data(n=10 * num_clients)
    ids = np.repeat(np.arange(num_clients), 10)
    for c in nan_clients:
        x[np.flatnonzero(ids == c)[0], 0] = np.nan
    for c in raise_clients:
        x[np.flatnonzero(ids == c)[0], 0] = RAISE_MARK
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=num_clients,
                             batch_size=100, **kwargs)
    return dm, x, y, ids


_grad, _weights = mse_grad, linear_weights


def test_nan_and_raising_clients_are_dropped_and_the_rest_aggregated(tmp_path):
    dm, x, y, ids = _faulty_module()
    model = Fragile(lr=0.1)
    w0 = _weights(model)
    logger = CSVLogger(str(tmp_path), name="faults")
    with pytest.warns(UserWarning, match="dropped from the round"):
        FederatedTrainer(max_epochs=2, callbacks=[FedAvg()], **(quiet_trainer_kwargs(tmp_path) | {"logger": logger})).fit(
            model, datamodule=dm
        )
    # Independent expectation: FedAvg of the three healthy clients (equal sizes), one full-batch step each.
    w = w0
    for _ in range(2):
        w = w + np.mean([-0.1 * _grad(w, x[ids == c], y[ids == c]) for c in (0, 2, 4)], axis=0)
    np.testing.assert_allclose(_weights(model), w, atol=1e-12)
    rows = [r for r in csv.DictReader(open(f"{logger.log_dir}/metrics.csv")) if r.get("round_clients_dropped")]
    assert [float(r["round_clients_dropped"]) for r in rows] == [2.0, 2.0]
    assert [float(r["round_clients"]) for r in rows] == [3.0, 3.0]


def test_round_where_every_client_fails_changes_nothing(tmp_path):
    dm, *_ = _faulty_module(num_clients=2, nan_clients=(0,), raise_clients=(1,))
    model = Fragile(lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    server = FedYogi(lr=0.1)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    # every round failed for every client: the run ends with an error (issue #11.6), after both rounds ran
    with pytest.warns(UserWarning, match="no client reported back"), pytest.raises(RuntimeError, match="No client"):
        trainer.fit(model, datamodule=dm)
    for a, b in zip(before, model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert server.num_steps == 0 and server.state == {}
    assert trainer.callback_metrics["round_clients_dropped"] == 2
    assert trainer.current_epoch == 2


def test_raise_policy_stops_training(tmp_path):
    dm, *_ = _faulty_module(nan_clients=(), raise_clients=(2,))
    trainer = FederatedTrainer(max_epochs=1, on_client_failure="raise", **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="corrupt sample"):
        trainer.fit(Fragile(), datamodule=dm)
    dm, *_ = _faulty_module(nan_clients=(1,), raise_clients=())
    trainer = FederatedTrainer(max_epochs=1, on_client_failure="raise", **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="Client 1 failed in round 0: non-finite update"):
        trainer.fit(Fragile(), datamodule=dm)


def _selection_module(**kwargs):
    x, y = regression_data(n=200)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=100), clients_per_round=10, **kwargs)
    dm.setup()
    return dm


def test_no_dropout_no_over_selection_is_plain_uniform_sampling():
    dm = _selection_module()
    for r in range(5):
        sel = dm.select_cohort(r)
        assert sel.unavailable == 0 and np.array_equal(sel.cohort, sel.candidates)
        assert len(set(sel.cohort.tolist())) == 10
        expected = np.random.default_rng([0, 0x5A3D, r]).choice(100, size=10, replace=False)
        assert np.array_equal(sel.cohort, expected)


def test_client_dropout_and_over_selection():
    dm = _selection_module(client_dropout=0.3, over_selection=1.0, seed=7)
    sizes, dropped = [], []
    for r in range(300):
        sel = dm.select_cohort(r)
        assert len(sel.candidates) == 20 and len(set(sel.candidates.tolist())) == 20
        assert set(sel.cohort.tolist()) <= set(sel.candidates.tolist())
        # the kept clients are the first available candidates, in sampled order
        positions = [sel.candidates.tolist().index(c) for c in sel.cohort.tolist()]
        assert positions == sorted(positions)
        sizes.append(len(sel.cohort))
        dropped.append(sel.unavailable)
    assert np.mean(dropped) / 20 == pytest.approx(0.3, abs=0.02)
    # a full cohort whenever >= 10 of the 20 candidates stay: P(Binomial(20, 0.7) >= 10)
    p_full = sum(math.comb(20, k) * 0.7**k * 0.3 ** (20 - k) for k in range(10, 21))
    assert np.mean(np.array(sizes) == 10) == pytest.approx(p_full, abs=0.02)
    again = _selection_module(client_dropout=0.3, over_selection=1.0, seed=7)
    assert all(np.array_equal(dm.sample_clients(r), again.sample_clients(r)) for r in range(20))


def test_dropout_without_over_selection_shrinks_the_cohort(tmp_path):
    dm = _selection_module(client_dropout=0.5)
    sizes = [len(dm.sample_clients(r)) for r in range(200)]
    assert np.mean(sizes) == pytest.approx(5.0, abs=0.4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"client_dropout": 1.0}, "`client_dropout` must be a probability in \\[0, 1\\), got 1.0"),
        ({"client_dropout": -0.1}, "`client_dropout`"),
        ({"over_selection": -1}, "`over_selection` must be a finite number >= 0, got -1"),
        ({"clients_per_round": 0}, "`clients_per_round` must be a positive integer, got 0"),
        ({"batch_size": 2.5}, "`batch_size` must be a positive integer, got 2.5"),
        ({"local_epochs": -1}, "`local_epochs`"),
        ({"data_order": "random"}, "`data_order` must be one of \\('reshuffle', 'once', 'none'\\)"),
        ({"num_workers": -2}, "`num_workers`"),
        ({"seed": -1}, "`seed`"),
    ],
)
def test_bad_datamodule_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FederatedDataModule(TensorDataset(torch.zeros(4, 1)), partitioner=IIDPartitioner(2), **kwargs)


def test_bad_failure_policy(tmp_path):
    with pytest.raises(ValueError, match="`on_client_failure` must be one of \\('skip', 'raise'\\)"):
        FederatedTrainer(on_client_failure="ignore", **quiet_trainer_kwargs(tmp_path))


def test_missing_natural_id_is_an_error():
    dm = FederatedDataModule(TensorDataset(torch.zeros(4, 1)), partitioner=NaturalIdPartitioner("writer_id"),
                             clients_per_round=1)
    with pytest.raises(ValueError, match="`id_column` 'writer_id' is not an attribute of TensorDataset"):
        dm.setup()


def test_label_partitioner_without_labels_is_an_error():
    from lightning_fed.datamodules import DirichletPartitioner

    dm = FederatedDataModule(TensorDataset(torch.zeros(40, 1)), partitioner=DirichletPartitioner(2, alpha=1.0),
                             clients_per_round=1)
    with pytest.raises(ValueError, match="needs labels"):
        dm.setup()
    dm = FederatedDataModule(TensorDataset(torch.zeros(40, 1)), partitioner=DirichletPartitioner(2, alpha=1.0),
                             clients_per_round=1, labels=np.linspace(0, 1, 40))
    with pytest.raises(ValueError, match="`labels` must be integer"):
        dm.setup()
