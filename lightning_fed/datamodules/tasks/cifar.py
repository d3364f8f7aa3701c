"""CIFAR-10 / CIFAR-100 (Krizhevsky, 2009) as federated data modules, the image tasks of Reddi et al. 2021.

Data: torchvision's python-pickle layout, ``{data_dir}/cifar-10-batches-py/`` (``data_batch_1`` ..
``data_batch_5``, ``test_batch``, ``batches.meta``) or ``{data_dir}/cifar-100-python/`` (``train``,
``test``, ``meta``). With ``download=True`` torchvision downloads and extracts them (needs internet);
otherwise a :class:`FileNotFoundError` explains how to get them. Reading is done by torchvision's own
``CIFAR10`` / ``CIFAR100`` reader, which checks every file's md5 against its pinned value before unpickling it.

Files are pickles, and unpickling runs code: a file whose md5 is unknown or wrong is never given to
:mod:`pickle`. With ``check_md5=False`` (re-packed or test files) the files are read by :func:`safe_load_batch`, a
restricted unpickler that builds only plain containers, numbers, strings and uint8 numpy arrays and refuses any
other object (the "Restricting Globals" recipe of the :mod:`pickle` documentation), so no code of the file can run.
CIFAR-100's coarse labels, which torchvision does not expose, are read from the same files (key
``coarse_labels``) by the same restricted reader.

Images stay in memory as uint8 ``[N, 3, 32, 32]`` (150 MB for CIFAR's 50,000 training images) in a
:class:`CIFARTensorDataset`, which preprocesses a whole batch at once with torch ops in
``get_batch(index)`` -- so :class:`~lightning_fed.datamodules.federated.TensorBatches` slices it
directly. The preprocessing is Reddi et al. 2021, App. C (as in TFF's CIFAR tasks):

* training: a random ``24 x 24`` crop and a random horizontal flip (each with probability 1/2), per
  image, then per-channel normalisation with the training-set mean / std;
* evaluation: the central ``24 x 24`` crop, then the same normalisation.

The augmentation draws from torch's *global* RNG. In federated training the loop seeds it with the
client's seed (``torch.manual_seed(client_seed(seed, round, cid))``) before a client's local work, so
augmentations are a pure function of ``(seed, round, client)`` and runs repeat exactly.

Default partitions (Reddi et al. 2021, Sec. 5 / App. C; 500 clients x 100 training images):
CIFAR-10: ``DirichletPartitioner(num_clients=500, alpha=0.1, method="per_client")`` (Hsu et al. 2019);
CIFAR-100: ``PachinkoPartitioner(500, 100, alpha=0.1, beta=10)`` over the 20 coarse / 100 fine labels.
Table-1 settings: 10 clients per round, batch size 20, 1 local epoch.
"""

from __future__ import annotations

import io
import numbers
import os
import pickle
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fed.datamodules.federated import FederatedDataModule, refuse_options
from lightning_fed.datamodules.partition import Partitioner
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.pachinko import PachinkoPartitioner
from lightning_fed.errors import DataNotFoundError

__all__ = [
    "CIFARFormatError",
    "safe_load_batch",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "CIFARTensorDataset",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
]

#: Per-channel (R, G, B) training-set mean / std of the pixels scaled to [0, 1].
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


class CIFARFormatError(ValueError):
    """A CIFAR file is not in the expected layout or holds something other than plain data (names the file).

    Example: a "batch file" that would call ``os.system`` when unpickled is refused::

        >>> import os, pickle, tempfile
        >>> from pathlib import Path
        >>> class Evil:
        ...     def __reduce__(self):
        ...         return (os.system, ("echo pwned",))
        >>> path = Path(tempfile.mkdtemp()) / "data_batch_1"
        >>> _ = path.write_bytes(pickle.dumps({"data": Evil()}))
        >>> safe_load_batch(path)
        Traceback (most recent call last):
        ...
        lightning_fed.datamodules.tasks.cifar.CIFARFormatError: .../data_batch_1 is not plain CIFAR data: it asks to load ...system, which could run code. Refused (only dicts, lists, numbers, strings and numpy arrays are read without an md5 check).
    """


#: The only globals a CIFAR batch file may name: numpy's array reconstruction (``numpy.core`` before numpy 2,
#: ``numpy._core`` after) and ``_codecs.encode`` (how protocol-2 pickles written by Python 3 store bytes).
_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _PlainDataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path) -> None:
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str):  # noqa: D401
        if (module, name) not in _SAFE_GLOBALS:
            raise CIFARFormatError(
                f"{self.path} is not plain CIFAR data: it asks to load {module}.{name}, which could run code. "
                f"Refused (only dicts, lists, numbers, strings and numpy arrays are read without an md5 check)."
            )
        return super().find_class(module, name)


def safe_load_batch(path: str | os.PathLike) -> dict:
    """Read one CIFAR python batch file (a pickled dict) without running any code from it.

    Only dicts, lists, tuples, numbers, strings, bytes and numpy arrays of a non-object dtype are built; any other
    global the file names is refused. Strings are decoded as latin-1 (as torchvision does).

    Raises:
        CIFARFormatError: the file names another global, holds an object array, or is not a dict; the message
            names the file.

    Example::

        >>> import pickle, tempfile
        >>> from pathlib import Path
        >>> import numpy as np
        >>> path = Path(tempfile.mkdtemp()) / "test_batch"
        >>> _ = path.write_bytes(pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [3, 8]}, protocol=2))
        >>> batch = safe_load_batch(path)
        >>> batch["data"].shape, batch["labels"]
        ((2, 3072), [3, 8])
    """
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            obj = _PlainDataUnpickler(io.BufferedReader(fh), path).load()
        except CIFARFormatError:
            raise
        except Exception as err:  # truncated / not a pickle
            raise CIFARFormatError(f"{path} is not a readable CIFAR batch file: {type(err).__name__}: {err}") from err
    if not isinstance(obj, dict):
        raise CIFARFormatError(f"{path} must hold a dict, got {type(obj).__name__}.")
    for key, value in obj.items():
        if isinstance(value, np.ndarray) and value.dtype.hasobject:
            raise CIFARFormatError(f"{path}: entry {key!r} is an object array; only plain numeric arrays are read.")
    return obj


class CIFARTensorDataset(Dataset):
    """In-memory CIFAR split that crops / flips / normalises whole batches with torch ops.

    Args:
        images: uint8 ``[N, 3, 32, 32]`` (CHW).
        targets: LongTensor ``[N]`` of class (fine) labels.
        mean, std: per-channel normalisation of the [0, 1] pixels (3 floats each).
        crop_size: side of the square crop (``1 .. 32``; default 24); 32 keeps the full image.
        augment: ``True``: random crop + random horizontal flip (training); ``False``: center crop.
        classes: class names (index -> name).
        coarse_targets: LongTensor ``[N]`` of coarse labels (CIFAR-100) or ``None``.

    ``get_batch(index)`` with a LongTensor ``index [B]`` returns ``(x [B, 3, c, c] float32, y [B] long)``;
    ``dataset[i]`` returns ``(x [3, c, c], y)`` (the same preprocessing, for a ``DataLoader``). Random
    draws use torch's global RNG (see the module docstring).

    Raises:
        ValueError: ``images`` not uint8 ``[N, 3, H, W]``, ``targets`` not int64 ``[N]``, or ``crop_size`` out of range.

    Example: center crop to 24x24 and normalisation (pixels 0 → (0 − 0.5)/0.25 = −2)::

        >>> import torch
        >>> ds = CIFARTensorDataset(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.tensor([0, 1, 2, 3]),
        ...                         mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), crop_size=24)
        >>> x, y = ds.get_batch(torch.tensor([2, 0]))
        >>> x.shape, y, x.unique()
        (torch.Size([2, 3, 24, 24]), tensor([2, 0]), tensor([-2.]))
    """

    def __init__(
        self,
        images: torch.Tensor,
        targets: torch.Tensor,
        mean: tuple[float, float, float],
        std: tuple[float, float, float],
        crop_size: int = 24,
        augment: bool = False,
        classes: list[str] | None = None,
        coarse_targets: torch.Tensor | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"`images` must be uint8 [N, 3, H, W], got {images.dtype} {tuple(images.shape)}")
        if targets.dtype != torch.long or targets.shape != (images.shape[0],):
            raise ValueError(f"`targets` must be a LongTensor [{images.shape[0]}], got {targets.dtype} {tuple(targets.shape)}")
        h, w = images.shape[2], images.shape[3]
        if isinstance(crop_size, bool) or not isinstance(crop_size, numbers.Integral) or not 1 <= crop_size <= min(h, w):
            raise ValueError(f"`crop_size` must be an integer in [1, {min(h, w)}], got {crop_size!r}")
        self.images = images
        self.targets = targets
        self.coarse_targets = coarse_targets
        self.classes = list(classes) if classes is not None else []
        self.crop_size = int(crop_size)
        self.augment = bool(augment)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Preprocessed ``(x [B, 3, c, c], y [B])`` for the samples ``index`` (LongTensor ``[B]``)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        x = self.images[index]  # [B, 3, H, W] uint8
        b, _, h, w = x.shape
        c = self.crop_size
        if self.augment:
            oy = torch.randint(0, h - c + 1, (b,))
            ox = torch.randint(0, w - c + 1, (b,))
            flip = torch.rand(b) < 0.5
        else:
            oy = torch.full((b,), (h - c) // 2, dtype=torch.long)
            ox = torch.full((b,), (w - c) // 2, dtype=torch.long)
            flip = torch.zeros(b, dtype=torch.bool)
        ar = torch.arange(c)
        rows = oy[:, None] + ar  # [B, c]
        cols = ox[:, None] + ar
        cols = torch.where(flip[:, None], cols.flip(1), cols)  # a flipped crop reads its columns backwards
        x = x[torch.arange(b)[:, None, None, None], torch.arange(3)[None, :, None, None], rows[:, None, :, None], cols[:, None, None, :]]
        x = (x.to(torch.float32).div_(255.0) - self.mean) / self.std
        return x, self.targets[index]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(torch.tensor([int(i)]))
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Batched fetch for ``DataLoader`` (one :meth:`get_batch` instead of one call per sample)."""
        x, y = self.get_batch(torch.as_tensor(indices, dtype=torch.long))
        return list(zip(x.unbind(0), y.unbind(0)))


class _CIFARDataModule(FederatedDataModule):
    """Shared loader of :class:`CIFAR10DataModule` / :class:`CIFAR100DataModule` (see the module doc)."""

    _name = ""
    _mean: tuple[float, float, float] = CIFAR10_MEAN
    _std: tuple[float, float, float] = CIFAR10_STD

    def __init__(
        self,
        data_dir: str | os.PathLike = "data",
        partitioner: Optional[Partitioner] = None,
        download: bool = False,
        check_md5: bool = True,
        crop_size: int = 24,
        augment: bool = True,
        normalize: bool = True,
        val_from_test: bool = True,
        clients_per_round: int = 10,
        batch_size: int = 20,
        local_epochs: int = 1,
        **kwargs: Any,
    ) -> None:
        if partitioner is None:
            partitioner = self.default_partitioner()
        refuse_options(type(self).__name__, kwargs, train_dataset="it loads its own data",
                       val_dataset="it loads its own data", test_dataset="it loads its own data")
        super().__init__(
            partitioner=partitioner,
            clients_per_round=clients_per_round,
            batch_size=batch_size,
            local_epochs=local_epochs,
            **kwargs,
        )
        for name, value in (("download", download), ("check_md5", check_md5), ("augment", augment),
                            ("normalize", normalize), ("val_from_test", val_from_test)):
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False, got {value!r}")
        if isinstance(crop_size, bool) or not isinstance(crop_size, numbers.Integral) or not 1 <= crop_size <= 32:
            raise ValueError(f"`crop_size` must be an integer in [1, 32] (24 in Reddi et al.; 32 = no crop), got {crop_size!r}")
        self.data_dir = str(data_dir)
        self.download = download
        self.check_md5 = check_md5
        self.crop_size = int(crop_size)
        self.augment = augment
        self.normalize = normalize
        self.val_from_test = val_from_test

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def default_partitioner() -> Partitioner:
        raise NotImplementedError

    @staticmethod
    def _torchvision_class() -> type:
        raise NotImplementedError

    # ------------------------------------------------------------------ files
    def _read_split_unverified(self, train: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """``(images uint8 [N, 32, 32, 3], labels int64 [N], classes)`` read with :func:`safe_load_batch` (no md5,
        no code from the files), in torchvision's file order and layout."""
        cls = self._torchvision_class()
        label_key = "labels" if "labels" in self._label_keys() else "fine_labels"
        data, labels = [], []
        for name, _ in cls.train_list if train else cls.test_list:
            path = self.folder / name
            entry = safe_load_batch(path)
            x = entry.get("data")
            y = entry.get(label_key)
            if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072:
                raise CIFARFormatError(f"{path}: 'data' must be a uint8 array [N, 3072], got "
                                       f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}.")
            if not isinstance(y, (list, np.ndarray)) or len(y) != x.shape[0]:
                raise CIFARFormatError(f"{path}: {label_key!r} must be a list of {x.shape[0]} labels.")
            data.append(x)
            labels.append(np.asarray(y, dtype=np.int64).reshape(-1))
        images = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))  # torchvision's HWC
        meta_path = self.folder / cls.meta["filename"]
        meta = safe_load_batch(meta_path)
        classes = meta.get(cls.meta["key"])
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise CIFARFormatError(f"{meta_path}: {cls.meta['key']!r} must be a list of class names.")
        y = np.concatenate(labels)
        bad = np.flatnonzero((y < 0) | (y >= len(classes)))
        if bad.size:
            raise CIFARFormatError(f"{self.folder}: label {int(y[bad[0]])} of sample {int(bad[0])} is outside the "
                                   f"{len(classes)} classes 0..{len(classes) - 1}.")
        return images, y, classes

    @staticmethod
    def _label_keys() -> tuple[str, ...]:
        return ("labels",)

    @property
    def folder(self) -> Path:
        """``{data_dir}/{base_folder}``, where torchvision keeps the pickle files."""
        return Path(self.data_dir) / self._torchvision_class().base_folder

    def _file_names(self) -> list[str]:
        cls = self._torchvision_class()
        return [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]

    def prepare_data(self) -> None:
        """Download with torchvision when ``download=True`` and the files are missing; else a clear error."""
        missing = [n for n in self._file_names() if not (self.folder / n).is_file()]
        if not missing:
            return
        if self.download:  # torchvision downloads the archive, checks its md5, extracts it
            self._torchvision_class()(self.data_dir, train=True, download=True)
            return
        cls = self._torchvision_class()
        raise DataNotFoundError(
            f"{self._name} not found: {self.folder} lacks {missing}. Pass download=True to let torchvision "
            f"download {cls.url} (needs internet), or extract {cls.filename} (the python version, "
            f"md5 {cls.tgz_md5}) into {self.data_dir!r} so that {self.folder} holds {self._file_names()}."
        )

    # ------------------------------------------------------------------ datasets
    def _coarse_labels(self, train: bool) -> torch.Tensor | None:
        return None

    def _load_split(self, train: bool) -> CIFARTensorDataset:
        if self.check_md5:
            cls = self._torchvision_class()
            try:  # torchvision checks every file's md5 before it unpickles anything
                ds = cls(self.data_dir, train=train, download=False)
            except RuntimeError as err:  # torchvision's "Dataset not found or corrupted"
                raise DataNotFoundError(
                    f"{self._name} in {self.folder} could not be read: {err} The files are missing, damaged or not "
                    f"torchvision's {cls.filename}; they were not unpickled. Delete them and get them again "
                    f"(download=True, or extract {cls.filename}, md5 {cls.tgz_md5})."
                ) from err
            data, labels, classes = ds.data, ds.targets, ds.classes
        else:
            data, labels, classes = self._read_split_unverified(train)
        images = torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))  # HWC -> CHW, uint8
        targets = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        mean, std = (self._mean, self._std) if self.normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
        return CIFARTensorDataset(
            images, targets, mean, std, crop_size=self.crop_size, augment=train and self.augment,
            classes=classes, coarse_targets=self._coarse_labels(train),
        )

    def load_datasets(self):
        """``(train, val, test)`` in-memory datasets; val is the test set if ``val_from_test`` (Reddi et al.
        evaluate on the whole test set)."""
        self.prepare_data()
        train = self._load_split(train=True)
        test = self._load_split(train=False)
        return train, (test if self.val_from_test else None), test


class CIFAR10DataModule(_CIFARDataModule):
    """Federated CIFAR-10: 50,000 train / 10,000 test images, 10 classes, 3x32x32 (cropped to 24x24).

    Args:
        data_dir: torchvision ``root``; files live in ``{data_dir}/cifar-10-batches-py/``.
        partitioner: default ``DirichletPartitioner(num_clients=500, alpha=0.1, method="per_client")``
            (Reddi et al. 2021: 500 clients x 100 images, label distribution ``Dir(0.1)``).
        download: let torchvision download the data (needs internet).
        check_md5: let torchvision check the files' md5s before unpickling them (default ``True``). ``False``
            reads files with unknown md5s (re-packed or test files) with the restricted :func:`safe_load_batch`
            instead of :mod:`pickle`: no code in them can run.
        crop_size: crop side (default 24; 32 = no crop).
        augment: random crop + flip on the training set (default ``True``); ``False`` center-crops it.
        normalize: standardise with :data:`CIFAR10_MEAN` / :data:`CIFAR10_STD` (default ``True``).
        val_from_test: return the test set as validation set too (default ``True``).
        clients_per_round, batch_size, local_epochs: Reddi et al. Table 1 settings (10, 20, 1).
        **kwargs: passed to :class:`FederatedDataModule`.

    Raises:
        ValueError: a bad argument. FileNotFoundError: at setup, data missing, unreadable or failing the md5 check.
        CIFARFormatError: (``check_md5=False``) a file is not plain CIFAR data (e.g. a pickle that would run code).

    Example: construction reads nothing (:meth:`setup` reads the files); the default partitioner is Reddi et al.'s::

        >>> dm = CIFAR10DataModule(data_dir="data")
        >>> dm.partitioner, dm.clients_per_round, dm.batch_size
        (DirichletPartitioner(num_clients=500, alpha=0.1, min_partition_size=10, max_tries=100, seed=0, method='per_client', self_balancing=False), 10, 20)
        >>> CIFAR10DataModule(augment="yes")
        Traceback (most recent call last):
        ...
        ValueError: `augment` must be True or False, got 'yes'
    """

    _name = "CIFAR-10"
    _mean, _std = CIFAR10_MEAN, CIFAR10_STD

    @staticmethod
    def default_partitioner() -> Partitioner:
        return DirichletPartitioner(num_clients=500, alpha=0.1, method="per_client")

    @staticmethod
    def _torchvision_class() -> type:
        from torchvision.datasets import CIFAR10

        return CIFAR10


class CIFAR100DataModule(_CIFARDataModule):
    """Federated CIFAR-100: 50,000 train / 10,000 test images, 100 fine / 20 coarse classes, 3x32x32.

    ``targets`` are the fine labels (what the model predicts); the datasets also carry
    ``coarse_targets``. Arguments as :class:`CIFAR10DataModule`, except:

    Args:
        data_dir: files live in ``{data_dir}/cifar-100-python/``.
        partitioner: default ``PachinkoPartitioner(500, 100, alpha=0.1, beta=10)`` (Reddi et al. 2021,
            App. C). With a :class:`PachinkoPartitioner`, setup checks that its ``coarse_of_fine`` agrees
            with the data's coarse labels (ValueError otherwise).
        normalize: standardise with :data:`CIFAR100_MEAN` / :data:`CIFAR100_STD`.

    Example: construction reads nothing (:meth:`setup` reads the files); the default partitioner is Reddi et al.'s
    Pachinko split::

        >>> CIFAR100DataModule(data_dir="data").partitioner
        PachinkoPartitioner(num_clients=500, samples_per_client=100, alpha=0.1, beta=10.0, ...)
    """

    _name = "CIFAR-100"
    _mean, _std = CIFAR100_MEAN, CIFAR100_STD

    @staticmethod
    def default_partitioner() -> Partitioner:
        return PachinkoPartitioner(num_clients=500, samples_per_client=100, alpha=0.1, beta=10.0)

    @staticmethod
    def _torchvision_class() -> type:
        from torchvision.datasets import CIFAR100

        return CIFAR100

    @staticmethod
    def _label_keys() -> tuple[str, ...]:
        return ("fine_labels",)

    def _coarse_labels(self, train: bool) -> torch.Tensor:
        cls = self._torchvision_class()
        coarse: list[int] = []
        for name, _ in cls.train_list if train else cls.test_list:
            path = self.folder / name
            entry = safe_load_batch(path)  # never full pickle, even after torchvision's md5 check
            if not isinstance(entry.get("coarse_labels"), (list, np.ndarray)):
                raise CIFARFormatError(f"{path} has no 'coarse_labels' list.")
            coarse.extend(entry["coarse_labels"])
        return torch.as_tensor(np.asarray(coarse, dtype=np.int64))

    def load_datasets(self):
        train, val, test = super().load_datasets()
        if isinstance(self.partitioner, PachinkoPartitioner):
            cof = np.asarray(self.partitioner.coarse_of_fine)
            fine, coarse = train.targets.numpy(), train.coarse_targets.numpy()
            if fine.max() >= cof.shape[0] or not np.array_equal(cof[fine], coarse):
                raise ValueError(
                    "`partitioner.coarse_of_fine` disagrees with the data's coarse labels; pass "
                    "coarse_of_fine=None (CIFAR-100's map) or the map matching the data"
                )
        return train, val, test
