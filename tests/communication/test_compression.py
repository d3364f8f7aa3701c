"""Compression as a client half (issue #56 items 2-4): a federated fit whose clients send C(Δ_i + e_i) and keep
e_i ← Δ_i + e_i − C(Δ_i + e_i) (error feedback: Karimireddy et al. 2019, Alg. 2 l. 4-7; Stich et al. 2018, Alg. 1)
against a NumPy transcription — several rounds, partial participation, returning clients, top-k and QSGD with the
same draws, resume (residuals in memory or on disk) equal to the uninterrupted run to 1e-9; a personal half's kept
parts are neither compressed nor counted; the argument and fit-start refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from communication.reference import qsgd, topk
from helpers import CHECKPOINT_DIR_REUSED, LinearRegression, federated_fit, linear_weights, mse_grad, regression_data
from lightning_fed.callbacks import FedAvg
from lightning_fed.checks import ArgumentError
from lightning_fed.communication import (QSGD, Compression, Float16, RandK, Sign, TopK, UniformQuantization,
                                         client_generator)
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

GAMMA, SEED = 0.1, 7
COMPRESSORS = {
    "topk": (lambda: TopK(k=2), lambda p, t, cid: topk(p, 2)[0]),
    "qsgd": (lambda: QSGD(levels=2), lambda p, t, cid: qsgd(p, 2, torch.rand(
        p.size, generator=client_generator(SEED, t, cid)).numpy().astype(np.float64))[0]),
}


def datamodule():
    x, y = regression_data(n=48, d=3, seed=2)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=4)
    dm.setup()
    return x, y, dm


def reference(w, x, y, dm, rounds, compress):
    """FedAvg (sample-weighted mean, server lr 1) of the clients' C(p_i), p_i = Δ_i + e_i, e_i ← p_i − C(p_i)."""
    residual = {}
    for t in range(rounds):
        sent, sizes = [], []
        for cid in (int(c) for c in dm.sample_clients(t)):
            local = w.copy()
            for batch in dm.client_batches(cid, t):
                local = local - GAMMA * mse_grad(local, x[batch], y[batch])
            p = local - w + residual.get(cid, 0.0)
            c = compress(p, t, cid)
            residual[cid] = p - c
            sent.append(c)
            sizes.append(dm.client_num_samples(cid))
        w = w + sum(n * c for n, c in zip(sizes, sent)) / sum(sizes)
    return w, residual


def fit(tmp_path, name, rounds, store="memory", **kwargs):
    torch.manual_seed(0)
    model = LinearRegression(lr=GAMMA)
    server = FedAvg(client_state_store=store)
    x, y, dm = datamodule()
    half = Compression(COMPRESSORS[name][0](), error_feedback=True, seed=SEED)
    trainer = federated_fit(tmp_path, model, dm, server, rounds, client_algorithms=[half], **kwargs)
    return model, server, trainer


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_56_error_feedback_equals_its_numpy_transcription(tmp_path, name):
    x, y, dm = datamodule()
    torch.manual_seed(0)
    w0 = linear_weights(LinearRegression(lr=GAMMA))
    model, server, trainer = fit(tmp_path, name, rounds=4)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(4)]
    assert len({c for cohort in cohorts for c in cohort}) < 12  # clients come back, with their residual
    want, residual = reference(w0, x, y, dm, 4, COMPRESSORS[name][1])
    np.testing.assert_allclose(linear_weights(model), want, rtol=0, atol=1e-9)
    table = server.client_algorithm_states["Compression"]
    assert sorted(table.ids()) == sorted(residual)
    for cid, e in residual.items():
        np.testing.assert_allclose(table.get(cid).numpy(), e, rtol=0, atol=1e-9)
    assert not np.allclose(want, reference(w0, x, y, dm, 4, lambda p, t, c: p)[0])  # compression changed the run


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED, "ignore:Be aware that when using `ckpt_path`:UserWarning")
@pytest.mark.parametrize("store", ["memory", "disk"])
def test_56_error_feedback_resumes_as_the_uninterrupted_run(tmp_path, store):
    full, full_server, _ = fit(tmp_path / "a", "qsgd", rounds=3)
    fit(tmp_path / "b", "qsgd", rounds=2, store=store, ckpt_dir=tmp_path / "cb")
    resumed, server, _ = fit(tmp_path / "b", "qsgd", rounds=3, store=store, ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    np.testing.assert_allclose(linear_weights(resumed), linear_weights(full), rtol=0, atol=1e-9)
    a, b = full_server.client_algorithm_states["Compression"], server.client_algorithm_states["Compression"]
    assert sorted(a.ids()) == sorted(b.ids())
    for cid in a.ids():
        np.testing.assert_allclose(b.get(cid).numpy(), a.get(cid).numpy(), rtol=0, atol=1e-9)


def test_56_kept_personal_parts_are_neither_compressed_nor_counted():
    delta = [torch.tensor([3.0, -1.0, 0.5]), torch.zeros(2), torch.tensor([-2.0])]  # index 1: a kept part (Δ = 0)
    out, nbytes, residual = Compression(TopK(k=2), error_feedback=True).encode(
        delta, [0, 2], client_id=0, round_idx=0, residual=torch.tensor([0.0, 0.0, 0.0, 9.0, 9.0, 0.25]))
    # p = Δ + e = (3, −1, .5 | 9, 9 | −1.75): top-2 of the travelling (3, −1, .5, −1.75) only
    assert [o.tolist() for o in out] == [[3.0, 0.0, 0.0], [0.0, 0.0], [-1.75]]
    assert nbytes == 2 * (4 + 4)
    assert residual.tolist() == [0.0, -1.0, 0.5, 9.0, 9.0, 0.0]  # (what the kept part held is carried, never sent)
    out, nbytes, residual = Compression(Float16()).encode(delta, [0, 2], 0, 0)
    assert nbytes == 4 * 2 and residual is None


def test_56_compression_arguments_are_checked():
    with pytest.raises(ArgumentError, match=r"`compressor` must be a lightning_fed.communication Compressor"):
        Compression("topk")
    with pytest.raises(ArgumentError, match=r"`error_feedback` must be True or False"):
        Compression(Float16(), error_feedback=1)
    with pytest.raises(ArgumentError, match=r"`seed` must be an integer >= 0"):
        Compression(Float16(), seed=-1)


def test_56_two_compression_halves_are_refused_at_fit_start(tmp_path):
    *_, dm = datamodule()
    with pytest.raises(ValueError, match=r"The run has 2 Compression client halves"):
        federated_fit(tmp_path, LinearRegression(), dm, FedAvg(), 1,
                      client_algorithms=[Compression(Float16()), Compression(TopK(k=1))])


def test_56_a_non_finite_update_is_not_hidden_by_its_compression():
    delta = [torch.tensor([float("nan"), 1.0, -2.0])]
    for compressor in (TopK(k=1), Float16()):
        out, nbytes, residual = Compression(compressor, error_feedback=True).encode(delta, [0], 0, 0)
        assert out is delta and nbytes == 12 and residual is None  # the loop drops it; e_i is kept


@pytest.mark.parametrize("compressor", [Float16(), QSGD(levels=7), UniformQuantization(bits=3), TopK(fraction=0.1),
                                        TopK(k=3), RandK(k=30), Sign(), Sign(scaled=True)], ids=repr)
def test_56_the_encoded_size_is_known_before_the_client_trains(compressor):
    v = torch.randn(25, dtype=torch.float64)
    assert compressor.size(25, 8) == compressor.compress(v, client_generator(0, 0, 0))[1]


def test_56_the_server_clips_the_decoded_update(tmp_path):
    """Compression on the client, then the server's clipping (McMahan et al. 2018, Alg. 1 ClipFn, flat): x_1 =
    x_0 + Σ n_i·clip(C(Δ_i)) / Σ n_i with C = top-1 and S = 0.05 — what DP-FedAvg's accountant then covers."""
    from lightning_fed.server.aggregators import ClipUpdates, WeightedMean

    x, y, dm = datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=GAMMA)
    w = linear_weights(model)
    federated_fit(tmp_path, model, dm, FedAvg(aggregators=[ClipUpdates(0.05), WeightedMean()]), 1,
                  client_algorithms=[Compression(TopK(k=1))])
    sent, sizes = [], []
    for cid in dm.sample_clients(0):
        local = w.copy()
        for batch in dm.client_batches(cid, 0):
            local = local - GAMMA * mse_grad(local, x[batch], y[batch])
        c = topk(local - w, 1)[0]
        sent.append(c * min(1.0, 0.05 / np.linalg.norm(c)))
        sizes.append(dm.client_num_samples(cid))
    want = w + sum(n * c for n, c in zip(sizes, sent)) / sum(sizes)
    np.testing.assert_allclose(linear_weights(model), want, rtol=0, atol=1e-12)
    assert max(np.linalg.norm(c) for c in sent) == pytest.approx(0.05)  # the clip was active


def test_56_error_feedback_runs_under_dp_fedavg(tmp_path):
    """The combination the module doc reasons to be covered (the residual stays with its client; each round's
    contribution is clipped after decoding) is not refused: DP-FedAvg with top-k and error feedback fits, and each
    sampled client's residual is kept."""
    from lightning_fed.callbacks import DPFedAvg

    *_, dm = datamodule()
    server = DPFedAvg(clip_norm=0.1, noise_multiplier=0.5, target_delta=1e-3)
    federated_fit(tmp_path, LinearRegression(lr=GAMMA), dm, server, 1,
                  client_algorithms=[Compression(TopK(k=1), error_feedback=True)])
    table = server.client_algorithm_states["Compression"]
    assert sorted(table.ids()) == sorted(int(c) for c in dm.sample_clients(0))


def test_communication_guide_snippet_runs():
    """docs/guide/communication.md's Python block builds the trainer it describes: FedAdam with QSGD (7 levels) and
    error feedback as the run's client half."""
    import re
    from pathlib import Path

    from lightning_fed.communication import QSGD, Compression

    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "communication.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    scope: dict = {}
    exec(compile(block, "communication.md", "exec"), scope)
    (half,) = scope["trainer"].client_algorithms
    assert isinstance(half, Compression) and isinstance(half.compressor, QSGD) and half.error_feedback
    assert half.compressor.levels == 7
