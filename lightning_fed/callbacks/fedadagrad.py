"""FedAdagrad (Reddi et al. 2021, Alg. 2, l. 12)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer


class FedAdagrad(AdaptiveServerOptimizer):
    """FedAdagrad: v_t = v_{t−1} + Δ_t² (Reddi et al. 2021, Alg. 2, l. 12), then
    x_{t+1} = x_t + η·m_t/(√v_t + τ) with m_t = β₁m_{t−1} + (1−β₁)Δ_t (l. 11, 15).

    Defaults: β₁ = 0.9 (the paper's Alg. 2 keeps momentum for all three methods; pass ``beta1=0`` for plain
    Adagrad), τ = 1e-3, v_{−1} = ``initial_accumulator`` = τ². With ``bias_correction=True`` only m is
    corrected (β₂ = 0: the sum has nothing to correct). See :class:`AdaptiveServerOptimizer` for the arguments
    and errors.
    """

    def __init__(
        self,
        lr: float = 1e-2,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        beta1: float = 0.9,
        bias_correction: bool = False,
        weighting: str = "num_samples",
    ) -> None:
        super().__init__(lr=lr, beta1=beta1, beta2=0.0, tau=tau, initial_accumulator=initial_accumulator,
                         bias_correction=bias_correction, weighting=weighting)

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        torch._foreach_add_(v, delta_sq)  # v ← v + Δ²
