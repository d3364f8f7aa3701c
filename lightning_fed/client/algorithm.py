"""The client half of a federated algorithm, composable with any server optimizer.

FL methods pair a client-side change of the local objective or optimizer (FedProx's proximal term, FedDyn's
dynamic regulariser, SCAFFOLD's control variates) with a server-side aggregation or update. A
:class:`ClientAlgorithm` is the client half, given to any server optimizer with ``client=[...]``::

    FedAdam(lr=0.01, client=[FedProxClient(mu=0.01)])          # FedProx clients under FedAdam

and its server half, if it has one, is an aggregator stage of the same algorithm's module
(:mod:`lightning_fed.algorithms`), so that a client half works with every server rule (pfl-research's split:
the central optimizer is independent of the client algorithm).

The protocol, called by the server optimizer's client channel (:meth:`ServerOptimizer.configure_client
<lightning_fed.callbacks.ServerOptimizer.configure_client>`, its ``on_before_optimizer_step`` and
``collect_client_extras``) for every client of every round, in the order the algorithms are listed:

1. :meth:`ClientAlgorithm.start` — the client starts from x_t (``context.global_params``) with its stored per-client
   state (``None`` the first time a client is seen, or for a stateless algorithm);
2. :meth:`ClientAlgorithm.before_optimizer_step` — at every local step, after the backward pass and before the
   client optimizer's step (Lightning's ``on_before_optimizer_step``): change the gradients in place;
3. :meth:`ClientAlgorithm.finish` — the local work is over: return what the client sends the server besides Δ_i
   (``ClientUpdate.extras``) and its new per-client state (``None``: unchanged).

Per-client state is one flat vector of :meth:`ClientAlgorithm.state_dim` numbers per client, kept by the server
optimizer in a :class:`~lightning_fed.server.client_state.ClientStateTable` per algorithm (rows created at a client's
first write, checkpointed with the server optimizer). The new state travels in the client's update, so under
``strategy="ddp"`` every rank writes the same rows.

:meth:`ClientAlgorithm.check` runs at fit start, before round 0 trains: a combination that cannot be meaningful
(e.g. FedDyn's client half without its server half) is refused there, naming both parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext


class ClientAlgorithm:
    """Base class of client halves: every method is a no-op, override what the algorithm needs.

    Subclasses hold only their hyper-parameters as attributes of the same names as their ``__init__`` arguments
    (the server optimizer records them in the checkpoint's run record, and ``repr`` shows them).

    Example: a client half that scales every gradient by 1/2 (a client learning rate halved), under FedAvg::

        >>> import torch
        >>> from lightning_fed.callbacks import FedAvg
        >>> class HalfGradients(ClientAlgorithm):
        ...     def before_optimizer_step(self, module, optimizer):
        ...         for p in module.parameters():
        ...             if p.grad is not None:
        ...                 p.grad.mul_(0.5)
        >>> FedAvg(client=[HalfGradients()])
        FedAvg(lr=1.0, weighting='num_samples', client=[HalfGradients()])
    """

    def state_dim(self, num_params: int) -> int:
        """Numbers stored per client (0: stateless, the default; e.g. ``num_params`` for one vector of the model's
        size, where ``num_params`` is the model's total number of parameters)."""
        return 0

    def check(self, server: Any) -> None:
        """At fit start: raise ``ValueError`` naming both parts when ``server`` (the server optimizer holding this
        client half) cannot be combined with it. Default: every server optimizer is fine."""

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """The client starts its local work from x_t (``module`` holds it; ``context.global_params`` is x_t) with its
        stored state (a flat CPU vector of :meth:`state_dim` numbers, ``None`` if never written)."""

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """At every local step, after the backward pass, before ``optimizer`` steps: change gradients in place."""

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
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


def dispatch_only(callback: Any, hook: str = "on_before_optimizer_step") -> bool:
    """Whether ``callback``'s ``hook`` only dispatches to client algorithms and it has none (a server optimizer
    without client halves): the lean local step skips calling it, and the vectorized executor does not count it as a
    per-step hook."""
    method = getattr(type(callback), hook, None)
    return bool(getattr(method, "client_dispatch", False)) and not getattr(callback, "client_algorithms", None)


def check_client_algorithms(client: Any) -> list[ClientAlgorithm]:
    """``client`` as a list of :class:`ClientAlgorithm` (``None``: empty).

    Raises:
        TypeError: an entry that is not a :class:`ClientAlgorithm`, naming ``client`` and its position.
    """
    if client is None:
        return []
    if isinstance(client, ClientAlgorithm):
        client = [client]
    client = list(client)
    for i, algorithm in enumerate(client):
        if not isinstance(algorithm, ClientAlgorithm):
            raise TypeError(
                f"`client[{i}]` must be a client algorithm (lightning_fed.client.ClientAlgorithm, e.g. "
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
