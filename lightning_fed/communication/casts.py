"""Casts of the update to a 16-bit float type: each entry sent as float16 or bfloat16 (issue #56; pfl's bf16
transport): 2 bytes an entry, decoded by casting back (round to nearest even, IEEE 754)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lightning_fed.communication.base import Compressor

__all__ = ["BFloat16", "Float16"]


class _Cast(Compressor):
    dtype: torch.dtype = torch.float16

    def size(self, d: int, element_size: int) -> int:
        """2 bytes an entry."""
        return 2 * int(d)

    def compress(self, v: Tensor, generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
        """``v`` rounded to :attr:`dtype` and back; ``2·d`` bytes."""
        sent = v.to(self.dtype)
        return sent.to(v.dtype), self.size(v.numel(), v.element_size())


class Float16(_Cast):
    """Each entry as IEEE float16 (2 bytes): values beyond ±65504 become ±inf (the loop then drops the update as
    non-finite), below 6e-8 zero.

    Example::

        >>> Float16().compress(torch.tensor([1.0, 1.0 + 2**-12, 70000.0]))
        (tensor([1., 1., inf]), 6)
    """

    dtype = torch.float16

    def __init__(self) -> None:
        pass


class BFloat16(_Cast):
    """Each entry as bfloat16 (2 bytes: float32's exponent, 8 bits of mantissa).

    Example::

        >>> BFloat16().compress(torch.tensor([1.0, 1.0 + 2**-9, 70000.0]))
        (tensor([1.0000e+00, 1.0000e+00, 7.0144e+04]), 6)
    """

    dtype = torch.bfloat16

    def __init__(self) -> None:
        pass
