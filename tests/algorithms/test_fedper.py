"""FedPer (issue #41) against a NumPy transcription of Arivazhagan et al. 2019, Alg. 1 — base layers averaged
(sample-weighted, over the round's cohort), the head kept per client and trained jointly with the base — several
rounds, partial participation, returning clients, a resume equal to the uninterrupted run; the head under FedAdam."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from helpers import federated_fit, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedPerClient
from lightning_fed.callbacks import FedAdam, FedAvg, FedPer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork

GAMMA = 0.05
BODY, HEAD = ("net.0.weight", "net.0.bias"), ("net.1.weight", "net.1.bias")


class TwoLayer(L.LightningModule):
    """x (3) → Linear(3, 2) (the body) → Linear(2, 1) (the head), mean squared error, SGD; float64."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)).double()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=GAMMA)


def datamodule(sizes_vary=True):
    x, y = regression_data(n=60, d=3, seed=1)
    local_work = SampledLocalWork(epochs=[1, 2], batch_size=[3, 6], seed=1) if sizes_vary else None
    kwargs = {"local_work": local_work} if local_work is not None else {"batch_size": 5}
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, **kwargs)
    dm.setup()
    return x, y, dm


def weights(model):
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def grads(w, x, y):
    """∇ of mean((x·W0ᵀ + b0)·W1ᵀ + b1 − y)² over the parameters of TwoLayer."""
    z = x @ w["net.0.weight"].T + w["net.0.bias"]
    out = (z @ w["net.1.weight"].T + w["net.1.bias"])[:, 0]
    d = 2.0 / len(x) * (out - y)
    dz = d[:, None] * w["net.1.weight"]
    return {"net.1.weight": (d @ z)[None, :], "net.1.bias": np.array([d.sum()]),
            "net.0.weight": dz.T @ x, "net.0.bias": dz.sum(0)}


def fit(tmp_path, server, rounds, dm=None, ckpt_dir=None, ckpt_path=None, model=None, **trainer_kwargs):
    if dm is None:
        *_, dm = datamodule()
    torch.manual_seed(0)
    model = TwoLayer() if model is None else model
    w0 = weights(model)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, ckpt_dir, ckpt_path, **trainer_kwargs)
    return w0, model, trainer


def _fedper_reference(w0, x, y, dm, rounds):
    """Alg. 1: every local step updates base and head together; the server's base is the n_j-weighted mean."""
    glob, own = dict(w0), {}
    for t in range(rounds):
        drifts, sizes = [], []
        for cid in dm.sample_clients(t):
            w = {**glob, **own.get(int(cid), {})}
            for batch in dm.client_batches(cid, t):
                g = grads(w, x[batch], y[batch])
                w = {k: w[k] - GAMMA * g[k] for k in w}
            own[int(cid)] = {k: w[k] for k in HEAD}
            drifts.append({k: w[k] - glob[k] for k in BODY})
            sizes.append(dm.client_num_samples(cid))
        p = np.array(sizes, dtype=float) / sum(sizes)
        for k in BODY:
            glob[k] = glob[k] + sum(pi * d[k] for pi, d in zip(p, drifts))
    return glob, own


def test_fedper_equals_numpy_algorithm_1(tmp_path):
    x, y, dm = datamodule()
    server = FedPer(head=["net.1"])
    w0, model, _ = fit(tmp_path, server, rounds=5, dm=dm)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(5)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    want, own = _fedper_reference(w0, x, y, dm, rounds=5)
    got = weights(model)
    for k in BODY:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-13)
    for k in HEAD:  # the global head never moves
        np.testing.assert_array_equal(got[k], w0[k])
    table = server.client_algorithm_states["FedPerClient"]
    assert sorted(table.ids()) == sorted(own)
    for cid, head in own.items():
        np.testing.assert_allclose(table.get(cid).numpy(), np.concatenate([head[k].ravel() for k in HEAD]),
                                   rtol=1e-12, atol=1e-13)


def test_fedper_head_under_fedadam_keeps_the_global_head(tmp_path):
    w0, model, _ = fit(tmp_path, FedAdam(lr=0.01), rounds=2, client_algorithms=[FedPerClient(head=["net.1"])])
    got = weights(model)
    assert all(np.array_equal(got[k], w0[k]) for k in HEAD)
    assert not np.array_equal(got["net.0.weight"], w0["net.0.weight"])
    a = weights(fit(tmp_path, FedPer(head=["net.1"]), rounds=3)[1])
    b = weights(fit(tmp_path, FedAvg(), rounds=3, client_algorithms=[FedPerClient(head=["net.1"])])[1])
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_fedper_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = FedPer(head=["net.1"])
    _, full, _ = fit(tmp_path / "a", full_server, rounds=4)
    fit(tmp_path / "b", FedPer(head=["net.1"]), rounds=2, ckpt_dir=tmp_path / "cb")
    server = FedPer(head=["net.1"])
    _, resumed, _ = fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                        ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    a, b = weights(full), weights(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    ta, tb = full_server.client_algorithm_states["FedPerClient"], server.client_algorithm_states["FedPerClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


@pytest.mark.parametrize("head, error, match", [
    ([], ValueError, r"`head` must name at least one"),
    ([3], TypeError, r"`names` must be a list of tensor or submodule names"),
])
def test_fedper_bad_head_is_refused(head, error, match):
    with pytest.raises(error, match=match):
        FedPerClient(head=head)


def test_a_head_that_selects_nothing_is_refused_at_fit_start(tmp_path):
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedPer(head=["classifier"])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"keeps nothing of TwoLayer"):
        trainer.fit(TwoLayer(), datamodule=datamodule()[2])
    assert trainer.global_step == 0


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_a_head_kept_local_over_a_frozen_encoder(tmp_path):
    from helpers import fit_frozen_pair

    frozen, head_only, trainer, reference = fit_frozen_pair(tmp_path, lambda: FedPer(head=["head.bias"]))
    assert torch.equal(frozen.head.weight, head_only.head.weight) and torch.equal(frozen.head.bias, head_only.head.bias)
    table = trainer.fit_loop.server_optimizer.client_algorithm_states["FedPerClient"]
    expected = reference.fit_loop.server_optimizer.client_algorithm_states["FedPerClient"]
    assert table.dim == 1 and all(torch.equal(table.get(i), expected.get(i)) for i in expected.ids())
