"""Stack Overflow: build time and memory of the streaming, memory-mapped preprocessing.

Writes a synthetic SQLite file in TFF's layout (``examples(split_name, client_id, serialized_example_proto)``, the
blobs serialized with :func:`lightning_fed.datamodules.tasks.stackoverflow.encode_example`, as the tests do): C clients
with Zipf-like sizes, N train examples (+ test and heldout examples), words drawn Zipf-like from a pool, then
measures, each in a fresh subprocess (so that ``ru_maxrss`` is the peak of that step alone):

* ``import``: the interpreter + torch + lightning_fed baseline;
* ``build``: ``datamodule.setup()`` with an empty cache folder (two streaming passes over train, one over test,
  ``.npy`` files written through ``open_memmap``, then loaded and partitioned), for SO NWP and SO tag;
* ``load``: ``datamodule.setup()`` again (memory-mapped from the cache), plus one client batch; the RSS right after
  loading (``/proc/self/status`` VmRSS) shows that the arrays are mapped, not read;
* ``legacy`` (``--legacy``): the previous in-memory path for NWP (every example's strings of train and test as
  Python lists via ``read_examples``, then encoded), for comparison.

    .venv/bin/python benchmarks/stackoverflow_stream.py --clients 20000 --train-examples 500000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def generate(path: Path, clients: int, train: int, test: int, heldout: int, pool: int, words: int, seed: int) -> None:
    sys.path.insert(0, str(ROOT))
    from lightning_fed.datamodules.tasks.stackoverflow import encode_example

    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(pool)])
    tag_pool = np.array([f"tag{i}" for i in range(2000)])
    word_p = 1.0 / np.arange(1, pool + 1)
    word_p /= word_p.sum()
    tag_p = 1.0 / np.arange(1, len(tag_pool) + 1)
    tag_p /= tag_p.sum()
    client_p = 1.0 / np.arange(1, clients + 1) ** 0.8
    client_p /= client_p.sum()
    names = np.array([f"{i:08d}" for i in rng.permutation(clients)])
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                "serialized_example_proto BLOB NOT NULL)")
    for split, n in (("train", train), ("heldout", heldout), ("test", test)):
        # every client gets at least one train example; the rest Zipf-like
        who = np.concatenate([np.arange(min(clients, n)), rng.choice(clients, size=max(0, n - clients), p=client_p)])
        if split != "train":
            who = rng.choice(clients, size=n, p=client_p)
        who = np.sort(who, kind="stable")  # grouped by client, as in TFF's file
        for s in range(0, n, 20000):
            owners = who[s:s + 20000]
            b = len(owners)
            n_words = rng.integers(1, 2 * words, size=b)
            n_title = rng.integers(1, 12, size=b)
            n_tags = rng.integers(1, 5, size=b)
            w = np.split(vocab[rng.choice(pool, size=int(n_words.sum()), p=word_p)], np.cumsum(n_words)[:-1])
            t = np.split(vocab[rng.choice(pool, size=int(n_title.sum()), p=word_p)], np.cumsum(n_title)[:-1])
            g = np.split(tag_pool[rng.choice(len(tag_pool), size=int(n_tags.sum()), p=tag_p)], np.cumsum(n_tags)[:-1])
            batch = []
            for c, wi, ti, gi in zip(owners, w, t, g):
                blob = encode_example({"creation_date": "2010-01-01 00:00:00.0+00:00", "score": 1,
                                       "tags": "|".join(gi), "title": " ".join(ti), "tokens": " ".join(wi),
                                       "type": "question"})
                batch.append((split, str(names[c]), blob))
            con.executemany("INSERT INTO examples VALUES (?, ?, ?)", batch)
    con.commit()
    con.close()


def child(args: argparse.Namespace) -> None:
    """One measurement, in this (fresh) process; prints a JSON line."""
    import torch

    torch.set_num_threads(1)
    from lightning_fed.datamodules.tasks.stackoverflow import (
        StackOverflowNWPDataModule, StackOverflowTagDataModule, nwp_token_rows, read_examples, top_k_vocab)

    out: dict = {"step": args.child, "task": args.task}
    if args.child == "generate":
        t0 = time.perf_counter()
        generate(args.db, args.clients, args.train_examples, args.test_examples, args.heldout_examples, args.pool,
                 args.words, args.seed)
        out["seconds"] = time.perf_counter() - t0
    elif args.child == "import":
        out["rss_after_mib"] = _rss_mib()
    elif args.child == "legacy":  # the previous implementation's memory profile (NWP)
        t0 = time.perf_counter()
        clients, tokens, _, _ = read_examples(args.db, "train")
        vocab = top_k_vocab((t.split(" ") if t else [] for t in tokens), args.vocab_size)
        seen, keep = {}, []
        for i, c in enumerate(clients):
            if seen.get(c, 0) < args.max_examples_per_client:
                seen[c] = seen.get(c, 0) + 1
                keep.append(i)
        rows = nwp_token_rows([tokens[i] for i in keep], vocab, 20, args.vocab_size)
        t_rows = nwp_token_rows(read_examples(args.db, "test")[1], vocab, 20, args.vocab_size)
        out["seconds"] = time.perf_counter() - t0
        out["rows"] = len(rows) + len(t_rows)
    else:
        cls = StackOverflowNWPDataModule if args.task == "nwp" else StackOverflowTagDataModule
        extra = {"num_tags": args.num_tags} if args.task == "tag" else {}
        dm = cls(sqlite_path=str(args.db), data_dir=str(args.data_dir), vocab_size=args.vocab_size,
                 max_examples_per_client=args.max_examples_per_client, download=False, **extra)
        t0 = time.perf_counter()
        dm.setup()
        out["seconds"] = time.perf_counter() - t0
        out["rss_after_mib"] = _rss_mib()
        out["train"], out["test"], out["clients"] = len(dm.train_dataset), len(dm.test_dataset), dm.num_clients
        batch = next(iter(dm.client_dataloader(0, 0)))
        out["batch_shapes"] = [list(b.shape) for b in batch]
    out["peak_mib"] = _peak_mib()
    print(json.dumps(out))


def run_child(args: argparse.Namespace, step: str, task: str, data_dir: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", step, "--task", task, "--db", str(args.db), "--data-dir",
           str(data_dir)]
    for name in ("vocab_size", "num_tags", "max_examples_per_client", "clients", "train_examples", "test_examples",
                 "heldout_examples", "words", "pool", "seed"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{step}/{task} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=20000)
    p.add_argument("--train-examples", type=int, default=500000)
    p.add_argument("--test-examples", type=int, default=None, help="default: train / 10")
    p.add_argument("--heldout-examples", type=int, default=None, help="default: train / 20")
    p.add_argument("--words", type=int, default=20, help="mean words per example (default 20)")
    p.add_argument("--pool", type=int, default=50000, help="distinct words (default 50,000)")
    p.add_argument("--vocab-size", type=int, default=10000)
    p.add_argument("--num-tags", type=int, default=500)
    p.add_argument("--max-examples-per-client", type=int, default=1000)
    p.add_argument("--tasks", default="nwp,tag", help="comma-separated subset of nwp,tag")
    p.add_argument("--legacy", action="store_true", help="also measure the old in-memory NWP path")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder, removed at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--task", default="nwp", help=argparse.SUPPRESS)
    p.add_argument("--db", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    for name in ("clients", "train_examples", "words", "pool", "vocab_size", "num_tags", "max_examples_per_client"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    tasks = [t for t in args.tasks.split(",") if t]
    if not tasks or any(t not in ("nwp", "tag") for t in tasks):
        p.error("--tasks must be a comma-separated subset of nwp,tag")
    if args.test_examples is None:
        args.test_examples = max(1, args.train_examples // 10)
    if args.heldout_examples is None:
        args.heldout_examples = args.train_examples // 20
    work = Path(tempfile.mkdtemp(prefix="so_bench_")) if args.workdir is None else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        args.db = work / "stackoverflow.sqlite"
        if args.db.exists():
            args.db.unlink()
        # Everything heavy runs in children: this process stays small, so that a child's ru_maxrss (which starts
        # from the RSS of the process that forked it) is its own peak.
        gen = run_child(args, "generate", "-", work)
        print(f"synthetic file: {args.clients} clients, {args.train_examples} train / {args.test_examples} test / "
              f"{args.heldout_examples} heldout examples, {args.db.stat().st_size / 2**20:.0f} MiB, generated in "
              f"{gen['seconds']:.0f} s")
        results = [run_child(args, "import", "-", work)]
        for task in tasks:
            data_dir = work / f"data_{task}"
            shutil.rmtree(data_dir, ignore_errors=True)
            build = run_child(args, "build", task, data_dir)
            size = sum(f.stat().st_size for f in (data_dir / "stackoverflow").rglob("*.npy")) / 2**20
            results += [dict(build, cache_mib=size), run_child(args, "load", task, data_dir)]
        if args.legacy:
            results.append(run_child(args, "legacy", "nwp", work))
        base = results[0]["peak_mib"]
        print(f"\n{'step':<8}{'task':<6}{'seconds':>9}{'peak RSS MiB':>14}{'peak-import':>13}{'RSS after':>11}"
              f"{'cache MiB':>11}  rows (train/test)")
        for r in results:
            rows = f"{r['train']}/{r['test']}" if "train" in r else str(r.get("rows", ""))
            sec = f"{r['seconds']:.1f}" if "seconds" in r else "-"
            after = f"{r['rss_after_mib']:.0f}" if "rss_after_mib" in r else "-"
            cache = f"{r['cache_mib']:.0f}" if "cache_mib" in r else "-"
            print(f"{r['step']:<8}{r['task']:<6}{sec:>9}{r['peak_mib']:>14.0f}{r['peak_mib'] - base:>13.0f}"
                  f"{after:>11}{cache:>11}  {rows}")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
