"""Deterministic k-bit uniform quantisation of the update: each entry rounded to the nearest of 2^k evenly spaced
levels between the vector's minimum and maximum (the min-max linear quantiser; issue #56).

With lo = min_i v_i and hi = max_i v_i, both sent as float32, step Δ = (hi − lo)/(2^k − 1), each entry is sent as
q_i = round((v_i − lo)/Δ) ∈ {0, …, 2^k − 1} (round half to even) and decoded as lo + q_i·Δ (lo when hi = lo).
Biased, error at most Δ/2 an entry. Encoding counted: 64 + d·k bits, rounded up to whole bytes.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from lightning_fed.checks import check_int
from lightning_fed.communication.base import Compressor, bits_to_bytes

__all__ = ["UniformQuantization"]


class UniformQuantization(Compressor):
    """k-bit deterministic min-max quantisation (see the module doc).

    Args:
        bits: k, 1 ≤ k ≤ 16 (default 8).

    Raises:
        ArgumentError: ``bits`` not an integer in [1, 16].

    Example: 2 bits on [0, 3]: the levels 0, 1, 2, 3::

        >>> UniformQuantization(bits=2).compress(torch.tensor([0.0, 1.4, 1.6, 3.0]))
        (tensor([0., 1., 2., 3.]), 9)
    """

    def __init__(self, bits: int = 8) -> None:
        self.bits = check_int("bits", bits, 1)
        if self.bits > 16:
            from lightning_fed.checks import ArgumentError

            raise ArgumentError(f"`bits` must be an integer in [1, 16], got {bits!r}.")

    def size(self, d: int, element_size: int) -> int:
        """⌈(64 + d·k)/8⌉ bytes."""
        return bits_to_bytes(64 + int(d) * self.bits)

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        d = v.numel()
        nbytes = self.size(d, v.element_size())
        if d == 0:
            return v.clone(), nbytes
        low, high = torch.aminmax(v.detach())  # (exact in float64 too: a float64 holds every float16/32 value)
        lo = float(np.float32(float(low)))  # the 2 × 32 bits sent
        hi = float(np.float32(float(high)))
        if hi == lo:
            return torch.full_like(v, lo), nbytes
        top = 2 ** self.bits - 1
        step = (hi - lo) / top
        # One float64 buffer, written in place: q_i = round((v_i − lo)/Δ), decoded q_i·Δ + lo (= lo + q_i·Δ).
        q = v.detach().to(torch.float64, copy=True).sub_(lo).div_(step).round_().clamp_(0, top)
        return q.mul_(step).add_(lo).to(v.dtype), nbytes
