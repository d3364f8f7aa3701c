"""Server SGD: x_{t+1} = x_t + η·Δ_t (FedAvg; Reddi et al. 2021, Alg. 1, l. 11 with ServerOpt = SGD)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fed.server.checks import check_positive
from lightning_fed.server.rules.base import NoState, Rule


class SGD(Rule):
    """x_{t+1} = x_t + η·Δ_t (McMahan et al. 2017 with η = 1; Reddi et al. 2021, Alg. 1, l. 11). No state.

    Args:
        lr: Server learning rate η (> 0, default 1.0: the new model is the weighted mean of the client models).

    Raises:
        ValueError: ``lr`` not a finite number > 0.

    Example: x_0 = [1, 1], Δ_0 = [2, −4], η = 0.5::

        >>> import torch
        >>> params = [torch.tensor([1.0, 1.0])]
        >>> rule = SGD(lr=0.5)
        >>> rule.update(params, [torch.tensor([2.0, -4.0])], rule.init(params), 1)
        NoState()
        >>> params  # [1 + 0.5·2, 1 − 0.5·4]
        [tensor([ 2., -1.])]
    """

    State = NoState

    def __init__(self, lr: float = 1.0) -> None:
        self.lr = check_positive("lr", lr)

    def update(self, params: list[Tensor], delta: list[Tensor], state: NoState, step: int) -> NoState:
        torch._foreach_add_(params, delta, alpha=self.lr)
        return state
