"""Client executors: how the cohort's local work is carried out (the swappable part of the federated loop).

An executor receives the loop's :class:`~lightning_fed.client.runner.ClientRunner`, never the loop, and returns the
round's ``(updates, failures)``."""

from __future__ import annotations

import abc
import contextlib
import math
from array import array
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

from lightning_fed.client import lean_step
from lightning_fed.client.distributed import assign_clients, gather_updates
from lightning_fed.client.runner import ClientRunner
from lightning_fed.client.update import ClientUpdate
from lightning_fed.interrupts import ClientTimeLimit, ClientTimeout
from lightning_fed.seeding import seed_sequence

#: What :meth:`ClientExecutor.run_round` returns: the updates of the clients that reported back (cohort order) and
#: ``(client id, reason)`` of those dropped (:meth:`ClientRunner.report_failure`).
RoundResult = tuple[list[ClientUpdate], list[tuple[int, str]]]


def client_seed(seed: int, round_idx: int, client_id: int) -> int:
    """The torch seed of client ``client_id``'s local work in round ``round_idx`` (a pure function, so results do
    not depend on the order or the process clients are trained in): the first 32-bit word of
    ``numpy.random.SeedSequence([seed, 0x7C1E, round_idx, client_id])``'s state (read as a ``uint32`` array when each
    is below 2**32: :func:`~lightning_fed.seeding.seed_sequence`, the same state).

    Example::

        >>> client_seed(0, 3, 17) == int(np.random.SeedSequence([0, 0x7C1E, 3, 17]).generate_state(1)[0])
        True
    """
    return int(seed_sequence(seed, 0x7C1E, round_idx, client_id).generate_state(1, dtype=np.uint32)[0])


def seed_client(seed: int, device: torch.device) -> None:
    """Seed torch for a client's local work on ``device``: ``torch.manual_seed(seed)``, except that on a CPU device,
    while no CUDA context exists, only the CPU generator is seeded (``torch.default_generator.manual_seed``).

    The two give the same CPU random numbers; ``torch.manual_seed`` also queues lazy seeds for CUDA, XPU and MTIA,
    which on a CUDA build of torch without an initialised GPU formats a stack trace each time (about 1 ms per
    client here) and can only affect a device that is not in use.

    Example::

        >>> seed_client(7, torch.device("cpu")); a = torch.rand(3)
        >>> torch.manual_seed(7); torch.equal(torch.rand(3), a)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        True
    """
    if device.type == "cpu" and not torch.cuda.is_initialized():
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


_FLOAT_32_64 = (torch.float32, torch.float64)
#: Up to this many scalar CPU losses are read with ``item()`` and added as Python floats (a client's handful of local
#: steps: cheaper than a ``stack`` and a NumPy accumulate); longer lists take the ``stack`` path. Like the lean step's
#: logged values, only while :data:`~lightning_fed.client.lean_step.HOST_SCALARS_ON_CPU` (``False``: the tensor path
#: every other device takes, one host copy per client).
_HOST_SUM_MAX = 16
_FLOAT32_MIN_NORMAL = 2.0 ** -126


def _host_running_sum(losses: list[torch.Tensor], dtype: torch.dtype) -> Optional[float]:
    """The running sum ``l_1 + l_2 + ... + l_n`` of scalar CPU tensors of ``dtype`` (float32 or float64), rounded
    after each addition as the tensor additions would round, computed on Python floats; ``None`` when a loss is not
    such a tensor (another dtype, device or shape) or, for float32, is a nonzero value below float32's smallest
    normal number (subnormals: left to the tensor path, which follows the CPU's flush-to-zero mode).

    Python floats are IEEE float64: for float64 each ``+`` is the float64 tensor addition. For float32 each sum of
    two float32 values is computed in float64 and rounded to float32 (``array("f")``); float64's 53-bit significand
    (≥ 2·24 + 2 bits) makes that double rounding equal to float32's own correctly rounded addition."""
    values = []
    for loss in losses:
        if loss.dtype is not dtype or not loss.is_cpu or loss.ndim:
            return None
        values.append(loss.item())
    if dtype is torch.float64:
        total = values[0]
        for value in values[1:]:
            total += value
        return total
    for value in values:
        if value != 0.0 and -_FLOAT32_MIN_NORMAL < value < _FLOAT32_MIN_NORMAL:
            return None
    total = values[0]
    for value in values[1:]:
        total = array("f", (total + value,))[0]
        if total != 0.0 and -_FLOAT32_MIN_NORMAL < total < _FLOAT32_MIN_NORMAL:
            return None
    return total


def mean_step_loss(losses: list[torch.Tensor]) -> float:
    """``float(l_1 + l_2 + ... + l_n) / n``: a client's mean local loss over the steps that returned one, the sum
    taken left to right as tensor additions (so it rounds as a running ``loss_sum + loss`` in the losses' dtype
    would); ``nan`` for no losses.

    Up to 16 scalar float32 or float64 losses on the CPU (a client of a handful of local steps) are read with
    ``item()`` and added as Python floats, each sum rounded to the losses' dtype (:func:`_host_running_sum`: the
    same IEEE additions, so the result is identical). For more, or on another device, the same additions run in one
    ``numpy.add.accumulate`` after one ``stack`` and one copy to the host (documented as that running loop in the
    array's dtype: the same IEEE operations in the same order, so the result is identical), without a tensor
    operation per step (on an accelerator: one copy instead of a kernel launch per step, and the one host sync the
    ``float`` needed anyway); anything else (other dtypes or shapes, mixed dtypes or devices) is added as tensors.

    Args:
        losses: The detached losses of the client's local steps, in step order.

    Example::

        >>> mean_step_loss([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(4.5)])
        2.5
        >>> mean_step_loss([])
        nan
    """
    if not losses:
        return math.nan
    first = losses[0]
    if (1 < len(losses) <= _HOST_SUM_MAX and first.is_cpu and first.dtype in _FLOAT_32_64
            and lean_step.HOST_SCALARS_ON_CPU):
        total = _host_running_sum(losses, first.dtype)
        if total is not None:
            return total / len(losses)
    if len(losses) > 1 and first.dtype in _FLOAT_32_64:
        try:
            stacked = torch.stack(losses)
        except RuntimeError:  # different shapes or devices: added as tensors below
            stacked = None
        if stacked is not None and stacked.ndim == 1 and stacked.dtype == first.dtype:
            # NumPy documents `add.accumulate` as the running loop `t = t + a[i]` in the array's dtype
            return float(np.add.accumulate(stacked.detach().cpu().numpy())[-1]) / len(losses)
    total = first
    for loss in losses[1:]:
        total = total + loss
    return float(total) / len(losses)


def _distributed(trainer: Any) -> bool:
    return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()


def rank_share(runner: ClientRunner, cohort: np.ndarray) -> list[int]:
    """The clients of ``cohort`` this rank trains: all of them in one process; under several processes its share
    (:func:`~lightning_fed.distributed.assign_clients`: balanced by client sample count, largest first), in cohort
    order."""
    trainer = runner.trainer
    mine = [int(c) for c in cohort.tolist()]
    if _distributed(trainer):
        sizes = [runner.datamodule.client_num_samples(c) for c in mine]
        mine = assign_clients(mine, sizes, trainer.world_size)[trainer.global_rank]
    return mine


def gather_round(runner: ClientRunner, updates: list[ClientUpdate], failures: list[tuple[int, str]],
                 cohort: np.ndarray) -> RoundResult:
    """This rank's ``updates`` and ``failures``, or under several processes every rank's, in cohort order
    (:func:`~lightning_fed.distributed.gather_updates`, through ``/dev/shm`` on one host unless the strategy's
    ``shared_memory`` is False)."""
    trainer = runner.trainer
    if not _distributed(trainer):
        return updates, failures
    return gather_updates(updates, failures, cohort, trainer.strategy.root_device,
                          shared_memory=getattr(trainer.strategy, "shared_memory", True))


class ClientExecutor(abc.ABC):
    """Runs the local work of a round's cohort and returns one :class:`ClientUpdate` per client that reported back.

    The federated loop owns everything around it (sampling, the global model x_t, aggregation); an executor
    only decides how clients are trained: one after another in this process (:class:`SequentialExecutor`),
    vectorised (:class:`~lightning_fed.client.vectorized.VectorizedExecutor`) or spread over ranks. It works
    through the :class:`~lightning_fed.client.runner.ClientRunner` it is given (start a client from x_t, local
    steps, finish it into a ``ClientUpdate``, report a failure) and never touches the loop.

    Example: an executor that records each round's cohort and delegates the training::

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
        >>> class Recording(ClientExecutor):
        ...     def __init__(self):
        ...         self.cohorts, self.inner = [], SequentialExecutor()
        ...     def run_round(self, runner, cohort, round_idx):
        ...         self.cohorts.append(cohort.tolist())
        ...         return self.inner.run_round(runner, cohort, round_idx)
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2)
        >>> executor = Recording()
        >>> quiet_trainer(max_epochs=2, client_executor=executor).fit(Line(), datamodule=dm)
        >>> executor.cohorts, executor.cohorts == [dm.sample_clients(t).tolist() for t in (0, 1)]  # the seeded S_t
        ([[2, 0], [2, 1]], True)
    """

    #: Whether :meth:`run_round` applies the loop's ``client_timeout_s`` (the loop refuses a time limit otherwise).
    supports_client_timeout: bool = False

    @abc.abstractmethod
    def run_round(self, runner: ClientRunner, cohort: np.ndarray, round_idx: int) -> RoundResult:
        """Train every client of ``cohort`` (shape ``[C]``) from x_t; return ``(updates, failures)``: the updates in
        cohort order, and ``(client id, reason)`` for each client dropped (each from
        :meth:`ClientRunner.report_failure` / :meth:`ClientRunner.client_failed`, which apply the failure policy)."""


class SequentialExecutor(ClientExecutor):
    """Trains the cohort's clients one after another with the module's own ``training_step`` and optimizer.

    For each client (Reddi et al. 2021, Alg. 1, l. 4-9): load x_t into the module in place, give it a fresh
    client optimizer (state cleared, hyper-parameters as at the start of the round), seed torch with
    :func:`client_seed`, run its mini-batches through Lightning's optimization loop (so hooks, precision,
    gradient clipping and ``self.log`` behave as in ordinary training), and record Δ_i = x_i − x_t.

    Under several processes (``FederatedTrainer(strategy="ddp", devices=..., num_nodes=...)``) each rank trains
    its share of the cohort (:func:`~lightning_fed.distributed.assign_clients`: balanced by client sample count,
    largest first) and the round's updates are gathered on every rank
    (:func:`~lightning_fed.distributed.gather_updates`), in cohort order: since every client's randomness is a
    pure function of (seed, round, client), the result equals a single-process run.

    With the loop's ``client_timeout_s`` each client's :meth:`train_client` runs under a
    :class:`~lightning_fed.interrupts.ClientTimeLimit` (interrupted by ``SIGALRM`` in the main thread; elsewhere
    checked between local steps only); a client past the limit is dropped through the runner's
    :meth:`~lightning_fed.client.runner.ClientRunner.report_failure` (``on_client_failure="raise"`` raises).

    Example: 2 rounds × 2 clients × 2 local batches (2 samples each, batch size 1) = 8 client optimizer steps::

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
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2, batch_size=1)
        >>> trainer = quiet_trainer(max_epochs=2)
        >>> type(trainer.fit_loop.executor).__name__
        'SequentialExecutor'
        >>> trainer.fit(Line(), datamodule=dm)
        >>> trainer.current_epoch, trainer.global_step
        (2, 8)
    """

    supports_client_timeout = True
    _time_limit: Optional[ClientTimeLimit] = None  # the current client's limit (checked between local steps)

    def run_round(self, runner: ClientRunner, cohort: np.ndarray, round_idx: int) -> RoundResult:
        mine = rank_share(runner, cohort)
        updates: list[ClientUpdate] = []
        failures: list[tuple[int, str]] = []
        timeout_s = runner.client_timeout_s
        for position, cid in enumerate(mine):
            limit = None if timeout_s is None else ClientTimeLimit(timeout_s, cid, round_idx)
            try:
                self._time_limit = limit
                with limit if limit is not None else contextlib.nullcontext():
                    update = self.train_client(runner, cid, round_idx)
            except ClientTimeout as timeout:
                failures.append(runner.report_failure(cid, f"timed out (client_timeout_s={timeout.limit_s:g} s)"))
                continue
            except Exception as error:  # noqa: BLE001 - a failing client must not end a day-long simulation
                failures.append(runner.client_failed(cid, error))
                continue
            finally:
                self._time_limit = None
            updates.append(update)
            runner.client_end(update, position)
        return gather_round(runner, updates, failures, cohort)

    def train_client(self, runner: ClientRunner, cid: int, round_idx: int) -> ClientUpdate:
        """One client's local work in round ``round_idx``, starting from the round's global model x_t."""
        datamodule = runner.datamodule
        runner.start_client(cid)
        seed_client(client_seed(datamodule.seed, round_idx, cid), runner.trainer.strategy.root_device)
        losses: list[torch.Tensor] = []
        steps = 0
        for batch_idx, batch in enumerate(datamodule.client_dataloader(cid, round_idx)):
            output = runner.local_step(batch, batch_idx)
            if self._time_limit is not None:
                self._time_limit.check()  # the only check where SIGALRM cannot be used
            if output is runner.STOP:
                break
            steps += 1
            loss = output.get("loss") if isinstance(output, dict) else None
            if loss is not None:  # manual optimization may return nothing: no loss reported, not a NaN
                losses.append(loss.detach() if loss.requires_grad else loss)
        return runner.finish_client(cid, num_steps=steps, loss=mean_step_loss(losses), loss_steps=len(losses))
