"""Robust reducers (lightning_fed/server/aggregators/robust.py) and the Flower-named server optimizers
(lightning_fed/callbacks/robust.py) against values computed by hand or with a few lines of NumPy / SciPy, and an
end-to-end run under 20 % scaled-update attackers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.callbacks import FedAdam, FedAvg, FedAvgM, FedMedian, FedTrimmedAvg, Krum
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import (
    ClientDeltas,
    CoordinateMedian,
    EmptyState,
    NormBoundedMean,
    RoundInfo,
    TrimmedMean,
    WeightedMean,
    check_chain,
)
from lightning_fed.server.aggregators import Krum as KrumReducer
from lightning_fed.server.attacks import MaliciousClients

INFO = RoundInfo(0, 0, 10, 10)


def _x(values, counts=None, dtype=torch.float64):
    """ClientDeltas from per-client lists of arrays (one array per parameter)."""
    deltas = [[torch.tensor(np.asarray(a), dtype=dtype) for a in client] for client in values]
    counts = torch.ones(len(values), dtype=torch.float64) if counts is None else torch.tensor(counts, dtype=torch.float64)
    return ClientDeltas(list(range(len(values))), deltas, counts)


def _reduce(stage, x):
    out, state = stage.apply(x, EmptyState(), INFO)
    assert state == EmptyState()
    return out


# ------------------------------------------------------------------------------------------------ median
def test_median_of_1_2_100_is_2_and_an_even_cohort_averages_the_middle_two():
    assert _reduce(CoordinateMedian(), _x([[[1.0]], [[2.0]], [[100.0]]]))[0].item() == 2.0
    # K = 4: (2 + 3) / 2, as np.median (Flower's aggregate_median), not torch.median's lower middle value 2
    assert _reduce(CoordinateMedian(), _x([[[1.0]], [[3.0]], [[100.0]], [[2.0]]]))[0].item() == 2.5


def test_median_per_coordinate_matches_numpy_and_ignores_counts():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 2, 3))  # 5 clients, a 2x3 parameter
    b = rng.normal(size=(5, 4))  # and a vector
    x = _x([[a[i], b[i]] for i in range(5)], counts=[1, 100, 3, 7, 2])
    out = _reduce(CoordinateMedian(), x)
    np.testing.assert_array_equal(out[0].numpy(), np.median(a, axis=0))
    np.testing.assert_array_equal(out[1].numpy(), np.median(b, axis=0))


def test_median_keeps_the_parameters_dtype():
    x = _x([[[1.0, 2.0]], [[3.0, 4.0]]], dtype=torch.float32)
    out = _reduce(CoordinateMedian(), x)
    assert out[0].dtype == torch.float32 and out[0].tolist() == [2.0, 3.0]


# ------------------------------------------------------------------------------------------------ trimmed mean
def test_trimmed_mean_by_hand():
    # beta = 0.2, K = 5: b = 1 per side; coordinate 0: sorted (-50, 2, 3, 4, 90) -> mean(2, 3, 4) = 3;
    # coordinate 1: sorted (0, 1, 1, 1, 7) -> mean(1, 1, 1) = 1
    x = _x([[[-50.0, 1.0]], [[2.0, 0.0]], [[3.0, 7.0]], [[4.0, 1.0]], [[90.0, 1.0]]])
    assert _reduce(TrimmedMean(beta=0.2), x)[0].tolist() == [3.0, 1.0]
    # beta = 0.19 < 1/5 trims nothing: the plain mean (-50 + 2 + 3 + 4 + 90) / 5 = 9.8
    assert _reduce(TrimmedMean(beta=0.19), x)[0][0].item() == pytest.approx(9.8, rel=1e-15)


@pytest.mark.parametrize("beta, k", [(0.1, 10), (0.25, 8), (0.3, 7), (0.49, 9), (0.0, 4)])
def test_trimmed_mean_matches_scipy_trim_mean(beta, k):
    rng = np.random.default_rng(k)
    a = rng.normal(size=(k, 6))
    out = _reduce(TrimmedMean(beta=beta), _x([[a[i]] for i in range(k)], counts=list(range(1, k + 1))))
    np.testing.assert_allclose(out[0].numpy(), scipy.stats.trim_mean(a, beta, axis=0), rtol=1e-14, atol=1e-15)
    assert TrimmedMean(beta).num_trimmed(k) == int(np.floor(beta * k))


@pytest.mark.parametrize("beta", [0.5, 0.7, -0.1, 1, "0.2", True, float("nan")])
def test_trimmed_mean_refuses_a_beta_that_trims_everything_or_is_not_a_fraction(beta):
    with pytest.raises(ValueError, match=r"`beta` must be a number in \[0, 0.5\)"):
        TrimmedMean(beta=beta)
    with pytest.raises(ValueError, match="`beta`"):
        FedTrimmedAvg(beta=beta)


# ------------------------------------------------------------------------------------------------ Krum
def _numpy_krum_scores(vectors: np.ndarray, f: int) -> np.ndarray:
    """s(i) = sum of the K - f - 2 smallest ||v_i - v_j||^2 over j != i (Blanchard et al. 2017, Sec. 4)."""
    k = len(vectors)
    scores = np.empty(k)
    for i in range(k):
        d = sorted(float(np.sum((vectors[i] - vectors[j]) ** 2)) for j in range(k) if j != i)
        scores[i] = sum(d[: k - f - 2])
    return scores


def test_krum_scores_by_hand_on_four_points():
    # 1-D points 0, 1, 2, 50; f = 0, so K - f - 2 = 2 neighbours:
    # 0: 1 + 4 = 5; 1: 1 + 1 = 2; 2: 1 + 4 = 5; 50: 48^2 + 49^2 = 4705
    x = _x([[[0.0]], [[1.0]], [[2.0]], [[50.0]]])
    assert KrumReducer(0).scores(x).tolist() == [5.0, 2.0, 5.0, 4705.0]
    assert _reduce(KrumReducer(0), x)[0].item() == 1.0


def test_krum_picks_the_smallest_numpy_score_over_all_parameters():
    rng = np.random.default_rng(1)
    k, f = 9, 2
    a = rng.normal(size=(k, 3, 2))
    b = rng.normal(size=(k, 5))
    a[[2, 6]] += 8.0  # two outliers
    x = _x([[a[i], b[i]] for i in range(k)])
    flat = np.concatenate([a.reshape(k, -1), b], axis=1)
    expected = _numpy_krum_scores(flat, f)
    np.testing.assert_allclose(KrumReducer(f).scores(x).numpy(), expected, rtol=1e-13)
    best = int(np.argmin(expected))
    out = _reduce(KrumReducer(num_malicious_clients=f, num_clients_to_keep=1), x)
    np.testing.assert_array_equal(out[0].numpy(), a[best])  # the chosen update itself, bit for bit
    np.testing.assert_array_equal(out[1].numpy(), b[best])
    assert best not in (2, 6)


def test_multi_krum_averages_the_m_best_weighted_by_counts():
    rng = np.random.default_rng(2)
    k, f, m = 8, 2, 4
    v = rng.normal(size=(k, 6))
    v[[0, 5]] *= 20.0
    counts = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    scores = _numpy_krum_scores(v, f)
    best = np.argsort(scores, kind="stable")[:m]
    assert not {0, 5} & set(best.tolist())
    x = _x([[v[i]] for i in range(k)], counts=counts.tolist())
    out = _reduce(KrumReducer(f, m), x)
    expected = (counts[best, None] * v[best]).sum(0) / counts[best].sum()
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-14)
    assert KrumReducer(f, m).select(x) == best.tolist()
    # uniform counts: the paper's plain mean of the m best
    out_uniform = _reduce(KrumReducer(f, m), _x([[v[i]] for i in range(k)]))
    np.testing.assert_allclose(out_uniform[0].numpy(), v[best].mean(0), rtol=1e-14)


def test_krum_keeps_zero_and_one_as_the_same_rule():
    x = _x([[[0.0]], [[1.0]], [[2.0]], [[50.0]], [[1.5]]])
    assert _reduce(KrumReducer(1, 0), x)[0].item() == _reduce(KrumReducer(1, 1), x)[0].item()


def test_krum_refuses_too_few_clients_for_f_and_keeping_more_than_the_round():
    four = _x([[[0.0]], [[1.0]], [[2.0]], [[3.0]]])
    with pytest.raises(ValueError, match=r"`num_malicious_clients`=1 needs more than 2f \+ 2 = 4 clients per round.*got 4"):
        KrumReducer(num_malicious_clients=1).apply(four, EmptyState(), INFO)
    with pytest.raises(ValueError, match=r"`num_clients_to_keep` \(5\) must not exceed the clients in the round \(4\)"):
        KrumReducer(num_malicious_clients=0, num_clients_to_keep=5).apply(four, EmptyState(), INFO)
    with pytest.raises(ValueError, match="`num_malicious_clients` must be an integer >= 0"):
        KrumReducer(num_malicious_clients=-1)
    with pytest.raises(ValueError, match="`num_clients_to_keep` must be an integer >= 0"):
        Krum(num_clients_to_keep=1.5)


# ------------------------------------------------------------------------------------------------ norm-bounded mean
def test_norm_bounded_mean_by_hand():
    # client 0: [3, 4] and [0] -> norm 5 over all parameters, clipped to M = 2.5: factor 1/2 -> [1.5, 2], [0]
    # client 1: [0, 1] and [0] -> norm 1 <= M, kept; client 2: [0, 0], [12] -> norm 12, factor 2.5/12
    # weights 1, 2, 1: ([1.5, 2] + 2·[0, 1] + [0, 0]) / 4 = [0.375, 1.0]; ([0] + 0 + [2.5]) / 4 = 0.625
    x = _x([[[3.0, 4.0], [0.0]], [[0.0, 1.0], [0.0]], [[0.0, 0.0], [12.0]]], counts=[1, 2, 1])
    out = _reduce(NormBoundedMean(max_norm=2.5), x)
    np.testing.assert_allclose(out[0].numpy(), [0.375, 1.0], rtol=1e-15)
    np.testing.assert_allclose(out[1].numpy(), [0.625], rtol=1e-15)
    # a bound no update reaches is the weighted mean itself
    torch.testing.assert_close(_reduce(NormBoundedMean(1e6), x), _reduce(WeightedMean(), x), rtol=1e-15, atol=0)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), None])
def test_norm_bounded_mean_refuses_a_bad_bound(bad):
    with pytest.raises(ValueError, match="`max_norm` must be a finite number > 0"):
        NormBoundedMean(max_norm=bad)


# ------------------------------------------------------------------------------------------------ server optimizers
def _updates(values, counts=None):
    counts = counts or [1] * len(values)
    return [ClientUpdate(i, [torch.tensor(v, dtype=torch.float64)], c, 1, 0.0) for i, (v, c) in enumerate(zip(values, counts))]


def test_flower_named_strategies_with_lr_1_return_the_robust_aggregate_of_the_client_models():
    """Flower's strategies aggregate the client models x_i = x_t + Δ_i; with η = 1 the new global model is that
    aggregate (here x_t = [10, -10])."""
    x_t = np.array([10.0, -10.0])
    deltas = [[1.0, 0.0], [2.0, 5.0], [100.0, -3.0], [0.5, 1.0], [3.0, 2.0]]
    models = x_t + np.array(deltas)
    cases = [
        (FedMedian(), np.median(models, axis=0)),
        (FedTrimmedAvg(beta=0.2), scipy.stats.trim_mean(models, 0.2, axis=0)),
        (Krum(num_malicious_clients=1), models[int(np.argmin(_numpy_krum_scores(models, 1)))]),
    ]
    for server, expected in cases:
        params = [torch.tensor(x_t)]
        server.server_update(params, _updates(deltas, counts=[5, 1, 1, 1, 9]))
        np.testing.assert_allclose(params[0].numpy(), expected, rtol=1e-15, err_msg=repr(server))
    # Multi-Krum (num_clients_to_keep > 0): the sample-weighted mean of the kept models, as Flower's `aggregate`
    keep = np.argsort(_numpy_krum_scores(models, 1), kind="stable")[:2]
    w = np.array([5.0, 1, 1, 1, 9])[keep]
    params = [torch.tensor(x_t)]
    Krum(num_malicious_clients=1, num_clients_to_keep=2).server_update(params, _updates(deltas, counts=[5, 1, 1, 1, 9]))
    np.testing.assert_allclose(params[0].numpy(), (w[:, None] * models[keep]).sum(0) / w.sum(), rtol=1e-14)


def test_a_robust_reducer_in_front_of_another_server_rule():
    """The median as FedAvgM's and FedAdam's aggregator: their update rule runs on Δ_t = median_i Δ_i."""
    deltas = [[1.0], [2.0], [100.0]]
    for make in (lambda: FedAvgM(lr=0.5, momentum=0.9), lambda: FedAdam(lr=0.1, tau=1e-3)):
        robust, reference = make(), make()
        robust.aggregators = check_chain([CoordinateMedian()])
        p_robust, p_ref = [torch.zeros(1, dtype=torch.float64)], [torch.zeros(1, dtype=torch.float64)]
        for _ in range(3):
            assert robust.server_update(p_robust, _updates(deltas))[0].item() == 2.0
            reference.server_update(p_ref, _updates([[2.0]]))  # the median given directly
        assert torch.equal(p_robust[0], p_ref[0])
    # FedAvgM by hand: b_1 = -2, x_1 = 1; b_2 = 0.9·(-2) - 2 = -3.8, x_2 = 1 + 1.9 = 2.9
    server = FedAvgM(lr=0.5, momentum=0.9)
    server.aggregators = check_chain([CoordinateMedian()])
    params = [torch.zeros(1, dtype=torch.float64)]
    server.server_update(params, _updates(deltas))
    server.server_update(params, _updates(deltas))
    assert params[0].item() == pytest.approx(2.9, rel=1e-15)


def test_client_transforms_must_be_transforms():
    with pytest.raises(ValueError, match="`client_transforms` must hold client-update stages"):
        FedMedian(client_transforms=[CoordinateMedian()])
    server = FedMedian(client_transforms=[MaliciousClients(0.2)])
    assert [type(s).__name__ for s in server.aggregators] == ["MaliciousClients", "CoordinateMedian"]


# ------------------------------------------------------------------------------------------------ end to end
def _fit_regression(server, rounds=8):
    """Linear regression (y = x·w + 0.5 + N(0, 0.1²)), 20 clients, 10 per round, 1 local epoch of batch-10 SGD;
    returns the global model's MSE on all the training data."""
    torch.manual_seed(0)
    x, y = regression_data(n=400)
    X, Y = torch.tensor(x), torch.tensor(y)
    dm = FederatedDataModule(TensorDataset(X, Y), partitioner=IIDPartitioner(num_clients=20, seed=0),
                             clients_per_round=10, batch_size=10, seed=0)
    model = LinearRegression()
    FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs("/tmp/lf-robust")).fit(model, datamodule=dm)
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model.linear(X).squeeze(-1), Y).item()


def test_twenty_percent_scaled_update_attackers_break_the_mean_but_not_median_or_krum():
    """2 of the 10 clients per round send −10·Δ_i. Measured (8 rounds): initial MSE 5.25; clean FedAvg 0.018;
    attacked FedAvg 1.5e3 (the mean moves by (8 − 20)/10 = −1.2 times the honest mean: away from the optimum);
    attacked FedMedian 0.039; attacked Krum (f = 2) 0.043."""
    attackers = lambda: [MaliciousClients(0.2, attack="scale", scale=-10.0, seed=0)]  # noqa: E731
    clean = _fit_regression(FedAvg())
    mean = _fit_regression(FedAvg(aggregators=[*attackers(), WeightedMean()]))
    median = _fit_regression(FedMedian(client_transforms=attackers()))
    krum = _fit_regression(Krum(num_malicious_clients=2, client_transforms=attackers()))
    assert clean < 0.03
    assert mean > 100.0  # diverged: far above the initial 5.25
    assert median < 0.1 and krum < 0.1


# ------------------------------------------------------------------------------------------------ too few reports
KRUM_CLIENTS, KRUM_FAILING, KRUM_LR = 5, 3, 0.1


class _FailsInRoundOne(LinearRegression):
    """Client KRUM_FAILING raises in round 1 only (its data holds the marker 777 in the first feature)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.trainer.current_epoch == 1 and (x == 777.0).any():
            raise RuntimeError("simulated client failure")
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)


def _krum_data():
    x, y = regression_data(n=10 * KRUM_CLIENTS)
    ids = np.repeat(np.arange(KRUM_CLIENTS), 10)
    x[np.flatnonzero(ids == KRUM_FAILING)[0], 0] = 777.0
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids
    return x, y, ids, dataset


def test_a_round_with_too_few_reports_for_krum_is_skipped_counted_and_warned_not_the_end_of_the_run(tmp_path):
    """Krum with f = 1 needs K > 4 reports. 5 clients per round; client 3 fails in round 1, so round 1 has K = 4: it
    is skipped (model and server state unchanged, its 4 reports counted in ``round_clients_dropped`` with
    ``round_clients`` = 0, a warning naming the round, K and the requirement) and rounds 0 and 2 are Krum steps, checked against Krum written out in NumPy."""
    import csv

    from lightning.pytorch.loggers import CSVLogger

    from helpers import linear_weights, mse_grad
    from lightning_fed.datamodules import NaturalIdPartitioner

    x, y, ids, dataset = _krum_data()
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=KRUM_CLIENTS,
                             batch_size=100)
    model = _FailsInRoundOne(lr=KRUM_LR)
    w = linear_weights(model)
    server = Krum(num_malicious_clients=1)
    logger = CSVLogger(str(tmp_path), name="krum")
    trainer = FederatedTrainer(max_epochs=3, callbacks=[server], **(quiet_trainer_kwargs(tmp_path) | {"logger": logger}))
    with pytest.warns(UserWarning, match=r"Round 1: 4 clients reported back.*more than 2f \+ 2 = 4.*skipped"):
        trainer.fit(model, datamodule=dm)
    for round_idx in range(3):
        clients = [c for c in range(KRUM_CLIENTS) if not (round_idx == 1 and c == KRUM_FAILING)]
        if len(clients) <= 4:
            continue  # skipped: w unchanged
        deltas = np.array([-KRUM_LR * mse_grad(w, x[ids == c], y[ids == c]) for c in clients])
        w = w + deltas[int(np.argmin(_numpy_krum_scores(deltas, 1)))]
    np.testing.assert_allclose(linear_weights(model), w, rtol=1e-12, atol=1e-15)
    assert server.num_steps == 2  # the server step counter (and any server state) skipped round 1
    rows = [r for r in csv.DictReader(open(f"{logger.log_dir}/metrics.csv")) if r.get("round_clients")]
    assert [float(r["round_clients"]) for r in rows] == [5.0, 0.0, 5.0]
    assert [float(r["round_clients_dropped"]) for r in rows] == [0.0, 1.0 + 4.0, 0.0]  # the failure and the 4 reports
    assert math.isnan(float(rows[1]["round_train_loss"])) and math.isnan(float(rows[1]["round_pseudo_grad_norm"]))


@pytest.mark.parametrize(
    "server, match",
    [(Krum(num_malicious_clients=1), r"`clients_per_round`=4.*`num_malicious_clients`=1 needs more than 2f \+ 2 = 4"),
     (FedAvg(aggregators=[KrumReducer(num_malicious_clients=1)]), r"`clients_per_round`=4.*2f \+ 2 = 4"),
     (Krum(num_malicious_clients=0, num_clients_to_keep=5), r"`clients_per_round`=4.*`num_clients_to_keep` \(5\)")],
)
def test_krum_settings_no_round_could_satisfy_are_refused_at_fit_start(tmp_path, server, match):
    x, y, ids, dataset = _krum_data()
    dm = FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=5, seed=0), clients_per_round=4,
                             batch_size=100)
    model = LinearRegression()
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=match):
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 0  # refused before any client trained


# ------------------------------------------------------------------------------------------------ settings that do nothing
def _fit_warnings(tmp_path, server, clients_per_round, rounds=2):
    """Fit `rounds` rounds on 6 clients; returns the messages of the UserWarnings raised."""
    import warnings

    x, y = regression_data(n=60)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=clients_per_round,
                             batch_size=10)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(LinearRegression(), datamodule=dm)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("beta, clients_per_round, warned", [(0.2, 4, True), (0.2, 5, False), (0.0, 4, False),
                                                              (0.3, 3, True), (0.34, 3, False)])
def test_a_trimmed_mean_that_trims_nothing_warns_once_per_fit(tmp_path, beta, clients_per_round, warned):
    """⌊β·C⌋ = 0 (0.2·4 = 0.8, 0.3·3 = 0.9): every round's trimmed mean is the plain mean; one warning at fit start
    naming beta and clients_per_round. β = 0 asks for the plain mean: no warning."""
    messages = _fit_warnings(tmp_path, FedTrimmedAvg(beta=beta), clients_per_round)
    hits = [m for m in messages if "trims" in m and "`beta`" in m]
    assert len(hits) == (1 if warned else 0), messages
    if warned:
        assert f"`clients_per_round`={clients_per_round}" in hits[0] and "0 values" in hits[0]


def test_attackers_that_round_to_zero_warn_once_per_fit(tmp_path):
    """⌊0.2·4⌋ = 0 malicious clients per round: the simulated attack does nothing; one warning naming fraction."""
    messages = _fit_warnings(tmp_path, FedMedian(client_transforms=[MaliciousClients(0.2)]), clients_per_round=4)
    hits = [m for m in messages if "`fraction`" in m]
    assert len(hits) == 1 and "`clients_per_round`=4" in hits[0] and "0 malicious" in hits[0], messages
    messages = _fit_warnings(tmp_path, FedMedian(client_transforms=[MaliciousClients(0.2)]), clients_per_round=5)
    assert not [m for m in messages if "`fraction`" in m]
