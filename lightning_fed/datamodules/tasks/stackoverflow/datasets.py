"""The Stack Overflow datasets, in memory or memory-mapped from the cache: :class:`StackOverflowNWPSequences`,
:class:`StackOverflowTagExamples`.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset


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

    Raises:
        ValueError: ``tokens`` not ``[N, T + 1]`` with T ≥ 1, or ``client_id`` not ``[N]``.

    Example: V = 4 words (ids 1..4; OOV 5, BOS 6, EOS 7), T = 4::

        >>> from lightning_fed.datamodules.tasks.stackoverflow.vocabulary import nwp_token_rows
        >>> rows = nwp_token_rows(["how to sort", "python"], ["how", "to", "python", "sort"], sequence_length=4)
        >>> rows
        array([[6, 1, 2, 4, 7],
               [6, 3, 7, 0, 0]])
        >>> seqs = StackOverflowNWPSequences(rows, client_id=[0, 1], client_names=["user0", "user1"])
        >>> seqs[0]  # (input, target) = (row[:-1], row[1:])
        (tensor([6, 1, 2, 4]), tensor([1, 2, 4, 7]))
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

    Raises:
        ValueError: offsets not ``[N + 1]``, or ``word_values`` not shaped like ``word_indices``.

    Example: "how to sort sort" over the vocabulary (how, to, python, sort) is (1/4, 1/4, 0, 2/4)::

        >>> from lightning_fed.datamodules.tasks.stackoverflow.vocabulary import bag_of_words, tag_multi_hot
        >>> words = bag_of_words(["how to sort sort", "java"], ["how", "to", "python", "sort"])
        >>> tags = tag_multi_hot(["python|sorting", "java"], ["python", "java"])
        >>> examples = StackOverflowTagExamples(*words, *tags, client_id=[0, 1], client_names=["user0", "user1"],
        ...                                     vocab_size=4, num_tags=2)
        >>> examples[0]
        (tensor([0.2500, 0.2500, 0.0000, 0.5000]), tensor([1., 0.]))
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
