"""FedNova: normalized averaging (Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020; arXiv:2007.07481).

The paper's framework (Sec. 4.1, "a generalized update rule"): client i of round t runs τ_i local steps from x_t and
its model change is a non-negative combination of the local gradients it computed, G_i = [g_i(x^(t,0)), …,
g_i(x^(t,τ_i−1))] (d × τ_i), ::

    Δ_i = x_i − x_t = −γ·G_i·a_i,          d_i = G_i·a_i / ‖a_i‖₁   (the normalized gradient)

with γ the client learning rate. FedAvg's update Σ_i p_i Δ_i = −γ·τ_eff·Σ_i w_i d_i, with τ_eff = Σ_i p_i‖a_i‖₁ and
w_i = p_i‖a_i‖₁/τ_eff (Sec. 4.1; Flower's baseline cites it as Eq. (6)), minimises the *surrogate* objective
Σ_i w_i F_i instead of Σ_i p_i F_i (Theorem 1) whenever the ‖a_i‖₁ differ. FedNova (Sec. 5) keeps τ_eff and replaces
w_i by p_i::

    x_{t+1} − x_t = −γ·τ_eff·Σ_i p_i d_i = τ_eff·Σ_i p_i·Δ_i/‖a_i‖₁

In this framework's sign convention the pseudo-gradient (a model change) is Δ_t = τ_eff·Σ_i p_i·Δ_i/‖a_i‖₁ and the
server rule applies it: :class:`~lightning_fed.algorithms.fednova.FedNova` is ``SGD(lr=η)``, x_{t+1} = x_t + η·Δ_t (η = 1: the
paper's update); under any other rule (e.g. FedAdam's) Δ_t is what that rule receives.

‖a_i‖₁ in closed form (τ = τ_i = ``ClientUpdate.num_steps``, the local optimizer steps the client actually took; the
examples of Sec. 4.1 after the generalized update rule):

* local SGD (``local_solver="sgd"``): x_{k+1} = x_k − γ g_k, so Δ_i = −γ Σ_k g_k, a_i = [1, …, 1] ∈ ℝ^τ and
  ‖a_i‖₁ = τ;
* local heavy-ball momentum ρ (``"momentum"``; ``torch.optim.SGD(momentum=ρ)``, dampening 0, buffer v_1 = g_1):
  v_k = ρ v_{k−1} + g_k, x_{k+1} = x_k − γ v_k. Then Δ_i = −γ Σ_{k=1}^τ v_k = −γ Σ_{j=1}^τ g_j Σ_{k=j}^τ ρ^{k−j}, so
  a_i = [1−ρ^τ, 1−ρ^{τ−1}, …, 1−ρ]/(1−ρ) (the paper's a_i for momentum) and::

      ‖a_i‖₁ = Σ_{m=1}^{τ} (1−ρ^m)/(1−ρ) = [τ − ρ(1−ρ^τ)/(1−ρ)] / (1−ρ)

* proximal local SGD (``"proximal"``; FedProx's client half,
  :class:`~lightning_fed.algorithms.FedProxClient`, gradient g_k + μ(x_k − x_t)): with y_k = x_k − x_t,
  y_{k+1} = (1−α) y_k − γ g_k and α = γμ, so Δ_i = y_τ = −γ Σ_{k=0}^{τ−1} (1−α)^{τ−1−k} g_k,
  a_i = [(1−α)^{τ−1}, …, (1−α), 1] (the paper's a_i for FedProx) and::

      ‖a_i‖₁ = Σ_{m=0}^{τ−1} (1−α)^m = [1 − (1−α)^τ] / α        (τ when α = 0)

  which needs 0 ≤ α < 1 (for α ≥ 1 the entries (1−α)^m are not non-negative); γ is the round's client learning rate
  ``ClientUpdate.client_lr`` (one rate for all parameters).

The geometric sums are evaluated with ``expm1``/``log1p`` (no cancellation for small α or ρ near 1); the test checks
each closed form against the explicitly built vector a_i.

Choices and conventions (the paper is followed; where the peers differ it is said here):

* p_i: the clients' sample weights within the round's cohort, p_i = n_i / Σ_{j∈S_t} n_j (``weighting="num_samples"``,
  the default) or 1/|S_t| (``"uniform"``); τ_eff = Σ p_i‖a_i‖₁ over the same p. A client that took no local step
  (τ_i = 0: a_i is empty and d_i undefined) gets p_i = 0 and the others are renormalised, as Nastya's normalisation
  does in this framework; a round in which nobody stepped gives Δ_t = 0.
* The authors' code (github.com/JYWa/FedNova, ``distoptim/FedNova.py``) computes ‖a_i‖₁ on the client by running the
  same recurrences step by step (``local_normalizing_vec``) and agrees with the closed forms above, but (a) for the
  proximal variant it sets τ_eff = Σ p_i τ_i (the step counts) instead of Σ p_i‖a_i‖₁; we follow the paper's
  τ_eff = Σ p_i‖a_i‖₁; (b) it allows momentum and proximal at once, with the proximal term added *after* the momentum
  buffer and both recurrences applied to one normalising scalar, which matches neither derivation — here
  momentum + proximal is refused; (c) its p_i is the client's share of the *whole* population's data (``ratio``); (d)
  its server momentum ``gmf`` on −Δ_t, with buffer b_1 = g_1 and step 1, is
  ``ServerOptimizer(rule=Momentum(lr=1.0, momentum=gmf), aggregators=[FedNovaAveraging(...)])`` here. Weight decay is
  folded into the local gradient before momentum there and in ``torch.optim.SGD`` alike (the gradient of
  F_i + λ/2‖x‖²), and the momentum buffer is reset every round (here: every client starts with a fresh optimizer).
* Flower's baseline (``baselines/fednova``, strategy.py) sends the same statistics but aggregates with flwr's
  ``aggregate``, which divides by the sum of the scales τ_eff·p_i/‖a_i‖₁: τ_eff cancels and its update is
  Σ_i [p_i/‖a_i‖₁ / Σ_j p_j/‖a_j‖₁]·Δ_i, i.e. a harmonic-mean τ_eff = 1/Σ_j (p_j/‖a_j‖₁) in place of the paper's
  arithmetic mean (the two agree when all ‖a_i‖₁ are equal). Its p_i is also the population share.
* fedlab (``fedlab/contrib/algorithm/fednova.py``, which FedAWARE's ``baselines/fednova.py`` runs) implements local
  SGD only, with τ_i = epochs·len(loader) (the nominal, not the actual, step count) and p_i = 1/|S_t|; its default
  option ``"weighted_scale"`` also multiplies Δ_t by N/|S_t| (population over cohort size).

With plain SGD and equal τ_i FedNova is FedAvg exactly (‖a_i‖₁ = τ for all i, so Δ_t = Σ_i p_i Δ_i).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.algorithms.fedprox import FedProxClient
from lightning_fed.checks import check_choice, check_non_negative, check_unit_interval
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, weighted_sum
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.rules.sgd import SGD

__all__ = ["FedNova", "FedNovaAveraging", "LOCAL_SOLVERS", "a_norm"]

#: The local solvers whose ‖a_i‖₁ FedNova knows (Wang et al. 2020, Sec. 4.1).
LOCAL_SOLVERS = ("sgd", "momentum", "proximal")


def _geometric_sum(r: float, n: int) -> float:
    """Σ_{m=0}^{n−1} r^m for 0 ≤ r ≤ 1 (n for r = 1), without cancellation for r near 0 or 1."""
    if n <= 0:
        return 0.0
    if r == 1.0:
        return float(n)
    if r == 0.0:
        return 1.0
    return -math.expm1(n * math.log1p(r - 1.0)) / (1.0 - r)  # (1 − r^n)/(1 − r)


def a_norm(local_solver: str, num_steps: int, momentum: float = 0.0, alpha: float = 0.0) -> float:
    """‖a_i‖₁ of a client that took ``num_steps`` = τ local steps (closed forms of the module docstring).

    Args:
        local_solver: ``"sgd"`` (τ), ``"momentum"`` ([τ − ρ(1−ρ^τ)/(1−ρ)]/(1−ρ) with ρ = ``momentum``) or
            ``"proximal"`` ([1 − (1−α)^τ]/α with α = ``alpha`` = γμ).
        num_steps: τ ≥ 0 (0 gives 0).
        momentum: ρ in [0, 1) (``"momentum"`` only).
        alpha: α = γμ in [0, 1) (``"proximal"`` only).

    Returns:
        ‖a_i‖₁ as a float (dimensionless: a number of "effective" local steps).

    Raises:
        ValueError: an unknown ``local_solver``, ``num_steps`` < 0, ρ or α outside [0, 1).

    Example: τ = 3 steps; momentum ρ = 0.5 gives a = [1.75, 1.5, 1] and proximal α = 0.5 gives a = [0.25, 0.5, 1]::

        >>> a_norm("sgd", 3), a_norm("momentum", 3, momentum=0.5), a_norm("proximal", 3, alpha=0.5)
        (3.0, 4.25, 1.75)
    """
    if local_solver not in LOCAL_SOLVERS:
        raise ValueError(f"`local_solver` must be one of {LOCAL_SOLVERS}, got {local_solver!r}.")
    tau = int(num_steps)
    if tau < 0:
        raise ValueError(f"`num_steps` must be >= 0, got {num_steps!r}.")
    if local_solver == "sgd":
        return float(tau)
    if local_solver == "momentum":
        rho = float(momentum)
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"The momentum ρ must be in [0, 1), got {momentum!r}.")
        return (tau - rho * _geometric_sum(rho, tau)) / (1.0 - rho) if rho > 0 else float(tau)
    a = float(alpha)
    if not 0.0 <= a < 1.0:
        raise ValueError(
            f"Proximal local SGD needs α = γ·μ in [0, 1) (client learning rate times `mu`), got α = {alpha!r}: for "
            "α ≥ 1 a step overshoots the anchor x_t and a_i has entries (1−α)^k that are not non-negative."
        )
    return _geometric_sum(1.0 - a, tau)


class FedNovaAveraging(Stage):
    """FedNova's reducer: Δ_t = τ_eff·Σ_i p_i·Δ_i/‖a_i‖₁ with τ_eff = Σ_i p_i‖a_i‖₁ (Wang et al. 2020, Sec. 5; the
    generalized update of Sec. 4.1; derivations and the peers' conventions in the module docstring).

    p_i are the round's ``ClientDeltas.counts`` normalised over the clients that took a local step (sample counts
    or 1, as the server optimizer's ``weighting`` gives them); τ_i is ``ClientUpdate.num_steps``; the proximal α = γμ
    uses the round's ``ClientUpdate.client_lr`` γ. Summed in float64 and rounded once to the parameters' dtype, in
    the order of :class:`~lightning_fed.server.aggregators.WeightedMean` (so equal τ_i under plain SGD give
    FedAvg's bits). No state.

    The local solver is declared, not inferred: the normalisation depends on it, and a declared solver is part of
    the run record and the checkpoint's configuration. :meth:`check_fit` (called at fit start by the server
    optimizer, before round 0 trains) refuses a declaration the clients do not match; :meth:`check_round_start` (at
    the start of every round, before its clients train) refuses a proximal α = γ·μ ≥ 1 with the round's client
    learning rate (an LR scheduler may raise γ after fit start).

    Args:
        local_solver: ``"sgd"`` (default), ``"momentum"`` or ``"proximal"``.
        momentum: ρ in [0, 1) of the clients' ``torch.optim.SGD(momentum=ρ)`` (``"momentum"`` only; default 0).
        mu: FedProx's μ ≥ 0 (``"proximal"`` only; default 0): the clients must run ``FedProxClient(mu)``.

    Raises:
        ValueError: an unknown ``local_solver``; ``momentum`` not in [0, 1) or nonzero without
            ``local_solver="momentum"``; ``mu`` not finite ≥ 0 or nonzero without ``local_solver="proximal"``; in
            :meth:`apply`, ``ClientDeltas.updates`` missing, or (proximal) a client learning rate that is not finite
            > 0, differs between parameters, or makes α = γμ ≥ 1; in :meth:`check_round_start`, the round's client
            learning rate makes α ≥ 1 (before the round's clients train).

    Example: two clients of 1 and 3 samples took τ = 1 and 4 SGD steps, Δ_0 = [1], Δ_1 = [2]: p = (¼, ¾),
    τ_eff = ¼·1 + ¾·4 = 3.25 and Δ_t = 3.25·(¼·1/1 + ¾·2/4) = 2.03125 (FedAvg: ¼·1 + ¾·2 = 1.75)::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.server.aggregators import EmptyState, RoundInfo
        >>> updates = [ClientUpdate(0, [torch.tensor([1.0])], num_samples=1, num_steps=1, loss=0.0),
        ...            ClientUpdate(1, [torch.tensor([2.0])], num_samples=3, num_steps=4, loss=0.0)]
        >>> x = ClientDeltas([0, 1], [u.delta for u in updates], torch.tensor([1.0, 3.0], dtype=torch.float64), updates)
        >>> FedNovaAveraging().apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))[0]
        [tensor([2.0312])]
        >>> FedNovaAveraging(local_solver="sgd", momentum=0.9)
        Traceback (most recent call last):
        ...
        ValueError: `momentum`=0.9 is the local momentum ρ of local_solver='momentum', but local_solver='sgd'; use local_solver='momentum', momentum=0.9.
    """

    kind = "reduce"
    #: Δ_t is not the clients' weighted mean: ``round_gradient_diversity`` uses the raw updates' mean instead.
    shifts_mean = True

    def __init__(self, local_solver: str = "sgd", momentum: float = 0.0, mu: float = 0.0) -> None:
        check_choice("local_solver", local_solver, LOCAL_SOLVERS)
        momentum = check_unit_interval("momentum", momentum)
        mu = check_non_negative("mu", mu)
        if momentum != 0.0 and local_solver != "momentum":
            raise ValueError(
                f"`momentum`={momentum} is the local momentum ρ of local_solver='momentum', but "
                f"local_solver={local_solver!r}; use local_solver='momentum', momentum={momentum}"
                + ("" if local_solver == "sgd" else " (momentum and proximal together have no closed-form a_i)") + "."
            )
        if mu != 0.0 and local_solver != "proximal":
            raise ValueError(
                f"`mu`={mu} is FedProx's proximal coefficient of local_solver='proximal', but "
                f"local_solver={local_solver!r}; use local_solver='proximal', mu={mu}."
            )
        self.local_solver = local_solver
        self.momentum = momentum
        self.mu = mu

    # ------------------------------------------------------------------ the normalisation
    def _alpha(self, update: Any) -> float:
        """α = γ·μ of one client's round (proximal only)."""
        if self.mu == 0.0:
            return 0.0
        lrs = [float(lr) for lr in (update.client_lrs or [update.client_lr]) if not math.isnan(float(lr))]
        if not lrs or any(not math.isfinite(lr) or lr <= 0 for lr in lrs) or max(lrs) != min(lrs):
            raise ValueError(
                f"{self!r} needs the client learning rate γ (α = γ·μ): client {update.client_id} reported "
                f"`client_lr`={update.client_lr!r} and `client_lrs`={list(update.client_lrs)!r}, but proximal FedNova "
                "needs one finite γ > 0 for all parameters (Wang et al. 2020 derive a_i for one client learning rate)."
            )
        return lrs[0] * self.mu

    def client_a_norm(self, update: Any) -> float:
        """‖a_i‖₁ of one client's :class:`~lightning_fed.ClientUpdate` (:func:`a_norm` with τ = ``num_steps``)."""
        alpha = self._alpha(update) if self.local_solver == "proximal" and int(update.num_steps) > 0 else 0.0
        return a_norm(self.local_solver, int(update.num_steps), momentum=self.momentum, alpha=alpha)

    def combine(self, x: ClientDeltas) -> tuple[Tensor, list[float], float]:
        """The round's p (float64 ``[K]``, summing to 1 over the clients that stepped, 0 for the others), the
        clients' ‖a_i‖₁ and τ_eff = Σ_i p_i‖a_i‖₁ (0 when no client stepped).

        Raises:
            ValueError: ``x.updates`` missing, or as :meth:`client_a_norm`.
        """
        if x.updates is None:
            raise ValueError(
                f"{type(self).__name__} needs each client's local steps (and learning rate): `ClientDeltas.updates` "
                "must hold the round's ClientUpdate list (the server optimizer fills it)."
            )
        norms = [self.client_a_norm(u) for u in x.updates]
        counts = x.counts.to(torch.float64) * torch.tensor([n > 0 for n in norms], dtype=torch.float64)
        total = float(counts.sum())
        if total <= 0:
            return torch.zeros_like(counts), norms, 0.0
        p = counts / total
        return p, norms, float(sum(c * n for c, n in zip(counts.tolist(), norms))) / total

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        p, norms, _ = self.combine(x)
        counts = x.counts.to(torch.float64) * (p > 0)
        first = x.deltas[0]
        total = float(counts.sum())
        if total <= 0:  # no client took a local step: nothing moved
            return [torch.zeros_like(d) for d in first], state
        # Δ_t = τ_eff·Σ_i (c_i/C)·Δ_i/‖a_i‖₁ = (Σ_i c_i·s_i·Δ_i)/C with s_i = S/(C·‖a_i‖₁), S = Σ_j c_j‖a_j‖₁, C = Σ_j c_j;
        # equal ‖a_i‖₁ = τ (integer) give s_i = 1 exactly, hence WeightedMean's operations and bits
        weighted = sum(c * n for c, n in zip(counts.tolist(), norms))
        alphas = [c * (weighted / (total * n)) if c > 0 else 0.0 for c, n in zip(counts.tolist(), norms)]
        result = weighted_sum(x.deltas, alphas, skip_zero=True)
        torch._foreach_div_(result, total)
        return [acc.to(d.dtype) for acc, d in zip(result, first)], state

    # ------------------------------------------------------------------ fit-start check
    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """At fit start (the server optimizer's ``on_train_start``, before round 0 trains): refuse clients that do not
        run the declared local solver, naming both parts.

        Raises:
            ValueError: manual optimization (τ_i would count batches, not optimizer steps); a client optimizer that
                is not ``torch.optim.SGD``, or uses dampening or Nesterov; its momentum ≠ ``momentum`` (ρ = 0 unless
                ``local_solver="momentum"``); ``local_solver="proximal"`` without exactly one ``FedProxClient`` of the
                same ``mu`` among the server optimizer's client algorithms, or with parameter groups of different
                learning rates or γ·μ ≥ 1; a ``FedProxClient`` with μ > 0 under another local solver; any other
                client algorithm (FedNova cannot normalise what it does to the local steps).
        """
        me = repr(self)
        algorithms = list(getattr(server, "client_algorithms", []) or [])
        prox = [a for a in algorithms if isinstance(a, FedProxClient)]
        others = [a for a in algorithms if not isinstance(a, FedProxClient)]
        if others:
            raise ValueError(
                f"{me} normalises local SGD, momentum SGD or FedProx's proximal SGD (Wang et al. 2020, Sec. 4.1), but "
                f"the client algorithm {others[0]!r} changes the local steps in a way it cannot normalise."
            )
        if self.local_solver == "proximal":
            if len(prox) != 1 or prox[0].mu != self.mu:
                found = "none" if not prox else ", ".join(repr(a) for a in prox)
                raise ValueError(
                    f"{me} normalises FedProx's proximal local steps with mu={self.mu}, so the clients must run "
                    f"exactly one FedProxClient(mu={self.mu}); the server optimizer's client algorithms have {found}."
                )
        else:
            active = [a for a in prox if a.mu != 0.0]
            if active:
                raise ValueError(
                    f"{active[0]!r} runs on the clients, but {me} normalises local_solver={self.local_solver!r} "
                    f"steps; use local_solver='proximal', mu={active[0].mu}."
                )
        if not getattr(pl_module, "automatic_optimization", True):
            raise ValueError(
                f"{me} normalises by τ_i, the client's local optimizer steps, which the federated loop counts as "
                "batches: manual optimization (`automatic_optimization = False`) is not supported."
            )
        lrs = []
        for opt in getattr(trainer, "optimizers", None) or ():
            raw = getattr(opt, "optimizer", opt)
            name = type(raw).__name__
            if not isinstance(raw, torch.optim.SGD):
                raise ValueError(
                    f"{me} needs local SGD (torch.optim.SGD, with or without momentum): the client optimizer is "
                    f"{name}, whose local steps are not a fixed combination a_i of the local gradients."
                )
            for g, group in enumerate(raw.param_groups):
                rho = float(group.get("momentum", 0.0) or 0.0)
                if group.get("nesterov", False) or float(group.get("dampening", 0.0) or 0.0) != 0.0:
                    raise ValueError(
                        f"The client optimizer {name} uses nesterov={group.get('nesterov', False)}, "
                        f"dampening={group.get('dampening', 0.0)} in parameter group {g}, but {me} derives a_i for "
                        "heavy-ball momentum without dampening (nesterov=False, dampening=0)."
                    )
                if rho != self.momentum:
                    hint = (f"use local_solver='momentum', momentum={rho}" if rho != 0 and self.local_solver == "sgd"
                            else f"set the client optimizer's momentum to {self.momentum}")
                    raise ValueError(
                        f"The client optimizer {name} has momentum={rho} in parameter group {g}, but {me} normalises "
                        f"local_solver={self.local_solver!r} steps with momentum ρ={self.momentum}; {hint}."
                    )
                lrs.append(float(group.get("lr", float("nan"))))
        self._check_proximal_lrs(lrs, "")

    def _check_proximal_lrs(self, lrs: list[float], when: str) -> None:
        """Proximal FedNova: one client learning rate γ with α = γ·μ < 1 (``when``: which round, for the message)."""
        if self.local_solver == "proximal" and self.mu > 0 and lrs:
            me = repr(self)
            if max(lrs) != min(lrs):
                raise ValueError(
                    f"{me} derives a_i for one client learning rate γ (α = γ·μ), but {when}the client optimizer's "
                    f"parameter groups have learning rates {lrs}."
                )
            if not lrs[0] * self.mu < 1.0:
                raise ValueError(
                    f"{me} needs α = γ·μ < 1, but {when}the client learning rate γ={lrs[0]} gives α = "
                    f"{lrs[0] * self.mu}" + (" (set by the LR scheduler); keep γ < 1/μ in every round." if when else ".")
                )

    def check_round_start(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """At the start of every round, before its clients train: proximal FedNova's α = γ·μ < 1 with the round's
        client learning rate γ (an LR scheduler may have raised it since fit start).

        Raises:
            ValueError: naming the round, γ and α; or the parameter groups' different learning rates.
        """
        if self.local_solver != "proximal" or self.mu == 0.0:
            return
        lrs = [float(group.get("lr", float("nan")))
               for opt in getattr(trainer, "optimizers", None) or ()
               for group in getattr(opt, "optimizer", opt).param_groups]
        self._check_proximal_lrs(lrs, f"in round {int(trainer.current_epoch)} ")


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

    (with ``FederatedTrainer(client_algorithms=[FedProxClient(mu)])`` for the proximal variant), or the authors' server momentum ``gmf``:
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
