"""Nastya's normalised client direction as a client transform stage (Malinovsky, Mishchenko, Richtárik, *On
Server-Side Stepsizes in Federated Optimization*, Algorithm 1 "Nastya", l. 8-9).

Each client's model change Δ_m = x_{t,m} − x_t is replaced by Δ_m/(γ·n_m) = −g_{t,m} (γ the client learning rate of
each parameter's optimizer group, n_m the client's local steps) and clients that took no local step get weight 0.
Followed by :class:`~lightning_fed.server.aggregators.WeightedMean` it gives Nastya's −g_t; the server stepsize
classes of :mod:`lightning_fed.callbacks.server_step_size` are that chain composed with a server rule.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from lightning_fed.server.aggregators.base import ClientDeltas, EmptyState, RoundInfo, Stage

__all__ = ["NormalizedDirections", "normalized_direction"]


def _is_positive_finite(lr: Any) -> bool:
    return not isinstance(lr, bool) and isinstance(lr, numbers.Real) and math.isfinite(lr) and lr > 0


def normalized_direction(update: Any, delta: Optional[list[Tensor]] = None) -> list[Tensor]:
    """Δ_m/(γ·n_m) = −g_{t,m} for one client (Nastya, Alg. 1, l. 8, with the sign of a model change).

    n_m is ``update.num_steps`` (local optimizer steps taken). γ is the client learning rate of each parameter's
    optimizer group (``update.client_lrs``, one per parameter, filled by the loop from the optimizer's parameter
    groups at the start of the round); when that list is empty (a hand-built update), ``update.client_lr`` for every
    parameter.

    Per-parameter-group γ: Alg. 1 has one client stepsize, and l. 8 turns the model change back into the
    "gradient-type estimator" g_{t,m} = (1/n)·Σ_i ∇f_m^{π^i}(x^i_{t,m}) (Sec. 4), the mean of the local gradients.
    With plain SGD and group rates γ_j, the block of parameters in group j moves by −γ_j·Σ_i ∇_j f_m^{π^i}, so
    dividing each block by its own γ_j·n_m gives exactly that estimator; dividing all blocks by one group's rate
    would scale block j by γ_j/γ_1 instead.

    A client that took no step returns zeros (its Δ is zero and it carries no direction;
    :class:`NormalizedDirections` also gives it weight 0). A parameter held by no optimizer
    group (``nan`` rate) is accepted only if its Δ is zero (a frozen parameter), and contributes zeros.

    Args:
        update: The client's :class:`~lightning_fed.ClientUpdate`; ``delta`` is a list of tensors shaped like
            the model's parameters.
        delta: The contribution to normalise in place of ``update.delta`` (default ``None``: ``update.delta``;
            a chain's earlier client transform may have changed it).

    Returns:
        One tensor per parameter, same shapes/dtypes as ``update.delta``.

    Example: Δ = [−1.5, 0.5] after n = 2 steps at γ = 0.25 is −g = Δ/(γ·n) = [−3, 1]::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> normalized_direction(ClientUpdate(0, [torch.tensor([-1.5, 0.5])], num_samples=8, num_steps=2, loss=0.0,
        ...                                   client_lr=0.25))
        [tensor([-3.,  1.])]

    Raises:
        ValueError: ``update.client_lr`` (when ``client_lrs`` is empty) or a parameter's rate in
            ``update.client_lrs`` is not a finite number > 0 (a parameter with a nonzero Δ that no group holds,
            or that groups with different rates hold, included); ``client_lrs`` not one per parameter; or
            ``update.num_steps`` negative.
    """
    if delta is None:
        delta = update.delta
    steps = int(update.num_steps)
    if steps < 0:
        raise ValueError(f"`ClientUpdate.num_steps` of client {update.client_id} must be >= 0, got {steps}.")
    if not update.client_lrs:
        lr = update.client_lr
        if not _is_positive_finite(lr):
            raise ValueError(
                f"The normalised direction Δ/(γ·n) needs the client learning rate γ: `ClientUpdate.client_lr` of "
                f"client {update.client_id} must be a finite number > 0, got {lr!r} (does the client optimizer have "
                "an 'lr' in its first parameter group?)."
            )
        if steps == 0:
            return [torch.zeros_like(d) for d in delta]
        scale = 1.0 / (float(lr) * steps)
        return [torch.mul(d, scale) for d in delta]
    if len(update.client_lrs) != len(delta):
        raise ValueError(
            f"`ClientUpdate.client_lrs` of client {update.client_id} must hold one learning rate per parameter "
            f"({len(delta)}), got {len(update.client_lrs)}."
        )
    if steps == 0:
        return [torch.zeros_like(d) for d in delta]
    result = []
    for index, (d, lr) in enumerate(zip(delta, update.client_lrs)):
        if _is_positive_finite(lr):
            result.append(torch.mul(d, 1.0 / (float(lr) * steps)))
        elif isinstance(lr, numbers.Real) and math.isnan(lr) and not bool(d.any()):
            result.append(torch.zeros_like(d))  # a parameter no optimizer group updates: no direction
        else:
            raise ValueError(
                f"The normalised direction Δ/(γ·n) needs the client learning rate γ of every parameter's optimizer "
                f"group: parameter {index} (in `module.parameters()` order) of client {update.client_id} has "
                f"`ClientUpdate.client_lrs[{index}]` = {lr!r}, but it must be a finite number > 0 (is the parameter "
                "in no optimizer group, in several groups with different 'lr', or in a group without an 'lr'?)."
            )
    return result



class NormalizedDirections(Stage):
    """Client transform Δ_m → Δ_m/(γ·n_m) (:func:`normalized_direction`), and weight 0 for clients with n_m = 0
    (Nastya, Malinovsky et al., Alg. 1, l. 8-9). No state.

    Clients that took no local step (e.g. a client smaller than the batch size under ``drop_last``) carry no
    direction: their count is set to 0, so the reducer renormalises over the others. The same changes are exposed
    through :meth:`client_counts` / :meth:`client_delta`, so ``ServerOptimizer.client_weights`` and
    ``round_gradient_diversity`` see the normalised round. Needs ``ClientDeltas.updates`` (the server optimizer
    fills it).

    Raises:
        ValueError: ``ClientDeltas.updates`` missing; no client in the round took a local step; or the errors of
            :func:`normalized_direction` (a client learning rate that is not a finite number > 0, …).

    Example: client 0 took n = 2 steps, client 1 one step, client 2 none (weight 0), all at γ = 0.25; the weighted
    mean is then ½·(−1.5/(0.25·2) + (−0.25)/(0.25·1)) = ½·(−3 − 1) = −2::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> from lightning_fed.server.aggregators import WeightedMean, run_chain
        >>> updates = [ClientUpdate(0, [torch.tensor([-1.5])], num_samples=8, num_steps=2, loss=0.0, client_lr=0.25),
        ...            ClientUpdate(1, [torch.tensor([-0.25])], num_samples=4, num_steps=1, loss=0.0, client_lr=0.25),
        ...            ClientUpdate(2, [torch.tensor([0.0])], num_samples=1, num_steps=0, loss=0.0, client_lr=0.25)]
        >>> x = ClientDeltas([0, 1, 2], [u.delta for u in updates], torch.ones(3, dtype=torch.float64), updates)
        >>> out, _ = NormalizedDirections().apply(x, EmptyState(), RoundInfo(0, 0, 3, 3))
        >>> out.deltas[0], out.counts
        ([tensor([-3.])], tensor([1., 1., 0.], dtype=torch.float64))
        >>> run_chain([NormalizedDirections(), WeightedMean()], x, (EmptyState(), EmptyState()), RoundInfo(0, 0, 3, 3))[0]
        [tensor([-2.])]
    """

    kind = "transform"

    def client_counts(self, counts: Tensor, updates: Sequence[Any]) -> Tensor:
        """``counts`` with the clients that took no local step set to 0.

        Raises:
            ValueError: no client in the round took a local step.
        """
        took_steps = torch.tensor([int(u.num_steps) > 0 for u in updates], dtype=torch.float64)
        masked = counts * took_steps
        if masked.sum() <= 0:
            raise ValueError(
                "No client in the round took a local step (all `num_steps` are 0): the normalised direction "
                "Δ/(γ·n) is undefined."
            )
        return masked

    def client_delta(self, delta: list[Tensor], update: Any) -> list[Tensor]:
        """Δ/(γ·n) of one client (:func:`normalized_direction`)."""
        return normalized_direction(update, delta)

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[ClientDeltas, NamedTuple]:
        if x.updates is None:
            raise ValueError(
                "NormalizedDirections needs each client's local steps and learning rates: `ClientDeltas.updates` "
                "must hold the round's ClientUpdate list (the server optimizer fills it)."
            )
        counts = self.client_counts(x.counts, x.updates)
        deltas = [self.client_delta(d, u) for d, u in zip(x.deltas, x.updates)]
        return x._replace(deltas=deltas, counts=counts), state
