"""Grouped natural partition: several natural ids (users, writers, speakers) per client."""

from __future__ import annotations

import numpy as np

from ..partition import Partition, _check_int
from .natural_id import NaturalIdPartitioner

__all__ = ["GroupedNaturalIdPartitioner"]

_MODES = ("allow-smaller", "allow-bigger", "drop-remainder", "strict")


class GroupedNaturalIdPartitioner(NaturalIdPartitioner):
    """Every client holds the samples of ``group_size`` consecutive natural ids (Flower's
    ``GroupedNaturalIdPartitioner``).

    The distinct ids are sorted (as in :class:`NaturalIdPartitioner`; Flower keeps them in order of first
    appearance unless ``sort_unique_ids=True``) and cut into groups of ``group_size``: client ``g`` holds the ids
    ``g*group_size .. g*group_size + group_size - 1`` of the sorted list, their samples in id order, then dataset
    order. With ``U`` distinct ids and ``r = U % group_size`` left over, ``mode`` decides (Flower's modes):

    - ``"allow-smaller"`` (default): the last client holds the ``r`` remaining ids (``ceil(U / group_size)`` clients);
    - ``"allow-bigger"``: ``floor(U / group_size)`` clients; the ``r`` remaining ids go one each to the first
      clients (Flower's ``np.array_split(ids, U // group_size)``: 7 ids in pairs give groups of 3, 2, 2; 11 ids in
      threes give 4, 4, 3; with ``r`` >= the number of groups, every group takes several);
    - ``"drop-remainder"``: the ``r`` remaining ids and their samples belong to no client (Flower spells it
      ``"drop-reminder"``);
    - ``"strict"``: ``r > 0`` is an error.

    ``Partition.client_names[g]`` is the tuple of client ``g``'s ids.

    Args:
        group_size: natural ids per client (int >= 1).
        id_column: the dataset column with the ids (non-empty str, default ``"client_id"``).
        mode: ``"allow-smaller"`` (default), ``"allow-bigger"``, ``"drop-remainder"`` or ``"strict"``.

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range (naming it); at :meth:`partition`
            time, the errors of :class:`NaturalIdPartitioner`, fewer distinct ids than ``group_size`` (except in
            ``"allow-smaller"``), or, in ``"strict"``, a number of ids that ``group_size`` does not divide.

    Example: 3 distinct ids in groups of 2 leave r = 1 id over::

        >>> ids = ["bob", "ann", "bob", "cat", "ann", "bob"]
        >>> for mode in ("allow-smaller", "allow-bigger", "drop-remainder"):
        ...     p = GroupedNaturalIdPartitioner(group_size=2, mode=mode).partition(6, ids=ids)
        ...     print(mode, p.client_names.tolist(), p.sizes().tolist())
        allow-smaller [('ann', 'bob'), ('cat',)] [5, 1]
        allow-bigger [('ann', 'bob', 'cat')] [6]
        drop-remainder [('ann', 'bob')] [5]
        >>> GroupedNaturalIdPartitioner(group_size=2, mode="strict").partition(6, ids=ids)
        Traceback (most recent call last):
        ...
        ValueError: `mode`='strict' but the 3 distinct ids are not a multiple of `group_size`=2 (1 left over); use another mode or group_size
    """

    def __init__(self, group_size: int, id_column: str = "client_id", mode: str = "allow-smaller") -> None:
        super().__init__(id_column)
        self.group_size = _check_int("group_size", group_size, minimum=1)
        if mode not in _MODES:
            raise ValueError(f"`mode` must be one of {_MODES}, got {mode!r}")
        self.mode = mode

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        natural = super()._partition(num_samples, labels, ids, num_classes)
        u, g = natural.num_clients, self.group_size
        full, rest = divmod(u, g)
        if self.mode == "strict" and rest:
            raise ValueError(f"`mode`='strict' but the {u} distinct ids are not a multiple of `group_size`={g} "
                             f"({rest} left over); use another mode or group_size")
        if self.mode != "allow-smaller" and full == 0:
            raise ValueError(f"only {u} distinct ids, fewer than `group_size`={g}; lower group_size or use "
                             "mode='allow-smaller'")
        bounds = list(range(0, full * g + 1, g))  # id positions where groups start/end
        if rest and self.mode == "allow-smaller":
            bounds.append(u)
        elif rest and self.mode == "allow-bigger":  # Flower: np.array_split(ids, full), leftovers to the first groups
            bounds = [0] + np.cumsum([len(a) for a in np.array_split(np.arange(u), full)]).tolist()
        offsets = natural.offsets[bounds]
        names = np.empty(len(bounds) - 1, dtype=object)
        for i in range(len(bounds) - 1):
            names[i] = tuple(natural.client_names[bounds[i] : bounds[i + 1]].tolist())
        indices = natural.indices[: offsets[-1]]
        return Partition(indices, offsets, labels, num_classes, client_names=names)
