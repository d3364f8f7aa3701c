"""The server side of Fed-LAMB / Fed-AMS (Karimi, Li, Li, *Layerwise and Dimensionwise Locally Adaptive
Optimization*, Algorithm 1, l. 16) as a reducer: model averaging plus the max-averaged second moment v̂ (and the
averaged first moment m̄). Composed with the SGD rule it is the server of
:class:`~lightning_fed.callbacks.LocalAdaptiveServer` (:class:`~lightning_fed.callbacks.FedLAMB`,
:class:`~lightning_fed.callbacks.FedAMS`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean

__all__ = ["MaxSecondMoment"]


class MaxSecondMoment(Stage):
    """Reducer of Karimi et al., Alg. 1, l. 16, with w_i = counts_i / Σ counts (uniform counts: the paper's mean)::

        Δ_t     = Σ_i w_i·Δ_i                   (the model average; the rule steps θ̄ + η·Δ_t)
        v̂_{r+1} = max(v̂_r, Σ_i w_i·v_i^T)      (v_i^T = ``extras["exp_avg_sq"]``)
        m̄_{r+1} = Σ_i w_i·m_i^T                 (``average_first_moment``; m_i^T = ``extras["exp_avg"]``)

    Δ_t is summed in float64 (:class:`~lightning_fed.server.aggregators.WeightedMean`); the moments are summed in
    their own dtype with the float weights w_i, and v̂, m̄ are updated in place. The :class:`State` holds
    v̂ = ``initial_second_moment``·1 and m̄ = 0 shaped like the parameters (:meth:`init_state`).

    Args:
        initial_second_moment: v̂_0 (≥ 0; Alg. 1, l. 2: ε).
        average_first_moment: Keep and average m̄ (``first_moment="average"``; default ``False``).
        owner: The name in error messages (default ``"MaxSecondMoment"``).

    Raises:
        ValueError: in :meth:`apply`, ``ClientDeltas.updates`` missing or an update without the extras needed.

    Example: two clients (uniform weights) with Δ = [1], [3] and v^T = [4], [0]: Δ_t = 2 and
    v̂ = max(0.5, (4 + 0)/2) = 2::

        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([1.0])], 1, 1, 0.0, extras={"exp_avg_sq": [torch.tensor([4.0])]}),
        ...            ClientUpdate(1, [torch.tensor([3.0])], 1, 1, 0.0, extras={"exp_avg_sq": [torch.tensor([0.0])]})]
        >>> x = ClientDeltas([0, 1], [u.delta for u in updates], torch.ones(2, dtype=torch.float64), updates)
        >>> stage = MaxSecondMoment(initial_second_moment=0.5)
        >>> stage.apply(x, stage.init_state(x.deltas[0], 2), RoundInfo(0, 0, 2, 2))
        ([tensor([2.])], State(second_moment=[tensor([2.])], first_moment=None))
    """

    kind = "reduce"

    class State(NamedTuple):
        """v̂ and m̄ (``None`` without ``average_first_moment``), one tensor per parameter."""

        second_moment: Optional[list[Tensor]] = None
        first_moment: Optional[list[Tensor]] = None

    def __init__(self, initial_second_moment: float = 1e-8, average_first_moment: bool = False,
                 owner: str = "MaxSecondMoment") -> None:
        self.initial_second_moment = initial_second_moment
        self.average_first_moment = average_first_moment
        self.owner = owner

    def init_state(self, params: list[Tensor], num_clients: int = 0) -> "MaxSecondMoment.State":
        """v̂_0 = ``initial_second_moment``·1 and (with ``average_first_moment``) m̄_0 = 0, shaped like ``params``."""
        return self.State(
            [torch.full_like(p, self.initial_second_moment) for p in params],
            [torch.zeros_like(p) for p in params] if self.average_first_moment else None,
        )

    def _weighted_mean(self, updates: list, weights: list[float], key: str) -> list[Tensor]:
        for u in updates:
            if key not in u.extras:
                raise ValueError(
                    f"{self.owner}: client {u.client_id}'s update has no `extras[{key!r}]`; the client "
                    "executor must call `collect_client_extras`."
                )
        result = [torch.mul(t, weights[0]) for t in updates[0].extras[key]]
        for w, u in zip(weights[1:], updates[1:]):
            torch._foreach_add_(result, [t.to(r.device) for t, r in zip(u.extras[key], result)], alpha=w)
        return result

    def apply(self, x: ClientDeltas, state: "MaxSecondMoment.State", info: RoundInfo) -> tuple[list[Tensor], "MaxSecondMoment.State"]:
        """Δ_t and the state with v̂ (and m̄) updated in place."""
        if x.updates is None:
            raise ValueError(f"{self.owner} needs `ClientDeltas.updates` (the clients' moments in their extras).")
        pseudo_gradient, _ = WeightedMean().apply(x, state, info)
        if state.second_moment is None:
            state = self.init_state(x.deltas[0])
        weights = (x.counts / x.counts.sum()).tolist()
        with torch.no_grad():
            mean_v = self._weighted_mean(x.updates, weights, "exp_avg_sq")
            for v_hat, v in zip(state.second_moment, mean_v):
                torch.maximum(v_hat, v.to(v_hat.device, v_hat.dtype), out=v_hat)
            if self.average_first_moment:
                mean_m = self._weighted_mean(x.updates, weights, "exp_avg")
                for m_bar, m in zip(state.first_moment, mean_m):
                    m_bar.copy_(m)
        return pseudo_gradient, state
