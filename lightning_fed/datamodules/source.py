"""The data source: the datasets a task provides and how they are read (labels, natural ids, batch format). One part
of :class:`~lightning_fed.datamodules.FederatedDataModule`; the partition, cohorts, local work and federated
evaluation are the others."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Sequence

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_fed.datamodules import huggingface
from lightning_fed.datamodules.huggingface import (
    ColumnTuples,
    HFTensorColumns,
    as_torch_format,
    check_batch_columns,
    check_dataset_batch_columns,
    dict_batch_hint,
    formatted_columns,
    image_column_problem,
    hf_datasets,
    is_hf_dataset,
    ragged_column,
    read_column,
)

#: The dataset attributes of :class:`DataSource`, as its error messages name them.
SPLITS = ("train_dataset", "val_dataset", "test_dataset")

#: The dataset whose batches each step of a LightningModule reads (:meth:`DataSource.batch_hint`).
_STEP_DATASETS = {"training_step": "train_dataset", "validation_step": "val_dataset", "test_step": "test_dataset"}


class DataSource:
    """The training, validation and test datasets, and how they are read: labels and natural ids without decoding
    samples, Hugging Face datasets in the ``"torch"`` format, their dict batches as tuples (``batch_columns``).

    It holds data only: no partition, cohort or randomness, so no run setting (the partition that its labels and
    ids produce is recorded by the data module). :class:`~lightning_fed.datamodules.FederatedDataModule` builds it
    from its options of the same names (``dm.data_source``; ``dm.train_dataset`` is ``dm.data_source.train_dataset``).

    Args:
        train_dataset: A map-style torch ``Dataset`` or Hugging Face ``datasets.Dataset`` (``None``: from
            :meth:`setup`'s ``load``).
        val_dataset: Centralized evaluation data, or ``None`` (default).
        test_dataset: Test data, or ``None`` (default).
        label_column: The column of a Hugging Face ``train_dataset`` holding labels (default ``"label"``).
        labels: Explicit per-sample labels, shape ``[len(train_dataset)]`` (default ``None``: read from the
            dataset's ``targets`` attribute, torchvision's convention, else from ``label_column``).
        batch_columns: For Hugging Face datasets, whose batches are dicts keyed by column: the columns to give as a
            tuple instead, in this order (e.g. ``("image", "label")``); the other columns are left out. Default
            ``None``: dict batches.

    Raises:
        ValueError: ``batch_columns`` that is not ``None`` or a non-empty sequence of distinct names; at
            :meth:`setup`, no ``train_dataset`` (from the base data module's ``load_datasets``), ``batch_columns``
            with a ``train_dataset`` that is not a Hugging Face dataset or naming a column its batches lack;
            in :meth:`read_labels` / :meth:`read_column`, missing or malformed labels / ids (see there).
        TypeError: at :meth:`setup`, a dataset that is not map-style: a ``DatasetDict`` (splits), an iterable
            (streaming) dataset or a dict.

    Example (labels from a Hugging Face column, batches as ``(x, y)`` tuples)::

        >>> import datasets, numpy as np
        >>> hf = datasets.Dataset.from_dict({"x": np.eye(4, dtype=np.float32), "label": [0, 1, 1, 0]})
        >>> source = DataSource(hf, batch_columns=("x", "label"))
        >>> source.setup()
        >>> source.train_dataset.format["type"], source.read_labels(needed_by="ShardPartitioner").tolist()
        ('torch', [0, 1, 1, 0])
        >>> x, y = source.tensor_columns().get_batch(torch.tensor([1, 2]))
        >>> x.shape, y.tolist()
        (torch.Size([2, 4]), [1, 1])
        >>> source.read_column("client_id")
        Traceback (most recent call last):
        ...
        ValueError: `id_column` 'client_id' is not a column of the dataset; columns: ['x', 'label'].
    """

    #: What the data module forwards to this part (``dm.train_dataset`` is ``dm.data_source.train_dataset``).
    attributes: ClassVar[tuple[str, ...]] = ("train_dataset", "val_dataset", "test_dataset", "label_column", "labels",
                                             "batch_columns")

    def __init__(
        self,
        train_dataset: Optional[Any] = None,
        val_dataset: Optional[Any] = None,
        test_dataset: Optional[Any] = None,
        label_column: str = "label",
        labels: Optional[Sequence[Any]] = None,
        batch_columns: Optional[Sequence[str]] = None,
    ) -> None:
        self.batch_columns = check_batch_columns(batch_columns)
        self.label_column = label_column
        self.labels = None if labels is None else np.asarray(labels)
        self.train_dataset = train_dataset
        self.val_dataset = val_dataset
        self.test_dataset = test_dataset
        self._hf_columns: Optional[tuple[Any, Optional[HFTensorColumns]]] = None  # (train_dataset, its columns)

    def setup(self, load: Optional[Callable[[], tuple[Any, Optional[Any], Optional[Any]]]] = None) -> None:
        """Take ``(train, val, test)`` from ``load()`` when there is no ``train_dataset`` (a given ``val_dataset`` /
        ``test_dataset`` is kept), refuse datasets that are not map-style, give Hugging Face datasets without a
        format the ``"torch"`` format and check ``batch_columns`` against them.

        Raises:
            ValueError: no ``train_dataset`` and no ``load``; ``batch_columns`` with a ``train_dataset`` that is
                not a Hugging Face dataset, or naming a column of no Hugging Face dataset's batches.
            TypeError: a ``DatasetDict``, an iterable dataset or a dict, naming the dataset.
        """
        if self.train_dataset is None:
            if load is None:
                raise ValueError("`train_dataset` is required: pass a torch or Hugging Face dataset.")
            self.train_dataset, val, test = load()
            self.val_dataset = self.val_dataset if self.val_dataset is not None else val
            self.test_dataset = self.test_dataset if self.test_dataset is not None else test
        for name in SPLITS:
            _check_map_style(name, getattr(self, name))
        self.train_dataset = as_torch_format(self.train_dataset)
        self.val_dataset = as_torch_format(self.val_dataset)
        self.test_dataset = as_torch_format(self.test_dataset)
        if self.batch_columns is not None:
            check_dataset_batch_columns("train_dataset", self.train_dataset, self.batch_columns)
            for name in SPLITS[1:]:  # other datasets' batches: tuples already
                if is_hf_dataset(getattr(self, name)):
                    check_dataset_batch_columns(name, getattr(self, name), self.batch_columns)

    def read_labels(self, needed_by: Optional[str] = None) -> Optional[np.ndarray]:
        """The per-sample labels of ``train_dataset``, ``[len(train_dataset)]``: ``labels`` if given, else the
        dataset's ``targets``, else a Hugging Face dataset's ``label_column``; integer class indices (any int dtype)
        or text / object class names (the partitioner encodes them). Never decodes a sample.

        Args:
            needed_by: Who needs them (e.g. ``"DirichletPartitioner"``), named in the errors. ``None`` (default):
                labels are optional, and ``None`` is returned where there are none or they are not one integer
                or text label per sample.

        Raises:
            ValueError: with ``needed_by``: no labels found (naming ``labels``, ``targets`` and ``label_column``),
                labels of another shape than ``[len(train_dataset)]``, or of a dtype other than int or text.
        """
        dataset = self.train_dataset
        if self.labels is not None:
            labels = self.labels
        elif hasattr(dataset, "targets"):
            labels = dataset.targets
        elif is_hf_dataset(dataset) and self.label_column in dataset.column_names:
            labels = read_column(dataset, self.label_column)
        elif needed_by is not None:
            raise ValueError(
                f"{needed_by} needs labels: pass `labels=`, give the dataset a `targets` "
                f"attribute, or a Hugging Face column named by `label_column` (now {self.label_column!r})."
            )
        else:
            return None
        labels = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
        if labels.ndim != 1 or len(labels) != len(dataset):
            if needed_by is None:
                return None
            raise ValueError(
                f"`labels` must have shape [{len(dataset)}] (one per training sample), got {labels.shape}."
            )
        if labels.dtype.kind in "USO":
            # text / object class names: the partitioner encodes them once as 0..C-1 (sorted) and keeps the
            # mapping in `Partition.label_names`
            return labels
        if not np.issubdtype(labels.dtype, np.integer):
            if needed_by is None:
                return None
            raise ValueError(
                f"`labels` must be integer class indices or text / object class names, got dtype {labels.dtype}."
            )
        return labels

    def read_column(self, name: str) -> np.ndarray:
        """The per-sample values ``name`` of ``train_dataset`` (a partitioner's natural ``id_column``), shape
        ``[len(train_dataset)]``: a Hugging Face column, or the dataset's attribute ``name``.

        Raises:
            ValueError: naming ``id_column`` and the columns there are, or the attribute the dataset lacks.
        """
        dataset = self.train_dataset
        if is_hf_dataset(dataset):
            if name not in dataset.column_names:
                raise ValueError(
                    f"`id_column` {name!r} is not a column of the dataset; columns: {dataset.column_names}."
                )
            return read_column(dataset, name)
        if not hasattr(dataset, name):
            raise ValueError(
                f"`id_column` {name!r} is not an attribute of {type(dataset).__name__}; the natural id must be stored "
                f"per sample as `dataset.{name}` (shape [len(dataset)])."
            )
        values = getattr(dataset, name)
        return values.numpy() if isinstance(values, torch.Tensor) else np.asarray(values)

    def check_collatable(self) -> None:
        """Refuse a Hugging Face ``train_dataset`` with a ragged column (rows holding lists of different lengths,
        :func:`~lightning_fed.datamodules.huggingface.ragged_column`): its batches of more than one row cannot be
        collated into one tensor. A torch dataset passes.

        Raises:
            ValueError: naming the column, its shortest and longest lengths, a row of each, and the ways out.
        """
        if not is_hf_dataset(self.train_dataset):
            return
        ragged = ragged_column(self.train_dataset)
        if ragged is not None:
            name, low, low_row, high, high_row = ragged
            raise ValueError(
                f"The Hugging Face train_dataset's column {name!r} is ragged: its rows hold lists of different "
                f"lengths, from {low} (row {low_row}) to {high} (row {high_row}), which cannot be collated into "
                "one tensor per batch, so the clients holding them would fail in every round. Pad or truncate "
                f"{name!r} to one length (dataset.map), remove it (dataset.remove_columns({name!r})) or leave it "
                "out of the format (dataset.with_format('torch', columns=[...])), or use batch_size=1."
            )

    def check_image_columns(self, shapes: bool = True) -> None:
        """Refuse a Hugging Face ``train_dataset`` whose ``Image`` column holds ``None`` images, or — with ``shapes``
        (batches of more than one row) — PNG images of different shapes, read from the Arrow buffer without decoding
        an image (:func:`~lightning_fed.datamodules.huggingface.image_column_problem`): the clients holding those
        rows would fail in every round. A torch dataset passes.

        Raises:
            ValueError: naming the column, the rows and the ways out.
        """
        if not is_hf_dataset(self.train_dataset):
            return
        problem = image_column_problem(self.train_dataset, shapes=shapes)
        if problem is not None:
            raise ValueError(
                f"The Hugging Face train_dataset's {problem}, which cannot be collated into a batch, so the clients "
                "holding them would fail in every round. Remove those rows (dataset.filter), resize the images to one "
                "shape (dataset.map, or the feature's mode for the channels)"
                + (", or use batch_size=1" if shapes and "None" not in problem else "") + "."
            )

    def tensor_columns(self) -> Optional[HFTensorColumns]:
        """A torch-formatted Hugging Face ``train_dataset`` as tensors, converted once per ``train_dataset``
        (:class:`~lightning_fed.datamodules.huggingface.HFTensorColumns`, batches as tuples with
        ``batch_columns``), or ``None``: not a Hugging Face dataset, or columns that cannot or should not be held
        (text, ragged, above :data:`~lightning_fed.datamodules.huggingface.HF_TENSOR_LIMIT_BYTES`)."""
        if self._hf_columns is not None and self._hf_columns[0] is self.train_dataset:
            return self._hf_columns[1]
        if not is_hf_dataset(self.train_dataset):
            return None
        columns = HFTensorColumns.from_dataset(self.train_dataset, lazy_images=True)
        if columns is not None:
            columns.tuple_columns = self.batch_columns
        self._hf_columns = (self.train_dataset, columns)
        if columns is not None:
            rank_zero_info(
                f"Hugging Face train_dataset: columns {list(columns.columns)} held as tensors for client batches "
                f"({columns.nbytes / 2**20:.1f} MiB, once; datasets above "
                f"{huggingface.HF_TENSOR_LIMIT_BYTES / 2**30:.0f} GiB are read through a DataLoader instead)."
            )
        return columns

    def save_decoded_images(self) -> None:
        """Keep the images of the Hugging Face ``train_dataset`` that client batches decoded (:meth:`tensor_columns`
        decodes an ``Image`` column's rows when a batch first holds them) in ``datasets``' cache for later runs
        (:meth:`HFTensorColumns.save_decoded <lightning_fed.datamodules.huggingface.HFTensorColumns.save_decoded>`);
        nothing when there are none."""
        if self._hf_columns is not None and self._hf_columns[1] is not None:
            self._hf_columns[1].save_decoded()

    def collate_fn(self, dataset: Any) -> Optional[ColumnTuples]:
        """The ``collate_fn`` of a ``DataLoader`` over ``dataset``: with ``batch_columns``, tuples of those columns
        for a Hugging Face dataset (:class:`~lightning_fed.datamodules.huggingface.ColumnTuples`); else ``None``
        (the default collation)."""
        return ColumnTuples(self.batch_columns) if self.batch_columns is not None and is_hf_dataset(dataset) else None

    def batch_hint(self, error: BaseException, step: str = "training_step") -> Optional[str]:
        """A hint for a ``step`` of the module (default ``training_step``: local work; ``validation_step``,
        ``test_step``) that raised ``error`` by reading dict batches of a Hugging Face dataset (without
        ``batch_columns``) as tuples, naming the columns (:func:`~lightning_fed.datamodules.huggingface.dict_batch_hint`);
        ``None`` otherwise. The dataset: ``train_dataset`` for training, ``val_dataset`` for validation (else
        ``train_dataset``, where the clients' held-out evaluation data comes from), ``test_dataset`` for testing."""
        name = _STEP_DATASETS.get(step, "train_dataset")
        if step == "validation_step" and not is_hf_dataset(self.val_dataset):
            name = "train_dataset"
        dataset = getattr(self, name)
        if self.batch_columns is not None or not is_hf_dataset(dataset):
            return None
        return dict_batch_hint(error, formatted_columns(dataset), name, step)

    def __repr__(self) -> str:
        kinds = ", ".join(f"{name}={type(getattr(self, name)).__name__}" for name in SPLITS)
        return (f"{type(self).__name__}({kinds}, label_column={self.label_column!r}, "
                f"batch_columns={self.batch_columns!r})")


def _check_map_style(name: str, dataset: Any) -> None:
    """Refuse datasets that cannot be partitioned by index: a Hugging Face ``DatasetDict`` (a dict of splits) or an
    iterable (streaming) dataset.

    Raises:
        TypeError: naming ``name``, the splits to choose from, or what to do with a stream.
    """
    if dataset is None:
        return
    datasets = hf_datasets()
    if datasets is not None and isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise TypeError(
            f"`{name}` is a Hugging Face {type(dataset).__name__} with splits {sorted(dataset)}; select one split, "
            f"e.g. `dataset[{sorted(dataset)[0]!r}]`."
        )
    iterable = isinstance(dataset, torch.utils.data.IterableDataset) or (
        datasets is not None and isinstance(dataset, datasets.IterableDataset)
    )
    if iterable:
        raise TypeError(
            f"`{name}` is an iterable (streaming) {type(dataset).__name__}: clients are index sets, so it must be a "
            "map-style dataset with `__len__` and `__getitem__` (for Hugging Face, load without `streaming=True`)."
        )
    if isinstance(dataset, dict):
        raise TypeError(f"`{name}` is a dict with keys {sorted(map(str, dataset))}; pass one dataset (one split).")
