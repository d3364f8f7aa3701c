"""Pathological label partition: every client holds exactly ``classes_per_client`` classes."""

from __future__ import annotations

import numpy as np

from .partition import Partition, Partitioner, _check_int, _check_seed

__all__ = ["PathologicalPartitioner"]


class PathologicalPartitioner(Partitioner):
    """Give each client samples of exactly ``classes_per_client`` distinct classes.

    Fed-LAMB's non-IID MNIST (Karimi et al., "Layer-wise and Dimension-wise Locally Adaptive
    Federated Learning", 2022) uses 1 class per client; the construction generalises the "#C = k"
    label-quantity skew of NIID-Bench (Li et al., "Federated Learning on Non-IID Data Silos: An
    Experimental Study", ICDE 2022), but here every class present is used.

    Construction (``C`` = number of distinct labels present, ``N`` = ``num_clients``,
    ``k`` = ``classes_per_client``): draw a seeded permutation ``pi`` of the classes and ``sigma`` of
    the clients; slot ``i`` in ``0 .. N*k-1`` gives class ``pi[i % C]`` to client ``sigma[i // k]``.
    Since ``k <= C``, the ``k`` consecutive slots of a client name distinct classes, and every class
    is held by ``floor(N*k/C)`` or ``ceil(N*k/C)`` clients (balanced). Each class's samples are then
    shuffled and split evenly (sizes differ by at most one) among the clients holding it. Every
    sample lands in exactly one client.

    Decision on ``N * k < C``: some class would have no client and its samples nowhere, so this is
    an error (raise ``num_clients`` or ``classes_per_client``) rather than silently dropping data.

    Args:
        num_clients: number of clients (int >= 1).
        classes_per_client: distinct classes per client (int >= 1).
        seed: seed of the class/client assignment and the within-class split (int >= 0, default 0).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range; at :meth:`partition` time,
            ``classes_per_client`` exceeds the number of classes present, ``N*k`` is less than the
            number of classes, or a class has fewer samples than clients holding it (a client would
            then miss one of its classes).
    """

    requires = "labels"

    def __init__(self, num_clients: int, classes_per_client: int, seed: int = 0) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.classes_per_client = _check_int("classes_per_client", classes_per_client, minimum=1)
        self.seed = _check_seed(seed)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        n_clients, k = self.num_clients, self.classes_per_client
        classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        n_classes = classes.shape[0]
        if k > n_classes:
            raise ValueError(
                f"`classes_per_client`={k} exceeds the {n_classes} classes present in the labels; "
                f"use classes_per_client <= {n_classes}"
            )
        if n_clients * k < n_classes:
            raise ValueError(
                f"`num_clients`={n_clients} x `classes_per_client`={k} = {n_clients * k} < {n_classes} classes: "
                "some class would belong to no client; raise num_clients or classes_per_client"
            )
        rng = np.random.default_rng(self.seed)
        class_perm = rng.permutation(n_classes)
        client_perm = rng.permutation(n_clients)
        slots = np.arange(n_clients * k)
        slot_class = class_perm[slots % n_classes]  # position in `classes`
        slot_client = client_perm[slots // k]

        # holders of each class, grouped by class (stable: slot order within a class)
        order = np.argsort(slot_class, kind="stable")
        holders_sorted = slot_client[order]
        n_holders = np.bincount(slot_class, minlength=n_classes)
        holder_start = np.concatenate(([0], np.cumsum(n_holders)[:-1]))
        short = np.flatnonzero(counts < n_holders)
        if short.size:
            j = int(short[0])
            raise ValueError(
                f"class {classes[j].item()!r} has {counts[j]} samples but {n_holders[j]} clients must hold it, "
                f"so a client would get fewer than `classes_per_client`={k} classes; "
                "lower num_clients or classes_per_client"
            )

        assignment = np.empty(num_samples, dtype=np.int64)
        by_class = np.argsort(inverse, kind="stable")
        class_start = np.concatenate(([0], np.cumsum(counts)[:-1]))
        for j in range(n_classes):
            members = rng.permutation(by_class[class_start[j] : class_start[j] + counts[j]])
            holders = holders_sorted[holder_start[j] : holder_start[j] + n_holders[j]]
            base, rem = divmod(int(counts[j]), int(n_holders[j]))
            sizes = np.full(holders.shape[0], base, dtype=np.int64)
            sizes[:rem] += 1
            assignment[members] = np.repeat(holders, sizes)
        return Partition.from_assignment(assignment, n_clients, labels, num_classes)
