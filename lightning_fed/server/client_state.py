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
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

from lightning_fed.checks import check_positive_int
from lightning_fed.server.client_store_disk import (  # noqa: F401  (re-exported: this module's API)
    checkpoint_removed,
    checkpoint_saved,
    checkpoint_saving,
    ClientStateStoreError,
    collect_garbage,
    CorruptClientStateError,
    disk_manifests,
    MissingClientStateError,
    pin_checkpoint,
    resolve_manifest_directories,
    _DiskRows,
)

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
            lightning_fed.server.client_store_disk.ClientStateStoreError: [Errno 2] `client_state_dir` '/proc/no/such/dir' (the on-disk client-state store) is not writable: creating '/proc/no/such/dir' failed (...). Choose a writable `client_state_dir`, or client_state_store='memory'.
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
