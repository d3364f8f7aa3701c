"""Ranks on one host exchange their packed round updates through shared memory instead of the process group.

Under gloo, an ``all_gather`` of the ranks' packed updates (:func:`~lightning_fed.client.distributed.gather_updates`)
copies every byte through the loopback TCP stack: about 27 ms a round for five FedAwareCNN updates (11.6 MB) per
rank on two CPU processes, where the clients' training takes about 425 ms (issue #33.4). When every rank runs on
the same host, each rank instead writes its packed buffer into its own file in ``/dev/shm`` (a ``tmpfs``: memory,
not disk), and the others map that file and read it: one memory copy per reader. The ``all_gather`` of the buffers'
sizes, which :func:`gather_updates` does anyway, is the only collective left, and it orders the accesses: every
rank has written before any rank reads. The bytes read are the bytes written, so the gathered updates are the same
bit for bit.

Two segments per rank, used by alternate writes: a rank rewrites a segment at the earliest two gathers later, after
the size ``all_gather`` of the gather in between, which no rank passes before it has finished reading. A segment grows (a
new file, twice the size, the old one unlinked) when a round's buffer does not fit; its generation number travels
with the sizes, so readers map the current file. Space is reserved with ``posix_fallocate`` before any write (a
full ``tmpfs`` is an ``OSError`` there, never a ``SIGBUS`` later); a rank that cannot reserve it says so in the same
collective and that round falls back to the process group's ``all_gather`` on every rank.

Whether the exchange can be used is decided once per process group, by every rank together
(:func:`host_exchange`): each rank writes a probe file; it can only if every rank can read every other rank's
probe (the same host, and the same ``/dev/shm``: not containers with private ones). A round uses it when every
rank wrote its segment (``shared_memory=True`` and room in ``/dev/shm`` on every rank). Files are named
``lightning_fed-<random>-r<rank>-p<parity>-g<generation>`` and removed by :func:`close_host_exchanges` (the
strategy's ``teardown``) or at interpreter exit — and, so that a killed process leaves nothing behind, each file is
unlinked as soon as every peer has mapped it (a segment is then used through the mappings alone, which the kernel
frees when the processes end).
"""

from __future__ import annotations

import atexit
import os
import secrets
import weakref
from typing import Any, Optional

import torch
import torch.distributed as dist

#: Where the segments live (a tmpfs on Linux); without it the exchange is not used.
SHM_DIR = "/dev/shm"
_MIN_SEGMENT = 1 << 20


class HostExchange:
    """One rank's shared-memory segments and its mappings of the other ranks' segments (one process group).

    Args:
        prefix: The file name prefix shared by the group's ranks (``lightning_fed-<random>``).
        rank: This process's rank.
        directory: Where the files are (default :data:`SHM_DIR`).

    Example: a "rank" writes a buffer and another mapping reads it back (within one process here)::

        >>> import tempfile, torch
        >>> from lightning_fed.client.distributed import pack_updates, unpack_updates
        >>> from lightning_fed.client.update import ClientUpdate
        >>> folder = tempfile.mkdtemp()
        >>> writer, reader = HostExchange("demo", 0, folder), HostExchange("demo", 1, folder)
        >>> packed = pack_updates([ClientUpdate(client_id=4, delta=[torch.tensor([1.5, -2.0])], num_samples=3,
        ...                                     num_steps=1, loss=0.5)], failures=[])
        >>> parity, generation = writer.write(packed)
        >>> buffer = reader.read(0, parity, generation, packed.total_bytes)
        >>> (update,), _ = unpack_updates(buffer, len(packed.meta), torch.device("cpu"))
        >>> update.client_id, update.delta[0].tolist()
        (4, [1.5, -2.0])
        >>> writer.close(); reader.close()
    """

    def __init__(self, prefix: str, rank: int, directory: str = SHM_DIR) -> None:
        self.prefix, self.rank, self.directory = prefix, rank, directory
        self._own: dict[int, tuple[int, int, torch.Tensor]] = {}  # parity -> (generation, bytes, mapping)
        self._peers: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}  # (rank, parity) -> (generation, mapping)
        self._calls = 0
        self._generation = 0
        self._unread: dict[int, str] = {}  # parity -> this rank's file that no peer has mapped yet
        self._written: Optional[int] = None  # the parity written by the current gather
        self._mapped: list[str] = []  # files every peer has mapped: unlinked at the next gather
        atexit.register(self.close)

    def path(self, rank: int, parity: int, generation: int) -> str:
        """The file of ``rank``'s segment ``parity`` (0 or 1) at ``generation``."""
        return os.path.join(self.directory, f"{self.prefix}-r{rank}-p{parity}-g{generation}")

    def write(self, packed: Any) -> Optional[tuple[int, int]]:
        """Write ``packed`` (a :class:`~lightning_fed.client.distributed.PackedUpdates`) into this round's segment
        (growing it when needed); returns ``(parity, generation)`` for the readers, or ``None`` when ``/dev/shm``
        has no room (nothing written; the round falls back to the process group). Every rank calls it once per
        gather, so the parity alternates in step on all ranks."""
        parity = self._calls % 2
        self._calls += 1
        need = packed.total_bytes
        generation, size, buffer = self._own.get(parity, (0, 0, None))
        if buffer is None or size < need:
            new_size = max(need, 2 * size, _MIN_SEGMENT)
            new_generation = self._generation + 1
            path = self.path(self.rank, parity, new_generation)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, new_size)  # reserves the pages: ENOSPC here, not SIGBUS on a write
                finally:
                    os.close(fd)
                mapping = torch.from_file(path, shared=True, size=new_size, dtype=torch.uint8)
            except OSError:
                _unlink(path)
                return None
            self._generation = new_generation
            if buffer is not None:
                _unlink(self.path(self.rank, parity, generation))
                self._unread.pop(parity, None)
            generation, size, buffer = new_generation, new_size, mapping
            self._own[parity] = (generation, size, buffer)
            self._unread[parity] = path
        self._written = parity
        packed.write(buffer)
        return parity, generation

    def settle(self, everyone_wrote: bool) -> None:
        """Called by every rank right after the gather's size ``all_gather``. Files that every peer mapped in an
        earlier gather are unlinked now (every peer has passed this collective, so it has finished reading them;
        the mappings keep the memory until they close, and nothing is left behind in ``/dev/shm`` if a process is
        killed later); when ``everyone_wrote``, the peers map this gather's new file now, so it is unlinked at the
        next gather."""
        for path in self._mapped:
            _unlink(path)
        self._mapped = []
        if everyone_wrote and self._written in self._unread:
            self._mapped.append(self._unread.pop(self._written))
        self._written = None

    def read(self, rank: int, parity: int, generation: int, length: int) -> torch.Tensor:
        """The first ``length`` bytes of ``rank``'s segment ``parity`` at ``generation`` (a mapping, cached until
        that rank's segment grows; read it before the next gather)."""
        cached = self._peers.get((rank, parity))
        if cached is None or cached[0] != generation:  # a generation is one file of one size: its mapping holds it
            path = self.path(rank, parity, generation)
            size = os.path.getsize(path)
            cached = (generation, torch.from_file(path, shared=True, size=size, dtype=torch.uint8))
            self._peers[(rank, parity)] = cached
        return cached[1][:length]

    def close(self) -> None:
        """Drop every mapping and remove this rank's files still in ``/dev/shm`` (idempotent)."""
        for parity, (generation, _, _) in self._own.items():
            _unlink(self.path(self.rank, parity, generation))
        self._own.clear()
        self._peers.clear()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


#: One decision per process group: group -> exchange or None (weak keys: a destroyed group is not kept alive, which
#: would postpone its destructor to interpreter exit, after the peers have gone).
_EXCHANGES: "weakref.WeakKeyDictionary[Any, Optional[HostExchange]]" = weakref.WeakKeyDictionary()


def host_exchange() -> Optional[HostExchange]:
    """This rank's :class:`HostExchange` for the default process group, or ``None`` where the ranks cannot share
    memory (decided on the first call, by all ranks together: every rank must make that call).

    ``None`` under NCCL (it gathers on the GPUs), without :data:`SHM_DIR`, or when some rank cannot read another
    rank's probe file (another host, or a private ``/dev/shm``). Whether a round uses it is decided per round
    (:func:`~lightning_fed.client.distributed.gather_updates`: every rank must have written its segment).

    Example: one gloo process (the decision is made once, then the same object is returned)::

        >>> import tempfile, torch.distributed as dist
        >>> dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
        >>> host_exchange() is host_exchange()
        True
        >>> close_host_exchanges(); dist.destroy_process_group()
    """
    group = dist.group.WORLD
    if group in _EXCHANGES:
        return _EXCHANGES[group]
    rank, world = dist.get_rank(), dist.get_world_size()
    prefix = [f"lightning_fed-{secrets.token_hex(6)}" if rank == 0 else None]
    dist.broadcast_object_list(prefix, src=0)
    probe = HostExchange(prefix[0], rank)
    wanted = "nccl" not in str(dist.get_backend()) and os.path.isdir(SHM_DIR)
    token = f"{prefix[0]}:{rank}".encode()
    if wanted:
        try:
            with open(probe.path(rank, 0, 0), "wb") as f:
                f.write(token)
        except OSError:
            wanted = False
    flags: list[Any] = [None] * world
    dist.all_gather_object(flags, wanted)
    readable = all(flags)
    if readable:
        try:
            for other in range(world):
                with open(probe.path(other, 0, 0), "rb") as f:
                    readable = readable and f.read() == f"{prefix[0]}:{other}".encode()
        except OSError:
            readable = False
    dist.all_gather_object(flags, readable)
    _unlink(probe.path(rank, 0, 0))
    exchange = probe if all(flags) else None
    _EXCHANGES[group] = exchange
    return exchange


def close_host_exchanges() -> None:
    """Remove every rank-local segment and forget the decisions (a new process group decides again)."""
    for exchange in list(_EXCHANGES.values()):
        if exchange is not None:
            exchange.close()
    _EXCHANGES.clear()
