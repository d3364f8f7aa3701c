"""SCAFFOLD end to end against a NumPy transcription of Karimireddy et al. 2020, Alg. 1 (option II)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from helpers import CHECKPOINT_DIR_REUSED, LinearRegression, assert_ready_made_name, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.algorithms.scaffold import SCAFFOLD
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork


def _weights(model: LinearRegression) -> np.ndarray:
    return np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])


def _flat(tensors) -> np.ndarray:
    return np.concatenate([t.detach().cpu().numpy().ravel() for t in tensors])


def _mse_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇_w mean((x·w[:-1] + w[-1] − y)²)."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ (xb @ w - y)


def _skewed_regression(n=48, d=3, seed=0):
    """Regression data whose targets depend on the row's position, so IID-by-position clients still differ a lot."""
    x, y = regression_data(n=n, d=d, seed=seed)
    return x, y + np.linspace(-3.0, 3.0, n) ** 2


def _reference(w0, x, y, dm, rounds, client_lr, server_lr, weighting="uniform"):
    """Karimireddy et al. 2020, Alg. 1, option II, with the data module's cohorts and mini-batches as inputs.

    Returns x, c and {client: c_i} after `rounds` rounds.
    """
    n = dm.num_clients
    w, c = w0.copy(), np.zeros_like(w0)
    ci = {k: np.zeros_like(w0) for k in range(n)}
    for t in range(rounds):
        cohort = dm.sample_clients(t)
        dys, dcs, sizes = [], [], []
        for k in cohort:
            yk = w.copy()
            batches = dm.client_batches(k, t)
            for b in batches:  # l. 8-10
                yk = yk - client_lr * (_mse_grad(yk, x[b], y[b]) - ci[k] + c)
            steps = len(batches)
            ci_plus = ci[k] - c + (w - yk) / (steps * client_lr)  # l. 12, option II
            dys.append(yk - w)
            dcs.append(ci_plus - ci[k])  # l. 13
            sizes.append(dm.client_num_samples(k))
            ci[k] = ci_plus  # l. 14
        lam = np.ones(len(cohort)) if weighting == "uniform" else np.array(sizes, float)
        lam = lam / lam.sum()
        dx = (lam[:, None] * np.array(dys)).sum(0)  # l. 16
        dc = np.mean(dcs, axis=0)
        w = w + server_lr * dx  # l. 17
        c = c + len(cohort) / n * dc
    return w, c, ci


def _datamodule(x, y, num_clients, per_round, **kwargs):
    dm = FederatedDataModule(
        TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
        clients_per_round=per_round, **kwargs,
    )
    dm.setup()
    return dm


def _stale_client(dm, rounds) -> bool:
    """Some client participates, sits out at least one round, then participates again."""
    seen = [set(dm.sample_clients(t).tolist()) for t in range(rounds)]
    return any(
        k in seen[b] and k not in seen[a + 1]
        for a in range(rounds) for b in range(a + 2, rounds) for k in seen[a]
    )


def _check_state(server, model, want_w, want_c, want_ci, num_clients):
    np.testing.assert_allclose(_weights(model), want_w, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_flat(server.state["control"]), want_c, rtol=0, atol=1e-9)
    for k in range(num_clients):
        np.testing.assert_allclose(_flat(server.client_control(k)), want_ci[k], rtol=0, atol=1e-9)


def test_scaffold_matches_numpy_alg1_with_stale_client_variates(tmp_path):
    x, y = _skewed_regression(seed=1)
    dm = _datamodule(x, y, num_clients=4, per_round=2, batch_size=1000, local_epochs=3, seed=5)  # full batch, K = 3
    assert _stale_client(dm, 3), "the test needs a client that comes back with a stale c_i"
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    w0 = _weights(model)
    server = SCAFFOLD(lr=0.8)
    FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    w, c, ci = _reference(w0, x, y, dm, rounds=3, client_lr=0.05, server_lr=0.8)
    assert server.num_clients == 4 and server.num_steps == 3
    _check_state(server, model, w, c, ci, 4)
    assert np.abs(c).max() > 1e-2 and sum(np.abs(v).max() > 1e-2 for v in ci.values()) >= 3
    # FedAvg (no control variates) from the same start ends elsewhere: the correction matters here.
    fedavg = w0.copy()
    for t in range(3):
        deltas = []
        for k in dm.sample_clients(t):
            idx, wk = dm.client_indices(k), fedavg.copy()
            for _ in range(3):
                wk = wk - 0.05 * _mse_grad(wk, x[idx], y[idx])
            deltas.append(wk - fedavg)
        fedavg = fedavg + 0.8 * np.mean(deltas, axis=0)
    assert np.abs(fedavg - w).max() > 1e-3


def test_scaffold_heterogeneous_local_steps_and_minibatches(tmp_path):
    """Each client uses its own K_i (number of local steps) in option II; Δx weighted by client size."""
    x, y = _skewed_regression(n=50, seed=2)
    dm = _datamodule(
        x, y, num_clients=5, per_round=3, local_work=SampledLocalWork(epochs=(1, 3), batch_size=(4, None), seed=0),
    )
    steps = {len(dm.client_batches(k, t)) for t in range(3) for k in dm.sample_clients(t)}
    assert len(steps) >= 3, "clients must take different numbers of local steps"
    torch.manual_seed(0)
    model = LinearRegression(lr=0.02)
    w0 = _weights(model)
    server = SCAFFOLD(lr=1.0, weighting="num_samples")
    FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    w, c, ci = _reference(w0, x, y, dm, rounds=3, client_lr=0.02, server_lr=1.0, weighting="num_samples")
    _check_state(server, model, w, c, ci, 5)


def test_server_rule_on_given_updates():
    """c ← c + (1/N)ΣΔc_i and c_i ← c_i + Δc_i, Δx uniform mean; a client seen twice accumulates its Δc."""
    rng = np.random.default_rng(0)
    server = SCAFFOLD(lr=0.5)
    server.num_clients = 6
    x0 = [rng.normal(size=(2, 3)), rng.normal(size=(3,))]
    params = [torch.tensor(p) for p in x0]
    rounds = [[1, 4], [4, 5, 0]]
    want_x, want_c = _flat(params), np.zeros(9)
    want_ci = {k: np.zeros(9) for k in range(6)}
    for cohort in rounds:
        updates = []
        dys, dcs = [], []
        for k in cohort:
            dy = [rng.normal(size=p.shape) for p in x0]
            dc = [rng.normal(size=p.shape) for p in x0]
            updates.append(ClientUpdate(
                client_id=k, delta=[torch.tensor(d) for d in dy], num_samples=int(rng.integers(1, 9)), num_steps=2,
                loss=0.0, extras={"delta_control": [torch.tensor(d) for d in dc]},
            ))
            dys.append(_flat([torch.tensor(d) for d in dy]))
            dcs.append(_flat([torch.tensor(d) for d in dc]))
            want_ci[k] = want_ci[k] + dcs[-1]
        server.server_update(params, updates)
        want_x = want_x + 0.5 * np.mean(dys, axis=0)
        want_c = want_c + len(cohort) / 6 * np.mean(dcs, axis=0)
    np.testing.assert_allclose(_flat(params), want_x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(_flat(server.state["control"]), want_c, rtol=0, atol=1e-12)
    for k in range(6):
        np.testing.assert_allclose(_flat(server.client_control(k)), want_ci[k], rtol=0, atol=1e-12)
    assert sorted(server.client_controls) == [0, 1, 4, 5]


def _resume_run(tmp_path, max_epochs, ckpt_dir, ckpt_path=None):
    x, y = _skewed_regression(seed=1)
    dm = _datamodule(x, y, num_clients=4, per_round=2, batch_size=8, local_epochs=2)
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = SCAFFOLD(lr=0.8)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True}
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=[server, checkpoint], **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, server


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_checkpoint_resume_equals_uninterrupted_and_loads_weights_only(tmp_path):
    full, full_server = _resume_run(tmp_path / "a", 4, tmp_path / "ca")
    _resume_run(tmp_path / "b", 2, tmp_path / "cb")
    ckpt = torch.load(tmp_path / "cb" / "last.ckpt", weights_only=True)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("SCAFFOLD")]
    # #41: the stage's state is saved one way, under "aggregators" (N is the c_i table's)
    assert "num_clients" not in state and "client_state" not in state and state["num_steps"] == 2
    table = state["aggregators"][0]["table"]["client_state_table"]
    assert table["num_clients"] == 4 and table["rows"] and state["aggregators"][0]["control"] is not None
    resumed, server = _resume_run(tmp_path / "b", 4, tmp_path / "cb", ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert server.num_steps == 4
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    for p, q in zip(full_server.state["control"], server.state["control"]):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert full_server.client_controls.keys() == server.client_controls.keys()
    for k in full_server.client_controls:
        torch.testing.assert_close(full_server.client_controls[k], server.client_controls[k], rtol=0, atol=0)


def test_state_dict_round_trip(tmp_path):
    server = SCAFFOLD(lr=0.3)
    server.num_clients = 3
    params = [torch.zeros(2, dtype=torch.float64)]
    update = ClientUpdate(client_id=2, delta=[torch.ones(2, dtype=torch.float64)], num_samples=1, num_steps=1,
                          loss=0.0, extras={"delta_control": [torch.tensor([1.0, -2.0], dtype=torch.float64)]})
    server.server_update(params, [update])
    torch.save(server.state_dict(), tmp_path / "s.pt")
    other = SCAFFOLD(lr=0.3)
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert other.client_state.num_clients == 3 and other.num_steps == 1
    np.testing.assert_allclose(_flat(other.state["control"]), [1 / 3, -2 / 3])
    np.testing.assert_allclose(_flat(other.client_control(2)), [1.0, -2.0])
    np.testing.assert_allclose(_flat(other.client_control(0)), [0.0, 0.0])
    mismatched = SCAFFOLD()
    mismatched.num_clients = 5
    mismatched.load_state_dict(server.state_dict())  # refused before any state changes (fit start, or the round)
    with pytest.raises(ValueError, match="control variates for 3 clients, but the data module has 5 clients"):
        mismatched.server_update(params, [update])
    assert mismatched.num_steps == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"lr": 0.0}, r"`lr` must be a finite number > 0, got 0.0"),
        ({"lr": -1.0}, r"`lr` must be a finite number > 0, got -1.0"),
        ({"lr": float("nan")}, r"`lr` must be a finite number > 0, got nan"),
        ({"weighting": "mean"}, r"`weighting` must be one of .*got 'mean'"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SCAFFOLD(**kwargs)


def test_misuse_errors():
    params = [torch.zeros(2)]
    update = ClientUpdate(client_id=0, delta=[torch.ones(2)], num_samples=1, num_steps=1, loss=0.0)
    with pytest.raises(RuntimeError, match="needs the number of clients N"):
        SCAFFOLD().server_update(params, [update])
    server = SCAFFOLD()
    server.num_clients = 2
    with pytest.raises(RuntimeError, match=r"no extras\['delta_control'\]"):
        server.server_update(params, [update])
    update.client_id, update.extras = 7, {"delta_control": [torch.ones(2)]}
    with pytest.raises(ValueError, match=r"Client id 7 is outside \[0, 2\)"):
        server.server_update(params, [update])
    assert repr(SCAFFOLD()) == "SCAFFOLD(lr=1.0, weighting='uniform')"


def test_41_scaffold_keeps_no_behaviour_in_callbacks(tmp_path):
    """SCAFFOLD's checks, c and c_i live in its stage (algorithms/scaffold.py); the callback is a ready-made name.
    A replaced chain is still refused at fit start."""
    assert_ready_made_name(SCAFFOLD, delegates=("_stage_state", "client_control"))
    from lightning_fed.algorithms import ScaffoldControl
    from lightning_fed.server.aggregators import check_chain

    server = SCAFFOLD()
    server.aggregators = check_chain([ScaffoldControl()])  # another chain (a new stage): not the class's own
    x, y = regression_data(n=30)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=3)
    with pytest.raises(ValueError, match=r"SCAFFOLD aggregates in its own way \(its aggregator chain is \[ScaffoldControl\]\)"):
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=dm)
