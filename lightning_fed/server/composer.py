"""The server side's composition: client weighting → aggregator chain → server rule, and their state.

:class:`ServerComposer` is what a server optimizer computes, apart from Lightning: its protocol is optax's,
:meth:`~ServerComposer.init` (the states, for a model shaped like ``params``) and :meth:`~ServerComposer.update`
(Δ_t from a round's client updates, then x_t → x_{t+1} in place). It is not a callback and knows no trainer:
:class:`~lightning_fed.callbacks.ServerOptimizer` is the Lightning adapter around one (its hooks, fit-start checks,
the client halves and their per-client state, checkpointing).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from lightning_fed.client.update import ClientUpdate, DeltaNorms
from lightning_fed.migrations import restore_tables, saved_stage_state
from lightning_fed.server.aggregators.base import (
    ClientDeltas,
    EmptyState,
    RoundInfo,
    RoundReport,
    Stage,
    WeightedMean,
    chain_states,
    check_chain,
    run_chain,
)
from lightning_fed.server.checks import WEIGHTINGS
from lightning_fed.server.rules.base import Rule, move_state, state_from_dict, state_to_dict

__all__ = ["ServerComposer", "ServerRound"]


class ServerRound(NamedTuple):
    """A round's server step as the federated loop reads it (``ServerOptimizer.round_step``).

    Attributes:
        pseudo_gradient: Δ_t, one tensor per federated parameter.
        weights: The clients' aggregation weights w (float64 ``[K]``, summing to 1; ``[0]`` in a round without any).
        gradient_diversity: D of the round, computed when called (NaN without clients).
        releases_buffers: Whether the clients' buffers may be averaged into the global ones (not under DP noise).
        snapshot: The server optimizer's state from before the step (``ServerOptimizer.snapshot_state``) when asked
            for, else ``None``: what ``ServerOptimizer.undo_round_step`` goes back to.

    Example: FedAvg's round of two clients with 1 and 3 samples; D = √(Σ_i w_i‖Δ_i‖² / ‖Σ_i w_i Δ_i‖²) = √(0.5/0.125)::

        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedAvg
        >>> step = FedAvg().round_step([torch.zeros(2)], [ClientUpdate(0, [torch.ones(2)], 1, 1, 0.0),
        ...                                                ClientUpdate(1, [torch.zeros(2)], 3, 1, 0.0)])
        >>> step.pseudo_gradient, step.weights, step.gradient_diversity(), step.releases_buffers, step.snapshot
        ([tensor([0.2500, 0.2500])], tensor([0.2500, 0.7500], dtype=torch.float64), 2.0, True, None)
    """

    pseudo_gradient: list[Tensor]
    weights: Tensor
    gradient_diversity: Callable[[], float]
    releases_buffers: bool
    snapshot: Optional[dict[str, Any]] = None


class ServerComposer:
    """Client weighting, an aggregator chain and a server rule, with their states (Reddi et al. 2021, Alg. 1,
    l. 10-11: Δ_t = Σ_i w_i Δ_i, x_{t+1} = ServerOpt(x_t, Δ_t)).

    Args:
        weighting: ``"num_samples"`` (w_i ∝ |D_i|) or ``"uniform"`` (w_i = 1/|S|).
        aggregators: An aggregator chain in place of the weighted mean, or ``None`` (checked by
            :func:`~lightning_fed.server.aggregators.check_chain`).
        rule: The server rule (:class:`~lightning_fed.server.rules.Rule`).

    Raises:
        ValueError: an unknown ``weighting``, naming the allowed values; as ``check_chain`` (then TypeError too).

    Example: two clients of 1 and 2 samples, FedAvg's rule with η = 1 (x_{t+1} = x_t + Δ_t)::

        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.server.rules import SGD
        >>> composer = ServerComposer("num_samples", None, SGD(1.0))
        >>> params = [torch.zeros(2)]
        >>> composer.update(params, [ClientUpdate(0, [torch.tensor([1.0, 0.0])], 1, 1, 0.0),
        ...                          ClientUpdate(1, [torch.tensor([4.0, 3.0])], 2, 1, 0.0)])
        [tensor([3., 2.])]
        >>> params, composer.num_steps, composer.round_report.weights
        ([tensor([3., 2.])], 1, tensor([0.3333, 0.6667], dtype=torch.float64))
    """

    def __init__(self, weighting: str, aggregators: Optional[list[Stage]], rule: Rule) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"`weighting` must be one of {WEIGHTINGS}, got {weighting!r}.")
        self.weighting = weighting
        self.aggregators: Optional[list[Any]] = None if aggregators is None else check_chain(aggregators)
        self.rule = rule
        #: The rule's typed state (``None`` before the first step) and the chain's (one per stage; ``None`` until
        #: first asked for, :meth:`chain_state`); ``saved_aggregator_state`` the chain's states as loaded, waiting.
        self.rule_state: Optional[Any] = None
        self.aggregator_state: Optional[tuple] = None
        self.saved_aggregator_state: Optional[list[dict[str, Any]]] = None
        #: The current round's :class:`~lightning_fed.server.aggregators.RoundInfo` (``None``: not in a fit).
        self.round_info: Optional[RoundInfo] = None
        #: Number of server steps taken so far (t after the update of round t−1).
        self.num_steps = 0
        #: The last step's :class:`~lightning_fed.server.aggregators.RoundReport` (client weights, stage reports).
        self.round_report: Optional[RoundReport] = None

    # ------------------------------------------------------------------ the protocol
    def init(self, params: list[Tensor], num_clients: Optional[int] = None) -> tuple:
        """The rule's state and the chain's states for a model shaped like ``params`` (made once, or restored from
        the state loaded); returns the chain's states. What :meth:`update` makes itself when they are missing."""
        if self.rule_state is None:
            self.rule_state = self.rule.init(params)
        return self.chain_state(params, num_clients) if self.aggregators is not None else ()

    def update(self, params: list[Tensor], updates: list[ClientUpdate], frozen: Sequence[int] = ()) -> list[Tensor]:
        """Aggregate ``updates`` into Δ_t and step ``params`` (x_t) in place to x_{t+1}; returns Δ_t. The parameters
        at ``frozen`` (positions) are left out of the chain, get Δ_t = 0 and keep x_t bit for bit (a DP chain's
        parameters that are not trained or kept local)."""
        reports: list = []
        if frozen:
            kept = [i for i in range(len(params)) if i not in set(frozen)]
            released = self.aggregate([_select(u, kept) for u in updates], reports, [params[i] for i in kept])
            pseudo_gradient = [torch.zeros_like(u_d) for u_d in updates[0].delta] if updates else \
                [torch.zeros_like(p) for p in params]
            for i, d in zip(kept, released):
                pseudo_gradient[i] = d
            global_frozen = [params[i].detach().clone() for i in frozen]
        else:
            pseudo_gradient = self.aggregate(updates, reports, list(params))
        with torch.no_grad():
            if self.rule_state is None:
                self.rule_state = self.rule.init(params)
            else:
                self.rule_state = move_state(self.rule_state, params)
            self.num_steps += 1  # t + 1 when the rule runs (1 on the first round)
            self.rule_state = self.rule.update(params, pseudo_gradient, self.rule_state, self.num_steps)
            for i, value in zip(frozen, global_frozen if frozen else ()):
                params[i].copy_(value)
        weights = self.client_weights(updates) if updates else torch.zeros(0, dtype=torch.float64)
        self.round_report = RoundReport([int(u.client_id) for u in updates], weights, tuple(reports))
        return pseudo_gradient

    # ------------------------------------------------------------------ weighting
    def client_weight_counts(self, updates: list[ClientUpdate]) -> Tensor:
        """Unnormalised aggregation weights, shape ``[len(updates)]``, float64: |D_i| (``"num_samples"``) or 1
        (``"uniform"``), then as changed by the client transforms of the chain (``Stage.client_counts``, e.g.
        zero-step clients get 0 under Nastya's normalisation); :meth:`client_weights` normalises them.

        Raises:
            ValueError: ``updates`` empty, or all clients with zero samples under ``"num_samples"``.
        """
        counts = self.weighting_counts(updates)
        for stage in self.aggregators or ():
            if stage.kind == "transform":
                counts = stage.client_counts(counts, updates)
        return counts

    def weighting_counts(self, updates: list[ClientUpdate]) -> Tensor:
        """The weighting's counts alone (|D_i| or 1), float64 ``[len(updates)]``; raises as
        :meth:`client_weight_counts`."""
        if not updates:
            raise ValueError("Cannot aggregate an empty round: no client updates.")
        if self.weighting == "uniform":
            raw = torch.ones(len(updates), dtype=torch.float64)
        else:
            raw = torch.tensor([float(u.num_samples) for u in updates], dtype=torch.float64)
        if raw.sum() <= 0 and not any(getattr(s, "checks_zero_counts", False) for s in self.aggregators or ()):
            raise ValueError("All clients in the round have zero samples; cannot weight by `num_samples`.")
        return raw

    def client_weights(self, updates: list[ClientUpdate]) -> Tensor:
        """Normalised aggregation weights w, shape ``[len(updates)]``, float64, summing to 1
        (:meth:`client_weight_counts` divided by their sum); raises as :meth:`client_weight_counts`."""
        raw = self.client_weight_counts(updates)
        return raw / raw.sum()

    def round_weights(self, updates: list[ClientUpdate]) -> Tensor:
        """:meth:`client_weights`, from :attr:`round_report` when it is these clients' (computed once per round)."""
        report = self.round_report
        if report is not None and report.client_ids == [int(u.client_id) for u in updates]:
            return report.weights
        return self.client_weights(updates)

    def client_delta(self, update: ClientUpdate) -> list[Tensor]:
        """The client's contribution to the pseudo-gradient: Δ_i as changed by the chain's client transforms
        (``Stage.client_delta``, e.g. Nastya's Δ_i/(γ·n_i)); Δ_i without a chain."""
        delta = update.delta
        for stage in self.aggregators or ():
            if stage.kind == "transform":
                delta = stage.client_delta(delta, update)
        return delta

    # ------------------------------------------------------------------ the chain
    def aggregate(self, updates: list[ClientUpdate], reports: Optional[list] = None,
                  template: Optional[list[Tensor]] = None) -> list[Tensor]:
        """The pseudo-gradient Δ_t = Σ_i w_i·client_delta(u_i), one tensor per parameter (shapes, dtypes and devices
        of the clients' deltas), with w_i = c_i / Σ_j c_j and c the :meth:`client_weight_counts` — or, with a chain,
        its result (client transforms → reducer → delta transforms); each stage's report is appended to ``reports``
        when given. A round without any client runs the chain on no client, shaped by ``template``.

        Precision: computed as (Σ_i c_i·client_delta(u_i)) / Σ_j c_j, the sum accumulated in float64 and divided
        once, then rounded once to the parameters' dtype. For a float32 (or half-precision) model with integer
        counts the float64 sum is exact (unless the deltas span more than ~2^25 in magnitude), so the result is
        the exact weighted mean correctly rounded to float32 — e.g. clients of 1 and 2 samples average exactly,
        where adding w_i·Δ_i with w = (1/3, 2/3) in float32 rounds once per client. A float64 model gets
        (Σ c_i·Δ_i)/Σc in float64. On devices without float64 (Apple MPS) the sum is accumulated in the
        parameters' dtype.
        """
        if self.aggregators is None:
            x = ClientDeltas([u.client_id for u in updates], [self.client_delta(u) for u in updates],
                             self.client_weight_counts(updates), list(updates))
            info = RoundInfo(self.num_steps, 0, len(updates), len(updates))
            mean = self.__dict__.get("_weighted_mean")  # (one kept: its workspace is reused from round to round)
            if mean is None:
                mean = self._weighted_mean = WeightedMean()
            return mean.apply(x, EmptyState(), info)[0]
        # The chain's client transforms apply themselves to the raw deltas and weighting counts.
        counts = self.weighting_counts(updates) if updates else torch.zeros(0, dtype=torch.float64)
        x = ClientDeltas([u.client_id for u in updates], [u.delta for u in updates], counts, list(updates), template)
        k = max(len(updates), 1)
        info = self.round_info if self.round_info is not None else RoundInfo(self.num_steps, 0, k, k)
        shape = x.deltas[0] if x.deltas else [torch.zeros_like(t) for t in template]
        self.chain_state(shape, info.num_clients)
        value, self.aggregator_state = run_chain(self.aggregators, x, self.aggregator_state, info, reports)
        return value

    def chain_state(self, params: list[Tensor], num_clients: Optional[int] = None) -> tuple:
        """The aggregator chain's states (one typed state per stage), created for a model shaped like ``params`` —
        or restored from the checkpoint loaded — the first time they are asked for (the first round's aggregation,
        or earlier a client half reading its server half's state, SCAFFOLD's c and c_i); ``num_clients``: N for
        the stages' ``init_state`` (default: the round's ``RoundInfo.num_clients``, else 0)."""
        if self.aggregator_state is None:
            if num_clients is None:
                num_clients = self.round_info.num_clients if self.round_info is not None else 0
            states = chain_states(self.aggregators, params, num_clients)
            if self.saved_aggregator_state is not None:
                states = tuple(type(s0)(**restore_tables(saved)) for s0, saved in zip(states, self.saved_aggregator_state))
                self.saved_aggregator_state = None
            self.aggregator_state = states
        return self.aggregator_state

    def stage_index(self, stage: Stage) -> Optional[int]:
        """The position of ``stage`` (by identity) in the chain, ``None`` when it is not in it."""
        return next((i for i, s in enumerate(self.aggregators or ()) if s is stage), None)

    def stage_state_fields(self, stage: Stage) -> Optional[dict[str, Any]]:
        """The state of ``stage`` (one of :attr:`aggregators`) as ``{field: value}`` without creating it: the live
        typed state's fields, or — after a checkpoint was loaded, before the first round re-makes the chain's states —
        the saved fields (client-state tables re-made); ``None`` when there is none yet. For fit-start checks of a
        loaded state (e.g. SCAFFOLD's c_i table against the data module's N) before any client trains.

        Example::

            >>> from lightning_fed.callbacks import SCAFFOLD
            >>> server = SCAFFOLD()
            >>> server.stage_state_fields(server.control_stage)  # no round, no checkpoint: no c, no c_i yet
            {'control': None, 'table': None}
        """
        index = self.stage_index(stage)
        if index is None:
            return None
        if self.aggregator_state is not None:
            return self.aggregator_state[index]._asdict()
        if self.saved_aggregator_state is not None and index < len(self.saved_aggregator_state):
            return restore_tables(self.saved_aggregator_state[index])
        return None

    def stage_hooks(self, name: str) -> list[Callable[..., Any]]:
        """The chain's stages' optional hook ``name`` (``check_setup``, ``check_fit``, ``prepare_round``, ...), bound,
        in chain order; ``[]`` without a chain."""
        return [hook for hook in (getattr(stage, name, None) for stage in self.aggregators or ()) if hook is not None]

    def stage_report(self, stage: Stage) -> Any:
        """What ``stage`` (one of :attr:`aggregators`) reported in the last round (:attr:`round_report`); ``None``
        before a round, in a round without a server step, or for a stage that reports nothing."""
        report = self.round_report
        if report is None:
            return None
        return next((r for s, r in zip(self.aggregators or (), report.stages) if s is stage), None)

    def aggregation_requirement(self, num_clients: int) -> Optional[str]:
        """``None`` when the aggregator chain can aggregate a round of ``num_clients`` = K reporting clients, else the
        first stage's reason (:meth:`~lightning_fed.server.aggregators.Stage.client_requirement`, e.g. Krum's
        K > 2f + 2); always ``None`` without a chain. The federated loop skips such a round like one where no
        client reported."""
        for stage in self.aggregators or ():
            requirement = getattr(stage, "client_requirement", None)
            why = requirement(num_clients) if requirement is not None else None
            if why is not None:
                return why
        return None

    def gradient_diversity(self, updates: list[ClientUpdate], pseudo_gradient: list[Tensor], raw_mean: bool,
                           delta_norms: Optional[dict[int, DeltaNorms]] = None) -> float:
        """Gradient diversity D = √( Σ_i λ_i‖g_i‖² / ‖Σ_i λ_i g_i‖² ) of the round, logged as
        ``round_gradient_diversity``.

        Source: Zeng et al., *Tackling Hybrid Heterogeneity on Federated Optimization via Gradient Diversity
        Maximization* (FedAWARE, ICML 2024), Definition 3.1, Eq. 3 — the **square root** of the ratio, so D ≥ 1
        (Jensen) and D = 1 exactly when all g_i are equal (the IID case); Fig. 3 and Fig. 5 plot this D. Here
        λ are the round's aggregation weights (:meth:`client_weights`), g_i the clients' contributions
        (:meth:`client_delta`) and Σ_i λ_i g_i the pseudo-gradient; norms are over all parameters together,
        accumulated in float64. Under a chain that adds DP noise (``raw_mean``: the server optimizer's ``privatises``)
        the pseudo-gradient released is clipped, noised and divided by the expected cohort size, not Σ_i λ_i g_i: there the denominator is
        ‖Σ_i λ_i g_i‖² of the same raw (unclipped, noise-free) g_i and λ_i, so D ≥ 1 (Cauchy–Schwarz) describes
        the clients' updates — a diagnostic of the trusted server, not covered by ε. Likewise under a reducer whose
        Δ_t is not the clients' weighted mean (a stage with ``shifts_mean = True``: FedDyn's mean − h/α, FedNova's
        normalised average, FedAWARE's and FedMGDA+'s min-norm directions), so the value is the same metric of the
        raw updates for every method (issue #34).

        Args:
            updates: The round's client updates.
            pseudo_gradient: The round's Δ_t (used as Σ_i λ_i g_i unless ``raw_mean`` or the chain shifts the mean).
            raw_mean: The denominator is ‖Σ_i λ_i g_i‖² of the raw g_i, not ``pseudo_gradient`` (a DP chain).
            delta_norms: Optional ``{id(update): DeltaNorms}``: per-tensor norms of Δ_i already computed this round
                (the loop's finiteness check), used where g_i is that very Δ_i, unchanged; the same numbers as
                computing them here.

        Returns:
            D as a Python float (dimensionless); ``nan`` when the pseudo-gradient is zero.
        """
        weights = self.round_weights(updates)
        deltas = [self.client_delta(u) for u in updates]

        def norms(update: ClientUpdate, delta: list[Tensor]) -> Tensor:
            cached = delta_norms.get(id(update)) if delta_norms else None
            kept = cached.for_delta(delta) if cached is not None else None
            return kept if kept is not None else torch.stack(torch._foreach_norm(delta))

        # on the device, then one copy to the host for the whole cohort (not one per client)
        sq_norms = torch.stack([norms(u, d).double().square().sum() for u, d in zip(updates, deltas)]).cpu()
        if raw_mean or any(getattr(stage, "shifts_mean", False) for stage in self.aggregators or ()):
            pseudo_gradient = [sum(float(w) * d[j].double() for w, d in zip(weights, deltas))
                               for j in range(len(deltas[0]))]
        denom = float(torch.stack(torch._foreach_norm(pseudo_gradient)).double().square().sum())
        return math.sqrt(float((weights * sq_norms).sum()) / denom) if denom > 0 else float("nan")

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> dict[str, list[Tensor]]:
        """The tensor fields of :attr:`rule_state` by name, each a list aligned with the federated parameters (the
        tensors themselves, so in-place changes persist; ``{}`` before the first step); assigning a dict sets those
        fields, the scalar ones kept (``{}``: no rule state).

        Example: the heavy-ball buffer after one step from Δ = [1, 2] is the first gradient, −Δ::

            >>> from lightning_fed import ClientUpdate
            >>> from lightning_fed.server.rules import Momentum
            >>> composer = ServerComposer("uniform", None, Momentum(lr=1.0, momentum=0.9))
            >>> _ = composer.update([torch.zeros(2)], [ClientUpdate(0, [torch.tensor([1.0, 2.0])], 1, 1, 0.0)])
            >>> composer.state
            {'momentum_buffer': [tensor([-1., -2.])]}
        """
        if self.rule_state is None:
            return {}
        defaults = type(self.rule_state)._field_defaults
        return {k: v for k, v in self.rule_state._asdict().items() if k not in defaults}

    @state.setter
    def state(self, value: dict[str, list[Tensor]]) -> None:
        if not value:
            self.rule_state = None
            return
        _, scalars = state_to_dict(self.rule_state, self.rule.State)
        self.rule_state = self.rule.State(**{**scalars, **value})

    def state_dict(self) -> dict[str, Any]:
        """``{"num_steps", "state": {field: [tensors]}}``, the rule state's scalar fields at the top level and
        ``"aggregators"`` (each stage's state as saved) with a chain whose states exist."""
        tensors, scalars = state_to_dict(self.rule_state, self.rule.State)
        out = {"num_steps": self.num_steps, "state": tensors, **scalars}
        if self.aggregator_state is not None:
            out["aggregators"] = [saved_stage_state(s._asdict()) for s in self.aggregator_state]
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Today's layout (:data:`lightning_fed.migrations.CHECKPOINT_FORMAT`); the chain's states wait in
        :attr:`saved_aggregator_state` until :meth:`chain_state` re-makes them."""
        self.num_steps = int(state_dict["num_steps"])
        self.rule_state = state_from_dict(self.rule.State, state_dict["state"], state_dict)
        if "aggregators" in state_dict:
            self.saved_aggregator_state = state_dict["aggregators"]
            self.aggregator_state = None


def _select(update: ClientUpdate, kept: list[int]) -> ClientUpdate:
    """``update`` with the deltas at ``kept`` only."""
    return dataclasses.replace(update, delta=[update.delta[i] for i in kept])


def delegated_method(name: str) -> Any:
    """A method of a class holding a ``composer`` that is the composer's (:class:`ServerComposer`) ``name``: its
    signature, its doc's first paragraph (how :class:`~lightning_fed.callbacks.ServerOptimizer` hands work on).

    Example::

        >>> from lightning_fed.callbacks import FedAvg
        >>> import inspect
        >>> inspect.signature(FedAvg.aggregate) == inspect.signature(ServerComposer.aggregate)
        True
    """
    composed = getattr(ServerComposer, name)
    method = functools.wraps(composed)(lambda self, *args, **kwargs: getattr(self.composer, name)(*args, **kwargs))
    method.__doc__ = (composed.__doc__ or "").split("\n\n")[0] + \
        f" (:meth:`ServerComposer.{name} <lightning_fed.server.composer.ServerComposer.{name}>`)"
    return method


def composed_attribute(name: str, doc: str, holder: str = "composer") -> property:
    """An attribute of a class (the server optimizer) that is its ``holder``'s ``name`` (one source of truth).

    Example::

        >>> from lightning_fed.callbacks import FedAvg
        >>> server = FedAvg()
        >>> server.weighting = "uniform"  # written through to the composer
        >>> server.composer.weighting
        'uniform'
    """
    return property(lambda self: getattr(getattr(self, holder), name),
                    lambda self, v: setattr(getattr(self, holder), name, v), doc=doc)
