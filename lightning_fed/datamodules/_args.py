"""Argument checks shared by the task data modules (package-internal). Each raises :class:`ValueError` naming the
argument and the allowed values."""

from __future__ import annotations

import numbers
from typing import Any


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a float in the open interval (0, 1), or :class:`ValueError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < float(value) < 1.0):
        raise ValueError(f"`{name}` must be a number in the open interval (0, 1), got {value!r}.")
    return float(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int ``>= minimum`` (``bool`` rejected), or :class:`ValueError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)
