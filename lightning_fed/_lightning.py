"""Every private Lightning symbol lightning_fed uses, in one place, each behind a small named function.

Lightning's public API has no seam for a loop whose epoch is a communication round: the federated loop subclasses
``_FitLoop``, drives the epoch loop's optimization helpers one local step at a time and feeds the logger
connector by hand. Those private names live here and nowhere else in the package (``tests/integration/test_client_boundaries.py``
checks it), so a Lightning upgrade that renames one breaks this module, loudly, at import
(:data:`REQUIRED_SYMBOLS`) or in ``tests/test__lightning.py`` (:data:`INSTANCE_ATTRIBUTES`), never a
simulation silently.

Supported Lightning: :data:`SUPPORTED_LIGHTNING` (the ``pyproject.toml`` pin).
"""

from __future__ import annotations

import contextlib
import importlib
from collections import OrderedDict
from typing import Any, Iterator

import lightning
import torch

#: The Lightning versions these private symbols were checked against (``pyproject.toml``: ``lightning>=2.6,<2.7``).
SUPPORTED_LIGHTNING = ">=2.6,<2.7"

#: (module, attribute path) of every private module-level or class-level symbol used below; checked at import.
REQUIRED_SYMBOLS: tuple[tuple[str, str], ...] = (
    ("lightning.pytorch.loops.fit_loop", "_FitLoop"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop._build_kwargs"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop._should_check_val_epoch"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop._update_learning_rates"),
    ("lightning.pytorch.trainer.call", "_call_callback_hooks"),
    ("lightning.pytorch.trainer.call", "_call_lightning_module_hook"),
    ("lightning.pytorch.trainer.call", "_call_strategy_hook"),
    ("lightning.pytorch.trainer.connectors.checkpoint_connector", "_CheckpointConnector"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.on_batch_start"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.on_batch_end"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
     "_LoggerConnector.update_train_step_metrics"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
     "_LoggerConnector.update_train_epoch_metrics"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.epoch_end_reached"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector.on_epoch_end"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
     "_LoggerConnector.should_reset_tensors"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection.reset"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultMetric"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection._get_cache"),
    ("lightning.pytorch.core.optimizer", "_init_optimizers_and_lr_schedulers"),
    ("lightning.pytorch.trainer.trainer", "Trainer._evaluation_loop"),
    ("lightning.pytorch.core.module", "LightningModule._on_before_batch_transfer"),
    ("lightning.pytorch.callbacks.progress.tqdm_progress", "_update_n"),
    ("lightning.pytorch.strategies.ddp", "_sync_module_states"),
    ("lightning.pytorch.loggers.tensorboard", "_TENSORBOARD_AVAILABLE"),
    ("lightning.fabric.utilities.cloud_io", "_is_local_file_protocol"),
    ("lightning.fabric.utilities.types", "_PATH"),
    ("lightning.pytorch.loops.optimization.automatic", "ClosureResult.from_training_step_output"),
    ("lightning.pytorch.loops.optimization.automatic", "Closure.warning_cache"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection._extract_batch_size"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection.metrics"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_get_default_dtype"),
    ("lightning.fabric.utilities.apply_func", "_BLOCKING_DEVICE_TYPES"),
)

#: Private instance attributes (set in ``__init__``, so not checkable on the class): (owner, attribute).
#: ``tests/test__lightning.py`` checks each on a real trainer, module and callback.
INSTANCE_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("Trainer", "_logger_connector"),
    ("Trainer", "_results"),
    ("Trainer", "_checkpoint_connector"),
    ("Trainer", "_accelerator_connector"),
    ("Strategy", "_checkpoint_io"),
    ("_LoggerConnector", "_first_loop_iter"),
    ("_LoggerConnector", "_progress_bar_metrics"),
    ("_LoggerConnector", "_callback_metrics"),
    ("_LoggerConnector", "_logged_metrics"),
    ("_TrainingEpochLoop", "_batches_that_stepped"),
    ("_TrainingEpochLoop", "automatic_optimization"),
    ("_TrainingEpochLoop", "manual_optimization"),
    ("_AutomaticOptimization", "optim_progress.optimizer.step"),
    ("LightningModule", "_current_fx_name"),
    ("ModelCheckpoint", "_every_n_train_steps"),
    ("ModelCheckpoint", "_train_time_interval"),
    ("ModelCheckpoint", "_save_on_train_epoch_end"),
    ("_ResultMetric", "_forward_cache"),
    ("_ResultMetric", "_computed"),
    ("_ResultMetric", "_update_count"),
    ("_ResultMetric", "has_reset"),
    ("_EvaluationLoop", "_results"),
    ("_LoggerConnector", "_current_fx"),
    ("_AutomaticOptimization", "optim_progress.optimizer.zero_grad"),
    ("TensorBoardLogger", "_version"),
    ("CSVLogger", "_version"),
    ("CSVLogger", "_experiment"),
)


def _resolve(module: str, path: str) -> Any:
    try:
        obj: Any = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"lightning_fed needs the private Lightning symbol {module}.{path}, which the installed lightning "
            f"{lightning.__version__} lacks ({error}); lightning_fed supports lightning{SUPPORTED_LIGHTNING}: "
            f"install a supported version (pip install 'lightning{SUPPORTED_LIGHTNING}')."
        ) from error
    return obj


def _check_required() -> dict[str, Any]:
    return {f"{module}:{path}": _resolve(module, path) for module, path in REQUIRED_SYMBOLS}


_SYMBOLS = _check_required()


def _symbol(module: str, path: str) -> Any:
    return _SYMBOLS[f"{module}:{path}"]


_call = "lightning.pytorch.trainer.call"

#: Lightning's fit loop, the base class of :class:`~lightning_fed.FederatedFitLoop`.
FitLoop = _symbol("lightning.pytorch.loops.fit_loop", "_FitLoop")
#: Lightning's checkpoint connector, the base class of :class:`~lightning_fed.checkpoint.FederatedCheckpointConnector`.
CheckpointConnector = _symbol("lightning.pytorch.trainer.connectors.checkpoint_connector", "_CheckpointConnector")
#: Lightning's path type (``str | Path``).
PATH = _symbol("lightning.fabric.utilities.types", "_PATH")
#: The device types ``move_data_to_device`` copies to without ``non_blocking=True`` (``("cpu", "mps")``).
BLOCKING_DEVICE_TYPES: tuple[str, ...] = tuple(
    _symbol("lightning.fabric.utilities.apply_func", "_BLOCKING_DEVICE_TYPES")
)


def tensorboard_available() -> bool:
    """Whether TensorBoard is installed (Lightning's own test, read at call time, used for its default logger)."""
    return bool(importlib.import_module("lightning.pytorch.loggers.tensorboard")._TENSORBOARD_AVAILABLE)


# ---------------------------------------------------------------------------------------------- hooks
def call_callback_hooks(trainer: Any, hook: str, *args: Any, **kwargs: Any) -> None:
    """Run callback hook ``hook`` on every callback, as Lightning's loops do (profiling, ``_current_fx_name``)."""
    _symbol(_call, "_call_callback_hooks")(trainer, hook, *args, **kwargs)


def call_module_hook(trainer: Any, hook: str, *args: Any, **kwargs: Any) -> Any:
    """Run LightningModule hook ``hook`` as Lightning's loops do; returns its result."""
    return _symbol(_call, "_call_lightning_module_hook")(trainer, hook, *args, **kwargs)


def call_strategy_hook(trainer: Any, hook: str, *args: Any, **kwargs: Any) -> Any:
    """Run strategy hook ``hook`` as Lightning's loops do; returns its result."""
    return _symbol(_call, "_call_strategy_hook")(trainer, hook, *args, **kwargs)


@contextlib.contextmanager
def hook_name(module: Any, name: str) -> Iterator[None]:
    """Within the block, ``self.log`` in ``module`` files values under hook ``name`` (``_current_fx_name``)."""
    previous, module._current_fx_name = module._current_fx_name, name
    try:
        yield
    finally:
        module._current_fx_name = previous


def before_batch_transfer(module: Any, batch: Any) -> Any:
    """The module's and data module's ``on_before_batch_transfer`` hooks, as Lightning's fetcher calls them."""
    return module._on_before_batch_transfer(batch, dataloader_idx=0)


def init_optimizers(module: Any) -> list[Any]:
    """The optimizers ``module.configure_optimizers()`` returns, normalised as Lightning does (schedulers dropped)."""
    optimizers, _ = _symbol("lightning.pytorch.core.optimizer", "_init_optimizers_and_lr_schedulers")(module)
    return list(optimizers)


# ---------------------------------------------------------------------------------------------- logging
def new_result_collection(training: bool) -> Any:
    """An empty Lightning results collection (what ``self.log`` writes into)."""
    return _symbol("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultCollection")(
        training=training
    )


def result_epoch_values(collection: Any) -> dict[str, Any]:
    """The epoch-level value (a tensor) of every metric logged into ``collection``, by name, as Lightning's
    ``metrics(on_step=False)`` computes them."""
    values = {}
    for _, metric in collection.valid_items():
        if metric.meta.on_epoch:
            values[metric.meta.name] = collection._get_cache(metric, on_step=False)
    return values


@contextlib.contextmanager
def evaluation_results(trainer: Any, collection: Any) -> Iterator[Any]:
    """Within the block, ``self.log`` during evaluation writes into ``collection`` instead of the evaluation loop's
    own results (restored afterwards, with the logger connector's current hook)."""
    loop = trainer._evaluation_loop
    saved, saved_fx = loop._results, trainer._logger_connector._current_fx
    loop._results = collection
    try:
        yield collection
    finally:
        loop._results = saved
        trainer._logger_connector._current_fx = saved_fx


def results(trainer: Any) -> Any:
    """The trainer's current result collection (the values ``self.log`` recorded), or ``None``."""
    return trainer._results


def log_batch_start(trainer: Any, batch: Any) -> None:
    """The logger connector's start of a training batch (infers the batch size from ``batch``)."""
    trainer._logger_connector.on_batch_start(batch)


def set_logged_batch_size(trainer: Any, size: Any) -> None:
    """Override the batch size ``self.log`` uses for the current batch."""
    trainer._results.batch_size = size


def log_batch_end(trainer: Any) -> None:
    """The logger connector's end of a training batch."""
    trainer._logger_connector.on_batch_end()


def log_round_step_values(trainer: Any) -> None:
    """Move the round's step-level values into the callback/progress-bar metrics and to the loggers (only once the
    connector has seen a batch)."""
    connector = trainer._logger_connector
    if connector._first_loop_iter is not None:
        connector.on_batch_end()
        connector.update_train_step_metrics()


def log_epoch_end_reached(trainer: Any) -> None:
    trainer._logger_connector.epoch_end_reached()


def log_epoch_end(trainer: Any) -> None:
    trainer._logger_connector.on_epoch_end()


def log_train_epoch_metrics(trainer: Any) -> None:
    trainer._logger_connector.update_train_epoch_metrics()


def reset_first_loop_iter(trainer: Any) -> None:
    """After validation: the next training batch starts a fresh step in the logger connector."""
    trainer._logger_connector._first_loop_iter = None


def metric_forward_cache(metric: Any) -> Any:
    """A ``_ResultMetric``'s value of the latest step (``None`` once consumed)."""
    return metric._forward_cache


def set_metric_forward_cache(metric: Any, value: Any) -> None:
    metric._forward_cache = value


def clear_metric_computed(metric: Any) -> None:
    """Forget a ``_ResultMetric``'s cached ``compute()`` result (its value was rewritten)."""
    metric._computed = None


# ---------------------------------------------------------------------------------------------- epoch loop
def batches_that_stepped(epoch_loop: Any) -> int:
    """The step that loggers see (``log_every_n_steps`` counts it)."""
    return epoch_loop._batches_that_stepped


def set_batches_that_stepped(epoch_loop: Any, value: int) -> None:
    epoch_loop._batches_that_stepped = value


def training_step_takes_batch_idx(epoch_loop: Any, batch: Any, batch_idx: int) -> bool:
    """Whether ``training_step`` is called with ``batch_idx`` (Lightning's own signature inspection)."""
    return "batch_idx" in epoch_loop._build_kwargs(OrderedDict(), batch, batch_idx)


def run_automatic_optimization(epoch_loop: Any, optimizer: Any, batch_idx: int, kwargs: OrderedDict) -> Any:
    """One step of Lightning's automatic optimization (closure, backward, clipping, ``optimizer.step``)."""
    return epoch_loop.automatic_optimization.run(optimizer, batch_idx, kwargs)


def run_manual_optimization(epoch_loop: Any, kwargs: OrderedDict) -> Any:
    """One ``training_step`` under manual optimization."""
    return epoch_loop.manual_optimization.run(kwargs)


def lean_step_trackers(epoch_loop: Any) -> tuple[Any, Any, Any, Any]:
    """The progress trackers one step of automatic optimization advances (``_AutomaticOptimization``'s
    ``_optimizer_step`` and zero-grad closure): optimizer step total and current, zero-grad total and current — for
    :func:`count_lean_step`, looked up once rather than at every step."""
    optimizer = epoch_loop.automatic_optimization.optim_progress.optimizer
    return optimizer.step.total, optimizer.step.current, optimizer.zero_grad.total, optimizer.zero_grad.current


def count_lean_step(trackers: tuple[Any, Any, Any, Any]) -> None:
    """Advance the optimizer-step and zero-grad progress (``trackers`` from :func:`lean_step_trackers`) by one step
    of automatic optimization taken outside Lightning's ``_AutomaticOptimization``."""
    step_total, step_current, zero_total, zero_current = trackers
    step_total.ready += 1
    step_total.completed += 1
    step_current.ready += 1
    step_current.completed += 1
    zero_total.ready += 1
    zero_total.started += 1
    zero_total.completed += 1
    zero_current.ready += 1
    zero_current.started += 1
    zero_current.completed += 1


def warn_training_step_returned_none() -> None:
    """The warning Lightning's automatic-optimization ``Closure`` gives (once per process, through its own warning
    cache) when ``training_step`` returns ``None``."""
    warning_cache = _symbol("lightning.pytorch.loops.optimization.automatic", "Closure.warning_cache")
    warning_cache.warn("`training_step` returned `None`. If this was on purpose, ignore this warning...")


def closure_result(training_step_output: Any) -> Any:
    """Lightning's ``ClosureResult`` of a ``training_step`` output (its checks and its detached loss copy), with
    ``accumulate_grad_batches=1``."""
    return _symbol("lightning.pytorch.loops.optimization.automatic", "ClosureResult.from_training_step_output")(
        training_step_output, 1
    )


def current_hook(module: Any) -> Any:
    """The hook ``self.log`` files values under (``_current_fx_name``)."""
    return module._current_fx_name


def set_current_hook(module: Any, name: Any) -> None:
    """``module._current_fx_name = name``, written to the instance's attributes directly (a plain attribute, never a
    parameter, buffer or sub-module: ``nn.Module.__setattr__``'s checks would only cost time)."""
    vars(module)["_current_fx_name"] = name


def logging_hook(trainer: Any) -> Any:
    """The hook the logger connector last logged from (``_current_fx``)."""
    return trainer._logger_connector._current_fx


def start_logged_batch(trainer: Any, results: Any, batch: Any) -> None:
    """The logger connector's ``on_batch_start(batch)`` with the trainer's current ``results`` already at hand
    (``trainer._results`` walks the trainer's state each time it is read)."""
    connector = trainer._logger_connector
    if connector._first_loop_iter is None:
        connector._first_loop_iter = True
    elif connector._first_loop_iter is True:
        connector._first_loop_iter = False
    results.batch = batch
    results.batch_size = None
    results.dataloader_idx = None


def end_logged_batch(trainer: Any, results: Any) -> None:
    """The logger connector's ``on_batch_end()`` with the trainer's current ``results`` already at hand: the values
    ``results.metrics(on_step)`` gives (``on_step``: the connector has seen a batch, as its ``metrics`` property
    decides) into its progress-bar, callback and logged metrics, then the results' batch and batch size dropped —
    what ``on_batch_end`` does, without reading ``trainer._results`` (a walk of the trainer's state) three times."""
    connector = trainer._logger_connector
    metrics = results.metrics(connector._first_loop_iter is not None)
    connector._progress_bar_metrics.update(metrics["pbar"])
    connector._callback_metrics.update(metrics["callback"])
    connector._logged_metrics.update(metrics["log"])
    results.batch = None
    results.batch_size = None


def start_hook_value(trainer: Any, results: Any, metric: Any, fx: str) -> bool:
    """What ``LightningModule.log`` and ``_ResultCollection.log`` do around the update of ``metric`` (a tensor
    ``_ResultMetric`` of ``results``, logged from hook ``fx``) when the logger connector last logged from another hook
    or ``metric`` was reset since: where the connector says tensors are to be reset (``should_reset_tensors(fx)``),
    ``results.reset(metrics=False, fx=fx)``; the hook made the connector's current one; and the update's own
    bookkeeping (``has_reset = False``, torchmetrics' ``_computed = None``, ``_update_count += 1``). The caller then
    updates the metric's value as ``_ResultMetric.update`` would.

    Returns ``False``, having done nothing, when the connector last logged from another hook but would not reset (a
    hook switch within a loop), or under ``Trainer(barebones=True)`` (``log`` logs nothing): the caller calls
    ``log``.
    """
    connector = trainer._logger_connector
    if trainer.barebones:
        return False
    if connector._current_fx != fx:
        if not connector.should_reset_tensors(fx):
            return False
        results.reset(metrics=False, fx=fx)
        connector._current_fx = fx
    metric.has_reset = False
    metric._computed = None
    metric._update_count += 1
    return True


def clear_logged_batch(results: Any) -> None:
    """Drop the results' reference to the current batch and its batch size (what ``on_batch_end`` does last)."""
    results.batch = None
    results.batch_size = None


def logged_batch_size(results: Any, metric: Any, batch_size: Any) -> Any:
    """The batch size ``self.log`` uses for ``metric`` (given, cached, or extracted from the current batch)."""
    return results._extract_batch_size(metric, batch_size, metric.meta)


_RESULT = "lightning.pytorch.trainer.connectors.logger_connector.result"


def log_epoch_mean_again(module: Any, name: str, value: float, prog_bar: bool) -> bool:
    """What ``module.log(name, value, prog_bar=prog_bar, on_step=False, on_epoch=True, batch_size=1)`` does to a
    number when Lightning's logger connector already logs from the module's current hook and that hook's result metric
    for ``name`` exists with exactly these arguments: ``_ResultMetric.update`` of a mean-reduced tensor metric
    (``value += v · 1``, ``cumulated_batch_size += 1``, ``has_reset = False``, and torchmetrics' update bookkeeping:
    ``_computed = None``, ``_update_count += 1``) with ``v`` the number as ``log`` makes
    it a tensor (the default dtype, the module's device), without ``log``'s per-call checks and ``_ResultMetric.to``.

    The first such call of the hook (the connector's current hook is another one, e.g. each round's first round
    metric) first does what ``log`` does then: ``results.reset(metrics=False, fx=hook)`` where the connector says
    tensors are to be reset (:meth:`should_reset_tensors`), and afterwards makes the hook the connector's current one.

    Returns ``False``, having done nothing, when any of that does not hold (or under ``Trainer(barebones=True)``,
    where ``log`` logs nothing); the caller then calls ``module.log``.
    """
    trainer = module._trainer
    fx = module._current_fx_name
    if trainer is None or fx is None or trainer.barebones:
        return False
    connector = trainer._logger_connector
    results = trainer._results
    if results is None or results.dataloader_idx is not None:
        return False
    metric = results.get(f"{fx}.{name}")
    if metric is None or not metric.is_tensor:
        return False
    meta = metric.meta
    device = module.device
    if (
        meta.name != name or meta.fx != fx or meta.prog_bar != prog_bar or meta.logger is not True
        or meta.on_step or meta.on_epoch is not True or not meta.is_mean_reduction or meta.enable_graph
        or meta.add_dataloader_idx is not True or meta.dataloader_idx is not None or meta.metric_attribute is not None
        or meta.sync.should or meta.sync.rank_zero_only
    ):
        return False
    first = connector._current_fx != fx
    if first and connector.should_reset_tensors(fx):  # as LightningModule.log does before its first value
        results.reset(metrics=False, fx=fx)
    if metric.value.device != device or metric.cumulated_batch_size.device != device:
        return False  # (after a reset, module.log's own reset of the same tensors changes nothing)
    v = torch.tensor(value, device=device, dtype=_symbol(_RESULT, "_get_default_dtype")())
    metric.value = metric.value + v * 1
    metric.cumulated_batch_size = metric.cumulated_batch_size + 1
    metric.has_reset = False
    # what torchmetrics' update wrapper does around ``update``: without it ``compute`` at the round's end warns
    # "compute ... called before the update method" once per round metric and could return a stale cached value
    metric._computed = None
    metric._update_count += 1
    if first:
        connector._current_fx = fx
    return True


def count_optimizer_steps(epoch_loop: Any, steps: int) -> None:
    """Advance the optimizer-step progress (``trainer.global_step``) by ``steps`` taken outside Lightning."""
    progress = epoch_loop.automatic_optimization.optim_progress.optimizer.step
    for tracker in (progress.total, progress.current):
        tracker.ready += steps
        tracker.completed += steps


def should_check_val_epoch(epoch_loop: Any) -> bool:
    """Whether this epoch (round) validates (``check_val_every_n_epoch``)."""
    return bool(epoch_loop._should_check_val_epoch())


def update_learning_rates(epoch_loop: Any, interval: str, update_plateau_schedulers: bool) -> None:
    """Step the LR schedulers of ``interval`` (plateau ones or the others)."""
    epoch_loop._update_learning_rates(interval, update_plateau_schedulers=update_plateau_schedulers)


# ---------------------------------------------------------------------------------------------- trainer parts
def set_checkpoint_connector(trainer: Any, connector: Any) -> None:
    trainer._checkpoint_connector = connector


def strategy_has_checkpoint_io(strategy: Any) -> bool:
    """Whether a strategy object was given its own ``CheckpointIO``."""
    return strategy._checkpoint_io is not None


def sync_batchnorm(trainer: Any) -> bool:
    """The trainer's ``sync_batchnorm`` argument."""
    return bool(getattr(trainer._accelerator_connector, "sync_batchnorm", False))


def sync_module_states(model: Any) -> None:
    """Broadcast rank 0's parameters and buffers to every rank (as DDP does at wrap time)."""
    _symbol("lightning.pytorch.strategies.ddp", "_sync_module_states")(model)


def is_local_file_protocol(path: Any) -> bool:
    return bool(_symbol("lightning.fabric.utilities.cloud_io", "_is_local_file_protocol")(path))


def tqdm_update_n(bar: Any, n: int) -> None:
    """Set a tqdm bar's count to ``n`` and refresh it (Lightning's own helper)."""
    _symbol("lightning.pytorch.callbacks.progress.tqdm_progress", "_update_n")(bar, n)


def model_checkpoint_step_triggers(callback: Any) -> tuple[Any, Any]:
    """A ``ModelCheckpoint``'s (``every_n_train_steps``, ``train_time_interval``) as given."""
    return callback._every_n_train_steps, callback._train_time_interval


def model_checkpoint_saves_on_train_epoch_end(callback: Any) -> Any:
    """A ``ModelCheckpoint``'s ``save_on_train_epoch_end`` as given (``None``: decided by Lightning)."""
    return callback._save_on_train_epoch_end


def set_model_checkpoint_saves_on_train_epoch_end(callback: Any, value: bool) -> None:
    callback._save_on_train_epoch_end = value


def logger_version(logger: Any) -> Any:
    """The version a TensorBoard/CSV logger was given or has taken (``None`` until its first use picks the next free
    one): its private ``_version`` (the public ``version`` property would pick it)."""
    return logger._version


def set_logger_version(logger: Any, version: int) -> None:
    """Make a TensorBoard/CSV logger log into ``version_<version>`` (a resume continuing its run's folder)."""
    logger._version = version


def logger_experiment_started(logger: Any) -> bool:
    """Whether a logger has already created its writer (its private ``_experiment``)."""
    return getattr(logger, "_experiment", None) is not None
