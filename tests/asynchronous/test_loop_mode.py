"""The asynchronous mode of the fit loop (issue #54 items 1, 4, 5, 6): one epoch = one server step.

The degenerate case equals a synchronous FedAvg fit bit for bit; a fit equals the pure simulation driven by
clients written out here (plain SGD on the clients' batches: the loop adds nothing); resume is bit for bit; the
refusals name the reason before any client trains."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.asynchronous import AsyncConfig, AsyncSimulation, StalenessWeighting
from lightning_fed.callbacks import DPFedAvg, FedAdam, FedAvg
from lightning_fed.client.update import ClientUpdate
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.devices import ParametricDeviceModel
from lightning_fed.server.composer import ServerComposer
from lightning_fed.server.rules import Adam
from tests.helpers import CHECKPOINT_DIR_REUSED, LinearRegression, federated_fit, regression_data

X, Y = regression_data(48)
DATA = TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
LOGNORMAL = dict(seconds_per_sample=0.01, compute_sigma=1.0, network_sigma=0.5, seed=3)


def _datamodule(num_clients, asynchronous, devices=None, **kwargs):
    kwargs.setdefault("clients_per_round", asynchronous.buffer_size if asynchronous else num_clients)
    return FederatedDataModule(DATA, partitioner=IIDPartitioner(num_clients, seed=0), batch_size=4,
                               data_order="none", device_model=ParametricDeviceModel(**(devices or {"seconds_per_sample": 0.01})),
                               asynchronous=asynchronous, **kwargs)


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def _fit(tmp_path, dm, server, epochs, **kwargs):
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    return model, federated_fit(tmp_path, model, dm, server, epochs, **kwargs)


def test_degenerate_case_equals_a_synchronous_fedavg_fit_bit_for_bit(tmp_path):
    """K = concurrency = cohort = N, equal devices, s ≡ 1: every server step is the synchronous round (N = 2: the
    sampler orders a cohort by its draw, the simulation by client id, and a weighted sum of two is exact in either
    order; more clients would differ in the last bits by the order of the sum alone)."""
    config = AsyncConfig(concurrency=2, buffer_size=2, staleness=StalenessWeighting("constant"))
    a, trainer = _fit(tmp_path / "a", _datamodule(2, config), FedAvg(lr=1.0), 3)
    s, sync_trainer = _fit(tmp_path / "s", _datamodule(2, None), FedAvg(lr=1.0), 3)
    assert all(torch.equal(p, q) for p, q in zip(_weights(a), _weights(s)))
    metrics = trainer.fit_loop.round_metrics
    assert (metrics["round_clients"], metrics["async/staleness_max"], metrics["async/dropped_stale"]) == (2, 0, 0)
    assert trainer.datamodule.simulated_time.async_simulation.version == 3
    sync_bytes = sync_trainer.fit_loop.communication  # issue #56's byte counts: the same clients, the same bytes
    assert trainer.fit_loop.communication.state_dict() == sync_bytes.state_dict() and sync_bytes.total_bytes_up > 0


def _reference_train(dm, lr):
    """A client's local work written out: plain SGD on the mean squared error over its batches, float64."""
    def train(c, params, k):
        w, b = params[0].clone(), params[1].clone()
        losses = []
        for batch in dm.client_batches(c, k):
            x, y = torch.from_numpy(X[batch]), torch.from_numpy(Y[batch])
            residual = x @ w[0] + b[0] - y
            losses.append(float((residual ** 2).mean()))
            gw, gb = 2 * x.T @ residual / len(batch), 2 * residual.mean()
            w, b = w - lr * gw, b - lr * gb
        return ClientUpdate(c, [w - params[0], b - params[1]], len(dm.client_indices(c)), len(losses),
                            float(np.mean(losses)))
    return train


def test_a_fit_equals_the_pure_simulation_with_the_same_clients(tmp_path):
    """FedBuff (K = 2, 3 in flight of 6, log-normal devices, s = 1/√(1+τ), max_staleness 2) with FedAdam: the
    loop's fit equals AsyncSimulation driven by hand-written clients, to 1e-12, with the same events."""
    config = AsyncConfig(concurrency=3, buffer_size=2, max_staleness=2, seed=5)
    dm = _datamodule(6, config, LOGNORMAL)
    model, trainer = _fit(tmp_path, dm, FedAdam(lr=0.05, weighting="uniform"), 6)
    ref_dm = _datamodule(6, None, LOGNORMAL)
    ref_dm.setup("fit")
    composer = ServerComposer("uniform", None, Adam(lr=0.05))
    torch.manual_seed(0)
    x = _weights(LinearRegression())
    sim = AsyncSimulation(config, 6, _reference_train(ref_dm, 0.05), composer.update,
                          ParametricDeviceModel(**LOGNORMAL),
                          lambda c, k: np.array([len(b) for b in ref_dm.client_batches(c, k)]))
    taus = [sim.step(x).staleness for _ in range(6)]
    ours = trainer.datamodule.simulated_time.async_simulation
    assert (ours.time, ours.dispatches, ours.dropped_stale_total) == (sim.time, sim.dispatches, sim.dropped_stale_total)
    assert max(t.max() for t in taus) > 0  # stale updates were weighted
    for p, q in zip(_weights(model), x):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=0, atol=1e-12)
    assert trainer.datamodule.simulated_time.clock.elapsed_seconds == sim.time


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_resume_mid_run_is_bit_for_bit(tmp_path):
    """Stopped after 2 of 4 server steps (clients in flight, several model versions held) and resumed from the
    checkpoint: the same model, events and clock as the uninterrupted fit."""
    config = AsyncConfig(concurrency=4, buffer_size=2, seed=1)

    def run(root, epochs, ckpt_dir=None, ckpt_path=None):
        return _fit(root, _datamodule(8, config, LOGNORMAL), FedAvg(lr=1.0), epochs, ckpt_dir=ckpt_dir,
                    ckpt_path=ckpt_path)

    full, full_trainer = run(tmp_path / "a", 4)
    run(tmp_path / "b", 2, tmp_path / "ckpt")
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    saved = next(v for k, v in state.items() if "FederatedDataModule" in k)["asynchronous"]
    # 3 in flight (the step's last reporter is replaced when the next step starts), from two model versions
    assert len(saved["in_flight"]) == 3 and len(saved["versions"]) == 2
    resumed, trainer = run(tmp_path / "b", 4, tmp_path / "ckpt2", str(tmp_path / "ckpt" / "last.ckpt"))
    assert all(torch.equal(p, q) for p, q in zip(_weights(full), _weights(resumed)))
    a, b = full_trainer.datamodule.simulated_time, trainer.datamodule.simulated_time
    assert a.async_simulation.state_dict()["in_flight"] == b.async_simulation.state_dict()["in_flight"]
    assert a.clock.elapsed_seconds == b.clock.elapsed_seconds and b.async_simulation.version == 4


def _refused(tmp_path, dm, server, match, **trainer_kwargs):
    model = LinearRegression()
    before = _weights(model)
    with pytest.raises(ValueError, match=match):
        federated_fit(tmp_path, model, dm, server, 1, **trainer_kwargs)
    assert all(torch.equal(p, q) for p, q in zip(before, _weights(model)))  # no client trained


@pytest.mark.filterwarnings("ignore:`max_update_norm_ratio`=3 does nothing")
@pytest.mark.parametrize("case, match", [
    ("scaffold", "SCAFFOLD corrects each update"),
    ("dp", "DPFedAvg adds DP noise"),
    ("executor", "VectorizedExecutor"),
    ("clients_per_round", r"clients_per_round \(3\) must equal buffer_size \(2\)"),
    ("client_dropout", "client_dropout, over_selection and cohort_sampling"),
    ("norm_ratio", "max_update_norm_ratio"),
])
def test_refusals_at_fit_start_say_why(tmp_path, case, match):
    from lightning_fed.algorithms.scaffold import SCAFFOLD

    config = AsyncConfig(concurrency=2, buffer_size=2)
    dm = _datamodule(4, config, clients_per_round=3 if case == "clients_per_round" else 2,
                     client_dropout=0.2 if case == "client_dropout" else 0.0)
    server = (SCAFFOLD(lr=1.0) if case == "scaffold" else
              DPFedAvg(clip_norm=1.0, noise_multiplier=1.0, target_delta=1e-3) if case == "dp" else FedAvg())
    kwargs = {"client_executor": "vectorized"} if case == "executor" else \
        {"max_update_norm_ratio": 3.0} if case == "norm_ratio" else {}
    _refused(tmp_path, dm, server, f"Asynchronous training .* is refused: .*{match}", **kwargs)


@pytest.mark.parametrize("weighting, buffer_size, warned", [
    (None, 2, True),         # FedAvg's default "num_samples": not FedBuff's Alg. 1 mean
    ("uniform", 2, False),   # the paper's (1/K)·Σ s(τ_i)·Δ_i
    (None, 1, False),        # K = 1 (FedAsync): one update, its weight is 1 either way
])
def test_a_buffer_averaged_by_samples_is_warned_as_not_the_papers_mean(tmp_path, weighting, buffer_size, warned):
    """FedBuff (Nguyen et al. 2022, Alg. 1) averages the K buffered updates uniformly; the server optimizer's default
    weighting is Reddi et al.'s sample weighting: a fit with K > 1 on the default says so at fit start."""
    import warnings

    from lightning_fed.asynchronous.loop_mode import NOT_THE_PAPERS_MEAN

    config = AsyncConfig(concurrency=2, buffer_size=buffer_size, **({"mixing": 0.5} if buffer_size == 1 else {}))
    server = FedAvg() if weighting is None else FedAvg(weighting=weighting)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(tmp_path, _datamodule(4, config), server, 1)
    assert any(str(w.message) == NOT_THE_PAPERS_MEAN for w in caught) is warned


KILLED_RUN = """
import os, signal, sys
import torch
torch.set_num_threads(1)
from lightning_fed.callbacks import FedAvg
from tests.asynchronous.test_loop_mode import KILL_CONFIG, LOGNORMAL, _datamodule
from tests.helpers import LinearRegression, federated_fit

class KilledInStep2(LinearRegression):  # SIGKILL inside a client's local training in server step 2
    def training_step(self, batch, batch_idx):
        if self.trainer.current_epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().training_step(batch, batch_idx)

torch.manual_seed(0)
federated_fit(sys.argv[1], KilledInStep2(lr=0.05), _datamodule(8, KILL_CONFIG, LOGNORMAL), FedAvg(lr=1.0), 4,
              ckpt_dir=sys.argv[2])
"""
KILL_CONFIG = AsyncConfig(concurrency=4, buffer_size=2, max_staleness=3, seed=2)


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED, "ignore:Be aware that when using `ckpt_path`")
def test_sigkill_mid_step_then_resume_equals_uninterrupted(tmp_path):
    """A process killed (SIGKILL) inside server step 2, resumed from its last checkpoint (after step 1: clients in
    flight, their versions, the clock) to step 4, ends with the uninterrupted run's model and events, bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path / "k"), str(tmp_path / "ckpt")], cwd=root,
                          env=env, capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] == "last.ckpt"

    def run(name, ckpt_path=None):
        return _fit(tmp_path / name, _datamodule(8, KILL_CONFIG, LOGNORMAL), FedAvg(lr=1.0), 4, ckpt_path=ckpt_path)

    full, full_trainer = run("full")
    resumed, trainer = run("resumed", str(tmp_path / "ckpt" / "last.ckpt"))
    assert all(torch.equal(p, q) for p, q in zip(_weights(full), _weights(resumed)))
    a, b = full_trainer.datamodule.simulated_time, trainer.datamodule.simulated_time
    assert a.async_simulation.state_dict()["in_flight"] == b.async_simulation.state_dict()["in_flight"]
    assert (a.clock.elapsed_seconds, a.async_simulation.dispatches) == (b.clock.elapsed_seconds,
                                                                         b.async_simulation.dispatches)


def test_a_compressed_upload_is_timed_by_its_encoded_size(tmp_path):
    """Issue #56's Compression under asynchronous training: the first report (K = 1) comes at download + compute +
    upload of the top-1 encoding, k·(8 + 4) = 12 bytes (one float64 value, one int32 index), not the raw Δ_i's 32.
    By hand: 4 clients of 12 samples, 3 steps of 4; the model's 4 float64 entries down (32 bytes at 100 B/s) and 12
    bytes up at 2 B/s, 0.5 s latency each way, 0.01 s a sample."""
    from lightning_fed.communication import Compression, TopK

    devices = dict(seconds_per_sample=0.01, download_bytes_per_s=100.0, upload_bytes_per_s=2.0, latency_s=0.5)
    config = AsyncConfig(concurrency=2, buffer_size=1)
    _, trainer = _fit(tmp_path, _datamodule(4, config, devices), FedAvg(lr=1.0), 1,
                      client_algorithms=[Compression(TopK(k=1))])
    hand = (32 / 100.0 + 0.5) + 0.01 * 12 + (12 / 2.0 + 0.5)
    assert trainer.fit_loop.round_metrics["clock/elapsed_seconds"] == pytest.approx(hand, rel=1e-12)
    assert trainer.fit_loop.communication.total_bytes_up == 12  # the one buffered update, as encoded


def test_error_feedback_in_the_degenerate_case_equals_synchronous_training_bit_for_bit(tmp_path):
    """Compression(TopK(k=1), error_feedback=True) (Karimireddy et al. 2019, Alg. 2 EF-SGD l. 4-7): in the degenerate
    case (K = concurrency = cohort = N = 2, equal devices, s ≡ 1) the model and each client's residual e_i after 3
    server steps are the synchronous run's, bit for bit."""
    from lightning_fed.communication import Compression, TopK

    def run(name, config):
        model, trainer = _fit(tmp_path / name, _datamodule(2, config), FedAvg(lr=1.0), 3,
                              client_algorithms=[Compression(TopK(k=1), error_feedback=True)])
        states = trainer.fit_loop.server_optimizer.client_states
        return _weights(model), [states.row("Compression", c) for c in (0, 1)]

    (a, residual_a), (s, residual_s) = (run("a", AsyncConfig(concurrency=2, buffer_size=2,
                                                             staleness=StalenessWeighting("constant"))),
                                        run("s", None))
    assert all(torch.equal(p, q) for p, q in zip(a, s))
    assert all(r is not None and torch.equal(r, q) for r, q in zip(residual_a, residual_s))
    assert all(bool(r.abs().sum() > 0) for r in residual_a)  # top-1 of 4 entries leaves a residual


def test_a_module_with_buffers_is_refused_with_the_reason(tmp_path):
    """Issue #54 item 2, kept refused: BatchNorm's running statistics have no published asynchronous rule (FedBuff,
    FedAsync step the parameters only); the refusal names the buffers and says so, before any client trains."""

    class WithNorm(LinearRegression):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3, dtype=torch.float64)

        def training_step(self, batch, batch_idx):
            return super().training_step((self.norm(batch[0]), batch[1]), batch_idx)

    model = WithNorm()
    before = _weights(model)
    with pytest.raises(ValueError, match=r"buffers \(norm.running_mean, norm.running_var, norm.num_batches_tracked\): "
                                         r"FedBuff \(Nguyen et al. 2022, Alg. 1\) and FedAsync .* publish no rule"):
        federated_fit(tmp_path, model, _datamodule(4, AsyncConfig(concurrency=2, buffer_size=2)), FedAvg(), 1)
    assert all(torch.equal(p, q) for p, q in zip(before, _weights(model)))


def test_error_feedback_residual_is_kept_at_the_report_for_a_client_dispatched_twice_in_a_step(tmp_path):
    """One client in flight, K = 2, and a seed whose first two dispatches draw the same client: it reports twice
    from version 0 with the same Δ (same start, same batches), and its second report must start from the residual of
    its first (EF-SGD, Karimireddy et al. 2019, Alg. 2 l. 4-7: p = Δ + e, send C(p), e ← p − C(p)). NumPy reference
    from the uncompressed run's Δ."""
    from lightning_fed.asynchronous import draw_client
    from lightning_fed.communication import Compression, TopK

    seed = next(s for s in range(100) if draw_client(s, 0, 2, ()) == draw_client(s, 1, 2, ()))
    config = AsyncConfig(concurrency=1, buffer_size=2, staleness=StalenessWeighting("constant"), seed=seed)

    def run(name, halves):
        _, trainer = _fit(tmp_path / name, _datamodule(2, config), FedAvg(lr=1.0), 1, client_algorithms=halves)
        buffered = trainer.fit_loop._async._buffer
        flat = [torch.cat([t.reshape(-1) for t in u.delta]).numpy() for u in buffered]
        return trainer, [u.client_id for u in buffered], flat

    _, ids, (delta, again) = run("raw", [])
    np.testing.assert_array_equal(delta, again)  # the same Δ twice
    trainer, ids_ef, (sent1, sent2) = run("ef", [Compression(TopK(k=1), error_feedback=True)])
    assert ids == ids_ef and ids[0] == ids[1]

    def top1(v):
        out = np.zeros_like(v)
        out[np.argmax(np.abs(v))] = v[np.argmax(np.abs(v))]
        return out

    e1 = delta - top1(delta)
    p2 = delta + e1
    np.testing.assert_array_equal(sent1, top1(delta))
    np.testing.assert_array_equal(sent2, top1(p2))
    residual = trainer.fit_loop.server_optimizer.client_states.row("Compression", ids[0])
    np.testing.assert_array_equal(residual.numpy(), p2 - top1(p2))
