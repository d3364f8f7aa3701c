"""Guards against absurd client updates: finite but far larger than the rest of the round's."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor


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
