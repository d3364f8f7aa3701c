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
:class:`~lightning_fed.callbacks.FedPer`'s default ``weighting="num_samples"``. A client never sampled before starts
from the initial head (the global model's, which the server never changes).
"""

from __future__ import annotations

from typing import Any, Sequence

from lightning_fed.client.personal import LocalParts

__all__ = ["FedPerClient"]


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
