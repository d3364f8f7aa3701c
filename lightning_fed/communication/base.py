"""The compressor protocol of client updates, and the random draws of stochastic compressors (issue #56).

A :class:`Compressor` maps the flat vector v ∈ R^d of what a client uploads (its Δ_i over the parameters that travel,
:func:`~lightning_fed.communication.bytes.travelling_positions`) to ``(decoded, nbytes)``: the vector the server
decodes — what it aggregates — and the size of the encoding the client sends, in bytes (bits rounded up to whole
bytes). Each compressor states its encoding and cites its source.

Stochastic compressors draw from :func:`client_generator` ``(seed, round, client id)``: a run is reproducible and
a resumed run draws what the uninterrupted one drew, whatever the order clients train in.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

__all__ = ["Compressor", "bits_to_bytes", "client_generator"]


def client_generator(seed: int, round_idx: int, client_id: int) -> torch.Generator:
    """The CPU generator of client ``client_id``'s draws in round ``round_idx`` of a compressor seeded ``seed``:
    a ``torch.Generator`` seeded with NumPy's ``SeedSequence([seed, round_idx, client_id])`` (64 bits), so the draws
    depend on the three numbers only. Tests reproduce a compressor's draws with it.

    Example::

        >>> a = torch.rand(2, generator=client_generator(0, 3, 7))
        >>> torch.equal(a, torch.rand(2, generator=client_generator(0, 3, 7)))
        True
    """
    state = np.random.SeedSequence([int(seed), int(round_idx), int(client_id)]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)


def bits_to_bytes(bits: int) -> int:
    """Whole bytes holding ``bits`` bits: ⌈bits / 8⌉.

    >>> bits_to_bytes(0), bits_to_bytes(1), bits_to_bytes(64)
    (0, 1, 8)
    """
    return int(math.ceil(int(bits) / 8))


class Compressor:
    """Base class of update compressors: override :meth:`compress` (and :attr:`stochastic` when it draws).

    Example: the identity, sending every entry in the vector's own dtype::

        >>> class Raw(Compressor):
        ...     def compress(self, v, generator=None):
        ...         return v.clone(), v.numel() * v.element_size()
        >>> Raw().compress(torch.ones(3))
        (tensor([1., 1., 1.]), 12)
    """

    #: Whether :meth:`compress` draws from its generator (:func:`client_generator`).
    stochastic: bool = False

    def size(self, d: int, element_size: int) -> int:
        """The encoding's size in bytes for a vector of ``d`` entries of ``element_size`` bytes: every compressor here
        sends a size that depends on d alone, known before the client trains (what a simulated clock plans an upload
        with). Default: the raw size, ``d × element_size``."""
        return int(d) * int(element_size)

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        """``(decoded, nbytes)`` of the flat floating vector ``v`` (shape ``[d]``, on the CPU): the decoded vector
        (shape ``[d]``, ``v``'s dtype) and the encoding's size in bytes. ``generator``: the draws of a stochastic
        compressor (:func:`client_generator`)."""
        raise NotImplementedError

    def settings(self) -> dict:
        """The hyper-parameters (the ``__init__`` arguments, stored as attributes of the same names)."""
        import inspect

        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.settings().items())})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.settings() == other.settings()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.settings().items()))))
