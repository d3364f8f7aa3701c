"""Server momentum on g_t = −Δ_t: heavy ball (FedAvgM, Hsu et al. 2019) and Nesterov, as ``torch.optim.SGD``."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lightning_fed.server.checks import check_positive, check_unit_interval
from lightning_fed.server.rules.base import Rule, zeros_like_all


class MomentumState(NamedTuple):
    """The momentum buffer b, one tensor per parameter.

    Example::

        >>> import torch
        >>> Momentum().init([torch.ones(2)])
        MomentumState(momentum_buffer=[tensor([0., 0.])])
    """

    momentum_buffer: list[Tensor]


class Momentum(Rule):
    """SGD with momentum μ on g_t = −Δ_t, exactly ``torch.optim.SGD(momentum=μ, dampening=0)`` from a zero buffer
    (Hsu, Qi & Brown 2019, *Measuring the Effects of Non-Identical Data Distribution*, FedAvgM; Reddi et al.
    2021, Alg. 1 with ServerOpt = SGD with momentum)::

        b_t = μ·b_{t−1} + g_t                 (b_0 = 0, so b_1 = g_1)
        x_{t+1} = x_t − η·b_t                 (heavy ball, ``nesterov=False``)
        x_{t+1} = x_t − η·(g_t + μ·b_t)       (Nesterov, ``nesterov=True``; torch's formulation, Sutskever et al. 2013)

    Args:
        lr: Server learning rate η (> 0, default 1.0).
        momentum: μ in [0, 1) (default 0.9).
        nesterov: Nesterov's look-ahead (default ``False``).

    Raises:
        ValueError: ``lr`` not finite and > 0, ``momentum`` outside [0, 1), ``nesterov`` not a bool.

    Example: Δ = 1 twice, μ = 0.9, η = 1: heavy ball x = 1 then 2.9; Nesterov x = 1.9 then 1.9 + 1 + 0.9·1.9 = 4.61::

        >>> import torch
        >>> for rule in (Momentum(momentum=0.9), Momentum(momentum=0.9, nesterov=True)):
        ...     params = [torch.tensor([0.0], dtype=torch.float64)]
        ...     state = rule.init(params)
        ...     for t in (1, 2):
        ...         state = rule.update(params, [torch.tensor([1.0], dtype=torch.float64)], state, t)
        ...     print(round(params[0].item(), 12))
        2.9
        4.61
    """

    State = MomentumState

    def __init__(self, lr: float = 1.0, momentum: float = 0.9, nesterov: bool = False) -> None:
        self.lr = check_positive("lr", lr)
        self.momentum = check_unit_interval("momentum", momentum)
        if not isinstance(nesterov, bool):
            raise ValueError(f"`nesterov` must be a bool, got {nesterov!r}.")
        self.nesterov = nesterov

    def init(self, params: list[Tensor]) -> MomentumState:
        return MomentumState(zeros_like_all(params))

    def update(self, params: list[Tensor], delta: list[Tensor], state: MomentumState, step: int) -> MomentumState:
        buf = state.momentum_buffer
        # b ← μ·b + g with g = −Δ (b starts at 0, so b_1 = g_1 as in torch's SGD).
        torch._foreach_mul_(buf, self.momentum)
        torch._foreach_sub_(buf, delta)
        if self.nesterov:
            direction = torch._foreach_mul(buf, self.momentum)
            torch._foreach_sub_(direction, delta)  # g + μ·b
            torch._foreach_add_(params, direction, alpha=-self.lr)
        else:
            torch._foreach_add_(params, buf, alpha=-self.lr)
        return state
