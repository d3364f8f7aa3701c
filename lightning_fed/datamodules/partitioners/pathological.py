"""Pathological label partition: every client holds exactly ``classes_per_client`` classes."""

from __future__ import annotations

import numpy as np

from ..partition import Partition, Partitioner, _check_int, _check_seed

__all__ = ["PathologicalPartitioner"]

_MODES = ("balanced", "random", "deterministic", "first-deterministic")


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

    ``class_assignment_mode`` chooses which classes a client holds (``C`` classes in sorted order ``0..C-1``):

    - ``"balanced"`` (default, ours): the balanced construction above.
    - ``"random"`` (Flower's default): each client draws its ``k`` classes uniformly without replacement
      (``rng.choice(C, k, replace=False)``, clients in order).
    - ``"deterministic"``: client ``c`` holds classes ``(c + t) % C`` for ``t = 0 .. k-1``.
    - ``"first-deterministic"`` (the original paper's setup in Flower): client ``c``'s first class is ``c % C``,
      its other ``k - 1`` classes are drawn uniformly without replacement from the remaining ``C - 1``
      (``rng.choice``, clients in order).

    In the three Flower modes each class's samples are shuffled and split evenly (sizes differ by at most one,
    larger pieces first) among the clients holding it, in client order. Where Flower warns and leaves the samples of
    a class that no client drew out of the partition, this is an error here (as in ``"balanced"``): raise
    ``num_clients`` or ``classes_per_client``, or use ``"balanced"``.

    Args:
        num_clients: number of clients (int >= 1).
        classes_per_client: distinct classes per client (int >= 1).
        seed: seed of the class/client assignment and the within-class split (int >= 0, default 0).
        class_assignment_mode: ``"balanced"`` (default), ``"random"``, ``"deterministic"`` or
            ``"first-deterministic"`` (keyword-only).

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range, an unknown ``class_assignment_mode``; in a Flower mode, a class
            that no client holds; at :meth:`partition` time,
            ``classes_per_client`` exceeds the number of classes present, ``N*k`` is less than the
            number of classes, or a class has fewer samples than clients holding it (a client would
            then miss one of its classes).

    Example: 6 clients x 2 classes over 3 classes: every class is held by 6·2/3 = 4 clients, who split its
    4 samples one each::

        >>> import numpy as np
        >>> labels = np.repeat([0, 1, 2], 4)  # 12 samples, 4 of each of 3 classes
        >>> p = PathologicalPartitioner(num_clients=6, classes_per_client=2, seed=0).partition(12, labels)
        >>> p.label_histogram()
        array([[1, 1, 0],
               [0, 1, 1],
               [1, 1, 0],
               [0, 1, 1],
               [1, 0, 1],
               [1, 0, 1]])
        >>> PathologicalPartitioner(num_clients=2, classes_per_client=1).partition(12, labels)
        Traceback (most recent call last):
        ...
        ValueError: `num_clients`=2 x `classes_per_client`=1 = 2 < 3 classes: some class would belong to no client; raise num_clients or classes_per_client
    """

    requires = "labels"

    def __init__(
        self, num_clients: int, classes_per_client: int, seed: int = 0, *, class_assignment_mode: str = "balanced"
    ) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.classes_per_client = _check_int("classes_per_client", classes_per_client, minimum=1)
        self.seed = _check_seed(seed)
        if class_assignment_mode not in _MODES:
            raise ValueError(f"`class_assignment_mode` must be one of {_MODES}, got {class_assignment_mode!r}")
        self.class_assignment_mode = class_assignment_mode

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
        mode = self.class_assignment_mode
        if mode == "balanced":
            class_perm = rng.permutation(n_classes)
            client_perm = rng.permutation(n_clients)
            slots = np.arange(n_clients * k)
            slot_class = class_perm[slots % n_classes]  # position in `classes`
            slot_client = client_perm[slots // k]
        else:
            held = self._flower_classes(n_clients, k, n_classes, rng)  # [N, k] positions in `classes`
            slot_class = held.reshape(-1)
            slot_client = np.repeat(np.arange(n_clients), k)
            unused = np.setdiff1d(np.arange(n_classes), slot_class)
            if unused.size:
                raise ValueError(
                    f"`class_assignment_mode`={mode!r} gave no client class(es) "
                    f"{[classes[j].item() for j in unused]}; their samples would belong to no client. Raise "
                    "num_clients or classes_per_client, change the seed, or use class_assignment_mode='balanced'"
                )

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

    def _flower_classes(self, n_clients: int, k: int, n_classes: int, rng: np.random.Generator) -> np.ndarray:
        """int64 ``[N, k]``: the classes of every client in a Flower mode (see the class docstring)."""
        c = np.arange(n_clients)[:, None]
        mode = self.class_assignment_mode
        if mode == "deterministic":
            return (c + np.arange(k)[None, :]) % n_classes
        if mode == "random":
            return np.stack([rng.choice(n_classes, size=k, replace=False) for _ in range(n_clients)])
        rows = []
        for cid in range(n_clients):  # "first-deterministic"
            first = cid % n_classes
            others = np.delete(np.arange(n_classes), first)
            rows.append(np.concatenate(([first], rng.choice(others, size=k - 1, replace=False))))
        return np.stack(rows).astype(np.int64)
