"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, Algorithm 1): a shared representation φ (the body), averaged by the server, and a head h_i per
client; in each round a client first trains its head with the body fixed, then the body with its new head fixed, and
sends only the body.

Algorithm 1 (round t, client i of the cohort I^t, step size α; GRD one gradient step)::

    h_i^{t,0} = h_i^{t−1,τ}                                                   (l. 6: the client's own head)
    for s = 1 … τ_h:  h_i^{t,s} = GRD(f_i(φ^t, h_i^{t,s−1}), h_i^{t,s−1}, α)      (l. 7-9: head, body fixed)
    φ_i^{t,0} = φ^t
    for s = 1 … τ_φ:  φ_i^{t,s} = GRD(f_i(φ_i^{t,s−1}, h_i^{t,τ_h}), φ_i^{t,s−1}, α)   (l. 10-12: body, head fixed)
    server:  φ^{t+1} = (1/|I^t|)·Σ_{i∈I^t} φ_i^{t,τ_φ}                              (l. 14)

Here a client's local work of a round (the data module's ``local_epochs`` / ``local_steps``) is τ_h + τ_φ steps:
:class:`FedRepClient` lets its first ``head_steps`` (τ_h) local steps update only the head — the body's gradients are
dropped (``grad = None``) before the client optimizer steps, so it skips them — and the remaining steps only the
body (the head's gradients dropped). It is a :class:`~lightning_fed.client.personal.LocalParts` keeping the head
local, so only the body is aggregated, by any server rule (e.g. FedRep's body under FedAdam). The authors train the
head for 10 local epochs and the body for 1 to 5 (Sec. 5); with ``local_epochs = e_h + e_b`` and n batches per
epoch, ``head_steps = e_h·n``. l. 14's mean is uniform, :class:`~lightning_fed.algorithms.fedrep.FedRep`'s default
``weighting="uniform"``. A client never sampled before starts from the initial head (the global model's, which the
server never changes).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import Tensor

from lightning_fed.checks import check_int
from lightning_fed.client.personal import LocalParts
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedRep", "FedRepClient"]


class FedRepClient(LocalParts):
    """FedRep's client half (Collins et al. 2021, Alg. 1): the head (``head``, by name) stays local; the first
    ``head_steps`` local steps of a round train only the head, the rest only the body.

    Args:
        head: Names of the head's submodules or tensors (e.g. ``["net.2"]``).
        head_steps: τ_h, the local steps per round that train the head (an integer ≥ 0; default 10). A client whose
            local work has at most τ_h steps trains only its head that round.

    Raises:
        TypeError: ``head`` not a list of names.
        ValueError: ``head`` empty, ``head_steps`` not an integer ≥ 0; at fit start, a name that selects nothing.

    Example::

        >>> FedRepClient(head=["classifier"], head_steps=5)
        FedRepClient(head=['classifier'], head_steps=5)
    """

    def __init__(self, head: Sequence[str], head_steps: int = 10) -> None:
        super().__init__(names=head)
        if not self.names:
            raise ValueError("`head` must name at least one submodule or tensor of the model (e.g. ['classifier']).")
        self.head, self.head_steps = list(self.names), check_int("head_steps", head_steps, 0)
        self._step = 0
        self._params_of: list[Tensor] = []

    def settings(self) -> dict[str, Any]:
        return {"head": self.head, "head_steps": self.head_steps}

    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        super().start(module, context, state)
        self._step = 0
        self._params_of = list(module.parameters())

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """Drop the body's gradients in the first ``head_steps`` steps (l. 7-9), the head's afterwards (l. 10-12)."""
        head = set(self._params)
        train_head = self._step < self.head_steps
        for i, p in enumerate(self._params_of):
            if (i in head) != train_head:
                p.grad = None
        self._step += 1


class FedRep(FedAvg):
    """FedRep (Collins et al., ICML 2021, Alg. 1): each client trains its own head for ``head_steps`` local steps
    with the body fixed, then the body with the head fixed; the server averages the body (see
    :mod:`lightning_fed.algorithms.fedrep`).

    Args:
        head: Names of the head (submodules or tensors), e.g. ``["classifier"]``.
        head_steps: τ_h, local steps per round on the head (default 10).
        lr: Server learning rate η (default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1, l. 14) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedRep's (default ``None``).

    Example::

        >>> FedRep(head=["net.2"], head_steps=3).client_algorithms
        [FedRepClient(head=['net.2'], head_steps=3)]
    """

    repr_fields = ("head", "head_steps", "lr", "weighting")

    def __init__(self, head: Sequence[str], head_steps: int = 10, lr: float = 1.0, weighting: str = "uniform",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedRepClient(head, head_steps)]
        self.head, self.head_steps = list(self._own_client[0].head), head_steps
