"""User-level DP: the DP-FedAvg stages (lightning_fed/server/aggregators/dp.py), the accountant
(lightning_fed/server/privacy.py) and the ready-made DP server optimizers (lightning_fed/callbacks/dp.py)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import rdp
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import DPFedAdam, DPFedAvg, FedAdam, FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import (
    AdaptiveClip,
    ClientDeltas,
    ClipUpdates,
    DPMean,
    EmptyState,
    GaussianNoise,
    RoundInfo,
    check_chain,
    update_noise_multiplier,
)
from lightning_fed.server.privacy import PrivacyAccountant


def _dm(num_clients=6, clients_per_round=3):
    x, y = regression_data(n=60)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
                               clients_per_round=clients_per_round, batch_size=4)


def _fit(server, rounds=3, tmp="/tmp/lf-dp", **trainer_kwargs):
    torch.manual_seed(0)
    model = LinearRegression()
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs(tmp), **trainer_kwargs)
    trainer.fit(model, datamodule=_dm())
    return [p.detach().clone() for p in model.parameters()], trainer


def _deltas(norms, dim=7, seed=0):
    """Client updates of two parameters each with the given global L2 norms."""
    g = np.random.default_rng(seed)
    out = []
    for n in norms:
        v = g.standard_normal(dim)
        v *= n / np.linalg.norm(v)
        out.append([torch.tensor(v[:3], dtype=torch.float32), torch.tensor(v[3:], dtype=torch.float32).reshape(2, 2)])
    return ClientDeltas(list(range(len(norms))), out, torch.ones(len(norms), dtype=torch.float64))


# ------------------------------------------------------------------------------------------- σ = 0, S = ∞ is FedAvg
@pytest.mark.parametrize("dp, plain", [
    (lambda: DPFedAvg(clip_norm=math.inf, noise_multiplier=0.0, target_delta=1e-5), lambda: FedAvg(weighting="uniform")),
    (lambda: DPFedAdam(clip_norm=math.inf, noise_multiplier=0.0, target_delta=1e-5, lr=0.05, tau=1e-2),
     lambda: FedAdam(lr=0.05, tau=1e-2, weighting="uniform")),
])
def test_no_noise_no_clipping_equals_the_plain_optimizer_bit_for_bit(dp, plain):
    a, trainer = _fit(dp())
    b, _ = _fit(plain())
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert trainer.callback_metrics["privacy/epsilon"] == math.inf


def test_the_dp_chain_on_an_adaptive_optimizer_set_after_construction():
    """'Works with every rule': a plain FedAdam given the chain equals DPFedAdam with the same σ, S (same seeds)."""
    a, _ = _fit(DPFedAdam(clip_norm=0.05, noise_multiplier=0.5, target_delta=1e-5, lr=0.05, tau=1e-2))
    server = FedAdam(lr=0.05, tau=1e-2, weighting="uniform")
    clip = ClipUpdates(0.05)
    server.aggregators = check_chain([clip, DPMean(), GaussianNoise(0.5, clip)])
    b, _ = _fit(server)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    c, _ = _fit(FedAdam(lr=0.05, tau=1e-2, weighting="uniform"))
    assert not torch.equal(a[0], c[0])  # the noise and clipping did something


# ------------------------------------------------------------------------------------------------------- clipping
def test_clipping_bounds_every_contribution_and_matches_numpy():
    x = _deltas([0.3, 2.0, 5.0, 1.0, 40.0])
    s = 1.0
    out, _ = ClipUpdates(s).apply(x, EmptyState(), RoundInfo(0, 0, 10, 5))
    for d in out.deltas:
        assert float(torch.sqrt(sum((t.double() ** 2).sum() for t in d))) <= s
    flat = np.stack([np.concatenate([t.numpy().ravel().astype(np.float64) for t in d]) for d in x.deltas])
    norms = np.linalg.norm(flat, axis=1)
    clipped = flat * np.minimum(1.0, s / norms)[:, None]
    got = np.stack([np.concatenate([t.numpy().ravel() for t in d]) for d in out.deltas])
    np.testing.assert_allclose(got, clipped, rtol=1e-6, atol=1e-7)
    assert out.deltas[0] is x.deltas[0]  # under the clip: untouched
    mean, _ = DPMean().apply(out, EmptyState(), RoundInfo(0, 0, 10, 8))  # expected cohort C = 8, 5 reported
    np.testing.assert_allclose(np.concatenate([t.numpy().ravel() for t in mean]), clipped.sum(0) / 8, rtol=1e-6, atol=1e-7)


def test_dp_mean_refuses_sample_weights():
    x = _deltas([1.0, 1.0])._replace(counts=torch.tensor([1.0, 3.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="weighting='uniform'"):
        DPMean().apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))


def test_small_clip_in_a_fit_bounds_every_update_seen_by_the_reducer():
    seen = []

    class Spy(DPMean):
        def apply(self, x, state, info):
            seen.extend(float(torch.sqrt(sum((t.double() ** 2).sum() for t in d))) for d in x.deltas)
            return super().apply(x, state, info)

    server = DPFedAvg(clip_norm=1e-3, noise_multiplier=0.0, target_delta=1e-5)
    server.aggregators[1] = Spy()
    _fit(server, rounds=2)
    assert len(seen) == 6 and max(seen) <= 1e-3 and min(seen) > 0.99e-3  # all clipped (their updates are larger)


# --------------------------------------------------------------------------------------------------------- noise
def test_noise_std_matches_sigma_s_over_c_and_repeats_by_seed():
    sigma, s, c = 1.3, 0.7, 5
    stage = GaussianNoise(sigma, s)
    draws = []
    for r in range(2000):
        out, _ = stage.apply([torch.zeros(3, dtype=torch.float64)], stage.init_state([], 50), RoundInfo(r, 7, 50, c))
        draws.append(out[0].numpy())
    draws = np.concatenate(draws)  # 6000 draws: std within ~1% (3 sampling SEs = 3/sqrt(2·6000) ≈ 2.7%)
    expected = sigma * s / c
    assert abs(draws.std() / expected - 1) < 0.03
    assert abs(draws.mean()) < 4 * expected / math.sqrt(draws.size)
    again, _ = stage.apply([torch.zeros(3, dtype=torch.float64)], stage.init_state([], 50), RoundInfo(1999, 7, 50, c))
    assert np.array_equal(again[0].numpy(), draws[-3:])
    other, _ = stage.apply([torch.zeros(3, dtype=torch.float64)], stage.init_state([], 50), RoundInfo(1999, 8, 50, c))
    assert not np.array_equal(other[0].numpy(), draws[-3:])


def test_a_noised_fit_repeats_exactly():
    make = lambda: DPFedAvg(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-5)  # noqa: E731
    a, _ = _fit(make())
    b, _ = _fit(make())
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# ---------------------------------------------------------------------------------------------- adaptive clipping
def test_adaptive_clipping_tracks_the_target_quantile():
    """Norms uniform on [0, 10], γ = 0.5 → S → the median 5; γ = 0.8 → 8 (Andrew et al. 2021, Alg. 1)."""
    g = np.random.default_rng(0)
    for gamma, quantile in ((0.5, 5.0), (0.8, 8.0)):
        stage = AdaptiveClip(gamma, learning_rate=0.2, initial_clip=0.1, count_stddev=100 / 20)
        state = stage.init_state([], 1000)
        tail = []
        for r in range(400):
            x = ClientDeltas(list(range(100)), [[torch.tensor([v])] for v in g.uniform(0, 10, 100)],
                             torch.ones(100, dtype=torch.float64))
            out, state = stage.apply(x, state, RoundInfo(r, 0, 1000, 100))
            if r >= 300:
                tail.append(float(state.clip_norm))
        assert abs(np.mean(tail) - quantile) < 0.3, (gamma, np.mean(tail))
        assert all(abs(float(d[0])) <= stage.round_clip_norm() for d in out.deltas)


def test_adaptive_clip_one_step_by_hand():
    x = _deltas([0.5, 2.0, 3.0, 0.1])
    stage = AdaptiveClip(0.5, learning_rate=0.2, initial_clip=1.0, count_stddev=0.0)
    _, state = stage.apply(x, stage.init_state([], 10), RoundInfo(0, 0, 10, 4))
    assert float(state.clip_norm) == pytest.approx(1.0 * math.exp(-0.2 * (2 / 4 - 0.5)))
    _, state = stage.apply(_deltas([0.5, 0.2, 0.3, 0.1]), state, RoundInfo(1, 0, 10, 4))
    assert float(state.clip_norm) == pytest.approx(math.exp(-0.2 * (1.0 - 0.5)))


def test_update_noise_multiplier_theorem_1():
    z, sb = 1.0, 2.0
    s = update_noise_multiplier(z, sb)
    assert (s ** -2 + (2 * sb) ** -2) ** -0.5 == pytest.approx(z)
    with pytest.raises(ValueError, match="count_stddev"):
        update_noise_multiplier(1.0, 0.4)


# ---------------------------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("n, c, sigma, rounds, delta", [(100, 10, 1.0, 20, 1e-5), (715, 10, 0.8, 15, 7e-4)])
def test_epsilon_is_the_library_answer(n, c, sigma, rounds, delta):
    lib = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    lib.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, c, dp_accounting.GaussianDpEvent(sigma / 2)), rounds)
    acc = PrivacyAccountant(sigma, n, c, "fixed_size")
    acc.step(rounds)
    assert acc.epsilon(delta) == lib.get_epsilon(delta)
    lib = rdp.RdpAccountant()
    lib.compose(dp_accounting.PoissonSampledDpEvent(c / n, dp_accounting.GaussianDpEvent(sigma)), rounds)
    assert PrivacyAccountant(sigma, n, c, "poisson").epsilon(delta, rounds) == lib.get_epsilon(delta)


@pytest.mark.parametrize("sampling", ["fixed_size", "poisson"])
@pytest.mark.parametrize("accounting", ["rdp", "pld"])
@pytest.mark.parametrize("n, c, sigma, rounds, delta", [(100, 10, 1.0, 20, 1e-5), (1154, 10, 1.0, 15, 7e-4)])
def test_epsilon_of_every_sampling_and_accounting_is_the_library_answer(sampling, accounting, n, c, sigma, rounds,
                                                                         delta):
    """#31 item 19: each (sampling, accounting) pair is dp-accounting's answer for its event, built here directly:
    fixed-size cohorts are sampling without replacement under replace-one (RDP: the library's sampled-without-
    replacement event with σ/2; PLD: the dominating pair γ·N(1, (σ/2)²) + (1 − γ)·N(0, (σ/2)²) vs N(0, (σ/2)²),
    the library's Poisson event of σ/2 under add-or-remove-one); Poisson cohorts are the Poisson event of σ under
    add-or-remove-one."""
    add_remove = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if accounting == "rdp" and sampling == "fixed_size":
        lib = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        event = dp_accounting.SampledWithoutReplacementDpEvent(n, c, dp_accounting.GaussianDpEvent(sigma / 2))
    else:
        lib = (rdp.RdpAccountant if accounting == "rdp" else dp_accounting.pld.PLDAccountant)(neighboring_relation=add_remove)
        base = sigma / 2 if sampling == "fixed_size" else sigma
        event = dp_accounting.PoissonSampledDpEvent(c / n, dp_accounting.GaussianDpEvent(base))
    lib.compose(event, rounds)
    acc = PrivacyAccountant(sigma, n, c, sampling, accounting)
    acc.step(rounds)
    assert acc.epsilon(delta) == lib.get_epsilon(delta)
    assert acc.state_dict()["accounting"] == accounting
    if accounting == "pld":  # PLD is the tighter of the two for the same rounds
        assert acc.epsilon(delta) < PrivacyAccountant(sigma, n, c, sampling, "rdp").epsilon(delta, rounds)


def test_pld_dominating_pair_for_fixed_size_cohorts_by_hand():
    """One round, fixed-size cohort: for the pair (γP + (1 − γ)Q, Q) with P = N(1, s²), Q = N(0, s²), s = σ/2,
    δ(ε') = γ·δ_PQ(ε) with e^ε' = 1 + γ(e^ε − 1) (Balle, Barthe & Gaboardi 2018, Thm. 2 and Thm. 10), and the
    Gaussian's δ_PQ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2), μ = 1/s (Balle & Wang 2018, Thm. 8)."""
    from scipy.stats import norm

    n, c, sigma = 1154, 10, 1.0
    gamma, mu = c / n, 2.0 / sigma
    eps = PrivacyAccountant(sigma, n, c, "fixed_size", "pld").epsilon(7e-4, 1)
    base = math.log1p(math.expm1(eps) / gamma)
    delta = gamma * (norm.cdf(-base / mu + mu / 2) - math.exp(base) * norm.cdf(-base / mu - mu / 2))
    assert delta == pytest.approx(7e-4, rel=2e-3)  # PLD's discretisation is pessimistic: ε slightly above exact


def test_accountant_bad_arguments():
    with pytest.raises(ValueError, match="sampling"):
        PrivacyAccountant(1.0, 10, 2, "shuffle")
    with pytest.raises(ValueError, match="clients_per_round"):
        PrivacyAccountant(1.0, 10, 20)
    with pytest.raises(ValueError, match="delta"):
        PrivacyAccountant(1.0, 10, 2).epsilon(0.0, 1)


def test_epsilon_is_logged_every_round_and_target_epsilon_stops_the_run(tmp_path):
    sigma, delta = 2.0, 1e-3
    per_round = [PrivacyAccountant(sigma, 6, 3).epsilon(delta, t) for t in range(1, 8)]
    target = (per_round[2] + per_round[3]) / 2  # 3 rounds fit, a 4th would not
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=sigma, target_delta=delta, target_epsilon=target)
    logged = []

    from lightning.pytorch.callbacks import Callback

    class Record(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            logged.append(float(trainer.callback_metrics["privacy/epsilon"]))

    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=7, callbacks=[server, Record()], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=_dm())
    assert trainer.current_epoch == 3 and server.accountant.rounds == 3
    assert logged == pytest.approx(per_round[:3], rel=1e-6)  # logged as float32
    with pytest.raises(ValueError, match="target_epsilon"):
        FederatedTrainer(max_epochs=2, callbacks=[DPFedAvg(0.1, sigma, delta, target_epsilon=per_round[0] / 2)],
                         **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=_dm())


def _poisson_dm(num_clients=6, clients_per_round=3, seed=0):
    x, y = regression_data(n=60)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
                               clients_per_round=clients_per_round, batch_size=4, cohort_sampling="poisson", seed=seed)


@pytest.mark.parametrize("server", [
    lambda: DPFedAvg(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3),
    lambda: DPFedAdam(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, sampling="fixed_size", accounting="pld"),
])
def test_fixed_size_accounting_is_refused_for_poisson_cohorts_at_fit_start(tmp_path, server):
    """#31 item 19: the replace-one fixed-size analysis does not hold for Poisson cohorts: refused before round 0."""
    torch.manual_seed(0)
    model = LinearRegression()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match="`sampling='fixed_size'` but FederatedDataModule has "
                                         "cohort_sampling='poisson'.*use sampling='poisson'"):
        trainer.fit(model, datamodule=_poisson_dm())
    assert trainer.current_epoch == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("accounting", ["rdp", "pld"])
def test_poisson_dp_run_logs_the_poisson_epsilon(tmp_path, accounting):
    """A DP run on Poisson cohorts: ε after each round is dp-accounting's Poisson-sampled Gaussian, q = C/N, under
    add-or-remove-one, from the chosen accountant; the accountant's state and the checkpoint record say so."""
    from lightning.pytorch.callbacks import Callback

    from lightning_fed.checkpoint import run_config

    logged = []

    class Record(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            logged.append(float(trainer.callback_metrics["privacy/epsilon"]))

    dm = _poisson_dm(seed=4)
    dm.setup()
    assert [len(dm.sample_clients(r)) for r in range(3)] == [3, 6, 5]  # this seed: no empty round, one of all N
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, sampling="poisson",
                      accounting=accounting)
    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=3, callbacks=[server, Record()], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=dm)
    lib_kind = rdp.RdpAccountant if accounting == "rdp" else dp_accounting.pld.PLDAccountant
    expected = []
    for t in (1, 2, 3):
        lib = lib_kind(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        lib.compose(dp_accounting.PoissonSampledDpEvent(3 / 6, dp_accounting.GaussianDpEvent(1.0)), t)
        expected.append(lib.get_epsilon(1e-3))
    assert logged == pytest.approx(expected, rel=1e-6)  # logged as float32
    assert server.state_dict()["privacy"] | {"rounds": 3} == server.state_dict()["privacy"]
    assert server.state_dict()["privacy"]["sampling"] == "poisson"
    config = run_config(trainer)
    assert config["cohort_sampling"] == "poisson" and config["server_optimizer.accounting"] == accounting


def test_poisson_dp_mean_divides_by_the_expected_cohort_size(tmp_path):
    """Under Poisson sampling the DP mean is Σ_i clip(Δ_i) / (qN) whatever the cohort's size (McMahan et al. 2018,
    Alg. 1, the fixed denominator): seed 3's round 0 samples one client of N = 6 with qN = 3, so with σ = 0 and no
    clipping the step is a third of FedAvg's on the same cohort (its mean of one client is Δ_1)."""
    dm = _poisson_dm(seed=3)
    dm.setup()
    assert dm.sample_clients(0).tolist() == [1]
    steps = []
    for server in (DPFedAvg(clip_norm=math.inf, noise_multiplier=0.0, target_delta=1e-3, sampling="poisson"),
                   FedAvg(weighting="uniform")):
        torch.manual_seed(0)
        model = LinearRegression()
        x0 = [p.detach().clone() for p in model.parameters()]
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(
            model, datamodule=_poisson_dm(seed=3))
        steps.append([p.detach() - a for p, a in zip(model.parameters(), x0)])
    for dp_step, avg_step in zip(*steps):
        torch.testing.assert_close(dp_step, avg_step / 3)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("seed, sizes", [(0, [4, 2, 0]), (22, [0, 3, 5])])
def test_empty_poisson_round_releases_the_noise_alone_and_is_composed(tmp_path, adaptive, seed, sizes):
    """The Poisson analysis composes the noised sum of whoever was sampled, nobody included: a round with an empty
    cohort must still release N(0, σ²S²)/(qN) and count as a round. Seed 0 samples nobody in round 2, seed 22 nobody
    in round 0 (N = 6, q = 1/2): the model moves by exactly the round's seeded noise (DPFedAvg, η = 1), and ε is that
    of three rounds."""
    from lightning_fed.server.aggregators import RoundInfo
    from lightning_fed.server.aggregators.dp import _NOISE_TAG, round_generator

    dm = _poisson_dm(seed=seed)
    dm.setup()
    assert [len(dm.sample_clients(r)) for r in range(3)] == sizes
    empty = sizes.index(0)
    kwargs = dict(adaptive_clipping=True, count_stddev=1.0) if adaptive else {}
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, sampling="poisson", **kwargs)
    torch.manual_seed(0)
    model = LinearRegression()
    seen, seen_clips = [], []

    from lightning.pytorch.callbacks import Callback

    class Record(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            seen.append([p.detach().clone() for p in pl_module.parameters()])
            state = server.aggregator_state
            seen_clips.append(float(state[0].clip_norm) if adaptive and state is not None else 0.1)

    trainer = FederatedTrainer(max_epochs=3, callbacks=[server, Record()], **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match=f"Round {empty}: no client reported back; the server stepped with the DP noise"):
        trainer.fit(model, datamodule=dm)
    assert server.accountant.rounds == 3 and server.num_steps == 3
    lib = rdp.RdpAccountant()
    lib.compose(dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(server.noise_multiplier)), 3)
    assert float(trainer.callback_metrics["privacy/epsilon"]) == pytest.approx(lib.get_epsilon(1e-3), rel=1e-6)
    seen.append([p.detach() for p in model.parameters()])
    clip = seen_clips[empty]  # S of the empty round (adaptive: S_0 = 0.1 moved by the rounds before it)
    std = server.aggregators[2].noise_multiplier * clip / 3  # σ_Δ·S/(qN)
    gen = round_generator(RoundInfo(empty, seed, 6, 3), _NOISE_TAG)
    for before, now in zip(seen[empty], seen[empty + 1]):
        noise = torch.randn(before.shape, generator=gen, dtype=before.dtype) * std
        torch.testing.assert_close(now - before, noise, rtol=1e-4, atol=0.0)


def test_poisson_accounting_is_refused_for_fixed_size_cohorts(tmp_path):
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, sampling="poisson")
    with pytest.raises(ValueError, match="sampling='fixed_size'"):
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(
            LinearRegression(), datamodule=_dm())


@pytest.mark.parametrize("kwargs, match", [
    (dict(clip_norm=0.0), "clip_norm"), (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(target_delta=1.0), "target_delta"), (dict(sampling="shuffle"), "sampling"),
    (dict(accounting="prv"), "`accounting` must be one of \\('rdp', 'pld'\\)"),
    (dict(clip_norm=math.inf), "finite"), (dict(noise_multiplier=0.0, target_epsilon=1.0), "target_epsilon"),
    (dict(adaptive_clipping=True, target_quantile=1.5), "target_quantile"),
    (dict(adaptive_clipping=True, count_stddev=0.1), "count_stddev"),
])
def test_bad_arguments_are_refused(kwargs, match):
    args = dict(clip_norm=1.0, noise_multiplier=1.0, target_delta=1e-5) | kwargs
    with pytest.raises(ValueError, match=match):
        DPFedAvg(**args)


# ---------------------------------------------------------------------------------------------------- checkpoints
def test_accountant_and_adaptive_clip_state_round_trip(tmp_path):
    """Two rounds, a checkpoint, resume to four = four rounds straight: same model, clip norm and ε."""
    make = lambda: DPFedAvg(clip_norm=0.05, noise_multiplier=1.0, target_delta=1e-3, adaptive_clipping=True,  # noqa: E731
                            count_stddev=1.0)
    straight_server = make()
    straight, _ = _fit(straight_server, rounds=4, tmp=tmp_path / "a")
    first = make()
    _, first_trainer = _fit(first, rounds=2, tmp=tmp_path / "b")
    saved = first.state_dict()
    assert saved["privacy"]["rounds"] == 2 and saved["aggregators"][2]["rounds"].item() == 2
    assert saved["aggregators"][0]["clip_norm"].dtype == torch.float64
    ckpt = tmp_path / "mid.ckpt"
    first_trainer.save_checkpoint(ckpt)
    torch.manual_seed(0)
    model = LinearRegression()
    resumed = make()
    trainer = FederatedTrainer(max_epochs=4, callbacks=[resumed], **quiet_trainer_kwargs(tmp_path / "c"))
    trainer.fit(model, datamodule=_dm(), ckpt_path=ckpt)
    for x, y in zip(straight, model.parameters()):
        assert torch.equal(x, y)
    assert resumed.accountant.rounds == 4 == int(resumed.aggregator_state[2].rounds)
    assert torch.equal(resumed.aggregator_state[0].clip_norm, straight_server.aggregator_state[0].clip_norm)
    assert float(trainer.callback_metrics["privacy/epsilon"]) == pytest.approx(
        PrivacyAccountant(1.0, 6, 3).epsilon(1e-3, 4), rel=1e-6)


def test_resume_with_other_privacy_parameters_is_refused():
    acc = PrivacyAccountant(1.0, 10, 2)
    acc.step(3)
    with pytest.raises(ValueError, match="noise_multiplier"):
        PrivacyAccountant(2.0, 10, 2).load_state_dict(acc.state_dict())


# ------------------------------------------------------------------------------------------------------ executors
def test_vectorized_executor_gives_the_sequential_result():
    make = lambda: DPFedAvg(clip_norm=0.05, noise_multiplier=1.0, target_delta=1e-3)  # noqa: E731
    seq, _ = _fit(make(), rounds=1)
    vec, _ = _fit(make(), rounds=1, client_executor="vectorized")
    for x, y in zip(seq, vec):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_two_gloo_processes_equal_one_with_dp(tmp_path):
    """DDP executor: every rank draws the same seeded noise, so 2 processes end where 1 does (as tests/test_distributed.py)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.test_distributed import SCRIPT

    dp = "DPFedYogi(clip_norm=0.05, noise_multiplier=1.0, target_delta=1e-3, adaptive_clipping=True, count_stddev=1.0, lr=0.05)"
    script = tmp_path / "train.py"
    text = SCRIPT.format(tests=str(Path(__file__).parents[2])).replace("import FedYogi", "import DPFedYogi")
    script.write_text(text.replace("FedYogi(lr=0.05)", dp))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for devices in (1, 2):
        subprocess.run([sys.executable, str(script), str(tmp_path / f"w{devices}.pt"), str(devices)], check=True,
                       env=env, cwd=tmp_path, capture_output=True, timeout=300)
    one = torch.load(tmp_path / "w1.pt", weights_only=True)
    two = torch.load(tmp_path / "w2.pt", weights_only=True)
    assert two["world_size"] == 2
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------- #31: guarantees at the edges
def _library_epsilon(segments, delta):
    """ε of ``segments`` [(σ, N, C, rounds)] of fixed-size cohorts, computed with dp-accounting directly (replace-one,
    sampling without replacement, σ/2: Wang, Balle & Kasiviswanathan 2019)."""
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for sigma, n, c, rounds in segments:
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, c, dp_accounting.GaussianDpEvent(sigma / 2)),
                    rounds)
    return float(acc.get_epsilon(delta))


class _RecordEpsilon:
    """A callback recording privacy/epsilon after every round (placed after the server optimizer)."""

    def __new__(cls):
        from lightning.pytorch.callbacks import Callback

        class Record(Callback):
            def __init__(self):
                self.logged = []

            def on_train_epoch_end(self, trainer, pl_module):
                self.logged.append(float(trainer.callback_metrics["privacy/epsilon"]))

        return Record()


def test_31_1_min_epochs_beyond_target_epsilon_is_refused_at_fit_start(tmp_path):
    """#31 item 1: Lightning ignores should_stop until min_epochs; a min_epochs that target_epsilon cannot cover is
    refused before round 0 trains, naming both arguments and the largest min_epochs allowed."""
    sigma, delta = 2.0, 1e-3
    per_round = [_library_epsilon([(sigma, 6, 3, t)], delta) for t in range(1, 8)]
    target = (per_round[2] + per_round[3]) / 2  # 3 rounds fit, a 4th would not
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=sigma, target_delta=delta, target_epsilon=target)
    record = _RecordEpsilon()
    trainer = FederatedTrainer(max_epochs=7, min_epochs=5, callbacks=[server, record], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"target_epsilon.*min_epochs=5.*min_epochs <= 3"):
        trainer.fit(LinearRegression(), datamodule=_dm())
    assert record.logged == [] and server.accountant.rounds == 0  # nothing trained
    # min_epochs = 3 is allowed and the run stops there, never logging ε above the target
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=sigma, target_delta=delta, target_epsilon=target)
    record = _RecordEpsilon()
    trainer = FederatedTrainer(max_epochs=7, min_epochs=3, callbacks=[server, record], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=_dm())
    assert trainer.current_epoch == 3 and record.logged == pytest.approx(per_round[:3], rel=1e-6)
    assert max(record.logged) <= target


def test_31_1_min_epochs_is_checked_against_the_rounds_already_run_on_resume(tmp_path):
    """#31 item 1 on resume: 2 rounds run, target_epsilon allows 3 in all, min_epochs=5 is refused naming 3."""
    sigma, delta = 2.0, 1e-3
    per_round = [_library_epsilon([(sigma, 6, 3, t)], delta) for t in range(1, 8)]
    target = (per_round[2] + per_round[3]) / 2
    make = lambda **kw: DPFedAvg(clip_norm=0.1, noise_multiplier=sigma, target_delta=delta, **kw)  # noqa: E731
    _, trainer = _fit(make(), rounds=2, tmp=tmp_path / "a")
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    server = make(target_epsilon=target)
    trainer = FederatedTrainer(max_epochs=7, min_epochs=5, callbacks=[server],
                               allow_resume_changes=["server_optimizer.target_epsilon"], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"min_epochs=5.*min_epochs <= 3"):
        trainer.fit(LinearRegression(), datamodule=_dm(), ckpt_path=tmp_path / "mid.ckpt")
    assert server.accountant.rounds == 2


def test_31_1_a_stop_that_is_overridden_never_lets_epsilon_exceed_the_target(tmp_path):
    """#31 item 1: whatever keeps the run going after the stop (here a callback resetting should_stop), the round
    that would take ε above target_epsilon does not train: the run ends with an error before it."""
    from lightning.pytorch.callbacks import Callback

    sigma, delta = 2.0, 1e-3
    per_round = [_library_epsilon([(sigma, 6, 3, t)], delta) for t in range(1, 8)]
    target = (per_round[1] + per_round[2]) / 2  # 2 rounds fit

    class KeepGoing(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = False

    server = DPFedAvg(clip_norm=0.1, noise_multiplier=sigma, target_delta=delta, target_epsilon=target)
    record = _RecordEpsilon()
    trainer = FederatedTrainer(max_epochs=7, callbacks=[server, record, KeepGoing()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="target_epsilon"):
        trainer.fit(LinearRegression(), datamodule=_dm())
    assert server.accountant.rounds == 2 and record.logged == pytest.approx(per_round[:2], rel=1e-6)


def _resume(tmp_path, first, second, rounds=(2, 4), allow=("server_optimizer",)):
    """Train ``first`` for rounds[0] rounds, checkpoint, resume with ``second`` to rounds[1]; returns the trainer."""
    _, trainer = _fit(first, rounds=rounds[0], tmp=tmp_path / "a")
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)
    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=rounds[1], callbacks=[second], allow_resume_changes=list(allow),
                               **quiet_trainer_kwargs(tmp_path / "b"))
    trainer.fit(LinearRegression(), datamodule=_dm(), ckpt_path=ckpt)
    return trainer, ckpt


def test_31_3_privacy_history_survives_an_allowed_change_of_server_optimizer_class(tmp_path):
    """#31 item 3: DPFedAdam for 2 rounds, then DPFedYogi for 2: ε is that of 4 rounds (not of the last 2), and the
    history goes on into the next checkpoint."""
    from lightning_fed.callbacks import DPFedYogi

    sigma, delta = 1.0, 1e-3
    make = lambda cls: cls(clip_norm=0.1, noise_multiplier=sigma, target_delta=delta, lr=0.05)  # noqa: E731
    second = make(DPFedYogi)
    with pytest.warns(UserWarning, match="server optimizer changed"):
        trainer, _ = _resume(tmp_path, make(DPFedAdam), second)
    expected = _library_epsilon([(sigma, 6, 3, 4)], delta)
    assert float(trainer.callback_metrics["privacy/epsilon"]) == pytest.approx(expected, rel=1e-6)
    assert second.epsilon == pytest.approx(expected, rel=1e-9)
    # the history is in the new checkpoint: a third class resumes at 4 + 1 rounds
    ckpt = tmp_path / "late.ckpt"
    trainer.save_checkpoint(ckpt)
    third = make(DPFedAdam)
    trainer = FederatedTrainer(max_epochs=5, callbacks=[third], allow_resume_changes=["server_optimizer"],
                               **quiet_trainer_kwargs(tmp_path / "c"))
    trainer.fit(LinearRegression(), datamodule=_dm(), ckpt_path=ckpt)
    assert third.epsilon == pytest.approx(_library_epsilon([(sigma, 6, 3, 5)], delta), rel=1e-9)


def test_31_3_history_with_other_noise_composes_each_segment(tmp_path):
    """#31 item 3: the history keeps each segment's σ: DPFedAdam(σ=1) 2 rounds → DPFedYogi(σ=2) 1 round."""
    from lightning_fed.callbacks import DPFedYogi

    delta = 1e-3
    second = DPFedYogi(clip_norm=0.1, noise_multiplier=2.0, target_delta=delta, lr=0.05)
    _resume(tmp_path, DPFedAdam(clip_norm=0.1, noise_multiplier=1.0, target_delta=delta, lr=0.05), second,
            rounds=(2, 3))
    assert second.epsilon == pytest.approx(_library_epsilon([(1.0, 6, 3, 2), (2.0, 6, 3, 1)], delta), rel=1e-9)


def test_31_3_non_private_rounds_make_epsilon_infinite_with_a_warning(tmp_path):
    """#31 item 3: FedAdam for 2 rounds, then DPFedAdam: the model already released non-private rounds, so ε of the
    run is ∞ (with a warning saying why), not the ε of the private rounds."""
    second = DPFedAdam(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, lr=0.05)
    with pytest.warns(UserWarning, match=r"2 round\(s\).*without differential privacy.*ε = ∞"):
        trainer, _ = _resume(tmp_path, FedAdam(lr=0.05, weighting="uniform"), second)
    assert second.epsilon == math.inf
    assert float(trainer.callback_metrics["privacy/epsilon"]) == math.inf
    # ... also after DP → non-DP → DP
    third = DPFedAdam(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, lr=0.05)
    trainer, _ = _resume(tmp_path / "x", DPFedAdam(clip_norm=0.1, noise_multiplier=1.0, target_delta=1e-3, lr=0.05),
                         FedAdam(lr=0.05, weighting="uniform"), rounds=(1, 2))
    ckpt = tmp_path / "x" / "late.ckpt"
    trainer.save_checkpoint(ckpt)
    trainer = FederatedTrainer(max_epochs=3, callbacks=[third], allow_resume_changes=["server_optimizer"],
                               **quiet_trainer_kwargs(tmp_path / "y"))
    with pytest.warns(UserWarning, match="without differential privacy"):
        trainer.fit(LinearRegression(), datamodule=_dm(), ckpt_path=ckpt)
    assert third.epsilon == math.inf


@pytest.mark.parametrize("setting, value", [("target_quantile", 0.8), ("count_stddev", 2.0),
                                            ("clip_learning_rate", 0.5)])
def test_31_5_adaptive_clipping_settings_are_in_the_record_and_a_change_is_refused(tmp_path, setting, value):
    """#31 item 5: a resume that changes adaptive clipping's γ, σ_b or η_C is refused unless allowed."""
    kwargs = dict(clip_norm=0.05, noise_multiplier=1.0, target_delta=1e-3, adaptive_clipping=True, count_stddev=1.0)
    with pytest.raises(ValueError, match=f"server_optimizer.{setting}"):
        _resume(tmp_path, DPFedAvg(**kwargs), DPFedAvg(**(kwargs | {setting: value})), allow=())
    trainer, _ = _resume(tmp_path / "ok", DPFedAvg(**kwargs), DPFedAvg(**(kwargs | {setting: value})),
                         allow=[f"server_optimizer.{setting}"])
    assert trainer.current_epoch == 4


@pytest.mark.parametrize("make", [
    lambda: FedAvg(weighting="num_samples", aggregators=[ClipUpdates(0.1), DPMean(), GaussianNoise(1.0, 0.1)]),
    lambda: _dp_fedavgm(weighting="num_samples")[0],
])
def test_31_7_dp_stages_with_sample_weights_are_refused_at_fit_start(tmp_path, make):
    """#31 item 7: DPMean needs uniform weights; the refusal comes before round 0 trains, naming `weighting`."""
    from lightning.pytorch.callbacks import Callback

    started = []

    class Spy(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            started.append(trainer.current_epoch)

    trainer = FederatedTrainer(max_epochs=2, callbacks=[make(), Spy()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match="weighting='uniform'"):
        trainer.fit(LinearRegression(), datamodule=_dm())
    assert started == []


def _dp_fedavgm(weighting="uniform"):
    """The class doc's DPFedAvgM (the DP mixin on FedAvgM) with the given ``weighting`` (set after construction
    when it is not uniform: the mixin refuses it at construction already)."""
    from lightning_fed.callbacks import FedAvgM
    from lightning_fed.callbacks.dp import DifferentialPrivacy

    class DPFedAvgM(DifferentialPrivacy, FedAvgM):
        def __init__(self, weighting="uniform"):
            FedAvgM.__init__(self, lr=1.0, momentum=0.9, weighting=weighting)
            self.setup_privacy(0.1, 1.0, 1e-3)

    server = DPFedAvgM()
    server.weighting = weighting
    return server, DPFedAvgM


def test_31_7_the_dp_mixin_refuses_sample_weights_when_set_up():
    _, cls = _dp_fedavgm()
    with pytest.raises(ValueError, match="weighting='uniform'"):
        cls(weighting="num_samples")


def test_31_7_a_hand_composed_dp_chain_warns_at_fit_start_that_epsilon_is_not_accounted(tmp_path):
    """#31 item 7: a plain server optimizer with ClipUpdates → DPMean → GaussianNoise has no δ to report ε at: one
    warning at fit start (not one per round), and no privacy/epsilon logged."""
    server = FedAdam(lr=0.05, tau=1e-2, weighting="uniform")
    clip = ClipUpdates(0.05)
    server.aggregators = check_chain([clip, DPMean(), GaussianNoise(0.5, clip)])
    with pytest.warns(UserWarning, match="ε is not accounted") as caught:
        _, trainer = _fit(server, rounds=3, tmp=tmp_path)
    assert sum("ε is not accounted" in str(w.message) for w in caught) == 1
    assert "privacy/epsilon" not in trainer.callback_metrics


def test_sweep_then_uniform_cohorts_are_refused_with_a_sampling_dp_accepts(tmp_path):
    """#43.5: the refusal suggests what DP accounting accepts, never sampling='sweep_then_uniform' (itself refused)."""
    x, y = regression_data(n=60)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=4,
                             cohort_sampling="sweep_then_uniform")
    trainer = FederatedTrainer(max_epochs=2, callbacks=[DPFedAvg(0.1, 1.0, 1e-3)], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"cohort_sampling='sweep_then_uniform', which DP accounting does not "
                                         r"analyse.*cohort_sampling='fixed_size'.*sampling='poisson'") as info:
        trainer.fit(LinearRegression(), datamodule=dm)
    assert "sampling='sweep_then_uniform'" not in str(info.value).replace("cohort_sampling='sweep_then_uniform'", "")
    assert trainer.current_epoch == 0


def test_43_restore_state_puts_back_the_accountant_and_the_chain_state(tmp_path):
    """#43 (on_nonfinite_server_step="restore"): a DP server optimizer restored to before a step has the rounds,
    the adaptive clip norm and ε of before (the restored round released nothing)."""
    from lightning_fed import ClientUpdate

    server = DPFedAvg(clip_norm=0.05, noise_multiplier=1.0, target_delta=1e-3, adaptive_clipping=True, count_stddev=1.0)
    params, _ = _fit(server, rounds=2, tmp=tmp_path)
    before = server.snapshot_state()
    clip = server.aggregator_state[0].clip_norm.clone()
    updates = [ClientUpdate(i, [torch.full_like(p, 0.1 * (i + 1)) for p in params], 10, 3, 0.5) for i in range(3)]
    server.server_update(params, updates)
    assert int(server.aggregator_state[2].rounds) == 3
    server.restore_state(before, params)
    assert server.accountant.rounds == 2 == int(server.aggregator_state[2].rounds) and server.num_steps == 2
    assert torch.equal(server.aggregator_state[0].clip_norm, clip)
    assert server.state_dict()["privacy"] == before["privacy"]
