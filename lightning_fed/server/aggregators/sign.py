"""signSGD with majority vote as a reducer stage (Bernstein, Wang, Azizzadenesheli, Anandkumar: "signSGD:
Compressed Optimisation for Non-Convex Problems", ICML 2018, Alg. 3; Bernstein, Zhao, Azizzadenesheli, Anandkumar:
"signSGD with Majority Vote is Communication Efficient and Fault Tolerant", ICLR 2019, Alg. 1).

Each client sends sign(Δ_i) (one bit an entry: the client half
``Compression(Sign())`` of :mod:`lightning_fed.communication.sign`); the server takes the elementwise majority,
Δ_t = sign(Σ_i sign(Δ_i)) — every client one vote, whatever its size — and the server rule steps along it
(``FedAvg(lr=η, aggregators=[MajorityVote()])``: x_{t+1} = x_t + η·Δ_t, Alg. 3's update with the model change's
sign, Δ_i ≈ −γ·g_i). A tie (an even number of votes that cancel) gives 0: that coordinate does not move.
The stage takes the sign of what it receives, so a client sending its full Δ_i votes the same.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage

__all__ = ["MajorityVote"]

#: The stages of :mod:`lightning_fed.server.aggregators.dp` a vote is refused with.
_DP_STAGES = ("ClipUpdates", "AdaptiveClip", "DPMean", "GaussianNoise")


class MajorityVote(Stage):
    """Δ_t = sign(Σ_i sign(Δ_i)), unweighted (see the module doc).

    Raises:
        ValueError: at fit start, with a DP stage in the chain (ClipUpdates, AdaptiveClip, DPMean, GaussianNoise):
            DP-FedAvg's accountant assumes the clipped weighted mean of the updates plus Gaussian noise; a sign vote
            is another release, whose sensitivity (one client flips a coordinate's vote) the accountant's ε does not
            describe.

    Example: three clients vote on two coordinates::

        >>> x = ClientDeltas([0, 1, 2], [[torch.tensor([0.5, -1.0])], [torch.tensor([-0.1, -3.0])],
        ...                              [torch.tensor([2.0, 0.2])]], torch.ones(3, dtype=torch.float64))
        >>> MajorityVote().apply(x, (), RoundInfo(0, 0, 3, 3))[0]
        [tensor([ 1., -1.])]
    """

    kind = "reduce"

    def __init__(self) -> None:
        pass

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        votes = [torch.sign(d).to(torch.float64) for d in x.deltas[0]]
        for delta in x.deltas[1:]:
            torch._foreach_add_(votes, [torch.sign(d).to(device=v.device, dtype=torch.float64)
                                        for d, v in zip(delta, votes)])
        return [torch.sign(v).to(d.dtype) for v, d in zip(votes, x.deltas[0])], state

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        dp = [type(s).__name__ for s in getattr(server, "aggregators", None) or () if type(s).__name__ in _DP_STAGES]
        if dp:
            raise ValueError(
                f"MajorityVote cannot run with the DP stage(s) {dp} of {type(server).__name__}: the accountant's ε "
                "covers the Gaussian mechanism on the clipped mean of the updates, not a sign vote. Use the DP "
                "chain's own mean (DPMean) without MajorityVote, or MajorityVote without DP.")
