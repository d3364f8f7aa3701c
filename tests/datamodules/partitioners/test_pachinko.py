"""CIFAR-10/100 data modules, the Pachinko partitioner and the CIFAR ResNets.

The fake CIFAR files are written in the REAL python-pickle layout torchvision reads
(``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``; ``cifar-100-python/train``,
``test``, ``meta`` with ``fine_labels`` / ``coarse_labels``; ``data`` uint8 ``[N, 3072]`` in CHW row-major
order) and read back by torchvision's own reader. Their md5s differ from torchvision's, so the data
modules are given ``check_md5=False`` (documented option; one test checks the md5 path rejects them).
"""

from __future__ import annotations

import numpy as np
import pytest
from lightning_fed.datamodules.partitioners.pachinko import CIFAR100_COARSE_OF_FINE, PachinkoPartitioner
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


# ---------------------------------------------------------------------------------------------- Pachinko
def _synthetic(per_fine=60, num_fine=100, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_fine), per_fine))


def test_coarse_map_is_cifar100s():
    cof = np.asarray(CIFAR100_COARSE_OF_FINE)
    assert cof.shape == (100,) and np.array_equal(np.bincount(cof), np.full(20, 5))
    # apple -> fruit_and_vegetables, aquarium_fish -> fish, baby -> people, bear -> large_carnivores,
    # beaver -> aquatic_mammals, whale (95) -> aquatic_mammals, worm (99) -> non-insect_invertebrates
    assert [cof[i] for i in (0, 1, 2, 3, 4, 95, 99)] == [4, 1, 14, 8, 0, 0, 13]


def test_pachinko_sizes_disjoint_deterministic():
    labels = _synthetic()
    p = PachinkoPartitioner(num_clients=50, samples_per_client=100, seed=3)
    a, b = p.partition(labels.size, labels), p.partition(labels.size, labels)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)
    assert np.array_equal(a.sizes(), np.full(50, 100))
    assert np.unique(a.indices).size == a.indices.size == 5000
    c = PachinkoPartitioner(num_clients=50, samples_per_client=100, seed=4).partition(labels.size, labels)
    assert not np.array_equal(a.indices, c.indices)


def test_pachinko_uses_every_sample_when_labels_run_out():
    # all 6000 samples requested: every fine label runs out, nothing is reused or lost
    labels = _synthetic()
    part = PachinkoPartitioner(num_clients=60, samples_per_client=100, alpha=0.1, beta=10).partition(labels.size, labels)
    assert np.array_equal(np.sort(part.indices), np.arange(labels.size))


def test_pachinko_exhausted_label_never_drawn_again():
    # fine label 0 (coarse 0 under a 2x2 map) has 3 samples; with alpha tiny, clients concentrate on one coarse
    labels = np.array([0] * 3 + [1] * 200 + [2] * 200 + [3] * 200)
    cof = [0, 0, 1, 1]
    part = PachinkoPartitioner(num_clients=20, samples_per_client=20, alpha=1e-3, beta=1e-3, coarse_of_fine=cof,
                               seed=1).partition(labels.size, labels)
    drawn = labels[part.indices]  # in draw order (client by client, sample by sample)
    assert np.count_nonzero(drawn == 0) == 3
    assert np.unique(part.indices).size == part.indices.size
    # after a label's last sample is drawn it never appears again (trivially true without replacement,
    # checked through the draw order); and clients whose coarse label ran dry still get full sizes
    last0 = np.flatnonzero(drawn == 0).max()
    assert not (drawn[last0 + 1 :] == 0).any()
    assert np.array_equal(part.sizes(), np.full(20, 20))


def test_pachinko_skew_alpha():
    labels = _synthetic()
    cof = np.asarray(CIFAR100_COARSE_OF_FINE)

    def mean_top_coarse(alpha):
        part = PachinkoPartitioner(num_clients=40, samples_per_client=100, alpha=alpha, beta=10).partition(
            labels.size, labels
        )
        fracs = []
        for cid in range(part.num_clients):
            counts = np.bincount(cof[labels[part.client_indices(cid)]], minlength=20)
            fracs.append(counts.max() / counts.sum())
        return float(np.mean(fracs))

    strong, weak = mean_top_coarse(0.1), mean_top_coarse(100.0)
    assert strong > 0.5, strong
    assert weak < 0.15, weak  # close to IID: 1/20 = 0.05 plus sampling noise


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_clients": 0}, "num_clients"),
        ({"samples_per_client": 0}, "samples_per_client"),
        ({"alpha": 0.0}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"coarse_of_fine": [0, -1]}, "coarse_of_fine"),
        ({"seed": -1}, "seed"),
    ],
)
def test_pachinko_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PachinkoPartitioner(**kwargs)


def test_pachinko_too_few_samples_and_unknown_label():
    with pytest.raises(ValueError, match="samples_per_client"):
        PachinkoPartitioner(num_clients=10, samples_per_client=10).partition(50, np.arange(50) % 100)
    with pytest.raises(ValueError, match="coarse_of_fine"):
        PachinkoPartitioner(num_clients=1, samples_per_client=1, coarse_of_fine=[0, 0]).partition(3, np.array([0, 1, 2]))
