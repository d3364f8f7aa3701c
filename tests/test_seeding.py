"""lightning_fed/seeding.py: NumPy's seeding from a few small ints read as a uint32 array — the same SeedSequence
pool and states, the same PCG64 generator and draws as NumPy's own reading of the list, bit for bit (issue #51);
and the two seeds read through it per client and round (client_seed, batch_schedule) against NumPy's list path."""

import numpy as np
import pytest

from lightning_fed.client.sequential import client_seed
from lightning_fed.datamodules.local_work import ClientWork, batch_schedule
from lightning_fed.seeding import default_rng, seed_entropy, seed_sequence

EDGES = [0, 1, 7, 0x7C1E, 2**31, 2**32 - 1]


def _cases():
    rng = np.random.Generator(np.random.PCG64(2026))
    cases = [tuple(EDGES[:k]) for k in range(1, len(EDGES) + 1)] + [(2**32 - 1,) * 6, (0, 0, 0, 0, 0)]
    for length in (1, 2, 3, 4, 5, 6, 9):
        for _ in range(20):
            cases.append(tuple(int(v) for v in rng.integers(0, 2**32, size=length)))
    return cases


def test_a_uint32_array_seeds_as_numpy_reads_the_list():
    for values in _cases():
        ours, numpys = seed_sequence(*values), np.random.SeedSequence(list(values))
        assert isinstance(seed_entropy(*values), np.ndarray)
        assert ours.pool.tolist() == numpys.pool.tolist(), values
        assert ours.generate_state(3).tolist() == numpys.generate_state(3).tolist()
        assert ours.generate_state(4, np.uint64).tolist() == numpys.generate_state(4, np.uint64).tolist()
        a, b = default_rng(*values), np.random.default_rng(list(values))
        assert a.bit_generator.state == b.bit_generator.state
        assert a.permutation(97).tolist() == b.permutation(97).tolist() and a.random() == b.random()


@pytest.mark.parametrize("values", [(2**32,), (3, 2**40 + 5), (-1, 2), (np.int64(3), 4), (True, 2), (1.0, 2)])
def test_other_values_are_read_by_numpy_as_the_list(values):
    assert seed_entropy(*values) == list(values)
    try:
        expected = np.random.SeedSequence(list(values)).pool.tolist()
    except (TypeError, ValueError) as error:  # NumPy's own error, unchanged
        with pytest.raises(type(error)):
            seed_sequence(*values)
        return
    assert seed_sequence(*values).pool.tolist() == expected


def test_client_seed_and_the_batch_order_are_numpys_list_seeding():
    """The executor's torch seed and a client's reshuffled / shuffled-once batches equal NumPy's list-seeded ones."""
    tag_reshuffle, tag_once = 0x52534846, 0x4F4E4345  # local_work's tags ("RSHF", "ONCE")
    idx = np.arange(100, 137)
    for seed, round_idx, cid in [(0, 0, 0), (0, 3, 17), (12345, 999, 4_000_000), (2**32 - 1, 7, 2**32 - 1),
                                 (2**40, 1, 2)]:
        expected = int(np.random.SeedSequence([seed, 0x7C1E, round_idx, cid]).generate_state(1, dtype=np.uint32)[0])
        assert client_seed(seed, round_idx, cid) == expected
        work = ClientWork(epochs=1, batch_size=5, steps=9)  # 8 batches a pass: epochs 0 and 1
        got = batch_schedule(idx, work, round_idx, cid, seed)
        orders = [idx[np.random.default_rng([seed, round_idx, cid, e, tag_reshuffle]).permutation(37)] for e in (0, 1)]
        expected_batches = [orders[0][i:i + 5] for i in range(0, 37, 5)] + [orders[1][:5]]  # a pass's last holds 2
        assert [b.tolist() for b in got] == [b.tolist() for b in expected_batches]
        once = batch_schedule(idx, ClientWork(epochs=1, batch_size=37), round_idx, cid, seed, data_order="once")
        assert once[0].tolist() == idx[np.random.default_rng([seed, cid, tag_once]).permutation(37)].tolist()
