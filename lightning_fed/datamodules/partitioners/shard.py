"""Shard partition: sort by label, cut into equal shards, deal a few shards to every client."""

from __future__ import annotations

import numpy as np

from ..partition import Partition, Partitioner, _check_int, _check_seed

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

    Fixed shard size (Flower's ``shard_size`` / ``keep_incomplete_shard``): with ``shard_size = s`` the
    label-sorted data is cut into ``floor(n / s)`` complete shards of ``s`` consecutive samples, plus, when
    ``keep_incomplete_shard=True`` and ``s`` does not divide ``n``, one last shard of the ``n % s`` remaining
    samples (otherwise those samples belong to no client). A seeded permutation of these ``S`` usable shards is then
    dealt in order:

    - ``shards_per_client = k`` given: client ``c`` gets the ``k`` shards at permutation positions
      ``c*k .. c*k+k-1``; the ``S - N*k`` shards left over belong to no client (their samples are left out of the
      partition). ``N * k > S`` is an error.
    - ``shards_per_client=None``: every usable shard is dealt, client ``c`` getting ``floor(S / N)`` shards plus one
      more for the first ``S % N`` clients (Flower's ``num_shards_per_partition=None``).

    (Flower, given both ``shard_size`` and ``num_shards_per_partition``, never uses the incomplete shard; here a kept
    incomplete shard is one of the usable shards in both cases.)

    Args:
        num_clients: number of clients (int >= 1).
        shards_per_client: shards per client (int >= 1, default 2); ``None`` only with ``shard_size`` (deal all).
        seed: seed of the shard dealing (int >= 0, default 0).
        shard_size: samples per shard (int >= 1, keyword-only, default ``None``: ``n // (N * k)`` with the remainder
            spread as above, every sample used).
        keep_incomplete_shard: keep the last, smaller shard (bool, keyword-only, default ``False``); only with
            ``shard_size``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument is out of range, ``shards_per_client=None`` without ``shard_size``,
            ``keep_incomplete_shard=True`` without ``shard_size``; at :meth:`partition` time, more shards than
            samples, more shards wanted than usable, or (``shards_per_client=None``) fewer usable shards than clients.

    Example: 3 clients x 2 shards = 6 label-sorted shards of 12 // 6 = 2 samples; each client gets the 2 shards
    of one class here::

        >>> import numpy as np
        >>> labels = np.repeat([0, 1, 2], 4)  # 12 samples, 4 of each of 3 classes
        >>> p = ShardPartitioner(num_clients=3, shards_per_client=2, seed=0).partition(12, labels)
        >>> p.sizes()
        array([4, 4, 4])
        >>> p.label_histogram()
        array([[0, 4, 0],
               [0, 0, 4],
               [4, 0, 0]])
        >>> ShardPartitioner(num_clients=3, shards_per_client=None)
        Traceback (most recent call last):
        ...
        ValueError: `shards_per_client`=None (deal every shard) needs `shard_size` (an int >= 1)
    """

    requires = "labels"

    def __init__(
        self,
        num_clients: int,
        shards_per_client: int | None = 2,
        seed: int = 0,
        *,
        shard_size: int | None = None,
        keep_incomplete_shard: bool = False,
    ) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        if shards_per_client is None and shard_size is None:
            raise ValueError("`shards_per_client`=None (deal every shard) needs `shard_size` (an int >= 1)")
        self.shards_per_client = (
            None if shards_per_client is None else _check_int("shards_per_client", shards_per_client, minimum=1)
        )
        self.seed = _check_seed(seed)
        self.shard_size = None if shard_size is None else _check_int("shard_size", shard_size, minimum=1)
        if not isinstance(keep_incomplete_shard, (bool, np.bool_)):
            raise TypeError(f"`keep_incomplete_shard` must be a bool, got {keep_incomplete_shard!r}")
        if keep_incomplete_shard and shard_size is None:
            raise ValueError("`keep_incomplete_shard`=True needs `shard_size` (without it every sample is used)")
        self.keep_incomplete_shard = bool(keep_incomplete_shard)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        if self.shard_size is not None:
            return self._fixed_size(num_samples, labels, num_classes)
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

    def _fixed_size(self, num_samples, labels, num_classes) -> Partition:
        """``shard_size`` given: see the class docstring."""
        s, n, k = self.shard_size, self.num_clients, self.shards_per_client
        complete, rest = divmod(num_samples, s)
        usable = complete + (1 if self.keep_incomplete_shard and rest else 0)
        if k is not None and n * k > usable:
            raise ValueError(
                f"`num_clients`={n} x `shards_per_client`={k} = {n * k} shards but only {usable} shards of "
                f"`shard_size`={s} fit in {num_samples} samples; lower num_clients, shards_per_client or shard_size"
            )
        if k is None and usable < n:
            raise ValueError(
                f"only {usable} shards of `shard_size`={s} fit in {num_samples} samples, fewer than "
                f"`num_clients`={n}; lower shard_size or num_clients"
            )
        by_label = np.argsort(labels, kind="stable").astype(np.int64)
        dealt = np.random.default_rng(self.seed).permutation(usable)
        if k is not None:
            per_client = np.full(n, k, dtype=np.int64)
        else:
            per_client = np.full(n, usable // n, dtype=np.int64)
            per_client[: usable % n] += 1
        dealt = dealt[: int(per_client.sum())]
        starts = dealt * s
        lengths = np.minimum(starts + s, num_samples) - starts
        out_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        gather = np.repeat(starts - out_starts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
        client_of_shard = np.repeat(np.arange(n), per_client)
        client_sizes = np.bincount(client_of_shard, weights=lengths, minlength=n).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(client_sizes, out=offsets[1:])
        return Partition(by_label[gather], offsets, labels, num_classes)
