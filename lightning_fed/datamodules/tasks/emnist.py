"""EMNIST-62 (Cohen et al., 2017) as a federated data module: character recognition (CR) or autoencoding (AE).

The two EMNIST tasks of Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (Sec. 5): EMNIST CR
(62-class character recognition with a CNN) and EMNIST AE (a bottleneck autoencoder); see
:mod:`lightning_fed.models.emnist` for the models. Reddi et al. use TFF's federated EMNIST, i.e. LEAF's FEMNIST
split by writer (3,400 writers, 671,585 train / 77,483 test examples).

Data sources
------------
* ``leaf_path`` given: LEAF's FEMNIST JSON files (``python preprocess.sh -s niid --sf 1.0 -k 0 -t sample`` in
  LEAF's ``data/femnist``), read from ``{leaf_path}/train/*.json`` and ``{leaf_path}/test/*.json`` (all files of
  each folder, sorted by name and concatenated). Each file is LEAF's
  ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [labels]}}}``.
  The train samples keep their writer in ``dataset.writer_ids`` (int64, index into ``dataset.writer_names``,
  the sorted writer names of the train files), and the default partitioner is
  ``NaturalIdPartitioner("writer_ids")``: one client per writer -- the natural split of the paper. The LEAF test
  files (each writer's held-out samples) form one centralized test set, as in the paper ("for all other
  tasks, we use the entire test set"). They are also the natural per-client split of federated evaluation:
  each writer's own test samples are its evaluation data (:meth:`EMNISTDataModule.natural_eval_split`).
* otherwise: torchvision's ``EMNIST(root=data_dir, split="byclass")``, i.e. the decompressed IDX files
  ``{data_dir}/EMNIST/raw/emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte`` (697,932 train /
  116,323 test images). With ``download=True`` torchvision downloads NIST's ``gzip.zip`` (about 560 MB, needs
  internet) and extracts them; otherwise a :class:`FileNotFoundError` says how to get them. These files carry
  no writer ids, so a ``partitioner`` is **required** (e.g. ``DirichletPartitioner(num_clients=3400,
  alpha=0.1)`` for 3,400 clients like the paper's writers; we do not pick an ``alpha`` for you, because the
  paper's split is the natural one and any Dirichlet ``alpha`` is a separate, heterogeneity-controlling choice).
  Nor does the test set carry writer ids, so there is no natural per-client evaluation split: federated
  evaluation (``eval_clients_per_round``) needs ``eval_fraction``, which holds out part of each client's train
  share as its evaluation data.

Pixel conventions (both sources give the same tensors)
------------------------------------------------------
* Orientation: the IDX files of the EMNIST release store every image transposed (rows and columns swapped;
  a known quirk of the conversion from NIST SD19). We fix this the usual way, ``image.transpose(-1, -2)``
  (equivalently ``torchvision.transforms.functional.rotate(hflip(x), 90)``), so characters read upright
  like MNIST digits. LEAF's FEMNIST is already upright (row-major 28x28).
* Polarity: values in [0, 1] with **0 = background, 1 = ink** (MNIST's convention). torchvision's EMNIST
  already is so (uint8 / 255). LEAF/TFF FEMNIST store 1 = background, so LEAF ``x`` becomes ``1 - x``; this is
  exactly TFF's EMNIST AE preprocessing (``x = 1 - pixels``), while TFF's CR preprocessing feeds the raw
  LEAF pixels (an affine change of the input the CNN's first layer absorbs; we use one convention for both).
* Storage: images are kept in memory as uint8 ``[N, 28, 28]`` (LEAF floats are ``k / 255``; they are
  rounded back to ``k``), converted to float32 per batch, so the 698 k torchvision images need 550 MB, not 2.2 GB.
* Labels: 62 classes in torchvision's ``byclass`` order ``0-9, A-Z, a-z`` (= LEAF's order).

Tasks
-----
* ``task="cr"``: a batch is ``(x [B, 1, 28, 28] float32, y [B] int64)``.
* ``task="ae"``: a batch is ``(x [B, 784] float32, x [B, 784])`` -- the target is the input.
In both tasks ``dataset.targets`` holds the class labels (int64 ``[N]``), which label partitioners read.

Defaults from Reddi et al. 2021 (Sec. 5, App. D): 10 clients per round, batch size 20, 1 local epoch, for both
EMNIST CR and EMNIST AE.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fed.datamodules.federated import FederatedDataModule, refuse_options
from lightning_fed.datamodules.partition import Partitioner
from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner
from lightning_fed.errors import DataNotFoundError

__all__ = ["EMNISTDataModule", "EMNISTDataset", "EMNIST_CLASSES", "EMNIST_TASKS", "read_leaf_femnist"]

#: The 62 ``byclass`` classes, index -> character (torchvision's ``EMNIST.classes_split_dict["byclass"]``).
EMNIST_CLASSES: list[str] = sorted(string.digits + string.ascii_letters)
#: ``"cr"``: character recognition; ``"ae"``: autoencoder (target = input).
EMNIST_TASKS = ("cr", "ae")
_NUM_CLASSES = 62
_SPLIT = "byclass"

_INSTALL_HINT = (
    "Pass download=True to let torchvision download EMNIST (NIST's gzip.zip, ~560 MB, needs internet), put the "
    "decompressed IDX files emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte into {raw}, or pass "
    "`leaf_path` = a LEAF FEMNIST data folder holding train/*.json and test/*.json (LEAF's data/femnist, "
    "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample)."
)


def _raw_file_names() -> list[str]:
    """The decompressed IDX file names torchvision's ``EMNIST(split="byclass")._check_exists`` requires."""
    parts, kinds = ("train", "test"), ("images-idx3", "labels-idx1")
    return [f"emnist-{_SPLIT}-{part}-{kind}-ubyte" for part in parts for kind in kinds]


class EMNISTDataset(Dataset):
    """In-memory EMNIST samples with ``targets`` (class labels) and, for LEAF data, ``writer_ids``.

    Args:
        images: uint8 ``[N, 28, 28]``, upright, 0 = background, 255 = ink.
        targets: int64 ``[N]`` class indices in ``[0, 62)``.
        task: ``"cr"`` or ``"ae"``.
        writer_ids: optional int64 ``[N]``: each sample's writer (index into ``writer_names``).
        writer_names: optional list of writer names.

    ``dataset[i]`` / ``dataset.get_batch(index)`` return ``(x, y)``: for ``"cr"`` ``x`` is float32
    ``[(B,) 1, 28, 28]`` in [0, 1] and ``y`` the int64 label(s); for ``"ae"`` ``x`` is float32 ``[(B,) 784]`` and
    ``y`` is ``x``.

    Raises:
        ValueError: an unknown ``task``, or tensors of the wrong dtype or shape.

    Example::

        >>> import torch
        >>> images = torch.full((2, 28, 28), 255, dtype=torch.uint8)
        >>> x, y = EMNISTDataset(images, torch.tensor([3, 40]), task="cr").get_batch(torch.tensor([1]))
        >>> x.shape, x.max().item(), y
        (torch.Size([1, 1, 28, 28]), 1.0, tensor([40]))
        >>> x, y = EMNISTDataset(images, torch.tensor([3, 40]), task="ae")[0]
        >>> x.shape, bool((x == y).all())
        (torch.Size([784]), True)
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        task: str = "cr",
        writer_ids: Optional[torch.Tensor] = None,
        writer_names: Optional[list[str]] = None,
    ) -> None:
        if task not in EMNIST_TASKS:
            raise ValueError(f"`task` must be one of {EMNIST_TASKS}, got {task!r}.")
        if images.dtype != torch.uint8 or images.ndim != 3 or tuple(images.shape[1:]) != (28, 28):
            raise ValueError(f"`images` must be uint8 [N, 28, 28], got {images.dtype} {tuple(images.shape)}.")
        if targets.dtype != torch.long or targets.shape != (images.shape[0],):
            raise ValueError(
                f"`targets` must be int64 [{images.shape[0]}], got {targets.dtype} {tuple(targets.shape)}."
            )
        if writer_ids is not None and (writer_ids.dtype != torch.long or writer_ids.shape != targets.shape):
            raise ValueError(
                f"`writer_ids` must be int64 [{images.shape[0]}], got {writer_ids.dtype} {tuple(writer_ids.shape)}."
            )
        self.data = images
        self.targets = targets
        self.task = task
        self.classes = list(EMNIST_CLASSES)
        if writer_ids is not None:
            self.writer_ids = writer_ids
            self.writer_names = list(writer_names) if writer_names is not None else None

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def _convert(self, images: torch.Tensor, labels: torch.Tensor):
        x = images.to(torch.float32).div_(255.0)
        if self.task == "ae":
            x = x.reshape(*images.shape[:-2], 28 * 28)
            return x, x
        return x.unsqueeze(-3), labels

    def __getitem__(self, i: int):
        return self._convert(self.data[i], self.targets[i])

    def get_batch(self, index: torch.Tensor):
        """The batch of samples ``index`` (int64 ``[B]``), as a DataLoader would collate it."""
        return self._convert(self.data[index], self.targets[index])


def _read_leaf_file(path: Path) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    with open(path, "r", encoding="utf-8") as f:
        blob = json.load(f)
    if not isinstance(blob, dict) or "users" not in blob or "user_data" not in blob:
        raise ValueError(f"{path} is not a LEAF JSON file: expected keys 'users' and 'user_data'.")
    users, xs, ys = [], [], []
    for user in blob["users"]:
        data = blob["user_data"].get(user)
        if data is None:
            raise ValueError(f"{path}: user {user!r} is listed in 'users' but has no 'user_data'.")
        x = np.asarray(data["x"], dtype=np.float64)
        y = np.asarray(data["y"])
        if x.ndim != 2 or x.shape[1] != 784 or len(y) != len(x):
            raise ValueError(
                f"{path}: user {user!r} must have x of shape [n, 784] and n labels, got x {x.shape}, y {y.shape}."
            )
        if len(x) == 0:
            continue
        if not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
            raise ValueError(f"{path}: user {user!r} has non-integer labels.")
        y = y.astype(np.int64)
        if y.min() < 0 or y.max() >= _NUM_CLASSES:
            raise ValueError(f"{path}: user {user!r} has labels outside [0, {_NUM_CLASSES}).")
        if x.min() < 0 or x.max() > 1:
            raise ValueError(f"{path}: user {user!r} has pixels outside [0, 1].")
        users.append(str(user))
        xs.append(x)
        ys.append(y)
    return users, xs, ys


def read_leaf_femnist(folder: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor, list[str], torch.Tensor]:
    """Read every ``*.json`` LEAF FEMNIST file in ``folder`` (sorted by file name).

    Returns:
        ``(images, labels, writers, writer_of_sample)``: uint8 ``[N, 28, 28]`` (converted to 0 = background:
        ``round((1 - x) * 255)``), int64 ``[N]``, the writer names in order of first appearance, and int64
        ``[N]`` indices into that list.

    Raises:
        FileNotFoundError: no folder or no ``*.json`` in it. ValueError: malformed content.

    Example: two writers in LEAF's JSON layout (LEAF stores 1.0 for background)::

        >>> import json, tempfile
        >>> from pathlib import Path
        >>> folder = Path(tempfile.mkdtemp())
        >>> data = {"users": ["f0", "f1"], "num_samples": [1, 2],
        ...         "user_data": {"f0": {"x": [[1.0] * 784], "y": [3]}, "f1": {"x": [[0.0] * 784] * 2, "y": [40, 7]}}}
        >>> _ = (folder / "all_data_0.json").write_text(json.dumps(data))
        >>> images, labels, writers, owner = read_leaf_femnist(folder)
        >>> images.shape, images[:, 0, 0].tolist(), labels.tolist(), writers, owner.tolist()
        (torch.Size([3, 28, 28]), [0, 255, 255], [3, 40, 7], ['f0', 'f1'], [0, 1, 1])
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        hint = _INSTALL_HINT.replace("{raw}", "{data_dir}/EMNIST/raw")
        raise DataNotFoundError(f"No LEAF *.json files in {folder}. {hint}")
    writers: list[str] = []
    index: dict[str, int] = {}
    imgs, labels, owner = [], [], []
    for path in files:
        users, xs, ys = _read_leaf_file(path)
        for user, x, y in zip(users, xs, ys):
            if user not in index:
                index[user] = len(writers)
                writers.append(user)
            imgs.append(np.rint((1.0 - x) * 255.0).astype(np.uint8).reshape(-1, 28, 28))
            labels.append(y)
            owner.append(np.full(len(y), index[user], dtype=np.int64))
    if not imgs:
        raise ValueError(f"The LEAF files in {folder} hold no samples.")
    return (
        torch.from_numpy(np.concatenate(imgs)),
        torch.from_numpy(np.concatenate(labels)),
        writers,
        torch.from_numpy(np.concatenate(owner)),
    )


class EMNISTDataModule(FederatedDataModule):
    """Federated EMNIST-62 for Reddi et al.'s EMNIST CR and EMNIST AE tasks (see the module docstring).

    Args:
        data_dir: torchvision ``root``; its files live in ``{data_dir}/EMNIST/raw/``.
        task: ``"cr"`` (character recognition, default) or ``"ae"`` (autoencoder, target = input).
        leaf_path: a LEAF FEMNIST data folder with ``train/`` and ``test/`` subfolders of ``*.json``; gives the
            natural one-client-per-writer split (default ``None``: torchvision's EMNIST byclass).
        partitioner: how to split the train set; default with ``leaf_path`` is
            ``NaturalIdPartitioner("writer_ids")``; **required** without ``leaf_path`` (no writer ids there),
            e.g. ``DirichletPartitioner(num_clients=3400, alpha=0.1)``.
        download: let torchvision download EMNIST if the raw files are missing (needs internet).
        val_from_test: also use the test set for validation (default ``True``: Reddi et al. validate on the
            entire test set every evaluation); ``False`` gives no validation set.
        clients_per_round, batch_size, local_epochs: Reddi et al. 2021 defaults (10, 20, 1).
        **kwargs: every other :class:`FederatedDataModule` option (``local_work``, ``seed``, ``cohort_sampling``,
            ``client_dropout``, ``over_selection``, ``eval_clients_per_round``, ...; the datasets are refused: the
            task loads its data). In federated evaluation (:mod:`lightning_fed.evaluation`) with ``leaf_path`` and
            the per-writer partition, each writer's evaluation data is its own LEAF test samples
            (:meth:`natural_eval_split`; writers without test samples are never evaluated), or with
            ``eval_fraction`` a held-out part of its train share. ``eval_fraction`` is **required** for federated
            evaluation on torchvision's EMNIST (its test set has no writer ids, so there is no natural
            per-client split) or with another ``partitioner``.

    Raises:
        ValueError: unknown ``task``; no ``partitioner`` and no ``leaf_path``; non-bool flags;
            ``eval_clients_per_round`` without ``eval_fraction`` where there is no natural per-client split
            (torchvision's EMNIST, or a ``partitioner`` other than ``NaturalIdPartitioner("writer_ids")``); and
            :class:`FederatedDataModule`'s checks.
        FileNotFoundError: at :meth:`prepare_data` / :meth:`setup`, when the data is missing.

    Example: a LEAF FEMNIST folder (``train/`` and ``test/`` JSON files) in a temporary folder gives one client
    per writer::

        >>> import json, tempfile
        >>> from pathlib import Path
        >>> root = Path(tempfile.mkdtemp())
        >>> for split, users in (("train", ["f0", "f1"]), ("test", ["f0"])):
        ...     (root / split).mkdir()
        ...     data = {"users": users, "num_samples": [2] * len(users),
        ...             "user_data": {u: {"x": [[1.0] * 784] * 2, "y": [3, 40]} for u in users}}
        ...     _ = (root / split / "data.json").write_text(json.dumps(data))
        >>> dm = EMNISTDataModule(data_dir=root, leaf_path=root, clients_per_round=2)
        >>> dm.setup("fit")
        >>> dm.num_clients, dm.partition.sizes(), dm.train_dataset[0][0].shape
        (2, array([2, 2]), torch.Size([1, 28, 28]))
        >>> EMNISTDataModule(task="ocr")
        Traceback (most recent call last):
        ...
        ValueError: `task` must be one of ('cr', 'ae') ('cr': character recognition, 'ae': autoencoder), got 'ocr'.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike = "data",
        task: str = "cr",
        leaf_path: str | os.PathLike | None = None,
        partitioner: Optional[Partitioner] = None,
        download: bool = False,
        val_from_test: bool = True,
        clients_per_round: int = 10,
        batch_size: int = 20,
        local_epochs: int = 1,
        **kwargs: Any,
    ) -> None:
        if task not in EMNIST_TASKS:
            raise ValueError(
                f"`task` must be one of {EMNIST_TASKS} ('cr': character recognition, 'ae': autoencoder), got {task!r}."
            )
        for name, flag in (("download", download), ("val_from_test", val_from_test)):
            if not isinstance(flag, bool):
                raise ValueError(f"`{name}` must be True or False, got {flag!r}.")
        if partitioner is None:
            if leaf_path is None:
                raise ValueError(
                    "`partitioner` is required without `leaf_path` (torchvision's EMNIST has no writer ids): e.g. "
                    "DirichletPartitioner(num_clients=3400, alpha=0.1); or pass `leaf_path` (LEAF FEMNIST JSON) "
                    "for the natural split by writer."
                )
            partitioner = NaturalIdPartitioner("writer_ids")
        refuse_options(type(self).__name__, kwargs, train_dataset="it loads its own data",
                       val_dataset="it loads its own data", test_dataset="it loads its own data")
        super().__init__(partitioner=partitioner, clients_per_round=clients_per_round, batch_size=batch_size,
                         local_epochs=local_epochs, **kwargs)
        natural = leaf_path is not None and _is_writer_partitioner(partitioner)
        if self.eval_clients_per_round is not None and self.eval_fraction is None and not natural:
            why = (
                "torchvision's EMNIST has no writer ids in its test set" if leaf_path is None
                else f"the LEAF test samples are per writer, but the partitioner is {partitioner!r}"
            )
            raise ValueError(
                f"Federated evaluation (`eval_clients_per_round`={self.eval_clients_per_round!r}) needs per-client "
                f"evaluation data and there is no natural per-client split ({why}): give `eval_fraction` (e.g. 0.2) "
                "to hold out part of each client's share, or use `leaf_path` with the per-writer partition."
            )
        self.data_dir = str(data_dir)
        self.task = task
        self.leaf_path = None if leaf_path is None else str(leaf_path)
        self.download = download
        self.val_from_test = val_from_test
        self._natural_eval = natural
        #: The LEAF test set and each test sample's train writer id (-1: a writer with no train samples).
        self._client_test: Optional[EMNISTDataset] = None
        self._client_test_writer_ids: Optional[np.ndarray] = None

    # ------------------------------------------------------------------ files
    @property
    def raw_folder(self) -> Path:
        """``{data_dir}/EMNIST/raw`` -- torchvision's ``EMNIST.raw_folder``."""
        return Path(self.data_dir) / "EMNIST" / "raw"

    def _raw_present(self) -> bool:
        return all((self.raw_folder / name).is_file() for name in _raw_file_names())

    def _leaf_dirs(self) -> tuple[Path, Path]:
        root = Path(self.leaf_path)
        return root / "train", root / "test"

    def prepare_data(self) -> None:
        """Check the LEAF folders, or make sure torchvision's raw files exist (download if allowed)."""
        if self.leaf_path is not None:
            for folder in self._leaf_dirs():
                if not folder.is_dir() or not any(folder.glob("*.json")):
                    raise DataNotFoundError(
                        f"`leaf_path` {self.leaf_path!r}: {folder} holds no LEAF *.json files; expected "
                        f"{{leaf_path}}/train/*.json and {{leaf_path}}/test/*.json (LEAF's data/femnist/data)."
                    )
            return
        if self._raw_present():
            return
        if self.download:
            from torchvision.datasets import EMNIST

            EMNIST(self.data_dir, split=_SPLIT, train=True, download=True)
            EMNIST(self.data_dir, split=_SPLIT, train=False, download=True)
            return
        missing = [n for n in _raw_file_names() if not (self.raw_folder / n).is_file()]
        hint = _INSTALL_HINT.replace("{raw}", str(self.raw_folder))
        raise DataNotFoundError(f"EMNIST not found: {self.raw_folder} lacks {missing}. {hint}")

    # ------------------------------------------------------------------ datasets
    def _load_torchvision(self, train: bool) -> EMNISTDataset:
        from torchvision.datasets import EMNIST

        ds = EMNIST(self.data_dir, split=_SPLIT, train=train, download=False)
        images = ds.data.transpose(1, 2).contiguous()  # the IDX files are transposed: make characters upright
        return EMNISTDataset(images, ds.targets.to(torch.long), task=self.task)

    def load_datasets(self):
        """``(train, val, test)`` in-memory :class:`EMNISTDataset` s; val is the test set if ``val_from_test``."""
        self.prepare_data()  # raises a clear FileNotFoundError when the data is missing
        if self.leaf_path is not None:
            train_dir, test_dir = self._leaf_dirs()
            images, labels, writers, owner = read_leaf_femnist(train_dir)
            # writer ids index the *sorted* writer names, so client c is the c-th writer by name
            order = np.argsort(np.asarray(writers, dtype=object), kind="stable")
            rank = np.empty(len(writers), dtype=np.int64)
            rank[order] = np.arange(len(writers))
            writer_ids = torch.from_numpy(rank)[owner]
            train = EMNISTDataset(images, labels, self.task, writer_ids, [writers[i] for i in order])
            t_images, t_labels, t_writers, t_owner = read_leaf_femnist(test_dir)
            test = EMNISTDataset(t_images, t_labels, self.task)
            rank_of = {writers[i]: r for r, i in enumerate(order.tolist())}
            t_rank = np.array([rank_of.get(w, -1) for w in t_writers], dtype=np.int64)
            self._client_test = test
            self._client_test_writer_ids = t_rank[t_owner.numpy()]
        else:
            train = self._load_torchvision(train=True)
            test = self._load_torchvision(train=False)
        return train, (test if self.val_from_test else None), test

    def natural_eval_split(self) -> Optional[tuple[EMNISTDataset, np.ndarray]]:
        """Each writer's own LEAF test samples as its federated-evaluation data (LEAF FEMNIST's per-writer
        train/test split, Caldas et al. 2018; Reddi et al. 2021 use the same files).

        Returns:
            ``(test_dataset, writer_ids)`` with ``writer_ids`` int64 ``[len(test_dataset)]``: the train writer id
            (the client's name in ``partition.client_names``) of each test sample, -1 for a writer with no train
            samples (never evaluated). ``None`` -- no natural split -- for torchvision's EMNIST (its test set
            carries no writer ids; federated evaluation then needs ``eval_fraction``), with a ``partitioner``
            other than ``NaturalIdPartitioner("writer_ids")``, and before the data is loaded.
        """
        if not self._natural_eval or self._client_test is None:
            return None
        return self._client_test, self._client_test_writer_ids


def _is_writer_partitioner(partitioner: Any) -> bool:
    """Whether ``partitioner`` gives one client per LEAF writer (the split the LEAF test files follow)."""
    return isinstance(partitioner, NaturalIdPartitioner) and partitioner.id_column == "writer_ids"
