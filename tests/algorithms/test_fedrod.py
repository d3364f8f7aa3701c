"""FedRoD (issue #55) against a NumPy transcription of Chen & Chao, ICLR 2022 (Fed-RoD) — body and generic head
stepped on the balanced softmax loss of the client's class counts, the personal head on the ordinary loss of the
summed logits (features and generic logits detached), the generic model's n_i/n mean — several rounds, partial
participation, returning clients, non-IID clients (Dirichlet), a resume equal to the uninterrupted run; FedAdam as
the server rule; the personal model (the client's personal head) in ``fed_personal_*``."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from helpers import classification_dataset, federated_fit, numpy_fedadam, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedRoDClient
from lightning_fed.callbacks import FedAdam, FedRoD
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, IIDPartitioner, SampledLocalWork
from lightning_fed.evaluation import FederatedEvaluation

GAMMA = 0.1
BODY, HEAD, PERSONAL = ("body.weight", "body.bias"), ("head.weight", "head.bias"), ("personal_head.weight",
                                                                                   "personal_head.bias")


class TwoHeads(L.LightningModule):
    """z = tanh(body(x)) (3 → 4); logits = head(z) + personal_head(z) (4 → 3 classes), the personal head 0 at first;
    cross-entropy, SGD; float64."""

    def __init__(self, zero_personal=True):
        super().__init__()
        self.body, self.head, self.personal_head = (nn.Linear(3, 4).double(), nn.Linear(4, 3).double(),
                                                    nn.Linear(4, 3).double())
        if zero_personal:
            nn.init.zeros_(self.personal_head.weight), nn.init.zeros_(self.personal_head.bias)

    def forward(self, x):
        z = torch.tanh(self.body(x))
        return self.head(z) + self.personal_head(z)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=GAMMA)


def _datamodule(**kwargs):
    data = classification_dataset(n=90, d=3, classes=3, seed=4)
    x, y = data.tensors[0].double().numpy(), data.tensors[1].numpy()
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.targets = torch.tensor(y)
    dm = FederatedDataModule(dataset, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5, min_partition_size=5,
                                                                       seed=0),
                             clients_per_round=3, local_work=SampledLocalWork(epochs=[1, 2], batch_size=[3, 6], seed=1),
                             **kwargs)
    dm.setup()
    return x, y, dm


def _weights(model):
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def _softmax(a):
    e = np.exp(a - a.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _grads(w, x, y, log_counts):
    """∇ of the balanced risk L^BR (mean −log softmax(g + log N)_y) over body and generic head, and of the personal loss
    (mean −log softmax(sg(g) + p(sg(z)))_y) over the personal head, at one mini-batch."""
    onehot = np.eye(3)[y] / len(y)
    z = np.tanh(x @ w["body.weight"].T + w["body.bias"])
    g = z @ w["head.weight"].T + w["head.bias"]
    p = z @ w["personal_head.weight"].T + w["personal_head.bias"]
    da = _softmax(g + log_counts) / len(y) - onehot
    dz = (da @ w["head.weight"]) * (1 - z ** 2)
    ds = _softmax(g + p) / len(y) - onehot
    return {"head.weight": da.T @ z, "head.bias": da.sum(0), "body.weight": dz.T @ x, "body.bias": dz.sum(0),
            "personal_head.weight": ds.T @ z, "personal_head.bias": ds.sum(0)}


def _fedrod_reference(w0, x, y, dm, rounds, balanced=True, server_step=None):
    """Fed-RoD: every mini-batch steps θ, ψ on L^BR and φ_i on L_i (one step size η); server: the n_i/n mean of θ, ψ.
    ``balanced=False`` is the deliberately wrong variant (the generic head on the ordinary loss)."""
    glob, own, shared = dict(w0), {}, (*BODY, *HEAD)
    for t in range(rounds):
        drifts, sizes = [], []
        for cid in dm.sample_clients(t):
            counts = np.bincount(y[dm.client_indices(cid)], minlength=3).astype(float)
            with np.errstate(divide="ignore"):
                log_counts = np.log(counts) if balanced else np.zeros(3)
            w = {**glob, **own.get(int(cid), {})}
            for batch in dm.client_batches(cid, t):
                g = _grads(w, x[batch], y[batch], log_counts)
                w = {k: w[k] - GAMMA * g[k] for k in w}
            own[int(cid)] = {k: w[k] for k in PERSONAL}
            drifts.append({k: w[k] - glob[k] for k in shared})
            sizes.append(dm.client_num_samples(cid))
        p = np.array(sizes, dtype=float) / sum(sizes)
        delta = {k: sum(pi * d[k] for pi, d in zip(p, drifts)) for k in shared}
        if server_step is None:
            glob.update({k: glob[k] + delta[k] for k in shared})
        else:
            server_step(glob, delta)
    return glob, own


def _fit(tmp_path, server, rounds, dm=None, ckpt_dir=None, ckpt_path=None, **trainer_kwargs):
    if dm is None:
        *_, dm = _datamodule()
    torch.manual_seed(0)
    model = TwoHeads()
    w0 = _weights(model)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, ckpt_dir, ckpt_path, **trainer_kwargs)
    return w0, model, trainer


def _personal_rows(own):
    return {cid: np.concatenate([head[k].ravel() for k in PERSONAL]) for cid, head in own.items()}


@pytest.mark.parametrize("balanced", [True, False], ids=["algorithm_1", "wrong_reference_unbalanced"])
def test_fedrod_equals_numpy_algorithm_1(tmp_path, balanced):
    x, y, dm = _datamodule()
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    server = FedRoD()
    w0, model, _ = _fit(tmp_path, server, rounds=4, dm=dm)
    want, own = _fedrod_reference(w0, x, y, dm, rounds=4, balanced=balanced)
    got, table = _weights(model), server.client_algorithm_states["FedRoDClient"]
    close = all(np.allclose(got[k], want[k], rtol=1e-12, atol=1e-13) for k in (*BODY, *HEAD))
    rows = _personal_rows(own)
    close = close and all(np.allclose(table.get(c).numpy(), rows[c], rtol=1e-12, atol=1e-13) for c in rows)
    assert close is balanced
    assert sorted(table.ids()) == sorted(rows)
    assert all(not np.any(got[k]) for k in PERSONAL)  # the global personal head stays 0


def test_fedrods_generic_model_under_fedadam_equals_numpy(tmp_path):
    """Composable with any server rule: FedAdam (Reddi et al. 2021, Alg. 2, τ = 1e-3) on the n_i/n mean."""
    x, y, dm = _datamodule()
    w0, model, _ = _fit(tmp_path, FedAdam(lr=0.01), rounds=3, dm=dm, client_algorithms=[FedRoDClient()])
    shared = (*BODY, *HEAD)
    steps = {k: numpy_fedadam() for k in shared}  # one FedAdam state per parameter

    def adam(glob, delta):
        glob.update({k: steps[k](glob[k], delta[k]) for k in shared})

    want, _ = _fedrod_reference(w0, x, y, dm, rounds=3, server_step=adam)
    got = _weights(model)
    for k in shared:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)


def test_fedrod_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = FedRoD()
    _, full, _ = _fit(tmp_path / "a", full_server, rounds=4)
    _fit(tmp_path / "b", FedRoD(), rounds=2, ckpt_dir=tmp_path / "cb")
    server = FedRoD()
    _, resumed, _ = _fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                         ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    a, b = _weights(full), _weights(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    ta, tb = full_server.client_algorithm_states["FedRoDClient"], server.client_algorithm_states["FedRoDClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


def test_the_personal_model_adds_the_clients_personal_head(tmp_path):
    """fed_personal_val_loss = the NumPy cross-entropy of head(z) + personal_head_i(z) on the client's held-out
    data; fed_val_loss the generic head's alone (the global personal head is 0); the training hooks are gone."""
    x, y, dm = _datamodule(eval_fraction=0.25, eval_clients_per_round="all", eval_batch_size=4)
    server = FedRoD()
    _, model, trainer = _fit(tmp_path, server, rounds=3, dm=dm)
    glob, table = _weights(model), server.client_algorithm_states["FedRoDClient"]
    last = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last

    def loss(w, idx):
        z = np.tanh(x[idx] @ w["body.weight"].T + w["body.bias"])
        s = z @ w["head.weight"].T + w["head.bias"] + z @ w["personal_head.weight"].T + w["personal_head.bias"]
        return float(np.mean(-np.log(_softmax(s)[np.arange(len(idx)), y[idx]])))

    want, plain = [], []
    for cid in last.client_ids.tolist():
        w = dict(glob)
        if cid in table:
            row = table.get(cid).numpy()
            w["personal_head.weight"], w["personal_head.bias"] = row[:12].reshape(3, 4), row[12:]
        want.append(loss(w, dm.client_eval_indices(cid)))
        plain.append(loss(glob, dm.client_eval_indices(cid)))
    assert any(cid in table for cid in last.client_ids.tolist())
    np.testing.assert_allclose(last.personal["val_loss"], want, rtol=1e-9)
    np.testing.assert_allclose(last.metrics["val_loss"], plain, rtol=1e-9)
    assert "training_step" not in vars(model) and not model.head._forward_hooks
    assert not model.personal_head._forward_hooks


@pytest.mark.parametrize("kwargs, match", [
    ({"generic_head": ""}, r"`generic_head` must be the name of a submodule"),
    ({"personal_head": 3}, r"`personal_head` must be the name of a submodule"),
    ({"generic_head": "h", "personal_head": "h"}, r"must name two different submodules"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedRoDClient(**kwargs)


@pytest.mark.parametrize("server, model, match", [
    (FedRoD(personal_head="p"), TwoHeads(), r"`personal_head` 'p' is not a submodule of TwoHeads"),
    (FedRoD(), TwoHeads(zero_personal=False), r"the personal head 'personal_head' must start at 0"),
])
def test_bad_models_are_refused_at_fit_start(tmp_path, server, model, match):
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=match):
        trainer.fit(model, datamodule=_datamodule()[2])
    assert trainer.global_step == 0


def test_labels_that_are_not_class_indices_are_refused_at_fit_start(tmp_path):
    data = classification_dataset(n=30, d=3, classes=3, seed=4)
    dataset = TensorDataset(data.tensors[0].double(), data.tensors[1])
    dataset.targets = np.array(["abc"[int(c)] for c in data.tensors[1]])
    dm = FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=2,
                             batch_size=5)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedRoD()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"FedRoDClient counts each client's classes by their integer labels"):
        trainer.fit(TwoHeads(), datamodule=dm)
    assert trainer.global_step == 0


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(FedRoD)
