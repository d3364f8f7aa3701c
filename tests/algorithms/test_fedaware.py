"""FedAWAREMinNorm (Zeng et al. 2024, Alg. 1, l. 10-11) as a stage, against NumPy momenta and an independent
min-norm solution; FedAWARE is that stage composed with the SGD rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAWARE
from lightning_fed.algorithms.fedaware import FedAWAREMinNorm
from lightning_fed.server.aggregators import ClientDeltas, RoundInfo
from lightning_fed.server.rules import SGD


def _min_norm_enumerated(vectors):
    """argmin_{λ ∈ simplex} ‖Σ λ_i v_i‖² by enumerating supports S and solving the KKT system G_S λ = μ·1,
    Σλ = 1 on each (independent of lightning_fed.server.min_norm)."""
    g = vectors @ vectors.T
    k = len(vectors)
    best, best_value = None, np.inf
    for mask in range(1, 2 ** k):
        s = [i for i in range(k) if mask >> i & 1]
        a = np.zeros((len(s) + 1, len(s) + 1))
        a[:-1, :-1], a[:-1, -1], a[-1, :-1] = g[np.ix_(s, s)], -1.0, 1.0
        try:
            sol = np.linalg.solve(a, np.r_[np.zeros(len(s)), 1.0])
        except np.linalg.LinAlgError:
            continue
        lam = np.zeros(k)
        lam[s] = sol[:-1]
        if lam.min() >= -1e-12 and lam @ g @ lam < best_value - 1e-15:
            best, best_value = lam, lam @ g @ lam
    return best


@pytest.mark.parametrize("normalize", [True, False])
def test_stage_momenta_and_direction_match_numpy(normalize):
    rng = np.random.default_rng(0)
    n, alpha = 4, 0.3
    stage = FedAWAREMinNorm(alpha=alpha, normalize=normalize, num_clients=n)
    state = stage.init_state([torch.zeros(3, dtype=torch.float64)], n)
    m = np.zeros((n, 3))
    for t, cohort in enumerate([(0, 1), (2, 1), (3, 0)]):
        deltas = rng.normal(size=(len(cohort), 3))
        x = ClientDeltas(list(cohort), [[torch.tensor(d)] for d in deltas], torch.ones(len(cohort), dtype=torch.float64))
        out, state, report = stage.apply(x, state, RoundInfo(t, 0, n, 2))
        for i, d in zip(cohort, deltas):
            m[i] = alpha * m[i] - (1 - alpha) * d  # g_i = −Δ_i, paper convention
        seen = sorted({c for r in [(0, 1), (2, 1), (3, 0)][:t + 1] for c in r})
        v = m[seen] / np.linalg.norm(m[seen], axis=1, keepdims=True) if normalize else m[seen]
        lam = _min_norm_enumerated(v)
        np.testing.assert_allclose(state.table.matrix.numpy(), m, rtol=0, atol=1e-15)
        np.testing.assert_allclose(state.gram.numpy(), m @ m.T, atol=1e-14)
        np.testing.assert_allclose(report.weights[seen], lam, atol=1e-9)
        np.testing.assert_allclose(out[0].numpy(), -(lam @ v), atol=1e-9)


def test_fedaware_is_the_stage_with_sgd():
    server = FedAWARE(lr=0.5, alpha=0.25, num_clients=3)
    assert isinstance(server.server_rule, SGD) and server.server_rule.lr == 0.5
    assert server.aggregators == [server.min_norm] and isinstance(server.min_norm, FedAWAREMinNorm)
    updates = [ClientUpdate(0, [torch.tensor([-1.0, 0.0], dtype=torch.float64)], 4, 1, 0.0),
               ClientUpdate(2, [torch.tensor([0.0, -3.0], dtype=torch.float64)], 2, 1, 0.0)]
    params = [torch.zeros(2, dtype=torch.float64)]
    pseudo = server.server_update(params, updates)
    # unit momenta e_0, e_1: λ = (½, ½), Δ_1 = −½·(e_0 + e_1), x_1 = 0.5·Δ_1
    np.testing.assert_array_equal(pseudo[0].numpy(), [-0.5, -0.5])
    np.testing.assert_array_equal(params[0].numpy(), [-0.25, -0.25])
    np.testing.assert_array_equal(server.last_weights, [0.5, 0.0, 0.5])
    assert server.client_num_samples.tolist() == [4, 0, 2] and server.client_state is server.aggregator_state[0].table


def test_stage_needs_num_clients():
    x = ClientDeltas([0], [[torch.ones(2)]], torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs the number of clients N"):
        FedAWAREMinNorm().apply(x, FedAWAREMinNorm.State(), RoundInfo(0, 0, 1, 1))


# ---------------------------------------------------------------------------------------------- the stage's own checks
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(alpha=1.0), "`alpha`.*\\[0, 1\\)"),
        (dict(alpha=0.0, alpha_convention="code"), "`alpha`.*\\(0, 1\\]"),
        (dict(alpha_convention="torch"), "`alpha_convention`"),
        (dict(normalize="yes"), "`normalize`"),
        (dict(solver="newton"), "`solver`"),
        (dict(fw_tol=1e-9), "`fw_tol` only apply to solver='frank_wolfe'"),
        (dict(solver="frank_wolfe", fw_max_iter=0), "`fw_max_iter`"),
        (dict(num_clients=0), "`num_clients`"),
        (dict(warmup_rounds=2, fedavg_warmup=True), "`warmup_rounds` and `fedavg_warmup=True`"),
        (dict(pairing="sorted"), "`pairing`"),
        (dict(max_state_bytes=0), "`max_state_bytes`"),
        (dict(weighting="tokens"), "`weighting`"),
    ],
)
def test_stage_refuses_bad_options_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAWAREMinNorm(**kwargs)


def test_stage_resolves_frank_wolfe_defaults_and_keeps_given_ones():
    assert (FedAWAREMinNorm().fw_max_iter, FedAWAREMinNorm().fw_tol, FedAWAREMinNorm().fw_away_steps) == (1000, 1e-5, False)
    stage = FedAWAREMinNorm(solver="frank_wolfe", fw_max_iter=7, fw_tol=0, fw_away_steps=True)
    assert (stage.fw_max_iter, stage.fw_tol, stage.fw_away_steps) == (7, 0.0, True)


def test_stage_reads_num_clients_and_knows_its_warm_up():
    class Data:
        num_clients = 2

    stage = FedAWAREMinNorm(fedavg_warmup=True)
    stage.read_num_clients(Data())
    assert stage.num_clients == 2 and stage.warming_up(None, 0)
    with pytest.raises(ValueError, match="built for num_clients=3, but the data module has 2"):
        FedAWAREMinNorm(num_clients=3).read_num_clients(Data())
    x = ClientDeltas([0], [[torch.tensor([1.0, 0.0], dtype=torch.float64)]], torch.ones(1, dtype=torch.float64))
    _, state, report = stage.apply(x, stage.init_state(x.deltas[0], 2), RoundInfo(0, 0, 1, 2))
    assert stage.warming_up(state, 1) and FedAWAREMinNorm.round_metrics(report) == {}
    x = ClientDeltas([1], [[torch.tensor([0.0, 2.0], dtype=torch.float64)]], torch.ones(1, dtype=torch.float64))
    _, state, report = stage.apply(x, state, RoundInfo(1, 1, 1, 2))
    assert not stage.warming_up(state, 2)
    _, state, report = stage.apply(x, state, RoundInfo(2, 2, 1, 2))
    metrics = FedAWAREMinNorm.round_metrics(report)
    assert set(metrics) == {"fedaware_support", "fedaware_fw_iters", "fedaware_min_norm_sq",
                            "fedaware_weighted_diversity"} and metrics["fedaware_support"] == 2.0
    assert FedAWAREMinNorm(warmup_rounds=1).warming_up(None, 0) and not FedAWAREMinNorm(warmup_rounds=1).warming_up(None, 1)


def test_a_loaded_momentum_table_for_another_n_is_refused_at_fit_start():
    """#41: the state is saved one way (the stage's, under "aggregators"); a table for another N is refused by the
    stage's fit-start check, before any client trains."""
    first = FedAWARE(num_clients=3)
    first.server_update([torch.zeros(2, dtype=torch.float64)],
                        [ClientUpdate(0, [torch.ones(2, dtype=torch.float64)], 1, 1, 0.0)])
    state = first.state_dict()
    assert "fedaware" not in state and "client_state" not in state and len(state["aggregators"]) == 1
    second = FedAWARE(num_clients=4)
    second.load_state_dict(state)
    assert second.momenta.shape == (3, 2) and second.seen.tolist() == [True, False, False]
    with pytest.raises(ValueError, match="checkpoint's FedAWARE state is for 3 clients, but this run has 4"):
        second.min_norm.check_fit(None, torch.nn.Linear(2, 1), second)


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_with_a_frozen_encoder_the_momentum_table_has_one_column_per_trained_number(tmp_path):
    from helpers import fit_frozen_pair, same_head

    frozen, head_only, trainer, _ = fit_frozen_pair(tmp_path, lambda: FedAWARE(lr=1.0, alpha=0.5))
    assert same_head(frozen, head_only)
    assert tuple(trainer.fit_loop.server_optimizer.client_state.matrix.shape) == (4, 7)  # N × |F|, not N × 31
