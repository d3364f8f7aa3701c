"""FedAdagrad (Reddi et al. 2021, Alg. 2, l. 12)."""

from __future__ import annotations

from typing import Optional

from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage
from lightning_fed.server.rules.adaptive import adagrad_beta1


class FedAdagrad(AdaptiveServerOptimizer):
    """FedAdagrad: v_t = v_{t−1} + Δ_t² (Reddi et al. 2021, Alg. 2, l. 12), then
    x_{t+1} = x_t + η·m_t/(√v_t + τ) with m_t = β₁m_{t−1} + (1−β₁)Δ_t (l. 11, 15).

    Defaults: β₁ = 0.9 (the paper's Alg. 2 keeps momentum for all three methods; pass ``beta1=0`` for plain
    Adagrad), τ = 1e-3, v_{−1} = ``initial_accumulator`` = τ². With ``bias_correction=True`` only m is
    corrected (β₂ = 0: the sum has nothing to correct).

    ``convention="flower"`` is Flower's FedAdagrad (β₁ = 0, v_{−1} = 0, x ← x + η·Δ/(√v + τ));
    ``convention="tff"`` is TFF's ``build_adagrad`` (no momentum, v_{−1} = 0.1 by default, x ← x + η·Δ/√(v + τ),
    τ inside the root). Both have no momentum, so ``beta1`` defaults to 0 there and any other value is an error.
    See :class:`AdaptiveServerOptimizer` for the other arguments, sources and errors.

    Args:
        beta1: β₁ in [0, 1); ``None`` (default) means 0.9 under ``"reddi"`` and 0 under ``"flower"``/``"tff"``.

    Raises:
        ValueError: as :class:`AdaptiveServerOptimizer`, or ``beta1`` ≠ 0 with ``convention="flower"``/``"tff"``.

    Example: one round from x_0 = 0 with Δ_0 = 0.1 and η = 0.1, against Alg. 2 by hand::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> update = ClientUpdate(0, [torch.tensor([0.1], dtype=torch.float64)], num_samples=1, num_steps=1, loss=0.0)
        >>> _ = FedAdagrad(lr=0.1).server_update(params, [update])
        >>> m = (1 - 0.9) * 0.1                     # m_0 = β₁·0 + (1 − β₁)Δ_0   (l. 11)
        >>> v = 1e-3**2 + 0.1**2  # v_0 = τ² + Δ_0²   (l. 12)
        >>> round(params[0].item(), 10), round(0.1 * m / (v**0.5 + 1e-3), 10)  # x_1 = x_0 + ηm_0/(√v_0 + τ)  (l. 15)
        (0.0099005, 0.0099005)
        >>> FedAdagrad(beta1=0.9, convention="flower")
        Traceback (most recent call last):
        ...
        ValueError: convention='flower': the framework's Adagrad has no momentum (β₁ = 0), got `beta1`=0.9. Leave `beta1` unset or use convention='reddi'.
    """

    rule = "adagrad"

    def __init__(
        self,
        lr: float = 1e-2,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        beta1: Optional[float] = None,
        bias_correction: bool = False,
        weighting: str = "num_samples",
        convention: str = "reddi",
        aggregators: Optional[list[Stage]] = None,
        client: Optional[list[ClientAlgorithm]] = None,
    ) -> None:
        beta1 = adagrad_beta1(beta1, convention)
        super().__init__(lr=lr, beta1=beta1, beta2=0.0, tau=tau, initial_accumulator=initial_accumulator,
                         bias_correction=bias_correction, weighting=weighting, convention=convention,
                         aggregators=aggregators, client=client)
