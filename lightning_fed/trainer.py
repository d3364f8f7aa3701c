"""FederatedTrainer: a lightning.Trainer whose fit loop runs communication rounds."""

from __future__ import annotations

from typing import Any, Optional

import lightning as L
from lightning.pytorch.callbacks import Callback, ProgressBar

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.progress import FederatedProgressBar
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.distributed import DDP_STRATEGY_NAMES, FederatedDDPStrategy
from lightning_fed.executor import ClientExecutor
from lightning_fed.guards import check_max_update_norm_ratio
from lightning_fed.interrupts import check_client_timeout
from lightning_fed.loop import FederatedFitLoop, find_server_optimizer


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
        client_executor: How the cohort is trained (default: sequentially in this process).
        on_client_failure: What a client that raises or returns a non-finite update does to the run:
            ``"skip"`` (default: dropped from the round with a warning, counted in ``round_clients_dropped``) or
            ``"raise"``.
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
        **kwargs: Any :class:`lightning.Trainer` argument.

    SIGTERM and SIGINT (``timeout``, SLURM, Kubernetes, Ctrl-C) stop a round at once, even with a hung client: the
    round's local work is discarded, a checkpoint of the state at the round's start is written to the
    ModelCheckpoint's ``dirpath/last.ckpt`` (else ``default_root_dir/last.ckpt``) and the run ends with exit status
    1; ``fit(..., ckpt_path=...)`` on it resumes exactly. See :class:`~lightning_fed.FederatedFitLoop`.

    Raises:
        ValueError: more than one :class:`~lightning_fed.callbacks.ServerOptimizer` in ``callbacks``, an
            unknown ``on_client_failure``, a ``client_timeout_s`` that is not ``None`` or a finite number > 0, or a
            ``max_update_norm_ratio`` that is not ``None`` or a finite number > 1.
    """

    def __init__(
        self,
        *,
        client_executor: Optional[ClientExecutor] = None,
        on_client_failure: str = "skip",
        client_timeout_s: Optional[float] = None,
        max_update_norm_ratio: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        check_client_timeout(client_timeout_s)  # before Lightning's set-up, so a bad value fails first
        check_max_update_norm_ratio(max_update_norm_ratio)
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
            client_timeout_s=client_timeout_s,
            max_update_norm_ratio=max_update_norm_ratio,
        )
        loop.epoch_loop = self.fit_loop.epoch_loop
        self.fit_loop = loop

    @property
    def server_optimizer(self) -> ServerOptimizer:
        """The trainer's server optimizer callback."""
        return find_server_optimizer(self.callbacks)
