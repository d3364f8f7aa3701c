"""Hugging Face ``datasets`` as federated training data: columns converted once to tensors from their Arrow buffers,
ragged columns found without decoding rows, labels and natural ids read from columns, and dict batches as tuples.

The conversion (:meth:`HFTensorColumns.from_dataset`) gives the tensors, dtypes and values of the ``"torch"`` format
(``dataset.with_format("torch")[:]``) without its per-element recursion: a fixed-shape column of nested lists
(``Dataset.from_dict`` of NumPy arrays; ``list``, ``large_list`` and ``fixed_size_list`` at any depth), an
``Array2D``–``Array5D`` feature or a scalar column is one NumPy view of its Arrow values buffer, reshaped by the
list sizes once they are checked to be uniform; an ``Image`` column is decoded by ``datasets`` (the feature's own
decoder, PIL; :mod:`~lightning_fed.datamodules.hf_images`): all rows at once into a column of its cache, which later
runs reuse, or, for a federated fit's client batches, each row when a batch first holds it, the rows decoded so far
kept in its cache for later runs. Any other column (structs, nulls, a format with ``dtype=`` or other keyword
arguments) goes through the torch formatter as before.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch

from lightning_fed.datamodules.hf_images import PendingImages, decoded_images, image_array, lazy_images

#: Largest Hugging Face dataset (its formatted columns as tensors, bytes) that :class:`HFTensorColumns` holds in memory
#: for client batches; larger ones are read through a ``DataLoader`` as before.
HF_TENSOR_LIMIT_BYTES = 2 * 1024**3

_NOT_A_TENSOR = object()  # a column the torch format gives as something else than one tensor (text, ragged rows)


def hf_datasets() -> Any:
    """The Hugging Face ``datasets`` package when it is imported, else ``None`` (it is never imported here: a Hugging
    Face dataset implies the library is already imported).

    Told by identity, not by name: a module imported as ``datasets`` counts only when it is a package whose
    ``Dataset`` is Hugging Face's (defined in ``datasets.arrow_dataset``), so a user's own ``datasets.py`` that
    shadows it on ``sys.path`` is not taken for it (every data module, on tensors too, asked it for Hugging Face's
    classes and failed with an ``AttributeError``).

    Example::

        >>> import datasets
        >>> hf_datasets() is datasets
        True
    """
    module = sys.modules.get("datasets")
    dataset_class = getattr(module, "Dataset", None)
    if (module is None or getattr(module, "__path__", None) is None or not isinstance(dataset_class, type)
            or dataset_class.__module__ != "datasets.arrow_dataset"):
        return None
    return module


def is_hf_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` is a Hugging Face ``datasets.Dataset`` (without importing ``datasets``: a Hugging Face
    dataset implies the library is already imported; a module named ``datasets`` that is not Hugging Face's is not
    asked, see :func:`hf_datasets`).

    Example::

        >>> import datasets
        >>> is_hf_dataset(datasets.Dataset.from_dict({"x": [1]})), is_hf_dataset([1])
        (True, False)
    """
    datasets = hf_datasets()
    return datasets is not None and isinstance(dataset, datasets.Dataset)


def as_torch_format(dataset: Any) -> Any:
    """A Hugging Face dataset without a format as ``dataset.with_format("torch")``; anything else unchanged.

    Example::

        >>> import datasets
        >>> as_torch_format(datasets.Dataset.from_dict({"x": [1]})).format["type"]
        'torch'
    """
    if dataset is not None and is_hf_dataset(dataset) and dataset.format["type"] is None:
        return dataset.with_format("torch")
    return dataset


def read_column(dataset: Any, name: str) -> np.ndarray:
    """Column ``name`` of a Hugging Face dataset as a NumPy array (labels, natural ids): the values and dtype of
    ``np.asarray(dataset.with_format("numpy")[name])``, ``[len(dataset)]`` for a scalar column. A scalar numeric or
    bool column without nulls is read from its Arrow buffer (one copy at most); others through the ``"numpy"``
    format, row by row.

    Raises:
        KeyError: ``name`` is not a column.

    Example::

        >>> import datasets
        >>> read_column(datasets.Dataset.from_dict({"label": [2, 0, 1]}), "label").tolist()
        [2, 0, 1]
    """
    import pyarrow as pa

    if name not in dataset.column_names:
        raise KeyError(name)
    column = dataset.with_format("arrow", columns=[name])[:].column(name)  # the rows of a selection
    kind = column.type
    if column.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind) or
                                   pa.types.is_boolean(kind)):
        return np.asarray(column.to_numpy())
    return np.asarray(dataset.with_format("numpy")[name])


class HFTensorColumns:
    """The columns of a ``"torch"``-formatted Hugging Face ``datasets.Dataset``, converted once to tensors, so that
    client batches are tensor slices (``TensorBatches``) instead of one Arrow read and one formatting per batch.

    ``get_batch(index)`` returns ``{column: tensor[index]}``: the same dict, tensors, dtypes and values that a
    ``DataLoader`` over the dataset collates for those indices (the torch formatter's dtypes: float32 for floats,
    int64 for integers, bool; an ``Image`` column as ``[C, H, W]`` in the image's own dtype, uint8 for 8-bit
    images). With ``tuple_columns`` it returns ``tuple(tensor[index] for each named column)`` instead. Memory: the
    formatted columns, once (``nbytes``; Fashion-MNIST's 60,000 × 784 float32 images and labels take 188 MB).

    An ``Image`` column is decoded at the first ``get_batch``'s conversion by ``datasets``, every image by the
    feature's ``decode_example`` (PIL, as the torch format does), into a column of ``datasets``' cache
    (:func:`~lightning_fed.datamodules.hf_images.decoded_images`): a ``cache-<fingerprint>.arrow`` file next to the
    files of a dataset read from disk, which later runs read instead of decoding again (a changed dataset has
    another fingerprint); an in-memory dataset's images are decoded in memory, at each conversion. With
    ``from_dataset(..., lazy_images=True)`` (a federated fit's client batches) each image is decoded when a batch
    first holds it instead (a client's images together when its loader starts: :meth:`decode_ahead`), and
    :meth:`save_decoded` keeps the rows decoded so far in ``datasets``' cache for later runs
    (:func:`~lightning_fed.datamodules.hf_images.lazy_images`). A corrupt image fails the batch holding it
    (and reading its column from ``columns``) with the torch format's error (PIL's), noting the column and row.

    Use :meth:`from_dataset`, which returns ``None`` (keep the ``DataLoader``) for datasets this cannot hold: another
    format than ``"torch"``, a column that is not one fixed-shape tensor (text, ragged sequences), or more than
    ``limit`` bytes (default :data:`HF_TENSOR_LIMIT_BYTES`, 2 GiB).

    Example::

        >>> import datasets, torch
        >>> ds = datasets.Dataset.from_dict({"x": [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], "y": [0, 1, 0]})
        >>> cols = HFTensorColumns.from_dataset(ds.with_format("torch"))
        >>> batch = cols.get_batch(torch.tensor([2, 0]))
        >>> batch["x"].tolist(), batch["y"].tolist(), batch["x"].dtype, cols.nbytes
        ([[4.0, 5.0], [0.0, 1.0]], [0, 0], torch.float32, 48)
        >>> HFTensorColumns.from_dataset(ds) is None  # not torch-formatted: DataLoader as before
        True
        >>> x, y = HFTensorColumns(cols.columns, tuple_columns=("x", "y")).get_batch(torch.tensor([1]))
        >>> x.tolist(), y.tolist()
        ([[2.0, 3.0]], [1])
    """

    def __init__(self, columns: Mapping[str, Any], tuple_columns: Optional[Sequence[str]] = None) -> None:
        self._tensors = {name: column.out if isinstance(column, PendingImages) else column
                         for name, column in columns.items()}
        self._failed = [column for column in columns.values() if isinstance(column, PendingImages)]
        self._pending = {column.name: column for column in self._failed}
        self.columns: Mapping[str, torch.Tensor] = _Columns(self._tensors, self._failed)
        self.tuple_columns = None if tuple_columns is None else tuple(tuple_columns)

    def __len__(self) -> int:
        return len(next(iter(self._tensors.values())))

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns' tensors."""
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    def get_batch(self, index: torch.Tensor) -> Any:
        """``{column: tensor[index]}`` for a LongTensor ``index [B]`` (a tuple in ``tuple_columns``' order when
        that is set)."""
        for failed in self._failed:
            failed.decode(index)
        if self.tuple_columns is not None:
            return tuple(self._take(name, index) for name in self.tuple_columns)
        return {name: self._take(name, index) for name in self._tensors}

    def decode_ahead(self, batches: Sequence[np.ndarray]) -> None:
        """Decode the images of ``batches`` (int64 index arrays: a client's local work, the batches its loader
        will take) not decoded yet, together, before the first is taken (:meth:`PendingImages.decode_ahead
        <lightning_fed.datamodules.hf_images.PendingImages.decode_ahead>`; ``TensorBatches`` calls it when a
        client's loader starts); the batches are the same. An image that cannot be decoded raises its error in the
        batch that holds it, as before.

        Example::

            >>> import datasets, numpy as np, torch
            >>> from PIL import Image
            >>> ds = datasets.Dataset.from_dict({"image": [Image.new("L", (2, 2), v) for v in (5, 6, 7)]},
            ...                                 features=datasets.Features({"image": datasets.Image()}))
            >>> cols = HFTensorColumns.from_dataset(ds.with_format("torch"), lazy_images=True)
            >>> cols.decode_ahead([np.array([2]), np.array([1, 2])])  # rows 1 and 2 decoded now
            >>> cols.get_batch(torch.tensor([1, 2]))["image"][:, 0, 0, 0].tolist()
            [6, 7]
        """
        if self._failed and len(batches):
            index = np.concatenate([np.asarray(batch, dtype=np.int64) for batch in batches])
            for pending in self._failed:
                pending.decode_ahead(index)

    def _take(self, name: str, index: torch.Tensor) -> torch.Tensor:
        pending = self._pending.get(name)
        return self._tensors[name][index] if pending is None else pending.take(index)

    def save_decoded(self) -> None:
        """Keep the rows of lazily decoded ``Image`` columns decoded since the last call for later runs (in
        ``datasets``' cache, next to the files of a dataset read from disk; :meth:`PendingImages.save
        <lightning_fed.datamodules.hf_images.PendingImages.save>`); nothing for other columns."""
        for pending in self._failed:
            pending.save()

    @classmethod
    def from_dataset(cls, dataset: Any, limit: Optional[int] = None,
                     lazy_images: bool = False) -> Optional["HFTensorColumns"]:
        """The columns of ``dataset`` as tensors, or ``None`` when it cannot or should not be held (see above;
        ``limit`` in bytes, default :data:`HF_TENSOR_LIMIT_BYTES` as it is at the call). ``lazy_images``: decode
        an ``Image`` column's rows when a batch first holds them (default False: all at the conversion)."""
        limit = HF_TENSOR_LIMIT_BYTES if limit is None else limit
        if not is_hf_dataset(dataset) or len(dataset) == 0 or (dataset.format or {}).get("type") != "torch":
            return None
        fmt = dataset.format
        names = list(fmt.get("columns") or dataset.column_names)
        if not names or fmt.get("format_kwargs") or (fmt.get("output_all_columns") and
                                                     set(names) != set(dataset.column_names)):
            return _formatted_columns(dataset, limit)  # dtype= and the like, or unformatted columns: as before
        table = dataset.with_format("arrow", columns=names)[:]  # the rows of a selection (select, shuffle, filter)
        n = len(dataset)
        plans = {}
        for name in names:
            plan = _plan_column(dataset, name, table.column(name), n, lazy_images)
            if plan is _NOT_A_TENSOR:
                return None
            plans[name] = plan
        if sum(plan[0] for plan in plans.values()) > limit:
            return None
        columns = {}
        for name, (_, convert) in plans.items():
            column = convert()
            if column is _NOT_A_TENSOR:
                return None
            columns[name] = column
        return cls(columns)


def _formatted_columns(dataset: Any, limit: int) -> Optional[HFTensorColumns]:
    """The torch formatter's columns (``dataset[:]``), when they are tensors of one row per sample."""
    first = dataset[0]
    if not isinstance(first, dict) or not first or not all(isinstance(v, torch.Tensor) for v in first.values()):
        return None
    if len(dataset) * sum(v.numel() * v.element_size() for v in first.values()) > limit:
        return None
    columns = dataset[:]
    if not all(isinstance(v, torch.Tensor) and len(v) == len(dataset) for v in columns.values()):
        return None  # a ragged column comes back as a list of tensors
    return HFTensorColumns(dict(columns))


def _formatted_column(dataset: Any, name: str) -> Any:
    """One column through the torch formatter (the reference path, for column types read here no faster)."""
    column = dataset.with_format("torch", columns=[name])[:][name]
    return column if isinstance(column, torch.Tensor) and len(column) == len(dataset) else _NOT_A_TENSOR


def _torch_dtype(np_dtype: np.dtype) -> Optional[torch.dtype]:
    """The torch formatter's dtype for values of ``np_dtype``: float32 for floats, int64 for integers (not uint64,
    left to the formatter), bool; ``None`` for anything else."""
    if np_dtype.kind == "f":
        return torch.float32
    if np_dtype.kind in "iu" and np_dtype != np.uint64:
        return torch.int64
    if np_dtype.kind == "b":
        return torch.bool
    return None


def _is_list(pa_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type) or pa.types.is_fixed_size_list(pa_type)


def fixed_shape_values(array: Any) -> Optional[tuple[Any, tuple[int, ...]]]:
    """The leaf values of a column of (nested) lists of one shape and that per-row shape, ``(values, shape)``, or
    ``None`` when a level is ragged, empty or holds nulls. ``values`` is a flat Arrow array of
    ``len(array) · prod(shape)`` values, row-major; a column that is no list gives ``(array, ())``. Each level is
    read with ``pyarrow.compute.list_value_length`` and ``flatten`` (which follow slices), never row by row.

    Example::

        >>> import pyarrow as pa
        >>> values, shape = fixed_shape_values(pa.array([[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]]))
        >>> shape, values.to_numpy().reshape(-1, *shape)[1, 2].tolist()
        ((3, 2), [11, 12])
        >>> fixed_shape_values(pa.array([[1, 2], [3]])) is None  # ragged
        True
    """
    import pyarrow.compute as pc

    shape = []
    while _is_list(array.type):
        if array.null_count or len(array) == 0:
            return None
        if hasattr(array.type, "list_size"):  # fixed_size_list
            size = array.type.list_size
        else:
            low, high = pc.min_max(pc.list_value_length(array)).values()
            if not low.is_valid or low.as_py() != high.as_py():
                return None
            size = low.as_py()
        if size == 0:
            return None
        shape.append(int(size))
        array = array.flatten()
    if array.null_count:
        return None
    return array, tuple(shape)


def _plan_column(dataset: Any, name: str, chunked: Any, n: int, lazy: bool = False) -> Any:
    """``(bytes, convert)`` for column ``name`` (``convert()`` gives its ``[n, ...]`` tensor or ``_NOT_A_TENSOR``),
    or ``_NOT_A_TENSOR`` when the torch format does not give it as one tensor."""
    import pyarrow as pa
    import datasets

    feature = dataset.features.get(name)
    if isinstance(feature, datasets.Image):
        if not feature.decode:
            return _NOT_A_TENSOR  # dicts of bytes and path
        if chunked.null_count:
            return _plan_formatted(dataset, name)
        return _plan_images(dataset, name, feature, chunked, n, lazy)
    array = chunked.combine_chunks() if isinstance(chunked, pa.ChunkedArray) else chunked
    if isinstance(array.type, pa.ExtensionType):  # Array2D ... Array5D: nested lists underneath
        array = array.storage
    leaf = array.type
    while _is_list(leaf):
        leaf = leaf.value_type
    if pa.types.is_string(leaf) or pa.types.is_large_string(leaf) or pa.types.is_binary(leaf) or \
            pa.types.is_large_binary(leaf):
        return _NOT_A_TENSOR  # text: str, not tensors
    if not (pa.types.is_integer(leaf) or pa.types.is_floating(leaf) or pa.types.is_boolean(leaf)):
        return _plan_formatted(dataset, name)
    found = fixed_shape_values(array)
    if found is None:  # ragged, nulls, empty lists: as the formatter gives them (ragged: a list, not a tensor)
        return _plan_formatted(dataset, name)
    values, shape = found
    dtype = _torch_dtype(np.dtype(values.type.to_pandas_dtype()))
    if dtype is None:
        return _plan_formatted(dataset, name)
    nbytes = n * math.prod(shape) * torch.empty((), dtype=dtype).element_size()

    def convert() -> torch.Tensor:
        flat = values.to_numpy(zero_copy_only=False)  # a view of the Arrow buffer where the type allows
        return torch.from_numpy(np.array(flat, dtype=torch.empty((), dtype=dtype).numpy().dtype)).reshape(n, *shape)

    return nbytes, convert


def _plan_formatted(dataset: Any, name: str) -> Any:
    first = dataset.with_format("torch", columns=[name])[0][name]
    if not isinstance(first, torch.Tensor):
        return _NOT_A_TENSOR
    return len(dataset) * first.numel() * first.element_size(), lambda: _formatted_column(dataset, name)



class _Columns(Mapping):
    """``HFTensorColumns.columns``: the column tensors by name; reading an ``Image`` column with rows that failed
    to decode or are not decoded yet (:class:`~.hf_images.PendingImages`) decodes them (raising the error of one
    that fails); names, ``len`` and ``in`` do not."""

    def __init__(self, tensors: dict[str, torch.Tensor], failed: list) -> None:
        self._tensors, self._failed = tensors, {column.name: column for column in failed}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._failed:
            return self._failed[name].full()
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def _plan_images(dataset: Any, name: str, feature: Any, array: Any, n: int, lazy: bool) -> Any:
    """An ``Image`` column decoded once by ``datasets`` into its cache (:func:`~.hf_images.decoded_images`, the shape
    and dtype of its first image), then held as one ``[n, C, H, W]`` tensor; ``_NOT_A_TENSOR`` when the images differ
    in shape or dtype. Rows ``decode_example`` could not decode raise its error when a batch holds them
    (:class:`~.hf_images.PendingImages`). With ``lazy``, every row is decoded when a batch first holds it
    (:func:`~.hf_images.lazy_images`)."""
    token = getattr(dataset, "_token_per_repo_id", None)
    first = image_array(feature, array[0].as_py(), token)  # {"bytes", "path"}
    try:
        torch.from_numpy(np.zeros(0, dtype=first.dtype))
    except TypeError:  # a pixel type torch has no dtype for: as the formatter does it
        return _plan_formatted(dataset, name)

    def convert() -> Any:
        if lazy:
            return lazy_images(dataset, name, array, first)
        found = decoded_images(dataset, name, first.shape, first.dtype)
        if found is None:
            return _NOT_A_TENSOR  # the formatter gives a list of tensors of different shapes or dtypes
        pixels, decoded = found
        out = torch.from_numpy(pixels)
        if decoded.false_count == 0:
            return out
        return PendingImages(name, out, ~np.asarray(decoded.to_numpy(zero_copy_only=False), dtype=bool),
                             values=lambda rows: array.take(rows).to_pylist(),
                             decode=lambda value: image_array(feature, value, token))

    return n * first.size * first.itemsize, convert


def _has_ragged_level(level: Any) -> bool:
    """Whether some level of the nested lists ``level`` holds lists of different lengths (nulls not counted)."""
    import pyarrow.compute as pc

    while _is_list(level.type):
        low, high = pc.min_max(pc.list_value_length(level)).values()
        if low.is_valid and low.as_py() != high.as_py():
            return True
        level = pc.list_flatten(level)
    return False


def ragged_column(dataset: Any) -> Optional[tuple[str, int, int, int, int]]:
    """The first column of a Hugging Face ``datasets.Dataset`` whose rows (or the lists nested in them) have
    different lengths, as ``(column, shortest length, a row holding it, longest length, a row holding it)``, or
    ``None``. Such a column cannot be collated into one tensor for a batch of rows of different lengths. Only the
    formatted columns are read (from Arrow, without decoding rows); a custom format (``set_transform``) is not
    judged (its transform may pad).

    Example::

        >>> import datasets
        >>> ragged_column(datasets.Dataset.from_dict({"x": [[1, 2], [3], [4, 5]], "y": [0, 1, 0]}))
        ('x', 1, 1, 2, 0)
        >>> ragged_column(datasets.Dataset.from_dict({"x": [[1, 2], [3, 4]], "text": ["a", "bc"]})) is None
        True
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    fmt = dataset.format or {}
    if fmt.get("type") == "custom":
        return None
    names = fmt.get("columns") or dataset.column_names
    schema = dataset.data.schema
    for name in names:
        if not pa.types.is_list(schema.field(name).type) and not pa.types.is_large_list(schema.field(name).type) \
                and not pa.types.is_fixed_size_list(schema.field(name).type):
            continue
        if getattr(dataset, "_indices", None) is None:
            level = dataset.data.column(name)
        else:  # a selection (select, shuffle, filter): only its rows
            level = dataset.with_format("arrow", columns=[name])[:].column(name)
        if not _has_ragged_level(level):
            continue  # the usual case, found without mapping every nested value back to its row
        rows = None
        while pa.types.is_list(level.type) or pa.types.is_large_list(level.type) or \
                pa.types.is_fixed_size_list(level.type):
            lengths = pc.list_value_length(level)
            low, high = pc.min_max(lengths).values()
            if low.is_valid and low.as_py() != high.as_py():
                low, high = low.as_py(), high.as_py()
                if rows is None:  # the rows themselves
                    return name, low, pc.index(lengths, low).as_py(), high, pc.index(lengths, high).as_py()
                parents = np.asarray(rows)  # a nested list: name the rows holding the shortest and longest
                at_low, at_high = pc.index(lengths, low).as_py(), pc.index(lengths, high).as_py()
                return name, low, int(parents[at_low]), high, int(parents[at_high])
            parent = np.arange(len(level)) if rows is None else np.asarray(rows)
            counts = np.nan_to_num(np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=float)).astype(np.int64)
            rows = np.repeat(parent, counts)
            level = pc.list_flatten(level)
    return None


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# IHDR colour type -> the channels of the decoded image without a feature mode (palette and 16-bit grey: 2-D, C = 1)
_PNG_DECODED_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def image_column_problem(dataset: Any, shapes: bool = True) -> Optional[str]:
    """What makes an ``Image`` column of a Hugging Face ``datasets.Dataset`` fail in every batch that holds its bad
    rows, read cheaply from the Arrow buffer (no image decoded), or ``None``: a ``None`` image (a null row: the
    torch format gives ``None``, which no batch collates), or — with ``shapes`` (batches of more than one row) — PNG
    images of different sizes (height × width from each PNG's IHDR header; and channels, from its colour type, when
    the feature has no ``mode`` to convert them to), which cannot be stacked into one tensor. Images stored as
    paths or in other formats (JPEG) are not judged. Only the formatted columns; a custom format
    (``set_transform``) is not judged (its transform may handle them). The headers are read with NumPy from the
    Arrow buffer (~3 ms for 6,000 images), not by PIL's lazy ``Image.open(...).size`` (~30 µs an image: 0.2 s at
    every fit start for 6,000), and all of them: a sample would let the rows it should refuse fail their clients.

    Returns:
        A sentence naming the column, the rows and what is wrong with them.

    Example::

        >>> import datasets, io
        >>> from PIL import Image
        >>> def png(w, h):
        ...     buffer = io.BytesIO()
        ...     Image.new("L", (w, h)).save(buffer, format="PNG")
        ...     return {"bytes": buffer.getvalue(), "path": None}
        >>> features = datasets.Features({"image": datasets.Image()})
        >>> image_column_problem(datasets.Dataset.from_dict({"image": [png(4, 4), png(4, 4)]}, features=features))
        >>> image_column_problem(datasets.Dataset.from_dict({"image": [png(4, 4), None]}, features=features))
        "Image column 'image' holds 1 None image(s) (row 1)"
        >>> image_column_problem(datasets.Dataset.from_dict({"image": [png(4, 4), png(5, 4)]}, features=features))
        "Image column 'image' holds images of different shapes: [1, 4, 4] (C, H, W; row 0) and [1, 4, 5] (row 1)"
    """
    import pyarrow as pa
    import datasets

    fmt = dataset.format or {}
    if fmt.get("type") == "custom":
        return None
    for name in formatted_columns(dataset):
        feature = dataset.features.get(name)
        if not isinstance(feature, datasets.Image) or not feature.decode:
            continue
        if getattr(dataset, "_indices", None) is None:
            column = dataset.data.column(name)
        else:  # a selection (select, shuffle, filter): only its rows
            column = dataset.with_format("arrow", columns=[name])[:].column(name)
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if array.null_count:
            rows = np.flatnonzero(np.asarray(array.is_null().to_numpy(zero_copy_only=False)))
            listed = ", ".join(map(str, rows[:5].tolist())) + (", ..." if len(rows) > 5 else "")
            return f"Image column {name!r} holds {len(rows)} None image(s) (row{'s' if len(rows) > 1 else ''} {listed})"
        if not shapes or not len(array):
            continue
        found = _png_shapes(array.field("bytes"), channels=feature.mode is None)
        if found is None:
            continue
        rows, values = found
        other = np.flatnonzero((values != values[0]).any(axis=1))
        if len(other):
            first, odd = values[0].tolist(), values[other[0]].tolist()
            what = "C, H, W" if feature.mode is None else "H, W"
            return (f"Image column {name!r} holds images of different shapes: {first} ({what}; row {rows[0]}) and "
                    f"{odd} (row {rows[other[0]]})")
    return None


def _png_shapes(binary: Any, channels: bool) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """``(rows, shapes)`` of the values of the Arrow binary array ``binary`` that are PNGs (signature and IHDR
    first), each shape ``[C, H, W]`` (``channels``) or ``[H, W]`` from its IHDR header, read for all rows at once
    from the data buffer; ``None`` when there is none."""
    import pyarrow as pa

    if not (pa.types.is_binary(binary.type) or pa.types.is_large_binary(binary.type)) or not len(binary):
        return None
    buffers = binary.buffers()
    if buffers[2] is None:
        return None
    kind = np.int64 if pa.types.is_large_binary(binary.type) else np.int32
    offsets = np.frombuffer(buffers[1], dtype=kind)[binary.offset : binary.offset + len(binary) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    valid = np.ones(len(binary), dtype=bool) if not binary.null_count else \
        ~np.asarray(binary.is_null().to_numpy(zero_copy_only=False))
    rows = np.flatnonzero(valid & (ends - starts >= 33))  # signature, IHDR header
    if not len(rows):
        return None
    expected = _PNG_SIGNATURE + b"\0\0\0\x0dIHDR"
    at = starts[rows]
    png = np.ones(len(rows), dtype=bool)
    for j, value in enumerate(expected):
        png &= data[at + j] == value
    rows, at = rows[png], at[png]
    if not len(rows):
        return None
    width, height = _big_endian(data, at + 16), _big_endian(data, at + 20)
    if not channels:
        return rows, np.stack([height, width], axis=1)
    colour = data[at + 25].astype(np.int64)
    lookup = np.full(256, -1, dtype=np.int64)
    for key, value in _PNG_DECODED_CHANNELS.items():
        lookup[key] = value
    return rows, np.stack([lookup[colour], height, width], axis=1)


def _big_endian(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 4-byte big-endian unsigned integers of ``data`` at the positions ``at`` (int64)."""
    value = data[at].astype(np.int64)
    for offset in (1, 2, 3):
        value = (value << 8) | data[at + offset]
    return value


def formatted_columns(dataset: Any) -> list[str]:
    """The columns a Hugging Face dataset's batches hold: its format's ``columns``, else all of them."""
    return list((dataset.format or {}).get("columns") or dataset.column_names)


def check_batch_columns(value: Any) -> Optional[tuple[str, ...]]:
    """``None`` or a non-empty sequence of distinct column names, as a tuple (``batch_columns``).

    Raises:
        ValueError: naming ``batch_columns`` and what is allowed.

    Example::

        >>> check_batch_columns(["image", "label"])
        ('image', 'label')
    """
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not value or \
            not all(isinstance(v, str) for v in value) or len(set(value)) != len(value):
        raise ValueError(
            "`batch_columns` must be None (dict batches) or a non-empty sequence of distinct column names, e.g. "
            f"('image', 'label') for (x, y) tuples, got {value!r}."
        )
    return tuple(value)


def check_dataset_batch_columns(name: str, dataset: Any, batch_columns: tuple[str, ...]) -> None:
    """Refuse ``batch_columns`` for ``dataset`` (the data module's ``name``) unless it is a Hugging Face dataset
    whose batches hold every named column.

    Raises:
        ValueError: naming ``batch_columns``, the dataset and the columns it has.
    """
    if not is_hf_dataset(dataset):
        raise ValueError(
            f"`batch_columns` {batch_columns} names Hugging Face columns, but `{name}` is a "
            f"{type(dataset).__name__}, whose batches are not dicts of columns; leave batch_columns=None."
        )
    available = formatted_columns(dataset)
    missing = [c for c in batch_columns if c not in available]
    if missing:
        raise ValueError(
            f"`batch_columns` names {missing}, not columns of `{name}`'s batches; its columns: {available}."
        )


class ColumnTuples:
    """A ``DataLoader`` ``collate_fn`` that collates rows (dicts of columns) as the default does, then returns the
    named columns as a tuple, in that order: ``(x, y)`` batches from a Hugging Face dataset (``batch_columns``).

    Example::

        >>> import torch
        >>> x, y = ColumnTuples(("image", "label"))([{"image": torch.zeros(2), "label": 1},
        ...                                           {"image": torch.ones(2), "label": 0}])
        >>> x.tolist(), y.tolist()
        ([[0.0, 0.0], [1.0, 1.0]], [1, 0])
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def __call__(self, rows: list) -> tuple:
        from torch.utils.data import default_collate

        batch = default_collate(rows)
        return tuple(batch[name] for name in self.columns)


def dict_batch_hint(error: BaseException, columns: Sequence[str], dataset: str = "train_dataset",
                    step: str = "training_step") -> Optional[str]:
    """A hint for a ``step`` (default ``training_step``; ``validation_step``, ``test_step``) that read a dict batch
    of ``columns`` of the Hugging Face ``dataset`` (its data module argument's name, default ``train_dataset``) as a
    tuple (``x, y = batch`` gives the column *names*: ``TypeError: linear(): argument 'input' … must be Tensor, not
    str``, ``AttributeError: 'str' object has no attribute 'dtype'``; ``batch[0]``: ``KeyError: 0``; another number
    of columns: ``ValueError: … values to unpack``), or ``None`` for other errors.

    Example::

        >>> dict_batch_hint(TypeError("linear(): argument 'input' (position 1) must be Tensor, not str"),
        ...                 ["image", "label"])[:62]
        'batches of the Hugging Face train_dataset are dicts of columns'
        >>> dict_batch_hint(ValueError("bad value"), ["image", "label"]) is None
        True
    """
    text = str(error)
    tuple_like = (
        (isinstance(error, TypeError) and "not str" in text)
        or (isinstance(error, AttributeError) and text.startswith("'str' object has no attribute"))
        or (isinstance(error, ValueError) and "values to unpack" in text)
        or (isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], int))
    )
    if not tuple_like:
        return None
    names = tuple(columns)
    return (
        f"batches of the Hugging Face {dataset} are dicts of columns {list(names)}, not tuples: index them by "
        f"name in {step} (batch[{names[0]!r}]), or pass batch_columns={names[:2]!r} to the data module for "
        "tuples of those columns in that order"
    )
