"""Shard partition: sort by label, cut into equal shards, deal a few shards to every client."""

from __future__ import annotations

import numpy as np

from .partition import Partition, Partitioner, _check_int, _check_seed

__all__ = ["ShardPartitioner"]


class ShardPartitioner(Partitioner):
    """The pathological non-IID split of McMahan et al. 2017 (label-sorted shards).

    McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
    AISTATS 2017, Sec. 3: sort the data by label (stable sort, so ties keep dataset order), divide it
    into ``num_clients * shards_per_client`` shards of equal size, and give every client
    ``shards_per_client`` shards chosen at random (a seeded permutation of the shards, dealt in
    order). With 10 classes, 200 shards and 2 shards per client, most clients see only two labels.
    FedAWARE's "Statistical only" setting (Zeng et al. 2024, arXiv:2310.02702, Sec. 5) is 100 clients x 2 shards.

    Remainder: with ``n`` samples and ``S = num_clients * shards_per_client`` shards, the shard size
    is ``n // S`` and the first ``n % S`` shards (in label-sorted order) get one extra sample, so
    every sample is assigned and client sizes differ by at most ``shards_per_client``. When ``S``
    divides ``n`` every client holds exactly ``shards_per_client * n // S`` samples.

    Args:
        num_clients: number of clients (int >= 1).
        shards_per_client: shards per client (int >= 1, default 2).
        seed: seed of the shard dealing (int >= 0, default 0).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range; at :meth:`partition` time, more shards than samples.
    """

    requires = "labels"

    def __init__(self, num_clients: int, shards_per_client: int = 2, seed: int = 0) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.shards_per_client = _check_int("shards_per_client", shards_per_client, minimum=1)
        self.seed = _check_seed(seed)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        num_shards = self.num_clients * self.shards_per_client
        if num_shards > num_samples:
            raise ValueError(
                f"more shards than samples: `num_clients`={self.num_clients} x `shards_per_client`="
                f"{self.shards_per_client} = {num_shards} shards > num_samples={num_samples}; "
                "lower num_clients or shards_per_client"
            )
        by_label = np.argsort(labels, kind="stable").astype(np.int64)
        base, rem = divmod(num_samples, num_shards)
        shard_sizes = np.full(num_shards, base, dtype=np.int64)
        shard_sizes[:rem] += 1
        shard_starts = np.concatenate(([0], np.cumsum(shard_sizes)[:-1]))

        dealt = np.random.default_rng(self.seed).permutation(num_shards)  # client c: dealt[c*k:(c+1)*k]
        lengths = shard_sizes[dealt]
        out_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        # position p of the output, inside dealt shard j, reads by_label[shard_starts[dealt[j]] + p - out_starts[j]]
        gather = np.repeat(shard_starts[dealt] - out_starts, lengths) + np.arange(num_samples, dtype=np.int64)
        indices = by_label[gather]

        client_sizes = lengths.reshape(self.num_clients, self.shards_per_client).sum(axis=1)
        offsets = np.zeros(self.num_clients + 1, dtype=np.int64)
        np.cumsum(client_sizes, out=offsets[1:])
        return Partition(indices, offsets, labels, num_classes)
