"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization Layers", arXiv
1912.00818, 2019, Sec. 3 / Algorithm 1): the model is base layers W_B, shared and averaged by the server as in
FedAvg, and personalisation layers W_P (the head), which each client keeps.

Algorithm 1 (client j)::

    receive W_B from the server; W_P,j is the client's own (initialised once, like W_B)
    for each local epoch e = 1 … E, for each batch b:  (W_B, W_P,j) ← (W_B, W_P,j) − η·∇L_j(W_B, W_P,j; b)
    send W_B to the server, keep W_P,j

    server:  W_B ← Σ_j (n_j / n)·W_B,j        (the FedAvg mean over the round's clients)

Here the local epochs are the client's local work of a round and the server step is any server rule over the base
layers: :class:`FedPerClient` is a :class:`~lightning_fed.client.personal.LocalParts` keeping the head (by name) local,
so the clients' updates are 0 there and only W_B is aggregated. Base and head are trained jointly at every local
step (unlike FedRep, :mod:`lightning_fed.algorithms.fedrep`). The paper weights the mean by the clients' sizes, as
:class:`~lightning_fed.algorithms.fedper.FedPer`'s default ``weighting="num_samples"``. A client never sampled before starts
from the initial head (the global model's, which the server never changes).

Where this differs from the paper:

* partial participation: the mean is over the round's cohort, and a client never sampled before starts from the
  initial head (the paper's W_P,j are initialised once, like W_B; here that initial value is the global model's);
  until it is sampled its personal model is the global model (``fed_personal_<m>``,
  :func:`lightning_fed.personal.personal_model` with ``untrained="global"``);
* local training uses the module's own client optimizer (Alg. 1's plain SGD step when that is SGD);
* any server rule may replace the n_j/n mean (e.g. FedAdam over the base layers);
* the global model's head stays at its initial values, so its central ``val_*`` measure the base layers with an
  untrained head (a warning says so at fit start, :mod:`lightning_fed.personal`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from lightning_fed.client.personal import LocalParts
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedPer", "FedPerClient"]


class FedPerClient(LocalParts):
    """FedPer's client half: the personalisation layers named in ``head`` stay local to each client; base and head
    are trained together at every local step (Arivazhagan et al. 2019, Alg. 1).

    Args:
        head: Names of the head's submodules or tensors (e.g. ``["net.2"]`` or ``["classifier"]``).

    Raises:
        TypeError: ``head`` not a list of names.
        ValueError: ``head`` empty; at fit start, a name that selects nothing.

    Example::

        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        >>> half = FedPerClient(head=["1"])
        >>> half.setup(net)
        >>> half.kept_names(net), half.state_dim(0)
        (['1.weight', '1.bias'], 3)
    """

    def __init__(self, head: Sequence[str]) -> None:
        super().__init__(names=head)
        if not self.names:
            raise ValueError("`head` must name at least one submodule or tensor of the model (e.g. ['classifier']).")
        self.head = list(self.names)

    def settings(self) -> dict[str, Any]:
        return {"head": self.head}


class FedPer(FedAvg):
    """FedPer (Arivazhagan et al. 2019, Alg. 1): FedAvg over the base layers; every client keeps the layers named in
    ``head`` (see :mod:`lightning_fed.algorithms.fedper`).

    Args:
        head: Names of the personalisation layers (submodules or tensors), e.g. ``["classifier"]``.
        lr: Server learning rate η (default 1.0).
        weighting: ``"num_samples"`` (default, the paper's n_j/n) or ``"uniform"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedPer's (default ``None``).

    Example::

        >>> FedPer(head=["net.2"])
        FedPer(head=['net.2'], lr=1.0, weighting='num_samples')
        >>> FedPer(head=["net.2"]).client_algorithms
        [FedPerClient(head=['net.2'])]
    """

    repr_fields = ("head", "lr", "weighting")

    def __init__(self, head: Sequence[str], lr: float = 1.0, weighting: str = "num_samples",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedPerClient(head)]
        self.head = list(self._own_client[0].head)
