"""The ``Image`` column of a Hugging Face ``datasets.Dataset`` decoded by ``datasets`` (the feature's own
``decode_example``, PIL: the values of the ``"torch"`` format), for
:class:`~lightning_fed.datamodules.huggingface.HFTensorColumns`, in one of two ways:

* all rows at once (:func:`decoded_images`): one ``Dataset.map`` whose result ``datasets`` caches next to the
  dataset's files, by its fingerprint (``HFTensorColumns.from_dataset``'s default);
* the rows a batch holds, when a batch first holds them (:func:`lazy_images`, a federated fit's client batches: a
  run of a few rounds reads the rows of the clients it samples, a fraction of the dataset; a client's rows are
  decoded together when its loader starts, :meth:`PendingImages.decode_ahead`). The rows decoded so far
  are stored by ``Dataset.map`` in one ``cache-<fingerprint>.arrow`` file next to the dataset's files
  (:meth:`PendingImages.save`, at the end of the fit) and read back, memory-mapped, by later runs
  (``Dataset.from_file``), which decode only the rows no run has decoded yet.

No PNG is parsed here: every pixel comes from ``decode_example``.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

def image_array(feature: Any, value: dict, token: Any = None) -> np.ndarray:
    """One image (``{"bytes", "path"}``, as an ``Image`` column stores it) decoded by the ``Image`` feature's
    ``decode_example`` (PIL) as the torch formatter gives it: ``[C, H, W]`` (HWC transposed; a 2-D image gets C = 1),
    in the image's own dtype. ``token``: the dataset's ``_token_per_repo_id`` (images on the Hub).

    Raises:
        Exception: ``decode_example``'s (PIL's) error for an image it cannot decode.

    Example::

        >>> import datasets, io
        >>> from PIL import Image
        >>> buffer = io.BytesIO(); Image.new("L", (3, 2), 7).save(buffer, format="PNG")
        >>> image = image_array(datasets.Image(), {"bytes": buffer.getvalue(), "path": None})
        >>> image.shape, image.dtype.name, int(image[0, 1, 2])
        ((1, 2, 3), 'uint8', 7)
    """
    image = np.asarray(feature.decode_example(value, token_per_repo_id=token))
    return (image[:, :, np.newaxis] if image.ndim == 2 else image).transpose((2, 0, 1))


class _DifferentImages(Exception):
    """An image decoded to another shape or dtype than the first (the torch format gives a list of tensors)."""


#: Bumped when :func:`_decode_images` changes what it writes: part of the fingerprint of the decoded column, with the
#: versions of ``datasets`` and PIL, so that a cache written by other code is not read.
_DECODED_IMAGES_VERSION = 1


def _decode_images(batch: Any, feature: Any, shape: tuple[int, ...], dtype: str, token: Any, versions: Any) -> dict:
    """``Dataset.map`` function (batched, ``"arrow"`` format, one ``Image`` column): each image decoded by the
    feature's ``decode_example`` (PIL), as the torch formatter does, into ``pixels [B, prod(shape)]`` of ``dtype``
    (each image ``[C, H, W]``, flattened), and
    ``decoded [B]`` (bool). An image ``decode_example`` cannot decode is left as zeros with ``decoded`` False (its
    error is raised again when a batch holds it); one of another shape or dtype raises :class:`_DifferentImages`."""
    column = batch.column(0).combine_chunks()
    payloads, paths = column.field("bytes").to_pylist(), column.field("path").to_pylist()
    pixels, decoded = np.zeros((len(payloads), *shape), dtype=dtype), np.zeros(len(payloads), dtype=bool)
    for i, (payload, path) in enumerate(zip(payloads, paths)):
        try:
            image = image_array(feature, {"bytes": payload, "path": path}, token)
        except Exception:  # noqa: BLE001 (raised again, with its row, by the batch that holds it)
            continue
        if image.shape != tuple(shape) or image.dtype != pixels.dtype:
            raise _DifferentImages()
        pixels[i], decoded[i] = image, True
    return {"pixels": pixels.reshape(len(payloads), -1), "decoded": decoded}


def decoded_images(dataset: Any, name: str, shape: Sequence[int], dtype: Any) -> Optional[tuple[np.ndarray, Any]]:
    """The ``Image`` column ``name`` of a Hugging Face ``datasets.Dataset`` decoded by ``datasets`` (the feature's
    ``decode_example``, PIL: the torch format's values) into a column of ``datasets``' cache, once:
    ``(pixels, decoded)``, ``pixels`` a NumPy array ``[len(dataset), *shape]`` of ``dtype`` (the images as
    ``[C, H, W]``, rows in the dataset's order, a selection's too) and ``decoded`` a ``pyarrow`` bool array, False
    for the rows ``decode_example`` could not decode (zeros in ``pixels``); ``None`` when an image decodes to
    another shape or dtype.

    The column is made by ``Dataset.map``: for a dataset read from files (``load_dataset``, ``load_from_disk``) it
    is written as a ``cache-<fingerprint>.arrow`` file next to those files and read back, memory-mapped, by later
    runs instead of decoding again; the fingerprint is ``datasets``' (of the dataset, ``shape``, ``dtype``, the
    feature, and the versions of ``datasets``, PIL and this decoding), so a changed dataset (another
    ``save_to_disk``, a ``map``, ``filter`` or ``select``) gets a column of its own. An in-memory dataset
    (``Dataset.from_dict``) has no files: its images are decoded in memory at every call. With
    ``datasets.disable_caching()`` nothing is reused. Where the column cannot be written next to the dataset's files
    (a read-only folder, a full disk: ``OSError``) the images are decoded in memory, with a ``UserWarning`` naming
    the folder.

    Example::

        >>> import datasets
        >>> from PIL import Image
        >>> ds = datasets.Dataset.from_dict({"image": [Image.new("L", (3, 2), 7)]},
        ...                                 features=datasets.Features({"image": datasets.Image()}))
        >>> pixels, decoded = decoded_images(ds, "image", (1, 2, 3), "uint8")
        >>> pixels.shape, int(pixels[0, 0, 1, 2]), decoded.to_pylist()
        ((1, 1, 2, 3), 7, [True])
    """
    import PIL
    import datasets

    shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
    versions = (_DECODED_IMAGES_VERSION, datasets.__version__, PIL.__version__)
    kwargs = {"feature": dataset.features[name], "shape": shape, "dtype": dtype.str, "versions": versions,
              "token": getattr(dataset, "_token_per_repo_id", None)}
    features = datasets.Features({"pixels": datasets.List(datasets.Value(dtype.name), length=math.prod(shape)),
                                  "decoded": datasets.Value("bool")})  # pixels: fixed_size_list, read without checks
    source = dataset.with_format("arrow", columns=[name])
    map_kwargs = {"batched": True, "fn_kwargs": kwargs, "features": features, "remove_columns": dataset.column_names,
                  "desc": f"Decoding the images of column {name!r}"}
    try:
        try:
            table = source.map(_decode_images, **map_kwargs).data  # a new dataset: its rows, in order
        except OSError as error:  # the dataset's folder cannot be written (read-only, full): decoded in memory
            folders = sorted({str(Path(f["filename"]).parent) for f in dataset.cache_files})
            warnings.warn(f"The images of column {name!r} are decoded in memory, at every run: `datasets` could not "
                          f"write the decoded column next to the dataset's files in {', '.join(folders)} ({error}).",
                          stacklevel=2)
            table = source.map(_decode_images, keep_in_memory=True, **map_kwargs).data
    except _DifferentImages:
        return None
    pixels, at = np.empty((len(dataset), *shape), dtype=dtype), 0
    if not _copy_pixels(table, pixels):
        return None
    return pixels, table.column("decoded").combine_chunks()


def _pixels_features(shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """The features of a decoded column: ``pixels`` (each image flattened, a ``fixed_size_list``, read without
    checks) and ``decoded`` (bool)."""
    import datasets

    return datasets.Features({"pixels": datasets.List(datasets.Value(dtype.name), length=math.prod(shape)),
                              "decoded": datasets.Value("bool")})


def _copy_pixels(table: Any, pixels: np.ndarray) -> bool:
    """Copy the ``pixels`` column of a decoded column's Arrow ``table`` (each chunk a view of the cache file's buffer)
    into ``pixels [n, *shape]``; False when its size does not match (written by other code)."""
    at, size = 0, math.prod(pixels.shape[1:])
    for chunk in table.column("pixels").chunks:
        flat = chunk.flatten().to_numpy(zero_copy_only=False)  # fixed_size_list: follows the chunk's slice
        if flat.size != len(chunk) * size or at + len(chunk) > len(pixels):
            return False
        pixels[at : at + len(chunk)] = flat.reshape(len(chunk), *pixels.shape[1:])
        at += len(chunk)
    return at == len(pixels)


class PendingImages:
    """The rows of an ``Image`` column not decoded yet: each decoded by the feature's ``decode_example`` (PIL) when a
    batch first holds it (:meth:`decode`), into its row of ``out`` (the column's ``[n, C, H, W]`` tensor). A row
    ``decode_example`` cannot decode raises the torch format's error (noting the column and row) in every batch that
    holds it and stays pending. A row decoded to another shape or dtype than ``out``'s is kept on its own: a batch
    holding it (:meth:`take`) stacks its rows as ``default_collate`` does, which succeeds for a batch of one row and
    raises ``torch.stack``'s error for rows of different shapes, as a ``DataLoader`` over the dataset would. Used for
    the rows the eager decoding (:func:`decoded_images`) could not decode, and for every row of a lazily decoded
    column (:func:`lazy_images`), whose decoded rows :meth:`save` stores.

    Args:
        name: The column.
        out: ``[n, C, H, W]``, the decoded rows filled in.
        pending: ``[n]`` bool, True for the rows not decoded yet.
        values: ``values(rows)`` gives the rows' ``{"bytes", "path"}``, a list (``rows``: int64 ``[k]``).
        decode: ``decode(value)`` gives the row's ``[C, H, W]`` array (:func:`image_array`).
        store: ``store(out, decoded)`` keeps the decoded rows for later runs (``None``: nowhere).
        new: Rows decoded before and not stored yet (default 0).

    Example::

        >>> import numpy as np, torch
        >>> images = PendingImages("image", torch.zeros(3, 1, 1, 1), np.ones(3, dtype=bool), values=list,
        ...                        decode=lambda row: np.full((1, 1, 1), 10 * row, dtype=np.float32))
        >>> images.decode(torch.tensor([2, 0])); images.take(torch.tensor([2, 0])).flatten().tolist()
        [20.0, 0.0]
        >>> images.pending.tolist()
        [False, True, False]
    """

    def __init__(self, name: str, out: torch.Tensor, pending: np.ndarray, values: Callable[[np.ndarray], list],
                 decode: Callable[[Any], np.ndarray],
                 store: Optional[Callable[[torch.Tensor, np.ndarray], None]] = None, new: int = 0) -> None:
        self.name, self.out, self.pending = name, out, np.asarray(pending, dtype=bool)
        self._values, self._decode, self._store = values, decode, store
        self._left, self._new = int(self.pending.sum()), new
        self._pixels = self.out.numpy()  # the same memory
        self._shape, self._dtype = self._pixels.shape[1:], self._pixels.dtype
        self.odd: dict[int, torch.Tensor] = {}  # rows decoded to another shape or dtype than out's
        self._is_odd = np.zeros(len(self.pending), dtype=bool)
        self._undecodable = np.zeros(len(self.pending), dtype=bool)  # failed in decode_ahead: left to the batches

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """The batch of rows ``index`` (decoded by :meth:`decode` first): ``out[index]``, or, when it holds a row of
        another shape or dtype, its rows stacked (``torch.stack``'s error for rows of different shapes)."""
        if not self.odd or not self._is_odd[np.asarray(index, dtype=np.int64)].any():
            return self.out[index]
        return torch.stack([self.odd.get(row, self.out[row]) for row in np.asarray(index).tolist()])

    def full(self) -> torch.Tensor:
        """``out`` with every row decoded.

        Raises:
            Exception: as :meth:`decode`; ValueError when some rows decoded to another shape or dtype than the
                others (no one tensor holds them)."""
        self.decode()
        if self.odd:
            row = min(self.odd)
            raise ValueError(f"Image column {self.name!r}: {len(self.odd)} row(s) decoded to another shape or dtype "
                             f"than the others, e.g. row {row}: {self.odd[row].dtype} {list(self.odd[row].shape)}, "
                             f"the others {self.out.dtype} {list(self.out.shape[1:])}.")
        return self.out

    def decode(self, index: Optional[torch.Tensor] = None) -> None:
        """Decode the pending rows of ``index`` (all when ``None``), in row order.

        Raises:
            Exception: the torch format's error for an image it cannot decode, with a note naming the column and
                row."""
        if self._left:
            self._decode_rows(self._pending_rows(index), strict=True)

    def decode_ahead(self, index: Any) -> None:
        """Decode the pending rows of ``index`` (int64 ``[k]``, rows may repeat: a client's local work, all its
        batches) now, together, in row order: one Arrow take and one loop over ``decode_example``, instead of one
        per batch between training steps. A row that cannot be decoded is left pending, without an error: the
        batch that holds it raises it (:meth:`decode`), as without this call; it is not tried again here.

        Example::

            >>> import numpy as np, torch
            >>> images = PendingImages("image", torch.zeros(3, 1, 1, 1), np.ones(3, dtype=bool), values=list,
            ...                        decode=lambda row: np.full((1, 1, 1), 10 * row, dtype=np.float32))
            >>> images.decode_ahead(np.array([2, 0, 2])); images.pending.tolist(), images.out.flatten().tolist()
            ([False, True, False], [0.0, 0.0, 20.0])
        """
        if self._left:
            rows = self._pending_rows(index)
            self._decode_rows(rows[~self._undecodable[rows]], strict=False)

    def _pending_rows(self, index: Any) -> np.ndarray:
        """The pending rows of ``index`` (all when ``None``), each once, in row order."""
        if index is None:
            return np.flatnonzero(self.pending)
        index = np.asarray(index, dtype=np.int64)
        return np.unique(index[self.pending[index]])

    def _decode_rows(self, rows: np.ndarray, strict: bool) -> None:
        """Decode ``rows`` (pending) into ``out``; an error is raised (``strict``, naming the row) or its row
        marked undecodable and left pending."""
        for row, value in zip(rows.tolist(), self._values(rows) if len(rows) else []):
            try:
                image = self._decode(value)
            except Exception as error:  # the torch format's error, naming the row
                if not strict:
                    self._undecodable[row] = True
                    continue
                if hasattr(error, "add_note"):
                    error.add_note(f"Image column {self.name!r}, row {row}.")
                raise
            if image.shape != self._shape or image.dtype != self._dtype:
                self.odd[row], self._is_odd[row] = torch.from_numpy(np.array(image)), True  # PIL's: read-only
            else:
                self._pixels[row] = image
            self.pending[row] = False
            self._left, self._new = self._left - 1, self._new + 1

    def save(self) -> None:
        """Keep the rows decoded so far for later runs, when some were decoded since the last :meth:`save` and there
        is somewhere to keep them (:func:`lazy_images`)."""
        if self._store is not None and self._new:
            self._store(self.out, ~self.pending)
            self._new = 0


class _DecodedRows:
    """Where :func:`lazy_images` keeps the decoded rows of an ``Image`` column of a dataset read from files: one
    ``cache-<fingerprint>.arrow`` file in the folder of the dataset's files, as ``datasets`` names its caches, of
    ``pixels`` and ``decoded`` columns written by ``Dataset.map`` and read by ``Dataset.from_file``
    (memory-mapped). The fingerprint is ``datasets``' ``Hasher``'s of the dataset's fingerprint, the column, its
    feature, the shape and dtype, and the versions of ``datasets``, PIL and this decoding: a changed dataset (saved
    again, ``map``, ``filter``, ``select``) gets a file of its own."""

    def __init__(self, dataset: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        import PIL
        import datasets
        from datasets.fingerprint import Hasher

        self.dataset, self.name, self.shape, self.dtype = dataset, name, shape, dtype
        self.fingerprint = Hasher.hash(("decoded image rows", _DECODED_IMAGES_VERSION, dataset._fingerprint, name,
                                        dataset.features[name], shape, dtype.str, datasets.__version__,
                                        PIL.__version__))
        folder = os.path.dirname(dataset.cache_files[0]["filename"])
        self.path = os.path.join(folder, f"cache-{self.fingerprint}.arrow")

    def load(self) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """``(pixels [n, *shape], decoded [n] bool)`` from the file, or ``None`` when there is none (or it does not
        match)."""
        import datasets

        if not os.path.exists(self.path):
            return None
        table = datasets.Dataset.from_file(self.path).data
        pixels = np.empty((len(self.dataset), *self.shape), dtype=self.dtype)
        if len(table) != len(pixels) or not _copy_pixels(table, pixels):
            return None
        return pixels, np.asarray(table.column("decoded").to_numpy(), dtype=bool)

    def store(self, out: torch.Tensor, decoded: np.ndarray) -> None:
        """Write ``out``'s rows and ``decoded`` (the rows that hold an image) over the file, by ``Dataset.map``;
        a folder that cannot be written (read-only, full) leaves it as it was, with a ``UserWarning``."""
        pixels = out.numpy().reshape(len(out), -1)
        try:
            self.dataset.with_format("arrow", columns=[self.name]).map(
                _stored_rows, batched=True, with_indices=True, fn_kwargs={"pixels": pixels, "decoded": decoded},
                features=_pixels_features(self.shape, self.dtype), remove_columns=self.dataset.column_names,
                new_fingerprint=self.fingerprint, cache_file_name=self.path, load_from_cache_file=False,
                desc=f"Keeping the decoded images of column {self.name!r}")
        except OSError as error:
            warnings.warn(f"The decoded images of column {self.name!r} are not kept for later runs: `datasets` could "
                          f"not write {self.path} ({error}).", stacklevel=2)


def _stored_rows(batch: Any, indices: list, pixels: np.ndarray, decoded: np.ndarray) -> dict:
    """``Dataset.map`` function of :meth:`_DecodedRows.store`: the rows ``indices`` of ``pixels`` and ``decoded``."""
    return {"pixels": pixels[indices], "decoded": decoded[indices]}


def lazy_images(dataset: Any, name: str, array: Any, first: np.ndarray) -> PendingImages:
    """The ``Image`` column ``name`` of a Hugging Face ``datasets.Dataset`` (its formatted rows, the Arrow struct
    array ``array`` of ``{"bytes", "path"}``), each row decoded by the feature's ``decode_example`` when a batch
    first holds it (:class:`PendingImages`; ``first``: row 0 decoded, ``[C, H, W]``, which gives the column's shape
    and dtype). For a dataset read from files (``load_dataset``, ``load_from_disk``) with ``datasets``' caching on,
    the rows that earlier runs decoded are read from the file they left (:class:`_DecodedRows`), and
    :meth:`PendingImages.save` writes the rows decoded so far over it; an in-memory dataset (``Dataset.from_dict``)
    decodes its rows in every run.

    Example::

        >>> import datasets, torch
        >>> from PIL import Image
        >>> ds = datasets.Dataset.from_dict({"image": [Image.new("L", (3, 2), v) for v in (5, 6, 7)]},
        ...                                 features=datasets.Features({"image": datasets.Image()}))
        >>> array = ds.with_format("arrow")[:].column("image").combine_chunks()
        >>> images = lazy_images(ds, "image", array, image_array(ds.features["image"], array[0].as_py()))
        >>> images.pending.tolist()  # row 0: given
        [False, True, True]
        >>> images.decode(torch.tensor([2])); images.out[:, 0, 0, 0].tolist(), images.pending.tolist()
        ([5, 0, 7], [False, True, False])
    """
    import datasets

    feature, token = dataset.features[name], getattr(dataset, "_token_per_repo_id", None)
    shape, dtype = tuple(first.shape), first.dtype
    array = array.combine_chunks() if hasattr(array, "combine_chunks") else array  # a take per batch: one chunk
    pixels, decoded = np.zeros((len(array), *shape), dtype=dtype), np.zeros(len(array), dtype=bool)
    rows = _DecodedRows(dataset, name, shape, dtype) if dataset.cache_files and datasets.is_caching_enabled() else None
    found = rows.load() if rows is not None else None
    if found is not None:
        pixels, decoded = found
    new = not decoded[0]
    pixels[0], decoded[0] = first, True
    return PendingImages(name, torch.from_numpy(pixels), ~decoded, values=lambda rows: array.take(rows).to_pylist(),
                         decode=lambda value: image_array(feature, value, token),
                         store=rows.store if rows is not None else None, new=int(new))
