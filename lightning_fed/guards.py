"""Guards against absurd client updates (finite but far larger than the rest of the round's) and against a
non-finite global model or server-optimizer state (loaded from a checkpoint, or written by a server step)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed.checks import check_choice, check_consecutive_limit


def check_max_update_norm_ratio(value: Any) -> Optional[float]:
    """Validate ``max_update_norm_ratio``: ``None`` (guard off) or a finite number k > 1.

    Raises:
        ValueError: anything else (booleans included; k ≤ 1 would drop every client above the median, a trimming
            rule rather than a guard against outliers).

    Example::

        >>> check_max_update_norm_ratio(None), check_max_update_norm_ratio(10)
        (None, 10.0)
        >>> check_max_update_norm_ratio(1)
        Traceback (most recent call last):
        ...
        ValueError: `max_update_norm_ratio` must be None (off) or a finite number > 1, got 1.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 1:
        raise ValueError(f"`max_update_norm_ratio` must be None (off) or a finite number > 1, got {value!r}.")
    return float(value)


def update_norm(delta: Sequence[Tensor]) -> float:
    """‖Δ_i‖₂ over all of a client's parameter changes (the tensors flattened and concatenated), accumulated in
    float64 (a float32 update with entries ~1e20 has a finite float64 norm where a float32 one would be ``inf``).

    Example: ‖([3], [4])‖₂ = 5, and 1e20 squared overflows float32 but not float64::

        >>> import torch
        >>> update_norm([torch.tensor([3.0]), torch.tensor([4.0])])
        5.0
        >>> big = torch.tensor([1e20, 1e20])
        >>> big.norm(), f"{update_norm([big]):.4e}"  # float32 overflows; √2·1e20 in float64
        (tensor(inf), '1.4142e+20')
    """
    if not delta:
        return 0.0
    norms = torch._foreach_norm(list(delta), 2, dtype=torch.float64)
    return float(torch.linalg.vector_norm(torch.stack([n.cpu() for n in norms])))


def norm_outliers(norms: Sequence[float], max_ratio: float) -> list[int]:
    """Indices i with ``norms[i] > max_ratio * median(norms)``, in increasing order.

    The median is the usual one (for an even count the mean of the two middle values, ``numpy.median``) over all
    of ``norms``, the outliers included. With a median of 0 (most clients did not move) nothing is flagged: there
    is no scale to compare with. With two clients and k ≥ 2 nothing can be flagged (the larger norm is at most
    twice the median): the guard needs at least three reporting clients to single one out.

    Args:
        norms: The round's client update norms ‖Δ_i‖₂, shape ``[C]``, finite and ≥ 0 (``inf`` is flagged).
        max_ratio: k > 1.

    Returns:
        The indices of the updates to drop (possibly empty).

    Example: median 2; with k = 10 only 50 > 20 is flagged::

        >>> norm_outliers([1.0, 2.0, 50.0, 2.5, 1.5], max_ratio=10)
        [2]
    """
    values = np.asarray(norms, dtype=np.float64)
    if values.size == 0:
        return []
    median = float(np.median(values))
    if not 0.0 < median < math.inf:
        return [int(i) for i in np.flatnonzero(~np.isfinite(values))]
    return [int(i) for i in np.flatnonzero(values > max_ratio * median)]


def warn_if_guard_inactive(max_ratio: Optional[float], clients_per_round: int) -> bool:
    """Warn (and return True) when the update-norm guard can never drop a client: with C = ``clients_per_round``
    reporting clients at most, C = 1 (an update never exceeds k times itself) or C = 2 with k ≥ 2 (the larger norm
    is at most twice the median, the two norms' mean). Called once at fit start; ``None`` (guard off) never warns.

    Example::

        >>> warn_if_guard_inactive(10.0, 3), warn_if_guard_inactive(1.5, 2), warn_if_guard_inactive(None, 1)
        (False, False, False)
    """
    if max_ratio is None or not (clients_per_round == 1 or (clients_per_round == 2 and max_ratio >= 2)):
        return False
    rank_zero_warn(
        f"`max_update_norm_ratio`={max_ratio:g} does nothing with `clients_per_round`={clients_per_round}: no update "
        f"can exceed {max_ratio:g} × the median of at most {clients_per_round} update norms. The guard needs at least "
        "3 reporting clients (or a ratio below 2 with 2)."
    )
    return True


#: The values of ``on_nonfinite_server_step``.
NONFINITE_SERVER_STEP_POLICIES = ("raise", "restore")


def check_on_nonfinite_server_step(value: Any) -> str:
    """Validate ``on_nonfinite_server_step``: ``"raise"`` or ``"restore"``.

    Raises:
        ValueError: anything else.

    Example::

        >>> check_on_nonfinite_server_step("restore")
        'restore'
        >>> check_on_nonfinite_server_step("skip")
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `on_nonfinite_server_step` must be one of ('raise', 'restore'), got 'skip'.
    """
    return check_choice("on_nonfinite_server_step", value, NONFINITE_SERVER_STEP_POLICIES)


#: ``max_consecutive_restores`` under ``on_nonfinite_server_step="restore"`` when it is not given.
DEFAULT_MAX_CONSECUTIVE_RESTORES = 3


def check_max_consecutive_restores(value: Any, on_nonfinite_server_step: str = "restore") -> Optional[int]:
    """Validate ``max_consecutive_restores``: how many rounds in a row a non-finite server step may be undone under
    ``on_nonfinite_server_step="restore"`` before the run stops (a step that is non-finite every round would
    otherwise train and discard every round to the end). ``None`` (default) means
    :data:`DEFAULT_MAX_CONSECUTIVE_RESTORES` (3) under ``"restore"``; under ``"raise"`` the first non-finite step
    stops the run, so it takes no value (returns ``None``).

    Raises:
        ArgumentError (a ValueError): anything but ``None`` or an integer >= 1 (booleans included), or a value with
            ``on_nonfinite_server_step="raise"``, naming both arguments
            (:func:`~lightning_fed.checks.check_consecutive_limit`).

    Example::

        >>> check_max_consecutive_restores(None), check_max_consecutive_restores(5)
        (3, 5)
        >>> check_max_consecutive_restores(None, "raise") is None
        True
        >>> check_max_consecutive_restores(0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `max_consecutive_restores` must be an integer >= 1 or None (3), got 0.
    """
    return check_consecutive_limit(
        "max_consecutive_restores", value, default=DEFAULT_MAX_CONSECUTIVE_RESTORES,
        policy_name="on_nonfinite_server_step", policy=on_nonfinite_server_step, active="restore",
        policies=NONFINITE_SERVER_STEP_POLICIES,
        why=f"with {on_nonfinite_server_step!r} the first non-finite server step stops the run. Leave it None or set "
            "on_nonfinite_server_step='restore'.",
    )


def _finite_flags(tensors: Sequence[Tensor]) -> list[bool]:
    """Whether each tensor's 2-norm is finite (it is when every entry is; it can also overflow for entries beyond
    ~1e19 in float32, which :func:`nonfinite_values` then rules out by counting), one fused norm per device and dtype,
    read on the host in one copy per device (one host sync for a model on one device)."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    flags: list[Any] = [None] * len(tensors)
    by_device: dict[Any, list[tuple[list[int], Tensor]]] = {}
    for (device, _), idx in groups.items():
        norms = torch._foreach_norm([tensors[i] for i in idx])  # the 2-norm: ~6x faster than ∞ on the CPU
        by_device.setdefault(device, []).append((idx, torch.isfinite(torch.stack(norms))))
    for parts in by_device.values():
        values = torch.cat([f for _, f in parts]).tolist()
        for i, v in zip((i for idx, _ in parts for i in idx), values):
            flags[i] = v
    return flags


def nonfinite_values(items: Sequence[tuple[str, Union[Tensor, float]]]) -> list[tuple[str, int, int]]:
    """``(label, number of non-finite values, number of values)`` of every item holding a NaN or ±inf, in the order
    of ``items``; ``[]`` when all are finite. Items are ``(label, value)`` with a tensor (non-floating and empty
    tensors are skipped) or a Python number. All finite costs one host sync per device (the tensors' ∞-norms read in
    one copy); the counts are computed only for the tensors found non-finite.

    Example::

        >>> import torch
        >>> nonfinite_values([("w", torch.tensor([1.0, float("nan"), float("inf")])), ("b", torch.zeros(2)),
        ...                   ("eta", 0.5), ("big", torch.tensor([3e38, 3e38]))])
        [('w', 2, 3)]
        >>> nonfinite_values([("eta", float("nan"))])
        [('eta', 1, 1)]
    """
    tensors: list[Tensor] = []
    where: list[int] = []
    bad: dict[int, tuple[str, int, int]] = {}
    for i, (label, value) in enumerate(items):
        if isinstance(value, Tensor):
            if value.numel() and value.is_floating_point():
                tensors.append(value.detach())
                where.append(i)
        elif isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isfinite(float(value)):
            bad[i] = (label, 1, 1)
    if tensors:
        for i, t, finite in zip(where, tensors, _finite_flags(tensors)):
            if not finite:
                count = int((~torch.isfinite(t)).sum())
                if count:  # else a finite tensor whose 2-norm overflowed
                    bad[i] = (items[i][0], count, t.numel())
    return [bad[i] for i in sorted(bad)]


def describe_nonfinite(bad: Sequence[tuple[str, int, int]], limit: int = 3) -> str:
    """:func:`nonfinite_values`' findings as text: ``"<label> has k non-finite value(s) (of n)"``, the first
    ``limit`` joined by ``"; "``, then how many more.

    Example::

        >>> describe_nonfinite([("global model parameter 'w'", 1, 3)])
        "global model parameter 'w' has 1 non-finite value(s) (of 3)"
    """
    text = "; ".join(f"{label} has {k} non-finite value(s) (of {n})" for label, k, n in bad[:limit])
    if len(bad) > limit:
        text += f"; and {len(bad) - limit} more tensor(s)"
    return text
