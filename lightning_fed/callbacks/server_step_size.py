"""Server-side stepsizes on the normalised client direction: Nastya and its adaptive and FedOpt variants.

Source: G. Malinovsky, K. Mishchenko, P. Richtárik, *On Server-Side Stepsizes in Federated Optimization:
Theory Explaining the Heuristics* (arXiv title: *Server-Side Stepsizes and Sampling Without Replacement
Provably Help in Federated Optimization*), Algorithm 1 "Nastya" (plain text in
``shared/seeds/003_773462bd4a63debc.txt``), and for the adaptive stepsize Y. Malitsky, K. Mishchenko,
*Adaptive Gradient Descent without Descent*, ICML 2020, Algorithm 1.

Every class here replaces the client's model change Δ_m = x_{t,m} − x_t by the *normalised direction*
Δ_m/(γ·n_m) = −g_{t,m} (Nastya, Alg. 1, l. 8) before aggregation; what differs is the server rule applied to
the aggregate:

* :class:`ServerStepSize` — Nastya itself: x_{t+1} = x_t − η·g_t (Alg. 1, l. 10);
* :class:`AdaptiveServerStepSize` — η_t estimated every round from successive directions (Malitsky &
  Mishchenko's adaptive gradient descent; the paper's Sec. 7 / Fig. 2 "RR (two stepsizes)");
* :class:`NormalizedFedAvgM`, :class:`NormalizedFedAdam`, :class:`NormalizedFedYogi`,
  :class:`NormalizedFedAdagrad` — a FedOpt server optimizer (Reddi et al. 2021) run on the normalised direction
  (the paper's Sec. 7: "we additionally utilize several server-side optimization subroutines on top of the local
  updates", e.g. Adam with stepsize 10^-2 on LeNet/CIFAR-10). Any other server optimizer ``Opt`` gets the same
  treatment with ``Opt(aggregators=[NormalizedDirections(), WeightedMean()], ...)``: every class here is that
  chain (:class:`~lightning_fed.server.aggregators.normalized.NormalizedDirections`, then the weighted mean)
  composed with a server rule.

Nastya's local data order (Alg. 1, l. 2 / l. 6) and partial participation (l. 3) are data-module options, not
server ones: ``FederatedDataModule(data_order="reshuffle")`` is the Random-Reshuffling option (a fresh
permutation of the client's data every local epoch), ``data_order="once"`` the Shuffle-Once option (one
permutation per client for the whole run), and ``clients_per_round=C`` the cohort size C (S_t uniform among the
subsets of size C). Alg. 1 makes one local pass of incremental GD over n single data points; with mini-batches
or several local epochs n_m is the number of local optimizer steps the client actually took.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.fedadagrad import FedAdagrad
from lightning_fed.callbacks.fedadam import FedAdam
from lightning_fed.callbacks.fedavgm import FedAvgM
from lightning_fed.callbacks.fedyogi import FedYogi
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.server.aggregators.base import WeightedMean
from lightning_fed.server.aggregators.normalized import NormalizedDirections, normalized_direction
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.server.rules.stepsize import AdaptiveStepSize

__all__ = [
    "AdaptiveServerStepSize",
    "NormalizedFedAdagrad",
    "NormalizedFedAdam",
    "NormalizedFedAvgM",
    "NormalizedFedYogi",
    "ServerStepSize",
    "normalized_direction",
]


def _normalized_chain() -> list:
    """Nastya's aggregation (Alg. 1, l. 8-9): the normalised directions, then their weighted mean."""
    return [NormalizedDirections(), WeightedMean()]


class ServerStepSize(ServerOptimizer):
    """Nastya: a server stepsize η on the normalised client direction (Malinovsky, Mishchenko, Richtárik, Alg. 1).

    Per round t, with cohort S_t, client learning rate γ and n_m local steps on client m (Alg. 1, l. 8-10; with
    several optimizer parameter groups each parameter is divided by its own group's γ, see
    :func:`normalized_direction`)::

        g_{t,m} = (x_t − x_{t,m}) / (γ·n_m)              (l. 8)
        g_t     = Σ_{m∈S_t} w_m·g_{t,m}                   (l. 9; w_m = 1/C by default)
        x_{t+1} = x_t − η·g_t                             (l. 10)

    When every client takes the same number n of local steps, η = γ·n gives x_{t+1} = x_t + Σ_m w_m Δ_m, i.e.
    :class:`~lightning_fed.callbacks.FedAvg` (with the same weighting); η > γ·n is the "large server stepsize"
    regime of the paper's Theorems 6-8 (small γ, η up to O(1/L)), η < γ·n the "small server stepsize" one of
    Theorem 9. Random reshuffling / shuffle-once local data (Alg. 1, l. 2/6) and the cohort size C (l. 3) are
    ``FederatedDataModule(data_order="reshuffle" | "once", clients_per_round=C)``. No state.

    Args:
        lr: The server stepsize η (> 0), in units of gradient steps (the paper gives no default; η = γ·n is
            FedAvg).
        weighting: ``"uniform"`` (default: 1/C, Alg. 1, l. 9) or ``"num_samples"`` (w_m ∝ |D_m|).

    Raises:
        ValueError: ``lr`` not a finite number > 0, or an unknown ``weighting``; at a server update, a client
            without a finite positive client learning rate for a parameter that moved (see
            :func:`normalized_direction`), or a round in which no client took a local step.

    Example: g_t = ½·(1.5/(0.25·2) + 0.25/(0.25·1)) = 2, so x_1 = 1 − 0.5·2 = 0::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([-1.5])], num_samples=8, num_steps=2, loss=0.0, client_lr=0.25),
        ...            ClientUpdate(1, [torch.tensor([-0.25])], num_samples=4, num_steps=1, loss=0.0, client_lr=0.25)]
        >>> params = [torch.tensor([1.0])]
        >>> ServerStepSize(lr=0.5).server_update(params, updates), params  # returns −g_t
        ([tensor([-2.])], [tensor([0.])])
        >>> ServerStepSize(lr=-1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `lr` must be a finite number > 0, got -1.0.
    """

    def __init__(self, lr: float, weighting: str = "uniform") -> None:
        # pseudo-gradient −g_t, so x ← x − η·g_t
        super().__init__(weighting=weighting, aggregators=_normalized_chain(), rule=SGD(lr))


class AdaptiveServerStepSize(ServerOptimizer):
    """Nastya with the server stepsize estimated each round by Malitsky & Mishchenko's adaptive gradient descent.

    The paper's experiments (Sec. 7, Fig. 2, "RR (two stepsizes)") "combine the local passes over the data with
    the adaptive estimation of smoothness proposed by [17]" (Malitsky & Mishchenko, *Adaptive Gradient Descent
    without Descent*, ICML 2020, Alg. 1), with the normalised direction g_t of Nastya (Alg. 1, l. 8-9; see
    :class:`ServerStepSize`) in place of ∇f(x_t). The Nastya paper gives no further detail (no η_0, no θ_0), so
    this follows Malitsky & Mishchenko's Alg. 1 literally::

        round 0:   x_1 = x_0 − η_0·g_0,                        θ_0 = +∞
        round t≥1: η_t = min( √(1 + θ_{t−1})·η_{t−1},  ‖x_t − x_{t−1}‖ / (2‖g_t − g_{t−1}‖) )
                   x_{t+1} = x_t − η_t·g_t,                    θ_t = η_t/η_{t−1}

    (so in round 1 only the second branch counts). Guards: when ‖g_t − g_{t−1}‖ = 0 or ‖x_t − x_{t−1}‖ = 0 the
    secant ratio carries no curvature information and only the first branch is used; if that is +∞ as well
    (round 1, θ_0 = +∞) the stepsize is kept, η_t = η_{t−1}. Nothing is ever divided by zero.

    Departures of the authors' public AdGD code (``ad_grad``) from their paper, *not* followed here: it divides
    θ_1 by 1 instead of λ_0 (``la_old = 1`` after the first step) and uses θ_0 = 10^9 for +∞. Its default
    λ_0 = 10^-6 is this class's default ``lr``: a negligible first step that only provides the first secant pair.

    With partial participation the directions of successive rounds come from different cohorts, so the estimate
    also sees client-sampling noise (the paper's experiment is single-node). The stepsize used in the last
    round is :attr:`current_lr` and is logged every round as ``server_lr`` (step = round).

    State (carried by ``state_dict``, so checkpoints resume exactly): ``prev_params`` (x_{t−1}) and
    ``prev_direction`` (−g_{t−1}), one tensor per parameter, and the scalars η_{t−1} (``eta``) and θ_{t−1}
    (``theta``).

    Args:
        lr: The initial server stepsize η_0 (> 0, default 1e-6 as the public AdGD code's ``la_0``).
        weighting: ``"uniform"`` (default: 1/C, Nastya Alg. 1, l. 9) or ``"num_samples"``.

    Raises:
        ValueError: ``lr`` not a finite number > 0, or an unknown ``weighting``; at a server update, the errors of
            :class:`ServerStepSize`.

    Example: f(x) = x² (g = 2x, L = 2), one client reporting one step at γ = 1 (Δ = −2x). Round 0 steps with
    η_0 = 0.1 from x_0 = 1 to x_1 = 0.8; round 1 estimates η_1 = ‖x_1 − x_0‖/(2‖g_1 − g_0‖) = 0.2/(2·0.4) = 0.25
    = 1/(2L) and steps to x_2 = 0.8 − 0.25·1.6 = 0.4::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> opt = AdaptiveServerStepSize(lr=0.1)
        >>> params = [torch.tensor([1.0], dtype=torch.float64)]
        >>> for _ in range(2):
        ...     update = ClientUpdate(0, [-2 * params[0].clone()], num_samples=1, num_steps=1, loss=0.0, client_lr=1.0)
        ...     _ = opt.server_update(params, [update])
        ...     print(round(opt.current_lr, 12), round(params[0].item(), 12))
        0.1 0.8
        0.25 0.4
    """

    repr_fields = ("lr", "weighting", "eta", "theta")

    def __init__(self, lr: float = 1e-6, weighting: str = "uniform") -> None:
        super().__init__(weighting=weighting, aggregators=_normalized_chain(), rule=AdaptiveStepSize(lr))

    @property
    def eta(self) -> Optional[float]:
        """η_{t−1}: the stepsize of the last server step (``None`` before the first)."""
        return None if self.rule_state is None else self.rule_state.eta

    @property
    def theta(self) -> float:
        """θ_{t−1} = η_{t−1}/η_{t−2} (+∞ until the second server step)."""
        return math.inf if self.rule_state is None else self.rule_state.theta

    @property
    def current_lr(self) -> float:
        """The server stepsize η used in the last round (η_0 = ``lr`` before the first)."""
        return self.lr if self.eta is None else self.eta

    def next_step_size(self, params: list[Tensor], pseudo_gradient: list[Tensor]) -> tuple[float, float]:
        """(η_t, θ_t) for x_t = ``params`` and −g_t = ``pseudo_gradient``, from the stored x_{t−1}, −g_{t−1},
        η_{t−1}, θ_{t−1} (Malitsky & Mishchenko 2020, Alg. 1, l. 3 and 5; guards in the class docstring)."""
        state = self.rule_state if self.rule_state is not None else self.server_rule.init(params)
        return self.server_rule.next_step_size(params, pseudo_gradient, state)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Log ``server_lr`` (the round's η_t) with the round as the step."""
        if self.eta is not None:
            pl_module.log("server_lr", self.eta, on_step=False, on_epoch=True, batch_size=1)


class NormalizedFedAvgM(FedAvgM):
    """:class:`~lightning_fed.callbacks.FedAvgM` (heavy-ball server momentum) on Nastya's normalised direction.

    b_t = μ·b_{t−1} + g_t, x_{t+1} = x_t − η·b_t with g_t the cohort mean of (x_t − x_{t,m})/(γ·n_m)
    (Malinovsky et al., Alg. 1, l. 8-9, and Sec. 7: server-side optimizers "on top of the local updates").
    With μ = 0 it is :class:`ServerStepSize`.

    Args:
        lr: Server stepsize η (> 0), in units of gradient steps (η = γ·n matches FedAvgM when all n_m = n).
        momentum: μ in [0, 1) (default 0.9).
        weighting: ``"uniform"`` (default, Alg. 1, l. 9) or ``"num_samples"``.

    Raises:
        ValueError: ``lr`` not finite and > 0, ``momentum`` outside [0, 1), an unknown ``weighting``; at a server
            update, the errors of :class:`ServerStepSize`.

    Example: g = −Δ/(γ·n) = 0.5/(0.25·2) = 1 every round; b_1 = 1, x_1 = −0.5; b_2 = 0.9 + 1 = 1.9,
    x_2 = −0.5 − 0.5·1.9 = −1.45::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> opt = NormalizedFedAvgM(lr=0.5, momentum=0.9)
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> for _ in range(2):
        ...     update = ClientUpdate(0, [torch.tensor([-0.5], dtype=torch.float64)], 4, num_steps=2, loss=0.0, client_lr=0.25)
        ...     _ = opt.server_update(params, [update])
        ...     print(round(params[0].item(), 12))
        -0.5
        -1.45
    """

    def __init__(self, lr: float, momentum: float = 0.9, weighting: str = "uniform") -> None:
        super().__init__(lr=lr, momentum=momentum, weighting=weighting, aggregators=_normalized_chain())


class _NormalizedAdaptive:
    """The one definition of :class:`NormalizedFedAdam` and :class:`NormalizedFedYogi`: the adaptive server optimizer
    it is mixed into (Reddi et al. 2021, Alg. 2, l. 11, 13/14, 15) on Nastya's normalised direction: Δ_t is replaced
    by −g_t, the cohort mean of Δ_m/(γ·n_m) (Malinovsky et al., Alg. 1, l. 8-9).

    Args:
        lr: Server learning rate η (> 0, default 1e-2).
        beta1: β₁ in [0, 1) (default 0.9).
        beta2: β₂ in [0, 1) (default 0.99).
        tau: Adaptivity τ (> 0, default 1e-3).
        initial_accumulator: v_{−1} ≥ 0 (default τ²).
        bias_correction: torch-style bias correction on top of ``"reddi"`` (default ``False``).
        weighting: ``"uniform"`` (default, Alg. 1, l. 9) or ``"num_samples"``.
        convention: ``"reddi"`` (default), ``"flower"`` or ``"tff"`` (see
            :class:`~lightning_fed.callbacks.AdaptiveServerOptimizer`).

    Raises:
        ValueError: as :class:`~lightning_fed.callbacks.AdaptiveServerOptimizer`; at a server update, the errors
            of :class:`ServerStepSize`.
    """

    def __init__(
        self,
        lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        bias_correction: bool = False,
        weighting: str = "uniform",
        convention: str = "reddi",
    ) -> None:
        super().__init__(lr=lr, beta1=beta1, beta2=beta2, tau=tau, initial_accumulator=initial_accumulator,
                         bias_correction=bias_correction, weighting=weighting, convention=convention,
                         aggregators=_normalized_chain())


class NormalizedFedAdam(_NormalizedAdaptive, FedAdam):
    """:class:`~lightning_fed.callbacks.FedAdam` (Reddi et al. 2021, Alg. 2, l. 11, 14-15) on Nastya's normalised
    direction: Δ_t is replaced by −g_t, the cohort mean of Δ_m/(γ·n_m) (Malinovsky et al., Alg. 1, l. 8-9).

    The paper's Sec. 7 / Fig. 2 (right) runs "Adam with stepsize 10^-2" on the per-pass direction of LeNet on
    CIFAR-10; ``lr=1e-2`` is the default here (the other defaults are Reddi et al.'s: β₁ = 0.9, β₂ = 0.99,
    τ = 1e-3, v_{−1} = τ², no bias correction; ``bias_correction=True`` gives torch.optim.Adam's correction,
    ``convention="flower"``/``"tff"`` Flower's/TFF's formulas). Arguments and errors: :class:`_NormalizedAdaptive`
    (``lr``, ``beta1``, ``beta2``, ``tau``, ``initial_accumulator``, ``bias_correction``, ``weighting`` — default
    ``"uniform"`` —, ``convention``).

    Example: the same step as :class:`~lightning_fed.callbacks.FedAdam` on Δ/(γ·n) = 0.5/(0.25·2) = 1::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedAdam
        >>> x, y = [torch.zeros(1, dtype=torch.float64)], [torch.zeros(1, dtype=torch.float64)]
        >>> _ = NormalizedFedAdam().server_update(x, [ClientUpdate(0, [torch.tensor([0.5], dtype=torch.float64)], 4, num_steps=2,
        ...                                                  loss=0.0, client_lr=0.25)])
        >>> _ = FedAdam().server_update(y, [ClientUpdate(0, [torch.tensor([1.0], dtype=torch.float64)], 4, 1, 0.0)])
        >>> torch.equal(x[0], y[0]), round(x[0].item(), 10)
        (True, 0.0099005049)
    """


class NormalizedFedYogi(_NormalizedAdaptive, FedYogi):
    """:class:`~lightning_fed.callbacks.FedYogi` (Reddi et al. 2021, Alg. 2, l. 11, 13, 15) on Nastya's normalised
    direction −g_t = mean of Δ_m/(γ·n_m) (Malinovsky et al., Alg. 1, l. 8-9). Arguments and errors as
    :class:`NormalizedFedAdam` (one definition, :class:`_NormalizedAdaptive`).

    Example: the same step as :class:`~lightning_fed.callbacks.FedYogi` on Δ/(γ·n) = 0.5/(0.25·2) = 1::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedYogi
        >>> x, y = [torch.zeros(1, dtype=torch.float64)], [torch.zeros(1, dtype=torch.float64)]
        >>> _ = NormalizedFedYogi().server_update(x, [ClientUpdate(0, [torch.tensor([0.5], dtype=torch.float64)], 4, num_steps=2,
        ...                                                  loss=0.0, client_lr=0.25)])
        >>> _ = FedYogi().server_update(y, [ClientUpdate(0, [torch.tensor([1.0], dtype=torch.float64)], 4, 1, 0.0)])
        >>> torch.equal(x[0], y[0]), round(x[0].item(), 10)
        (True, 0.0099005)
    """


class NormalizedFedAdagrad(FedAdagrad):
    """:class:`~lightning_fed.callbacks.FedAdagrad` (Reddi et al. 2021, Alg. 2, l. 11, 12, 15) on Nastya's
    normalised direction −g_t = mean of Δ_m/(γ·n_m) (Malinovsky et al., Alg. 1, l. 8-9).

    Args:
        lr: Server learning rate η (> 0, default 1e-2).
        tau: Adaptivity τ (> 0, default 1e-3).
        initial_accumulator: v_{−1} ≥ 0 (default τ²).
        beta1: β₁ in [0, 1) (``None``, the default: 0.9 under ``"reddi"``, 0 under ``"flower"``/``"tff"``).
        bias_correction: bias-correct m (default ``False``).
        weighting: ``"uniform"`` (default, Alg. 1, l. 9) or ``"num_samples"``.
        convention: ``"reddi"`` (default), ``"flower"`` or ``"tff"`` (see :class:`~lightning_fed.callbacks.FedAdagrad`).

    Raises:
        ValueError: as :class:`~lightning_fed.callbacks.AdaptiveServerOptimizer`; at a server update, the errors
            of :class:`ServerStepSize`.

    Example: the same step as :class:`~lightning_fed.callbacks.FedAdagrad` on Δ/(γ·n) = 0.5/(0.25·2) = 1::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedAdagrad
        >>> x, y = [torch.zeros(1, dtype=torch.float64)], [torch.zeros(1, dtype=torch.float64)]
        >>> _ = NormalizedFedAdagrad().server_update(x, [ClientUpdate(0, [torch.tensor([0.5], dtype=torch.float64)], 4, num_steps=2,
        ...                                                  loss=0.0, client_lr=0.25)])
        >>> _ = FedAdagrad().server_update(y, [ClientUpdate(0, [torch.tensor([1.0], dtype=torch.float64)], 4, 1, 0.0)])
        >>> torch.equal(x[0], y[0]), round(x[0].item(), 10)
        (True, 0.0009990005)
    """

    def __init__(
        self,
        lr: float = 1e-2,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        beta1: Optional[float] = None,
        bias_correction: bool = False,
        weighting: str = "uniform",
        convention: str = "reddi",
    ) -> None:
        super().__init__(lr=lr, tau=tau, initial_accumulator=initial_accumulator, beta1=beta1,
                         bias_correction=bias_correction, weighting=weighting, convention=convention,
                         aggregators=_normalized_chain())
