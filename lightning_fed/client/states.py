"""The run's per-client state: one :class:`~lightning_fed.server.client_state.ClientStateTable` per client half that
keeps state, by the half's ``state_key``, owned by the client runner with the run's client halves
(:attr:`ClientHalves.states <lightning_fed.client.algorithm.ClientHalves.states>`).

A client's rows are read when it starts (:meth:`ClientStates.row`, through its
:class:`~lightning_fed.client.runner.ClientContext`'s ``client_states``) and the server step writes the rows that
arrived with the round's updates (:meth:`ClientStates.receive`). The server optimizer saves the registry with its own state (the
checkpoint's ``"client_algorithms"``) and binds the run's registry at fit start, handing over what it loaded.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from lightning_fed.server.client_state import ClientStateStore, ClientStateTable

__all__ = ["ClientStates", "resolve_store", "where_given"]


class ClientStates:
    """The client halves' per-client tables of one run, by ``state_key``, in one store.

    Args:
        store: Where new tables keep their rows (default: in memory).

    Example: client 3's row of a half keyed ``"FedDynClient"``, before and after its update arrived::

        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.algorithms import FedDynClient
        >>> states, half = ClientStates(), FedDynClient(alpha=0.1)
        >>> states.setup([half], {"FedDynClient": 2}, num_clients=5, dtype=torch.float32)
        >>> states.row("FedDynClient", 3) is None
        True
        >>> update = ClientUpdate(3, [torch.zeros(2)], 1, 1, 0.0, extras={"client_state/FedDynClient": torch.ones(2)})
        >>> states.receive([update], [half])
        >>> states.row("FedDynClient", 3)
        tensor([1., 1.])
    """

    def __init__(self, store: Optional[ClientStateStore] = None) -> None:
        #: ``state_key`` -> table (``{}`` before the fit-start :meth:`setup` or a load).
        self.tables: dict[str, ClientStateTable] = {}
        #: Whether :attr:`tables` came from a checkpoint not yet checked against the run (fit start).
        self.loaded = False
        #: Where new tables are made (:class:`~lightning_fed.server.client_state.ClientStateStore`).
        self.store = store if store is not None else ClientStateStore("memory", None)

    def row(self, key: str, client_id: int) -> Optional[Tensor]:
        """Client ``client_id``'s row of table ``key``; ``None`` when never written (or no such table)."""
        table = self.tables.get(key)
        return table.get(client_id) if table is not None and client_id in table else None

    def adopt(self, other: "ClientStates") -> None:
        """Take over ``other``'s tables, load flag and store (what a server optimizer loaded before the run bound
        this registry)."""
        self.tables, self.loaded, self.store = other.tables, other.loaded, other.store

    def setup(self, algorithms: list[Any], sizes: dict[str, int], num_clients: Optional[int],
              dtype: torch.dtype) -> None:
        """At fit start: drop tables of halves the run does not have (warning when they were loaded), then make (or
        check, when loaded) one table of ``num_clients`` rows of ``sizes[key]`` numbers per stateful half.

        Raises:
            ValueError: a loaded table of another population N or another state size (naming the half and both).
        """
        tables, loaded = self.tables, self.loaded
        stale = [k for k in tables if k not in sizes]
        if stale and loaded:
            from lightning.pytorch.utilities.rank_zero import rank_zero_warn

            rank_zero_warn(f"The checkpoint holds per-client state of client half(s) {stale} that this run does not "
                           f"have (its halves: {[a.state_key for a in algorithms]}); that state is dropped.")
        for key in stale:
            del tables[key]
        if num_clients is None:
            return
        for key, size in sizes.items():
            table = tables.get(key)
            if table is not None and loaded and (table.num_clients != int(num_clients) or table.dim != size):
                what = (f"the population changed from N = {table.num_clients} to N = {int(num_clients)} clients"
                        if table.num_clients != int(num_clients) else
                        f"its state size changed from {table.dim} to {size} numbers per client (another model?)")
                raise ValueError(
                    f"Cannot resume client half {key}: the checkpoint's per-client state was made for another run "
                    f"({what}); each client's saved state belongs to that client of that partition, so it cannot "
                    f"be carried over. Resume with the checkpoint's data module, or start a new run."
                )
            if table is None or table.num_clients != int(num_clients) or table.dim != size:
                tables[key] = self.store.table(key, int(num_clients), size, dtype)
            else:  # a loaded table, moved to the run's store when it is in another (client_state_store)
                tables[key] = self.store.adopt(key, table)
        self.loaded = False

    def receive(self, updates: list[Any], algorithms: list[Any],
                where: Callable[[Any], str] = lambda algorithm: "given") -> None:
        """Write the new per-client states that arrived with ``updates`` (``extras["client_state/<key>"]``) into
        their tables; a client dropped from the round keeps its old state. ``where(algorithm)`` says where a half was
        given, for the error.

        Raises:
            ValueError: a half whose ``finish`` returned a state of another size than its ``state_dim`` (a stateless
                half, ``state_dim`` 0, must return ``None``), naming the half, the client and both sizes.
        """
        for algorithm in algorithms:
            key = f"client_state/{algorithm.state_key}"
            table = self.tables.get(algorithm.state_key)
            for update in updates:
                if key not in update.extras:
                    continue
                state = update.extras[key]
                num_params = sum(t.numel() for t in update.delta)
                expected = table.dim if table is not None else int(algorithm.state_dim(num_params))
                if state.numel() != expected:
                    raise ValueError(
                        f"Client half {type(algorithm).__name__} ({where(algorithm)}) returned a "
                        f"per-client state of {state.numel()} numbers from finish() for client "
                        f"{update.client_id}, but its state_dim({num_params}) is {expected}"
                        + (" (stateless: finish must return None as the state)." if expected == 0 else ".")
                    )
                if table is not None:
                    table.put(update.client_id, state)

    def state_dict(self) -> dict[str, Any]:
        """``{state_key: table state dict}`` (a checkpoint's ``"client_algorithms"``)."""
        return {key: t.state_dict() for key, t in self.tables.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The tables of :meth:`state_dict`'s layout; :attr:`loaded` when there are any."""
        self.tables = {str(key): ClientStateTable.from_state_dict(t) for key, t in state_dict.items()}
        self.loaded = bool(self.tables)


def resolve_store(owner: str, kind: str, directory: Optional[str], trainer: Any, stages: list[Any]) -> ClientStateStore:
    """At fit start: the store per-client tables are made in — ``directory``, else
    ``<trainer.default_root_dir>/client_state`` for ``kind="disk"`` — checked writable, and every stage that makes
    tables (``client_state_store``) told where; a stage whose table must be in memory (``dense_client_state``,
    FedAWARE's) refuses ``"disk"``. ``owner`` names the server optimizer in errors.

    Raises:
        ValueError: ``"disk"`` with such a stage, naming it and the argument; or with more than one process
            (``trainer.world_size`` > 1: every DDP rank would write its own copy of every row).
        ClientStateStoreError: the ``"disk"`` store's directory cannot be created or written (read-only, no
            permission, full), naming ``client_state_dir``, the directory and the file tried.

    Example::

        >>> resolve_store("FedAvg", "memory", None, None, []).kind
        'memory'
    """
    if kind == "disk" and int(getattr(trainer, "world_size", 1) or 1) > 1:
        raise ValueError(
            f"{owner}(client_state_store='disk') runs in one process, but this trainer has "
            f"world_size={trainer.world_size} (strategy='ddp'): every rank applies the server update and would "
            "write its own copy of every row into one directory. Use client_state_store='memory' under DDP.")
    if kind == "disk" and directory is None:
        root = getattr(trainer, "default_root_dir", None) or os.getcwd()
        directory = os.path.join(str(root), "client_state")
    store = ClientStateStore(kind, directory)
    dense = [stage for stage in stages if kind == "disk" and getattr(stage, "dense_client_state", False)]
    if not dense:
        store.check_writable()  # before any client trains: not after round 0
    for stage in stages:
        if kind == "disk" and getattr(stage, "dense_client_state", False):
            raise ValueError(
                f"{owner}(client_state_store='disk'): {type(stage).__name__} computes over every "
                "client's row at once (a dense [N, d] table in memory), which the disk store does not hold; use "
                "client_state_store='memory' (its size is checked against `max_state_bytes`).")
        if hasattr(stage, "client_state_store"):
            stage.client_state_store = store
    return store


def where_given(algorithm: Any, own: list[Any], run: list[Any], owner: str) -> str:
    """Where the client half ``algorithm`` was given, for errors: ``"`client[i]` of <owner>"`` when it is among
    ``own`` (the server optimizer's halves: the method's own, then ``client``), else
    ``"`client_algorithms[j]` of the trainer"``, ``j`` its position among the halves of ``run`` (the run's, in
    order) that are not in ``own``.

    Example::

        >>> a, b, c = object(), object(), object()
        >>> where_given(b, [a, b], [a, b, c], "FedAvg"), where_given(c, [a, b], [a, b, c], "FedAvg")
        ('`client[1]` of FedAvg', '`client_algorithms[0]` of the trainer')
    """
    if any(a is algorithm for a in own):
        return f"`client[{next(i for i, a in enumerate(own) if a is algorithm)}]` of {owner}"
    given = [a for a in run if not any(a is b for b in own)]
    return f"`client_algorithms[{next((j for j, a in enumerate(given) if a is algorithm), 0)}]` of the trainer"
