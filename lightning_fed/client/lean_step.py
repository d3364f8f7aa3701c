"""The lean local step: one client mini-batch with exactly what Lightning's optimization loop does to the weights and
to ``self.log`` values, without the per-step machinery that does nothing for the run at hand.

:meth:`ClientRunner.local_step <lightning_fed.client.runner.ClientRunner.local_step>` runs every mini-batch through
Lightning's own loop pieces (batch hooks, ``_AutomaticOptimization``'s closure, the precision plugin, the logger
connector): about 1.5 ms of Python per step, plus ~1.4 ms for each ``self.log`` call, which dominates a small
model's step (a 200k-parameter MLP steps in ~1.5 ms). When none of those pieces can do anything — decided once per
round by :func:`lean_step_blocker` — the runner uses a :class:`LeanLocalStep` instead, which does what they would do
and nothing else:

* the batch goes to the device with Lightning's ``move_data_to_device`` (the default ``transfer_batch_to_device``;
  the other batch hooks are identities; a tuple of CPU tensors for a CPU module is left as it is, which is what
  ``move_data_to_device`` returns, and a tuple of plain tensors for another device is copied tensor by tensor as
  ``move_data_to_device`` copies it, without its walk of the collection), the logger connector sees the batch
  (batch-size extraction for ``self.log``; Hugging Face dict batches: the first tensor's length);
* ``_AutomaticOptimization``'s closure, in its order: ``training_step`` (with ``_current_fx_name`` set as
  ``_call_strategy_hook`` sets it), then ``optimizer.zero_grad()`` (``optimizer_zero_grad``'s default), then
  ``loss.backward()`` (``backward``'s default under 32-true precision; skipped when ``training_step`` returned
  ``None``, with Lightning's own warning), run by ``optimizer.step(closure)`` — or, for the torch.optim optimizers
  that call the closure once and first (:data:`CLOSURE_FIRST_OPTIMIZERS`, without step pre-hooks), as
  ``closure(); optimizer.step()``, the same computation without ``step``'s wrappers around the forward and backward
  passes. A tensor output is used as is (Lightning's ``ClosureResult`` divides it by ``accumulate_grad_batches`` = 1
  and copies it: the same numbers); any other output goes through Lightning's ``ClosureResult`` (its checks and
  errors). The weights are the same bit for bit;
* callbacks' ``on_before_optimizer_step`` (e.g. FedProx's proximal term, SCAFFOLD's control-variate correction)
  called as Lightning's precision plugin calls it: after the closure, before the optimizer's update, under that
  hook's name, with the torch optimizer;
* ``trainer.global_step`` and the zero-grad progress counted as ``_AutomaticOptimization`` counts them.

``self.log`` during a lean step goes through a fast path (:meth:`LeanLocalStep.log`): the first call of each name in
a round, and any call it does not handle exactly, goes to Lightning's real ``LightningModule.log`` (so its checks
and errors stay); a later call with the same arguments (batch size aside) of a scalar float tensor with mean
reduction, no ``sync_dist``, no ``enable_graph`` and no ``metric_attribute`` applies what Lightning's
``_ResultMetric.update`` would: epoch-level, ``value += v · batch_size`` and ``cumulated_batch_size += batch_size``
(batch size as Lightning extracts it); step-level, the step's last value of the name (Lightning's forward cache
keeps the last; on the CPU as a Python float, ``item()``: an exact copy, as Lightning's clone is — except while
torch.compile traces a compiled ``training_step``, where ``item()`` would break the graph and a tensor clone is kept)
is kept and, at the client's end (or before a step that used Lightning's log), added in step order to the round's
:class:`~lightning_fed.round_logging.RoundLogAccumulator` in the same float64 running sum it keeps for Lightning's
path (:meth:`~lightning_fed.round_logging.RoundLogAccumulator.add_step_values`). At the end of a client
(:meth:`LeanLocalStep.finish_client`) the last step values go through the logger connector's ``on_batch_end`` once,
so ``trainer.callback_metrics`` & co. hold what they held after the client's last step on Lightning's path.
``torchmetrics.Metric`` objects, other reductions (``"max"``, ``"sum"``...), ``sync_dist``, integer or non-scalar
values, changed arguments always take the real ``log`` (and that step then ends with the logger connector's full
``on_batch_end`` and the round log's ``after_step``, as on Lightning's path). The round's logged values are
therefore the same as on Lightning's path (``tests/client/test_lean_step.py`` compares them exactly).

One difference remains: when a client fails part-way on the lean path, the logger connector's cached
``callback_metrics`` are not refreshed with that client's step values (on Lightning's path they hold its last
completed step until the next client's); the round's logged values are unaffected (a failed client counts nothing).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Optional

import torch
from lightning.fabric.utilities import move_data_to_device
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor

from lightning_fed import _lightning as pl_private
from lightning_fed.client.algorithm import dispatch_only

#: LightningModule hooks that Lightning calls in a training batch; overriding any of them takes Lightning's path.
MODULE_BATCH_HOOKS = (
    "on_train_batch_start", "on_train_batch_end", "on_before_batch_transfer", "transfer_batch_to_device",
    "on_after_batch_transfer", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad", "optimizer_step", "optimizer_zero_grad", "backward", "configure_gradient_clipping",
    "clip_gradients", "lr_scheduler_step",
)
#: LightningDataModule hooks called on a training batch.
DATAMODULE_BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
#: Callback hooks Lightning's optimization calls on every callback of the trainer.
CALLBACK_OPTIMIZATION_HOOKS = ("on_before_zero_grad", "on_before_backward", "on_after_backward")
#: The callback hook the lean step calls itself, where Lightning's precision plugin calls it (``_after_closure``:
#: after the closure's backward, before the optimizer's update): FedProx's and SCAFFOLD's gradient corrections.
CALLBACK_BEFORE_STEP_HOOK = "on_before_optimizer_step"
#: Callback hooks the runner calls on the step callbacks around each local step.
CALLBACK_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end")

_FLOATS = (torch.float32, torch.float64)
_TORCH_OPTIMIZER = importlib.import_module("torch.optim.optimizer")  # (torch.optim does not export the module)
#: torch.optim optimizers whose ``step(closure)`` calls the closure once, first (under ``torch.enable_grad()``), then
#: updates: for them (without step pre-hooks, which ``step(closure)`` runs before the closure) ``closure()`` then
#: ``step()`` is the same computation, and cheaper (the forward and backward passes then run outside ``step``'s
#: ``record_function`` and grad-mode wrappers).
CLOSURE_FIRST_OPTIMIZERS = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.Adadelta,
    torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Rprop, torch.optim.ASGD,
)
_HOOK = "training_step"
#: Whether torch.compile (dynamo) is tracing the caller: ``self.log`` inside a compiled ``training_step`` (e.g. a
#: ``torch.compile``d LightningModule, whose ``training_step`` Lightning compiles) keeps step values as tensors.
_is_compiling = torch.compiler.is_compiling


def lean_step_blocker(trainer: Any, datamodule: Any, step_callbacks: list[Any]) -> Optional[str]:
    """Why Lightning's optimization loop must run this round's local steps (a sentence naming the reason), or
    ``None`` when :class:`LeanLocalStep` does exactly what it would.

    Example::

        >>> import lightning as L, torch
        >>> from lightning_fed import FederatedTrainer
        >>> class Clipped(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1))
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> trainer = FederatedTrainer(gradient_clip_val=1.0, logger=False, accelerator="cpu")
        >>> trainer.strategy.connect(Clipped())
        >>> lean_step_blocker(trainer, None, [])
        'gradient clipping (gradient_clip_val=1.0)'
    """
    module = trainer.lightning_module
    if not module.automatic_optimization:
        return "manual optimization"
    if len(trainer.optimizers) > 1:
        return f"{len(trainer.optimizers)} optimizers"
    if trainer.gradient_clip_val:
        return f"gradient clipping (gradient_clip_val={trainer.gradient_clip_val})"
    if trainer.accumulate_grad_batches != 1:
        return f"accumulate_grad_batches={trainer.accumulate_grad_batches}"
    if type(trainer.precision_plugin) is not Precision:
        return f"precision plugin {type(trainer.precision_plugin).__name__} (not plain 32-true)"
    if type(trainer.profiler) is not PassThroughProfiler:
        return f"profiler {type(trainer.profiler).__name__}"
    strategy = trainer.strategy
    if strategy.model is not module or not (
        (type(strategy) is SingleDeviceStrategy and trainer.world_size == 1) or unwrapped_federated_ddp(strategy)
    ):
        return f"strategy {type(strategy).__name__}"
    if any(config.interval != "epoch" for config in trainer.lr_scheduler_configs):
        return "an LR scheduler stepped per optimizer step"
    for name in MODULE_BATCH_HOOKS:
        if is_overridden(name, module, LightningModule) or name in vars(module):
            return f"the module overrides {name}"
    for dm in {id(d): d for d in (datamodule, trainer.datamodule) if d is not None}.values():
        for name in DATAMODULE_BATCH_HOOKS:
            if is_overridden(name, dm, LightningDataModule):
                return f"the data module overrides {name}"
    for callbacks, names in ((trainer.callbacks, CALLBACK_OPTIMIZATION_HOOKS), (step_callbacks, CALLBACK_BATCH_HOOKS)):
        for callback in callbacks:
            for name in names:
                if is_overridden(name, callback, Callback) and not _idle_batch_hook(callback, name, module):
                    return f"callback {type(callback).__name__} overrides {name}"
    return None


def unwrapped_federated_ddp(strategy: Any) -> bool:
    """Whether ``strategy`` is lightning_fed's own ``FederatedDDPStrategy`` (not a subclass) with the module unwrapped
    and no post-local-SGD model averager: then a local step is the single-device one on this rank's device —
    Lightning's DDP ``training_step`` calls the module directly, ``pre_backward``/``post_backward`` return at once for
    an unwrapped module, and ``optimizer_step`` only adds the averager, which is absent (issue #33: the lean step was
    switched off on every rank). The vectorized executor asks the same to vmap each rank's share of the cohort.

    Example::

        >>> from lightning.pytorch.strategies import SingleDeviceStrategy
        >>> from lightning_fed.distributed import FederatedDDPStrategy
        >>> unwrapped_federated_ddp(FederatedDDPStrategy()), unwrapped_federated_ddp(SingleDeviceStrategy("cpu"))
        (True, False)
    """
    from lightning_fed.distributed import FederatedDDPStrategy

    return type(strategy) is FederatedDDPStrategy and getattr(strategy, "_model_averager", None) is None


def _idle_batch_hook(callback: Any, name: str, module: Any) -> bool:
    """Whether ``callback``'s overridden hook ``name`` provably does nothing in a local step: Lightning's own
    ``ModelCheckpoint`` (not a subclass) under automatic optimization returns from ``on_train_batch_end`` at once
    without ``every_n_train_steps`` and ``train_time_interval`` (which federated training refuses anyway: a checkpoint
    inside a round would hold a client's model)."""
    if type(callback) is ModelCheckpoint and name == "on_train_batch_end" and module.automatic_optimization:
        every_n_train_steps, train_time_interval = pl_private.model_checkpoint_step_triggers(callback)
        return every_n_train_steps < 1 and train_time_interval is None
    return False


def _cpu_tensors(batch: tuple) -> bool:
    """Whether every element of ``batch`` is a CPU ``Tensor`` (not a subclass)."""
    for t in batch:
        if type(t) is not Tensor or not t.is_cpu:
            return False
    return True


def _moved(batch: tuple, device: torch.device, non_blocking: bool) -> Optional[tuple]:
    """What Lightning's ``move_data_to_device(batch, device)`` returns for a tuple of plain ``Tensor`` objects
    (``t.to(device, non_blocking=True)`` for each, without ``non_blocking`` for the devices Lightning keeps blocking:
    ``non_blocking`` is ``device.type not in _lightning.BLOCKING_DEVICE_TYPES``),
    without ``apply_to_collection``'s walk of the collection (~7 µs of Python per step); ``None`` for any other
    batch (a subclass, another element, another collection), which takes ``move_data_to_device`` itself."""
    for t in batch:
        if type(t) is not Tensor:
            return None
    if non_blocking:
        return tuple([t.to(device, non_blocking=True) for t in batch])
    return tuple([t.to(device) for t in batch])


def _closure_first(optimizer: Any) -> bool:
    """Whether ``optimizer.step(closure)`` equals ``closure(); optimizer.step()`` (see
    :data:`CLOSURE_FIRST_OPTIMIZERS`; an optimizer with a step pre-hook or a subclass keeps ``step(closure)``)."""
    return (
        type(optimizer) in CLOSURE_FIRST_OPTIMIZERS
        and not optimizer._optimizer_step_pre_hooks
        and not _TORCH_OPTIMIZER._global_optimizer_pre_hooks
    )


#: On the CPU, a step value logged with ``self.log`` is kept as a Python float (``Tensor.item()``): there that is a
#: copy, not a device synchronisation, and the cheapest one. ``False`` keeps it as a detached tensor clone, the path
#: every other device takes (no host synchronisation inside a local step; the values reach the host once per client,
#: at its end). Both give the same logged values bit for bit (``tests/client/test_lean_step.py``).
HOST_SCALARS_ON_CPU = True


class _Logged:
    """A name the fast ``self.log`` path handles: the arguments it was first logged with and its result metric."""

    __slots__ = (
        "kwargs", "metric", "key", "on_step", "on_epoch", "device", "on_cpu", "cpu_step_only", "results", "pending",
        "pending_dtype", "values", "last", "last_dtype",
    )

    def __init__(self, kwargs: dict, metric: Any, key: str, device: torch.device, results: Any) -> None:
        self.kwargs = kwargs
        self.metric = metric
        self.key = key
        self.on_step = bool(metric.meta.on_step)
        self.on_epoch = bool(metric.meta.on_epoch)
        self.device = device
        # on the CPU a step value is kept as a Python float (``Tensor.item()``: the exact float32/float64 value, no
        # tensor copy); elsewhere as Lightning keeps it, a detached clone (no host sync per step)
        self.on_cpu = device.type == "cpu" and HOST_SCALARS_ON_CPU
        self.cpu_step_only = self.on_cpu and self.on_step and not self.on_epoch  # (LeanLocalStep.log's shortest path)
        self.results = results
        self.pending: Any = None  # this step's step value (a later call in the step replaces it)
        self.pending_dtype: Optional[torch.dtype] = None  # its dtype (a float's tensor dtype, for `last`)
        self.values: list[Any] = []  # the client's step values not yet in the round log (added in order)
        self.last: Any = None  # the client's last step value through the fast path
        self.last_dtype: Optional[torch.dtype] = None

    def last_tensor(self) -> Tensor:
        """The client's last step value as the scalar tensor Lightning's forward cache would hold (a float kept on
        the CPU converts back exactly: it came from a tensor of ``last_dtype``)."""
        last = self.last
        return last if type(last) is Tensor else torch.tensor(last, dtype=self.last_dtype)


class LeanLocalStep:
    """One round's lean local steps for ``trainer``'s module (made by the runner when :func:`lean_step_blocker`
    finds nothing; a new one each round).

    Args:
        trainer: The federated trainer (single device, one optimizer, automatic optimization).
        epoch_loop: Lightning's training epoch loop (its optimizer-step progress is ``trainer.global_step``).
        round_log: The round's :class:`~lightning_fed.round_logging.RoundLogAccumulator`.

    Example: a client step through the lean path equals the plain PyTorch step (zero_grad, backward, step)::

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
        ...         loss = ((self.w * x - y) ** 2).mean()
        ...         self.log("train_loss", loss)
        ...         return loss
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
        >>> dm = FederatedDataModule(TensorDataset(x, 2 * x), partitioner=IIDPartitioner(num_clients=1),
        ...                          clients_per_round=1, batch_size=4)
        >>> trainer = FederatedTrainer(max_epochs=1, logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> model = Line()
        >>> trainer.fit(model, datamodule=dm)
        >>> runner = trainer.fit_loop.client_runner
        >>> runner.step_path, round(model.w.item(), 10), round(float(trainer.callback_metrics["train_loss"]), 10)
        ('lean', 3.0, 30.0)
    """

    def __init__(self, trainer: Any, epoch_loop: Any, round_log: Any, logged: Optional[dict] = None) -> None:
        self._trainer = trainer
        self._module = module = trainer.lightning_module
        self._epoch_loop = epoch_loop
        self._round_log = round_log
        self._optimizer = trainer.optimizers[0]
        self._closure_first = _closure_first(self._optimizer)
        self._device = trainer.strategy.root_device
        self._args: tuple = ()
        self._output: Any = None  # what the closure made of training_step's output (see _closure)
        self._on_cpu = self._device.type == "cpu"
        self._non_blocking = self._device.type not in pl_private.BLOCKING_DEVICE_TYPES  # as move_data_to_device decides
        # the trainer's result collection (fixed within a client; `trainer._results` walks the trainer's state)
        self._collection: Any = pl_private.results(trainer)
        self._trackers = pl_private.lean_step_trackers(epoch_loop)
        self._attributes = vars(module)  # the module's instance attributes (where `log` is installed per step)
        # the names the fast `self.log` path handles: those of `logged` (the previous round's LeanLocalStep's
        # :attr:`logged`) still registered in this result collection, so that each round's first step need not go
        # through LightningModule.log to register them again
        self._logged: dict[str, _Logged] = {
            name: entry for name, entry in (logged or {}).items()
            if entry.results is self._collection and self._collection is not None
            and self._collection.get(entry.key) is entry.metric
        }
        self._real_logged = False
        self._fast_logged = False
        self._touched: list[_Logged] = []  # entries with a step value in the current step
        # callbacks whose on_before_optimizer_step runs after each backward (the others' is Callback's no-op)
        self._before_step = [cb for cb in trainer.callbacks if is_overridden(CALLBACK_BEFORE_STEP_HOOK, cb, Callback)
                             and not dispatch_only(cb)]
        # the fast path stands in for LightningModule.log only: not for a module's own `log` (or a patched one)
        self.fast_log = type(module).log is LightningModule.log and "log" not in vars(module)

    @property
    def logged(self) -> dict:
        """The names the fast ``self.log`` path handles (``{name: entry}``), for the next round's
        ``LeanLocalStep(..., logged=...)``."""
        return self._logged

    # ------------------------------------------------------------------ the step
    def _closure(self) -> Optional[Tensor]:
        """Lightning's automatic-optimization closure: ``training_step`` (as ``_call_strategy_hook`` runs it), then
        ``optimizer.zero_grad()`` (``optimizer_zero_grad``'s default), then ``loss.backward()`` (``backward``'s
        default under 32-true precision) unless the step returned ``None``."""
        if not torch.is_grad_enabled():  # as under `torch.enable_grad()` (grad mode is normally on already)
            with torch.enable_grad():
                return self._closure()
        try:
            module = self._module
            previous = pl_private.current_hook(module)  # as _call_strategy_hook does (no `finally` there either)
            pl_private.set_current_hook(module, _HOOK)
            output = module.training_step(*self._args)
            pl_private.set_current_hook(module, previous)
            if type(output) is Tensor:
                # ClosureResult's loss / accumulate_grad_batches with accumulate_grad_batches = 1 is the loss itself
                # (x / 1 == x exactly, and so is its gradient), and its detached copy is the same numbers
                loss = output
                self._output = {"loss": output.detach()}
            else:
                result = pl_private.closure_result(output)  # Lightning's checks of a dict / None / bad output
                loss = result.closure_loss
                if loss is None:
                    pl_private.warn_training_step_returned_none()
                self._output = {} if result.loss is None else result.asdict()
            self._optimizer.zero_grad()
            if loss is not None:
                loss.backward()
            return loss
        finally:  # grad mode as `torch.enable_grad()` leaves it, whatever training_step did to it
            if not torch.is_grad_enabled():
                torch.set_grad_enabled(True)

    def _after_closure(self) -> None:
        """What Lightning's ``Precision._after_closure`` does here: every callback's ``on_before_optimizer_step``
        under that hook name, with the torch optimizer (the module's own hook and ``configure_gradient_clipping`` are
        Lightning's no-op defaults, or :func:`lean_step_blocker` would have chosen Lightning's loop)."""
        module = self._module
        previous = pl_private.current_hook(module)  # as _call_callback_hooks does (no `finally` there either)
        pl_private.set_current_hook(module, CALLBACK_BEFORE_STEP_HOOK)
        for callback in self._before_step:
            callback.on_before_optimizer_step(self._trainer, module, self._optimizer)
        pl_private.set_current_hook(module, previous)

    def _closure_then_hooks(self) -> Optional[Tensor]:
        """The closure as Lightning's precision plugin wraps it for ``optimizer.step(closure)``."""
        loss = self._closure()
        self._after_closure()
        return loss

    def step(self, batch: Any, batch_idx: int, pass_batch_idx: bool) -> dict[str, Any]:
        """Train on ``batch`` (the ``batch_idx``-th of the client); returns what Lightning's automatic optimization
        returns (``{"loss": detached loss, **extra}``, or ``{}`` when ``training_step`` returned ``None``)."""
        trainer = self._trainer
        results = self._collection
        if type(batch) is not tuple:
            batch = move_data_to_device(batch, self._device)
        elif not (self._on_cpu and _cpu_tensors(batch)):
            # (a tuple of CPU tensors for a CPU module: what move_data_to_device gives is the same tensors)
            moved = _moved(batch, self._device, self._non_blocking)
            batch = move_data_to_device(batch, self._device) if moved is None else moved
        pl_private.start_logged_batch(trainer, results, batch)
        # e.g. a Hugging Face batch: its size is the first tensor's length (a tuple skips the slower ABC check)
        if type(batch) is not tuple and isinstance(batch, Mapping):
            size = next((v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.ndim > 0), None)
            pl_private.set_logged_batch_size(trainer, size)
        self._args = (batch, batch_idx) if pass_batch_idx else (batch,)
        self._real_logged = False
        attributes = self._attributes
        if self.fast_log:
            attributes["log"] = self.log
        self._output = None
        try:
            if self._closure_first:
                self._closure()
                if self._before_step:
                    self._after_closure()
                self._optimizer.step()
            else:
                self._optimizer.step(closure=self._closure_then_hooks if self._before_step else self._closure)
        finally:
            if self.fast_log:
                attributes.pop("log", None)
        output, self._output = self._output, None
        if output is None:
            raise RuntimeError(
                f"{type(self._optimizer).__name__}.step(closure) did not call the closure: training_step never ran "
                "(Lightning's automatic optimization needs an optimizer that calls its closure)."
            )
        pl_private.count_lean_step(self._trackers)
        if self._touched:  # one step value per name and step, the step's last (as the forward cache keeps it)
            for entry in self._touched:
                if entry.pending is not None:
                    entry.values.append(entry.pending)
                    entry.last, entry.pending = entry.pending, None
                    entry.last_dtype = entry.pending_dtype
                    self._fast_logged = True
            self._touched.clear()
        if self._real_logged:
            self._add_step_values()  # the fast path's earlier values first: the round log adds in step order
            pl_private.end_logged_batch(trainer, results)  # (the logger connector's on_batch_end)
            self._round_log.after_step(results)
        else:
            pl_private.clear_logged_batch(results)
        return output

    def start_client(self, results: Any = None) -> None:
        """A new client: no step value of an earlier (possibly failed) client is pending; the optimizer and result
        collection (``results``: the trainer's current one, as the runner has just read it; default: read here) are
        the trainer's current ones (a callback may replace the optimizer before the client starts)."""
        self._collection = pl_private.results(self._trainer) if results is None else results
        self._trackers = pl_private.lean_step_trackers(self._epoch_loop)
        self._optimizer = self._trainer.optimizers[0]
        self._closure_first = _closure_first(self._optimizer)
        self._fast_logged = False
        self._touched.clear()
        for entry in self._logged.values():
            entry.last = entry.pending = None
            entry.values.clear()

    def _add_step_values(self, to_host: bool = False) -> None:
        for entry in self._logged.values():
            if entry.values:
                self._round_log.add_step_values(entry.key, entry.values, to_host=to_host)
                entry.values.clear()

    def finish_client(self) -> None:
        """The client's last step values logged through the fast path go through the logger connector's
        ``on_batch_end`` (as after that step on Lightning's path), then count as consumed."""
        if not self._fast_logged:
            return
        self._fast_logged = False
        self._add_step_values(to_host=True)  # (the round log reads the client's mean on the host next)
        stepped = [entry for entry in self._logged.values() if entry.last is not None]
        for entry in stepped:
            last = entry.last_tensor()
            pl_private.set_metric_forward_cache(entry.metric, last)
            if not entry.on_epoch:
                entry.metric.value = last
        if stepped:  # the logger connector's on_batch_end, with the client's result collection at hand
            pl_private.end_logged_batch(self._trainer, self._collection)
        for entry in stepped:
            pl_private.set_metric_forward_cache(entry.metric, None)
            entry.last = None

    # ------------------------------------------------------------------ self.log
    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """``self.log`` during a lean step (installed on the module for the step only; see the module docstring)."""
        entry = self._logged.get(name)
        trainer = self._trainer
        if (
            entry is None or args or type(value) is not Tensor
            or pl_private.current_hook(self._module) != _HOOK or self._collection is not entry.results
        ):
            return self._real_log(name, value, *args, **kwargs)
        batch_size = kwargs.pop("batch_size", None)
        metric = entry.metric
        if (
            kwargs != entry.kwargs or value.numel() != 1 or value.dtype not in _FLOATS or value.device != entry.device
            or (batch_size is not None and type(batch_size) is not int)
            # the hook's first value since the connector logged from another hook (each round's first step), or
            # this name's first since then: what log does first, done here (pl_private.start_hook_value)
            or ((pl_private.logging_hook(trainer) != _HOOK or metric.has_reset)
                and not pl_private.start_hook_value(trainer, entry.results, metric, _HOOK))
        ):
            if batch_size is not None:
                kwargs["batch_size"] = batch_size
            return self._real_log(name, value, *args, **kwargs)
        if entry.on_step and entry.pending is None and pl_private.metric_forward_cache(metric) is not None:
            if batch_size is not None:  # Lightning's log ran for this name earlier in this step: it continues
                kwargs["batch_size"] = batch_size
            return self._real_log(name, value, *args, **kwargs)
        # what LightningModule.log + _ResultMetric.update do to a scalar float tensor with mean reduction (Lightning
        # keeps a clone of the step value, safe from later in-place changes: `item()` on the CPU is such a copy, and
        # the epoch sum below makes new tensors)
        if entry.cpu_step_only and not _is_compiling():  # the common case: a step value kept as a Python float
            if entry.pending is None:  # (`item()` reads a one-element tensor of any shape, graph or not: no detach)
                self._touched.append(entry)
            entry.pending = value.item()
            entry.pending_dtype = value.dtype
            return
        value = value.detach()
        if value.ndim:
            value = value.squeeze()
        if entry.on_step:
            if entry.pending is None:
                self._touched.append(entry)
            if entry.on_cpu and not _is_compiling():  # (`item()` would break a torch.compile graph)
                entry.pending = value.item()
                entry.pending_dtype = value.dtype
            else:
                entry.pending = value.clone()
        if entry.on_epoch:
            size = pl_private.logged_batch_size(entry.results, metric, batch_size)
            metric.value = metric.value + value * size
            metric.cumulated_batch_size = metric.cumulated_batch_size + size

    def _real_log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self._real_logged = True
        entry = self._logged.get(name)
        if entry is not None:  # this step's value reaches the logger connector (and the round log) on Lightning's path
            entry.last = entry.pending = None
        LightningModule.log(self._module, name, value, *args, **kwargs)
        if entry is None and not args:
            self._register(name, value, kwargs)

    def _register(self, name: str, value: Any, kwargs: dict) -> None:
        trainer = self._trainer
        results = pl_private.results(trainer)
        key = f"{_HOOK}.{name}"
        if (
            type(value) is not Tensor or value.numel() != 1 or value.dtype not in _FLOATS
            or pl_private.current_hook(self._module) != _HOOK or pl_private.logging_hook(trainer) != _HOOK
            or results is None or key not in results
            or kwargs.get("sync_dist") or kwargs.get("enable_graph") or kwargs.get("metric_attribute") is not None
            or (kwargs.get("logger") and trainer.logger is None)
        ):
            return
        metric = results[key]
        if not metric.is_tensor or not metric.meta.is_mean_reduction or metric.meta.name != name:
            return
        kwargs = {k: v for k, v in kwargs.items() if k != "batch_size"}
        self._logged[name] = _Logged(kwargs, metric, key, value.device, results)
