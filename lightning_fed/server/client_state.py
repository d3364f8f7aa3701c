"""The client-state table: the per-client state a server method keeps for every client of the federation.

FedAWARE's momenta m_i (Zeng et al. 2024, Alg. 1, l. 10) and SCAFFOLD's control variates c_i (Karimireddy et al.
2020, Alg. 1, l. 13) are one flat vector of d numbers per client (d = the model's total number of parameters, in
``module.parameters()`` order). :class:`ClientStateTable` holds them on the CPU, sized by N (the number of
clients), and checkpoints them through :meth:`ClientStateTable.state_dict`.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
from torch import Tensor


class ClientStateTable:
    """One flat CPU vector of ``dim`` numbers per client, for the N clients ``0 … num_clients − 1``.

    A row never written reads as zeros (:meth:`get`) and is not :meth:`present`. Two layouts:

    * ``dense=True``: one ``[N, dim]`` tensor allocated up front (:attr:`matrix`), for methods that compute over all
      rows at once (FedAWARE's Gram matrix). Memory N·dim·(4 B for float32) from the start.
    * ``dense=False`` (default): a row is created at its client's first write; memory grows with the clients seen,
      up to the same N·dim once all have been (SCAFFOLD's c_i).

    Rows are copied to the CPU in the table's dtype on write. Under ``dense=False`` :meth:`put` stores a new tensor
    (never writes in place), so a :meth:`state_dict` handed out earlier keeps its values.

    Args:
        num_clients: N (an integer ≥ 1).
        dim: d, the length of every row (an integer ≥ 1).
        dtype: The rows' floating dtype (default ``torch.float32``).
        dense: The layout (default ``False``, see above).

    Raises:
        ValueError: ``num_clients`` or ``dim`` not an integer ≥ 1, ``dtype`` not a floating dtype; at use: a client
            id outside [0, N) (the message names it), a row of the wrong length, a state dict of another N or d.

    Example::

        >>> import torch
        >>> table = ClientStateTable(num_clients=3, dim=2)
        >>> table.put(2, torch.tensor([1.0, -2.0]))
        >>> table.get(2), table.get(0), table.present.tolist()
        (tensor([ 1., -2.]), tensor([0., 0.]), [False, False, True])
        >>> ClientStateTable.from_state_dict(table.state_dict()).ids()
        [2]
        >>> table.get(3)
        Traceback (most recent call last):
        ...
        ValueError: client id 3 is outside [0, 3) (num_clients=3).
    """

    def __init__(self, num_clients: int, dim: int, dtype: torch.dtype = torch.float32, dense: bool = False) -> None:
        for name, value in (("num_clients", num_clients), ("dim", dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"`dtype` must be a floating torch.dtype, got {dtype!r}.")
        if not isinstance(dense, bool):
            raise ValueError(f"`dense` must be a bool, got {dense!r}.")
        self.num_clients, self.dim, self.dtype, self.dense = num_clients, dim, dtype, dense
        self._present = torch.zeros(num_clients, dtype=torch.bool)
        self._matrix: Optional[Tensor] = torch.zeros(num_clients, dim, dtype=dtype) if dense else None
        self._rows: dict[int, Tensor] = {}

    # ------------------------------------------------------------------ ids
    def check_ids(self, ids: Iterable[int], unique: bool = False) -> list[int]:
        """``ids`` as Python ints, checked to lie in [0, N) (and, with ``unique``, to be distinct).

        Raises:
            ValueError: naming the ids outside [0, N), or the repeated ones.
        """
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.num_clients]
        if bad:
            what = f"client id {bad[0]} is" if len(bad) == 1 else f"client ids {bad} are"
            raise ValueError(f"{what} outside [0, {self.num_clients}) (num_clients={self.num_clients}).")
        if unique and len(set(ids)) != len(ids):
            raise ValueError(f"A client appears more than once: ids {ids}.")
        return ids

    @property
    def present(self) -> Tensor:
        """bool ``[N]``: whether client i's row has been written (the tensor itself)."""
        return self._present

    def ids(self) -> list[int]:
        """The clients whose rows have been written, ascending."""
        return torch.nonzero(self._present).flatten().tolist()

    def __contains__(self, client_id: int) -> bool:
        return bool(self._present[self.check_ids([client_id])[0]])

    def __len__(self) -> int:
        return int(self._present.sum())

    # ------------------------------------------------------------------ rows
    @property
    def matrix(self) -> Tensor:
        """The ``[N, dim]`` table itself (``dense=True`` only; rows never written are zero).

        Raises:
            RuntimeError: a ``dense=False`` table.
        """
        if self._matrix is None:
            raise RuntimeError("ClientStateTable.matrix needs dense=True; this table creates rows lazily.")
        return self._matrix

    def get(self, client_id: int) -> Tensor:
        """Client ``client_id``'s row, ``[dim]`` (the stored tensor, or new zeros if never written)."""
        (i,) = self.check_ids([client_id])
        if self._matrix is not None:
            return self._matrix[i]
        row = self._rows.get(i)
        return torch.zeros(self.dim, dtype=self.dtype) if row is None else row

    def gather(self, ids: Iterable[int]) -> Tensor:
        """The rows of ``ids`` stacked, ``[len(ids), dim]`` (a new tensor)."""
        ids = self.check_ids(ids)
        if self._matrix is not None:
            return self._matrix.index_select(0, torch.tensor(ids, dtype=torch.long))
        return torch.stack([self.get(i) for i in ids]) if ids else torch.zeros(0, self.dim, dtype=self.dtype)

    def _row(self, value: Tensor) -> Tensor:
        value = value.detach().to(device="cpu", dtype=self.dtype)
        if tuple(value.shape) != (self.dim,):
            raise ValueError(f"A client-state row must have shape ({self.dim},), got {tuple(value.shape)}.")
        return value

    def put(self, client_id: int, value: Tensor) -> None:
        """Set client ``client_id``'s row to ``value`` (``[dim]``, any device; stored on the CPU in :attr:`dtype`)."""
        (i,) = self.check_ids([client_id])
        value = self._row(value)
        if self._matrix is not None:
            self._matrix[i].copy_(value)
        else:
            self._rows[i] = value
        self._present[i] = True

    def scatter(self, ids: Iterable[int], values: Tensor) -> None:
        """Set the rows of ``ids`` (distinct) to ``values`` (``[len(ids), dim]``)."""
        ids = self.check_ids(ids, unique=True)
        if self._matrix is not None:
            if tuple(values.shape) != (len(ids), self.dim):
                raise ValueError(f"Expected rows of shape ({len(ids)}, {self.dim}), got {tuple(values.shape)}.")
            rows = torch.tensor(ids, dtype=torch.long)
            self._matrix.index_copy_(0, rows, values.detach().to(device="cpu", dtype=self.dtype))
            self._present[rows] = True
            return
        for i, value in zip(ids, values):
            self.put(i, value)

    def rows(self) -> dict[int, Tensor]:
        """``{client id: row}`` for the clients written so far (the stored tensors; views of :attr:`matrix` if dense)."""
        return {i: self.get(i) for i in self.ids()}

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """``{"num_clients", "dim", "dense", "dtype" (e.g. ``"float32"``), "present": bool [N], "rows": [N, dim] tensor (dense) or
        {client id: [dim] tensor}}``: tensors, ints, bools and a string only (loadable with ``weights_only=True``)."""
        rows: Any = self._matrix.clone() if self._matrix is not None else dict(self._rows)
        return {"num_clients": self.num_clients, "dim": self.dim, "dense": self.dense,
                "dtype": str(self.dtype).removeprefix("torch."),
                "present": self._present.clone(), "rows": rows}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the rows (copied to the CPU in this table's dtype).

        Raises:
            ValueError: the state dict is for another N or d.
        """
        for name in ("num_clients", "dim"):
            if int(state_dict[name]) != getattr(self, name):
                raise ValueError(
                    f"The client-state checkpoint has {name}={int(state_dict[name])}, but this table has "
                    f"{name}={getattr(self, name)}."
                )
        rows = state_dict["rows"]
        self._present.zero_()
        self._rows = {}
        if self._matrix is not None:
            self._matrix.zero_()
        if isinstance(rows, dict):
            for i, value in rows.items():
                self.put(int(i), value.clone())
            return
        present = state_dict.get("present")
        ids = list(range(self.num_clients)) if present is None else torch.nonzero(present).flatten().tolist()
        if self._matrix is not None:
            self._matrix.copy_(rows.detach().cpu().to(self.dtype))
            self._present[ids] = True
        else:
            for i in ids:
                self.put(i, rows[i].clone())

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any]) -> "ClientStateTable":
        """A table built from :meth:`state_dict`'s output (N, d, layout and dtype from the checkpoint)."""
        rows = state_dict["rows"]
        dtype = getattr(torch, state_dict["dtype"]) if "dtype" in state_dict else (
            rows.dtype if isinstance(rows, Tensor) else next(iter(rows.values())).dtype if rows else torch.float32
        )
        table = cls(int(state_dict["num_clients"]), int(state_dict["dim"]), dtype=dtype,
                    dense=bool(state_dict.get("dense", not isinstance(rows, dict))))
        table.load_state_dict(state_dict)
        return table

    def __repr__(self) -> str:
        return (f"ClientStateTable(num_clients={self.num_clients}, dim={self.dim}, dtype={self.dtype}, "
                f"dense={self.dense}, written={len(self)})")
