"""The argument checks of the whole package, one spelling each (issue #52 item 3d).

Each check returns the validated value (an ``int``, a ``float`` or the given choice) or raises
:class:`ArgumentError` naming the argument, the allowed values and the value received, in one of these shapes:

* ``\\`<name>\\` must be an integer >= <minimum>, got <value>.`` (:func:`check_int`, :func:`check_positive_int`;
  ``... or None, got`` / ``... or None (<what None means>), got`` where ``None`` is allowed)
* ``\\`<name>\\` must be a finite number > 0, got <value>.`` (:func:`check_positive`), ``... >= 0``
  (:func:`check_non_negative`)
* ``\\`<name>\\` must be a number in [0, 1), got <value>.`` (:func:`check_unit_interval`), ``... in the open interval
  (0, 1)`` (:func:`check_fraction`), ``... a finite number in <interval>`` (:func:`check_in_range`)
* ``\\`<name>\\` must be one of <choices>, got <value>.`` (:func:`check_choice`)

:class:`ArgumentError` is both a ``ValueError`` and a ``TypeError`` (as NumPy's ``AxisError`` is both a ``ValueError``
and an ``IndexError``): a wrong type and a value out of range are one kind of mistake here, and code that catches
either of the types these checks raised before they were one set keeps catching them.

Example::

    >>> check_positive_int("clients_per_round", 10), check_positive("lr", 0.1)
    (10, 0.1)
    >>> check_int("max_iter", None, 1, optional=True) is None
    True
    >>> check_positive_int("batch_size", 0)
    Traceback (most recent call last):
    ...
    lightning_fed.checks.ArgumentError: `batch_size` must be an integer >= 1, got 0.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

__all__ = [
    "ArgumentError", "check_choice", "check_consecutive_limit", "check_fraction", "check_in_range", "check_int",
    "check_names", "check_non_negative", "check_positive", "check_positive_int", "check_unit_interval",
]


class ArgumentError(ValueError, TypeError):
    """A bad argument: the message names it, the allowed values and the value given. Both a ``ValueError`` and a
    ``TypeError``, so ``except ValueError`` and ``except TypeError`` catch it.

    >>> issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, TypeError)
    True
    """


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: Optional[int] = None, *, optional: bool = False,
              none_means: Optional[str] = None) -> Optional[int]:
    """``value`` as a Python ``int`` if it is an integer (``bool`` and integral floats refused) ``>= minimum``
    (``minimum=None``: any integer), or ``None`` if it is ``None`` and ``optional``.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        minimum: the smallest allowed value, or ``None`` for no bound (default).
        optional: whether ``None`` is allowed (default ``False``).
        none_means: what ``None`` stands for, shown in the message (``"3"``: ``... or None (3), got 0.``).

    Raises:
        ArgumentError: ``\\`<name>\\` must be an integer >= <minimum>[ or None[ (<none_means>)]], got <value!r>.``

    Example::

        >>> check_int("seed", 0, 0), check_int("offset", -3)
        (0, -3)
        >>> check_int("max_consecutive_restores", 0, 1, optional=True, none_means="3")
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `max_consecutive_restores` must be an integer >= 1 or None (3), got 0.
    """
    if value is None and optional:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum):
        allowed = "an integer" if minimum is None else f"an integer >= {minimum}"
        if optional:
            allowed += " or None" + (f" ({none_means})" if none_means else "")
        raise ArgumentError(f"`{name}` must be {allowed}, got {value!r}.")
    return int(value)


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` >= 1 (:func:`check_int` with ``minimum=1``).

    Raises:
        ArgumentError: ``\\`<name>\\` must be an integer >= 1, got <value!r>.``

    >>> check_positive_int("num_clients", 3)
    3
    """
    return check_int(name, value, 1)  # type: ignore[return-value]


def check_positive(name: str, value: Any) -> float:
    """``value`` as a ``float`` if it is a finite real number > 0 (``bool`` refused).

    Raises:
        ArgumentError: ``\\`<name>\\` must be a finite number > 0, got <value!r>.``

    >>> check_positive("lr", 1)
    1.0
    """
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"`{name}` must be a finite number > 0, got {value!r}.")
    return float(value)


def check_non_negative(name: str, value: Any) -> float:
    """``value`` as a ``float`` if it is a finite real number >= 0 (``bool`` refused).

    Raises:
        ArgumentError: ``\\`<name>\\` must be a finite number >= 0, got <value!r>.``

    >>> check_non_negative("mu", 0)
    0.0
    """
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        raise ArgumentError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return float(value)


def check_unit_interval(name: str, value: Any) -> float:
    """``value`` as a ``float`` if it lies in [0, 1) (``bool`` refused).

    Raises:
        ArgumentError: ``\\`<name>\\` must be a number in [0, 1), got <value!r>.``

    >>> check_unit_interval("beta1", 0.9)
    0.9
    """
    if not _is_real(value) or not 0.0 <= value < 1.0:
        raise ArgumentError(f"`{name}` must be a number in [0, 1), got {value!r}.")
    return float(value)


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a ``float`` in the open interval (0, 1) (``bool`` refused).

    Raises:
        ArgumentError: ``\\`<name>\\` must be a number in the open interval (0, 1), got <value!r>.``

    >>> check_fraction("eval_fraction", 0.2)
    0.2
    """
    if not _is_real(value) or not (0.0 < float(value) < 1.0):
        raise ArgumentError(f"`{name}` must be a number in the open interval (0, 1), got {value!r}.")
    return float(value)


def check_in_range(name: str, value: Any, *, low: float, low_open: bool, high: float = math.inf) -> float:
    """``value`` as a ``float`` if it is a finite real number in (low, high) (``low_open``) or [low, high).

    Raises:
        ArgumentError: ``\\`<name>\\` must be a finite number in <interval>, got <value!r>.``

    >>> check_in_range("phi_min", 0, low=0.0, low_open=False)
    0.0
    """
    ok = _is_real(value) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value < high
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high})"
        raise ArgumentError(f"`{name}` must be a finite number in {interval}, got {value!r}.")
    return float(value)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``.

    Raises:
        ArgumentError: ``\\`<name>\\` must be one of <choices>, got <value!r>.``

    >>> check_choice("on_client_failure", "skip", ("skip", "raise", "skip_all"))
    'skip'
    """
    if value not in choices:
        raise ArgumentError(f"`{name}` must be one of {choices}, got {value!r}.")
    return value


def check_names(name: str, value: Any, example: str = "classifier") -> list[str]:
    """``value`` as a list of non-empty ``str`` names (submodules or tensors of a model); one ``str`` is a list of
    one.

    Raises:
        ArgumentError: ``\\`<name>\\` must be a non-empty list of submodule or tensor names (e.g. ['<example>']),
            got <value!r>.``

    >>> check_names("head", "net.2")
    ['net.2']
    """
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ArgumentError(f"`{name}` must be a non-empty list of submodule or tensor names (e.g. [{example!r}]), "
                            f"got {value!r}.")
    return names


def check_consecutive_limit(name: str, value: Any, *, default: int, policy_name: str, policy: str, active: str,
                            policies: tuple[str, ...], why: str) -> Optional[int]:
    """A limit on how many rounds in a row something may happen before the run stops (``max_consecutive_restores``,
    ``max_consecutive_client_failures``): ``None`` (``default`` under ``policy == active``) or an integer >= 1; it
    applies only when the policy argument ``policy_name`` is ``active`` (otherwise returns ``None``).

    Raises:
        ArgumentError: ``\\`<name>\\` must be an integer >= 1 or None (<default>), got <value!r>.``; or, for a value
            with another policy, ``\\`<name>\\`=<value!r> applies only with <policy_name>=<active!r> (of <policies>):
            <why>``.

    Example::

        >>> limit = dict(default=3, policy_name="on_failure", active="skip", policies=("skip", "raise"),
        ...              why="'raise' stops at the first failure. Leave it None.")
        >>> check_consecutive_limit("max_failures", None, policy="skip", **limit)
        3
        >>> check_consecutive_limit("max_failures", 2, policy="raise", **limit)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `max_failures`=2 applies only with on_failure='skip' (of ('skip', 'raise')): 'raise' stops at the first failure. Leave it None.
    """
    limit = check_int(name, value, 1, optional=True, none_means=str(default))
    if policy != active:
        if limit is not None:
            raise ArgumentError(f"`{name}`={value!r} applies only with {policy_name}={active!r} (of {policies}): {why}")
        return None
    return default if limit is None else limit
