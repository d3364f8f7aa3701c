"""FedAWARE (Zeng et al. 2024, Alg. 1) and its min-norm solver, against NumPy written from the paper."""

from __future__ import annotations

import csv
import itertools

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset

from helpers import CHECKPOINT_DIR_REUSED, LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.algorithms.fedaware import FedAWARE
from lightning_fed.server.min_norm import (
    MinNormConvergenceWarning,
    min_norm_frank_wolfe,
    min_norm_pair,
    min_norm_weights,
)
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner


# ---------------------------------------------------------------------------------------------- NumPy references
def _exact_min_norm(gram: np.ndarray) -> np.ndarray:
    """argmin_{λ ∈ simplex} λᵀGλ by enumerating supports S and solving the KKT system of the equality-constrained
    QP on S (2G_S λ_S + ν1 = 0, 1ᵀλ_S = 1); the best feasible (λ_S ≥ 0) candidate wins."""
    n = len(gram)
    best_value, best = np.inf, None
    for r in range(1, n + 1):
        for support in itertools.combinations(range(n), r):
            s = list(support)
            kkt = np.zeros((r + 1, r + 1))
            kkt[:r, :r] = 2 * gram[np.ix_(s, s)]
            kkt[:r, r] = kkt[r, :r] = 1.0
            rhs = np.zeros(r + 1)
            rhs[r] = 1.0
            try:
                sol = np.linalg.solve(kkt, rhs)[:r]
            except np.linalg.LinAlgError:
                continue
            if np.all(sol >= -1e-12):
                lam = np.zeros(n)
                lam[s] = np.clip(sol, 0, None)
                value = lam @ gram @ lam
                if value < best_value - 1e-15:
                    best_value, best = value, lam
    return best


class ReferenceFedAWARE:
    """Alg. 1, l. 8-12, plus the public code's options, with the exact min-norm weights (Eq. 8), in NumPy."""

    def __init__(self, num_clients, dim, lr, alpha, normalize=False, convention="paper", warmup=False,
                 projection=False, weighting="num_samples"):
        self.lr, self.alpha, self.normalize, self.convention = lr, alpha, normalize, convention
        self.warmup, self.projection, self.weighting = warmup, projection, weighting
        self.m = np.zeros((num_clients, dim))
        self.seen = np.zeros(num_clients, dtype=bool)
        self.sizes = np.zeros(num_clients)

    def round(self, x, clients):
        """One round from x_t with ``clients`` = [(client id, Δ_i flat, |D_i|)]; returns (x_{t+1}, (λ, diversity))."""
        a = self.alpha
        for cid, delta, n in clients:
            g = -delta  # l. 8: g_i = x_t − x_i
            self.m[cid] = a * self.m[cid] + (1 - a) * g if self.convention == "paper" else (1 - a) * self.m[cid] + a * g
            self.seen[cid] = True
            self.sizes[cid] = n
        if self.warmup and not self.seen.all():
            w = np.array([n for _, _, n in clients], float) if self.weighting == "num_samples" else np.ones(len(clients))
            w /= w.sum()
            return x + self.lr * sum(wi * delta for wi, (_, delta, _) in zip(w, clients)), None
        idx = np.flatnonzero(self.seen & (np.linalg.norm(self.m, axis=1) > 0))
        v = self.m[idx] / np.linalg.norm(self.m[idx], axis=1, keepdims=True) if self.normalize else self.m[idx]
        lam = _exact_min_norm(v @ v.T)  # l. 11
        d = lam @ v  # l. 12
        if self.projection:
            w = self.sizes[idx] if self.weighting == "num_samples" else np.ones(len(idx))
            avg = (w / w.sum()) @ self.m[idx]
            d = (avg @ d) / (d @ d) * d
        full = np.zeros(len(self.seen))
        full[idx] = lam
        diversity = np.sqrt((lam @ np.einsum("ij,ij->i", v, v)) / (lam @ v @ v.T @ lam))  # Eq. 6: the square root
        return x - self.lr * d, (full, diversity)


def _reference_fedaware(x0, rounds, num_clients, lr, alpha, **options):
    ref = ReferenceFedAWARE(num_clients, len(x0), lr, alpha, **options)
    x, history = x0.copy(), []
    for clients in rounds:
        x, info = ref.round(x, clients)
        history.append(info)
    return x, history


# ---------------------------------------------------------------------------------------------- the solver
def test_two_vectors_match_the_closed_form():
    rng = np.random.default_rng(0)
    cases = [rng.normal(size=(2, 5)) for _ in range(20)]
    cases += [np.array([[1.0, 0.0], [2.0, 0.0]]), np.array([[3.0, 1.0], [-1.0, 0.5]]), np.array([[1.0, 1.0], [1.0, 1.0]])]
    for a, b in cases:
        denom = (a - b) @ (a - b)
        want = np.clip(((b - a) @ b) / denom, 0, 1) if denom > 0 else 1.0
        gamma, value = min_norm_pair(a @ a, a @ b, b @ b)
        assert gamma == pytest.approx(want, abs=1e-12)
        assert value == pytest.approx(np.sum((want * a + (1 - want) * b) ** 2), abs=1e-12)
        result = min_norm_weights(torch.tensor(np.stack([a, b])))
        np.testing.assert_allclose(result.weights, [want, 1 - want], atol=1e-12)
        assert result.num_iters == 0 and result.converged


def test_three_vectors_plain_frank_wolfe_matches_exact_qp():
    """3 vectors in 2 or 3 dims: the optimum is a vertex, an edge point (both found exactly by the best-pair start)
    or interior to the triangle (linear convergence): plain Frank–Wolfe reaches the exact QP solution."""
    rng = np.random.default_rng(1)
    kinds = set()
    for trial in range(150):
        dim = 2 + trial % 2
        v = rng.normal(size=(3, dim)) + rng.normal(size=dim) * rng.uniform(0, 2)
        want = _exact_min_norm(v @ v.T)
        kinds.add(int((want > 1e-9).sum()))
        got = min_norm_frank_wolfe(v @ v.T, max_iter=20000, tol=1e-14)
        np.testing.assert_allclose(got.weights, want, atol=1e-7)
        np.testing.assert_allclose(got.weights @ v, want @ v, atol=1e-8)
        assert got.value == pytest.approx(float(want @ v @ v.T @ want), abs=1e-12)
        assert got.weights.min() >= 0 and got.weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert kinds == {1, 2, 3}, "vertex, edge and interior optima are all exercised"


def test_away_step_frank_wolfe_matches_exact_qp_on_larger_sets():
    rng = np.random.default_rng(2)
    for trial in range(120):
        n, dim = 3 + trial % 4, 2 + trial % 4
        v = rng.normal(size=(n, dim)) + rng.normal(size=dim) * rng.uniform(0, 2)
        want = _exact_min_norm(v @ v.T)
        got = min_norm_frank_wolfe(torch.tensor(v @ v.T), max_iter=20000, tol=1e-14, away_steps=True)
        np.testing.assert_allclose(got.weights @ v, want @ v, atol=1e-8)  # the min-norm point is unique
        assert got.value == pytest.approx(float(want @ v @ v.T @ want), abs=1e-12)
        if n <= dim:  # affinely independent: λ unique too
            np.testing.assert_allclose(got.weights, want, atol=1e-7)


def _pair_weight(a, b):
    """Weight of a in the min-norm point of the segment [a, b]: clip(((b − a)·b) / ‖a − b‖², 0, 1)."""
    return float(np.clip(((b - a) @ b) / ((a - b) @ (a - b)), 0, 1))


def test_first_frank_wolfe_iterate_and_stopping_rules():
    rng = np.random.default_rng(3)
    v = rng.normal(size=(6, 3)) + 0.3
    gram = v @ v.T
    # By hand: the best pair, then one Frank–Wolfe step towards the vertex minimising ⟨v_i, u⟩ with exact line search.
    pairs = [(i, j, _pair_weight(v[i], v[j])) for i, j in itertools.combinations(range(6), 2)]
    i, j, c = min(pairs, key=lambda p: np.sum((p[2] * v[p[0]] + (1 - p[2]) * v[p[1]]) ** 2))
    lam = np.zeros(6)
    lam[i], lam[j] = c, 1 - c
    u = lam @ v
    t = int(np.argmin(v @ u))
    gamma = _pair_weight(u, v[t])
    lam = gamma * lam + (1 - gamma) * np.eye(6)[t]
    with pytest.warns(MinNormConvergenceWarning, match="max_iter`=1"):
        capped = min_norm_frank_wolfe(gram, max_iter=1, tol=0.0)
    np.testing.assert_allclose(capped.weights, lam, atol=1e-12)
    assert capped.num_iters == 1 and not capped.converged
    loose = min_norm_frank_wolfe(gram, max_iter=100000, tol=1e-2)
    tight = min_norm_frank_wolfe(gram, max_iter=100000, tol=1e-9)
    assert loose.converged and loose.num_iters < tight.num_iters
    single = min_norm_frank_wolfe(np.array([[4.0]]))
    np.testing.assert_allclose(single.weights, [1.0])
    assert single.value == 4.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(gram=np.ones((2, 3))), "square"),
        (dict(gram=np.zeros((0, 0))), "non-empty"),
        (dict(gram=np.array([[np.nan]])), "non-finite"),
        (dict(gram=np.eye(2), max_iter=0), "`max_iter`"),
        (dict(gram=np.eye(2), tol=-1.0), "`tol`"),
    ],
)
def test_solver_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        min_norm_frank_wolfe(**kwargs)


# ---------------------------------------------------------------------------------------------- the update rule
def _random_rounds(num_clients=5, cohorts=((0, 1), (2, 1), (3, 4), (0, 2)), seed=0, shapes=((3, 2), (2,))):
    rng = np.random.default_rng(seed)
    x0 = [rng.normal(size=s) for s in shapes]
    rounds = []
    for cohort in cohorts:
        rounds.append([(cid, [rng.normal(scale=0.1, size=s) + 0.05 for s in shapes], int(rng.integers(1, 50)))
                       for cid in cohort])
    return x0, rounds


def _flat(tensors):
    return np.concatenate([np.asarray(t).ravel() for t in tensors])


def _run_direct(server, x0, rounds):
    params = [torch.tensor(p, dtype=torch.float64) for p in x0]
    diversities = []
    for clients in rounds:
        updates = [
            ClientUpdate(client_id=cid, delta=[torch.tensor(d) for d in deltas], num_samples=n, num_steps=1, loss=0.0)
            for cid, deltas, n in clients
        ]
        pseudo = server.server_update(params, updates)
        diversities.append(server.gradient_diversity(updates, pseudo))
    return _flat(p.numpy() for p in params), diversities


def _raw_diversity(clients, weighting="num_samples"):
    """Def. 3.1 (the square root) on the round's raw updates [(cid, Δ_i flat, |D_i|)], written from the paper."""
    g = np.stack([d for _, d, _ in clients])
    w = np.array([n if weighting == "num_samples" else 1.0 for _, _, n in clients], float)
    w = w / w.sum()
    mean = w @ g
    return np.sqrt((w * (g * g).sum(axis=1)).sum() / (mean @ mean))


OPTIONS = [
    dict(normalize=False, alpha_convention="paper", fedavg_warmup=False, projection=False),  # Alg. 1 as written
    dict(normalize=True, alpha_convention="paper", fedavg_warmup=False, projection=False),
    dict(normalize=True, alpha_convention="code", fedavg_warmup=True, projection=False),  # the public code
    dict(normalize=True, alpha_convention="code", fedavg_warmup=True, projection=True),
    dict(normalize=False, alpha_convention="paper", fedavg_warmup=False, projection=True, weighting="uniform"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_update_rule_matches_numpy_alg1(options):
    """Partial participation over 4 rounds and 5 clients: momenta of unsampled clients persist, unseen ones are
    left out, then everyone is in; the exact QP weights give the same model."""
    x0, rounds = _random_rounds()
    server = FedAWARE(lr=0.7, alpha=0.3, num_clients=5, solver="frank_wolfe", fw_away_steps=True, fw_tol=1e-14,
                      fw_max_iter=20000, **options)
    got, diversities = _run_direct(server, x0, rounds)
    flat_rounds = [[(cid, _flat(deltas), n) for cid, deltas, n in clients] for clients in rounds]
    ref_options = dict(options)
    ref_options["convention"] = ref_options.pop("alpha_convention")
    ref_options["warmup"] = ref_options.pop("fedavg_warmup")
    want, history = _reference_fedaware(_flat(x0), flat_rounds, 5, lr=0.7, alpha=0.3, **ref_options)
    np.testing.assert_allclose(got, want, atol=1e-9)
    final = history[-1]
    np.testing.assert_allclose(server.last_weights, final[0], atol=1e-7)
    assert server.last_weighted_diversity == pytest.approx(final[1], rel=1e-7)  # Eq. 6 with FedAWARE's λ
    for clients, got_div in zip(flat_rounds, diversities):  # round_gradient_diversity: the raw updates (Def. 3.1)
        assert got_div == pytest.approx(_raw_diversity(clients, options.get("weighting", "num_samples")), rel=1e-12)
    if options["fedavg_warmup"]:
        assert history[0] is None and server.warming_up is False


def test_default_plain_frank_wolfe_is_within_its_tolerance_of_alg1():
    """solver="frank_wolfe" (the default before the exact active-set solver) with its default options: plain
    Frank–Wolfe stops at an L1 change of λ below 1e-5, so it is Alg. 1 up to ~1e-5 (the exact match above uses tight
    tolerances); with the cap at 1 iteration it is visibly not."""
    x0, rounds = _random_rounds(seed=4)
    flat_rounds = [[(cid, _flat(deltas), n) for cid, deltas, n in clients] for clients in rounds]
    want, _ = _reference_fedaware(_flat(x0), flat_rounds, 5, lr=1.0, alpha=0.5)
    server = FedAWARE(lr=1.0, alpha=0.5, num_clients=5, normalize=False, fedavg_warmup=False, solver="frank_wolfe")
    got, _ = _run_direct(server, x0, rounds)
    assert server.last_solve.converged and server.last_solve.num_iters > 1
    assert np.abs(got - want).max() < 1e-4
    with pytest.warns(MinNormConvergenceWarning, match="max_iter`=1"):
        capped, _ = _run_direct(
            FedAWARE(num_clients=5, normalize=False, fedavg_warmup=False, solver="frank_wolfe", fw_max_iter=1),
            x0, rounds,
        )
    assert np.abs(capped - want).max() > 1e-4


def test_unseen_clients_are_excluded_and_momenta_persist():
    x0, rounds = _random_rounds(cohorts=((0, 1), (1, 2)))
    server = FedAWARE(alpha=0.25, num_clients=4, normalize=False, fedavg_warmup=False, solver="frank_wolfe",
                      fw_away_steps=True)
    _run_direct(server, x0, rounds)
    assert server.seen.tolist() == [True, True, True, False]
    assert server.last_weights[3] == 0.0
    m0 = -0.75 * _flat(rounds[0][0][1])  # client 0: one visit, m = (1−α)·g
    m1 = 0.25 * (-0.75 * _flat(rounds[0][1][1])) + 0.75 * -_flat(rounds[1][0][1])  # client 1: two visits
    np.testing.assert_allclose(server.momenta[0].numpy(), m0, atol=1e-15)
    np.testing.assert_allclose(server.momenta[1].numpy(), m1, atol=1e-15)
    assert not server.momenta[3].any() and server.momenta.device.type == "cpu"
    table = server.momenta.numpy()
    np.testing.assert_allclose(server.gram.numpy(), table @ table.T, atol=1e-14)


def test_warmup_is_fedavg_and_reports_the_base_diversity():
    x0, rounds = _random_rounds(cohorts=((0, 1),))
    server = FedAWARE(lr=0.5, num_clients=3, fedavg_warmup=True)
    got, diversities = _run_direct(server, x0, rounds)
    sizes = np.array([n for _, _, n in rounds[0]], float)
    deltas = [_flat(d) for _, d, _ in rounds[0]]
    avg = (sizes[0] * deltas[0] + sizes[1] * deltas[1]) / sizes.sum()
    np.testing.assert_allclose(got, _flat(x0) + 0.5 * avg, atol=1e-14)
    w = sizes / sizes.sum()
    want_div = np.sqrt((w[0] * deltas[0] @ deltas[0] + w[1] * deltas[1] @ deltas[1]) / (avg @ avg))
    assert diversities[0] == pytest.approx(want_div, rel=1e-12)
    assert server.last_weights is None and server.warming_up


def test_state_dict_round_trip_continues_identically():
    x0, rounds = _random_rounds(seed=7)
    make = lambda: FedAWARE(lr=0.5, alpha=0.3, num_clients=5, fedavg_warmup=False)  # noqa: E731
    full, _ = _run_direct(make(), x0, rounds)
    first = make()
    mid, _ = _run_direct(first, x0, rounds[:2])
    state = first.state_dict()
    second = make()
    second.load_state_dict(state)
    assert second.num_steps == 2 and second.seen.sum() == 3
    shapes = [p.shape for p in x0]
    mid_split = np.split(mid, np.cumsum([int(np.prod(s)) for s in shapes])[:-1])
    resumed, _ = _run_direct(second, [a.reshape(s) for a, s in zip(mid_split, shapes)], rounds[2:])
    np.testing.assert_allclose(full, resumed, atol=0, rtol=0)
    other = FedAWARE(num_clients=6)
    other.load_state_dict(state)  # refused before the state changes (fit start: the stage's check_fit; here the round)
    with pytest.raises(ValueError, match=r"momentum table has shape \(5, \d+\), but the run has 6 clients"):
        other.server_update([torch.zeros(p.shape, dtype=torch.float64) for p in x0],
                            [ClientUpdate(0, [torch.ones(p.shape, dtype=torch.float64) for p in x0], 1, 1, 0.0)])
    assert other.num_steps == 2


# ---------------------------------------------------------------------------------------------- end to end
def _regression_module(x, y, num_clients, clients_per_round, **kwargs):
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    return FederatedDataModule(
        dataset, partitioner=IIDPartitioner(num_clients=num_clients, seed=0), clients_per_round=clients_per_round,
        **kwargs,
    )


def _linear_weights(model: LinearRegression) -> np.ndarray:
    return np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])


def _mse_grad(w, x, y):
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ (xb @ w - y)


@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[3]])
def test_trainer_partial_participation_matches_numpy(tmp_path, options):
    """LinearRegression, 4 full-batch clients of which 2 per round, 2 local steps, 3 rounds (4 under warm-up)."""
    x, y = regression_data(n=40, seed=3)
    rounds = 4 if options["fedavg_warmup"] else 3
    model = LinearRegression(lr=0.05)
    w = _linear_weights(model)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=2, batch_size=100, local_epochs=2)
    server = FedAWARE(lr=0.8, alpha=0.3, solver="frank_wolfe", fw_away_steps=True, fw_tol=1e-14, fw_max_iter=20000,
                      **options)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert server.num_clients == 4
    parts = [dm.client_indices(c) for c in range(4)]
    # The reference runs its own local SGD on each round's cohort (the sampler is the data module's).
    ref_options = dict(options)
    ref_options["convention"] = ref_options.pop("alpha_convention")
    ref_options["warmup"] = ref_options.pop("fedavg_warmup")
    ref = ReferenceFedAWARE(4, len(w), lr=0.8, alpha=0.3, **ref_options)
    for t in range(rounds):
        clients = []
        for cid in dm.sample_clients(t).tolist():
            wi = w.copy()
            for _ in range(2):
                wi = wi - 0.05 * _mse_grad(wi, x[parts[cid]], y[parts[cid]])
            clients.append((cid, wi - w, len(parts[cid])))
        w, info = ref.round(w, clients)
    assert info is not None, "the last round is a FedAWARE round"
    np.testing.assert_allclose(server.last_weights, info[0], atol=1e-7)
    np.testing.assert_allclose(_linear_weights(model), w, atol=1e-10)


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_trainer_resume_equals_uninterrupted(tmp_path):
    """The momentum table, seen mask and Gram matrix travel through a Lightning checkpoint."""
    x, y = regression_data(n=48, seed=4)

    def fit(root, max_epochs, ckpt_path=None):
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        dm = _regression_module(x, y, num_clients=6, clients_per_round=2, batch_size=4)
        checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True, save_top_k=-1, every_n_epochs=1)
        server = FedAWARE(lr=0.5, alpha=0.3, fedavg_warmup=False)
        kwargs = quiet_trainer_kwargs(root) | {"enable_checkpointing": True}
        FederatedTrainer(max_epochs=max_epochs, callbacks=[server, checkpoint], **kwargs).fit(
            model, datamodule=dm, ckpt_path=ckpt_path
        )
        return model, server

    full, full_server = fit(tmp_path / "a", 5)
    fit(tmp_path / "b", 3)
    resumed, server = fit(tmp_path / "b", 5, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert server.num_steps == 5
    torch.testing.assert_close(server.momenta, full_server.momenta, rtol=0, atol=0)
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_logs_solver_metrics_and_fedaware_diversity(tmp_path):
    x, y = regression_data(n=30, seed=5)
    dm = _regression_module(x, y, num_clients=3, clients_per_round=2, batch_size=100)
    logger = CSVLogger(str(tmp_path), name="run")
    server = FedAWARE(lr=1.0, alpha=0.5)
    FederatedTrainer(max_epochs=4, callbacks=[server], **(quiet_trainer_kwargs(tmp_path) | {"logger": logger})).fit(
        LinearRegression(lr=0.1), datamodule=dm
    )
    rows = [r for r in csv.DictReader(open(f"{logger.log_dir}/metrics.csv")) if r.get("round_train_loss")]
    last = rows[-1]
    lam = server.last_weights
    gram = server.gram.numpy()
    unit = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    assert float(last["fedaware_support"]) == (lam > 0).sum()
    assert float(last["fedaware_min_norm_sq"]) == pytest.approx(lam @ unit @ lam, rel=1e-6)
    assert float(last["fedaware_weighted_diversity"]) == pytest.approx(1.0 / np.sqrt(lam @ unit @ lam), rel=1e-6)
    assert float(last["round_gradient_diversity"]) >= 1.0  # the raw updates' diversity, checked against NumPy above


def test_round_gradient_diversity_is_that_of_the_raw_updates_not_the_lambda_weighted_one():
    """#34: FedAWARE logs the same ``round_gradient_diversity`` as FedAvg for the same updates (Def. 3.1 on the raw
    Δ_i), and its λ-weighted value separately. Orthogonal updates g_0 = [1, 0] (|D| = 10), g_1 = [0, 3] (|D| = 30):
    w = (¼, ¾), D = √((¼·1 + ¾·9) / ‖[¼, 9/4]‖²) = √(7 / (82/16)) ≈ 1.1687; FedAWARE's unit momenta are orthogonal,
    λ = (½, ½), ‖d‖² = ½, weighted D = √2."""
    from lightning_fed.callbacks.fedavg import FedAvg

    updates = [ClientUpdate(0, [torch.tensor([-1.0, 0.0], dtype=torch.float64)], 10, 1, 0.0),
               ClientUpdate(1, [torch.tensor([0.0, -3.0], dtype=torch.float64)], 30, 1, 0.0)]
    server = FedAWARE(num_clients=2)
    pseudo = server.server_update([torch.zeros(2, dtype=torch.float64)], updates)
    want = np.sqrt(7.0 / (82.0 / 16.0))
    assert server.gradient_diversity(updates, pseudo) == pytest.approx(want, rel=1e-14)
    fedavg = FedAvg()
    assert fedavg.gradient_diversity(updates, fedavg.aggregate(updates)) == pytest.approx(want, rel=1e-14)
    assert server.last_weighted_diversity == pytest.approx(np.sqrt(2.0), rel=1e-12)


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(lr=0.0), "`lr`"),
        (dict(alpha=1.0), "`alpha`.*\\[0, 1\\)"),
        (dict(alpha=-0.1), "`alpha`"),
        (dict(alpha=0.0, alpha_convention="code"), "`alpha`.*\\(0, 1\\]"),
        (dict(alpha=float("nan")), "`alpha`"),
        (dict(alpha_convention="torch"), "`alpha_convention`"),
        (dict(normalize="yes"), "`normalize`"),
        (dict(projection=1), "`projection`"),
        (dict(fw_max_iter=0), "`fw_max_iter`"),
        (dict(fw_max_iter=2.5), "`fw_max_iter`"),
        (dict(fw_tol=-1e-5), "`fw_tol`"),
        (dict(num_clients=0), "`num_clients`"),
        (dict(max_state_bytes=0), "`max_state_bytes` must be 'auto', an integer >= 1"),
        (dict(max_state_bytes="8GiB"), "`max_state_bytes`"),
        (dict(max_state_bytes=True), "`max_state_bytes`"),
        (dict(weighting="tokens"), "`weighting`"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAWARE(**kwargs)


def _update(cid, value=0.1):
    return ClientUpdate(client_id=cid, delta=[torch.full((2,), value, dtype=torch.float64)], num_samples=3,
                        num_steps=1, loss=0.0)


def test_runtime_errors():
    params = [torch.zeros(2, dtype=torch.float64)]
    with pytest.raises(ValueError, match="needs the number of clients N"):
        FedAWARE().server_update(params, [_update(0)])
    with pytest.raises(ValueError, match=r"Client ids \[3\] are outside \[0, 3\)"):
        FedAWARE(num_clients=3).server_update(params, [_update(3)])
    with pytest.raises(ValueError, match="more than once"):
        FedAWARE(num_clients=3).server_update(params, [_update(1), _update(1)])
    with pytest.raises(ValueError, match="empty round"):
        FedAWARE(num_clients=3).server_update(params, [])
    server = FedAWARE(num_clients=3)
    server.server_update(params, [_update(0)])
    with pytest.raises(ValueError, match="momentum table has shape \\(3, 2\\).*3 clients and 5 parameters"):
        server.server_update([torch.zeros(5, dtype=torch.float64)], [_update(0)])


def test_num_clients_must_agree_with_the_datamodule(tmp_path):
    x, y = regression_data(n=20)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=2, batch_size=100)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedAWARE(num_clients=5)], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match="num_clients=5, but the data module has 4 clients"):
        trainer.fit(LinearRegression(), datamodule=dm)


# ---------------------------------------------------------------------------------------------- #42: memory at fit start
class _CountingRegression(LinearRegression):
    """LinearRegression that counts its training steps (every client's local steps)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)


def test_per_client_state_above_max_state_bytes_is_refused_at_fit_start_before_any_client_trains(tmp_path):
    """2,000 clients: a 30.52 MiB Gram matrix (N² float64) against a 1,000,000-byte limit is refused by name at fit
    start (on main the tables were allocated after round 0 trained: 100,000 clients died there with a raw
    allocator error asking for 80,000,000,000 bytes)."""
    x, y = regression_data(n=4000, seed=0)
    dm = _regression_module(x, y, num_clients=2000, clients_per_round=2, batch_size=4)
    model = _CountingRegression()
    server = FedAWARE(max_state_bytes=1_000_000)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError) as info:
        trainer.fit(model, datamodule=dm)
    message = str(info.value)
    assert message.startswith("FedAWARE's per-client state for N=2,000 clients and d=4 parameters is 30.60 MiB")
    for part in ("momenta [N, d] float64 0.06 MiB", "Gram matrix [N, N] float64 30.52 MiB", "|D_i| [N] int64 0.02 MiB",
                 "seen mask [N] bool 2,000 B", "`max_state_bytes` is 0.95 MiB", "saved in every checkpoint"):
        assert part in message
    assert model.steps == 0 and server.num_steps == 0 and server.client_state is None


def test_per_client_state_above_half_max_state_bytes_warns_and_trains(tmp_path):
    """Between half the limit and the limit: a warning naming the sizes, and the round trains as without a limit."""
    x, y = regression_data(n=40, seed=0)

    def fit(limit):
        torch.manual_seed(0)
        model = LinearRegression(lr=0.1)
        dm = _regression_module(x, y, num_clients=10, clients_per_round=3, batch_size=4)
        FederatedTrainer(max_epochs=2, callbacks=[FedAWARE(max_state_bytes=limit)],
                         **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
        return model

    # 10 clients, d = 4 (float64): 320 + 800 + 80 + 10 = 1,210 bytes.
    with pytest.warns(UserWarning, match=r"N=10 clients and d=4 parameters is 1,210 B .*`max_state_bytes` is 2,000 B: "
                                         "above half the limit"):
        warned = fit(2000)
    unlimited = fit(None)
    for a, b in zip(warned.parameters(), unlimited.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_max_state_bytes_without_a_trainer_and_its_default():
    """``server_update`` (no fit start) refuses before building the tables; ``"auto"`` is half the physical memory;
    ``None`` sets no limit."""
    with pytest.raises(ValueError, match=r"N=100,000 clients and d=2 parameters is 74.51 GiB .*Gram matrix \[N, N\] "
                                         r"float64 74.51 GiB.*`max_state_bytes` is 1.00 GiB"):
        FedAWARE(num_clients=100_000, max_state_bytes=2**30).server_update([torch.zeros(2, dtype=torch.float64)],
                                                                          [_update(0)])
    import os

    assert FedAWARE().min_norm.state_limit() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    sizes = FedAWARE(max_state_bytes=None).min_norm.check_state_size(10**6, 10**9, torch.float32)
    assert sizes["Gram matrix [N, N] float64"] == 8 * 10**12 and sizes["momenta [N, d] float32"] == 4 * 10**15


# ---------------------------------------------------------------------------------------------- #34: the authors' recipe
def _updates(pairs):
    return [ClientUpdate(cid, [torch.tensor(d, dtype=torch.float64)], n, 1, 0.0) for cid, d, n in pairs]


def test_warmup_rounds_is_fedavg_for_that_many_rounds_then_fedaware():
    """``warmup_rounds=2``: rounds 0 and 1 step with the |D|-weighted FedAvg of the updates although every client has
    been seen after round 0; round 2 is FedAWARE (here with α = 1 in the code convention, m_i = g_i, so on two
    orthogonal unit-length... momenta the min-norm step is −½(v_0 + v_1))."""
    server = FedAWARE(lr=1.0, alpha=1.0, alpha_convention="code", num_clients=2, warmup_rounds=2)
    x = [torch.zeros(2, dtype=torch.float64)]
    rounds = [[(0, [-1.0, 0.0], 10), (1, [0.0, -2.0], 30)]] * 3
    want = np.zeros(2)
    for t, pairs in enumerate(rounds):
        assert server.warming_up == (t < 2)
        server.server_update(x, _updates(pairs))
        if t < 2:  # FedAvg: x += ¼·[-1, 0] + ¾·[0, -2]
            want = want + np.array([-0.25, -1.5])
            assert server.last_weights is None
        else:  # momenta g_0 = [1, 0], g_1 = [0, 2]: unit vectors e_0, e_1, λ = (½, ½)
            want = want - np.array([0.5, 0.5])
            np.testing.assert_allclose(server.last_weights, [0.5, 0.5], atol=1e-12)
        np.testing.assert_allclose(x[0].numpy(), want, atol=1e-14)
    assert FedAWARE(warmup_rounds=0).warmup_rounds == 0
    with pytest.raises(ValueError, match="`warmup_rounds` must be an integer >= 0 or None, got -1"):
        FedAWARE(warmup_rounds=-1)
    with pytest.raises(ValueError, match="`warmup_rounds` and `fedavg_warmup=True`"):
        FedAWARE(warmup_rounds=3, fedavg_warmup=True)


def test_public_code_pairing_puts_updates_in_other_clients_slots():
    """``pairing="public_code"`` (the public code's bug): the cohort drawn as [2, 0, 1], the k-th update in id order
    goes to the k-th drawn client: client 0's update into slot 2, client 1's into slot 0, client 2's into slot 1.
    With α = 1 (code convention) m_slot = g of the update it got. In a warm-up round the FedAvg weights |D| of the
    drawn order multiply the updates in id order: (20·g_0 + 30·g_1 + 50·g_2)/100 with |D_2| = 20, |D_0| = 30,
    |D_1| = 50. The default pairs each update with its own client; a cohort drawn in id order is unaffected."""
    g = {0: [1.0, 0.0, 0.0], 1: [0.0, 1.0, 0.0], 2: [0.0, 0.0, 1.0]}
    n = {0: 30, 1: 50, 2: 20}
    drawn = [2, 0, 1]
    pairs = [(cid, [-v for v in g[cid]], n[cid]) for cid in drawn]  # Δ_i = −g_i, in the cohort's order
    bug = FedAWARE(lr=1.0, alpha=1.0, alpha_convention="code", num_clients=3, warmup_rounds=1, pairing="public_code")
    x = [torch.zeros(3, dtype=torch.float64)]
    bug.server_update(x, _updates(pairs))
    np.testing.assert_array_equal(bug.momenta.numpy(), np.array([g[1], g[2], g[0]]))  # rows = slots 0, 1, 2
    np.testing.assert_allclose(x[0].numpy(), -(20 * np.array(g[0]) + 30 * np.array(g[1]) + 50 * np.array(g[2])) / 100,
                               atol=1e-15)
    assert bug.client_num_samples.tolist() == [30, 50, 20]  # the slots keep their own clients' |D_i|
    right = FedAWARE(lr=1.0, alpha=1.0, alpha_convention="code", num_clients=3, warmup_rounds=1)
    x = [torch.zeros(3, dtype=torch.float64)]
    right.server_update(x, _updates(pairs))
    np.testing.assert_array_equal(right.momenta.numpy(), np.eye(3))
    np.testing.assert_allclose(x[0].numpy(), -np.array([30, 50, 20]) / 100, atol=1e-15)
    in_order = FedAWARE(alpha=1.0, alpha_convention="code", num_clients=3, pairing="public_code")
    in_order.server_update([torch.zeros(3, dtype=torch.float64)], _updates(sorted(pairs)))
    np.testing.assert_array_equal(in_order.momenta.numpy(), np.eye(3))
    assert "pairing='public_code'" in repr(bug) and FedAWARE().pairing == "client_id"
    with pytest.raises(ValueError, match=r"`pairing` must be one of \('client_id', 'public_code'\), got 'buggy'"):
        FedAWARE(pairing="buggy")


def test_public_code_pairing_through_the_trainer_follows_the_cohorts_selection_order(tmp_path):
    """Through FederatedTrainer (one round, 4 of 5 clients drawn in the data module's selection order): with
    ``pairing="public_code"`` slot ``cohort[k]`` holds the momentum that the correct pairing gives client
    ``sorted(cohort)[k]`` (α = 1, code convention: m = g), so the emulation sees the cohort in its draw order."""
    x, y = regression_data(n=60, seed=3)

    def fit(pairing):
        torch.manual_seed(0)
        dm = _regression_module(x, y, num_clients=5, clients_per_round=4, batch_size=4)
        server = FedAWARE(lr=1.0, alpha=1.0, alpha_convention="code", warmup_rounds=1, pairing=pairing)
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path / pairing)).fit(
            LinearRegression(lr=0.05), datamodule=dm)
        return server.momenta.numpy(), dm.sample_clients(0).tolist()

    right, cohort = fit("client_id")
    bug, cohort_again = fit("public_code")
    assert cohort == cohort_again and cohort != sorted(cohort)  # a draw that is not already in id order
    for slot, owner in zip(cohort, sorted(cohort)):
        np.testing.assert_array_equal(bug[slot], right[owner])
    assert not np.array_equal(bug, right)


def test_41_fedaware_keeps_no_behaviour_in_callbacks():
    """FedAWARE's N, checks and round metrics live in its stage (algorithms/fedaware.py); the callback is a
    ready-made name (its own chain refused when replaced: tests/server/aggregators/test_base.py)."""
    from helpers import assert_ready_made_name
    from lightning_fed.callbacks import FedAWARE

    assert_ready_made_name(FedAWARE, delegates=("_min_norm_report", "extra_repr"))
