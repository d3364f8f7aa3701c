"""The client half of a federated algorithm, composable with any server optimizer.

FL methods pair a client-side change of the local objective or optimizer (FedProx's proximal term, FedDyn's
dynamic regulariser, SCAFFOLD's control variates) with a server-side aggregation or update. A
:class:`ClientAlgorithm` is the client half, a part of the run of its own::

    FederatedTrainer(callbacks=[FedAdam(lr=0.01)], client_algorithms=[FedProxClient(mu=0.01)])  # FedProx clients
    # (FedAdam(lr=0.01, client=[...]), the halves given to the server optimizer: deprecated, removed in 0.3.0)

and its server half, if it has one, is an aggregator stage of the same algorithm's module
(:mod:`lightning_fed.algorithms`), so that a client half works with every server rule (pfl-research's split:
the central optimizer is independent of the client algorithm).

The protocol, called by the client runner (:class:`ClientHalves`, owned by
:class:`~lightning_fed.client.runner.ClientRunner`) for every client of every round, in the order the algorithms
are listed:

1. :meth:`ClientAlgorithm.start` — the client starts from x_t (``context.global_params``) with its stored per-client
   state (``None`` the first time a client is seen, or for a stateless algorithm);
2. :meth:`ClientAlgorithm.before_optimizer_step` — at every local step, after the backward pass and before the
   client optimizer's step (Lightning's ``on_before_optimizer_step``): change the gradients in place;
3. :meth:`ClientAlgorithm.finish` — the local work is over: return what the client sends the server besides Δ_i
   (``ClientUpdate.extras``) and its new per-client state (``None``: unchanged).

Per-client state is one flat vector of :meth:`ClientAlgorithm.state_dim` numbers per client, stored in the run's
:class:`~lightning_fed.client.states.ClientStates` (a :class:`~lightning_fed.server.client_state.ClientStateTable` per
algorithm, saved with the server optimizer's state), by its
:attr:`ClientAlgorithm.state_key` (rows created at a client's
first write, checkpointed with the server optimizer). The new state travels in the client's update, so under
``strategy="ddp"`` every rank writes the same rows.

:meth:`ClientAlgorithm.check` runs at fit start, before round 0 trains: a combination that cannot be meaningful
(e.g. FedDyn's client half without its server half) is refused there, naming both parts.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from lightning_fed.client.states import ClientStates



class ClientAlgorithm:
    """Base class of client halves: every method is a no-op, override what the algorithm needs.

    Subclasses hold only their hyper-parameters as attributes of the same names as their ``__init__`` arguments
    (the server optimizer records them in the checkpoint's run record, and ``repr`` shows them).

    Example: a client half that scales every gradient by 1/2 (a client learning rate halved), under FedAvg; the run's
    client halves are given to the trainer (``FederatedTrainer(client_algorithms=[...])``; YAML/CLI:
    ``trainer.client_algorithms``)::

        >>> import torch
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.callbacks import FedAvg
        >>> class HalfGradients(ClientAlgorithm):
        ...     def before_optimizer_step(self, module, optimizer):
        ...         for p in module.parameters():
        ...             if p.grad is not None:
        ...                 p.grad.mul_(0.5)
        >>> trainer = FederatedTrainer(callbacks=[FedAvg()], client_algorithms=[HalfGradients()], logger=False, enable_checkpointing=False,
        ...                            enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.client_algorithms
        [HalfGradients()]
    """

    def state_dim(self, num_params: int) -> int:
        """Numbers stored per client (0: stateless, the default; e.g. ``num_params`` for one vector of the model's
        size, where ``num_params`` is the number of entries of the federated parameters: the model's total unless some
        are frozen, see :func:`~lightning_fed.client.runner.federated_parameters`)."""
        return 0

    @property
    def state_key(self) -> str:
        """The name its per-client state is kept and checkpointed under (default: the class name, e.g.
        ``"FedDynClient"``), so that adding, removing or reordering other client halves keeps this one's state. Two
        halves of one run with per-client state must have different keys (refused at fit start otherwise); override
        it to run one class twice."""
        return type(self).__name__

    def setup(self, module: Any) -> None:
        """At fit start, before :meth:`state_dim` is asked: look at the model (e.g. select the parts a
        personalised method keeps local, :class:`~lightning_fed.client.personal.LocalParts`). Default: nothing."""

    def local_parameters(self) -> list[int]:
        """After :meth:`setup`: the positions (in ``module.parameters()``) of the parameters this half keeps on the
        client — their Δ_i is 0 by construction, so the server leaves them at x_t; under a chain that adds DP noise
        they are left out of the clipping norm and of the noise (their global value is not a release of client
        data). Default: none (``[]``); :class:`~lightning_fed.client.personal.LocalParts` returns what it keeps.

        Example::

            >>> ClientAlgorithm().local_parameters()
            []
        """
        return []

    def local_buffers(self) -> list[int]:
        """After :meth:`setup`: the positions (in ``module.buffers()``) of the buffers this half keeps on the client
        (not sent either way, :mod:`lightning_fed.communication.bytes`). Default: none (``[]``).

        Example::

            >>> ClientAlgorithm().local_buffers()
            []
        """
        return []

    def download_bytes(self, params: list[Tensor]) -> int:
        """The bytes the server sends this half's client each round besides x_t (``params``: x_t over the federated
        parameters that travel), counted by :mod:`lightning_fed.communication.bytes` (e.g. SCAFFOLD's control c).
        Default: none (0).

        Example::

            >>> ClientAlgorithm().download_bytes([torch.zeros(3)])
            0
        """
        return 0

    def fit_start(self, trainer: Any, server: Any) -> None:
        """At fit start, from the server optimizer's ``on_fit_start`` (before a checkpoint's optimizer state is
        restored and before the loop snapshots the hyper-parameters of round 0), for the halves given with
        ``server``: set up the trainer's client optimizer (e.g. Fed-LAMB's client half installs its local
        optimizer). Default: nothing."""

    def check(self, server: Any) -> None:
        """At fit start: raise ``ValueError`` naming both parts when ``server`` (the server optimizer holding this
        client half) cannot be combined with it. Default: every server optimizer is fine."""

    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        """The client starts its local work from x_t (``module`` holds it; ``context.global_params`` is x_t over the
        federated parameters, aligned with ``context.parameters(module)``, which is ``module.parameters()`` unless
        some are frozen) with its stored state (a flat CPU vector of :meth:`state_dim` numbers, ``None`` if never
        written)."""

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """At every local step, after the backward pass, before ``optimizer`` steps: change gradients in place."""

    def finish(self, module: Any, context: Any) -> tuple[dict[str, Any], Optional[Tensor]]:
        """The local work is over (``module`` holds x_i): ``(extras, new_state)`` — what the client sends the
        server besides Δ_i, and its new per-client state (``None``: unchanged)."""
        return {}, None

    def settings(self) -> dict[str, Any]:
        """The hyper-parameters: the ``__init__`` arguments stored as attributes of the same names."""
        import inspect

        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"{type(self).__name__}({args})"


class ClientHalves:
    """The client halves a run's clients execute, owned and called by the
    :class:`~lightning_fed.client.runner.ClientRunner` (no per-step dispatch through the server optimizer).

    At fit start (:meth:`setup`) the run's halves are gathered, in this order: the ready-made method's own (FedProx's
    :class:`~lightning_fed.algorithms.FedProxClient`, FedDyn's, SCAFFOLD's), then those given to the server optimizer
    as ``client=[...]`` (the composition of issue #30, kept), then ``FederatedTrainer(client_algorithms=[...])``
    (CLI ``trainer.client_algorithms``) — the last are a part of the run of their own, so swapping the server
    optimizer keeps them. Each half's :meth:`ClientAlgorithm.check` then runs against the server optimizer (a method
    whose halves must come together, SCAFFOLD or FedDyn, is refused there, naming both), and the per-client state
    tables are made or checked.

    Per-client state is kept by name (:attr:`ClientAlgorithm.state_key`) in the run's
    :class:`~lightning_fed.client.states.ClientStates` (the client runner's; the server stores what clients keep, as in
    cross-device FL where clients are stateless between rounds; it is checkpointed with the server optimizer's state),
    each client's row handed to a half's ``start`` through its ``ClientContext``. A table loaded from a checkpoint
    whose population N or state size differs from this run's is refused here, before any client trains.

    Example::

        >>> from lightning_fed.algorithms import FedProxClient
        >>> halves = ClientHalves()
        >>> halves.algorithms
        []
        >>> FedProxClient(mu=0.1).state_key
        'FedProxClient'
    """

    def __init__(self) -> None:
        #: The run's client halves, in the order they run (set by :meth:`setup`).
        self.algorithms: list[ClientAlgorithm] = []
        #: The run's per-client state (:class:`~lightning_fed.client.states.ClientStates`), owned with the halves by
        #: the client runner: each client's rows reach it through its ``ClientContext.client_states``.
        self.states = ClientStates()
        self._context: Any = None  # the ClientContext of the client in local work (None between clients)

    def setup(self, server: Any, given: Optional[list[ClientAlgorithm]], num_clients: Optional[int],
              module: Any, params: Optional[list[Tensor]] = None) -> None:
        """At fit start, before round 0 trains: gather the halves (see the class doc), run their ``check`` and
        ``setup(module)``, and make (or check, after a checkpoint was loaded) their per-client tables in
        :attr:`states`, the run's, which the server optimizer binds
        (:meth:`~lightning_fed.callbacks.ServerOptimizer.bind_client_algorithms`: it hands over what it loaded and
        saves it with its state).
        ``params``: the federated parameters (the client runner's; default ``module.parameters()``): a half's
        ``state_dim`` is asked for their number of entries.

        Raises:
            ValueError: two stateful halves with one ``state_key``; two personal halves keeping the same tensor
                (:func:`~lightning_fed.client.personal.check_disjoint_local_parts`); what a half's ``check``
                refuses; a table loaded
                from a checkpoint for another population N or another state size (naming the half, the old and the
                new value).
        """
        algorithms = [*server.server_client_algorithms, *check_client_algorithms(given)]
        self.algorithms = algorithms
        server.bind_client_algorithms(algorithms, self.states)
        for algorithm in algorithms:
            algorithm.check(server)
            algorithm.setup(module)
        from lightning_fed.client.personal import check_disjoint_local_parts  # personal.py imports this module

        check_disjoint_local_parts(algorithms, module)
        params = list(module.parameters()) if params is None else list(params)
        dim = sum(p.numel() for p in params)
        sizes = {}
        for algorithm in algorithms:
            size = int(algorithm.state_dim(dim))
            if size > 0:
                key = algorithm.state_key
                if key in sizes:
                    raise ValueError(
                        f"Two client halves keep per-client state under the same name {key!r} ({algorithms}); give "
                        "each its own `state_key` (override the property) or drop one."
                    )
                sizes[key] = size
        dtype = params[0].dtype if params and params[0].is_floating_point() else torch.float32
        self.states.setup(algorithms, sizes, num_clients, dtype)

    def start(self, module: Any, context: Any) -> None:
        """Client ``context.client_id`` starts from x_t: every half's :meth:`ClientAlgorithm.start` with its stored
        state (``None`` if never written)."""
        if not self.algorithms:
            return
        self._context = context
        states = getattr(context, "client_states", None) or self.states  # (a context made by hand: the halves')
        for algorithm in self.algorithms:
            algorithm.start(module, context, states.row(algorithm.state_key, context.client_id))

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """At every local step, before the client optimizer steps (no-op outside a client's local work)."""
        if self._context is None:
            return
        for algorithm in self.algorithms:
            algorithm.before_optimizer_step(module, optimizer)

    def finish(self, module: Any, context: Any) -> dict[str, Any]:
        """The client's local work is over: every half's extras from :meth:`ClientAlgorithm.finish`, and its new
        per-client state under ``"client_state/<state_key>"`` (written to the table when the server receives the
        update; a client dropped from the round keeps its old state)."""
        if not self.algorithms:
            return {}
        context, self._context = self._context or context, None
        extras: dict[str, Any] = {}
        for algorithm in self.algorithms:
            sent, state = algorithm.finish(module, context)
            extras.update(sent)
            if state is not None:
                extras[f"client_state/{algorithm.state_key}"] = state.detach().reshape(-1).cpu()
        return extras


def dispatch_only(callback: Any, hook: str = "on_before_optimizer_step") -> bool:
    """Whether ``callback``'s ``hook`` only dispatches to client algorithms and it has none (a server optimizer
    without client halves): the lean local step skips calling it, and the vectorized executor does not count it as a
    per-step hook."""
    method = getattr(type(callback), hook, None)
    return bool(getattr(method, "client_dispatch", False)) and not getattr(callback, "client_algorithms", None)


def check_client_algorithms(client: Any, name: str = "client") -> list[ClientAlgorithm]:
    """``client`` as a list of :class:`ClientAlgorithm` (``None``: empty).

    Args:
        client: The halves (a list, one half, or ``None``).
        name: The argument named in the error (default ``"client"``, the server optimizer's).

    Raises:
        TypeError: an entry that is not a :class:`ClientAlgorithm`, naming ``name`` and its position.
    """
    if client is None:
        return []
    if isinstance(client, ClientAlgorithm):
        client = [client]
    client = list(client)
    for i, algorithm in enumerate(client):
        if not isinstance(algorithm, ClientAlgorithm):
            raise TypeError(
                f"`{name}[{i}]` must be a client algorithm (lightning_fed.client.ClientAlgorithm, e.g. "
                f"FedProxClient(mu=0.01)), got {type(algorithm).__name__}."
            )
    return client


def flat(tensors: list[Tensor]) -> Tensor:
    """The tensors as one flat CPU vector (``module.parameters()`` order), in their common dtype."""
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def unflat(vector: Tensor, like: list[Tensor]) -> list[Tensor]:
    """Split a flat vector into tensors shaped, typed and placed like ``like``."""
    out, offset = [], 0
    for t in like:
        n = t.numel()
        out.append(vector[offset:offset + n].reshape(t.shape).to(device=t.device, dtype=t.dtype))
        offset += n
    return out


def optimizer_param_indices(optimizer: Any, index: dict[int, int]) -> list[int]:
    """Positions in ``module.parameters()`` (via ``index``: ``id(param) -> position``) of the parameters that
    ``optimizer`` (a torch optimizer or Lightning's wrapper of one) updates, in its parameter-group order."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer -> torch.optim.Optimizer
    positions = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            i = index.get(id(p))
            if i is not None:
                positions.append(i)
    return positions


def stepped_indices(optimizer: Any, params: list[Tensor], index: dict[int, int]) -> list[int]:
    """Positions (in ``params`` = ``module.parameters()``; ``index``: ``id(param) -> position``) of the parameters
    ``optimizer`` is about to update at this local step: those of its groups that have a gradient (torch optimizers
    skip the others). What a client half's :meth:`ClientAlgorithm.before_optimizer_step` corrects.

    Example::

        >>> w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
        >>> w.grad = torch.ones(2)
        >>> stepped_indices(torch.optim.SGD([w, b], lr=0.1), [w, b], {id(w): 0, id(b): 1})
        [0]
    """
    return [i for i in optimizer_param_indices(optimizer, index) if params[i].grad is not None]
