"""The result of splitting a dataset among clients, and the base class of the schemes that compute it.

A :class:`Partition` stores the sample indices of every client in compressed-sparse-row (CSR) form:
one flat ``indices`` array (client 0's samples first, then client 1's, ...) and an ``offsets`` array
with ``num_clients + 1`` entries. This costs ``8 * (num_assigned_samples + num_clients + 1)`` bytes,
so a natural partition with 1,000,000 clients over 10,000,000 samples takes about 88 MB, with no
per-client Python objects.

A :class:`Partitioner` is a seeded, stateless scheme (IID, shards, Dirichlet, ...) that turns the
dataset size and, where it needs them, the labels or natural client ids into a :class:`Partition`.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from lightning_fed.checks import check_int as _check_int  # noqa: F401  (the partitioners' and local_work's)

__all__ = ["Partition", "Partitioner"]


# --------------------------------------------------------------------------------------------------
# Argument checks shared by the partitioners and the local-work policies (package-internal).
# --------------------------------------------------------------------------------------------------
def _check_seed(seed: Any) -> int:
    """A seed is a non-negative int (what :class:`numpy.random.SeedSequence` accepts)."""
    return _check_int("seed", seed, minimum=0)


def _as_labels(labels: Any, num_samples: int | None = None) -> np.ndarray:
    """Validate class labels: a 1-D array of non-negative integers, returned as int64.

    Raises:
        TypeError: the labels are not of an integer dtype.
        ValueError: not 1-D, negative, or of a length other than ``num_samples``.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"`labels` must be a 1-D array, got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise TypeError(
            f"`labels` must be integer class indices, got dtype {arr.dtype}; "
            "encode string/float labels as 0..num_classes-1 first"
        )
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ValueError(f"`labels` must be non-negative class indices, got min {int(arr.min())}")
    if num_samples is not None and arr.shape[0] != num_samples:
        raise ValueError(f"`labels` has {arr.shape[0]} entries but num_samples={num_samples}")
    return arr


def _encode_labels(labels: Any) -> tuple[Any, np.ndarray | None]:
    """Encode string / bytes / object class labels once as ``0 .. C-1``; other labels pass through unchanged.

    Returns:
        ``(codes, names)``: for text or object labels, ``codes`` is int64 ``[num_samples]`` with
        ``names[codes[i]] == labels[i]`` and ``names`` the sorted distinct labels (``np.unique`` order);
        for any other input, ``(labels, None)`` (integer labels are validated later, floats refused).

    Raises:
        ValueError: a label is ``None`` / NaN, or the labels are not 1-D.
        TypeError: the labels mix kinds that cannot be ordered (e.g. ``str`` and ``int``).
    """
    arr = np.asarray(labels)
    if arr.dtype.kind not in "USO":
        return labels, None
    if arr.ndim != 1:
        raise ValueError(f"`labels` must be a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind == "O":
        values = arr.tolist()
        bad = [i for i, v in enumerate(values) if v is None or (isinstance(v, float) and v != v)]
        if bad:
            raise ValueError(f"`labels` hold {values[bad[0]]!r} at sample {bad[0]} ({len(bad)} such samples); every "
                             "sample needs a class label")
        kinds = {type(v).__name__ for v in values}
        if len(kinds) > 1:
            raise TypeError(f"`labels` mix kinds ({', '.join(sorted(kinds))}); class labels must all be of one kind "
                            "(all str, or all int) to be encoded as class indices")
    try:
        names, codes = np.unique(arr, return_inverse=True)
    except TypeError as err:
        raise TypeError(f"`labels` cannot be ordered to be encoded as class indices ({err})") from err
    return codes.reshape(-1).astype(np.int64), names


# Five viridis anchor colours (RGB, 0..255) for the pure-numpy heatmap.
_VIRIDIS = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64
)


def _colormap(values: np.ndarray) -> np.ndarray:
    """Map values in [0, 1] (any shape ``S``) to uint8 RGB of shape ``[3, *S]`` (viridis-like)."""
    v = np.clip(values, 0.0, 1.0) * (len(_VIRIDIS) - 1)
    lo = np.minimum(np.floor(v).astype(np.int64), len(_VIRIDIS) - 2)
    frac = (v - lo)[..., None]
    rgb = _VIRIDIS[lo] * (1.0 - frac) + _VIRIDIS[lo + 1] * frac  # [*S, 3]
    return np.moveaxis(np.rint(rgb).astype(np.uint8), -1, 0)


class Partition:
    """Sample indices grouped by client, in CSR form. Computed once per run.

    Attributes:
        indices: int64 ``[num_assigned_samples]``; dataset indices, client 0's first, then client 1's, ...
        offsets: int64 ``[num_clients + 1]``; client ``c`` owns ``indices[offsets[c]:offsets[c + 1]]``.
            ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == len(indices)``.
        labels: int64 ``[num_samples]``, the labels of the whole dataset (for :meth:`stats` and
            :meth:`heatmap`), or ``None`` when unknown.
        num_classes: number of classes (``labels.max() + 1`` when not given), or ``None`` without labels.
        client_names: ``[num_clients]`` array naming each client (the natural id of a natural
            partition), or ``None``.
        label_names: ``[num_classes]`` array, ``label_names[k]`` = the original label of class index ``k``
            when the labels were given as text or objects and encoded by :meth:`Partitioner.partition`
            (sorted distinct labels), else ``None`` (class index ``k`` is label ``k``).

    Args:
        indices: see above (any integer array-like; stored as int64).
        offsets: see above.
        labels: see above (default ``None``).
        num_classes: see above (default ``None``: inferred from ``labels``).
        client_names: see above (default ``None``).
        label_names: see above (default ``None``).

    Raises:
        ValueError: malformed CSR arrays, an index outside ``[0, len(labels))``, ``num_classes`` not
            above every label, or ``client_names`` of the wrong length.

    Example: three clients over a 6-sample data set (sample 5 belongs to no client)::

        >>> p = Partition.from_client_lists([[0, 1], [2, 3, 4], []], labels=[0, 0, 1, 1, 2, 2])
        >>> p
        Partition(num_clients=3, num_samples=5, num_classes=3)
        >>> p.sizes(), p.offsets, p.client_indices(1)
        (array([2, 3, 0]), array([0, 2, 5, 5]), array([2, 3, 4]))
        >>> p.label_histogram()  # client x class counts
        array([[2, 0, 0],
               [0, 2, 1],
               [0, 0, 0]])
        >>> Partition.from_assignment([1, 0, 1, -1], num_clients=2).client_indices(1)  # -1: left out
        array([0, 2])
        >>> p.client_indices(3)
        Traceback (most recent call last):
        ...
        IndexError: client id `cid`=3 out of range: valid ids are 0..2
    """

    def __init__(
        self,
        indices: Any,
        offsets: Any,
        labels: Any = None,
        num_classes: int | None = None,
        client_names: Any = None,
        label_names: Any = None,
    ) -> None:
        idx = np.asarray(indices)
        off = np.asarray(offsets)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(f"`indices` must be a 1-D integer array, got shape {idx.shape}, dtype {idx.dtype}")
        if off.ndim != 1 or off.size < 2 or not np.issubdtype(off.dtype, np.integer):
            raise ValueError(
                f"`offsets` must be a 1-D integer array of length num_clients + 1 >= 2, "
                f"got shape {off.shape}, dtype {off.dtype}"
            )
        self.indices: np.ndarray = idx.astype(np.int64, copy=False)
        self.offsets: np.ndarray = off.astype(np.int64, copy=False)
        if self.offsets[0] != 0 or self.offsets[-1] != self.indices.shape[0]:
            raise ValueError(
                f"`offsets` must start at 0 and end at len(indices)={self.indices.shape[0]}, "
                f"got {int(self.offsets[0])} .. {int(self.offsets[-1])}"
            )
        if np.any(np.diff(self.offsets) < 0):
            raise ValueError("`offsets` must be non-decreasing")
        if self.indices.size and self.indices.min() < 0:
            raise ValueError(f"`indices` must be non-negative, got min {int(self.indices.min())}")

        self.labels: np.ndarray | None = None if labels is None else _as_labels(labels)
        if self.labels is not None and self.indices.size and self.indices.max() >= self.labels.shape[0]:
            raise ValueError(
                f"`indices` reach {int(self.indices.max())} but `labels` has only {self.labels.shape[0]} entries"
            )
        if num_classes is not None:
            num_classes = _check_int("num_classes", num_classes, minimum=1)
            if self.labels is not None and self.labels.size and self.labels.max() >= num_classes:
                raise ValueError(f"`num_classes`={num_classes} but `labels` contain {int(self.labels.max())}")
        elif self.labels is not None:
            num_classes = int(self.labels.max()) + 1 if self.labels.size else 0
        self.num_classes: int | None = num_classes

        self.client_names: np.ndarray | None = None
        if client_names is not None:
            names = np.asarray(client_names)
            if names.shape != (self.num_clients,):
                raise ValueError(
                    f"`client_names` must have shape ({self.num_clients},), one per client, got {names.shape}"
                )
            self.client_names = names
        self.label_names: np.ndarray | None = None
        if label_names is not None:
            lnames = np.asarray(label_names)
            if self.num_classes is None or lnames.shape != (self.num_classes,):
                raise ValueError(
                    f"`label_names` must have shape ({self.num_classes},), one per class, got {lnames.shape}"
                )
            self.label_names = lnames

    # ---------------------------------------------------------------------------------- builders
    @classmethod
    def from_client_lists(
        cls,
        client_indices: Sequence[Any],
        labels: Any = None,
        num_classes: int | None = None,
        client_names: Any = None,
        label_names: Any = None,
    ) -> Partition:
        """Build a partition from one index array per client (client ``c`` = ``client_indices[c]``).

        Raises:
            ValueError: ``client_indices`` is empty, or see :class:`Partition`.
        """
        arrays = [np.asarray(a, dtype=np.int64).reshape(-1) for a in client_indices]
        if not arrays:
            raise ValueError("`client_indices` must hold at least one client")
        sizes = np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(np.concatenate(arrays), offsets, labels, num_classes, client_names, label_names)

    @classmethod
    def from_assignment(
        cls,
        assignment: Any,
        num_clients: int,
        labels: Any = None,
        num_classes: int | None = None,
        client_names: Any = None,
    ) -> Partition:
        """Build a partition from the client of every sample, without a Python loop over clients.

        Args:
            assignment: int ``[num_samples]``; the client of each sample in ``[0, num_clients)``, or
                ``-1`` for a sample left out of every client.
            num_clients: number of clients (clients with no sample get an empty slice).

        Within a client, samples keep dataset order (stable sort).

        Raises:
            ValueError: an entry outside ``[-1, num_clients)``.
        """
        num_clients = _check_int("num_clients", num_clients, minimum=1)
        a = np.asarray(assignment, dtype=np.int64).reshape(-1)
        if a.size and (a.min() < -1 or a.max() >= num_clients):
            raise ValueError(f"`assignment` entries must lie in [-1, {num_clients}), got {a.min()} .. {a.max()}")
        order = np.argsort(a, kind="stable")
        num_left_out = int(np.count_nonzero(a < 0))
        indices = order[num_left_out:]
        counts = np.bincount(a[a >= 0] if num_left_out else a, minlength=num_clients)
        offsets = np.zeros(num_clients + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(indices, offsets, labels, num_classes, client_names)

    # ---------------------------------------------------------------------------------- access
    @property
    def num_clients(self) -> int:
        """Number of clients (``len(offsets) - 1``)."""
        return int(self.offsets.shape[0] - 1)

    def client_indices(self, cid: int) -> np.ndarray:
        """The dataset indices of client ``cid`` (int64 view, do not modify).

        Raises:
            IndexError: ``cid`` outside ``[0, num_clients)``.
        """
        if isinstance(cid, bool) or not isinstance(cid, numbers.Integral) or not 0 <= cid < self.num_clients:
            raise IndexError(f"client id `cid`={cid!r} out of range: valid ids are 0..{self.num_clients - 1}")
        return self.indices[self.offsets[cid] : self.offsets[cid + 1]]

    def sizes(self) -> np.ndarray:
        """int64 ``[num_clients]``: the number of samples of each client."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return self.num_clients

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_clients={self.num_clients}, num_samples={self.indices.shape[0]}, "
            f"num_classes={self.num_classes})"
        )

    # ---------------------------------------------------------------------------------- stats
    def label_histogram(self, num_clients: int | None = None) -> np.ndarray:
        """int64 ``[n, num_classes]``: per-client class counts for the first ``n`` clients.

        Args:
            num_clients: ``n``; default all clients. Memory is ``8 * n * num_classes`` bytes.

        Raises:
            ValueError: the partition has no labels.
        """
        if self.labels is None or self.num_classes is None:
            raise ValueError("this partition has no `labels`; pass labels to the partitioner to get label statistics")
        n = self.num_clients
        if num_clients is not None:
            n = min(_check_int("num_clients", num_clients, minimum=0), n)
        end = int(self.offsets[n])
        owner = np.repeat(np.arange(n, dtype=np.int64), self.sizes()[:n])
        flat = owner * self.num_classes + self.labels[self.indices[:end]]
        return np.bincount(flat, minlength=n * self.num_classes).reshape(n, self.num_classes)

    def stats(self, label_histogram: bool = True) -> dict[str, Any]:
        """Summary statistics for logging.

        Args:
            label_histogram: include ``"label_histogram"`` when labels are known (default ``True``;
                costs ``8 * num_clients * num_classes`` bytes).

        Returns:
            ``"num_clients"`` (int), ``"num_samples"`` (int, samples assigned to some client),
            ``"sizes"`` (int64 ``[num_clients]``), ``"size_min"``, ``"size_median"``, ``"size_mean"``,
            ``"size_std"``, ``"size_max"`` (floats/ints), ``"num_classes"`` (int or None) and, with
            labels, ``"label_histogram"`` (int64 ``[num_clients, num_classes]``).
        """
        sizes = self.sizes()
        out: dict[str, Any] = {
            "num_clients": self.num_clients,
            "num_samples": int(self.indices.shape[0]),
            "sizes": sizes,
            "size_min": int(sizes.min()),
            "size_median": float(np.median(sizes)),
            "size_mean": float(sizes.mean()),
            "size_std": float(sizes.std()),
            "size_max": int(sizes.max()),
            "num_classes": self.num_classes,
        }
        if label_histogram and self.labels is not None:
            out["label_histogram"] = self.label_histogram()
        return out

    def heatmap(self, max_clients: int = 100, cell_px: int = 8, max_px: int = 2048) -> np.ndarray:
        """A client x class image of label fractions, for ``SummaryWriter.add_image`` (CHW).

        Rows are the first ``max_clients`` clients, columns the classes; a cell's colour (viridis-like,
        dark = 0, yellow = 1) is the fraction of that client's samples in that class (0 for an empty
        client). Rendered in pure numpy, without axes or colour scale: the fit loop logs
        :func:`lightning_fed.tensorboard.partition_figure` (the same fractions as a labelled matplotlib figure
        with a colour bar) instead.

        Args:
            max_clients: number of client rows (default 100).
            cell_px: side of a cell in pixels (default 8); shrunk so neither side exceeds ``max_px``.
            max_px: the largest height/width in pixels (default 2048); a cell is at least 1 pixel.

        Returns:
            uint8 ``[3, H, W]`` with ``H = rows * s``, ``W = num_classes * s``, ``s`` the cell size.

        Raises:
            ValueError: the partition has no labels, or a bad argument.
        """
        max_clients = _check_int("max_clients", max_clients, minimum=1)
        cell_px = _check_int("cell_px", cell_px, minimum=1)
        max_px = _check_int("max_px", max_px, minimum=1)
        hist = self.label_histogram(max_clients).astype(np.float64)
        rows, cols = hist.shape
        totals = hist.sum(axis=1, keepdims=True)
        frac = np.divide(hist, totals, out=np.zeros_like(hist), where=totals > 0)
        s = max(1, min(cell_px, max_px // max(rows, cols, 1)))
        img = _colormap(frac)  # [3, rows, cols]
        return np.repeat(np.repeat(img, s, axis=1), s, axis=2)


class Partitioner(abc.ABC):
    """A seeded scheme that splits a dataset among clients.

    Subclasses set :attr:`requires` and implement :meth:`_partition`; :meth:`partition` validates the
    inputs first, so subclasses receive clean arrays.

    Attributes:
        requires: what the scheme needs besides the sample count: ``"none"``, ``"labels"`` (class
            labels, e.g. for label skew) or ``"ids"`` (a natural client id per sample).

    Example: a scheme that gives client 0 the even and client 1 the odd samples; :meth:`partition` checks the
    inputs (and encodes text labels) before ``_partition`` runs::

        >>> import numpy as np
        >>> class EvenOdd(Partitioner):
        ...     def _partition(self, num_samples, labels, ids, num_classes):
        ...         return Partition.from_assignment(np.arange(num_samples) % 2, 2, labels, num_classes)
        >>> p = EvenOdd().partition(5, labels=["cat", "dog", "cat", "cat", "dog"])
        >>> p.client_indices(0), p.label_names, p.label_histogram()
        (array([0, 2, 4]), array(['cat', 'dog'], dtype='<U3'), array([[2, 1],
               [1, 1]]))
        >>> EvenOdd().partition(0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `num_samples` must be an integer >= 1, got 0.
    """

    requires: ClassVar[str] = "none"

    def partition(
        self,
        num_samples: int,
        labels: np.ndarray | None = None,
        ids: np.ndarray | None = None,
        *,
        num_classes: int | None = None,
    ) -> Partition:
        """Split ``num_samples`` samples among clients.

        Args:
            num_samples: dataset size (>= 1).
            labels: ``[num_samples]`` class labels; required when ``requires == "labels"``, and
                otherwise, when given, attached to the result for statistics. Integer labels are class
                indices; text (``str`` / ``bytes``) or object labels are encoded once as ``0 .. C-1`` in
                sorted order (``np.unique``), the scheme runs on the codes and the result's
                ``label_names`` keeps the mapping. Float labels are refused.
            ids: ``[num_samples]`` natural client ids (any sortable dtype); required when
                ``requires == "ids"``.
            num_classes: number of classes when known (default: ``labels.max() + 1``); only affects
                statistics and the heatmap width.

        Returns:
            The :class:`Partition`.

        Raises:
            ValueError: a required input is missing, lengths disagree, or the scheme cannot satisfy its
                parameters on this data.
            TypeError: ``num_samples`` is not an int, ``labels`` are floats, or text/object labels mix
                kinds (``str`` with ``int``).
        """
        num_samples = _check_int("num_samples", num_samples, minimum=1)
        name = type(self).__name__
        if self.requires == "labels" and labels is None:
            raise ValueError(f"{name} requires `labels` (integer class labels of the {num_samples} samples)")
        if self.requires == "ids" and ids is None:
            raise ValueError(f"{name} requires `ids` (the natural client id of each of the {num_samples} samples)")
        label_names = None
        if labels is not None:
            labels, label_names = _encode_labels(labels)
        lab = None if labels is None else _as_labels(labels, num_samples)
        if label_names is not None and num_classes is None:
            num_classes = int(label_names.shape[0])
        id_arr = None
        if ids is not None:
            id_arr = np.asarray(ids)
            if id_arr.ndim != 1 or id_arr.shape[0] != num_samples:
                raise ValueError(f"`ids` must be 1-D with num_samples={num_samples} entries, got shape {id_arr.shape}")
        result = self._partition(num_samples, lab, id_arr, num_classes)
        if label_names is not None:
            if result.num_classes != label_names.shape[0]:
                raise ValueError(
                    f"`num_classes`={result.num_classes} but the text labels hold {label_names.shape[0]} classes"
                )
            result.label_names = label_names
        return result

    @abc.abstractmethod
    def _partition(
        self,
        num_samples: int,
        labels: np.ndarray | None,
        ids: np.ndarray | None,
        num_classes: int | None,
    ) -> Partition:
        """Compute the partition from validated inputs (labels are int64 when given)."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"
