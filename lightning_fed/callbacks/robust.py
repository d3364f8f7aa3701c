"""Robust server optimizers under the names Flower users know: ``FedMedian``, ``FedTrimmedAvg(beta)`` and
``Krum(num_malicious_clients, num_clients_to_keep)``.

Each is :class:`~lightning_fed.callbacks.FedAvg` (x_{t+1} = x_t + η·Δ_t) with a robust reducer from
:mod:`lightning_fed.server.aggregators.robust` in place of the weighted mean; with η = 1 (the default) the new global
model is the robust aggregate of the client models, as Flower's strategies of the same names
(``flwr/server/strategy/fedmedian.py``, ``fedtrimmedavg.py``, ``krum.py``). To put a robust reducer in front of another
server rule, give it as an aggregator instead: ``FedAdam(aggregators=[CoordinateMedian()])``.

``client_transforms`` are client-update stages (kind ``"transform"``) run before the reducer, e.g. the simulated
attackers :class:`~lightning_fed.server.attacks.MaliciousClients` for an experiment. They are kept as the attribute
``client_transforms`` and recorded in the checkpoint's run record (``server_optimizer.client_transforms``, each
stage's repr), so a resume with another attack is refused unless allowed.
"""

from __future__ import annotations

from typing import Optional, Sequence

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.server.aggregators.base import Stage
from lightning_fed.server.aggregators.robust import CoordinateMedian, Krum as KrumReducer, TrimmedMean

__all__ = ["FedMedian", "FedTrimmedAvg", "Krum"]


def _chain(client_transforms: Optional[Sequence[Stage]], reducer: Stage) -> list[Stage]:
    transforms = list(client_transforms or [])
    for stage in transforms:
        if not isinstance(stage, Stage) or stage.kind != "transform":
            raise ValueError(
                f"`client_transforms` must hold client-update stages (kind 'transform', e.g. MaliciousClients), got "
                f"{stage!r}."
            )
    return [*transforms, reducer]


class FedMedian(FedAvg):
    """FedAvg with the coordinate-wise median of the client updates: x_{t+1} = x_t + η·median_i(Δ_i).

    Source: Yin, Chen, Ramchandran, Bartlett, ICML 2018, Definition 1 (coordinate-wise median,
    :class:`~lightning_fed.server.aggregators.CoordinateMedian`); Flower's ``FedMedian``
    (``flwr/server/strategy/fedmedian.py``, ``aggregate_median``), which with η = 1 it matches: the median of the
    client models x_t + Δ_i, the mean of the two middle values for an even cohort, sample counts ignored.

    Args:
        lr: Server learning rate η (default 1.0, > 0).
        client_transforms: Client-update stages run before the median (e.g. ``[MaliciousClients(0.2, ...)]``).

    Raises:
        ValueError: ``lr`` not a finite number > 0, or a ``client_transforms`` entry that is not a transform stage.

    Example::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([0.0])]
        >>> updates = [ClientUpdate(i, [torch.tensor([v])], 10, 1, 0.0) for i, v in enumerate([1.0, 2.0, 100.0])]
        >>> FedMedian().server_update(params, updates)
        [tensor([2.])]
    """

    repr_fields = ("lr",)

    def __init__(self, lr: float = 1.0, client_transforms: Optional[Sequence[Stage]] = None) -> None:
        super().__init__(lr=lr, aggregators=_chain(client_transforms, CoordinateMedian()))
        self.client_transforms = self.aggregators[:-1]  # in the checkpoint's run record


class FedTrimmedAvg(FedAvg):
    """FedAvg with the coordinate-wise β-trimmed mean of the client updates (drop ⌊βK⌋ largest and smallest values per
    coordinate, average the rest).

    Source: Yin, Chen, Ramchandran, Bartlett, ICML 2018, Definition 2 (coordinate-wise trimmed mean,
    :class:`~lightning_fed.server.aggregators.TrimmedMean`); Flower's ``FedTrimmedAvg(beta=0.2)``
    (``flwr/server/strategy/fedtrimmedavg.py``, ``aggregate_trimmed_avg``), which with η = 1 it matches (sample counts
    ignored), except that β ≥ 0.5 is refused here (Flower returns NaN when it trims every value).

    Args:
        beta: Fraction cut from each side, in [0, 0.5) (default 0.2, as Flower).
        lr: Server learning rate η (default 1.0, > 0).
        client_transforms: Client-update stages run before the trimmed mean.

    Raises:
        ValueError: ``beta`` outside [0, 0.5), ``lr`` not a finite number > 0, or a bad ``client_transforms`` entry.

    Example: β = 0.2 with K = 5 drops one value per side: mean(2, 3, 4) = 3::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([0.0])]
        >>> updates = [ClientUpdate(i, [torch.tensor([v])], 1, 1, 0.0) for i, v in enumerate([-50.0, 2.0, 3.0, 4.0, 90.0])]
        >>> FedTrimmedAvg(beta=0.2).server_update(params, updates)
        [tensor([3.])]
    """

    state_key_fields = ("lr", "beta")
    repr_fields = ("beta", "lr")

    def __init__(
        self, beta: float = 0.2, lr: float = 1.0, client_transforms: Optional[Sequence[Stage]] = None
    ) -> None:
        reducer = TrimmedMean(beta)
        super().__init__(lr=lr, aggregators=_chain(client_transforms, reducer))
        self.beta = reducer.beta
        self.client_transforms = self.aggregators[:-1]  # in the checkpoint's run record


class Krum(FedAvg):
    """FedAvg with Krum / Multi-Krum selection of the client updates (Blanchard et al. 2017).

    Source: Blanchard, El Mhamdi, Guerraoui, Stainer, *Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent*, NeurIPS 2017, Sec. 4 (:class:`~lightning_fed.server.aggregators.Krum`, where the score is written
    out); Flower's ``Krum(num_malicious_clients=0, num_clients_to_keep=0)`` (``flwr/server/strategy/krum.py``,
    ``aggregate_krum``): ``num_clients_to_keep`` = 0 is Krum (the single best update), m > 0 Multi-Krum (the
    sample-weighted mean of the m best, as Flower; ``weighting="uniform"`` for the paper's plain mean). Unlike
    Flower, which clamps the neighbour count to 1, the paper's condition K > 2f + 2 is kept: ``clients_per_round``
    ≤ 2f + 2 (or < m) is refused at fit start, and a round in which dropout or failing clients leave K ≤ 2f + 2
    (or K < m) reports is skipped (global model and server state unchanged, the reports counted in
    ``round_clients_dropped``, a warning).

    Args:
        num_malicious_clients: f ≥ 0 (default 0).
        num_clients_to_keep: m ≥ 0 (default 0: Krum).
        lr: Server learning rate η (default 1.0, > 0).
        weighting: ``"num_samples"`` (default) or ``"uniform"``: the weights of the Multi-Krum mean.
        client_transforms: Client-update stages run before Krum.

    Raises:
        ValueError: a negative / non-integer count, ``lr`` not > 0, an unknown ``weighting``, a bad
            ``client_transforms`` entry; (at fit start) ``clients_per_round`` ≤ 2f + 2 or m > ``clients_per_round``;
            (:meth:`server_update` called directly) K ≤ 2f + 2 or m > K.

    Example: f = 1 with 5 clients; each scores its K − f − 2 = 2 nearest; the outlier 100 is never chosen::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> params = [torch.tensor([0.0])]
        >>> updates = [ClientUpdate(i, [torch.tensor([v])], 1, 1, 0.0) for i, v in enumerate([0.0, 1.0, 2.0, 4.0, 100.0])]
        >>> Krum(num_malicious_clients=1).server_update(params, updates)  # scores 1+4, 1+1, 1+4, 4+9, 96²+98²
        [tensor([1.])]
    """

    state_key_fields = ("lr", "weighting", "num_malicious_clients", "num_clients_to_keep")
    repr_fields = ("num_malicious_clients", "num_clients_to_keep", "lr", "weighting")

    def __init__(
        self,
        num_malicious_clients: int = 0,
        num_clients_to_keep: int = 0,
        lr: float = 1.0,
        weighting: str = "num_samples",
        client_transforms: Optional[Sequence[Stage]] = None,
    ) -> None:
        reducer = KrumReducer(num_malicious_clients, num_clients_to_keep)
        super().__init__(lr=lr, weighting=weighting, aggregators=_chain(client_transforms, reducer))
        self.client_transforms = self.aggregators[:-1]  # in the checkpoint's run record
        self.num_malicious_clients = reducer.num_malicious_clients
        self.num_clients_to_keep = reducer.num_clients_to_keep
