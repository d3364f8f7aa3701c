"""SCAFFOLD's reducer: the averaged model update Δx and the control-variate updates of the server (Karimireddy et
al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020, Algorithm 1, l. 14-17).
Composed with the SGD rule (η_g) it is :class:`~lightning_fed.callbacks.SCAFFOLD`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean
from lightning_fed.server.client_state import ClientStateTable

__all__ = ["ScaffoldControl", "control_dtype"]


def control_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of c for parameters of ``dtype``: float64 stays float64; every other floating dtype (float32,
    bf16, fp16) accumulates in float32.

    Example::

        >>> control_dtype(torch.bfloat16), control_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def _flatten(tensors: list[Tensor], dtype: torch.dtype) -> Tensor:
    """One 1-D CPU tensor of ``dtype`` holding ``tensors`` one after another."""
    return torch.cat([t.detach().reshape(-1).to(device="cpu", dtype=dtype) for t in tensors])


class ScaffoldControl(Stage):
    """Reducer of SCAFFOLD (Karimireddy et al. 2020, Alg. 1, l. 14-17, option II on the clients)::

        Δx = Σ_{i∈S} λ_i·Δy_i                  λ_i = counts_i / Σ counts (uniform counts: l. 16's 1/|S|)
        c  ← c + (1/N)·Σ_{i∈S} Δc_i             (l. 17: (|S|/N)·(1/|S|)·ΣΔc_i, so c stays mean_i c_i)
        c_i ← c_i + Δc_i   for i ∈ S            (l. 14, the server's copy of the client variates)

    Δy_i is the client's delta and Δc_i its ``ClientUpdate.extras["delta_control"]`` (one tensor per parameter).
    The :class:`State` holds c (one tensor per parameter, float32 — float64 for a float64 model — on the model's
    device; zeros shaped like the deltas if none yet) and the c_i in a lazily filled
    :class:`~lightning_fed.server.client_state.ClientStateTable` (``dense=False``, flat CPU rows), created at the
    first round. The server step x ← x + η_g·Δx is the rule's (:class:`~lightning_fed.server.rules.SGD`).

    Args:
        num_clients: N (``None``: must be set before the first round; SCAFFOLD reads it from the data module).

    Raises:
        RuntimeError: in :meth:`apply`, N unknown, ``ClientDeltas.updates`` missing, or an update without
            ``extras["delta_control"]``.
        ValueError: in :meth:`apply`, a client id outside [0, N).

    Example: N = 4, two clients with Δy = [1], [3] and Δc = [2], [−6] (uniform weights): Δx = 2, c = (2 − 6)/4::

        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([1.0])], 1, 1, 0.0, extras={"delta_control": [torch.tensor([2.0])]}),
        ...            ClientUpdate(3, [torch.tensor([3.0])], 1, 1, 0.0, extras={"delta_control": [torch.tensor([-6.0])]})]
        >>> x = ClientDeltas([0, 3], [u.delta for u in updates], torch.ones(2, dtype=torch.float64), updates)
        >>> stage = ScaffoldControl(num_clients=4)
        >>> delta, state = stage.apply(x, stage.init_state(x.deltas[0], 4), RoundInfo(0, 0, 4, 2))
        >>> delta, state.control, state.table.get(3)
        ([tensor([2.])], [tensor([-1.])], tensor([-6.]))
    """

    kind = "reduce"

    class State(NamedTuple):
        """c (one tensor per parameter; ``None`` before the first round) and the c_i table (``None`` likewise)."""

        control: Optional[list[Tensor]] = None
        table: Optional[ClientStateTable] = None

    def __init__(self, num_clients: Optional[int] = None) -> None:
        self.num_clients = num_clients

    @staticmethod
    def zero_control(params: list[Tensor]) -> list[Tensor]:
        """c = 0 shaped like ``params`` (dtype :func:`control_dtype`, on their devices)."""
        return [torch.zeros(p.shape, dtype=control_dtype(p.dtype), device=p.device) for p in params]

    def init_state(self, params: list[Tensor], num_clients: int) -> "ScaffoldControl.State":
        """c = 0 shaped like ``params``; no c_i yet."""
        return self.State(self.zero_control(params), None)

    def check_round(self, client_ids: list[int], updates: list) -> None:
        """The checks of Alg. 1's inputs, before any state changes (errors as in the class doc)."""
        if self.num_clients is None:
            raise RuntimeError(
                "SCAFFOLD needs the number of clients N (read from `trainer.datamodule.num_clients` in `setup`)."
            )
        for cid, update in zip(client_ids, updates):
            if not 0 <= int(cid) < self.num_clients:
                raise ValueError(f"Client id {cid} is outside [0, {self.num_clients}).")
            if "delta_control" not in update.extras:
                raise RuntimeError(
                    f"Client {cid}'s update has no extras['delta_control']: SCAFFOLD clients must be "
                    "trained through the federated loop (configure_client / collect_client_extras)."
                )

    def apply(self, x: ClientDeltas, state: "ScaffoldControl.State", info: RoundInfo) -> tuple[list[Tensor], "ScaffoldControl.State"]:
        """Δx (the weighted mean of ``x.deltas`` by ``x.counts``) and the state with c and the cohort's c_i updated."""
        if x.updates is None:
            raise RuntimeError("ScaffoldControl needs `ClientDeltas.updates` (the clients' extras['delta_control']).")
        self.check_round(x.client_ids, x.updates)
        pseudo_gradient, _ = WeightedMean().apply(x, state, info)
        with torch.no_grad():
            control = state.control if state.control is not None else self.zero_control(x.deltas[0])
            table = state.table
            if table is None:
                dtype = torch.float32
                for c in control:
                    dtype = torch.promote_types(dtype, c.dtype)
                table = ClientStateTable(self.num_clients, sum(c.numel() for c in control), dtype=dtype)
            dtype = table.dtype
            for update in x.updates:
                delta = [d.to(device=c.device, dtype=c.dtype) for d, c in zip(update.extras["delta_control"], control)]
                torch._foreach_add_(control, delta, alpha=1.0 / self.num_clients)
                flat = _flatten(delta, dtype)
                cid = int(update.client_id)
                # A new tensor (never in place), so state dicts handed out earlier keep their values.
                table.put(cid, flat if cid not in table else table.get(cid) + flat)
        return pseudo_gradient, self.State(control, table)
