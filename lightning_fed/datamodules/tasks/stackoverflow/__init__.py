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
* Federated evaluation (``eval_clients_per_round``): TFF's test split is keyed by ``client_id`` (the user), so each
  train user's own test examples (all of them, in rowid order) are its evaluation data; users with no test examples
  are never evaluated, and test-only users (client index -1) belong to no client.

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
``_client_id`` for the tag task; ``test_client_order`` (int64, the test rows of train users grouped per user, each
user's rows in rowid order) and ``test_client_offsets`` (int64 ``[num_clients + 1]``), the per-user evaluation data
of federated evaluation, grouped once at build time; ``meta.json`` (vocabulary, tags, client names, sizes). The folder is built under
a temporary name (``.<task>-<key>.<uuid>.tmp``) and renamed only when complete, so a killed build never leaves a
cache that loads (its temporary folder may stay behind and can be deleted). Loading memory-maps the arrays
(``np.load(mmap_mode="c")``: read-only mapping, copy-on-write view): the datasets read only the rows of the
batches they serve, and are pickled (DataLoader workers) as file paths, re-mapped on unpickling. The validation
subsample is an in-memory copy of its 10,000 rows, read from the mapped test split. ``cache=False`` runs the same
streaming build into in-memory arrays and writes nothing (fine for small files).

Examples are decoded by a fast reader of TensorFlow's usual ``tf.train.Example`` layout that falls back to
:func:`parse_example` for anything else; still, the first build of the full file takes a while (pure Python).

Modules
-------
:mod:`.proto` (the ``tf.train.Example`` reader/writer), :mod:`.sqlite` (TFF's SQLite file: download, reading),
:mod:`.vocabulary` (vocabularies and encodings), :mod:`.datasets` (in-memory / memory-mapped datasets),
:mod:`.cache` (the streaming build into the cache folder) and :mod:`.datamodule` (the two data modules). Every
public name is re-exported here.
"""

from lightning_fed.datamodules.tasks.stackoverflow.cache import PREPROCESSING_VERSION
from lightning_fed.datamodules.tasks.stackoverflow.datamodule import StackOverflowNWPDataModule, StackOverflowTagDataModule
from lightning_fed.datamodules.tasks.stackoverflow.datasets import StackOverflowNWPSequences, StackOverflowTagExamples
from lightning_fed.datamodules.tasks.stackoverflow.proto import (  # noqa: F401  (private names: tests)
    _example_texts,
    _fast_texts,
    _text,
    encode_example,
    parse_example,
)
from lightning_fed.datamodules.tasks.stackoverflow.sqlite import (  # noqa: F401  (MAX_*: documented limits; _open_db: tests)
    MAX_SQLITE_BYTES,
    MAX_SQLITE_RATIO,
    SPLITS,
    TFF_SQLITE_URL,
    _open_db,
    count_examples,
    download_sqlite,
    iter_examples,
    read_examples,
)
from lightning_fed.datamodules.tasks.stackoverflow.vocabulary import (
    bag_of_words,
    nwp_token_rows,
    special_ids,
    tag_multi_hot,
    top_k_vocab,
)

__all__ = [
    "TFF_SQLITE_URL",
    "SPLITS",
    "PREPROCESSING_VERSION",
    "parse_example",
    "encode_example",
    "count_examples",
    "iter_examples",
    "read_examples",
    "download_sqlite",
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
