"""Clients spread over DDP ranks: the cohort split and the gather of the round's updates and failures."""

from __future__ import annotations

import dataclasses
import heapq
import math
import pickle
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from lightning_fed.client.host_exchange import host_exchange
from lightning_fed.client.update import ClientUpdate


def assign_clients(cohort: Sequence[int], num_samples: Sequence[int], world_size: int) -> list[list[int]]:
    """Split a cohort across ranks, balanced by client sample count, largest first (greedy LPT scheduling).

    Args:
        cohort: The round's client ids, in cohort order.
        num_samples: |D_i| of each client of ``cohort`` (same order).
        world_size: Number of ranks (>= 1).

    Returns:
        For each rank, its clients in cohort order. Deterministic: ties go to the lower rank.
    """
    order = sorted(range(len(cohort)), key=lambda i: (-int(num_samples[i]), i))
    loads = [(0, rank) for rank in range(world_size)]
    heapq.heapify(loads)
    positions: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        load, rank = heapq.heappop(loads)
        positions[rank].append(i)
        heapq.heappush(loads, (load + int(num_samples[i]), rank))
    return [[int(cohort[i]) for i in sorted(p)] for p in positions]


#: Byte alignment of every tensor (and of the metadata block) inside a packed buffer, so that each slice can be
#: viewed as its dtype (``Tensor.view(dtype)`` needs the offset to be a multiple of the element size; 16 covers
#: complex128).
_ALIGN = 16


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`_ALIGN`."""
    return -(-nbytes // _ALIGN) * _ALIGN


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where one tensor lies in a rank's packed tensor bytes; it stands in for the tensor in the pickled skeleton.

    Attributes:
        offset: Start of the tensor's bytes in the tensor block, in bytes (a multiple of :data:`_ALIGN`).
        dtype: The tensor's dtype.
        shape: The tensor's shape.
        stride: The tensor's strides, in elements (the packed bytes are its values in row-major order).
        requires_grad: The tensor's ``requires_grad`` flag.
    """

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's values: ``prod(shape) * dtype.itemsize``."""
        return math.prod(self.shape) * self.dtype.itemsize


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill ``numel`` consecutive elements without overlap, in any dimension order
    (contiguous, channels-last, transposed), so that ``torch.empty_strided(t.shape, t.stride())`` rebuilds its
    layout exactly."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _packable(value: Any) -> bool:
    """Whether ``value`` travels as raw bytes: a plain (not a subclass), strided, dense, non-quantized tensor.
    Any other tensor is pickled as before (on the CPU)."""
    return (
        type(value) is torch.Tensor and value.layout == torch.strided and not value.is_quantized
        and not value.is_nested and _dense(value)
    )


def _skeleton(value: Any, slots: list[tuple[_Slot, torch.Tensor]], offset: list[int]) -> Any:
    """``value`` with each packable tensor replaced by a :class:`_Slot` (appended to ``slots`` with the tensor),
    other tensors moved to the CPU, through dicts, lists and tuples (named tuples included); ``offset[0]`` is the
    running byte offset of the tensor block."""
    if isinstance(value, torch.Tensor):
        if not _packable(value):
            return value.to("cpu")
        slot = _Slot(offset[0], value.dtype, tuple(value.shape), tuple(value.stride()), value.requires_grad)
        offset[0] += _aligned(slot.nbytes)
        slots.append((slot, value))
        return slot
    if isinstance(value, dict):
        return {k: _skeleton(v, slots, offset) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_skeleton(v, slots, offset) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v, slots, offset) for v in value)
    return value


def _fill(value: Any, block: torch.Tensor, device: torch.device) -> Any:
    """The inverse of :func:`_skeleton`: each :class:`_Slot` becomes a new tensor on ``device`` (its own storage,
    the original dtype, shape, strides, ``requires_grad`` and bytes) read from ``block`` (uint8, this rank's tensor
    block); pickled tensors are moved to ``device``."""
    if isinstance(value, _Slot):
        if value.nbytes:
            values = block[value.offset: value.offset + value.nbytes].view(value.dtype).view(value.shape)
        else:
            values = torch.empty(value.shape, dtype=value.dtype)
        out = torch.empty_strided(value.shape, value.stride, dtype=value.dtype, device=device)
        out.copy_(values)
        return out.requires_grad_(True) if value.requires_grad else out
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _fill(v, block, device) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_fill(v, block, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, block, device) for v in value)
    return value


@dataclasses.dataclass
class PackedUpdates:
    """One rank's updates and failures as a pickled skeleton (small) plus the bytes of their tensors (large).

    Attributes:
        meta: ``pickle.dumps((skeletons, failures))``: each update as a ``ClientUpdate`` (made by
            ``dataclasses.replace``) whose tensors are :class:`_Slot` s, and the ``(client id, reason)`` failures
            (a :class:`~lightning_fed.client.runner.ClientFailure` keeps where a raised error came from, so every
            rank takes the same decision on a round whose clients all failed alike).
        slots: Each packed tensor with its slot, in tensor-block order.
        tensor_bytes: Size of the tensor block in bytes (every tensor's bytes rounded up to :data:`_ALIGN`).

    Example: one update's tensors as bytes and back (what :func:`gather_updates` does per rank)::

        >>> update = ClientUpdate(client_id=3, delta=[torch.tensor([0.5, -1.0]), torch.ones(2, 2, dtype=torch.float64)],
        ...                       num_samples=12, num_steps=3, loss=0.25,
        ...                       extras={"delta_control": [torch.tensor([2.0, 4.0])], "note": "kept in the pickle"})
        >>> packed = pack_updates([update], failures=[(7, "timed out")])
        >>> [(slot.offset, slot.dtype, slot.shape) for slot, _ in packed.slots]  # 16-byte aligned
        [(0, torch.float32, (2,)), (16, torch.float64, (2, 2)), (48, torch.float32, (2,))]
        >>> buffer = torch.empty(packed.total_bytes, dtype=torch.uint8)
        >>> packed.write(buffer)
        >>> (back,), failures = unpack_updates(buffer, len(packed.meta), torch.device("cpu"))
        >>> back.client_id, back.delta[1].dtype, back.extras["delta_control"][0].tolist(), back.extras["note"], failures
        (3, torch.float64, [2.0, 4.0], 'kept in the pickle', [(7, 'timed out')])
    """

    meta: bytes
    slots: list[tuple[_Slot, torch.Tensor]]
    tensor_bytes: int

    @property
    def total_bytes(self) -> int:
        """Bytes of the packed buffer: the metadata rounded up to :data:`_ALIGN`, then the tensor block."""
        return _aligned(len(self.meta)) + self.tensor_bytes

    def write(self, buffer: torch.Tensor) -> None:
        """Write the metadata and every tensor's bytes into ``buffer`` (uint8, shape ``[>= total_bytes]``, any
        device; padding left as it is)."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < self.total_bytes:
            raise ValueError(f"Expected a 1-D uint8 buffer of at least {self.total_bytes} bytes, got "
                             f"{buffer.dtype} of shape {tuple(buffer.shape)}.")
        buffer[: len(self.meta)].copy_(torch.frombuffer(bytearray(self.meta), dtype=torch.uint8))
        base = _aligned(len(self.meta))
        for slot, tensor in self.slots:
            if slot.nbytes:
                start = base + slot.offset
                buffer[start: start + slot.nbytes].view(slot.dtype).view(slot.shape).copy_(tensor.detach())


def pack_updates(updates: Sequence[ClientUpdate], failures: Sequence[tuple[int, str]]) -> PackedUpdates:
    """Split one rank's ``updates`` and ``failures`` into small pickled metadata and the bytes of their tensors.

    Every plain dense tensor of ``delta``, ``buffers`` and ``extras`` (nested in dicts, lists and tuples: e.g.
    SCAFFOLD's ``extras["delta_control"]``, the client algorithms' ``extras["client_state/<state_key>"]``) becomes a
    :class:`_Slot`; everything else (ids, counts, loss, learning rates, non-tensor extras, tensors of other kinds,
    which go to the CPU as before) stays in the pickled skeleton. Nothing is copied until :meth:`PackedUpdates.write`.
    """
    slots: list[tuple[_Slot, torch.Tensor]] = []
    offset = [0]
    skeletons = [
        dataclasses.replace(
            u, delta=_skeleton(u.delta, slots, offset), buffers=_skeleton(u.buffers, slots, offset),
            extras=_skeleton(u.extras, slots, offset), client_lrs=list(u.client_lrs),
        )
        for u in updates
    ]
    meta = pickle.dumps((skeletons, list(failures)), protocol=pickle.HIGHEST_PROTOCOL)
    return PackedUpdates(meta, slots, offset[0])


def unpack_updates(
    buffer: torch.Tensor, meta_bytes: int, device: torch.device
) -> tuple[list[ClientUpdate], list[tuple[int, str]]]:
    """Rebuild one rank's updates and failures from its packed ``buffer`` (uint8, shape ``[>= total_bytes]``, as
    written by :meth:`PackedUpdates.write`; ``meta_bytes`` = ``len(PackedUpdates.meta)``), every tensor on ``device``
    with its own storage (``dataclasses.replace`` of the skeleton, so updates are still made only by the runner)."""
    skeletons, failures = pickle.loads(buffer[:meta_bytes].cpu().numpy().tobytes())
    block = buffer[_aligned(meta_bytes):]
    updates = [
        dataclasses.replace(
            s, delta=_fill(s.delta, block, device), buffers=_fill(s.buffers, block, device),
            extras=_fill(s.extras, block, device),
        )
        for s in skeletons
    ]
    return updates, failures


def _communication_device(device: torch.device) -> torch.device:
    """Where the packed buffers are gathered: ``device`` under NCCL (it gathers CUDA tensors only), the CPU
    otherwise (gloo)."""
    backend = str(dist.get_backend())
    if "nccl" in backend:
        if device.type != "cuda":
            raise RuntimeError(f"The process group's backend is {backend!r}, which gathers CUDA tensors only, but "
                               f"the rank's device is {device}.")
        return device
    return torch.device("cpu")


def gather_updates(
    updates: list[ClientUpdate], failures: list[tuple[int, str]], cohort: Sequence[int], device: torch.device,
    shared_memory: bool = True,
) -> tuple[list[ClientUpdate], list[tuple[int, str]]]:
    """All ranks' client updates and failures of the round, on every rank, in cohort order, every tensor on
    ``device`` with the values, dtype, shape and strides it was sent with.

    Each rank packs its updates (:func:`pack_updates`): small pickled metadata (ids, counts, loss, learning rates,
    failures, non-tensor extras, the tensors' layout) and one byte block holding all its tensors. Where every rank
    is on this host and the process group is not NCCL, a rank writes its buffer into its shared-memory segment
    (:mod:`lightning_fed.client.host_exchange`) and an ``all_gather`` of every rank's sizes (int64 ``[5]``: metadata
    and tensor bytes, whether written, the segment's parity and generation) lets the others read it in place.
    Otherwise (another host, ``shared_memory=False``, a rank short of ``/dev/shm`` space, NCCL) the buffers
    themselves are ``all_gather``-ed (uint8, padded to the largest rank's size) on the CPU under gloo or on
    ``device`` under NCCL. Either way tensors are never pickled, this rank's own updates are returned as they are
    (not copied), and the result equals an ``all_gather_object`` of the updates bit for bit.

    Args:
        updates: This rank's updates (any order).
        failures: This rank's ``(client id, reason)`` failures.
        cohort: The round's client ids, in cohort order (every gathered client id must be in it).
        device: Where the gathered tensors are put (the rank's root device).
        shared_memory: Whether this rank may exchange through ``/dev/shm`` (default True; a round uses it only if
            every rank does: :class:`~lightning_fed.distributed.FederatedDDPStrategy`'s ``shared_memory``).
    """
    world, me = dist.get_world_size(), dist.get_rank()
    packed = pack_updates(updates, failures)
    comm = _communication_device(device)
    exchange = host_exchange() if comm.type == "cpu" and world > 1 else None
    written = exchange.write(packed) if exchange is not None and shared_memory else None
    parity, generation = written if written is not None else (0, 0)
    sizes = torch.tensor([len(packed.meta), packed.tensor_bytes, written is not None, parity, generation],
                         dtype=torch.int64, device=comm)
    all_sizes = [torch.empty_like(sizes) for _ in range(world)]
    dist.all_gather(all_sizes, sizes)
    table = torch.stack(all_sizes).cpu().tolist()
    buffers: dict[int, torch.Tensor] = {}
    everyone_wrote = all(row[2] for row in table)
    if exchange is not None:
        exchange.settle(everyone_wrote)
    if exchange is not None and everyone_wrote:
        for rank, (meta, tensor_bytes, _, rank_parity, rank_generation) in enumerate(table):
            if rank != me:
                buffers[rank] = exchange.read(rank, rank_parity, rank_generation, _aligned(meta) + tensor_bytes)
    elif world > 1:
        length = max(_aligned(row[0]) + row[1] for row in table)
        send = torch.empty(length, dtype=torch.uint8, device=comm)
        packed.write(send)
        received = torch.empty(world, length, dtype=torch.uint8, device=comm)
        dist.all_gather(list(received.unbind(0)), send)
        buffers = {rank: received[rank] for rank in range(world) if rank != me}
    position = {int(c): i for i, c in enumerate(np.asarray(cohort).tolist())}
    all_updates: list[ClientUpdate] = []
    all_failures: list[tuple[int, str]] = []
    for rank in range(world):
        if rank == me:
            rank_updates, rank_failures = list(updates), list(failures)
        else:
            rank_updates, rank_failures = unpack_updates(buffers[rank], table[rank][0], device)
        all_updates.extend(rank_updates)
        all_failures.extend(rank_failures)
    all_updates.sort(key=lambda u: position[u.client_id])
    all_failures.sort(key=lambda f: position[f[0]])
    return all_updates, all_failures
