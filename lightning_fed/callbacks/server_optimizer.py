"""The server optimizer callback: aggregates client updates into the pseudo-gradient and updates the global model."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_fed import migrations
from lightning_fed.client.update import ClientUpdate, DeltaNorms
from lightning_fed.client.algorithm import ClientAlgorithm, check_client_algorithms
from lightning_fed.client.states import ClientStates, resolve_store, where_given
from lightning_fed.server.client_state import (ClientStateStore, ClientStateTable, check_client_state_store,
                                               collect_tables_garbage)
from lightning_fed.server.aggregators.base import RoundInfo, Stage
from lightning_fed.server.aggregators.dp import adds_noise, check_dp_chain, check_private_fit, trained_parameters
from lightning_fed.server.arguments import REMOVED_OVERRIDES, check_arguments  # noqa: F401  (re-exported)
from lightning_fed.server.arguments import _ArgumentsCheckedByName, check_removed_overrides, check_rule_lr, fields_of
from lightning_fed.server.arguments import (CLIENT_REMOVED_IN, none_if_infinite,  # noqa: F401  (re-exported)
                                            warn_client_deprecated)
from lightning_fed.server.composer import ServerComposer, ServerRound, composed_attribute, delegated_method
from lightning_fed.server.fit_checks import (check_cohort, check_federated_trainer, check_own_chain, frozen_positions,
                                             local_parameter_ids)
from lightning_fed.server.rules.base import Rule, zeros_like_all  # noqa: F401  (zeros_like_all re-exported)
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.server.checks import check_positive, check_unit_interval  # noqa: F401  (re-exported)


class ServerOptimizer(Callback, _ArgumentsCheckedByName):
    """The server optimizer (ServerOpt of Reddi et al. 2021, Alg. 1, l. 10-11): one Lightning callback that turns a
    round's client updates into the next global model, and carries the client halves of the algorithms it runs.

    A composition (docs/guide/server-optimizers.md, "How a server optimizer is composed"): an aggregator chain
    (:mod:`lightning_fed.server.aggregators`) in place of the weighted mean Δ_t = Σ_i w_i Δ_i and a rule
    x_{t+1} = ServerOpt(x_t, Δ_t) (:mod:`lightning_fed.server.rules`), held by a
    :class:`~lightning_fed.server.composer.ServerComposer`, and client halves (:mod:`lightning_fed.client.algorithm`).
    Ready-made names (:class:`FedAvg`, ...) fix parts and defaults only. One per
    :class:`~lightning_fed.trainer.FederatedTrainer` (none: :class:`FedAvg`, η = 1); the loop calls :meth:`round_step`.

    Args:
        lr: Server learning rate η (> 0; default 1.0, or the rule's).
        weighting: ``"num_samples"`` (default: w_i ∝ |D_i|, Reddi et al. 2021, Alg. 5) or ``"uniform"`` (w_i = 1/|S|).
        aggregators: An aggregator chain in place of the weighted mean (default ``None``).
        rule: The server rule (default ``None``: SGD(lr), FedAvg's rule).
        client: Client algorithms every client runs (default ``None``). Deprecated (``DeprecationWarning``; removed
            in 0.3.0): give them as ``FederatedTrainer(client_algorithms=[...])`` (YAML/CLI: ``trainer.client_algorithms``).
        client_state_store: Where per-client tables (SCAFFOLD's c_i, ...) keep their rows: ``"memory"`` (default) or
            ``"disk"`` (one file per row, :mod:`lightning_fed.server.client_state`; same results, may change on resume).
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``).

    Raises:
        ValueError: ``lr`` not a finite number > 0, an unknown ``weighting``, ``lr`` disagreeing with ``rule.lr``,
            ``client_state_store`` not one of ``("memory", "disk")``, ``client_state_dir`` without ``"disk"``;
            at fit start, what the checks of :meth:`setup`, :meth:`on_fit_start` and :meth:`on_train_start` refuse.
        TypeError: ``rule`` not a :class:`~lightning_fed.server.rules.Rule`, a ``client`` entry not a
            :class:`~lightning_fed.client.ClientAlgorithm`.
        RuntimeError: at fit start, under a plain :class:`lightning.Trainer`.

    Example: the pseudo-gradient of two clients with 1 and 2 samples is (1·Δ_0 + 2·Δ_1)/3 (:class:`FedAvg`)::

        >>> import torch
        >>> from lightning_fed.callbacks import FedAvg
        >>> updates = [ClientUpdate(client_id=0, delta=[torch.tensor([1.0, 0.0])], num_samples=1, num_steps=1, loss=0.0),
        ...            ClientUpdate(client_id=1, delta=[torch.tensor([4.0, 3.0])], num_samples=2, num_steps=1, loss=0.0)]
        >>> FedAvg().client_weights(updates), FedAvg().aggregate(updates)  # (1·[1, 0] + 2·[4, 3]) / 3
        (tensor([0.3333, 0.6667], dtype=torch.float64), [tensor([3., 2.])])
        >>> FedAvg(weighting="uniform").aggregate(updates)  # ([1, 0] + [4, 3]) / 2
        [tensor([2.5000, 1.5000])]
        >>> FedAvg(weighting="mean")
        Traceback (most recent call last):
        ...
        ValueError: `weighting` must be one of ('num_samples', 'uniform'), got 'mean'.
    """

    #: Marks server optimizers for the modules below the callbacks (:func:`~lightning_fed.server.checks.is_server_optimizer`).
    is_server_optimizer = True
    #: Settings of ``__init__`` that do not change the experiment: not in the run record, free to change on resume.
    unrecorded_settings = ("client_state_store", "client_state_dir")
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

    weighting = composed_attribute("weighting", "``\"num_samples\"`` or ``\"uniform\"``.")
    aggregators = composed_attribute("aggregators", "The aggregator chain replacing the weighted mean, or ``None``.")
    server_rule = composed_attribute("rule", "The server rule (:mod:`lightning_fed.server.rules`; default SGD(lr)).")
    num_steps = composed_attribute("num_steps", "Number of server steps taken so far (t after the update of round t−1).")
    round_report = composed_attribute("round_report", "The last round's :class:`~lightning_fed.server.aggregators.RoundReport` "
                             "(client weights, stage reports); ``None`` before it and from the start of each round.")
    aggregator_state = composed_attribute("aggregator_state", "The chain's typed states (one per stage), ``None`` until made.")
    rule_state = composed_attribute("rule_state", "The rule's typed state (a ``NamedTuple``), ``None`` before the first step.")
    _saved_aggregator_state = composed_attribute("saved_aggregator_state", "The chain's states as loaded, until re-made.")
    state = composed_attribute("state", "The rule state's tensors by name, aligned with the federated parameters "
                      "(:attr:`ServerComposer.state <lightning_fed.server.composer.ServerComposer.state>`).")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Raises: TypeError for a method of :data:`~lightning_fed.server.arguments.REMOVED_OVERRIDES` defined."""
        super().__init_subclass__(**kwargs)
        check_removed_overrides(cls)

    def __init__(self, lr: Optional[float] = None, weighting: str = "num_samples",
                 aggregators: Optional[list[Stage]] = None, rule: Optional[Rule] = None,
                 client: Optional[list[ClientAlgorithm]] = None, client_state_store: str = "memory",
                 client_state_dir: Optional[str] = None) -> None:
        self.client_state_store, self.client_state_dir = check_client_state_store(client_state_store, client_state_dir)
        self.lr = check_rule_lr(lr, rule)
        #: Weighting, aggregator chain and rule, with their states (:class:`~lightning_fed.server.composer.ServerComposer`).
        self.composer = ServerComposer(weighting, aggregators, SGD(self.lr) if rule is None else rule)
        #: A per-client table of the server optimizer's own (``None``: none), checkpointed under ``"client_state"``;
        #: a stage's (FedAWARE's m_i, SCAFFOLD's c_i) is read there and saved with the stage, under ``"aggregators"``.
        self.client_state: Optional[ClientStateTable] = None
        self._trained: Optional[list[bool]] = None  # under a noised chain: the parameters the clients train
        self._local_ids: set[int] = set()  # under a noised chain: id() of the parameters client halves keep local
        self._stepped = False  # the server stepped in the current round
        #: The client algorithms given as ``client`` (``None``: none), run by every client of every round.
        self.client: Optional[list[ClientAlgorithm]] = None if client is None else check_client_algorithms(client)
        if client is not None:
            warn_client_deprecated(self)
        self._own_client: list[ClientAlgorithm] = []  # halves a ready-made method brings (FedProx's), before `client`
        self._own_aggregators: Optional[list[Stage]] = None  # the chain a ready-made method fixes (SCAFFOLD's)
        #: The client halves' per-client state (:class:`~lightning_fed.client.states.ClientStates`), the run's once
        #: bound at fit start (:meth:`bind_client_algorithms`).
        self.client_states = ClientStates(ClientStateStore(self.client_state_store, self.client_state_dir))
        self._run_client_algorithms: Optional[list[ClientAlgorithm]] = None  # the run's halves, bound at fit start

    # ------------------------------------------------------------------ client halves
    @property
    def server_client_algorithms(self) -> list[ClientAlgorithm]:
        """The client halves given with this server optimizer: the method's own (FedProx's, SCAFFOLD's), then
        ``client``. The client runner runs them, then ``FederatedTrainer(client_algorithms=...)``."""
        return [*self._own_client, *(self.client or ())]

    @property
    def client_algorithms(self) -> list[ClientAlgorithm]:
        """Every client half of the run: during a fit, the list the client runner runs (bound at fit start), else
        :attr:`server_client_algorithms` (what checks of halves that must come together, FedDyn's, read)."""
        if self._run_client_algorithms is not None:
            return list(self._run_client_algorithms)
        return self.server_client_algorithms

    def bind_client_algorithms(self, algorithms: Optional[list[ClientAlgorithm]],
                               states: Optional[ClientStates] = None) -> None:
        """Record the run's client halves (at fit start, by :class:`~lightning_fed.client.algorithm.ClientHalves`;
        ``None``: forget them) and, given, the run's per-client state, which takes over what this one holds."""
        self._run_client_algorithms = None if algorithms is None else list(algorithms)
        if states is not None and states is not self.client_states:
            states.adopt(self.client_states)
            self.client_states = states

    client_algorithm_states = composed_attribute(
        "tables", "The client halves' per-client tables by ``state_key`` (``\"FedDynClient\"``).", "client_states")
    loaded_client_state = composed_attribute(
        "loaded", "Whether :attr:`client_algorithm_states` came from a checkpoint not yet checked.", "client_states")

    def configure_client(self, trainer: Any, pl_module: Any, client_id: int, round_idx: int,
                         context: Any = None) -> None:
        """Called by the client runner when a client starts from x_t, before its local steps (server → client;
        ``context``: its :class:`~lightning_fed.client.runner.ClientContext`). Default: nothing."""

    def collect_client_extras(self, trainer: Any, pl_module: Any, client_id: int, round_idx: int,
                              context: Any = None) -> dict[str, Any]:
        """Called by the client runner after a client's local steps; the result joins ``ClientUpdate.extras``
        (client → server), after the client halves' extras. Default: nothing (``{}``)."""
        return {}

    # ------------------------------------------------------------------ aggregation: the composer's
    client_weights = delegated_method("client_weights")
    round_weights = delegated_method("round_weights")
    client_delta = delegated_method("client_delta")
    aggregate = delegated_method("aggregate")
    chain_state = delegated_method("chain_state")
    stage_state_fields = delegated_method("stage_state_fields")
    stage_report = delegated_method("stage_report")
    aggregation_requirement = delegated_method("aggregation_requirement")

    @property
    def privatises(self) -> bool:
        """Whether the chain adds DP noise (σ > 0): then only what ε covers is released (buffers keep their global
        value, untrained or local parameters are not stepped: :func:`~lightning_fed.server.fit_checks.frozen_positions`)."""
        return adds_noise(self.aggregators)

    def gradient_diversity(self, updates: list[ClientUpdate], pseudo_gradient: list[Tensor],
                           delta_norms: Optional[dict[int, DeltaNorms]] = None) -> float:
        """Gradient diversity D of the round (Zeng et al. 2024, Def. 3.1), logged as ``round_gradient_diversity``:
        :meth:`ServerComposer.gradient_diversity <lightning_fed.server.composer.ServerComposer.gradient_diversity>`,
        over the raw updates under :attr:`privatises`; ``delta_norms``: ``{id(update): DeltaNorms}`` of the round."""
        return self.composer.gradient_diversity(updates, pseudo_gradient, self.privatises, delta_norms)

    def validate_round(self, params: list[Tensor], updates: list[ClientUpdate]) -> None:
        """Every stage's :meth:`~lightning_fed.server.aggregators.Stage.prepare_round` (SCAFFOLD's checks of N, ids,
        Δc_i), first in :meth:`server_update`, before any state changes; raises when the round cannot be applied."""
        for prepare_round in self.composer.stage_hooks("prepare_round"):
            prepare_round(self, params, updates)

    def server_update(self, params: list[Tensor], updates: list[ClientUpdate]) -> list[Tensor]:
        """Aggregate ``updates`` and step ``params`` (holding x_t) in place to x_{t+1}; returns Δ_t. First
        :meth:`validate_round`, then the client halves' states that came with ``updates`` written
        (:meth:`ClientStates.receive <lightning_fed.client.states.ClientStates.receive>`). Under :attr:`privatises`
        the parameters the clients do not train (as of the round's start) or keep local get Δ_t = 0 and keep x_t.

        Raises:
            ValueError: under such a chain, no parameter trained and shared; as ``ClientStates.receive``.
        """
        self.validate_round(params, updates)
        own, run = self.server_client_algorithms, self.client_algorithms
        self.client_states.receive(updates, run, lambda half: where_given(half, own, run, type(self).__name__))
        frozen: list[int] = []
        if self.privatises:  # DP: clip and noise only what the clients train; the rest stays at x_t exactly
            trained = self._trained if self._trained is not None and len(self._trained) == len(params) \
                else trained_parameters(params)
            frozen = frozen_positions(type(self).__name__, params, trained, self._local_ids)
        pseudo_gradient = self.composer.update(params, updates, frozen)
        self._stepped = True
        return pseudo_gradient

    # ------------------------------------------------------------------ the federated loop's round
    def round_step(self, params: list[Tensor], updates: list[ClientUpdate], snapshot: bool = False,
                   delta_norms: Optional[dict[int, DeltaNorms]] = None) -> Optional[ServerRound]:
        """The federated loop's server step: ``None`` when the server does not step (no update, and not a server that
        releases empty rounds, DP's); else :meth:`server_update` (after :meth:`snapshot_state` when ``snapshot``)
        and the round's :class:`~lightning_fed.server.composer.ServerRound` (weights, :meth:`gradient_diversity`
        with ``delta_norms``, buffers released unless :attr:`privatises`, the snapshot)."""
        if not updates and not getattr(self, "releases_empty_rounds", False):
            return None
        before = self.snapshot_state() if snapshot else None
        pseudo_gradient = self.server_update(params, updates)
        weights = self.round_weights(updates) if updates else torch.zeros(0, dtype=torch.float64)
        diversity = (lambda: self.gradient_diversity(updates, pseudo_gradient, delta_norms)) if updates else \
            (lambda: float("nan"))
        return ServerRound(pseudo_gradient, weights, diversity, not self.privatises, before)

    def undo_round_step(self, params: list[Tensor], step: ServerRound) -> None:
        """Back to the state before ``step`` (:meth:`round_step` with ``snapshot``); RuntimeError without one."""
        if step.snapshot is None:
            raise RuntimeError("undo_round_step: this round_step kept no snapshot (snapshot=False).")
        self.restore_state(step.snapshot, params)

    # ------------------------------------------------------------------ Lightning hooks: the checks before round 0
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Every stage's ``check_setup`` (FedAWARE reads N from the data module); at fit start, the DP chain's check
        (:func:`~lightning_fed.server.aggregators.dp.check_dp_chain`). Raises ValueError as those (e.g. ``DPMean`` in
        the chain with ``weighting="num_samples"``)."""
        for check_setup in self.composer.stage_hooks("check_setup"):
            check_setup(trainer, pl_module, self)
        if stage == "fit":
            check_dp_chain(self)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """:meth:`resolve_client_state_store`, then the ``fit_start`` of the client halves given with this server
        optimizer (Fed-LAMB's installs its client optimizer). Raises: as those."""
        self.resolve_client_state_store(trainer)
        for algorithm in self.server_client_algorithms:
            fit_start = getattr(algorithm, "fit_start", None)
            if fit_start is not None:
                fit_start(trainer, self)

    def resolve_client_state_store(self, trainer: Any = None) -> ClientStateStore:
        """At fit start: the store per-client tables are made in, checked writable, and the stages told where
        (:func:`~lightning_fed.client.states.resolve_store`, raising ValueError or ClientStateStoreError as it does:
        ``"disk"`` for a stage whose table must be in memory, FedAWARE's, or under DDP; a directory not writable).

        Example::

            >>> import tempfile
            >>> from lightning_fed.callbacks import SCAFFOLD
            >>> server = SCAFFOLD(client_state_store="disk", client_state_dir=tempfile.mkdtemp())
            >>> server.resolve_client_state_store().kind, server.control_stage.client_state_store.kind
            ('disk', 'disk')
        """
        store = resolve_store(type(self).__name__, self.client_state_store, self.client_state_dir, trainer,
                              list(self.aggregators or ()))
        self.client_states.store = store
        return store

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The fit-start checks, in order (:mod:`lightning_fed.server.fit_checks`): the method's own chain kept, a
        federated trainer, under :attr:`privatises` :func:`~lightning_fed.server.aggregators.dp.check_private_fit`,
        the stages' ``check_cohort`` and ``check_fit`` (e.g. FedDyn's server half without its client half).

        Raises:
            RuntimeError: ``trainer`` is a plain :class:`lightning.Trainer`.
            ValueError: as those checks.
        """
        check_own_chain(type(self).__name__, self._own_aggregators, self.aggregators)
        check_federated_trainer(type(self).__name__, trainer)
        if self.privatises:
            self._trained = trained_parameters(list(pl_module.parameters()), trainer.optimizers)
            check_private_fit(self, trainer, pl_module, self._trained)
        check_cohort(self.composer.stage_hooks("check_cohort"), trainer.datamodule)
        for check_fit in self.composer.stage_hooks("check_fit"):
            check_fit(trainer, pl_module, self)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Every stage's ``check_round_start`` (raising ValueError as it does), the round's
        :class:`~lightning_fed.server.aggregators.RoundInfo`; under :attr:`privatises`, which parameters are trained
        and kept local (:func:`~lightning_fed.server.fit_checks.local_parameter_ids`); under ``"disk"``, the row
        versions nothing references deleted (:func:`~lightning_fed.server.client_state.collect_tables_garbage`)."""
        for check_round_start in self.composer.stage_hooks("check_round_start"):
            check_round_start(trainer, pl_module, self)
        dm = trainer.datamodule
        if dm is not None and hasattr(dm, "select_cohort"):
            self.composer.round_info = RoundInfo(int(trainer.current_epoch), int(getattr(dm, "seed", 0)),
                                                 int(dm.num_clients), int(dm.clients_per_round))
        self._stepped = False
        self.round_report = None
        if self.privatises:
            self._trained = trained_parameters(list(pl_module.parameters()), trainer.optimizers)
            self._local_ids = local_parameter_ids(list(pl_module.parameters()), self.client_algorithms)
        if self.client_state_store == "disk":
            collect_tables_garbage([*self.client_algorithm_states.values(), self.client_state,
                                    *(v for state in self.aggregator_state or () for v in state)])

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Log every stage's :meth:`~lightning_fed.server.aggregators.Stage.round_metrics` of the round's report
        (e.g. FedAWARE's ``fedaware_support``); nothing in a round without a server step."""
        for stage in self.aggregators or ():
            round_metrics = getattr(stage, "round_metrics", None)
            metrics = round_metrics(self.stage_report(stage)) if round_metrics is not None else {}
            for name, value in metrics.items():
                pl_module.log(name, value, on_step=False, on_epoch=True, batch_size=1)

    # ------------------------------------------------------------------ state and checkpointing
    def snapshot_state(self) -> dict[str, Any]:
        """A copy of :meth:`state_dict` (tensors cloned; the rows of the lazily filled per-client tables, never
        written in place, shared; an on-disk table's manifest) for :meth:`restore_state`."""
        return migrations.clone_state(self.state_dict())

    def restore_state(self, snapshot: dict[str, Any], params: list[Tensor]) -> None:
        """Go back to ``snapshot`` (from :meth:`snapshot_state`) in the middle of a run, as a resume from it would:
        :meth:`load_state_dict`, the chain's states re-made at once for ``params``, no server step in the round.

        Example: FedAdam's step count and moments back to before a step::

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
        self.load_state_dict(migrations.clone_state(snapshot))
        self.loaded_client_state = loaded
        if self._saved_aggregator_state is not None and self.aggregators is not None:
            self.aggregator_state = None
            self.chain_state(params)
        self._stepped = False
        self.round_report = None

    @property
    def state_key(self) -> str:
        """Lightning's key of this callback's state: the class name and :attr:`state_key_fields`' values."""
        return self._generate_state_key(**dict(fields_of(self, self.state_key_fields)))

    def state_dict(self) -> dict[str, Any]:
        """:meth:`ServerComposer.state_dict <lightning_fed.server.composer.ServerComposer.state_dict>`, plus
        ``"client_state"`` with a table of this server optimizer's own (a stage's is saved with the stage) and
        ``"client_algorithms"`` with the client halves' tables."""
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
        shown = [(key, formats[key](value) if key in formats else value) for key, value in fields_of(self, self.repr_fields)
                 if not (key in hidden and value == hidden[key])]
        return ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}" for key, value in shown)

    def _client_repr(self) -> str:
        return f", client={self.client!r}" if self.client else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()}{self._client_repr()})"
