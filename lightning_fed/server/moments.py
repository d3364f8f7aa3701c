"""The one place where the Adam / AMSGrad moment updates are written (Kingma & Ba 2015, Alg. 1, l. 7-8;
Reddi, Kale & Kumar 2018, AMSGrad, Alg. 2, l. 6-7).

Two forms, because existing runs are pinned bit for bit and the two forms round differently in the last bit:

* the *foreach* form over lists of tensors (:func:`first_moment_`, :func:`second_moment_adam_`), used by the
  server rules of Reddi et al. 2021, Alg. 2 (:mod:`lightning_fed.server.rules.adaptive`):
  m ← lerp(m, Δ, 1 − β₁), v ← lerp(v, Δ², 1 − β₂);
* the *per-tensor* form (:func:`adam_moments_`, :func:`amsgrad_max_`, :func:`bias_corrections`), used by LAMB on
  the server (:mod:`lightning_fed.server.rules.lamb`) and by the Fed-LAMB / Fed-AMS client optimizers
  (:mod:`lightning_fed.algorithms.fedlamb`): m ← lerp(m, g, 1 − β₁), v ← β₂·v + (1 − β₂)·g·g (addcmul).

All functions update their first arguments in place.

Example: one step from m = v = 0 with g = 2, β₁ = 0.9, β₂ = 0.99::

    >>> import torch
    >>> m, v = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    >>> adam_moments_(m, v, torch.tensor([2.0], dtype=torch.float64), 0.9, 0.99)
    >>> round(m.item(), 12), round(v.item(), 12)  # (1 − β₁)·g, (1 − β₂)·g²
    (0.2, 0.04)
    >>> bias_corrections(0.9, 0.99, 1)  # (1 − β₁¹, 1 − β₂¹)
    (0.09999999999999998, 0.010000000000000009)
"""

from __future__ import annotations

import torch
from torch import Tensor


def first_moment_(m: list[Tensor], delta: list[Tensor], beta1: float) -> None:
    """m ← β₁·m + (1 − β₁)·Δ for lists of tensors (Reddi et al. 2021, Alg. 2, l. 11), as ``lerp``."""
    torch._foreach_lerp_(m, delta, 1.0 - beta1)


def second_moment_adam_(v: list[Tensor], delta_sq: list[Tensor], beta2: float) -> None:
    """v ← β₂·v + (1 − β₂)·Δ² for lists of tensors given Δ² (Reddi et al. 2021, Alg. 2, l. 14), as ``lerp``."""
    torch._foreach_lerp_(v, delta_sq, 1.0 - beta2)


def adam_moments_(m: Tensor, v: Tensor, grad: Tensor, beta1: float, beta2: float) -> None:
    """m ← β₁·m + (1 − β₁)·g and v ← β₂·v + (1 − β₂)·g² for one tensor (Kingma & Ba 2015, Alg. 1, l. 7-8;
    Karimi et al., Fed-LAMB Alg. 1, l. 9-10; You et al. 2020, LAMB Alg. 2)."""
    m.lerp_(grad, 1.0 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)


def amsgrad_max_(v_hat: Tensor, v: Tensor) -> None:
    """v̂ ← max(v̂, v) elementwise (AMSGrad, Reddi, Kale & Kumar 2018, Alg. 2, l. 7)."""
    torch.maximum(v_hat, v, out=v_hat)


def bias_corrections(beta1: float, beta2: float, step: int, first: bool = True, second: bool = True) -> tuple[float, float]:
    """(1 − β₁ᵗ, 1 − β₂ᵗ) at step t ≥ 1 (Kingma & Ba 2015, Alg. 1, l. 9-10), each 1.0 where not requested."""
    return (1.0 - beta1**step if first else 1.0, 1.0 - beta2**step if second else 1.0)
