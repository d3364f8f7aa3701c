"""Server stepsizes on the normalised direction (Malinovsky, Mishchenko, Richtárik, "Nastya", Alg. 1) against
NumPy transcriptions: Nastya, FedAvg as Nastya with η = γ·n, Malitsky & Mishchenko's adaptive stepsize, FedAdam on
the normalised direction; checkpoints; guards; bad arguments."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset

from helpers import CHECKPOINT_DIR_REUSED, CLI_ARGS_UNDER_PYTEST, LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.callbacks.server_step_size import (
    AdaptiveServerStepSize,
    NormalizedFedAdagrad,
    NormalizedFedAdam,
    NormalizedFedAvgM,
    NormalizedFedYogi,
    ServerStepSize,
)
from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules import ClientWork, FederatedDataModule, FixedLocalSteps, IIDPartitioner, LocalWork

GAMMA = 0.05  # client stepsize γ
STEPS = {0: 1, 1: 2, 2: 3, 3: 5}  # heterogeneous local step counts n_m


class StepsByClient(LocalWork):
    """Client ``cid`` takes ``STEPS[cid]`` full-batch gradient steps every round."""

    def plan(self, cid, round_idx, num_samples):
        return ClientWork(epochs=1, batch_size=10**6, steps=STEPS[cid])


# ---------------------------------------------------------------------- NumPy side
def _weights_of(model: LinearRegression) -> np.ndarray:
    return np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])


def _mse_grad(w, x, y):
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ (xb @ w - y)


def _client_direction(w, x, y, gamma, n):
    """Nastya Alg. 1, l. 5-8 with full-batch local steps: g = (x_t − x_{t,m}^n)/(γ n)."""
    wi = w.copy()
    for _ in range(n):
        wi = wi - gamma * _mse_grad(wi, x, y)
    return (w - wi) / (gamma * n)


def _round_direction(w, x, y, parts, cohort, steps, gamma, weighting="uniform"):
    """Nastya Alg. 1, l. 9: g_t = (1/C) Σ_{m∈S_t} g_{t,m} (or weighted by |D_m|)."""
    gs = np.array([_client_direction(w, x[parts[m]], y[parts[m]], gamma, steps[m]) for m in cohort])
    lam = np.ones(len(cohort)) if weighting == "uniform" else np.array([len(parts[m]) for m in cohort], float)
    return (lam[:, None] * gs).sum(0) / lam.sum()


def _setup(num_clients=4, clients_per_round=4, local_work=None, n=31, seed=3):
    x, y = regression_data(n=n, seed=seed)
    dm = FederatedDataModule(
        TensorDataset(torch.tensor(x), torch.tensor(y)),
        partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
        clients_per_round=clients_per_round,
        local_work=local_work if local_work is not None else StepsByClient(),
    )
    dm.setup()
    parts = [dm.client_indices(c) for c in range(num_clients)]
    return x, y, dm, parts


def _fit(tmp_path, server, dm, rounds, **extra):
    torch.manual_seed(0)
    model = LinearRegression(lr=GAMMA)
    w0 = _weights_of(model)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], **(quiet_trainer_kwargs(tmp_path) | extra))
    trainer.fit(model, datamodule=dm)
    return w0, _weights_of(model), trainer


# ---------------------------------------------------------------------- Nastya (Alg. 1)
@pytest.mark.parametrize("weighting", ["uniform", "num_samples"])
def test_nastya_matches_numpy_alg1_partial_participation_heterogeneous_steps(tmp_path, weighting):
    x, y, dm, parts = _setup(clients_per_round=2)
    eta = 0.3
    w, got, _ = _fit(tmp_path, ServerStepSize(lr=eta, weighting=weighting), dm, rounds=3)
    cohorts = [dm.sample_clients(t) for t in range(3)]
    assert len({tuple(sorted(c)) for c in cohorts}) > 1, "the test should see different cohorts"
    for cohort in cohorts:
        w = w - eta * _round_direction(w, x, y, parts, cohort, STEPS, GAMMA, weighting)  # Alg. 1, l. 10
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)


def test_default_weighting_is_uniform_over_the_cohort():
    for cls in (ServerStepSize, NormalizedFedAvgM):
        assert cls(lr=1.0).weighting == "uniform"
    for cls in (AdaptiveServerStepSize, NormalizedFedAdam, NormalizedFedYogi, NormalizedFedAdagrad):
        assert cls().weighting == "uniform"


@pytest.mark.parametrize("weighting", ["uniform", "num_samples"])
def test_nastya_with_eta_gamma_n_is_fedavg(tmp_path, weighting):
    """All clients take n local steps: η = γ·n gives FedAvg (same weighting), end to end."""
    n = 3
    x, y, dm, parts = _setup(local_work=FixedLocalSteps(steps=n, batch_size=10**6))
    w0, nastya, _ = _fit(tmp_path / "a", ServerStepSize(lr=GAMMA * n, weighting=weighting), dm, rounds=3)
    _, fedavg, _ = _fit(tmp_path / "b", FedAvg(lr=1.0, weighting=weighting), dm, rounds=3)
    np.testing.assert_allclose(nastya, fedavg, rtol=0, atol=1e-12)
    # and both are x_{t+1} = x_t + Σ λ_m Δ_m in NumPy
    lam = np.ones(4) if weighting == "uniform" else np.array([len(p) for p in parts], float)
    assert len(set(lam)) > 1 or weighting == "uniform"
    w = w0
    for _ in range(3):
        deltas = np.array([-GAMMA * n * _client_direction(w, x[p], y[p], GAMMA, n) for p in parts])
        w = w + (lam[:, None] * deltas).sum(0) / lam.sum()
    np.testing.assert_allclose(nastya, w, rtol=0, atol=1e-6)
    assert not np.allclose(w, w0)


def test_normalised_aggregate_and_zero_step_clients_get_no_weight():
    rng = np.random.default_rng(0)
    deltas = [[rng.normal(size=(2, 3)), rng.normal(size=3)] for _ in range(3)]
    lrs, steps, sizes = [0.1, 0.5, 0.2], [4, 2, 0], [10, 30, 5]
    updates = [
        ClientUpdate(client_id=i, delta=[torch.tensor(d) for d in deltas[i]], num_samples=sizes[i],
                     num_steps=steps[i], loss=0.0, client_lr=lrs[i])
        for i in range(3)
    ]
    for weighting, lam in (("uniform", np.array([1.0, 1.0, 0.0])), ("num_samples", np.array([10.0, 30.0, 0.0]))):
        server = ServerStepSize(lr=1.0, weighting=weighting)
        np.testing.assert_allclose(server.client_weights(updates).numpy(), lam / lam.sum(), atol=1e-15)
        got = server.aggregate(updates)
        for k in range(2):
            want = sum(lam[i] * deltas[i][k] / (lrs[i] * steps[i]) for i in range(2)) / lam.sum()
            np.testing.assert_allclose(got[k].numpy(), want, rtol=0, atol=1e-12)
            assert np.isfinite(got[k].numpy()).all()


def test_no_client_took_a_step_is_an_error():
    update = ClientUpdate(client_id=0, delta=[torch.zeros(2)], num_samples=3, num_steps=0, loss=math.nan,
                          client_lr=0.1)
    with pytest.raises(ValueError, match="No client in the round took a local step"):
        ServerStepSize(lr=1.0).server_update([torch.zeros(2)], [update])


@pytest.mark.parametrize("client_lr", [math.nan, 0.0, -0.1, math.inf])
def test_missing_or_bad_client_lr_is_an_error(client_lr):
    update = ClientUpdate(client_id=7, delta=[torch.ones(2)], num_samples=3, num_steps=2, loss=0.0,
                          client_lr=client_lr)
    with pytest.raises(ValueError, match=r"`ClientUpdate.client_lr` of client 7 must be a finite number > 0"):
        ServerStepSize(lr=1.0).server_update([torch.zeros(2)], [update])


# ---------------------------------------------------------------------- adaptive server stepsize
def _adgd_reference(w, direction, eta0, rounds):
    """Malitsky & Mishchenko 2020, Alg. 1, on Nastya's direction g(x) (guards as documented in the class)."""
    x_prev = g_prev = None
    eta_prev, theta = None, np.inf
    branches, etas = [], []
    for t in range(rounds):
        g = direction(t, w)
        if t == 0:
            eta, theta_new = eta0, np.inf
        else:
            first = np.sqrt(1 + theta) * eta_prev
            dx, dg = np.linalg.norm(w - x_prev), np.linalg.norm(g - g_prev)
            second = dx / (2 * dg) if dx > 0 and dg > 0 else np.inf
            eta = min(first, second)
            branches.append("first" if first <= second else "second")
            if np.isinf(eta):
                eta = eta_prev
            theta_new = eta / eta_prev
        x_prev, g_prev = w, g
        w = w - eta * g
        eta_prev, theta = eta, theta_new
        etas.append(eta)
    return w, etas, theta, branches


def test_adaptive_server_step_size_matches_numpy_adgd(tmp_path):
    x, y, dm, parts = _setup()
    rounds, eta0 = 7, 0.3
    logger = CSVLogger(str(tmp_path), name="run")
    w0, got, trainer = _fit(tmp_path, AdaptiveServerStepSize(lr=eta0), dm, rounds=rounds, logger=logger)
    want, etas, theta, branches = _adgd_reference(
        w0, lambda t, w: _round_direction(w, x, y, parts, range(4), STEPS, GAMMA), eta0, rounds
    )
    assert {"first", "second"} <= set(branches), "both branches of the min should be exercised"
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    server = trainer.server_optimizer
    assert server.eta == pytest.approx(etas[-1], rel=1e-12)
    assert server.theta == pytest.approx(theta, rel=1e-9)
    rows = list(csv.DictReader(open(f"{logger.log_dir}/metrics.csv")))
    logged = {int(r["step"]): float(r["server_lr"]) for r in rows if r.get("server_lr")}
    assert sorted(logged) == list(range(rounds)), "server_lr is logged once per round, step = round"
    np.testing.assert_allclose([logged[t] for t in range(rounds)], etas, rtol=1e-6)  # logged as float32


def test_adaptive_with_partial_participation_matches_numpy(tmp_path):
    x, y, dm, parts = _setup(clients_per_round=3)
    rounds, eta0 = 4, 1e-6
    w0, got, _ = _fit(tmp_path, AdaptiveServerStepSize(lr=eta0), dm, rounds=rounds)
    want, *_ = _adgd_reference(
        w0, lambda t, w: _round_direction(w, x, y, parts, dm.sample_clients(t), STEPS, GAMMA), eta0, rounds
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _synthetic_rounds(num_rounds, seed=0, repeat=False, zero_first=False):
    rng = np.random.default_rng(seed)
    out = []
    for r in range(num_rounds):
        clients = []
        for i in range(2):
            delta = [rng.normal(scale=0.1, size=(2, 2)), rng.normal(scale=0.1, size=2)]
            clients.append((delta, 0.1 * (i + 1), i + 2))
        out.append(clients)
    if repeat:
        out = [out[0]] * num_rounds
    if zero_first:
        out[0] = [([np.zeros((2, 2)), np.zeros(2)], lr, n) for _, lr, n in out[0]]
    return out


def _server_round(server, params, clients):
    updates = [
        ClientUpdate(client_id=i, delta=[torch.tensor(d) for d in delta], num_samples=5, num_steps=n, loss=0.0,
                     client_lr=lr)
        for i, (delta, lr, n) in enumerate(clients)
    ]
    server.server_update(params, updates)


def test_adaptive_zero_direction_change_keeps_the_first_branch():
    """Identical directions in every round: ‖g_t − g_{t−1}‖ = 0, so η_1 = η_0 (θ_0 = +∞), then η_t = √(1+θ)η."""
    server = AdaptiveServerStepSize(lr=0.5)
    params = [torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    etas = []
    for clients in _synthetic_rounds(4, repeat=True):
        _server_round(server, params, clients)
        etas.append(server.eta)
    want = [0.5, 0.5, math.sqrt(2) * 0.5]
    want.append(math.sqrt(1 + want[2] / want[1]) * want[2])
    np.testing.assert_allclose(etas, want, rtol=1e-12)
    assert all(torch.isfinite(p).all() for p in params)


def test_adaptive_zero_model_change_keeps_the_first_branch():
    """g_0 = 0 leaves x_1 = x_0: the secant ratio is 0/‖g_1‖ and carries no information, η_1 = η_0."""
    server = AdaptiveServerStepSize(lr=0.5)
    params = [torch.ones(2, 2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)]
    for clients in _synthetic_rounds(2, zero_first=True):
        _server_round(server, params, clients)
    assert server.eta == 0.5 and server.theta == 1.0


def test_adaptive_state_dict_resumes_exactly():
    rounds = _synthetic_rounds(6, seed=4)
    make = lambda: [torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]  # noqa: E731
    full, params_full = AdaptiveServerStepSize(lr=0.3), make()
    for clients in rounds:
        _server_round(full, params_full, clients)
    first, params = AdaptiveServerStepSize(lr=0.3), make()
    for clients in rounds[:3]:
        _server_round(first, params, clients)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = AdaptiveServerStepSize(lr=0.3)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    assert set(resumed.state) == {"prev_params", "prev_direction"}
    for clients in rounds[3:]:
        _server_round(resumed, params, clients)
    for a, b in zip(params, params_full):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (resumed.eta, resumed.theta, resumed.num_steps) == (full.eta, full.theta, 6)


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_adaptive_checkpoint_resume_through_the_trainer(tmp_path):
    def run(root, rounds, ckpt_path=None):
        x, y, dm, _ = _setup()
        checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=-1, every_n_epochs=1)
        torch.manual_seed(0)
        model = LinearRegression(lr=GAMMA)
        trainer = FederatedTrainer(
            max_epochs=rounds, callbacks=[AdaptiveServerStepSize(lr=0.02), checkpoint],
            **(quiet_trainer_kwargs(root) | {"enable_checkpointing": True}),
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return _weights_of(model), trainer.server_optimizer

    full, full_server = run(tmp_path / "a", 5)
    run(tmp_path / "b", 2)
    resumed, server = run(tmp_path / "b", 5, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    np.testing.assert_array_equal(resumed, full)
    assert (server.eta, server.theta, server.num_steps) == (full_server.eta, full_server.theta, 5)


# ---------------------------------------------------------------------- FedOpt on the normalised direction
def test_fedadam_on_the_normalised_direction_matches_numpy(tmp_path):
    x, y, dm, parts = _setup()
    lr, tau, rounds = 0.05, 1e-2, 3
    w, got, _ = _fit(tmp_path, NormalizedFedAdam(lr=lr, tau=tau), dm, rounds=rounds)
    m, v = np.zeros_like(w), np.full_like(w, tau**2)
    for _ in range(rounds):
        delta = -_round_direction(w, x, y, parts, range(4), STEPS, GAMMA)  # Δ_t := −g_t (uniform mean)
        m = 0.9 * m + 0.1 * delta  # Reddi et al. 2021, Alg. 2, l. 11, 14, 15
        v = 0.99 * v + 0.01 * delta**2
        w = w + lr * m / (np.sqrt(v) + tau)
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)


def test_fedavgm_on_the_normalised_direction_and_a_user_composition():
    """NormalizedFedAvgM is heavy ball on g_t; a user's composition FedAvg + [NormalizedDirections, WeightedMean] is
    ServerStepSize."""
    rounds = _synthetic_rounds(3, seed=2)
    p_m = [torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    server = NormalizedFedAvgM(lr=0.2, momentum=0.5)
    buf = [np.zeros((2, 2)), np.zeros(2)]
    want = [np.zeros((2, 2)), np.zeros(2)]
    for clients in rounds:
        _server_round(server, p_m, clients)
        for k in range(2):
            g = -sum(delta[k] / (lr * n) for delta, lr, n in clients) / len(clients)
            buf[k] = 0.5 * buf[k] + g
            want[k] = want[k] - 0.2 * buf[k]
    for a, b in zip(p_m, want):
        np.testing.assert_allclose(a.numpy(), b, rtol=0, atol=1e-12)

    p_a = [torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    p_b = [torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    from lightning_fed.server.aggregators import NormalizedDirections, WeightedMean

    composed = FedAvg(lr=0.2, weighting="uniform", aggregators=[NormalizedDirections(), WeightedMean()])
    nastya = ServerStepSize(lr=0.2)
    for clients in rounds:
        _server_round(composed, p_a, clients)
        _server_round(nastya, p_b, clients)
    for a, b in zip(p_a, p_b):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)
def test_cli_yaml_instantiates_the_classes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    for class_name, init_args, expected in (
        ("NormalizedFedAdam", "{lr: 0.01, beta2: 0.999}", {"lr": 0.01, "beta2": 0.999, "weighting": "uniform"}),
        ("AdaptiveServerStepSize", "{lr: 0.001}", {"lr": 0.001, "weighting": "uniform"}),
        ("ServerStepSize", "{lr: 2.5, weighting: num_samples}", {"lr": 2.5, "weighting": "num_samples"}),
    ):
        config.write_text(
            "trainer:\n  max_epochs: 2\n  callbacks:\n"
            f"    - class_path: lightning_fed.callbacks.server_step_size.{class_name}\n      init_args: {init_args}\n"
            "model:\n  class_path: helpers.LinearRegression\n"
            "data:\n  class_path: lightning_fed.datamodules.FederatedDataModule\n"
            "  init_args: {data_order: once, clients_per_round: 2}\n"
        )
        cli = FederatedCLI(args=["--config", str(config)], run=False)
        server = cli.trainer.server_optimizer
        assert type(server).__name__ == class_name
        assert {k: getattr(server, k) for k in expected} == expected
        assert cli.datamodule.data_order == "once"


# ---------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("lr", [0, -1.0, math.nan, math.inf, "0.1", True])
@pytest.mark.parametrize(
    "make",
    [
        lambda lr: ServerStepSize(lr=lr),
        lambda lr: AdaptiveServerStepSize(lr=lr),
        lambda lr: NormalizedFedAvgM(lr=lr),
        lambda lr: NormalizedFedAdam(lr=lr),
        lambda lr: NormalizedFedYogi(lr=lr),
        lambda lr: NormalizedFedAdagrad(lr=lr),
    ],
)
def test_bad_lr(make, lr):
    with pytest.raises(ValueError, match=r"`lr` must be a finite number > 0, got"):
        make(lr)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: ServerStepSize(lr=1.0, weighting="by_steps"), r"`weighting` must be one of .*'by_steps'"),
        (lambda: AdaptiveServerStepSize(weighting="mean"), r"`weighting` must be one of .*'mean'"),
        (lambda: NormalizedFedAvgM(lr=1.0, momentum=1.0), r"`momentum` must be a number in \[0, 1\), got 1.0"),
        (lambda: NormalizedFedAdam(beta1=-0.1), r"`beta1` must be a number in \[0, 1\)"),
        (lambda: NormalizedFedYogi(tau=0.0), r"`tau` must be a finite number > 0"),
        (lambda: NormalizedFedAdagrad(initial_accumulator=-1.0), r"`initial_accumulator` must be a finite number"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_normalized_fedadam_and_fedyogi_share_one_definition():
    import inspect

    from lightning_fed.callbacks import FedAdam, FedYogi, NormalizedFedAdam, NormalizedFedYogi

    assert NormalizedFedAdam.__init__ is NormalizedFedYogi.__init__
    names = list(inspect.signature(NormalizedFedAdam.__init__).parameters)[1:]
    assert names == ["lr", "beta1", "beta2", "tau", "initial_accumulator", "bias_correction", "weighting", "convention"]
    for cls, base in ((NormalizedFedAdam, FedAdam), (NormalizedFedYogi, FedYogi)):
        server = cls(lr=0.1, tau=0.01)  # the base's rule, the defaults' uniform weighting, the normalised chain
        assert isinstance(server, base) and server.server_rule.update_second_moment.__self__.__class__ is type(base().server_rule)
        assert (server.lr, server.tau, server.weighting) == (0.1, 0.01, "uniform")
        assert [type(s).__name__ for s in server.aggregators] == ["NormalizedDirections", "WeightedMean"]
