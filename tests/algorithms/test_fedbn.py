"""FedBN (issue #41) against a NumPy transcription of Li et al. 2021, Alg. 1 — BatchNorm parameters and running
statistics local per client, the rest averaged (1/K over the round's cohort) — several rounds, partial
participation, clients that come back (their own BatchNorm state matters), a resume equal to the uninterrupted run,
and the refusal of a model without BatchNorm."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from helpers import federated_fit, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedBNClient
from lightning_fed.callbacks import FedAdam, FedAvg, FedBN
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

GAMMA, EPS, MOMENTUM = 0.05, 1e-5, 0.1


class BNRegression(L.LightningModule):
    """x (3) → Linear(3, 2) → BatchNorm1d(2) → Linear(2, 1), mean squared error, SGD; float64."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2), nn.Linear(2, 1)).double()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=GAMMA)


def _datamodule(num_clients=6):
    x, y = regression_data(n=60, d=3, seed=0)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=num_clients, seed=0), clients_per_round=3,
                             batch_size=5, local_epochs=1)
    dm.setup()
    return x, y, dm


def _numpy(model):
    """{name: array} of the model's parameters and buffers."""
    out = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    out.update({n: b.detach().numpy().copy() for n, b in model.named_buffers()})
    return out


BN = ("net.1.weight", "net.1.bias", "net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked")
SHARED = ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias")


def _sgd_step(w, x, y):
    """One SGD step of BNRegression in training mode on the batch (x, y) (BatchNorm's batch statistics, biased
    variance in the normalisation, unbiased in the running variance)."""
    w = dict(w)
    b = len(x)
    z = x @ w["net.0.weight"].T + w["net.0.bias"]
    mu, var = z.mean(0), z.var(0)
    s = np.sqrt(var + EPS)
    zh = (z - mu) / s
    a = w["net.1.weight"] * zh + w["net.1.bias"]
    out = (a @ w["net.2.weight"].T + w["net.2.bias"])[:, 0]
    d_out = 2.0 / b * (out - y)
    grads = {"net.2.weight": (d_out @ a)[None, :], "net.2.bias": np.array([d_out.sum()])}
    da = d_out[:, None] * w["net.2.weight"]
    grads["net.1.weight"], grads["net.1.bias"] = (da * zh).sum(0), da.sum(0)
    dzh = da * w["net.1.weight"]
    dz = (b * dzh - dzh.sum(0) - zh * (dzh * zh).sum(0)) / (b * s)
    grads["net.0.weight"], grads["net.0.bias"] = dz.T @ x, dz.sum(0)
    for k, g in grads.items():
        w[k] = w[k] - GAMMA * g
    w["net.1.running_mean"] = (1 - MOMENTUM) * w["net.1.running_mean"] + MOMENTUM * mu
    w["net.1.running_var"] = (1 - MOMENTUM) * w["net.1.running_var"] + MOMENTUM * var * b / (b - 1)
    w["net.1.num_batches_tracked"] = w["net.1.num_batches_tracked"] + 1
    return w


def _fedbn_reference(w0, x, y, dm, rounds, keep_bn=True):
    """Li et al. 2021, Alg. 1: local SGD on every layer (l. 3-5), then the uniform mean of the cohort's non-BN layers
    (l. 6-10); each client's BN layer is its own (the initial one the first time it is sampled)."""
    glob, own = dict(w0), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            w = dict(glob)
            if keep_bn and int(cid) in own:
                w.update(own[int(cid)])
            for batch in dm.client_batches(cid, t):
                w = _sgd_step(w, x[batch], y[batch])
            own[int(cid)] = {k: w[k] for k in BN}
            drifts.append({k: w[k] - glob[k] for k in SHARED})
        for k in SHARED:
            glob[k] = glob[k] + np.mean([d[k] for d in drifts], axis=0)
    return glob, own


def _fit(tmp_path, server, rounds, ckpt_dir=None, ckpt_path=None, **trainer_kwargs):
    x, y, dm = _datamodule()
    torch.manual_seed(0)
    model = BNRegression()
    w0 = _numpy(model)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, ckpt_dir, ckpt_path, **trainer_kwargs)
    return x, y, dm, w0, model, trainer


def test_fedbn_equals_numpy_algorithm_1(tmp_path):
    server = FedBN()
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=5)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(5)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want, own = _fedbn_reference(w0, x, y, dm, rounds=5)
    got = _numpy(model)
    for k in SHARED:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-13)
    for k in BN:  # the global model's BatchNorm layer is never changed by the server
        np.testing.assert_array_equal(got[k], w0[k])
    table = server.client_algorithm_states["FedBNClient"]
    assert sorted(table.ids()) == sorted(own)
    for cid, bn in own.items():
        row = table.get(cid).numpy()
        np.testing.assert_allclose(row, np.concatenate([np.ravel(bn[k]) for k in BN]).astype(float), rtol=1e-12,
                                   atol=1e-13)
    # the clients' own BatchNorm state changed the result: without it (reset every round) it is another run
    forgetful, _ = _fedbn_reference(w0, x, y, dm, rounds=5, keep_bn=False)
    assert not np.allclose(got["net.0.weight"], forgetful["net.0.weight"], rtol=1e-9, atol=0)


def test_fedbn_client_half_under_fedadam_leaves_batchnorm_global_and_equals_the_ready_made_name(tmp_path):
    """Composable with any server rule: the client half under FedAdam changes only the shared layers; FedBN is
    FedAvg(weighting="uniform") with the half, bit for bit."""
    *_, w0, model, _ = _fit(tmp_path, FedAdam(lr=0.01, weighting="uniform"), rounds=2,
                            client_algorithms=[FedBNClient()])
    got = _numpy(model)
    for k in BN:
        np.testing.assert_array_equal(got[k], w0[k])
    assert not np.array_equal(got["net.0.weight"], w0["net.0.weight"])
    a = _numpy(_fit(tmp_path, FedBN(), rounds=3)[4])
    b = _numpy(_fit(tmp_path, FedAvg(weighting="uniform"), rounds=3, client_algorithms=[FedBNClient()])[4])
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_fedbn_resume_equals_the_uninterrupted_run(tmp_path):
    *_, full, _ = _fit(tmp_path / "a", FedBN(), rounds=4, ckpt_dir=tmp_path / "ca")
    full_server = _fit(tmp_path / "a2", FedBN(), rounds=4)[5].server_optimizer
    _fit(tmp_path / "b", FedBN(), rounds=2, ckpt_dir=tmp_path / "cb")
    server = FedBN()
    *_, resumed, _ = _fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                          ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    a, b = _numpy(full), _numpy(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    ta, tb = full_server.client_algorithm_states["FedBNClient"], server.client_algorithm_states["FedBNClient"]
    assert sorted(ta.ids()) == sorted(tb.ids())
    assert all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


class NoBN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1).double()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=GAMMA)


def test_fedbn_without_batchnorm_is_refused_at_fit_start(tmp_path):
    _, _, dm = _datamodule()
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedBN()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"FedBNClient\(\) keeps nothing of NoBN: no parameter or buffer is selected"):
        trainer.fit(NoBN(), datamodule=dm)
    assert trainer.global_step == 0
