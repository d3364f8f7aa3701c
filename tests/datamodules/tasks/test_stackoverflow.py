"""Stack Overflow (SO NWP / SO LR): TFF's SQLite layout written by the test, hand-checked preprocessing, models."""
from __future__ import annotations

import sqlite3
import numpy as np
import pytest
import torch
from helpers import quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules.tasks.stackoverflow import (
    StackOverflowNWPDataModule,
    StackOverflowTagDataModule,
    bag_of_words,
    encode_example,
    nwp_token_rows,
    parse_example,
    read_examples,
    special_ids,
    tag_multi_hot,
    top_k_vocab,
)
from lightning_fed.models.stackoverflow import StackOverflowNWP, StackOverflowTagLR


# (split, client, tokens, title, tags)
ROWS = [
    ("train", "00000001", "a b c a", "t1", "x|y"),
    ("train", "00000001", "a d", "t2", "x"),
    ("test", "00000001", "a q", "tq", "y|w"),
    ("train", "00000002", "b a e", "t3", "y|z"),
    ("heldout", "00000002", "zzz", "th", "x"),
    ("train", "00000003", "a b", "t4", "x|z"),
    ("train", "00000003", "c", "t5", "w"),
    ("train", "00000003", "b b", "t6", "x"),
    ("test", "00000004", "b c d e", "tt", "x|z"),
    ("test", "00000002", "e", "tu", "q"),
]


def write_tff_sqlite(path, rows=ROWS):
    """TFF's layout: examples(split_name, client_id, serialized_example_proto) + client_metadata."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                "serialized_example_proto BLOB NOT NULL)")
    con.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, "
                "num_examples INTEGER NOT NULL)")
    for split, client, tokens, title, tags in rows:
        blob = encode_example({"creation_date": "2010-01-01 00:00:00.0+00:00", "score": 3, "tags": tags,
                               "title": title, "tokens": tokens, "type": "question"})
        con.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, client, blob))
    counts = {}
    for split, client, *_ in rows:
        counts[(client, split)] = counts.get((client, split), 0) + 1
    con.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)", [(c, s, n) for (c, s), n in counts.items()])
    con.commit()
    con.close()
    return path


@pytest.fixture
def db(tmp_path):
    return write_tff_sqlite(tmp_path / "stackoverflow.sqlite")


def test_protobuf_roundtrip_and_tf_bytes():
    # Bytes of tf.train.Example(features={"tokens": bytes_list ["a b"], "score": int64_list [-2]}) written by hand:
    # Example{1: Features{1: entry{1: "tokens", 2: Feature{1: BytesList{1: "a b"}}}}}
    entry = b"\x0a\x06tokens" + b"\x12\x07" + b"\x0a\x05" + b"\x0a\x03a b"
    blob = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert parse_example(blob) == {"tokens": [b"a b"]}
    f = parse_example(encode_example({"tokens": "a b", "score": -2, "w": [0.5, 1.5], "tags": ["x", "y"]}))
    assert f == {"tokens": [b"a b"], "score": [-2], "w": [0.5, 1.5], "tags": [b"x", b"y"]}
    with pytest.raises(ValueError):
        parse_example(b"\x0a\x10abc")


def test_read_examples(db):
    clients, tokens, titles, tags = read_examples(db, "train")
    assert clients == ["00000001", "00000001", "00000002", "00000003", "00000003", "00000003"]
    assert tokens[0] == "a b c a" and titles[3] == "t4" and tags[2] == "y|z"
    assert read_examples(db, "heldout")[1] == ["zzz"]
    with pytest.raises(ValueError, match="split"):
        read_examples(db, "validation")


def test_vocab_selection():
    _, tokens, _, tags = zip(*[(r[0], r[2], r[3], r[4]) for r in ROWS if r[0] == "train"])
    assert top_k_vocab((t.split(" ") for t in tokens), 3) == ["a", "b", "c"]
    assert top_k_vocab((t.split(" ") for t in tokens), 10) == ["a", "b", "c", "d", "e"]  # ties by word
    assert top_k_vocab((t.split("|") for t in tags), 2) == ["x", "y"]  # y and z tie at 2 -> y


def test_nwp_rows_bos_eos_pad_truncate():
    vocab = ["a", "b", "c"]
    assert special_ids(3) == {"pad": 0, "oov": 4, "bos": 5, "eos": 6}
    rows = nwp_token_rows(["a q b", "a b c a", "c c c c c c", ""], vocab, sequence_length=4)
    np.testing.assert_array_equal(rows, [
        [5, 1, 4, 2, 6],  # BOS a OOV b EOS (3 < 4 words)
        [5, 1, 2, 3, 1],  # exactly 4 words: no EOS
        [5, 3, 3, 3, 3],  # truncated to 4 words, no EOS
        [5, 6, 0, 0, 0],  # empty: BOS EOS pad
    ])
    # special ids follow vocab_size, not the number of distinct words
    assert nwp_token_rows(["q"], vocab, 2, vocab_size=10).tolist() == [[12, 11, 13]]


def test_bag_of_words_and_tags():
    idx, off, val = bag_of_words(["a b c a q", "", "q"], ["a", "b", "c"])
    dense = np.zeros((3, 3), dtype=np.float32)
    for r in range(3):
        np.add.at(dense[r], idx[off[r]:off[r + 1]], val[off[r]:off[r + 1]])
    np.testing.assert_allclose(dense, [[2 / 5, 1 / 5, 1 / 5], [0, 0, 0], [0, 0, 0]])
    t_idx, t_off = tag_multi_hot(["y|x|q", "", "x|x"], ["x", "y"])
    assert t_idx.tolist() == [0, 1, 0] and t_off.tolist() == [0, 2, 2, 3]


def test_nwp_datamodule(db):
    dm = StackOverflowNWPDataModule(sqlite_path=str(db), data_dir=str(db.parent), vocab_size=3, sequence_length=4,
                                    max_examples_per_client=2, num_eval_samples=2, clients_per_round=2,
                                    batch_size=2, seed=1)
    dm.setup()
    assert dm.vocab == ["a", "b", "c"]  # from the whole train split (client 3's third example included)
    assert dm.num_clients == 3 and list(dm.partition.client_names) == [0, 1, 2]
    assert dm.train_dataset.client_names == ["00000001", "00000002", "00000003"]
    assert len(dm.train_dataset) == 5  # client 3 capped at its first 2 examples
    np.testing.assert_array_equal(dm.train_dataset.tokens[dm.client_indices(2)].numpy(),
                                  [[5, 1, 2, 6, 0], [5, 3, 6, 0, 0]])
    assert len(dm.test_dataset) == 3 and len(dm.val_dataset) == 2
    x, y = next(iter(dm.client_dataloader(0, 0)))
    assert x.shape == (2, 4) and y.shape == (2, 4) and torch.equal(x[:, 1:], y[:, :-1])
    # second load comes from the cache and gives the same data
    assert len(list(db.parent.glob("stackoverflow/nwp-*/meta.json"))) == 1
    dm2 = StackOverflowNWPDataModule(sqlite_path=str(db), data_dir=str(db.parent), vocab_size=3, sequence_length=4,
                                     max_examples_per_client=2, num_eval_samples=2, clients_per_round=2, seed=1)
    dm2.setup()
    assert torch.equal(dm2.train_dataset.tokens, dm.train_dataset.tokens) and dm2.vocab == dm.vocab
    assert torch.equal(dm2.val_dataset.tokens, dm.val_dataset.tokens)


def test_tag_datamodule(db):
    dm = StackOverflowTagDataModule(sqlite_path=str(db), data_dir=str(db.parent), vocab_size=3, num_tags=2,
                                    num_eval_samples=None, clients_per_round=2, batch_size=4, cache=False)
    dm.setup()
    assert dm.vocab == ["a", "b", "c"] and dm.tags == ["x", "y"]
    x, y = dm.train_dataset.get_batch(torch.tensor([0, 2]))
    # "a b c a t1" -> a 2/5, b 1/5, c 1/5 ; "b a e t3" -> a 1/4, b 1/4
    torch.testing.assert_close(x, torch.tensor([[0.4, 0.2, 0.2], [0.25, 0.25, 0.0]]))
    torch.testing.assert_close(y, torch.tensor([[1.0, 1.0], [0.0, 1.0]]))
    xi, yi = dm.train_dataset[2]
    assert torch.equal(xi, x[1]) and torch.equal(yi, y[1])
    sub = dm.test_dataset.subset(np.array([2, 0]))
    torch.testing.assert_close(sub.get_batch(torch.tensor([0, 1]))[1], torch.tensor([[0.0, 0.0], [0.0, 1.0]]))


def test_missing_file_and_argument_errors(tmp_path):
    dm = StackOverflowNWPDataModule(data_dir=str(tmp_path), download=False)
    with pytest.raises(FileNotFoundError, match="stackoverflow.sqlite"):
        dm.prepare_data()
    for kwargs, name in [({"vocab_size": 0}, "vocab_size"), ({"sequence_length": 0}, "sequence_length"),
                         ({"max_examples_per_client": 0}, "max_examples_per_client"),
                         ({"num_eval_samples": 1.5}, "num_eval_samples")]:
        with pytest.raises(ValueError, match=name):
            StackOverflowNWPDataModule(**kwargs)
    with pytest.raises(ValueError, match="num_tags"):
        StackOverflowTagDataModule(num_tags=0)
    with pytest.raises(ValueError, match="hidden_size"):
        StackOverflowNWP(hidden_size=0)
    with pytest.raises(ValueError, match="lr"):
        StackOverflowTagLR(lr=0)


@pytest.mark.parametrize("task", ["nwp", "tag"])
def test_one_federated_round(db, tmp_path, task):
    common = dict(sqlite_path=str(db), data_dir=str(tmp_path), vocab_size=3, max_examples_per_client=1000,
                  num_eval_samples=2, clients_per_round=2, batch_size=2, cache=False)
    if task == "nwp":
        dm = StackOverflowNWPDataModule(sequence_length=4, **common)
        model = StackOverflowNWP(vocab_size=3, embedding_dim=4, hidden_size=8, lr=0.1)
        metric = "val_acc"
    else:
        dm = StackOverflowTagDataModule(num_tags=2, **common)
        model = StackOverflowTagLR(vocab_size=3, num_tags=2, lr=0.1)
        metric = "val_recall_at_5"
    before = [p.detach().clone() for p in model.parameters()]
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert metric in trainer.callback_metrics and "val_loss" in trainer.callback_metrics
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


# ------------------------------------------------------------------ streaming build / memory-mapped cache
def random_rows(seed=0, n=400):
    """A messier file: 12 train clients of very different sizes, empty texts, test-only clients, OOV tags."""
    rng = np.random.default_rng(seed)
    pool = [f"w{i}" for i in range(40)]
    tag_pool = [f"t{i}" for i in range(9)]
    rows = []
    for _ in range(n):
        split = rng.choice(["train", "train", "train", "test", "heldout"])
        client = f"{int(rng.zipf(1.5)) % 12 + (20 if split == 'test' and rng.random() < 0.3 else 0):08d}"
        words = " ".join(rng.choice(pool[: rng.integers(1, 40)], size=rng.integers(0, 30)))
        title = " ".join(rng.choice(pool, size=rng.integers(0, 4)))
        tags = "|".join(rng.choice(tag_pool, size=rng.integers(0, 4)))
        rows.append((str(split), client, words, title, tags))
    return rows


def in_memory_reference(db, task, vocab_size, cap, sequence_length=20, num_tags=5):
    """The pre-streaming implementation (whole splits as Python lists), from the public functions."""
    clients, tokens, titles, tags = read_examples(db, "train")
    vocab = top_k_vocab((t.split(" ") if t else [] for t in tokens), vocab_size)
    seen, keep = {}, []
    for i, c in enumerate(clients):
        if cap is None or seen.get(c, 0) < cap:
            seen[c] = seen.get(c, 0) + 1
            keep.append(i)
    names = sorted(set(clients))
    pos = {c: i for i, c in enumerate(names)}
    t_clients, t_tokens, t_titles, t_tags = read_examples(db, "test")
    out = {"vocab": vocab, "names": names, "train_cid": np.array([pos[clients[i]] for i in keep]),
           "test_cid": np.array([pos.get(c, -1) for c in t_clients])}
    if task == "nwp":
        out["train"] = nwp_token_rows([tokens[i] for i in keep], vocab, sequence_length, vocab_size)
        out["test"] = nwp_token_rows(t_tokens, vocab, sequence_length, vocab_size)
    else:
        out["tags"] = top_k_vocab(([x for x in t.split("|") if x] for t in tags), num_tags)
        out["train"] = (*bag_of_words([f"{tokens[i]} {titles[i]}" for i in keep], vocab),
                        *tag_multi_hot([tags[i] for i in keep], out["tags"]))
        out["test"] = (*bag_of_words([f"{a} {b}" for a, b in zip(t_tokens, t_titles)], vocab),
                       *tag_multi_hot(t_tags, out["tags"]))
    return out


def make_dm(task, db, data_dir, **kw):
    common = dict(sqlite_path=str(db), data_dir=str(data_dir), vocab_size=15, max_examples_per_client=7,
                  num_eval_samples=9, clients_per_round=2, batch_size=3, seed=3)
    common.update(kw)
    if task == "nwp":
        return StackOverflowNWPDataModule(sequence_length=6, **common)
    return StackOverflowTagDataModule(num_tags=5, **common)


def assert_matches_reference(dm, ref, task):
    assert dm.vocab == ref["vocab"] and dm.train_dataset.client_names == ref["names"]
    if task == "tag":
        assert dm.tags == ref["tags"]
    for split, ds in (("train", dm.train_dataset), ("test", dm.test_dataset)):
        np.testing.assert_array_equal(ds.client_id, ref[f"{split}_cid"])
        if task == "nwp":
            np.testing.assert_array_equal(ds.tokens.numpy(), ref[split])
            x, y = ds.get_batch(torch.arange(len(ds)))
            assert x.dtype == torch.int64 and torch.equal(x, torch.from_numpy(ref[split][:, :-1]))
            assert torch.equal(y, torch.from_numpy(ref[split][:, 1:]))
        else:
            w_idx, w_off, w_val, t_idx, t_off = ref[split]
            np.testing.assert_array_equal(ds.word_indices.numpy(), w_idx)
            np.testing.assert_array_equal(ds.word_offsets.numpy(), w_off)
            np.testing.assert_array_equal(ds.word_values.numpy(), w_val)  # bitwise: same float32 values
            np.testing.assert_array_equal(ds.tag_indices.numpy(), t_idx)
            np.testing.assert_array_equal(ds.tag_offsets.numpy(), t_off)
    rng = np.random.default_rng([dm.seed, 0x50E7A1])
    rows = np.sort(rng.choice(len(dm.test_dataset), size=dm.num_eval_samples, replace=False))
    index = torch.arange(len(rows))
    for a, b in zip(dm.val_dataset.get_batch(index), dm.test_dataset.get_batch(torch.from_numpy(rows))):
        assert torch.equal(a, b)


@pytest.mark.parametrize("task", ["nwp", "tag"])
@pytest.mark.parametrize("cache", [True, False])
def test_streamed_build_equals_in_memory(tmp_path, monkeypatch, task, cache):
    import lightning_fed.datamodules.tasks.stackoverflow.cache as so  # the module whose _CHUNK_ROWS the build reads

    monkeypatch.setattr(so, "_CHUNK_ROWS", 7)  # many chunks, rows straddling chunk borders
    monkeypatch.setattr(so, "_COPY_ELEMS", 5)
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    ref = in_memory_reference(db, task, 15, 7, 6, 5)
    assert len(ref["vocab"]) == 15 and len(set(ref["names"])) == 12 and (ref["test_cid"] == -1).any()
    dm = make_dm(task, db, tmp_path, cache=cache)
    dm.setup()
    assert_matches_reference(dm, ref, task)
    folders = list((tmp_path / "stackoverflow").glob(f"{task}-*")) if cache else []
    assert len(folders) == int(cache)
    if cache:
        assert not list(folders[0].glob("*.raw")) and not list((tmp_path / "stackoverflow").glob(".*"))
        assert dm.train_dataset._files and dm.test_dataset._files  # memory-mapped from the cache
        dm2 = make_dm(task, db, tmp_path)
        dm2.setup()  # loaded from the cache, not rebuilt
        assert_matches_reference(dm2, ref, task)
        assert dm2.train_dataset._files["client_id"].startswith(str(folders[0]))


@pytest.mark.parametrize("task", ["nwp", "tag"])
def test_memmapped_datasets_pickle_by_path_and_workers(tmp_path, task):
    import pickle

    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows(1, n=3000))
    dm = make_dm(task, db, tmp_path, num_workers=1, max_examples_per_client=None)
    dm.setup()
    train = dm.train_dataset
    blob = pickle.dumps(train)
    assert len(blob) < 2000  # the arrays travel as file paths, not data
    again = pickle.loads(blob)
    index = torch.tensor([0, 5, len(train) - 1])
    for a, b in zip(again.get_batch(index), train.get_batch(index)):
        assert torch.equal(a, b)
    assert len(pickle.dumps(dm.val_dataset)) > 200  # an in-memory subset is pickled by value
    # num_workers > 0: client loaders go through a DataLoader with a worker process
    cid = int(np.argmax([len(dm.client_indices(c)) for c in range(dm.num_clients)]))
    batches = list(dm.client_dataloader(cid, 0))
    assert sum(len(b[0]) for b in batches) == len(dm.client_indices(cid))


def test_failed_build_leaves_nothing_and_rebuilds(tmp_path, monkeypatch):
    import os

    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    real_rename = os.rename

    def broken(*args, **kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "rename", broken)
    with pytest.raises(OSError, match="simulated"):
        make_dm("tag", db, tmp_path).setup()
    assert list((tmp_path / "stackoverflow").iterdir()) == []  # temporary folder removed, no cache
    monkeypatch.setattr(os, "rename", real_rename)
    dm = make_dm("tag", db, tmp_path)
    dm.setup()
    assert_matches_reference(dm, in_memory_reference(db, "tag", 15, 7, 6, 5), "tag")


def _build_and_die(task, where, db, data_dir):
    """Runs in a forked child: build with tiny chunks and SIGKILL itself from a patched stdlib function."""
    import builtins
    import os
    import signal

    import lightning_fed.datamodules.tasks.stackoverflow.cache as so  # the module whose _CHUNK_ROWS the build reads

    so._CHUNK_ROWS = 2
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    if where == "commit":  # everything written, killed just before the atomic rename
        os.rename = die
    else:  # killed in the middle of writing the raw CSR data (the 5th chunk written)
        real_open, writes = builtins.open, [0]

        class Killing:
            def __init__(self, fh):
                self.fh = fh

            def write(self, b):
                writes[0] += 1
                if writes[0] == 5:
                    die()
                return self.fh.write(b)

            def close(self):
                self.fh.close()

        def opener(path, mode="r", *a, **k):
            fh = real_open(path, mode, *a, **k)
            return Killing(fh) if str(path).endswith(".raw") else fh

        builtins.open = opener
    make_dm(task, db, data_dir).setup()
    os._exit(0)


@pytest.mark.parametrize("task,where", [("nwp", "commit"), ("tag", "mid")])
def test_killed_build_leaves_no_loadable_cache(tmp_path, task, where):
    import multiprocessing
    import signal

    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    child = multiprocessing.get_context("fork").Process(target=_build_and_die, args=(task, where, db, tmp_path))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    folder = tmp_path / "stackoverflow"
    leftovers = [p.name for p in folder.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(f".{task}-") and leftovers[0].endswith(".tmp")
    assert not list(folder.glob(f"{task}-*"))  # nothing under the name that is loaded
    if where == "commit":
        assert (folder / leftovers[0] / "meta.json").is_file()  # complete data, still never loaded
    dm = make_dm(task, db, tmp_path)
    dm.setup()  # rebuilds
    assert_matches_reference(dm, in_memory_reference(db, task, 15, 7, 6, 5), task)
    assert len(list(folder.glob(f"{task}-*"))) == 1


def test_fast_text_extraction_matches_parse_example():
    from lightning_fed.datamodules.tasks.stackoverflow import _example_texts, _fast_texts, _text

    rng = np.random.default_rng(0)
    words = ["a", "bb", "ccc" * 50, "é", "\u4e2d", ""]
    blobs = []
    for i in range(300):
        feats = {}
        for key in rng.permutation(["tokens", "title", "tags", "type", "score", "creation_date"]):
            r = rng.random()
            if key == "score" or r < 0.05:
                feats[str(key)] = int(rng.integers(-5, 5))  # an Int64List where a string is expected
            elif r < 0.1:
                continue  # missing feature
            elif r < 0.15:
                feats[str(key)] = [" ".join(rng.choice(words, 3)), "second"]  # several values: first one
            elif r < 0.2:
                feats[str(key)] = 1.5
            else:
                feats[str(key)] = " ".join(rng.choice(words, int(rng.integers(0, 60))))
        blobs.append(encode_example(feats))
    blobs.append(encode_example({"tokens": "x"}) + b"")
    blobs.append(b"\x0a\x00")  # an empty example
    blobs.append(b"\x0a\x0c" + b"\x0a\x0a" + b"\x0a\x06tokens" + b"\x12\x00")  # empty Feature
    blobs.append(b"\x0a\x0a" + b"\x0a\x08" + b"\x0a\x04tags" + b"\x12\x00")
    blobs.append(b"\x0a\x09" + b"\x0a\x07" + b"\x12\x00" + b"\x0a\x03tag")  # value before key
    blobs.append(encode_example({"tokens": b"\xff\xfe bad utf8"}))
    fast = 0
    for b in blobs:
        f = parse_example(b)
        assert _example_texts(b) == (_text(f, "tokens"), _text(f, "title"), _text(f, "tags"))
        fast += _fast_texts(b) is not None
    assert fast > 150  # the plain layout takes the fast path
    with pytest.raises(ValueError):
        _example_texts(b"\x0a\x10abc")  # malformed: the generic parser's error


@pytest.mark.parametrize("cache", [True, False])
def test_partition_is_cached_with_the_data(db, cache):
    """#40 item 5: the one-client-per-user partition is read from the cache (the train split grouped by user),
    equal to NaturalIdPartitioner's; a cache from before (no grouping) gets it added once, the same."""
    from lightning_fed.datamodules import NaturalIdPartitioner

    def module():
        return StackOverflowNWPDataModule(sqlite_path=str(db), data_dir=str(db.parent), vocab_size=3,
                                          sequence_length=4, max_examples_per_client=2, num_eval_samples=2,
                                          clients_per_round=2, cache=cache)

    dm = module()
    dm.setup()
    assert dm._train_groups is not None
    ids = np.asarray(dm.train_dataset.client_id)
    expected = NaturalIdPartitioner().partition(len(ids), ids=ids)
    for got in (dm.partition, dm.cached_partition(None)):
        assert np.array_equal(got.indices, expected.indices) and np.array_equal(got.offsets, expected.offsets)
        assert np.array_equal(got.client_names, expected.client_names)
        assert got.client_names.dtype == expected.client_names.dtype
    if cache:
        folder = next(db.parent.glob("stackoverflow/nwp-*"))
        for name in ("train_client_order", "train_client_offsets"):
            (folder / f"{name}.npy").unlink()
        old = module()
        old.setup()
        assert (folder / "train_client_offsets.npy").is_file()
        assert np.array_equal(old.partition.indices, expected.indices)
        assert np.array_equal(old.partition.offsets, expected.offsets)
        assert not list(folder.glob(".train-groups.*"))
