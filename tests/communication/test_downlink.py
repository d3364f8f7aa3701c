"""Downlink compression (issue #56 item 2, last clause): the server broadcasts D(C(x_t)) = x̂_t, each sampled client
trains from x̂_t and sends Δ_i = x_i − x̂_t, the server steps from its exact x_t — against a NumPy transcription
over 3 rounds with partial participation, alone and with the uplink's top-k; the ledger counts the encoded
broadcast; the argument check and the fit-start refusals of halves that need the exact x_t."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from communication.reference import topk, uniform
from communication.test_compression import GAMMA, datamodule
from helpers import LinearRegression, federated_fit, linear_weights, mse_grad
from lightning_fed.callbacks import SCAFFOLD, FedAvg, FedDyn
from lightning_fed.checks import ArgumentError
from lightning_fed.communication import Compression, DownlinkCompression, TopK, UniformQuantization

BITS, ROUNDS = 3, 3


def reference(w, x, y, dm, rounds, down, up=lambda p: p):
    """FedAvg (sample-weighted mean, server lr 1): x_{t+1} = x_t + Σ n_i C_up(x_i − x̂_t) / Σ n_i, x̂_t = down(x_t)."""
    for t in range(rounds):
        start = down(w)
        sent, sizes = [], []
        for cid in (int(c) for c in dm.sample_clients(t)):
            local = start.copy()
            for batch in dm.client_batches(cid, t):
                local = local - GAMMA * mse_grad(local, x[batch], y[batch])
            sent.append(up(local - start))
            sizes.append(dm.client_num_samples(cid))
        w = w + sum(n * c for n, c in zip(sizes, sent)) / sum(sizes)
    return w


@pytest.mark.parametrize("uplink, executor", [(None, "sequential"), ("topk", "sequential"), (None, "vectorized")])
def test_56_downlink_compression_equals_its_numpy_transcription(tmp_path, uplink, executor):
    x, y, dm = datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=GAMMA)
    w0 = linear_weights(model)
    halves = [DownlinkCompression(UniformQuantization(bits=BITS))]
    if uplink:
        halves.append(Compression(TopK(k=2)))
    trainer = federated_fit(tmp_path, model, dm, FedAvg(), ROUNDS, client_algorithms=halves,
                            client_executor=executor)
    cohorts = [[int(c) for c in dm.sample_clients(t)] for t in range(ROUNDS)]
    assert all(len(c) == 3 for c in cohorts) and len({c for cohort in cohorts for c in cohort}) < 6  # partial
    down = lambda w: uniform(w, BITS)[0]  # noqa: E731
    up = (lambda p: topk(p, 2)[0]) if uplink else (lambda p: p)
    want = reference(w0, x, y, dm, ROUNDS, down, up)
    np.testing.assert_allclose(linear_weights(model), want, rtol=0, atol=1e-12)
    assert not np.allclose(want, reference(w0, x, y, dm, ROUNDS, lambda w: w, up))  # the broadcast changed the run
    ledger = trainer.fit_loop.communication
    per_client = int(np.ceil((64 + 4 * BITS) / 8))  # d = 4 entries (w, b) at 3 bits, lo and hi as float32
    assert ledger.total_bytes_down == ROUNDS * 3 * per_client == 3 * ledger.bytes_down
    assert ledger.bytes_up == (3 * 2 * (8 + 4) if uplink else 3 * 4 * 8)


def test_56_downlink_compressor_is_checked():
    with pytest.raises(ArgumentError, match=r"`compressor` of DownlinkCompression must be one of Float16\(\), "
                                            r"BFloat16\(\), UniformQuantization\(bits\).*got TopK"):
        DownlinkCompression(TopK(k=1))


@pytest.mark.parametrize("server, name, why", [
    (lambda: SCAFFOLD(lr=0.8), "ScaffoldClient", "receives more than the model"),  # c, besides x_t
    (lambda: FedDyn(alpha=0.1), "FedDynClient", "keeps per-client state"),  # g_k
], ids=["SCAFFOLD", "FedDyn"])
def test_56_downlink_refuses_halves_that_need_the_exact_global_model(tmp_path, server, name, why):
    *_, dm = datamodule()
    with pytest.raises(ValueError, match=rf"DownlinkCompression cannot be combined with the client half {name}: "
                                         rf"it {why}"):
        federated_fit(tmp_path, LinearRegression(), dm, server(), 1,
                      client_algorithms=[DownlinkCompression(UniformQuantization())])


def test_56_downlink_refuses_parts_kept_on_the_client(tmp_path):
    from lightning_fed.client.personal import LocalParts

    *_, dm = datamodule()
    with pytest.raises(ValueError, match=r"client half LocalParts: it keeps parts of the model on the client"):
        federated_fit(tmp_path, LinearRegression(), dm, FedAvg(), 1,
                      client_algorithms=[LocalParts(names=["linear.bias"]), DownlinkCompression(UniformQuantization())])


def test_56_asynchronous_training_refuses_downlink_compression(tmp_path):
    from asynchronous.test_loop_mode import AsyncConfig, _datamodule, _refused
    from lightning_fed.communication import BFloat16

    dm = _datamodule(4, AsyncConfig(concurrency=2, buffer_size=2), clients_per_round=2)
    _refused(tmp_path, dm, FedAvg(), "Asynchronous training .* is refused: .*DownlinkCompression .update compression.",
             client_algorithms=[DownlinkCompression(BFloat16())])
