"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think Locally, Act Globally:
Federated Learning with Local and Global Representations", arXiv 2001.01523, 2020, Sec. 3, Algorithm 1): each
client m keeps its own *local representation* ℓ_m(·; θ_m^ℓ) (the body, the lower layers) and all clients share a
*global model* g(·; θ^g) on top of it (the head), averaged by the server — the opposite split of FedPer
(:mod:`lightning_fed.algorithms.fedper`), which keeps the head and shares the body.

Algorithm 1 (round t, clients S_t)::

    server sends θ^g_t to every m ∈ S_t
    client m:  for each local epoch, for each batch (X, Y):
                   (θ_m^ℓ, θ^g_m) ← (θ_m^ℓ, θ^g_m) − η·∇ L(g(ℓ_m(X; θ_m^ℓ); θ^g_m), Y)   (both trained jointly)
               keep θ_m^ℓ, send θ^g_m
    server:    θ^g_{t+1} = (1/|S_t|)·Σ_{m∈S_t} θ^g_m

:class:`LGFedAvgClient` is a :class:`~lightning_fed.client.personal.LocalParts` keeping the body (by name) local,
so the clients' updates are 0 there and only the global head is aggregated, by any server rule (FedAdam on the head
included). The server's mean is uniform, as the authors' code (github.com/pliang279/LG-FedAvg, ``main_lg.py``:
the global keys summed and divided by the cohort size m), :class:`~lightning_fed.algorithms.lgfedavg.LGFedAvg`'s
default ``weighting="uniform"``.

Choices that differ from the paper / the authors' code:

* the authors start LG-FedAvg from a model first trained by FedAvg (``--load_fed``); here it starts from the
  module's weights — run FedAvg first and load its checkpoint's weights into the module for the paper's setting;
* a client never sampled before starts from the initial body (the global model's, which the server never
  changes), as every client's local model in the authors' code is a copy of the initial global model;
* the authors evaluate each client with the best local model over rounds (``best_net_list``); here a client's
  personal model (``fed_personal_<m>``) is its latest body with the current global head
  (:meth:`~lightning_fed.client.personal.LocalParts.personal_model`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.personal import LocalParts
from lightning_fed.server.aggregators.base import Stage

__all__ = ["LGFedAvg", "LGFedAvgClient"]


class LGFedAvgClient(LocalParts):
    """LG-FedAvg's client half: the local representation named in ``body`` stays with each client; body and global
    head are trained together at every local step (Liang et al. 2020, Alg. 1).

    Args:
        body: Names of the local representation's submodules or tensors (e.g. ``["net.0"]`` or ``["encoder"]``).

    Raises:
        TypeError: ``body`` not a list of names.
        ValueError: ``body`` empty; at fit start, a name that selects nothing.

    Example::

        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        >>> half = LGFedAvgClient(body=["0"])
        >>> half.setup(net)
        >>> half.kept_names(net), half.state_dim(0)
        (['0.weight', '0.bias'], 8)
    """

    def __init__(self, body: Sequence[str]) -> None:
        super().__init__(names=body)
        if not self.names:
            raise ValueError("`body` must name at least one submodule or tensor of the model (e.g. ['encoder']).")
        self.body = list(self.names)

    def settings(self) -> dict[str, Any]:
        return {"body": self.body}


class LGFedAvg(FedAvg):
    """LG-FedAvg (Liang et al. 2020, Alg. 1): FedAvg (uniform mean) over the global head; every client keeps the
    local representation named in ``body`` (see :mod:`lightning_fed.algorithms.lgfedavg`).

    Args:
        body: Names of the local representation (submodules or tensors), e.g. ``["encoder"]``.
        lr: Server learning rate η (default 1.0).
        weighting: ``"uniform"`` (default, the authors' mean) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after LG-FedAvg's (default ``None``).

    Example::

        >>> LGFedAvg(body=["net.0"])
        LGFedAvg(body=['net.0'], lr=1.0, weighting='uniform')
        >>> LGFedAvg(body=["net.0"]).client_algorithms
        [LGFedAvgClient(body=['net.0'])]
    """

    repr_fields = ("body", "lr", "weighting")
    #: The client half a CLI swap of the server optimizer carries into ``trainer.client_algorithms`` (its argument:
    #: this class's).
    carried_client_half = ("LGFedAvgClient", {"body": "body"})

    def __init__(self, body: Sequence[str], lr: float = 1.0, weighting: str = "uniform",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [LGFedAvgClient(body)]
        self.body = list(self._own_client[0].body)
