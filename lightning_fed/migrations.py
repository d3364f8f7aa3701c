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
* **2** — every per-client state is a ``"client_state"`` table state dict (what this version writes); a stage
  state holding a table inside ``"aggregators"`` saves it as ``{"client_state_table": <its state dict>}``.

Settings added to the run record after format 1 (``cohort_sampling``, ``server_optimizer.accounting``, ...) are not
migrated: the record comparison reads a missing key as the value such a checkpoint was run with
(``lightning_fed.checkpoint._RECORD_DEFAULTS``).
"""

from __future__ import annotations

from typing import Any, Callable

from lightning_fed.server.client_state import ClientStateTable

__all__ = ["CHECKPOINT_FORMAT", "MIGRATIONS", "checkpoint_format", "migrate_checkpoint", "upgrade_server_state"]

#: The format of the lightning_fed record this version writes.
CHECKPOINT_FORMAT = 2

#: The key of lightning_fed's record in a Lightning checkpoint (``lightning_fed.checkpoint.CHECKPOINT_KEY``).
RECORD_KEY = "lightning_fed"


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


def _format_0(checkpoint: dict[str, Any]) -> None:
    """No record: nothing to add (the run cannot be checked); the server states are upgraded by format 1's step."""


def _format_1(checkpoint: dict[str, Any]) -> None:
    """Per-client states in a method's own layout → ``"client_state"`` tables (:func:`upgrade_server_state`)."""
    callbacks = checkpoint.get("callbacks")
    if isinstance(callbacks, dict):
        for key, state in list(callbacks.items()):
            if isinstance(state, dict):
                callbacks[key] = upgrade_server_state(state)


#: format → the function upgrading a checkpoint of that format (in place) to the next one.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], None]] = {0: _format_0, 1: _format_1}


def checkpoint_format(checkpoint: dict[str, Any]) -> int:
    """The format of ``checkpoint``'s lightning_fed record (0 without one)."""
    record = checkpoint.get(RECORD_KEY)
    return int(record.get("format", 1)) if isinstance(record, dict) else 0


def migrate_checkpoint(checkpoint: dict[str, Any]) -> int:
    """Upgrade a loaded Lightning checkpoint (in place) to :data:`CHECKPOINT_FORMAT`; returns the format it had.

    Raises:
        ValueError: a format newer than this version writes (a checkpoint of a later lightning_fed).
    """
    found = checkpoint_format(checkpoint)
    if found > CHECKPOINT_FORMAT:
        raise ValueError(
            f"The checkpoint's lightning_fed record has format {found}, newer than this version's "
            f"{CHECKPOINT_FORMAT}: it was written by a later lightning_fed; upgrade lightning_fed to load it."
        )
    for version in range(found, CHECKPOINT_FORMAT):
        MIGRATIONS[version](checkpoint)
    if isinstance(checkpoint.get(RECORD_KEY), dict):
        checkpoint[RECORD_KEY]["format"] = CHECKPOINT_FORMAT
    return found
