"""``self.log`` in a ``training_step`` that the vectorized executor runs under ``vmap``: the values are recorded per
client and reach the round's log as they would through the sequential executor.

Inside ``vmap(grad_and_value(training_step))`` the module's ``log``/``log_dict`` are replaced by a
:class:`LogRecorder`. It keeps each call's value (a tensor that is batched over the clients, or a number) and returns
them, stacked per name, as the auxiliary output of the vmapped function, so every local step yields a ``[G]`` value
per logged name for the G clients of the call. :class:`ClientLogSums` adds them up per client exactly as
:class:`~lightning_fed.round_logging.RoundLogAccumulator` reduces a client's values on the sequential path (see
:mod:`lightning_fed.round_logging`):

* step level (``on_step=True``, ``training_step``'s default): the client's mean over its local steps of each step's
  last value of the name;
* epoch level (``on_epoch=True``, mean reduction): the client's batch-size-weighted mean over every call (batch size
  ``batch_size=`` or, as Lightning extracts it, the length of the client's mini-batch).

At the end of the round each name is registered in the trainer's result collection by one call of Lightning's own
``LightningModule.log`` under the hook ``training_step`` (its checks, default ``on_step``/``on_epoch`` and metadata),
and each client's values go to the round log (:meth:`RoundLogAccumulator.record_client
<lightning_fed.round_logging.RoundLogAccumulator.record_client>`), which writes the round's client-weighted value
Σ_i w_i m_i — the same value as the sequential executor's up to floating-point rounding (sums in float64 instead
of Lightning's float32 accumulator). Not recorded (and named in one ``UserWarning`` by the executor):
``torchmetrics.Metric`` objects, reductions other than the mean, ``sync_dist=True``, ``metric_attribute``, values
that are not one number per client.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Optional

import numpy as np
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_fed import _lightning as pl_private

_MEAN = ("mean", torch.mean)
#: The log arguments that go into Lightning's metadata of a logged name (and their defaults): recorded per name and
#: passed to the registration call, so the result metric is the one the sequential executor's calls would make.
_LOG_DEFAULTS = {"prog_bar": False, "logger": None, "on_step": None, "on_epoch": None, "enable_graph": False,
                 "add_dataloader_idx": True, "rank_zero_only": False}
_HOOK = "training_step"


class LogRecorder:
    """Stands in for ``LightningModule.log``/``log_dict`` while ``training_step`` runs under ``vmap``.

    Each traced call of ``training_step`` (one per vmapped local step; :meth:`begin` starts it) records the calls of
    ``self.log`` with their values; :meth:`take` then returns them as ``{name: Tensor[n_calls]}`` (per client, inside
    ``vmap``) and keeps the call's host-side facts in :attr:`taken` (name → its ``batch_size`` arguments, ``None``
    where not given).

    Attributes:
        kwargs: name → the log arguments of its first call (``batch_size`` aside), in first-call order.
        unsupported: the names whose values cannot be recorded (see the module docstring).

    Example::

        >>> recorder = LogRecorder()
        >>> recorder.begin()
        >>> recorder.log("loss", torch.tensor(2.0), prog_bar=True)
        >>> recorder.log_dict({"a": 1.0, "b": torch.tensor(3.0)}, batch_size=4)
        >>> {name: value.tolist() for name, value in recorder.take().items()}  # float64, one entry per call
        {'loss': [2.0], 'a': [1.0], 'b': [3.0]}
        >>> recorder.taken, recorder.kwargs["loss"]
        ({'loss': [None], 'a': [4], 'b': [4]}, {'prog_bar': True})
    """

    def __init__(self) -> None:
        self.kwargs: dict[str, dict[str, Any]] = {}
        self.unsupported: set[str] = set()
        self.trace: dict[str, list[Optional[int]]] = {}
        self.taken: dict[str, list[Optional[int]]] = {}
        self._values: dict[str, list[Tensor]] = {}

    def begin(self) -> None:
        """A new traced call of ``training_step``: nothing recorded yet."""
        self._values, self.trace = {}, {}

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: Optional[bool] = None,
        on_step: Optional[bool] = None,
        on_epoch: Optional[bool] = None,
        reduce_fx: Any = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: Optional[int] = None,
        metric_attribute: Optional[str] = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record ``value`` for ``name`` (the arguments as ``LightningModule.log``'s)."""
        name = str(name)
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            value = torch.tensor(float(value), dtype=torch.float64)
        if (
            name in self.unsupported or not isinstance(value, Tensor) or value.numel() != 1
            or reduce_fx not in _MEAN or sync_dist or metric_attribute is not None
            or (batch_size is not None and not isinstance(batch_size, int))
        ):
            self.unsupported.add(name)
            self._values.pop(name, None)
            self.trace.pop(name, None)
            return
        kwargs = {"prog_bar": prog_bar, "logger": logger, "on_step": on_step, "on_epoch": on_epoch,
                  "enable_graph": enable_graph, "add_dataloader_idx": add_dataloader_idx,
                  "rank_zero_only": rank_zero_only}
        kwargs = {k: v for k, v in kwargs.items() if v != _LOG_DEFAULTS[k]}
        self.kwargs.setdefault(name, kwargs)
        if kwargs != self.kwargs[name]:  # as Lightning's result collection refuses it
            raise MisconfigurationException(
                f"You called `self.log({name}, ...)` twice in `{_HOOK}` with different arguments. This is not allowed"
            )
        self._values.setdefault(name, []).append(value.detach().reshape(()).to(torch.float64))
        self.trace.setdefault(name, []).append(batch_size)

    def log_dict(
        self,
        dictionary: Any,
        prog_bar: bool = False,
        logger: Optional[bool] = None,
        on_step: Optional[bool] = None,
        on_epoch: Optional[bool] = None,
        reduce_fx: Any = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: Optional[int] = None,
        rank_zero_only: bool = False,
    ) -> None:
        """:meth:`log` for each item of ``dictionary`` (the arguments as ``LightningModule.log_dict``'s)."""
        for name, value in dict(dictionary).items():
            self.log(name, value, prog_bar=prog_bar, logger=logger, on_step=on_step, on_epoch=on_epoch,
                     reduce_fx=reduce_fx, enable_graph=enable_graph, sync_dist=sync_dist,
                     sync_dist_group=sync_dist_group, add_dataloader_idx=add_dataloader_idx, batch_size=batch_size,
                     rank_zero_only=rank_zero_only)

    def take(self) -> dict[str, Tensor]:
        """This traced call's values, ``{name: Tensor[n_calls]}`` (float64); its ``batch_size`` arguments go to
        :attr:`taken`."""
        values, self._values = self._values, {}
        self.taken, self.trace = self.trace, {}
        return {name: torch.stack(v) for name, v in values.items()}


class ClientLogSums:
    """Per-client sums of the recorded values of one chunk of ``n`` clients (float64, on the values' device).

    Example: two clients; the first logs 1 then 3 (batches of 2 and 4), the second logs 5 (a batch of 2)::

        >>> sums = ClientLogSums(2)
        >>> sums.add({"x": torch.tensor([[1.0], [5.0]], dtype=torch.float64)}, {"x": [None]}, [0, 1], batch_size=2)
        >>> sums.add({"x": torch.tensor([[3.0]], dtype=torch.float64)}, {"x": [None]}, [0], batch_size=4)
        >>> sums.client_values(0), sums.client_values(1)
        ({'x/step': 2.0, 'x/epoch': 2.3333333333333335}, {'x/step': 5.0, 'x/epoch': 5.0})
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._step_sum: dict[str, Tensor] = {}
        self._epoch_sum: dict[str, Tensor] = {}
        self._step_count: dict[str, np.ndarray] = {}
        self._epoch_size: dict[str, np.ndarray] = {}
        self._host: Optional[dict[str, tuple[list[float], list[float]]]] = None

    def add(self, values: dict[str, Tensor], trace: dict[str, list[Optional[int]]], rows: list[int],
            batch_size: int) -> None:
        """One vmapped call's values (``{name: Tensor[len(rows), n_calls]}``) for the chunk's ``rows``, whose
        mini-batches have ``batch_size`` samples each."""
        index: Optional[Tensor] = None
        for name, value in values.items():
            sizes = [batch_size if b is None else b for b in trace.get(name, [])]
            if len(sizes) != value.shape[-1]:
                continue
            if name not in self._step_sum:
                self._step_sum[name] = torch.zeros(self.n, dtype=torch.float64, device=value.device)
                self._epoch_sum[name] = torch.zeros(self.n, dtype=torch.float64, device=value.device)
                self._step_count[name] = np.zeros(self.n, dtype=np.int64)
                self._epoch_size[name] = np.zeros(self.n, dtype=np.int64)
            if index is None or index.device != value.device:
                index = torch.tensor(rows, dtype=torch.long, device=value.device)
            weights = torch.tensor(sizes, dtype=torch.float64, device=value.device)
            self._step_sum[name].index_add_(0, index, value[:, -1])  # the step's last value of the name
            self._epoch_sum[name].index_add_(0, index, (value * weights).sum(-1))
            self._step_count[name][rows] += 1
            self._epoch_size[name][rows] += sum(sizes)

    def client_values(self, row: int) -> dict[str, float]:
        """Row ``row``'s m_i: ``{"<name>/step": mean of its step values, "<name>/epoch": batch-size-weighted
        mean}`` for the names it logged."""
        if self._host is None:
            self._host = {name: (self._step_sum[name].tolist(), self._epoch_sum[name].tolist())
                          for name in self._step_sum}
        out: dict[str, float] = {}
        for name, (step_sum, epoch_sum) in self._host.items():
            if self._step_count[name][row] > 0:
                out[name + "/step"] = step_sum[row] / int(self._step_count[name][row])
            if self._epoch_size[name][row] > 0:
                out[name + "/epoch"] = epoch_sum[row] / int(self._epoch_size[name][row])
        return out


def register_logged_values(trainer: Any, recorder: LogRecorder, names: list[str],
                           log: Callable[..., None] = LightningModule.log) -> list[str]:
    """Register ``names`` (recorded by ``recorder``) in the trainer's result collection with one call each of
    Lightning's ``LightningModule.log`` under the hook ``training_step`` (its checks, defaults and metadata; the
    round log then writes the round's values over the registration value). Returns the result keys
    (``"training_step.<name>"``)."""
    module = trainer.lightning_module
    results = pl_private.results(trainer)
    keys = []
    pl_private.start_logged_batch(trainer, results, None)
    try:
        with pl_private.hook_name(module, _HOOK):
            for name in names:
                log(module, name, torch.tensor(0.0, device=module.device), batch_size=1, **recorder.kwargs[name])
                keys.append(f"{_HOOK}.{name}")
    finally:
        pl_private.clear_logged_batch(results)
    return keys
