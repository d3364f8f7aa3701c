"""What a value logged in ``training_step`` means in a round: one client-weighted value per round.

In ordinary Lightning, ``self.log("train_loss", loss)`` in ``training_step`` logs every step (``on_step=True``) and
``on_epoch=True`` averages over the epoch's batches. In federated training the server's step is the round, so
both become one value per round, computed from the clients that reported back:

* within client i, Lightning's own reduction over its local steps gives m_i — for a step-level value
  (``on_step=True``) the mean over its local steps (each step counts once, as Lightning's step values carry batch
  size 1), for an epoch-level value (``on_epoch=True``, mean reduction) the batch-size-weighted mean;
* across the round, the value is Σ_i w_i m_i with w_i the server optimizer's aggregation weights
  (:meth:`~lightning_fed.callbacks.ServerOptimizer.client_weights`: sample counts, or uniform) renormalised over
  the clients that logged it. Dropped clients (failed, non-finite, timed out) contribute nothing.

The values are logged at the round's step under Lightning's names (``train_loss``, or ``train_loss_step`` and
``train_loss_epoch`` when both are asked for). Logging the loss that ``training_step`` returns therefore gives
exactly ``round_train_loss`` (the loop's sample-weighted mean of the clients' mean local losses). A round in which
no client reported a value logs NaN. Values logged with other reductions (``reduce_fx="max"``, ...) and
``torchmetrics.Metric`` objects keep Lightning's accumulation over all local steps of the round.
"""

from __future__ import annotations

from typing import Any, Union

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_fed._lightning import clear_metric_computed, metric_forward_cache, set_metric_forward_cache

#: The hooks whose ``self.log`` values are per local step in a round.
TRAINING_FX = frozenset({"training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward",
                         "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
                         "optimizer_step", "optimizer_zero_grad", "backward"})


_FLOAT_32_64 = (torch.float32, torch.float64)


def _mean_tensor_metrics(results: Any) -> list[tuple[str, Any]]:
    return [
        (key, rm) for key, rm in results.items()
        if rm.meta.fx in TRAINING_FX and rm.is_tensor and rm.meta.is_mean_reduction
    ]


class RoundLogAccumulator:
    """Collects each client's logged training values and writes the round's client-weighted values back.

    Owned by :class:`~lightning_fed.FederatedFitLoop` (like Lightning's epoch loop owns its optimization helpers);
    the loop calls :meth:`start_client`, :meth:`after_step` after each local step, :meth:`finish_client` for a
    client that reported back, :meth:`discard` for one dropped later, and :meth:`end_round` with the aggregation
    weights before the round's values are logged.

    Example: clients log the mean of their x; x = 1, 2, 6 over 2 clients ({6, 1} and {2}, one full-batch step
    each) and sample-count weights give Σ_i (n_i/n)·mean_i(x) = (2·3.5 + 1·2)/3 = mean(x) = 3, where the plain
    mean over the round's local steps would be (3.5 + 2)/2 = 2.75::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class LogsX(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         self.log("x_mean", x.mean())
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> x = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64)
        >>> dm = FederatedDataModule(TensorDataset(x, 2 * x), partitioner=IIDPartitioner(num_clients=2),
        ...                          clients_per_round=2, batch_size=2)
        >>> trainer = FederatedTrainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        ...                            enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(LogsX(), datamodule=dm)
        >>> [x[dm.client_indices(c)].tolist() for c in (0, 1)], round(float(trainer.callback_metrics["x_mean"]), 10)
        ([[6.0, 1.0], [2.0]], 3.0)
    """

    def __init__(self) -> None:
        self._pending: dict[int, dict[str, float]] = {}
        self._start: dict[str, tuple[Tensor, Tensor]] = {}
        self._step_sum: dict[str, Union[Tensor, float]] = {}  # float64 sums: tensors, or Python floats
        self._step_count: dict[str, int] = {}

    def start_round(self) -> None:
        self._pending = {}

    def start_client(self, results: Any) -> None:
        self._step_sum, self._step_count = {}, {}
        self._start = {
            key: (rm.value.detach().clone(), rm.cumulated_batch_size.detach().clone())
            for key, rm in _mean_tensor_metrics(results) if rm.meta.on_epoch
        }

    def after_step(self, results: Any) -> None:
        """Add this step's step-level values (``on_step=True``) to the client's sums."""
        for key, rm in _mean_tensor_metrics(results):
            cached = metric_forward_cache(rm)
            if rm.meta.on_step and cached is not None and not rm.has_reset:
                self.add_step_value(key, cached)
                set_metric_forward_cache(rm, None)  # consumed: a later step that does not log this value adds nothing

    def add_step_value(self, key: str, value: Tensor) -> None:
        """Add one local step's step-level value of result ``key`` (``"<hook>.<name>"``) to the client's sum (in
        float64, in step order; what :meth:`after_step` does for each value it finds, and what the lean local step's
        ``self.log`` fast path calls directly)."""
        value = value.detach().to(torch.float64)
        self._step_sum[key] = self._step_sum[key] + value if key in self._step_sum else value
        self._step_count[key] = self._step_count.get(key, 0) + 1

    def add_step_values(self, key: str, values: list[Any], to_host: bool = False) -> None:
        """:meth:`add_step_value` for each of ``values`` (in step order: scalar tensors, or Python floats holding a
        float32 or float64 value exactly, as the lean step's ``self.log`` fast path keeps them on the CPU), in one go:
        the same float64 sum, in the same order (on the CPU as Python floats, which are IEEE float64: each float32 or
        float64 value converts exactly and each ``+`` rounds as the float64 tensor addition does). ``to_host=True``
        (at a client's end, where the client's mean is read on the host anyway) treats float tensors on one
        accelerator the same way: one copy to the host instead of two kernel launches per value."""
        if values and all(type(v) is float for v in values):
            floats = values
        elif len(values) > 1 and all(
            type(v) is not float and (v.is_cpu or to_host) and v.dtype in _FLOAT_32_64 and v.device == values[0].device
            for v in values
        ):
            floats = torch.stack([v.detach() for v in values]).double().tolist()
        else:
            for value in values:
                self.add_step_value(key, torch.tensor(value, dtype=torch.float64) if type(value) is float else value)
            return
        total = None if key not in self._step_sum else float(self._step_sum[key])
        for value in floats:
            total = value if total is None else total + value
        self._step_sum[key] = total  # kept as a Python float (IEEE float64: what a float64 tensor would hold)
        self._step_count[key] = self._step_count.get(key, 0) + len(values)

    def finish_client(self, client_id: int, results: Any) -> None:
        """Record client ``client_id``'s m_i for every value it logged."""
        values: dict[str, float] = {}
        for key, total in self._step_sum.items():
            values[key + "/step"] = float(total) / self._step_count[key]
        for key, rm in _mean_tensor_metrics(results):
            if not rm.meta.on_epoch:
                continue
            v0, c0 = self._start.get(key, (torch.zeros((), dtype=rm.value.dtype), torch.zeros((), dtype=torch.long)))
            count = float(rm.cumulated_batch_size - c0)
            if count > 0:
                values[key + "/epoch"] = float(rm.value.double() - v0.double()) / count
        self._pending[int(client_id)] = values

    def record_client(self, client_id: int, values: dict[str, float]) -> None:
        """Record client ``client_id``'s m_i computed elsewhere (the vectorized executor's
        :class:`~lightning_fed.client.vectorized_logging.ClientLogSums`): ``{"<result key>/step" or "/epoch": m_i}``,
        as :meth:`finish_client` records them."""
        self._pending[int(client_id)] = dict(values)

    def discard(self, client_id: int) -> None:
        """Client ``client_id`` was dropped after finishing: its values do not count."""
        self._pending.pop(int(client_id), None)

    def end_round(self, results: Any, weights: dict[int, float]) -> None:
        """Write Σ_i w_i m_i (``weights``: client id → aggregation weight) into the round's logged values."""
        pending = self._pending
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, pending)
            pending = {cid: vals for part in gathered for cid, vals in part.items()}
        pending = {cid: vals for cid, vals in pending.items() if cid in weights}
        for key, rm in _mean_tensor_metrics(results):
            parts = {"/step": rm.meta.on_step, "/epoch": rm.meta.on_epoch}
            for suffix, wanted in parts.items():
                if not wanted:
                    continue
                pairs = [(weights[cid], vals[key + suffix]) for cid, vals in pending.items() if key + suffix in vals]
                total_w = sum(w for w, _ in pairs)
                value = sum(w * v for w, v in pairs) / total_w if pairs and total_w > 0 else float("nan")
                tensor = torch.tensor(value, dtype=rm.value.dtype if rm.value.is_floating_point() else torch.float64,
                                      device=rm.value.device)
                if suffix == "/step":
                    set_metric_forward_cache(rm, tensor)
                    if not rm.meta.on_epoch:
                        rm.value = tensor
                else:
                    rm.value = tensor.clone()
                    rm.cumulated_batch_size = torch.ones_like(rm.cumulated_batch_size)
            clear_metric_computed(rm)
