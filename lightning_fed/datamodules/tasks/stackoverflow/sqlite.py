"""TFF's ``stackoverflow.sqlite``: where it is downloaded from (:func:`download_sqlite`) and how its examples are
read (:func:`count_examples`, :func:`iter_examples`, :func:`read_examples`).
"""

from __future__ import annotations

import lzma
import os
import sqlite3
import struct
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

from lightning_fed.atomic_io import atomic_write
from lightning_fed.checks import check_int as _check_int
from lightning_fed.datamodules.tasks.pip_archive import copy_bounded
from lightning_fed.datamodules.tasks.stackoverflow.proto import _example_texts
from lightning_fed.errors import DataNotFoundError


#: Where TFF downloads the dataset (``tff.simulation.datasets.stackoverflow.load_data``).
TFF_SQLITE_URL = "https://storage.googleapis.com/tff-datasets-public/stackoverflow.sqlite.lzma"
#: Largest decompressed SQLite file accepted from the download (256 GiB).
MAX_SQLITE_BYTES = 256 << 30
#: Largest decompressed / compressed ratio accepted from the download (text compresses ~5-10 times with lzma; a
#: bomb of zeros ~7,000 times).
MAX_SQLITE_RATIO = 100.0


class _CountingReader:
    """A read-only stream that counts the bytes read through it (the compressed bytes of a download)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.count = raw, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return data

    def readable(self) -> bool:
        return True
def download_sqlite(db: str | os.PathLike) -> None:
    """Download TFF's ``stackoverflow.sqlite.lzma`` from :data:`TFF_SQLITE_URL` and decompress it to ``db`` (its
    folder must exist), through a temporary file renamed into place only once complete
    (:func:`~lightning_fed.atomic_io.atomic_write`).

    The decompression is bounded: it stops with :class:`~lightning_fed.datamodules.tasks.pip_archive.ArchiveTooLargeError`
    (and deletes the partial file) past :data:`MAX_SQLITE_BYTES`, or once the output passes 64 MiB and
    :data:`MAX_SQLITE_RATIO` times the compressed bytes read so far (a decompression bomb).
    """
    with urllib.request.urlopen(TFF_SQLITE_URL) as resp:
        counted = _CountingReader(resp)
        with lzma.open(counted) as fin, atomic_write(db) as fout:
            copy_bounded(fin, fout, f"the download {TFF_SQLITE_URL}", MAX_SQLITE_BYTES,
                         max_ratio=MAX_SQLITE_RATIO, compressed_bytes=lambda: counted.count, block=1 << 22)


#: The values of the ``split_name`` column.
SPLITS = ("train", "heldout", "test")


def _open_db(path: str | os.PathLike, split: Optional[str] = None) -> sqlite3.Connection:
    if split is not None and split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    if not Path(path).is_file():
        raise DataNotFoundError(f"Stack Overflow SQLite file {str(path)!r} does not exist.")
    # The path is data, not URI syntax: as_uri() percent-escapes '#', '?', '%' (a folder "run#1" would otherwise cut
    # the URI at '#', dropping "?mode=ro" and making SQLite create a file "run" outside the data folder).
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)


def count_examples(path: str | os.PathLike, split: str) -> int:
    """Number of examples of ``split`` (one SQL ``COUNT(*)``, nothing decoded).

    Raises:
        ValueError: ``split`` not in :data:`SPLITS`; FileNotFoundError: no file.
    """
    con = _open_db(path, split)
    try:
        return int(con.execute("SELECT COUNT(*) FROM examples WHERE split_name = ?", (split,)).fetchone()[0])
    finally:
        con.close()


def iter_examples(
    path: str | os.PathLike, split: str, fetch_size: int = 4096
) -> Iterator[tuple[str, str, str, str]]:
    """Stream the examples of ``split`` in ``rowid`` order as ``(client_id, tokens, title, tags)`` strings.

    Reads the cursor ``fetch_size`` rows at a time (never the whole split), so memory stays bounded whatever the
    size of the file. The connection is closed when the iterator is exhausted or garbage collected.

    Raises:
        ValueError: ``split`` not in :data:`SPLITS` or ``fetch_size`` < 1; while iterating, a row whose
            ``client_id`` is not TEXT (e.g. NULL) or whose blob is not a ``tf.train.Example`` (the message names the
            file, the rowid and the problem). FileNotFoundError: no file.
    """
    fetch_size = _check_int("fetch_size", fetch_size, 1)
    con = _open_db(path, split)  # validate eagerly (not at the first next())
    return _iter_rows(con, split, fetch_size, path)


def _bad_row(path: Any, split: str, rowid: int, what: str) -> ValueError:
    return ValueError(f"Stack Overflow file {str(path)!r}: row {rowid} (rowid) of table examples, split {split!r}: "
                      f"{what}")


def _iter_rows(con: sqlite3.Connection, split: str, fetch_size: int,
               path: Any = "?") -> Iterator[tuple[str, str, str, str]]:
    try:
        cur = con.execute(
            "SELECT rowid, client_id, serialized_example_proto FROM examples WHERE split_name = ? ORDER BY rowid",
            (split,),
        )
        while True:
            rows = cur.fetchmany(fetch_size)
            if not rows:
                return
            for rowid, client_id, blob in rows:
                if not isinstance(client_id, str):  # NULL, or an INTEGER that str() would merge with the text
                    raise _bad_row(path, split, rowid, f"client_id is {client_id!r} ({type(client_id).__name__}); "
                                   "every example needs a TEXT client id (TFF's schema).")
                if not isinstance(blob, (bytes, bytearray, memoryview)):
                    raise _bad_row(path, split, rowid, f"serialized_example_proto is {type(blob).__name__}, "
                                   "expected a BLOB holding a serialized tf.train.Example.")
                try:
                    texts = _example_texts(blob)
                except (ValueError, IndexError, TypeError, struct.error) as err:
                    raise _bad_row(path, split, rowid, f"serialized_example_proto is not a valid tf.train.Example "
                                   f"({type(err).__name__}: {err or 'truncated'}).") from err
                yield (client_id, *texts)
    finally:
        con.close()


def read_examples(path: str | os.PathLike, split: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """All examples of ``split`` in TFF's SQLite file, in ``rowid`` order, as Python lists (in memory: fine for
    tests and small files; the data modules stream with :func:`iter_examples` instead).

    Returns:
        ``(client_ids, tokens, titles, tags)``: four parallel lists of strings.

    Raises:
        ValueError: ``split`` not in :data:`SPLITS`; FileNotFoundError: no file.
    """
    clients: list[str] = []
    tokens: list[str] = []
    titles: list[str] = []
    tags: list[str] = []
    for c, t, ti, ta in iter_examples(path, split):
        clients.append(c)
        tokens.append(t)
        titles.append(ti)
        tags.append(ta)
    return clients, tokens, titles, tags
