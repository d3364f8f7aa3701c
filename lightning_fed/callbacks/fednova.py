"""FedNova: FedAvg's server step on the normalized average of the client updates (the server half is
:class:`~lightning_fed.algorithms.fednova.FedNovaAveraging`; under another server rule, give it as ``aggregators``)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from lightning_fed.algorithms.fedprox import FedProxClient
from lightning_fed.algorithms.fednova import FedNovaAveraging
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import ClientDeltas
from lightning_fed.server.rules.sgd import SGD


class FedNova(ServerOptimizer):
    """FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
    NeurIPS 2020, Sec. 5): normalized averaging, then the server step x_{t+1} = x_t + η·Δ_t with::

        Δ_t = τ_eff·Σ_i p_i·Δ_i/‖a_i‖₁,      τ_eff = Σ_i p_i·‖a_i‖₁

    Δ_i = x_i − x_t the client's model change over its τ_i = ``ClientUpdate.num_steps`` local steps and ‖a_i‖₁ the
    ℓ1 norm of the weights its local solver gives its local gradients (Sec. 4.1, generalized update rule; Flower's
    baseline cites it as Eq. (6)): τ_i for local SGD, [τ_i − ρ(1−ρ^τ_i)/(1−ρ)]/(1−ρ) for heavy-ball momentum ρ,
    [1 − (1−α)^τ_i]/α with α = γμ for FedProx's proximal local SGD at client learning rate γ
    (:func:`~lightning_fed.algorithms.fednova.a_norm`; derivations and the authors', Flower's and fedlab's conventions
    in :mod:`lightning_fed.algorithms.fednova`). p_i: the clients' sample weights in the round (``"num_samples"``) or
    1/|S_t| (``"uniform"``); clients that took no local step get weight 0. η = 1 (default) is the paper's update.
    With local SGD and equal τ_i this is :class:`FedAvg` exactly. No server state.

    The local solver is declared here and checked at fit start against the clients (client optimizer
    ``torch.optim.SGD`` with that momentum, no dampening or Nesterov; the FedProx client half for the proximal
    variant). ``local_solver="proximal"`` brings FedProx's client half itself (``FedProxClient(mu)``, as
    :class:`FedProx` does): do not add another.

    Composition: the reducer works under any server rule, e.g. FedNova's averaging with FedAdam's server step::

        ServerOptimizer(rule=Adam(lr=0.01), aggregators=[FedNovaAveraging(local_solver="momentum", momentum=0.9)])

    (with ``client=[FedProxClient(mu)]`` for the proximal variant), or the authors' server momentum ``gmf``:
    ``rule=Momentum(lr=1.0, momentum=gmf)``. The same fit-start checks run there.

    Logged ``round_gradient_diversity``: the raw client updates' diversity √(Σ_i w_i‖Δ_i‖² / ‖Σ_i w_i Δ_i‖²) (Zeng et
    al. 2024, Def. 3.1), the same metric as every other method logs (not over the normalised contributions).

    Args:
        lr: Server learning rate η (> 0, default 1.0).
        weighting: ``"num_samples"`` (default, the paper's p_i = n_i/n) or ``"uniform"``.
        local_solver: ``"sgd"`` (default), ``"momentum"`` or ``"proximal"``.
        momentum: ρ in [0, 1) of the client optimizer (``local_solver="momentum"``; default 0).
        mu: FedProx's μ ≥ 0 (``local_solver="proximal"``; default 0).
        client: Further client algorithms (none can be normalised by FedNova: refused at fit start).

    Raises:
        ValueError: ``lr`` not a finite number > 0, an unknown ``weighting`` or ``local_solver``, ``momentum`` or
            ``mu`` out of range or given for another local solver; at fit start, clients that do not match the
            declared solver (:meth:`FedNovaAveraging.check_fit
            <lightning_fed.algorithms.fednova.FedNovaAveraging.check_fit>` names both parts).

    Example: two clients of 1 and 3 samples took τ = 1 and 4 SGD steps with Δ_0 = [1], Δ_1 = [2]: τ_eff = 3.25 and
    Δ_t = 3.25·(¼·1/1 + ¾·2/4) = 2.03125, where FedAvg takes ¼·1 + ¾·2 = 1.75::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([1.0])], num_samples=1, num_steps=1, loss=0.0),
        ...            ClientUpdate(1, [torch.tensor([2.0])], num_samples=3, num_steps=4, loss=0.0)]
        >>> params = [torch.tensor([0.0])]
        >>> FedNova().server_update(params, updates), params
        ([tensor([2.0312])], [tensor([2.0312])])
        >>> FedNova(local_solver="momentum", momentum=0.9)
        FedNova(lr=1.0, weighting='num_samples', local_solver='momentum', momentum=0.9, mu=0.0)
        >>> FedNova(local_solver="sgd", mu=0.1)
        Traceback (most recent call last):
        ...
        ValueError: `mu`=0.1 is FedProx's proximal coefficient of local_solver='proximal', but local_solver='sgd'; use local_solver='proximal', mu=0.1.
    """

    state_key_fields = repr_fields = ("lr", "weighting", "local_solver", "momentum", "mu")

    def __init__(
        self, lr: float = 1.0, weighting: str = "num_samples", local_solver: str = "sgd", momentum: float = 0.0,
        mu: float = 0.0, client: Optional[list[ClientAlgorithm]] = None,
    ) -> None:
        stage = FedNovaAveraging(local_solver=local_solver, momentum=momentum, mu=mu)
        super().__init__(weighting=weighting, aggregators=[stage], rule=SGD(lr), client=client)
        self.local_solver, self.momentum, self.mu = stage.local_solver, stage.momentum, stage.mu
        if stage.local_solver == "proximal":
            self._own_client = [FedProxClient(stage.mu)]  # FedProx's client half (lightning_fed.algorithms.fedprox)

    # ------------------------------------------------------------------ bookkeeping
