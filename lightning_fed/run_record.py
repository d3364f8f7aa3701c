"""The run record of a federated checkpoint (issue #52: moved out of ``checkpoint.py``): :func:`run_config`, the
settings that define a run (partition, data seed, cohort size, local work, data order, server optimizer and its
hyper-parameters, client halves), stored in every checkpoint under ``checkpoint["lightning_fed"]["run_config"]``;
what a resume may change (:func:`normalize_allowed_changes`) and what it changed (:func:`config_differences`, old
class paths read as today's); the privacy history a resumed run inherits (:func:`privacy_history`). The refusals that
use them are :class:`~lightning_fed.checkpoint.FederatedCheckpointConnector`'s; every name stays importable from
:mod:`lightning_fed.checkpoint`.
"""

from __future__ import annotations

import inspect
import numbers
import re
from typing import Any, Iterable, Optional, Union

import numpy as np
import torch

from lightning_fed._moved import new_paths
from lightning_fed.migrations import MOVED_CLASSES
from lightning_fed.server.checks import is_server_optimizer
from lightning_fed.server.fields import setting_value

#: The top-level names of :func:`run_config` (the first part of every name ``allow_resume_changes`` accepts).
def _run_config_names() -> tuple[str, ...]:
    from lightning_fed.datamodules.federated import FederatedDataModule
    from lightning_fed.datamodules.simulated_time import SimulatedTime

    return ("partitioner", "partition", *FederatedDataModule.run_setting_names(), "local_work", "server_optimizer",
            "client_algorithms", *SimulatedTime.setting_names)  # the last: recorded only with a device model


def _datamodule_record_defaults() -> dict[str, Any]:
    from lightning_fed.datamodules.federated import FederatedDataModule

    return FederatedDataModule.record_defaults()


#: The first parts of the run record's names: the partitioner, the partition, the data module's run settings as its
#: parts report them (:meth:`FederatedDataModule.run_setting_names
#: <lightning_fed.datamodules.FederatedDataModule.run_setting_names>`), local work, the server optimizer and the client halves.
RUN_CONFIG_NAMES = _run_config_names()
#: Settings added to the record later, with the value a checkpoint that lacks them was run with.
_RECORD_DEFAULTS = {**_datamodule_record_defaults(), "server_optimizer.accounting": "rdp",
                    "server_optimizer.client": None,
                    # issue #34: options added later, with the behaviour of a checkpoint that lacks them
                    "local_work.batch_size_upper": "dataset_size", "server_optimizer.warmup_rounds": None,
                    "server_optimizer.pairing": "client_id"}
_ABSENT = "<absent>"
#: Server-optimizer settings recorded only since issue #31 (adaptive clipping's, the robust reducers' simulated
#: attack): absent from an older checkpoint's record, they cannot be checked (a warning), not a refusal.
_LATER_SETTINGS = ("target_quantile", "clip_learning_rate", "count_stddev", "client_transforms")
#: Device-model settings recorded only since issue #53's trace hashes: absent from an older record, a warning.
_LATER_DEVICE_SETTINGS = ("device_model.capacity_sha256", "device_model.behaviour_sha256")


def _plain(value: Any) -> Any:
    """``value`` as a weights-only-loadable, comparable value: numbers, strings, lists; other objects as repr."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, torch.Tensor):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if inspect.isroutine(value) or inspect.isclass(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
    text = repr(value)
    if re.search(r" at 0x[0-9a-fA-F]+", text):  # the default repr holds a memory address: use the settings
        settings = ", ".join(f"{k}={v!r}" for k, v in object_settings(value).items())
        return f"{_class_name(value)}({settings})"
    return text


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def object_settings(obj: Any) -> dict[str, Any]:
    """The constructor settings of ``obj``: ``{name: value}`` for every ``__init__`` parameter stored as an
    attribute of the same name (the convention of lightning_fed's partitioners, local-work policies and server
    optimizers; a setting the class lists in ``setting_paths`` is read there, :func:`~lightning_fed.server.fields.
    setting_value`), values made plain by :func:`_plain`; not those the class lists in ``unrecorded_settings`` (e.g. a
    server optimizer's ``client_state_store``: where state is kept, not what is computed)."""
    settings: dict[str, Any] = {}
    try:
        params = inspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):
        return settings
    unrecorded = getattr(type(obj), "unrecorded_settings", ())  # settings that do not change the experiment
    paths = getattr(type(obj), "setting_paths", {})  # settings that live on a stage (FedAWARE's)
    for name, param in params.items():
        if name == "self" or name in unrecorded or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in vars(obj) or isinstance(getattr(type(obj), name, None), property) or name in paths:
            settings[name] = _plain(setting_value(obj, name))  # (a stage's setting read on the stage)
    return settings


def _add_object(config: dict[str, Any], key: str, obj: Any) -> None:
    if obj is None:
        return
    config[key] = _class_name(obj)
    for name, value in object_settings(obj).items():
        config[f"{key}.{name}"] = value


def _partition_digest(partition: Any) -> str:
    import hashlib

    digest = hashlib.sha256()
    for array in (partition.offsets, partition.indices):
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return f"{partition.num_clients} clients, {len(partition.indices)} samples, sha256 {digest.hexdigest()[:16]}"


def run_config(trainer: Any) -> dict[str, Any]:
    """The settings that define a federated run, as a flat ``{name: value}`` dict stored in every checkpoint.

    Names (the first part is one of :data:`RUN_CONFIG_NAMES`):

    * ``partitioner`` (class) and ``partitioner.<arg>`` (its constructor settings, e.g. ``partitioner.alpha``);
    * ``partition``: the client → sample assignment (number of clients, of samples, SHA-256 of the index arrays),
      which also changes when the training data change;
    * the data module's run settings as its parts report them (``dm.run_config()``: ``seed``,
      ``clients_per_round``, ``data_order``, ``drop_last``, ``client_dropout``, ``over_selection``,
      ``cohort_sampling``, ``poisson_draws``);
    * ``local_work`` (class) and ``local_work.<arg>`` (e.g. ``local_work.batch_size``, ``local_work.local_epochs``);
    * ``server_optimizer`` (class) and ``server_optimizer.<arg>`` (e.g. ``server_optimizer.lr``);
    * ``client_algorithms``: the client halves given to the trainer (``FederatedTrainer(client_algorithms=...)``),
      when there are any; on resume they are compared together with ``server_optimizer.client``.

    Settings the trainer does not have (no data module, partition not computed yet) are left out.
    """
    config: dict[str, Any] = {}
    dm = getattr(trainer, "datamodule", None)
    if dm is not None:
        _add_object(config, "partitioner", getattr(dm, "partitioner", None))
        partition = getattr(dm, "_partition", None)
        if partition is not None:
            cached = getattr(dm, "_lightning_fed_partition_digest", None)
            if cached is None or cached[0] is not partition:
                cached = (partition, _partition_digest(partition))
                dm._lightning_fed_partition_digest = cached
            config["partition"] = cached[1]
        report = getattr(dm, "run_config", None)
        if callable(report):
            config.update({name: _plain(value) for name, value in report().items()})
        _add_object(config, "local_work", getattr(dm, "local_work", None))
    server = _server_optimizer(trainer)
    _add_object(config, "server_optimizer", server)
    halves = getattr(trainer, "client_algorithms", None)
    if halves:
        config["client_algorithms"] = _plain(list(halves))
    return config


def privacy_history(trainer: Any) -> list[dict[str, Any]]:
    """The rounds of the run that a resumed ``fit`` inherits from *earlier* server optimizers (an allowed change of
    class on resume), as :class:`~lightning_fed.server.privacy.PrivacyAccountant` history segments
    (``{"rounds", "private", ...}``; ``private=False``: aggregated without DP). ``[]`` for a fresh run, a resume
    with the same server-optimizer class (its own state carries its rounds) or a trainer without the federated
    checkpoint connector. Kept in every checkpoint under ``checkpoint["lightning_fed"]["privacy"]``."""
    connector = getattr(trainer, "_checkpoint_connector", None)
    return [dict(s) for s in getattr(connector, "privacy_history", [])]


def _privacy_segment(server: Any) -> Optional[dict[str, Any]]:
    """The server optimizer's own rounds as a history segment: its accountant's (a DP server optimizer, see
    ``privacy_segment``), or its server steps as non-private rounds; ``None`` when not known."""
    if server is None:
        return None
    segment = getattr(server, "privacy_segment", None)
    if callable(segment):
        return segment()
    return {"private": False, "rounds": int(getattr(server, "num_steps", 0))}


def _segment_from_state(state: Any) -> Optional[dict[str, Any]]:
    """A history segment from a server optimizer's checkpointed state (checkpoints without a privacy record)."""
    if not isinstance(state, dict):
        return None
    if isinstance(state.get("privacy"), dict):
        return {"private": True, **state["privacy"]}
    if "num_steps" in state:
        return {"private": False, "rounds": int(state["num_steps"])}
    return None


def _run_client_halves(trainer: Any) -> list[Any]:
    """The run's client halves in the order the client runner runs them: the server optimizer's own and its
    ``client``, then ``FederatedTrainer(client_algorithms=...)``."""
    server = _server_optimizer(trainer)
    own = list(server.server_client_algorithms) if server is not None else []
    return own + list(getattr(trainer, "client_algorithms", None) or [])


def _client_halves_merged(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a run record) with the client halves given to the server optimizer (``server_optimizer.client``)
    and to the trainer (``client_algorithms``) compared as one list, ``client_algorithms``: the CLI moves an old
    config's ``server_optimizer.client`` to ``trainer.client_algorithms``, the same run."""
    if "server_optimizer.client" not in config and "client_algorithms" not in config:
        return config
    out = {k: v for k, v in config.items() if k not in ("server_optimizer.client", "client_algorithms")}
    halves = list(config.get("server_optimizer.client") or []) + list(config.get("client_algorithms") or [])
    out["client_algorithms"] = halves or None
    return out


def _server_optimizer(trainer: Any) -> Any:
    found = [cb for cb in getattr(trainer, "callbacks", []) if is_server_optimizer(cb)]
    return found[0] if len(found) == 1 else None


def normalize_allowed_changes(allow: Union[bool, Iterable[str], None]) -> Union[bool, tuple[str, ...]]:
    """Validate ``FederatedTrainer(allow_resume_changes=...)``.

    Raises:
        ValueError: not a bool or an iterable of names whose first part is one of :data:`RUN_CONFIG_NAMES`.
    """
    if allow is None:
        return ()
    if isinstance(allow, bool):
        return allow
    if isinstance(allow, str):
        allow = [allow]
    try:
        names = tuple(allow)
    except TypeError:
        raise ValueError(
            f"`allow_resume_changes` must be True, False or a list of setting names, got {allow!r}."
        ) from None
    for name in names:
        if not isinstance(name, str) or name.split(".", 1)[0] not in RUN_CONFIG_NAMES:
            raise ValueError(
                f"`allow_resume_changes` got {name!r}; names are one of {RUN_CONFIG_NAMES}, optionally followed by "
                "`.<argument>` (e.g. 'server_optimizer.lr', 'local_work.batch_size'), or pass True to allow all."
            )
    return names


def _is_allowed(key: str, allowed: Union[bool, tuple[str, ...]]) -> bool:
    if allowed is True:
        return True
    if allowed is False:
        return False
    for name in allowed:
        if key == name or key.startswith(name + "."):
            return True
        # a changed partitioner setting changes the assignment it computes
        if key == "partition" and (name == "partitioner" or name.startswith("partitioner.")):
            return True
    return False


def _moved_module_paths(value: Any) -> Any:
    """``value`` (a run record read from a checkpoint, or one of its values) with every class named by its module
    path from before the data modules' sub-folders (``lightning_fed.datamodules.dirichlet.DirichletPartitioner``)
    named by its path now (``lightning_fed.datamodules.partitioners.dirichlet.DirichletPartitioner``,
    ``lightning_fed._moved.new_paths``, no warning): the same class, so a checkpoint written before the move
    resumes without a difference; so is a ready-made server optimizer named by its path in ``callbacks/`` before it
    moved into ``algorithms/`` (:data:`~lightning_fed.migrations.MOVED_CLASSES`). Other values are returned unchanged."""
    if isinstance(value, str):
        if value in MOVED_CLASSES:
            return MOVED_CLASSES[value]
        return new_paths(value)[0]
    if isinstance(value, list):
        return [_moved_module_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: _moved_module_paths(v) for k, v in value.items()}
    return value


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(name, old value, new value)`` of every setting that differs (``'<absent>'`` for a missing one; a setting
    recorded only by newer versions counts as its default where a record lacks it)."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, _RECORD_DEFAULTS.get(key, _ABSENT)), new.get(key, _RECORD_DEFAULTS.get(key, _ABSENT))
        if a != b:
            diffs.append((key, a, b))
    return diffs
