"""Top-k sparsification (Stich, Cordonnier, Jaggi: "Sparsified SGD with Memory", NeurIPS 2018, Def. 2.1 top_k):
the k entries of largest magnitude are sent, the others decoded as 0 (ties: the lower index first).

Encoding counted: k values in the update's dtype and k indices as 32-bit integers: k·(element size + 4) bytes.
Biased; with error feedback (``Compression(TopK(...), error_feedback=True)``) it is Stich et al.'s Mem-SGD.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from lightning_fed.checks import ArgumentError, check_fraction, check_int
from lightning_fed.communication.base import Compressor

__all__ = ["TopK", "sparsity_k"]


def sparsity_k(name: str, k: Optional[int], fraction: Optional[float]) -> tuple[Optional[int], Optional[float]]:
    """The checked ``(k, fraction)`` of a sparsifier: exactly one given (k ≥ 1; fraction in (0, 1)).

    Raises:
        ArgumentError: both or neither given, or one out of range, naming ``name``'s argument.
    """
    if (k is None) == (fraction is None):
        raise ArgumentError(f"{name} needs exactly one of `k` (an integer >= 1) and `fraction` (a number in the open "
                            f"interval (0, 1)), got k={k!r}, fraction={fraction!r}.")
    return (check_int("k", k, 1) if k is not None else None,
            check_fraction("fraction", fraction) if fraction is not None else None)


class _Sparsifier(Compressor):
    def kept(self, d: int) -> int:
        """k for a vector of d entries: ``min(k, d)``, or ``max(1, ⌈fraction·d⌉)`` (0 when d = 0)."""
        if d == 0:
            return 0
        return min(self.k, d) if self.k is not None else max(1, int(math.ceil(self.fraction * d)))

    def size(self, d: int, element_size: int) -> int:
        """k values and k int32 indices: k·(element_size + 4) bytes."""
        return self.kept(int(d)) * (int(element_size) + 4)


class TopK(_Sparsifier):
    """The k entries of largest |v_i| (see the module doc).

    Args:
        k: Entries kept (capped at d). Give ``k`` or ``fraction``, not both.
        fraction: Entries kept as a share of d: ``max(1, ⌈fraction·d⌉)`` (e.g. 0.01: top-1 %).

    Raises:
        ArgumentError: both or neither given; ``k`` < 1; ``fraction`` outside (0, 1).

    Example::

        >>> TopK(k=2).compress(torch.tensor([0.5, -3.0, 1.0, 2.0]))  # 2 × (4 + 4) bytes
        (tensor([ 0., -3.,  0.,  2.]), 16)
    """

    def __init__(self, k: Optional[int] = None, fraction: Optional[float] = None) -> None:
        self.k, self.fraction = sparsity_k("TopK", k, fraction)

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        d = v.numel()
        k = self.kept(d)
        out = torch.zeros_like(v)
        if k == 0:
            return out, self.size(0, v.element_size())
        flat = v.detach().reshape(-1)
        index = top_indices(flat.abs(), k)
        out.view(-1)[index] = flat[index]
        return out, self.size(d, v.element_size())


def top_indices(magnitude: Tensor, k: int) -> Tensor:
    """The positions of the k largest entries of the flat ``magnitude`` (ties at the k-th: lower positions first),
    in ascending order of position, 1 ≤ k ≤ d.

    The k-th largest value is found among candidates (when d ≥ 1024 and k ≤ d/4): the entries at least the
    ⌈2k/64⌉-th largest of every 64th entry. When there are at least k of them, they hold the k largest (the k-th
    largest is then at least that threshold) and every entry tied with the k-th, so the selection is exactly that of
    the whole vector, at the cost of one comparison over d and a ``torch.topk`` over about 2k entries instead of d.
    Otherwise (too few candidates, or a vector with a NaN: its order is not that of numbers) the whole vector is
    searched.

    >>> top_indices(torch.tensor([0.5, 3.0, 2.0, 2.0, 0.1]), 3)
    tensor([1, 2, 3])
    """
    d = magnitude.numel()
    positions, values = None, magnitude
    stride = 64
    if d >= 16 * stride and 4 * k <= d and bool(torch.isfinite(magnitude.sum())):
        sample = magnitude[::stride]  # ⌈d/64⌉ ≥ ⌈2k/64⌉ entries
        threshold = torch.topk(sample, -(-2 * k // stride), sorted=False).values.min()
        candidates = torch.nonzero(magnitude >= threshold).reshape(-1)
        if candidates.numel() >= k:
            positions, values = candidates, magnitude[candidates]
    kth = torch.topk(values, k, sorted=False).values.min()  # the k-th largest
    above = torch.nonzero(values > kth).reshape(-1)
    tied = torch.nonzero(values == kth).reshape(-1)[:k - above.numel()]  # ties at the k-th: lower position first
    index = torch.cat([above, tied]).sort().values
    return index if positions is None else positions[index]
