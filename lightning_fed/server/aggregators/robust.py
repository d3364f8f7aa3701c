"""Byzantine-robust reducers: coordinate-wise median and trimmed mean, Krum / Multi-Krum, norm-bounded mean.

Each is a ``"reduce"`` stage (:class:`~lightning_fed.server.aggregators.Stage`): it turns the round's client updates
Δ_1..Δ_K into the pseudo-gradient Δ_t, so it composes with any server rule, e.g.
``FedAvgM(aggregators=[CoordinateMedian()])`` (momentum on the median) or, in front, with client transforms such as
the simulated attackers of :mod:`lightning_fed.server.attacks`.

They reduce the clients' *updates* Δ_i = x_i − x_t, where Flower's strategies reduce the client *models* x_i; since
every x_i = x_t + Δ_i shares x_t, the median / trimmed mean / Krum choice of the models is x_t plus that of the
updates (pairwise distances are equal), so with ``FedAvg(lr=1)`` the two agree up to floating-point rounding.

Weights (the chain's ``counts``, i.e. sample counts under ``weighting="num_samples"``):

* :class:`CoordinateMedian`, :class:`TrimmedMean` and the Krum **score** ignore them, as the papers (Yin et al. 2018
  analyse equal-sized local data sets; Blanchard et al. 2017 score vectors only) and as Flower's ``FedMedian``,
  ``FedTrimmedAvg`` and ``Krum`` (``aggregate_median`` / ``aggregate_trimmed_avg`` / ``aggregate_krum`` drop the
  number of examples);
* Multi-Krum's average of the m selected updates and :class:`NormBoundedMean` use them (Flower's Multi-Krum averages
  the kept models with ``aggregate``, weighted by examples; pass ``weighting="uniform"`` to the server optimizer for
  the plain average of Blanchard et al. 2017, Sec. 4).

All arithmetic is in float64 (the parameters' dtype on Apple MPS) and the result is rounded once to the
parameters' dtype.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed.checks import check_int
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, accumulation_dtype, weighted_sum

__all__ = ["CoordinateMedian", "Krum", "NormBoundedMean", "TrimmedMean"]


def _stack(x: ClientDeltas, k: int) -> Tensor:
    """Parameter ``k`` of every client, stacked: ``[K, *shape]`` in the accumulation dtype."""
    return torch.stack([delta[k].to(accumulation_dtype(delta[k])) for delta in x.deltas])


def _flat(x: ClientDeltas) -> Tensor:
    """Every client's update as one vector: ``[K, P]`` (P = number of parameters) in the accumulation dtype."""
    return torch.stack(
        [torch.cat([d.reshape(-1).to(accumulation_dtype(d)) for d in delta]) for delta in x.deltas]
    )


def _check_nonempty(x: ClientDeltas, name: str) -> None:
    if len(x.deltas) == 0:
        raise ValueError(f"{name} cannot aggregate an empty round: no client updates.")


def _weighted_mean(deltas: list[list[Tensor]], counts: Tensor, like: list[Tensor]) -> list[Tensor]:
    """Σ_i c_i Δ_i / Σ c_i in the accumulation dtype, rounded once to the dtypes of ``like``."""
    c = counts.tolist()
    total = float(counts.sum())
    if total <= 0:
        raise ValueError("The selected clients' weights sum to zero; cannot take their weighted mean.")
    result = weighted_sum(deltas, c)
    torch._foreach_div_(result, total)
    return [r.to(p.dtype) for r, p in zip(result, like)]


class CoordinateMedian(Stage):
    """Coordinate-wise median of the client updates: (Δ_t)_j = median_i (Δ_i)_j for every coordinate j.

    Source: Yin, Chen, Ramchandran, Bartlett, *Byzantine-Robust Distributed Learning: Towards Optimal Statistical
    Rates*, ICML 2018, Definition 1 ("coordinate-wise median"; Option I of Algorithm 1). For an even number of
    clients K the median is the mean of the two middle values (numpy's ``np.median``, which Flower's ``FedMedian``
    uses: ``flwr/server/strategy/aggregate.py``, ``aggregate_median``) — not ``torch.median``'s lower middle value.

    Sample counts are ignored (as the paper and Flower's ``FedMedian``).

    Shapes: each client's update is a list of tensors of the model's shapes; the result has the same shapes and the
    first client's dtypes.

    Raises:
        ValueError: (at aggregation) an empty round.

    Example: the median of 1, 2 and 100 is 2; of 1, 2, 3 and 100 it is (2 + 3)/2::

        >>> import torch
        >>> from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo
        >>> x = ClientDeltas([0, 1, 2], [[torch.tensor([1.0, 5.0])], [torch.tensor([2.0, -1.0])],
        ...                               [torch.tensor([100.0, 0.0])]], torch.ones(3, dtype=torch.float64))
        >>> CoordinateMedian().apply(x, EmptyState(), RoundInfo(0, 0, 3, 3))[0]
        [tensor([2., 0.])]
    """

    kind = "reduce"

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        _check_nonempty(x, "CoordinateMedian")
        k = len(x.deltas)
        out = []
        for j, p in enumerate(x.deltas[0]):
            s = _stack(x, j).sort(dim=0).values
            mid = s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2
            out.append(mid.to(p.dtype))
        return out, state


class TrimmedMean(Stage):
    """Coordinate-wise β-trimmed mean: per coordinate, drop the b = ⌊βK⌋ largest and b smallest of the K client
    values and average the remaining K − 2b.

    Source: Yin, Chen, Ramchandran, Bartlett, *Byzantine-Robust Distributed Learning: Towards Optimal Statistical
    Rates*, ICML 2018, Definition 2 ("coordinate-wise β-trimmed mean"; Option II of Algorithm 1). The cut
    b = ⌊βK⌋ per side is Flower's ``FedTrimmedAvg`` (``_trim_mean``: ``lowercut = int(proportiontocut * nobs)``,
    after ``scipy.stats.trim_mean``). Sample counts are ignored (as the paper and Flower).

    Args:
        beta: β in [0, 0.5), the fraction trimmed from *each* side (default 0.2, Flower's default). β ≥ 0.5 would trim
            every value for an even K (Flower then returns NaN); β = 0 is the plain unweighted mean.

    A β > 0 that trims nothing in every round (⌊β·C⌋ = 0 for ``clients_per_round`` C) is warned about once at fit
    start (:meth:`check_cohort`).

    Raises:
        ValueError: ``beta`` not a number in [0, 0.5); (at aggregation) an empty round.

    Example: β = 0.25 with K = 4 drops the smallest and the largest value per coordinate::

        >>> import torch
        >>> from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo
        >>> x = ClientDeltas([0, 1, 2, 3], [[torch.tensor([1.0])], [torch.tensor([2.0])], [torch.tensor([4.0])],
        ...                                  [torch.tensor([100.0])]], torch.ones(4, dtype=torch.float64))
        >>> TrimmedMean(beta=0.25).apply(x, EmptyState(), RoundInfo(0, 0, 4, 4))[0]  # (2 + 4) / 2
        [tensor([3.])]
        >>> TrimmedMean(beta=0.5)
        Traceback (most recent call last):
        ...
        ValueError: `beta` must be a number in [0, 0.5) (the fraction trimmed from each side; 0.5 or more trims every value), got 0.5.
    """

    kind = "reduce"

    def __init__(self, beta: float = 0.2) -> None:
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0.0 <= beta < 0.5:
            raise ValueError(
                "`beta` must be a number in [0, 0.5) (the fraction trimmed from each side; 0.5 or more trims every "
                f"value), got {beta!r}."
            )
        self.beta = float(beta)

    def num_trimmed(self, num_clients: int) -> int:
        """b = ⌊β·K⌋, the number of values dropped from each side for K = ``num_clients``."""
        return int(math.floor(self.beta * num_clients))

    def check_cohort(self, clients_per_round: int) -> None:
        """Warn (once, at fit start) when β > 0 trims nothing in every round: ⌊β·C⌋ = 0 for C =
        ``clients_per_round`` (so for every K ≤ C), i.e. the trimmed mean is the plain mean."""
        super().check_cohort(clients_per_round)
        c = int(clients_per_round)
        if self.beta > 0 and self.num_trimmed(c) == 0:
            need = max(1, math.ceil(1.0 / self.beta) - 1)
            while self.num_trimmed(need) == 0:
                need += 1
            rank_zero_warn(
                f"TrimmedMean with `beta`={self.beta:g} and `clients_per_round`={c} trims ⌊{self.beta:g}·K⌋ = 0 values "
                f"per side in every round (K ≤ {c}): it is the plain unweighted mean. Trimming one value per side "
                f"needs `beta` >= 1/{c} or `clients_per_round` >= {need}."
            )

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        _check_nonempty(x, "TrimmedMean")
        k = len(x.deltas)
        b = self.num_trimmed(k)  # β < 0.5 ⇒ 2b < K: at least one value is kept
        out = []
        for j, p in enumerate(x.deltas[0]):
            s = _stack(x, j).sort(dim=0).values
            out.append(s[b : k - b].mean(dim=0).to(p.dtype))
        return out, state


class Krum(Stage):
    """Krum and Multi-Krum: keep the m client updates with the smallest Krum scores and average them.

    Source: Blanchard, El Mhamdi, Guerraoui, Stainer, *Machine Learning with Adversaries: Byzantine Tolerant Gradient
    Descent*, NeurIPS 2017, Sec. 4. With K clients of which at most f are Byzantine (requires K > 2f + 2), the score
    of client i is

        s(i) = Σ_{j ∈ N_i} ‖Δ_i − Δ_j‖²,

    N_i the K − f − 2 clients j ≠ i closest to Δ_i. Krum (m = 1) returns the update with the smallest score;
    Multi-Krum averages the m updates with the smallest scores (Sec. 4, "Multi-Krum"). Distances are over all
    parameters together, in float64. Ties go to the lower position in the round's client order (a stable sort).

    Flower's ``Krum(num_malicious_clients, num_clients_to_keep)`` (``flwr/server/strategy/krum.py``,
    ``aggregate_krum``) is this rule on the client models, with two differences kept deliberately: Flower clamps
    the neighbour count to ``max(1, K − f − 2)`` where this refuses K ≤ 2f + 2 (the paper's condition), and here
    ``num_clients_to_keep`` = 0 and 1 both mean Krum (Flower's 0; m = 1 keeps one update, the same thing).

    Weights: the score ignores them; the Multi-Krum average uses the chain's counts (sample counts under
    ``weighting="num_samples"``, as Flower's Multi-Krum; ``weighting="uniform"`` gives the paper's plain average).

    Args:
        num_malicious_clients: f ≥ 0, the number of Byzantine clients the rule tolerates per round.
        num_clients_to_keep: m ≥ 0; 0 or 1 is Krum (default 1), m > 1 Multi-Krum. Must not exceed K.

    Rounds with too few reports: in a federated run, ``clients_per_round`` C ≤ 2f + 2 or m > C is refused at fit
    start (:meth:`~lightning_fed.server.aggregators.Stage.check_cohort`: no round could be aggregated), and a round
    in which client dropout or failures leave K ≤ 2f + 2 (or K < m) reports is skipped by the loop like a round
    where no client reported: model and server state unchanged, the K reports counted in ``round_clients_dropped``,
    a warning; the run goes on.

    Raises:
        ValueError: a negative or non-integer argument; (:meth:`apply` / :meth:`scores` called directly) K ≤ 2f + 2
            or m > K.

    Example: four updates 0, 1, 2 and 50 with f = 0: each scores the sum of squared distances to its K − f − 2 = 2
    nearest: 0 → 1 + 4 = 5, 1 → 1 + 1 = 2, 2 → 1 + 4 = 5, 50 → 48² + 49² = 4705; Krum picks 1::

        >>> import torch
        >>> from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo
        >>> x = ClientDeltas([0, 1, 2, 3], [[torch.tensor([v])] for v in (0.0, 1.0, 2.0, 50.0)],
        ...                  torch.ones(4, dtype=torch.float64))
        >>> Krum(num_malicious_clients=0).scores(x).tolist()
        [5.0, 2.0, 5.0, 4705.0]
        >>> Krum(num_malicious_clients=0).apply(x, EmptyState(), RoundInfo(0, 0, 4, 4))[0]
        [tensor([1.])]
        >>> Krum(num_malicious_clients=1).apply(x, EmptyState(), RoundInfo(0, 0, 4, 4))
        Traceback (most recent call last):
        ...
        ValueError: Krum with `num_malicious_clients`=1 needs more than 2f + 2 = 4 clients per round (Blanchard et al. 2017, Sec. 4), got 4.
    """

    kind = "reduce"

    def __init__(self, num_malicious_clients: int = 0, num_clients_to_keep: int = 1) -> None:
        for name, value in (("num_malicious_clients", num_malicious_clients), ("num_clients_to_keep", num_clients_to_keep)):
            check_int(name, value, 0)
        self.num_malicious_clients = int(num_malicious_clients)
        self.num_clients_to_keep = int(num_clients_to_keep)

    def client_requirement(self, num_clients: int) -> Optional[str]:
        """Why a round of K = ``num_clients`` reports cannot be reduced (K ≤ 2f + 2, or m > K), else ``None``."""
        f, k = self.num_malicious_clients, int(num_clients)
        if k <= 2 * f + 2:
            return (
                f"Krum with `num_malicious_clients`={f} needs more than 2f + 2 = {2 * f + 2} clients per round "
                f"(Blanchard et al. 2017, Sec. 4), got {k}."
            )
        if self.num_clients_to_keep > k:
            return f"`num_clients_to_keep` ({self.num_clients_to_keep}) must not exceed the clients in the round ({k})."
        return None

    def _check_round(self, k: int) -> None:
        why = self.client_requirement(k)
        if why is not None:
            raise ValueError(why)

    def scores(self, x: ClientDeltas) -> Tensor:
        """The Krum scores s(i), float64 ``[K]`` (see the class doc).

        Raises:
            ValueError: K ≤ 2f + 2.
        """
        _check_nonempty(x, "Krum")
        k = len(x.deltas)
        self._check_round(k)
        flat = _flat(x)
        dist = torch.stack([(flat - flat[i]).square().sum(dim=1) for i in range(k)]).to(torch.float64)
        dist.fill_diagonal_(float("inf"))  # N_i excludes i itself
        nearest = dist.sort(dim=1).values[:, : k - self.num_malicious_clients - 2]
        return nearest.sum(dim=1)

    def select(self, x: ClientDeltas) -> list[int]:
        """Positions (into ``x.deltas``) of the kept updates, best score first: one for Krum, m for Multi-Krum."""
        order = torch.sort(self.scores(x), stable=True).indices.tolist()
        return order[: max(1, self.num_clients_to_keep)]

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        keep = self.select(x)
        if len(keep) == 1:
            return [d.clone() for d in x.deltas[keep[0]]], state
        return _weighted_mean([x.deltas[i] for i in keep], x.counts[keep], x.deltas[0]), state


class NormBoundedMean(Stage):
    """Norm-bounded averaging: clip each client update to norm at most M, then take the weighted mean,

        Δ_t = Σ_i c_i · Δ_i / max(1, ‖Δ_i‖₂ / M)  /  Σ_i c_i,

    ‖·‖₂ over all parameters together, c the chain's counts (sample counts under ``weighting="num_samples"``).

    Source: Sun, Kairouz, Suresh, McMahan, *Can You Really Backdoor Federated Learning?*, 2019 (arXiv:1911.07963),
    Sec. 4, "norm thresholding of updates" (the server clips every update whose norm exceeds M before FedAvg's
    sample-weighted average).

    Args:
        max_norm: M > 0, the largest update norm kept (the units of the parameters).

    Raises:
        ValueError: ``max_norm`` not a finite number > 0; (at aggregation) an empty round.

    Example: updates [3, 4] (norm 5) and [0, 1] with M = 1 and equal weights: ([0.6, 0.8] + [0, 1]) / 2::

        >>> import torch
        >>> from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo
        >>> x = ClientDeltas([0, 1], [[torch.tensor([3.0, 4.0])], [torch.tensor([0.0, 1.0])]],
        ...                  torch.ones(2, dtype=torch.float64))
        >>> NormBoundedMean(max_norm=1.0).apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))[0]
        [tensor([0.3000, 0.9000])]
    """

    kind = "reduce"

    def __init__(self, max_norm: float) -> None:
        if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not math.isfinite(max_norm) \
                or max_norm <= 0:
            raise ValueError(f"`max_norm` must be a finite number > 0, got {max_norm!r}.")
        self.max_norm = float(max_norm)

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        _check_nonempty(x, "NormBoundedMean")
        clipped = []
        for delta in x.deltas:
            wide = [d.to(accumulation_dtype(d)) for d in delta]
            norm = float(torch.stack([w.square().sum() for w in wide]).sum().sqrt())
            factor = 1.0 / max(1.0, norm / self.max_norm)
            clipped.append([w * factor for w in wide])
        return _weighted_mean(clipped, x.counts, x.deltas[0]), state
