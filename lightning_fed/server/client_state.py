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

Why one file per row and version rather than one memory-mapped ``[N, d]`` file: a row is written whole and never in
place, so an older checkpoint's rows cannot change under it (a memory-mapped table written in place would need a
copy of the table per checkpoint); a write is one atomic rename; deleting a version is one ``unlink``; and nothing is
sized by N (a ``[N, d]`` map is N·d·4 bytes of address space and, on file systems without sparse files, of disk).
The disk store runs in one process (refused under DDP, where every rank applies the server update).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import weakref
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

__all__ = ["CLIENT_STATE_STORES", "ClientStateStore", "ClientStateTable", "MissingClientStateError",
           "check_client_state_store", "collect_garbage", "disk_manifests"]

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


# ---------------------------------------------------------------------------------------------- on-disk rows
class _Directory:
    """What this process knows about one on-disk table directory: the versions each checkpoint references
    (``refs``, by checkpoint path; by ``("pinned", id)`` for a checkpoint built, not yet saved), the superseded
    versions that may be
    deleted (``candidates``) and the table objects open on it (``live``: their versions are never deleted)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.refs: dict[Any, set[tuple[int, int]]] = {}
        self.candidates: set[tuple[int, int]] = set()
        self.live: "weakref.WeakSet[_DiskRows]" = weakref.WeakSet()  # every table object open on it
        self.loaded = False
        self.blocked = False  # a refs file could not be read: what it protects is unknown, so nothing is deleted

    def load_refs(self) -> None:
        """Read ``refs/`` once: the versions the checkpoints of earlier processes reference (refs of checkpoints
        that no longer exist are dropped)."""
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


class _DiskRows:
    """The rows of one table in ``directory``, one file per client and version (see the module docstring)."""

    def __init__(self, directory: str, dim: int, dtype: torch.dtype) -> None:
        self.directory = os.path.abspath(directory)
        self.dim, self.dtype = dim, dtype
        self.versions: dict[int, int] = {}
        _directory(self.directory).live.add(self)

    def path(self, client_id: int) -> str:
        return _row_path(self.directory, client_id, self.versions[client_id])

    def read(self, client_id: int) -> Tensor:
        path = self.path(client_id)
        try:
            return torch.from_file(path, shared=False, size=self.dim, dtype=self.dtype)
        except (RuntimeError, OSError) as error:
            raise _missing(path, client_id, self.directory) from error

    def write(self, client_id: int, value: Tensor) -> None:
        from lightning_fed.atomic_io import atomic_write

        version = secrets.randbits(63)
        path = _row_path(self.directory, client_id, version)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = value.contiguous().view(torch.uint8).numpy()
        with atomic_write(path) as f:
            f.write(data.data)
        old = self.versions.get(client_id)
        self.versions[client_id] = version
        if old is not None:
            _directory(self.directory).candidates.add((client_id, old))

    def manifest(self) -> dict[str, Any]:
        ids = sorted(self.versions)
        return {"kind": "disk", "directory": self.directory, "ids": torch.tensor(ids, dtype=torch.int64),
                "versions": torch.tensor([self.versions[i] for i in ids], dtype=torch.int64)}

    def adopt(self, manifest: dict[str, Any]) -> None:
        """Point at the rows of ``manifest`` (a checkpoint's), after checking every referenced file is there.

        Raises:
            MissingClientStateError: the directory or a row file is missing, naming it and the client id.
        """
        if len(manifest["ids"]) and not os.path.isdir(self.directory):
            raise MissingClientStateError(
                f"The client-state store directory {self.directory!r} that the checkpoint references does not "
                "exist (moved or deleted?); its per-client rows cannot be restored. Restore the directory, or start "
                "a new run.")
        versions = dict(zip(manifest["ids"].tolist(), manifest["versions"].tolist()))
        for client_id, version in versions.items():
            path = _row_path(self.directory, client_id, version)
            if not os.path.isfile(path) or os.path.getsize(path) != self.dim * _itemsize(self.dtype):
                raise _missing(path, client_id, self.directory)
        state = _directory(self.directory)
        state.candidates.update((i, v) for i, v in self.versions.items() if versions.get(i) != v)
        self.versions = versions


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _missing(path: str, client_id: int, directory: str) -> MissingClientStateError:
    return MissingClientStateError(
        f"The row of client {client_id} in the client-state store {directory!r} is missing or damaged (file "
        f"{path!r}); refusing to restart that client's state at zero. Resume from a checkpoint whose rows are "
        "all there, or start a new run.")


def disk_manifests(value: Any) -> list[dict[str, Any]]:
    """The on-disk tables' manifests (``{"kind": "disk", "directory", "ids", "versions"}``) inside ``value`` (a
    checkpoint, or its ``"callbacks"``), found by walking dicts and lists.

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


def _referenced(manifest: dict[str, Any]) -> set[tuple[int, int]]:
    return set(zip(manifest["ids"].tolist(), manifest["versions"].tolist()))


def _refs_file(directory: str, checkpoint_path: str) -> str:
    digest = hashlib.sha256(checkpoint_path.encode()).hexdigest()[:20]
    return os.path.join(directory, "refs", f"{digest}.pt")


def _write_refs(directory: str, checkpoint_path: str, refs: set[tuple[int, int]]) -> None:
    from lightning_fed.atomic_io import atomic_write

    file = _refs_file(directory, checkpoint_path)
    os.makedirs(os.path.dirname(file), exist_ok=True)
    ids, versions = zip(*sorted(refs)) if refs else ((), ())
    with atomic_write(file) as f:
        torch.save({"checkpoint": checkpoint_path, "ids": torch.tensor(ids, dtype=torch.int64),
                    "versions": torch.tensor(versions, dtype=torch.int64)}, f)


def pin_checkpoint(checkpoint: dict[str, Any]) -> None:
    """Protect the rows ``checkpoint`` references from :func:`collect_garbage` until it is saved
    (:func:`checkpoint_saving`) — for good when it is saved where no refs are kept (a remote path, another
    checkpoint IO): its rows are then never deleted. Called by the checkpoint connector when a checkpoint is built."""
    for manifest in disk_manifests(checkpoint.get("callbacks", {})):
        state = _directory(manifest["directory"])
        state.refs.setdefault(("pinned", id(checkpoint)), set()).update(_referenced(manifest))


def checkpoint_saving(checkpoint: dict[str, Any], path: str) -> list[tuple[str, set]]:
    """Before ``checkpoint`` is written to ``path`` (local): register, in each on-disk table's ``refs/``, the rows it
    references together with those of the file it replaces (a kill mid-save leaves either file valid). Returns
    what :func:`checkpoint_saved` needs."""
    path = os.path.abspath(path)
    done = []
    for manifest in disk_manifests(checkpoint.get("callbacks", {})):
        state = _directory(manifest["directory"])
        state.load_refs()
        refs = _referenced(manifest)
        _write_refs(state.path, path, refs | state.refs.get(path, set()))
        done.append((state.path, refs))
    return done


def checkpoint_saved(checkpoint: dict[str, Any], path: str, done: list[tuple[str, set]]) -> None:
    """After ``checkpoint`` was written to ``path``: its refs become exactly its rows (those only the replaced file
    referenced may go), then :func:`collect_garbage`."""
    path = os.path.abspath(path)
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
    (on disk, or being written) references; returns the deleted files. Only versions this process superseded or saw
    released are candidates: rows a killed process wrote after its last checkpoint stay (the retention, documented in
    the README).

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
    removed = []
    for client_id, version in sorted(state.candidates):
        if (client_id, version) in live or (client_id, version) in keep:
            continue
        path = _row_path(state.path, client_id, version)
        _remove(path)
        removed.append(path)
    state.candidates.clear()
    return removed


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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
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
        """The directory of table ``name`` (``None`` in memory)."""
        if self.kind == "memory":
            return None
        if self.directory is None:
            raise ValueError("client_state_store='disk' needs a directory (`client_state_dir`), resolved at fit start.")
        return os.path.join(self.directory, re.sub(r"[^A-Za-z0-9_.-]", "_", name))

    def table(self, name: str, num_clients: int, dim: int, dtype: torch.dtype = torch.float32) -> ClientStateTable:
        """A new lazily filled table (``dense=False``) named ``name`` in this store."""
        return ClientStateTable(num_clients, dim, dtype=dtype, directory=self.table_directory(name))

    def adopt(self, name: str, table: Optional[ClientStateTable]) -> Optional[ClientStateTable]:
        """``table`` (e.g. loaded from a checkpoint) in this store: itself when it is already in it (a disk table
        keeps the directory its checkpoint references), else a copy moved row by row (memory → disk writes each
        row once; disk → memory reads each). Dense tables and ``None`` are returned as they are."""
        if table is None or table.dense or table.store == self.kind:
            return table
        moved = self.table(name, table.num_clients, table.dim, table.dtype)
        for i in table.ids():
            moved.put(i, table.get(i))
        return moved

    def __repr__(self) -> str:
        return f"ClientStateStore({self.kind!r}, {self.directory!r})"
