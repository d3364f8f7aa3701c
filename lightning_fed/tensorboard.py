"""What a federated run writes to TensorBoard at fit start: a *Custom Scalars* layout (the curves that matter first:
validation metrics, round loss, pseudo-gradient norm, gradient diversity), its hyper-parameters for the HParams tab
and the partition (rounded size statistics, the client-size distribution, per-client label shares where labels exist).

The HParams tab compares runs by their *session start info*, one per run directory. TensorBoard keeps only the
**first** one written to a run, so :func:`log_federated_hparams` must be the first hparams write of the run:
Lightning's own hparams write at fit start (the model's ``save_hyperparameters`` with a ``hp_metric`` placeholder)
happens only when the :class:`~lightning.pytorch.loggers.TensorBoardLogger` has ``default_hp_metric=True``
(Lightning's default); the ``lightning-fed`` command's logger turns it off. When it already happened, a warning says so.

Column order in the HParams tab: TensorBoard sorts the settings by name (with a run's experiment summary, see
below; without one it puts the settings that differ between the shown runs first) and ticks the first five. The
first five names (capitalised, so they sort before every ``snake_case`` key) are therefore the federated summary: ``Cohort`` (clients per round), ``Local work``, ``Partitioner``,
``Server optimizer`` and ``Server optimizer lr`` (η). Each run is its own session group (the *trial id* is the run's
log directory), so two runs with equal settings stay two rows.

``Cohort`` is written to TensorBoard as text (``"10"``): the HParams tab shows every number with five significant
digits (``10.000``); ``hparams.yaml`` keeps the int.

Metric columns: TensorBoard ticks the first five metric columns, and without an *experiment summary* it orders them
by name, so ``val_acc`` came after every ``round_*`` scalar, unticked. Once the first round with validation metrics
is logged (or at the end of the fit, whichever comes first), each run therefore writes an experiment summary: the
hyper-parameters above, then the metric columns with the validation metrics (``val_*``) first, then the other
scalars logged so far, by name. TensorBoard takes the columns of the table from one run's experiment summary (any
one of those shown): a hyper-parameter that only another run has (a FedAdam run's ``server_optimizer/beta1`` next
to a FedAvg run) has no column then, nor a scalar first logged later in the run; and the columns are in name order
(the five above ticked), not "the settings that differ first" (TensorBoard computes that only without a summary).

With federated evaluation, the metric columns after the validation metrics are ``fed_personal_<m>/weighted`` and
``fed_<m>/weighted`` (then their ``/worst10``) for each validation metric ``m``, marked as validation metrics: every
method logs ``fed_personal_*`` (the global model is the personal model of a method without one, see
:mod:`lightning_fed.evaluation`), so one column compares FedAvg with Ditto. The client halves' own settings are
hyper-parameter columns (``client_algorithms/Ditto/lam``, ``client_algorithms/FedRep/head_steps``,
:func:`client_half_settings`).

The Custom Scalars layout is written at fit start and again whenever a new validation or federated-evaluation
metric is first logged: one chart per validation metric (``val_loss`` and ``val_acc`` on separate axes), and one
category per federated-evaluation family logged (``fed_``, ``fed_personal_``, ``fed_personalized_``) with a chart
per validation metric holding its weighted mean and its worst 10 % of clients (:func:`custom_scalars_layout`);
TensorBoard uses the latest layout.

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

from lightning_fed import _lightning as pl_private
from lightning_fed.server.checks import find_server_optimizer, is_server_optimizer
from lightning_fed.server.fields import has_setting, setting_value
from lightning_fed.tensorboard_partition import (  # noqa: F401  (re-exported: lightning_fed.tensorboard's API)
    MANY_CLIENTS,
    PARTITION_DISTRIBUTION_TAG,
    PARTITION_FIGURE_TAG,
    PARTITION_SIZES_TAG,
    PARTITION_STATS_TAG,
    SIZE_QUANTILES,
    client_size_figure,
    label_distribution_figure,
    log_partition,
    partition_figure,
    partition_stats_text,
    size_quantiles,
    _tensorboard_loggers,
)

__all__ = [
    "client_half_settings",
    "client_size_figure",
    "custom_scalars_layout",
    "experiment_summary",
    "federated_hparams",
    "flatten_settings",
    "label_distribution_figure",
    "log_federated_hparams",
    "log_partition",
    "metric_columns",
    "partition_figure",
    "tensorboard_hparams",
]


#: The leading HParams columns (see the module docstring): name → what it holds.
LEADING_COLUMNS = ("Cohort", "Local work", "Partitioner", "Server optimizer", "Server optimizer lr")


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
        if has_setting(obj, name):  # (a stage's setting read on the stage: server/fields.py)
            out[name] = setting_value(obj, name)
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
    from lightning_fed.datamodules.local_work import LocalWork
    from lightning_fed.datamodules.partition import Partitioner

    return is_server_optimizer(value) or isinstance(value, (Partitioner, LocalWork))


def federated_hparams(trainer: Any) -> dict[str, Any]:
    """The settings that tell federated runs apart, flat, as TensorBoard HParams (bool/int/float/str values).

    Keys (``X/arg`` are the constructor arguments of X, e.g. ``server_optimizer/lr``, ``partitioner/alpha``):

    - ``server_optimizer``, ``server_optimizer/*``: the ServerOpt (Reddi et al. 2021, Alg. 1, l. 11) and its
      server learning rate η, β₁, β₂, τ, weighting, ...;
    - ``client_algorithms``, ``client_algorithms/<half>/*``: the run's client halves and their own settings
      (:func:`client_half_settings`, e.g. ``client_algorithms/Ditto/lam``; none without a half);
    - ``partitioner``, ``partitioner/*``, ``num_clients`` (N of the computed partition);
    - ``clients_per_round`` (cohort size C), ``local_work``, ``local_work/*`` (local epochs E or steps, batch size
      B), then the data module's settings as its parts report them (``FederatedDataModule.settings()``:
      ``seed`` — cohorts, local work, data order —, ``data_order``, ``drop_last``, the cohort sampler's
      ``cohort_sampling``, ``poisson_draws``, ``client_dropout``, ``over_selection`` and federated evaluation's
      ``eval_clients_per_round``, ``eval_fraction``, ``eval_local_steps``, ``eval_csv``), ``data`` (the data
      module class);
    - ``rounds`` (``max_epochs``), ``global_seed`` (``seed_everything``'s, ``"None"`` when not called);
    - ``client_optimizer``, ``client_optimizer/*`` (lr, momentum, ... of the client optimizer's first parameter
      group, as built by ``configure_optimizers``);
    - ``model``, ``model/*``: the module class and its saved hyper-parameters (``save_hyperparameters``);
    - first, a readable summary (:data:`LEADING_COLUMNS`, capitalised so that TensorBoard sorts them before the
      rest and shows them by default): ``Server optimizer`` (class name), ``Server optimizer lr`` (η, float; ``"None"``
      without an ``lr``), ``Partitioner`` (class name, ``"None"`` without one), ``Cohort`` (clients per round, int),
      ``Local work`` (its settings, e.g. ``"local_epochs=1, batch_size=4"``).

    Args:
        trainer: A :class:`~lightning_fed.FederatedTrainer` whose data module is set up (the fit loop's start).
    """
    dm = trainer.datamodule
    module = trainer.lightning_module
    out: dict[str, Any] = {}
    server = find_server_optimizer(trainer.callbacks)
    partitioner = getattr(dm, "partitioner", None)
    local_work = getattr(dm, "local_work", None)
    out["Server optimizer"] = type(server).__name__
    out["Server optimizer lr"] = _plain(getattr(server, "lr", None))
    out["Partitioner"] = type(partitioner).__name__ if partitioner is not None else "None"
    out["Cohort"] = int(dm.clients_per_round)
    out["Local work"] = (
        ", ".join(f"{k}={_plain(v)}" for k, v in _settings(local_work).items()) if local_work is not None else "None"
    )
    out.update(flatten_settings("server_optimizer", server))
    halves = [*(getattr(server, "client_algorithms", None) or []), *(getattr(trainer, "client_algorithms", None) or [])]
    out.update(client_half_settings(list({id(h): h for h in halves}.values())))
    if getattr(dm, "partitioner", None) is not None:
        out.update(flatten_settings("partitioner", dm.partitioner))
    out["num_clients"] = int(dm.partition.num_clients)
    out["clients_per_round"] = int(dm.clients_per_round)
    if getattr(dm, "local_work", None) is not None:
        out.update(flatten_settings("local_work", dm.local_work))
    report = getattr(dm, "settings", None)
    if callable(report):  # the data module's settings as its parts report them (cohorts, federated evaluation)
        out.update({key: _plain(value) for key, value in report().items() if key not in out})
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


def client_half_settings(halves: Any) -> dict[str, Any]:
    """The HParams columns of a run's client halves (``lightning_fed.algorithms``: FedProx's, SCAFFOLD's, FedBN's,
    FedPer's, FedRep's, Ditto's, ``LocalParts``, ...): ``client_algorithms`` (their names, comma-separated) and
    ``client_algorithms/<name>/<arg>`` for each half's own settings (its ``settings()``: the ``__init__`` arguments,
    e.g. Ditto's λ as ``client_algorithms/Ditto/lam``, FedRep's τ_h as ``client_algorithms/FedRep/head_steps``), so
    the table compares methods on what they are for; ``{}`` without a half. ``<name>`` is the class name without
    a trailing ``Client`` (``DittoClient`` → ``Ditto``), ``_2``, ``_3``, ... appended to a name taken already.

    >>> from lightning_fed.algorithms import DittoClient, FedRepClient
    >>> client_half_settings([FedRepClient(head=["head"], head_steps=5), DittoClient(lam=0.5)])
    {'client_algorithms': 'FedRep, Ditto', 'client_algorithms/FedRep/head': "['head']", 'client_algorithms/FedRep/head_steps': 5, 'client_algorithms/Ditto/lam': 0.5, 'client_algorithms/Ditto/lr': 'None'}
    """
    out: dict[str, Any] = {}
    names: list[str] = []
    for half in halves:
        base = type(half).__name__
        base = base[: -len("Client")] if base.endswith("Client") and base != "Client" else base
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
        settings = half.settings() if callable(getattr(half, "settings", None)) else {}
        out.update({f"client_algorithms/{name}/{key}": _plain(value) for key, value in settings.items()})
    if names:
        out = {"client_algorithms": ", ".join(names), **out}
    return out


def _global_seed() -> Optional[int]:
    seed = os.environ.get("PL_GLOBAL_SEED")
    return int(seed) if seed is not None else None


def _csv_loggers(trainer: Any) -> list[Any]:
    from lightning.pytorch.loggers import CSVLogger

    return [lg for lg in trainer.loggers if isinstance(lg, CSVLogger)]


def one_row_per_step(logger: Any) -> None:
    """Make a :class:`~lightning.pytorch.loggers.CSVLogger`'s ``metrics.csv`` hold one row per step (per round):
    Lightning writes a row per logging call, three per round in a federated run (the step-level training values,
    the validation metrics, the round's metrics), all with the same ``step``.

    Values logged at the step of the row before (and under other names) are merged into that row; the rows of the
    latest step are written when a later step is logged or when the logger is finalized (end of ``fit``,
    ``validate``, ..., also after an exception). A name logged twice at one step starts a new row, as before.
    Installed once per logger, at the start of the fit loop; values are unchanged.
    """
    writer = logger.experiment
    if getattr(writer, "_lightning_fed_one_row_per_step", False):
        return
    writer._lightning_fed_one_row_per_step = True
    log_metrics, save, finalize = writer.log_metrics, writer.save, logger.finalize

    def merged_log_metrics(metrics_dict: dict, step: Optional[int] = None) -> None:
        log_metrics(metrics_dict, step)
        row = writer.metrics.pop()
        last = writer.metrics[-1] if writer.metrics else None
        shared = set(row).intersection(last or ()) - {"step", "epoch"}
        if last is not None and last["step"] == row["step"] and last.get("epoch") == row.get("epoch", last.get("epoch")) \
                and not shared:
            last.update(row)
        else:
            writer.metrics.append(row)

    def held_back_save() -> None:
        rows = writer.metrics
        if not rows:
            return
        first_held = len(rows)
        while first_held > 0 and rows[first_held - 1]["step"] == rows[-1]["step"]:
            first_held -= 1
        held, writer.metrics = rows[first_held:], rows[:first_held]
        save()  # writes (and clears) the rows of earlier steps
        writer.metrics = held + writer.metrics

    def flushing_finalize(status: str) -> None:
        save()
        finalize(status)

    writer.log_metrics, writer.save, logger.finalize = merged_log_metrics, held_back_save, flushing_finalize


#: What Lightning and the fit loop write to a run's log folder before the first round: event files (the HParams
#: session, the partition), ``hparams.yaml``, the CLI's ``config.yaml``. A failed fit's folder holding only these
#: is removed (:func:`remove_unused_log_dirs`).
_SETUP_FILES = ("hparams.yaml", "config.yaml")


def new_log_dirs(trainer: Any) -> list[str]:
    """The log folders of ``trainer``'s TensorBoard and CSV loggers that do not exist yet, with their ancestors that
    do not exist either (``runs/lightning_logs/version_0``, ``runs/lightning_logs``, ...), called before ``fit``;
    reading ``log_dir`` fixes the logger's next version, as Lightning would. ``[]`` with several processes
    (``world_size > 1``: there Lightning broadcasts the version of rank 0)."""
    if trainer.world_size != 1:
        return []
    out: list[str] = []
    for logger in [*_tensorboard_loggers(trainer), *_csv_loggers(trainer)]:
        path = os.path.abspath(str(logger.log_dir))
        while path and not os.path.exists(path) and path not in out:
            out.append(path)
            path = os.path.dirname(path)
    return out


def _version_folder(ckpt_path: Any) -> Optional[tuple[str, int]]:
    """The nearest ancestor folder of the local file ``ckpt_path`` named ``version_N``, and N; ``None`` if none."""
    import re

    if not isinstance(ckpt_path, (str, os.PathLike)) or not os.path.isfile(ckpt_path):
        return None
    folder = os.path.dirname(os.path.abspath(ckpt_path))
    while os.path.dirname(folder) != folder:
        match = re.fullmatch(r"version_(\d+)", os.path.basename(folder))
        if match:
            return folder, int(match.group(1))
        folder = os.path.dirname(folder)
    return None


def continue_version(trainer: Any, ckpt_path: Any) -> list[str]:
    """Make a resumed fit log into the version folder of the checkpoint it resumes from.

    When ``ckpt_path`` is a file inside ``<save_dir>/<name>/version_N/`` (e.g. the stop checkpoint
    ``runs/lightning_logs/version_3/checkpoints/last.ckpt``), each TensorBoard and CSV logger of ``trainer`` whose
    ``save_dir/name`` is that ``<save_dir>/<name>`` and whose version is not fixed gets ``version=N``, as if built
    with ``TensorBoardLogger(version=N)`` / ``CSVLogger(version=N)``: the resumed rounds continue the same curves
    (TensorBoard adds an event file; a CSV logger's ``metrics.csv`` is kept and appended to, where Lightning's
    ``CSVLogger`` would delete it). A logger that cannot continue it (another ``save_dir``/``name``, or a version
    given) logs into its own folder, with a warning saying where and why. Called by :meth:`FederatedTrainer.fit`
    before the loggers' folders are fixed; nothing happens for a checkpoint outside a ``version_N`` folder.

    Returns:
        The log folders continued.

    Example::

        >>> import os, tempfile
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> from lightning_fed import FederatedTrainer
        >>> root = tempfile.mkdtemp()
        >>> ckpt = os.path.join(root, "lightning_logs", "version_3", "checkpoints", "last.ckpt")
        >>> os.makedirs(os.path.dirname(ckpt)); open(ckpt, "wb").close()
        >>> trainer = FederatedTrainer(logger=CSVLogger(root), enable_progress_bar=False)
        >>> [os.path.relpath(d, root) for d in continue_version(trainer, ckpt)], trainer.logger.version
        (['lightning_logs/version_3'], 3)
    """
    found = _version_folder(ckpt_path)
    if found is None:
        return []
    folder, version = found
    continued = []
    for logger in [*_tensorboard_loggers(trainer), *_csv_loggers(trainer)]:
        root = os.path.realpath(str(logger.root_dir))
        why = None
        if root != os.path.realpath(os.path.dirname(folder)):
            why = f"its save_dir/name is {logger.root_dir}, not {os.path.dirname(folder)}"
        elif pl_private.logger_version(logger) not in (None, version):
            why = f"its version is fixed to {pl_private.logger_version(logger)!r}"
        if why is not None:
            rank_zero_warn(f"Resuming from {ckpt_path}, written in the log folder {folder}: the {type(logger).__name__} "
                           f"logs into {logger.log_dir} instead, because {why}. Give the logger "
                           f"save_dir/name of that folder (and no version) to continue its curves there.")
            continue
        pl_private.set_logger_version(logger, version)
        if not pl_private.logger_experiment_started(logger):
            _keep_csv_metrics(logger)
        continued.append(folder)
    return continued


def _keep_csv_metrics(logger: Any) -> None:
    """Open a CSV logger's writer on an existing version folder keeping its ``metrics.csv`` (Lightning's writer
    deletes it) and its columns, so that the resumed rounds' rows are appended."""
    import csv
    import warnings

    from lightning.pytorch.loggers import CSVLogger

    if not isinstance(logger, CSVLogger):
        return
    path = os.path.join(logger.log_dir, "metrics.csv")
    kept = open(path, newline="").read() if os.path.isfile(path) else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
        writer = logger.experiment
    if kept is not None:
        with open(path, "w", newline="") as file:
            file.write(kept)
        header = next(csv.reader([kept.splitlines()[0]])) if kept.strip() else []
        writer.metrics_keys = sorted(header)


def remove_unused_log_dirs(paths: list[str]) -> list[str]:
    """Remove the folders among ``paths`` (from :func:`new_log_dirs`: created by this fit) that hold nothing but
    what the set-up of a failed fit writes: TensorBoard event files, ``hparams.yaml``, ``config.yaml`` (no
    ``metrics.csv``, no checkpoint, no sub-folder left); deepest first, so a ``lightning_logs`` left empty goes too.
    Returns the folders removed.

    Called by :meth:`FederatedTrainer.fit` when the fit raised before its first round finished (and by ``validate``,
    ``test`` and ``predict`` when they raised before logging a metric, e.g. on a missing checkpoint): a refused argument
    or a data error would otherwise leave an empty ``version_N`` behind every time (Lightning creates the loggers'
    folders before the data module's ``setup``).
    """
    import shutil

    removed = []
    for path in sorted(paths, key=lambda p: p.count(os.sep), reverse=True):
        if not os.path.isdir(path):
            continue
        entries = os.listdir(path)
        if all(os.path.isfile(os.path.join(path, e)) and (e.startswith("events.out.tfevents.") or e in _SETUP_FILES)
               for e in entries):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def run_name(logger: Any) -> str:
    """The run's HParams *trial id*: its log directory (``logger.log_dir``, normalised, e.g.
    ``runs/lightning_logs/version_3``), one per run, so TensorBoard never merges two runs into one session group
    (it would for equal settings without a trial id)."""
    return os.path.normpath(str(logger.log_dir))


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
    (step 0, trial id :func:`run_name`: the log directory, so runs with equal settings stay apart) with the
    :func:`custom_scalars_layout`, and into the logger's ``hparams.yaml`` (``logger.log_hyperparams(params,
    metrics={})``, which writes no placeholder metric); a :class:`~lightning.pytorch.loggers.CSVLogger`'s
    ``hparams.yaml`` gets the same settings (next to the module's) and its ``metrics.csv`` one row per round
    (:func:`one_row_per_step`). Called once, at the start of the fit loop.

    Returns:
        The hyper-parameters written (``{}`` without a TensorBoard or CSV logger).

    Warns:
        when Lightning already wrote this run's hparams session (``TensorBoardLogger(default_hp_metric=True)``
        and a module/data module with ``save_hyperparameters``): TensorBoard shows only that first session.
    """
    loggers = _tensorboard_loggers(trainer)
    csv_loggers = _csv_loggers(trainer)
    if not loggers and not csv_loggers:
        return {}
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb

    params = federated_hparams(trainer)
    for logger in csv_loggers:
        logger.log_hyperparams(params)
        one_row_per_step(logger)
    for logger in loggers:
        if _lightning_logged_hparams(trainer, logger):
            rank_zero_warn(
                f"TensorBoard keeps the first hyper-parameter session of a run, and Lightning already wrote one for "
                f"{logger.log_dir!r} (the module's hparams with `hp_metric`): the HParams tab will not show the "
                "federated settings (server optimizer, partitioner, cohort, local work, seed). Create the logger with "
                "`TensorBoardLogger(..., default_hp_metric=False)` (the lightning-fed command does)."
            )
        logger.log_hyperparams(params, metrics={})
        shown = tensorboard_hparams(params)
        logger.experiment._get_file_writer().add_summary(hparams_pb(shown, trial_id=run_name(logger)), 0)
        logger.experiment.add_custom_scalars(custom_scalars_layout())
        _watch_metrics(logger, shown)
    return params


def tensorboard_hparams(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as written to TensorBoard's HParams tab: ``Cohort`` (clients per round) as text, ``"10"``, since
    the tab shows every number with five significant digits (``10.000``).

    >>> tensorboard_hparams({"Cohort": 10, "seed": 0})
    {'Cohort': '10', 'seed': 0}
    """
    return {k: (str(v) if k == "Cohort" and not isinstance(v, str) else v) for k, v in params.items()}


def _is_validation_metric(name: str) -> bool:
    """Whether a logged scalar is a validation metric of the global model: its name starts with ``val_``."""
    return name.startswith("val_")


def _federated_family(name: str) -> Optional[tuple[str, str, str]]:
    """``(prefix, metric, statistic)`` of a federated-evaluation scalar (``fed_personal_val_acc/weighted`` →
    ``("fed_personal_", "val_acc", "weighted")``), ``None`` for any other tag."""
    if "/" not in name:
        return None
    head, stat = name.rsplit("/", 1)
    for prefix in ("fed_personalized_", "fed_personal_", "fed_"):  # longest first
        if head.startswith(prefix):
            return prefix, head[len(prefix):], stat
    return None


#: The federated-evaluation metric columns that follow the validation metrics, in this order (prefix, statistic):
#: personal models first (every method logs them, the column that compares methods), then the global model on the
#: clients, weighted, then the worst 10 % of clients.
_LEADING_FEDERATED = (("fed_personal_", "weighted"), ("fed_", "weighted"), ("fed_personal_", "worst10"),
                      ("fed_", "worst10"), ("fed_personalized_", "weighted"), ("fed_personalized_", "worst10"))


def metric_columns(names: Any) -> list[str]:
    """The HParams tab's metric columns for the logged scalar ``names``: the validation metrics (``val_*``) first,
    then, for federated evaluation, ``fed_personal_<m>/weighted``, ``fed_<m>/weighted``, ``fed_personal_<m>/worst10``,
    ``fed_<m>/worst10``, ``fed_personalized_<m>/weighted`` and ``/worst10`` for each validation metric ``m`` (each
    group by name), then the others, each by name; Lightning's ``epoch`` scalar (the step again) is left out.

    >>> metric_columns(["round_train_loss", "val_loss", "epoch", "round_time_s", "val_acc"])
    ['val_acc', 'val_loss', 'round_time_s', 'round_train_loss']
    >>> metric_columns(["fed_val_acc/p10", "fed_val_acc/worst10", "fed_personal_val_acc/weighted", "val_acc",
    ...                 "fed_val_acc/weighted", "fed_eval_clients"])
    ['val_acc', 'fed_personal_val_acc/weighted', 'fed_val_acc/weighted', 'fed_val_acc/worst10', 'fed_eval_clients', 'fed_val_acc/p10']
    """
    names = sorted(set(names) - {"epoch"})
    out = [n for n in names if _is_validation_metric(n)]
    for prefix, stat in _LEADING_FEDERATED:
        out += [n for n in names if (family := _federated_family(n)) is not None and family[0] == prefix
                and family[2] == stat and _is_validation_metric(family[1])]
    chosen = set(out)
    return out + [n for n in names if n not in chosen]


def experiment_summary(params: dict[str, Any], metrics: Any) -> Any:
    """The HParams *experiment summary* (a ``Summary`` proto) of a run: one column per hyper-parameter of ``params``
    (its type from the value: text, bool or number) and the metric columns in :func:`metric_columns` order, the
    validation metrics marked as such.

    >>> from tensorboard.plugins.hparams import metadata
    >>> pb = experiment_summary({"Cohort": "10", "seed": 0}, ["round_train_loss", "val_loss"])
    >>> experiment = metadata.parse_experiment_plugin_data(pb.value[0].metadata.plugin_data.content)
    >>> [h.name for h in experiment.hparam_infos], [m.name.tag for m in experiment.metric_infos]
    (['Cohort', 'seed'], ['val_loss', 'round_train_loss'])
    """
    import time

    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    def dtype(value: Any) -> int:
        if isinstance(value, bool):
            return api_pb2.DATA_TYPE_BOOL
        return api_pb2.DATA_TYPE_STRING if isinstance(value, str) else api_pb2.DATA_TYPE_FLOAT64

    hparam_infos = [api_pb2.HParamInfo(name=k, type=dtype(v)) for k, v in params.items()]
    metric_infos = [
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=name), dataset_type=(
            api_pb2.DATASET_VALIDATION if _is_validation_metric(name) or (
                (family := _federated_family(name)) is not None and _is_validation_metric(family[1]))
            else api_pb2.DATASET_UNKNOWN))
        for name in metric_columns(metrics)
    ]
    experiment = api_pb2.Experiment(hparam_infos=hparam_infos, metric_infos=metric_infos, time_created_secs=time.time())
    summary = summary_pb2.Summary()
    summary.value.add(tag=metadata.EXPERIMENT_TAG, tensor=metadata.NULL_TENSOR,
                      metadata=metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(experiment=experiment)))
    return summary


def _watch_metrics(logger: Any, params: dict[str, Any]) -> None:
    """Follow what ``logger`` (a TensorBoard logger) logs: when a validation metric is logged for the first time,
    write the Custom Scalars layout again with one chart per validation metric; once the round of the first
    validation metrics is over (a later step is logged) or at the end of the fit, write the run's
    :func:`experiment_summary` with the metrics logged so far. Installed once per logger; values are unchanged."""
    if getattr(logger, "_lightning_fed_watched", False):
        return
    logger._lightning_fed_watched = True
    log_metrics, finalize = logger.log_metrics, logger.finalize
    seen: dict[str, None] = {}
    state = {"validation_step": None, "summary_written": False}

    def write_summary() -> None:
        if state["validation_step"] is not None and not state["summary_written"]:
            state["summary_written"] = True
            logger.experiment._get_file_writer().add_summary(experiment_summary(params, seen), 0)

    def watching_log_metrics(metrics: dict, step: Optional[int] = None) -> None:
        if state["validation_step"] is not None and step is not None and step > state["validation_step"]:
            write_summary()  # the first validated round is over: its metrics are all known
        log_metrics(metrics, step)
        new = [name for name in metrics if name not in seen]
        seen.update(dict.fromkeys(new))
        if any(_is_validation_metric(name) or _federated_family(name) for name in new):
            if state["validation_step"] is None:
                state["validation_step"] = step if step is not None else 0
            validation = [name for name in metric_columns(seen) if _is_validation_metric(name)]
            logger.experiment.add_custom_scalars(custom_scalars_layout(validation, seen))

    def summarising_finalize(status: str) -> None:
        write_summary()
        finalize(status)

    logger.log_metrics, logger.finalize = watching_log_metrics, summarising_finalize


#: The federated-evaluation tag families with a Custom Scalars category each: (prefix, category title, chart suffix).
FEDERATED_FAMILIES = (
    ("fed_", "Federated evaluation (global model on clients)", "global model on clients"),
    ("fed_personal_", "Personal models (fed_personal_*)", "personal models"),
    ("fed_personalized_", "Fine-tuned global model (fed_personalized_*)", "fine-tuned"),
)


def custom_scalars_layout(validation_metrics: Any = (), logged: Any = ()) -> dict[str, dict[str, list]]:
    """The *Custom Scalars* tab of a federated run: ``{category: {chart title: ["Multiline", [tag regexes]]}}``
    (``SummaryWriter.add_custom_scalars``' format; a regex is matched against the start of a tag).

    Category ``"Federated training"`` (open): one chart per validation metric of the global model (``val_acc``,
    ``val_loss``, ...: each on its own axis, an accuracy of 0.4 is not drawn flat next to a loss of 2), the round's
    training loss (``round_train_loss``), the pseudo-gradient norm ‖Δ_t‖ (``round_pseudo_grad_norm``) and the
    gradient diversity (``round_gradient_diversity``). Then, for each federated-evaluation family of
    :data:`FEDERATED_FAMILIES` with a tag among ``logged`` — ``fed_`` (the global model on the clients' own data),
    ``fed_personal_`` (each client's personal model; every method logs it, see :mod:`lightning_fed.evaluation`),
    ``fed_personalized_`` (fine-tuned, ``eval_local_steps``) — a category with one chart per validation metric ``m``
    holding two curves: ``<prefix>m/weighted`` (the sample-weighted mean over clients) and ``<prefix>m/worst10``
    (the mean of the worst 10 % of clients). Last, category ``"Round cost and clients"``: ``round_time_s``,
    ``round_local_steps`` and the client counts.

    Args:
        validation_metrics: the names of the validation metrics logged so far (none at fit start; the layout is
            written again when one is first logged).
        logged: every scalar tag logged so far (default none: no federated-evaluation category).

    >>> list(custom_scalars_layout(["val_acc", "val_loss"])["Federated training"])
    ['val_acc (global model)', 'val_loss (global model)', 'round_train_loss', 'pseudo-gradient norm ‖Δ_t‖', 'gradient diversity']
    >>> layout = custom_scalars_layout(["val_acc"], ["val_acc", "fed_val_acc/weighted", "fed_personal_val_acc/weighted"])
    >>> list(layout)
    ['Federated training', 'Federated evaluation (global model on clients)', 'Personal models (fed_personal_*)', 'Round cost and clients']
    >>> layout["Personal models (fed_personal_*)"]
    {'val_acc (personal models): weighted, worst 10 %': ['Multiline', ['fed_personal_val_acc/weighted$', 'fed_personal_val_acc/worst10$']]}
    """
    import re

    validation = {f"{name} (global model)": ["Multiline", [re.escape(name) + "$"]] for name in validation_metrics}
    logged = set(logged)
    federated = {}
    for prefix, title, what in FEDERATED_FAMILIES:
        charts = {
            f"{name} ({what}): weighted, worst 10 %": [
                "Multiline", [re.escape(f"{prefix}{name}/{stat}") + "$" for stat in ("weighted", "worst10")]]
            for name in validation_metrics if f"{prefix}{name}/weighted" in logged
        }
        if charts:
            federated[title] = charts
    return {
        "Federated training": {
            **validation,
            "round_train_loss": ["Multiline", [r"round_train_loss$"]],
            "pseudo-gradient norm ‖Δ_t‖": ["Multiline", [r"round_pseudo_grad_norm$"]],
            "gradient diversity": ["Multiline", [r"round_gradient_diversity$"]],
        },
        **federated,
        "Round cost and clients": {
            "round_time_s": ["Multiline", [r"round_time_s$"]],
            "round_local_steps": ["Multiline", [r"round_local_steps$"]],
            "clients": ["Multiline", [r"round_clients.*"]],
        },
    }
