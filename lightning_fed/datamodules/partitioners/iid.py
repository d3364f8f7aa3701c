"""IID partition: a uniformly random, near-equal split of the samples among clients."""

from __future__ import annotations

import numpy as np

from ..partition import Partition, Partitioner, _check_int, _check_seed

__all__ = ["IIDPartitioner"]


class IIDPartitioner(Partitioner):
    """Shuffle all samples with a seeded permutation and cut them into ``num_clients`` contiguous pieces.

    The homogeneous baseline of McMahan et al., "Communication-Efficient Learning of Deep Networks
    from Decentralized Data", AISTATS 2017. Client sizes differ by at most one: with ``n`` samples,
    the first ``n % num_clients`` clients get ``n // num_clients + 1`` samples, the others
    ``n // num_clients``. Every sample lands in exactly one client.

    Args:
        num_clients: number of clients (int >= 1).
        seed: seed of the permutation (int >= 0, default 0); the same seed gives the same partition
            on any machine (``np.random.default_rng``).

    Raises:
        TypeError: ``num_clients`` or ``seed`` is not an int.
        ValueError: ``num_clients < 1`` or ``seed < 0``; at :meth:`partition` time, more clients than samples.

    Example: 12 samples over 5 clients: the first 12 % 5 = 2 clients get 3 samples, the others 2::

        >>> import numpy as np
        >>> labels = np.repeat([0, 1, 2], 4)  # 12 samples, 4 of each of 3 classes
        >>> p = IIDPartitioner(num_clients=5, seed=0).partition(12, labels)
        >>> p.sizes(), int(np.sort(p.indices).tolist() == list(range(12)))  # every sample exactly once
        (array([3, 3, 2, 2, 2]), 1)
        >>> IIDPartitioner(num_clients=13).partition(12)
        Traceback (most recent call last):
        ...
        ValueError: more clients than samples: `num_clients`=13 > num_samples=12; use at most num_samples clients
    """

    requires = "none"

    def __init__(self, num_clients: int, seed: int = 0) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.seed = _check_seed(seed)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        if self.num_clients > num_samples:
            raise ValueError(
                f"more clients than samples: `num_clients`={self.num_clients} > num_samples={num_samples}; "
                "use at most num_samples clients"
            )
        perm = np.random.default_rng(self.seed).permutation(num_samples).astype(np.int64)
        base, rem = divmod(num_samples, self.num_clients)
        sizes = np.full(self.num_clients, base, dtype=np.int64)
        sizes[:rem] += 1
        offsets = np.zeros(self.num_clients + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return Partition(perm, offsets, labels, num_classes)
