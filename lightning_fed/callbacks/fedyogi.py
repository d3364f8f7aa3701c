"""FedYogi (Reddi et al. 2021, Alg. 2, l. 13)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer


class FedYogi(AdaptiveServerOptimizer):
    """FedYogi: v_t = v_{t−1} − (1 − β₂)·Δ_t²·sign(v_{t−1} − Δ_t²) (Reddi et al. 2021, Alg. 2, l. 13), then
    x_{t+1} = x_t + η·m_t/(√v_t + τ) (l. 15).

    Defaults: β₁ = 0.9, β₂ = 0.99, τ = 1e-3, v_{−1} = τ², no bias correction. ``convention="flower"`` is Flower's
    FedYogi (v_{−1} = 0, no bias correction), ``convention="tff"`` TFF's ``build_yogi`` (v_{−1} = 1e-6 by
    default, step η·√(1 − β₂^k)/(1 − β₁^k)). See :class:`AdaptiveServerOptimizer` for the arguments, sources and
    errors.
    """

    rule = "yogi"

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        sign = torch._foreach_sub(v, delta_sq)
        for s in sign:
            s.sign_()
        torch._foreach_mul_(sign, delta_sq)
        torch._foreach_add_(v, sign, alpha=-(1.0 - self.beta2))  # v ← v − (1−β₂)Δ²·sign(v − Δ²)
