"""The server optimizer callback: aggregates client updates into the pseudo-gradient and updates the global model."""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lightning_fed import migrations
from lightning_fed.client import ClientUpdate
from lightning_fed.client.update import DeltaNorms
from lightning_fed.client.algorithm import ClientAlgorithm, check_client_algorithms
from lightning_fed.client.states import ClientStates, resolve_store, where_given
from lightning_fed.migrations import clone_state
from lightning_fed.server.client_state import (ClientStateStore, ClientStateTable, check_client_state_store,
                                               collect_tables_garbage)
from lightning_fed.server.aggregators.base import RoundInfo, Stage
from lightning_fed.server.aggregators.dp import adds_noise, check_dp_chain, check_private_fit, trained_parameters
from lightning_fed.server.arguments import REMOVED_OVERRIDES, check_arguments  # noqa: F401  (re-exported)
from lightning_fed.server.arguments import _ArgumentsCheckedByName, check_removed_overrides, check_rule_lr
from lightning_fed.server.composer import ServerComposer, ServerRound
from lightning_fed.server.fit_checks import (check_cohort, check_federated_trainer, check_own_chain, frozen_positions,
                                             local_parameter_ids)
from lightning_fed.server.rules.base import Rule
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

    A composition, not a subclass hierarchy (docs/guide/server-optimizers.md, "How a server optimizer is composed"):
    an optional aggregator chain (:mod:`lightning_fed.server.aggregators`) in place of the weighted mean
    Δ_t = Σ_i w_i Δ_i, a rule x_{t+1} = ServerOpt(x_t, Δ_t) (:mod:`lightning_fed.server.rules`) and optional client
    halves (:mod:`lightning_fed.client.algorithm`), held by a :class:`~lightning_fed.server.composer.ServerComposer`.
    The ready-made names (:class:`FedAvg`, :class:`FedAdam`, ...) fix parts and defaults only. After every round the
    federated loop calls :meth:`round_step`; Lightning checkpoints :meth:`state_dict`. At most one per
    :class:`~lightning_fed.FederatedTrainer` (none: :class:`FedAvg`, η = 1); refused under a plain
    :class:`lightning.Trainer` at fit start.

    Args:
        lr: Server learning rate η (> 0; default 1.0, or the rule's).
        weighting: ``"num_samples"`` (default: w_i ∝ |D_i|, Reddi et al. 2021, Alg. 5) or ``"uniform"`` (w_i = 1/|S|).
        aggregators: An aggregator chain in place of the weighted mean (default ``None``).
        rule: The server rule (default ``None``: SGD(lr), FedAvg's rule).
        client: Client algorithms every client runs (default ``None``).
        client_state_store: Where the per-client tables (SCAFFOLD's c_i, a client half's state) keep their rows:
            ``"memory"`` (default) or ``"disk"`` (one file per client row; :mod:`lightning_fed.server.client_state`).
            Same results bit for bit: a resume may change it.
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``).

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

    weighting = _composed("weighting", "``\"num_samples\"`` or ``\"uniform\"``.")
    aggregators = _composed("aggregators", "The aggregator chain replacing the weighted mean, or ``None``.")
    server_rule = _composed("rule", "The server rule (:mod:`lightning_fed.server.rules`; default SGD(lr)).")
    num_steps = _composed("num_steps", "Number of server steps taken so far (t after the update of round t−1).")
    round_report = _composed("round_report", "The last round's :class:`~lightning_fed.server.aggregators.RoundReport` "
                             "(client weights, stage reports); ``None`` before it and from the start of each round.")
    aggregator_state = _composed("aggregator_state", "The chain's typed states (one per stage), ``None`` until made.")
    _rule_state = _composed("rule_state", "The rule's typed state, ``None`` before the first step.")
    _saved_aggregator_state = _composed("saved_aggregator_state", "The chain's states as loaded, until re-made.")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Raises: TypeError for a method of :data:`~lightning_fed.server.arguments.REMOVED_OVERRIDES` defined."""
        super().__init_subclass__(**kwargs)
        check_removed_overrides(cls)

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
        self.lr = check_rule_lr(lr, rule)
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

    state = _composed("state", "The rule state's tensors by name, aligned with the federated parameters "
                      "(:attr:`ServerComposer.state <lightning_fed.server.composer.ServerComposer.state>`).")
    rule_state = _composed("rule_state", "The typed state (a ``NamedTuple``) of :attr:`server_rule`; ``None`` before "
                           "the first round.")

    # ------------------------------------------------------------------ aggregation: the composer's
    client_weights = _delegated("client_weights")
    round_weights = _delegated("round_weights")
    client_delta = _delegated("client_delta")
    aggregate = _delegated("aggregate")
    chain_state = _delegated("chain_state")
    stage_state_fields = _delegated("stage_state_fields")
    stage_report = _delegated("stage_report")
    aggregation_requirement = _delegated("aggregation_requirement")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Run every stage's ``check_round_start``, record the round's
        :class:`~lightning_fed.server.aggregators.RoundInfo`; under a chain that adds DP noise, which parameters it
        leaves out; with the ``"disk"`` store, delete the row versions nothing references any more.

        Raises:
            ValueError: from a stage's :meth:`~lightning_fed.server.aggregators.Stage.check_round_start`.
        """
        for check_round_start in self.composer.stage_hooks("check_round_start"):
            check_round_start(trainer, pl_module, self)
        dm = trainer.datamodule
        if dm is not None and hasattr(dm, "select_cohort"):
            self.composer.round_info = RoundInfo(
                int(trainer.current_epoch), int(getattr(dm, "seed", 0)), int(dm.num_clients), int(dm.clients_per_round)
            )
        self._stepped = False
        self.round_report = None
        if self.privatises:
            self._trained = trained_parameters(list(pl_module.parameters()), trainer.optimizers)
            self._local_ids = local_parameter_ids(list(pl_module.parameters()), self.client_algorithms)
        if self.client_state_store == "disk":  # the on-disk row versions nothing references any more
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

    @property
    def privatises(self) -> bool:
        """Whether the aggregator chain adds DP noise (:func:`~lightning_fed.server.aggregators.dp.adds_noise`, σ > 0).
        Then only what ε covers is released: buffers stay at their global value (the loop does not average the
        clients' buffers), parameters not trained by the clients (``requires_grad=False`` or in no client optimizer)
        and the personal parts client halves keep local are neither clipped, noised nor stepped
        (:func:`~lightning_fed.server.fit_checks.frozen_positions`), and fit refuses running statistics and
        ``max_update_norm_ratio``."""
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
        """Aggregate ``updates`` and step ``params`` (holding x_t) in place to x_{t+1}; returns Δ_t. First
        :meth:`validate_round`, then the client halves' new per-client states that arrived with ``updates`` are
        written (:meth:`ClientStates.receive <lightning_fed.client.states.ClientStates.receive>`; a client dropped
        from the round keeps its old state).

        Under a chain that adds DP noise (:attr:`privatises`) the parameters the clients do not train
        (:func:`~lightning_fed.server.aggregators.dp.trained_parameters`, as of the round's start) and those the
        client halves keep local (FedPer's head, FedBN's norm layers, ...) are left out of the chain (not in the
        clipped norm, not noised), get Δ_t = 0 and keep x_t bit for bit
        (:func:`~lightning_fed.server.fit_checks.frozen_positions`).

        Raises:
            ValueError: under such a chain, no parameter trained; a client half whose ``finish`` returned a state of
                another size than its ``state_dim`` (naming the half, the client, the expected and the actual size).
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

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The fit-start checks before round 0, in order: a ready-made method's own chain kept
        (:func:`~lightning_fed.server.fit_checks.check_own_chain`), a federated trainer
        (:func:`~lightning_fed.server.fit_checks.check_federated_trainer`), under a chain that adds DP noise
        :func:`~lightning_fed.server.aggregators.dp.check_private_fit`, the stages' ``check_cohort``
        (:func:`~lightning_fed.server.fit_checks.check_cohort`) and ``check_fit`` (FedDyn's server half without its
        client half; FedNova's reducer with clients that do not run its declared local solver).

        Raises:
            RuntimeError: ``trainer`` is a plain :class:`lightning.Trainer` (use :class:`~lightning_fed.FederatedTrainer`).
            ValueError: a ready-made method's own chain replaced; what ``check_private_fit`` refuses (running
                statistics, ``max_update_norm_ratio``, no trained parameter); as a stage's ``check_cohort`` or
                ``check_fit``.
        """
        check_own_chain(type(self).__name__, self._own_aggregators, self.aggregators)
        check_federated_trainer(type(self).__name__, trainer)
        if self.privatises:
            self._trained = trained_parameters(list(pl_module.parameters()), trainer.optimizers)
            check_private_fit(self, trainer, pl_module, self._trained)
        check_cohort(self.composer.stage_hooks("check_cohort"), trainer.datamodule)
        for check_fit in self.composer.stage_hooks("check_fit"):
            check_fit(trainer, pl_module, self)

    # ------------------------------------------------------------------ state integrity (issue #43)
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
        return self._generate_state_key(lr=self.lr, weighting=self.weighting)

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
        return f"lr={self.lr}, weighting={self.weighting!r}"

    def _client_repr(self) -> str:
        return f", client={self.client!r}" if self.client else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()}{self._client_repr()})"

