"""The update-norm guard (issue #16, item 9): a finite but absurd client update is dropped, not averaged in."""

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
from lightning_fed.callbacks import FedAvg
from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.guards import norm_outliers, update_norm

MARK = 777.0
ABSURD = 1e15
NUM_CLIENTS, BAD, LR = 5, 2, 0.1


class Absurd(LinearRegression):
    """A module whose training step sets every parameter to 1e15 on one client's data (a finite, absurd update)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        if (x == MARK).any():
            with torch.no_grad():
                for p in self.parameters():
                    p.fill_(ABSURD)
        return F.mse_loss(self.linear(x).squeeze(-1), y)


def _data():
    x, y = regression_data(n=10 * NUM_CLIENTS)
    ids = np.repeat(np.arange(NUM_CLIENTS), 10)
    x[np.flatnonzero(ids == BAD)[0], 0] = MARK
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=NUM_CLIENTS,
                             batch_size=100)
    return dm, x, y, ids


_grad, _weights = mse_grad, linear_weights


def _client_delta(w, x, y, c, ids):
    """Δ_c of one full-batch SGD step from the global w (client BAD starts from 1e15 everywhere)."""
    start = np.full_like(w, ABSURD) if c == BAD else w
    return start - LR * _grad(start, x[ids == c], y[ids == c]) - w


def _fit(tmp_path, rounds=2, **trainer_kwargs):
    dm, x, y, ids = _data()
    model = Absurd(lr=LR)
    w0 = _weights(model)
    logger = CSVLogger(str(tmp_path), name="guard")
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[FedAvg()],
                               **(quiet_trainer_kwargs(tmp_path) | {"logger": logger}), **trainer_kwargs)
    trainer.fit(model, datamodule=dm)
    rows = [r for r in csv.DictReader(open(f"{logger.log_dir}/metrics.csv")) if r.get("round_clients_dropped")]
    return model, w0, x, y, ids, rows


def test_absurd_update_is_dropped_and_the_rest_aggregated(tmp_path):
    with pytest.warns(UserWarning, match=rf"Client {BAD} failed in round 1: update norm .* max_update_norm_ratio=10"):
        model, w, x, y, ids, rows = _fit(tmp_path, max_update_norm_ratio=10)
    # Independent expectation: FedAvg (equal client sizes, η = 1) of the four other clients, two rounds.
    for _ in range(2):
        w = w + np.mean([_client_delta(w, x, y, c, ids) for c in range(NUM_CLIENTS) if c != BAD], axis=0)
    np.testing.assert_allclose(_weights(model), w, rtol=0, atol=1e-12)
    assert [float(r["round_clients_dropped"]) for r in rows] == [1.0, 1.0]
    assert [float(r["round_clients"]) for r in rows] == [4.0, 4.0]


def test_without_the_guard_the_absurd_update_is_averaged_in(tmp_path):
    model, w, x, y, ids, rows = _fit(tmp_path, rounds=1)
    w = w + np.mean([_client_delta(w, x, y, c, ids) for c in range(NUM_CLIENTS)], axis=0)
    np.testing.assert_allclose(_weights(model), w, rtol=1e-12)
    assert np.abs(_weights(model)).max() > 1e14  # the model is ruined, silently
    assert [float(r["round_clients_dropped"]) for r in rows] == [0.0]


def test_absurd_update_with_raise_policy_raises(tmp_path):
    with pytest.raises(RuntimeError, match=rf"Client {BAD} failed in round 0: update norm .*on_client_failure='raise'"):
        _fit(tmp_path, rounds=1, max_update_norm_ratio=10, on_client_failure="raise")


def test_norm_outliers_against_the_median_written_out():
    assert norm_outliers([1.0, 2.0, 3.0, 100.0], 10) == [3]  # median (2 + 3) / 2 = 2.5, limit 25
    assert norm_outliers([1.0, 2.0, 3.0, 25.0], 10) == []  # 25 is not > 25
    assert norm_outliers([3.0, 30.1, 1.0], 10) == [1]  # median 3, limit 30
    assert norm_outliers([1.0, 50.0], 10) == []  # two clients: the larger is at most twice the median
    assert norm_outliers([0.0, 0.0, 5.0], 10) == []  # median 0: no scale, nothing flagged
    assert norm_outliers([1.0, 1.0, math.inf], 10) == [2]
    assert norm_outliers([], 10) == []


def test_update_norm_is_the_l2_norm_of_all_entries_in_float64():
    delta = [torch.full((2, 3), 1e20, dtype=torch.float32), torch.full((4,), -2e20, dtype=torch.float32)]
    expected = math.sqrt(6 * float(np.float32(1e20)) ** 2 + 4 * float(np.float32(-2e20)) ** 2)
    assert update_norm(delta) == pytest.approx(expected, rel=1e-12)  # float32 accumulation would give inf
    assert update_norm([]) == 0.0


@pytest.mark.parametrize("bad", [1, 1.0, 0.5, -3, math.inf, math.nan, True, "10"])
def test_bad_max_update_norm_ratio_is_refused(bad):
    with pytest.raises(ValueError, match="`max_update_norm_ratio` must be None .* finite number > 1"):
        FederatedTrainer(max_update_norm_ratio=bad, logger=False, enable_checkpointing=False)


@pytest.mark.parametrize("clients_per_round, ratio, warned", [(1, 10, True), (2, 10, True), (2, 2, True),
                                                              (2, 1.5, False), (3, 10, False)])
def test_a_norm_guard_that_cannot_flag_anyone_warns_once_per_fit(tmp_path, clients_per_round, ratio, warned):
    """With one client, or two and k ≥ 2 (the larger norm is at most twice the median, their mean), no update can
    exceed k × the median: the guard does nothing; one warning at fit start naming both arguments."""
    import warnings

    x, y = regression_data(n=30)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=NaturalIdPartitioner("c"),
                             clients_per_round=clients_per_round, batch_size=10)
    dm.train_dataset.c = np.repeat(np.arange(3), 10)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg()], max_update_norm_ratio=ratio,
                               **quiet_trainer_kwargs(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(LinearRegression(), datamodule=dm)
    hits = [str(w.message) for w in caught if "`max_update_norm_ratio`" in str(w.message)]
    assert len(hits) == (1 if warned else 0), hits
    if warned:
        assert f"`clients_per_round`={clients_per_round}" in hits[0] and "does nothing" in hits[0]


def test_43_nonfinite_values_names_each_tensor_and_reads_the_host_once():
    """#43: the check after every server step: which tensors hold NaN/±inf, read in one host copy when all are
    finite (no bool() per tensor); finite but huge values (whose 2-norm would overflow) are not flagged."""
    from lightning_fed.client.host_sync import HostSyncCounter
    from lightning_fed.guards import describe_nonfinite, nonfinite_values

    finite = [(f"t{i}", torch.full((3,), 1e3 if i % 2 else 1.0, dtype=torch.float32 if i % 3 else torch.float64))
              for i in range(20)] + [("step", 3), ("eta", 0.5), ("ints", torch.tensor([7])), ("empty", torch.zeros(0))]
    with HostSyncCounter() as counter:
        assert nonfinite_values(finite) == []
    assert counter.count == 0
    assert nonfinite_values([("huge", torch.full((3,), 3e38))]) == []  # its 2-norm overflows; its values are finite
    bad = finite + [("v", torch.tensor([1.0, float("nan"), float("-inf")])), ("eta2", float("inf"))]
    assert nonfinite_values(bad) == [("v", 2, 3), ("eta2", 1, 1)]
    assert describe_nonfinite(nonfinite_values(bad), limit=1) == "v has 2 non-finite value(s) (of 3); and 1 more tensor(s)"
