"""FederatedTrainer: a lightning.Trainer whose fit loop runs communication rounds."""

from __future__ import annotations

import contextlib
import math
import os
import re
import warnings
from typing import Any, Optional, Union

import lightning as L
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ProgressBar
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from lightning.pytorch.utilities.types import EVAL_DATALOADERS, TRAIN_DATALOADERS

from lightning_fed._lightning import PATH, set_checkpoint_connector, strategy_has_checkpoint_io
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.progress import FederatedProgressBar
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.checkpoint import (
    AtomicCheckpointIO,
    FederatedCheckpointConnector,
    MidRoundCheckpointError,
    RoundCheckpointGuard,
    normalize_allowed_changes,
)
from lightning_fed.distributed import DDP_STRATEGY_NAMES, FederatedDDPStrategy
from lightning_fed.evaluation import FederatedEvaluation
from lightning_fed.executor import ClientExecutor, SequentialExecutor
from lightning_fed.guards import (
    check_max_consecutive_restores,
    check_max_update_norm_ratio,
    check_on_nonfinite_server_step,
)
from lightning_fed.client.runner import FAILURE_POLICIES, check_max_consecutive_client_failures
from lightning_fed.interrupts import check_client_timeout
from lightning_fed.client.algorithm import ClientAlgorithm, check_client_algorithms
from lightning_fed.client.runner import ClientAlgorithmSteps
from lightning_fed.loop import FederatedFitLoop
from lightning_fed.server.checks import find_server_optimizer


#: ``client_executor`` names accepted as strings (e.g. from the CLI).
EXECUTOR_NAMES = ("sequential", "vectorized")


#: Said (``rank_zero_info``) when a trainer is built without a server optimizer callback.
NO_SERVER_OPTIMIZER_NOTE = (
    "No server optimizer given: using FedAvg with server learning rate η = 1 (the sample-weighted average of the "
    "client models). Choose one with callbacks=[FedAdam(lr=1e-2)] (CLI: --server_optimizer FedAdam)."
)


def _resolve_executor(executor: Any) -> Optional[ClientExecutor]:
    """``None``, an executor instance, or one of :data:`EXECUTOR_NAMES`.

    Raises:
        ValueError / TypeError: naming ``client_executor`` and the allowed values.
    """
    if executor is None or isinstance(executor, ClientExecutor):
        return executor
    if isinstance(executor, str):
        if executor == "sequential":
            return SequentialExecutor()
        if executor == "vectorized":
            from lightning_fed.vectorized import VectorizedExecutor

            return VectorizedExecutor()
        raise ValueError(f"`client_executor` must be one of {EXECUTOR_NAMES} or a ClientExecutor, got {executor!r}.")
    raise TypeError(
        f"`client_executor` must be one of {EXECUTOR_NAMES} or a ClientExecutor instance, got {type(executor).__name__}."
    )


def _use_default_logger(trainer_kwargs: dict[str, Any]) -> None:
    """Where no logger is given (or ``logger=True``), Lightning's default logger, with ``default_hp_metric=False``
    (written as a separate function: jsonargparse reads the trainer's own body to type its ``**kwargs``)."""
    if trainer_kwargs.get("logger", True) is True:
        trainer_kwargs.update(logger=_default_logger(trainer_kwargs.get("default_root_dir")))


def _default_logger(root_dir: Optional[str]) -> Any:
    """Lightning's default logger (TensorBoard when installed, else CSV), with ``default_hp_metric=False`` so that
    the run's HParams session is the federated one (:mod:`lightning_fed.tensorboard`)."""
    import os

    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from lightning_fed._lightning import tensorboard_available

    save_dir = os.fspath(root_dir) if root_dir is not None else os.getcwd()
    if tensorboard_available():
        return TensorBoardLogger(save_dir=save_dir, default_hp_metric=False)
    return CSVLogger(save_dir=save_dir)


def _raise_sigterm_exception(signum: int, frame: Any) -> None:
    raise SIGTERMException(f"Received SIGTERM again ({signum}) while stopping.")


def _exit_1_on_next_sigterm() -> None:
    """Where SIGTERM's disposition is the default (terminate, status 143), make the next SIGTERM raise
    ``SIGTERMException`` (``SystemExit`` with status 1) instead; handlers a user installed are left alone."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL, None
    ):
        signal.signal(signal.SIGTERM, _raise_sigterm_exception)


class FederatedTrainer(L.Trainer):
    """A :class:`lightning.Trainer` that installs :class:`~lightning_fed.FederatedFitLoop`.

    Every ``Trainer`` argument keeps its meaning, with one epoch = one communication round: ``max_epochs``
    counts rounds, ``check_val_every_n_epoch`` validates the global model every n rounds and
    ``log_every_n_steps`` (default here 1) logs every n rounds. The server optimizer is a callback: pass exactly
    one (``callbacks=[FedAdam(...)]``); none means :class:`~lightning_fed.callbacks.FedAvg` with η = 1.
    Unless a progress bar is given (or ``enable_progress_bar=False``) a
    :class:`~lightning_fed.callbacks.FederatedProgressBar` shows the round and the client being trained.
    ``strategy="ddp"`` (or ``"ddp_spawn"``, ``"ddp_fork"``, ``"ddp_notebook"``) becomes
    :class:`~lightning_fed.distributed.FederatedDDPStrategy`: the cohort is split across ranks (devices and
    nodes) and validation is sharded by Lightning's distributed sampler.

    Checkpoints (see :mod:`lightning_fed.checkpoint`): unless a checkpoint IO plugin is given (in ``plugins`` or on
    the strategy), :class:`~lightning_fed.checkpoint.AtomicCheckpointIO` writes them crash-safely (temporary file in
    the target directory, fsync, rename) and names the file and the damage when one cannot be read.
    ``ModelCheckpoint`` saves at the end of rounds (``save_on_train_epoch_end`` becomes ``True``), after the round's
    metrics are logged; step- or time-based saving (``every_n_train_steps``, ``train_time_interval``),
    ``save_on_train_epoch_end=False``, ``save_on_exception=True`` and ``OnExceptionCheckpoint`` are refused at fit
    start, and :meth:`save_checkpoint` refuses to run inside a round. Every checkpoint records the run's
    configuration (:func:`~lightning_fed.checkpoint.run_config`); ``fit(ckpt_path=...)`` refuses to resume with a
    different one unless ``allow_resume_changes`` allows it, and always restores the server optimizer's state.

    Args:
        client_executor: How the cohort is trained: a :class:`~lightning_fed.client.sequential.ClientExecutor`, or
            ``"sequential"`` (default: one client after another in this process) or ``"vectorized"``
            (:class:`~lightning_fed.vectorized.VectorizedExecutor` with its defaults).
        client_algorithms: Client halves every client runs (:class:`~lightning_fed.client.ClientAlgorithm`, e.g.
            ``[FedProxClient(mu=0.01)]``; default ``None``: only the server optimizer's own), after the server
            optimizer's own halves and its ``client=[...]``. They belong to the run, not to the server optimizer:
            swapping the server optimizer (in Python, a second config, ``--server_optimizer`` on the CLI) keeps
            them. Their per-client state is kept by name (``state_key``); a ``TypeError`` names a wrong entry.
        on_client_failure: What a client that raises or returns a non-finite update does to the run:
            ``"skip"`` (default: dropped from the round with a warning, counted in ``round_clients_dropped``;
            but a round in which every client raised the same exception type at the same place — a bug, not a
            flaky client — stops the run at once with that error), ``"raise"`` (the first failing client stops
            the run) or ``"skip_all"`` (always dropped, the run goes on: fault-injection studies).
        allow_resume_changes: Which configuration changes ``fit(ckpt_path=...)`` accepts: ``False`` (default:
            none; a changed partition, data seed, cohort size, local work, data order or server optimizer raises a
            ``ValueError`` naming each setting with its old and new value), ``True`` (all, each reported in a
            warning), or a list of setting names of :func:`~lightning_fed.checkpoint.run_config`, e.g.
            ``["server_optimizer.lr"]``; a name allows its sub-settings (``"local_work"`` allows
            ``"local_work.batch_size"``). The server optimizer's state (step count, moments) is restored across an
            allowed hyper-parameter change; across an allowed change of its class it starts afresh, with a warning.
        client_timeout_s: Wall-clock limit of one client's local work, in seconds (default ``None``: no limit). A
            client that runs longer is interrupted (``SIGALRM`` in the main thread on Linux/macOS, so a client hung
            in ``time.sleep`` or a Python loop is stopped; in another thread or on Windows the limit is checked
            between local steps only) and treated like a failing client (see ``on_client_failure``), with a
            warning naming the client and the round. With :class:`~lightning_fed.VectorizedExecutor` it makes
            the executor train clients sequentially.
        max_update_norm_ratio: k > 1 (default ``None``: off): a client whose update norm ‖Δ_i‖₂ is more than k
            times the median of the round's client update norms is treated like a failing client (a finite but
            absurd update, e.g. 1e15, would otherwise dominate the aggregate). Needs at least three reporting
            clients to single one out.
        on_nonfinite_server_step: What a server step that makes the global model or the server optimizer's state
            non-finite (NaN/±inf; checked after every server step, one host sync a round) does: ``"raise"``
            (default: the run stops with a ``RuntimeError`` naming the round and the tensors, e.g. ``FedAdam state
            'state.exp_avg_sq' for parameter 'net.0.weight' has 1 non-finite value(s) (of 40)``) or ``"restore"``
            (the global model x_t and the server optimizer's state from before the step are restored, with a
            warning naming the round and the tensors; the round counts as one in which no client reported, its
            reports in ``round_clients_dropped``; a copy of the server optimizer's state is kept every round for
            it). A checkpoint whose global model or server-optimizer state is non-finite is refused when ``fit``
            loads it, whatever this says.
        max_consecutive_restores: Under ``on_nonfinite_server_step="restore"``: after this many rounds in a row whose
            server step was undone the run stops with a ``RuntimeError`` naming the rounds and the tensors (a step
            that is non-finite every round would otherwise discard every round to the end). Default ``None``: 3; an
            int >= 1; refused with ``"raise"``.
        max_consecutive_client_failures: Under ``on_client_failure="skip"``: a client that fails (raises, times out
            or sends a non-finite update; an update-norm outlier does not count) in each of its last n sampled
            rounds stops the run with a ``RuntimeError`` naming the client, its rounds, the error (and the data row
            where the data source names it) and its traceback. Default ``None``: 3; an int >= 1; refused with
            ``"raise"`` and ``"skip_all"`` (which keeps dropping such a client).
        **kwargs: Any :class:`lightning.Trainer` argument.

    SIGTERM and SIGINT (``timeout``, SLURM, Kubernetes, Ctrl-C) stop a round at once, even with a hung client: the
    round's local work is discarded, a checkpoint of the state at the round's start is written to the
    ModelCheckpoint's ``dirpath/last.ckpt`` (without a ModelCheckpoint in ``callbacks``, Lightning's default one
    included: the run's own folder, ``<save_dir>/<name>/version_N/checkpoints/last.ckpt`` of the first logger, or
    ``default_root_dir/last.ckpt`` without a logger) and the run ends with exit status 1; ``fit(..., ckpt_path=...)``
    on it resumes exactly, in the same version folder (the message gives the command; under ``lightning-fed fit``:
    ``lightning-fed fit --config <the run's config.yaml> --ckpt_path <path>``). See :class:`~lightning_fed.FederatedFitLoop`.

    Raises:
        ValueError: more than one :class:`~lightning_fed.callbacks.ServerOptimizer` in ``callbacks``, an
            unknown ``on_client_failure`` or ``on_nonfinite_server_step``, a malformed ``allow_resume_changes``, a
            ``client_timeout_s`` that is not ``None`` or a finite number > 0, a ``max_update_norm_ratio`` that is
            not ``None`` or a finite number > 1, or a ``max_consecutive_restores`` /
            ``max_consecutive_client_failures`` that is not ``None`` or an int >= 1 or is given with a policy it
            does not apply to.

    Example: one epoch is one round; ``global_step`` counts the clients' optimizer steps. 5 samples over 3 clients
    (2, 2 and 1 samples), all 3 per round, batch size 1: 2 rounds × (2 + 2 + 1) = 10 steps::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Line(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.01)
        >>> x = torch.arange(1.0, 6.0, dtype=torch.float64)
        >>> dm = FederatedDataModule(TensorDataset(x, 2 * x), partitioner=IIDPartitioner(num_clients=3, seed=0),
        ...                          clients_per_round=3, batch_size=1)
        >>> trainer = FederatedTrainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        ...                            enable_checkpointing=False, accelerator="cpu")
        >>> type(trainer.server_optimizer).__name__  # none given: FedAvg with η = 1
        'FedAvg'
        >>> trainer.fit(Line(), datamodule=dm)
        >>> trainer.current_epoch, trainer.global_step, trainer.estimated_stepping_batches
        (2, 10, 10)
        >>> FederatedTrainer(on_client_failure="retry")
        Traceback (most recent call last):
        ...
        ValueError: `on_client_failure` must be one of ('skip', 'raise', 'skip_all'), got 'retry'.
    """

    def __init__(
        self,
        *,
        client_executor: Optional[Union[ClientExecutor, str]] = None,
        on_client_failure: str = "skip",
        allow_resume_changes: Union[bool, list[str]] = False,
        client_timeout_s: Optional[float] = None,
        max_update_norm_ratio: Optional[float] = None,
        on_nonfinite_server_step: str = "raise",
        client_algorithms: Optional[list[ClientAlgorithm]] = None,
        max_consecutive_restores: Optional[int] = None,
        max_consecutive_client_failures: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        #: The client halves every client runs besides the server optimizer's own (a part of the run of their own:
        #: swapping the server optimizer keeps them); run by the client runner after the server optimizer's.
        self.client_algorithms: list[ClientAlgorithm] = check_client_algorithms(client_algorithms, "client_algorithms")
        client_executor = _resolve_executor(client_executor)
        allowed = normalize_allowed_changes(allow_resume_changes)
        check_client_timeout(client_timeout_s)  # before Lightning's set-up, so a bad value fails first
        check_max_update_norm_ratio(max_update_norm_ratio)
        check_on_nonfinite_server_step(on_nonfinite_server_step)
        check_max_consecutive_restores(max_consecutive_restores, on_nonfinite_server_step)
        if on_client_failure in FAILURE_POLICIES:  # (an unknown one: the loop names it)
            check_max_consecutive_client_failures(max_consecutive_client_failures, on_client_failure)
        callbacks = kwargs.get("callbacks")
        if callbacks is None:
            callbacks = []
        elif isinstance(callbacks, Callback):
            callbacks = [callbacks]
        else:
            callbacks = list(callbacks)
        # a stop signal's checkpoint goes to a ModelCheckpoint the user gave, never to Lightning's default one
        self._model_checkpoint_given = any(isinstance(cb, ModelCheckpoint) for cb in callbacks)
        servers = [cb for cb in callbacks if isinstance(cb, ServerOptimizer)]
        if not servers:
            rank_zero_info(NO_SERVER_OPTIMIZER_NOTE)  # info, once per trainer: a documented default, not a mistake
            callbacks.append(FedAvg())
        else:
            find_server_optimizer(callbacks)  # raises on two or more
        # the client halves' per-step call, where the server optimizer's dispatch used to run (same order)
        server_index = next(i for i, cb in enumerate(callbacks) if isinstance(cb, ServerOptimizer))
        callbacks.insert(server_index + 1, ClientAlgorithmSteps())
        if kwargs.get("enable_progress_bar", True) is not False and not any(
            isinstance(cb, ProgressBar) for cb in callbacks
        ):
            callbacks.append(FederatedProgressBar())
        callbacks.append(RoundCheckpointGuard())
        callbacks.append(FederatedEvaluation())  # federated evaluation (lightning_fed/evaluation.py)
        kwargs["callbacks"] = callbacks
        plugins = kwargs.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        strategy_io = isinstance(kwargs.get("strategy"), Strategy) and strategy_has_checkpoint_io(kwargs["strategy"])
        if not strategy_io and not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = plugins + [AtomicCheckpointIO()]
        strategy = kwargs.get("strategy")
        if isinstance(strategy, str) and strategy in DDP_STRATEGY_NAMES:
            kwargs["strategy"] = FederatedDDPStrategy(start_method=DDP_STRATEGY_NAMES[strategy])
        if kwargs.get("log_every_n_steps") is None:
            kwargs["log_every_n_steps"] = 1
        _use_default_logger(kwargs)
        super().__init__(**kwargs)
        loop = FederatedFitLoop(
            self,
            min_epochs=self.fit_loop.min_epochs,
            max_epochs=self.fit_loop.max_epochs,
            executor=client_executor,
            on_client_failure=on_client_failure,
            client_timeout_s=client_timeout_s,
            max_update_norm_ratio=max_update_norm_ratio,
            on_nonfinite_server_step=on_nonfinite_server_step,
            max_consecutive_restores=max_consecutive_restores,
            max_consecutive_client_failures=max_consecutive_client_failures,
        )
        loop.epoch_loop = self.fit_loop.epoch_loop
        self.fit_loop = loop
        _quiet_empty_validation_list(loop.epoch_loop.val_loop)
        set_checkpoint_connector(self, FederatedCheckpointConnector(self, allowed))

    @property
    def estimated_stepping_batches(self) -> Union[int, float]:
        """The client optimizer steps this process takes over the run: what ``global_step`` reaches after
        ``max_epochs`` rounds (without failing clients or an ``on_train_batch_start`` that stops a client early).

        Computed exactly from the data module (cohorts, local work and batch caps are pure functions of the seed
        and the round): Σ over rounds t < ``max_epochs`` and this rank's clients c of round t of the number of
        local batches of c. ``inf`` when ``max_epochs`` is unbounded. An LR schedule by round uses
        ``max_epochs`` instead (schedulers step per round, ``interval="epoch"``). With a ``device_model`` (issue #53)
        the rounds are planned on the simulated clock from its start (the clients that train and their steps under a
        round deadline); before the fit starts, the bytes that travel are taken to be the module's parameters with
        ``requires_grad`` (so a personalised method's kept parts, known at fit start, count).

        Raises:
            TypeError: no :class:`~lightning_fed.datamodules.FederatedDataModule` attached.
        """
        from lightning_fed.distributed import assign_clients
        from lightning_fed.trainer_args import check_trainer_arguments

        rounds = self.max_epochs if self.max_epochs is not None else -1
        if rounds < 0:
            return math.inf
        dm = self.fit_loop.datamodule
        dm.setup("fit")
        limit = check_trainer_arguments(self)
        total = 0
        planned = _planned_steps(self, dm, rounds)  # with a device model: who trains, how many steps
        for t in range(rounds):
            cohort = dm.select_cohort(t).cohort.tolist() if planned is None else list(planned[t])
            if self.world_size > 1:
                sizes = [dm.client_num_samples(c) for c in cohort]
                cohort = assign_clients(cohort, sizes, self.world_size)[self.global_rank]
            for c in cohort:
                n = len(dm.client_batches(c, t)) if planned is None else planned[t][c]
                total += n if limit is None else min(n, limit)
        return total

    def validate(
        self,
        model: Optional[L.LightningModule] = None,
        dataloaders: Optional[Any] = None,
        ckpt_path: Optional[PATH] = None,
        verbose: bool = True,
        datamodule: Optional[L.LightningDataModule] = None,
        weights_only: Optional[bool] = None,
    ) -> Any:
        """Validate the global model: :meth:`lightning.Trainer.validate`, federated evaluation included.

        A SIGTERM received during it ends it with :class:`~lightning.pytorch.utilities.exceptions.SIGTERMException`
        (exit status 1 in a script), federated evaluation included (stopped at once, even with a hung client). After
        such a stop a second SIGTERM (e.g. a scheduler repeating it while the process shuts down) raises
        ``SIGTERMException`` again where SIGTERM's disposition was the default, so the process still exits with
        status 1, not 143 (killed by the signal). When it raises (e.g. a missing checkpoint), the log folders it
        created and left holding only set-up files are removed (before any metric was logged), as :meth:`fit` does.

        Args:
            model: The LightningModule (the global model).
            dataloaders: As in :meth:`lightning.Trainer.validate` (a data module may be passed here).
            ckpt_path: The checkpoint whose global model is validated ("best", "last", or a path), as in Lightning.
            verbose: Print the validation results.
            datamodule: The :class:`~lightning_fed.datamodules.FederatedDataModule`.
            weights_only: Passed to ``torch.load`` when loading the checkpoint, as in Lightning.
        """
        try:
            return self._removing_unused_log_dirs(
                super().validate, model, dataloaders, ckpt_path, verbose, datamodule, weights_only
            )
        except SIGTERMException:
            _exit_1_on_next_sigterm()
            raise

    def test(
        self,
        model: Optional[L.LightningModule] = None,
        dataloaders: Optional[Any] = None,
        ckpt_path: Optional[PATH] = None,
        verbose: bool = True,
        datamodule: Optional[L.LightningDataModule] = None,
        weights_only: Optional[bool] = None,
    ) -> Any:
        """Test the global model: :meth:`lightning.Trainer.test`.

        When it raises before any metric was logged (e.g. a missing checkpoint), the log folders it created and left
        holding only set-up files are removed, as :meth:`fit` does.

        Args:
            model: The LightningModule (the global model).
            dataloaders: As in :meth:`lightning.Trainer.test` (a data module may be passed here).
            ckpt_path: The checkpoint whose global model is tested ("best", "last", or a path), as in Lightning.
            verbose: Print the test results.
            datamodule: The :class:`~lightning_fed.datamodules.FederatedDataModule`.
            weights_only: Passed to ``torch.load`` when loading the checkpoint, as in Lightning.
        """
        return self._removing_unused_log_dirs(
            super().test, model, dataloaders, ckpt_path, verbose, datamodule, weights_only
        )

    def predict(
        self,
        model: Optional[L.LightningModule] = None,
        dataloaders: Optional[Any] = None,
        datamodule: Optional[L.LightningDataModule] = None,
        return_predictions: Optional[bool] = None,
        ckpt_path: Optional[PATH] = None,
        weights_only: Optional[bool] = None,
    ) -> Any:
        """Predict with the global model: :meth:`lightning.Trainer.predict`.

        When it raises before any metric was logged (e.g. a missing checkpoint), the log folders it created and left
        holding only set-up files are removed, as :meth:`fit` does.

        Args:
            model: The LightningModule (the global model).
            dataloaders: As in :meth:`lightning.Trainer.predict` (a data module may be passed here).
            datamodule: A data module with a ``predict_dataloader``.
            return_predictions: Return the predictions (default: yes, except with spawn-based strategies).
            ckpt_path: The checkpoint whose global model predicts ("best", "last", or a path), as in Lightning.
            weights_only: Passed to ``torch.load`` when loading the checkpoint, as in Lightning.
        """
        return self._removing_unused_log_dirs(
            super().predict, model, dataloaders, datamodule, return_predictions, ckpt_path, weights_only
        )

    def _removing_unused_log_dirs(self, run: Any, *args: Any) -> Any:
        """``run(*args)``; when it raises before any metric was logged, the log folders it created holding only
        set-up files are removed."""
        from lightning_fed.tensorboard import new_log_dirs, remove_unused_log_dirs

        created = new_log_dirs(self)
        try:
            return run(*args)
        except BaseException as err:
            if created and not self.logged_metrics:
                remove_unused_log_dirs(created)
            self._add_batch_hint(err)
            raise

    def _add_batch_hint(self, error: BaseException) -> None:
        """Add the data module's hint for a dict batch read as a tuple (:meth:`FederatedDataModule.batch_hint
        <lightning_fed.datamodules.FederatedDataModule.batch_hint>`) to ``error`` as a note, naming the step that
        raised it: the validation a fit starts with (the sanity check), validation, federated evaluation, testing.
        A client's failure has the note already (the client runner adds it)."""
        if not isinstance(error, Exception) or any(
            str(note).startswith(_BATCH_HINT_NOTE) for note in getattr(error, "__notes__", ())
        ):
            return
        step = _failing_step(error)
        hint = getattr(self.datamodule, "batch_hint", None)
        hint = hint(error, step) if step is not None and callable(hint) else None
        if hint:
            error.add_note(f"Hint: {hint}.")

    @property
    def server_optimizer(self) -> ServerOptimizer:
        """The trainer's server optimizer callback."""
        return find_server_optimizer(self.callbacks)

    def fit(
        self,
        model: LightningModule,
        train_dataloaders: Optional[Union[TRAIN_DATALOADERS, LightningDataModule]] = None,
        val_dataloaders: Optional[EVAL_DATALOADERS] = None,
        datamodule: Optional[LightningDataModule] = None,
        ckpt_path: Optional[PATH] = None,
        weights_only: Optional[bool] = None,
    ) -> None:
        """Train the global model, one round per epoch: :meth:`lightning.Trainer.fit` (the same arguments).

        Resuming from a checkpoint inside a logger's ``version_N`` folder (e.g. the stop checkpoint
        ``runs/lightning_logs/version_3/checkpoints/last.ckpt``) logs into that ``version_N`` again
        (:func:`lightning_fed.tensorboard.continue_version`; a warning says where and why not when a logger cannot).
        When it raises before its first round finished, the log folders it created and left holding only set-up
        files are removed (no empty ``version_N`` per failed attempt;
        :func:`lightning_fed.tensorboard.remove_unused_log_dirs`).

        Args:
            model: The LightningModule (the global model).
            train_dataloaders: As in :meth:`lightning.Trainer.fit` (a data module may be passed here).
            val_dataloaders: As in :meth:`lightning.Trainer.fit`.
            datamodule: The :class:`~lightning_fed.datamodules.FederatedDataModule`.
            ckpt_path: Checkpoint to resume from ("last", "hpc", or a path), as in Lightning.
            weights_only: Passed to ``torch.load`` when resuming, as in Lightning.
        """
        from lightning_fed.tensorboard import continue_version, new_log_dirs, remove_unused_log_dirs

        continued = continue_version(self, ckpt_path)  # a checkpoint inside .../version_N/: log into it again
        created = new_log_dirs(self)
        try:
            with warnings.catch_warnings() if continued else contextlib.nullcontext():
                for folder in continued:  # resuming there: its checkpoints folder is expected not to be empty
                    warnings.filterwarnings("ignore", message=f"Checkpoint directory .*{re.escape(os.path.basename(folder))}"
                                            f"{re.escape(os.sep)}checkpoints exists and is not empty")
                return super().fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, weights_only)
        except BaseException as err:
            if created and getattr(self.fit_loop, "_rounds_run", 0) == 0:
                remove_unused_log_dirs(created)
            self._add_batch_hint(err)
            raise

    def save_checkpoint(
        self, filepath: PATH, weights_only: Optional[bool] = None, storage_options: Optional[Any] = None
    ) -> None:
        """:meth:`lightning.Trainer.save_checkpoint`, refused inside a round.

        Raises:
            MidRoundCheckpointError: (a ``RuntimeError``) called while a round's clients train (e.g. from ``on_train_batch_end``): the module then
                holds a client's local model, not the global model.
        """
        if getattr(self.fit_loop, "in_round", False):
            raise MidRoundCheckpointError(
                f"save_checkpoint({str(filepath)!r}) was called inside round {self.current_epoch}, while the module "
                "holds a client's local model, not the global model; save at the end of a round instead "
                "(ModelCheckpoint(every_n_epochs=...), or from on_train_epoch_end)."
            )
        super().save_checkpoint(filepath, weights_only=weights_only, storage_options=storage_options)


#: How the hint for a dict batch read as a tuple starts, as a note on the error (client runner and trainer alike).
_BATCH_HINT_NOTE = "Hint: batches of the Hugging Face "

#: The LightningModule steps whose batches come from the data module's datasets.
_STEPS = ("training_step", "validation_step", "test_step")


def _failing_step(error: BaseException) -> Optional[str]:
    """The name of the LightningModule step (:data:`_STEPS`) in whose call ``error`` was raised: the outermost such
    frame of its traceback whose ``self`` is a LightningModule; ``None`` if none."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in _STEPS and isinstance(frame.f_locals.get("self"), LightningModule):
            return frame.f_code.co_name
        tb = tb.tb_next
    return None


#: Lightning's warning for a validation loader of length 0. ``FederatedDataModule.val_dataloader`` returns ``[]``
#: when there is no validation data, on purpose (Lightning then skips validation): the warning would otherwise open
#: every run without a validation set, asking whether that was intended.
_EMPTY_VALIDATION_WARNING = r"Total length of `list` across ranks is zero"


def _quiet_empty_validation_list(val_loop: Any) -> None:
    """Let the fit's validation loop (its sanity check too) set up its data without
    :data:`_EMPTY_VALIDATION_WARNING` (an empty *list* only; an empty ``DataLoader`` still warns)."""
    setup_data = val_loop.setup_data

    def quiet_setup_data() -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EMPTY_VALIDATION_WARNING, category=UserWarning)
            return setup_data()

    val_loop.setup_data = quiet_setup_data


def _planned_steps(trainer: Any, datamodule: Any, rounds: int) -> Optional[list[dict[int, int]]]:
    """With a device model: the first ``rounds`` rounds planned on the simulated clock, ``{client: local steps}`` of
    the clients that train each round (``SimulatedTime.forecast``); ``None`` without one. The bytes that travel are the
    loop's federated parameters once the fit started, else the module's parameters with ``requires_grad``."""
    from lightning_fed.clock import payload_bytes, shared_parameters

    timing = getattr(datamodule, "simulated_time", None)
    if timing is None or not timing.active:
        return None
    runner, module = trainer.fit_loop.client_runner, trainer.lightning_module
    params = runner.params or [p for p in module.parameters() if p.requires_grad]
    payload = payload_bytes(shared_parameters(params, module, runner.client_halves.algorithms))
    return timing.forecast(datamodule, rounds, payload)
