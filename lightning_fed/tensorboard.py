"""What a federated run writes to TensorBoard at fit start: its hyper-parameters for the HParams tab and the
partition (size statistics, a clients × classes figure).

The HParams tab compares runs by their *session start info*, one per run directory. TensorBoard keeps only the
**first** one written to a run, so :func:`log_federated_hparams` must be the first hparams write of the run:
Lightning's own hparams write at fit start (the model's ``save_hyperparameters`` with a ``hp_metric`` placeholder)
happens only when the :class:`~lightning.pytorch.loggers.TensorBoardLogger` has ``default_hp_metric=True``
(Lightning's default); the ``lightning-fed`` command's logger turns it off. When it already happened, a warning says so.

No experiment summary is written: TensorBoard then builds the HParams table from the union of every run's
hyper-parameters (a FedAdam run's ``server_optimizer/beta1`` next to a FedAvg run without one) and offers every
scalar the runs log (``round_train_loss``, ``val_loss``, ``val_acc``, ...) as a metric column.

matplotlib is imported only when a figure is drawn, rendered with its Agg canvas (no display, no global backend
switch).
"""

from __future__ import annotations

import inspect
import numbers
import os
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

__all__ = [
    "federated_hparams",
    "flatten_settings",
    "label_distribution_figure",
    "log_federated_hparams",
    "log_partition",
    "partition_figure",
]

#: Tag of the partition figure (image) and of the size statistics (text).
PARTITION_FIGURE_TAG = "partition/clients_x_classes"
PARTITION_STATS_TAG = "partition/stats"
#: Tag of the per-client label distribution (stacked bars, :func:`label_distribution_figure`).
PARTITION_DISTRIBUTION_TAG = "partition/label_distribution"

_SIZE_UNITS = ("absolute", "percent")

#: Client-optimizer settings reported from ``trainer.optimizers[0].param_groups[0]``.
_CLIENT_OPTIMIZER_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "betas", "eps")
#: Sequences/arrays longer than this are summarised by type and shape instead of written out.
_MAX_LISTED = 16


# ---------------------------------------------------------------------------------------------- hparams
def _plain(value: Any) -> Any:
    """``value`` as a bool/int/float/str (what TensorBoard's HParams accepts)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return value
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return _plain(value.item())
        if value.size > _MAX_LISTED:
            return f"{value.dtype}{list(value.shape)}"
        return str(value.tolist())
    if isinstance(value, (list, tuple)):
        if len(value) > _MAX_LISTED:
            return f"{type(value).__name__}[{len(value)}]"
        return str([_plain(v) for v in value])
    if isinstance(value, type):
        return value.__name__
    return type(value).__name__


def _settings(obj: Any) -> dict[str, Any]:
    """The constructor arguments of ``obj`` read back from its attributes of the same name (all the project's
    server optimizers, partitioners and local-work policies store them so); arguments without such an attribute,
    an unset ``aggregators`` chain and unset ``client`` algorithms are left out."""
    try:
        params = inspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return {}
    out = {}
    for name, param in params.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in ("aggregators", "client") and getattr(obj, name, None) is None:
            continue  # no aggregator chain / client algorithms: the defaults, as runs logged before they existed
        if hasattr(obj, name):
            out[name] = getattr(obj, name)
    return out


def flatten_settings(name: str, obj: Any) -> dict[str, Any]:
    """``{name: class name, "name/arg": value, ...}`` for an object, or ``{"name/key": value}`` for a mapping.

    Nested mappings and objects with constructor arguments (a partitioner inside a data module's settings, ...)
    are flattened recursively into ``name/outer/inner`` keys; values become bool/int/float/str (``None`` →
    ``"None"``, short lists → their ``str``, long arrays → ``"dtype[shape]"``).
    """
    out: dict[str, Any] = {}
    if isinstance(obj, dict) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not isinstance(obj, type)):
        items = {str(k): obj[k] for k in obj.keys() if not str(k).startswith("_")}
    else:
        out[name] = type(obj).__name__
        items = _settings(obj)
    for key, value in items.items():
        if _is_component(value):
            out.update(flatten_settings(f"{name}/{key}", value))
        elif isinstance(value, dict):
            out.update(flatten_settings(f"{name}/{key}", value))
        else:
            out[f"{name}/{key}"] = _plain(value)
    return out


def _is_component(value: Any) -> bool:
    from lightning_fed.callbacks.server_optimizer import ServerOptimizer
    from lightning_fed.datamodules.local_work import LocalWork
    from lightning_fed.datamodules.partition import Partitioner

    return isinstance(value, (ServerOptimizer, Partitioner, LocalWork))


def federated_hparams(trainer: Any) -> dict[str, Any]:
    """The settings that tell federated runs apart, flat, as TensorBoard HParams (bool/int/float/str values).

    Keys (``X/arg`` are the constructor arguments of X, e.g. ``server_optimizer/lr``, ``partitioner/alpha``):

    - ``server_optimizer``, ``server_optimizer/*``: the ServerOpt (Reddi et al. 2021, Alg. 1, l. 11) and its
      server learning rate η, β₁, β₂, τ, weighting, ...;
    - ``partitioner``, ``partitioner/*``, ``num_clients`` (N of the computed partition);
    - ``clients_per_round`` (cohort size C), ``local_work``, ``local_work/*`` (local epochs E or steps, batch size
      B), ``data_order``, ``seed`` (the data module's seed: cohorts, local work, data order), ``client_dropout``,
      ``over_selection``, ``drop_last``, ``data`` (the data module class);
    - ``rounds`` (``max_epochs``), ``global_seed`` (``seed_everything``'s, ``"None"`` when not called);
    - ``client_optimizer``, ``client_optimizer/*`` (lr, momentum, ... of the client optimizer's first parameter
      group, as built by ``configure_optimizers``);
    - ``model``, ``model/*``: the module class and its saved hyper-parameters (``save_hyperparameters``).

    Args:
        trainer: A :class:`~lightning_fed.FederatedTrainer` whose data module is set up (the fit loop's start).
    """
    dm = trainer.datamodule
    module = trainer.lightning_module
    out: dict[str, Any] = {}
    from lightning_fed.loop import find_server_optimizer

    out.update(flatten_settings("server_optimizer", find_server_optimizer(trainer.callbacks)))
    if getattr(dm, "partitioner", None) is not None:
        out.update(flatten_settings("partitioner", dm.partitioner))
    out["num_clients"] = int(dm.partition.num_clients)
    out["clients_per_round"] = int(dm.clients_per_round)
    if getattr(dm, "local_work", None) is not None:
        out.update(flatten_settings("local_work", dm.local_work))
    for key in ("data_order", "seed", "client_dropout", "over_selection", "drop_last"):
        if hasattr(dm, key):
            out[key] = _plain(getattr(dm, key))
    out["data"] = type(dm).__name__
    out["rounds"] = _plain(trainer.max_epochs)
    out["global_seed"] = _plain(_global_seed())
    if trainer.optimizers:
        opt = trainer.optimizers[0]
        out["client_optimizer"] = type(opt).__name__
        group = opt.param_groups[0]
        out.update({f"client_optimizer/{k}": _plain(group[k]) for k in _CLIENT_OPTIMIZER_KEYS if k in group})
    if module is not None:
        out["model"] = type(module).__name__
        hparams = dict(getattr(module, "hparams_initial", {}) or {})
        out.update(flatten_settings("model", {k: v for k, v in hparams.items() if not k.startswith("_")}))
    return out


def _global_seed() -> Optional[int]:
    seed = os.environ.get("PL_GLOBAL_SEED")
    return int(seed) if seed is not None else None


def _tensorboard_loggers(trainer: Any) -> list[Any]:
    from lightning.fabric.loggers import TensorBoardLogger as FabricTensorBoardLogger
    from lightning.pytorch.loggers import TensorBoardLogger

    return [lg for lg in trainer.loggers if isinstance(lg, (TensorBoardLogger, FabricTensorBoardLogger))]


def _lightning_logged_hparams(trainer: Any, logger: Any) -> bool:
    """Whether Lightning's own fit-start hparams write (lightning.pytorch.loggers.utilities._log_hyperparams) put a
    session start info into this TensorBoard run before us."""
    if not getattr(trainer, "enable_autolog_hparams", True) or not getattr(logger, "_default_hp_metric", False):
        return False
    module, dm = trainer.lightning_module, trainer.datamodule
    return bool(getattr(module, "_log_hyperparams", False) or (dm is not None and getattr(dm, "_log_hyperparams", False)))


@rank_zero_only
def log_federated_hparams(trainer: Any) -> dict[str, Any]:
    """Write :func:`federated_hparams` to every TensorBoard logger of ``trainer`` as the run's HParams session
    (step 0), and into the logger's ``hparams.yaml`` (``logger.log_hyperparams(params, metrics={})``, which
    writes no placeholder metric). Called once, at the start of the fit loop.

    Returns:
        The hyper-parameters written (``{}`` without a TensorBoard logger).

    Warns:
        when Lightning already wrote this run's hparams session (``TensorBoardLogger(default_hp_metric=True)``
        and a module/data module with ``save_hyperparameters``): TensorBoard shows only that first session.
    """
    loggers = _tensorboard_loggers(trainer)
    if not loggers:
        return {}
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb

    params = federated_hparams(trainer)
    for logger in loggers:
        if _lightning_logged_hparams(trainer, logger):
            rank_zero_warn(
                f"TensorBoard keeps the first hyper-parameter session of a run, and Lightning already wrote one for "
                f"{logger.log_dir!r} (the module's hparams with `hp_metric`): the HParams tab will not show the "
                "federated settings (server optimizer, partitioner, cohort, local work, seed). Create the logger with "
                "`TensorBoardLogger(..., default_hp_metric=False)` (the lightning-fed command does)."
            )
        logger.log_hyperparams(params, metrics={})
        logger.experiment._get_file_writer().add_summary(hparams_pb(params), 0)
    return params


# ---------------------------------------------------------------------------------------------- partition
def partition_figure(partition: Any, max_clients: int = 100) -> Any:
    """A matplotlib figure of the label distribution: clients × classes, colour = fraction of the client's samples.

    Row ``c`` is client ``c`` (the first ``max_clients`` clients), column ``k`` class ``k``; the cell's colour
    (viridis, fixed scale 0 → 1, with a colour bar) is n_{c,k} / n_c, the share of client c's samples with label
    k (0 for an empty client) — the same numbers as :meth:`~lightning_fed.datamodules.Partition.heatmap`.

    Args:
        partition: A :class:`~lightning_fed.datamodules.Partition` with labels.
        max_clients: Number of client rows (default 100).

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas (no pyplot state); ``SummaryWriter.add_figure`` renders it.

    Raises:
        ValueError: the partition has no labels, or ``max_clients`` < 1.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from lightning_fed.datamodules.partition import _check_int

    max_clients = _check_int("max_clients", max_clients, minimum=1)
    hist = partition.label_histogram(max_clients).astype(np.float64)
    totals = hist.sum(axis=1, keepdims=True)
    frac = np.divide(hist, totals, out=np.zeros_like(hist), where=totals > 0)
    rows, cols = frac.shape
    fig = Figure(figsize=(6.4, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(frac, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    shown = f"clients 0-{rows - 1} of {partition.num_clients}" if rows < partition.num_clients else f"{rows} clients"
    ax.set_title(f"Label distribution per client ({shown}, {cols} classes)")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("fraction of the client's samples")
    return fig


def label_distribution_figure(
    partition: Any, size_unit: str = "absolute", max_clients: int = 30, legend: bool = True, title: Optional[str] = None
) -> Any:
    """Per-client label distribution as stacked horizontal bars (the layout of Flower's
    ``flwr_datasets.visualization.plot_label_distributions``, its default ``plot_type="bar"``).

    One bar per client (client 0 at the top, the first ``max_clients`` clients), split into one coloured segment per
    class whose length is n_{c,k}, the number of client c's samples with label k (``size_unit="absolute"``), or
    100 · n_{c,k} / n_c (``"percent"``, every bar then spans 100; an empty client has an empty bar). The legend names
    the classes: ``Partition.label_names`` for text labels, else the class index. Without labels, each bar is the
    client's size (one segment, no legend), e.g. for a natural partition such as Shakespeare.

    Args:
        partition: a :class:`~lightning_fed.datamodules.Partition`.
        size_unit: ``"absolute"`` (default, sample counts) or ``"percent"`` (share of the client's samples).
        max_clients: number of client bars (int >= 1, default 30).
        legend: draw the class legend (bool, default ``True``), right of the bars.
        title: figure title (default: a description of what is shown).

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas (no pyplot state), width 8 in, height growing with the number
        of clients; ``fig.savefig(path)`` writes it, ``SummaryWriter.add_figure`` logs it.

    Raises:
        ValueError: ``size_unit`` not in ``("absolute", "percent")`` or ``max_clients`` < 1.
        TypeError: ``legend`` is not a bool.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lightning_fed.datamodules.partition import _check_int

    if size_unit not in _SIZE_UNITS:
        raise ValueError(f"`size_unit` must be one of {_SIZE_UNITS}, got {size_unit!r}")
    max_clients = _check_int("max_clients", max_clients, minimum=1)
    if not isinstance(legend, (bool, np.bool_)):
        raise TypeError(f"`legend` must be a bool, got {legend!r}")
    rows = min(max_clients, partition.num_clients)
    has_labels = partition.labels is not None
    if has_labels:
        values = partition.label_histogram(rows).astype(np.float64)  # [rows, C]
    else:
        values = partition.sizes()[:rows].astype(np.float64)[:, None]
    if size_unit == "percent":
        totals = values.sum(axis=1, keepdims=True)
        values = np.divide(100.0 * values, totals, out=np.zeros_like(values), where=totals > 0)
    num_classes = values.shape[1]
    fig = Figure(figsize=(8.0, max(2.5, 0.9 + 0.22 * rows)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = _class_colours(num_classes)
    y = np.arange(rows)
    left = np.zeros(rows)
    names = getattr(partition, "label_names", None)
    for k in range(num_classes):
        label = (str(names[k]) if names is not None else str(k)) if has_labels else "samples"
        ax.barh(y, values[:, k], left=left, height=0.8, color=cmap[k], label=label)
        left += values[:, k]
    ax.set_yticks(y, [str(c) for c in range(rows)], fontsize=7 if rows > 40 else 9)
    ax.invert_yaxis()
    ax.set_ylabel("client")
    ax.set_xlabel("share of the client's samples (%)" if size_unit == "percent" else "number of samples")
    if size_unit == "percent":
        ax.set_xlim(0, 100)
    if title is None:
        shown = f"clients 0-{rows - 1} of {partition.num_clients}" if rows < partition.num_clients else f"{rows} clients"
        what = "Label distribution per client" if has_labels else "Samples per client"
        title = f"{what} ({shown}" + (f", {num_classes} classes)" if has_labels else ")")
    ax.set_title(title)
    if legend and has_labels:
        fig.legend(*ax.get_legend_handles_labels(), title="class", loc="outside right upper",
                   ncols=1 if num_classes <= 25 else 2, fontsize=8)
    return fig


def _class_colours(num_classes: int) -> list:
    """One colour per class: tab10 / tab20 for up to 20 classes, then evenly spaced viridis."""
    from matplotlib import colormaps

    if num_classes <= 10:
        return [colormaps["tab10"](k) for k in range(num_classes)]
    if num_classes <= 20:
        return [colormaps["tab20"](k) for k in range(num_classes)]
    return [colormaps["viridis"](x) for x in np.linspace(0, 1, num_classes)]


@rank_zero_only
def log_partition(trainer: Any, partition: Any, max_clients: int = 100) -> None:
    """Write the partition's size statistics (text, ``partition/stats``), its :func:`label_distribution_figure`
    (image, ``partition/label_distribution``: stacked per-client class counts with a legend, or client sizes without
    labels) and, when it has labels, its :func:`partition_figure` (image, ``partition/clients_x_classes``) to every
    TensorBoard logger, at step 0."""
    for logger in _tensorboard_loggers(trainer):
        experiment = logger.experiment
        stats = partition.stats(label_histogram=False)
        summary = {k: v for k, v in stats.items() if k != "sizes"}
        experiment.add_text(PARTITION_STATS_TAG, "  \n".join(f"{k}: {v}" for k, v in summary.items()), 0)
        experiment.add_figure(PARTITION_DISTRIBUTION_TAG, label_distribution_figure(partition), 0)
        if partition.labels is not None:
            experiment.add_figure(PARTITION_FIGURE_TAG, partition_figure(partition, max_clients), 0)
