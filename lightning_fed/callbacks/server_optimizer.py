"""The server optimizer callback: aggregates client updates into the pseudo-gradient and updates the global model."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
import warnings
from typing import Any, Optional, Sequence

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_fed.client import ClientUpdate
from lightning_fed.client.update import DeltaNorms
from lightning_fed.client.algorithm import ClientAlgorithm, check_client_algorithms
from lightning_fed.server.client_state import (
    ClientStateStore,
    ClientStateTable,
    check_client_state_store,
    collect_garbage,
    nonfinite_disk_rows,
)
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
from lightning_fed.server.aggregators.dp import adds_noise, check_private_fit, trained_parameters
from lightning_fed.server.rules.base import Rule, move_state, state_from_dict, state_to_dict
from lightning_fed.server.rules.base import zeros_like_all  # noqa: F401  (re-exported)
from lightning_fed.server.rules.sgd import SGD

from lightning_fed.server.checks import WEIGHTINGS as _WEIGHTINGS
from lightning_fed.server.checks import check_positive, check_unit_interval  # noqa: F401  (re-exported)


def check_arguments(cls: type, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Refuse ``cls(*args, **kwargs)`` before any ``__init__`` runs when the arguments do not fit ``cls.__init__``,
    with an error naming ``cls`` (not the base class whose ``__init__`` it inherits) and, for a misspelt keyword, the
    closest valid one (:func:`difflib.get_close_matches`).

    Raises:
        TypeError: an unknown keyword, too many positional arguments, a missing required one, a repeated one.

    Example::

        >>> from lightning_fed.callbacks import FedAdam
        >>> check_arguments(FedAdam, (), {"lr": 0.1})
        >>> FedAdam(lrr=0.1)
        Traceback (most recent call last):
        ...
        TypeError: FedAdam got an unexpected keyword argument 'lrr'; did you mean 'lr'? (FedAdam's arguments: lr, beta1, beta2, tau, initial_accumulator, bias_correction, weighting, convention, aggregators, client)
    """
    signature = inspect.signature(cls.__init__)
    try:
        signature.bind(None, *args, **kwargs)
        return
    except TypeError as error:
        problem = str(error)
    params = list(signature.parameters.values())[1:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    valid = f"({cls.__name__}'s arguments: {', '.join(names)})"
    unknown = [k for k in kwargs if k not in names]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params):
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise TypeError(f"{cls.__name__} got an unexpected keyword argument {unknown[0]!r}{hint} {valid}") from None
    raise TypeError(f"{cls.__name__}: {problem} {valid}") from None


#: Methods a subclass may no longer define, and what to write instead: the server optimizer does not call them (or
#: not on every path), so an override would be silently ignored; it is refused when the subclass is defined.
REMOVED_OVERRIDES = {
    "step": "the update is a server rule (lightning_fed.server.rules.Rule, `ServerOptimizer(rule=...)`)",
    "init_state": "the update's state is the rule's typed state (Rule.init) or an aggregator stage's (Stage.init_state)",
    "aggregate": "an aggregation is an aggregator chain (`aggregators=[...]` of lightning_fed.server.aggregators.Stage)",
    "client_delta": "a change of each client's contribution is a 'transform' Stage (Stage.client_delta) in `aggregators`",
    "client_weight_counts": "a change of the clients' weights is a 'transform' Stage (Stage.client_counts) in `aggregators`",
}


class _ArgumentsCheckedByName:
    """Checks a server optimizer's arguments against ``cls.__init__`` before it is built, so a wrong one is named with
    the class the user wrote (``FedAdam(lrr=0.1)`` would otherwise be a ``TypeError`` of
    ``AdaptiveServerOptimizer.__init__``). A base class of its own, not ``ServerOptimizer.__new__``: jsonargparse reads
    the signature of a class that defines ``__new__`` itself from that ``__new__`` (``*args, **kwargs``), which would
    hide ``ServerOptimizer``'s own arguments from the CLI and YAML."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Raises: TypeError naming ``cls``, the argument, the closest valid keyword and the valid ones."""
        if args or kwargs:
            check_arguments(cls, args, kwargs)
        return super().__new__(cls)


class ServerOptimizer(Callback, _ArgumentsCheckedByName):
    """The server optimizer (ServerOpt of Reddi et al. 2021, Alg. 1, l. 10-11): one Lightning callback that turns a
    round's client updates into the next global model, and carries the client halves of the algorithms it runs.

    A server optimizer is a composition, not a subclass hierarchy (optax's ``chain``, pfl-research's split of the
    central optimizer from the client algorithm):

    1. **aggregators** (:mod:`lightning_fed.server.aggregators`, optional): a chain of stages over typed states —
       client transforms → one reducer → delta transforms (robust reducers, DP clipping and noise, SCAFFOLD's and
       FedAWARE's server halves) — that replaces the default weighted mean Δ_t = Σ_i w_i Δ_i with w_i ∝ |D_i|
       (``weighting="num_samples"``, the example-weighted average of Reddi et al. 2021, Sec. 4 / Alg. 5) or
       w_i = 1/|S| (``weighting="uniform"``, Alg. 1, l. 10);
    2. **rule** (:mod:`lightning_fed.server.rules`): the update x_{t+1} = ServerOpt(x_t, Δ_t) over its own typed
       state (SGD — FedAvg's rule, the default —, Momentum, Adagrad/Adam/Yogi, LAMB, AdaptiveStepSize);
    3. **client** (:mod:`lightning_fed.client.algorithm`, optional): client halves every client runs
       (:class:`~lightning_fed.algorithms.FedProxClient`, ...). They are run by the client runner
       (:class:`~lightning_fed.client.algorithm.ClientHalves`), after the method's own, before
       ``FederatedTrainer(client_algorithms=...)`` — the place for halves that should outlive a swap of the server
       optimizer. Their per-client state is stored here by name (:attr:`client_algorithm_states`) and checkpointed.

    The ready-made names (:class:`FedAvg`, :class:`FedAdam`, :class:`FedProx`, DP and robust variants, ...) fix some
    of these parts; ``ServerOptimizer(rule=..., aggregators=..., client=...)`` builds any other combination, in YAML
    too. After every round the federated loop calls :meth:`server_update`; Lightning checkpoints the state
    (:meth:`state_dict`). Exactly one server optimizer may be given to a :class:`~lightning_fed.FederatedTrainer`;
    none means :class:`FedAvg` with η = 1. Under a plain :class:`lightning.Trainer` it is refused at fit start.

    Writing a new method: a server-side rule is a :class:`~lightning_fed.server.rules.Rule` (``init`` / ``update``
    over a NamedTuple state), a server-side aggregation a :class:`~lightning_fed.server.aggregators.Stage`, a
    client-side change a :class:`~lightning_fed.client.ClientAlgorithm`; one module of :mod:`lightning_fed.algorithms`
    holds an algorithm's halves (SCAFFOLD's, Fed-LAMB's, FedProx's, FedDyn's, ...). This is the only way: a subclass
    fixes parts and defaults, it does not override the update, the aggregation or the client channel.

    Args:
        lr: Server learning rate η (> 0; default 1.0, or the rule's).
        weighting: ``"num_samples"`` (default) or ``"uniform"``.
        aggregators: An aggregator chain in place of the weighted mean (default ``None``).
        rule: The server rule (default ``None``: SGD(lr), FedAvg's rule).
        client: Client algorithms every client runs (default ``None``). Deprecated (a ``DeprecationWarning``;
            removed in 0.3.0): give them as ``FederatedTrainer(client_algorithms=[...])`` (YAML/CLI:
            ``trainer.client_algorithms``), which keeps them when the server optimizer is swapped.
        client_state_store: Where the per-client tables (SCAFFOLD's c_i, FedDyn's g_k, any client half's state) keep
            their rows: ``"memory"`` (default: CPU tensors, every row in every checkpoint) or ``"disk"`` (one file
            per client row, RAM holds none; checkpoints reference the rows by version instead of copying them; see
            :mod:`lightning_fed.server.client_state`). Not a setting of the experiment (results are the same bit for
            bit): a resume may change it, the loaded rows are moved to the run's store. FedAWARE's dense momenta stay
            in memory (``"disk"`` is refused for it at fit start).
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``);
            each table in its own sub-directory. A resumed run keeps writing to the directory its checkpoint
            references.

    Raises:
        ValueError: ``lr`` not a finite number > 0, an unknown ``weighting``, ``lr`` disagreeing with ``rule.lr``,
            ``client_state_store`` not one of ``("memory", "disk")``, ``client_state_dir`` without ``"disk"``;
            at fit start, what a client algorithm's ``check`` or a stage's ``check_fit`` refuses (and
            ``client_state_store="disk"`` with a stage that needs its table in memory, FedAWARE's).
        TypeError: ``rule`` not a :class:`~lightning_fed.server.rules.Rule`, a ``client`` entry not a
            :class:`~lightning_fed.client.ClientAlgorithm`.

    Example: the pseudo-gradient of two clients with 1 and 2 samples is (1·Δ_0 + 2·Δ_1)/3 (here with
    :class:`FedAvg`, the simplest subclass)::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedAvg
        >>> updates = [ClientUpdate(client_id=0, delta=[torch.tensor([1.0, 0.0])], num_samples=1, num_steps=1, loss=0.0),
        ...            ClientUpdate(client_id=1, delta=[torch.tensor([4.0, 3.0])], num_samples=2, num_steps=1, loss=0.0)]
        >>> FedAvg().client_weights(updates)
        tensor([0.3333, 0.6667], dtype=torch.float64)
        >>> FedAvg().aggregate(updates)  # (1·[1, 0] + 2·[4, 3]) / 3
        [tensor([3., 2.])]
        >>> FedAvg(weighting="uniform").aggregate(updates)  # ([1, 0] + [4, 3]) / 2
        [tensor([2.5000, 1.5000])]
        >>> FedAvg(weighting="mean")
        Traceback (most recent call last):
        ...
        ValueError: `weighting` must be one of ('num_samples', 'uniform'), got 'mean'.
    """

    #: Marks server optimizers for the modules below the callbacks (:func:`~lightning_fed.server.checks.is_server_optimizer`).
    is_server_optimizer = True
    #: The attributes that name this server optimizer's state in a checkpoint (:attr:`state_key`, Lightning's
    #: ``"<class>{'lr': 1.0, ...}"``), in order; ``"key=path"`` reads the dotted attribute ``path`` (a stage's:
    #: ``"alpha=min_norm.alpha"``). A subclass lists its own; the strings are in checkpoints, so never reorder them.
    state_key_fields: tuple[str, ...] = ("lr", "weighting")
    #: The attributes :meth:`extra_repr` shows, in order (``"key=path"`` as in :attr:`state_key_fields`); a string
    #: value is shown quoted (its ``repr``), any other as ``str``.
    repr_fields: tuple[str, ...] = ("lr", "weighting")
    #: Fields of :attr:`repr_fields` left out of the repr while they hold the value given here (e.g. ``None``).
    repr_hidden: dict[str, Any] = {}
    #: Fields of :attr:`repr_fields` shown through a function of their value (``{"phi_max": none_if_infinite}``).
    repr_formats: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a subclass that defines a method of :data:`REMOVED_OVERRIDES` (it would be silently ignored).

        Raises:
            TypeError: naming the method and what to write instead.
        """
        super().__init_subclass__(**kwargs)
        for name, instead in REMOVED_OVERRIDES.items():
            if name in vars(cls):
                raise TypeError(f"{cls.__name__} defines `{name}`, which a server optimizer no longer lets a subclass "
                                f"override (it would be ignored): {instead}.")

    def __init__(
        self,
        lr: Optional[float] = None,
        weighting: str = "num_samples",
        aggregators: Optional[list[Stage]] = None,
        rule: Optional[Rule] = None,
        client: Optional[list[ClientAlgorithm]] = None,
        client_state_store: str = "memory",
        client_state_dir: Optional[str] = None,
    ) -> None:
        #: Where the per-client tables keep their rows (``"memory"`` or ``"disk"``) and the disk store's directory.
        self.client_state_store, self.client_state_dir = check_client_state_store(client_state_store, client_state_dir)
        self._store = ClientStateStore(self.client_state_store, self.client_state_dir)
        if rule is not None:
            if not isinstance(rule, Rule):
                raise TypeError(f"`rule` must be a server rule (lightning_fed.server.rules.Rule), got {type(rule).__name__}.")
            if lr is not None and check_positive("lr", lr) != rule.lr:
                raise ValueError(
                    f"`lr`={lr!r} disagrees with the rule's learning rate {rule.lr!r}; give the server learning rate "
                    "on the rule (e.g. `rule: {class_path: Adam, init_args: {lr: 0.01}}`) and leave `lr` unset."
                )
            lr = rule.lr
        self.lr = check_positive("lr", 1.0 if lr is None else lr)
        if weighting not in _WEIGHTINGS:
            raise ValueError(f"`weighting` must be one of {_WEIGHTINGS}, got {weighting!r}.")
        self.weighting = weighting
        #: The server rule (:mod:`lightning_fed.server.rules`; default SGD(lr), FedAvg's rule).
        self.server_rule: Rule = SGD(self.lr) if rule is None else rule
        self._rule_state: Optional[Any] = None
        #: The aggregator chain (:mod:`lightning_fed.server.aggregators`) replacing the weighted mean, or ``None``.
        self.aggregators: Optional[list[Any]] = None if aggregators is None else check_chain(aggregators)
        self.aggregator_state: Optional[tuple] = None
        self._saved_aggregator_state: Optional[list[dict[str, Any]]] = None
        self._round_info: Optional[RoundInfo] = None
        #: Number of server steps taken so far (t after the update of round t−1).
        self.num_steps = 0
        #: A per-client table (:class:`~lightning_fed.server.client_state.ClientStateTable`) of the server optimizer's
        #: own, ``None`` otherwise; checkpointed under ``"client_state"``. FedAWARE's m_i and SCAFFOLD's c_i are their
        #: stages' (this name reads them there) and are saved with the stage's state, under ``"aggregators"``.
        self.client_state: Optional[ClientStateTable] = None
        self._trained: Optional[list[bool]] = None  # under a noised chain: the parameters the clients train
        self._local_ids: set[int] = set()  # under a noised chain: id() of the parameters client halves keep local
        self._stepped = False  # the server stepped in the current round
        #: The client algorithms given as ``client`` (``None``: none), run by every client of every round
        #: (:mod:`lightning_fed.client.algorithm`).
        self.client: Optional[list[ClientAlgorithm]] = None if client is None else check_client_algorithms(client)
        if client is not None:
            warn_client_deprecated(self)
        #: Client halves a ready-made method brings itself (FedProx's :class:`FedProxClient`), run before ``client``.
        self._own_client: list[ClientAlgorithm] = []
        #: The chain a ready-made method fixes as its own (SCAFFOLD's ``[ScaffoldControl]``), ``None`` otherwise: a
        #: replaced :attr:`aggregators` is refused at fit start (:meth:`on_train_start`).
        self._own_aggregators: Optional[list[Stage]] = None
        #: Per-client state of the run's client halves that keep one, by the half's
        #: :attr:`~lightning_fed.client.ClientAlgorithm.state_key` (e.g. ``"FedDynClient"``) -> table; made at fit
        #: start by the client runner's :class:`~lightning_fed.client.algorithm.ClientHalves`, written when a
        #: client's update reaches the server, checkpointed with this state.
        self.client_algorithm_states: dict[str, ClientStateTable] = {}
        #: Whether :attr:`client_algorithm_states` came from a checkpoint not yet checked against the run (fit start).
        self.loaded_client_state = False
        self._run_client_algorithms: Optional[list[ClientAlgorithm]] = None  # the run's halves, bound at fit start
        #: The last round's :class:`~lightning_fed.server.aggregators.RoundReport` (client weights, the chain's stage
        #: reports), set by :meth:`server_update`; ``None`` before it and from the start of each round.
        self.round_report: Optional[RoundReport] = None

    @property
    def server_client_algorithms(self) -> list[ClientAlgorithm]:
        """The client halves given with this server optimizer: the method's own (FedProx's, FedDyn's, SCAFFOLD's),
        then ``client``, in order. The client runner runs them, then ``FederatedTrainer(client_algorithms=...)``."""
        return [*self._own_client, *(self.client or ())]

    @property
    def client_algorithms(self) -> list[ClientAlgorithm]:
        """Every client half of the run: during a fit, the list the client runner runs (bound at fit start,
        :meth:`bind_client_algorithms`), else :attr:`server_client_algorithms`. What fit-start checks of a method
        whose halves must come together (:func:`~lightning_fed.algorithms.feddyn.check_feddyn`) read."""
        if self._run_client_algorithms is not None:
            return list(self._run_client_algorithms)
        return self.server_client_algorithms

    def bind_client_algorithms(self, algorithms: Optional[list[ClientAlgorithm]]) -> None:
        """Record the run's client halves (called by :meth:`ClientHalves.setup
        <lightning_fed.client.algorithm.ClientHalves.setup>` at fit start; ``None``: forget them)."""
        self._run_client_algorithms = None if algorithms is None else list(algorithms)

    @property
    def state(self) -> dict[str, list[Tensor]]:
        """The optimizer state: name -> list of tensors aligned with the federated parameters (``module.parameters()``
        when none is frozen; the client runner's ``params``) (``{}`` before the
        first round): a view of the tensor fields of :attr:`server_rule`'s typed state (the tensors themselves, so
        in-place changes persist); assigning a dict sets those fields."""
        if self._rule_state is None:
            return {}
        defaults = type(self._rule_state)._field_defaults
        return {k: v for k, v in self._rule_state._asdict().items() if k not in defaults}

    @state.setter
    def state(self, value: dict[str, list[Tensor]]) -> None:
        state_type = self.server_rule.State
        if not value:
            self._rule_state = None
            return
        _, scalars = state_to_dict(self._rule_state, state_type)
        self._rule_state = state_type(**{**scalars, **value})

    @property
    def rule_state(self) -> Optional[Any]:
        """The typed state (a ``NamedTuple``) of :attr:`server_rule`; ``None`` before the first round."""
        return self._rule_state

    # ------------------------------------------------------------------ aggregation
    def client_weight_counts(self, updates: list[ClientUpdate]) -> Tensor:
        """Unnormalised aggregation weights, shape ``[len(updates)]``, float64: |D_i| (``"num_samples"``) or 1
        (``"uniform"``), then as changed by the client transforms of the aggregator chain (``Stage.client_counts``,
        e.g. zero-step clients get 0 under Nastya's normalisation). :meth:`client_weights` and :meth:`aggregate`
        normalise them by their sum.

        Raises:
            ValueError: ``updates`` empty, or all clients with zero samples under ``"num_samples"`` (or as the
                chain's stages raise).
        """
        counts = self._weighting_counts(updates)
        for stage in self.aggregators or ():
            if stage.kind == "transform":
                counts = stage.client_counts(counts, updates)
        return counts

    def _weighting_counts(self, updates: list[ClientUpdate]) -> Tensor:
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
        (:meth:`client_weight_counts` divided by their sum).

        Raises:
            ValueError: as :meth:`client_weight_counts`.
        """
        raw = self.client_weight_counts(updates)
        return raw / raw.sum()

    def stage_report(self, stage: Stage) -> Any:
        """What ``stage`` (one of :attr:`aggregators`) reported in the last round (:attr:`round_report`); ``None``
        before a round, in a round without a server step, or for a stage that reports nothing."""
        report = self.round_report
        if report is None:
            return None
        return next((r for s, r in zip(self.aggregators or (), report.stages) if s is stage), None)

    def round_weights(self, updates: list[ClientUpdate]) -> Tensor:
        """:meth:`client_weights` of ``updates``, taken from :attr:`round_report` when it is the report of these
        clients (computed once per round; the loop's round metrics read it), else computed."""
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

    def aggregate(self, updates: list[ClientUpdate]) -> list[Tensor]:
        """The pseudo-gradient Δ_t = Σ_i w_i·client_delta(u_i), one tensor per parameter (shapes, dtypes and
        devices of the clients' deltas), with w_i = c_i / Σ_j c_j and c the :meth:`client_weight_counts`.

        Precision: computed as (Σ_i c_i·client_delta(u_i)) / Σ_j c_j, the sum accumulated in float64 and divided
        once, then rounded once to the parameters' dtype. For a float32 (or half-precision) model with integer
        counts the float64 sum is exact (unless the deltas span more than ~2^25 in magnitude), so the result is
        the exact weighted mean correctly rounded to float32 — e.g. clients of 1 and 2 samples average exactly,
        where adding w_i·Δ_i with w = (1/3, 2/3) in float32 rounds once per client. A float64 model gets
        (Σ c_i·Δ_i)/Σc in float64. On devices without float64 (Apple MPS) the sum is accumulated in the
        parameters' dtype.
        """
        return self._aggregate(updates, None)

    def _aggregate(self, updates: list[ClientUpdate], reports: Optional[list],
                   template: Optional[list[Tensor]] = None) -> list[Tensor]:
        """:meth:`aggregate`, appending the chain's stage reports to ``reports`` when given; ``template`` (x_t, or
        the parameters aggregated) shapes a round without any client."""
        if self.aggregators is not None:
            return self._run_aggregators(updates, reports, template)
        x = ClientDeltas([u.client_id for u in updates], [self.client_delta(u) for u in updates],
                         self.client_weight_counts(updates), list(updates))
        return WeightedMean().apply(x, EmptyState(), RoundInfo(self.num_steps, 0, len(updates), len(updates)))[0]

    def _run_aggregators(self, updates: list[ClientUpdate], reports: Optional[list] = None,
                         template: Optional[list[Tensor]] = None) -> list[Tensor]:
        """Δ_t from the aggregator chain (client transforms → reducer → delta transforms); each stage's report is
        appended to ``reports`` when given (:func:`~lightning_fed.server.aggregators.run_chain`). A round without any
        client (a server that :attr:`releases_empty_rounds`) runs the chain on no client, shaped by ``template``."""
        # The chain's client transforms apply themselves to the raw deltas and weighting counts.
        if updates:
            counts = self._weighting_counts(updates)
        else:
            counts = torch.zeros(0, dtype=torch.float64)
        x = ClientDeltas([u.client_id for u in updates], [u.delta for u in updates], counts, list(updates), template)
        k = max(len(updates), 1)
        info = self._round_info if self._round_info is not None else RoundInfo(self.num_steps, 0, k, k)
        shape = x.deltas[0] if x.deltas else [torch.zeros_like(t) for t in template]
        self.chain_state(shape, info.num_clients)
        value, self.aggregator_state = run_chain(self.aggregators, x, self.aggregator_state, info, reports)
        return value

    def chain_state(self, params: list[Tensor], num_clients: Optional[int] = None) -> tuple:
        """The aggregator chain's states (one typed state per stage), created for a model shaped like ``params`` —
        or restored from the checkpoint loaded — the first time they are asked for: when the first round is
        aggregated, or earlier by a client half that reads its server half's state (SCAFFOLD's c and c_i).

        Args:
            params: tensors shaped like the model's parameters (a client's delta, or the parameters detached).
            num_clients: N for the stages' ``init_state`` (default: the round's ``RoundInfo.num_clients``, else 0).
        """
        if self.aggregator_state is None:
            if num_clients is None:
                num_clients = self._round_info.num_clients if self._round_info is not None else 0
            states = chain_states(self.aggregators, params, num_clients)
            if self._saved_aggregator_state is not None:
                states = tuple(type(s0)(**_restore_tables(saved)) for s0, saved in zip(states, self._saved_aggregator_state))
                self._saved_aggregator_state = None
            self.aggregator_state = states
        return self.aggregator_state

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
        index = next((i for i, s in enumerate(self.aggregators or ()) if s is stage), None)
        if index is None:
            return None
        if self.aggregator_state is not None:
            return self.aggregator_state[index]._asdict()
        if self._saved_aggregator_state is not None and index < len(self._saved_aggregator_state):
            return _restore_tables(self._saved_aggregator_state[index])
        return None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Record the round's :class:`~lightning_fed.server.aggregators.RoundInfo` for the aggregator chain, and run
        every stage's ``check_round_start`` before the round's clients train.

        Raises:
            ValueError: from a stage's :meth:`~lightning_fed.server.aggregators.Stage.check_round_start`.
        """
        for stage in self.aggregators or ():
            check_round_start = getattr(stage, "check_round_start", None)
            if check_round_start is not None:
                check_round_start(trainer, pl_module, self)
        dm = trainer.datamodule
        if dm is not None and hasattr(dm, "select_cohort"):
            self._round_info = RoundInfo(
                int(trainer.current_epoch), int(getattr(dm, "seed", 0)), int(dm.num_clients), int(dm.clients_per_round)
            )
        self._stepped = False
        self.round_report = None
        if self.privatises:
            self._trained = trained_parameters(list(pl_module.parameters()), trainer.optimizers)
            self._local_ids = self.local_parameter_ids(pl_module)
        if self.client_state_store == "disk":
            self.collect_client_state_garbage()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Log every stage's :meth:`~lightning_fed.server.aggregators.Stage.round_metrics` of the round's report
        (e.g. FedAWARE's ``fedaware_support``); nothing in a round without a server step."""
        for stage in self.aggregators or ():
            round_metrics = getattr(stage, "round_metrics", None)
            metrics = round_metrics(self.stage_report(stage)) if round_metrics is not None else {}
            for name, value in metrics.items():
                pl_module.log(name, value, on_step=False, on_epoch=True, batch_size=1)

    def local_parameter_ids(self, pl_module: Any) -> set[int]:
        """``id()`` of the parameters of ``pl_module`` that the run's client halves keep on the clients
        (:meth:`ClientAlgorithm.local_parameters <lightning_fed.client.algorithm.ClientAlgorithm.local_parameters>`:
        the personal parts of FedBN, FedPer, FedRep, :class:`~lightning_fed.client.personal.LocalParts`), once they
        are set up; empty before. Read at every round's start under a chain that adds DP noise."""
        params = list(pl_module.parameters())
        return {id(params[i]) for half in self.client_algorithms for i in half.local_parameters() if i < len(params)}

    @property
    def privatises(self) -> bool:
        """Whether the aggregator chain adds DP noise (:func:`~lightning_fed.server.aggregators.dp.adds_noise`, σ > 0).
        Then only what ε covers is released: buffers stay at their global value (the loop does not average the
        clients' buffers), parameters not trained by the clients (``requires_grad=False`` or in no client optimizer)
        and the personal parts client halves keep local (:meth:`local_parameter_ids`) are neither clipped, noised
        nor stepped, and fit refuses running statistics and ``max_update_norm_ratio``."""
        return adds_noise(self.aggregators)

    def gradient_diversity(self, updates: list[ClientUpdate], pseudo_gradient: list[Tensor],
                           delta_norms: Optional[dict[int, DeltaNorms]] = None) -> float:
        """Gradient diversity D = √( Σ_i λ_i‖g_i‖² / ‖Σ_i λ_i g_i‖² ) of the round, logged as
        ``round_gradient_diversity``.

        Source: Zeng et al., *Tackling Hybrid Heterogeneity on Federated Optimization via Gradient Diversity
        Maximization* (FedAWARE, ICML 2024), Definition 3.1, Eq. 3 — the **square root** of the ratio, so D ≥ 1
        (Jensen) and D = 1 exactly when all g_i are equal (the IID case); Fig. 3 and Fig. 5 plot this D. Here
        λ are the round's aggregation weights (:meth:`client_weights`), g_i the clients' contributions
        (:meth:`client_delta`) and Σ_i λ_i g_i the pseudo-gradient; norms are over all parameters together,
        accumulated in float64. Under a chain that adds DP noise (:attr:`privatises`) the pseudo-gradient released
        is clipped, noised and divided by the expected cohort size, not Σ_i λ_i g_i: there the denominator is
        ‖Σ_i λ_i g_i‖² of the same raw (unclipped, noise-free) g_i and λ_i, so D ≥ 1 (Cauchy–Schwarz) describes
        the clients' updates — a diagnostic of the trusted server, not covered by ε. Likewise under a reducer whose
        Δ_t is not the clients' weighted mean (a stage with ``shifts_mean = True``: FedDyn's mean − h/α, FedNova's
        normalised average, FedAWARE's and FedMGDA+'s min-norm directions), so the value is the same metric of the
        raw updates for every method (issue #34).

        Args:
            updates: The round's client updates.
            pseudo_gradient: The round's Δ_t (used as Σ_i λ_i g_i unless the chain privatises or shifts the mean).
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
        if self.privatises or any(getattr(stage, "shifts_mean", False) for stage in self.aggregators or ()):
            pseudo_gradient = [sum(float(w) * d[j].double() for w, d in zip(weights, deltas))
                               for j in range(len(deltas[0]))]
        denom = float(torch.stack(torch._foreach_norm(pseudo_gradient)).double().square().sum())
        return math.sqrt(float((weights * sq_norms).sum()) / denom) if denom > 0 else float("nan")

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

    def server_update(self, params: list[Tensor], updates: list[ClientUpdate]) -> list[Tensor]:
        """Aggregate ``updates`` and step ``params`` (holding x_t) in place to x_{t+1}; returns Δ_t.

        Under a chain that adds DP noise (:attr:`privatises`) the parameters the clients do not train
        (:func:`~lightning_fed.server.aggregators.dp.trained_parameters`, as of the round's start) and those the
        client halves keep local (:meth:`local_parameter_ids`: FedPer's head, FedBN's norm layers, ...) are left out
        of the chain (not in the clipped norm, not noised), get Δ_t = 0 and keep x_t bit for bit.

        Raises:
            ValueError: under such a chain, no parameter trained.
        """
        self.validate_round(params, updates)
        self.receive_client_states(updates)
        reports: list = []
        frozen: list[int] = []
        if self.privatises:  # DP: clip and noise only what the clients train; the rest stays at x_t exactly
            trained = self._trained if self._trained is not None and len(self._trained) == len(params) \
                else trained_parameters(params)
            frozen = [i for i, t in enumerate(trained) if not t or id(params[i]) in self._local_ids]
        if frozen:
            kept = [i for i in range(len(params)) if i not in set(frozen)]
            if not kept:
                raise ValueError(f"{type(self).__name__} adds DP noise, but no parameter is trained and shared (all "
                                 "frozen or kept local by a client half).")
            released = self._aggregate([dataclasses.replace(u, delta=[u.delta[i] for i in kept]) for u in updates],
                                       reports, [params[i] for i in kept])
            pseudo_gradient = [torch.zeros_like(u_d) for u_d in updates[0].delta] if updates else \
                [torch.zeros_like(p) for p in params]
            for i, d in zip(kept, released):
                pseudo_gradient[i] = d
            global_frozen = [params[i].detach().clone() for i in frozen]
        else:
            pseudo_gradient = self._aggregate(updates, reports, list(params))
        with torch.no_grad():
            if self._rule_state is None:
                self._rule_state = self.server_rule.init(params)
            else:
                self._rule_state = move_state(self._rule_state, params)
            self.num_steps += 1  # t + 1 when the rule runs (1 on the first round)
            self._rule_state = self.server_rule.update(params, pseudo_gradient, self._rule_state, self.num_steps)
            for i, value in zip(frozen, global_frozen if frozen else ()):
                params[i].copy_(value)
        self._stepped = True
        weights = self.client_weights(updates) if updates else torch.zeros(0, dtype=torch.float64)
        self.round_report = RoundReport([int(u.client_id) for u in updates], weights, tuple(reports))
        return pseudo_gradient

    def validate_round(self, params: list[Tensor], updates: list[ClientUpdate]) -> None:
        """Called first by :meth:`server_update`, before any state changes: a subclass raises here when the round
        cannot be applied to ``params`` (e.g. FedAWARE: N unknown, a momentum table of another shape). Default: every
        stage's :meth:`~lightning_fed.server.aggregators.Stage.prepare_round` (e.g. SCAFFOLD's checks of N, the client
        ids and Δc_i, then c created or moved to ``params``' device)."""
        for stage in self.aggregators or ():
            prepare_round = getattr(stage, "prepare_round", None)
            if prepare_round is not None:
                prepare_round(self, params, updates)

    # ------------------------------------------------------------------ client channel
    def configure_client(
        self, trainer: Any, pl_module: Any, client_id: int, round_idx: int, context: Any = None
    ) -> None:
        """Called by the client runner after a client starts from x_t with a fresh optimizer, before its local steps
        (server → client; ``context``: its :class:`~lightning_fed.client.runner.ClientContext`). Default: nothing.
        The client halves are not run here: the client runner runs them itself
        (:class:`~lightning_fed.client.algorithm.ClientHalves`)."""

    def collect_client_extras(
        self, trainer: Any, pl_module: Any, client_id: int, round_idx: int, context: Any = None
    ) -> dict[str, Any]:
        """Called by the client runner after a client's local steps; the result joins ``ClientUpdate.extras``
        (client → server), after the client halves' extras. Default: nothing (``{}``)."""
        return {}

    def receive_client_states(self, updates: list[ClientUpdate]) -> None:
        """Write the client algorithms' new per-client states that arrived with ``updates`` into their tables
        (called by :meth:`server_update` first; a client dropped from the round keeps its old state).

        Raises:
            ValueError: a client half whose ``finish`` returned a state of another size than its ``state_dim``
                (a stateless half, ``state_dim`` 0, must return ``None``), naming the half, the client, the expected
                and the actual size.
        """
        algorithms = self.client_algorithms
        for i, algorithm in enumerate(algorithms):
            key = f"client_state/{algorithm.state_key}"
            table = self.client_algorithm_states.get(algorithm.state_key)
            for update in updates:
                if key not in update.extras:
                    continue
                state = update.extras[key]
                num_params = sum(t.numel() for t in update.delta)
                expected = table.dim if table is not None else int(algorithm.state_dim(num_params))
                if state.numel() != expected:
                    raise ValueError(
                        f"Client half {type(algorithm).__name__} ({_where(algorithm, self)}) returned a "
                        f"per-client state of {state.numel()} numbers from finish() for client "
                        f"{update.client_id}, but its state_dim({num_params}) is {expected}"
                        + (" (stateless: finish must return None as the state)." if expected == 0 else ".")
                    )
                if table is not None:
                    table.put(update.client_id, state)

    # ------------------------------------------------------------------ trainer check
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Every stage's :meth:`~lightning_fed.server.aggregators.Stage.check_setup` (e.g. FedAWARE reads N from the
        data module); at fit start (before round 0): check a chain holding DP stages
        (:func:`~lightning_fed.server.aggregators.dp.check_dp_chain`: ``DPMean`` needs ``weighting="uniform"``; a
        hand-composed DP chain warns that ε is not accounted).

        Raises:
            ValueError: as a stage's ``check_setup``; ``DPMean`` in the chain with ``weighting="num_samples"``.
        """
        for chain_stage in self.aggregators or ():
            check_setup = getattr(chain_stage, "check_setup", None)
            if check_setup is not None:
                check_setup(trainer, pl_module, self)
        if stage == "fit":
            from lightning_fed.server.aggregators.dp import check_dp_chain

            check_dp_chain(self)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Resolve the client-state store (:meth:`resolve_client_state_store`) before round 0, then run the
        :meth:`~lightning_fed.client.ClientAlgorithm.fit_start` of the client halves given with this server
        optimizer (e.g. Fed-LAMB's installs its client optimizer).

        Raises:
            ValueError: as :meth:`resolve_client_state_store`, or a half's ``fit_start``.
        """
        self.resolve_client_state_store(trainer)
        for algorithm in self.server_client_algorithms:
            fit_start = getattr(algorithm, "fit_start", None)
            if fit_start is not None:
                fit_start(trainer, self)

    #: Settings of ``__init__`` that do not change the experiment: not in the run record, free to change on resume.
    unrecorded_settings = ("client_state_store", "client_state_dir")

    @property
    def client_state_store_spec(self) -> ClientStateStore:
        """The :class:`~lightning_fed.server.client_state.ClientStateStore` new per-client tables are made in
        (resolved at fit start, :meth:`resolve_client_state_store`)."""
        return self._store

    def resolve_client_state_store(self, trainer: Any = None) -> ClientStateStore:
        """At fit start: the store's directory (``client_state_dir``, else ``<trainer.default_root_dir>/client_state``)
        and the stages that make per-client tables told where; a stage whose table must be in memory
        (``dense_client_state``, FedAWARE's) refuses ``"disk"``.

        Raises:
            ValueError: ``client_state_store="disk"`` with such a stage, naming it and the argument; or with more than
                one process (``trainer.world_size`` > 1: every DDP rank would write its own copy of every row).
            ClientStateStoreError: the ``"disk"`` store's directory cannot be created or written (read-only, no
                permission, full), naming ``client_state_dir``, the directory and the file tried
                (:meth:`ClientStateStore.check_writable <lightning_fed.server.client_state.ClientStateStore.check_writable>`).

        Example::

            >>> import tempfile
            >>> from lightning_fed.callbacks import SCAFFOLD
            >>> server = SCAFFOLD(client_state_store="disk", client_state_dir=tempfile.mkdtemp())
            >>> server.resolve_client_state_store().kind, server.control_stage.client_state_store.kind
            ('disk', 'disk')
        """
        directory = self.client_state_dir
        if self.client_state_store == "disk" and int(getattr(trainer, "world_size", 1) or 1) > 1:
            raise ValueError(
                f"{type(self).__name__}(client_state_store='disk') runs in one process, but this trainer has "
                f"world_size={trainer.world_size} (strategy='ddp'): every rank applies the server update and would "
                "write its own copy of every row into one directory. Use client_state_store='memory' under DDP.")
        if self.client_state_store == "disk" and directory is None:
            root = getattr(trainer, "default_root_dir", None) or os.getcwd()
            directory = os.path.join(str(root), "client_state")
        self._store = ClientStateStore(self.client_state_store, directory)
        for stage in self.aggregators or ():
            if self.client_state_store == "disk" and getattr(stage, "dense_client_state", False):
                break  # refused below, naming the stage
        else:
            self._store.check_writable()  # before any client trains: not after round 0
        for stage in self.aggregators or ():
            if self.client_state_store == "disk" and getattr(stage, "dense_client_state", False):
                raise ValueError(
                    f"{type(self).__name__}(client_state_store='disk'): {type(stage).__name__} computes over every "
                    "client's row at once (a dense [N, d] table in memory), which the disk store does not hold; use "
                    "client_state_store='memory' (its size is checked against `max_state_bytes`).")
            if hasattr(stage, "client_state_store"):
                stage.client_state_store = self._store
        return self._store

    def client_table(self, name: str, num_clients: int, dim: int, dtype: torch.dtype) -> ClientStateTable:
        """A new per-client table ``name`` (a client half's ``state_key``) in the run's store."""
        return self._store.table(name, num_clients, dim, dtype)

    def client_tables(self) -> list[ClientStateTable]:
        """Every live per-client table: the client halves', the stages' and :attr:`client_state`."""
        tables = list(self.client_algorithm_states.values())
        for state in self.aggregator_state or ():
            tables += [v for v in state if isinstance(v, ClientStateTable)]
        if self.client_state is not None:
            tables.append(self.client_state)
        unique = {id(t): t for t in tables}
        return list(unique.values())

    def collect_client_state_garbage(self) -> None:
        """Delete the on-disk row versions nothing references any more
        (:func:`~lightning_fed.server.client_state.collect_garbage`); called at every round start."""
        for directory in {t.directory for t in self.client_tables() if t.directory is not None}:
            collect_garbage(directory)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse a trainer without the federated loop: there the server optimizer would silently do nothing.

        Also runs every aggregator stage's ``check_cohort(clients_per_round)`` (e.g. Krum refuses
        ``clients_per_round`` ≤ 2f + 2; TrimmedMean warns when it would trim nothing).

        A ready-made method that fixes its chain (:attr:`_own_aggregators`, e.g. SCAFFOLD's ``[ScaffoldControl]``)
        refuses a replaced :attr:`aggregators` first.

        Raises:
            RuntimeError: ``trainer`` is a plain :class:`lightning.Trainer` (use :class:`~lightning_fed.FederatedTrainer`).
            ValueError: a ready-made method's own chain replaced; under a chain that adds DP noise (:attr:`privatises`), what
                :func:`~lightning_fed.server.aggregators.dp.check_private_fit` refuses (running statistics,
                ``max_update_norm_ratio``, no trained parameter); as a stage's ``check_cohort`` or ``check_fit``
                (e.g. FedDyn's server half without its client half; FedNova's reducer with clients that do not run
                its declared local solver).
        """
        own = self._own_aggregators
        if own is not None and not (self.aggregators is not None and len(self.aggregators) == len(own)
                                    and all(a is b for a, b in zip(self.aggregators, own))):
            raise ValueError(
                f"{type(self).__name__} aggregates in its own way (its aggregator chain is "
                f"[{', '.join(type(s).__name__ for s in own)}]), so another `aggregators` chain cannot be used; use "
                "them with a server optimizer that takes the default aggregation."
            )
        if getattr(trainer.fit_loop, "client_runner", None) is None:  # not lightning_fed's FederatedFitLoop
            raise RuntimeError(
                f"{type(self).__name__} is a server optimizer: it needs lightning_fed.FederatedTrainer, but "
                f"{type(trainer).__name__} trains centrally and would ignore it. Use FederatedTrainer(...), or drop "
                "the server optimizer from `callbacks` for a centralized baseline."
            )
        if self.privatises:
            self._trained = trained_parameters(list(pl_module.parameters()), trainer.optimizers)
            check_private_fit(self, trainer, pl_module, self._trained)
        cohort = getattr(trainer.datamodule, "clients_per_round", None)
        if cohort is not None:  # refuse (or warn about) the chain's settings for this cohort size before round 0
            for stage in self.aggregators or ():
                check = getattr(stage, "check_cohort", None)
                if check is not None:
                    check(int(cohort))
        for stage in self.aggregators or ():  # a server half that needs its client half (FedDyn), or a stage that
            check_fit = getattr(stage, "check_fit", None)  # depends on the clients' local solver (FedNova), refuses
            if check_fit is not None:
                check_fit(trainer, pl_module, self)

    # ------------------------------------------------------------------ state integrity (issue #43)
    def state_items(self, param_names: Sequence[str], saved: bool = False) -> list[tuple[str, Any]]:
        """``(label, value)`` of every tensor and every NaN float of the server optimizer's state (±inf is a legitimate
        value of a scalar field, e.g. AdaptiveStepSize's θ = ∞ before its second round), for the non-finite checks
        (:func:`~lightning_fed.guards.nonfinite_values`); labels are ``"<Class> state '<path>'"`` with the path in
        :meth:`state_dict`'s layout, plus ``" for parameter '<name>'"`` for a per-parameter list.

        Args:
            param_names: The global model's federated parameters' names, in ``module.parameters()`` order.
            saved: ``False`` (default): the live state a server step changes — the rule's state, the aggregator
                chain's stage states and, of the per-client tables, the rows of the clients of the last server step
                (:attr:`round_report`; labelled ``"... row of client <id>"``) — checked after every server step;
                ``True``: everything :meth:`state_dict` holds, whole per-client tables included (checked once, when
                loaded from a checkpoint).

        Example::

            >>> import torch
            >>> from lightning_fed.callbacks import FedAdam
            >>> server = FedAdam(lr=0.1)
            >>> server.server_update([torch.zeros(2)], [ClientUpdate(0, [torch.ones(2)], 1, 1, 0.0)]) and None
            >>> [label for label, _ in server.state_items(["w"])]
            ["FedAdam state 'state.exp_avg' for parameter 'w'", "FedAdam state 'state.exp_avg_sq' for parameter 'w'"]
        """
        items: list[tuple[str, Any]] = []
        prefix = f"{type(self).__name__} state"
        if saved:
            _state_items(items, prefix, self.state_dict(), (), param_names, None)
            return items
        rows = _RowsOf(self.round_report.client_ids if self.round_report is not None else [])
        if self._rule_state is not None:
            _state_items(items, prefix, self._rule_state._asdict(), ("state",), param_names, rows)
        for i, stage_state in enumerate(self.aggregator_state or ()):
            _state_items(items, prefix, stage_state, ("aggregators", str(i)), param_names, rows)
        for key, table in self.client_algorithm_states.items():
            _state_items(items, prefix, table, ("client_algorithms", key), param_names, rows)
        if self.client_state is not None:
            _state_items(items, prefix, self.client_state, ("client_state",), param_names, rows)
        return items

    def required_state(self, num_params: int) -> list[str]:
        """The entries (dotted paths in :meth:`state_dict`'s layout) a saved state must hold for a resume after at
        least one server step (``num_steps`` > 0): ``num_steps``; the rule's tensor fields (``state.exp_avg``, ...);
        ``aggregators`` with a chain, and ``aggregators.<i>.<field>`` for each stage's ``required_fields`` (SCAFFOLD's
        c and c_i table, FedAWARE's momenta); ``client_algorithms.<state_key>`` for each client half of the run that keeps per-client state.
        A subclass with its own :meth:`state_dict` layout names its own. The checkpoint connector refuses a resume
        whose state lacks one (it would go on from a fresh state silently).

        Args:
            num_params: d, the model's number of parameter entries (for the client algorithms' ``state_dim``).

        Example::

            >>> from lightning_fed.callbacks import FedAdam, FedAvg
            >>> FedAdam().required_state(10), FedAvg().required_state(10)
            (['num_steps', 'state.exp_avg', 'state.exp_avg_sq'], ['num_steps'])
        """
        state_type = self.server_rule.State
        required = ["num_steps"] + [f"state.{f}" for f in state_type._fields if f not in state_type._field_defaults]
        if self.aggregators is not None:
            required.append("aggregators")
            required += [f"aggregators.{i}.{f}" for i, s in enumerate(self.aggregators) for f in s.required_fields]
        required += [f"client_algorithms.{a.state_key}" for a in self.client_algorithms if int(a.state_dim(num_params)) > 0]
        return required

    def snapshot_state(self) -> dict[str, Any]:
        """A copy of the server optimizer's state (:meth:`state_dict`, every tensor cloned but the rows of the
        lazily filled per-client tables, which are never written in place and are shared; an on-disk table's state is
        its manifest), for :meth:`restore_state`: taken before each server step under
        ``on_nonfinite_server_step="restore"``."""
        return _clone(self.state_dict())

    def restore_state(self, snapshot: dict[str, Any], params: list[Tensor]) -> None:
        """Go back to ``snapshot`` (from :meth:`snapshot_state`) in the middle of a run, as a resume from a checkpoint
        holding it would: :meth:`load_state_dict`, then the aggregator chain's states re-made at once for
        ``params`` (the global model's parameters), and no server step in the current round.

        Example: FedAdam's step count and moments back to before a step::

            >>> import torch
            >>> from lightning_fed.callbacks import FedAdam
            >>> server, params = FedAdam(lr=0.1), [torch.zeros(2)]
            >>> _ = server.server_update(params, [ClientUpdate(0, [torch.ones(2)], 1, 1, 0.0)])
            >>> before = server.snapshot_state()
            >>> _ = server.server_update(params, [ClientUpdate(0, [torch.ones(2)], 1, 1, 0.0)])
            >>> server.restore_state(before, params)
            >>> server.num_steps, torch.equal(server.state["exp_avg"][0], before["state"]["exp_avg"][0])
            (1, True)
        """
        loaded = self.loaded_client_state
        self.load_state_dict(_clone(snapshot))
        self.loaded_client_state = loaded
        if self._saved_aggregator_state is not None and self.aggregators is not None:
            self.aggregator_state = None
            self.chain_state(params)
        self._stepped = False
        self.round_report = None

    # ------------------------------------------------------------------ checkpointing
    @property
    def state_key(self) -> str:
        """Lightning's key of this callback's state: the class name and :attr:`state_key_fields`' values."""
        return self._generate_state_key(**dict(self._fields(self.state_key_fields)))

    def _fields(self, specs: Sequence[str]) -> list[tuple[str, Any]]:
        """``(key, value)`` of each ``"key"`` or ``"key=dotted.path"`` of ``specs``, read from this object."""
        out = []
        for spec in specs:
            key, _, path = spec.partition("=")
            value: Any = self
            for part in (path or key).split("."):
                value = getattr(value, part)
            out.append((key, value))
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{"num_steps", "state": {field: [tensors]}}`` plus the rule state's scalar fields at the top level
        (e.g. ``eta``, ``theta``), ``"aggregators"`` with a chain and ``"client_state"`` with a client-state table of
        this server optimizer's own (not one that a stage's state holds: that is saved with the stage)."""
        tensors, scalars = state_to_dict(self._rule_state, self.server_rule.State)
        out = {"num_steps": self.num_steps, "state": tensors, **scalars}
        if self.aggregator_state is not None:
            out["aggregators"] = [_cpu(s._asdict()) for s in self.aggregator_state]
        table = self.client_state
        if table is not None and not any(v is table for st in (self.aggregator_state or ()) for v in st):
            out["client_state"] = table.state_dict()  # a stage's table is saved once, with its stage's state
        if self.client_algorithm_states:
            out["client_algorithms"] = {key: t.state_dict() for key, t in self.client_algorithm_states.items()}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.num_steps = int(state_dict["num_steps"])
        self._rule_state = state_from_dict(self.server_rule.State, state_dict["state"], state_dict)
        if "aggregators" in state_dict:
            self._saved_aggregator_state = state_dict["aggregators"]
            self.aggregator_state = None
        if "client_state" in state_dict:
            self.client_state = ClientStateTable.from_state_dict(state_dict["client_state"])
        self.client_algorithm_states = {
            str(key): ClientStateTable.from_state_dict(t) for key, t in state_dict.get("client_algorithms", {}).items()
        }
        self.loaded_client_state = bool(self.client_algorithm_states)

    def select_federated(self, positions: Sequence[int], sizes: Sequence[int]) -> list[str]:
        """Cut a state loaded from a checkpoint that covers every parameter of the model down to the federated ones
        (a resume of a run saved before only the federated parameters were: its frozen parameters' entries were
        never used). Per-parameter lists of the rule's and the stages' states keep the entries at ``positions``;
        per-client tables of one number per model entry keep those entries' columns. Exact: every kept number is
        the saved one.

        Args:
            positions: The federated parameters' positions in ``module.parameters()``.
            sizes: ``numel`` of every parameter of the model (``module.parameters()`` order).

        Returns:
            The paths of the state that were cut (e.g. ``["state.exp_avg", "client_algorithms.FedDynClient"]``).

        Raises:
            ValueError: a state that cannot be cut exactly (a dense per-client table, FedAWARE's, whose Gram matrix
                covers every entry), naming it.

        Example::

            >>> import torch
            >>> from lightning_fed.callbacks import FedAdam
            >>> server = FedAdam(lr=0.1)
            >>> update = ClientUpdate(0, [torch.ones(2), torch.zeros(3)], 1, 1, 0.0)
            >>> _ = server.server_update([torch.zeros(2), torch.zeros(3)], [update])
            >>> server.select_federated([0], [2, 3]), [t.shape for t in server.state["exp_avg"]]
            (['state.exp_avg', 'state.exp_avg_sq'], [torch.Size([2])])
        """
        positions, sizes = [int(i) for i in positions], [int(n) for n in sizes]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        columns = torch.cat([torch.arange(offsets[i], offsets[i] + sizes[i]) for i in positions]) if positions \
            else torch.zeros(0, dtype=torch.long)
        total, cut = sum(sizes), []

        def per_parameter(value: Any) -> bool:
            return (isinstance(value, (list, tuple)) and len(value) == len(sizes) and len(sizes) > 0
                    and all(isinstance(v, Tensor) and v.numel() == n for v, n in zip(value, sizes)))

        def table(value: ClientStateTable, path: str) -> ClientStateTable:
            if value.dim != total:
                return value
            if value.dense:
                raise ValueError(
                    f"Cannot resume {type(self).__name__}'s state {path!r} for the federated parameters only: it is a "
                    f"dense per-client table over all {total} entries of the model (FedAWARE's momenta, whose Gram "
                    "matrix covers every entry), saved before frozen parameters were left out. Start a new run, or "
                    "resume with every parameter trained."
                )
            out = ClientStateTable(value.num_clients, int(columns.numel()), dtype=value.dtype)
            for i in value.ids():
                out.put(i, value.get(i)[columns])
            cut.append(path)
            return out

        def walk(value: Any, path: str) -> Any:
            if per_parameter(value):
                cut.append(path)
                return [value[i] for i in positions]
            if isinstance(value, ClientStateTable):
                return table(value, path)
            if isinstance(value, dict):
                if set(value) == {_TABLE_KEY}:
                    restored = table(ClientStateTable.from_state_dict(value[_TABLE_KEY]), path)
                    return {_TABLE_KEY: restored.state_dict()}
                return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
            return value

        if self._rule_state is not None:
            fields = self._rule_state._asdict()
            self._rule_state = type(self._rule_state)(**{k: walk(v, f"state.{k}") for k, v in fields.items()})
        if self._saved_aggregator_state is not None:
            self._saved_aggregator_state = [walk(st, f"aggregators.{i}")
                                            for i, st in enumerate(self._saved_aggregator_state)]
        if self.client_state is not None:
            self.client_state = table(self.client_state, "client_state")
        self.client_algorithm_states = {key: table(t, f"client_algorithms.{key}")
                                        for key, t in self.client_algorithm_states.items()}
        return cut

    def extra_repr(self) -> str:
        """``key=value`` of :attr:`repr_fields` (strings quoted), but those :attr:`repr_hidden` hides."""
        hidden, formats = self.repr_hidden, self.repr_formats
        shown = [(key, formats[key](value) if key in formats else value) for key, value in self._fields(self.repr_fields)
                 if not (key in hidden and value == hidden[key])]
        return ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}" for key, value in shown)

    def _client_repr(self) -> str:
        return f", client={self.client!r}" if self.client else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()}{self._client_repr()})"


#: The release that drops ``ServerOptimizer(client=...)`` (deprecated for ``FederatedTrainer(client_algorithms=...)``).
CLIENT_REMOVED_IN = "0.3.0"


def warn_client_deprecated(server: Any) -> None:
    """Warn (``DeprecationWarning``, at the line that built ``server``) that ``client=[...]`` of a server optimizer
    is deprecated: the kept way is ``FederatedTrainer(client_algorithms=[...])``, removal in :data:`CLIENT_REMOVED_IN`."""
    level, frame = 3, inspect.currentframe().f_back.f_back  # the caller of ServerOptimizer.__init__
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is server:
        level, frame = level + 1, frame.f_back  # a subclass's __init__ passing `client` on: point past it
    name = type(server).__name__
    warnings.warn(
        f"`{name}(client=[...])` is deprecated and will be removed in lightning_fed {CLIENT_REMOVED_IN}: give the "
        "client halves to the trainer instead, `FederatedTrainer(client_algorithms=[...])` (YAML/CLI: "
        "`trainer.client_algorithms`), which also keeps them when the server optimizer is swapped.",
        DeprecationWarning, stacklevel=level)


def none_if_infinite(value: float) -> Optional[float]:
    """``None`` for ±∞ (an unset bound, as the constructor takes it), else ``value``: a :attr:`ServerOptimizer.repr_formats` entry.

    Example::

        >>> none_if_infinite(math.inf), none_if_infinite(2.0)
        (None, 2.0)
    """
    return None if math.isinf(value) else value


def _where(algorithm: ClientAlgorithm, server: ServerOptimizer) -> str:
    """Where ``algorithm`` was given: ``"`client[i]` of FedAvg"`` (the server optimizer's own and ``client``, as
    one list) or ``"`client_algorithms[j]` of the trainer"``."""
    own = server.server_client_algorithms
    if any(a is algorithm for a in own):
        return f"`client[{next(i for i, a in enumerate(own) if a is algorithm)}]` of {type(server).__name__}"
    given = [a for a in server.client_algorithms if not any(a is b for b in own)]
    return f"`client_algorithms[{next((j for j, a in enumerate(given) if a is algorithm), 0)}]` of the trainer"


class _RowsOf:
    """The client ids whose rows of the per-client tables :func:`_state_items` lists (each table once)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = [int(i) for i in ids]
        self.seen: set[int] = set()


def _state_items(items: list, prefix: str, value: Any, path: tuple, param_names: Sequence[str],
                 tables: Optional[_RowsOf]) -> None:
    """Append ``(label, value)`` for the tensors and NaN floats inside ``value`` (see ``ServerOptimizer.state_items``);
    a :class:`ClientStateTable` contributes the rows of ``tables.ids`` (state dicts of tables: every row)."""
    label = f"{prefix} {'.'.join(path)!r}"
    if isinstance(value, Tensor):
        items.append((label, value))
    elif isinstance(value, float):
        if math.isnan(value):  # ±inf is a value of scalar state (AdaptiveStepSize's θ before round 2, S = ∞)
            items.append((label, value))
    elif isinstance(value, ClientStateTable):
        if tables is not None and id(value) not in tables.seen:
            tables.seen.add(id(value))
            items.extend((f"{label} row of client {i}", value.get(i)) for i in tables.ids
                         if 0 <= i < value.num_clients and i in value)
    elif hasattr(value, "_asdict"):
        _state_items(items, prefix, value._asdict(), path, param_names, tables)
    elif isinstance(value, dict):
        # an on-disk table's state dict: its rows recorded non-finite when written, read from their files (only those)
        items.extend((f"{label} row of client {i}", row) for i, row in nonfinite_disk_rows(value))
        for key, v in value.items():
            _state_items(items, prefix, v, path + (str(key),), param_names, tables)
    elif isinstance(value, (list, tuple)):
        if value and len(value) == len(param_names) and all(isinstance(v, Tensor) for v in value):
            items.extend((f"{label} for parameter {name!r}", v) for name, v in zip(param_names, value))
        else:
            for i, v in enumerate(value):
                _state_items(items, prefix, v, path + (str(i),), param_names, tables)


def _clone(value: Any) -> Any:
    """``value`` with every tensor cloned (dicts, lists, tuples and NamedTuples rebuilt) — except the rows of a lazily
    filled client-state table's state dict (``dense`` false, ``"rows"`` a dict): a row is never written in place
    (:meth:`ClientStateTable.put` stores a new tensor), so a snapshot shares them instead of doubling the table."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        if value.get("dense") is False and isinstance(value.get("rows"), dict) and "num_clients" in value:
            return {k: (dict(v) if k == "rows" else _clone(v)) for k, v in value.items()}
        return {k: _clone(v) for k, v in value.items()}
    if hasattr(value, "_asdict"):
        return type(value)(**{k: _clone(v) for k, v in value._asdict().items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


_TABLE_KEY = "client_state_table"  # a ClientStateTable inside a stage's state, saved as its (weights-only) state dict


def _restore_tables(value: Any) -> Any:
    """A stage state saved by :func:`_cpu` back to live values (its client-state tables re-made)."""
    if isinstance(value, dict):
        if set(value) == {_TABLE_KEY}:
            return ClientStateTable.from_state_dict(value[_TABLE_KEY])
        return {k: _restore_tables(v) for k, v in value.items()}
    return value


def _cpu(value: Any) -> Any:
    if isinstance(value, ClientStateTable):
        return {_TABLE_KEY: value.state_dict()}
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value
