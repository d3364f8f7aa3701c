"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
Algorithm 1 with option II) as one unit: the client half :class:`ScaffoldClient` (the drift correction c − c_i of
l. 10 and Δc_i of l. 12-13) and the server half :class:`ScaffoldControl` (the reducer of l. 16-17, whose typed state
holds c and the c_i). :class:`~lightning_fed.algorithms.scaffold.SCAFFOLD` is the two under server SGD (η_g), the paper's
method; the halves go with any server rule, e.g. SCAFFOLD's clients and control variates under FedYogi::

    FederatedTrainer(callbacks=[FedYogi(lr=0.01, weighting="uniform", aggregators=[ScaffoldControl()])],
                     client_algorithms=[ScaffoldClient()])

One half without the other is refused at fit start naming both (:func:`check_scaffold`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.client.algorithm import ClientAlgorithm, stepped_indices
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean, state_dtype
from lightning_fed.server.client_state import ClientStateTable
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.server.fields import stage_mirror, warn_mirror
from lightning_fed.server.rules.sgd import SGD

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["SCAFFOLD", "ScaffoldClient", "ScaffoldControl", "check_scaffold", "control_dtype"]


#: The dtype of c for parameters of a dtype (:func:`~lightning_fed.server.aggregators.base.state_dtype`: float64
#: stays float64, every other floating dtype accumulates in float32).
control_dtype = state_dtype


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
    #: After a server step a checkpoint must hold c and the c_i table (without the table every c_i would restart at
    #: zero while c, their mean, is kept).
    required_fields = ("control", "table")

    class State(NamedTuple):
        """c (one tensor per parameter; ``None`` before the first round) and the c_i table (``None`` likewise)."""

        control: Optional[list[Tensor]] = None
        table: Optional[ClientStateTable] = None

    def __init__(self, num_clients: Optional[int] = None) -> None:
        self.num_clients = num_clients
        #: Where the c_i table keeps its rows (:class:`~lightning_fed.server.client_state.ClientStateStore`; set by
        #: the server optimizer at fit start from its ``client_state_store``; ``None``: in memory).
        self.client_state_store: Optional[Any] = None

    def __repr__(self) -> str:
        return "ScaffoldControl()"  # N is the data module's (set at fit start), not a setting of the run

    @staticmethod
    def zero_control(params: list[Tensor]) -> list[Tensor]:
        """c = 0 shaped like ``params`` (dtype :func:`control_dtype`, on their devices)."""
        return [torch.zeros(p.shape, dtype=control_dtype(p.dtype), device=p.device) for p in params]

    def init_state(self, params: list[Tensor], num_clients: int) -> "ScaffoldControl.State":
        """c = 0 shaped like ``params``; no c_i yet."""
        return self.State(self.zero_control(params), None)

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """At fit start: the client half is there (:func:`check_scaffold`) and N is the data module's
        ``num_clients`` (kept as given when the data module has none), also the N of the c_i table a checkpoint
        restored.

        Raises:
            ValueError: as :func:`check_scaffold`; a restored c_i table for another number of clients (before any
                client trains).
        """
        check_scaffold(server)
        num_clients = getattr(getattr(trainer, "datamodule", None), "num_clients", None)
        if num_clients is not None:
            self.num_clients = int(num_clients)
            fields = server.stage_state_fields(self) if hasattr(server, "stage_state_fields") else None
            table = (fields or {}).get("table")
            if isinstance(table, ClientStateTable) and table.num_clients != self.num_clients:
                raise ValueError(
                    f"SCAFFOLD holds control variates for {table.num_clients} clients, but the data module has "
                    f"{self.num_clients} clients."
                )

    def prepare_round(self, server: Any, params: list[Tensor], updates: Any) -> None:
        """Before any state changes (the server optimizer's ``validate_round``): :meth:`check_round` against the c_i
        table held (live, or loaded from a checkpoint), then c created (zeros) or moved to ``params``' device
        (:meth:`control`).

        Raises:
            RuntimeError, ValueError: as :meth:`check_round`.
        """
        fields = server.stage_state_fields(self) or {}
        self.check_round([u.client_id for u in updates], updates, fields.get("table"))
        self.control(server, params)

    def control(self, server: Any, params: list[Tensor]) -> tuple[list[Tensor], Optional[ClientStateTable]]:
        """The server's c (created as zeros, or moved to ``params``' device, in ``server``'s chain state, where this
        stage's state lives) and the c_i table (``None`` before any client reported)."""
        index = next(i for i, s in enumerate(server.aggregators) if s is self)
        states = list(server.chain_state(params))
        state = states[index]
        control = state.control if state.control is not None else self.zero_control(params)
        if control[0].device != params[0].device:
            control = [t.to(p.device) for t, p in zip(control, params)]
        if control is not state.control:
            states[index] = state._replace(control=control)
            server.aggregator_state = tuple(states)
        return control, state.table

    @staticmethod
    def client_variate(control: list[Tensor], table: Optional[ClientStateTable], client_id: int) -> list[Tensor]:
        """c_i of client ``client_id`` from the ``table`` row, shaped like ``control`` (c's devices and dtypes; zeros
        before its first participation)."""
        flat = table.get(client_id) if table is not None and client_id in table else None
        if flat is None:
            return [torch.zeros_like(c) for c in control]
        pieces = torch.split(flat, [c.numel() for c in control])
        return [t.reshape(c.shape).to(device=c.device, dtype=c.dtype) for t, c in zip(pieces, control)]

    def client_control(self, server: Any, client_id: int) -> list[Tensor]:
        """c_i of client ``client_id`` held in ``server``'s state of this stage (:meth:`client_variate`).

        Raises:
            RuntimeError: before the first round (no c yet).
        """
        fields = server.stage_state_fields(self) or {}
        if fields.get("control") is None:
            raise RuntimeError("SCAFFOLD has no control variates yet: they are created with the first client.")
        return self.client_variate(fields["control"], fields.get("table"), client_id)

    def check_round(self, client_ids: list[int], updates: list, table: Optional[ClientStateTable] = None) -> None:
        """The checks of Alg. 1's inputs, before any state changes (errors as in the class doc). With the c_i
        ``table`` of the state (e.g. loaded from a checkpoint): N is taken from it when not known yet, and a table
        for another N is refused (ValueError)."""
        if self.num_clients is None and table is not None:
            self.num_clients = table.num_clients
        if table is not None and table.num_clients != self.num_clients:
            raise ValueError(
                f"SCAFFOLD holds control variates for {table.num_clients} clients, but the data module has "
                f"{self.num_clients} clients."
            )
        if self.num_clients is None:
            raise RuntimeError(
                "SCAFFOLD needs the number of clients N (read from `trainer.datamodule.num_clients` at fit start)."
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
        self.check_round(x.client_ids, x.updates, state.table)
        pseudo_gradient, _ = WeightedMean().apply(x, state, info)
        with torch.no_grad():
            control = state.control if state.control is not None else self.zero_control(x.deltas[0])
            table = state.table
            if table is not None and table.num_clients != self.num_clients:
                raise ValueError(
                    f"SCAFFOLD holds control variates for {table.num_clients} clients, but the data module has "
                    f"{self.num_clients} clients."
                )
            store = self.client_state_store
            if table is None:
                dtype = torch.float32
                for c in control:
                    dtype = torch.promote_types(dtype, c.dtype)
                dim = sum(c.numel() for c in control)
                table = ClientStateTable(self.num_clients, dim, dtype=dtype) if store is None else \
                    store.table(type(self).__name__, self.num_clients, dim, dtype)
            elif store is not None:  # a loaded table, in the run's store (client_state_store)
                table = store.adopt(type(self).__name__, table)
            dtype = table.dtype
            for update in x.updates:
                delta = [d.to(device=c.device, dtype=c.dtype) for d, c in zip(update.extras["delta_control"], control)]
                torch._foreach_add_(control, delta, alpha=1.0 / self.num_clients)
                flat = _flatten(delta, dtype)
                cid = int(update.client_id)
                # A new tensor (never in place), so state dicts handed out earlier keep their values.
                table.put(cid, flat if cid not in table else table.get(cid) + flat)
        return pseudo_gradient, self.State(control, table)


def check_scaffold(server: Any) -> None:
    """At fit start: SCAFFOLD's two halves come together, once each.

    Args:
        server: the server optimizer (:class:`~lightning_fed.callbacks.ServerOptimizer`) holding the halves.

    Raises:
        ValueError: a :class:`ScaffoldClient` without a :class:`ScaffoldControl` in ``server.aggregators`` or the
            reverse, or either twice; the message names both parts.

    Example::

        >>> from lightning_fed.callbacks import FedYogi
        >>> check_scaffold(SCAFFOLD())  # fine: the ready-made name holds both halves
        >>> check_scaffold(FedYogi(aggregators=[ScaffoldControl()]))  # its client half not given to the trainer
        Traceback (most recent call last):
        ...
        ValueError: ScaffoldControl() (SCAFFOLD's server half) in FedYogi's `aggregators` needs SCAFFOLD's client half: `FederatedTrainer(client_algorithms=[ScaffoldClient()])` (or use SCAFFOLD()); without it no client sends Δc_i (Alg. 1, l. 12-13).
    """
    name = type(server).__name__
    clients = [a for a in getattr(server, "client_algorithms", ()) if isinstance(a, ScaffoldClient)]
    stages = [s for s in getattr(server, "aggregators", None) or () if isinstance(s, ScaffoldControl)]
    if clients and not stages:
        raise ValueError(
            f"{clients[0]!r} (SCAFFOLD's client half) needs SCAFFOLD's server half in {name}'s `aggregators`: "
            "`aggregators=[ScaffoldControl()]` (or use SCAFFOLD()); without it c and the c_i are never updated "
            "(Karimireddy et al. 2020, Alg. 1, l. 16-17)."
        )
    if stages and not clients:
        raise ValueError(
            f"{stages[0]!r} (SCAFFOLD's server half) in {name}'s `aggregators` needs SCAFFOLD's client half: "
            "`FederatedTrainer(client_algorithms=[ScaffoldClient()])` (or use SCAFFOLD()); without it no client sends "
            "Δc_i (Alg. 1, l. 12-13)."
        )
    if len(clients) > 1 or len(stages) > 1:
        raise ValueError(f"{name} runs SCAFFOLD's halves more than once ({clients}, {stages}); give one of each.")


class ScaffoldClient(ClientAlgorithm):
    """SCAFFOLD's client half (Karimireddy et al. 2020, Alg. 1, l. 7-13, option II): client i starts from x with the
    server's c and its own c_i (both held in :class:`ScaffoldControl`'s state by the server optimizer), takes its
    local steps on the corrected gradient and sends Δc_i::

        y_i ← x;   K times:  y_i ← y_i − η_l·(g_i(y_i) − c_i + c)                 (l. 10)
        c_i⁺ = c_i − c + (x − y_i)/(K·η_l),   Δc_i = c_i⁺ − c_i                       (l. 12-13, option II)

    How it runs inside the user's unchanged LightningModule:

    * the correction c − c_i (in the parameter's dtype) is added to the gradient of every parameter the optimizer is
      about to update, in Lightning's ``on_before_optimizer_step`` (after the backward pass and, under AMP, after
      unscaling; before gradient clipping and the step), so a plain SGD client optimizer with learning rate η_l takes
      exactly l. 10; another optimizer (momentum, Adam, weight decay) gets the corrected gradient;
    * K is counted per parameter: the local steps at which it had a gradient (each client its own K_i under
      heterogeneous local work); η_l is the learning rate of the parameter's optimizer group when the client starts.
      A parameter with K = 0 sends Δc = 0 and keeps its c_i;
    * Δc_i travels in ``ClientUpdate.extras["delta_control"]`` (one tensor per parameter, c's dtype and device); the
      server applies c_i ← c_i + Δc_i only for updates that reach it, so a dropped client changes neither c nor c_i.

    Stateless as a client algorithm (``state_dim`` 0): the c_i are the server half's state, as in Alg. 1.

    Raises:
        ValueError: at fit start, as :func:`check_scaffold`; a client id outside [0, N).
        RuntimeError: :meth:`finish` without :meth:`start`, or a stepped parameter's learning rate not a finite
            number > 0 (option II divides by it).

    Example: SCAFFOLD's clients and control variates under FedAvgM (server momentum), the client half given to the
    trainer (YAML/CLI: ``trainer.client_algorithms``; ``examples/fashion_mnist_hybrid_plus_scaffold_fedyogi.yaml``)::

        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.callbacks import FedAvgM
        >>> server = FedAvgM(lr=1.0, momentum=0.9, weighting="uniform", aggregators=[ScaffoldControl()])
        >>> trainer = FederatedTrainer(callbacks=[server], client_algorithms=[ScaffoldClient()], logger=False, enable_checkpointing=False,
        ...                            enable_progress_bar=False, enable_model_summary=False)
        >>> server, trainer.client_algorithms
        (FedAvgM(lr=1.0, weighting='uniform', momentum=0.9), [ScaffoldClient()])
    """

    def __init__(self) -> None:
        self._server: Any = None
        self._stage_index = -1
        self._params: list[Tensor] = []
        self._index: dict[int, int] = {}
        self._control: list[Tensor] = []
        self._correction: Optional[list[Tensor]] = None
        self._steps: list[int] = []
        self._lrs: list[float] = []

    def check(self, server: Any) -> None:
        """:func:`check_scaffold`; then remember the server optimizer, whose chain state holds c and the c_i."""
        check_scaffold(server)
        self._server = getattr(server, "composer", server)  # the server side's state (c, the c_i), not the callback
        self._stage_index = next(i for i, s in enumerate(server.aggregators) if isinstance(s, ScaffoldControl))

    def _stage(self) -> ScaffoldControl:
        if self._server is None:
            raise RuntimeError("ScaffoldClient runs only inside a server optimizer's fit (its `check` binds it).")
        return self._server.aggregators[self._stage_index]

    def control(self, params: list[Tensor]) -> tuple[list[Tensor], Optional[ClientStateTable]]:
        """The server's c (created as zeros, or moved to ``params``' device, in the server optimizer's chain state)
        and the c_i table (``None`` before any client reported): :meth:`ScaffoldControl.control`."""
        return self._stage().control(self._server, params)

    def download_bytes(self, params: list[Tensor]) -> int:
        """The server's c, sent with x (Alg. 1, l. 5): one entry per entry of x, in :func:`control_dtype`."""
        return sum(p.numel() * torch.empty((), dtype=control_dtype(p.dtype)).element_size() for p in params)

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Receive (x, c) and c_i (Alg. 1, l. 5-7): the correction c − c_i, zero step counts, η_l per parameter."""
        stage = self._stage()
        client_id = int(context.client_id)
        if stage.num_clients is not None and not 0 <= client_id < stage.num_clients:
            raise ValueError(f"Client id {client_id} is outside [0, {stage.num_clients}).")
        self._params = context.parameters(module)  # the federated parameters, aligned with x and c
        self._index = {id(p): i for i, p in enumerate(self._params)}
        control, table = self.control([p.detach() for p in self._params])
        self._control = control
        client = ScaffoldControl.client_variate(control, table, client_id)
        self._correction = [(c - ci).to(p.dtype) for c, ci, p in zip(control, client, self._params)]
        self._steps = [0] * len(self._params)
        self._lrs = [math.nan] * len(self._params)
        for optimizer in module.trainer.optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    i = self._index.get(id(p))
                    if i is not None:
                        self._lrs[i] = float(group.get("lr", math.nan))

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """g_i(y_i) − c_i + c (Alg. 1, l. 10) for the parameters ``optimizer`` updates; counts their steps."""
        if self._correction is None:
            return
        stepped = stepped_indices(optimizer, self._params, self._index)
        if not stepped:
            return
        with torch.no_grad():
            torch._foreach_add_([self._params[i].grad for i in stepped], [self._correction[i] for i in stepped])
        for i in stepped:
            self._steps[i] += 1

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """Δc_i = −c + (x − y_i)/(K·η_l) per parameter (l. 12-13, option II; zero where K = 0), sent as
        ``extras["delta_control"]``."""
        if self._correction is None:
            raise RuntimeError("ScaffoldClient.finish called before start for this client.")
        delta_control = []
        with torch.no_grad():
            for i, (p, x, c) in enumerate(zip(self._params, context.global_params, self._control)):
                steps, lr = self._steps[i], self._lrs[i]
                if steps == 0:
                    delta_control.append(torch.zeros_like(c))
                    continue
                if not (math.isfinite(lr) and lr > 0):
                    raise RuntimeError(
                        f"SCAFFOLD option II needs the client learning rate η_l > 0 of every trained parameter; "
                        f"parameter {i} has lr={lr!r}."
                    )
                drift = (x.to(c.device, c.dtype) - p.detach().to(c.device, c.dtype)) / (steps * lr)  # (x − y_i)/(K·η_l)
                delta_control.append(drift - c)
        self._correction, self._control = None, []
        return {"delta_control": delta_control}, None

    def settings(self) -> dict[str, Any]:
        return {}


_STATE = "SCAFFOLD.stage_state_fields(SCAFFOLD.control_stage)"  # the live stage state, or the one loaded before it


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
        >>> stage = scaffold.control_stage  # the control variates are the stage's
        >>> sorted(round(stage.client_control(scaffold, i)[0].item(), 10) for i in (0, 1))  # c_i⁺ = (x − y_i)/(K·η_l)
        [-9.6, -3.6]
        >>> round(scaffold.stage_state_fields(stage)["control"][0].item(), 10), stage.num_clients  # c = (1/N)·Σ Δc_i
        (-6.6, 2)
    """

    def __init__(self, lr: float = 1.0, weighting: str = "uniform", client_state_store: str = "memory",
                 client_state_dir: Optional[str] = None) -> None:
        #: The reducer stage (:class:`~lightning_fed.algorithms.scaffold.ScaffoldControl`): Δx, c and the c_i.
        self.control_stage = ScaffoldControl()
        super().__init__(weighting=weighting, aggregators=[self.control_stage], rule=SGD(lr),
                         client_state_store=client_state_store, client_state_dir=client_state_dir)
        self._own_client = [ScaffoldClient()]  # the client half: c − c_i on the gradients, Δc_i sent back
        self._own_aggregators = [self.control_stage]  # its own chain: another one is refused at fit start

    def _stage_state(self) -> ScaffoldControl.State:
        fields = self.stage_state_fields(self.control_stage)  # the live state, or the one loaded before it is re-made
        return ScaffoldControl.State() if fields is None else ScaffoldControl.State(**fields)

    # Deprecated mirrors of the control stage (removed in 0.3.0: read SCAFFOLD.control_stage and its state instead).
    num_clients = stage_mirror(
        "num_clients", "SCAFFOLD.control_stage.num_clients",
        "N, the number of clients in the federation (from the data module at fit start).",
        lambda self: self.control_stage.num_clients, lambda self, value: setattr(self.control_stage, "num_clients", value))
    client_state = stage_mirror(
        "client_state", f"{_STATE}['table']",
        "The c_i (:class:`~lightning_fed.server.client_state.ClientStateTable`, ``None`` before the first round).",
        lambda self: self._stage_state().table,
        lambda self, value: setattr(self, "aggregator_state", (self._stage_state()._replace(table=value),)))
    state = stage_mirror(
        "state", f"{_STATE}['control']",
        "``{\"control\": c}`` (the stage state's c, one tensor per parameter; ``{}`` before the first client).",
        lambda self: {} if self._stage_state().control is None else {"control": self._stage_state().control},
        lambda self, value: setattr(self, "aggregator_state",
                                    (self._stage_state()._replace(control=value.get("control")),)))
    client_controls = stage_mirror(
        "client_controls", f"{_STATE}['table'].rows()",
        "c_i of every client seen so far: client id -> flat CPU vector (missing = zero).",
        lambda self: {} if self._stage_state().table is None else self._stage_state().table.rows())

    def client_control(self, client_id: int) -> list[Tensor]:
        """Deprecated (removed in 0.3.0): ``SCAFFOLD.control_stage.client_control(SCAFFOLD, client_id)``. c_i of client
        ``client_id`` shaped like c (on c's device; zeros before its first participation).

        Raises:
            RuntimeError: before the first round (no c yet).
        """
        warn_mirror(type(self).__name__, "client_control",
                    f"{type(self).__name__}.control_stage.client_control({type(self).__name__}, client_id)")
        return self.control_stage.client_control(self, client_id)
