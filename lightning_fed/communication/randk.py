"""Random-k sparsification (Stich, Cordonnier, Jaggi: "Sparsified SGD with Memory", NeurIPS 2018, Def. 2.1 rand_k):
k entries chosen uniformly without replacement are sent, the others decoded as 0; ``unbiased=True`` scales the
kept entries by d/k (E[C(v)] = v; Wangni et al. 2018).

The draw: ``torch.randperm(d, generator=g)[:k]`` from the client's generator
(:func:`~lightning_fed.communication.base.client_generator`). Encoding counted: k values in the update's dtype and
k indices as 32-bit integers: k·(element size + 4) bytes (a server that regenerates the indices from the seed would
need only the values; they are counted as sent, as for :class:`~lightning_fed.communication.topk.TopK`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lightning_fed.communication.topk import _Sparsifier, sparsity_k

__all__ = ["RandK"]


class RandK(_Sparsifier):
    """k random entries (see the module doc).

    Args:
        k: Entries kept (capped at d). Give ``k`` or ``fraction``, not both.
        fraction: Entries kept as a share of d: ``max(1, ⌈fraction·d⌉)``.
        unbiased: Scale the kept entries by d/k (default ``False``: Stich et al.'s rand_k, for error feedback).

    Raises:
        ArgumentError: both or neither of ``k`` / ``fraction``; ``k`` < 1; ``fraction`` outside (0, 1);
            ``unbiased`` not a bool.

    Example::

        >>> from lightning_fed.communication.base import client_generator
        >>> v = torch.tensor([1.0, 2.0, 3.0, 4.0])
        >>> kept = torch.randperm(4, generator=client_generator(0, 0, 0))[:2]
        >>> out, nbytes = RandK(k=2).compress(v, client_generator(0, 0, 0))
        >>> torch.equal(out[kept], v[kept]), int((out != 0).sum()), nbytes
        (True, 2, 16)
    """

    stochastic = True

    def __init__(self, k: Optional[int] = None, fraction: Optional[float] = None, unbiased: bool = False) -> None:
        self.k, self.fraction = sparsity_k("RandK", k, fraction)
        if not isinstance(unbiased, bool):
            from lightning_fed.checks import ArgumentError

            raise ArgumentError(f"`unbiased` must be True or False, got {unbiased!r}.")
        self.unbiased = unbiased

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        d = v.numel()
        k = self.kept(d)
        index = torch.randperm(d, generator=generator)[:k]
        out = torch.zeros_like(v)
        kept = v.detach()[index]
        out[index] = kept * (d / k) if self.unbiased and k else kept
        return out, self.size(d, v.element_size())
