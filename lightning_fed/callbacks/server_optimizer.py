"""The server optimizer callback: aggregates client updates into the pseudo-gradient and updates the global model."""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import Any, Optional, Sequence

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_fed import migrations
from lightning_fed.client import ClientUpdate
from lightning_fed.client.update import DeltaNorms
from lightning_fed.client.algorithm import ClientAlgorithm, check_client_algorithms
from lightning_fed.client.states import ClientStates, resolve_store
from lightning_fed.migrations import clone_state
from lightning_fed.server.client_state import ClientStateStore, ClientStateTable, check_client_state_store, collect_garbage
from lightning_fed.server.aggregators.base import RoundInfo, Stage
from lightning_fed.server.aggregators.dp import adds_noise, check_private_fit, trained_parameters
from lightning_fed.server.arguments import REMOVED_OVERRIDES, _ArgumentsCheckedByName, check_arguments  # noqa: F401
from lightning_fed.server.composer import ServerComposer, ServerRound
from lightning_fed.server.rules.base import Rule, state_to_dict
from lightning_fed.server.rules.base import zeros_like_all  # noqa: F401  (re-exported)
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.server.checks import check_positive, check_unit_interval  # noqa: F401  (re-exported)


def _delegated(name: str) -> Any:
    """A method of the server optimizer that is its composer's :class:`ServerComposer` method ``name`` (its
    signature; its doc's first paragraph, the composer holding the examples)."""
    composed = getattr(ServerComposer, name)

    @functools.wraps(composed)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.composer, name)(*args, **kwargs)

    method.__doc__ = (composed.__doc__ or "").split("\n\n")[0] + f" (:meth:`ServerComposer.{name} " \
        f"<lightning_fed.server.composer.ServerComposer.{name}>`)"
    return method


def _composed(name: str, doc: str) -> property:
    """An attribute of the server optimizer that is its composer's (one source of truth)."""
    return property(lambda self: getattr(self.composer, name), lambda self, v: setattr(self.composer, name, v), doc=doc)


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

    weighting = _composed("weighting", "``\"num_samples\"`` or ``\"uniform\"``.")
    aggregators = _composed("aggregators", "The aggregator chain replacing the weighted mean, or ``None``.")
    server_rule = _composed("rule", "The server rule (:mod:`lightning_fed.server.rules`; default SGD(lr)).")
    num_steps = _composed("num_steps", "Number of server steps taken so far (t after the update of round t−1).")
    round_report = _composed("round_report", "The last round's :class:`~lightning_fed.server.aggregators.RoundReport` "
                             "(client weights, stage reports); ``None`` before it and from the start of each round.")
    aggregator_state = _composed("aggregator_state", "The chain's typed states (one per stage), ``None`` until made.")
    _rule_state = _composed("rule_state", "The rule's typed state, ``None`` before the first step.")
    _saved_aggregator_state = _composed("saved_aggregator_state", "The chain's states as loaded, until re-made.")
    _round_info = _composed("round_info", "The current round's RoundInfo.")

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
        #: Weighting, aggregator chain and rule, with their states (:class:`~lightning_fed.server.composer.ServerComposer`).
        self.composer = ServerComposer(weighting, aggregators, SGD(self.lr) if rule is None else rule)
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
        #: The per-client state of the client halves (:class:`~lightning_fed.client.states.ClientStates`): the run's,
        #: bound at fit start (:meth:`bind_client_algorithms`), written when a client's update reaches the server,
        #: checkpointed with this state; before a fit, this server optimizer's own (what a checkpoint loaded).
        self.client_states = ClientStates(self._store)
        self._run_client_algorithms: Optional[list[ClientAlgorithm]] = None  # the run's halves, bound at fit start

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

    def bind_client_algorithms(self, algorithms: Optional[list[ClientAlgorithm]],
                               states: Optional[ClientStates] = None) -> None:
        """Record the run's client halves (called by :meth:`ClientHalves.setup
        <lightning_fed.client.algorithm.ClientHalves.setup>` at fit start; ``None``: forget them) and, given, the
        run's per-client state: it takes over what this server optimizer holds (loaded from a checkpoint; the store)
        and is what :attr:`client_algorithm_states` reads and the checkpoints save from then on."""
        self._run_client_algorithms = None if algorithms is None else list(algorithms)
        if states is not None and states is not self.client_states:
            states.adopt(self.client_states)
            self.client_states = states

    client_algorithm_states = property(
        lambda self: self.client_states.tables, lambda self, v: setattr(self.client_states, "tables", v),
        doc="The client halves' per-client tables by ``state_key`` (e.g. ``\"FedDynClient\"``), :attr:`client_states`'.")
    loaded_client_state = property(
        lambda self: self.client_states.loaded, lambda self, v: setattr(self.client_states, "loaded", v),
        doc="Whether :attr:`client_algorithm_states` came from a checkpoint not yet checked against the run.")

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

    # ------------------------------------------------------------------ aggregation: the composer's
    client_weight_counts = _delegated("client_weight_counts")
    client_weights = _delegated("client_weights")
    round_weights = _delegated("round_weights")
    client_delta = _delegated("client_delta")
    aggregate = _delegated("aggregate")
    chain_state = _delegated("chain_state")
    stage_state_fields = _delegated("stage_state_fields")
    stage_report = _delegated("stage_report")
    aggregation_requirement = _delegated("aggregation_requirement")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Record the round's :class:`~lightning_fed.server.aggregators.RoundInfo` for the aggregator chain, and run
        every stage's ``check_round_start`` before the round's clients train.

        Raises:
            ValueError: from a stage's :meth:`~lightning_fed.server.aggregators.Stage.check_round_start`.
        """
        for check_round_start in self.composer.stage_hooks("check_round_start"):
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
        """Gradient diversity D = √( Σ_i λ_i‖g_i‖² / ‖Σ_i λ_i g_i‖² ) of the round (Zeng et al. 2024, Def. 3.1,
        Eq. 3), logged as ``round_gradient_diversity``: :meth:`ServerComposer.gradient_diversity
        <lightning_fed.server.composer.ServerComposer.gradient_diversity>`, the denominator of the raw updates under a
        chain that adds DP noise (:attr:`privatises`). ``delta_norms``: ``{id(update): DeltaNorms}`` already computed
        this round (the loop's finiteness check). Returns D (a float; ``nan`` when the pseudo-gradient is zero)."""
        return self.composer.gradient_diversity(updates, pseudo_gradient, self.privatises, delta_norms)

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
        frozen: list[int] = []
        if self.privatises:  # DP: clip and noise only what the clients train; the rest stays at x_t exactly
            trained = self._trained if self._trained is not None and len(self._trained) == len(params) \
                else trained_parameters(params)
            frozen = [i for i, t in enumerate(trained) if not t or id(params[i]) in self._local_ids]
            if len(frozen) == len(params):
                raise ValueError(f"{type(self).__name__} adds DP noise, but no parameter is trained and shared (all "
                                 "frozen or kept local by a client half).")
        pseudo_gradient = self.composer.update(params, updates, frozen)
        self._stepped = True
        return pseudo_gradient

    # ------------------------------------------------------------------ the federated loop's round
    def round_step(self, params: list[Tensor], updates: list[ClientUpdate], snapshot: bool = False,
                   delta_norms: Optional[dict[int, DeltaNorms]] = None) -> Optional[ServerRound]:
        """The federated loop's server step: ``None`` when the server does not step (no update, and not a server that
        releases empty rounds, DP's); else, after a snapshot of the state (:meth:`snapshot_state`, for
        :meth:`undo_round_step`) when ``snapshot``, :meth:`server_update` and the round's
        :class:`~lightning_fed.server.composer.ServerRound` (weights of :attr:`round_report`, the
        :meth:`gradient_diversity` with ``delta_norms``, whether buffers are released: not under :attr:`privatises`;
        the snapshot, held by the round, not by the server optimizer)."""
        if not updates and not getattr(self, "releases_empty_rounds", False):
            return None
        before = self.snapshot_state() if snapshot else None
        pseudo_gradient = self.server_update(params, updates)
        weights = self.round_weights(updates) if updates else torch.zeros(0, dtype=torch.float64)
        diversity = (lambda: self.gradient_diversity(updates, pseudo_gradient, delta_norms)) if updates else \
            (lambda: float("nan"))
        return ServerRound(pseudo_gradient, weights, diversity, not self.privatises, before)

    def undo_round_step(self, params: list[Tensor], step: ServerRound) -> None:
        """Back to the state from before ``step`` (a :meth:`round_step` taken with ``snapshot``;
        :meth:`restore_state`).

        Raises:
            RuntimeError: ``step`` holds no snapshot.
        """
        if step.snapshot is None:
            raise RuntimeError("undo_round_step: this round_step kept no snapshot (snapshot=False).")
        self.restore_state(step.snapshot, params)

    def validate_round(self, params: list[Tensor], updates: list[ClientUpdate]) -> None:
        """Called first by :meth:`server_update`, before any state changes: a subclass raises here when the round
        cannot be applied to ``params`` (e.g. FedAWARE: N unknown, a momentum table of another shape). Default: every
        stage's :meth:`~lightning_fed.server.aggregators.Stage.prepare_round` (e.g. SCAFFOLD's checks of N, the client
        ids and Δc_i, then c created or moved to ``params``' device)."""
        for prepare_round in self.composer.stage_hooks("prepare_round"):
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
        self.client_states.receive(updates, self.client_algorithms, lambda algorithm: _where(algorithm, self))

    # ------------------------------------------------------------------ trainer check
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Every stage's :meth:`~lightning_fed.server.aggregators.Stage.check_setup` (e.g. FedAWARE reads N from the
        data module); at fit start (before round 0): check a chain holding DP stages
        (:func:`~lightning_fed.server.aggregators.dp.check_dp_chain`: ``DPMean`` needs ``weighting="uniform"``; a
        hand-composed DP chain warns that ε is not accounted).

        Raises:
            ValueError: as a stage's ``check_setup``; ``DPMean`` in the chain with ``weighting="num_samples"``.
        """
        for check_setup in self.composer.stage_hooks("check_setup"):
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
        self._store = resolve_store(type(self).__name__, self.client_state_store, self.client_state_dir, trainer,
                                    list(self.aggregators or ()))
        self.client_states.store = self._store
        return self._store

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
        for check in self.composer.stage_hooks("check_cohort") if cohort is not None else ():
            check(int(cohort))  # refuse (or warn about) the chain's settings for this cohort size before round 0
        # a server half that needs its client half (FedDyn), or a stage that depends on the local solver (FedNova)
        for check_fit in self.composer.stage_hooks("check_fit"):
            check_fit(trainer, pl_module, self)

    # ------------------------------------------------------------------ state integrity (issue #43)
    def state_items(self, param_names: Sequence[str], saved: bool = False) -> list[tuple[str, Any]]:
        """:func:`lightning_fed.migrations.state_items` of this server optimizer: ``(label, value)`` of its state for
        the non-finite checks."""
        return migrations.state_items(self, param_names, saved)

    def required_state(self, num_params: int) -> list[str]:
        """:func:`lightning_fed.migrations.required_state`: the entries a resume after a server step needs."""
        return migrations.required_state(self, num_params)

    def snapshot_state(self) -> dict[str, Any]:
        """A copy of the server optimizer's state (:meth:`state_dict`, every tensor cloned but the rows of the
        lazily filled per-client tables, which are never written in place and are shared; an on-disk table's state is
        its manifest), for :meth:`restore_state`: taken before each server step under
        ``on_nonfinite_server_step="restore"``."""
        return clone_state(self.state_dict())

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
        self.load_state_dict(clone_state(snapshot))
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
        out = self.composer.state_dict()
        table = self.client_state
        if table is not None and not any(v is table for st in (self.aggregator_state or ()) for v in st):
            out["client_state"] = table.state_dict()  # a stage's table is saved once, with its stage's state
        if self.client_states.tables:
            out["client_algorithms"] = self.client_states.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.composer.load_state_dict(state_dict)
        if "client_state" in state_dict:
            self.client_state = ClientStateTable.from_state_dict(state_dict["client_state"])
        self.client_states.load_state_dict(state_dict.get("client_algorithms", {}))

    def select_federated(self, positions: Sequence[int], sizes: Sequence[int]) -> list[str]:
        """:func:`lightning_fed.migrations.select_federated`: a loaded all-parameter state cut to the federated ones."""
        return migrations.select_federated(self, positions, sizes)

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
