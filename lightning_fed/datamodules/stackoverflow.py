"""Federated Stack Overflow (TensorFlow Federated's ``tff.simulation.datasets.stackoverflow``): next-word prediction
(SO NWP) and tag prediction (SO LR), one client per Stack Overflow user, as in Reddi et al., "Adaptive Federated
Optimization", ICLR 2021 (Sec. 5, App. C/D) and TFF's ``stackoverflow_word_prediction`` / ``stackoverflow_tag_
prediction`` preprocessing.

On-disk layout (TFF's, read as is)
----------------------------------
``<data_dir>/stackoverflow/stackoverflow.sqlite`` (TFF downloads ``stackoverflow.sqlite.lzma`` from
:data:`TFF_SQLITE_URL` and decompresses it; :meth:`StackOverflowNWPDataModule.prepare_data` does the same when
``download=True``). Tables:

* ``examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)``: ``split_name`` is ``'train'``,
  ``'heldout'`` or ``'test'``; the blob is a serialized ``tf.train.Example`` with bytes features ``tokens``
  (space-separated words), ``tags`` (``'|'``-separated), ``title``, ``type``, ``creation_date`` and an int64
  feature ``score``. It is decoded by the tiny protobuf reader :func:`parse_example` (no TensorFlow needed):
  ``Example{1: Features{1: map<string, Feature>}}``, ``Feature{1: BytesList, 2: FloatList, 3: Int64List}``.
* ``client_metadata(client_id, split_name, num_examples)``: not needed (read only if present, never required).

Examples of a client are taken in ``rowid`` order (TFF's SQL client data reads them in table order).

Preprocessing (TFF's, see the functions for the details)
--------------------------------------------------------
* Word vocabulary: the ``vocab_size`` (10,000) most frequent words of the ``tokens`` feature over the *whole*
  train split (TFF's ``load_word_counts``), ties broken by the word (lexicographically; TFF's count file order is
  unspecified for ties). Tag vocabulary: the ``num_tags`` (500) most frequent tags over the train split (TFF's
  ``load_tag_counts``), same tie rule.
* NWP (:func:`nwp_token_rows`): ids pad 0, words 1..V, OOV V+1, BOS V+2, EOS V+3 (TFF ``get_special_tokens``
  with one OOV bucket). An example's first ``sequence_length`` (20) words -> ids; EOS appended only if fewer than
  20 words; BOS prepended; padded with pad to 21. Input = row[:-1], target = row[1:] (``[20]`` each).
* Tag LR (:func:`bag_of_words`): words of ``tokens + ' ' + title`` (TFF joins both); the bag is the *mean* of the
  one-hot vectors over all words including OOV words, with the OOV column dropped (TFF: ``reduce_mean(one_hot(ids,
  V+1))[:V]``), i.e. count / total number of words. Tags -> multi-hot over the 500 tags (OOV tags dropped).
  Deviation: an example with no words gets an all-zero bag (TFF's mean of nothing is NaN).
* At most ``max_examples_per_client`` (1,000) examples per train client (TFF ``max_elements_per_user``, the first
  ones). Clients are the distinct ``client_id`` strings of the train split, sorted (``client_names``).
* Validation during training: ``num_eval_samples`` (10,000) test examples drawn at random (seeded) from the test
  split (Reddi et al., Sec. 5 "Validation metrics"); ``trainer.test`` uses the whole test split.

Streaming build, memory-mapped cache
------------------------------------
The real file has 342,477 train clients and ~135 M train examples, so nothing is ever held as Python lists of the
whole split. The build (:meth:`load_datasets`) streams the file with a cursor, ``fetchmany`` at a time:

1. pass 1 over train: word counts (and tag counts) of every example and, per client, the number of kept examples
   (the first ``max_examples_per_client`` in rowid order) -- memory = the distinct words/tags + one int per client;
2. pass 2 over train and one pass over test (``COUNT(*)`` first): the examples are encoded ``_CHUNK_ROWS`` at a
   time and written straight into ``.npy`` files opened with :func:`numpy.lib.format.open_memmap` (arrays of
   unknown length, the CSR data of the tag task, are appended to a raw file and copied into their ``.npy``).

Files, in ``<data_dir>/stackoverflow/<task>-<key>/`` (key = the SQLite file's path, size and mtime plus the
preprocessing arguments and :data:`PREPROCESSING_VERSION`): ``{train,test}_tokens.npy`` (int32 ``[N, T + 1]``)
and ``{train,test}_client_id.npy`` (int32) for NWP; ``{split}_word_indices`` (int32), ``_word_offsets`` (int64
``[N + 1]``), ``_word_values`` (float32), ``_tag_indices`` (int32), ``_tag_offsets`` (int64) and
``_client_id`` for the tag task; ``meta.json`` (vocabulary, tags, client names, sizes). The folder is built under
a temporary name (``.<task>-<key>.<uuid>.tmp``) and renamed only when complete, so a killed build never leaves a
cache that loads (its temporary folder may stay behind and can be deleted). Loading memory-maps the arrays
(``np.load(mmap_mode="c")``: read-only mapping, copy-on-write view): the datasets read only the rows of the
batches they serve, and are pickled (DataLoader workers) as file paths, re-mapped on unpickling. The validation
subsample is an in-memory copy of its 10,000 rows, read from the mapped test split. ``cache=False`` runs the same
streaming build into in-memory arrays and writes nothing (fine for small files).

Examples are decoded by a fast reader of TensorFlow's usual ``tf.train.Example`` layout that falls back to
:func:`parse_example` for anything else; still, the first build of the full file takes a while (pure Python).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import lzma
import numbers
import os
import shutil
import sqlite3
import struct
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.local_work import LocalWork
from lightning_fed.datamodules.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.pip_archive import copy_bounded

__all__ = [
    "TFF_SQLITE_URL",
    "SPLITS",
    "PREPROCESSING_VERSION",
    "parse_example",
    "encode_example",
    "count_examples",
    "iter_examples",
    "read_examples",
    "top_k_vocab",
    "special_ids",
    "nwp_token_rows",
    "bag_of_words",
    "tag_multi_hot",
    "StackOverflowNWPSequences",
    "StackOverflowTagExamples",
    "StackOverflowNWPDataModule",
    "StackOverflowTagDataModule",
]

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
#: The values of the ``split_name`` column.
SPLITS = ("train", "heldout", "test")
#: Bumped whenever preprocessing changes (part of the cache key).
PREPROCESSING_VERSION = 2


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


# ---------------------------------------------------------------------------------------------------------------
# A minimal protobuf reader/writer for tf.train.Example
# ---------------------------------------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed protobuf: varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field_number, wire_type, value)``; value is an int (varint / fixed) or a bytes slice."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise ValueError("malformed protobuf: length-delimited field runs past the end")
            value = buf[pos:pos + n]
            pos += n
        elif wire == 5:
            value = buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            value = buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"malformed protobuf: unsupported wire type {wire}")
        yield field, wire, value


def _parse_feature(buf: bytes) -> list:
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2:  # BytesList
            return [v for f, w, v in _fields(value) if f == 1]
        if field == 2 and wire == 2:  # FloatList (packed or not)
            out: list = []
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    out.extend(struct.unpack(f"<{len(v) // 4}f", v))
                elif f == 1 and w == 5:
                    out.append(struct.unpack("<f", v)[0])
            return out
        if field == 3 and wire == 2:  # Int64List (packed or not)
            out = []
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    p = 0
                    while p < len(v):
                        x, p = _varint(v, p)
                        out.append(x - (1 << 64) if x >= 1 << 63 else x)
                elif f == 1 and w == 0:
                    out.append(v - (1 << 64) if v >= 1 << 63 else v)
            return out
    return []


def parse_example(blob: bytes) -> dict[str, list]:
    """Decode a serialized ``tf.train.Example`` into ``{name: values}`` (bytes / float / int lists).

    Raises:
        ValueError: malformed protobuf.
    """
    blob = bytes(blob)
    out: dict[str, list] = {}
    for field, wire, features in _fields(blob):
        if field != 1 or wire != 2:
            continue
        for f, w, entry in _fields(features):
            if f != 1 or w != 2:
                continue
            key, value = "", b""
            for ef, ew, ev in _fields(entry):
                if ef == 1 and ew == 2:
                    key = bytes(ev).decode("utf-8")
                elif ef == 2 and ew == 2:
                    value = ev
            out[key] = _parse_feature(value)
    return out


def _enc_varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _enc_varint(field << 3 | 2) + _enc_varint(len(payload)) + payload


def encode_example(features: dict[str, Any]) -> bytes:
    """Serialize ``{name: value}`` as a ``tf.train.Example`` (the inverse of :func:`parse_example`).

    A ``str``/``bytes`` value becomes a one-element BytesList, an ``int`` an Int64List, a ``float`` a FloatList;
    lists of them are kept as lists. Used by tests to write files in TFF's format.
    """
    entries = b""
    for key, value in features.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if all(isinstance(v, (str, bytes)) for v in values):
            inner = b"".join(_ld(1, v.encode("utf-8") if isinstance(v, str) else v) for v in values)
            feature = _ld(1, inner)
        elif all(isinstance(v, numbers.Integral) for v in values):
            feature = _ld(3, _ld(1, b"".join(_enc_varint(int(v)) for v in values)))
        else:
            feature = _ld(2, _ld(1, struct.pack(f"<{len(values)}f", *map(float, values))))
        entries += _ld(1, _ld(1, key.encode("utf-8")) + _ld(2, feature))
    return _ld(1, entries)


def _text(features: dict[str, list], name: str) -> str:
    values = features.get(name) or [b""]
    v = values[0]
    return v.decode("utf-8", errors="replace") if isinstance(v, (bytes, bytearray)) else str(v)


_WANTED = {b"tokens": 0, b"title": 1, b"tags": 2}


def _len_at(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    return (b, pos + 1) if b < 0x80 else _varint(buf, pos)


def _fast_texts(blob: bytes) -> Optional[list[bytes]]:
    """``[tokens, title, tags]`` (raw bytes) from the usual layout of a ``tf.train.Example`` written by TensorFlow
    (each map entry = key then a BytesList feature), several times faster than :func:`parse_example`; ``None``
    whenever anything differs from that layout (the caller then uses :func:`parse_example`)."""
    try:
        if blob[0] != 0x0A:
            return None
        n, pos = _len_at(blob, 1)  # Example.features: the map entries follow
        end = pos + n
        if end != len(blob):
            return None
        out: list = [b"", b"", b""]
        while pos < end:
            if blob[pos] != 0x0A:  # map entry
                return None
            n, pos = _len_at(blob, pos + 1)
            entry_end = pos + n
            if blob[pos] != 0x0A:
                return None
            n, p = _len_at(blob, pos + 1)
            slot = _WANTED.get(blob[p:p + n])
            if slot is not None:
                p += n
                if blob[p] != 0x12:  # the value
                    return None
                n, p = _len_at(blob, p + 1)
                if p + n != entry_end or blob[p] != 0x0A:  # Feature = BytesList only
                    return None
                n, p = _len_at(blob, p + 1)
                if p + n != entry_end:
                    return None
                if n:
                    if blob[p] != 0x0A:
                        return None
                    n, p = _len_at(blob, p + 1)
                    if p + n > entry_end:
                        return None
                    out[slot] = blob[p:p + n]
                else:
                    out[slot] = b""
            pos = entry_end
        if pos != end:
            return None
        return out
    except IndexError:
        return None


def _example_texts(blob: bytes) -> tuple[str, str, str]:
    """``(tokens, title, tags)`` of a serialized example, as :func:`parse_example` + the first value of each."""
    blob = bytes(blob)
    raw = _fast_texts(blob)
    if raw is None:
        f = parse_example(blob)
        return _text(f, "tokens"), _text(f, "title"), _text(f, "tags")
    return tuple(v.decode("utf-8", errors="replace") for v in raw)  # type: ignore[return-value]


def _open_db(path: str | os.PathLike, split: Optional[str] = None) -> sqlite3.Connection:
    if split is not None and split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    if not Path(path).is_file():
        raise FileNotFoundError(f"Stack Overflow SQLite file {str(path)!r} does not exist.")
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


# ---------------------------------------------------------------------------------------------------------------
# Vocabularies and encodings
# ---------------------------------------------------------------------------------------------------------------
def top_k_vocab(items: Iterable[Iterable[str]], k: int) -> list[str]:
    """The ``k`` most frequent items (fewer if there are fewer), by count descending then item ascending.

    Args:
        items: an iterable of per-example item lists (words of an example, tags of an example).
    """
    counts: Counter = Counter()
    for seq in items:
        counts.update(seq)
    return _top_k(counts, k)


def _top_k(counts: Counter, k: int) -> list[str]:
    """The ``k`` keys of ``counts`` with the largest counts, ties by key ascending (:func:`top_k_vocab`'s rule)."""
    ranked = heapq.nsmallest(k, counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [w for w, _ in ranked]


def _split_words(text: str) -> list[str]:
    return text.split(" ") if text else []  # tf.strings.split(sep=' '): empty string -> no words


def _split_tags(text: str) -> list[str]:
    return [t for t in text.split("|") if t] if text else []


def special_ids(vocab_size: int) -> dict[str, int]:
    """TFF's NWP special ids for ``vocab_size`` words and one OOV bucket: pad 0, OOV V+1, BOS V+2, EOS V+3."""
    return {"pad": 0, "oov": vocab_size + 1, "bos": vocab_size + 2, "eos": vocab_size + 3}


def nwp_token_rows(
    token_texts: Sequence[str], vocab: Sequence[str], sequence_length: int = 20, vocab_size: Optional[int] = None
) -> np.ndarray:
    """TFF's ``to_ids`` + padding for next-word prediction, int64 ``[N, sequence_length + 1]``.

    ``vocab_size`` (default ``len(vocab)``, must be ``>= len(vocab)``) places the special ids (see
    :func:`special_ids`), so that a corpus with fewer distinct words than V still matches a V-word model.

    Per example: words = ``text.split(' ')``, truncated to ``sequence_length``; word ``vocab[i]`` -> ``i + 1``,
    other words -> OOV; EOS appended if fewer than ``sequence_length`` words; BOS prepended; pad (0) to the end.
    """
    if vocab_size is None:
        vocab_size = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"`vocab_size` must be >= len(vocab) = {len(vocab)}, got {vocab_size}.")
    sp = special_ids(vocab_size)
    lookup = {w: i + 1 for i, w in enumerate(vocab)}
    oov, bos, eos = sp["oov"], sp["bos"], sp["eos"]
    rows = np.zeros((len(token_texts), sequence_length + 1), dtype=np.int64)
    for r, text in enumerate(token_texts):
        words = _split_words(text)[:sequence_length]
        ids = [bos] + [lookup.get(w, oov) for w in words]
        if len(words) < sequence_length:
            ids.append(eos)
        rows[r, : len(ids)] = ids
    return rows


def bag_of_words(texts: Sequence[str], vocab: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse normalised bag of words (TFF's tag-prediction features) in CSR form.

    Row ``r``'s dense vector is ``x[vocab index] = count / total words`` (OOV words count in the total, their
    column is dropped); an example without words is all zeros. Words are split on whitespace.

    Returns:
        ``(indices int64 [nnz], offsets int64 [N + 1], values float32 [nnz])``: the in-vocabulary word indices of
        row ``r`` (with repeats, 0-based into ``vocab``) are ``indices[offsets[r]:offsets[r+1]]``, each weighing
        ``values`` (= 1 / total words of the row).
    """
    lookup = {w: i for i, w in enumerate(vocab)}
    indices: list[int] = []
    values: list[float] = []
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    for r, text in enumerate(texts):
        words = text.split()  # whitespace split: the joined "tokens title" string has no empty words
        ids = [lookup[w] for w in words if w in lookup]
        indices.extend(ids)
        if ids:
            values.extend([1.0 / len(words)] * len(ids))
        offsets[r + 1] = len(indices)
    return np.asarray(indices, dtype=np.int64), offsets, np.asarray(values, dtype=np.float32)


def tag_multi_hot(tag_texts: Sequence[str], tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Multi-hot tag targets in CSR form: ``(indices int64, offsets int64 [N + 1])``, tags not in ``tags``
    dropped, each tag once per example."""
    lookup = {t: i for i, t in enumerate(tags)}
    indices: list[int] = []
    offsets = np.zeros(len(tag_texts) + 1, dtype=np.int64)
    for r, text in enumerate(tag_texts):
        indices.extend(sorted({lookup[t] for t in _split_tags(text) if t in lookup}))
        offsets[r + 1] = len(indices)
    return np.asarray(indices, dtype=np.int64), offsets


# ---------------------------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------------------------
def _load_npy(path: str | os.PathLike) -> np.ndarray:
    """Memory-map a ``.npy`` file. Mode ``"c"`` (copy-on-write) maps the file read-only exactly like ``"r"`` (pages
    come from the page cache on demand, nothing is read up front) but gives a *writable* view, so that
    ``torch.from_numpy`` neither warns nor lets a stray in-place write crash the process; the file never changes."""
    return np.load(path, mmap_mode="c", allow_pickle=False)


class _FileBacked:
    """Pickling for datasets whose arrays may be memory-mapped ``.npy`` files: those are pickled as their path
    and re-mapped on unpickling (DataLoader workers started with ``spawn``/``forkserver`` then map the same
    files instead of receiving a copy of the data); in-memory arrays are pickled by value."""

    _files: dict[str, str]

    def _attach(self, files: Optional[dict[str, str]]) -> None:
        self._files = dict(files or {})

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._files:
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name, path in self._files.items():
            setattr(self, name, np.asarray(_load_npy(path)))


def _int_array(a: Any, name: str) -> np.ndarray:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)  # no copy for a memory map
    if a.size == 0 and not np.issubdtype(a.dtype, np.integer):
        a = a.astype(np.int64)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"`{name}` must hold integers, got dtype {a.dtype}.")
    return a


class StackOverflowNWPSequences(_FileBacked, Dataset):
    """Next-word-prediction rows with their client: items ``(input [T], target [T])`` int64, T = 20.

    The rows may be a memory-mapped array (what :class:`StackOverflowNWPDataModule` loads from its cache): a
    batch reads only its own rows from disk.

    Args:
        tokens: ``[N, T + 1]`` integer rows from :func:`nwp_token_rows` (numpy array, memory map or tensor; kept
            in its integer dtype, the cache stores int32).
        client_id: ``[N]`` index into ``client_names`` (-1 for examples of clients outside the train split, e.g.
            test data), read by ``NaturalIdPartitioner("client_id")``.
        client_names: TFF client id strings.

    Attributes:
        tokens: the rows as a tensor sharing memory with the (possibly memory-mapped) array.
    """

    def __init__(self, tokens: Any, client_id: Any, client_names: Sequence[str],
                 _files: Optional[dict[str, str]] = None) -> None:
        tokens = _int_array(tokens, "tokens")
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise ValueError(f"`tokens` must have shape [N, T + 1] with T >= 1, got {tuple(tokens.shape)}.")
        client_id = _int_array(client_id, "client_id")
        if client_id.shape != (tokens.shape[0],):
            raise ValueError(f"`client_id` must have shape [{tokens.shape[0]}], got {client_id.shape}.")
        self._tokens = tokens
        self.client_id = client_id
        self.client_names = list(client_names)
        self._attach(_files)

    @property
    def tokens(self) -> torch.Tensor:
        return torch.from_numpy(self._tokens)

    def __len__(self) -> int:
        return int(self._tokens.shape[0])

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input int64 [B, T], target int64 [B, T])`` of rows ``index`` by one slice."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        rows = torch.from_numpy(self._tokens[index].astype(np.int64, copy=False))
        return rows[:, :-1], rows[:, 1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = torch.from_numpy(np.array(self._tokens[int(i)], dtype=np.int64))
        return row[:-1], row[1:]

    def subset(self, rows: np.ndarray) -> "StackOverflowNWPSequences":
        """The rows ``rows`` (int array) as a new, in-memory dataset."""
        rows = np.asarray(rows, dtype=np.int64)
        return StackOverflowNWPSequences(self._tokens[rows], self.client_id[rows], self.client_names)

    def to_state(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "client_id": torch.from_numpy(self.client_id), "client_names": self.client_names}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "StackOverflowNWPSequences":
        return cls(state["tokens"], state["client_id"], state["client_names"])


class StackOverflowTagExamples(_FileBacked, Dataset):
    """Tag-prediction examples stored sparsely: items ``(bag float32 [V], tags float32 [K])``.

    Dense rows are built per batch (the full train split densified would need ~N x 10,000 floats). The CSR arrays
    may be memory-mapped (what :class:`StackOverflowTagDataModule` loads from its cache).

    Args:
        word_indices, word_offsets, word_values: CSR bag of words from :func:`bag_of_words`.
        tag_indices, tag_offsets: CSR multi-hot tags from :func:`tag_multi_hot`.
        client_id: ``[N]`` index into ``client_names`` (-1 outside the train clients).
        client_names: TFF client id strings.
        vocab_size: V (columns of the bag); num_tags: K (columns of the targets).

    Attributes:
        word_indices, word_offsets, word_values, tag_indices, tag_offsets: tensors sharing memory with the arrays.
    """

    _ARRAYS = ("word_indices", "word_offsets", "word_values", "tag_indices", "tag_offsets")

    def __init__(self, word_indices, word_offsets, word_values, tag_indices, tag_offsets, client_id,
                 client_names: Sequence[str], vocab_size: int, num_tags: int,
                 _files: Optional[dict[str, str]] = None) -> None:
        self._word_indices = _int_array(word_indices, "word_indices")
        self._word_offsets = _int_array(word_offsets, "word_offsets")
        wv = word_values.numpy() if isinstance(word_values, torch.Tensor) else np.asarray(word_values)
        self._word_values = wv if wv.dtype == np.float32 else wv.astype(np.float32)
        self._tag_indices = _int_array(tag_indices, "tag_indices")
        self._tag_offsets = _int_array(tag_offsets, "tag_offsets")
        self.client_id = _int_array(client_id, "client_id")
        self.client_names = list(client_names)
        self.vocab_size = int(vocab_size)
        self.num_tags = int(num_tags)
        n = self.client_id.shape[0]
        if self._word_offsets.shape != (n + 1,) or self._tag_offsets.shape != (n + 1,):
            raise ValueError(f"`word_offsets`/`tag_offsets` must have shape [{n + 1}] (N + 1 with N = len(client_id)).")
        if self._word_values.shape != self._word_indices.shape:
            raise ValueError("`word_values` must have the shape of `word_indices`.")
        self._attach(_files)

    word_indices = property(lambda self: torch.from_numpy(self._word_indices))
    word_offsets = property(lambda self: torch.from_numpy(self._word_offsets))
    word_values = property(lambda self: torch.from_numpy(self._word_values))
    tag_indices = property(lambda self: torch.from_numpy(self._tag_indices))
    tag_offsets = property(lambda self: torch.from_numpy(self._tag_offsets))

    def __len__(self) -> int:
        return int(self.client_id.shape[0])

    @staticmethod
    def _gather(offsets: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row, at)``: for each requested row, its positions in the CSR data (only those are read)."""
        starts, ends = offsets[index].astype(np.int64), offsets[index + 1].astype(np.int64)
        lengths = ends - starts
        row = np.repeat(np.arange(index.size, dtype=np.int64), lengths)
        pos = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return row, starts[row] + pos

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x float32 [B, V], y float32 [B, K])`` of rows ``index``."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1).numpy()
        x = torch.zeros(index.size, self.vocab_size)
        row, at = self._gather(self._word_offsets, index)
        x.index_put_((torch.from_numpy(row), torch.from_numpy(self._word_indices[at].astype(np.int64))),
                     torch.from_numpy(self._word_values[at]), accumulate=True)
        y = torch.zeros(index.size, self.num_tags)
        row, at = self._gather(self._tag_offsets, index)
        y[torch.from_numpy(row), torch.from_numpy(self._tag_indices[at].astype(np.int64))] = 1.0
        return x, y

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(torch.tensor([int(i)]))
        return x[0], y[0]

    def subset(self, rows: np.ndarray) -> "StackOverflowTagExamples":
        """The rows ``rows`` (int array) as a new, in-memory dataset."""
        rows = np.asarray(rows, dtype=np.int64)
        w_row, w_at = self._gather(self._word_offsets, rows)
        t_row, t_at = self._gather(self._tag_offsets, rows)
        w_len = self._word_offsets[rows + 1] - self._word_offsets[rows]
        t_len = self._tag_offsets[rows + 1] - self._tag_offsets[rows]
        zero = np.zeros(1, dtype=np.int64)
        return StackOverflowTagExamples(
            self._word_indices[w_at], np.concatenate([zero, np.cumsum(w_len)]), self._word_values[w_at],
            self._tag_indices[t_at], np.concatenate([zero, np.cumsum(t_len)]), self.client_id[rows],
            self.client_names, self.vocab_size, self.num_tags,
        )

    def to_state(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._ARRAYS + ("client_names", "vocab_size", "num_tags")} | {
            "client_id": torch.from_numpy(self.client_id)}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> "StackOverflowTagExamples":
        return cls(s["word_indices"], s["word_offsets"], s["word_values"], s["tag_indices"], s["tag_offsets"],
                   s["client_id"], s["client_names"], s["vocab_size"], s["num_tags"])


# ---------------------------------------------------------------------------------------------------------------
# Streaming build (bounded memory)
# ---------------------------------------------------------------------------------------------------------------
#: Examples encoded and written per chunk by the streaming build.
_CHUNK_ROWS = 16384
#: Elements copied per step when a growable array is finalised.
_COPY_ELEMS = 1 << 20


class _NpyFile:
    """A ``.npy`` file created with :func:`np.lib.format.open_memmap` and filled by slices ``f[a:b] = values``:
    each write maps just that region and unmaps it at once, so the written pages go to the page cache instead of
    piling up in this process's resident set (a multi-GB output would otherwise all count as its RSS)."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: Any) -> None:
        m = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)  # zero-filled (sparse) file
        self.path, self.shape, self.dtype, self.offset = path, tuple(shape), np.dtype(dtype), int(m.offset)
        del m
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def __setitem__(self, key: Any, values: Any) -> None:
        start, stop, step = key.indices(self.shape[0]) if isinstance(key, slice) else (key, key + 1, 1)
        if step != 1:
            raise ValueError("only contiguous slices can be written")
        if stop <= start:
            return
        m = np.memmap(self.path, dtype=self.dtype, mode="r+", offset=self.offset + start * self.row_bytes,
                      shape=(stop - start,) + self.shape[1:])
        m[:] = values
        del m  # munmap: dirty pages are written back by the kernel (fsync'ed before the cache is published)


class _Store:
    """Where a build puts its arrays: ``<folder>/<name>.npy`` files (:class:`_NpyFile`, ``folder`` given), or
    plain in-memory arrays (``folder=None``, ``cache=False``)."""

    def __init__(self, folder: Optional[Path]) -> None:
        self.folder = folder
        self.arrays: dict[str, Any] = {}

    def fixed(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        if self.folder is None:
            a: Any = np.zeros(shape, dtype=dtype)
        else:
            a = _NpyFile(self.folder / f"{name}.npy", shape, dtype)
        self.arrays[name] = a
        return a

    def growable(self, name: str, dtype: Any) -> "_Appender":
        return _Appender(self, name, np.dtype(dtype))

    def sync(self) -> None:
        """Make the written files durable (before the folder is renamed into place)."""
        for a in self.arrays.values():
            if isinstance(a, _NpyFile):
                fd = os.open(a.path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)


class _Appender:
    """An array of unknown final length: chunks are appended to a raw file (or a list), then :meth:`finish` writes
    the ``.npy`` (reading and writing ``_COPY_ELEMS`` elements at a time) and deletes the raw file."""

    def __init__(self, store: _Store, name: str, dtype: np.dtype) -> None:
        self.store, self.name, self.dtype, self.n = store, name, dtype, 0
        self._parts: list[np.ndarray] = []
        self._raw = None if store.folder is None else store.folder / f"{name}.raw"
        self._fh = None if self._raw is None else open(self._raw, "wb")

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if self._fh is None:
            self._parts.append(values)
        else:
            self._fh.write(values.tobytes())
        self.n += values.size

    def finish(self) -> None:
        if self._fh is None:
            self.store.arrays[self.name] = (np.concatenate(self._parts) if self._parts
                                            else np.zeros(0, dtype=self.dtype))
            return
        self._fh.close()
        out = self.store.fixed(self.name, (self.n,), self.dtype)
        with open(self._raw, "rb") as src:
            for s in range(0, self.n, _COPY_ELEMS):
                block = np.fromfile(src, dtype=self.dtype, count=min(_COPY_ELEMS, self.n - s))
                out[s:s + block.size] = block
        os.unlink(self._raw)


def _chunks(rows: Iterator[tuple], size: int) -> Iterator[list[tuple]]:
    chunk: list[tuple] = []
    for r in rows:
        chunk.append(r)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _scan_train(db: Path, cap: Optional[int], with_tags: bool) -> tuple[Counter, Counter, dict[str, int]]:
    """Pass 1 over the train split: word counts (``tokens``, every example), tag counts (if ``with_tags``) and the
    number of kept examples per client (``min(count, cap)``)."""
    words: Counter = Counter()
    tags: Counter = Counter()
    per_client: dict[str, int] = {}
    for client, tokens, _, tag_text in iter_examples(db, "train"):
        words.update(_split_words(tokens))
        if with_tags:
            tags.update(_split_tags(tag_text))
        k = per_client.get(client, 0)
        if cap is None or k < cap:
            per_client[client] = k + 1
    return words, tags, per_client


def _kept_train_rows(db: Path, cap: Optional[int]) -> Iterator[tuple[str, str, str, str]]:
    """Pass 2 over the train split: each client's first ``cap`` examples (all if ``None``), in rowid order."""
    seen: dict[str, int] = {}
    for row in iter_examples(db, "train"):
        k = seen.get(row[0], 0)
        if cap is None or k < cap:
            seen[row[0]] = k + 1
            yield row


def _write_nwp(store: _Store, prefix: str, rows: Iterator[tuple], n: int, pos: dict[str, int], vocab: list[str],
               sequence_length: int, vocab_size: int) -> None:
    dtype = np.int32 if vocab_size + 3 < 2**31 else np.int64
    tokens = store.fixed(f"{prefix}_tokens", (n, sequence_length + 1), dtype)
    cid = store.fixed(f"{prefix}_client_id", (n,), np.int32 if len(pos) < 2**31 else np.int64)
    at = 0
    for chunk in _chunks(rows, _CHUNK_ROWS):
        m = len(chunk)
        if at + m > n:
            raise RuntimeError(f"the {prefix} split has more examples than counted ({n}); is the file being written?")
        tokens[at:at + m] = nwp_token_rows([r[1] for r in chunk], vocab, sequence_length, vocab_size)
        cid[at:at + m] = [pos.get(r[0], -1) for r in chunk]
        at += m
    if at != n:
        raise RuntimeError(f"the {prefix} split has {at} examples, {n} were counted; is the file being written?")


def _write_tag(store: _Store, prefix: str, rows: Iterator[tuple], n: int, pos: dict[str, int], vocab: list[str],
               tags: list[str]) -> None:
    cid = store.fixed(f"{prefix}_client_id", (n,), np.int32 if len(pos) < 2**31 else np.int64)
    w_off = store.fixed(f"{prefix}_word_offsets", (n + 1,), np.int64)
    t_off = store.fixed(f"{prefix}_tag_offsets", (n + 1,), np.int64)
    w_off[0] = t_off[0] = 0
    w_idx = store.growable(f"{prefix}_word_indices", np.int32)
    w_val = store.growable(f"{prefix}_word_values", np.float32)
    t_idx = store.growable(f"{prefix}_tag_indices", np.int32)
    at = 0
    for chunk in _chunks(rows, _CHUNK_ROWS):
        m = len(chunk)
        if at + m > n:
            raise RuntimeError(f"the {prefix} split has more examples than counted ({n}); is the file being written?")
        wi, wo, wv = bag_of_words([f"{r[1]} {r[2]}" for r in chunk], vocab)  # TFF: join([tokens, title], ' ')
        ti, to = tag_multi_hot([r[3] for r in chunk], tags)
        w_off[at + 1:at + m + 1] = wo[1:] + w_idx.n
        t_off[at + 1:at + m + 1] = to[1:] + t_idx.n
        w_idx.append(wi)
        w_val.append(wv)
        t_idx.append(ti)
        cid[at:at + m] = [pos.get(r[0], -1) for r in chunk]
        at += m
    if at != n:
        raise RuntimeError(f"the {prefix} split has {at} examples, {n} were counted; is the file being written?")
    for a in (w_idx, w_val, t_idx):
        a.finish()


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
        local_epochs: int = 1,
        local_work: Optional[LocalWork] = None,
        data_order: str = "reshuffle",
        seed: int = 0,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            partitioner=NaturalIdPartitioner("client_id"), clients_per_round=clients_per_round,
            batch_size=batch_size, local_epochs=local_epochs, local_work=local_work, data_order=data_order,
            seed=seed, eval_batch_size=eval_batch_size, num_workers=num_workers, drop_last=drop_last,
        )
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
        :class:`~lightning_fed.datamodules.pip_archive.ArchiveTooLargeError` (and deletes the partial file) past
        :data:`MAX_SQLITE_BYTES`, or once the output passes 64 MiB and :data:`MAX_SQLITE_RATIO` times the compressed
        bytes read so far (a decompression bomb)."""
        db = self.database
        if db.is_file():
            return
        if not self.download or self.sqlite_path is not None:
            raise FileNotFoundError(
                f"Stack Overflow SQLite file {str(db)!r} not found. Get TFF's file from {TFF_SQLITE_URL}, decompress "
                f"it (`xz -d`) to that path, or pass `download=True` (needs internet)."
            )
        db.parent.mkdir(parents=True, exist_ok=True)
        tmp = db.with_name(f".{db.name}.{uuid.uuid4().hex}.tmp")
        try:
            with urllib.request.urlopen(TFF_SQLITE_URL) as resp:
                counted = _CountingReader(resp)
                with lzma.open(counted) as fin, open(tmp, "wb") as fout:
                    copy_bounded(fin, fout, f"the download {TFF_SQLITE_URL}", MAX_SQLITE_BYTES,
                                 max_ratio=MAX_SQLITE_RATIO, compressed_bytes=lambda: counted.count, block=1 << 22)
            os.replace(tmp, db)
        finally:
            if tmp.exists():
                tmp.unlink()

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
        except Exception:  # truncated, foreign or older cache: rebuild
            return None
        self._set_meta(meta)
        return train, test

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
        val = test
        if self.num_eval_samples is not None and self.num_eval_samples < len(test):
            # Only the chosen rows are read: `test` is memory-mapped (nothing of the split is materialised).
            rng = np.random.default_rng([self.seed, 0x50E7A1])
            val = test.subset(np.sort(rng.choice(len(test), size=self.num_eval_samples, replace=False)))
        return train, val, test

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
        clients_per_round, batch_size, local_epochs, local_work, data_order, seed, eval_batch_size, num_workers,
        drop_last: see :class:`FederatedDataModule`.

    Attributes:
        vocab: the V words, id ``i + 1`` = ``vocab[i]`` (after :meth:`setup`).

    Raises:
        ValueError: a non-integer or too small ``vocab_size``/``sequence_length``/``max_examples_per_client``/
            ``num_eval_samples``, and the base class' checks.
    """

    _task = "nwp"

    def __init__(self, data_dir: str = "data", sqlite_path: Optional[str] = None, vocab_size: int = 10000,
                 sequence_length: int = 20, max_examples_per_client: Optional[int] = 1000,
                 num_eval_samples: Optional[int] = 10000, download: bool = True, cache: bool = True,
                 clients_per_round: int = 50, batch_size: int = 16, local_epochs: int = 1,
                 local_work: Optional[LocalWork] = None, data_order: str = "reshuffle", seed: int = 0,
                 eval_batch_size: int = 256, num_workers: int = 0, drop_last: bool = False) -> None:
        super().__init__(data_dir, sqlite_path, vocab_size, max_examples_per_client, num_eval_samples, download,
                         cache, clients_per_round, batch_size, local_epochs, local_work, data_order, seed,
                         eval_batch_size, num_workers, drop_last)
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
        num_tags: number of tags K (default 500), >= 1.
        Others: see :class:`StackOverflowNWPDataModule`.

    Attributes:
        vocab: the V words (column ``i`` of ``x`` = ``vocab[i]``); tags: the K tags (after :meth:`setup`).
    """

    _task = "tag"

    def __init__(self, data_dir: str = "data", sqlite_path: Optional[str] = None, vocab_size: int = 10000,
                 num_tags: int = 500, max_examples_per_client: Optional[int] = 1000,
                 num_eval_samples: Optional[int] = 10000, download: bool = True, cache: bool = True,
                 clients_per_round: int = 10, batch_size: int = 100, local_epochs: int = 1,
                 local_work: Optional[LocalWork] = None, data_order: str = "reshuffle", seed: int = 0,
                 eval_batch_size: int = 256, num_workers: int = 0, drop_last: bool = False) -> None:
        super().__init__(data_dir, sqlite_path, vocab_size, max_examples_per_client, num_eval_samples, download,
                         cache, clients_per_round, batch_size, local_epochs, local_work, data_order, seed,
                         eval_batch_size, num_workers, drop_last)
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
