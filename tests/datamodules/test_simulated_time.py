"""Simulated time in a run (issue #53): FederatedDataModule(device_model, round_deadline, deadline_policy), the
SimulatedTime part, the loop's clock metrics, the run record and resume. References: a device table worked out by
hand; a "partial" run against a run told the same step counts through its local work; FedNova normalising by the
k_i done (Wang et al. 2020, Sec. 5: Δ = τ_eff Σ p_i Δ_i / ‖a_i‖₁ with ‖a_i‖₁ = k_i for local SGD) in NumPy."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, federated_fit, linear_weights, mse_grad, regression_data
from lightning_fed.callbacks import FedAvg, FedNova
from lightning_fed.checks import ArgumentError
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, LocalWork, ClientWork, SampledLocalWork
from lightning_fed.datamodules.devices import CallableDeviceModel, ParametricDeviceModel

# Six clients of 10 samples; 3 local epochs of batches of 5: K = 6 steps of 5 samples. LinearRegression's payload
# is 4 float64 = 32 bytes: 1 s down at 32 B/s, 2 s up at 16 B/s, compute 30 · spp.
SPP = np.array([0.01, 0.02, 0.05, 0.1, 0.2, 0.03])


def table(ids):
    return {"seconds_per_sample": SPP[ids], "download_bytes_per_s": 32.0, "upload_bytes_per_s": 16.0,
            "latency_s": 0.0}


# by hand, D = 4.2: finish = 3 + 30·spp = 3.3, 3.6, 4.5, 6, 9, 3.9; under "partial" k = floor(1.2 / (5·spp)) capped
# at 6: 6, 6, 4, 2, 1, 6 (finish 3 + 5·spp·k = 3.3, 3.6, 4.0, 4.0, 4.0, 3.9); under "drop" 2, 3 and 4 miss it
FINISH_FULL = np.array([3.3, 3.6, 4.5, 6.0, 9.0, 3.9])
K_PARTIAL = {0: 6, 1: 6, 2: 4, 3: 2, 4: 1, 5: 6}
FINISH_PARTIAL = np.array([3.3, 3.6, 4.0, 4.0, 4.0, 3.9])


class TableSteps(LocalWork):
    """The same work told directly: 3 epochs of batches of 5, cut to K_PARTIAL[cid] steps."""

    def plan(self, cid, round_idx, num_samples):
        return ClientWork(epochs=3, batch_size=5, steps=K_PARTIAL[cid])


def _dm(**kwargs):
    x, y = regression_data(n=60, d=3, seed=0)
    options = dict(partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=5,
                   local_epochs=3) | kwargs
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), **options)
    dm.setup()
    return x, y, dm


def _fit(tmp_path, dm, server, rounds=3, **kwargs):
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, **kwargs)
    return model, trainer


@pytest.mark.parametrize("server", [FedAvg, FedNova])
def test_a_partial_run_equals_the_run_told_those_steps_and_fednova_normalises_by_them(tmp_path, server):
    x, y, dm = _dm(device_model=CallableDeviceModel(table), round_deadline=4.2, deadline_policy="partial")
    model, trainer = _fit(tmp_path, dm, server(lr=1.0))
    _, _, told = _dm(local_work=TableSteps())
    same, _ = _fit(tmp_path, told, server(lr=1.0))
    assert np.array_equal(linear_weights(model), linear_weights(same))  # bit for bit
    cohorts = [dm.sample_clients(t) for t in range(3)]
    assert {K_PARTIAL[c] for s in cohorts for c in s.tolist()} >= {1, 2, 6}  # cut clients trained
    # the clock: each round lasts until its last client's report
    m = trainer.callback_metrics
    expected = sum(FINISH_PARTIAL[s].max() for s in cohorts)
    assert m["clock/elapsed_seconds"].item() == pytest.approx(expected, rel=1e-6)
    assert m["clock/round_seconds"].item() == pytest.approx(FINISH_PARTIAL[cohorts[2]].max(), rel=1e-6)
    assert m["clock/bytes_down"].item() == m["clock/bytes_up"].item() == 3 * 32
    assert m["clock/missed_deadline"].item() == 0 and dm.simulated_time.clock.rounds == 3
    if server is FedNova:  # x ← x + η τ_eff Σ p_i Δ_i / k_i, p_i = n_i / Σ n_j (all 10), local SGD of k_i steps
        torch.manual_seed(0)
        w = linear_weights(LinearRegression(lr=0.05))
        for t, cohort in enumerate(cohorts):
            deltas, k = [], []
            for cid in cohort.tolist():
                wk = w.copy()
                for batch in told.client_batches(cid, t):
                    wk = wk - 0.05 * mse_grad(wk, x[batch], y[batch])
                deltas.append(wk - w)
                k.append(K_PARTIAL[cid])
            p = np.full(len(k), 1 / len(k))
            w = w + float(p @ np.array(k)) * sum(pi * d / ki for pi, d, ki in zip(p, deltas, k))
        np.testing.assert_allclose(linear_weights(model), w, rtol=1e-12, atol=1e-14)


def test_drop_leaves_out_the_late_clients_before_they_train(tmp_path):
    _, _, dm = _dm(device_model=CallableDeviceModel(table), round_deadline=4.2)
    trained = []
    orig = dm.client_dataloader
    dm.client_dataloader = lambda cid, t: trained.append((t, int(cid))) or orig(cid, t)
    _, trainer = _fit(tmp_path, dm, FedAvg(lr=1.0))
    cohorts = [dm.select_cohort(t).cohort for t in range(3)]
    assert trained == [(t, c) for t, s in enumerate(cohorts) for c in s.tolist() if FINISH_FULL[c] <= 4.2]
    last = cohorts[2]
    m = trainer.callback_metrics
    assert m["clock/missed_deadline"].item() == int((FINISH_FULL[last] > 4.2).sum())
    assert m["round_clients_unavailable"].item() == m["clock/missed_deadline"].item()
    late = [(FINISH_FULL[s] > 4.2).any() for s in cohorts]
    expected = sum(4.2 if lt else FINISH_FULL[s].max() for s, lt in zip(cohorts, late))
    assert m["clock/elapsed_seconds"].item() == pytest.approx(expected, rel=1e-6)


def test_over_selection_keeps_the_first_to_finish():
    _, _, dm = _dm(device_model=CallableDeviceModel(table), clients_per_round=2, over_selection=1.0)
    for t in range(4):
        selection = dm.select_cohort(t)
        candidates = selection.candidates  # 4 candidates, nobody drops out
        new, plan = dm.simulated_time.start_round(dm, selection, t, 32, 32)
        first = sorted(candidates.tolist(), key=lambda c: (FINISH_FULL[c], c))[:2]
        assert sorted(new.cohort.tolist()) == sorted(first) and new.candidates is selection.candidates
        assert plan.round_seconds == pytest.approx(max(FINISH_FULL[first]))
    # without a device model: the first two in sample order
    _, _, plain = _dm(clients_per_round=2, over_selection=1.0)
    assert plain.select_cohort(0).cohort.tolist() == plain.select_cohort(0).candidates[:2].tolist()


def _record_fit(tmp_path, name, rounds, ckpt_path=None, **dm_kwargs):
    options = dict(device_model=ParametricDeviceModel(seconds_per_sample=0.05, compute_sigma=1.0, network_sigma=0.5,
                                                      slow_fraction=0.3, slowdown=4.0, seed=1),
                   round_deadline=0.6, over_selection=0.5, local_work=SampledLocalWork(epochs=(1, 3), batch_size=(2, 5),
                                                                                     seed=2)) | dm_kwargs
    _, _, dm = _dm(**options)
    model, trainer = _fit(tmp_path, dm, FedAvg(lr=1.0), rounds=rounds, ckpt_dir=tmp_path / name, ckpt_path=ckpt_path)
    return model, trainer, dm


def test_same_seed_same_times_and_resume_mid_run_is_bit_for_bit_with_the_clock(tmp_path):
    full, trainer, dm = _record_fit(tmp_path, "full", rounds=4)
    again, trainer2, dm2 = _record_fit(tmp_path, "again", rounds=4)
    assert np.array_equal(linear_weights(full), linear_weights(again))
    assert dm.simulated_time.clock.state_dict() == dm2.simulated_time.clock.state_dict()
    assert trainer.callback_metrics["clock/missed_deadline"] == 5  # the last round: every candidate was late
    mid = glob.glob(str(tmp_path / "full" / "epoch=1-*.ckpt"))[0]
    saved = torch.load(mid, weights_only=True)
    assert saved["FederatedDataModule"]["clock"]["rounds"] == 2
    assert saved["lightning_fed"]["run_config"]["device_model.seed"] == 1
    assert saved["lightning_fed"]["run_config"]["round_deadline"] == 0.6
    resumed, trainer3, dm3 = _record_fit(tmp_path, "resumed", rounds=4, ckpt_path=mid)
    assert np.array_equal(linear_weights(resumed), linear_weights(full))
    assert dm3.simulated_time.clock.state_dict() == dm.simulated_time.clock.state_dict()
    assert trainer3.callback_metrics["clock/elapsed_seconds"] == trainer.callback_metrics["clock/elapsed_seconds"]
    with pytest.raises(ValueError, match=r"device_model.slowdown: 4.0 -> 2.0"):
        _record_fit(tmp_path, "other", rounds=4, ckpt_path=mid,
                    device_model=ParametricDeviceModel(seconds_per_sample=0.05, compute_sigma=1.0, network_sigma=0.5,
                                                       slow_fraction=0.3, slowdown=2.0, seed=1))
    with pytest.raises(ValueError, match=r"device_model: 'lightning_fed.+ParametricDeviceModel' -> '<absent>'"):
        _record_fit(tmp_path, "none", rounds=4, ckpt_path=mid, device_model=None, round_deadline=None)


def test_off_by_default_nothing_recorded():
    _, _, dm = _dm()
    assert dm.device_model is None and dm.round_deadline is None and dm.deadline_policy == "drop"
    assert "device_model" not in dm.settings() and "device_model" not in dm.run_config() and dm.state_dict() == {}
    on = _dm(device_model=ParametricDeviceModel(), round_deadline=5)[2]
    assert on.settings()["device_model"] == "ParametricDeviceModel" and on.settings()["round_deadline"] == 5.0
    assert on.run_config()["device_model.seconds_per_sample"] == 0.01
    assert on.state_dict() == {"clock": {"elapsed_seconds": 0.0, "rounds": 0}}


@pytest.mark.parametrize("kwargs, message", [
    (dict(device_model=ParametricDeviceModel(), round_deadline=-1.0),
     r"`round_deadline` must be a finite number > 0, got -1.0"),
    (dict(device_model=ParametricDeviceModel(), deadline_policy="wait"),
     r"`deadline_policy` must be one of \('drop', 'partial'\), got 'wait'"),
    (dict(round_deadline=10.0), r"`round_deadline` \(10.0\) needs a `device_model`"),
    (dict(device_model=ParametricDeviceModel(), deadline_policy="partial"),
     r"`deadline_policy='partial'` needs a `round_deadline`"),
    (dict(device_model="fast phones"), r"`device_model` must be a DeviceModel .* got str"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        FederatedDataModule(TensorDataset(torch.zeros(4, 1)), partitioner=IIDPartitioner(2), **kwargs)


def test_partial_refused_at_fit_start_with_a_data_module_that_makes_its_own_batches(tmp_path):
    class OwnBatches(FederatedDataModule):
        def client_dataloader(self, cid, round_idx):
            return super().client_dataloader(cid, round_idx)

    x, y = regression_data(n=60, d=3, seed=0)
    dm = OwnBatches(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(6), clients_per_round=3,
                    device_model=CallableDeviceModel(table), round_deadline=4.2, deadline_policy="partial")
    with pytest.raises(ValueError, match="OwnBatches overrides `client_dataloader`; use deadline_policy='drop'"):
        _fit(tmp_path, dm, FedAvg(lr=1.0))


def test_estimated_stepping_batches_counts_the_planned_steps(tmp_path):
    """FederatedTrainer.estimated_stepping_batches, read in configure_optimizers: the steps the clock lets run."""
    seen = []

    class Reads(LinearRegression):
        def configure_optimizers(self):
            seen.append(self.trainer.estimated_stepping_batches)
            return super().configure_optimizers()

    _, _, dm = _dm(device_model=CallableDeviceModel(table), round_deadline=4.2, deadline_policy="partial")
    trainer = federated_fit(tmp_path, Reads(lr=0.05), dm, FedAvg(lr=1.0), 3)
    cohorts = [dm.select_cohort(t).cohort for t in range(3)]
    assert seen == [sum(K_PARTIAL[c] for s in cohorts for c in s.tolist())] == [trainer.global_step]
    assert dm.simulated_time.clock.rounds == 3  # the forecast left the run's clock alone


def test_partial_under_the_vectorized_executor_equals_the_run_told_those_steps(tmp_path):
    from lightning_fed.client.vectorized import VectorizedExecutor

    _, _, dm = _dm(device_model=CallableDeviceModel(table), round_deadline=4.2, deadline_policy="partial")
    model, _ = _fit(tmp_path, dm, FedNova(lr=1.0), rounds=1, client_executor=VectorizedExecutor())
    assert {K_PARTIAL[c] for c in dm.select_cohort(0).cohort.tolist()} == {2, 4, 6}  # cut clients in round 0
    _, _, told = _dm(local_work=TableSteps())
    same, _ = _fit(tmp_path, told, FedNova(lr=1.0), rounds=1, client_executor=VectorizedExecutor())
    assert np.array_equal(linear_weights(model), linear_weights(same))


def test_54_asynchronous_needs_a_device_model_and_no_deadline_and_is_in_the_run_record():
    from lightning_fed.asynchronous import AsyncConfig, StalenessWeighting

    config = AsyncConfig(concurrency=4, buffer_size=2, staleness=StalenessWeighting("hinge", a=0.5, b=2))
    with pytest.raises(ArgumentError, match="`asynchronous` needs a `device_model`"):
        FederatedDataModule(TensorDataset(torch.zeros(4, 1)), asynchronous=config)
    with pytest.raises(ArgumentError, match="`asynchronous` has no rounds to set a deadline on"):
        FederatedDataModule(TensorDataset(torch.zeros(4, 1)), device_model=ParametricDeviceModel(0.01),
                            round_deadline=5.0, asynchronous=config)
    with pytest.raises(ArgumentError, match="`asynchronous` must be an AsyncConfig or None, got dict"):
        FederatedDataModule(TensorDataset(torch.zeros(4, 1)), device_model=ParametricDeviceModel(0.01),
                            asynchronous={"concurrency": 4})
    dm = FederatedDataModule(TensorDataset(torch.zeros(4, 1)), device_model=ParametricDeviceModel(0.01),
                             asynchronous=config)
    record = dm.run_config()
    assert {k: v for k, v in record.items() if k.startswith("asynchronous")} == {
        "asynchronous": True, "asynchronous.concurrency": 4, "asynchronous.buffer_size": 2,
        "asynchronous.staleness.name": "hinge", "asynchronous.staleness.a": 0.5, "asynchronous.staleness.b": 2,
        "asynchronous.max_staleness": None, "asynchronous.mixing": None, "asynchronous.seed": 0}
    assert dm.settings()["asynchronous/buffer_size"] == 2
    with pytest.raises(ValueError, match="asynchronous run cannot be forecast"):
        dm.simulated_time.forecast(dm, 2, 32)
    assert "asynchronous" not in FederatedDataModule(TensorDataset(torch.zeros(4, 1)),
                                                     device_model=ParametricDeviceModel(0.01)).run_config()


def test_a_round_with_an_empty_poisson_sample_lasts_until_the_deadline_in_a_run(tmp_path):
    """Issue #53: a round nobody reports in lasts what the server waits. Poisson cohorts of rate 1/6 (the documented
    per-client draws u_i < q, by hand below): a round whose sample is empty lasts D = 4.2 s (before: 0 s); the others
    last the latest finish of FINISH_FULL that fits D, or D when a sampled client missed it."""
    _, _, dm = _dm(device_model=CallableDeviceModel(table), round_deadline=4.2, cohort_sampling="poisson",
                   clients_per_round=1)
    sampled = [np.flatnonzero(np.random.default_rng([0, 0x9015, r]).random(6) < 1 / 6) for r in range(6)]
    expected = [4.2 if not len(s) or (FINISH_FULL[s] > 4.2).any() else FINISH_FULL[s].max() for s in sampled]
    assert any(not len(s) for s in sampled) and any(len(s) for s in sampled)  # both cases in these rounds
    _, trainer = _fit(tmp_path, dm, FedAvg(lr=1.0), rounds=6)
    assert dm.simulated_time.clock.elapsed_seconds == pytest.approx(sum(expected), rel=1e-12)


def test_a_run_where_every_client_misses_the_deadline_says_so_in_its_error(tmp_path):
    """Before, the end-of-run error blamed ``client_dropout=0.0`` alone, though every client missed the deadline
    (the fastest finishes at 3.3 s, the deadline is 1 s)."""
    _, _, dm = _dm(device_model=CallableDeviceModel(table), round_deadline=1.0)
    with pytest.warns(UserWarning, match=r"Round 0: no client reported back \(every sampled client dropped out or "
                                         r"missed the round \(client_dropout=0.0; missed round_deadline=1.0 s"), \
            pytest.raises(RuntimeError, match=r"3 round\(s\): every sampled client dropped out or missed the round "
                                              r"\(client_dropout=0.0; missed round_deadline=1.0 s \(deadline_policy="
                                              r"'drop'\); offline per the device_model's availability\)"):
        _fit(tmp_path, dm, FedAvg(lr=1.0))
