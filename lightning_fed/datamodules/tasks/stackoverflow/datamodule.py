"""The Stack Overflow data modules: :class:`StackOverflowNWPDataModule` (SO NWP) and
:class:`StackOverflowTagDataModule` (SO LR).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np

from lightning_fed.checks import check_int as _check_int
from lightning_fed.datamodules.federated import FederatedDataModule, refuse_options
from lightning_fed.datamodules.partition import Partition
from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.tasks.stackoverflow.cache import (
    PREPROCESSING_VERSION,
    _kept_train_rows,
    _scan_train,
    _Store,
    _write_client_groups,
    _write_nwp,
    _write_tag,
)
from lightning_fed.datamodules.tasks.stackoverflow.datasets import (
    StackOverflowNWPSequences,
    StackOverflowTagExamples,
    _load_npy,
)
from lightning_fed.datamodules.tasks.stackoverflow.sqlite import (
    TFF_SQLITE_URL,
    count_examples,
    download_sqlite,
    iter_examples,
)
from lightning_fed.datamodules.tasks.stackoverflow.vocabulary import _top_k
from lightning_fed.errors import DataNotFoundError


# ---------------------------------------------------------------------------------------------------------------
# Data modules
# ---------------------------------------------------------------------------------------------------------------
class _StackOverflowDataModule(FederatedDataModule):
    _task = ""

    def __init__(
        self,
        data_dir: str = "data",
        sqlite_path: Optional[str] = None,
        vocab_size: int = 10000,
        max_examples_per_client: Optional[int] = 1000,
        num_eval_samples: Optional[int] = 10000,
        download: bool = True,
        cache: bool = True,
        clients_per_round: int = 10,
        batch_size: int = 16,
        **kwargs: Any,
    ) -> None:
        refuse_options(type(self).__name__, kwargs, partitioner="its clients are the Stack Overflow users",
                       train_dataset="it loads its own data", val_dataset="it loads its own data",
                       test_dataset="it loads its own data")
        super().__init__(partitioner=NaturalIdPartitioner("client_id"), clients_per_round=clients_per_round,
                         batch_size=batch_size, **kwargs)
        self._client_test: Optional[Any] = None
        #: The test split grouped per client: (order, offsets), from the cache (or the in-memory build).
        self._test_groups: Optional[tuple[np.ndarray, np.ndarray]] = None
        #: The train split grouped per client (order, offsets): the partition, cached with the data.
        self._train_groups: Optional[tuple[np.ndarray, np.ndarray]] = None
        self.data_dir = str(data_dir)
        self.sqlite_path = None if sqlite_path is None else str(sqlite_path)
        self.vocab_size = _check_int("vocab_size", vocab_size, 1)
        self.max_examples_per_client = (
            None if max_examples_per_client is None else _check_int("max_examples_per_client", max_examples_per_client, 1)
        )
        self.num_eval_samples = None if num_eval_samples is None else _check_int("num_eval_samples", num_eval_samples, 1)
        self.download = bool(download)
        self.cache = bool(cache)
        self.vocab: list[str] = []

    @property
    def cache_dir(self) -> Path:
        """``<data_dir>/stackoverflow``: the SQLite file (unless ``sqlite_path``) and the processed caches."""
        return Path(self.data_dir) / "stackoverflow"

    @property
    def database(self) -> Path:
        """The SQLite file read: ``sqlite_path`` or ``<data_dir>/stackoverflow/stackoverflow.sqlite``."""
        return Path(self.sqlite_path) if self.sqlite_path is not None else self.cache_dir / "stackoverflow.sqlite"

    def prepare_data(self) -> None:
        """Make sure the SQLite file exists: download and decompress TFF's ``stackoverflow.sqlite.lzma`` when
        ``download=True`` (about 1.5 GB compressed), else raise a clear :class:`FileNotFoundError`.

        The decompression streams to a temporary file in the data folder and is bounded: it stops with
        :class:`~lightning_fed.datamodules.tasks.pip_archive.ArchiveTooLargeError` (and deletes the partial file) past
        :data:`MAX_SQLITE_BYTES`, or once the output passes 64 MiB and :data:`MAX_SQLITE_RATIO` times the compressed
        bytes read so far (a decompression bomb)."""
        db = self.database
        if db.is_file():
            return
        if not self.download or self.sqlite_path is not None:
            raise DataNotFoundError(
                f"Stack Overflow SQLite file {str(db)!r} not found. Get TFF's file from {TFF_SQLITE_URL}, decompress "
                f"it (`xz -d`) to that path, or pass `download=True` (needs internet)."
            )
        db.parent.mkdir(parents=True, exist_ok=True)
        download_sqlite(db)

    def _cache_path(self) -> Path:
        """The cache folder ``<data_dir>/stackoverflow/<task>-<key>`` (key: the file's path, size and mtime and
        the preprocessing arguments)."""
        st = self.database.stat()
        key = (f"{self.database.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.vocab_size}|"
               f"{self.max_examples_per_client}|{self._cache_extra()}|v{PREPROCESSING_VERSION}")
        return self.cache_dir / f"{self._task}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def _build(self, store: _Store) -> dict[str, Any]:
        """Stream the file (two passes over train, one over test) into ``store``; return the metadata."""
        raise NotImplementedError

    def _datasets(self, arrays: dict[str, np.ndarray], meta: dict[str, Any],
                  files: Optional[dict[str, str]]) -> tuple[Any, Any]:
        raise NotImplementedError

    def _build_cache(self, final: Path) -> None:
        """Build into a private temporary folder and rename it to ``final`` only once complete: a killed or failed
        build leaves at most a ``.<name>.<uuid>.tmp`` folder, which is never loaded."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        tmp.mkdir()
        try:
            store = _Store(tmp)
            meta = self._build(store)
            store.sync()
            with open(tmp / "meta.json", "w", encoding="utf-8") as fh:
                json.dump(meta, fh)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "meta.json").is_file():  # not a concurrent build that finished first
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _load_cache(self, folder: Path) -> Optional[tuple[Any, Any]]:
        """``(train, test)`` memory-mapped from a complete cache folder, or ``None`` if it is unusable."""
        try:
            with open(folder / "meta.json", encoding="utf-8") as fh:
                meta = json.load(fh)
            if meta.get("version") != PREPROCESSING_VERSION or meta.get("task") != self._task:
                return None
            files = {p.stem: str(p) for p in folder.glob("*.npy")}
            arrays = {name: _load_npy(path) for name, path in files.items()}
            train, test = self._datasets(arrays, meta, files)
            if len(train) != meta["n_train"] or len(test) != meta["n_test"]:
                return None
            groups = self._test_groups_of(arrays, len(meta["client_names"]))
            train_groups = self._train_groups_of(folder, arrays, len(meta["client_names"]))
        except Exception:  # truncated, foreign or older cache: rebuild
            return None
        self._set_meta(meta)
        self._test_groups = groups
        self._train_groups = train_groups
        return train, test

    @classmethod
    def _train_groups_of(cls, folder: Path, arrays: dict[str, Any], num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """The train split grouped per client, read from the cache folder; a cache built before the grouping was
        cached gets it added once (built in a private folder, moved in order file first, offsets last)."""
        if "train_client_offsets" not in arrays or "train_client_order" not in arrays:
            tmp = folder / f".train-groups.{uuid.uuid4().hex}.tmp"
            try:
                tmp.mkdir()
                store = _Store(tmp)
                store.arrays["train_client_id"] = arrays["train_client_id"]
                _write_client_groups(store, "train", num_clients)
                store.sync()
                for name in ("train_client_order", "train_client_offsets"):
                    os.replace(tmp / f"{name}.npy", folder / f"{name}.npy")
                    arrays[name] = _load_npy(str(folder / f"{name}.npy"))
            except OSError:  # a read-only cache: group in memory at every setup
                store = _Store(None)
                store.arrays["train_client_id"] = arrays["train_client_id"]
                _write_client_groups(store, "train", num_clients)
                arrays = {**arrays, **store.arrays}
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return cls._groups_of(arrays, "train", num_clients)

    @classmethod
    def _test_groups_of(cls, arrays: dict[str, Any], num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """``(order, offsets)`` of the test split grouped per client (:func:`_write_client_groups`), checked."""
        return cls._groups_of(arrays, "test", num_clients)

    @staticmethod
    def _groups_of(arrays: dict[str, Any], split: str, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """``(order, offsets)`` of ``split`` grouped per client (:func:`_write_client_groups`), checked."""
        order, offsets = np.asarray(arrays[f"{split}_client_order"]), np.asarray(arrays[f"{split}_client_offsets"])
        if offsets.shape != (num_clients + 1,) or offsets[0] != 0 or offsets[-1] != order.size:
            raise ValueError(f"{split}_client_offsets does not match {split}_client_order / the clients")
        return order, offsets

    def cached_partition(self, labels: Optional[np.ndarray]) -> Optional[Partition]:
        """The one-client-per-user partition read from the cache (the train split grouped by user, built once with
        the data) instead of sorting every example's user id at every setup: the same partition
        :class:`NaturalIdPartitioner` computes (clients ``0..N-1`` in user order, each user's examples in row
        order)."""
        if self._train_groups is None or not isinstance(self.partitioner, NaturalIdPartitioner):
            return None
        order, offsets = self._train_groups
        dtype = np.asarray(self.train_dataset.client_id).dtype
        return Partition(order, offsets, labels, client_names=np.arange(offsets.size - 1, dtype=dtype))

    def _set_meta(self, meta: dict[str, Any]) -> None:
        self.vocab = list(meta["vocab"])

    def load_datasets(self) -> tuple[Any, Any, Any]:
        """``(train, val, test)``: train = the train split (capped per client), val = ``num_eval_samples``
        seeded random test examples (all of them if ``None`` or fewer), test = the whole test split.

        With ``cache=True`` train and test are memory-mapped from the cache folder (built on first use by
        streaming the SQLite file); val is an in-memory copy of its rows. With ``cache=False`` the same streaming
        build fills in-memory arrays and nothing is written."""
        if not self.database.is_file():
            self.prepare_data()
        if self.cache:
            final = self._cache_path()
            loaded = self._load_cache(final) if final.is_dir() else None
            if loaded is None:
                if final.exists():  # unusable: replace it
                    shutil.rmtree(final, ignore_errors=True)
                self._build_cache(final)
                loaded = self._load_cache(final)
                if loaded is None:
                    raise RuntimeError(f"The Stack Overflow cache {str(final)!r} just built cannot be loaded.")
            train, test = loaded
        else:
            store = _Store(None)
            meta = self._build(store)
            train, test = self._datasets(store.arrays, meta, None)
            self._set_meta(meta)
            self._test_groups = self._test_groups_of(store.arrays, len(meta["client_names"]))
            self._train_groups = self._groups_of(store.arrays, "train", len(meta["client_names"]))
        val = test
        if self.num_eval_samples is not None and self.num_eval_samples < len(test):
            # Only the chosen rows are read: `test` is memory-mapped (nothing of the split is materialised).
            rng = np.random.default_rng([self.seed, 0x50E7A1])
            val = test.subset(np.sort(rng.choice(len(test), size=self.num_eval_samples, replace=False)))
        self._client_test = test
        return train, val, test

    def natural_eval_split(self) -> Optional[tuple[Any, np.ndarray]]:
        """Each user's own examples of TFF's test split (keyed by ``client_id``, the user) as its
        federated-evaluation data: ``(test_dataset, test_dataset.client_id)``, the cached per-example client
        index into ``client_names`` (the train clients' names in ``partition.client_names``; -1 for a test user
        with no train examples, never evaluated). Every test example of the user counts, in ``rowid`` order
        (``max_examples_per_client`` caps the train split only, like TFF's ``max_elements_per_user``); a train
        user with no test examples has no evaluation data and is never sampled for evaluation. ``None`` before
        the data is loaded."""
        if self._client_test is None:
            return None
        return self._client_test, self._client_test.client_id

    def natural_eval_partition(self) -> Optional[tuple[Any, Partition]]:
        """:meth:`natural_eval_split` grouped per client, read from the cache's precomputed grouping
        (``test_client_order`` / ``test_client_offsets``, built once with the cache) instead of sorting the test
        split's client ids at every setup; the same indices as the generic grouping."""
        if self._client_test is None or self._test_groups is None:
            return super().natural_eval_partition()
        partition = self.partition
        n = len(self._client_test.client_names)
        if partition.client_names is None or not np.array_equal(partition.client_names, np.arange(n)):
            return super().natural_eval_partition()  # pragma: no cover - the partition is always one client per user
        order, offsets = self._test_groups
        return self._client_test, Partition(order, offsets)

    def _cache_extra(self) -> str:
        return ""

    def _scan(self, with_tags: bool) -> tuple[Counter, Counter, list[str], dict[str, int], int, int]:
        words, tags, per_client = _scan_train(self.database, self.max_examples_per_client, with_tags)
        names = sorted(per_client)
        pos = {c: i for i, c in enumerate(names)}
        return words, tags, names, pos, sum(per_client.values()), count_examples(self.database, "test")


class StackOverflowNWPDataModule(_StackOverflowDataModule):
    """Stack Overflow next-word prediction (SO NWP), one client per user, TFF preprocessing (see module doc).

    Batches: ``(input int64 [B, 20], target int64 [B, 20])``; ids pad 0, words 1..V, OOV V+1, BOS V+2, EOS V+3
    (model vocabulary ``vocab_size + 4``). Defaults follow Reddi et al. 2021: vocabulary 10,000, sequences of
    20 words, <= 1,000 examples per client, batch size 16, 1 local epoch, 50 clients per round, 10,000 validation
    examples.

    Args:
        data_dir: root folder (the file is ``<data_dir>/stackoverflow/stackoverflow.sqlite``; caches beside it).
        sqlite_path: read this SQLite file instead (never downloaded to).
        vocab_size: number of words V (default 10,000), >= 1.
        sequence_length: words per example T (default 20), >= 1.
        max_examples_per_client: keep each train client's first examples (default 1,000; ``None``: all).
        num_eval_samples: validation subsample of the test split (default 10,000; ``None``: whole test split).
        download: let :meth:`prepare_data` download TFF's file (default ``True``).
        cache: keep the processed datasets as memory-mapped ``.npy`` files in a cache folder (default ``True``);
            ``False``: build them in memory on every setup.
        clients_per_round, batch_size: the task's defaults (above); see :class:`FederatedDataModule`.
        **kwargs: every other :class:`FederatedDataModule` option (``local_epochs``, ``local_work``, ``seed``,
            ``cohort_sampling``, ``client_dropout``, ``over_selection``, ``eval_clients_per_round``, ...). In
            federated evaluation each user's evaluation data is its own examples of the test split
            (:meth:`natural_eval_split`), or with ``eval_fraction`` a held-out part of its train examples.
            ``partitioner`` and the datasets are refused (the clients are the users; the task loads its data).

    Attributes:
        vocab: the V words, id ``i + 1`` = ``vocab[i]`` (after :meth:`setup`).

    Raises:
        ValueError: a non-integer or too small ``vocab_size``/``sequence_length``/``max_examples_per_client``/
            ``num_eval_samples``, and the base class' checks.

    Example: construction reads nothing (the SQLite data is fetched and cached by :meth:`prepare_data` /
    :meth:`setup`); one client per user::

        >>> dm = StackOverflowNWPDataModule(data_dir="data")
        >>> dm.partitioner, dm.clients_per_round, dm.batch_size
        (NaturalIdPartitioner(id_column='client_id'), 50, 16)
        >>> StackOverflowNWPDataModule(vocab_size=0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `vocab_size` must be an integer >= 1, got 0.
    """

    _task = "nwp"

    def __init__(self, data_dir: str = "data", sqlite_path: Optional[str] = None, vocab_size: int = 10000,
                 sequence_length: int = 20, max_examples_per_client: Optional[int] = 1000,
                 num_eval_samples: Optional[int] = 10000, download: bool = True, cache: bool = True,
                 clients_per_round: int = 50, batch_size: int = 16, **kwargs: Any) -> None:
        super().__init__(data_dir=data_dir, sqlite_path=sqlite_path, vocab_size=vocab_size,
                         max_examples_per_client=max_examples_per_client, num_eval_samples=num_eval_samples,
                         download=download, cache=cache, clients_per_round=clients_per_round, batch_size=batch_size,
                         **kwargs)
        self.sequence_length = _check_int("sequence_length", sequence_length, 1)

    def _cache_extra(self) -> str:
        return f"T={self.sequence_length}"

    def _build(self, store: _Store) -> dict[str, Any]:
        words, _, names, pos, n_train, n_test = self._scan(with_tags=False)
        vocab = _top_k(words, self.vocab_size)
        del words
        db, cap, t, v = self.database, self.max_examples_per_client, self.sequence_length, self.vocab_size
        _write_nwp(store, "train", _kept_train_rows(db, cap), n_train, pos, vocab, t, v)
        _write_nwp(store, "test", iter_examples(db, "test"), n_test, pos, vocab, t, v)
        _write_client_groups(store, "test", len(names))
        _write_client_groups(store, "train", len(names))
        return {"version": PREPROCESSING_VERSION, "task": self._task, "vocab": vocab, "client_names": names,
                "n_train": n_train, "n_test": n_test}

    def _datasets(self, arrays, meta, files):
        out = []
        for split in ("train", "test"):
            names = {"_tokens": f"{split}_tokens", "client_id": f"{split}_client_id"}
            out.append(StackOverflowNWPSequences(
                arrays[names["_tokens"]], arrays[names["client_id"]], meta["client_names"],
                _files=None if files is None else {attr: files[n] for attr, n in names.items()}))
        return tuple(out)


class StackOverflowTagDataModule(_StackOverflowDataModule):
    """Stack Overflow tag prediction (SO LR), one client per user, TFF preprocessing (see module doc).

    Batches: ``(x float32 [B, vocab_size], y float32 [B, num_tags])``: the normalised bag of words of
    ``tokens + title`` and the multi-hot of the example's tags among the ``num_tags`` most frequent. Defaults follow
    Reddi et al. 2021: 10,000 words, 500 tags, <= 1,000 examples per client, batch size 100, 1 local epoch,
    10 clients per round, 10,000 validation examples.

    Args:
        num_tags: number of tags K (default 500), >= 1; the other arguments: see :class:`StackOverflowNWPDataModule`.

    Attributes:
        vocab: the V words (column ``i`` of ``x`` = ``vocab[i]``); tags: the K tags (after :meth:`setup`).

    Raises:
        ValueError: ``num_tags`` not an integer >= 1, and the checks of :class:`StackOverflowNWPDataModule`.

    Example: construction reads nothing (the SQLite data is fetched and cached by :meth:`prepare_data` /
    :meth:`setup`)::

        >>> dm = StackOverflowTagDataModule(data_dir="data")
        >>> dm.partitioner, dm.clients_per_round, dm.batch_size
        (NaturalIdPartitioner(id_column='client_id'), 10, 100)
        >>> StackOverflowTagDataModule(num_tags=0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `num_tags` must be an integer >= 1, got 0.
    """

    _task = "tag"

    def __init__(self, data_dir: str = "data", sqlite_path: Optional[str] = None, vocab_size: int = 10000,
                 num_tags: int = 500, max_examples_per_client: Optional[int] = 1000,
                 num_eval_samples: Optional[int] = 10000, download: bool = True, cache: bool = True,
                 clients_per_round: int = 10, batch_size: int = 100, **kwargs: Any) -> None:
        super().__init__(data_dir=data_dir, sqlite_path=sqlite_path, vocab_size=vocab_size,
                         max_examples_per_client=max_examples_per_client, num_eval_samples=num_eval_samples,
                         download=download, cache=cache, clients_per_round=clients_per_round, batch_size=batch_size,
                         **kwargs)
        self.num_tags = _check_int("num_tags", num_tags, 1)
        self.tags: list[str] = []

    def _cache_extra(self) -> str:
        return f"K={self.num_tags}"

    def _set_meta(self, meta: dict[str, Any]) -> None:
        super()._set_meta(meta)
        self.tags = list(meta["tags"])

    def _build(self, store: _Store) -> dict[str, Any]:
        words, tag_counts, names, pos, n_train, n_test = self._scan(with_tags=True)
        vocab = _top_k(words, self.vocab_size)
        tags = _top_k(tag_counts, self.num_tags)
        del words, tag_counts
        db = self.database
        _write_tag(store, "train", _kept_train_rows(db, self.max_examples_per_client), n_train, pos, vocab, tags)
        _write_tag(store, "test", iter_examples(db, "test"), n_test, pos, vocab, tags)
        _write_client_groups(store, "test", len(names))
        _write_client_groups(store, "train", len(names))
        return {"version": PREPROCESSING_VERSION, "task": self._task, "vocab": vocab, "tags": tags,
                "client_names": names, "n_train": n_train, "n_test": n_test}

    def _datasets(self, arrays, meta, files):
        out = []
        for split in ("train", "test"):
            attrs = {f"_{a}": f"{split}_{a}" for a in StackOverflowTagExamples._ARRAYS}
            attrs["client_id"] = f"{split}_client_id"
            out.append(StackOverflowTagExamples(
                *(arrays[attrs[f"_{a}"]] for a in StackOverflowTagExamples._ARRAYS), arrays[attrs["client_id"]],
                meta["client_names"], self.vocab_size, self.num_tags,
                _files=None if files is None else {attr: files[n] for attr, n in attrs.items()}))
        return tuple(out)
