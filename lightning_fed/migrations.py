"""Old checkpoints load through one table: :data:`MIGRATIONS` maps the format of a checkpoint's lightning_fed record
(``checkpoint["lightning_fed"]["format"]``; 0 for a checkpoint without the record) to the function that upgrades it to
the next format, and :func:`migrate_checkpoint` applies them in order, up to :data:`CHECKPOINT_FORMAT`, before
Lightning restores the callbacks. A class's ``load_state_dict`` reads only today's layout of its own state; the
layouts of earlier versions are turned into it here (:func:`upgrade_server_state`), in one place.

Formats:

* **0** — no lightning_fed record (a plain ``lightning.Trainer``, or a version before the record): nothing about the
  run can be checked on resume (the checkpoint connector warns); the server-optimizer states are upgraded as for 1.
* **1** — the record (run configuration, server-optimizer state key, privacy history). Per-client state may still
  be in a method's own layout from before :class:`~lightning_fed.server.client_state.ClientStateTable`: SCAFFOLD's
  ``"client_controls"`` (client id → flat c_i) with ``"num_clients"``, FedAWARE's ``"fedaware"["momenta"]``
  (an N × d matrix) and ``"seen"`` (bool ``[N]``).
* **2** — every per-client state is a ``"client_state"`` table state dict; a stage state holding a table inside
  ``"aggregators"`` saves it as ``{"client_state_table": <its state dict>}``. The client halves' tables
  (``"client_algorithms"``) are keyed by the half's position in the server optimizer's halves (its own, then
  ``client=[...]``).
* **3** — the client halves' tables are keyed by the half's name (``ClientAlgorithm.state_key``, e.g.
  ``"FedDynClient"``; what this version writes), so that adding or reordering halves keeps each one's state. The
  step from 2 needs the halves of the run resuming (in order: the server optimizer's own, its ``client``, then
  ``FederatedTrainer(client_algorithms=...)``, the order a format-2 run had them in), given by the checkpoint
  connector; without them, or with fewer halves than positions, it refuses.
* **4** — each stage's state is saved one way, the composed layout of
  :class:`~lightning_fed.callbacks.ServerOptimizer` (what this version writes), under ``"aggregators"``:
  FedAWARE's min-norm stage (``[{"table": {"client_state_table": ...}, "client_num_samples", "gram"}]``) instead of
  its format-3 layout (the momenta in ``"client_state"``, |D_i| and the Gram matrix in ``"fedaware"``); SCAFFOLD's
  control stage (``[{"control": c, "table": {"client_state_table": ...}}]``) instead of c in ``"state"["control"]``,
  the c_i in ``"client_state"`` and N in ``"num_clients"`` (N is the table's); Fed-LAMB's and FedAMS's max-moment
  stage (``[{"second_moment": v̂, "first_moment": m̄ or None}]``) instead of v̂ and m̄ under ``"state"``.
* **5** — a per-client table's state dict may be an on-disk store's manifest (``"store": {"kind": "disk",
  "directory", "ids", "versions"}``, the rows in files it references, :mod:`lightning_fed.server.client_state`)
  instead of ``"rows"``; a version that knows only format 4 refuses it (newer format) instead of failing on the
  missing rows. Format-4 checkpoints hold only in-memory tables, already valid format 5: the step is the number.

Settings added to the run record after format 1 (``cohort_sampling``, ``server_optimizer.accounting``, ...) are not
migrated: the record comparison reads a missing key as the value such a checkpoint was run with
(``lightning_fed.checkpoint._RECORD_DEFAULTS``, the data module's from its parts' ``record_defaults``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from lightning_fed.server.client_state import ClientStateTable, nonfinite_disk_rows

__all__ = ["CHECKPOINT_FORMAT", "MIGRATIONS", "MOVED_CLASSES", "check_record", "checkpoint_format", "compose_fedaware_state",
           "compose_fedlamb_state", "compose_scaffold_state", "migrate_checkpoint",
           "name_client_states", "upgrade_server_state", "TABLE_KEY", "clone_state", "required_state",
           "restore_tables", "saved_stage_state", "select_federated", "state_items"]

#: The format of the lightning_fed record this version writes.
CHECKPOINT_FORMAT = 5

#: The key of lightning_fed's record in a Lightning checkpoint (``lightning_fed.checkpoint.CHECKPOINT_KEY``).
RECORD_KEY = "lightning_fed"

#: Ready-made server optimizers that moved from ``callbacks/`` into their method's module of ``algorithms/`` (issue
#: #52): the class path a run record written before the move names -> the class path now. The same classes (the old
#: modules re-export them), so such a checkpoint resumes without a difference (``lightning_fed.checkpoint`` reads its
#: record through this table).
MOVED_CLASSES = {
    f"lightning_fed.callbacks.{old}.{name}": f"lightning_fed.algorithms.{new}.{name}"
    for old, new, name in (
        ("fedprox", "fedprox", "FedProx"), ("feddyn", "feddyn", "FedDyn"), ("fednova", "fednova", "FedNova"),
        ("fedmgda", "fedmgda", "FedMGDAPlus"), ("fedaware", "fedaware", "FedAWARE"), ("scaffold", "scaffold", "SCAFFOLD"),
        ("fedlamb", "fedlamb", "LocalAdaptiveServer"), ("fedlamb", "fedlamb", "FedLAMB"), ("fedlamb", "fedlamb", "FedAMS"),
        ("fedper", "fedper", "FedPer"), ("fedper", "fedrep", "FedRep"), ("fedper", "ditto", "Ditto"),
        ("fedbn", "fedbn", "FedBN"),
    )
}


def upgrade_server_state(state: dict[str, Any]) -> dict[str, Any]:
    """One server optimizer's state dict in today's layout (format 2); a state already in it is returned unchanged.

    * SCAFFOLD before the client-state table: ``"client_controls"`` (client id → flat c_i) and ``"num_clients"`` (N)
      become ``"client_state"`` (a lazily filled table of N rows; none without rows).
    * FedAWARE before the table: ``state["fedaware"]["momenta"]`` (N × d) and ``["seen"]`` (bool ``[N]``) become
      ``"client_state"`` (a dense table).

    Args:
        state: A server optimizer's ``state_dict()`` as saved (not modified; a new dict is returned when upgraded).

    Raises:
        ValueError: SCAFFOLD's c_i without the N they belong to.

    Example: SCAFFOLD's c_i of clients 0 and 2 of N = 3, as written before the table::

        >>> import torch
        >>> old = {"num_steps": 1, "state": {}, "num_clients": 3, "client_controls": {0: torch.ones(2), 2: -torch.ones(2)}}
        >>> new = upgrade_server_state(old)
        >>> sorted(new["client_state"]["rows"]), new["client_state"]["num_clients"], "client_controls" in new
        ([0, 2], 3, False)
        >>> upgrade_server_state(new) is new
        True
    """
    if "client_state" in state:
        return state
    if "client_controls" in state:  # SCAFFOLD
        controls = state["client_controls"]
        rest = {k: v for k, v in state.items() if k != "client_controls"}
        if not controls:
            return rest  # no client seen yet: no table
        num_clients = int(state.get("num_clients", -1))
        if num_clients < 0:
            raise ValueError("This SCAFFOLD checkpoint holds client control variates but no `num_clients`.")
        first = next(iter(controls.values()))
        table = {"num_clients": num_clients, "dim": first.numel(), "rows": controls}
        return {**rest, "client_state": ClientStateTable.from_state_dict(table).state_dict()}
    saved = state.get("fedaware")
    if isinstance(saved, dict) and saved.get("momenta") is not None:  # FedAWARE
        momenta = saved["momenta"]
        n, d = momenta.shape
        fedaware = {k: v for k, v in saved.items() if k not in ("momenta", "seen")}
        table = {"num_clients": n, "dim": d, "dense": True, "rows": momenta, "present": saved.get("seen")}
        return {**state, "fedaware": fedaware, "client_state": ClientStateTable.from_state_dict(table).state_dict()}
    return state


def _format_0(checkpoint: dict[str, Any], client_halves: Optional[list[str]] = None) -> None:
    """No record: nothing to add (the run cannot be checked); the server states are upgraded by format 1's step."""


def _format_1(checkpoint: dict[str, Any], client_halves: Optional[list[str]] = None) -> None:
    """Per-client states in a method's own layout → ``"client_state"`` tables (:func:`upgrade_server_state`)."""
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        for key, state in list(callbacks.items()):
            if isinstance(state, dict):
                callbacks[key] = upgrade_server_state(state)


def name_client_states(tables: dict[str, Any], client_halves: Optional[list[str]]) -> dict[str, Any]:
    """The client halves' tables of one server-optimizer state keyed by name: a positional key ``"<i>"`` (format ≤ 2)
    becomes ``client_halves[i]``; a named key is kept.

    Args:
        tables: ``state["client_algorithms"]`` as saved.
        client_halves: The ``state_key`` of every client half of the resuming run, in order (``None``: unknown).

    Raises:
        ValueError: a positional key without a half at that position (or no halves given), naming it.

    Example::

        >>> name_client_states({"1": "g_k table"}, ["FedProxClient", "FedDynClient"])
        {'FedDynClient': 'g_k table'}
    """
    out: dict[str, Any] = {}
    for key, table in tables.items():
        if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
            i = int(key)
            if client_halves is None or i >= len(client_halves):
                known = "no client halves" if not client_halves else f"the client halves {client_halves}"
                raise ValueError(
                    f"The checkpoint (format 2) keeps per-client state of the client half at position {i} of the "
                    f"server optimizer's halves, but the run resuming it has {known}; resume with the client halves "
                    "the checkpoint was written with (in their order)."
                )
            key = client_halves[i]
        out[str(key)] = table
    return out


def _format_2(checkpoint: dict[str, Any], client_halves: Optional[list[str]] = None) -> None:
    """The client halves' tables keyed by position → keyed by the half's name (:func:`name_client_states`)."""
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        for state in callbacks.values():
            if isinstance(state, dict) and isinstance(state.get("client_algorithms"), dict):
                state["client_algorithms"] = name_client_states(state["client_algorithms"], client_halves)


def _table(saved: Any) -> Any:
    """A table's state dict as a stage state saves it (``None`` stays ``None``)."""
    return None if saved is None else {"client_state_table": saved}


def compose_scaffold_state(state: dict[str, Any]) -> dict[str, Any]:
    """One SCAFFOLD state dict of format ≤ 3 (c in ``"state"["control"]``, the c_i in ``"client_state"``, already a
    table: :func:`upgrade_server_state`, and ``"num_clients"``) in the composed layout: its control stage's state
    under ``"aggregators"``. Any other state is returned unchanged.

    Example::

        >>> compose_scaffold_state({"num_steps": 0, "state": {}, "num_clients": -1})
        {'num_steps': 0, 'state': {}, 'aggregators': [{'control': None, 'table': None}]}
    """
    inner = state.get("state")
    if "aggregators" in state or "num_clients" not in state or not isinstance(inner, dict) or set(inner) - {"control"}:
        return state
    rest = {k: v for k, v in state.items() if k not in ("num_clients", "client_state", "state")}
    stage = {"control": inner.get("control"), "table": _table(state.get("client_state"))}
    return {**rest, "state": {}, "aggregators": [stage]}


def compose_fedlamb_state(state: dict[str, Any]) -> dict[str, Any]:
    """One Fed-LAMB/FedAMS (``LocalAdaptiveServer``) state dict of format ≤ 3 (v̂ and, with
    ``first_moment="average"``, m̄ under ``"state"``) in the composed layout: its max-moment stage's state under
    ``"aggregators"``. Any other state is returned unchanged.

    Example::

        >>> compose_fedlamb_state({"num_steps": 1, "state": {"second_moment": ["v"]}})
        {'num_steps': 1, 'state': {}, 'aggregators': [{'second_moment': ['v'], 'first_moment': None}]}
    """
    inner = state.get("state")
    if ("aggregators" in state or not isinstance(inner, dict) or "second_moment" not in inner
            or set(inner) - {"second_moment", "first_moment"}):
        return state
    stage = {"second_moment": inner["second_moment"], "first_moment": inner.get("first_moment")}
    return {**state, "state": {}, "aggregators": [stage]}


def compose_fedaware_state(state: dict[str, Any]) -> dict[str, Any]:
    """One FedAWARE state dict of format ≤ 3 (``"fedaware"`` with N, |D_i| and the Gram matrix; the momenta in
    ``"client_state"``, already a table: :func:`upgrade_server_state`) in the composed layout: its min-norm stage's
    state under ``"aggregators"``. Any other state is returned unchanged.

    Example::

        >>> old = {"num_steps": 0, "state": {}, "fedaware": {"num_clients": 3, "client_num_samples": None, "gram": None}}
        >>> compose_fedaware_state(old)
        {'num_steps': 0, 'state': {}, 'aggregators': [{'table': None, 'client_num_samples': None, 'gram': None}]}
    """
    saved = state.get("fedaware")
    if not isinstance(saved, dict) or "aggregators" in state:
        return state
    rest = {k: v for k, v in state.items() if k not in ("fedaware", "client_state")}
    table = state.get("client_state")
    stage = {"table": _table(table), "client_num_samples": saved.get("client_num_samples"), "gram": saved.get("gram")}
    return {**rest, "aggregators": [stage]}


def _format_3(checkpoint: dict[str, Any], client_halves: Optional[list[str]] = None) -> None:
    """FedAWARE's, SCAFFOLD's and Fed-LAMB's own layouts → their stage's state under ``"aggregators"``
    (:func:`compose_fedaware_state`, :func:`compose_scaffold_state`, :func:`compose_fedlamb_state`)."""
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        for key, state in list(callbacks.items()):
            if isinstance(state, dict):
                callbacks[key] = compose_fedlamb_state(compose_scaffold_state(compose_fedaware_state(state)))


def _format_4(checkpoint: dict[str, Any], client_halves: Optional[list[str]] = None) -> None:
    """Nothing to change: format 5 only adds the on-disk tables' manifest, and a format-4 checkpoint holds every
    per-client table's rows in memory (``"rows"``), which format 5 reads as they are."""


#: format → the function upgrading a checkpoint of that format (in place) to the next one; each takes the checkpoint
#: and ``client_halves`` (the resuming run's client halves' names, in order; ``None`` when not known).
MIGRATIONS: dict[int, Callable[..., None]] = {0: _format_0, 1: _format_1, 2: _format_2, 3: _format_3, 4: _format_4}


def _malformed(path: Optional[str], field: str, value: Any, expected: str) -> ValueError:
    where = f"Checkpoint {path!r}" if path is not None else "The checkpoint"
    shown = repr(value) if len(repr(value)) <= 80 else f"a {type(value).__name__}"
    return ValueError(f"{where} has a malformed lightning_fed record: {field} is {shown}, expected {expected}.")


def check_record(checkpoint: dict[str, Any], path: Optional[str] = None) -> None:
    """Refuse a checkpoint whose lightning_fed record (``checkpoint["lightning_fed"]``) does not have the layout this
    version reads: the record a dict; ``format`` an integer ≥ 1; ``run_config`` a dict of settings;
    ``server_optimizer_state_key`` a string or ``None``; ``privacy`` a dict with a list ``previous`` of dicts and a
    dict (or ``None``) ``current``. Fields a record may lack (older formats) are not required. A checkpoint without
    the record passes (format 0).

    Args:
        checkpoint: The loaded checkpoint (not modified).
        path: The checkpoint file, named in the message (default ``None``).

    Raises:
        ValueError: one sentence naming the file, the field, what it holds and what was expected.

    Example::

        >>> check_record({"lightning_fed": {"format": 2, "run_config": {}}})  # fine
        >>> check_record({"lightning_fed": {"format": "two"}}, "last.ckpt")
        Traceback (most recent call last):
        ...
        ValueError: Checkpoint 'last.ckpt' has a malformed lightning_fed record: format is 'two', expected an integer >= 1 (the record's format number).
    """
    if RECORD_KEY not in checkpoint:
        return
    record = checkpoint[RECORD_KEY]
    if not isinstance(record, dict):
        raise _malformed(path, f"checkpoint[{RECORD_KEY!r}]", record, "a dict (the run record)")
    fmt = record.get("format", 1)
    if isinstance(fmt, bool) or not isinstance(fmt, numbers.Integral) or fmt < 1:
        raise _malformed(path, "format", fmt, "an integer >= 1 (the record's format number)")
    config = record.get("run_config", {})
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise _malformed(path, "run_config", config, "a dict of setting name -> value")
    key = record.get("server_optimizer_state_key")
    if key is not None and not isinstance(key, str):
        raise _malformed(path, "server_optimizer_state_key", key, "a string (the server optimizer's state key) or None")
    if "privacy" in record:
        privacy = record["privacy"]
        if not isinstance(privacy, dict):
            raise _malformed(path, "privacy", privacy, "a dict with 'previous' and 'current'")
        previous = privacy.get("previous", [])
        if not isinstance(previous, list) or not all(isinstance(s, dict) for s in previous):
            raise _malformed(path, "privacy['previous']", previous, "a list of history segments (dicts)")
        current = privacy.get("current")
        if current is not None and not isinstance(current, dict):
            raise _malformed(path, "privacy['current']", current, "a history segment (a dict) or None")


def checkpoint_format(checkpoint: dict[str, Any]) -> int:
    """The format of ``checkpoint``'s lightning_fed record (0 without one).

    Raises:
        ValueError: a malformed record (:func:`check_record`).
    """
    check_record(checkpoint)
    record = checkpoint.get(RECORD_KEY)
    return int(record.get("format", 1)) if isinstance(record, dict) else 0


def migrate_checkpoint(checkpoint: dict[str, Any], path: Optional[str] = None,
                       client_halves: Optional[list[str]] = None) -> int:
    """Upgrade a loaded Lightning checkpoint (in place) to :data:`CHECKPOINT_FORMAT`; returns the format it had.

    Args:
        checkpoint: The loaded checkpoint.
        path: The checkpoint file, named in errors (default ``None``).
        client_halves: The ``state_key`` of every client half of the run resuming it, in order (default ``None``:
            unknown; a format-2 checkpoint with per-client state of client halves is then refused).

    Raises:
        ValueError: a malformed lightning_fed record (:func:`check_record`), or a format newer than this version
            writes (a checkpoint of a later lightning_fed).
    """
    check_record(checkpoint, path)
    found = checkpoint_format(checkpoint)
    if found > CHECKPOINT_FORMAT:
        where = f"Checkpoint {path!r}: its" if path is not None else "The checkpoint's"
        raise ValueError(
            f"{where} lightning_fed record has format {found}, newer than this version's "
            f"{CHECKPOINT_FORMAT}: it was written by a later lightning_fed; upgrade lightning_fed to load it."
        )
    for version in range(found, CHECKPOINT_FORMAT):
        MIGRATIONS[version](checkpoint, client_halves=client_halves)
    if isinstance(checkpoint.get(RECORD_KEY), dict):
        checkpoint[RECORD_KEY]["format"] = CHECKPOINT_FORMAT
    return found


# ---------------------------------------------------------------------- the server optimizer's saved layout
# What a checkpoint holds of a server optimizer and how it is read back: a stage state's tables saved as state dicts,
# the entries a resume needs, the cut of an all-parameter state to the federated ones, and every value the
# non-finite checks read (the loop after each server step, the checkpoint connector on load).

#: A :class:`ClientStateTable` inside a stage's state is saved as ``{TABLE_KEY: <its (weights-only) state dict>}``.
TABLE_KEY = "client_state_table"


def saved_stage_state(value: Any) -> Any:
    """``value`` (a stage state's fields) as saved: tensors detached on the CPU, tables as ``{TABLE_KEY: state}``."""
    if isinstance(value, ClientStateTable):
        return {TABLE_KEY: value.state_dict()}
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: saved_stage_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(saved_stage_state(v) for v in value)
    return value


def restore_tables(value: Any) -> Any:
    """A stage state saved by :func:`saved_stage_state` back to live values (its client-state tables re-made)."""
    if isinstance(value, dict):
        if set(value) == {TABLE_KEY}:
            return ClientStateTable.from_state_dict(value[TABLE_KEY])
        return {k: restore_tables(v) for k, v in value.items()}
    return value


def clone_state(value: Any) -> Any:
    """``value`` with every tensor cloned (dicts, lists, tuples and NamedTuples rebuilt) — except the rows of a lazily
    filled client-state table's state dict (``dense`` false, ``"rows"`` a dict): a row is never written in place
    (:meth:`ClientStateTable.put` stores a new tensor), so a snapshot shares them instead of doubling the table."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        if value.get("dense") is False and isinstance(value.get("rows"), dict) and "num_clients" in value:
            return {k: (dict(v) if k == "rows" else clone_state(v)) for k, v in value.items()}
        return {k: clone_state(v) for k, v in value.items()}
    if hasattr(value, "_asdict"):
        return type(value)(**{k: clone_state(v) for k, v in value._asdict().items()})
    if isinstance(value, (list, tuple)):
        return type(value)(clone_state(v) for v in value)
    return value


class _RowsOf:
    """The client ids whose rows of the per-client tables :func:`_state_items` lists (each table once)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = [int(i) for i in ids]
        self.seen: set[int] = set()


def _state_items(items: list, prefix: str, value: Any, path: tuple, param_names: Sequence[str],
                 tables: Optional[_RowsOf]) -> None:
    """Append ``(label, value)`` for the tensors and NaN floats inside ``value`` (see :func:`state_items`);
    a :class:`ClientStateTable` contributes the rows of ``tables.ids`` (state dicts of tables: every row)."""
    label = f"{prefix} {'.'.join(path)!r}"
    if isinstance(value, Tensor):
        items.append((label, value))
    elif isinstance(value, float):
        if math.isnan(value):  # ±inf is a value of scalar state (AdaptiveStepSize's θ before round 2, S = ∞)
            items.append((label, value))
    elif isinstance(value, ClientStateTable):
        if tables is not None and id(value) not in tables.seen:
            tables.seen.add(id(value))
            items.extend((f"{label} row of client {i}", value.get(i)) for i in tables.ids
                         if 0 <= i < value.num_clients and i in value)
    elif hasattr(value, "_asdict"):
        _state_items(items, prefix, value._asdict(), path, param_names, tables)
    elif isinstance(value, dict):
        # an on-disk table's state dict: its rows recorded non-finite when written, read from their files (only those)
        items.extend((f"{label} row of client {i}", row) for i, row in nonfinite_disk_rows(value))
        for key, v in value.items():
            _state_items(items, prefix, v, path + (str(key),), param_names, tables)
    elif isinstance(value, (list, tuple)):
        if value and len(value) == len(param_names) and all(isinstance(v, Tensor) for v in value):
            items.extend((f"{label} for parameter {name!r}", v) for name, v in zip(param_names, value))
        else:
            for i, v in enumerate(value):
                _state_items(items, prefix, v, path + (str(i),), param_names, tables)


def state_items(server: Any, param_names: Sequence[str], saved: bool = False) -> list[tuple[str, Any]]:
    """``(label, value)`` of every tensor and every NaN float of ``server``'s state (a server optimizer; ±inf is a legitimate
    value of a scalar field, e.g. AdaptiveStepSize's θ = ∞ before its second round), for the non-finite checks
    (:func:`~lightning_fed.guards.nonfinite_values`); labels are ``"<Class> state '<path>'"`` with the path in
    :meth:`ServerOptimizer.state_dict <lightning_fed.callbacks.ServerOptimizer.state_dict>`'s layout, plus ``" for parameter '<name>'"`` for a per-parameter list.

    Args:
        param_names: The global model's federated parameters' names, in ``module.parameters()`` order.
        saved: ``False`` (default): the live state a server step changes — the rule's state, the aggregator
            chain's stage states and, of the per-client tables, the rows of the clients of the last server step
            (``server.round_report``; labelled ``"... row of client <id>"``) — checked after every server step;
            ``True``: everything ``server.state_dict()`` holds, whole per-client tables included (checked once, when
            loaded from a checkpoint).

    Example::

        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedAdam
        >>> server = FedAdam(lr=0.1)
        >>> server.server_update([torch.zeros(2)], [ClientUpdate(0, [torch.ones(2)], 1, 1, 0.0)]) and None
        >>> [label for label, _ in state_items(server, ["w"])]
        ["FedAdam state 'state.exp_avg' for parameter 'w'", "FedAdam state 'state.exp_avg_sq' for parameter 'w'"]
    """
    items: list[tuple[str, Any]] = []
    prefix = f"{type(server).__name__} state"
    if saved:
        _state_items(items, prefix, server.state_dict(), (), param_names, None)
        return items
    rows = _RowsOf(server.round_report.client_ids if server.round_report is not None else [])
    if server.rule_state is not None:
        _state_items(items, prefix, server.rule_state._asdict(), ("state",), param_names, rows)
    for i, stage_state in enumerate(server.aggregator_state or ()):
        _state_items(items, prefix, stage_state, ("aggregators", str(i)), param_names, rows)
    for key, table in server.client_algorithm_states.items():
        _state_items(items, prefix, table, ("client_algorithms", key), param_names, rows)
    if server.client_state is not None:
        _state_items(items, prefix, server.client_state, ("client_state",), param_names, rows)
    return items


def required_state(server: Any, num_params: int) -> list[str]:
    """The entries (dotted paths in :meth:`ServerOptimizer.state_dict <lightning_fed.callbacks.ServerOptimizer.state_dict>`'s layout) a saved state must hold for a resume after at
    least one server step (``num_steps`` > 0): ``num_steps``; the rule's tensor fields (``state.exp_avg``, ...);
    ``aggregators`` with a chain, and ``aggregators.<i>.<field>`` for each stage's ``required_fields`` (SCAFFOLD's
    c and c_i table, FedAWARE's momenta); ``client_algorithms.<state_key>`` for each client half of the run that keeps per-client state.
    A subclass with its own :meth:`state_dict` layout names its own. The checkpoint connector refuses a resume
    whose state lacks one (it would go on from a fresh state silently).

    Args:
        num_params: d, the model's number of parameter entries (for the client algorithms' ``state_dim``).

    Example::

        >>> from lightning_fed.callbacks import FedAdam, FedAvg
        >>> required_state(FedAdam(), 10), required_state(FedAvg(), 10)
        (['num_steps', 'state.exp_avg', 'state.exp_avg_sq'], ['num_steps'])
    """
    state_type = server.server_rule.State
    required = ["num_steps"] + [f"state.{f}" for f in state_type._fields if f not in state_type._field_defaults]
    if server.aggregators is not None:
        required.append("aggregators")
        required += [f"aggregators.{i}.{f}" for i, s in enumerate(server.aggregators) for f in s.required_fields]
    required += [f"client_algorithms.{a.state_key}" for a in server.client_algorithms if int(a.state_dim(num_params)) > 0]
    return required


def select_federated(server: Any, positions: Sequence[int], sizes: Sequence[int]) -> list[str]:
    """Cut a state loaded from a checkpoint that covers every parameter of the model down to the federated ones
    (a resume of a run saved before only the federated parameters were: its frozen parameters' entries were
    never used). Per-parameter lists of the rule's and the stages' states keep the entries at ``positions``;
    per-client tables of one number per model entry keep those entries' columns. Exact: every kept number is
    the saved one.

    Args:
        positions: The federated parameters' positions in ``module.parameters()``.
        sizes: ``numel`` of every parameter of the model (``module.parameters()`` order).

    Returns:
        The paths of the state that were cut (e.g. ``["state.exp_avg", "client_algorithms.FedDynClient"]``).

    Raises:
        ValueError: a state that cannot be cut exactly (a dense per-client table, FedAWARE's, whose Gram matrix
            covers every entry), naming it.

    Example::

        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.callbacks import FedAdam
        >>> server = FedAdam(lr=0.1)
        >>> update = ClientUpdate(0, [torch.ones(2), torch.zeros(3)], 1, 1, 0.0)
        >>> _ = server.server_update([torch.zeros(2), torch.zeros(3)], [update])
        >>> select_federated(server, [0], [2, 3]), [t.shape for t in server.state["exp_avg"]]
        (['state.exp_avg', 'state.exp_avg_sq'], [torch.Size([2])])
    """
    positions, sizes = [int(i) for i in positions], [int(n) for n in sizes]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    columns = torch.cat([torch.arange(offsets[i], offsets[i] + sizes[i]) for i in positions]) if positions \
        else torch.zeros(0, dtype=torch.long)
    total, cut = sum(sizes), []

    def per_parameter(value: Any) -> bool:
        return (isinstance(value, (list, tuple)) and len(value) == len(sizes) and len(sizes) > 0
                and all(isinstance(v, Tensor) and v.numel() == n for v, n in zip(value, sizes)))

    def table(value: ClientStateTable, path: str) -> ClientStateTable:
        if value.dim != total:
            return value
        if value.dense:
            raise ValueError(
                f"Cannot resume {type(server).__name__}'s state {path!r} for the federated parameters only: it is a "
                f"dense per-client table over all {total} entries of the model (FedAWARE's momenta, whose Gram "
                "matrix covers every entry), saved before frozen parameters were left out. Start a new run, or "
                "resume with every parameter trained."
            )
        out = ClientStateTable(value.num_clients, int(columns.numel()), dtype=value.dtype)
        for i in value.ids():
            out.put(i, value.get(i)[columns])
        cut.append(path)
        return out

    def walk(value: Any, path: str) -> Any:
        if per_parameter(value):
            cut.append(path)
            return [value[i] for i in positions]
        if isinstance(value, ClientStateTable):
            return table(value, path)
        if isinstance(value, dict):
            if set(value) == {TABLE_KEY}:
                restored = table(ClientStateTable.from_state_dict(value[TABLE_KEY]), path)
                return {TABLE_KEY: restored.state_dict()}
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
        return value

    if server.rule_state is not None:
        fields = server.rule_state._asdict()
        server.rule_state = type(server.rule_state)(**{k: walk(v, f"state.{k}") for k, v in fields.items()})
    if server._saved_aggregator_state is not None:
        server._saved_aggregator_state = [walk(st, f"aggregators.{i}")
                                        for i, st in enumerate(server._saved_aggregator_state)]
    if server.client_state is not None:
        server.client_state = table(server.client_state, "client_state")
    server.client_algorithm_states = {key: table(t, f"client_algorithms.{key}")
                                    for key, t in server.client_algorithm_states.items()}
    return cut
