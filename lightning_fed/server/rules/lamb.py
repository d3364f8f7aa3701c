"""LAMB on the server (You et al. 2020, Algorithm 2) applied to g_t = −Δ_t: layerwise adaptivity, no client state."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.server.checks import check_in_range, check_phi_bounds, check_positive, check_unit_interval
from lightning_fed.server.moments import adam_moments_, bias_corrections
from lightning_fed.server.rules.base import Rule, zeros_like_all


def layerwise_scale(param: Tensor, update: Tensor, phi_min: float = 0.0, phi_max: float = math.inf) -> Tensor:
    """The layerwise trust ratio φ(‖θ‖)/‖u‖ of one parameter tensor (a 0-d tensor, on ``param``'s device).

    φ(z) = min(max(z, γ_l), γ_u) (You et al. 2020, *Large Batch Optimization for Deep Learning*, Sec. 3;
    identity for γ_l = 0, γ_u = ∞, Karimi et al., Sec. 4 "we use the identity function for φ").

    Where φ(‖θ‖) = 0 (a tensor that is all zeros, e.g. a zero-initialised bias, with γ_l = 0) or ‖u‖ = 0, the
    ratio is 1: the paper's rule would multiply the step by 0 and freeze a zero tensor forever; ratio 1 is the
    convention of the LAMB reference implementations (trust ratio 1 when a norm is zero).
    """
    phi = torch.linalg.vector_norm(param).clamp(min=phi_min, max=phi_max)
    unorm = torch.linalg.vector_norm(update)
    ok = (phi > 0) & (unorm > 0)
    return torch.where(ok, phi / torch.where(ok, unorm, torch.ones_like(unorm)), torch.ones_like(phi))



class LAMBState(NamedTuple):
    """m (``exp_avg``) and v (``exp_avg_sq``), one tensor per parameter, both starting at 0.

    Example::

        >>> import torch
        >>> LAMB().init([torch.ones(1)])
        LAMBState(exp_avg=[tensor([0.])], exp_avg_sq=[tensor([0.])])
    """

    exp_avg: list[Tensor]
    exp_avg_sq: list[Tensor]


class LAMB(Rule):
    """One LAMB step on g_t = −Δ_t per round (You et al. 2020, *Large Batch Optimization for Deep Learning*,
    Alg. 2; the formula, defaults and the trust-ratio convention are documented on
    :class:`~lightning_fed.callbacks.ServerLAMB`, which composes this rule).

    Args:
        lr: η > 0 (default 1e-2). beta1, beta2: in [0, 1) (0.9, 0.999). eps: ε > 0 (1e-6).
        weight_decay: λ ≥ 0 (0). bias_correction: bool (``True``). phi_min: γ_l ≥ 0 (0). phi_max: γ_u (``None``: ∞).

    Raises:
        ValueError: an argument outside its range (the message names it).

    Example: x_0 = [3, 4], Δ_0 = [1, 0]: the tensor moves by η·‖x_0‖ = 0.05 along Δ::

        >>> import torch
        >>> params = [torch.tensor([3.0, 4.0], dtype=torch.float64)]
        >>> rule = LAMB(lr=0.01)
        >>> _ = rule.update(params, [torch.tensor([1.0, 0.0], dtype=torch.float64)], rule.init(params), 1)
        >>> [round(v, 6) for v in params[0].tolist()]
        [3.05, 4.0]
    """

    State = LAMBState

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
    ) -> None:
        self.lr = check_positive("lr", lr)
        self.beta1 = check_unit_interval("beta1", beta1)
        self.beta2 = check_unit_interval("beta2", beta2)
        self.eps = check_positive("eps", eps)
        self.weight_decay = check_in_range("weight_decay", weight_decay, low=0.0, low_open=False)
        if not isinstance(bias_correction, bool):
            raise ValueError(f"`bias_correction` must be a bool, got {bias_correction!r}.")
        self.bias_correction = bias_correction
        self.phi_min, self.phi_max = check_phi_bounds(phi_min, phi_max)

    def init(self, params: list[Tensor]) -> LAMBState:
        return LAMBState(zeros_like_all(params), zeros_like_all(params))

    def update(self, params: list[Tensor], delta: list[Tensor], state: LAMBState, step: int) -> LAMBState:
        c1, c2 = bias_corrections(self.beta1, self.beta2, step, self.bias_correction, self.bias_correction)
        for x, d, m, v in zip(params, delta, state.exp_avg, state.exp_avg_sq):
            g = -d
            adam_moments_(m, v, g, self.beta1, self.beta2)
            update = m.div(c1).div_(v.div(c2).sqrt_().add_(self.eps))
            if self.weight_decay != 0:
                update.add_(x, alpha=self.weight_decay)
            update.mul_(layerwise_scale(x, update, self.phi_min, self.phi_max))
            x.add_(update, alpha=-self.lr)
        return state

    def __repr__(self) -> str:
        phi_max = None if math.isinf(self.phi_max) else self.phi_max
        return (f"LAMB(lr={self.lr}, beta1={self.beta1}, beta2={self.beta2}, eps={self.eps}, "
                f"weight_decay={self.weight_decay}, bias_correction={self.bias_correction}, "
                f"phi_min={self.phi_min}, phi_max={phi_max})")
