"""The on-disk client-state store (issue #52: moved out of ``server/client_state.py``): one copy-on-write file per
client row and version, the manifest a checkpoint holds instead of the rows, the ``refs/`` a checkpoint registers,
the garbage collection of versions nothing references (checkpoints copied by hand included) and its errors. The
design and its reasons are :mod:`lightning_fed.server.client_state`'s; :class:`~lightning_fed.server.client_state.
ClientStateTable` (``client_state_store="disk"``) is what uses it, and every name stays importable from there.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import warnings
import weakref
import zlib
from typing import Any, Optional

import torch
from torch import Tensor

class MissingClientStateError(FileNotFoundError):
    """A checkpoint references a row of an on-disk client-state store that is not there (the store directory was
    moved or deleted, or the row file removed): the resume is refused rather than restarting that client at zero.

    Example::

        >>> import tempfile, torch
        >>> from lightning_fed.server.client_state import ClientStateTable
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(1, torch.ones(2))
        >>> saved = table.state_dict()
        >>> os.remove(table._disk.path(1))
        >>> ClientStateTable.from_state_dict(saved)
        Traceback (most recent call last):
        ...
        lightning_fed.server.client_store_disk.MissingClientStateError: The row of client 1 in the client-state store '...' is missing or damaged (file '...-....row'); refusing to restart that client's state at zero. Resume from a checkpoint whose rows are all there, or start a new run.
    """


class CorruptClientStateError(MissingClientStateError):
    """A row file of an on-disk client-state store whose bytes differ from those written (its CRC-32 is not the one
    the manifest recorded: flipped bits, a file overwritten by hand): refused when the row is read, naming the file
    and the client, rather than resuming that client from other numbers.

    Example::

        >>> import tempfile, torch
        >>> from lightning_fed.server.client_state import ClientStateTable
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(1, torch.ones(2))
        >>> with open(table._disk.path(1), "r+b") as f:
        ...     _ = f.write(b"\\x01")  # one byte changed
        >>> table.get(1)
        Traceback (most recent call last):
        ...
        lightning_fed.server.client_store_disk.CorruptClientStateError: The row of client 1 in the client-state store '...' is damaged (file '...-....row': CRC-32 ... but ... was recorded when it was written); refusing to resume that client from other numbers. Resume from an earlier checkpoint, or start a new run.
    """


class ClientStateStoreError(OSError):
    """The on-disk client-state store cannot be written: ``client_state_dir`` not writable (checked at fit start,
    before any client trains) or a row that could not be written (``ENOSPC``: the disk is full). The message names the
    store directory and the file; ``errno`` is the operating system's.

    Example::

        >>> import errno
        >>> ClientStateStoreError(errno.ENOSPC, "no space").errno == errno.ENOSPC
        True
    """


# ---------------------------------------------------------------------------------------------- on-disk rows
class _Directory:
    """What this process knows about one on-disk table directory: the versions each checkpoint references
    (``refs``, by checkpoint path; by ``("pinned", id)`` for a checkpoint built, not yet saved), the superseded
    versions that may be deleted (``candidates``), the table objects open on it (``live``: their versions are never
    deleted) and the folders scanned for ``.ckpt`` files before a deletion (``folders``, see :func:`collect_garbage`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.refs: dict[Any, set[tuple[int, int]]] = {}
        self.candidates: set[tuple[int, int]] = set()
        self.live: "weakref.WeakSet[_DiskRows]" = weakref.WeakSet()  # every table object open on it
        self.loaded = False
        self.blocked = False  # a refs file could not be read: what it protects is unknown, so nothing is deleted
        # the folder holding the store directory (the run folder with the default `<default_root_dir>/client_state`)
        self.folders: set[str] = {os.path.dirname(os.path.dirname(path))}

    def add_checkpoint_folder(self, checkpoint_path: str) -> None:
        folder = os.path.dirname(checkpoint_path)
        self.folders.update((folder, os.path.dirname(folder)))

    def load_refs(self) -> None:
        """Read ``refs/`` once: the versions the checkpoints of earlier processes reference (refs of checkpoints
        that no longer exist are dropped; their folders are still scanned, :func:`collect_garbage`)."""
        if self.loaded:
            return
        self.loaded = True
        folder = os.path.join(self.path, "refs")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            file = os.path.join(folder, name)
            if not name.endswith(".pt"):
                continue
            try:
                saved = torch.load(file, weights_only=True)
            except Exception:  # unreadable (refs are written atomically: damaged by other means): nothing is collected
                self.blocked = True
                continue
            self.add_checkpoint_folder(saved["checkpoint"])
            if not os.path.exists(saved["checkpoint"]):
                _remove(file)
                continue
            self.refs.setdefault(saved["checkpoint"], set()).update(
                zip(saved["ids"].tolist(), saved["versions"].tolist()))


_DIRECTORIES: dict[str, _Directory] = {}


def _directory(path: str) -> _Directory:
    path = os.path.abspath(path)
    if path not in _DIRECTORIES:
        _DIRECTORIES[path] = _Directory(path)
    return _DIRECTORIES[path]


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _row_path(directory: str, client_id: int, version: int) -> str:
    return os.path.join(directory, "rows", f"{client_id % 256:02x}", f"{client_id}-{version:016x}.row")


def _crc32(value: Tensor) -> int:
    return zlib.crc32(value.contiguous().view(torch.uint8).numpy()) & 0xFFFFFFFF


def _write_error(error: OSError, path: str, directory: str, what: str) -> ClientStateStoreError:
    return ClientStateStoreError(
        error.errno, f"Cannot write {what} {path!r} of the client-state store {directory!r} "
        f"(`client_state_dir`): {os.strerror(error.errno) if error.errno else error}. Free space on (or make "
        "writable) that file system, or choose another `client_state_dir`; the run's last checkpoint and its rows "
        "are intact.")


class _DiskRows:
    """The rows of one table in ``directory``, one file per client and version (see the module docstring), with the
    CRC-32 of each version's bytes (``crc``) and whether it is all finite (``finite``), both recorded when written."""

    def __init__(self, directory: str, dim: int, dtype: torch.dtype) -> None:
        self.directory = os.path.abspath(directory)
        self.dim, self.dtype = dim, dtype
        self.versions: dict[int, int] = {}
        self.crc: dict[int, int] = {}  # absent: a row of a manifest written before checksums (not checked)
        self.finite: dict[int, bool] = {}
        _directory(self.directory).live.add(self)

    def path(self, client_id: int) -> str:
        return _row_path(self.directory, client_id, self.versions[client_id])

    def read(self, client_id: int) -> Tensor:
        """The row of ``client_id`` read from its file and checked against its CRC-32.

        Raises:
            MissingClientStateError: the file is missing or of another size; :class:`CorruptClientStateError`: its
                bytes are not those written (naming the file and the client).
        """
        path = self.path(client_id)
        try:
            row = torch.from_file(path, shared=False, size=self.dim, dtype=self.dtype)
        except (RuntimeError, OSError) as error:
            raise _missing(path, client_id, self.directory) from error
        expected = self.crc.get(client_id)
        if expected is not None and _crc32(row) != expected:
            raise CorruptClientStateError(
                f"The row of client {client_id} in the client-state store {self.directory!r} is damaged (file "
                f"{path!r}: CRC-32 {_crc32(row):08x} but {expected:08x} was recorded when it was written); refusing "
                "to resume that client from other numbers. Resume from an earlier checkpoint, or start a new run.")
        return row

    def write(self, client_id: int, value: Tensor) -> None:
        """Write ``value`` as a new version of ``client_id``'s row (atomically; see the module docstring).

        Raises:
            ClientStateStoreError: the file could not be written (e.g. ``ENOSPC``), naming it and the store.
        """
        from lightning_fed.atomic_io import atomic_write

        version = secrets.randbits(63)
        path = _row_path(self.directory, client_id, version)
        value = value.contiguous()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with atomic_write(path) as f:
                f.write(value.view(torch.uint8).numpy().data)
        except OSError as error:
            raise _write_error(error, path, self.directory, f"the row of client {client_id}") from error
        old = self.versions.get(client_id)
        self.versions[client_id] = version
        self.crc[client_id] = _crc32(value)
        self.finite[client_id] = bool(torch.isfinite(value).all())
        if old is not None:
            _directory(self.directory).candidates.add((client_id, old))

    def manifest(self) -> dict[str, Any]:
        ids = sorted(self.versions)
        out = {"kind": "disk", "directory": self.directory, "ids": torch.tensor(ids, dtype=torch.int64),
               "versions": torch.tensor([self.versions[i] for i in ids], dtype=torch.int64)}
        if all(i in self.crc for i in ids):  # else rows of a manifest written before checksums: none recorded
            out["crc32"] = torch.tensor([self.crc[i] for i in ids], dtype=torch.int64)
            out["finite"] = torch.tensor([self.finite.get(i, True) for i in ids], dtype=torch.bool)
        return out

    def adopt(self, manifest: dict[str, Any]) -> None:
        """Point at the rows of ``manifest`` (a checkpoint's), after checking every referenced file is there.

        Raises:
            MissingClientStateError: the directory or a row file is missing, naming it and the client id.
        """
        if len(manifest["ids"]) and not os.path.isdir(self.directory):
            saved = manifest.get("saved_directory")
            also = f" (nor {saved!r}, where it was when the checkpoint was written)" if saved and saved != \
                self.directory else ""
            raise MissingClientStateError(
                f"The client-state store directory {self.directory!r} that the checkpoint references does not "
                f"exist{also} (moved or deleted?); its per-client rows cannot be restored. Restore the directory, or "
                "start a new run.")
        ids = manifest["ids"].tolist()
        versions = dict(zip(ids, manifest["versions"].tolist()))
        for client_id, version in versions.items():
            path = _row_path(self.directory, client_id, version)
            if not os.path.isfile(path) or os.path.getsize(path) != self.dim * _itemsize(self.dtype):
                raise _missing(path, client_id, self.directory)
        state = _directory(self.directory)
        state.candidates.update((i, v) for i, v in self.versions.items() if versions.get(i) != v)
        self.versions = versions
        crc, finite = manifest.get("crc32"), manifest.get("finite")
        self.crc = dict(zip(ids, crc.tolist())) if crc is not None else {}
        self.finite = dict(zip(ids, finite.tolist())) if finite is not None else {}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _missing(path: str, client_id: int, directory: str) -> MissingClientStateError:
    return MissingClientStateError(
        f"The row of client {client_id} in the client-state store {directory!r} is missing or damaged (file "
        f"{path!r}); refusing to restart that client's state at zero. Resume from a checkpoint whose rows are "
        "all there, or start a new run.")


def disk_manifests(value: Any) -> list[dict[str, Any]]:
    """The on-disk tables' manifests (``{"kind": "disk", "directory", "ids", "versions"}``, since issue #49 also
    ``"crc32"``, ``"finite"`` and, in a saved checkpoint, ``"relative"``) inside ``value`` (a checkpoint, or its
    ``"callbacks"``), found by walking dicts and lists.

    Example::

        >>> import tempfile, torch
        >>> from lightning_fed.server.client_state import ClientStateTable
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(1, torch.ones(2))
        >>> [m["ids"].tolist() for m in disk_manifests({"SCAFFOLD": {"aggregators": [{"table": table.state_dict()}]}})]
        [[1]]
    """
    found: list[dict[str, Any]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("kind") == "disk" and "directory" in item and "versions" in item:
                found.append(item)
                continue
            stack.extend(v for v in item.values() if isinstance(v, (dict, list, tuple)))
        elif isinstance(item, (list, tuple)):
            stack.extend(v for v in item if isinstance(v, (dict, list, tuple)))
    return found


def resolve_manifest_directories(checkpoint: Any, path: str) -> None:
    """Point the on-disk manifests of ``checkpoint``, loaded from the local file ``path``, at their store directory
    as seen from where the file is now: a manifest saved with ``"relative"`` (the store directory relative to the
    checkpoint's folder, recorded at save) reads the rows next to the checkpoint — a copied run folder reads its own
    copy — when that directory exists, else the absolute ``"directory"`` recorded at save (a checkpoint file copied
    alone). The recorded one is kept as ``"saved_directory"`` for the error messages. Called by
    :meth:`~lightning_fed.checkpoint.AtomicCheckpointIO.load_checkpoint`.

    Example::

        >>> manifest = {"kind": "disk", "directory": "/old/run/client_state/T", "relative": "../client_state/T",
        ...             "versions": None}
        >>> resolve_manifest_directories({"callbacks": {"S": manifest}}, "/nowhere/run/ckpt/last.ckpt")
        >>> manifest["directory"], manifest["saved_directory"]  # neither exists: the one next to the checkpoint
        ('/nowhere/run/client_state/T', '/old/run/client_state/T')
    """
    for manifest in disk_manifests(checkpoint.get("callbacks", checkpoint) if isinstance(checkpoint, dict) else
                                   checkpoint):
        relative = manifest.get("relative")
        if not isinstance(relative, str):
            continue
        here = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), relative))
        saved = manifest.setdefault("saved_directory", manifest["directory"])
        if here != saved and (os.path.isdir(here) or not os.path.isdir(saved)):
            manifest["directory"] = here


def _referenced(manifest: dict[str, Any]) -> set[tuple[int, int]]:
    return set(zip(manifest["ids"].tolist(), manifest["versions"].tolist()))


def _refs_file(directory: str, checkpoint_path: str) -> str:
    digest = hashlib.sha256(checkpoint_path.encode()).hexdigest()[:20]
    return os.path.join(directory, "refs", f"{digest}.pt")


def _write_refs(directory: str, checkpoint_path: str, refs: set[tuple[int, int]]) -> None:
    from lightning_fed.atomic_io import atomic_write

    file = _refs_file(directory, checkpoint_path)
    ids, versions = zip(*sorted(refs)) if refs else ((), ())
    try:
        os.makedirs(os.path.dirname(file), exist_ok=True)
        with atomic_write(file) as f:
            torch.save({"checkpoint": checkpoint_path, "ids": torch.tensor(ids, dtype=torch.int64),
                        "versions": torch.tensor(versions, dtype=torch.int64)}, f)
    except OSError as error:
        raise _write_error(error, file, directory, f"the references of checkpoint {checkpoint_path!r}") from error


# ------------------------------------------------------------------ checkpoints copied or moved by hand
#: What the ``.ckpt`` files seen by :func:`collect_garbage` reference, by file identity (device, inode, size,
#: modification time): ``[(recorded directory, relative directory or None, {(client, version)})]``. A file renamed
#: keeps its identity (not read again); one written, copied or changed has a new one.
_CHECKPOINT_MANIFESTS: dict[tuple[int, int, int, int], list[tuple[str, Optional[str], set]]] = {}
_UNREADABLE_WARNED: set[tuple[int, int, int, int]] = set()


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _manifest_summary(manifests: list[dict[str, Any]]) -> list[tuple[str, Optional[str], set]]:
    return [(str(m.get("saved_directory", m["directory"])), m.get("relative") if isinstance(m.get("relative"), str)
             else None, _referenced(m)) for m in manifests]


def _read_checkpoint_manifests(path: str) -> Optional[list[tuple[str, Optional[str], set]]]:
    """The manifests of the ``.ckpt`` file ``path`` (weights-only, memory-mapped: its tensors are not read), or
    ``None`` when it cannot be read that way (damaged, being copied, or not weights-only loadable)."""
    for mmap in (True, False):
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception:
            continue
        found = disk_manifests(checkpoint.get("callbacks", checkpoint) if isinstance(checkpoint, dict) else checkpoint)
        return _manifest_summary(found)
    return None


def _scan_checkpoints(state: _Directory) -> Optional[set[tuple[int, int]]]:
    """The versions of ``state``'s table that the ``.ckpt`` files in its folders reference (each file read once, see
    :data:`_CHECKPOINT_MANIFESTS`), or ``None`` when one of them cannot be read (then nothing may be deleted)."""
    found: set[tuple[int, int]] = set()
    unreadable = False
    for folder in sorted(state.folders):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith(".ckpt"):
                continue
            try:
                if not entry.is_file():
                    continue
                key = _identity(entry.stat())
            except OSError:
                continue
            summary = _CHECKPOINT_MANIFESTS.get(key)
            if summary is None:
                summary = _read_checkpoint_manifests(entry.path)
                if summary is None:
                    unreadable = True
                    if key not in _UNREADABLE_WARNED:
                        _UNREADABLE_WARNED.add(key)
                        warnings.warn(
                            f"Cannot read which client-state rows the checkpoint {entry.path!r} references (damaged, "
                            "being copied, or not loadable with weights_only=True); no row version of "
                            f"{state.path!r} is deleted while it is there.", stacklevel=2)
                    continue
                _CHECKPOINT_MANIFESTS[key] = summary
            here = os.path.dirname(entry.path)
            for directory, relative, refs in summary:
                resolved = os.path.normpath(os.path.join(here, relative)) if relative is not None else None
                if state.path in (os.path.abspath(directory), resolved):
                    found |= refs
    return None if unreadable else found


def _remember_saved(checkpoint: dict[str, Any], path: str) -> None:
    """Record what the file just written at ``path`` references, so that :func:`collect_garbage` need not read it."""
    try:
        key = _identity(os.stat(path))
    except OSError:
        return
    _CHECKPOINT_MANIFESTS[key] = _manifest_summary(disk_manifests(checkpoint.get("callbacks", {})))


def pin_checkpoint(checkpoint: dict[str, Any]) -> None:
    """Protect the rows ``checkpoint`` references from :func:`collect_garbage` until it is saved
    (:func:`checkpoint_saving`) — for good when it is saved where no refs are kept (a remote path, another
    checkpoint IO): its rows are then never deleted. Called by the checkpoint connector when a checkpoint is built."""
    for manifest in disk_manifests(checkpoint.get("callbacks", {})):
        state = _directory(manifest["directory"])
        state.refs.setdefault(("pinned", id(checkpoint)), set()).update(_referenced(manifest))


def checkpoint_saving(checkpoint: dict[str, Any], path: str) -> list[tuple[str, set]]:
    """Before ``checkpoint`` is written to ``path`` (local): record in each on-disk manifest its store directory
    relative to the checkpoint's folder (``"relative"``, see :func:`resolve_manifest_directories`), and register, in
    each on-disk table's ``refs/``, the rows it references together with those of the file it replaces (a kill
    mid-save leaves either file valid). Returns what :func:`checkpoint_saved` needs.

    Raises:
        ClientStateStoreError: ``refs/`` could not be written (e.g. a full disk), naming the file and the store.
    """
    path = os.path.abspath(path)
    done = []
    for manifest in disk_manifests(checkpoint.get("callbacks", {})):
        state = _directory(manifest["directory"])
        try:
            manifest["relative"] = os.path.relpath(state.path, os.path.dirname(path))
        except ValueError:  # another drive (Windows): only the absolute directory
            manifest.pop("relative", None)
        manifest.pop("saved_directory", None)
        state.load_refs()
        state.add_checkpoint_folder(path)
        refs = _referenced(manifest)
        _write_refs(state.path, path, refs | state.refs.get(path, set()))
        done.append((state.path, refs))
    return done


def checkpoint_saved(checkpoint: dict[str, Any], path: str, done: list[tuple[str, set]]) -> None:
    """After ``checkpoint`` was written to ``path``: its refs become exactly its rows (those only the replaced file
    referenced may go), then :func:`collect_garbage`."""
    path = os.path.abspath(path)
    if done:
        _remember_saved(checkpoint, path)
    for directory, refs in done:
        state = _directory(directory)
        old = state.refs.get(path, set())
        state.refs[path] = refs
        state.refs.pop(("pinned", id(checkpoint)), None)
        state.candidates.update(old - refs)
        _write_refs(directory, path, refs)
        collect_garbage(directory)


def checkpoint_removed(path: str) -> None:
    """After the checkpoint file ``path`` was deleted (e.g. by ``ModelCheckpoint(save_top_k=...)``): its refs go, and
    the rows only it referenced are deleted (:func:`collect_garbage`)."""
    path = os.path.abspath(path)
    for state in list(_DIRECTORIES.values()):
        if path in state.refs:
            state.candidates.update(state.refs.pop(path))
            _remove(_refs_file(state.path, path))
            collect_garbage(state.path)


def collect_garbage(directory: str) -> list[str]:
    """Delete the superseded row versions of the table in ``directory`` that neither its live table nor any checkpoint
    references; returns the deleted files. "Any checkpoint": those registered in ``refs/`` (saved by
    :class:`~lightning_fed.checkpoint.AtomicCheckpointIO`, on disk or being written) and, before anything is deleted,
    every ``.ckpt`` file in the folders of those checkpoints, in their parent folders and in the folder holding the
    store directory — a checkpoint copied or renamed by hand (``cp last.ckpt backup.ckpt``) keeps its rows. Each file
    is read once (weights-only, memory-mapped); a ``.ckpt`` that cannot be read stops the deletions (with a warning)
    while it is there. Only versions this process superseded or saw released are candidates: rows a killed process
    wrote after its last checkpoint stay (the retention, documented in docs/guide/reliability-what-is-guaranteed.md).

    Example: a row written twice; the first version, which nothing references, goes::

        >>> import tempfile, torch
        >>> from lightning_fed.server.client_state import ClientStateTable
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(0, torch.ones(2)); table.put(0, torch.zeros(2))
        >>> len(collect_garbage(table.directory)), torch.equal(table.get(0), torch.zeros(2))
        (1, True)
    """
    state = _directory(directory)
    state.load_refs()
    if state.blocked:
        state.candidates.clear()
        return []
    live = {item for table in list(state.live) for item in table.versions.items()}
    keep = set().union(*state.refs.values()) if state.refs else set()
    doomed = sorted(c for c in state.candidates if c not in live and c not in keep)
    if not doomed:
        state.candidates.clear()
        return []
    copies = _scan_checkpoints(state)
    if copies is None:  # a .ckpt that cannot be read: what it references is unknown; try again at the next one
        return []
    removed = []
    for client_id, version in doomed:
        if (client_id, version) in copies:
            continue
        path = _row_path(state.path, client_id, version)
        _remove(path)
        removed.append(path)
    state.candidates = {c for c in doomed if c in copies}  # looked at again: deleted once no copy references them
    return removed
