"""What one client sends back to the server after its local work in a round."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor


@dataclass
class ClientUpdate:
    """The result of one client's local training in one round (Reddi et al. 2021, Alg. 1, l. 9).

    Attributes:
        client_id: The client's id in the partition, ``0 <= client_id < num_clients``.
        delta: Δ_i = x_i − x_t, one tensor per federated parameter (``module.parameters()`` order, shapes, dtype,
            device; frozen parameters — ``requires_grad=False`` or in no client optimizer — left out, see
            :func:`~lightning_fed.client.runner.federated_parameters`): the client's model change over the round.
        num_samples: |D_i|, the client's number of training samples (the default aggregation weight).
        num_steps: Local optimizer steps taken (batches processed).
        loss: Mean training loss over the local steps that returned one (``nan`` if none did).
        loss_steps: How many local steps returned a loss (``training_step`` under manual optimization may return
            none); ``-1`` (default) means all ``num_steps``.
        client_lr: The client optimizer's learning rate γ (first parameter group) during this round (see also
            ``client_lrs``).
        buffers: The client's final values of ``module.buffers()`` (e.g. BatchNorm running statistics), same
            order as ``module.buffers()``; averaged by the loop, never passed through the server optimizer.
        extras: Extra tensors an algorithm asks clients for (see
            :meth:`~lightning_fed.callbacks.ServerOptimizer.collect_client_extras`), e.g. Fed-LAMB's second moments.
        client_lrs: The client learning rate γ of each parameter's optimizer group during this round, one float
            per entry of ``delta`` (``nan`` for a parameter in no group, or in several groups with different
            rates); see :func:`parameter_client_lrs`. Empty (the default) means ``client_lr`` for every parameter.
        delta_bytes: The size in bytes of Δ_i's encoding when a compressor encoded it
            (:class:`~lightning_fed.communication.compression.Compression`; ``delta`` then holds the decoded Δ̂_i);
            ``None`` (default): sent raw, ``numel × element_size`` (see :mod:`lightning_fed.communication.bytes`).

    Example::

        >>> import torch
        >>> update = ClientUpdate(client_id=7, delta=[torch.tensor([0.5, -1.0])], num_samples=12, num_steps=3, loss=0.25)
        >>> update.loss_steps, update.client_lr, update.extras  # defaults: every step reported a loss
        (3, nan, {})
        >>> update.delta[0].shape
        torch.Size([2])
    """

    client_id: int
    delta: list[Tensor]
    num_samples: int
    num_steps: int
    loss: float
    client_lr: float = float("nan")
    buffers: list[Tensor] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    client_lrs: list[float] = field(default_factory=list)
    loss_steps: int = -1
    delta_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        if self.loss_steps < 0:
            self.loss_steps = self.num_steps


class DeltaNorms(NamedTuple):
    """The per-tensor L2 norms of a client's Δ_i as computed once in a round (by the loop's finiteness check), for
    the round's other readers of the same norms (the gradient diversity), with what they were computed from.

    Attributes:
        norms: ``torch.stack(torch._foreach_norm(delta))``: shape ``[len(delta)]``, the deltas' dtype and device
            (for a finite Δ_i whose norms overflow that dtype: :func:`overflow_safe_norms`, float64).
        delta: The list of tensors they are the norms of (compared by identity).
        versions: Each tensor's ``_version`` then: an in-place change since makes :meth:`for_delta` refuse them.

    Example::

        >>> d = [torch.tensor([3.0, 4.0]), torch.tensor([1.0])]
        >>> cached = DeltaNorms.of(d, torch.stack(torch._foreach_norm(d)))
        >>> cached.for_delta(d).tolist(), cached.for_delta(list(d))  # another list object: not these norms
        ([5.0, 1.0], None)
        >>> d[1].mul_(2)
        tensor([2.])
        >>> cached.for_delta(d) is None  # changed in place since
        True
    """

    norms: Tensor
    delta: list[Tensor]
    versions: tuple[int, ...]

    @classmethod
    def of(cls, delta: list[Tensor], norms: Tensor) -> "DeltaNorms":
        """Keep ``norms`` (``torch.stack(torch._foreach_norm(delta))``) of ``delta`` as it is now."""
        return cls(norms, delta, tuple(t._version for t in delta))

    def for_delta(self, delta: list[Tensor]) -> Optional[Tensor]:
        """The stacked norms if ``delta`` is the same list, unchanged in place since; else ``None``."""
        if delta is not self.delta or any(t._version != v for t, v in zip(delta, self.versions)):
            return None
        return self.norms


def overflow_safe_norms(tensors: Sequence[Tensor]) -> Tensor:
    """Per-tensor L2 norms that do not overflow where the sum of squares would: ‖t‖₂ = s·‖t/s‖₂ with s = max|t|,
    in float64. Used for a Δ_i whose plain norms (in its own dtype) are not finite although every entry is (a
    float32 update with entries ~4e19: 4e19² overflows float32); the kept :class:`DeltaNorms` of such an update
    are these.

    Args:
        tensors: floating tensors, any shapes, one device.

    Returns:
        shape ``[len(tensors)]``, float64, on the tensors' device (``0`` for an empty or all-zero tensor; ``nan`` /
        ``inf`` where a tensor holds one).

    Example: 4e19 squared overflows float32; √2·4e19 does not::

        >>> big = torch.full((2,), 4e19)
        >>> torch.stack(torch._foreach_norm([big])).tolist(), f"{overflow_safe_norms([big]).item():.6e}"
        ([inf], '5.656854e+19')
        >>> overflow_safe_norms([torch.tensor([3.0, 4.0]), torch.zeros(0), torch.zeros(2)]).tolist()
        [5.0, 0.0, 0.0]
    """
    out = []
    for t in tensors:
        t = t.detach().to(torch.float64)
        if t.numel() == 0:
            out.append(torch.zeros((), dtype=torch.float64, device=t.device))
            continue
        scale = t.abs().amax().clamp_min(torch.finfo(torch.float64).tiny)
        out.append(scale * torch.linalg.vector_norm(t / scale))
    return torch.stack(out)


def parameter_client_lrs(
    params: Sequence[Tensor], param_groups: Sequence[Sequence[dict[str, Any]]], group_lrs: Sequence[Sequence[float]]
) -> list[float]:
    """The learning rate γ of the optimizer group holding each parameter, one float per entry of ``params``.

    Args:
        params: The module's parameters (``module.parameters()`` order).
        param_groups: For each optimizer, its ``param_groups`` (only their ``"params"`` lists are read).
        group_lrs: For each optimizer, the learning rate of each of its groups (same nesting as
            ``param_groups``), e.g. the rates at the start of the round.

    Returns:
        ``lrs[i]`` = the rate of the group that holds ``params[i]``; ``nan`` if no group holds it, or if groups with
        different rates do.
    """
    lr_of: dict[int, float] = {}
    for groups, lrs in zip(param_groups, group_lrs):
        for group, lr in zip(groups, lrs):
            for p in group["params"]:
                key = id(p)
                lr = float(lr)
                previous = lr_of.get(key)
                lr_of[key] = lr if previous is None or previous == lr else math.nan
    return [lr_of.get(id(p), math.nan) for p in params]



def finite_updates(updates: list[ClientUpdate], delta_norms: Optional[dict[int, DeltaNorms]] = None) -> list[bool]:
    """Whether each update's delta and floating buffers are all finite, read on the host in one copy for the
    round where every update sits on one device (one host sync a round, not one a client). A finite sum of the
    tensors' norms means every entry is finite; a sum that is not finite can also come from finite entries whose
    squares overflow (a float32 Δ_i with entries ~4e19): those updates alone are checked entry by entry
    (``torch.isfinite``, read in one more copy, only in such a round), so only a true NaN or ±inf drops one.
    With ``delta_norms`` (a dict), the per-tensor norms of each update's delta are kept there for the round's
    gradient diversity (``ServerOptimizer.gradient_diversity``'s ``delta_norms``), so each Δ_i is read once
    for both; for a finite Δ_i whose norms overflowed, its :func:`~lightning_fed.client.update.overflow_safe_norms`
    (float64).
    Example: a NaN in client 1's delta::

        >>> from lightning_fed import ClientUpdate
        >>> nan = torch.tensor([1.0, float("nan")])
        >>> finite_updates([ClientUpdate(0, [torch.ones(2)], 1, 1, 0.0), ClientUpdate(1, [nan], 1, 1, 0.0)])
        [True, False]
    """
    flags = []
    for u in updates:
        norms = torch._foreach_norm(u.delta) if u.delta else []
        stacked = torch.stack(norms) if norms else None
        if delta_norms is not None and stacked is not None:
            delta_norms[id(u)] = DeltaNorms.of(u.delta, stacked)
        floating = [b for b in u.buffers if b.is_floating_point()]
        if floating:  # Δ_i's norms and the buffers' in one sum, as they always were
            stacked = torch.stack(list(norms) + list(torch._foreach_norm(floating)))
        flags.append(torch.isfinite(stacked.sum()) if stacked is not None else None)
    present = [f for f in flags if f is not None]
    if len({f.device for f in present}) == 1:
        values = iter(torch.stack(present).tolist())
        out = [True if f is None else next(values) for f in flags]
    else:
        out = [True if f is None else bool(f) for f in flags]
    suspect = [i for i, finite in enumerate(out) if not finite]
    if suspect:  # a norm that is not finite: a NaN/inf entry, or squares that overflowed (rare: one more copy)
        checks = [torch.stack([torch.isfinite(t).all() for t in [*updates[i].delta, *updates[i].buffers]
                               if t.is_floating_point()]).all()
                  for i in suspect]
        exact = torch.stack(checks).tolist() if len({c.device for c in checks}) == 1 else [bool(c) for c in checks]
        for i, finite in zip(suspect, exact):
            if finite:
                out[i] = True
                if delta_norms is not None:
                    delta_norms[id(updates[i])] = DeltaNorms.of(updates[i].delta,
                                                                overflow_safe_norms(updates[i].delta))
    return out
