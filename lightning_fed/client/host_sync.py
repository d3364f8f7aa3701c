"""Counting host synchronisations: the ops that copy a tensor's value to the host.

On an accelerator each such copy (``Tensor.item()``, ``float(t)``, ``bool(t)``, ``int(t)``, a Python ``if`` on a
tensor) makes the host wait for the device to finish its queued work, so a local step with one cannot overlap the
next step's launch with this one's kernels (issue #33). :class:`HostSyncCounter` counts them on any device,
the CPU included (where the same ops are plain copies), which is how the tests and ``benchmarks/gpu_suite.py`` check
that lightning_fed's local steps make none.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

#: The aten ops that read a tensor's value on the host: ``item()`` / ``float()`` / ``int()`` (``_local_scalar_dense``
#: underneath), ``bool()`` and Python branches on a tensor (``is_nonzero``).
HOST_SYNC_OPS = ("aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default")


class HostSyncCounter(TorchDispatchMode):
    """A ``TorchDispatchMode`` that counts the host synchronisations (:data:`HOST_SYNC_OPS`) made while it is
    active (``with counter: ...``); every op still runs as it would.

    Attributes:
        count: Host synchronisations seen so far (int, starts at 0; a counter may be entered several times and
            keeps adding).

    The count is of aten ops, so it is device-independent: a CPU run counts what a GPU run of the same code would
    synchronise (Python code that branches on ``tensor.is_cpu`` can of course differ). Copies with ``.cpu()`` /
    ``.to("cpu")`` are not counted (on the CPU they are no copy at all).

    Example::

        >>> import torch
        >>> x = torch.ones(3)
        >>> with HostSyncCounter() as counter:
        ...     y = x * 2                # stays on the device: no sync
        ...     total = float(y.sum())   # one sync
        ...     if (y > 1).all():        # one sync (a Python branch on a tensor)
        ...         pass
        >>> counter.count, total
        (2, 6.0)
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if str(func) in HOST_SYNC_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))
