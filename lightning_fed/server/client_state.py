"""The client-state table: the per-client state a server method keeps for every client of the federation.

FedAWARE's momenta m_i (Zeng et al. 2024, Alg. 1, l. 10), SCAFFOLD's control variates c_i (Karimireddy et al.
2020, Alg. 1, l. 13) and FedDyn's g_k are one flat vector of d numbers per client (d = the model's total number of
parameters, in ``module.parameters()`` order). :class:`ClientStateTable` holds them, sized by N (the number of
clients), and checkpoints them through :meth:`ClientStateTable.state_dict`.

Where the rows live is the table's **store** (:data:`CLIENT_STATE_STORES`, chosen with
``ServerOptimizer(client_state_store=...)``, :class:`ClientStateStore`):

* ``"memory"`` (default): every row is a CPU tensor; a checkpoint holds every row.
* ``"disk"``: one file per client row under a directory; RAM holds no row (a row is read when its client is in the
  cohort, written when its update reaches the server). Rows are **copy-on-write**: every write creates a new file
  ``rows/<client id mod 256, 2 hex digits>/<client id>-<version, 16 hex digits>.row`` (the raw row, written
  atomically: temporary file, ``fsync``, rename, ``fsync`` of the directory) and never changes an existing one. A
  checkpoint holds only the manifest (client id → version), so its size and save time do not grow with the table,
  and it keeps pointing at the rows of its own round however the run goes on. Versions that neither the live table
  nor any checkpoint still on disk references are deleted (:func:`collect_garbage`, at every checkpoint save or
  removal by :class:`~lightning_fed.checkpoint.AtomicCheckpointIO` and at every round start): each checkpoint
  registers the versions it references in ``refs/`` next to the rows (written before the checkpoint itself, so a
  process killed mid-save never loses a row a checkpoint on disk references; a ``refs/`` file that cannot be read
  stops the deletions in its directory).

What "any checkpoint still on disk" covers (issue #49): besides ``refs/``, before a version is deleted the ``.ckpt``
files in the folders of the table's checkpoints, their parent folders and the folder holding the store directory are
read (once each, by file identity: weights-only and memory-mapped, so the model's tensors are not read; a renamed file
keeps its identity), and a version any of them references is kept. Scanning rather than reference counting because a
copy made by hand (``cp last.ckpt backup.ckpt``) tells the store nothing: only the file itself says what it needs. It
runs only when something would be deleted, reads only files not seen before, and does not grow with the table, so a
save's time stays flat. A ``.ckpt`` there that cannot be read stops the deletions while it is there (a warning).

A manifest also holds each row's CRC-32 (checked when the row is read: :class:`CorruptClientStateError`) and whether
it is all finite (a NaN/inf row is refused at resume, as a memory table's is), and — in a saved checkpoint — the
store directory relative to the checkpoint's folder (:func:`resolve_manifest_directories`: a copied run folder reads
its own rows). A resume writes only into the run's own store (:meth:`ClientStateStore.adopt` copies the rows of a
checkpoint whose store is elsewhere). Table folders: :func:`table_folder`.

Why one file per row and version rather than one memory-mapped ``[N, d]`` file: a row is written whole and never in
place, so an older checkpoint's rows cannot change under it (a memory-mapped table written in place would need a
copy of the table per checkpoint); a write is one atomic rename; deleting a version is one ``unlink``; and nothing is
sized by N (a ``[N, d]`` map is N·d·4 bytes of address space and, on file systems without sparse files, of disk).
The disk store runs in one process (refused under DDP, where every rank applies the server update).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import warnings
import weakref
import zlib
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

from lightning_fed.checks import check_positive_int

__all__ = ["CLIENT_STATE_STORES", "ClientStateStore", "ClientStateStoreError", "ClientStateTable",
           "CorruptClientStateError", "MissingClientStateError", "check_client_state_store", "collect_garbage",
           "collect_tables_garbage", "disk_manifests", "nonfinite_disk_rows", "resolve_manifest_directories", "table_folder"]

#: The allowed values of ``client_state_store``: where a server optimizer keeps its per-client rows.
CLIENT_STATE_STORES = ("memory", "disk")


def check_client_state_store(store: Any, directory: Any = None) -> tuple[str, Optional[str]]:
    """``(store, directory)`` checked: ``store`` one of :data:`CLIENT_STATE_STORES`, ``directory`` ``None`` or a
    path (a str or :class:`os.PathLike`), and only with ``"disk"``.

    Raises:
        ValueError: naming ``client_state_store`` (and the allowed values) or ``client_state_dir``.

    Example::

        >>> check_client_state_store("disk", "/tmp/x")
        ('disk', '/tmp/x')
        >>> check_client_state_store("ssd")
        Traceback (most recent call last):
        ...
        ValueError: `client_state_store` must be one of ('memory', 'disk'), got 'ssd'.
    """
    if not isinstance(store, str) or store not in CLIENT_STATE_STORES:
        raise ValueError(f"`client_state_store` must be one of {CLIENT_STATE_STORES}, got {store!r}.")
    if directory is not None:
        if not isinstance(directory, (str, os.PathLike)) or not str(os.fspath(directory)):
            raise ValueError(f"`client_state_dir` must be a directory path or None, got {directory!r}.")
        if store != "disk":
            raise ValueError(f"`client_state_dir`={str(directory)!r} needs client_state_store='disk', got {store!r}.")
        directory = os.fspath(directory)
    return store, directory


class MissingClientStateError(FileNotFoundError):
    """A checkpoint references a row of an on-disk client-state store that is not there (the store directory was
    moved or deleted, or the row file removed): the resume is refused rather than restarting that client at zero.

    Example::

        >>> import tempfile, torch
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(1, torch.ones(2))
        >>> saved = table.state_dict()
        >>> os.remove(table._disk.path(1))
        >>> ClientStateTable.from_state_dict(saved)
        Traceback (most recent call last):
        ...
        lightning_fed.server.client_state.MissingClientStateError: The row of client 1 in the client-state store '...' is missing or damaged (file '...-....row'); refusing to restart that client's state at zero. Resume from a checkpoint whose rows are all there, or start a new run.
    """


class CorruptClientStateError(MissingClientStateError):
    """A row file of an on-disk client-state store whose bytes differ from those written (its CRC-32 is not the one
    the manifest recorded: flipped bits, a file overwritten by hand): refused when the row is read, naming the file
    and the client, rather than resuming that client from other numbers.

    Example::

        >>> import tempfile, torch
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(1, torch.ones(2))
        >>> with open(table._disk.path(1), "r+b") as f:
        ...     _ = f.write(b"\\x01")  # one byte changed
        >>> table.get(1)
        Traceback (most recent call last):
        ...
        lightning_fed.server.client_state.CorruptClientStateError: The row of client 1 in the client-state store '...' is damaged (file '...-....row': CRC-32 ... but ... was recorded when it was written); refusing to resume that client from other numbers. Resume from an earlier checkpoint, or start a new run.
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


#: State keys kept as folder names as they are: no ``-``, not starting with ``.``, at most 100 characters. Every other
#: key gets ``<key with the other characters as "_", 64 at most>-<first 16 hex digits of the key's SHA-256>``.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,99}")


def table_folder(name: str) -> str:
    """The folder name of table ``name`` (a state key such as ``"ScaffoldControl"`` or ``"FedProxClient{mu=0.1}"``)
    inside the store directory: injective and never outside it.

    A key of letters, digits, ``_`` and ``.`` (not first), at most 100 characters, is its own folder name (today's
    names: ``ScaffoldControl``, ``FedDynClient``); any other key (``-``, ``/``, ``{``, spaces, ``..``, the empty key,
    a long key) is escaped and followed by ``-`` and 16 hex digits of the SHA-256 of the exact key. The two forms do
    not meet (only the second holds ``-``), and two escaped keys share a folder only if their SHA-256 prefixes
    collide. Stores written before this mapping (``re.sub(r"[^A-Za-z0-9_.-]", "_", key)``) are still read: a
    checkpoint names its directory; a resume copies the rows into the new folder.

    Example::

        >>> table_folder("ScaffoldControl"), table_folder("a b"), table_folder("a_b")
        ('ScaffoldControl', 'a_b-c8687a08aa5d6ed2', 'a_b')
        >>> table_folder(".."), table_folder("")
        ('_..-5ec1f7e700f37c3d', '_-e3b0c44298fc1c14')
    """
    if not isinstance(name, str):
        raise ValueError(f"A client-state table name must be a str, got {name!r}.")
    if _PLAIN_KEY.fullmatch(name):
        return name
    escaped = re.sub(r"[^A-Za-z0-9_.]", "_", name)[:64]
    if not escaped or escaped.startswith("."):
        escaped = "_" + escaped
    return f"{escaped}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


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


def nonfinite_disk_rows(state_dict: Any) -> list[tuple[int, Tensor]]:
    """``(client id, row)`` of the rows an on-disk table's state dict (:meth:`ClientStateTable.state_dict`) records
    as holding a NaN or ±inf when they were written — read from their files, only those — for the resume check that
    refuses non-finite server state as it refuses a memory table's rows; ``[]`` for anything else (a memory state
    dict, a manifest written before the flags).

    Example::

        >>> import tempfile, torch
        >>> table = ClientStateTable(num_clients=3, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(0, torch.ones(2)); table.put(2, torch.tensor([1.0, float("nan")]))
        >>> [(i, row.tolist()) for i, row in nonfinite_disk_rows(table.state_dict())]
        [(2, [1.0, nan])]
    """
    store = state_dict.get("store") if isinstance(state_dict, dict) else None
    if not isinstance(store, dict) or store.get("kind") != "disk" or store.get("finite") is None:
        return []
    flags = store["finite"].tolist()
    if all(flags):
        return []
    table = ClientStateTable.from_state_dict(state_dict)
    return [(i, table.get(i)) for i, ok in zip(store["ids"].tolist(), flags) if not ok]


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


def collect_tables_garbage(values: Iterable[Any]) -> None:
    """:func:`collect_garbage` in the directory of every on-disk :class:`ClientStateTable` among ``values`` (each
    directory once; other values, ``None`` and in-memory tables are skipped): what the server optimizer runs at every
    round start under ``client_state_store="disk"``, over its client halves', its stages' and its own tables.

    Example: the first version of a row written twice goes, an in-memory table and ``None`` are skipped::

        >>> import glob, os, tempfile, torch
        >>> table = ClientStateTable(num_clients=2, dim=2, directory=tempfile.mkdtemp())
        >>> table.put(0, torch.ones(2)); table.put(0, torch.zeros(2))
        >>> row_files = lambda: len(glob.glob(os.path.join(table.directory, "rows", "*", "*.row")))
        >>> row_files()
        2
        >>> collect_tables_garbage([table, ClientStateTable(num_clients=2, dim=2), None, table])
        >>> row_files(), torch.equal(table.get(0), torch.zeros(2))
        (1, True)
    """
    for directory in {v.directory for v in values if isinstance(v, ClientStateTable) and v.directory is not None}:
        collect_garbage(directory)


# ---------------------------------------------------------------------------------------------- the table
class ClientStateTable:
    """One flat vector of ``dim`` numbers per client, for the N clients ``0 … num_clients − 1``.

    A row never written reads as zeros (:meth:`get`) and is not :meth:`present`. Two layouts:

    * ``dense=True``: one ``[N, dim]`` tensor allocated up front (:attr:`matrix`), for methods that compute over all
      rows at once (FedAWARE's Gram matrix). Memory N·dim·(4 B for float32) from the start. In memory only.
    * ``dense=False`` (default): a row is created at its client's first write; memory grows with the clients seen,
      up to the same N·dim once all have been (SCAFFOLD's c_i, FedDyn's g_k) — or, with ``directory``, the rows are
      files on disk (one per client and version, see the module docstring) and RAM holds none of them.

    Rows are copied to the CPU in the table's dtype on write. Under ``dense=False`` :meth:`put` stores a new tensor
    or a new file (never writes in place), so a :meth:`state_dict` handed out earlier keeps its values.

    Args:
        num_clients: N (an integer ≥ 1).
        dim: d, the length of every row (an integer ≥ 1).
        dtype: The rows' floating dtype (default ``torch.float32``).
        dense: The layout (default ``False``, see above).
        directory: ``None`` (default): rows in memory; a directory: rows on disk there (created when the first row
            is written; ``dense=False`` only).

    Raises:
        ValueError: ``num_clients`` or ``dim`` not an integer ≥ 1, ``dtype`` not a floating dtype, ``directory``
            with ``dense=True``; at use: a client id outside [0, N) (the message names it), a row of the wrong
            length, a state dict of another N or d.
        MissingClientStateError: loading a state dict whose on-disk rows are not there (naming the file and client).

    Example::

        >>> import torch
        >>> table = ClientStateTable(num_clients=3, dim=2)
        >>> table.put(2, torch.tensor([1.0, -2.0]))
        >>> table.get(2), table.get(0), table.present.tolist()
        (tensor([ 1., -2.]), tensor([0., 0.]), [False, False, True])
        >>> ClientStateTable.from_state_dict(table.state_dict()).ids()
        [2]
        >>> table.get(3)
        Traceback (most recent call last):
        ...
        ValueError: client id 3 is outside [0, 3) (num_clients=3).

    On disk, a checkpoint holds the manifest (client → version), not the rows::

        >>> import tempfile
        >>> disk = ClientStateTable(num_clients=3, dim=2, directory=tempfile.mkdtemp())
        >>> disk.put(1, torch.tensor([0.5, 4.0]))
        >>> saved = disk.state_dict()
        >>> "rows" in saved, saved["store"]["ids"].tolist()
        (False, [1])
        >>> disk.put(1, torch.tensor([7.0, 7.0]))  # a new version; the saved manifest still reads the old one
        >>> ClientStateTable.from_state_dict(saved).get(1)
        tensor([0.5000, 4.0000])
    """

    def __init__(self, num_clients: int, dim: int, dtype: torch.dtype = torch.float32, dense: bool = False,
                 directory: Optional[str] = None, _allocate: bool = True) -> None:
        for name, value in (("num_clients", num_clients), ("dim", dim)):
            check_positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"`dtype` must be a floating torch.dtype, got {dtype!r}.")
        if not isinstance(dense, bool):
            raise ValueError(f"`dense` must be a bool, got {dense!r}.")
        if dense and directory is not None:
            raise ValueError("A dense ClientStateTable (all rows at once) is held in memory; `directory` needs "
                             "dense=False.")
        self.num_clients, self.dim, self.dtype, self.dense = num_clients, dim, dtype, dense
        self._present = torch.zeros(num_clients, dtype=torch.bool)
        self._matrix: Optional[Tensor] = torch.zeros(num_clients, dim, dtype=dtype) if dense and _allocate else None
        self._rows: dict[int, Tensor] = {}
        self._disk: Optional[_DiskRows] = None if directory is None else _DiskRows(directory, dim, dtype)

    @property
    def store(self) -> str:
        """Where the rows live: ``"memory"`` or ``"disk"`` (:data:`CLIENT_STATE_STORES`)."""
        return "memory" if self._disk is None else "disk"

    @property
    def directory(self) -> Optional[str]:
        """The rows' directory (absolute) under the ``"disk"`` store, else ``None``."""
        return None if self._disk is None else self._disk.directory

    # ------------------------------------------------------------------ ids
    def check_ids(self, ids: Iterable[int], unique: bool = False) -> list[int]:
        """``ids`` as Python ints, checked to lie in [0, N) (and, with ``unique``, to be distinct).

        Raises:
            ValueError: naming the ids outside [0, N), or the repeated ones.
        """
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.num_clients]
        if bad:
            what = f"client id {bad[0]} is" if len(bad) == 1 else f"client ids {bad} are"
            raise ValueError(f"{what} outside [0, {self.num_clients}) (num_clients={self.num_clients}).")
        if unique and len(set(ids)) != len(ids):
            raise ValueError(f"A client appears more than once: ids {ids}.")
        return ids

    @property
    def present(self) -> Tensor:
        """bool ``[N]``: whether client i's row has been written (the tensor itself)."""
        return self._present

    def ids(self) -> list[int]:
        """The clients whose rows have been written, ascending."""
        return torch.nonzero(self._present).flatten().tolist()

    def __contains__(self, client_id: int) -> bool:
        return bool(self._present[self.check_ids([client_id])[0]])

    def __len__(self) -> int:
        return int(self._present.sum())

    # ------------------------------------------------------------------ rows
    @property
    def matrix(self) -> Tensor:
        """The ``[N, dim]`` table itself (``dense=True`` only; rows never written are zero).

        Raises:
            RuntimeError: a ``dense=False`` table.
        """
        if self._matrix is None:
            raise RuntimeError("ClientStateTable.matrix needs dense=True; this table creates rows lazily.")
        return self._matrix

    def get(self, client_id: int) -> Tensor:
        """Client ``client_id``'s row, ``[dim]`` (the stored tensor — on disk, read from its file —, or new zeros
        if never written)."""
        (i,) = self.check_ids([client_id])
        if self._matrix is not None:
            return self._matrix[i]
        if self._disk is not None:
            return self._disk.read(i) if bool(self._present[i]) else torch.zeros(self.dim, dtype=self.dtype)
        row = self._rows.get(i)
        return torch.zeros(self.dim, dtype=self.dtype) if row is None else row

    def gather(self, ids: Iterable[int]) -> Tensor:
        """The rows of ``ids`` stacked, ``[len(ids), dim]`` (a new tensor)."""
        ids = self.check_ids(ids)
        if self._matrix is not None:
            return self._matrix.index_select(0, torch.tensor(ids, dtype=torch.long))
        return torch.stack([self.get(i) for i in ids]) if ids else torch.zeros(0, self.dim, dtype=self.dtype)

    def _row(self, value: Tensor) -> Tensor:
        value = value.detach().to(device="cpu", dtype=self.dtype)
        if tuple(value.shape) != (self.dim,):
            raise ValueError(f"A client-state row must have shape ({self.dim},), got {tuple(value.shape)}.")
        return value

    def put(self, client_id: int, value: Tensor) -> None:
        """Set client ``client_id``'s row to ``value`` (``[dim]``, any device; stored on the CPU in :attr:`dtype`,
        or written to a new file under the ``"disk"`` store)."""
        (i,) = self.check_ids([client_id])
        value = self._row(value)
        if self._matrix is not None:
            self._matrix[i].copy_(value)
        elif self._disk is not None:
            self._disk.write(i, value)
        else:
            self._rows[i] = value
        self._present[i] = True

    def scatter(self, ids: Iterable[int], values: Tensor) -> None:
        """Set the rows of ``ids`` (distinct) to ``values`` (``[len(ids), dim]``)."""
        ids = self.check_ids(ids, unique=True)
        if self._matrix is not None:
            if tuple(values.shape) != (len(ids), self.dim):
                raise ValueError(f"Expected rows of shape ({len(ids)}, {self.dim}), got {tuple(values.shape)}.")
            rows = torch.tensor(ids, dtype=torch.long)
            self._matrix.index_copy_(0, rows, values.detach().to(device="cpu", dtype=self.dtype))
            self._present[rows] = True
            return
        for i, value in zip(ids, values):
            self.put(i, value)

    def rows(self) -> dict[int, Tensor]:
        """``{client id: row}`` for the clients written so far (the stored tensors; views of :attr:`matrix` if dense;
        every row read from its file under the ``"disk"`` store)."""
        return {i: self.get(i) for i in self.ids()}

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """``{"num_clients", "dim", "dense", "dtype" (e.g. ``"float32"``), "present": bool [N], "rows": [N, dim]
        tensor (dense) or {client id: [dim] tensor}}`` in memory; on disk ``"store"``: ``{"kind": "disk",
        "directory", "ids": int64 [k], "versions": int64 [k]}`` (the manifest) instead of ``"rows"``. Tensors, ints,
        bools and strings only (loadable with ``weights_only=True``)."""
        out = {"num_clients": self.num_clients, "dim": self.dim, "dense": self.dense,
               "dtype": str(self.dtype).removeprefix("torch."), "present": self._present.clone()}
        if self._disk is not None:
            out["store"] = self._disk.manifest()
        else:
            out["rows"] = self._matrix.clone() if self._matrix is not None else dict(self._rows)
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the rows, without copying them: a memory table takes the state dict's CPU tensors of its dtype
        as they are (its rows are never written in place, so they may be shared; a dense table copies them into
        :attr:`matrix`), a disk table points at the manifest's row files (a memory state dict is written to disk
        row by row; a disk one into a memory table is read row by row).

        Raises:
            ValueError: the state dict is for another N or d.
            MissingClientStateError: a disk manifest's directory or row file is missing (naming it and the client).
        """
        for name in ("num_clients", "dim"):
            if int(state_dict[name]) != getattr(self, name):
                raise ValueError(
                    f"The client-state checkpoint has {name}={int(state_dict[name])}, but this table has "
                    f"{name}={getattr(self, name)}."
                )
        self._present.zero_()
        self._rows = {}
        if self._matrix is not None:
            self._matrix.zero_()
        store = state_dict.get("store")
        if isinstance(store, dict) and store.get("kind") == "disk":
            source = _DiskRows(store["directory"], self.dim, self.dtype)
            if self._disk is not None and self._disk.directory == source.directory:
                self._disk.adopt(store)
            else:
                source.adopt(store)
                for i in source.versions:
                    self.put(i, source.read(i))
            self._present[list(source.versions) if self._disk is None else list(self._disk.versions)] = True
            return
        if self._disk is not None:
            self._disk.versions = {}
        rows = state_dict["rows"]
        if isinstance(rows, dict):
            for i, value in rows.items():
                self.put(int(i), value)
            return
        present = state_dict.get("present")
        ids = list(range(self.num_clients)) if present is None else torch.nonzero(present).flatten().tolist()
        if self.dense:
            if self._matrix is None:  # built by from_state_dict: take the saved matrix itself (no second copy)
                self._matrix = self._row_matrix(rows)
            else:
                self._matrix.copy_(rows.detach().cpu().to(self.dtype))
            self._present[ids] = True
        else:
            for i in ids:
                self.put(i, rows[i])

    def _row_matrix(self, rows: Tensor) -> Tensor:
        rows = rows.detach().to(device="cpu", dtype=self.dtype)
        if tuple(rows.shape) != (self.num_clients, self.dim):
            raise ValueError(f"A dense client-state table must have shape ({self.num_clients}, {self.dim}), got "
                             f"{tuple(rows.shape)}.")
        return rows if rows.is_contiguous() else rows.contiguous()

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> "ClientStateTable":
        """A table built from :meth:`state_dict`'s output (N, d, layout, dtype and store from the checkpoint; the
        rows not copied, see :meth:`load_state_dict`)."""
        rows = state_dict.get("rows")
        dtype = getattr(torch, state_dict["dtype"]) if "dtype" in state_dict else (
            rows.dtype if isinstance(rows, Tensor) else next(iter(rows.values())).dtype if rows else torch.float32
        )
        store = state_dict.get("store")
        directory = store["directory"] if isinstance(store, dict) and store.get("kind") == "disk" else None
        dense = bool(state_dict.get("dense", not isinstance(rows, dict)))
        table = cls(int(state_dict["num_clients"]), int(state_dict["dim"]), dtype=dtype, dense=dense,
                    directory=directory, _allocate=False)
        table.load_state_dict(state_dict)
        return table

    def __repr__(self) -> str:
        where = "" if self._disk is None else f", directory={self._disk.directory!r}"
        return (f"ClientStateTable(num_clients={self.num_clients}, dim={self.dim}, dtype={self.dtype}, "
                f"dense={self.dense}, written={len(self)}{where})")


class ClientStateStore:
    """Where a server optimizer's per-client tables keep their rows: ``ServerOptimizer(client_state_store=...,
    client_state_dir=...)`` resolved at fit start.

    Args:
        kind: ``"memory"`` (default) or ``"disk"`` (:data:`CLIENT_STATE_STORES`).
        directory: the ``"disk"`` store's directory; each table gets its own sub-directory named after it
            (``"ScaffoldControl"``, a client half's ``state_key``). ``None``: ``<default_root_dir>/client_state``
            (resolved by the server optimizer at fit start).

    Raises:
        ValueError: as :func:`check_client_state_store`; :meth:`table` of a ``"disk"`` store without a directory.

    Example::

        >>> import tempfile
        >>> ClientStateStore().table("ScaffoldControl", 4, 3).store
        'memory'
        >>> ClientStateStore("disk", tempfile.mkdtemp()).table("ScaffoldControl", 4, 3).store
        'disk'
    """

    def __init__(self, kind: str = "memory", directory: Optional[str] = None) -> None:
        self.kind, directory = check_client_state_store(kind, None)[0], directory
        self.directory = None if directory is None else os.path.abspath(os.fspath(directory))

    def table_directory(self, name: str) -> Optional[str]:
        """The directory of table ``name`` (``None`` in memory): ``<directory>/<table_folder(name)>``
        (:func:`table_folder`: one folder per name, always inside :attr:`directory`)."""
        if self.kind == "memory":
            return None
        if self.directory is None:
            raise ValueError("client_state_store='disk' needs a directory (`client_state_dir`), resolved at fit start.")
        return os.path.join(self.directory, table_folder(name))

    def table(self, name: str, num_clients: int, dim: int, dtype: torch.dtype = torch.float32) -> ClientStateTable:
        """A new lazily filled table (``dense=False``) named ``name`` in this store."""
        return ClientStateTable(num_clients, dim, dtype=dtype, directory=self.table_directory(name))

    def adopt(self, name: str, table: Optional[ClientStateTable]) -> Optional[ClientStateTable]:
        """``table`` (e.g. loaded from a checkpoint) in this store: itself when it is already in it (a disk table
        in this table's directory, :meth:`table_directory`), else a copy moved row by row (memory → disk writes each
        row once; disk → memory reads each; a disk table in another directory — a resume with another
        ``client_state_dir``, a checkpoint whose store is elsewhere — is copied into this one: the run writes only
        into its own store, the other directory is left as it is). Dense tables and ``None`` are returned as they
        are.

        Raises:
            MissingClientStateError: a row to copy is missing or damaged (naming the file and the client).
        """
        if table is None or table.dense or (table.store == self.kind and (
                self.directory is None or table.directory == self.table_directory(name))):
            return table
        moved = self.table(name, table.num_clients, table.dim, table.dtype)
        for i in table.ids():
            moved.put(i, table.get(i))
        return moved

    def check_writable(self, argument: str = "client_state_dir") -> None:
        """Under ``"disk"``: create :attr:`directory` and write, ``fsync`` and delete a file in it and in every table
        directory already there — at fit start, before any client trains. Nothing under ``"memory"``.

        Raises:
            ClientStateStoreError: a directory that cannot be created or written (read-only, no permission, full),
                naming ``argument`` (the setting that chose it), the directory and the file tried.

        Example::

            >>> import tempfile
            >>> ClientStateStore("disk", tempfile.mkdtemp()).check_writable()
            >>> ClientStateStore("disk", "/proc/no/such/dir").check_writable()
            Traceback (most recent call last):
            ...
            lightning_fed.server.client_state.ClientStateStoreError: [Errno 2] `client_state_dir` '/proc/no/such/dir' (the on-disk client-state store) is not writable: creating '/proc/no/such/dir' failed (...). Choose a writable `client_state_dir`, or client_state_store='memory'.
        """
        if self.kind != "disk" or self.directory is None:
            return
        from lightning_fed.atomic_io import atomic_write

        def refuse(error: OSError, what: str) -> ClientStateStoreError:
            return ClientStateStoreError(
                error.errno, f"`{argument}` {self.directory!r} (the on-disk client-state store) is not writable: "
                f"{what} failed ({os.strerror(error.errno) if error.errno else error}). Choose a writable "
                f"`{argument}`, or client_state_store='memory'.")

        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            raise refuse(error, f"creating {self.directory!r}") from error
        folders = [self.directory] + sorted(
            entry.path for entry in os.scandir(self.directory) if entry.is_dir(follow_symlinks=False))
        for folder in folders:
            probe = os.path.join(folder, f".writable-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                with atomic_write(probe) as f:
                    f.write(b"\0")
                os.unlink(probe)
            except OSError as error:
                with contextlib.suppress(OSError):
                    os.unlink(probe)
                raise refuse(error, f"writing {probe!r}") from error

    def __repr__(self) -> str:
        return f"ClientStateStore({self.kind!r}, {self.directory!r})"
