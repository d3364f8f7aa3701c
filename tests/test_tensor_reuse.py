"""Model-sized CPU tensors reused from round to round (lightning_fed/tensor_reuse.py): Δ_i's storage and the weighted
mean's sums written in place where nobody else holds them — the same numbers bit for bit as new tensors (against
``torch._foreach_sub`` and a NumPy float64 weighted mean), and never a tensor that a callback, a view, a NumPy
array, a DLPack capsule, an autograd graph or a weak reference still sees."""

from __future__ import annotations

import copy
import pickle
import weakref

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from helpers import quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators.base import ClientDeltas, EmptyState, RoundInfo, WeightedMean, weighted_sum
from lightning_fed.tensor_reuse import DeltaBuffers, Workspace


def _bits(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes (so that −0.0 ≠ 0.0 and NaN payloads count)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().copy()


def _params(g: torch.Generator) -> list[torch.Tensor]:
    """Parameters of several dtypes and layouts: float32, a transposed (non-contiguous) float32 weight, float64,
    bfloat16, a scalar."""
    return [torch.randn(4, 3, generator=g), torch.randn(5, 2, generator=g).t(), torch.randn(6, generator=g).double(),
            torch.randn(3, generator=g).bfloat16(), torch.randn((), generator=g)]


def _assert_same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for d, e in zip(got, expected):
        assert d.dtype == e.dtype and d.shape == e.shape and d.stride() == e.stride()
        assert (_bits(d) == _bits(e)).all()


def test_delta_buffers_write_into_last_rounds_unheld_tensors_as_foreach_sub_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    pool, start, addresses = DeltaBuffers(), _params(g), None
    for round_idx in range(3):
        pool.new_round()
        deltas = []
        for _ in range(4):  # four clients a round
            x_i = [p + torch.randn(p.shape, generator=g).to(p.dtype) for p in start]
            expected = torch._foreach_sub(x_i, start)
            delta = pool.delta(x_i, start)
            _assert_same(delta, expected)  # (no loop variable here: it would hold a tensor into the next round)
            deltas.append(delta)
        now = {d.data_ptr() for delta in deltas for d in delta}
        if round_idx:
            assert now == addresses  # every tensor of the round before was written into, none made anew
        addresses = now
        del deltas, delta


@pytest.mark.parametrize("holder", ["reference", "list", "view", "detach", "numpy", "dlpack", "graph", "weakref"])
def test_delta_buffers_never_write_into_a_tensor_someone_still_holds(holder):
    pool, start = DeltaBuffers(), [torch.zeros(3), torch.zeros(2)]
    delta = pool.delta([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0])], start)
    before = [d.clone() for d in delta]
    w = torch.ones(3, requires_grad=True)
    kept = {"reference": lambda: delta[0], "list": lambda: delta, "view": lambda: delta[0][1:],
            "detach": lambda: delta[0].detach(), "numpy": lambda: delta[0].numpy(),
            "dlpack": lambda: torch.utils.dlpack.to_dlpack(delta[0]), "graph": lambda: (w * delta[0]).sum(),
            "weakref": lambda: weakref.ref(delta[0])}[holder]()
    first = delta[0].data_ptr()
    del delta
    pool.new_round()
    again = pool.delta([torch.tensor([7.0, 8.0, 9.0]), torch.tensor([1.0, 1.0])], start)
    assert again[0].data_ptr() != first and again[0].tolist() == [7.0, 8.0, 9.0]
    if holder == "graph":
        kept.backward()
        assert w.grad.tolist() == before[0].tolist()
    elif holder == "reference":
        assert torch.equal(kept, before[0])
    del kept


def test_workspace_reuses_its_tensors_unless_held_and_is_neither_pickled_nor_copied():
    work, like = Workspace(), [torch.zeros(2, 3), torch.zeros(4).t()]
    sums = work.take("sums", like, torch.float64)
    assert [t.dtype for t in sums] == [torch.float64] * 2 and [t.shape for t in sums] == [(2, 3), (4,)]
    address = sums[0].data_ptr()
    held = sums[0]
    del sums
    assert work.take("sums", like, torch.float64)[0].data_ptr() != address  # `held` still sees the first
    del held
    again = work.take("sums", like, torch.float64)
    assert work.take("other", like)[0].dtype == torch.float32  # names are apart; dtype defaults to like's
    address = again[0].data_ptr()
    del again
    assert work.take("sums", like, torch.float64)[0].data_ptr() == address
    assert work.take("sums", [torch.zeros(3, 2)], torch.float64)[0].shape == (3, 2)  # another shape: new
    assert pickle.loads(pickle.dumps(work))._kept == {} and copy.deepcopy(work)._kept == {}
    assert work.take("sums", [torch.zeros(2, device="meta")]) is None and work.take("sums", []) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_weighted_sum_into_given_tensors_and_scratch_is_the_same_sum_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    deltas = [[torch.randn(7, 5, generator=g).to(dtype), torch.randn(9, generator=g).to(dtype)] for _ in range(6)]
    counts = [3.0, 0.0, 17.0, 5.0, 1.0, 250.0]
    for skip_zero in (False, True):
        expected = weighted_sum(deltas, counts, skip_zero=skip_zero)
        out = [torch.empty_like(t) for t in expected]
        scratch = [torch.empty_like(t) for t in expected]
        got = weighted_sum(deltas, counts, skip_zero=skip_zero, out=out, scratch=scratch)
        assert got is out
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and (_bits(a) == _bits(b)).all()
    # against NumPy: Σ c_i·Δ_i in float64, client by client (integer counts: each product is exact in float64)
    reference = [sum(c * d[j].double().numpy() for c, d in zip(counts, deltas)) for j in range(2)]
    for a, r in zip(got, reference):
        assert (a.numpy() == r).all()


def _mean_input(g, counts, dtype=torch.float32):
    deltas = [[torch.randn(4, 3, generator=g).to(dtype), torch.randn(3, generator=g).to(dtype)] for _ in counts]
    return ClientDeltas(list(range(len(counts))), deltas, torch.tensor(counts, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_mean_reuses_its_sums_and_result_across_rounds_and_matches_numpy_bit_for_bit(dtype):
    """Reddi et al. 2021, Alg. 1, l. 10: Δ_t = Σ_i |D_i|·Δ_i / Σ_j |D_j|, summed in float64 and rounded once to
    the parameters' dtype (WeightedMean's docstring); NumPy computes the same from the paper's formula."""
    g, stage, counts, info = torch.Generator().manual_seed(2), WeightedMean(), [5.0, 2.0, 9.0], RoundInfo(0, 0, 3, 3)
    addresses = None
    for round_idx in range(3):
        x = _mean_input(g, counts, dtype)
        mean, _ = stage.apply(x, EmptyState(), info)
        reference = [(sum(c * d[j].double().numpy() for c, d in zip(counts, x.deltas)) / sum(counts)).astype(
            np.float32 if dtype == torch.float32 else np.float64) for j in range(2)]
        assert all(m.dtype == dtype and (m.numpy() == r).all() for m, r in zip(mean, reference))
        now = [m.data_ptr() for m in mean]
        assert addresses is None or now == addresses
        addresses = now
        del mean
    kept, _ = stage.apply(_mean_input(g, counts, dtype), EmptyState(), info)  # a caller keeps this round's Δ_t
    before = [t.clone() for t in kept]
    other, _ = stage.apply(_mean_input(g, counts, dtype), EmptyState(), info)
    assert all(torch.equal(a, b) for a, b in zip(kept, before))
    assert other[0].data_ptr() != kept[0].data_ptr()
    assert copy.deepcopy(stage)._workspace._kept == {} and pickle.loads(pickle.dumps(stage))._workspace._kept == {}


class _Linear32(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.linear(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Deltas(L.Callback):
    """Records each client's Δ_i storage addresses (``keep``: keeps the updates too, as a buffering server would)."""

    def __init__(self, keep: bool):
        self.keep, self.addresses, self.kept = keep, [], []

    def on_train_epoch_start(self, trainer, pl_module):
        self.addresses.append(set())

    def on_client_end(self, trainer, pl_module, update, position):
        self.addresses[-1].update(d.data_ptr() for d in update.delta)
        if self.keep:
            self.kept.append((update, [d.clone() for d in update.delta]))


def _fit(tmp_path, keep: bool):
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(48, 3, generator=g), torch.randn(48, 2, generator=g))
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             batch_size=4)
    model, record = _Linear32(), _Deltas(keep)
    FederatedTrainer(max_epochs=4, callbacks=[FedAvg(lr=1.0), record], **quiet_trainer_kwargs(tmp_path)).fit(
        model, datamodule=dm)
    return [p.detach().clone() for p in model.parameters()], record


def test_a_fit_writes_each_rounds_deltas_into_the_last_rounds_unless_a_callback_keeps_them(tmp_path):
    reused_weights, reused = _fit(tmp_path / "a", keep=False)
    kept_weights, kept = _fit(tmp_path / "b", keep=True)
    assert all(a == reused.addresses[0] for a in reused.addresses[1:])  # round 0's storage, every round
    assert all(not (a & b) for i, a in enumerate(kept.addresses) for b in kept.addresses[:i])  # never reused
    for update, values in kept.kept:  # what the callback kept is untouched by later rounds
        assert all(torch.equal(d, v) for d, v in zip(update.delta, values))
    assert all((_bits(a) == _bits(b)).all() for a, b in zip(reused_weights, kept_weights))
