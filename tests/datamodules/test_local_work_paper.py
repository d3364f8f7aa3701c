"""FedAWARE Hybrid+ local steps K_i = floor(E_i |D_i| / B_i) (Zeng et al. 2024, Sec. 5) in SampledLocalWork."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.local_work import (
    DATA_ORDERS,
    STEPS_RULES,
    ClientWork,
    SampledLocalWork,
    batch_schedule,
    num_local_steps,
)

# (E, |D|, B) -> (K of the paper, E * ceil(|D| / B) of the "epochs" rule), by hand.
HAND = [
    ((2, 25, 10), (5, 6)),  # floor(50/10) = 5;  2 * 3 = 6
    ((3, 47, 10), (14, 15)),  # floor(141/10) = 14;  3 * 5 = 15
    ((4, 101, 33), (12, 16)),  # floor(404/33) = 12 (396);  4 * 4 = 16
    ((5, 36, 12), (15, 15)),  # B divides |D|: both 15
    ((2, 7, 10), (2, 2)),  # |D| < 10: B = |D| = 7, floor(14/7) = 2
    ((3, 1, 10), (3, 3)),  # one sample: B = 1
    ((5, 64, 63), (5, 10)),  # floor(320/63) = 5;  5 * 2 = 10
]


@pytest.mark.parametrize(("edb", "want"), HAND)
def test_k_matches_hand_computed_values(edb, want):
    e, n, b = edb
    paper = SampledLocalWork(epochs=e, batch_size=b).plan(3, 1, n)
    assert paper.steps == want[0] and paper.epochs == e and paper.batch_size == min(b, n)
    assert num_local_steps(n, paper) == want[0]
    epochs = SampledLocalWork(epochs=e, batch_size=b, steps_rule="epochs").plan(3, 1, n)
    assert epochs.steps is None and num_local_steps(n, epochs) == want[1]


def test_paper_rule_is_the_default_and_draws_do_not_change():
    assert SampledLocalWork().steps_rule == "paper" and STEPS_RULES == ("paper", "epochs")
    paper, old = SampledLocalWork(seed=5), SampledLocalWork(seed=5, steps_rule="epochs")
    rng = np.random.default_rng(1)
    differ = 0
    for r in range(40):
        for cid in range(40):
            n = int(rng.integers(1, 400))
            p, o = paper.plan(cid, r, n), old.plan(cid, r, n)
            assert (p.epochs, p.batch_size) == (o.epochs, o.batch_size)  # same E_i, B_i draws
            assert p.steps == (p.epochs * n) // p.batch_size >= p.epochs
            differ += p.steps != num_local_steps(n, o)
            assert (p.steps != num_local_steps(n, o)) == (n % p.batch_size != 0)
    assert differ > 0


def test_client_without_samples_is_left_as_before():
    """K = 0 for |D_i| = 0: no steps under either rule (zero-step handling belongs to the data module/loop)."""
    for rule in STEPS_RULES:
        work = SampledLocalWork(epochs=3, steps_rule=rule).plan(0, 0, 0)
        assert work == ClientWork(epochs=3, batch_size=1) and num_local_steps(0, work) == 0


def test_bad_steps_rule_names_the_argument():
    for bad in ("floor", "Paper", None, 1):
        with pytest.raises(ValueError, match=r"`steps_rule` must be one of \('paper', 'epochs'\)"):
            SampledLocalWork(steps_rule=bad)


@pytest.mark.parametrize("order", DATA_ORDERS)
def test_partial_last_epoch_follows_the_data_order(order):
    """|D| = 25, B = 10, E = 2: 3 batches per epoch (10, 10, 5) and K = 5, so epoch 0 is whole and epoch 1 stops
    after 2 batches; those are the first 20 positions of epoch 1's order, the same order the "epochs" rule uses."""
    idx = np.arange(500, 525, dtype=np.int64)
    work = SampledLocalWork(epochs=2, batch_size=10).plan(4, 7, 25)
    assert work.steps == 5
    got = batch_schedule(idx, work, round_idx=7, cid=4, seed=9, data_order=order)
    full = batch_schedule(idx, ClientWork(2, 10), round_idx=7, cid=4, seed=9, data_order=order)
    assert [len(b) for b in got] == [10, 10, 5, 10, 10] and len(full) == 6
    for a, b in zip(got, full[:5]):
        np.testing.assert_array_equal(a, b)
    assert sorted(np.concatenate(got[:3]).tolist()) == idx.tolist()  # epoch 0: a permutation
    epoch1 = np.concatenate(full[3:])
    np.testing.assert_array_equal(np.concatenate(got[3:]), epoch1[:20])
    epoch0 = np.concatenate(got[:3])
    if order == "none":
        np.testing.assert_array_equal(epoch0, idx)
        np.testing.assert_array_equal(epoch1, idx)
    elif order == "once":
        np.testing.assert_array_equal(epoch1, epoch0)  # shuffle-once: the same order every epoch
    else:
        assert not np.array_equal(epoch1, epoch0)  # reshuffled


def test_drop_last_continues_into_a_further_epoch():
    """With drop_last, 2 full batches per epoch of 25: K = floor(2*25/10) = 5 needs epochs 0, 1 and one batch of 2."""
    idx = np.arange(25, dtype=np.int64)
    work = SampledLocalWork(epochs=2, batch_size=10).plan(0, 0, 25)
    got = batch_schedule(idx, work, round_idx=0, cid=0, seed=0, data_order="once", drop_last=True)
    assert [len(b) for b in got] == [10] * 5
    order = np.concatenate(got[:2])
    np.testing.assert_array_equal(np.concatenate(got[2:4]), order)
    np.testing.assert_array_equal(got[4], order[:10])


class _ListDataset(Dataset):
    """A plain map-style dataset (not tensor-backed): the data module serves it through a torch DataLoader."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("tensor_backed", [True, False])
def test_client_loader_gives_k_steps(tensor_backed):
    """100 samples over 4 IID clients (25 each), E ~ U{2..3}, B ~ U{10..25}: each client's loader yields
    floor(E |D| / B) batches whose samples are the scheduled ones."""
    x = torch.arange(100, dtype=torch.float32).unsqueeze(1)
    y = torch.arange(100)
    dataset = TensorDataset(x, y) if tensor_backed else _ListDataset(x, y)
    dm = FederatedDataModule(
        dataset, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=4,
        local_work=SampledLocalWork(epochs=(2, 3), batch_size=(10, None), seed=3), seed=3,
    )
    dm.setup()
    partial = 0
    for r in range(6):
        for cid in range(4):
            n = dm.client_num_samples(cid)
            work = dm.client_work(cid, r)
            k = (work.epochs * n) // work.batch_size
            assert work.steps == k
            batches = list(dm.client_dataloader(cid, r))
            assert len(batches) == k
            scheduled = dm.client_batches(cid, r)
            for (_, yb), want in zip(batches, scheduled):
                np.testing.assert_array_equal(yb.numpy(), want)
            per_epoch = -(-n // work.batch_size)
            partial += k % per_epoch != 0
    assert partial > 0, "some draws end inside an epoch"


def test_batch_size_upper_dataset_size_minus_one_is_the_public_codes_draw():
    """#34: ``batch_size_upper="dataset_size_minus_one"`` draws B_i ~ U{10..|D_i|−1} (the authors' code,
    ``np.random.randint(10, |D_i|)``), B_i = |D_i| for |D_i| <= 10; the default reaches |D_i|. Over 4,000 draws on
    |D_i| = 12 the default hits {10, 11, 12} and the option {10, 11} only, each about equally often."""
    from lightning_fed.datamodules.local_work import BATCH_SIZE_UPPERS

    assert BATCH_SIZE_UPPERS == ("dataset_size", "dataset_size_minus_one")
    paper = SampledLocalWork(epochs=1, seed=0, steps_rule="epochs")
    code = SampledLocalWork(epochs=1, seed=0, steps_rule="epochs", batch_size_upper="dataset_size_minus_one")
    assert paper.batch_size_upper == "dataset_size"
    drawn_paper = [paper.plan(c, r, 12).batch_size for r in range(40) for c in range(100)]
    drawn_code = [code.plan(c, r, 12).batch_size for r in range(40) for c in range(100)]
    assert sorted(set(drawn_paper)) == [10, 11, 12] and sorted(set(drawn_code)) == [10, 11]
    assert abs(drawn_code.count(10) / 4000 - 0.5) < 0.05
    assert code.plan(0, 0, 11).batch_size == 10  # randint(10, 11) = 10
    assert {code.plan(c, 0, 10).batch_size for c in range(20)} == {10}  # |D_i| <= 10: the whole client
    assert {code.plan(c, 0, 7).batch_size for c in range(20)} == {7}
    fixed_high = SampledLocalWork(epochs=1, batch_size=(10, 12), batch_size_upper="dataset_size_minus_one")
    assert 12 in {fixed_high.plan(c, 0, 50).batch_size for c in range(200)}  # a given high end is unaffected
    with pytest.raises(ValueError, match=r"`batch_size_upper` must be one of \('dataset_size', 'dataset_size_minus_one'\)"):
        SampledLocalWork(batch_size_upper="exclusive")
