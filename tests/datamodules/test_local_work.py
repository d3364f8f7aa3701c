"""Tests of the local-work policies and the per-round batch schedule (pure numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_fed.datamodules.local_work import (
    DATA_ORDERS,
    ClientWork,
    FixedLocalSteps,
    FixedLocalWork,
    LocalWork,
    SampledLocalWork,
    batch_schedule,
    num_local_steps,
)

CLIENT = np.arange(1000, 1047, dtype=np.int64)  # a client with 47 samples, non-trivial dataset indices


def epochs_of(batches: list[np.ndarray], per_epoch: int) -> list[np.ndarray]:
    return [np.concatenate(batches[e * per_epoch : (e + 1) * per_epoch]) for e in range(len(batches) // per_epoch)]


# ----------------------------------------------------------------------------------- ClientWork / policies
def test_client_work_validation():
    assert ClientWork(2, 10) == ClientWork(epochs=2, batch_size=10, steps=None)
    with pytest.raises(ValueError, match="epochs"):
        ClientWork(0, 10)
    with pytest.raises(TypeError, match="epochs"):
        ClientWork(1.5, 10)
    with pytest.raises(ValueError, match="batch_size"):
        ClientWork(1, 0)
    with pytest.raises(ValueError, match="steps"):
        ClientWork(1, 4, steps=0)
    with pytest.raises(AttributeError):
        ClientWork(1, 4).epochs = 3  # frozen


def test_fixed_policies():
    assert FixedLocalWork().plan(0, 0, 100) == ClientWork(epochs=1, batch_size=20)
    assert FixedLocalWork(5, 50).plan(3, 7, 10) == ClientWork(epochs=5, batch_size=50)
    assert FixedLocalSteps(steps=12, batch_size=32).plan(1, 2, 5) == ClientWork(epochs=1, batch_size=32, steps=12)
    assert isinstance(FixedLocalWork(), LocalWork)
    with pytest.raises(ValueError, match="local_epochs"):
        FixedLocalWork(local_epochs=0)
    with pytest.raises(TypeError, match="batch_size"):
        FixedLocalWork(batch_size="20")
    with pytest.raises(ValueError, match="steps"):
        FixedLocalSteps(0, 10)
    with pytest.raises(ValueError, match="cid"):
        FixedLocalWork().plan(-1, 0, 10)
    with pytest.raises(ValueError, match="round_idx"):
        FixedLocalSteps(3, 4).plan(0, -2, 10)


def test_sampled_local_work_ranges_and_coverage():
    policy = SampledLocalWork(seed=0)  # FedAWARE Hybrid+: E ~ U{2..5}, B ~ U{10..|D_i|}
    sizes = np.random.default_rng(0).integers(10, 200, size=100)
    epochs, ratios = [], []
    for r in range(20):
        for cid, n in enumerate(sizes):
            w = policy.plan(cid, r, int(n))
            assert w.steps == (w.epochs * int(n)) // w.batch_size  # steps_rule="paper": K = floor(E |D| / B)
            assert 2 <= w.epochs <= 5 and 10 <= w.batch_size <= n
            epochs.append(w.epochs)
            ratios.append(w.batch_size)
    counts = np.bincount(epochs, minlength=6)[2:]
    assert set(np.unique(epochs)) == {2, 3, 4, 5}
    assert counts.min() > 0.2 * len(epochs) and counts.max() < 0.3 * len(epochs)  # uniform: ~25% each
    # both ends of the batch range are reached on a small client
    bs = {policy.plan(0, r, 12).batch_size for r in range(200)}
    assert bs == {10, 11, 12}


def test_sampled_local_work_small_client_and_bounds():
    policy = SampledLocalWork(epochs=(1, 1), batch_size=(10, 64), seed=3)
    assert all(policy.plan(c, 0, 7).batch_size == 7 for c in range(20))  # |D_i| < 10: the whole client
    assert all(10 <= policy.plan(c, 0, 1000).batch_size <= 64 for c in range(50))
    assert all(policy.plan(c, 0, 30).batch_size <= 30 for c in range(50))  # high clipped to |D_i|
    assert policy.plan(0, 0, 0).batch_size == 1
    assert SampledLocalWork(epochs=3, batch_size=16).plan(4, 4, 100) == ClientWork(3, 16, steps=18)  # floor(300/16)
    assert SampledLocalWork(epochs=3, batch_size=16, steps_rule="epochs").plan(4, 4, 100) == ClientWork(3, 16)


def test_sampled_local_work_determinism_independent_of_order():
    a, b = SampledLocalWork(seed=7), SampledLocalWork(seed=7)
    cohort = [(c, 100 + 3 * c) for c in range(30)]
    forward = {c: a.plan(c, 4, n) for c, n in cohort}
    _ = [b.plan(99, 0, 500) for _ in range(5)]  # unrelated draws in between do not matter
    backward = {c: b.plan(c, 4, n) for c, n in reversed(cohort)}
    assert forward == backward
    # the documented seeding: rng([seed, round, cid]), epochs first then batch size
    rng = np.random.default_rng([7, 4, 5])
    e = int(rng.integers(2, 5, endpoint=True))
    bsz = int(rng.integers(10, 115, endpoint=True))
    assert forward[5] == ClientWork(e, bsz, steps=(e * 115) // bsz)
    other_seed = [SampledLocalWork(seed=8).plan(c, 4, n) for c, n in cohort]
    assert other_seed != [forward[c] for c, _ in cohort]
    other_round = [a.plan(c, 5, n) for c, n in cohort]
    assert other_round != [forward[c] for c, _ in cohort]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"epochs": (5, 2)}, ValueError, r"epochs.*low=5 > high=2"),
        ({"epochs": (0, 2)}, ValueError, r"epochs\[0\]"),
        ({"epochs": (2, None)}, TypeError, r"epochs\[1\]"),
        ({"epochs": "2-5"}, TypeError, "epochs"),
        ({"batch_size": (0, None)}, ValueError, r"batch_size\[0\]"),
        ({"batch_size": (32, 16)}, ValueError, "batch_size"),
        ({"batch_size": (1, 2, 3)}, TypeError, "batch_size"),
        ({"seed": -1}, ValueError, "seed"),
    ],
)
def test_sampled_local_work_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SampledLocalWork(**kwargs)


# ----------------------------------------------------------------------------------- batch_schedule
@pytest.mark.parametrize("order", DATA_ORDERS)
def test_every_epoch_is_a_permutation(order):
    work = ClientWork(epochs=3, batch_size=10)
    batches = batch_schedule(CLIENT, work, round_idx=2, cid=5, seed=0, data_order=order)
    assert len(batches) == 3 * 5 == num_local_steps(len(CLIENT), work)
    assert [len(b) for b in batches[:5]] == [10, 10, 10, 10, 7]
    assert all(b.dtype == np.int64 for b in batches)
    for epoch in epochs_of(batches, 5):
        np.testing.assert_array_equal(np.sort(epoch), CLIENT)


def test_none_is_dataset_order():
    batches = batch_schedule(CLIENT, ClientWork(2, 20), 0, 0, 0, data_order="none")
    np.testing.assert_array_equal(np.concatenate(batches[:3]), CLIENT)
    np.testing.assert_array_equal(np.concatenate(batches[3:]), CLIENT)


def test_reshuffle_differs_between_epochs_and_rounds_and_is_deterministic():
    work = ClientWork(epochs=2, batch_size=47)
    r0 = batch_schedule(CLIENT, work, round_idx=0, cid=3, seed=1)
    assert not np.array_equal(r0[0], r0[1])  # fresh permutation per epoch
    np.testing.assert_array_equal(np.concatenate(r0), np.concatenate(batch_schedule(CLIENT, work, 0, 3, 1)))
    r1 = batch_schedule(CLIENT, work, round_idx=1, cid=3, seed=1)
    assert not np.array_equal(r0[0], r1[0])
    assert not np.array_equal(r0[0], batch_schedule(CLIENT, work, 0, 4, 1)[0])  # other client
    assert not np.array_equal(r0[0], batch_schedule(CLIENT, work, 0, 3, 2)[0])  # other seed


def test_once_is_the_same_every_epoch_and_round():
    work = ClientWork(epochs=3, batch_size=47)
    first = batch_schedule(CLIENT, work, round_idx=0, cid=8, seed=4, data_order="once")
    assert not np.array_equal(first[0], CLIENT)  # it is shuffled
    for r in (0, 1, 17):
        for b in batch_schedule(CLIENT, work, round_idx=r, cid=8, seed=4, data_order="once"):
            np.testing.assert_array_equal(b, first[0])
    assert not np.array_equal(first[0], batch_schedule(CLIENT, work, 0, 9, 4, data_order="once")[0])


@pytest.mark.parametrize("order", DATA_ORDERS)
@pytest.mark.parametrize(
    ("steps", "bs", "drop_last"), [(1, 10, False), (13, 10, False), (13, 10, True), (7, 100, False)]
)
def test_steps_budget(order, steps, bs, drop_last):
    work = ClientWork(epochs=1, batch_size=bs, steps=steps)
    batches = batch_schedule(CLIENT, work, 3, 2, 0, data_order=order, drop_last=drop_last)
    assert len(batches) == steps == num_local_steps(len(CLIENT), work, drop_last)
    per_pass = len(CLIENT) // bs if drop_last else math.ceil(len(CLIENT) / bs)
    # the step schedule is the prefix of the epoch schedule with enough epochs
    enough = ClientWork(epochs=math.ceil(steps / per_pass), batch_size=bs)
    full = batch_schedule(CLIENT, enough, 3, 2, 0, order, drop_last)
    for got, want in zip(batches, full[:steps], strict=True):
        np.testing.assert_array_equal(got, want)
    if drop_last:
        assert all(len(b) == bs for b in batches)
        for epoch in epochs_of(batches, per_pass):  # each pass: distinct samples of the client
            assert len(np.unique(epoch)) == len(epoch) and np.isin(epoch, CLIENT).all()


def test_drop_last_and_empty_clients():
    assert batch_schedule(CLIENT, ClientWork(1, 50), 0, 0, 0, drop_last=True) == []
    assert batch_schedule(np.array([], dtype=np.int64), ClientWork(2, 5), 0, 0, 0) == []
    with pytest.raises(ValueError, match="no batch of `batch_size`=50.*drop_last"):
        batch_schedule(CLIENT, ClientWork(1, 50, steps=3), 0, 0, 0, drop_last=True)
    with pytest.raises(ValueError, match="steps"):
        batch_schedule(np.array([], dtype=np.int64), ClientWork(1, 5, steps=2), 0, 0, 0)


def test_batch_schedule_bad_arguments():
    work = ClientWork(1, 8)
    with pytest.raises(ValueError, match=r"data_order.*reshuffle.*once.*none.*'shuffle'"):
        batch_schedule(CLIENT, work, 0, 0, 0, data_order="shuffle")
    with pytest.raises(TypeError, match="work"):
        batch_schedule(CLIENT, (1, 8), 0, 0, 0)
    with pytest.raises(ValueError, match="round_idx"):
        batch_schedule(CLIENT, work, -1, 0, 0)
    with pytest.raises(ValueError, match="seed"):
        batch_schedule(CLIENT, work, 0, 0, -3)
    with pytest.raises(ValueError, match="indices"):
        batch_schedule(CLIENT.astype(float), work, 0, 0, 0)
    with pytest.raises(TypeError, match="drop_last"):
        batch_schedule(CLIENT, work, 0, 0, 0, drop_last="yes")


# ----------------------------------------------------------------------------------- #49: one-sample batches
@pytest.mark.parametrize("n, work, drop_last, limit", [
    (21, ClientWork(1, 10), False, None), (21, ClientWork(1, 10), True, None), (21, ClientWork(1, 10), False, 2),
    (22, ClientWork(3, 10), False, None), (1, ClientWork(2, 10), False, None), (5, ClientWork(1, 1), True, None),
    (11, ClientWork(1, 10, steps=1), False, None), (11, ClientWork(1, 10, steps=2), False, None),
    (31, ClientWork(1, 10, steps=7), False, 3), (0, ClientWork(1, 10), False, None), (10, ClientWork(1, 10), False, 1),
])
def test_49_has_single_sample_batch_agrees_with_the_schedule(n, work, drop_last, limit):
    from lightning_fed.datamodules.local_work import has_single_sample_batch

    if work.steps is not None and n == 0:
        return
    batches = batch_schedule(np.arange(n), work, round_idx=0, cid=0, seed=0, drop_last=drop_last)
    batches = batches if limit is None else batches[:limit]
    assert has_single_sample_batch(n, work, drop_last, limit) == any(len(b) == 1 for b in batches)


def test_49_single_sample_batch_clients_names_them_with_their_size_and_batch_size():
    from lightning_fed.datamodules.local_work import single_sample_batch_clients

    sizes = [21, 20, 1, 12, 41, 3]
    # by hand: batches of 10 leave one sample for 21 and 41 (mod 10 == 1) and the one-sample client
    assert single_sample_batch_clients(sizes, FixedLocalWork(batch_size=10)) == [(0, 21, 10), (2, 1, 10), (4, 41, 10)]
    assert single_sample_batch_clients(sizes, FixedLocalWork(batch_size=10), drop_last=True) == []
    assert single_sample_batch_clients(sizes, FixedLocalSteps(steps=2, batch_size=10)) == [(2, 1, 10)]  # 21: 2 full
    assert single_sample_batch_clients(sizes, FixedLocalWork(batch_size=2)) == [(0, 21, 2), (2, 1, 2), (4, 41, 2),
                                                                                 (5, 3, 2)]
    assert single_sample_batch_clients(sizes, SampledLocalWork(seed=0)) == [(2, 1, 1)]
