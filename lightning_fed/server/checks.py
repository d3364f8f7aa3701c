"""The server side's own argument checks (the client weighting, LAMB's trust-ratio bounds) and how the modules below
the callbacks find the server optimizer. The generic checks (``check_positive``, ``check_unit_interval``,
``check_in_range``, ``check_choice``) are :mod:`lightning_fed.checks`'s, importable from here too.

Example::

    >>> check_positive("lr", 0.1), check_unit_interval("beta1", 0.9)
    (0.1, 0.9)
    >>> check_weighting("mean")
    Traceback (most recent call last):
    ...
    lightning_fed.checks.ArgumentError: `weighting` must be one of ('num_samples', 'uniform'), got 'mean'.
"""

from __future__ import annotations

import math
from typing import Any

from lightning_fed.checks import (ArgumentError, check_choice, check_in_range, check_positive,  # noqa: F401
                                  check_unit_interval)

#: The client weightings of the server's aggregation (``weighting=``).
WEIGHTINGS = ("num_samples", "uniform")


def check_weighting(weighting: Any) -> str:
    """Return ``weighting`` if it is one of :data:`WEIGHTINGS`, else ``ValueError`` naming ``weighting``."""
    return check_choice("weighting", weighting, WEIGHTINGS)


def check_phi_bounds(phi_min: Any, phi_max: Any) -> tuple[float, float]:
    """Validate the bounds γ_l = ``phi_min`` ≥ 0 and γ_u = ``phi_max`` > 0 (``None``: ∞) with γ_l ≤ γ_u
    (the trust-ratio clip φ of LAMB, You et al. 2020, Sec. 3).

    Raises:
        ValueError: naming the offending argument.
    """
    low = check_in_range("phi_min", phi_min, low=0.0, low_open=False)
    if phi_max is None:
        return low, math.inf
    high = check_in_range("phi_max", phi_max, low=0.0, low_open=True)
    if high < low:
        raise ArgumentError(f"`phi_max` ({high}) must be >= `phi_min` ({low}).")
    return low, high


def is_server_optimizer(obj: Any) -> bool:
    """Whether ``obj`` is a server optimizer (an instance of a class that sets ``is_server_optimizer = True``, as
    :class:`~lightning_fed.callbacks.ServerOptimizer` does): lets the modules below the callbacks (checkpointing,
    TensorBoard, the loop) find it without importing the callbacks.

    Example::

        >>> from lightning_fed.callbacks import FedAvg
        >>> is_server_optimizer(FedAvg()), is_server_optimizer(object())
        (True, False)
    """
    return bool(getattr(type(obj), "is_server_optimizer", False))


def find_server_optimizer(callbacks: Any) -> Any:
    """The single server optimizer among ``callbacks`` (:func:`is_server_optimizer`).

    Raises:
        ValueError: none or more than one given.
    """
    found = [cb for cb in callbacks if is_server_optimizer(cb)]
    if len(found) != 1:
        names = ", ".join(type(cb).__name__ for cb in found) or "none"
        raise ValueError(
            f"A federated trainer needs exactly one server optimizer callback (FedAvg, FedAdam, ...); got "
            f"{len(found)}: {names}."
        )
    return found[0]
