"""The streaming build (bounded memory) into ``.npy`` files of the cache folder, or into memory.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from lightning_fed.datamodules.tasks.stackoverflow.sqlite import iter_examples
from lightning_fed.datamodules.tasks.stackoverflow.vocabulary import (
    _split_tags,
    _split_words,
    bag_of_words,
    nwp_token_rows,
    tag_multi_hot,
)


#: Bumped whenever preprocessing or the cache layout changes (part of the cache key). 3: the test split's examples
#: grouped per train client (``test_client_order``, ``test_client_offsets``).
PREPROCESSING_VERSION = 3


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


def _write_client_groups(store: _Store, prefix: str, num_clients: int) -> None:
    """Group the examples of ``prefix`` by client (CSR): ``{prefix}_client_order`` (int64, the rows whose
    ``{prefix}_client_id`` is a client, grouped by client in ascending id, each client's rows ascending = rowid
    order) and ``{prefix}_client_offsets`` (int64 ``[num_clients + 1]``): client c's rows are
    ``order[offsets[c]:offsets[c + 1]]``; rows with id -1 (users outside the train split) are left out.

    A counting sort over ``_CHUNK_ROWS``-row chunks of the client ids (read back from the store): memory = the
    order array (8 bytes per grouped row) + one int64 per client + one chunk."""
    written = store.arrays[f"{prefix}_client_id"]
    cid = np.load(written.path, mmap_mode="r") if isinstance(written, _NpyFile) else written
    n = int(cid.shape[0])
    counts = np.zeros(num_clients, dtype=np.int64)
    for s in range(0, n, _CHUNK_ROWS):
        c = np.asarray(cid[s:s + _CHUNK_ROWS])
        counts += np.bincount(c[c >= 0], minlength=num_clients)
    offsets = np.zeros(num_clients + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    order = np.empty(int(offsets[-1]), dtype=np.int64)
    fill = offsets[:-1].copy()
    for s in range(0, n, _CHUNK_ROWS):
        c = np.asarray(cid[s:s + _CHUNK_ROWS])
        rows = np.flatnonzero(c >= 0)
        if rows.size == 0:
            continue
        cv = c[rows].astype(np.int64)
        by = np.argsort(cv, kind="stable")
        cs = cv[by]
        starts = np.flatnonzero(np.concatenate(([True], cs[1:] != cs[:-1])))
        rank = np.arange(cs.size) - np.repeat(starts, np.diff(np.append(starts, cs.size)))
        order[fill[cs] + rank] = s + rows[by]
        fill += np.bincount(cv, minlength=num_clients)
    out_order = store.fixed(f"{prefix}_client_order", (order.size,), np.int64)
    for s in range(0, order.size, _COPY_ELEMS):
        out_order[s:s + _COPY_ELEMS] = order[s:s + _COPY_ELEMS]
    out_offsets = store.fixed(f"{prefix}_client_offsets", (num_clients + 1,), np.int64)
    out_offsets[0:num_clients + 1] = offsets
