"""SCAFFOLD: stochastic controlled averaging — control variates that correct the clients' drift."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.fedprox import optimizer_param_indices
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.server.client_state import ClientStateTable

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype (float32, bf16, fp16) accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _flatten(tensors: list[Tensor], dtype: torch.dtype) -> Tensor:
    """One 1-D CPU tensor of ``dtype`` holding ``tensors`` one after another."""
    return torch.cat([t.detach().reshape(-1).to(device="cpu", dtype=dtype) for t in tensors])


class SCAFFOLD(ServerOptimizer):
    """SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
    Algorithm 1 with option II).

    Server control variate c and one client control variate c_i per client, all zero at the start and shaped
    like the model (one tensor per entry of ``module.parameters()``). Round with cohort S, for client i ∈ S
    (Alg. 1, l. 7-14)::

        y_i ← x;   K times:  y_i ← y_i − η_l·(g_i(y_i) − c_i + c)                 (l. 10)
        c_i⁺ = c_i − c + (x − y_i)/(K·η_l)                                         (l. 12, option II)
        send Δy_i = y_i − x (the ordinary delta) and Δc_i = c_i⁺ − c_i;  c_i ← c_i⁺  (l. 13-14)

    and at the server (l. 16-17)::

        x ← x + η_g·Σ_{i∈S} λ_i·Δy_i        λ_i = 1/|S| (``weighting="uniform"``, the default, as in l. 16)
        c ← c + (|S|/N)·(1/|S|)·Σ_{i∈S} Δc_i = c + (1/N)·Σ_{i∈S} Δc_i

    so c stays the mean of all N client variates. N is ``trainer.datamodule.num_clients`` (read in ``setup``).

    How it runs inside the user's unchanged LightningModule:

    * the correction c − c_i is added to every parameter's gradient in Lightning's ``on_before_optimizer_step``
      hook (after the backward pass — and, under AMP, after unscaling — before gradient clipping and the step),
      so a plain SGD client optimizer with learning rate η_l takes exactly step l. 10; with another optimizer
      (momentum, Adam, weight decay) the corrected gradient goes through it;
    * K is counted per parameter: the number of local steps at which the parameter had a gradient (for an
      ordinary model, every parameter: the client's number of optimizer steps, which differs between clients
      under heterogeneous local work — each client uses its own K_i). η_l is the learning rate of the
      parameter's optimizer group at the start of the client's work (``context.client_lr`` of the
      :class:`~lightning_fed.client.runner.ClientContext` for one group). x is ``context.global_params``. A parameter with K = 0 (a client that took no step, or an unused parameter) sends Δc = 0 and
      keeps its c_i;
    * Δc_i travels in ``ClientUpdate.extras["delta_control"]`` (one tensor per parameter); the server applies
      c_i ← c_i + Δc_i only for the updates that reach :meth:`server_update`, so a client dropped from the round
      (failure, non-finite update) changes neither c nor its own c_i.

    Choices where the paper leaves room: ``weighting="num_samples"`` weights the model update Δx by client size
    instead (not the paper's); the c update is always the plain sum /N above, which keeps c = mean_i c_i.
    Option I (c_i⁺ = g_i(x), an extra full gradient pass) is not implemented.

    Memory: the simulator keeps each participating client's c_i on the CPU as one flat vector of d numbers
    (d = number of model parameters; float32, or float64 for a float64 model), created at the client's first
    participation (absent = zero). After all N clients have participated that is N·d·4 bytes in RAM and in every
    checkpoint (``state_dict``): e.g. 100 Fashion-MNIST clients × 582k parameters (FedAwareCNN) ≈ 0.23 GB,
    1,154 Shakespeare clients × 823k parameters (ShakespeareLSTM) ≈ 3.8 GB. c itself lives on the model's device.

    The c_i live in :attr:`client_state`, a :class:`~lightning_fed.server.client_state.ClientStateTable` of N
    lazily created rows (``dense=False``).

    State (checkpointed, loadable with ``weights_only=True``): ``state["control"]`` (c), ``client_state`` (the
    table's state dict; checkpoints written before it, with ``client_controls`` (dict client id -> flat c_i), still
    load), ``num_clients`` (N).

    Reddi et al. 2021 (Sec. 5, "Comparison to SCAFFOLD") and Zeng et al. 2024 (FedAWARE, Table 1, CIFAR-10) find
    SCAFFOLD at or below FedAvg when only a small fraction of clients is sampled per round (stale c_i); FedAWARE
    uses η_g = 1 (App. C.1).

    Args:
        lr: Server (global) learning rate η_g (> 0, default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1 l. 16) or ``"num_samples"`` weights for Δx.

    Raises:
        ValueError: ``lr`` not a finite number > 0, or an unknown ``weighting``.

    Example: two clients, one sample each ((x, y) = (1, 2) and (2, 4); loss (w·x − y)², gradient 2x(w·x − y)),
    K = 2 local SGD steps of η_l = 0.1 from x = 0 in round 0, where c = c_i = 0 (plain SGD)::

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
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> data = TensorDataset(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2,
        ...                          batch_size=1, local_epochs=2)
        >>> model, scaffold = Line(), SCAFFOLD()
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[scaffold], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> # (1, 2): y = 0 + 0.1·4 = 0.4, then 0.4 + 0.1·3.2 = 0.72;  (2, 4): y = 0 + 0.1·16 = 1.6, then 1.6 + 0.1·3.2 = 1.92
        >>> round(model.w.item(), 10)  # x ← x + η_g·mean_i(y_i − x) = (0.72 + 1.92)/2
        1.32
        >>> sorted(round(scaffold.client_control(i)[0].item(), 10) for i in (0, 1))  # c_i⁺ = (x − y_i)/(K·η_l)
        [-9.6, -3.6]
        >>> round(scaffold.state["control"][0].item(), 10), scaffold.num_clients  # c = (1/N)·Σ Δc_i
        (-6.6, 2)
    """

    def __init__(self, lr: float = 1.0, weighting: str = "uniform") -> None:
        super().__init__(lr=lr, weighting=weighting)
        #: N, the number of clients in the federation (from the data module in :meth:`setup`).
        self.num_clients: Optional[int] = None
        # The client being trained (set in configure_client, cleared in collect_client_extras).
        self._params: list[Tensor] = []
        self._index: dict[int, int] = {}
        self._correction: Optional[list[Tensor]] = None
        self._steps: list[int] = []
        self._lrs: list[float] = []
        self._global_params: list[Tensor] = []

    @property
    def client_controls(self) -> dict[int, Tensor]:
        """c_i of every client seen so far: client id -> flat CPU vector (missing = zero); the rows of
        :attr:`client_state`."""
        return {} if self.client_state is None else self.client_state.rows()

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Read N from ``trainer.datamodule.num_clients`` (no-op without a federated data module).

        Raises:
            ValueError: the stored client variates are for another N (a different federation).
        """
        num_clients = getattr(trainer.datamodule, "num_clients", None) if trainer.datamodule is not None else None
        if num_clients is None:
            return
        num_clients = int(num_clients)
        table = self.client_state
        if table is not None and table.num_clients != num_clients:
            raise ValueError(
                f"SCAFFOLD holds control variates for {table.num_clients} clients (ids up to "
                f"{max(table.ids(), default=-1)}), but the data module has {num_clients} clients."
            )
        self.num_clients = num_clients

    def init_state(self, params: list[Tensor]) -> dict[str, list[Tensor]]:
        """c = 0, one tensor per parameter (float32, or float64 for float64 parameters)."""
        return {"control": [torch.zeros(p.shape, dtype=_accumulator_dtype(p.dtype), device=p.device) for p in params]}

    def _table_dtype(self) -> torch.dtype:
        dtype = torch.float32
        for c in self.state["control"]:
            dtype = torch.promote_types(dtype, c.dtype)
        return dtype

    def client_control(self, client_id: int) -> list[Tensor]:
        """c_i of client ``client_id`` shaped like c (on c's device; zeros before its first participation).

        Raises:
            RuntimeError: before the first round (no c yet).
        """
        if not self.state:
            raise RuntimeError("SCAFFOLD has no control variates yet: they are created with the first client.")
        control = self.state["control"]
        table = self.client_state
        flat = table.get(client_id) if table is not None and client_id in table else None
        if flat is None:
            return [torch.zeros_like(c) for c in control]
        pieces = torch.split(flat, [c.numel() for c in control])
        return [t.reshape(c.shape).to(device=c.device, dtype=c.dtype) for t, c in zip(pieces, control)]

    def _check_client_id(self, client_id: int) -> None:
        if self.num_clients is not None and not 0 <= int(client_id) < self.num_clients:
            raise ValueError(f"Client id {client_id} is outside [0, {self.num_clients}).")

    # ------------------------------------------------------------------ client side
    def configure_client(
        self, trainer: Any, pl_module: Any, client_id: int, round_idx: int, context: Optional["ClientContext"] = None
    ) -> None:
        """Send (x, c) to client ``client_id`` (Alg. 1, l. 5; x is ``context.global_params``): prepare its gradient
        correction c − c_i and zero its per-parameter step counts.

        Raises:
            RuntimeError: no ``context`` (the federated loop's client runner always sends one).
        """
        if context is None:
            raise RuntimeError(
                "SCAFFOLD.configure_client needs the ClientContext (x_t) that the federated loop's ClientRunner sends."
            )
        self._check_client_id(client_id)
        self._global_params = context.global_params
        self._params = list(pl_module.parameters())
        self._index = {id(p): i for i, p in enumerate(self._params)}
        if not self.state:
            self.state = self.init_state(self._params)
        else:
            self._move_state(self._params)
        control = self.state["control"]
        client = self.client_control(client_id)
        self._correction = [(c - ci).to(p.dtype) for c, ci, p in zip(control, client, self._params)]
        self._steps = [0] * len(self._params)
        self._lrs = [math.nan] * len(self._params)
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    i = self._index.get(id(p))
                    if i is not None:
                        self._lrs[i] = float(group.get("lr", math.nan))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Corrected gradient g_i(y_i) − c_i + c (Alg. 1, l. 10) for the parameters ``optimizer`` updates; counts
        the step for each of them. No-op outside a client's local work."""
        if self._correction is None:
            return
        stepped = [i for i in optimizer_param_indices(optimizer, self._index) if self._params[i].grad is not None]
        if not stepped:
            return
        with torch.no_grad():
            torch._foreach_add_([self._params[i].grad for i in stepped], [self._correction[i] for i in stepped])
        for i in stepped:
            self._steps[i] += 1

    def collect_client_extras(
        self, trainer: Any, pl_module: Any, client_id: int, round_idx: int, context: Optional["ClientContext"] = None
    ) -> dict[str, Any]:
        """Δc_i = c_i⁺ − c_i = −c + (x − y_i)/(K·η_l) per parameter (Alg. 1, l. 12-13, option II), as
        ``{"delta_control": [tensor per parameter]}``; zero where K = 0.

        Raises:
            RuntimeError: called without :meth:`configure_client`, or a stepped parameter's learning rate is not a
                finite number > 0.
        """
        if self._correction is None:
            raise RuntimeError("SCAFFOLD.collect_client_extras called before configure_client for this client.")
        global_params = context.global_params if context is not None else self._global_params
        control = self.state["control"]
        delta_control = []
        with torch.no_grad():
            for i, (p, x, c) in enumerate(zip(self._params, global_params, control)):
                steps, lr = self._steps[i], self._lrs[i]
                if steps == 0:
                    delta_control.append(torch.zeros_like(c))
                    continue
                if not (math.isfinite(lr) and lr > 0):
                    raise RuntimeError(
                        f"SCAFFOLD option II needs the client learning rate η_l > 0 of every trained parameter; "
                        f"parameter {i} has lr={lr!r}."
                    )
                # (x − y_i)/(K·η_l)
                drift = (x.to(c.device, c.dtype) - p.detach().to(c.device, c.dtype)) / (steps * lr)
                delta_control.append(drift - c)
        self._correction = None
        self._global_params = []
        return {"delta_control": delta_control}

    # ------------------------------------------------------------------ server side
    def step(self, params: list[Tensor], pseudo_gradient: list[Tensor]) -> None:
        """x ← x + η_g·Δx (Alg. 1, l. 17)."""
        torch._foreach_add_(params, pseudo_gradient, alpha=self.lr)

    def server_update(self, params: list[Tensor], updates: list[ClientUpdate]) -> list[Tensor]:
        """x ← x + η_g·Σλ_iΔy_i, then c ← c + (1/N)·ΣΔc_i and c_i ← c_i + Δc_i for every reporting client
        (Alg. 1, l. 14, 16-17). Returns Δx.

        Raises:
            RuntimeError: N unknown (no :meth:`setup` with a federated data module), or an update without
                ``extras["delta_control"]``.
            ValueError: a client id outside [0, N).
        """
        if self.num_clients is None:
            raise RuntimeError(
                "SCAFFOLD needs the number of clients N (read from `trainer.datamodule.num_clients` in `setup`)."
            )
        for update in updates:
            self._check_client_id(update.client_id)
            if "delta_control" not in update.extras:
                raise RuntimeError(
                    f"Client {update.client_id}'s update has no extras['delta_control']: SCAFFOLD clients must be "
                    "trained through the federated loop (configure_client / collect_client_extras)."
                )
        pseudo_gradient = super().server_update(params, updates)
        with torch.no_grad():
            control = self.state["control"]
            if self.client_state is None:
                self.client_state = ClientStateTable(
                    self.num_clients, sum(c.numel() for c in control), dtype=self._table_dtype()
                )
            table = self.client_state
            dtype = table.dtype
            for update in updates:
                delta = [d.to(device=c.device, dtype=c.dtype) for d, c in zip(update.extras["delta_control"], control)]
                torch._foreach_add_(control, delta, alpha=1.0 / self.num_clients)
                flat = _flatten(delta, dtype)
                cid = int(update.client_id)
                # A new tensor (never in place), so state dicts handed out earlier keep their values.
                table.put(cid, flat if cid not in table else table.get(cid) + flat)
        return pseudo_gradient

    # ------------------------------------------------------------------ checkpointing
    @property
    def state_key(self) -> str:
        return self._generate_state_key(lr=self.lr, weighting=self.weighting)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["num_clients"] = -1 if self.num_clients is None else int(self.num_clients)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore c, the client variates (``client_state``, or ``client_controls`` of a checkpoint written before
        the client-state table) and N.

        Raises:
            ValueError: the checkpoint's N differs from the data module's.
        """
        num_clients = int(state_dict.get("num_clients", -1))
        if num_clients >= 0 and self.num_clients is not None and num_clients != self.num_clients:
            raise ValueError(
                f"This SCAFFOLD checkpoint was saved with {num_clients} clients; the data module has "
                f"{self.num_clients}."
            )
        super().load_state_dict(state_dict)
        if num_clients >= 0:
            self.num_clients = num_clients
        if "client_state" in state_dict:
            return  # restored by the base class
        controls = state_dict.get("client_controls", {})
        self.client_state = None
        if controls:
            if self.num_clients is None:
                raise ValueError("This SCAFFOLD checkpoint holds client control variates but no `num_clients`.")
            first = next(iter(controls.values()))
            self.client_state = ClientStateTable.from_state_dict(
                {"num_clients": self.num_clients, "dim": first.numel(), "rows": controls}
            )
