"""Crash-safe file writes shared by the checkpoint IO and every data module's downloads and caches.

:func:`atomic_write` is the one temporary-file-then-rename writer of the package: a file written through it is,
at every moment, either absent/the previous complete file or the new complete file -- never a truncated one --
on every local filesystem (POSIX ``rename(2)`` semantics of :func:`os.replace` within one directory).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

__all__ = ["atomic_write", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike) -> None:
    """``fsync`` the directory ``directory`` so that a rename inside it is durable; a no-op where directories
    cannot be opened (Windows) or synced."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, prefix: Optional[str] = None, suffix: str = ".tmp") -> Iterator[BinaryIO]:
    """Write the file ``path`` atomically: yield a binary file open for writing on a new temporary file in
    ``path``'s directory; when the ``with`` block ends normally it is flushed, ``fsync``-ed, renamed over ``path``
    with :func:`os.replace` and the directory is ``fsync``-ed.

    If the block (or the rename) raises -- including ``KeyboardInterrupt`` -- the temporary file is deleted and
    ``path`` is left as it was. A process killed mid-write leaves only the temporary file, named
    ``<prefix><8 hex digits><suffix>`` (default ``.<name>.<hex>.tmp``, hidden), never a truncated ``path``.

    Args:
        path: the target file; its directory must exist.
        prefix: temporary name before the random token (default ``".<name>."``).
        suffix: temporary name after the token (default ``".tmp"``).

    The temporary file is created exclusively (``O_EXCL``) with mode ``0o666`` minus the umask, like an ordinary
    new file.

    Raises:
        OSError: the directory does not exist or is not writable, or writing/renaming failed.

    Example: an error inside the block leaves the old content::

        >>> import tempfile
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "state.bin"
        >>> with atomic_write(path) as fh:
        ...     _ = fh.write(b"round 1")
        >>> try:
        ...     with atomic_write(path) as fh:
        ...         _ = fh.write(b"round 2, half writ")
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt:
        ...     pass
        >>> path.read_bytes(), sorted(p.name for p in path.parent.iterdir())  # no temporary file left
        (b'round 1', ['state.bin'])
    """
    target = Path(path)
    if prefix is None:
        prefix = f".{target.name}."
    while True:
        tmp = target.with_name(f"{prefix}{secrets.token_hex(4)}{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)
