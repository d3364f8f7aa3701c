"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""

from __future__ import annotations

import lzma
import sqlite3
from pathlib import Path
import pytest
from lightning_fed.datamodules.tasks import stackoverflow as so
from lightning_fed.datamodules.tasks.stackoverflow import sqlite as so_sqlite
from tests.datamodules.tasks.test_stackoverflow import write_tff_sqlite


# ---------------------------------------------------------------------------------------------- item 3: SO paths
def test_stackoverflow_path_with_hash_sign_is_data(tmp_path):
    folder = tmp_path / "run#1"
    folder.mkdir()
    db = write_tff_sqlite(folder / "so.sqlite")
    assert so.count_examples(db, "train") == 6
    assert not (tmp_path / "run").exists()  # SQLite used to open (create) this, read-write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run#1"]
    for name in ("a?b", "50%"):
        other = tmp_path / name
        other.mkdir()
        assert so.count_examples(write_tff_sqlite(other / "so.sqlite"), "test") == 3


def test_stackoverflow_connection_is_read_only(tmp_path):
    db = write_tff_sqlite(tmp_path / "so#x.sqlite")
    con = so._open_db(db)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            con.execute("DELETE FROM examples")
    finally:
        con.close()


# ---------------------------------------------------------------------------------------------- item 13: SO rows
def _insert(db: Path, split, client, blob) -> None:
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE IF NOT EXISTS examples (split_name TEXT, client_id, serialized_example_proto BLOB)")
    con.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, client, blob))
    con.commit()
    con.close()


def test_stackoverflow_null_client_id_is_refused_naming_the_row(tmp_path):
    db = tmp_path / "so.sqlite"
    blob = so.encode_example({"tokens": "a b", "title": "t", "tags": "x"})
    _insert(db, "train", "u1", blob)
    _insert(db, "train", None, blob)
    with pytest.raises(ValueError, match=r"so\.sqlite.*row 2 .*client_id is None"):
        so.read_examples(db, "train")


def test_stackoverflow_integer_and_text_ids_are_not_merged(tmp_path):
    db = tmp_path / "so.sqlite"
    blob = so.encode_example({"tokens": "a b", "title": "t", "tags": "x"})
    _insert(db, "train", "7", blob)
    _insert(db, "train", 7, blob)  # a column without TEXT affinity keeps the INTEGER
    with pytest.raises(ValueError, match=r"row 2 .*client_id is 7 \(int\)"):
        so.read_examples(db, "train")


@pytest.mark.parametrize("blob, what", [(None, "NoneType"), ("text", "str"), (b"\x0a\x05\x0a\x03", "not a valid")])
def test_stackoverflow_malformed_blob_names_the_row(tmp_path, blob, what):
    db = tmp_path / "so.sqlite"
    _insert(db, "train", "u1", so.encode_example({"tokens": "a", "title": "t", "tags": "x"}))
    _insert(db, "train", "u2", blob)
    with pytest.raises(ValueError, match=rf"so\.sqlite.*row 2 .*{what}"):
        so.read_examples(db, "train")


# ---------------------------------------------------------------------------------------------- item 4: bombs
def test_stackoverflow_lzma_bomb_download_is_refused(tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.sqlite.lzma"
    with lzma.open(bomb, "wb", preset=1) as f:
        zeros = b"\0" * (16 << 20)
        for _ in range(10):  # 160 MiB of zeros in ~25 kB
            f.write(zeros)
    assert bomb.stat().st_size < 200_000
    monkeypatch.setattr(so_sqlite, "TFF_SQLITE_URL", bomb.as_uri())  # read where the download runs
    data = tmp_path / "data"
    dm = so.StackOverflowNWPDataModule(data_dir=str(data), download=True)
    with pytest.raises(ValueError, match="inflates more than 100 times"):
        dm.prepare_data()
    assert not any((data / "stackoverflow").iterdir())  # no partial file left
