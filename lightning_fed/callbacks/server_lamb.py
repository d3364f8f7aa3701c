"""ServerLAMB: LAMB (You et al. 2020) applied by the server to the pseudo-gradient — layerwise adaptivity with no
client state."""

from __future__ import annotations

from typing import Optional

from lightning_fed.callbacks.server_optimizer import ServerOptimizer, none_if_infinite
from lightning_fed.server.aggregators.base import Stage
from lightning_fed.server.checks import check_positive, check_weighting
from lightning_fed.server.rules.lamb import LAMB


class ServerLAMB(ServerOptimizer):
    """The server treats g_t = −Δ_t as a gradient and takes one LAMB step (You et al. 2020, *Large Batch
    Optimization for Deep Learning: Training BERT in 76 Minutes*, Algorithm 2; the ServerOpt slot of Reddi et
    al. 2021, Alg. 1, l. 11; FLSim's ``FedLAMBOptimizer`` offers the same).

    Round t = 1, 2, ... (``self.num_steps``), per parameter tensor x^ℓ::

        g_t = −Δ_t
        m_t = β₁·m_{t−1} + (1 − β₁)·g_t                      (m_0 = 0)
        v_t = β₂·v_{t−1} + (1 − β₂)·g_t²                     (v_0 = 0)
        m̂_t = m_t/(1 − β₁ᵗ),  v̂_t = v_t/(1 − β₂ᵗ)            (if ``bias_correction``, as Alg. 2)
        r_t = m̂_t/(√v̂_t + ε)
        u_t = r_t + λ·x_t^ℓ
        x_{t+1}^ℓ = x_t^ℓ − η·φ(‖x_t^ℓ‖)/‖u_t^ℓ‖·u_t^ℓ

    with φ(z) = min(max(z, γ_l), γ_u) (Sec. 3 of You et al.; identity by default). Each parameter tensor moves
    by η·φ(‖x^ℓ‖) per round, whatever the scale of Δ. Where φ(‖x^ℓ‖) = 0 or u^ℓ = 0 the trust ratio is 1
    (the step is η·u^ℓ), as in the LAMB reference implementations; otherwise a zero-initialised tensor would
    never move. State: ``exp_avg`` (m) and ``exp_avg_sq`` (v), one tensor per parameter. The composition
    ``ServerOptimizer(rule=LAMB(...), aggregators=...)`` (:class:`~lightning_fed.server.rules.LAMB`).

    Defaults: η = 0.01, β₁ = 0.9, β₂ = 0.999, ε = 1e-6 (You et al.'s BERT setting), λ = 0, bias correction on.

    Args:
        lr: Server learning rate η (> 0): the per-round step relative to each tensor's norm.
        beta1: β₁ in [0, 1).
        beta2: β₂ in [0, 1).
        eps: ε > 0.
        weight_decay: λ ≥ 0 (decoupled, added to r_t).
        bias_correction: Apply Adam's bias correction (default ``True``, as Alg. 2).
        phi_min: γ_l ≥ 0 (default 0).
        phi_max: γ_u > 0, ≥ γ_l (default ``None``: ∞).
        weighting: ``"num_samples"`` (default) or ``"uniform"`` aggregation of the client deltas.
        aggregators: An aggregator chain in place of the weighted mean (default ``None``).

    Raises:
        ValueError: an argument outside its range (the message names it), or an unknown ``weighting``.

    Example: x_0 = [3, 4] (‖x_0‖ = 5), Δ_0 = [1, 0]. With bias correction r_1 = g/(|g| + ε) ≈ [−1, 0], so the
    tensor moves by η·‖x_0‖ = 0.01·5 = 0.05 along −r_1::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([3.0, 4.0], dtype=torch.float64)]
        >>> update = ClientUpdate(0, [torch.tensor([1.0, 0.0], dtype=torch.float64)], num_samples=1, num_steps=1, loss=0.0)
        >>> _ = ServerLAMB(lr=0.01).server_update(params, [update])
        >>> [round(v, 6) for v in params[0].tolist()]
        [3.05, 4.0]
        >>> ServerLAMB(beta2=1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `beta2` must be a number in [0, 1), got 1.0.
    """

    state_key_fields = ("lr", "beta1", "beta2", "eps", "weight_decay", "weighting")
    repr_fields = ("lr", "weighting", "beta1", "beta2", "eps", "weight_decay", "bias_correction", "phi_min", "phi_max")
    repr_formats = {"phi_max": none_if_infinite}

    def __init__(
        self,
        lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        phi_min: float = 0.0,
        phi_max: Optional[float] = None,
        weighting: str = "num_samples",
        aggregators: Optional[list[Stage]] = None,
    ) -> None:
        check_positive("lr", lr)
        check_weighting(weighting)
        rule = LAMB(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                    bias_correction=bias_correction, phi_min=phi_min, phi_max=phi_max)
        super().__init__(weighting=weighting, aggregators=aggregators, rule=rule)
        self.beta1, self.beta2, self.eps, self.weight_decay = rule.beta1, rule.beta2, rule.eps, rule.weight_decay
        self.bias_correction = rule.bias_correction
        self.phi_min, self.phi_max = rule.phi_min, rule.phi_max
