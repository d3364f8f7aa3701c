"""The tokenised corpus, the dataset, the temporal per-client split and corpus statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fed.checks import check_fraction as _check_fraction
from lightning_fed.checks import check_int as _check_int
from lightning_fed.datamodules.tasks.shakespeare.vocabulary import (
    CHUNK_LENGTH,
    OOV_ID,
    PAD_ID,
    SPECIAL_IDS,
    VOCAB_SIZE,
    decode,
    snippets_to_chunks,
)


# ---------------------------------------------------------------------------------------------------------------
# Corpus, dataset, split
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class ShakespeareCorpus:
    """All snippets of a source, tokenised, before the train/test split and client filtering.

    Attributes:
        client_names: ``"<play>/<ROLE>"`` (or LEAF user) per client, in order of first appearance.
        snippet_client: int64 ``[S]`` client of each snippet; snippets sorted by client, each client's in text
            (temporal) order.
        snippet_chars: int64 ``[S]`` characters per snippet.
        snippet_split: int8 ``[S]``: -1 = decided by the temporal split, 0 = fixed train, 1 = fixed test (LEAF).
        tokens: uint8 ``[N, 81]`` chunks; chunk_snippet: int64 ``[N]`` snippet of each chunk.

    Example: two roles; the 90-character snippet becomes BOS + 90 + EOS = 92 tokens, padded to 2 chunks of 81::

        >>> corpus = build_corpus([("Hamlet/HAMLET", "To be, or not to be"), ("Hamlet/OPHELIA", "O, what a noble mind"),
        ...                        ("Hamlet/HAMLET", "x" * 90)])
        >>> corpus.client_names, corpus.snippet_client, corpus.snippet_chars
        (['Hamlet/HAMLET', 'Hamlet/OPHELIA'], array([0, 0, 1]), array([19, 90, 20]))
        >>> corpus.tokens.shape, corpus.chunk_snippet
        ((4, 81), array([0, 1, 1, 2]))
    """

    client_names: list[str]
    snippet_client: np.ndarray
    snippet_chars: np.ndarray
    snippet_split: np.ndarray
    tokens: np.ndarray
    chunk_snippet: np.ndarray

    def to_state(self) -> dict[str, Any]:
        return {
            "client_names": list(self.client_names),
            "snippet_client": torch.from_numpy(self.snippet_client),
            "snippet_chars": torch.from_numpy(self.snippet_chars),
            "snippet_split": torch.from_numpy(self.snippet_split),
            "tokens": torch.from_numpy(self.tokens),
            "chunk_snippet": torch.from_numpy(self.chunk_snippet),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "ShakespeareCorpus":
        return cls(
            client_names=list(state["client_names"]),
            snippet_client=state["snippet_client"].numpy(),
            snippet_chars=state["snippet_chars"].numpy(),
            snippet_split=state["snippet_split"].numpy(),
            tokens=state["tokens"].numpy(),
            chunk_snippet=state["chunk_snippet"].numpy(),
        )


def build_corpus(
    speeches: Sequence[tuple[str, str]], fixed_test: Optional[Sequence[tuple[str, str]]] = None
) -> ShakespeareCorpus:
    """Tokenise ``(client_name, snippet)`` pairs (in temporal order) into a :class:`ShakespeareCorpus`.

    With ``fixed_test`` (LEAF's pre-split data), ``speeches`` are fixed train snippets and ``fixed_test`` fixed
    test snippets; otherwise the split is left to :func:`split_corpus`.
    """
    items = [(c, s, -1 if fixed_test is None else 0) for c, s in speeches]
    if fixed_test is not None:
        items += [(c, s, 1) for c, s in fixed_test]
    index: dict[str, int] = {}
    for c, _, _ in items:
        index.setdefault(c, len(index))
    client = np.fromiter((index[c] for c, _, _ in items), dtype=np.int64, count=len(items))
    split = np.fromiter((f for _, _, f in items), dtype=np.int8, count=len(items))
    order = np.lexsort((split, client))  # by client, train before test, stable text order within
    texts = [items[i][1] for i in order]
    tokens, chunk_snippet = snippets_to_chunks(texts)
    return ShakespeareCorpus(
        client_names=list(index),
        snippet_client=client[order],
        snippet_chars=np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)),
        snippet_split=split[order],
        tokens=tokens,
        chunk_snippet=chunk_snippet,
    )


class ShakespeareSequences(Dataset):
    """Fixed-length character sequences with their client: ``(input [80], target [80])`` int64 pairs.

    Everything is held as tensors/arrays so that client subsets are plain fancy indexing.

    Args:
        tokens: ``[N, 81]`` token rows (any integer dtype; stored as ``torch.long``).
        client_id: ``[N]`` int index into ``client_names`` (read by ``NaturalIdPartitioner("client_id")``).
        client_names: ``"<play>/<ROLE>"`` names.

    Attributes:
        tokens: LongTensor ``[N, 81]``; client_id: int64 ndarray ``[N]``; client_names: list[str].

    Raises:
        ValueError: ``tokens`` not ``[N, 81]``, ``client_id`` not ``[N]`` or not indexing ``client_names``.

    Example: input = row[:80], target = row[1:] (BOS = 88, then "To b")::

        >>> corpus = build_corpus([("Hamlet/HAMLET", "To be, or not to be"), ("Hamlet/OPHELIA", "O, what a noble mind")])
        >>> seqs = ShakespeareSequences(corpus.tokens, corpus.snippet_client[corpus.chunk_snippet], corpus.client_names)
        >>> x, y = seqs[0]
        >>> len(seqs), x.shape, x[:5].tolist(), y[:4].tolist()
        (2, torch.Size([80]), [88, 12, 24, 14, 42], [12, 24, 14, 42])
    """

    def __init__(self, tokens: Any, client_id: Any, client_names: Sequence[str]):
        tokens = torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, torch.Tensor) else tokens)
        if tokens.ndim != 2 or tokens.shape[1] != CHUNK_LENGTH:
            raise ValueError(f"`tokens` must have shape [N, {CHUNK_LENGTH}], got {tuple(tokens.shape)}.")
        client_id = np.asarray(client_id.numpy() if isinstance(client_id, torch.Tensor) else client_id)
        client_id = client_id.astype(np.int64, copy=False)
        if client_id.shape != (tokens.shape[0],):
            raise ValueError(f"`client_id` must have shape [{tokens.shape[0]}], got {client_id.shape}.")
        names = list(client_names)
        if client_id.size and (client_id.min() < 0 or client_id.max() >= len(names)):
            raise ValueError(f"`client_id` values must index `client_names` (0..{len(names) - 1}).")
        self.tokens = tokens.long().contiguous()
        self.client_id = client_id
        self.client_names = names

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def get_batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the samples ``index`` (LongTensor ``[B]``), each ``[B, 80]`` int64: the batch a
        ``DataLoader`` would collate, by one slice."""
        rows = self.tokens[index]
        return rows[:, :-1], rows[:, 1:]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[i]
        return row[:-1], row[1:]

    @property
    def num_clients(self) -> int:
        """Number of names in ``client_names`` (clients with samples here may be fewer)."""
        return len(self.client_names)

    @property
    def inputs(self) -> torch.Tensor:
        """LongTensor ``[N, 80]`` (a view)."""
        return self.tokens[:, :-1]

    @property
    def target_tokens(self) -> torch.Tensor:
        """LongTensor ``[N, 80]`` (a view)."""
        return self.tokens[:, 1:]

    def client_num_tokens(self) -> np.ndarray:
        """Non-pad target tokens per client, int64 ``[num_clients]`` (TFF weights clients by this count)."""
        counts = (self.tokens[:, 1:] != PAD_ID).sum(dim=1).numpy()
        return np.bincount(self.client_id, weights=counts, minlength=self.num_clients).astype(np.int64)

    def subset(self, indices: Any) -> "ShakespeareSequences":
        """A new dataset of the rows ``indices`` (same ``client_names``)."""
        idx = np.asarray(indices, dtype=np.int64)
        return ShakespeareSequences(self.tokens[torch.from_numpy(idx)], self.client_id[idx], self.client_names)


def temporal_split_sizes(counts: np.ndarray | Sequence[int], test_fraction: float) -> np.ndarray:
    """Number of train snippets per client for a temporal split: ``floor((1 - test_fraction) * n)`` clipped to
    ``[1, n - 1]`` when ``n >= 2`` (so such a client has >= 1 train and >= 1 test snippet), ``n`` when ``n <= 1``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n_train = np.floor(counts * (1.0 - float(test_fraction)) + 1e-9).astype(np.int64)
    n_train = np.clip(n_train, 1, np.maximum(counts - 1, 1))
    return np.where(counts >= 2, n_train, counts)


def split_corpus(
    corpus: ShakespeareCorpus, test_fraction: float = 0.2, min_snippets: int = 2
) -> tuple[ShakespeareSequences, ShakespeareSequences]:
    """Temporal per-client train/test split and client filtering (see module doc), vectorised.

    Clients with fewer than ``min_snippets`` snippets (not applied to fixed LEAF splits) or with no train chunk
    are dropped; the others are renumbered ``0..K-1`` in corpus order and shared by both returned datasets.

    Returns:
        ``(train, test)`` :class:`ShakespeareSequences` with the same ``client_names``.
    """
    test_fraction = _check_fraction("test_fraction", test_fraction)
    min_snippets = _check_int("min_snippets", min_snippets, 1)
    num_clients = len(corpus.client_names)
    sc = corpus.snippet_client
    counts = np.bincount(sc, minlength=num_clients)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rank = np.arange(sc.size, dtype=np.int64) - first[sc]
    n_train = temporal_split_sizes(counts, test_fraction)
    is_test = np.where(corpus.snippet_split >= 0, corpus.snippet_split == 1, rank >= n_train[sc])

    chunk_client = sc[corpus.chunk_snippet]
    chunk_test = is_test[corpus.chunk_snippet]
    train_chunks = np.bincount(chunk_client[~chunk_test], minlength=num_clients)
    fixed = np.zeros(num_clients, dtype=bool)
    fixed[sc[corpus.snippet_split >= 0]] = True
    keep = (train_chunks > 0) & ((counts >= min_snippets) | fixed)
    new_id = np.full(num_clients, -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()), dtype=np.int64)
    names = [n for n, k in zip(corpus.client_names, keep) if k]
    kept_chunk = keep[chunk_client]
    tokens = torch.from_numpy(corpus.tokens)

    def make(mask: np.ndarray) -> ShakespeareSequences:
        rows = np.flatnonzero(mask)
        return ShakespeareSequences(tokens[torch.from_numpy(rows)], new_id[chunk_client[rows]], names)

    return make(kept_chunk & ~chunk_test), make(kept_chunk & chunk_test)


def most_frequent_baseline(
    train: ShakespeareSequences, test: ShakespeareSequences, masked_tokens: Sequence[int] = (PAD_ID,)
) -> tuple[int, float]:
    """Accuracy on ``test`` of always predicting the most frequent *train* target token.

    Counted over the target tokens not in ``masked_tokens`` (default: pad only, as TFF's
    ``MaskedCategoricalAccuracy(masked_tokens=[pad])`` and :class:`~lightning_fed.models.char_lstm.
    ShakespeareLSTM`'s default accuracy). Returns ``(token_id, accuracy)``.
    """
    masked = torch.tensor(list(masked_tokens), dtype=torch.long)
    tr = train.tokens[:, 1:].reshape(-1)
    tr = tr[~torch.isin(tr, masked)]
    mode = int(torch.bincount(tr, minlength=VOCAB_SIZE).argmax())
    te = test.tokens[:, 1:].reshape(-1)
    te = te[~torch.isin(te, masked)]
    return mode, float((te == mode).double().mean()) if te.numel() else float("nan")


def corpus_statistics(train: ShakespeareSequences, test: ShakespeareSequences) -> dict[str, Any]:
    """Clients, chunks, characters (ids 1..87, i.e. characters incl. OOV) and baseline accuracies."""
    chars_per_client = np.zeros(train.num_clients, dtype=np.int64)
    for ds in (train, test):
        # rows are non-overlapping pieces of the padded snippets: every character is counted exactly once
        per_row = ((ds.tokens >= 1) & (ds.tokens <= OOV_ID)).sum(dim=1).numpy()
        chars_per_client += np.bincount(ds.client_id, weights=per_row, minlength=ds.num_clients).astype(np.int64)
    mode, acc = most_frequent_baseline(train, test)
    mode_s, acc_s = most_frequent_baseline(train, test, SPECIAL_IDS)
    return {
        "clients": train.num_clients,
        "clients_with_test": int(np.unique(test.client_id).size),
        "train_chunks": len(train),
        "test_chunks": len(test),
        "total_chars": int(chars_per_client.sum()),
        "median_chars_per_client": float(np.median(chars_per_client)) if chars_per_client.size else 0.0,
        "max_chars_per_client": int(chars_per_client.max()) if chars_per_client.size else 0,
        "train_target_tokens": int((train.tokens[:, 1:] != PAD_ID).sum()),
        "test_target_tokens": int((test.tokens[:, 1:] != PAD_ID).sum()),
        "baseline_token": decode([mode], show_special=True),
        "baseline_acc": acc,
        "baseline_token_no_special": decode([mode_s], show_special=True),
        "baseline_acc_no_special": acc_s,
    }
