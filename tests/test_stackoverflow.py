"""Stack Overflow (SO NWP / SO LR): TFF's SQLite layout written by the test, hand-checked preprocessing, models."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
import torch

from helpers import quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules.stackoverflow import (
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
from lightning_fed.models.stackoverflow import RecallAtK, StackOverflowNWP, StackOverflowTagLR

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
# train word counts: a 5, b 5, c 2, d 1, e 1 -> top-3 = [a, b, c]; tags: x 4, z 2, y 2, w 1 -> top-2 = [x, y]


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
    assert len(list(db.parent.glob("stackoverflow/nwp-*.pt"))) == 1
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


def test_recall_at_5_hand_computed():
    scores = torch.tensor([
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3],  # top-5 = tags 0..4
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],  # top-5 = tags 2..6
        [0.5, 0.1, 0.1, 0.1, 0.1, 0.1, 0.9],  # no positives: adds nothing
    ])
    target = torch.tensor([
        [1, 0, 0, 0, 0, 1, 1],  # 1 of 3 in top-5
        [1, 1, 0, 0, 1, 0, 0],  # 1 of 3 in top-5
        [0, 0, 0, 0, 0, 0, 0],
    ])
    metric = RecallAtK(5)
    metric.update(scores[:2], target[:2])
    metric.update(scores[2:], target[2:])
    assert metric.compute().item() == pytest.approx(2 / 6)  # micro: (1 + 1) / (3 + 3), as Keras Recall(top_k=5)
    # torchmetrics' MultilabelRecall thresholds scores and (1.9) takes no `top_k`: not TFF's recall@5.
    from torchmetrics.classification import MultilabelRecall

    assert MultilabelRecall(num_labels=7, average="micro")(scores, target).item() != pytest.approx(2 / 6)


def test_model_shapes():
    nwp = StackOverflowNWP(vocab_size=50, embedding_dim=8, hidden_size=12)
    x = torch.randint(0, 54, (3, 20))
    assert nwp(x).shape == (3, 20, 54)
    full = StackOverflowNWP()
    assert full.embedding.weight.shape == (10004, 96) and full.lstm.hidden_size == 670
    assert full.projection.out_features == 96 and full.head.out_features == 10004
    lr = StackOverflowTagLR()
    assert lr(torch.rand(4, 10000)).shape == (4, 500)
    # accuracy ignores pad/OOV/BOS/EOS targets: only the one word target counts
    logits = torch.zeros(1, 4, 54)
    logits[0, :, 7] = 1.0
    nwp.val_acc.update(logits, torch.tensor([[7, 51, 53, 0]]))
    assert nwp.val_acc.compute().item() == 1.0


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
