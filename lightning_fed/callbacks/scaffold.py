"""SCAFFOLD: stochastic controlled averaging — control variates that correct the clients' drift."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from lightning_fed.algorithms.scaffold import ScaffoldClient, ScaffoldControl
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.server.client_state import ClientStateTable
from lightning_fed.server.rules.sgd import SGD


class SCAFFOLD(ServerOptimizer):
    """SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
    Algorithm 1 with option II).

    A composition of the two halves in :mod:`lightning_fed.algorithms.scaffold`:
    ``ServerOptimizer(aggregators=[ScaffoldControl()], rule=SGD(lr), client=[ScaffoldClient()])`` — the client half
    :class:`~lightning_fed.algorithms.ScaffoldClient` (the gradient correction and Δc_i), the reducer
    :class:`~lightning_fed.algorithms.ScaffoldControl` (Δx, c and c_i updates, l. 14-17) and the server SGD rule
    x ← x + η_g·Δx; c and the c_i table live in the stage's state (:attr:`aggregator_state`). The halves also go
    with another server rule (e.g. FedYogi's), see the module :mod:`lightning_fed.algorithms.scaffold`.

    Server control variate c and one client control variate c_i per client, all zero at the start and shaped
    like the model (one tensor per entry of ``module.parameters()``). Round with cohort S, for client i ∈ S
    (Alg. 1, l. 7-14)::

        y_i ← x;   K times:  y_i ← y_i − η_l·(g_i(y_i) − c_i + c)                 (l. 10)
        c_i⁺ = c_i − c + (x − y_i)/(K·η_l)                                         (l. 12, option II)
        send Δy_i = y_i − x (the ordinary delta) and Δc_i = c_i⁺ − c_i;  c_i ← c_i⁺  (l. 13-14)

    and at the server (l. 16-17)::

        x ← x + η_g·Σ_{i∈S} λ_i·Δy_i        λ_i = 1/|S| (``weighting="uniform"``, the default, as in l. 16)
        c ← c + (|S|/N)·(1/|S|)·Σ_{i∈S} Δc_i = c + (1/N)·Σ_{i∈S} Δc_i

    so c stays the mean of all N client variates. N is ``trainer.datamodule.num_clients`` (read at fit start).

    This class only fixes the parts (the stage, the rule, the client half); the behaviour is theirs: fit-start
    checks in :meth:`ScaffoldControl.check_fit <lightning_fed.algorithms.ScaffoldControl.check_fit>`, the round's
    checks and c in :meth:`~lightning_fed.algorithms.ScaffoldControl.prepare_round`.

    How the client half runs inside the user's unchanged LightningModule (the correction in Lightning's
    ``on_before_optimizer_step``, K and η_l per parameter, Δc_i in ``ClientUpdate.extras["delta_control"]``, a
    dropped client changing neither c nor its c_i): :class:`~lightning_fed.algorithms.ScaffoldClient`.

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

    State (checkpointed, loadable with ``weights_only=True``): the control stage's state, saved as every composed
    server optimizer saves its chain's, under ``"aggregators"``: c (``"control"``) and the c_i table (``"table"``,
    whose N is the run's). Checkpoints in the earlier layouts (c under ``"state"``, the c_i under ``"client_state"``
    or ``"client_controls"``, ``"num_clients"``) are upgraded on load (:mod:`lightning_fed.migrations`).

    Reddi et al. 2021 (Sec. 5, "Comparison to SCAFFOLD") and Zeng et al. 2024 (FedAWARE, Table 1, CIFAR-10) find
    SCAFFOLD at or below FedAvg when only a small fraction of clients is sampled per round (stale c_i); FedAWARE
    uses η_g = 1 (App. C.1).

    Args:
        lr: Server (global) learning rate η_g (> 0, default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1 l. 16) or ``"num_samples"`` weights for Δx.
        client_state_store: Where the c_i live: ``"memory"`` (default) or ``"disk"`` (one file per client row,
            checkpoints reference them; :class:`~lightning_fed.callbacks.ServerOptimizer`).
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``).

    Raises:
        ValueError: ``lr`` not a finite number > 0, an unknown ``weighting`` or ``client_state_store``.

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

    def __init__(self, lr: float = 1.0, weighting: str = "uniform", client_state_store: str = "memory",
                 client_state_dir: Optional[str] = None) -> None:
        #: The reducer stage (:class:`~lightning_fed.server.aggregators.ScaffoldControl`): Δx, c and the c_i.
        self.control_stage = ScaffoldControl()
        super().__init__(weighting=weighting, aggregators=[self.control_stage], rule=SGD(lr),
                         client_state_store=client_state_store, client_state_dir=client_state_dir)
        self._own_client = [ScaffoldClient()]  # the client half: c − c_i on the gradients, Δc_i sent back
        self._own_aggregators = [self.control_stage]  # its own chain: another one is refused at fit start

    @property
    def num_clients(self) -> Optional[int]:
        """N, the number of clients in the federation (from the data module at fit start; the stage's)."""
        return self.control_stage.num_clients

    @num_clients.setter
    def num_clients(self, value: Optional[int]) -> None:
        self.control_stage.num_clients = value

    def _stage_state(self) -> ScaffoldControl.State:
        fields = self.stage_state_fields(self.control_stage)  # the live state, or the one loaded before it is re-made
        return ScaffoldControl.State() if fields is None else ScaffoldControl.State(**fields)

    @property
    def client_state(self) -> Optional[ClientStateTable]:
        """The c_i (:class:`~lightning_fed.server.client_state.ClientStateTable`, ``None`` before the first round),
        held in the stage's state."""
        return self._stage_state().table

    @client_state.setter
    def client_state(self, value: Optional[ClientStateTable]) -> None:
        self.aggregator_state = (self._stage_state()._replace(table=value),)

    @property
    def state(self) -> dict[str, list[Tensor]]:
        """``{"control": c}`` (the stage state's c, one tensor per parameter; ``{}`` before the first client)."""
        control = self._stage_state().control
        return {} if control is None else {"control": control}

    @state.setter
    def state(self, value: dict[str, list[Tensor]]) -> None:
        self.aggregator_state = (self._stage_state()._replace(control=value.get("control")),)

    @property
    def client_controls(self) -> dict[int, Tensor]:
        """c_i of every client seen so far: client id -> flat CPU vector (missing = zero); the rows of
        :attr:`client_state`."""
        return {} if self.client_state is None else self.client_state.rows()

    def client_control(self, client_id: int) -> list[Tensor]:
        """c_i of client ``client_id`` shaped like c (on c's device; zeros before its first participation):
        :meth:`ScaffoldControl.client_control <lightning_fed.algorithms.ScaffoldControl.client_control>`.

        Raises:
            RuntimeError: before the first round (no c yet).
        """
        return self.control_stage.client_control(self, client_id)
