"""One client's local work in a round, as the federated loop's executors see it.

:class:`ClientRunner` is to :class:`~lightning_fed.FederatedFitLoop` what Lightning's ``_AutomaticOptimization`` is
to its epoch loop: a part the loop owns and sets up at the start of each round, which does one thing — turn x_t and
a client's data into a :class:`~lightning_fed.ClientUpdate` (Reddi et al. 2021, Alg. 1, l. 4-9) — and which the
executors (sequential, vectorized, over DDP ranks) drive instead of the loop:

1. :meth:`ClientRunner.start_client` — the module gets x_t in place, the client optimizer(s) a fresh state, the
   callbacks ``on_client_start``, the run's client halves (:attr:`ClientRunner.client_halves`) the
   :class:`ClientContext` and their per-client state;
2. :meth:`ClientRunner.local_step` — one mini-batch through Lightning's optimization loop;
3. :meth:`ClientRunner.finish_client` — Δ_i = x_i − x_t and the client's extras into a ``ClientUpdate``
   (:meth:`ClientRunner.build_update` is the only place a ``ClientUpdate`` is made);
4. :meth:`ClientRunner.report_failure` / :meth:`ClientRunner.client_failed` — the failure policy
   (``on_client_failure``) applied in one place, and :meth:`ClientRunner.stop_if_all_failed_alike` — a round whose
   every client raised the same error at the same place stops the run (a deterministic error, not flaky clients),
   and :meth:`ClientRunner.stop_if_failed_repeatedly` — a client failing in each of its last n sampled rounds
   (:class:`ClientRecord`) stops it too.

Client halves (FedProx, SCAFFOLD, Fed-LAMB's client; :class:`~lightning_fed.client.algorithm.ClientHalves`) are
owned and called by the runner: ``start`` with the :class:`ClientContext` (x_t, the round's client learning rates,
never ``trainer.fit_loop``), ``before_optimizer_step`` at every local step (:class:`ClientAlgorithmSteps`),
``finish`` into the update's extras.

**The federated parameters.** What a run federates is F, the parameters the client optimizer updates
(:func:`federated_parameters`: ``requires_grad`` and held by a parameter group of one of ``trainer.optimizers``),
decided once at fit start (:meth:`ClientRunner.setup`). x_t, Δ_i, the client learning rates, the server optimizer's
state and the per-client tables cover F only; the other (frozen) parameters are shared by every client, never copied
or diffed per client, and a client that changes one anyway ends the run with :class:`FrozenParameterChangedError`.
"""


from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from lightning_fed import _lightning as pl_private
from lightning.pytorch.callbacks import Callback

from lightning_fed.client.algorithm import ClientHalves
from lightning_fed.tensor_reuse import DeltaBuffers
from lightning_fed.client.failures import (  # noqa: F401  (re-exported: lightning_fed.client.runner's API)
    DEFAULT_MAX_CONSECUTIVE_CLIENT_FAILURES,
    FAILURE_POLICIES,
    ClientFailure,
    ClientFailureHandling,
    ClientRecord,
    FrozenParameterChangedError,
    check_max_consecutive_client_failures,
    error_notes,
    failure_origin,
)
from lightning_fed.client.lean_step import LeanLocalStep, lean_step_blocker
from lightning_fed.client.update import ClientUpdate, parameter_client_lrs


def federated_parameters(module: torch.nn.Module, optimizers: Any = ()) -> list[int]:
    """The positions in ``module.parameters()`` of the federated parameters F: those with ``requires_grad`` that,
    when there are client optimizers, a parameter group of one of them holds (a plain tensor registered as a
    parameter counts as trained). The others are frozen: never copied, diffed, aggregated or stepped.

    Args:
        module: The model.
        optimizers: The client optimizers (``trainer.optimizers``; torch optimizers or Lightning's wrappers). None:
            every parameter with ``requires_grad`` is federated.

    Example: a frozen embedding and a trained head::

        >>> net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))
        >>> _ = net[0].weight.requires_grad_(False)
        >>> federated_parameters(net, [torch.optim.SGD(net[1].parameters(), lr=0.1)])
        [1, 2]
        >>> federated_parameters(net, [torch.optim.SGD([net[1].weight], lr=0.1)])  # the bias is in no group
        [1]
    """
    held = {id(p) for opt in optimizers for group in getattr(opt, "optimizer", opt).param_groups
            for p in group["params"]}
    return [i for i, p in enumerate(module.parameters())
            if (bool(p.requires_grad) or not isinstance(p, torch.nn.Parameter)) and (not held or id(p) in held)]


@dataclass(frozen=True)
class ClientContext:
    """What the server sends client ``client_id`` in round ``round_idx`` (pfl's ``central_context``).

    Attributes:
        client_id: The client's id in the partition.
        round_idx: The round t (0-based).
        global_params: x_t, one tensor per federated parameter (``params``, same order; read-only by convention):
            ``module.parameters()`` when every parameter is trained, else F only (:func:`federated_parameters`).
            Under :class:`~lightning_fed.communication.DownlinkCompression`: x̂_t, the decoded broadcast the
            client holds.
        global_buffers: The global model's buffers, one per entry of ``module.buffers()``.
        client_lr: γ, the client learning rate of the round (first optimizer's first parameter group; ``nan``
            without one).
        client_batches: ``client_batches()`` iterates over the client's local batches of the round again (the same
            batches, in the same order, as its local work; ``None`` outside the federated loop): for a client half
            that trains a personal model on the client's own data (Ditto, with
            :func:`~lightning_fed.client.personal.personal_step`).
        client_lrs: γ of each parameter's optimizer group in the round, aligned with ``global_params``
            (:func:`~lightning_fed.client.update.parameter_client_lrs`).
        params: The module's federated parameters themselves (the tensors the client trains in place), aligned with
            ``global_params``; empty in a context made outside the federated loop (then ``module.parameters()``).
        client_states: The run's per-client state, the client halves' rows (a ``ClientStates``; ``None`` outside).

    Example: made by :meth:`ClientRunner.context`; read-only::

        >>> import torch
        >>> context = ClientContext(client_id=3, round_idx=0, global_params=[torch.zeros(2)], global_buffers=[],
        ...                         client_lr=0.1)
        >>> context.client_lr, context.client_lrs
        (0.1, [])
        >>> context.client_lr = 1.0
        Traceback (most recent call last):
        ...
        dataclasses.FrozenInstanceError: cannot assign to field 'client_lr'
    """

    client_id: int
    round_idx: int
    global_params: list[Tensor]
    global_buffers: list[Tensor]
    client_lr: float
    client_lrs: list[float] = field(default_factory=list)
    client_batches: Optional[Any] = field(default=None, compare=False, repr=False)
    params: list[Tensor] = field(default_factory=list, compare=False, repr=False)
    client_states: Optional[Any] = field(default=None, compare=False, repr=False)

    def parameters(self, module: Any) -> list[Tensor]:
        """The tensors ``global_params`` is aligned with: :attr:`params`, or ``module.parameters()`` in a context
        made by hand (no ``params``)."""
        return list(self.params) if self.params else list(module.parameters())


class ClientRunner(ClientFailureHandling):
    """Starts, steps and finishes clients from the round's global model x_t; owned by the federated loop.

    The loop calls :meth:`setup` at the start of a run and :meth:`start_round` at the start of each round; the
    round's executor then uses :meth:`start_client`, :meth:`local_step`, :meth:`finish_client` (or
    :meth:`build_update` for clients trained outside the module, e.g. vectorized), :meth:`client_failed` /
    :meth:`report_failure` and :meth:`client_end`, and reads :attr:`global_params`, :attr:`round_client_lr`,
    :attr:`trainer`, :attr:`datamodule`, :attr:`server_optimizer`, :attr:`client_timeout_s`.

    Args:
        on_client_failure: ``"skip"`` (drop the client from the round with a warning; but when every client of a
            round raised the same exception type at the same place, stop the run: :meth:`stop_if_all_failed_alike`),
            ``"raise"`` (stop at the first failing client) or ``"skip_all"`` (always drop, never stop: for
            fault-injection studies where every client of a round may fail on purpose).
        client_timeout_s: The per-client time limit in seconds, or ``None`` (checked by the loop).
        max_consecutive_client_failures: Under ``"skip"``, a client failing in each of its last n sampled rounds
            stops the run (:meth:`stop_if_failed_repeatedly`; ``None``: 3;
            :func:`check_max_consecutive_client_failures`).

    The federated parameters F (:func:`federated_parameters`) are decided once, in :meth:`setup` (fit start), and
    shown at fit start (``"federating 270,336 of 19,349,504 parameters"``, when some are frozen): :attr:`params`,
    :attr:`global_params`, the clients' Δ_i and learning rates cover F only, in ``module.parameters()`` order. The
    frozen parameters (:attr:`frozen_params`) are not copied at the round's start, not restored before each client
    and not diffed after it; their version counters (``Tensor._version``, bumped by every in-place write through
    autograd's view of the tensor: optimizers, ``copy_``, ``add_``) and storages are compared before and after each
    client's local work, and a change raises :class:`FrozenParameterChangedError` naming the parameter (a write
    through ``.data`` bypasses that counter and is not seen). Buffers are snapshotted, restored and sent as before.

    Raises:
        ValueError: an unknown ``on_client_failure``; a bad ``max_consecutive_client_failures``.

    Example: after a one-round fit the runner still holds the round's x_t (here x_0 = 0) while the module holds
    x_1; with one client and one full-batch SGD step, x_1 = 0 − γ·2·mean(x(0·x − 2x)) = 0.1·2·15 = 3::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Line(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
        >>> data = TensorDataset(x, 2 * x)
        >>> def quiet_trainer(**kwargs):
        ...     return FederatedTrainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
        ...                             enable_checkpointing=False, accelerator="cpu", **kwargs)
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=1), clients_per_round=1, batch_size=4)
        >>> model, trainer = Line(), quiet_trainer(max_epochs=1)
        >>> trainer.fit(model, datamodule=dm)
        >>> runner = trainer.fit_loop.client_runner
        >>> runner.global_params, runner.round_client_lr, round(model.w.item(), 10)
        ([tensor([0.], dtype=torch.float64)], 0.1, 3.0)
        >>> ClientRunner(on_client_failure="retry")
        Traceback (most recent call last):
        ...
        ValueError: `on_client_failure` must be one of ('skip', 'raise', 'skip_all'), got 'retry'.
    """

    #: Returned by :meth:`local_step` when the module's ``on_train_batch_start`` returned -1.
    STOP = object()

    #: Whether :meth:`local_step` may use the lean step (:mod:`lightning_fed.client.lean_step`) when it does exactly
    #: what Lightning's optimization loop would; ``False`` always takes Lightning's loop (read at each round's start).
    allow_lean_step: bool = True

    def __init__(self, on_client_failure: str = "skip", client_timeout_s: Optional[float] = None,
                 max_consecutive_client_failures: Optional[int] = None) -> None:
        if on_client_failure not in FAILURE_POLICIES:
            raise ValueError(f"`on_client_failure` must be one of {FAILURE_POLICIES}, got {on_client_failure!r}.")
        self.on_client_failure = on_client_failure
        self.client_timeout_s = client_timeout_s
        #: n: under ``"skip"``, a client failing in each of its last n sampled rounds stops the run
        #: (:meth:`stop_if_failed_repeatedly`); ``None`` under the other policies.
        self.max_consecutive_client_failures = check_max_consecutive_client_failures(
            max_consecutive_client_failures, on_client_failure)
        self.client_record = ClientRecord()
        self.trainer: Any = None
        self.datamodule: Any = None
        self.server_optimizer: Any = None
        self.round_log: Any = None
        self.round_idx = -1
        self._epoch_loop: Any = None
        self._params: list[Tensor] = []
        self._federated: list[int] = []  # positions of F in module.parameters()
        self._frozen: list[tuple[str, Tensor]] = []  # (name, tensor) of the frozen parameters
        self._frozen_marks: list[tuple[int, int]] = []  # their (_version, data_ptr) at a client's start
        self._param_names: list[str] = []
        self._num_all_params = 0
        self._buffers: list[Tensor] = []
        self._global_params: list[Tensor] = []
        self._global_buffers: list[Tensor] = []
        self._optimizer_defaults: list[list[dict[str, Any]]] = []
        self._round_client_lrs: list[float] = []
        self._step_callbacks: list[Any] = []
        self._pass_batch_idx: Optional[bool] = None  # does training_step take batch_idx (inspected once)
        self._lean: Optional[LeanLocalStep] = None
        self._lean_blocker: Optional[str] = None
        self._client_context: Optional[ClientContext] = None  # the current client's, made once in start_client
        #: The run's client halves with their per-client ``states`` (:class:`~lightning_fed.client.algorithm.ClientHalves`).
        self.client_halves = ClientHalves()
        #: The run's :class:`~lightning_fed.communication.Compression` half (``None``: updates sent raw), at fit start.
        self.compression: Optional[Any] = None
        #: The run's :class:`~lightning_fed.communication.DownlinkCompression` half (``None``: x_t sent raw).
        self.downlink: Optional[Any] = None
        self._start_params: list[Tensor] = []  # x̂_t, what the clients start from (x_t itself without a downlink)
        self._deltas = DeltaBuffers()  # Δ_i's CPU storage, reused from round to round where nobody kept it

    # ------------------------------------------------------------------ set-up (the loop)
    def setup(
        self, trainer: Any, epoch_loop: Any, datamodule: Any, server_optimizer: Any, round_log: Any,
        step_callbacks: list[Any],
    ) -> None:
        """Bind the run's trainer parts (called by the loop at the start of a run)."""
        self.trainer = trainer
        self._epoch_loop = epoch_loop
        self.datamodule = datamodule
        self.server_optimizer = server_optimizer
        self.round_log = round_log
        self._step_callbacks = step_callbacks
        module = trainer.lightning_module
        named = list(module.named_parameters())
        self._federated = federated_parameters(module, trainer.optimizers)
        chosen = set(self._federated)
        self._params = [named[i][1] for i in self._federated]
        self._param_names = [named[i][0] for i in self._federated]
        self._frozen = [(n, p) for i, (n, p) in enumerate(named) if i not in chosen]
        self._num_all_params = len(named)
        self._buffers = list(module.buffers())
        if named and not self._params:
            raise ValueError(
                f"{type(module).__name__} has no federated parameter: each of its {len(named)} parameters has "
                "requires_grad=False or is in no optimizer of configure_optimizers, so the clients would train "
                "nothing. Unfreeze the parameters to train and hand them to the client optimizer."
            )
        if self._frozen:
            total = sum(p.numel() for _, p in named)
            rank_zero_info(f"federating {sum(p.numel() for p in self._params):,} of {total:,} parameters "
                           f"({len(self._params)} of {len(named)} tensors; frozen: requires_grad=False or in no "
                           "client optimizer)")
        # a resume: the checkpoint's federated parameters against these (before the halves' tables are checked)
        resolve = getattr(getattr(trainer, "_checkpoint_connector", None), "resolve_federated", None)
        if resolve is not None:
            resolve(server_optimizer, self._param_names, [n for n, _ in named], [p.numel() for _, p in named])
        self.client_halves.setup(server_optimizer, getattr(trainer, "client_algorithms", None),
                                 getattr(datamodule, "num_clients", None), module, self._params)
        from lightning_fed.communication.compression import find_compression  # (it imports the client package)

        self.compression = find_compression(self.client_halves.algorithms)  # (two refused here, at fit start)
        from lightning_fed.communication.downlink import find_downlink

        self.downlink = find_downlink(self.client_halves.algorithms, sum(p.numel() for p in self._params))
        for callback in trainer.callbacks:  # the halves' per-step call
            if isinstance(callback, ClientAlgorithmSteps):
                callback.halves = self.client_halves

    @property
    def params(self) -> list[Tensor]:
        """The module's federated parameters F (the tensors clients train in place), in ``module.parameters()``
        order: every parameter when none is frozen."""
        return self._params

    @property
    def param_names(self) -> list[str]:
        """The names (``module.named_parameters()``) of :attr:`params`."""
        return self._param_names

    @property
    def federated_positions(self) -> list[int]:
        """The positions of :attr:`params` in ``module.parameters()`` (:func:`federated_parameters`)."""
        return self._federated

    @property
    def frozen_params(self) -> list[tuple[str, Tensor]]:
        """``(name, tensor)`` of the parameters not federated (shared by every client, read-only)."""
        return list(self._frozen)

    @property
    def federates_everything(self) -> bool:
        """Whether every parameter of the module is federated (no frozen one)."""
        return not self._frozen

    @property
    def buffers(self) -> list[Tensor]:
        return self._buffers

    def start_round(self, round_idx: int) -> None:
        """Snapshot x_t (the federated parameters only), the global buffers and the client optimizers'
        hyper-parameters for round ``round_idx``."""
        self.restart_round(round_idx)
        self._deltas.new_round()
        self._optimizer_defaults = [
            [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            for opt in self.trainer.optimizers
        ]
        # a pure function of the round: computed once here, not per client (context and update both read it)
        lrs = [[g.get("lr", float("nan")) for g in defaults] for defaults in self._optimizer_defaults]
        self._round_client_lrs = parameter_client_lrs(
            self._params, [opt.param_groups for opt in self.trainer.optimizers], lrs
        )
        self._lean_blocker = (
            lean_step_blocker(self.trainer, self.datamodule, self._step_callbacks) if self.allow_lean_step
            else "allow_lean_step=False"
        )
        logged = self._lean.logged if self._lean is not None else None  # (the names the fast self.log handles)
        self._lean = (LeanLocalStep(self.trainer, self._epoch_loop, self.round_log, logged)
                      if self._lean_blocker is None else None)

    def restart_round(self, round_idx: int, params: Optional[list[Tensor]] = None,
                      buffers: Optional[list[Tensor]] = None) -> None:
        """Snapshot x_t and the global buffers again, now as round ``round_idx``, keeping the hyper-parameters and the
        local-step path :meth:`start_round` took (asynchronous training, issue #54: each client of a server step
        starts from its own model version, its dispatch index is its round; the rest is the server step's).
        ``params``/``buffers``: x_t and the buffers, aligned with :attr:`params`/:attr:`buffers`; given ``params``
        are used as they are, not copied (read-only for the round, as x_t always is: the clients start from it and
        nothing writes it); default: a copy of the module's own. The module gets them at :meth:`start_client`."""
        self.round_idx = round_idx
        with torch.no_grad():
            self._global_params = [p.detach().clone() for p in self._params] if params is None else list(params)
            self._global_buffers = [b.detach().clone() for b in (self._buffers if buffers is None else buffers)]
            self._start_params = (self._global_params if self.downlink is None
                                  else self.downlink.broadcast(self._global_params)[0])

    @property
    def step_path(self) -> str:
        """Which local step this round's clients take: ``"lean"`` (:class:`~lightning_fed.client.lean_step.
        LeanLocalStep`, exactly Lightning's arithmetic without its idle per-step machinery) or ``"lightning"``
        (Lightning's optimization loop; :attr:`lean_step_blocker` says why). Decided in :meth:`start_round`."""
        return "lean" if self._lean is not None else "lightning"

    @property
    def lean_step_blocker(self) -> Optional[str]:
        """Why this round takes Lightning's optimization loop (e.g. ``"the module overrides on_after_backward"``), or
        ``None`` on the lean path."""
        return self._lean_blocker

    def reset_to_global(self, client_start: bool = False) -> None:
        """The module's federated parameters back to x_t (``client_start``: to :attr:`client_start_params`, what a
        client starts from) and its buffers to the global ones; the client optimizers fresh (state cleared,
        hyper-parameters as at the round's start). Frozen parameters are not touched."""
        with torch.no_grad():
            torch._foreach_copy_(self._params, self._start_params if client_start else self._global_params)
            if self._buffers:
                for b, g in zip(self._buffers, self._global_buffers):
                    b.copy_(g)
        self._reset_optimizers()

    def _reset_optimizers(self) -> None:
        for opt, defaults in zip(self.trainer.optimizers, self._optimizer_defaults):
            opt.state.clear()
            for group, saved in zip(opt.param_groups, defaults):
                group.update(saved)

    # ------------------------------------------------------------------ what the server sends
    @property
    def global_params(self) -> list[Tensor]:
        """x_t: the global model's federated parameters at the start of the round (aligned with :attr:`params`)."""
        return self._global_params

    @property
    def client_start_params(self) -> list[Tensor]:
        """x̂_t: what the clients of the round start from and their Δ_i is taken against — x_t (the same list) unless
        a :class:`~lightning_fed.communication.DownlinkCompression` half decodes it from the encoded broadcast."""
        return self._start_params

    @property
    def global_buffers(self) -> list[Tensor]:
        """The global model's buffers at the start of the round (``module.buffers()`` order)."""
        return self._global_buffers

    @property
    def round_client_lr(self) -> float:
        """The client learning rate γ of the round (first optimizer's first parameter group; ``nan`` if none)."""
        if not self._optimizer_defaults or not self._optimizer_defaults[0]:
            return float("nan")
        return float(self._optimizer_defaults[0][0].get("lr", float("nan")))

    @property
    def round_client_lrs(self) -> list[float]:
        """γ of each federated parameter's optimizer group in the round, aligned with :attr:`params` (a copy of the
        list computed once in :meth:`start_round`)."""
        return list(self._round_client_lrs)

    def context(self, client_id: int) -> ClientContext:
        """The :class:`ClientContext` of client ``client_id`` in this round."""
        return ClientContext(
            client_id=int(client_id), round_idx=self.round_idx, global_params=self._start_params,
            global_buffers=self._global_buffers, client_lr=self.round_client_lr, client_lrs=self.round_client_lrs,
            client_batches=lambda: self.datamodule.client_dataloader(int(client_id), self.round_idx),
            params=self._params, client_states=self.client_halves.states,
        )

    # ------------------------------------------------------------------ one client
    def start_client(self, client_id: int) -> None:
        """Load x_t into the module in place, give the client fresh optimizer(s), run ``on_client_start`` and the
        server optimizer's ``configure_client`` (with the :class:`ClientContext` as ``context``; the same object
        is passed at the client's end, to ``collect_client_extras`` and the client halves' ``finish``)."""
        self.reset_to_global(client_start=True)
        trainer = self.trainer
        self.call_client_hook("on_client_start", client_id, self.round_idx)
        module = trainer.lightning_module
        context = self._client_context = self.context(client_id)
        self.server_optimizer.configure_client(trainer, module, client_id, self.round_idx, context=context)
        self.client_halves.start(module, context)
        self._frozen_marks = self.frozen_marks()
        results = pl_private.results(trainer)
        self.round_log.start_client(results)
        if self._lean is not None:
            self._lean.start_client(results)

    def local_step(self, batch: Any, batch_idx: int) -> Any:
        """One local mini-batch through Lightning's optimization loop (hooks, precision, clipping, logging); returns
        ``training_step``'s output, or :attr:`STOP` when ``on_train_batch_start`` returned -1 (the lean step where
        :attr:`step_path` is ``"lean"``: the same weights and logged values)."""
        if self._lean is not None:
            if self._pass_batch_idx is None:
                self._pass_batch_idx = pl_private.training_step_takes_batch_idx(self._epoch_loop, batch, batch_idx)
            return self._lean.step(batch, batch_idx, self._pass_batch_idx)
        trainer = self.trainer
        module = trainer.lightning_module
        epoch_loop = self._epoch_loop
        batch = trainer.precision_plugin.convert_input(batch)
        batch = pl_private.before_batch_transfer(module, batch)
        batch = pl_private.call_strategy_hook(trainer, "batch_to_device", batch, dataloader_idx=0)
        pl_private.log_batch_start(trainer, batch)
        if isinstance(batch, Mapping):  # e.g. a Hugging Face batch: its size is the first tensor's length
            size = next((v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.ndim > 0), None)
            pl_private.set_logged_batch_size(trainer, size)
        self._call_step_callbacks("on_train_batch_start", batch, batch_idx)
        response = pl_private.call_module_hook(trainer, "on_train_batch_start", batch, batch_idx)
        pl_private.call_strategy_hook(trainer, "on_train_batch_start", batch, batch_idx)
        if response == -1:
            pl_private.log_batch_end(trainer)
            return self.STOP
        kwargs = OrderedDict(batch=batch)
        if self._pass_batch_idx is None:
            self._pass_batch_idx = pl_private.training_step_takes_batch_idx(epoch_loop, batch, batch_idx)
        if self._pass_batch_idx:
            kwargs["batch_idx"] = batch_idx
        if module.automatic_optimization:
            output = pl_private.run_automatic_optimization(epoch_loop, trainer.optimizers[0], batch_idx, kwargs)
        else:
            output = pl_private.run_manual_optimization(epoch_loop, kwargs)
        self._call_step_callbacks("on_train_batch_end", output, batch, batch_idx)
        pl_private.call_module_hook(trainer, "on_train_batch_end", output, batch, batch_idx)
        pl_private.log_batch_end(trainer)
        self.round_log.after_step(pl_private.results(trainer))
        return output

    def _call_step_callbacks(self, name: str, *args: Any) -> None:
        """A batch hook of the callbacks that follow local steps (as Lightning's ``_call_callback_hooks``)."""
        trainer = self.trainer
        module = trainer.lightning_module
        with pl_private.hook_name(module, name):
            for callback in self._step_callbacks:
                with trainer.profiler.profile(f"[Callback]{callback.state_key}.{name}"):
                    getattr(callback, name)(trainer, module, *args)

    def finish_client(
        self, client_id: int, num_steps: int, loss: float, loss_steps: Optional[int] = None
    ) -> ClientUpdate:
        """Package the module's current weights as client ``client_id``'s :class:`ClientUpdate` (``loss``: the mean
        over the ``loss_steps`` local steps that returned a loss; default all ``num_steps``), with the server
        optimizer's ``collect_client_extras``."""
        trainer = self.trainer
        module = trainer.lightning_module
        if self._lean is not None:
            self._lean.finish_client()
        self.round_log.finish_client(client_id, pl_private.results(trainer))
        self.check_frozen(self._frozen_marks, f"client {client_id}")
        context, self._client_context = self._client_context, None
        if context is None or context.client_id != int(client_id) or context.round_idx != self.round_idx:
            context = self.context(client_id)  # (a client finished without start_client)
        extras = self.client_halves.finish(module, context)
        extras.update(self.server_optimizer.collect_client_extras(trainer, module, client_id, self.round_idx,
                                                                  context=context))
        with torch.no_grad():
            delta = self._deltas.delta(self._params, self._start_params)  # x_i − x̂_t (x̂_t = x_t: no downlink)
            buffers = [b.detach().clone() for b in self._buffers]
        return self.build_update(client_id, delta, num_steps, loss, loss_steps, buffers, extras)

    def frozen_marks(self) -> list[tuple[int, int]]:
        """``(version counter, storage address)`` of each frozen parameter, for :meth:`check_frozen`."""
        return [(p._version, p.data_ptr()) for _, p in self._frozen]

    def check_frozen(self, marks: list[tuple[int, int]], who: str) -> None:
        """Raise when a frozen parameter was written in place (or given another storage) since ``marks`` were taken
        (:meth:`frozen_marks`; no cost beyond reading two integers a parameter).

        Raises:
            FrozenParameterChangedError: naming the parameters, ``who`` (e.g. ``"client 3"``) and the round.
        """
        changed = [name for (name, p), (version, ptr) in zip(self._frozen, marks)
                   if p._version != version or p.data_ptr() != ptr]
        if changed:
            raise FrozenParameterChangedError(
                f"Round {self.round_idx}: {who} changed the frozen parameter(s) {', '.join(repr(n) for n in changed)}, "
                "which are not federated (requires_grad=False or in no client optimizer at fit start): their change "
                "would be neither averaged nor undone. Train them with the client optimizer (requires_grad=True and "
                "in configure_optimizers' parameter groups from the start of fit), or leave them unchanged."
            )

    def build_update(
        self,
        client_id: int,
        delta: list[Tensor],
        num_steps: int,
        loss: float,
        loss_steps: Optional[int] = None,
        buffers: Optional[list[Tensor]] = None,
        extras: Optional[dict[str, Any]] = None,
    ) -> ClientUpdate:
        """The one place a :class:`ClientUpdate` is made: Δ_i and the client's results, with |D_i| from the data
        module and the round's client learning rates.

        Args:
            client_id: The client.
            delta: Δ_i = x_i − x_t, one tensor per federated parameter (aligned with :attr:`params`).
            num_steps: Local optimizer steps taken.
            loss: Mean local loss over the ``loss_steps`` steps that returned one (``nan`` if none).
            loss_steps: Default ``num_steps``.
            buffers: The client's final buffers (default: copies of the global buffers, which local work did not
                change).
            extras: What the client sends the server besides Δ_i (default none).

        With a :class:`~lightning_fed.communication.Compression` half, Δ_i is encoded here (after every client
        half's ``finish``): the update holds the decoded Δ̂_i and its encoded size (``delta_bytes``).
        """
        if buffers is None:
            buffers = [b.detach().clone() for b in self._global_buffers]
        extras, delta_bytes = {} if extras is None else extras, None
        if self.compression is not None:  # Δ_i is final here: the server receives the decoded Δ̂_i
            delta, extras, delta_bytes = self.compression.encode_update(self, client_id, delta, extras)
        return ClientUpdate(
            client_id=int(client_id),
            delta=delta,
            num_samples=self.datamodule.client_num_samples(client_id),
            num_steps=num_steps,
            loss=loss,
            loss_steps=num_steps if loss_steps is None else int(loss_steps),
            client_lr=self.round_client_lr,
            buffers=buffers,
            extras=extras,
            client_lrs=self.round_client_lrs,
            delta_bytes=delta_bytes,
        )

    def count_optimizer_steps(self, steps: int) -> None:
        """Advance ``trainer.global_step`` by ``steps`` client optimizer steps taken outside Lightning's loop."""
        pl_private.count_optimizer_steps(self._epoch_loop, steps)

    # ------------------------------------------------------------------ hooks
    def call_client_hook(self, name: str, *args: Any) -> None:
        """Call ``name(trainer, pl_module, *args)`` on every callback that defines it (federated hooks:
        ``on_client_start(client_id, round_idx)``, ``on_client_end(update, position)``)."""
        trainer = self.trainer
        for callback in trainer.callbacks:
            hook = getattr(callback, name, None)
            if callable(hook):
                hook(trainer, trainer.lightning_module, *args)
            elif name == "on_client_end" and isinstance(callback, ProgressBar):
                # a user's TQDMProgressBar / RichProgressBar counts clients: the bar's 'batch' is a client
                callback.on_train_batch_end(trainer, trainer.lightning_module, None, None, args[1])

    def client_end(self, update: ClientUpdate, position: int) -> None:
        """Client ``update.client_id`` (the ``position``-th of this process's clients, from 0) reported back."""
        self.call_client_hook("on_client_end", update, position)


class ClientAlgorithmSteps(Callback):
    """The per-step call of the run's client halves: ``on_before_optimizer_step`` runs the client runner's
    :meth:`ClientHalves.before_optimizer_step <lightning_fed.client.algorithm.ClientHalves.before_optimizer_step>`
    (after the backward pass, before gradient clipping and the client optimizer's step, as Lightning orders them).

    :class:`~lightning_fed.FederatedTrainer` installs it right after the server optimizer among the callbacks, so the
    halves' gradient changes run where they ran when the server optimizer dispatched them (results bit for bit). It
    keeps no state; without client halves the lean step and the vectorized executor skip it
    (:func:`~lightning_fed.client.algorithm.dispatch_only`).

    Example::

        >>> ClientAlgorithmSteps().client_algorithms  # outside a federated fit: none
        []
    """

    def __init__(self) -> None:
        #: The client runner's halves (bound by :meth:`ClientRunner.setup`; ``None`` outside a federated fit).
        self.halves: Optional[ClientHalves] = None

    @property
    def client_algorithms(self) -> list[Any]:
        """The client halves the run's client runner calls (``[]`` outside a federated fit)."""
        return list(self.halves.algorithms) if self.halves is not None else []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.halves is not None:
            self.halves.before_optimizer_step(pl_module, optimizer)

    on_before_optimizer_step.client_dispatch = True  # type: ignore[attr-defined]  # see client.algorithm.dispatch_only
