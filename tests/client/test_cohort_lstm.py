"""The cohort-batched LSTM of the vectorized executor: the same function and gradients as ``torch.nn.LSTM``."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap
from torch.utils.data import TensorDataset

from helpers import quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.client.cohort_lstm import CohortLSTMLayer, cohort_lstm, supports
from lightning_fed.client.sequential import SequentialExecutor
from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.vectorized import VectorizedExecutor


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["float64", "float32"])
@pytest.mark.parametrize(
    "batch_first, num_layers, bias, with_state",
    [(True, 2, True, False), (False, 1, False, True), (True, 3, True, True), (False, 2, True, False)],
)
def test_vmapped_values_and_gradients_match_nn_lstm(batch_first, num_layers, bias, with_state, dtype, atol):
    """float64: the batched-matmul LSTM with hand-written BPTT; float32 on CPU: oneDNN's fused layer per client.
    The reference is PyTorch's composite LSTM under vmap (oneDNN off: it has no batching rule)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 7, num_layers=num_layers, batch_first=batch_first, bias=bias, dtype=dtype)
    clients, batch, steps = 3, 4, 6
    params = {k: v.detach() + 0.1 * torch.randn(clients, *v.shape, dtype=dtype) for k, v in lstm.named_parameters()}
    shape = (clients, batch, steps, 5) if batch_first else (clients, steps, batch, 5)
    x = torch.randn(*shape, dtype=dtype)
    h0 = torch.randn(clients, num_layers, batch, 7, dtype=dtype)
    c0 = torch.randn(clients, num_layers, batch, 7, dtype=dtype)

    def loss(p, x, h0, c0):  # every output matters: the sequence, h_n and c_n
        out, (h, c) = functional_call(lstm, p, (x, (h0, c0) if with_state else None))
        return out.sin().sum() + (1.3 * h).cos().sum() + (c**2).sum()

    fn = vmap(grad_and_value(loss, argnums=(0, 1, 2, 3)))
    with torch.backends.mkldnn.flags(enabled=False):
        reference = fn(params, x, h0, c0)  # PyTorch's own (composite) LSTM under vmap
    assert supports(lstm, x[0], (h0[0], c0[0]) if with_state else None)
    with cohort_lstm(lstm):
        got = fn(params, x, h0, c0)
    assert "forward" not in lstm.__dict__  # restored
    torch.testing.assert_close(got[1], reference[1], atol=atol, rtol=0)
    for k in params:
        torch.testing.assert_close(got[0][0][k], reference[0][0][k], atol=atol, rtol=0)
    for i in (1, 2, 3):
        torch.testing.assert_close(got[0][i], reference[0][i], atol=atol, rtol=0)


def test_layer_matches_the_lstm_equations_by_hand():
    """One step of one client, computed from the equations with NumPy."""
    rng = np.random.default_rng(0)
    h_size, n_in, batch = 2, 3, 1
    x = rng.normal(size=(1, 1, batch, n_in))
    h0, c0 = rng.normal(size=(1, batch, h_size)), rng.normal(size=(1, batch, h_size))
    w_ih, w_hh = rng.normal(size=(1, 4 * h_size, n_in)), rng.normal(size=(1, 4 * h_size, h_size))
    bias = rng.normal(size=(1, 4 * h_size))
    tensors = [torch.from_numpy(a) for a in (x, h0, c0, w_ih, w_hh, bias)]
    out, h, c, *_ = CohortLSTMLayer.apply(*tensors, torch.zeros_like(tensors[-1]))
    a = w_ih[0] @ x[0, 0, 0] + w_hh[0] @ h0[0, 0] + bias[0]
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    i, f, g, o = sig(a[:2]), sig(a[2:4]), np.tanh(a[4:6]), sig(a[6:])
    c_ref = f * c0[0, 0] + i * g
    np.testing.assert_allclose(c[0, 0].numpy(), c_ref, atol=1e-14)
    np.testing.assert_allclose(out[0, 0, 0].numpy(), o * np.tanh(c_ref), atol=1e-14)
    np.testing.assert_allclose(h[0, 0].numpy(), o * np.tanh(c_ref), atol=1e-14)


@pytest.mark.parametrize(
    "kwargs, ok",
    [(dict(), True), (dict(batch_first=True, num_layers=3, bias=False), True), (dict(bidirectional=True), False),
     (dict(proj_size=2), False), (dict(num_layers=2, dropout=0.5), False), (dict(num_layers=1, dropout=0.5), True)],
)
def test_supported_configurations(kwargs, ok):
    lstm = torch.nn.LSTM(3, 4, **kwargs)
    assert supports(lstm, torch.zeros(5, 2, 3)) is ok
    assert not supports(torch.nn.LSTM(3, 4), torch.zeros(5, 3))  # unbatched input
    lstm.eval()
    if "dropout" in kwargs:
        assert supports(lstm, torch.zeros(5, 2, 3))  # no dropout in eval mode


class CharLSTM(L.LightningModule):
    """Embedding -> LSTM -> Linear next-token model (a small ShakespeareLSTM)."""

    def __init__(self, dtype=torch.float64, **lstm_kwargs) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(11, 4, dtype=dtype)
        self.lstm = torch.nn.LSTM(4, 6, batch_first=True, dtype=dtype, **lstm_kwargs)
        hidden = 12 if lstm_kwargs.get("bidirectional") else 6
        self.head = torch.nn.Linear(hidden, 11, dtype=dtype)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out, _ = self.lstm(self.embedding(x))
        loss = F.cross_entropy(self.head(out).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.5)


SIZES = (3, 7, 12, 5, 9)


def char_dataset() -> TensorDataset:
    ids = np.repeat(np.arange(len(SIZES)), SIZES)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 11, (len(ids), 9), generator=g)
    dataset = TensorDataset(data[:, :-1], data[:, 1:])
    dataset.client_id = torch.from_numpy(ids)
    return dataset


def fit_lstm(tmp_path, executor, rounds=2, **module_kwargs):
    torch.manual_seed(0)
    module = CharLSTM(**module_kwargs)
    dm = FederatedDataModule(char_dataset(), partitioner=NaturalIdPartitioner(), clients_per_round=4, batch_size=4,
                             local_epochs=2, seed=1)
    trainer = FederatedTrainer(max_epochs=rounds, client_executor=executor, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(module, datamodule=dm)
    return torch.cat([p.detach().flatten() for p in module.parameters()])


@pytest.mark.parametrize("max_parallel", [None, 2])
def test_fit_float64_matches_sequential(tmp_path, max_parallel):
    executor = VectorizedExecutor(max_parallel=max_parallel)
    vectorized = fit_lstm(tmp_path, executor, num_layers=2)
    assert executor.fallback_reason is None
    sequential = fit_lstm(tmp_path, SequentialExecutor(), num_layers=2)
    torch.testing.assert_close(vectorized, sequential, atol=1e-12, rtol=0)


@pytest.mark.parametrize("max_parallel", [None, 3])
def test_fit_float32_one_round_matches_sequential(tmp_path, max_parallel):
    """float32 on CPU: oneDNN's fused LSTM layer per client (in chunks of ``max_parallel`` clients)."""
    executor = VectorizedExecutor(max_parallel=max_parallel)
    vectorized = fit_lstm(tmp_path, executor, rounds=1, dtype=torch.float32)
    assert executor.fallback_reason is None
    sequential = fit_lstm(tmp_path, SequentialExecutor(), rounds=1, dtype=torch.float32)
    torch.testing.assert_close(vectorized, sequential, atol=1e-5, rtol=0)


def test_unsupported_lstm_configuration_runs_the_composite_lstm_exactly(tmp_path):
    executor = VectorizedExecutor()
    vectorized = fit_lstm(tmp_path, executor, bidirectional=True)
    assert executor.fallback_reason is None  # vmapped, through PyTorch's composite LSTM
    sequential = fit_lstm(tmp_path, SequentialExecutor(), bidirectional=True)
    torch.testing.assert_close(vectorized, sequential, atol=1e-12, rtol=0)


def test_fit_runs_the_cohort_lstm_for_all_clients_at_once(tmp_path, monkeypatch):
    """The vectorized fit goes through the cohort LSTM with the clients folded into the group dimension."""
    import lightning_fed.client.cohort_lstm as cohort

    groups = []
    original = cohort._lstm_forward

    def spy(x, *args):
        groups.append(x.shape[0])
        return original(x, *args)

    monkeypatch.setattr(cohort, "_lstm_forward", spy)
    fit_lstm(tmp_path, VectorizedExecutor(), rounds=1)
    assert groups and max(groups) > 1  # several clients per call (grouped by the size of their k-th batch)
