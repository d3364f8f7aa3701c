"""FedNova (Wang et al. 2020) against a NumPy transcription of the paper: the closed forms of ‖a_i‖₁ against the
vectors a_i built from the local solvers' recurrences; normalized averaging Δ_t = τ_eff·Σ p_i Δ_i/‖a_i‖₁ with
heterogeneous local steps (SampledLocalWork), partial participation and several rounds, for local SGD, local momentum
and FedProx's proximal local SGD; under another server rule; equal to FedAvg with equal τ_i; and the combinations
that cannot match refused at fit start."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, linear_weights, mse_grad, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.algorithms import FedNovaAveraging, FedProxClient
from lightning_fed.algorithms.fednova import a_norm
from lightning_fed.callbacks import FedAvg, FedNova, ServerOptimizer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork
from lightning_fed.server.aggregators import ClientDeltas, ClipUpdates, EmptyState, RoundInfo
from lightning_fed.server.rules import Adam


class MomentumRegression(LinearRegression):
    """Local SGD with heavy-ball momentum ρ and weight decay λ (torch.optim.SGD)."""

    def __init__(self, lr=0.05, momentum=0.9, weight_decay=0.0, **sgd):
        super().__init__(lr=lr)
        self.momentum, self.weight_decay, self.sgd = momentum, weight_decay, sgd

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum,
                               weight_decay=self.weight_decay, **self.sgd)


class AdamRegression(LinearRegression):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def _datamodule(seed=0, local_work=True, n=60):
    x, y = regression_data(n=n, d=3, seed=seed)
    kwargs = (dict(local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 5], seed=1)) if local_work
              else dict(batch_size=5, local_epochs=1))
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, **kwargs)
    dm.setup()
    return x, y, dm


# ------------------------------------------------------------------------------------- the vectors a_i (Sec. 4.1)
def _impulse_response(step, tau, gamma, rho=0.0, mu=0.0):
    """a_i built explicitly: run the scalar local solver for τ steps with gradient 1 at step j only (and the proximal
    pull of the iterate), so that Δ = −γ·a_j; the gradients enter linearly, hence Δ = −γ Σ_j a_j g_j."""
    a = []
    for j in range(tau):
        y, v = 0.0, 0.0
        for k in range(tau):
            g = (1.0 if k == j else 0.0) + mu * y  # FedProxClient: ∇F + μ(x − x_t)
            v = g if k == 0 else rho * v + g       # torch SGD: buffer starts at the first gradient
            y = y - gamma * (v if rho else g)
        a.append(-y / gamma)
    return np.array(a)


@pytest.mark.parametrize("tau", [1, 2, 5, 17])
def test_a_norm_closed_forms_equal_the_explicit_vectors(tau):
    assert a_norm("sgd", tau) == tau == np.abs(_impulse_response(0, tau, 0.1)).sum()
    for rho in (0.1, 0.5, 0.9, 0.99):
        a = _impulse_response(0, tau, 0.1, rho=rho)
        paper = (1 - rho ** np.arange(tau, 0, -1)) / (1 - rho)  # [1−ρ^τ, …, 1−ρ]/(1−ρ)
        np.testing.assert_allclose(a, paper, rtol=1e-12)
        np.testing.assert_allclose(a_norm("momentum", tau, momentum=rho), np.abs(a).sum(), rtol=1e-12)
    for gamma, mu in ((0.1, 1e-5), (0.1, 0.1), (0.05, 6.0), (0.5, 1.8)):
        alpha = gamma * mu
        a = _impulse_response(0, tau, gamma, mu=mu)
        paper = (1 - alpha) ** np.arange(tau - 1, -1, -1)  # [(1−α)^{τ−1}, …, 1−α, 1]
        np.testing.assert_allclose(a, paper, rtol=1e-9)
        np.testing.assert_allclose(a_norm("proximal", tau, alpha=alpha), np.abs(a).sum(), rtol=1e-12)
    assert a_norm("momentum", tau, momentum=0.0) == a_norm("proximal", tau, alpha=0.0) == tau


def test_a_norm_refuses_what_has_no_non_negative_a():
    with pytest.raises(ValueError, match=r"α = γ·μ in \[0, 1\)"):
        a_norm("proximal", 3, alpha=1.0)
    with pytest.raises(ValueError, match=r"momentum ρ must be in \[0, 1\)"):
        a_norm("momentum", 3, momentum=1.0)
    with pytest.raises(ValueError, match="`local_solver` must be one of"):
        a_norm("adam", 3)


# ------------------------------------------------------------------------------------------ NumPy reference
def _fednova_reference(w0, x, y, dm, rounds, gamma, solver="sgd", rho=0.0, mu=0.0, wd=0.0, eta=1.0,
                       server_adam=None, uniform=False):
    """Wang et al. 2020: local solver (Sec. 4.1), then x ← x + η·τ_eff·Σ p_i Δ_i/‖a_i‖₁ (Sec. 5), p_i ∝ n_i in the
    cohort; with ``server_adam=(β1, β2, τ)`` Reddi et al.'s FedAdam step (Alg. 2, v₋₁ = τ²) on that Δ_t instead."""
    w = w0.copy()
    m, v = np.zeros_like(w0), None
    for t in range(rounds):
        deltas, sizes, norms = [], [], []
        for cid in dm.sample_clients(t):
            wk, buf, steps = w.copy(), None, 0
            for batch in dm.client_batches(cid, t):
                g = mse_grad(wk, x[batch], y[batch]) + mu * (wk - w) + wd * wk
                buf = g if buf is None else rho * buf + g
                wk = wk - gamma * (buf if rho else g)
                steps += 1
            if solver == "sgd":
                a = np.ones(steps)
            elif solver == "momentum":
                a = (1 - rho ** np.arange(steps, 0, -1)) / (1 - rho)
            else:
                a = (1 - gamma * mu) ** np.arange(steps - 1, -1, -1)
            deltas.append(wk - w)
            sizes.append(dm.client_num_samples(cid))
            norms.append(np.abs(a).sum())
        p = np.full(len(sizes), 1.0 / len(sizes)) if uniform else np.array(sizes, float) / sum(sizes)
        tau_eff = float((p * np.array(norms)).sum())
        delta = tau_eff * sum(pi * d / n for pi, d, n in zip(p, deltas, norms))
        if server_adam is None:
            w = w + eta * delta
        else:
            b1, b2, tau = server_adam
            v = np.full_like(w0, tau**2) if v is None else v
            m = b1 * m + (1 - b1) * delta
            v = b2 * v + (1 - b2) * delta**2
            w = w + eta * m / (np.sqrt(v) + tau)
    return w


def _fit(server, model, dm, tmp_path, rounds):
    FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    return linear_weights(model)


def test_fednova_local_sgd_equals_numpy(tmp_path):
    x, y, dm = _datamodule()
    steps = {len(dm.client_batches(c, t)) for t in range(4) for c in dm.sample_clients(t)}
    assert len(steps) > 2  # heterogeneous τ_i
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    got = _fit(FedNova(lr=0.8), model, dm, tmp_path, rounds=4)
    expected = _fednova_reference(w0, x, y, dm, rounds=4, gamma=0.05, eta=0.8)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    # and it is not FedAvg: the normalisation moved the result
    _, _, dm2 = _datamodule()
    torch.manual_seed(0)
    plain = _fit(FedAvg(lr=0.8), LinearRegression(lr=0.05), dm2, tmp_path, rounds=4)
    assert np.abs(plain - got).max() > 1e-4


def test_fednova_uniform_weights_equal_numpy(tmp_path):
    x, y, dm = _datamodule(seed=1, n=64)  # clients of 10 and 11 samples
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    got = _fit(FedNova(weighting="uniform"), model, dm, tmp_path, rounds=3)
    expected = _fednova_reference(w0, x, y, dm, rounds=3, gamma=0.05, uniform=True)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    assert np.abs(expected - _fednova_reference(w0, x, y, dm, rounds=3, gamma=0.05)).max() > 1e-6


def test_fednova_local_momentum_with_weight_decay_equals_numpy(tmp_path):
    x, y, dm = _datamodule()
    model = MomentumRegression(lr=0.02, momentum=0.9, weight_decay=0.01)
    w0 = linear_weights(model)
    got = _fit(FedNova(local_solver="momentum", momentum=0.9), model, dm, tmp_path, rounds=4)
    expected = _fednova_reference(w0, x, y, dm, rounds=4, gamma=0.02, solver="momentum", rho=0.9, wd=0.01)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_fednova_proximal_equals_numpy(tmp_path):
    x, y, dm = _datamodule()
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    got = _fit(FedNova(local_solver="proximal", mu=2.0, weighting="num_samples"), model, dm, tmp_path, rounds=4)
    expected = _fednova_reference(w0, x, y, dm, rounds=4, gamma=0.05, solver="proximal", mu=2.0)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    # the authors' τ_eff = Σ p_i τ_i (not followed) would give another model
    sgd_norms = _fednova_reference(w0, x, y, dm, rounds=4, gamma=0.05, solver="sgd", mu=2.0)
    assert np.abs(sgd_norms - expected).max() > 1e-6


def test_fednova_averaging_under_fedadam_equals_numpy(tmp_path):
    """FedNova's reducer under another server rule, with FedProx's client half given as `client`."""
    x, y, dm = _datamodule()
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    server = ServerOptimizer(rule=Adam(lr=0.03), aggregators=[FedNovaAveraging(local_solver="proximal", mu=0.5)],
                             client=[FedProxClient(mu=0.5)])
    got = _fit(server, model, dm, tmp_path, rounds=4)
    expected = _fednova_reference(w0, x, y, dm, rounds=4, gamma=0.05, solver="proximal", mu=0.5, eta=0.03,
                                  server_adam=(0.9, 0.99, 1e-3))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_equal_local_steps_and_plain_sgd_give_fedavg_bit_for_bit(tmp_path):
    runs = []
    for server in (FedNova(lr=0.7), FedAvg(lr=0.7)):
        _, _, dm = _datamodule(local_work=False)  # 10 samples per client, batch 5: τ_i = 2 for every client
        torch.manual_seed(0)
        runs.append(_fit(server, LinearRegression(lr=0.05), dm, tmp_path, rounds=3))
    assert np.array_equal(runs[0], runs[1])


# ------------------------------------------------------------------------------------------- the reducer by hand
def _updates(steps, samples, deltas, lr=0.1):
    return [ClientUpdate(i, [torch.tensor(d, dtype=torch.float64)], num_samples=n, num_steps=s, loss=0.0, client_lr=lr)
            for i, (s, n, d) in enumerate(zip(steps, samples, deltas))]


def test_zero_step_clients_get_weight_zero_and_an_empty_round_gives_zero():
    updates = _updates([2, 0, 4], [1, 5, 3], [[1.0], [0.0], [2.0]])
    x = ClientDeltas([0, 1, 2], [u.delta for u in updates], torch.tensor([1.0, 5.0, 3.0], dtype=torch.float64), updates)
    delta, _ = FedNovaAveraging().apply(x, EmptyState(), RoundInfo(0, 0, 3, 3))
    p = np.array([0.25, 0.75])  # client 1 took no step: p over the other two
    tau_eff = 0.25 * 2 + 0.75 * 4
    np.testing.assert_allclose(delta[0].numpy(), tau_eff * (p[0] * 1.0 / 2 + p[1] * 2.0 / 4), rtol=1e-15)
    idle = _updates([0, 0], [1, 1], [[0.0], [0.0]])
    x = ClientDeltas([0, 1], [u.delta for u in idle], torch.ones(2, dtype=torch.float64), idle)
    assert FedNovaAveraging().apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))[0][0].tolist() == [0.0]


def test_fednova_averaging_after_a_client_transform():
    """A client transform (clipping) before the reducer: Δ_i clipped, then normalised."""
    from lightning_fed.server.aggregators import run_chain

    updates = _updates([1, 4], [1, 1], [[3.0, 4.0], [0.3, 0.4]])
    x = ClientDeltas([0, 1], [u.delta for u in updates], torch.ones(2, dtype=torch.float64), updates)
    chain = [ClipUpdates(clip_norm=1.0), FedNovaAveraging()]
    delta, _ = run_chain(chain, x, (EmptyState(), EmptyState()), RoundInfo(0, 0, 2, 2))
    clipped = np.array([0.6, 0.8])
    tau_eff = 0.5 * 1 + 0.5 * 4
    np.testing.assert_allclose(delta[0].numpy(), tau_eff * (0.5 * clipped / 1 + 0.5 * np.array([0.3, 0.4]) / 4))


def test_proximal_needs_one_client_learning_rate_and_alpha_below_one():
    stage = FedNovaAveraging(local_solver="proximal", mu=0.5)
    updates = _updates([2], [1], [[1.0]], lr=0.1)
    updates[0].client_lrs = [0.1, 0.2]
    with pytest.raises(ValueError, match=r"one finite γ > 0 for all parameters"):
        stage.client_a_norm(updates[0])
    with pytest.raises(ValueError, match=r"α = γ·μ in \[0, 1\)"):
        stage.client_a_norm(_updates([2], [1], [[1.0]], lr=2.0)[0])
    assert stage.client_a_norm(_updates([2], [1], [[1.0]], lr=0.2)[0]) == pytest.approx(1 + 0.9, rel=1e-15)


@pytest.mark.parametrize("kwargs, message", [
    (dict(local_solver="adam"), r"`local_solver` must be one of \('sgd', 'momentum', 'proximal'\)"),
    (dict(local_solver="momentum", momentum=1.0), r"`momentum` must be a number in \[0, 1\)"),
    (dict(local_solver="sgd", momentum=0.9), r"local_solver='sgd'; use local_solver='momentum', momentum=0.9\."),
    (dict(local_solver="proximal", mu=0.1, momentum=0.9), r"momentum and proximal together have no closed-form"),
    (dict(local_solver="momentum", momentum=0.9, mu=0.1), r"local_solver='momentum'; use local_solver='proximal', mu=0.1\."),
    (dict(local_solver="proximal", mu=-1.0), r"`mu` must be a finite number >= 0"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedNovaAveraging(**kwargs)
    with pytest.raises(ValueError, match=message):
        FedNova(**kwargs)


# ------------------------------------------------------------------------------------------ fit-start refusals
@pytest.mark.parametrize("server, model, message", [
    (lambda: FedNova(), lambda: MomentumRegression(momentum=0.9),
     r"client optimizer SGD has momentum=0.9 .* local_solver='sgd' .* use local_solver='momentum', momentum=0.9"),
    (lambda: FedNova(local_solver="momentum", momentum=0.9), lambda: MomentumRegression(momentum=0.5),
     r"momentum=0.5 .*local_solver='momentum' steps with momentum ρ=0.9"),
    (lambda: FedNova(local_solver="momentum", momentum=0.9), lambda: MomentumRegression(momentum=0.9, nesterov=True),
     r"nesterov=True"),
    (lambda: FedNova(), lambda: AdamRegression(lr=0.05), r"client optimizer is Adam"),
    (lambda: FedNova(client=[FedProxClient(mu=0.01)]), lambda: LinearRegression(lr=0.05),
     r"FedProxClient\(mu=0.01\) runs on the clients, but FedNovaAveraging\(local_solver='sgd'.*use "
     r"local_solver='proximal', mu=0.01"),
    (lambda: FedNova(local_solver="proximal", mu=0.1, client=[FedProxClient(mu=0.1)]), lambda: LinearRegression(lr=0.05),
     r"exactly one FedProxClient\(mu=0.1\); the server optimizer's client algorithms have FedProxClient\(mu=0.1\), "
     r"FedProxClient\(mu=0.1\)"),
    (lambda: ServerOptimizer(aggregators=[FedNovaAveraging(local_solver="proximal", mu=0.1)],
                             client=[FedProxClient(mu=0.01)]), lambda: LinearRegression(lr=0.05),
     r"mu=0.1, so the clients must run exactly one FedProxClient\(mu=0.1\); .* have FedProxClient\(mu=0.01\)"),
    (lambda: ServerOptimizer(aggregators=[FedNovaAveraging(local_solver="proximal", mu=0.1)]),
     lambda: LinearRegression(lr=0.05), r"exactly one FedProxClient\(mu=0.1\); .* have none"),
    (lambda: FedNova(local_solver="proximal", mu=30.0), lambda: LinearRegression(lr=0.05),
     r"needs α = γ·μ < 1, but the client learning rate γ=0.05 gives α = 1.5"),
])
def test_mismatched_local_solver_refused_at_fit_start(tmp_path, server, model, message):
    _, _, dm = _datamodule()
    model = model()
    w0 = linear_weights(model)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=message):
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 0 and np.array_equal(linear_weights(model), w0)


class RaisedLR(LinearRegression):
    """γ = 0.05 in round 0, then 10× (an LR scheduler by round): with μ = 4, α = 0.2 then 2."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=10.0),
                                                   "interval": "epoch"}}


def test_proximal_alpha_is_checked_with_each_rounds_client_learning_rate_before_it_trains(tmp_path):
    """#43.3: a scheduler raising γ is refused at the start of the round it would break, not at its aggregation."""
    _, _, dm = _datamodule()
    model = RaisedLR(lr=0.05)
    seen = []

    class Rounds(L.Callback):
        def on_client_start(self, trainer, pl_module, client_id, round_idx):
            seen.append(round_idx)

    trainer = FederatedTrainer(max_epochs=3, callbacks=[FedNova(local_solver="proximal", mu=4.0), Rounds()],
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"needs α = γ·μ < 1, but in round 1 the client learning rate γ=0.5 gives "
                                         r"α = 2.0 \(set by the LR scheduler\)"):
        trainer.fit(model, datamodule=dm)
    assert set(seen) == {0}  # round 1's clients never trained
