"""The server-rule interface: x_{t+1} = ServerOpt(x_t, Δ_t) (Reddi et al. 2021, Alg. 1, l. 11) over one typed state.

A :class:`Rule` is the optax ``GradientTransformation`` model: ``init(params) -> state`` and
``update(params, delta, state, step) -> state``, the state a ``NamedTuple`` whose fields are either lists of
tensors (one per parameter, e.g. Adam's ``exp_avg``) or Python scalars (e.g. the adaptive stepsize's ``eta``).
The owning :class:`~lightning_fed.callbacks.ServerOptimizer` alone checkpoints the state
(:func:`state_to_dict` / :func:`state_from_dict`): no rule writes a ``state_dict``.

Conventions: ``update`` moves ``params`` (x_t, updated in place to x_{t+1}, as the federated loop expects) and
returns the new state; to stay bit for bit with the pinned runs (and cheap) it may reuse the tensors of the state
it was given, so a caller keeps only the returned state. ``step`` is t + 1 (1 in the first round).
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor


class NoState(NamedTuple):
    """The state of a rule that keeps none (e.g. SGD).

    Example::

        >>> NoState()._asdict()
        {}
    """


class Rule(abc.ABC):
    """A server rule over one typed state (see the module doc).

    Subclasses set :attr:`State` (their ``NamedTuple`` type; scalar fields need defaults, the value before the
    first round), implement :meth:`update` and, if they keep tensors, :meth:`init`.

    Example (a rule of one's own: x ← x + η·sign(Δ), a server signSGD, no state)::

        >>> import torch
        >>> class SignSGD(Rule):
        ...     def __init__(self, lr: float = 1.0):
        ...         self.lr = lr
        ...     def update(self, params, delta, state, step):
        ...         torch._foreach_add_(params, [d.sign() for d in delta], alpha=self.lr)
        ...         return state
        >>> params = [torch.tensor([1.0, 1.0])]
        >>> rule = SignSGD(lr=0.5)
        >>> _ = rule.update(params, [torch.tensor([3.0, -0.1])], rule.init(params), 1)
        >>> params
        [tensor([1.5000, 0.5000])]
    """

    #: The ``NamedTuple`` type of the state.
    State: type = NoState
    #: The server learning rate η.
    lr: float = 1.0

    def init(self, params: list[Tensor]) -> Any:
        """The state before the first round for parameters ``params`` (default: :attr:`State` with its defaults)."""
        return self.State()

    @abc.abstractmethod
    def update(self, params: list[Tensor], delta: list[Tensor], state: Any, step: int) -> Any:
        """Move ``params`` (x_t, in place) to x_{t+1} given the pseudo-gradient Δ_t (``delta``, same shapes) in
        round ``step`` = t + 1; return the new state."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def _is_tensor_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, Tensor) for t in value)


def state_to_dict(state: Optional[NamedTuple], state_type: type) -> tuple[dict[str, list[Tensor]], dict[str, Any]]:
    """Split a rule state into (tensor-list fields on CPU, scalar fields) for a checkpoint; ``None`` (no round
    yet) gives no tensors and the scalar fields' defaults."""
    if state is None:
        return {}, dict(state_type._field_defaults)
    tensors, scalars = {}, {}
    for name, value in state._asdict().items():
        if _is_tensor_list(value) and name not in state_type._field_defaults:
            tensors[name] = [t.detach().cpu() for t in value]
        else:
            scalars[name] = value
    return tensors, scalars


def state_from_dict(state_type: type, tensors: dict[str, list[Tensor]], scalars: dict[str, Any]) -> Optional[NamedTuple]:
    """The inverse of :func:`state_to_dict`; ``None`` when the checkpoint holds no tensors and the state has
    tensor fields (saved before the first round: the state is created at the first round).

    Raises:
        KeyError: a tensor field of ``state_type`` missing from ``tensors`` (names the field).
    """
    fields = {}
    tensor_fields = [f for f in state_type._fields if f not in state_type._field_defaults]
    if tensor_fields and not tensors:
        return None
    for name in tensor_fields:
        if name not in tensors:
            raise KeyError(f"The checkpoint's server-rule state has no field {name!r} (has {sorted(tensors)}).")
        fields[name] = [t.clone() for t in tensors[name]]
    for name, default in state_type._field_defaults.items():
        fields[name] = scalars.get(name, default)
    return state_type(**fields)


def move_state(state: NamedTuple, params: list[Tensor]) -> NamedTuple:
    """``state`` with its tensor lists on the devices of ``params`` (unchanged if already there)."""
    moved = {}
    for name, value in state._asdict().items():
        if _is_tensor_list(value) and value and value[0].device != params[0].device:
            moved[name] = [t.to(p.device) for t, p in zip(value, params)]
    return state._replace(**moved) if moved else state


def zeros_like_all(params: list[Tensor], fill: Optional[float] = None) -> list[Tensor]:
    """Fresh tensors shaped like ``params``: zeros, or ``fill`` everywhere."""
    if fill is None:
        return [torch.zeros_like(p) for p in params]
    return [torch.full_like(p, fill) for p in params]
