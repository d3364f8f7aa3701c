"""Argument checks shared by the server optimizers, rules, aggregators and client optimizers.

Every check returns the validated value (as a float or the given choice) and raises ``ValueError`` naming the
argument, the allowed values and the value received.

Example::

    >>> check_positive("lr", 0.1), check_unit_interval("beta1", 0.9)
    (0.1, 0.9)
    >>> check_choice("weighting", "mean", WEIGHTINGS)
    Traceback (most recent call last):
    ...
    ValueError: `weighting` must be one of ('num_samples', 'uniform'), got 'mean'.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

#: The client weightings of the server's aggregation (``weighting=``).
WEIGHTINGS = ("num_samples", "uniform")


def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is a finite number > 0.

    Raises:
        ValueError: naming ``name`` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")
    return float(value)


def check_unit_interval(name: str, value: Any) -> float:
    """Return ``value`` as a float if it lies in [0, 1).

    Raises:
        ValueError: naming ``name`` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1), got {value!r}.")
    return float(value)


def check_in_range(name: str, value: Any, *, low: float, low_open: bool, high: float = math.inf) -> float:
    """``value`` as a float if it is a finite real number in (low, high) / [low, high), else ``ValueError``."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value < high
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high})"
        raise ValueError(f"`{name}` must be a finite number in {interval}, got {value!r}.")
    return float(value)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``.

    Raises:
        ValueError: naming ``name``, the value and the allowed choices otherwise.
    """
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")
    return value


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
        raise ValueError(f"`phi_max` ({high}) must be >= `phi_min` ({low}).")
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
