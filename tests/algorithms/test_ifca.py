"""IFCA (issue #55) against a NumPy transcription of Ghosh et al., NeurIPS 2020, Alg. 1, option II (model averaging) —
each client picks the cluster model with the lowest loss on its data, trains it by local SGD, the server averages
per cluster — on a mixture of two linear regressions (the paper's synthetic setting), several rounds, partial
participation, returning clients, a resume equal to the uninterrupted run; what cannot compose refused at fit start;
the personal model (the best cluster) in ``fed_personal_*``. θ_1^{(0)} is an ``nn.Linear`` drawn under
``cluster_seed`` (the documented seed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from helpers import LinearRegression, federated_fit, linear_weights, mse_grad, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import DittoClient, IFCAClient
from lightning_fed.algorithms.ifca import IFCAClusters, cluster_seed
from lightning_fed.callbacks import IFCA, FedAdam, FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork
from lightning_fed.evaluation import FederatedEvaluation

GAMMA = 0.05


def _datamodule(**kwargs):
    """6 clients; the even ones' labels from w_A, the odd ones' from w_B (x·w + noise)."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(72, 3))
    args = dict(partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                local_work=SampledLocalWork(epochs=[1, 2], batch_size=[3, 6], seed=1), **kwargs)
    probe = FederatedDataModule(TensorDataset(torch.tensor(x), torch.zeros(72, dtype=torch.float64)), **args)
    probe.setup()
    y = np.empty(72)
    for cid in range(6):
        idx = probe.client_indices(cid)
        w = np.array([2.0, -1.0, 0.5, 1.0]) if cid % 2 == 0 else np.array([-1.5, 0.5, 2.0, -1.0])
        y[idx] = x[idx] @ w[:3] + w[3] + 0.05 * rng.normal(size=len(idx))
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), **args)
    dm.setup()
    return x, y, dm


def _initial_cluster(seed, j):
    torch.manual_seed(cluster_seed(seed, j))
    lin = nn.Linear(3, 1, dtype=torch.float64)
    return np.concatenate([lin.weight.detach().numpy().ravel(), lin.bias.detach().numpy()])


def _ifca_reference(thetas, x, y, dm, rounds, pick=np.argmin, choices=None):
    """Alg. 1, option II: ĵ = argmin_j F_i(θ_j) (mean squared error over the client's samples); local SGD from θ_ĵ over
    the round's batches; θ_j ← the uniform mean of its clients' models (unchanged without any). ``pick=np.argmax``
    is the deliberately wrong variant."""
    thetas = [t.copy() for t in thetas]
    xb = np.hstack([x, np.ones((len(x), 1))])
    for t in range(rounds):
        members = {j: [] for j in range(len(thetas))}
        for cid in dm.sample_clients(t):
            idx = dm.client_indices(cid)
            j = int(pick([np.mean((xb[idx] @ th - y[idx]) ** 2) for th in thetas]))
            w = thetas[j].copy()
            for batch in dm.client_batches(cid, t):
                w = w - GAMMA * mse_grad(w, x[batch], y[batch])
            members[j].append(w)
            if choices is not None:
                choices.append(j)
        thetas = [np.mean(members[j], axis=0) if members[j] else thetas[j] for j in range(len(thetas))]
    return thetas


def _fit(tmp_path, server, rounds, dm=None, ckpt_dir=None, ckpt_path=None, **trainer_kwargs):
    if dm is None:
        *_, dm = _datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=GAMMA)
    w0 = linear_weights(model)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, ckpt_dir, ckpt_path, **trainer_kwargs)
    return w0, model, trainer


def _clusters(server, model):
    fields = server.stage_state_fields(server.cluster_stage)
    return [linear_weights(model), *fields["models"].numpy()]


@pytest.mark.parametrize("pick", [np.argmin, np.argmax], ids=["algorithm_1_option_ii", "wrong_reference_argmax"])
def test_ifca_equals_numpy_algorithm_1_option_ii(tmp_path, pick):
    x, y, dm = _datamodule()
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    server = IFCA(num_clusters=2)
    w0, model, trainer = _fit(tmp_path, server, rounds=4, dm=dm)
    choices = []
    want = _ifca_reference([w0, _initial_cluster(dm.seed, 1)], x, y, dm, rounds=4, pick=pick, choices=choices)
    got = _clusters(server, model)
    close = all(np.allclose(g, w, rtol=1e-12, atol=1e-13) for g, w in zip(got, want))
    assert close is (pick is np.argmin)
    if pick is np.argmin:
        assert set(choices) == {0, 1}  # both clusters trained
        assert trainer.callback_metrics["ifca_cluster_1_clients"] + trainer.callback_metrics[
            "ifca_cluster_0_clients"] == 3


def test_ifca_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = IFCA(num_clusters=2)
    _, full, _ = _fit(tmp_path / "a", full_server, rounds=4)
    _fit(tmp_path / "b", IFCA(num_clusters=2), rounds=2, ckpt_dir=tmp_path / "cb")
    server = IFCA(num_clusters=2)
    _, resumed, _ = _fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                         ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert all(np.array_equal(a, b) for a, b in zip(_clusters(full_server, full), _clusters(server, resumed)))


def test_the_personal_model_is_the_best_cluster_on_the_clients_data(tmp_path):
    x, y, dm = _datamodule(eval_fraction=0.25, eval_clients_per_round="all", eval_batch_size=4)
    server = IFCA(num_clusters=2)
    _, model, trainer = _fit(tmp_path, server, rounds=3, dm=dm)
    thetas = _clusters(server, model)
    last = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last
    xb = np.hstack([x, np.ones((len(x), 1))])
    want = []
    for cid in last.client_ids.tolist():
        idx, ev = dm.client_indices(cid), dm.client_eval_indices(cid)
        best = thetas[int(np.argmin([np.mean((xb[idx] @ th - y[idx]) ** 2) for th in thetas]))]
        want.append(np.mean((xb[ev] @ best - y[ev]) ** 2))
    np.testing.assert_allclose(last.personal["val_loss"], want, rtol=1e-9)
    assert not np.allclose(last.personal["val_loss"], last.metrics["val_loss"])
    from lightning_fed.personal import personal_model  # the accessor: the best cluster's copy, the module untouched

    for cid in (0, 1):
        idx = dm.client_indices(cid)
        best = thetas[int(np.argmin([np.mean((xb[idx] @ th - y[idx]) ** 2) for th in thetas]))]
        np.testing.assert_array_equal(linear_weights(personal_model(trainer, cid)), best)
    np.testing.assert_array_equal(linear_weights(model), thetas[0])


@pytest.mark.parametrize("server, halves, match, kwargs", [
    (lambda: FedAdam(lr=0.01, aggregators=[IFCAClusters(2)]), lambda: [IFCAClient()],
     r"FedAdam's server rule Adam has one state for one model; IFCA needs the plain SGD rule", {}),
    (lambda: FedAvg(), lambda: [IFCAClient()], r"IFCAClient\(\) \(IFCA's client half\) needs IFCA's server half",
     {}),
    (lambda: IFCA(), lambda: [DittoClient(0.1)], r"IFCA cannot run with the client half\(s\) \[DittoClient", {}),
    (lambda: IFCA(), lambda: [], r"`max_update_norm_ratio`=3 compares the clients' update norms",
     {"max_update_norm_ratio": 3.0}),
])
def test_what_cannot_compose_is_refused_at_fit_start(tmp_path, server, halves, match, kwargs):
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server()], client_algorithms=halves(),
                               **quiet_trainer_kwargs(tmp_path), **kwargs)
    with pytest.raises(ValueError, match=match):
        trainer.fit(LinearRegression(lr=GAMMA), datamodule=_datamodule()[2])
    assert trainer.global_step == 0


def test_bad_num_clusters_is_refused():
    with pytest.raises(ValueError, match=r"`num_clusters` must be an integer >= 2"):
        IFCA(num_clusters=1)


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(IFCA)
