"""Vocabularies and TFF's encodings: :func:`top_k_vocab`, :func:`special_ids`, :func:`nwp_token_rows` (SO NWP),
:func:`bag_of_words` and :func:`tag_multi_hot` (SO LR).
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Iterable, Optional, Sequence

import numpy as np


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
