"""FedMGDA+: the min-norm combination of normalised client updates over the ε-constrained simplex, applied by server
SGD (the server half is :class:`~lightning_fed.algorithms.fedmgda.FedMGDAMinNorm`)."""

from __future__ import annotations

from typing import Any, Optional

from lightning_fed.algorithms.fedmgda import FedMGDAMinNorm
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.checks import check_weighting
from lightning_fed.server.rules.sgd import SGD
from torch import Tensor


class FedMGDAPlus(ServerOptimizer):
    """FedMGDA+ (Hu et al., *Federated Learning Meets Multi-objective Optimization*, IEEE TNSE 2022, Algorithm 1):
    ``ServerOptimizer(aggregators=[FedMGDAMinNorm(epsilon, normalize)], rule=SGD(lr))``.

    In round t, with Δ_i the update of client i of the cohort S_t (K = |S_t| clients that reported) and
    d_i = Δ_i/‖Δ_i‖ (one L2 norm over all parameters)::

        λ*      = argmin_λ ‖Σ_i λ_i d_i‖²  s.t.  λ ≥ 0, Σλ_i = 1, ‖λ − λ₀‖_∞ ≤ ε      (MGDA's min-norm step)
        x_{t+1} = x_t + η·Σ_i λ*_i d_i                                             (server SGD, global lr η)

    λ₀ is the prior weighting of the cohort (``weighting``: uniform 1/K by default, as the authors' code; or
    |D_i|/Σ_j|D_j|); ε = 1 (the default) is the whole simplex, as in FedAWARE's comparison (Zeng et al. 2024,
    Fig. 6), and ε = 0 is FedAvg of the normalised updates. λ* is solved exactly (duality gap ≤ 1e-9·max_i G_ii on
    the K × K Gram matrix; :mod:`lightning_fed.algorithms.fedmgda`, which also lists where the authors', FedLab's and
    FLGo's implementations differ). A client whose update is zero (no local step) is left out of the λ-step. Shapes:
    Δ_t has the parameters' shapes and dtypes; λ* (:attr:`last_weights`) is float64 ``[K]`` in the round's order.
    No server state. Logged per round: ``fedmgda_min_norm_sq`` (‖Σλ*_i d_i‖²: 0 at a Pareto-stationary point of the
    cohort's objectives), ``fedmgda_support`` (clients with λ*_i > 0) and ``fedmgda_weighted_diversity``
    (√(Σλ*_i‖d_i‖²/‖Σλ*_i d_i‖²) with these λ* and d_i); ``round_gradient_diversity`` is the raw updates' diversity,
    the same metric as every other method logs.

    Args:
        lr: Server (global) learning rate η (> 0, default 1.0; FedAWARE's baseline and the authors' default).
        epsilon: ε ∈ [0, 1] (default 1.0).
        normalize: Combine the normalised updates d_i (default ``True``, FedMGDA+); ``False``: the raw Δ_i (FedMGDA).
        weighting: λ₀ and the weights of the round's train loss and buffer averaging: ``"uniform"`` (default) or
            ``"num_samples"``.
        client: Client algorithms every client runs (e.g. ``[FedProxClient(mu=0.1)]``, the authors' FedMGDA+prox).

    Raises:
        ValueError: ``lr`` not a finite number > 0, ``epsilon`` outside [0, 1], ``normalize`` not a bool, or an
            unknown ``weighting``.

    Example: updates [2, 0] and [0, 1]: normalised, their min-norm combination is λ = (½, ½), so x_1 = x_0 + η·[½, ½];
    with ε = 0.1 around the sample weights λ₀ = (0.75, 0.25) the box keeps λ = (0.65, 0.35)::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([2.0, 0.0], dtype=torch.float64)], 30, 3, 0.0),
        ...            ClientUpdate(1, [torch.tensor([0.0, 1.0], dtype=torch.float64)], 10, 1, 0.0)]
        >>> params = [torch.zeros(2, dtype=torch.float64)]
        >>> opt = FedMGDAPlus(lr=0.5)
        >>> opt.server_update(params, updates), params, opt.last_weights
        ([tensor([0.5000, 0.5000], dtype=torch.float64)], [tensor([0.2500, 0.2500], dtype=torch.float64)], array([0.5, 0.5]))
        >>> boxed = FedMGDAPlus(epsilon=0.1, weighting="num_samples")
        >>> _ = boxed.server_update([torch.zeros(2, dtype=torch.float64)], updates)
        >>> boxed.last_weights.round(12)
        array([0.65, 0.35])
        >>> FedMGDAPlus(epsilon=2.0)
        Traceback (most recent call last):
        ...
        ValueError: `epsilon` must be a finite number in [0, 1] (0: λ = λ₀, FedAvg of the normalised updates; 1: the whole simplex), got 2.0.

    Its reducer under another server rule (here FedAvgM's heavy ball)::

        >>> from lightning_fed.algorithms import FedMGDAMinNorm
        >>> from lightning_fed.server.rules import Momentum
        >>> ServerOptimizer(rule=Momentum(lr=1.0, momentum=0.9), aggregators=[FedMGDAMinNorm(epsilon=0.5)])
        ServerOptimizer(lr=1.0, weighting='num_samples')
    """

    state_key_fields = ("lr", "epsilon", "normalize", "weighting")
    repr_fields = ("lr", "weighting", "epsilon", "normalize")

    def __init__(
        self,
        lr: float = 1.0,
        epsilon: float = 1.0,
        normalize: bool = True,
        weighting: str = "uniform",
        client: Optional[list[ClientAlgorithm]] = None,
    ) -> None:
        check_weighting(weighting)
        #: The reducer stage (:class:`~lightning_fed.algorithms.fedmgda.FedMGDAMinNorm`).
        self.min_norm = FedMGDAMinNorm(epsilon=epsilon, normalize=normalize)
        super().__init__(weighting=weighting, aggregators=[self.min_norm], rule=SGD(lr), client=client)

    @property
    def epsilon(self) -> float:
        """ε, the half-width of the box around λ₀ (the stage's)."""
        return self.min_norm.epsilon

    @property
    def normalize(self) -> bool:
        """Whether the updates are normalised (the stage's)."""
        return self.min_norm.normalize

    @property
    def last_weights(self) -> Any:
        """λ* of the last round, float64 ``[K]`` in the round's order (``None`` before the first round; the
        :attr:`round_report`'s)."""
        report = self.stage_report(self.min_norm)
        return None if report is None else report.weights
