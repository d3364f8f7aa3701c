"""FedAdam (Reddi et al. 2021, Alg. 2, l. 14)."""

from __future__ import annotations

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer


class FedAdam(AdaptiveServerOptimizer):
    """FedAdam: v_t = β₂·v_{t−1} + (1 − β₂)·Δ_t² (Reddi et al. 2021, Alg. 2, l. 14), then
    x_{t+1} = x_t + η·m_t/(√v_t + τ) (l. 15).

    Defaults: β₁ = 0.9, β₂ = 0.99, τ = 1e-3, v_{−1} = τ², no bias correction. ``convention="flower"`` is Flower's
    FedAdam (v_{−1} = 0, step η·√(1 − β₂^{k+1})/(1 − β₁^{k+1}) in round k ≥ 1), ``convention="tff"`` TFF's
    ``build_adam`` (v_{−1} = 0, step η·√(1 − β₂^k)/(1 − β₁^k)); ``bias_correction=True`` is torch.optim.Adam's
    placement, matching neither. See :class:`AdaptiveServerOptimizer` for the arguments, sources and errors.

    Example: one round from x_0 = 0 with Δ_0 = 0.1 and η = 0.1, against Alg. 2 by hand::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> update = ClientUpdate(0, [torch.tensor([0.1], dtype=torch.float64)], num_samples=1, num_steps=1, loss=0.0)
        >>> _ = FedAdam(lr=0.1).server_update(params, [update])
        >>> m = (1 - 0.9) * 0.1                     # m_0 = β₁·0 + (1 − β₁)Δ_0   (l. 11)
        >>> v = 0.99 * 1e-3**2 + (1 - 0.99) * 0.1**2  # v_0 = β₂τ² + (1 − β₂)Δ_0²   (l. 14)
        >>> round(params[0].item(), 10), round(0.1 * m / (v**0.5 + 1e-3), 10)  # x_1 = x_0 + ηm_0/(√v_0 + τ)  (l. 15)
        (0.0905028312, 0.0905028312)
    """

    rule = "adam"
