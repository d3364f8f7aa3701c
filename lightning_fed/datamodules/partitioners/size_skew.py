"""Size skew: client sizes growing linearly, quadratically or exponentially with the client id, alone (IID labels)
or combined with Dirichlet label skew."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..partition import Partition, Partitioner, _check_int, _check_seed
from .dirichlet import _check_alpha
from .inner_dirichlet import _inner_dirichlet

__all__ = [
    "ExponentialPartitioner",
    "LinearPartitioner",
    "SizeLabelSkewPartitioner",
    "SquarePartitioner",
    "size_skew_sizes",
]

_SIZE_LAWS = ("linear", "square", "exponential")


def size_skew_sizes(size_law: str, num_samples: int, num_clients: int) -> np.ndarray:
    """int64 ``[num_clients]``: Flower's size-skew client sizes.

    Client ``i`` (``i = 1 .. N``) gets ``u_i`` units with ``u_i = i`` (``"linear"``), ``i**2`` (``"square"``) or
    ``e**i`` (``"exponential"``); its size is ``floor(num_samples * u_i / sum(u))`` and the samples this rounding
    leaves over go to the last (largest) client, so the sizes sum to ``num_samples`` (Flower's
    ``IdToSizeFncPartitioner``). The exponential units are computed as ``e**(i - N)`` (the same fractions, without
    overflow for ``N > 709``).

    Raises:
        ValueError: ``size_law`` unknown, or a client would get 0 samples (too many clients for the data).

    Example: linear units 1, 2, 3 (sum 6) of 12 samples; square units 1, 4, 9 (sum 14) of 28 samples;
    exponential: floor(12·e/(e + e² + e³)) = 1, floor(12·e²/(...)) = 2, and the last client takes the rest::

        >>> size_skew_sizes("linear", 12, 3), size_skew_sizes("square", 28, 3), size_skew_sizes("exponential", 12, 3)
        (array([2, 4, 6]), array([ 2,  8, 18]), array([1, 2, 9]))
        >>> size_skew_sizes("square", 12, 3)  # floor(12·1/14) = 0
        Traceback (most recent call last):
        ...
        ValueError: square size skew over `num_clients`=3 gives client 0 0 of the 12 samples; every client needs >= 1: lower num_clients
    """
    if size_law not in _SIZE_LAWS:
        raise ValueError(f"`size_law` must be one of {_SIZE_LAWS}, got {size_law!r}")
    i = np.linspace(1, num_clients, num_clients)
    units = {"linear": lambda: i, "square": lambda: i**2, "exponential": lambda: np.exp(i - num_clients)}[size_law]()
    sizes = (units / units.sum() * num_samples).astype(np.int64)
    sizes[-1] += num_samples - int(sizes.sum())
    if sizes.min() < 1:
        raise ValueError(
            f"{size_law} size skew over `num_clients`={num_clients} gives client {int(np.argmin(sizes))} "
            f"{int(sizes.min())} of the {num_samples} samples; every client needs >= 1: lower num_clients"
        )
    return sizes


class _SizeSkewPartitioner(Partitioner):
    """IID samples, client sizes from :func:`size_skew_sizes` (subclasses fix the law)."""

    requires = "none"
    size_law: ClassVar[str]

    def __init__(self, num_clients: int, seed: int = 0, shuffle: bool = True) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.seed = _check_seed(seed)
        if not isinstance(shuffle, (bool, np.bool_)):
            raise TypeError(f"`shuffle` must be a bool, got {shuffle!r}")
        self.shuffle = bool(shuffle)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        sizes = size_skew_sizes(self.size_law, num_samples, self.num_clients)
        order = (np.random.default_rng(self.seed).permutation(num_samples) if self.shuffle
                 else np.arange(num_samples)).astype(np.int64)
        offsets = np.zeros(self.num_clients + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return Partition(order, offsets, labels, num_classes)


_COMMON_DOC = """

    The samples are shuffled with a seeded permutation and cut in client order: client 0 takes the first
    ``sizes[0]`` samples of the permutation, client 1 the next ``sizes[1]``, ... (labels IID, sizes skewed). Flower
    cuts the dataset in its stored order (``shuffle=False`` here), which is label-skewed too when the data is
    sorted by label.

    Args:
        num_clients: number of clients ``N`` (int >= 1).
        seed: seed of the permutation (int >= 0, default 0).
        shuffle: shuffle before cutting (bool, default ``True``); ``False`` cuts in dataset order, like Flower.

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range (naming it); at :meth:`partition`
            time, a client that would get no sample.
    """


class LinearPartitioner(_SizeSkewPartitioner):
    __doc__ = """Client ``i`` (1-based) gets a share ``i / sum_j j`` of the samples (Flower's ``LinearPartitioner``),
    see :func:`size_skew_sizes`.""" + _COMMON_DOC + """
    Example: shares 1/6, 2/6, 3/6 of 12 samples; ``shuffle=False`` on label-sorted data also skews labels::

        >>> import numpy as np
        >>> labels = np.repeat([0, 1, 2], 4)
        >>> LinearPartitioner(num_clients=3).partition(12, labels).sizes()
        array([2, 4, 6])
        >>> LinearPartitioner(num_clients=3, shuffle=False).partition(12, labels).label_histogram()
        array([[2, 0, 0],
               [2, 2, 0],
               [0, 2, 4]])
    """
    size_law = "linear"


class SquarePartitioner(_SizeSkewPartitioner):
    __doc__ = """Client ``i`` (1-based) gets a share ``i**2 / sum_j j**2`` of the samples (Flower's
    ``SquarePartitioner``), see :func:`size_skew_sizes`.""" + _COMMON_DOC + """
    Example: shares 1/14, 4/14, 9/14 of 28 samples::

        >>> SquarePartitioner(num_clients=3).partition(28).sizes()
        array([ 2,  8, 18])
    """
    size_law = "square"


class ExponentialPartitioner(_SizeSkewPartitioner):
    __doc__ = """Client ``i`` (1-based) gets a share ``e**i / sum_j e**j`` of the samples (Flower's
    ``ExponentialPartitioner``), see :func:`size_skew_sizes`.""" + _COMMON_DOC + """
    Example: shares e/(e + e² + e³) ≈ 0.09, 0.24, 0.67 of 12 samples (rounded down, the rest to the last)::

        >>> ExponentialPartitioner(num_clients=3).partition(12).sizes()
        array([1, 2, 9])
    """
    size_law = "exponential"


class SizeLabelSkewPartitioner(Partitioner):
    """Size skew and label skew together: :func:`size_skew_sizes` client sizes, a Dirichlet class mix per client.

    Client sizes follow ``size_law`` (``"linear"``, ``"square"`` or ``"exponential"``, as
    :class:`LinearPartitioner` & co.), and each client's classes are drawn as in :class:`InnerDirichletPartitioner`
    with those sizes: ``q_c ~ Dir(alpha)``, classes drawn from ``q_c`` without replacement. Equivalent to
    ``InnerDirichletPartitioner(size_skew_sizes(size_law, n, N), alpha, seed)``.

    Args:
        num_clients: number of clients ``N`` (int >= 1).
        alpha: Dirichlet concentration over classes: a finite float > 0 or one per class (sorted class order).
        size_law: ``"linear"`` (default), ``"square"`` or ``"exponential"``.
        seed: seed (int >= 0, default 0).

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range (naming it); at :meth:`partition`
            time, a client that would get no sample or a per-class ``alpha`` of the wrong length.

    Example: linear sizes 2, 4, 6 with α = 0.5 — the same partition as
    ``InnerDirichletPartitioner([2, 4, 6], alpha=0.5)``::

        >>> import numpy as np
        >>> from lightning_fed.datamodules.partitioners.inner_dirichlet import InnerDirichletPartitioner
        >>> labels = np.repeat([0, 1, 2], 4)
        >>> p = SizeLabelSkewPartitioner(num_clients=3, alpha=0.5, size_law="linear", seed=0).partition(12, labels)
        >>> p.sizes()
        array([2, 4, 6])
        >>> q = InnerDirichletPartitioner([2, 4, 6], alpha=0.5, seed=0).partition(12, labels)
        >>> bool((p.indices == q.indices).all())
        True
    """

    requires = "labels"

    def __init__(self, num_clients: int, alpha: Any, size_law: str = "linear", seed: int = 0) -> None:
        self.num_clients = _check_int("num_clients", num_clients, minimum=1)
        self.alpha = _check_alpha(alpha)
        if size_law not in _SIZE_LAWS:
            raise ValueError(f"`size_law` must be one of {_SIZE_LAWS}, got {size_law!r}")
        self.size_law = size_law
        self.seed = _check_seed(seed)

    def _partition(self, num_samples, labels, ids, num_classes) -> Partition:
        sizes = size_skew_sizes(self.size_law, num_samples, self.num_clients)
        return _inner_dirichlet(sizes, self.alpha, self.seed, num_samples, labels, num_classes, "client sizes")
