"""ScaffoldControl (Karimireddy et al. 2020, Alg. 1, l. 14-17) as a stage against NumPy: Δx the mean of Δy_i,
c ← c + (1/N)·ΣΔc_i, c_i ← c_i + Δc_i; SCAFFOLD is that stage composed with the SGD rule (η_g)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import SCAFFOLD
from lightning_fed.algorithms.scaffold import ScaffoldControl
from lightning_fed.server.aggregators import ClientDeltas, RoundInfo
from lightning_fed.server.rules import SGD


def _updates(rng, ids):
    return [ClientUpdate(i, [torch.tensor(rng.normal(size=(2, 2))), torch.tensor(rng.normal(size=2))],
                         num_samples=i + 1, num_steps=1, loss=0.0,
                         extras={"delta_control": [torch.tensor(rng.normal(size=(2, 2))), torch.tensor(rng.normal(size=2))]})
            for i in ids]


def _flat(tensors):
    return np.concatenate([t.numpy().ravel() for t in tensors])


def test_stage_matches_numpy_over_two_rounds():
    rng = np.random.default_rng(0)
    n = 5
    stage = ScaffoldControl(num_clients=n)
    state = stage.init_state([torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)], n)
    c, ci = np.zeros(6), np.zeros((n, 6))
    for t, ids in enumerate([(0, 3), (3, 4, 1)]):
        updates = _updates(rng, ids)
        counts = torch.tensor([float(u.num_samples) for u in updates], dtype=torch.float64)
        x = ClientDeltas(list(ids), [u.delta for u in updates], counts, updates)
        delta, state = stage.apply(x, state, RoundInfo(t, 0, n, len(ids)))
        w = counts.numpy() / counts.sum().item()
        np.testing.assert_allclose(_flat(delta), sum(wi * _flat(u.delta) for wi, u in zip(w, updates)), rtol=1e-14)
        for u in updates:
            dc = _flat(u.extras["delta_control"])
            c += dc / n
            ci[u.client_id] += dc
        np.testing.assert_allclose(_flat(state.control), c, rtol=1e-14, atol=1e-15)
        for i in range(n):
            np.testing.assert_allclose(state.table.get(i).numpy(), ci[i], rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(_flat(state.control), ci.mean(axis=0), rtol=1e-13)  # c = mean_i c_i


def test_scaffold_is_the_stage_with_sgd():
    server = SCAFFOLD(lr=0.5)
    server.num_clients = 4
    assert isinstance(server.server_rule, SGD) and server.server_rule.lr == 0.5
    assert server.aggregators == [server.control_stage] and server.control_stage.num_clients == 4
    updates = [ClientUpdate(0, [torch.tensor([1.0])], 1, 1, 0.0, extras={"delta_control": [torch.tensor([2.0])]}),
               ClientUpdate(3, [torch.tensor([3.0])], 1, 1, 0.0, extras={"delta_control": [torch.tensor([-6.0])]})]
    params = [torch.tensor([1.0])]
    server.server_update(params, updates)
    assert params[0].item() == 2.0  # 1 + 0.5·(1 + 3)/2
    assert server.state["control"][0].item() == -1.0 and server.client_control(3)[0].item() == -6.0
    assert server.client_state is server.aggregator_state[0].table


def test_stage_refuses_bad_rounds():
    u = ClientUpdate(7, [torch.ones(1)], 1, 1, 0.0, extras={"delta_control": [torch.ones(1)]})
    x = ClientDeltas([7], [u.delta], torch.ones(1, dtype=torch.float64), [u])
    with pytest.raises(RuntimeError, match="needs the number of clients N"):
        ScaffoldControl().apply(x, ScaffoldControl.State(), RoundInfo(0, 0, 8, 1))
    with pytest.raises(ValueError, match=r"Client id 7 is outside \[0, 4\)"):
        ScaffoldControl(num_clients=4).apply(x, ScaffoldControl.State(), RoundInfo(0, 0, 4, 1))
    with pytest.raises(RuntimeError, match="ClientDeltas.updates"):
        ScaffoldControl(num_clients=8).apply(x._replace(updates=None), ScaffoldControl.State(), RoundInfo(0, 0, 8, 1))


# ---------------------------------------------------------------- the two halves under another server rule (issue #30)
def _scaffold_yogi_reference(w0, x, y, dm, rounds, client_lr, eta, beta1=0.9, beta2=0.99, tau=1e-3):
    """Karimireddy et al. 2020, Alg. 1 (option II) for the clients, c and the c_i (l. 7-17), with the server step
    x ← x + η_g·Δx of l. 17 replaced by Reddi et al. 2021, Alg. 2's FedYogi on Δx (v₋₁ = τ²): NumPy only."""
    from helpers import mse_grad

    n = dm.num_clients
    w, c = w0.copy(), np.zeros_like(w0)
    ci = {k: np.zeros_like(w0) for k in range(n)}
    m, v = np.zeros_like(w0), np.full_like(w0, tau**2)
    for t in range(rounds):
        cohort = dm.sample_clients(t)
        dys, dcs = [], []
        for k in cohort:
            yk = w.copy()
            batches = dm.client_batches(k, t)
            for b in batches:
                yk = yk - client_lr * (mse_grad(yk, x[b], y[b]) - ci[k] + c)  # l. 10
            ci_plus = ci[k] - c + (w - yk) / (len(batches) * client_lr)  # l. 12, option II
            dys.append(yk - w)
            dcs.append(ci_plus - ci[k])
            ci[k] = ci_plus
        dx = np.mean(dys, axis=0)  # l. 16, uniform
        c = c + np.sum(dcs, axis=0) / n  # l. 17
        m = beta1 * m + (1 - beta1) * dx  # Reddi et al. Alg. 2, FedYogi
        v = v - (1 - beta2) * dx**2 * np.sign(v - dx**2)
        w = w + eta * m / (np.sqrt(v) + tau)
    return w, c, ci


def test_scaffold_halves_under_fedyogi_match_numpy(tmp_path):
    from helpers import LinearRegression, linear_weights, quiet_trainer_kwargs, regression_data
    from torch.utils.data import TensorDataset

    from lightning_fed import FederatedTrainer
    from lightning_fed.algorithms import ScaffoldClient
    from lightning_fed.callbacks import FedYogi
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork

    x, y = regression_data(n=60, d=3, seed=2)
    y = y + np.linspace(-2.0, 2.0, len(y)) ** 2  # clients that differ: a drift to correct
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 5], seed=1))
    dm.setup()
    torch.manual_seed(0)
    model = LinearRegression(lr=0.03)
    w0 = linear_weights(model)
    server = FedYogi(lr=0.05, weighting="uniform", aggregators=[ScaffoldControl()], client=[ScaffoldClient()])
    FederatedTrainer(max_epochs=4, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    want_w, want_c, want_ci = _scaffold_yogi_reference(w0, x, y, dm, rounds=4, client_lr=0.03, eta=0.05)
    (state,) = server.aggregator_state
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=0, atol=1e-10)
    np.testing.assert_allclose(_flat(state.control), want_c, rtol=0, atol=1e-10)
    for k in range(6):
        got = state.table.get(k) if k in state.table else torch.zeros(len(want_w), dtype=torch.float64)
        np.testing.assert_allclose(got.numpy(), want_ci[k], rtol=0, atol=1e-10)
    assert len({frozenset(dm.sample_clients(t).tolist()) for t in range(4)}) > 1  # partial participation


def test_scaffold_halves_under_fedyogi_resume_bit_for_bit(tmp_path):
    """The chain state (c and the c_i table) of a composed SCAFFOLD goes into the checkpoint (weights-only) and back."""
    from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import TensorDataset

    from lightning_fed import FederatedTrainer
    from lightning_fed.algorithms import ScaffoldClient
    from lightning_fed.callbacks import FedYogi
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    def run(folder, epochs, ckpt=None):
        x, y = regression_data(n=40, d=3, seed=3)
        dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                                 partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                                 batch_size=4, local_epochs=2)
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        server = FedYogi(lr=0.05, weighting="uniform", aggregators=[ScaffoldControl()], client=[ScaffoldClient()])
        saver = ModelCheckpoint(dirpath=str(tmp_path / folder), save_last=True, every_n_epochs=1)
        FederatedTrainer(max_epochs=epochs, callbacks=[server, saver],
                         **(quiet_trainer_kwargs(tmp_path / folder) | {"enable_checkpointing": True})).fit(
            model, datamodule=dm, ckpt_path=ckpt)
        return model

    full = run("a", 4)
    run("b", 2)
    torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    resumed = run("b", 4, ckpt=str(tmp_path / "b" / "last.ckpt"))
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("half", ["client", "server"])
def test_one_half_alone_is_refused_at_fit_start_naming_both(tmp_path, half):
    from helpers import LinearRegression, linear_weights, quiet_trainer_kwargs, regression_data
    from torch.utils.data import TensorDataset

    from lightning_fed import FederatedTrainer
    from lightning_fed.algorithms import ScaffoldClient
    from lightning_fed.callbacks import FedYogi
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    x, y = regression_data(n=20, d=3, seed=0)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2, batch_size=5)
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    server = (FedYogi(client=[ScaffoldClient()]) if half == "client"
              else FedYogi(aggregators=[ScaffoldControl()]))
    match = (r"ScaffoldClient\(\) \(SCAFFOLD's client half\) needs SCAFFOLD's server half in FedYogi's `aggregators`"
             if half == "client" else
             r"ScaffoldControl\(\) \(SCAFFOLD's server half\) .* needs SCAFFOLD's client half")
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=match):
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 0 and np.array_equal(linear_weights(model), w0)


def _population_run(tmp_path, folder, num_clients, composed, ckpt=None, epochs=1, callbacks=()):
    from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import TensorDataset

    from lightning_fed import FederatedTrainer
    from lightning_fed.algorithms import ScaffoldClient
    from lightning_fed.callbacks import FedYogi
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    x, y = regression_data(n=40, d=3, seed=3)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=num_clients, seed=0), clients_per_round=2,
                             batch_size=4)
    torch.manual_seed(0)
    server = FedYogi(lr=0.05, weighting="uniform", aggregators=[ScaffoldControl()], client=[ScaffoldClient()]) \
        if composed else SCAFFOLD(lr=0.8)
    saver = ModelCheckpoint(dirpath=str(tmp_path / folder), save_last=True, every_n_epochs=1)
    FederatedTrainer(max_epochs=epochs, callbacks=[server, saver, *callbacks], allow_resume_changes=["partitioner"],
                     **(quiet_trainer_kwargs(tmp_path / folder) | {"enable_checkpointing": True})).fit(
        LinearRegression(lr=0.05), datamodule=dm, ckpt_path=ckpt)


@pytest.mark.parametrize("composed", [True, False], ids=["halves", "SCAFFOLD"])
def test_43_resuming_with_another_population_is_refused_before_any_client_trains(tmp_path, composed):
    """#43 case 5: c_i kept for 4 clients, resumed (partition change allowed) with 5: refused at fit start, before
    the round's clients train (before: the composed halves raised only in the aggregation of round 1)."""
    from lightning.pytorch.callbacks import Callback

    class Count(Callback):
        batches = 0

        def on_train_batch_start(self, *args):
            Count.batches += 1

    _population_run(tmp_path, "a", 4, composed)
    with pytest.raises(ValueError, match=r"(control variates for|saved with) 4 clients.* 5"):
        _population_run(tmp_path, "b", 5, composed, ckpt=str(tmp_path / "a" / "last.ckpt"), epochs=2,
                        callbacks=[Count()])
    assert Count.batches == 0


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_with_a_frozen_encoder_c_and_the_c_i_table_cover_only_the_trained_parameters(tmp_path):
    from helpers import fit_frozen_pair, same_head

    frozen, head_only, trainer, _ = fit_frozen_pair(tmp_path, SCAFFOLD)
    assert same_head(frozen, head_only)
    server = trainer.fit_loop.server_optimizer
    fields = server.stage_state_fields(server.control_stage)
    assert [t.shape for t in fields["control"]] == [torch.Size([1, 6]), torch.Size([1])]
    assert fields["table"].dim == 7  # |F| = 6 + 1, not the model's 31
