"""Asynchronous training as a mode of the federated fit loop (issue #54): one Lightning epoch = one server step.

With ``FederatedDataModule(device_model=..., asynchronous=AsyncConfig(...))`` the loop's epoch ``t`` is
:meth:`AsyncSimulation.step <lightning_fed.asynchronous.AsyncSimulation.step>`: clients report in simulated-time
order until K = ``buffer_size`` updates weighted by s(τ) are buffered, then the server optimizer's ``round_step``
(FedAvg with a server lr, FedAdam, FedYogi, ..., with its aggregator chain over the buffer: FedBuff, Nguyen et al.,
AISTATS 2022, Alg. 1; FedAsync, Xie et al. 2019, with ``buffer_size=1, mixing=α``) gives x_{t+1}. So ``max_epochs``
counts server steps, and validation, checkpoints and callbacks run after each server step as after a round.

Training one client (:meth:`AsyncLoopMode.train`): the model version it was dispatched with is loaded into the
module's federated parameters, the client runner starts "round" k (its dispatch index: what keys its batch order and
its torch seed, as the round index does synchronously), the loop's executor trains the client alone, and a failing
or non-finite client is dropped (recorded as the round's failures: ``round_clients_dropped``). Its update is checked
for finiteness with the loop's own check. After the server step the module holds x_{t+1}.

The step's metrics join the round metrics: ``async/staleness_mean``, ``async/staleness_max``, ``async/dropped_stale``,
``async/offline``, ``async/updates_per_hour`` (:meth:`AsyncStep.metrics
<lightning_fed.asynchronous.AsyncStep.metrics>`), ``async/failed`` and ``clock/elapsed_seconds`` (the simulated
seconds at the step, as a synchronous round's clock metric); the data module's simulated clock advances to the
step's time (``time/<metric>`` against simulated seconds); TensorBoard gets the histogram ``async/staleness``. The
bytes (``round_bytes_*``, issue #56) count the step's buffered clients (one download and one upload each); clients
dropped as stale, offline or failed are not counted.

Refused at fit start, each with the reason (:func:`refusal`): SCAFFOLD, FedDyn and FedAWARE (their corrections
assume every update comes from the current model), a server optimizer that adds DP noise (its accounting assumes a
cohort sampled each round), executors other than the sequential one and several processes (one client is trained at
a time, when it reports), modules with buffers (BatchNorm statistics: FedBuff and FedAsync publish no rule for
buffers, the synchronous mean of buffer values assumes one start version, and a version keeps the parameters
only), ``max_update_norm_ratio`` and ``on_nonfinite_server_step="restore"`` (both defined on a round),
cohort-sampling options (``client_dropout``, ``over_selection``, ``cohort_sampling="poisson"``: the dispatches draw
the clients) and ``clients_per_round`` other than ``buffer_size`` (the clients of one epoch), and
``DownlinkCompression`` (a client starts from its exact model version here). Warned at fit start
(:data:`NOT_THE_PAPERS_MEAN`): a buffer of K > 1 averaged with the server optimizer's ``weighting="num_samples"``
(its default), where FedBuff's Alg. 1 takes the uniform mean (``weighting="uniform"``).

Update compression (issue #56's ``Compression``) composes: a dispatch's upload is timed by Δ_i's encoded size
(:func:`~lightning_fed.communication.bytes.planned_bytes`, as the synchronous clock plans a round), a stochastic
compressor's draws are keyed by the dispatch index (the client's round), and a client's per-client state (error
feedback's residual e_i, a personal half's state) is written when it reports, so that a client dispatched again
before the server step starts from it. A stop signal ends the run at the end of the server step (the
step is not cut short).

Example: FedBuff with FedAdam, 5 of 20 clients in flight on log-normal devices, K = 2 updates per server step::

    >>> import lightning as L, torch
    >>> from torch.utils.data import TensorDataset
    >>> from lightning_fed import FederatedTrainer
    >>> from lightning_fed.asynchronous import AsyncConfig
    >>> from lightning_fed.callbacks import FedAdam
    >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
    >>> from lightning_fed.datamodules.devices import ParametricDeviceModel
    >>> class Line(L.LightningModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w = torch.nn.Parameter(torch.zeros(3))
    ...     def training_step(self, batch, batch_idx):
    ...         return ((batch[0] @ self.w - batch[1]) ** 2).mean()
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(200, 3, generator=g)
    >>> dm = FederatedDataModule(TensorDataset(x, x.sum(1)), partitioner=IIDPartitioner(20), clients_per_round=2,
    ...                          batch_size=5, device_model=ParametricDeviceModel(0.01, compute_sigma=1.0),
    ...                          asynchronous=AsyncConfig(concurrency=5, buffer_size=2, max_staleness=8))
    >>> trainer = FederatedTrainer(max_epochs=4, callbacks=[FedAdam(lr=0.05)], logger=False, accelerator="cpu",
    ...                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    >>> trainer.fit(Line(), datamodule=dm)
    >>> metrics = trainer.fit_loop.round_metrics
    >>> metrics["round_clients"], metrics["async/staleness_max"] >= 0, dm.simulated_time.async_simulation.version
    (2.0, True, 4)
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed.asynchronous.simulation import AsyncSimulation, AsyncStep
from lightning_fed.client.update import ClientUpdate
from lightning_fed.clock import payload_bytes, shared_parameters
from lightning_fed.communication.bytes import planned_bytes
from lightning_fed.datamodules.cohorts import CohortSelection

__all__ = ["AsyncLoopMode", "refusal", "start_async_mode"]


def refusal(loop: Any) -> Optional[str]:
    """Why the fit cannot train asynchronously (the module doc's list), or ``None``."""
    from lightning_fed.algorithms.fedaware import FedAWARE
    from lightning_fed.algorithms.feddyn import FedDyn, FedDynClient
    from lightning_fed.algorithms.scaffold import SCAFFOLD, ScaffoldClient
    from lightning_fed.client.sequential import SequentialExecutor

    trainer, dm, server = loop.trainer, loop.datamodule, loop.server_optimizer
    halves = loop.client_runner.client_halves.algorithms
    corrected = [type(o).__name__ for o in (server, *halves)
                 if isinstance(o, (SCAFFOLD, FedDyn, FedAWARE, ScaffoldClient, FedDynClient))]
    if corrected:
        return (f"{corrected[0]} corrects each update with per-client or global state that assumes the update comes "
                "from the current global model; a stale update breaks that assumption")
    if server.privatises:
        return (f"{type(server).__name__} adds DP noise, and its privacy accounting assumes a cohort sampled each "
                "round, not clients dispatched one by one")
    if type(loop.executor) is not SequentialExecutor or trainer.world_size > 1:
        return (f"the executor {type(loop.executor).__name__} (world size {trainer.world_size}) trains cohorts; "
                "asynchronous training trains one client at a time, when it reports (use SequentialExecutor, "
                "one process)")
    if loop.client_runner.downlink is not None:  # issue #56's DownlinkCompression
        return ("DownlinkCompression (update compression of the broadcast model) is not supported: each client "
                "here starts from its model version x_v kept exact, and FedAsync's mixing x_v + Δ_i assumes it did")
    buffers = [name for name, _ in trainer.lightning_module.named_buffers()]
    if buffers:  # issue #54 item 2: kept refused, no published rule to implement exactly
        return (f"the module has buffers ({', '.join(buffers[:3])}): FedBuff (Nguyen et al. 2022, Alg. 1) and "
                "FedAsync (Xie et al. 2019) step the model's parameters only and publish no rule for buffers such "
                "as BatchNorm statistics, and the synchronous loop's rule (the clients' weighted mean of their "
                "buffer values) assumes every client started from the same global buffers, which a stale client "
                "did not (it trained from an older version's); a model version keeps the federated parameters only. "
                "Use a module without buffers (e.g. GroupNorm or LayerNorm instead of BatchNorm)")
    if loop.max_update_norm_ratio is not None or loop.on_nonfinite_server_step == "restore":
        return ("max_update_norm_ratio and on_nonfinite_server_step='restore' are defined on a round's cohort, "
                "which asynchronous training does not have")
    cohorts = dm.cohorts
    if cohorts.client_dropout > 0 or cohorts.over_selection > 0 or cohorts.cohort_sampling != "fixed_size":
        return ("client_dropout, over_selection and cohort_sampling choose a round's cohort; asynchronous training "
                "draws each dispatched client itself (use the device model's availability for dropout)")
    if dm.clients_per_round != dm.asynchronous.buffer_size:
        return (f"clients_per_round ({dm.clients_per_round}) must equal buffer_size ({dm.asynchronous.buffer_size}): "
                "an epoch is one server step of buffer_size client updates")
    return None


def start_async_mode(loop: Any) -> Optional["AsyncLoopMode"]:
    """At fit start: the mode when the data module sets ``asynchronous`` (after the refusals), else ``None``.

    Raises:
        ValueError: the fit cannot train asynchronously (:func:`refusal`, in a sentence naming why).
    """
    part = getattr(loop.datamodule, "simulated_time", None)
    if part is None or getattr(part, "asynchronous", None) is None:
        return None
    why = refusal(loop)
    if why is not None:
        raise ValueError(f"Asynchronous training (the data module's `asynchronous`) is refused: {why}.")
    if part.asynchronous.buffer_size > 1 and getattr(loop.server_optimizer, "weighting", None) == "num_samples":
        rank_zero_warn(NOT_THE_PAPERS_MEAN, category=UserWarning)
    return AsyncLoopMode(loop, part)


#: warned at fit start when the buffer (K > 1) is averaged with the server optimizer's default weighting
NOT_THE_PAPERS_MEAN = (
    "Asynchronous training averages the buffer with the server optimizer's weighting='num_samples' (w_i ∝ |D_i|, "
    "its default, Reddi et al. 2021's synchronous choice); FedBuff (Nguyen et al. 2022, Alg. 1) averages the K "
    "buffered updates uniformly, Δ̄ = (1/K)·Σ s(τ_i)·Δ_i. Give the server optimizer weighting='uniform' for the "
    "paper's rule, or keep 'num_samples' knowingly.")


class AsyncLoopMode:
    """The loop's asynchronous epochs (the module doc). Built by :func:`start_async_mode`.

    Args:
        loop: The :class:`~lightning_fed.loop.FederatedFitLoop`.
        part: The data module's :class:`~lightning_fed.datamodules.simulated_time.SimulatedTime` (its
            ``asynchronous`` config, device model and clock); the simulation is kept in ``part.async_simulation``
            so the data module's ``state_dict`` carries it into checkpoints.

    Example: the fit loop holds one when the data module trains asynchronously (FedAsync here: K = 1, mixing 0.5)::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.asynchronous import AsyncConfig
        >>> from lightning_fed.callbacks import FedAvg
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> from lightning_fed.datamodules.devices import ParametricDeviceModel
        >>> class Lin(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(2))
        ...     def training_step(self, batch, batch_idx):
        ...         return ((batch[0] @ self.w - batch[1]) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> x = torch.randn(40, 2, generator=torch.Generator().manual_seed(0))
        >>> dm = FederatedDataModule(TensorDataset(x, x.sum(1)), partitioner=IIDPartitioner(8), clients_per_round=1,
        ...                          batch_size=5, device_model=ParametricDeviceModel(0.01),
        ...                          asynchronous=AsyncConfig(concurrency=3, buffer_size=1, mixing=0.5))
        >>> trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg()], logger=False, accelerator="cpu",
        ...                            enable_checkpointing=False, enable_progress_bar=False,
        ...                            enable_model_summary=False)
        >>> trainer.fit(Lin(), datamodule=dm)
        >>> type(trainer.fit_loop._async).__name__, trainer.fit_loop._async.sim.version
        ('AsyncLoopMode', 2)
    """

    def __init__(self, loop: Any, part: Any) -> None:
        self.loop, self.part = loop, part
        dm, runner = loop.datamodule, loop.client_runner
        payload = payload_bytes(shared_parameters(runner.params, loop.trainer.lightning_module,
                                                  runner.client_halves.algorithms))
        # (each server step's start sets the bytes as the synchronous clock plans them: planned_bytes, in advance)
        sim = AsyncSimulation(part.asynchronous, dm.partition.num_clients, self.train, self._server_step,
                              part.device_model, self.step_samples, payload, payload)
        if part._async_state is not None:  # a resumed run: the saved buffer, clients in flight, versions, clock
            sim.load_state_dict(part._async_state)
            part._async_state = None
        part.async_simulation = sim
        self.sim = sim
        self._server_round: Any = None  # the last server step's ServerRound, and its buffered updates
        self._buffer: list[ClientUpdate] = []

    def step_samples(self, client_id: int, dispatch: int) -> np.ndarray:
        """The samples of each local step of ``client_id`` when trained with dispatch index ``dispatch``."""
        batches = self.loop.datamodule.client_batches(int(client_id), int(dispatch))
        return np.fromiter((len(b) for b in batches), dtype=np.int64)

    def train(self, client_id: int, params: list[Tensor], dispatch: int) -> Optional[ClientUpdate]:
        """Client ``client_id``'s local training from ``params`` (its start version) as round ``dispatch`` of the
        client runner; ``None`` when it failed or its update is non-finite (recorded as the step's failure)."""
        loop, runner = self.loop, self.loop.client_runner
        # x_v as this client's round; the step's hyper-parameters and step path stay advance's start_round's
        runner.restart_round(int(dispatch), params)
        from lightning_fed.loop import _round_result

        updates, failures = _round_result(loop.executor, loop.executor.run_round(runner, np.array([client_id]),
                                                                                  int(dispatch)))
        for failure in failures:
            if getattr(failure, "error", None) is not None:
                failure.error = None  # the exception holds the client's frames
        loop.round_failures.extend(failures)
        updates = [u for u, ok in zip(updates, loop._finite_updates(updates, {})) if loop._keep_finite(u, ok)]
        if updates and any(str(k).startswith("client_state/") for k in updates[0].extras):
            # a client keeps its new state (error feedback's residual, a personal model) once it reports: written
            # now, not at the server step, so that a client dispatched again within the step starts from it
            server = loop.server_optimizer
            server.client_states.receive(updates, server.client_algorithms)
        return updates[0] if updates else None

    def _server_step(self, params: list[Tensor], updates: list[ClientUpdate]) -> None:
        self._buffer = list(updates)
        self._server_round = self.loop.server_optimizer.round_step(params, updates)

    def advance(self, rnd: Any) -> AsyncStep:
        """Epoch ``rnd.idx``: events up to the next server step and the step; fills ``rnd`` for the loop's report
        (updates, the server step, failures, the step's metrics) and leaves x_{t+1} in the module."""
        from lightning_fed import _lightning as pl_private
        from lightning_fed.evaluation import _histogram
        from lightning_fed.guards import nonfinite_values
        from lightning_fed.migrations import state_items

        loop, runner = self.loop, self.loop.client_runner
        pl_private.set_batches_that_stepped(loop.epoch_loop, rnd.idx)
        runner.start_round(rnd.idx)  # once per server step, as once per round: each client then restart_round's
        # bytes each way as they travel, as the synchronous clock plans a round: the broadcast, and Δ_i as the run's
        # compressor encodes it (issue #56's Compression: an upload is timed by its encoded size)
        self.sim.download_bytes, self.sim.upload_bytes = planned_bytes(runner)
        loop.round_failures = []
        loop._round_log.start_round()
        x = [p.detach().clone() for p in runner.params]
        start_time = self.part.clock.elapsed_seconds  # the previous step's time (the clock follows the steps)
        loop.in_round = True
        try:
            step = self.sim.step(x)
        finally:
            with torch.no_grad():
                torch._foreach_copy_(runner.params, x)
            loop.in_round = False
        rnd.updates, rnd.step = self._buffer, self._server_round
        # bytes (issue #56): the step's buffered clients, each one download and one upload; clients dropped as stale,
        # offline or failed are not counted (they never train in the simulation)
        loop.communication.record(runner, step.client_ids.tolist(), self._buffer)
        rnd.selection = CohortSelection(step.client_ids, step.client_ids, step.offline)  # offline: unavailable
        rnd.num_failures = len(loop.round_failures)
        runner.client_record.end_round(rnd.idx, [*step.client_ids.tolist(), *(f[0] for f in loop.round_failures)],
                                       step.client_ids.tolist(), loop.round_failures)
        runner.stop_if_failed_repeatedly(rnd.idx)
        loop._rounds_run += 1
        loop._rounds_with_updates += 1
        bad = nonfinite_values(loop._model_items + state_items(loop.server_optimizer, loop._param_names))
        if bad:
            loop._nonfinite_server_step(rnd.idx, bad, rnd.step)  # raises (on_nonfinite_server_step="raise")
        self.part.clock.advance(step.time - start_time)
        rnd.metrics = {**step.metrics(start_time), "async/failed": float(step.failed),
                       "clock/elapsed_seconds": self.part.clock.elapsed_seconds}  # as a synchronous round's
        _histogram(loop.trainer, "async/staleness", step.staleness, rnd.idx)
        return step

    def __repr__(self) -> str:
        return f"AsyncLoopMode({self.part.asynchronous!r})"
