"""FedMGDA+ (Hu et al., IEEE TNSE 2022, Alg. 1) against NumPy written from the paper: d_i = Δ_i/‖Δ_i‖, λ* the min-norm
weights over {λ ≥ 0, Σλ = 1, ‖λ − λ₀‖_∞ ≤ ε}, x ← x + η·Σλ*_i d_i — with mini-batches, heterogeneous local steps,
partial participation and several rounds. The λ-step is checked by independent methods: brute force over the
active sets (KKT, every coordinate at its lower bound, upper bound or free) and a fine grid for K = 3."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, linear_weights, mse_grad, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedMGDAMinNorm, FedProxClient, min_norm_box
from lightning_fed.algorithms.fedmgda import box_duality_gap
from lightning_fed.callbacks import FedAvg, FedMGDAPlus, ServerOptimizer
from lightning_fed.server.min_norm import MinNormConvergenceWarning, min_norm_active_set
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, LinearPartitioner, SampledLocalWork
from lightning_fed.server.aggregators import ClientDeltas, ClipUpdates, EmptyState, RoundInfo
from lightning_fed.server.rules import Momentum


# ------------------------------------------------------------------------------------------ independent λ-steps
def brute_force_box(g: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """argmin λᵀGλ over {Σλ = 1, lower ≤ λ ≤ upper} by enumerating the 3^K active sets: the fixed coordinates at a
    bound, the free ones from the equality-constrained KKT system 2·G_FF·λ_F + 2·G_FX·λ_X = ν·1, Σλ_F = 1 − Σλ_X;
    the best feasible candidate (the optimum's own active set is among them; unique for positive definite G)."""
    k = len(lower)
    best, best_value = None, np.inf
    for states in itertools.product("luf", repeat=k):
        lam = np.where(np.array(states) == "l", lower, upper).astype(float)
        free = [i for i, s in enumerate(states) if s == "f"]
        fixed = [i for i, s in enumerate(states) if s != "f"]
        rest = 1.0 - lam[fixed].sum()
        if free:
            m = len(free)
            kkt = np.zeros((m + 1, m + 1))
            kkt[:m, :m] = 2 * g[np.ix_(free, free)]
            kkt[:m, m] = -1.0
            kkt[m, :m] = 1.0
            rhs = np.concatenate([-2 * g[np.ix_(free, fixed)] @ lam[fixed], [rest]])
            try:
                lam[free] = np.linalg.solve(kkt, rhs)[:m]
            except np.linalg.LinAlgError:
                continue
        elif abs(rest) > 1e-12:
            continue
        if np.all(lam >= lower - 1e-12) and np.all(lam <= upper + 1e-12) and abs(lam.sum() - 1) < 1e-12:
            value = lam @ g @ lam
            if value < best_value - 1e-15:
                best, best_value = lam, value
    return best


def box(prior: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    return np.maximum(prior - eps, 0.0), np.minimum(prior + eps, 1.0)


def random_problem(rng, k: int, d: int):
    v = rng.normal(size=(k, d)) * rng.uniform(0.2, 3.0, size=(k, 1))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v @ v.T, rng.dirichlet(np.ones(k))


@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("eps", [0.02, 0.1, 0.3, 0.6])
def test_box_solver_equals_brute_force_over_active_sets(k, eps):
    rng = np.random.default_rng(100 * k + int(100 * eps))
    for _ in range(6):
        g, prior = random_problem(rng, k, d=k + 3)  # positive definite: one optimum
        lower, upper = box(prior, eps)
        expected = brute_force_box(g, lower, upper)
        result = min_norm_box(g, lower, upper)
        assert result.converged and result.gap <= 1e-9
        np.testing.assert_allclose(result.weights, expected, atol=1e-8)
        assert result.value == pytest.approx(expected @ g @ expected, abs=1e-12)
        assert np.all(result.weights >= lower - 1e-12) and np.all(result.weights <= upper + 1e-12)
        assert result.weights.sum() == pytest.approx(1.0, abs=1e-12)
        # the stage's λ-step dispatches to the same answer
        lam, _ = FedMGDAMinNorm(epsilon=eps).solve(g, prior)
        np.testing.assert_allclose(lam, expected, atol=1e-8)


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.45])
def test_box_solver_on_a_singular_gram_matrix_equals_a_fine_grid_for_three_clients(eps):
    """K = 3 updates in a plane (G singular, the optimum need not be unique): the value is the grid's minimum."""
    rng = np.random.default_rng(int(eps * 100))
    step = 1 / 600
    a, b = np.meshgrid(np.arange(0, 1 + step / 2, step), np.arange(0, 1 + step / 2, step), indexing="ij")
    grid = np.stack([a.ravel(), b.ravel(), 1 - a.ravel() - b.ravel()], axis=1)
    for _ in range(5):
        g, prior = random_problem(rng, 3, d=2)
        lower, upper = box(prior, eps)
        inside = grid[np.all((grid >= lower - 1e-12) & (grid <= upper + 1e-12), axis=1)]
        values = np.einsum("ni,ij,nj->n", inside, g, inside)
        result = min_norm_box(g, lower, upper)
        assert result.converged
        assert result.value <= values.min() + 1e-12  # no grid point is better ...
        assert result.value >= values.min() - 4 * step  # ... and the grid's best is within its resolution
        assert np.all(result.weights >= lower - 1e-12) and np.all(result.weights <= upper + 1e-12)


def test_box_solver_on_the_whole_simplex_equals_fedawares_active_set_solver():
    rng = np.random.default_rng(7)
    for k in (3, 6, 10, 25):
        for d in (2, k + 5):
            g, _ = random_problem(rng, k, d)
            box_result = min_norm_box(g, np.zeros(k), np.ones(k))
            exact = min_norm_active_set(g)
            assert box_result.converged and box_result.value == pytest.approx(exact.value, abs=2e-9)
            if d > k:  # positive definite: the same unique λ
                np.testing.assert_allclose(box_result.weights, exact.weights, atol=1e-6)


def test_duality_gap_of_the_box_is_zero_only_at_the_optimum():
    g = np.array([[1.0, 0.0], [0.0, 4.0]])
    assert box_duality_gap(g, [0.75, 0.25], [0.25, 0.25], [0.75, 0.75]) == 0.0
    # λ = (0.5, 0.5): Gλ = (0.5, 2), f = 1.25, best vertex (0.75, 0.25): 0.375 + 0.5 -> gap 0.375
    assert box_duality_gap(g, [0.5, 0.5], [0.25, 0.25], [0.75, 0.75]) == pytest.approx(0.375)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lower=[0.6, 0.6], upper=[1.0, 1.0]), "does not meet the simplex"),
    (dict(lower=[0.0, 0.0], upper=[0.4, 0.4]), "does not meet the simplex"),
    (dict(lower=[0.5, 0.0], upper=[0.4, 1.0]), "`lower` must be <= `upper`"),
    (dict(lower=[0.0], upper=[1.0]), "must have shape \\[2\\]"),
    (dict(lower=[0.0, np.nan], upper=[1.0, 1.0]), "must be finite"),
    (dict(lower=[0.0, 0.0], upper=[1.0, 1.0], tol=-1.0), "`tol` must be a finite number >= 0"),
    (dict(lower=[0.0, 0.0], upper=[1.0, 1.0], max_iter=0), "`max_iter` must be an integer >= 1"),
])
def test_box_solver_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        min_norm_box(np.eye(2), **kwargs)


def test_box_solver_warns_when_capped():
    g, prior = random_problem(np.random.default_rng(3), 8, 12)
    lower, upper = box(prior, 0.1)
    with pytest.warns(MinNormConvergenceWarning, match="max_iter"):
        result = min_norm_box(g, lower, upper, max_iter=1)
    assert not result.converged


# ------------------------------------------------------------------------------------------ the reducer stage
def _x(deltas, counts, ids=None):
    deltas = [[torch.tensor(d, dtype=torch.float64)] for d in deltas]
    return ClientDeltas(list(ids or range(len(deltas))), deltas, torch.tensor(counts, dtype=torch.float64))


def test_stage_is_invariant_to_the_scale_of_each_update_and_epsilon_zero_is_the_normalised_mean():
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(4, 6))
    info = RoundInfo(0, 0, 4, 4)
    base = FedMGDAMinNorm().apply(_x(raw, [1.0] * 4), EmptyState(), info)[0][0]
    scaled = FedMGDAMinNorm().apply(_x(raw * np.array([[10.0], [0.1], [1.0], [3.0]]), [1.0] * 4), EmptyState(), info)
    torch.testing.assert_close(scaled[0][0], base, rtol=1e-12, atol=1e-14)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    counts = np.array([1.0, 2.0, 3.0, 4.0])
    mean = FedMGDAMinNorm(epsilon=0.0).apply(_x(raw, counts), EmptyState(), info)[0][0].numpy()
    np.testing.assert_allclose(mean, counts @ unit / counts.sum(), rtol=1e-12)
    plain = FedMGDAMinNorm(epsilon=0.0, normalize=False).apply(_x(raw, counts), EmptyState(), info)[0][0].numpy()
    np.testing.assert_allclose(plain, counts @ raw / counts.sum(), rtol=1e-12)  # FedAvg


def test_stage_leaves_zero_updates_out_and_a_round_of_zeros_does_not_move():
    info = RoundInfo(0, 0, 3, 3)
    stage = FedMGDAMinNorm(epsilon=0.2)
    out, _, report = stage.apply(_x([[2.0, 0.0], [0.0, 0.0], [0.0, 1.0]], [1.0, 1.0, 1.0]), EmptyState(), info)
    out = out[0]
    # λ₀ = (½, ½) over clients 0 and 2, the box [0.3, 0.7] holds the optimum (½, ½)
    np.testing.assert_allclose(report.weights, [0.5, 0.0, 0.5], atol=1e-12)
    torch.testing.assert_close(out, torch.tensor([0.5, 0.5], dtype=torch.float64))
    zero, _, report = stage.apply(_x([[0.0, 0.0], [0.0, 0.0]], [1.0, 1.0]), EmptyState(), info)
    zero = zero[0]
    assert torch.equal(zero, torch.zeros(2, dtype=torch.float64)) and np.array_equal(report.weights, [0.0, 0.0])


def test_stage_keeps_the_parameters_dtype_and_names_a_non_finite_client():
    x = ClientDeltas([3, 8], [[torch.tensor([1.0, 0.0]), torch.tensor([[2.0]])],
                              [torch.tensor([0.0, 1.0]), torch.tensor([[0.0]])]], torch.ones(2, dtype=torch.float64))
    out, *_ = FedMGDAMinNorm().apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))
    assert [t.dtype for t in out] == [torch.float32, torch.float32] and out[1].shape == (1, 1)
    bad = ClientDeltas([3, 8], [[torch.tensor([1.0, 0.0])], [torch.tensor([float("inf"), 1.0])]],
                       torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"non-finite updates of clients \[8\]"):
        FedMGDAMinNorm().apply(bad, EmptyState(), RoundInfo(0, 0, 2, 2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=-0.1), "`epsilon` must be a finite number in \\[0, 1\\]"),
    (dict(epsilon=1.01), "`epsilon` must be a finite number in \\[0, 1\\]"),
    (dict(epsilon=float("nan")), "`epsilon`"),
    (dict(epsilon=True), "`epsilon`"),
    (dict(normalize=1), "`normalize` must be a bool"),
    (dict(tol=-1e-9), "`tol` must be a finite number >= 0"),
])
def test_stage_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedMGDAMinNorm(**kwargs)


# ------------------------------------------------------------------------------------------ FedMGDA+ end to end
def _datamodule(partitioner):
    x, y = regression_data(n=63, d=3, seed=4)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=partitioner,
                             clients_per_round=3, local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 6], seed=2))
    dm.setup()
    return x, y, dm


def _fedmgda_reference(w0, x, y, dm, rounds, gamma, eta, eps, weighting, mu=0.0, rule="sgd", beta=0.9):
    """Hu et al. 2022, Alg. 1: the cohort's local SGD (FedProx's proximal term with ``mu``), d_i = Δ_i/‖Δ_i‖,
    λ* by brute force over the box around λ₀, then the server rule on Σλ*_i d_i."""
    w, buf = w0.copy(), np.zeros_like(w0)
    for t in range(rounds):
        deltas, sizes = [], []
        for cid in dm.sample_clients(t):
            wk = w.copy()
            for batch in dm.client_batches(cid, t):
                wk = wk - gamma * (mse_grad(wk, x[batch], y[batch]) + mu * (wk - w))
            deltas.append(wk - w)
            sizes.append(dm.client_num_samples(cid))
        d = np.array(deltas) / np.linalg.norm(deltas, axis=1, keepdims=True)
        prior = np.ones(len(d)) if weighting == "uniform" else np.array(sizes, float)
        prior /= prior.sum()
        lam = brute_force_box(d @ d.T, *box(prior, eps))
        direction = lam @ d
        if rule == "sgd":
            w = w + eta * direction
        else:  # heavy ball on g = −Δ_t
            buf = beta * buf - direction
            w = w - eta * buf
    return w


@pytest.mark.parametrize("eps, weighting", [(1.0, "uniform"), (0.15, "uniform"), (0.1, "num_samples")])
def test_fedmgda_plus_equals_numpy(tmp_path, eps, weighting):
    x, y, dm = _datamodule(LinearPartitioner(num_clients=6, seed=1))  # unequal |D_i|: λ₀ depends on `weighting`
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    server = FedMGDAPlus(lr=0.3, epsilon=eps, weighting=weighting)
    FederatedTrainer(max_epochs=4, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    expected = _fedmgda_reference(w0, x, y, dm, rounds=4, gamma=0.05, eta=0.3, eps=eps, weighting=weighting)
    np.testing.assert_allclose(linear_weights(model), expected, rtol=1e-10, atol=1e-12)
    if eps < 1.0:  # the box is active: not the unconstrained min-norm step
        free = _fedmgda_reference(w0, x, y, dm, rounds=4, gamma=0.05, eta=0.3, eps=1.0, weighting=weighting)
        assert np.abs(expected - free).max() > 1e-4


def test_fedmgda_reducer_composes_with_another_rule_and_fedprox_clients(tmp_path):
    """The authors' FedMGDA+prox clients, and the reducer under heavy-ball momentum instead of SGD."""
    x, y, dm = _datamodule(IIDPartitioner(num_clients=6, seed=0))
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    server = ServerOptimizer(rule=Momentum(lr=0.2, momentum=0.9), aggregators=[FedMGDAMinNorm(epsilon=0.3)],
                             weighting="uniform", client=[FedProxClient(mu=0.4)])
    FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    expected = _fedmgda_reference(w0, x, y, dm, rounds=3, gamma=0.05, eta=0.2, eps=0.3, weighting="uniform",
                                  mu=0.4, rule="momentum")
    np.testing.assert_allclose(linear_weights(model), expected, rtol=1e-10, atol=1e-12)


def test_fedmgda_plus_with_fedprox_clients_is_the_composition_bit_for_bit(tmp_path):
    runs = []
    for server in (FedMGDAPlus(lr=0.5, epsilon=0.4, client=[FedProxClient(mu=0.2)]),
                   FedAvg(lr=0.5, weighting="uniform", aggregators=[FedMGDAMinNorm(epsilon=0.4)],
                          client=[FedProxClient(mu=0.2)])):
        _, _, dm = _datamodule(IIDPartitioner(num_clients=6, seed=0))
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
        runs.append(linear_weights(model))
    assert np.array_equal(runs[0], runs[1])


def test_a_client_transform_runs_before_the_min_norm_step(tmp_path):
    """Clipping before normalisation changes nothing (d_i is scale-free): FedMGDA+ behind ClipUpdates is FedMGDA+."""
    runs = []
    for chain in ([FedMGDAMinNorm()], [ClipUpdates(clip_norm=1e-3), FedMGDAMinNorm()]):
        _, _, dm = _datamodule(IIDPartitioner(num_clients=6, seed=0))
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        server = FedAvg(lr=0.5, weighting="uniform", aggregators=chain)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
            trainer.fit(model, datamodule=dm)
        runs.append(linear_weights(model))
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-12)
