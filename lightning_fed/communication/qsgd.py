"""QSGD's stochastic quantisation (Alistarh, Grubic, Li, Tomioka, Vojnovic: "QSGD: Communication-Efficient SGD via
Gradient Quantization and Encoding", NeurIPS 2017, Sec. 3.1, eq. (4)-(5)).

Q_s(v)_i = ‖v‖₂ · sgn(v_i) · ξ_i(v, s) with s levels: for r_i = s·|v_i|/‖v‖₂ and l = ⌊r_i⌋ (0 ≤ l ≤ s),
ξ_i = (l + 1)/s with probability p_i = r_i − l, else l/s — unbiased, E[Q_s(v)] = v (Lemma 3.1 (i)).
The draw: s·ξ_i = ⌊r_i + u_i⌋ for u_i uniform in [0, 1) (it is l + 1 exactly when u_i ≥ 1 − p_i, probability p_i),
u = ``torch.rand(d, generator=g)`` (float32) from the client's generator
(:func:`~lightning_fed.communication.base.client_generator`); the arithmetic is float64.

Encoding counted (fixed length, not the Elias code of Sec. 3.2): ‖v‖₂ as one float32 (32 bits), then per coordinate
one sign bit and ⌈log₂(s + 1)⌉ bits for its level l' ∈ {0, …, s}: 32 + d·(1 + ⌈log₂(s + 1)⌉) bits, rounded up to
whole bytes. The server decodes with the float32 norm it received.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from lightning_fed.checks import check_positive_int
from lightning_fed.communication.base import Compressor, bits_to_bytes

__all__ = ["QSGD"]


class QSGD(Compressor):
    """QSGD's unbiased stochastic quantisation with ``levels`` = s levels (see the module doc for the source and
    the encoding counted).

    Args:
        levels: s ≥ 1 (default 15: 4 bits a level and a sign bit; 7: 4 bits an entry in all, "QSGD 4-bit"; 1:
            ternary, sign and norm only).

    Raises:
        ArgumentError: ``levels`` not an integer ≥ 1.

    Example: s = 1 on v = (3, −4) (‖v‖ = 5): each entry is ±5 with probability |v_i|/5, else 0::

        >>> from lightning_fed.communication.base import client_generator
        >>> QSGD(levels=1).compress(torch.tensor([3.0, -4.0]), client_generator(0, 0, 0))
        (tensor([ 0., -5.]), 5)
    """

    stochastic = True

    def __init__(self, levels: int = 15) -> None:
        self.levels = check_positive_int("levels", levels)

    def level_bits(self) -> int:
        """⌈log₂(s + 1)⌉: the bits of one level l' ∈ {0, …, s}."""
        return int(math.ceil(math.log2(self.levels + 1)))

    def size(self, d: int, element_size: int) -> int:
        """⌈(32 + d·(1 + ⌈log₂(s + 1)⌉))/8⌉ bytes."""
        return bits_to_bytes(32 + int(d) * (1 + self.level_bits()))

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        d, s = v.numel(), self.levels
        nbytes = self.size(d, v.element_size())
        # One float64 buffer, written in place: |v_i| (exact in float64), ‖v‖₂ = ‖|v|‖₂ (the same squares summed),
        # r_i = |v_i|/‖v‖·s, then s·ξ_i = ⌊r_i + u_i⌋ (u_i promoted exactly) and its sign, v_i's.
        level = v.detach().to(torch.float64, copy=True).abs_()
        norm = float(torch.linalg.vector_norm(level))
        u = torch.rand(d, generator=generator)  # drawn even for v = 0: the draws stay aligned
        if norm == 0.0:
            return torch.zeros_like(v), nbytes
        level.div_(norm).mul_(s).add_(u).floor_().clamp_(max=s)
        sent_norm = float(np.float32(norm))  # the 32 bits sent
        return level.copysign_(v.detach()).mul_(sent_norm / s).to(v.dtype), nbytes
