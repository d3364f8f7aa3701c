"""Natural partition: one client per distinct value of a per-sample id (user, writer, speaker, ...)."""

from __future__ import annotations

import numpy as np

from .partition import Partition, Partitioner

__all__ = ["NaturalIdPartitioner"]


class NaturalIdPartitioner(Partitioner):
    """One client per distinct natural id, clients ordered by sorted unique id.

    For datasets that come with their own users (FEMNIST writers, Shakespeare speakers,
    StackOverflow users; Caldas et al., "LEAF", 2018; Reddi et al., ICLR 2021). Client ``c`` holds
    the samples whose id is the ``c``-th smallest distinct id, in dataset order;
    ``Partition.client_names`` holds the distinct ids. Every sample lands in exactly one client.

    One stable argsort of the ids, no Python loop over clients: 1,000,000 clients over 10,000,000
    integer ids take a few seconds.

    Args:
        id_column: name of the dataset column with the ids (non-empty str, default ``"client_id"``);
            used by the data module to read ``ids``, the partitioner itself only sees the array.

    Raises:
        TypeError / ValueError: ``id_column`` is not a non-empty str; at :meth:`partition` time,
            ``ids`` missing, of the wrong length, or float ids containing NaN.
    """

    requires = "ids"

    def __init__(self, id_column: str = "client_id") -> None:
        if not isinstance(id_column, str):
            raise TypeError(
                f"`id_column` must be a non-empty str, got {id_column!r} of type {type(id_column).__name__}"
            )
        if not id_column:
            raise ValueError("`id_column` must be a non-empty str, got ''")
        self.id_column = id_column

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        if np.issubdtype(ids.dtype, np.floating) and np.isnan(ids).any():
            raise ValueError(f"`ids` (column {self.id_column!r}) contain NaN; every sample needs a client id")
        order = np.argsort(ids, kind="stable").astype(np.int64, copy=False)
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        offsets = np.append(starts, num_samples).astype(np.int64)
        return Partition(order, offsets, labels, num_classes, client_names=sorted_ids[starts])
