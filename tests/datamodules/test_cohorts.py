"""The cohort sampler, one part of FederatedDataModule (#40 item 1): its checks, its settings report, its draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.cohorts import COHORT_SAMPLINGS, CohortSampler


def test_settings_report_and_repr():
    sampler = CohortSampler(clients_per_round=4, cohort_sampling="poisson", client_dropout=0.25)
    assert sampler.settings() == {"clients_per_round": 4, "cohort_sampling": "poisson", "client_dropout": 0.25,
                                  "over_selection": 0.0, "poisson_draws": "per_client"}
    assert set(CohortSampler.run_settings) == set(sampler.settings())
    assert repr(sampler).startswith("CohortSampler(clients_per_round=4, cohort_sampling='poisson'")


@pytest.mark.parametrize("kwargs, match", [
    ({"clients_per_round": 0}, "`clients_per_round` must be an integer >= 1"),
    ({"client_dropout": 1.0}, r"`client_dropout` must be a probability in \[0, 1\)"),
    ({"over_selection": -1}, "`over_selection` must be a finite number >= 0"),
    ({"cohort_sampling": "uniform"}, "`cohort_sampling` must be one of"),
    ({"cohort_sampling": "poisson", "over_selection": 0.5}, "needs cohort_sampling='fixed_size'"),
    ({"cohort_sampling": "sweep_then_uniform", "over_selection": 0.5}, "needs cohort_sampling='fixed_size'"),
    ({"cohort_sampling": "poisson", "poisson_draws": "fast"}, r"`poisson_draws` must be one of \('per_client', "
                                                              r"'binomial'\), got 'fast'"),
    ({"poisson_draws": "binomial"}, "`poisson_draws='binomial'` needs cohort_sampling='poisson' \\(got 'fixed_size'\\)"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CohortSampler(**kwargs)


def test_population_check_names_the_sizes():
    with pytest.raises(ValueError, match=r"`clients_per_round` \(5\) must not exceed the number of clients \(4\)"):
        CohortSampler(clients_per_round=5).check_population(4)


@pytest.mark.parametrize("sampling", COHORT_SAMPLINGS)
def test_the_data_module_draws_the_samplers_cohorts(sampling):
    """The data module composes the sampler: its cohorts are the sampler's, its attributes the sampler's settings."""
    dm = FederatedDataModule(TensorDataset(torch.zeros(60, 1)), partitioner=IIDPartitioner(30), clients_per_round=4,
                             cohort_sampling=sampling, client_dropout=0.2, seed=5)
    dm.setup()
    sampler = CohortSampler(4, sampling, 0.2, seed=5)
    assert dm.cohorts.settings() == sampler.settings() and dm.cohort_sampling == sampling
    for r in range(12):
        a, b = dm.select_cohort(r), sampler.select(r, 30)
        assert np.array_equal(a.cohort, b.cohort) and np.array_equal(a.candidates, b.candidates)
    assert dm.sweep_rounds == sampler.sweep_rounds(30) == (8 if sampling == "sweep_then_uniform" else 0)


def test_run_record_names_come_from_the_parts():
    """The checkpoint's run record and its names are the parts' reports (no list of data-module settings in
    checkpoint.py), in the order and with the names checkpoints were written with before #40."""
    from lightning_fed.checkpoint import RUN_CONFIG_NAMES

    assert RUN_CONFIG_NAMES == ("partitioner", "partition", "seed", "clients_per_round", "data_order", "drop_last",
                                "client_dropout", "over_selection", "cohort_sampling", "poisson_draws", "local_work",
                                "server_optimizer", "client_algorithms",
                                "device_model", "round_deadline", "deadline_policy",  # #53: only with a device model
                                "asynchronous")  # #54: only when on
    dm = FederatedDataModule(TensorDataset(torch.zeros(8, 1)), partitioner=IIDPartitioner(4), clients_per_round=2,
                             cohort_sampling="poisson", seed=3)
    assert dm.run_config() == {"seed": 3, "clients_per_round": 2, "data_order": "reshuffle", "drop_last": False,
                               "client_dropout": 0.0, "over_selection": 0.0, "cohort_sampling": "poisson",
                               "poisson_draws": "per_client"}
    assert dm.settings()["eval_fraction"] is None and dm.settings()["cohort_sampling"] == "poisson"


def test_record_defaults_come_from_the_parts():
    """A checkpoint from before ``cohort_sampling`` was recorded compares as "fixed_size": the default is the
    sampler's, not a list in checkpoint.py."""
    from lightning_fed.checkpoint import _RECORD_DEFAULTS

    assert FederatedDataModule.record_defaults() == {"cohort_sampling": "fixed_size", "poisson_draws": "per_client"}
    assert _RECORD_DEFAULTS["poisson_draws"] == "per_client"
    assert _RECORD_DEFAULTS["cohort_sampling"] == "fixed_size"


def test_binomial_poisson_draws_have_the_law_of_independent_per_client_draws():
    """``poisson_draws="binomial"`` (K ~ Bin(N, q), then a uniform K-subset) against the law of independent
    Bernoulli(q) draws, computed by hand: every client's inclusion frequency ≈ q, the mean and variance of |S| ≈ Nq and
    Nq(1 − q), and a pair's joint inclusion ≈ q² (independence). N = 20, q = 0.25, 20,000 rounds: binomial standard
    errors, 5 σ bounds."""
    n, c, rounds = 20, 5, 20_000
    q = c / n
    sampler = CohortSampler(clients_per_round=c, cohort_sampling="poisson", poisson_draws="binomial", seed=3)
    hits = np.zeros((rounds, n), dtype=bool)
    for r in range(rounds):
        cohort = sampler.select(r, n).cohort
        assert np.all(np.diff(cohort) > 0)  # distinct, in increasing id order (as "per_client")
        hits[r, cohort] = True
    freq = hits.mean(0)
    assert np.all(np.abs(freq - q) < 5 * np.sqrt(q * (1 - q) / rounds)), freq
    sizes = hits.sum(1)
    assert abs(sizes.mean() - n * q) < 5 * np.sqrt(n * q * (1 - q) / rounds)
    assert abs(sizes.var() / (n * q * (1 - q)) - 1) < 0.05
    both = (hits[:, 0] & hits[:, 1]).mean()
    assert abs(both - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / rounds)


def test_binomial_poisson_draws_at_a_million_clients():
    """At N = 10^6, q = 10^-5: the round's cohort is a pure function of (seed, round), int64, about C = 10 clients on
    average, and other clients than "per_client"'s draws (its speed: benchmarks/partition_scale.py)."""
    fast = CohortSampler(clients_per_round=10, cohort_sampling="poisson", poisson_draws="binomial", seed=0)
    exact = CohortSampler(clients_per_round=10, cohort_sampling="poisson", seed=0)
    a, b = fast.select(7, 1_000_000), fast.select(7, 1_000_000)
    assert np.array_equal(a.cohort, b.cohort) and a.cohort.dtype == np.int64
    assert not np.array_equal(a.cohort, exact.select(7, 1_000_000).cohort)
    sizes = [len(fast.select(r, 1_000_000).cohort) for r in range(200)]
    assert 8 < np.mean(sizes) < 12


# --- availability (issue #53 item 3): a client offline at the round's start is not sampled ---------------------------

def reference_online_cohort(seed: int, round_idx: int, n: int, c: int, online: set) -> tuple[list, int]:
    """The documented rejection sampling, from NumPy's draws by hand: the C-draw without availability, then one
    permutation of all n (n small) with the clients already drawn skipped; the first c online clients of that order,
    and how many offline clients came before the c-th."""
    rng = np.random.default_rng([seed, 0x5A3D, round_idx])
    order = rng.choice(n, size=c, replace=False).tolist()
    if sum(i in online for i in order) < c:
        order += [i for i in rng.permutation(n).tolist() if i not in order]
    cohort, offline = [], 0
    for i in order:
        if len(cohort) == c:
            break
        if i in online:
            cohort.append(i)
        else:
            offline += 1
    return cohort, offline


def test_offline_clients_are_not_sampled_hand_checked_order():
    online = {1, 3, 4}
    sampler = CohortSampler(clients_per_round=2, seed=0)
    is_online = lambda ids: np.isin(ids, sorted(online))  # noqa: E731
    for r in range(40):
        selection = sampler.select(r, 6, is_online)
        assert (selection.cohort.tolist(), selection.offline) == reference_online_cohort(0, r, 6, 2, online), r
    # round 0 by hand: NumPy draws [3, 1] first (both online: nothing else drawn)
    assert sampler.select(0, 6).cohort.tolist() == [3, 1] == sampler.select(0, 6, is_online).cohort.tolist()


def test_each_round_is_uniform_among_the_online_clients():
    """The law: every pair of the 3 online clients among 6 equally likely (1/3 each), offline clients never; 1,500
    rounds, 5 σ binomial bounds."""
    online, rounds = [1, 3, 4], 1500
    sampler = CohortSampler(clients_per_round=2, seed=5)
    counts: dict = {}
    for r in range(rounds):
        pair = tuple(sorted(sampler.select(r, 6, lambda ids: np.isin(ids, online)).cohort.tolist()))
        counts[pair] = counts.get(pair, 0) + 1
    assert set(counts) == {(1, 3), (1, 4), (3, 4)}
    p = 1 / 3
    assert all(abs(k / rounds - p) < 5 * np.sqrt(p * (1 - p) / rounds) for k in counts.values()), counts


def test_everyone_online_gives_the_cohorts_of_no_availability():
    everyone = lambda ids: np.ones(len(ids), dtype=bool)  # noqa: E731
    for kwargs in ({}, {"client_dropout": 0.3, "over_selection": 0.5}, {"cohort_sampling": "poisson"},
                   {"cohort_sampling": "sweep_then_uniform"}):
        sampler = CohortSampler(clients_per_round=3, seed=2, **kwargs)
        for r in range(6):
            a, b = sampler.select(r, 10, everyone), sampler.select(r, 10)
            assert a.cohort.tolist() == b.cohort.tolist() and a.candidates.tolist() == b.candidates.tolist()
            assert (a.unavailable, a.offline) == (b.unavailable, 0)


def test_poisson_and_sweep_leave_the_offline_clients_out():
    online = lambda ids: ids % 2 == 0  # noqa: E731
    for sampling in ("poisson", "sweep_then_uniform"):
        sampler = CohortSampler(clients_per_round=4, cohort_sampling=sampling, seed=1)
        for r in range(3):
            plain, selection = sampler.select(r, 12), sampler.select(r, 12, online)
            assert selection.cohort.tolist() == [c for c in plain.cohort.tolist() if c % 2 == 0]
            assert selection.offline == sum(c % 2 for c in plain.candidates.tolist())


def test_too_few_online_small_population_gives_a_smaller_cohort():
    selection = CohortSampler(clients_per_round=3, seed=0).select(0, 8, lambda ids: ids == 6)
    assert selection.cohort.tolist() == [6] and selection.offline == 7
    assert CohortSampler(clients_per_round=3, seed=0).select(0, 8, lambda ids: ids < 0).cohort.tolist() == []


def test_availability_at_a_million_clients_asks_o_cohort_clients():
    asked = []

    def half_online(ids):
        asked.append(len(ids))
        return ids % 2 == 0

    selection = CohortSampler(clients_per_round=10, seed=0).select(5, 1_000_000, half_online)
    assert len(selection.cohort) == 10 and np.all(selection.cohort % 2 == 0)
    assert sum(asked) <= 10 + 64  # the C-draw, then one block
    with pytest.raises(RuntimeError, match=r"Round 5: only \d+ of the 10000 clients drawn were online at the round's "
                                           r"start, fewer than the 10 the cohort needs"):
        CohortSampler(clients_per_round=10, seed=0).select(5, 1_000_000, lambda ids: ids % 5000 == 0)


def test_the_offline_clients_drawn_are_named_and_average_the_negative_hypergeometric_mean():
    """``offline_ids``: the offline clients drawn before the cohort was full, in draw order (the reference's order of
    draws); their count per round (``clock/offline_at_selection``) has the negative hypergeometric mean
    r·(N − K)/(K + 1) for the r-th online draw of a uniform random order of N clients, K online (r = 3, N = 40,
    K = 10: 90/11), its variance r(N − K)(N + 1)(K − r + 1)/((K + 1)²(K + 2)); 1,200 rounds, 5 σ bounds."""
    online, n, r, rounds = set(range(0, 40, 4)), 40, 3, 1200
    sampler = CohortSampler(clients_per_round=r, seed=3)
    is_online = lambda ids: np.isin(ids, sorted(online))  # noqa: E731
    counts = []
    for t in range(rounds):
        selection = sampler.select(t, n, is_online)
        rng = np.random.default_rng([3, 0x5A3D, t])  # the reference's order of draws
        order = rng.choice(n, size=r, replace=False).tolist()
        if sum(i in online for i in order) < r:
            order += [i for i in rng.permutation(n).tolist() if i not in order]
        third = [k for k, i in enumerate(order) if i in online][r - 1]
        assert selection.offline_ids.tolist() == [i for i in order[:third] if i not in online], t
        counts.append(selection.offline)
    k = len(online)
    mean, var = r * (n - k) / (k + 1), r * (n - k) * (n + 1) * (k - r + 1) / ((k + 1) ** 2 * (k + 2))
    assert abs(np.mean(counts) - mean) < 5 * np.sqrt(var / rounds), (np.mean(counts), mean)
