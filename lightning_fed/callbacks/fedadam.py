"""FedAdam (Reddi et al. 2021, Alg. 2, l. 14)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer


class FedAdam(AdaptiveServerOptimizer):
    """FedAdam: v_t = β₂·v_{t−1} + (1 − β₂)·Δ_t² (Reddi et al. 2021, Alg. 2, l. 14), then
    x_{t+1} = x_t + η·m_t/(√v_t + τ) (l. 15).

    Defaults: β₁ = 0.9, β₂ = 0.99, τ = 1e-3, v_{−1} = τ², no bias correction. ``convention="flower"`` is Flower's
    FedAdam (v_{−1} = 0, step η·√(1 − β₂^{k+1})/(1 − β₁^{k+1}) in round k ≥ 1), ``convention="tff"`` TFF's
    ``build_adam`` (v_{−1} = 0, step η·√(1 − β₂^k)/(1 − β₁^k)); ``bias_correction=True`` is torch.optim.Adam's
    placement, matching neither. See :class:`AdaptiveServerOptimizer` for the arguments, sources and errors.
    """

    rule = "adam"

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        torch._foreach_lerp_(v, delta_sq, 1.0 - self.beta2)  # v ← β₂v + (1−β₂)Δ²
