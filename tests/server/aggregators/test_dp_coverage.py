"""What a DP run releases is what ε covers (issue #31, items 2, 4, 6 and 8): buffers, frozen parameters, the
update-norm guard, and the privacy/diversity metrics of a round (lightning_fed/server/aggregators/dp.py, the DP
mixin in lightning_fed/callbacks/dp.py and the server optimizer in lightning_fed/callbacks/server_optimizer.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.callbacks import DPFedAdam, DPFedAvg, FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import ClipUpdates, DPMean, GaussianNoise, check_chain


def _dm(num_clients=6, clients_per_round=3):
    x, y = regression_data(n=60)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
                               clients_per_round=clients_per_round, batch_size=4)


def _hand_chain(sigma=1.0, s=0.1):
    """A plain FedAvg given the DP-FedAvg chain by hand (no DP mixin)."""
    server = FedAvg(weighting="uniform")
    clip = ClipUpdates(s)
    server.aggregators = check_chain([clip, DPMean(), GaussianNoise(sigma, clip)])
    return server


class Trained(Callback):
    """Records whether any client trained (a refusal at fit start must come before)."""

    def __init__(self):
        self.batches = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches += 1


# --------------------------------------------------------------------------------- item 2: buffers under DP
class WithBatchNorm(LinearRegression):
    def __init__(self, track_running_stats=True):
        super().__init__()
        self.bn1 = torch.nn.BatchNorm1d(3, dtype=torch.float64, track_running_stats=track_running_stats)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.linear(self.bn1(x)).squeeze(-1), y)


@pytest.mark.parametrize("make", [lambda: DPFedAvg(0.1, 1.0, 1e-3), lambda: DPFedAdam(0.1, 1.0, 1e-3, lr=0.05),
                                  lambda: DPFedAvg(0.1, 1.0, 1e-3, adaptive_clipping=True, count_stddev=1.0),
                                  _hand_chain])
def test_running_statistics_under_dp_are_refused_at_fit_start_naming_the_module(tmp_path, make):
    seen = Trained()
    trainer = FederatedTrainer(max_epochs=2, callbacks=[make(), seen], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"bn1 \(BatchNorm1d\)") as err:
        trainer.fit(WithBatchNorm(), datamodule=_dm())
    assert "GroupNorm" in str(err.value) and "track_running_stats=False" in str(err.value)
    assert seen.batches == 0 and trainer.current_epoch == 0  # before any round trained


def test_batchnorm_without_running_statistics_and_noise_free_dp_are_accepted(tmp_path):
    FederatedTrainer(max_epochs=1, callbacks=[DPFedAvg(0.1, 1.0, 1e-3)], **quiet_trainer_kwargs(tmp_path)).fit(
        WithBatchNorm(track_running_stats=False), datamodule=_dm())
    # σ = 0 releases nothing private (ε = ∞, logged as such): buffers are averaged as without DP
    model = WithBatchNorm()
    FederatedTrainer(max_epochs=1, callbacks=[DPFedAvg(math.inf, 0.0, 1e-3)], **quiet_trainer_kwargs(tmp_path)).fit(
        model, datamodule=_dm())
    assert not torch.equal(model.bn1.running_mean, torch.zeros(3, dtype=torch.float64))


class WithCounters(LinearRegression):
    """A module whose training step changes a float buffer and an integer counter in place (not a norm layer)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("input_sum", torch.zeros(3, dtype=torch.float64))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("constant", torch.arange(4, dtype=torch.float32))

    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.no_grad():
            self.input_sum += x.sum(0)
            self.steps += 1
        return F.mse_loss(self.linear(x).squeeze(-1), y)


@pytest.mark.parametrize("make", [lambda: DPFedAvg(0.1, 1.0, 1e-3), _hand_chain])
def test_buffers_stay_at_the_global_value_under_dp_with_one_warning(tmp_path, make):
    torch.manual_seed(0)
    model = WithCounters()
    start = {n: b.clone() for n, b in model.named_buffers()}
    with pytest.warns(UserWarning, match=r"input_sum, steps") as record:
        FederatedTrainer(max_epochs=3, callbacks=[make()], **quiet_trainer_kwargs(tmp_path)).fit(
            model, datamodule=_dm())
    for name, buf in model.named_buffers():
        assert torch.equal(buf, start[name]), name  # bit for bit: nothing of the clients' buffers is released
    assert sum("kept at the global value" in str(w.message) for w in record) == 1
    # without DP the same buffers are averaged (float) / maximised (integer) from the clients
    plain = WithCounters()
    FederatedTrainer(max_epochs=1, callbacks=[FedAvg()], **quiet_trainer_kwargs(tmp_path)).fit(plain, datamodule=_dm())
    assert int(plain.steps) > 0 and not torch.equal(plain.input_sum, start["input_sum"])


# ------------------------------------------------------------------------------ item 4: frozen parameters
class WithFrozen(LinearRegression):
    """A trained linear layer, a frozen parameter (requires_grad=False) and one left out of the optimizer."""

    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Parameter(torch.randn(50, dtype=torch.float64), requires_grad=False)
        self.unoptimized = torch.nn.Parameter(torch.randn(40, dtype=torch.float64))

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.linear(x).squeeze(-1) + 0 * (self.frozen.sum() + self.unoptimized.sum())
        return F.mse_loss(out, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.linear.parameters(), lr=self.lr)


@pytest.mark.parametrize("make", [lambda: DPFedAvg(0.1, 1.0, 1e-3), lambda: DPFedAdam(0.1, 1.0, 1e-3, lr=0.05),
                                  _hand_chain])
def test_frozen_and_unoptimized_parameters_stay_bit_for_bit_under_dp(tmp_path, make):
    torch.manual_seed(0)
    model = WithFrozen()
    frozen, unoptimized = model.frozen.detach().clone(), model.unoptimized.detach().clone()
    w = model.linear.weight.detach().clone()
    FederatedTrainer(max_epochs=3, callbacks=[make()], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=_dm())
    assert torch.equal(model.frozen, frozen) and torch.equal(model.unoptimized, unoptimized)
    assert not torch.equal(model.linear.weight, w)  # the trained layer did move


def _update(cid, delta):
    return ClientUpdate(client_id=cid, delta=[torch.tensor(d, dtype=torch.float64) for d in delta], num_samples=1,
                        num_steps=1, loss=0.0)


def test_noise_on_trained_coordinates_is_sigma_s_over_c_and_the_clip_ignores_frozen_ones():
    sigma, s, k, d = 1.3, 0.7, 4, 20000
    frozen = torch.nn.Parameter(torch.zeros(30, dtype=torch.float64), requires_grad=False)
    trained = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
    server = DPFedAvg(clip_norm=s, noise_multiplier=sigma, target_delta=1e-5)
    # clients moved the frozen parameter a lot (norm 100 each): it must neither be released nor shrink the clip
    updates = [_update(i, [np.full(30, 100 / math.sqrt(30)), np.zeros(d)]) for i in range(k)]
    delta = server.server_update([frozen, trained], updates)
    zero = torch.zeros(30, dtype=torch.float64)
    assert torch.equal(frozen, zero) and torch.equal(delta[0], zero)
    std = float(trained.std())  # x_1 − x_0 = Δ_t = noise only: N(0, (σS/C)²), C = k here
    assert abs(std / (sigma * s / k) - 1) < 0.03  # 3 sampling SEs ≈ 3/sqrt(2·20000) = 1.5%
    # a trained update of norm 0.5 < S = 0.7 passes unclipped though its frozen part has norm 100
    tiny = DPFedAvg(clip_norm=s, noise_multiplier=1e-9, target_delta=1e-5)
    v = np.zeros(d)
    v[:2] = [0.3, 0.4]
    updates = [_update(i, [np.full(30, 100 / math.sqrt(30)), v]) for i in range(k)]
    trained = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
    tiny.server_update([frozen, trained], updates)
    np.testing.assert_allclose(trained.detach().numpy()[:2], [0.3, 0.4], atol=1e-7)  # Σ_i Δ_i / C = v


# ------------------------------------------------------------------------ item 6: the update-norm guard
@pytest.mark.parametrize("make", [lambda: DPFedAvg(0.1, 1.0, 1e-3), _hand_chain])
def test_dp_with_max_update_norm_ratio_is_refused_at_fit_start(tmp_path, make):
    seen = Trained()
    trainer = FederatedTrainer(max_epochs=2, callbacks=[make(), seen], max_update_norm_ratio=10.0,
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match="max_update_norm_ratio") as err:
        trainer.fit(LinearRegression(), datamodule=_dm())
    assert "noise_multiplier" in str(err.value)
    assert seen.batches == 0 and trainer.current_epoch == 0


def test_noise_free_dp_with_max_update_norm_ratio_is_accepted(tmp_path):
    FederatedTrainer(max_epochs=1, callbacks=[DPFedAvg(0.1, 0.0, 1e-3)], max_update_norm_ratio=10.0,
                     **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=_dm())


# -------------------------------------------------------------------- item 8: clip_norm and gradient diversity
class FailsInRound1(LinearRegression):
    def training_step(self, batch, batch_idx):
        if self.trainer.current_epoch == 1:
            raise RuntimeError("client failure in round 1")
        return super().training_step(batch, batch_idx)


class Record(Callback):
    def __init__(self):
        self.rows = []

    def on_train_epoch_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        self.rows.append({k: float(m[k]) for k in ("privacy/clip_norm", "privacy/epsilon", "round_gradient_diversity")})


@pytest.mark.parametrize("adaptive", [False, True])
def test_clip_norm_is_nan_in_a_round_where_no_client_reported(tmp_path, adaptive):
    server = DPFedAvg(0.1, 1.0, 1e-3, adaptive_clipping=adaptive, count_stddev=1.0 if adaptive else None)
    record = Record()
    with pytest.warns(UserWarning, match="no client reported back"):
        # every client fails alike in round 1 on purpose (fault injection): "skip_all" goes on past that round
        FederatedTrainer(max_epochs=3, callbacks=[server, record], on_client_failure="skip_all",
                         **quiet_trainer_kwargs(tmp_path)).fit(FailsInRound1(), datamodule=_dm())
    clip = [r["privacy/clip_norm"] for r in record.rows]
    assert math.isfinite(clip[0]) and math.isnan(clip[1]) and math.isfinite(clip[2])
    assert math.isnan(record.rows[1]["round_gradient_diversity"])  # as the other round metrics of that round
    eps = [r["privacy/epsilon"] for r in record.rows]
    assert eps[1] == eps[0] < eps[2]  # nothing released in round 1


def test_gradient_diversity_under_dp_is_that_of_the_raw_updates():
    g = np.random.default_rng(3)
    raw = [[g.standard_normal(3) * 5, g.standard_normal((2, 2)) * 5] for _ in range(4)]
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=2.0, target_delta=1e-5)
    updates = [_update(i, d) for i, d in enumerate(raw)]
    params = [torch.zeros(3, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)]
    pseudo = server.server_update(params, updates)
    flat = np.stack([np.concatenate([t.ravel() for t in d]) for d in raw])  # λ_i = 1/4, norms over all params
    expected = math.sqrt(np.mean(np.sum(flat ** 2, axis=1)) / np.sum(flat.mean(0) ** 2))
    got = server.gradient_diversity(updates, pseudo)
    assert got == pytest.approx(expected, rel=1e-12) and got >= 1


def test_logged_gradient_diversity_of_a_dp_fit_is_at_least_one(tmp_path):
    record = Record()
    FederatedTrainer(max_epochs=3, callbacks=[DPFedAvg(1.0, 1.0, 1e-3), record], **quiet_trainer_kwargs(tmp_path)).fit(
        LinearRegression(), datamodule=_dm())
    assert all(r["round_gradient_diversity"] >= 1 for r in record.rows), record.rows


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
@pytest.mark.parametrize("make", [lambda: DPFedAvg(0.1, 1.0, 1e-3), lambda: DPFedAdam(0.1, 1.0, 1e-3, lr=0.05)])
def test_clipping_and_noise_cover_only_the_federated_parameters(tmp_path, make):
    """Issue #42: the clients' updates hold only the trained head; the clipped norm, the noise (drawn for the head's
    7 numbers from the same generator) and the server step are those of the model of the head alone."""
    from helpers import fit_frozen_pair, same_head

    torch.manual_seed(0)
    frozen, head_only, trainer, _ = fit_frozen_pair(tmp_path, make)
    assert same_head(frozen, head_only) and not torch.equal(frozen.head.bias, torch.zeros(1, dtype=torch.float64))
    assert all(len(v) == 2 for v in trainer.fit_loop.server_optimizer.state.values())


# ---------------------------------------------------------------- issue #49: personal parts kept by client halves
class BodyHead(LinearRegression):
    """x (3) → body Linear(3, 2) → head Linear(2, 1) (``net.1``, what FedPer keeps), MSE, SGD; float64."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).double()
        del self.linear

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class RecordingFedAvg(FedAvg):
    """FedAvg(weighting="uniform") given the DP-FedAvg chain by hand (as :func:`_hand_chain`; no accountant, so a
    fit costs no ε evaluations), keeping a copy of x_t, the clients' Δ_i and x_{t+1} of every server step."""

    def __init__(self, sigma, s, client):
        super().__init__(weighting="uniform", client=client)
        clip = ClipUpdates(s)
        self.aggregators = check_chain([clip, DPMean(), GaussianNoise(sigma, clip)])
        self.steps = []

    def server_update(self, params, updates):
        before = [p.detach().clone() for p in params]
        deltas = [[d.detach().clone() for d in u.delta] for u in updates]
        out = super().server_update(params, updates)
        self.steps.append((before, deltas, [p.detach().clone() for p in params]))
        return out


def _noise(seed, round_idx, shapes):
    """The documented noise stream, written out: a torch.Generator seeded through NumPy's SeedSequence by
    (seed, 0xD9F0, round), one N(0, 1) draw per tensor released, in order (server/aggregators/dp.py)."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, 0xD9F0, round_idx]).generate_state(1, np.uint64)[0]
    gen = torch.Generator().manual_seed(int(state & 0x7FFF_FFFF_FFFF_FFFF))
    return [torch.randn(shape, generator=gen, dtype=torch.float64).numpy() for shape in shapes]


@pytest.mark.filterwarnings("ignore:FedAvg aggregates with the DP stages:UserWarning")
def test_kept_personal_parts_are_neither_clipped_nor_noised(tmp_path):
    """Issue #49: FedPer's head under the DP-FedAvg chain stays at its initial value bit for bit over 3 rounds (on
    main the noise N(0, (σS/C)²) was added to it every round), and the released body equals a NumPy transcription
    of McMahan et al. 2018, Alg. 1 over the body alone — x_{t+1} = x_t + (Σ_i Δ_i·min(1, S/‖Δ_i‖) + σS·ξ) / C, the
    norm over the body's tensors only, ξ the documented noise stream drawn for the body's tensors only."""
    from lightning_fed.algorithms import FedPerClient

    sigma, s, n, c, rounds = 0.5, 0.05, 6, 3, 3
    torch.manual_seed(0)
    model = BodyHead()
    head0 = [p.detach().clone() for p in model.net[1].parameters()]
    server = RecordingFedAvg(sigma, s, client=[FedPerClient(head=["net.1"])])
    dm = _dm(n, c)
    FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)

    for p, p0 in zip(model.net[1].parameters(), head0):
        assert torch.equal(p, p0)  # the global head: bit for bit its initial value
    assert len(server.steps) == rounds
    clipped = 0
    for t, (before, deltas, after) in enumerate(server.steps):
        body = [0, 1]  # net.0.weight, net.0.bias; net.1.* (2, 3) is the head
        assert all(not d[i].any() for d in deltas for i in (2, 3))  # the clients' Δ_i is 0 on the head
        total = [np.zeros(before[i].shape) for i in body]
        for d in deltas:
            v = [d[i].numpy() for i in body]
            norm = math.sqrt(sum(float((x ** 2).sum()) for x in v))
            clipped += norm > s
            total = [a + x * min(1.0, s / norm) for a, x in zip(total, v)]
        xi = _noise(int(dm.seed), t, [before[i].shape for i in body])
        for k, i in enumerate(body):
            want = before[i].numpy() + (total[k] + sigma * s * xi[k]) / c
            # the clip may shrink its factor by 1e-6 so that ‖clip(Δ_i)‖ ≤ S survives rounding: ≤ 1e-6·S·K/C off;
            # the noise itself is σS/C ≈ 8e-3 per coordinate here
            np.testing.assert_allclose(after[i].numpy(), want, rtol=0, atol=1e-7)
        for i in (2, 3):
            assert torch.equal(after[i], before[i])
    assert clipped > 0  # S is small enough that the clipping acted


def test_dp_fedavg_with_a_kept_head_keeps_it_and_accounts_the_same_epsilon(tmp_path):
    """Issue #49 with the accounted DPFedAvg: the kept head is unchanged bit for bit after 2 rounds, and ε is the
    library's answer for the same σ, N, C and rounds (what the clients keep does not enter the accountant)."""
    import dp_accounting
    from dp_accounting import rdp

    from lightning_fed.algorithms import FedPerClient

    sigma, delta, n, c, rounds = 0.8, 1e-3, 6, 3, 2
    torch.manual_seed(0)
    model = BodyHead()
    head0 = [p.detach().clone() for p in model.net[1].parameters()]
    body0 = model.net[0].weight.detach().clone()
    server = DPFedAvg(clip_norm=0.05, noise_multiplier=sigma, target_delta=delta, sampling="poisson",
                      client=[FedPerClient(head=["net.1"])])
    x, y = regression_data(n=60)  # Poisson cohorts: RDP's ε costs milliseconds there, about a second for fixed size
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(n, seed=0),
                             clients_per_round=c, batch_size=4, cohort_sampling="poisson")
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert all(torch.equal(p, p0) for p, p0 in zip(model.net[1].parameters(), head0))
    assert not torch.equal(model.net[0].weight, body0)
    lib = rdp.RdpAccountant()
    lib.compose(dp_accounting.PoissonSampledDpEvent(c / n, dp_accounting.GaussianDpEvent(sigma)), rounds)
    assert server.epsilon == lib.get_epsilon(delta)
