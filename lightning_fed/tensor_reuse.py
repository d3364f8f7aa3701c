"""Model-sized CPU tensors reused from round to round, where glibc's heap would hand their memory back to the kernel.

A round of the sequential executor makes one Δ_i = x_i − x̂_t per client (:meth:`ClientRunner.finish_client
<lightning_fed.client.runner.ClientRunner.finish_client>`), C model-sized tensors that live until the server step
has read them and are freed together at the round's end. On the CPU these blocks come from glibc's heap. When the
last of them sits at the top of the heap, freeing them makes the top free chunk larger than glibc's trim threshold,
so ``free`` hands the whole run of pages back to the kernel (``brk`` shrinks by about C model sizes). The next round
asks for the same memory again, and every page faults in anew: about 196 minor page faults for each 784 KB tensor
of the 784-256-10 MLP, some 2,000 a round at C = 10. They cost system time, and the later local steps' gradient
blocks land on fresh pages too, so the same torch calls take longer in the federated fit than in a plain PyTorch
loop. The plain loop frees its Δ_i at the next round's start, when x_t's new copy sits above them, so there the
heap does not shrink.

:class:`DeltaBuffers` keeps the round's Δ_i tensors and writes the next round's Δ_i into them
(``torch.sub(x_i, x̂_t, out=buffer)``: the same subtraction, bit for bit). A tensor is reused only when nothing
else can see it: no Python reference besides the buffer list's, no other C++ holder (an autograd graph, a DLPack
capsule), no other tensor on its storage (a view, ``.data``, ``.detach()``, a NumPy array) and no weak reference.
Anything a callback or server optimizer kept is therefore never overwritten; its client gets a new tensor instead.
Reuse is for CPU tensors only: on an accelerator the caching allocator keeps freed blocks and ``_foreach_sub``
is one fused kernel.

The server step's weighted mean does the same with its float64 sums, the float64 copy of each client's Δ_i that
the addition makes, and the mean rounded to the parameters' dtype (:class:`Workspace`, kept by
:class:`~lightning_fed.server.aggregators.base.WeightedMean`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Optional

import torch
from torch import Tensor

def _counts(buffers: list[Tensor], i: int) -> tuple[int, int, int, int]:
    """``buffers[i]``'s Python references, ``TensorImpl`` holders, storage users (with the one ``untyped_storage()``
    makes while it is read) and weak references."""
    t = buffers[i]
    return (sys.getrefcount(buffers[i]), t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata),
            weakref.getweakrefcount(t))


def _alone() -> Optional[tuple[int, int, int, int]]:
    """:func:`_counts` of a tensor only a list holds, on this interpreter and torch (``None`` where torch lacks the
    counts: then nothing is reused)."""
    try:
        return _counts([torch.empty(1)], 0)
    except (AttributeError, RuntimeError):  # pragma: no cover - a torch without _use_count / _storage_Use_Count
        return None


_ALONE = _alone()


def unshared(buffers: list[Tensor], i: int) -> bool:
    """Whether ``buffers[i]`` is held by ``buffers`` alone: no other Python reference, no other ``TensorImpl``
    holder (an autograd graph, a DLPack capsule), no other tensor on its storage (a view, ``.data``, ``.detach()``,
    a NumPy array) and no weak reference — the counts of a tensor only a list holds (measured once at import)."""
    return _ALONE is not None and _counts(buffers, i) == _ALONE


def fits(buffer: Tensor, like: Tensor, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether ``buffer`` has the shape, strides and device of ``like`` and ``dtype`` (default ``like``'s): what an
    elementwise result of ``like`` (e.g. ``x_i − x̂_t``, ``like.to(dtype)``) gets."""
    return (
        type(buffer) is Tensor and buffer.dtype == (like.dtype if dtype is None else dtype)
        and buffer.device == like.device and buffer.shape == like.shape and buffer.stride() == like.stride()
        and buffer.storage_offset() == 0 and not buffer.requires_grad
    )


class DeltaBuffers:
    """The Δ_i tensors handed out in a round, reused in the next round where nobody else holds them (CPU only).

    The runner calls :meth:`new_round` at each round's start and :meth:`delta` at each client's end.

    Example: the second round writes Δ_i into the first round's tensor, which nobody kept::

        >>> import torch
        >>> pool = DeltaBuffers()
        >>> x_i, x_t = [torch.tensor([3.0, 5.0])], [torch.tensor([1.0, 1.0])]
        >>> first = pool.delta(x_i, x_t)
        >>> address = first[0].data_ptr()
        >>> del first
        >>> pool.new_round()
        >>> second = pool.delta([torch.tensor([2.0, 9.0])], x_t)
        >>> second[0].tolist(), second[0].data_ptr() == address
        ([1.0, 8.0], True)
        >>> kept = second  # a callback keeps this round's Δ_i: the next round gets a new tensor
        >>> pool.new_round()
        >>> pool.delta(x_i, x_t)[0].data_ptr() == address
        False
    """

    def __init__(self) -> None:
        self._issued: list[list[Tensor]] = []  # this round's Δ_i tensors (own lists, not the updates')
        self._free: list[list[Tensor]] = []  # last round's, held by nobody else: written into by `delta`

    def new_round(self) -> None:
        """A round starts: last round's Δ_i tensors that nobody else holds become reusable (the others, and any
        unused from before, are let go)."""
        issued, self._issued = self._issued, []
        self._free = [buffers for buffers in issued if all(unshared(buffers, i) for i in range(len(buffers)))]

    def delta(self, params: list[Tensor], start: list[Tensor]) -> list[Tensor]:
        """Δ_i = ``params`` − ``start`` (aligned lists, e.g. x_i and x̂_t): new tensors, or on the CPU last round's
        unshared ones written in place — the same numbers as ``torch._foreach_sub(params, start)``, bit for bit."""
        on_cpu = all(p.is_cpu for p in params)
        buffers = self._reusable(params) if on_cpu else None
        if buffers is None:
            buffers = torch._foreach_sub(params, start)
        else:
            for buffer, p, s in zip(buffers, params, start):
                torch.sub(p, s, out=buffer)
        if on_cpu:
            self._issued.append(list(buffers))
        return buffers

    def _reusable(self, params: list[Tensor]) -> Any:
        while self._free:
            buffers = self._free.pop()
            if len(buffers) == len(params) and all(map(fits, buffers, params)):
                return buffers
        return None

    def clear(self) -> None:
        """Let every kept tensor go (e.g. at the end of a fit)."""
        self._issued, self._free = [], []


class Workspace:
    """Named lists of CPU tensors a server stage keeps from one round to the next and writes its results into
    (:class:`~lightning_fed.server.aggregators.base.WeightedMean`: the float64 sums, the float64 copy of a client's
    Δ_i, the rounded mean). A list is reused where nobody else holds its tensors (see :func:`unshared`) and they fit
    (:func:`fits`); otherwise new ones are made and kept. Not pickled and not deep-copied (a copy starts empty).

    Example::

        >>> import torch
        >>> work = Workspace()
        >>> like = [torch.zeros(3)]
        >>> sums = work.take("sums", like, torch.float64)
        >>> sums[0].dtype, sums[0].shape
        (torch.float64, torch.Size([3]))
        >>> address = sums[0].data_ptr()
        >>> del sums
        >>> work.take("sums", like, torch.float64)[0].data_ptr() == address
        True
        >>> work.take("sums", [torch.zeros(3, device="meta")], torch.float64) is None  # not on the CPU: no reuse
        True
    """

    def __init__(self) -> None:
        self._kept: dict[str, list[Tensor]] = {}

    def take(self, name: str, like: list[Tensor], dtypes: Any = None) -> Optional[list[Tensor]]:
        """Tensors shaped (and strided) like ``like``, of ``dtypes`` (one dtype, a list aligned with ``like``, or
        ``None``: ``like``'s own), with undefined contents — the ones kept under ``name`` when nobody else holds
        them, else new ones (then kept); ``None`` when ``like`` is empty or not all on the CPU."""
        if not like or not all(t.is_cpu for t in like):
            return None
        if dtypes is None or isinstance(dtypes, torch.dtype):
            dtypes = [like[0].dtype if dtypes is None else dtypes] * len(like) if dtypes is not None \
                else [t.dtype for t in like]
        kept = self._kept.get(name)
        if (
            kept is not None and len(kept) == len(like) and all(map(fits, kept, like, dtypes))
            and all(unshared(kept, i) for i in range(len(kept)))
        ):
            return list(kept)
        kept = [torch.empty_like(t, dtype=dtype) for t, dtype in zip(like, dtypes)]
        if not all(map(fits, kept, like, dtypes)):  # (a tensor that is not dense: no reuse)
            self._kept.pop(name, None)
            return None
        self._kept[name] = kept
        return list(kept)

    def __getstate__(self) -> dict:
        return {"_kept": {}}

    def __deepcopy__(self, memo: dict) -> "Workspace":
        return Workspace()
