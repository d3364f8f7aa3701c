"""Inner-Dirichlet partition: client sizes given, a Dirichlet class mix per client."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..partition import Partition, Partitioner, _check_int, _check_seed
from .dirichlet import _check_alpha, _class_alpha, assign_class_counts, dirichlet_class_counts

__all__ = ["InnerDirichletPartitioner"]


def _check_sizes(name: str, sizes: Any) -> tuple[int, ...]:
    """A non-empty sequence of ints >= 1, as a tuple (raises naming ``name``)."""
    allowed = "a non-empty sequence of ints >= 1 (one size per client)"
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__len__") or len(sizes) == 0:
        raise TypeError(f"`{name}` must be {allowed}, got {sizes!r}")
    out = []
    for i, s in enumerate(sizes):
        try:
            out.append(_check_int(f"{name}[{i}]", s, minimum=1))
        except (TypeError, ValueError) as err:
            raise type(err)(f"`{name}` must be {allowed}; {err}") from err
    return tuple(out)


class InnerDirichletPartitioner(Partitioner):
    """Given client sizes, every client draws a class mix ``q_c ~ Dir(alpha)`` and then its samples' classes.

    Flower's ``InnerDirichletPartitioner`` (after Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification", 2019): client ``c`` holds exactly ``partition_sizes[c]``
    samples; it draws ``q_c ~ Dir(alpha)`` over the ``C`` classes present (``alpha`` a scalar, i.e. ``alpha * 1_C``,
    or a per-class vector), then the classes of its samples from ``q_c`` without replacement, renormalising ``q_c``
    over the classes that still have samples when one runs out. The draws run in lock-step, one sample per client
    per step (a class short of requests goes to a random subset of its requesters), exactly as
    :class:`DirichletPartitioner`'s ``method="per_client"``, which is this scheme with equal sizes: with
    ``partition_sizes`` = those equal sizes and the same ``alpha`` and ``seed`` the two give the same partition.
    Flower draws one sample at a time for a uniformly random client; the distribution of a client's class mix is
    the same, the random stream is not. Each class's samples are then shuffled and dealt to the clients taking it.

    Args:
        partition_sizes: the number of samples of each client (sequence of ints >= 1; its length is the number of
            clients ``N``; the sum must equal the dataset size, checked at :meth:`partition` time).
        alpha: Dirichlet concentration over classes: a finite float > 0 or one per class (sorted class order).
        seed: seed (int >= 0, default 0); all draws come from one ``np.random.default_rng(seed)``.

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range (naming it); at :meth:`partition` time,
            ``sum(partition_sizes)`` differs from the number of samples, or a per-class ``alpha`` has the wrong length.

    Example: client sizes 2, 4, 6 (summing to the 12 samples), α = 0.5::

        >>> import numpy as np
        >>> labels = np.repeat([0, 1, 2], 4)  # 12 samples, 4 of each of 3 classes
        >>> p = InnerDirichletPartitioner([2, 4, 6], alpha=0.5, seed=0).partition(12, labels)
        >>> p.sizes()
        array([2, 4, 6])
        >>> p.label_histogram()
        array([[1, 0, 1],
               [0, 2, 2],
               [3, 2, 1]])
        >>> InnerDirichletPartitioner([2, 4], alpha=0.5).partition(12, labels)
        Traceback (most recent call last):
        ...
        ValueError: `partition_sizes` sum to 6 but the dataset has 12 samples; they must be equal (every sample in exactly one client)
    """

    requires = "labels"

    def __init__(self, partition_sizes: Any, alpha: Any, seed: int = 0) -> None:
        self.partition_sizes = _check_sizes("partition_sizes", partition_sizes)
        self.alpha = _check_alpha(alpha)
        self.seed = _check_seed(seed)

    @property
    def num_clients(self) -> int:
        """Number of clients ``N`` (``len(partition_sizes)``)."""
        return len(self.partition_sizes)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        return _inner_dirichlet(np.asarray(self.partition_sizes, dtype=np.int64), self.alpha, self.seed,
                                num_samples, labels, num_classes, "partition_sizes")


def _inner_dirichlet(sizes, alpha, seed, num_samples, labels, num_classes, what) -> Partition:
    """The inner-Dirichlet partition for client ``sizes`` (shared with the size+label-skew partitioner)."""
    total = int(sizes.sum())
    if total != num_samples:
        raise ValueError(f"`{what}` sum to {total} but the dataset has {num_samples} samples; they must be equal "
                         "(every sample in exactly one client)")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    class_alpha = _class_alpha(alpha, counts.shape[0])
    by_class = np.argsort(inverse, kind="stable")
    class_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rng = np.random.default_rng(seed)
    take = dirichlet_class_counts(sizes, class_alpha, counts, rng)
    assignment = assign_class_counts(take, by_class, class_start, counts, rng, num_samples)
    return Partition.from_assignment(assignment, sizes.shape[0], labels, num_classes)
