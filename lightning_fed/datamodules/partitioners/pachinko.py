"""Pachinko-allocation (two-level Dirichlet) label-skew partition, the federated CIFAR-100 of Reddi et al.

Source: Reddi et al., "Adaptive Federated Optimization", ICLR 2021, App. C (CIFAR-100): the 50,000
training images are split among 500 clients of 100 images each "using a two-level latent Dirichlet
allocation scheme" / Pachinko allocation (Li & McCallum, ICML 2006) over CIFAR-100's 20 coarse
labels (super-classes) and 100 fine labels, with ``alpha = 0.1`` (coarse) and ``beta = 10`` (fine);
this is how TensorFlow Federated's ``tff.simulation.datasets.cifar100`` was built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_fed.checks import check_positive

from ..partition import Partition, Partitioner, _check_int, _check_seed

__all__ = ["CIFAR100_COARSE_OF_FINE", "PachinkoPartitioner"]

#: CIFAR-100's fine label -> coarse label (super-class) map, in torchvision/Krizhevsky's fine-label order
#: (fine 0 "apple" -> coarse 4 "fruit_and_vegetables", fine 1 "aquarium_fish" -> 1 "fish", ...). 100 entries,
#: every coarse label 0..19 appears 5 times.
CIFAR100_COARSE_OF_FINE: tuple[int, ...] = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)  # fmt: skip


def _draw(rng: np.random.Generator, weights: np.ndarray, cdf: np.ndarray) -> int:
    """Index drawn with probability ``weights / weights.sum()`` (weights >= 0, some > 0; ``cdf = cumsum(weights)``)."""
    k = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    k = min(k, weights.shape[0] - 1)
    while weights[k] <= 0:  # rounding at a boundary: step back to the last open entry
        k -= 1
    return k


class PachinkoPartitioner(Partitioner):
    """Two-level Dirichlet ("Pachinko allocation") label skew over coarse and fine labels.

    The labels given to :meth:`partition` are the *fine* labels; ``coarse_of_fine[f]`` is the coarse
    label of fine label ``f``. Clients are filled one after another. Client ``c`` draws

    * coarse-label proportions ``p_c ~ Dir(alpha * 1_K)`` over the ``K`` coarse labels, and
    * for every coarse label ``k``, fine-label proportions ``q_{c,k} ~ Dir(beta * 1_{F_k})`` over its
      ``F_k`` fine labels;

    then each of its ``samples_per_client`` samples is drawn by picking a coarse label from ``p_c``,
    a fine label from ``q_{c,k}``, and an unused sample of that fine label (uniformly, without
    replacement over the whole partition). When a fine label runs out it is removed (for this and
    every later client) and ``q_{c,k}`` is renormalised over the fine labels left; when all fine labels
    of a coarse label are gone, the coarse label is removed and ``p_c`` renormalised. If a client's
    remaining proportions underflow to zero, it draws uniformly among the labels left.

    Each client's indices are stored in draw order. Samples beyond ``num_clients * samples_per_client``
    are left out of every client.

    Defaults are Reddi et al. 2021 App. C's CIFAR-100 split: 500 clients x 100 samples,
    ``alpha = 0.1``, ``beta = 10``, CIFAR-100's coarse map.

    Args:
        num_clients: number of clients ``N`` (int >= 1, default 500).
        samples_per_client: samples per client (int >= 1, default 100).
        alpha: coarse-level Dirichlet concentration (finite float > 0, default 0.1).
        beta: fine-level Dirichlet concentration (finite float > 0, default 10.0).
        coarse_of_fine: the coarse label of each fine label (sequence of ints >= 0), default
            :data:`CIFAR100_COARSE_OF_FINE`.
        seed: seed (int >= 0, default 0); all draws come from ``np.random.default_rng(seed)``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range; at :meth:`partition` time, a fine label without an entry in
            ``coarse_of_fine`` or ``num_clients * samples_per_client`` above the sample count.

    Example: 4 fine labels in 2 coarse groups ({0, 1} and {2, 3}), 2 clients x 5 samples of 12; the 2 samples
    left over belong to no client::

        >>> import numpy as np
        >>> fine = np.repeat([0, 1, 2, 3], 3)
        >>> p = PachinkoPartitioner(num_clients=2, samples_per_client=5, alpha=0.1, beta=10.0,
        ...                         coarse_of_fine=[0, 0, 1, 1], seed=0).partition(12, fine)
        >>> p
        Partition(num_clients=2, num_samples=10, num_classes=4)
        >>> p.label_histogram()
        array([[3, 1, 0, 1],
               [0, 2, 2, 1]])
        >>> PachinkoPartitioner(num_clients=3, samples_per_client=5, coarse_of_fine=[0, 0, 1, 1]).partition(12, fine)
        Traceback (most recent call last):
        ...
        ValueError: impossible: `num_clients`=3 x `samples_per_client`=5 = 15 > num_samples=12; lower num_clients or samples_per_client
    """

    requires = "labels"

    def __init__(
        self,
        num_clients: int = 500,
        samples_per_client: int = 100,
        alpha: float = 0.1,
        beta: float = 10.0,
        coarse_of_fine: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.samples_per_client = _check_int("samples_per_client", samples_per_client, minimum=1)
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        if coarse_of_fine is None:
            coarse_of_fine = CIFAR100_COARSE_OF_FINE
        cof = np.asarray(coarse_of_fine)
        if cof.ndim != 1 or cof.size == 0:
            raise ValueError(f"`coarse_of_fine` must be a non-empty 1-D sequence of ints >= 0, got shape {cof.shape}")
        if not np.issubdtype(cof.dtype, np.integer):
            raise TypeError(f"`coarse_of_fine` must hold ints >= 0 (coarse label of each fine label), got dtype {cof.dtype}")
        if cof.min() < 0:
            raise ValueError(f"`coarse_of_fine` must hold ints >= 0, got min {int(cof.min())}")
        self.coarse_of_fine = [int(v) for v in cof]
        self.seed = _check_seed(seed)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        n, s = self.num_clients, self.samples_per_client
        if n * s > num_samples:
            raise ValueError(
                f"impossible: `num_clients`={n} x `samples_per_client`={s} = {n * s} > num_samples={num_samples}; "
                "lower num_clients or samples_per_client"
            )
        cof = np.asarray(self.coarse_of_fine, dtype=np.int64)
        num_fine = cof.shape[0]
        if labels.max() >= num_fine:
            raise ValueError(
                f"fine label {int(labels.max())} has no entry in `coarse_of_fine` (length {num_fine}); "
                "give the coarse label of every fine label"
            )
        rng = np.random.default_rng(self.seed)
        # pools: the samples of every fine label, shuffled; pointer[f] = how many of them are used
        counts = np.bincount(labels, minlength=num_fine)
        by_fine = np.argsort(labels, kind="stable")
        start = np.concatenate(([0], np.cumsum(counts)[:-1]))
        pool = by_fine.copy()
        for f in range(num_fine):
            rng.shuffle(pool[start[f] : start[f] + counts[f]])
        left = counts.astype(np.int64).copy()
        coarse_ids = np.unique(cof)  # coarse labels actually used by the map
        members = [np.flatnonzero(cof == k) for k in coarse_ids]  # fine labels of each coarse label
        coarse_left = np.array([left[m].sum() for m in members], dtype=np.int64)

        out = np.empty(n * s, dtype=np.int64)
        pos = 0
        for _ in range(n):
            p = rng.dirichlet(np.full(coarse_ids.shape[0], self.alpha))
            q = [rng.dirichlet(np.full(m.shape[0], self.beta)) for m in members]
            w = fine_w = None  # the client's renormalised proportions; recomputed only when a label runs out
            for _ in range(s):
                if w is None:
                    open_coarse = coarse_left > 0
                    w = p * open_coarse
                    if not w.sum() > 0:  # underflow: uniform over the coarse labels left
                        w = open_coarse.astype(np.float64)
                    w_cdf = np.cumsum(w)
                    fine_w = [None] * len(members)
                k = _draw(rng, w, w_cdf)
                if fine_w[k] is None:
                    open_fine = left[members[k]] > 0
                    wf = q[k] * open_fine
                    if not wf.sum() > 0:
                        wf = open_fine.astype(np.float64)
                    fine_w[k] = (wf, np.cumsum(wf))
                f = int(members[k][_draw(rng, *fine_w[k])])
                out[pos] = pool[start[f] + counts[f] - left[f]]
                left[f] -= 1
                coarse_left[k] -= 1
                pos += 1
                if left[f] == 0:  # fine label f ran out: remove it (and maybe its coarse label), renormalise
                    w = None
        offsets = np.arange(n + 1, dtype=np.int64) * s
        return Partition(out, offsets, labels, num_classes)
