"""Shakespeare vocabulary and TFF's encoding: ids, :func:`normalize_text`, :func:`encode`, :func:`decode`,
:func:`snippets_to_chunks` (TFF ``tensorflow_federated/python/research/optimization/shakespeare/dataset.py``).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np
import torch


# ---------------------------------------------------------------------------------------------------------------
# Vocabulary (TFF: tensorflow_federated/python/research/optimization/shakespeare/dataset.py, CHAR_VOCAB and
# get_special_tokens()).
# ---------------------------------------------------------------------------------------------------------------
#: TFF's 86-character Shakespeare vocabulary, in TFF's order (character ``CHAR_VOCAB[i]`` has id ``i + 1``).
CHAR_VOCAB: list[str] = list(
    "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
)
#: Padding id (also the ``ignore_index`` of the loss).
PAD_ID = 0
#: Out-of-vocabulary id (``len(CHAR_VOCAB) + 1``).
OOV_ID = len(CHAR_VOCAB) + 1
#: Beginning-of-snippet id.
BOS_ID = len(CHAR_VOCAB) + 2
#: End-of-snippet id.
EOS_ID = len(CHAR_VOCAB) + 3
#: Number of token ids (pad + 86 characters + OOV + BOS + EOS = 90).
VOCAB_SIZE = len(CHAR_VOCAB) + 4
#: Model input / target length (McMahan et al. 2017).
SEQUENCE_LENGTH = 80
#: Stored chunk length: input = chunk[:-1], target = chunk[1:].
CHUNK_LENGTH = SEQUENCE_LENGTH + 1
#: The four special ids (pad, OOV, BOS, EOS).
SPECIAL_IDS = (PAD_ID, OOV_ID, BOS_ID, EOS_ID)

assert len(CHAR_VOCAB) == 86 and len(set(CHAR_VOCAB)) == 86

_LOOKUP = np.full(128, OOV_ID, dtype=np.int64)  # code point (< 128) -> id; everything else is OOV
for _i, _c in enumerate(CHAR_VOCAB):
    _LOOKUP[ord(_c)] = _i + 1
_ID_TO_CHAR = np.array(["<pad>"] + CHAR_VOCAB + ["<oov>", "<bos>", "<eos>"], dtype=object)


# ---------------------------------------------------------------------------------------------------------------
# Encoding and chunking
# ---------------------------------------------------------------------------------------------------------------
_NORMALIZE = str.maketrans(
    {
        "\u2014": "--",  # em dash (the corpus writes dashes as "--" elsewhere)
        "\u2013": "-",  # en dash
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u00a0": " ",
        "\u00e6": "ae",
        "\u00c6": "AE",
        "\u0153": "oe",
        "\u00e9": "e",
        "\u00e8": "e",
        "\u00ea": "e",
        "\u00eb": "e",
    }
)
_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Map the typographic characters the vocabulary lacks to their ASCII forms and collapse whitespace.

    ``—`` -> ``--``, ``–`` -> ``-``, curly quotes -> straight, a few ligatures/accents -> ASCII letters; runs of
    whitespace (including line breaks) -> one space; leading/trailing whitespace stripped.
    """
    return _WS.sub(" ", text.translate(_NORMALIZE)).strip()


def encode(text: str) -> np.ndarray:
    """Token ids of ``text``, one per Unicode code point, int64 ``[len(text)]`` (no BOS/EOS added).

    Characters of :data:`CHAR_VOCAB` map to ``1..86``, anything else to :data:`OOV_ID` (TFF's
    ``StaticVocabularyTable`` with one OOV bucket). Vectorised: ~100 M characters/s.
    """
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    out = np.full(cps.shape, OOV_ID, dtype=np.int64)
    ascii_mask = cps < 128
    out[ascii_mask] = _LOOKUP[cps[ascii_mask]]
    return out


def decode(ids: Iterable[int], show_special: bool = False) -> str:
    """Inverse of :func:`encode` for inspection: characters for ids 1..86; special ids as ``<pad>``/``<oov>``/
    ``<bos>``/``<eos>`` when ``show_special`` else dropped (OOV as ``?`` is ambiguous, so it is also dropped)."""
    arr = np.asarray(list(ids) if not isinstance(ids, (np.ndarray, torch.Tensor)) else ids).reshape(-1)
    arr = arr.numpy() if isinstance(arr, torch.Tensor) else arr
    if not show_special:
        arr = arr[(arr >= 1) & (arr <= len(CHAR_VOCAB))]
    return "".join(_ID_TO_CHAR[arr].tolist())


def snippets_to_chunks(snippets: Sequence[str], drop_empty: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """TFF's tokenisation of a list of snippets, vectorised.

    Each snippet becomes ``[BOS] + encode(snippet) + [EOS]``, padded with :data:`PAD_ID` to the next multiple of
    :data:`CHUNK_LENGTH` (81), and is cut into rows of 81 tokens.

    Args:
        snippets: the snippets (strings), in order.
        drop_empty: drop chunks whose 80 targets (``chunk[1:]``) are all pad (default ``True``; see module doc).

    Returns:
        ``(tokens, chunk_snippet)``: uint8 ``[N, 81]`` token rows and int64 ``[N]`` index of each row's snippet.
    """
    n = len(snippets)
    if n == 0:
        return np.zeros((0, CHUNK_LENGTH), dtype=np.uint8), np.zeros(0, dtype=np.int64)
    lengths = np.fromiter((len(s) for s in snippets), dtype=np.int64, count=n)
    ids = encode("".join(snippets))
    padded = -(-(lengths + 2) // CHUNK_LENGTH) * CHUNK_LENGTH
    offsets = np.concatenate(([0], np.cumsum(padded)[:-1]))
    flat = np.zeros(int(padded.sum()), dtype=np.uint8)
    flat[offsets] = BOS_ID
    flat[offsets + lengths + 1] = EOS_ID
    char_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    positions = np.arange(ids.size, dtype=np.int64) + np.repeat(offsets + 1 - char_starts, lengths)
    flat[positions] = ids
    tokens = flat.reshape(-1, CHUNK_LENGTH)
    chunk_snippet = np.repeat(np.arange(n, dtype=np.int64), padded // CHUNK_LENGTH)
    if drop_empty:
        keep = (tokens[:, 1:] != PAD_ID).any(axis=1)
        tokens, chunk_snippet = tokens[keep], chunk_snippet[keep]
    return np.ascontiguousarray(tokens), chunk_snippet
