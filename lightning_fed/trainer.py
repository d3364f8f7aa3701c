"""FederatedTrainer: a lightning.Trainer whose fit loop runs communication rounds."""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import lightning as L
from lightning.pytorch.callbacks import Callback, ProgressBar

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.progress import FederatedProgressBar
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.distributed import DDP_STRATEGY_NAMES, FederatedDDPStrategy
from lightning_fed.executor import ClientExecutor, SequentialExecutor
from lightning_fed.loop import FederatedFitLoop, find_server_optimizer


#: ``client_executor`` names accepted as strings (e.g. from the CLI).
EXECUTOR_NAMES = ("sequential", "vectorized")


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

    Args:
        client_executor: How the cohort is trained: a :class:`~lightning_fed.executor.ClientExecutor`, or
            ``"sequential"`` (default: one client after another in this process) or ``"vectorized"``
            (:class:`~lightning_fed.vectorized.VectorizedExecutor` with its defaults).
        on_client_failure: What a client that raises or returns a non-finite update does to the run:
            ``"skip"`` (default: dropped from the round with a warning, counted in ``round_clients_dropped``) or
            ``"raise"``.
        **kwargs: Any :class:`lightning.Trainer` argument.

    Raises:
        ValueError: more than one :class:`~lightning_fed.callbacks.ServerOptimizer` in ``callbacks``, or an
            unknown ``on_client_failure``.
    """

    def __init__(
        self,
        *,
        client_executor: Optional[Union[ClientExecutor, str]] = None,
        on_client_failure: str = "skip",
        **kwargs: Any,
    ) -> None:
        client_executor = _resolve_executor(client_executor)
        callbacks = kwargs.get("callbacks")
        if callbacks is None:
            callbacks = []
        elif isinstance(callbacks, Callback):
            callbacks = [callbacks]
        else:
            callbacks = list(callbacks)
        servers = [cb for cb in callbacks if isinstance(cb, ServerOptimizer)]
        if not servers:
            callbacks.append(FedAvg())
        else:
            find_server_optimizer(callbacks)  # raises on two or more
        if kwargs.get("enable_progress_bar", True) is not False and not any(
            isinstance(cb, ProgressBar) for cb in callbacks
        ):
            callbacks.append(FederatedProgressBar())
        kwargs["callbacks"] = callbacks
        strategy = kwargs.get("strategy")
        if isinstance(strategy, str) and strategy in DDP_STRATEGY_NAMES:
            kwargs["strategy"] = FederatedDDPStrategy(start_method=DDP_STRATEGY_NAMES[strategy])
        if kwargs.get("log_every_n_steps") is None:
            kwargs["log_every_n_steps"] = 1
        super().__init__(**kwargs)
        loop = FederatedFitLoop(
            self,
            min_epochs=self.fit_loop.min_epochs,
            max_epochs=self.fit_loop.max_epochs,
            executor=client_executor,
            on_client_failure=on_client_failure,
        )
        loop.epoch_loop = self.fit_loop.epoch_loop
        self.fit_loop = loop

    @property
    def estimated_stepping_batches(self) -> Union[int, float]:
        """The client optimizer steps this process takes over the run: what ``global_step`` reaches after
        ``max_epochs`` rounds (without failing clients or an ``on_train_batch_start`` that stops a client early).

        Computed exactly from the data module (cohorts, local work and batch caps are pure functions of the seed
        and the round): Σ over rounds t < ``max_epochs`` and this rank's clients c of round t of the number of
        local batches of c. ``inf`` when ``max_epochs`` is unbounded. An LR schedule by round uses
        ``max_epochs`` instead (schedulers step per round, ``interval="epoch"``).

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
        for t in range(rounds):
            cohort = dm.select_cohort(t).cohort.tolist()
            if self.world_size > 1:
                sizes = [dm.client_num_samples(c) for c in cohort]
                cohort = assign_clients(cohort, sizes, self.world_size)[self.global_rank]
            for c in cohort:
                n = len(dm.client_batches(c, t))
                total += n if limit is None else min(n, limit)
        return total

    @property
    def server_optimizer(self) -> ServerOptimizer:
        """The trainer's server optimizer callback."""
        return find_server_optimizer(self.callbacks)
