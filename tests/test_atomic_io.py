"""lightning_fed.atomic_io.atomic_write: the one temp-file-then-rename writer (checkpoints, downloads, caches)."""

from __future__ import annotations

import os

import pytest

from lightning_fed.atomic_io import atomic_write


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with atomic_write(target) as fh:
        fh.write(b"new contents")
        assert target.read_bytes() == b"old"  # the target is untouched until the block ends
        tmp = [p for p in tmp_path.iterdir() if p != target]
        assert len(tmp) == 1 and tmp[0].name.startswith(".data.bin.") and tmp[0].name.endswith(".tmp")
    assert target.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]


@pytest.mark.parametrize("error", [ValueError("bad data"), KeyboardInterrupt()])
def test_atomic_write_failure_keeps_the_old_file(tmp_path, error):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with pytest.raises(type(error)):
        with atomic_write(target) as fh:
            fh.write(b"half")
            raise error
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]


def test_atomic_write_failed_rename_removes_the_temporary(tmp_path, monkeypatch):
    target = tmp_path / "data.bin"

    def broken(*args, **kwargs):
        raise OSError("rename failed (simulated)")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="simulated"):
        with atomic_write(target) as fh:
            fh.write(b"x")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_prefix_suffix_and_mode(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_write(target, prefix=".ckpt.partial-", suffix="") as fh:
        (tmp,) = list(tmp_path.iterdir())
        assert tmp.name.startswith(".ckpt.partial-") and len(tmp.name) == len(".ckpt.partial-") + 8
        fh.write(b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert (target.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_atomic_write_missing_directory_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_write(tmp_path / "missing" / "f"):
            pass
