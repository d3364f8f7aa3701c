"""The federated fit loop: one Lightning epoch is one communication round."""

from __future__ import annotations

import copy
import dataclasses
import math
import signal
import time
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import ProgressBar, Timer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed import _lightning as pl_private
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client.runner import FAILURE_POLICIES, ClientRecord, ClientRunner
from lightning_fed.server.checks import find_server_optimizer  # noqa: F401  (re-exported: lightning_fed.loop's API)
from lightning_fed.asynchronous.loop_mode import start_async_mode
from lightning_fed.client.sequential import ClientExecutor, SequentialExecutor
from lightning_fed.client.update import ClientUpdate, DeltaNorms, finite_updates
from lightning_fed.clock_tensorboard import log_against_simulated_time
from lightning_fed.communication.bytes import CommunicationLedger, planned_bytes
from lightning_fed.round_logging import RoundLogAccumulator
from lightning_fed.trainer_args import check_trainer_arguments
from lightning_fed.guards import (
    check_max_consecutive_restores,
    check_max_update_norm_ratio,
    check_on_nonfinite_server_step,
    describe_nonfinite,
    nonfinite_values,
    norm_outliers,
    update_norm,
    warn_if_guard_inactive,
)
from lightning_fed.migrations import state_items
from lightning_fed.interrupts import DeferSigterm, RoundInterrupted, StopSignals, check_client_timeout
from lightning_fed.loop_report import ROUND_METRICS, RoundReporting  # noqa: F401  (ROUND_METRICS re-exported)
from lightning_fed.loop_stop import StopSignalHandling

_FAILURE_POLICIES = FAILURE_POLICIES


class FederatedFitLoop(RoundReporting, StopSignalHandling, pl_private.FitLoop):
    """Replaces ``trainer.fit_loop``: each epoch is a communication round (Reddi et al. 2021, Alg. 1).

    Round t:

    1. the cohort S_t = ``datamodule.sample_clients(t)`` (l. 3);
    2. the :class:`~lightning_fed.client.sequential.ClientExecutor` trains every client from x_t with the module's
       ``training_step`` and ``configure_optimizers`` (l. 4-9) through the loop's
       :class:`~lightning_fed.client.runner.ClientRunner` (:attr:`client_runner`) and returns the round's
       :class:`ClientUpdate` s and failures;
    3. the server optimizer callback aggregates them into Δ_t and writes x_{t+1} into the module's federated
       parameters (l. 10-11; the parameters the client optimizer updates, decided at fit start: frozen ones are
       never copied, aggregated or written, see :class:`~lightning_fed.client.runner.ClientRunner`);
       floating-point buffers (e.g. BatchNorm statistics) become the clients' weighted average, integer
       buffers (e.g. ``num_batches_tracked``) their maximum — never through the server optimizer; under a server
       optimizer that adds DP noise (``ServerOptimizer.privatises``) every buffer keeps its global value;
    4. the per-round metrics ``round_train_loss`` (sample-weighted mean of the clients' mean local losses),
       ``round_pseudo_grad_norm`` (‖Δ_t‖₂), ``round_gradient_diversity`` (√(Σλ_i‖g_i‖²/‖Σλ_i g_i‖²), see
       :meth:`ServerOptimizer.gradient_diversity`), ``round_time_s`` (wall time) and ``round_local_steps`` are
       logged with the round as the step, then the global model is validated every
       ``check_val_every_n_epoch`` rounds, then the ``on_train_epoch_end`` hooks run (checkpoints), then
       epoch-interval LR schedulers step (a client learning-rate schedule by round).

    The client optimizer is the one Lightning built from ``configure_optimizers``; before each client its state
    is cleared and its hyper-parameters (learning rate included) reset to their start-of-round values, which is
    what a freshly built optimizer would be (cross-device: no client state survives a round).

    Failing clients: a client whose local training raises, or whose update is non-finite (NaN/Inf loss, delta
    or buffer), is dropped from the round's aggregate with a warning (``on_client_failure="skip"``, the default)
    or stops training (``"raise"``). Under ``"skip"``, a round in which every client (one or more) raised the same
    exception type at the same place stops the run at that round with a ``RuntimeError`` raised from the first
    client's exception (a deterministic error — a bug — would otherwise fail every round and end the run only
    after ``max_epochs`` rounds; :meth:`~lightning_fed.client.runner.ClientRunner.stop_if_all_failed_alike`);
    ``"skip_all"`` drops them and goes on (fault-injection studies). Under ``"skip"``, a client that failed in each
    of its last ``max_consecutive_client_failures`` (3) sampled rounds stops the run too, naming it and its error
    (:meth:`~lightning_fed.client.runner.ClientRunner.stop_if_failed_repeatedly`); the end of fit warns with the
    sampled clients that never trained. A run in which no client ever reported back
    ends with a ``RuntimeError`` saying why, round counts by reason (empty cohorts, e.g. Poisson cohorts with a
    small rate; every sampled client dropped out; clients failed; too few for the aggregator). Dropped clients are
    counted in ``round_clients_dropped``; a round in which no client reports back leaves the global model and the server optimizer's state unchanged. So does a round
    whose K reporting clients are too few for the server optimizer's aggregator chain (e.g. Krum needs
    K > 2f + 2; :meth:`ServerOptimizer.aggregation_requirement`): it is skipped with a warning naming the round, K
    and the requirement, its K reports are counted in ``round_clients_dropped`` (``round_clients`` is 0, as in a
    round where nobody reported), and the run goes on. Clients removed by the data module's simulated dropout are
    counted in ``round_clients_unavailable``.

    Hung clients: with ``client_timeout_s`` a client whose local work (from loading x_t to packaging its update)
    runs longer is interrupted and dropped like a failing client (see :class:`~lightning_fed.interrupts.
    ClientTimeLimit`: a ``SIGALRM`` timer in the main thread, else a check between local steps). Absurd updates:
    with ``max_update_norm_ratio`` = k, after the finite check a client whose ‖Δ_i‖₂ exceeds k times the median
    of the round's (finite) update norms is dropped like a failing client
    (:func:`~lightning_fed.guards.norm_outliers`; it needs at least three reporting clients to single one out, and
    warns once at fit start when ``clients_per_round`` makes it a no-op: :func:`~lightning_fed.guards.
    warn_if_guard_inactive`).

    Non-finite server steps: after every server step the global model x_{t+1} (parameters and floating buffers) and
    the server optimizer's state (:func:`~lightning_fed.migrations.state_items`: the rule's state, e.g. FedAdam's
    ``exp_avg``/``exp_avg_sq``, the aggregator chain's, and the per-client-table rows of the round's clients) are
    checked for NaN/±inf, in one host sync a round. With ``on_nonfinite_server_step="raise"`` (the default) a non-finite value stops the run
    with a ``RuntimeError`` naming the round and the tensors (e.g. ``FedAdam state 'state.exp_avg_sq' for parameter
    'net.0.weight' has 1 non-finite value(s) (of 40)``); with ``"restore"`` the global model x_t and the server
    optimizer's state from before the step are restored (:meth:`ServerOptimizer.restore_state`; a copy of that state
    is taken before every server step), with a warning naming the round and the tensors, and the round counts as one
    in which no client reported (its reports are counted in ``round_clients_dropped``); the
    ``max_consecutive_restores``-th (3) such round in a row stops the run with a ``RuntimeError`` naming the tensors,
    and the end-of-run message counts restored rounds apart. A checkpoint is checked
    when loaded: see :class:`~lightning_fed.checkpoint.FederatedCheckpointConnector`.

    Stop signals: while the cohort trains, SIGTERM and SIGINT stop the round at once (a client hung in
    ``time.sleep`` included): the round's local work is discarded, the module gets back the global model x_t and
    the loop's progress goes back to the end of the previous round (the server optimizer has not been touched:
    aggregation had not happened), a checkpoint is written (:attr:`stop_checkpoint_path`: by default in the run's
    own ``version_N/checkpoints/``), the message says how to resume (:meth:`resume_hint`) and the run ends with
    :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException` (SIGTERM; exit status 1 in a script) or
    ``KeyboardInterrupt`` (SIGINT; Lightning exits with status 1). ``trainer.fit(..., ckpt_path=that path)``
    resumes exactly (same weights as an uninterrupted run). A SIGTERM that arrives after the round's aggregation
    stops the run at the round's end, after validation (central validation is held back until it is done, see
    :class:`~lightning_fed.interrupts.DeferSigterm`; federated evaluation is cut short and its round keeps no
    ``fed_*`` values) and the round's callbacks, with the same checkpoint of the
    state between rounds and ``SIGTERMException`` (exit status 1). A SIGINT outside the cohort's training is
    Lightning's ``KeyboardInterrupt`` (exit status 1, no checkpoint written). Under several processes
    (``strategy="ddp"``) rounds are not stopped early and validation is not deferred (a rank leaving a round alone
    would leave the others waiting in a collective); Lightning's SIGTERM handling applies, and the round-end stop
    writes no extra checkpoint.

    Lightning's ``max_epochs`` counts rounds, ``log_every_n_steps`` counts rounds, ``global_step`` counts client
    optimizer steps. Learning-rate schedulers must use ``interval="epoch"`` (per round); gradient accumulation is
    not supported.

    Args:
        trainer: The trainer whose ``fit_loop`` this replaces.
        min_epochs: Minimum number of rounds.
        max_epochs: Maximum number of rounds.
        executor: How clients are trained (default :class:`SequentialExecutor`).
        on_client_failure: ``"skip"`` (default), ``"raise"`` or ``"skip_all"``.
        client_timeout_s: Wall-clock limit of one client's local work in seconds, ``None`` (default) for none.
        max_update_norm_ratio: k > 1 for the update-norm guard, ``None`` (default) for none.
        on_nonfinite_server_step: ``"raise"`` (default) or ``"restore"`` (see "Non-finite server steps").
        max_consecutive_restores: Under ``"restore"``, the undone rounds in a row that stop the run (``None``: 3).
        max_consecutive_client_failures: Under ``on_client_failure="skip"``, the failing sampled rounds in a row of
            one client that stop the run (``None``: 3; see "Failing clients").

    Raises:
        ValueError: an unknown ``on_client_failure`` or ``on_nonfinite_server_step``; a ``client_timeout_s`` that is
            not ``None`` or a finite number > 0; a ``max_update_norm_ratio`` that is not ``None`` or a finite
            number > 1; (when the run starts) a ``client_timeout_s`` with an executor that does not support it.
        RuntimeError: (in a round) a server step that made the global model or the server optimizer's state
            non-finite, under ``on_nonfinite_server_step="raise"`` (under ``"restore"``: the
            ``max_consecutive_restores``-th in a row); a client that failed in each of its last
            ``max_consecutive_client_failures`` sampled rounds (``"skip"``).
        ValueError: (when the run starts) a module with ``BatchNorm1d`` layers in training mode whose clients' local
            batches can hold a single sample (:func:`check_single_sample_batchnorm`).

    Example: :class:`~lightning_fed.FederatedTrainer` installs it; ``max_epochs`` is the number of rounds::

        >>> from lightning_fed import FederatedTrainer
        >>> trainer = FederatedTrainer(max_epochs=3, logger=False, enable_progress_bar=False, accelerator="cpu")
        >>> isinstance(trainer.fit_loop, FederatedFitLoop), trainer.fit_loop.max_epochs, trainer.max_epochs
        (True, 3, 3)
        >>> type(trainer.fit_loop.executor).__name__, trainer.fit_loop.client_runner.on_client_failure
        ('SequentialExecutor', 'skip')
    """

    #: Returned by :meth:`ClientRunner.local_step` when the module's ``on_train_batch_start`` returned -1.
    STOP = ClientRunner.STOP

    def __init__(
        self,
        trainer: Any,
        min_epochs: Optional[int] = 0,
        max_epochs: Optional[int] = None,
        executor: Optional[ClientExecutor] = None,
        on_client_failure: str = "skip",
        client_timeout_s: Optional[float] = None,
        max_update_norm_ratio: Optional[float] = None,
        on_nonfinite_server_step: str = "raise",
        max_consecutive_restores: Optional[int] = None,
        max_consecutive_client_failures: Optional[int] = None,
    ) -> None:
        super().__init__(trainer, min_epochs=min_epochs, max_epochs=max_epochs)
        #: Starts, steps and finishes clients from x_t; what the executor works through (it never sees the loop).
        self.client_runner = ClientRunner(on_client_failure, check_client_timeout(client_timeout_s),
                                          max_consecutive_client_failures)
        self.max_update_norm_ratio = check_max_update_norm_ratio(max_update_norm_ratio)
        #: ``"raise"`` or ``"restore"``: what a server step that makes x_{t+1} or the server state non-finite does.
        self.on_nonfinite_server_step = check_on_nonfinite_server_step(on_nonfinite_server_step)
        #: Under ``"restore"``: the most rounds in a row whose server step is undone before the run stops (else None).
        self.max_consecutive_restores = check_max_consecutive_restores(max_consecutive_restores,
                                                                       self.on_nonfinite_server_step)
        self._restored_in_a_row: list[tuple[int, str]] = []  # (round, what went non-finite) of the current run
        self._rounds_restored = 0
        self._param_names: list[str] = []
        self._model_items: list[tuple[str, Tensor]] = []  # (label, tensor) of x's parameters and floating buffers
        self._round_start_state: dict[str, Any] = {}
        #: (client id, reason) of the clients dropped from the current round.
        self.round_failures: list[tuple[int, str]] = []
        self.executor = executor if executor is not None else SequentialExecutor()
        self.server_optimizer: Optional[ServerOptimizer] = None
        self.round_metrics: dict[str, float] = {}
        self._params: list[Tensor] = []
        self._buffers: list[Tensor] = []
        self._partition_logged = False
        self._round_log = RoundLogAccumulator()
        #: The run's bytes down and up, exact (:mod:`lightning_fed.communication.bytes`; logged as ``round_bytes_*``,
        #: ``total_bytes_*``).
        self.communication = CommunicationLedger()
        self._rounds_run = 0
        self._rounds_with_updates = 0
        #: Rounds without an update, by why: "empty" (no client sampled), "unavailable" (every sampled client
        #: dropped out), "failed" (every client failed or was dropped), "too_few" (too few for the aggregator).
        self._rounds_without_updates: dict[str, int] = {}
        #: True while a round's clients train (the module holds a local model): FederatedTrainer.save_checkpoint refuses.
        self.in_round = False
        #: Round metrics already registered with the same arguments are added to Lightning's result metric directly
        #: (what ``LightningModule.log`` would do, without its per-call checks: about 0.3 ms per metric and round);
        #: False sends every round metric through ``LightningModule.log`` (for comparisons).
        self.fast_round_logging = True
        self._async: Any = None  # the asynchronous mode (lightning_fed.asynchronous.loop_mode), set at fit start

    # ------------------------------------------------------------------ data
    @property
    def datamodule(self) -> Any:
        """The trainer's :class:`~lightning_fed.datamodules.FederatedDataModule`.

        Raises:
            TypeError: the trainer has no federated data module.
        """
        dm = self.trainer.datamodule
        if dm is None or not all(hasattr(dm, a) for a in ("sample_clients", "client_dataloader", "seed")):
            raise TypeError(
                "Federated training needs a FederatedDataModule: call "
                "`trainer.fit(model, datamodule=FederatedDataModule(...))`."
            )
        return dm

    def setup_data(self) -> None:
        """No global train loader: a round is ``clients_per_round`` clients (the progress bar's 'batches')."""
        dm = self.datamodule
        self.max_batches = dm.clients_per_round
        self.trainer.val_check_batch = self.max_batches

    # ------------------------------------------------------------------ run
    @property
    def skip(self) -> bool:
        """Only a finished run is skipped: ``limit_train_batches=0`` reaches the argument check and is refused."""
        return self.done

    def on_run_start(self) -> None:
        trainer = self.trainer
        self.server_optimizer = find_server_optimizer(trainer.callbacks)
        self.datamodule.local_batch_limit = check_trainer_arguments(trainer)
        for config in trainer.lr_scheduler_configs:
            if config.interval != "epoch":
                raise ValueError(
                    f"LR scheduler {type(config.scheduler).__name__} has interval={config.interval!r}; federated "
                    "training supports interval='epoch' only (one epoch = one round: a client learning-rate "
                    "schedule by round)."
                )
        module = trainer.lightning_module
        if trainer.strategy.model is not module and isinstance(trainer.strategy.model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError(
                "The module is wrapped in DistributedDataParallel, which would average gradients across ranks "
                "training different clients; use FederatedTrainer(strategy='ddp') (FederatedDDPStrategy)."
            )
        if self.client_timeout_s is not None and not getattr(self.executor, "supports_client_timeout", False):
            raise ValueError(
                f"`client_timeout_s` is set but the client executor {type(self.executor).__name__} does not support "
                "a per-client time limit (SequentialExecutor and VectorizedExecutor do)."
            )
        # Callbacks whose batch hooks run at every local step (not progress bars and timers: they follow rounds).
        step_callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, (ProgressBar, Timer))]
        runner = self.client_runner
        runner.setup(trainer, self.epoch_loop, self.datamodule, self.server_optimizer, self._round_log, step_callbacks)
        self._params, self._buffers = runner.params, runner.buffers  # the federated parameters F, the buffers
        self._param_names = runner.param_names
        self._model_items = [(f"global model parameter {n!r}", p) for n, p in zip(self._param_names, self._params)]
        self._model_items += [(f"global model buffer {n!r}", b) for (n, _), b in zip(module.named_buffers(), self._buffers)
                              if b.is_floating_point()]
        check_local_work = getattr(self.datamodule, "check_local_work", None)
        if check_local_work is not None:
            check_local_work()
        check_single_sample_batchnorm(module, self.datamodule)
        self._rounds_run = self._rounds_with_updates = 0
        #: The round this process started at (> 0 when resumed from a checkpoint): ``run_summary`` counts the rounds
        #: this process trained apart from the run's total.
        self.first_round = int(self.trainer.current_epoch)
        self._rounds_without_updates = {}
        self._restored_in_a_row, self._rounds_restored = [], 0
        runner.client_record = ClientRecord()
        warn_if_guard_inactive(self.max_update_norm_ratio, self.datamodule.clients_per_round)
        self._log_partition()
        self._async = start_async_mode(self)  # asynchronous training (issue #54): None when off
        super().on_run_start()

    def on_save_checkpoint(self) -> dict:
        """Lightning's fit-loop state and the run's byte totals (``"communication"``)."""
        return {**super().on_save_checkpoint(), "communication": self.communication.state_dict()}

    def on_load_checkpoint(self, state_dict: dict) -> None:
        self.communication.load_state_dict(state_dict.get("communication", {}))  # (none before issue #56: 0)
        super().on_load_checkpoint(state_dict)

    def on_run_end(self) -> Any:
        """Raises ``RuntimeError`` when rounds ran but no client ever reported back (the model is untrained), saying
        why: no client sampled (empty cohorts, e.g. ``cohort_sampling="poisson"`` with a small rate), every sampled
        client dropped out, clients failed or were dropped, or too few reported for the aggregator."""
        output = super().on_run_end()
        self._warn_end_of_fit()
        if self._rounds_run > 0 and self._rounds_with_updates == 0:
            raise RuntimeError(self._no_update_message())
        return output

    def on_advance_start(self) -> None:
        trainer = self.trainer
        if self.restarted_mid_epoch or self.restarted_on_epoch_end:
            raise RuntimeError(
                "This checkpoint was saved in the middle of a round; federated training resumes only from "
                "checkpoints saved at the end of a round (ModelCheckpoint's default)."
            )
        if not self.restarted_on_epoch_start:
            self.epoch_progress.increment_ready()
        pl_private.call_callback_hooks(trainer, "on_train_epoch_start")
        pl_private.call_module_hook(trainer, "on_train_epoch_start")
        self.epoch_progress.increment_started()

    def advance(self) -> None:
        """Runs one communication round: select the cohort, run its clients, filter their updates, the server step,
        the round's report."""
        rnd = _Round(self.trainer.current_epoch, time.perf_counter())
        # asynchronous training: the epoch is one server step instead (lightning_fed.asynchronous.loop_mode)
        run = self._synchronous_round if self._async is None else self._async.advance
        run(rnd)
        self._report_round(rnd)

    def _synchronous_round(self, rnd: "_Round") -> None:
        """A synchronous round up to its report: select the cohort, run its clients, filter their updates, the
        server step."""
        self._start_round(rnd)
        self._run_clients(rnd)
        self._filter_updates(rnd)
        self._server_step(rnd)

    def _start_round(self, rnd: "_Round") -> None:
        """The round's cohort (``rnd.selection``); the client runner, the round log and the failures reset."""
        pl_private.set_batches_that_stepped(self.epoch_loop, rnd.idx)
        self.client_runner.start_round(rnd.idx)
        rnd.selection = self.datamodule.select_cohort(rnd.idx)
        timing = getattr(self.datamodule, "simulated_time", None)  # the simulated clock (issue #53), when on
        if timing is not None and timing.active:
            # bytes each way as they travel: the broadcast, and Δ_i as the run's compressor encodes it (issue #56)
            download, upload = planned_bytes(self.client_runner)
            rnd.selection, rnd.plan = timing.start_round(self.datamodule, rnd.selection, rnd.idx, download, upload)
        self.round_failures = []
        self._round_log.start_round()
        self._round_start_state = copy.deepcopy(self.epoch_loop.state_dict())

    def _run_clients(self, rnd: "_Round") -> None:
        """The executor runs the cohort (a stop signal ends the run at once); ``rnd.updates`` and the failures."""
        trainer, runner = self.trainer, self.client_runner
        single = trainer.world_size == 1
        self.in_round = True
        try:
            with StopSignals(enabled=single):
                if single and trainer.received_sigterm:  # arrived between the previous round's end and here
                    raise RoundInterrupted(signal.SIGTERM)
                with trainer.profiler.profile("run_federated_round"):
                    result = self.executor.run_round(runner, rnd.selection.cohort, rnd.idx)
        except RoundInterrupted as interrupt:
            self._stop_round(rnd.idx, interrupt.signum)
        rnd.updates, failures = _round_result(self.executor, result)
        self.communication.record(runner, rnd.selection.cohort, rnd.updates)  # every report, before any is dropped
        runner.stop_if_all_failed_alike(len(rnd.updates), failures, rnd.idx)  # a deterministic error: stop now
        for failure in failures:
            if getattr(failure, "error", None) is not None:
                failure.error = None  # the exception holds the client's frames (its batch, its local model)
        self.round_failures = list(failures)
        rnd.num_failures = len(failures)

    def _filter_updates(self, rnd: "_Round") -> None:
        """Drop non-finite updates and norm outliers (recorded as failures), record each sampled client's round, and
        skip the round when too few reported for the aggregator (e.g. Krum's K > 2f + 2: its K reports counted as
        dropped)."""
        runner, updates = self.client_runner, rnd.updates
        updates = [u for u, finite in zip(updates, self._finite_updates(updates, rnd.delta_norms))
                   if self._keep_finite(u, finite)]
        outliers: set[int] = set()
        if self.max_update_norm_ratio is not None:
            kept = self._drop_norm_outliers(updates)
            outliers = {id(u) for u in updates} - {id(u) for u in kept}
            outliers = {u.client_id for u in updates if id(u) in outliers}
            updates = kept
        # each sampled client's run of failing rounds (an outlier trained: it does not extend it); n in a row stop
        runner.client_record.end_round(
            rnd.idx, rnd.selection.cohort, [u.client_id for u in updates], self.round_failures,
            [not (f[0] in outliers and i >= rnd.num_failures) for i, f in enumerate(self.round_failures)])
        runner.stop_if_failed_repeatedly(rnd.idx)
        rnd.too_few = self.server_optimizer.aggregation_requirement(len(updates)) if updates else None
        if rnd.too_few is not None:
            rnd.num_too_few = len(updates)
            for update in updates:
                self._round_log.discard(update.client_id)
            updates = []
        self._rounds_run += 1
        self._rounds_with_updates += bool(updates)
        if not updates:
            why = ("too_few" if rnd.too_few is not None else "failed" if len(rnd.selection.cohort) else
                   "unavailable" if rnd.selection.unavailable else "empty")
            self._rounds_without_updates[why] = self._rounds_without_updates.get(why, 0) + 1
        rnd.updates = updates

    def _server_step(self, rnd: "_Round") -> None:
        """x_{t+1} from the server optimizer (``rnd.step``; ``None`` when it does not step) and the buffers; then the
        check of the global model and the server state: a non-finite step raises or is undone
        (``on_nonfinite_server_step``), the round then counting as one without updates."""
        runner, server, updates = self.client_runner, self.server_optimizer, rnd.updates
        with torch.no_grad():
            torch._foreach_copy_(self._params, runner.global_params)
            rnd.step = server.round_step(self._params, updates, snapshot=self.on_nonfinite_server_step == "restore",
                                         delta_norms=rnd.delta_norms)
            if updates:
                self._average_buffers(updates, rnd.step)
            elif self._buffers:
                torch._foreach_copy_(self._buffers, runner.global_buffers)
        self.in_round = False
        if rnd.step is None:
            return
        bad = nonfinite_values(self._model_items + state_items(server, self._param_names))
        if not bad:
            self._restored_in_a_row = []
            return
        self._nonfinite_server_step(rnd.idx, bad, rnd.step)
        rnd.num_restored, rnd.step, rnd.restored = len(updates), None, True
        for update in updates:
            self._round_log.discard(update.client_id)
        self._rounds_with_updates -= bool(updates)
        if updates:  # counted apart in the end-of-run message
            self._rounds_without_updates["restored"] = self._rounds_without_updates.get("restored", 0) + 1
        rnd.updates = []

    def _report_round(self, rnd: "_Round") -> None:
        """The round's metrics (:attr:`round_metrics`), the warning of a round without a step, the round log."""
        updates, step, nan = rnd.updates, rnd.step, float("nan")
        self.round_metrics = {
            "round_train_loss": nan,
            "round_pseudo_grad_norm": nan,
            "round_gradient_diversity": nan,
            "round_time_s": time.perf_counter() - rnd.start,
            "round_local_steps": float(sum(u.num_steps for u in updates)),
            "round_clients": float(len(updates)),
            "round_clients_dropped": float(len(self.round_failures) + rnd.num_too_few + rnd.num_restored),
            "round_clients_unavailable": float(rnd.selection.unavailable),
        }
        weights: dict[int, float] = {}
        if step is not None:
            norms = torch.stack(torch._foreach_norm(step.pseudo_gradient)).double()
            self.round_metrics["round_pseudo_grad_norm"] = float(torch.linalg.vector_norm(norms))
        if step is not None and updates:
            weights = {u.client_id: float(w) for u, w in zip(updates, step.weights.tolist())}
            self.round_metrics["round_train_loss"] = self._round_train_loss(updates, step.weights, rnd.idx)
            self.round_metrics["round_gradient_diversity"] = step.gradient_diversity()
        else:
            self._warn_round_without_update(rnd)
        if rnd.plan is not None:
            self.round_metrics.update(self.datamodule.simulated_time.end_round(rnd.plan))
        self.round_metrics.update(rnd.metrics)
        self._round_log.end_round(pl_private.results(self.trainer), weights)
        pl_private.log_round_step_values(self.trainer)  # the round's step values into callback/progress-bar metrics

    def on_advance_end(self) -> None:
        trainer = self.trainer
        module = trainer.lightning_module
        round_idx = trainer.current_epoch
        pl_private.log_epoch_end_reached(trainer)
        self.epoch_progress.increment_processed()
        if pl_private.should_check_val_epoch(self.epoch_loop) and trainer.limit_val_batches != 0:
            trainer.validating = True
            pl_private.call_module_hook(trainer, "on_validation_model_zero_grad")
            with DeferSigterm(enabled=trainer.world_size == 1):  # a SIGTERM stops the run at the round's end
                self.epoch_loop.val_loop.run()
            trainer.training = True
            pl_private.reset_first_loop_iter(trainer)
        pl_private.set_batches_that_stepped(self.epoch_loop, round_idx + 1)
        # After validation, right before the callbacks' own on_train_epoch_end: Lightning resets an fx's tensor
        # results when logging switches to it from another fx, so logging these before validation would let a
        # callback that logs in on_train_epoch_end (FedAWARE, AdaptiveServerStepSize) wipe them.
        self._log_round_metrics(module)
        self.communication.log(trainer, round_idx)
        for timer in trainer.callbacks:  # max_time is checked at round ends: a round is never cut short
            if isinstance(timer, Timer):
                timer.on_train_batch_end(trainer, module, None, None, 0)
        # As Lightning's epoch loop: epoch-interval schedulers (the client learning rate by round) step before the
        # on_train_epoch_end callbacks, so a checkpoint saved there holds the stepped scheduler and a resumed run
        # continues the same schedule; plateau schedulers step after, once the round's metrics are monitored.
        pl_private.update_learning_rates(self.epoch_loop, "epoch", update_plateau_schedulers=False)
        pl_private.call_callback_hooks(trainer, "on_train_epoch_end", monitoring_callbacks=False)
        pl_private.call_module_hook(trainer, "on_train_epoch_end")
        pl_private.call_callback_hooks(trainer, "on_train_epoch_end", monitoring_callbacks=True)
        pl_private.log_epoch_end(trainer)
        pl_private.update_learning_rates(self.epoch_loop, "epoch", update_plateau_schedulers=True)
        stepped = pl_private.batches_that_stepped(self.epoch_loop)
        pl_private.set_batches_that_stepped(self.epoch_loop, stepped - 1)  # the epoch's metrics at the round's step
        pl_private.log_train_epoch_metrics(trainer)
        pl_private.set_batches_that_stepped(self.epoch_loop, stepped)
        timing = getattr(self.datamodule, "simulated_time", None)
        if timing is not None and timing.active:  # validation against simulated time (issue #53)
            log_against_simulated_time(trainer, timing.clock.elapsed_seconds)
        self.epoch_progress.increment_completed()
        if trainer.received_sigterm:
            path = self._save_stop_checkpoint() if trainer.world_size == 1 else None
            where = f"; checkpoint written to {path} (resume with {self.resume_hint(path)})" if path else ""
            raise SIGTERMException(f"Stopped by SIGTERM after round {round_idx}{where}.")

    # ------------------------------------------------------------------ the client runner's settings and round state
    @property
    def on_client_failure(self) -> str:
        """``"skip"``, ``"raise"`` or ``"skip_all"`` (applied by :meth:`ClientRunner.report_failure` and
        :meth:`ClientRunner.stop_if_all_failed_alike`)."""
        return self.client_runner.on_client_failure

    @property
    def client_timeout_s(self) -> Optional[float]:
        """The per-client time limit in seconds, or ``None``."""
        return self.client_runner.client_timeout_s

    @property
    def global_params(self) -> list[Tensor]:
        """x_t: the global model's federated parameters at the start of the current round (``module.parameters()``
        order, frozen parameters left out: the client runner's ``params``; read-only by convention). Client
        algorithms get it from their :class:`~lightning_fed.client.runner.ClientContext`."""
        return self.client_runner.global_params

    @property
    def global_buffers(self) -> list[Tensor]:
        """The global model's buffers at the start of the current round (same order as ``module.buffers()``)."""
        return self.client_runner.global_buffers

    @property
    def round_client_lr(self) -> float:
        """The client learning rate γ of the current round (first optimizer's first parameter group)."""
        return self.client_runner.round_client_lr

    @property
    def round_client_lrs(self) -> list[float]:
        """γ of each federated parameter's optimizer group in the current round, aligned with :attr:`global_params`."""
        return self.client_runner.round_client_lrs

    def record_client_failure(self, client_id: int, reason: str) -> None:
        """Drop client ``client_id`` (which reported back) from the round (policies ``"skip"``, ``"skip_all"``) or
        raise (``"raise"``).

        Raises:
            RuntimeError: with policy ``"raise"``.
        """
        self.round_failures.append(self.client_runner.report_failure(client_id, reason))

    _finite_updates = staticmethod(finite_updates)  # (:func:`~lightning_fed.client.update.finite_updates`)

    def _keep_finite(self, update: ClientUpdate, finite: bool) -> bool:
        """``finite`` (from :meth:`_finite_updates`), also requiring a finite loss where the client reported one;
        a non-finite update is recorded as the client's failure and discarded from the round log."""
        if update.loss_steps > 0 and not math.isfinite(update.loss):  # no loss reported (manual optimization): fine
            finite = False
        if not finite:
            self._round_log.discard(update.client_id)
            self.record_client_failure(update.client_id, f"non-finite update (loss={update.loss})")
        return finite

    def _drop_norm_outliers(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """Drop (record as failed) the updates with ‖Δ_i‖₂ > k·median (:func:`~lightning_fed.guards.norm_outliers`)."""
        if not updates:
            return updates
        norms = [update_norm(u.delta) for u in updates]
        outliers = set(norm_outliers(norms, self.max_update_norm_ratio))
        if not outliers:
            return updates
        median = float(np.median(norms))
        for i in sorted(outliers):
            self._round_log.discard(updates[i].client_id)
            self.record_client_failure(
                updates[i].client_id,
                f"update norm {norms[i]:.4g} > max_update_norm_ratio={self.max_update_norm_ratio:g} × the round's "
                f"median client update norm {median:.4g}",
            )
        return [u for i, u in enumerate(updates) if i not in outliers]

    def _nonfinite_server_step(self, round_idx: int, bad: list[tuple[str, int, int]], step: Any) -> None:
        """Round ``round_idx``'s server step made ``bad`` non-finite: raise, or (``"restore"``) put back x_t, the
        global buffers and the server optimizer's state from before the step, with a warning.

        Raises:
            RuntimeError: under ``on_nonfinite_server_step="raise"``.
        """
        what = describe_nonfinite(bad)
        if self.on_nonfinite_server_step != "restore":
            raise RuntimeError(
                f"Round {round_idx}: the server step made the global model or the server optimizer's state non-finite: "
                f"{what}. Stopping (FederatedTrainer(on_nonfinite_server_step='restore') would restore the round's "
                "start and go on)."
            )
        runner = self.client_runner
        with torch.no_grad():
            torch._foreach_copy_(self._params, runner.global_params)
            if self._buffers:
                torch._foreach_copy_(self._buffers, runner.global_buffers)
        self.server_optimizer.undo_round_step(self._params, step)
        self._rounds_restored += 1
        self._restored_in_a_row.append((round_idx, what))
        n = self.max_consecutive_restores
        if n is not None and len(self._restored_in_a_row) >= n:
            rounds = self._restored_in_a_row[-n:]
            raise RuntimeError(
                f"Round {round_idx}: the server step made the global model or the server optimizer's state non-finite "
                f"in {n} rounds in a row ({', '.join(str(r) for r, _ in rounds)}), each undone "
                f"(on_nonfinite_server_step='restore'); stopping instead of discarding every round to the end "
                f"(max_consecutive_restores={n}). The global model and the server optimizer's state are back at round "
                f"{round_idx}'s start. Non-finite in round {round_idx}: {what}."
                + "".join(f" Round {r}: {w}." for r, w in rounds[:-1] if w != what)
                + " Lower the server learning rate, clip the updates or check the server optimizer's state."
            )
        rank_zero_warn(
            f"Round {round_idx}: the server step made the global model or the server optimizer's state non-finite "
            f"({what}); on_nonfinite_server_step='restore': the global model and the server optimizer's state are "
            "back at the round's start, and the round counts as one in which no client reported (its reports in "
            "round_clients_dropped)."
        )

    # ------------------------------------------------------------------ internals
    def _average_buffers(self, updates: list[ClientUpdate], step: Any) -> None:
        """The buffers x_{t+1}: the clients' weighted mean (``step.weights``; integer buffers their maximum), or their
        global values when the server step releases no buffers (a chain that adds DP noise)."""
        if not self._buffers:
            return
        if not step.releases_buffers:  # DP: the clients' buffers are not released
            self._keep_global_buffers(updates)
            return
        weights = step.weights.tolist()
        for i, buf in enumerate(self._buffers):
            values = [u.buffers[i] for u in updates]
            if buf.is_floating_point():
                buf.copy_(sum(w * v.to(torch.float64) for w, v in zip(weights, values)).to(buf.dtype))
            else:
                buf.copy_(torch.stack(values).amax(dim=0))

    def _keep_global_buffers(self, updates: list[ClientUpdate]) -> None:
        """Under a server optimizer that adds DP noise: every buffer back to its global value (ε covers only the
        noised parameters), with a warning naming the buffers some client changed (running statistics of norm
        layers are refused at fit start; these are other buffers the module updates in training)."""
        names = [n for n, _ in self.trainer.lightning_module.named_buffers()]
        changed = [
            name for i, (name, g) in enumerate(zip(names, self.client_runner.global_buffers))
            if any(not torch.equal(u.buffers[i], g) for u in updates if len(u.buffers) == len(names))
        ]
        torch._foreach_copy_(self._buffers, self.client_runner.global_buffers)
        if changed and not getattr(self, "_warned_dp_buffers", False):  # once per run
            self._warned_dp_buffers = True
            rank_zero_warn(
                f"{type(self.server_optimizer).__name__} adds DP noise, and ε does not cover buffers: the buffers the "
                f"clients changed in training ({', '.join(changed)}) are kept at the global value, never averaged "
                "from the clients. Make them parameters, or compute them outside training, if they must change."
            )

def check_single_sample_batchnorm(module: torch.nn.Module, datamodule: Any, limit: int = 5) -> None:
    """Refuse, at fit start, a module with ``BatchNorm1d`` layers in training mode whose clients' local batches can
    hold a single sample (:func:`~lightning_fed.datamodules.local_work.single_sample_batch_clients`: a client's size
    mod the batch size is 1 without ``drop_last``, a batch size of 1, or a client of one sample): such a layer
    cannot normalise one ``[1, C]`` sample ("Expected more than 1 value per channel when training"), so those
    clients would fail — and be dropped — in every round they are sampled in. ``BatchNorm2d``/``3d`` normalise a
    sample's H·W values per channel and train on one sample: not refused. Judged only for the data module's own
    batches (``client_batches`` and ``client_dataloader`` not overridden).

    Raises:
        ValueError: naming the layers, the clients (the first ``limit``, with their sizes), the batch size and the
            fixes (``drop_last=True``, another ``batch_size``, or the layer in eval mode).
    """
    from lightning_fed.datamodules.federated import FederatedDataModule
    from lightning_fed.datamodules.local_work import single_sample_batch_clients

    layers = [name for name, m in module.named_modules()
              if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.LazyBatchNorm1d)) and m.training]
    if not layers or not isinstance(datamodule, FederatedDataModule):
        return
    kind = type(datamodule)
    if kind.client_batches is not FederatedDataModule.client_batches or \
            kind.client_dataloader is not FederatedDataModule.client_dataloader:
        return
    found = single_sample_batch_clients(datamodule.partition.sizes(), datamodule.local_work, datamodule.drop_last,
                                        datamodule.local_batch_limit)
    if not found:
        return
    sizes = sorted({b for _, _, b in found})
    named = ", ".join(f"client {c} ({n} sample{'s' if n != 1 else ''})" for c, n, _ in found[:limit])
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    raise ValueError(
        f"{type(module).__name__} has BatchNorm1d layer(s) in training mode ({', '.join(layers)}), and with "
        f"batch_size={sizes[0] if len(sizes) == 1 else sizes} and drop_last={datamodule.drop_last} {len(found)} "
        f"client(s) take a local batch of a single sample: {named}{more}. BatchNorm1d cannot normalise one sample in "
        "training ('Expected more than 1 value per channel when training'), so these clients would fail in every "
        "round they are sampled in. Use drop_last=True in the data module, another batch_size (one that no client's "
        "size leaves a remainder of 1 by), or put the layer(s) in eval mode."
    )


def _round_result(executor: Any, result: Any) -> tuple[list[ClientUpdate], list[tuple[int, str]]]:
    """An executor's ``run_round`` result as ``(updates, failures)``.

    Raises:
        TypeError: anything else (e.g. a bare list of updates, the return value before executors reported failures).
    """
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list) and isinstance(result[1], list):
        return result
    raise TypeError(
        f"{type(executor).__name__}.run_round must return (updates, failures): a list of ClientUpdate and a list of "
        f"(client id, reason) from ClientRunner.report_failure; got {type(result).__name__}."
    )


@dataclasses.dataclass
class _Round:
    """One round of :meth:`FederatedFitLoop.advance`, as its steps fill it in."""
    idx: int
    start: float  # time.perf_counter() at the round's start
    selection: Any = None  # the data module's CohortSelection
    updates: list[ClientUpdate] = dataclasses.field(default_factory=list)
    num_failures: int = 0  # the executor's failures (then the filters' follow in round_failures)
    delta_norms: dict[int, DeltaNorms] = dataclasses.field(default_factory=dict)
    too_few: Optional[str] = None  # why the aggregator cannot aggregate this round's K reports
    num_too_few: int = 0
    step: Any = None  # the server optimizer's ServerRound, None without a (kept) server step
    restored: bool = False
    num_restored: int = 0
    plan: Any = None  # the simulated clock's RoundPlan (lightning_fed.clock), None without a device model
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # the asynchronous step's (issue #54)
