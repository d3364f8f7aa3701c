"""The sign of the update, one bit an entry (Bernstein, Wang, Azizzadenesheli, Anandkumar: "signSGD: Compressed
Optimisation for Non-Convex Problems", ICML 2018, Alg. 1 and Alg. 3 (majority vote); Karimireddy, Rebjock, Stich,
Jaggi: "Error Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML 2019, Alg. 1 (scaled sign)).

``Sign()`` sends sign(v_i) ∈ {−1, +1} (0 is sent as +1: one bit has two values): d bits. With the server stage
:class:`~lightning_fed.server.aggregators.sign.MajorityVote` the server steps along sign(Σ_i sign(Δ_i)) — signSGD
with majority vote. ``Sign(scaled=True)`` sends (‖v‖₁/d)·sign(v) (EF-SignSGD's compressor, Karimireddy et al.
2019, Alg. 1 l. 4): d bits and the scale as one float32, 32 + d bits; use it with error feedback.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from lightning_fed.communication.base import Compressor, bits_to_bytes

__all__ = ["Sign"]


class Sign(Compressor):
    """The sign of each entry (see the module doc).

    Args:
        scaled: Send (‖v‖₁/d)·sign(v) (EF-SignSGD) instead of sign(v) (default ``False``).

    Raises:
        ArgumentError: ``scaled`` not a bool.

    Example::

        >>> Sign().compress(torch.tensor([0.5, -3.0, 0.0]))
        (tensor([ 1., -1.,  1.]), 1)
        >>> Sign(scaled=True).compress(torch.tensor([0.5, -3.0, 0.0, 1.5]))  # ‖v‖₁/d = 5/4; 32 + 4 bits
        (tensor([ 1.2500, -1.2500,  1.2500,  1.2500]), 5)
    """

    def __init__(self, scaled: bool = False) -> None:
        if not isinstance(scaled, bool):
            from lightning_fed.checks import ArgumentError

            raise ArgumentError(f"`scaled` must be True or False, got {scaled!r}.")
        self.scaled = scaled

    def size(self, d: int, element_size: int) -> int:
        """⌈d/8⌉ bytes; scaled: ⌈(32 + d)/8⌉."""
        return bits_to_bytes(int(d) + (32 if self.scaled else 0))

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        d = v.numel()
        sign = (v.detach() < 0).to(v.dtype).mul_(-2.0).add_(1.0)  # 1 − 2·[v_i < 0]: −1 or +1 (+1 for 0 and NaN)
        if not self.scaled:
            return sign, self.size(d, v.element_size())
        scale = float(np.float32(float(v.detach().to(torch.float64).abs().sum()) / d)) if d else 0.0
        return (sign.to(torch.float64) * scale).to(v.dtype), self.size(d, v.element_size())
