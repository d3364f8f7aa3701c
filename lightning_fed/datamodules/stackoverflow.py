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

Processed datasets are cached as ``<data_dir>/stackoverflow/<task>-<key>.pt`` (key = the SQLite file's size and
mtime plus the preprocessing arguments); decoding the full 342,477-client file in pure Python takes a long time
once, every later load reads the cache.
"""

from __future__ import annotations

import hashlib
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

__all__ = [
    "TFF_SQLITE_URL",
    "SPLITS",
    "PREPROCESSING_VERSION",
    "parse_example",
    "encode_example",
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
#: The values of the ``split_name`` column.
SPLITS = ("train", "heldout", "test")
#: Bumped whenever preprocessing changes (part of the cache key).
PREPROCESSING_VERSION = 1


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


def read_examples(path: str | os.PathLike, split: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """All examples of ``split`` in TFF's SQLite file, in ``rowid`` order.

    Returns:
        ``(client_ids, tokens, titles, tags)``: four parallel lists of strings.

    Raises:
        ValueError: ``split`` not in :data:`SPLITS`; FileNotFoundError: no file.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}, got {split!r}.")
    if not Path(path).is_file():
        raise FileNotFoundError(f"Stack Overflow SQLite file {str(path)!r} does not exist.")
    clients: list[str] = []
    tokens: list[str] = []
    titles: list[str] = []
    tags: list[str] = []
    con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT client_id, serialized_example_proto FROM examples WHERE split_name = ? ORDER BY rowid", (split,)
        )
        for client_id, blob in rows:
            f = parse_example(blob)
            clients.append(str(client_id))
            tokens.append(_text(f, "tokens"))
            titles.append(_text(f, "title"))
            tags.append(_text(f, "tags"))
    finally:
        con.close()
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
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [w for w, _ in ranked[:k]]


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


def _first_n_per_client(client_ids: Sequence[str], n: Optional[int]) -> np.ndarray:
    """Row indices keeping each client's first ``n`` rows (all rows when ``n`` is None), in order."""
    if n is None:
        return np.arange(len(client_ids), dtype=np.int64)
    seen: Counter = Counter()
    keep = []
    for i, c in enumerate(client_ids):
        if seen[c] < n:
            seen[c] += 1
            keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def _client_index(client_ids: Sequence[str], names: Optional[Sequence[str]] = None) -> tuple[np.ndarray, list[str]]:
    names = sorted(set(client_ids)) if names is None else list(names)
    pos = {c: i for i, c in enumerate(names)}
    return np.asarray([pos.get(c, -1) for c in client_ids], dtype=np.int64), names


# ---------------------------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------------------------
class StackOverflowNWPSequences(Dataset):
    """Next-word-prediction rows with their client: items ``(input [T], target [T])`` int64, T = 20.

    Args:
        tokens: ``[N, T + 1]`` rows from :func:`nwp_token_rows`.
        client_id: ``[N]`` index into ``client_names`` (-1 for examples of clients outside the train split, e.g.
            test data), read by ``NaturalIdPartitioner("client_id")``.
        client_names: TFF client id strings.
    """

    def __init__(self, tokens: Any, client_id: Any, client_names: Sequence[str]) -> None:
        tokens = torch.as_tensor(np.asarray(tokens)) if not isinstance(tokens, torch.Tensor) else tokens
        if tokens.ndim != 2 or tokens.shape[1] < 2:
            raise ValueError(f"`tokens` must have shape [N, T + 1] with T >= 1, got {tuple(tokens.shape)}.")
        client_id = np.asarray(client_id, dtype=np.int64)
        if client_id.shape != (tokens.shape[0],):
            raise ValueError(f"`client_id` must have shape [{tokens.shape[0]}], got {client_id.shape}.")
        self.tokens = tokens.long().contiguous()
        self.client_id = client_id
        self.client_names = list(client_names)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input [B, T], target [B, T])`` of rows ``index`` by one slice."""
        rows = self.tokens[index]
        return rows[:, :-1], rows[:, 1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[i]
        return row[:-1], row[1:]

    def subset(self, rows: np.ndarray) -> "StackOverflowNWPSequences":
        """The rows ``rows`` (int array) as a new dataset."""
        rows = np.asarray(rows, dtype=np.int64)
        return StackOverflowNWPSequences(self.tokens[torch.from_numpy(rows)], self.client_id[rows], self.client_names)

    def to_state(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "client_id": torch.from_numpy(self.client_id), "client_names": self.client_names}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "StackOverflowNWPSequences":
        return cls(state["tokens"], state["client_id"].numpy(), state["client_names"])


class StackOverflowTagExamples(Dataset):
    """Tag-prediction examples stored sparsely: items ``(bag float32 [V], tags float32 [K])``.

    Dense rows are built per batch (the full train split densified would need ~N x 10,000 floats).

    Args:
        word_indices, word_offsets, word_values: CSR bag of words from :func:`bag_of_words`.
        tag_indices, tag_offsets: CSR multi-hot tags from :func:`tag_multi_hot`.
        client_id: ``[N]`` index into ``client_names`` (-1 outside the train clients).
        client_names: TFF client id strings.
        vocab_size: V (columns of the bag); num_tags: K (columns of the targets).
    """

    def __init__(self, word_indices, word_offsets, word_values, tag_indices, tag_offsets, client_id,
                 client_names: Sequence[str], vocab_size: int, num_tags: int) -> None:
        self.word_indices = torch.as_tensor(np.asarray(word_indices, dtype=np.int64))
        self.word_offsets = torch.as_tensor(np.asarray(word_offsets, dtype=np.int64))
        self.word_values = torch.as_tensor(np.asarray(word_values, dtype=np.float32))
        self.tag_indices = torch.as_tensor(np.asarray(tag_indices, dtype=np.int64))
        self.tag_offsets = torch.as_tensor(np.asarray(tag_offsets, dtype=np.int64))
        self.client_id = np.asarray(client_id, dtype=np.int64)
        self.client_names = list(client_names)
        self.vocab_size = int(vocab_size)
        self.num_tags = int(num_tags)
        n = self.client_id.shape[0]
        if self.word_offsets.shape != (n + 1,) or self.tag_offsets.shape != (n + 1,):
            raise ValueError(f"`word_offsets`/`tag_offsets` must have shape [{n + 1}] (N + 1 with N = len(client_id)).")

    def __len__(self) -> int:
        return int(self.client_id.shape[0])

    @staticmethod
    def _gather(offsets: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts, ends = offsets[index], offsets[index + 1]
        lengths = ends - starts
        row = torch.repeat_interleave(torch.arange(index.numel()), lengths)
        pos = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        return row, starts[row] + pos

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x float32 [B, V], y float32 [B, K])`` of rows ``index``."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        x = torch.zeros(index.numel(), self.vocab_size)
        row, at = self._gather(self.word_offsets, index)
        x.index_put_((row, self.word_indices[at]), self.word_values[at], accumulate=True)
        y = torch.zeros(index.numel(), self.num_tags)
        row, at = self._gather(self.tag_offsets, index)
        y[row, self.tag_indices[at]] = 1.0
        return x, y

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.get_batch(torch.tensor([int(i)]))
        return x[0], y[0]

    def subset(self, rows: np.ndarray) -> "StackOverflowTagExamples":
        """The rows ``rows`` (int array) as a new dataset."""
        rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        w_row, w_at = self._gather(self.word_offsets, rows)
        t_row, t_at = self._gather(self.tag_offsets, rows)
        w_len = self.word_offsets[rows + 1] - self.word_offsets[rows]
        t_len = self.tag_offsets[rows + 1] - self.tag_offsets[rows]
        zero = torch.zeros(1, dtype=torch.long)
        return StackOverflowTagExamples(
            self.word_indices[w_at], torch.cat([zero, torch.cumsum(w_len, 0)]), self.word_values[w_at],
            self.tag_indices[t_at], torch.cat([zero, torch.cumsum(t_len, 0)]), self.client_id[rows.numpy()],
            self.client_names, self.vocab_size, self.num_tags,
        )

    def to_state(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("word_indices", "word_offsets", "word_values", "tag_indices",
                                              "tag_offsets", "client_names", "vocab_size", "num_tags")} | {
            "client_id": torch.from_numpy(self.client_id)}

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> "StackOverflowTagExamples":
        return cls(s["word_indices"].numpy(), s["word_offsets"].numpy(), s["word_values"].numpy(),
                   s["tag_indices"].numpy(), s["tag_offsets"].numpy(), s["client_id"].numpy(), s["client_names"],
                   s["vocab_size"], s["num_tags"])


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
        ``download=True`` (about 1.5 GB compressed), else raise a clear :class:`FileNotFoundError`."""
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
            with urllib.request.urlopen(TFF_SQLITE_URL) as resp, lzma.open(resp) as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, length=1 << 22)
            os.replace(tmp, db)
        finally:
            if tmp.exists():
                tmp.unlink()

    def _cache_file(self, extra: str) -> Path:
        st = self.database.stat()
        key = (f"{self.database.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.vocab_size}|"
               f"{self.max_examples_per_client}|{extra}|v{PREPROCESSING_VERSION}")
        return self.cache_dir / f"{self._task}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"

    def _build(self) -> tuple[Any, Any, list[str]]:
        raise NotImplementedError

    def load_datasets(self) -> tuple[Any, Any, Any]:
        """``(train, val, test)``: train = the train split (capped per client), val = ``num_eval_samples``
        seeded random test examples (all of them if ``None`` or fewer), test = the whole test split."""
        if not self.database.is_file():
            self.prepare_data()
        cls = StackOverflowNWPSequences if self._task == "nwp" else StackOverflowTagExamples
        cache = self._cache_file(self._cache_extra()) if self.cache else None
        train = test = None
        if cache is not None and cache.is_file():
            try:
                state = torch.load(cache, weights_only=True)
                train, test = cls.from_state(state["train"]), cls.from_state(state["test"])
                self.vocab = list(state["vocab"])
                self._set_extra(state)
            except Exception:  # truncated or foreign cache: rebuild
                train = test = None
        if train is None:
            train, test, self.vocab = self._build()
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(f".{cache.name}.{uuid.uuid4().hex}.tmp")
                torch.save({"train": train.to_state(), "test": test.to_state(), "vocab": self.vocab,
                            **self._extra_state()}, tmp)
                os.replace(tmp, cache)
        val = test
        if self.num_eval_samples is not None and self.num_eval_samples < len(test):
            rng = np.random.default_rng([self.seed, 0x50E7A1])
            val = test.subset(np.sort(rng.choice(len(test), size=self.num_eval_samples, replace=False)))
        return train, val, test

    def _cache_extra(self) -> str:
        return ""

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _set_extra(self, state: dict[str, Any]) -> None:
        pass


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
        cache: cache the processed datasets as ``.pt`` files (default ``True``).
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

    def _build(self) -> tuple[StackOverflowNWPSequences, StackOverflowNWPSequences, list[str]]:
        clients, tokens, _, _ = read_examples(self.database, "train")
        vocab = top_k_vocab((_split_words(t) for t in tokens), self.vocab_size)
        keep = _first_n_per_client(clients, self.max_examples_per_client)
        cid, names = _client_index([clients[i] for i in keep])
        train = StackOverflowNWPSequences(
            nwp_token_rows([tokens[i] for i in keep], vocab, self.sequence_length, self.vocab_size), cid, names)
        t_clients, t_tokens, _, _ = read_examples(self.database, "test")
        test = StackOverflowNWPSequences(nwp_token_rows(t_tokens, vocab, self.sequence_length, self.vocab_size),
                                         _client_index(t_clients, names)[0], names)
        return train, test, vocab


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

    def _extra_state(self) -> dict[str, Any]:
        return {"tags": self.tags}

    def _set_extra(self, state: dict[str, Any]) -> None:
        self.tags = list(state["tags"])

    def _make(self, clients, tokens, titles, tag_texts, vocab, tags, names=None) -> StackOverflowTagExamples:
        texts = [f"{t} {ti}" for t, ti in zip(tokens, titles)]  # TFF: strings.join([tokens, title], ' ')
        w_idx, w_off, w_val = bag_of_words(texts, vocab)
        t_idx, t_off = tag_multi_hot(tag_texts, tags)
        cid, names = _client_index(clients, names)
        return StackOverflowTagExamples(w_idx, w_off, w_val, t_idx, t_off, cid, names, self.vocab_size,
                                        self.num_tags)

    def _build(self) -> tuple[StackOverflowTagExamples, StackOverflowTagExamples, list[str]]:
        clients, tokens, titles, tag_texts = read_examples(self.database, "train")
        vocab = top_k_vocab((_split_words(t) for t in tokens), self.vocab_size)
        self.tags = top_k_vocab((_split_tags(t) for t in tag_texts), self.num_tags)
        keep = _first_n_per_client(clients, self.max_examples_per_client)
        pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
        train = self._make(pick(clients), pick(tokens), pick(titles), pick(tag_texts), vocab, self.tags)
        test = self._make(*read_examples(self.database, "test"), vocab, self.tags, train.client_names)
        return train, test, vocab
