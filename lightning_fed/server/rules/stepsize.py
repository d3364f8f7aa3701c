"""The adaptive server stepsize of Malitsky & Mishchenko (*Adaptive Gradient Descent without Descent*, ICML 2020,
Alg. 1) on the pseudo-gradient, as in Malinovsky, Mishchenko & Richtárik's Sec. 7 / Fig. 2 ("RR (two stepsizes)").
The formula and its guards are documented on :class:`~lightning_fed.callbacks.AdaptiveServerStepSize`."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.server.checks import check_positive
from lightning_fed.server.rules.base import Rule, zeros_like_all


class StepSizeState(NamedTuple):
    """x_{t−1} (``prev_params``), −g_{t−1} (``prev_direction``), one tensor per parameter, and the scalars
    η_{t−1} (``eta``, ``None`` before the first round) and θ_{t−1} (``theta``, +∞ until the second).

    Example::

        >>> import torch
        >>> AdaptiveStepSize().init([torch.ones(1)])
        StepSizeState(prev_params=[tensor([0.])], prev_direction=[tensor([0.])], eta=None, theta=inf)
    """

    prev_params: list[Tensor]
    prev_direction: list[Tensor]
    eta: Optional[float] = None
    theta: float = math.inf


def _distance(a: list[Tensor], b: list[Tensor]) -> float:
    """‖a − b‖₂ over all tensors together, accumulated in float64."""
    total = 0.0
    for x, y in zip(a, b):
        total += float((x.double() - y.double()).pow(2).sum())
    return math.sqrt(total)


class AdaptiveStepSize(Rule):
    """x_{t+1} = x_t + η_t·Δ_t with η_t = min(√(1 + θ_{t−1})·η_{t−1}, ‖x_t − x_{t−1}‖/(2‖Δ_t − Δ_{t−1}‖))
    (Malitsky & Mishchenko 2020, Alg. 1, l. 3-5), η_0 = ``lr``, θ_t = η_t/η_{t−1}.

    Args:
        lr: η_0 > 0 (default 1e-6, the public AdGD code's ``la_0``).

    Raises:
        ValueError: ``lr`` not a finite number > 0.

    Example: f(x) = x², Δ = −2x: η_0 = 0.1 takes x from 1 to 0.8, then η_1 = 0.2/(2·0.4) = 0.25 takes it to 0.4::

        >>> import torch
        >>> rule, params = AdaptiveStepSize(lr=0.1), [torch.tensor([1.0], dtype=torch.float64)]
        >>> state = rule.init(params)
        >>> for t in (1, 2):
        ...     state = rule.update(params, [-2 * params[0].clone()], state, t)
        ...     print(round(state.eta, 12), round(params[0].item(), 12))
        0.1 0.8
        0.25 0.4
    """

    State = StepSizeState

    def __init__(self, lr: float = 1e-6) -> None:
        self.lr = check_positive("lr", lr)

    def init(self, params: list[Tensor]) -> StepSizeState:
        return StepSizeState(zeros_like_all(params), zeros_like_all(params))

    def next_step_size(self, params: list[Tensor], delta: list[Tensor], state: StepSizeState) -> tuple[float, float]:
        """(η_t, θ_t) for x_t = ``params`` and −g_t = ``delta`` given the previous ``state``."""
        if state.eta is None:
            return self.lr, math.inf
        first = math.sqrt(1.0 + state.theta) * state.eta if math.isfinite(state.theta) else math.inf
        dx = _distance(params, state.prev_params)
        dg = _distance(delta, state.prev_direction)
        second = dx / (2.0 * dg) if dx > 0 and dg > 0 else math.inf
        eta = min(first, second)
        if not math.isfinite(eta):
            eta = state.eta
        return eta, (eta / state.eta if state.eta > 0 else math.inf)

    def update(self, params: list[Tensor], delta: list[Tensor], state: StepSizeState, step: int) -> StepSizeState:
        eta, theta = self.next_step_size(params, delta, state)
        torch._foreach_copy_(state.prev_params, params)
        torch._foreach_copy_(state.prev_direction, delta)
        torch._foreach_add_(params, delta, alpha=eta)  # x ← x − η_t·g_t
        return state._replace(eta=eta, theta=theta)
