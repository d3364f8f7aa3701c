"""Where a server optimizer's settings are read (issue #52): the fields its ``state_key`` and ``repr`` are derived
from (:func:`fields_of`), a constructor setting read where it lives (:func:`setting_value`: a ready-made name whose
settings are its stage's names them in ``setting_paths``), how an unset bound is shown (:func:`none_if_infinite`),
and the deprecated mirror accessors of a ready-made name's stage (:func:`stage_mirror`)."""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any, Callable, Optional, Sequence

#: The release that removes the ready-made names' mirror accessors of their stage (FedAWARE's, SCAFFOLD's), as it
#: removes ``ServerOptimizer(client=...)`` (``server/arguments.py`` ``CLIENT_REMOVED_IN``).
MIRRORS_REMOVED_IN = "0.3.0"

#: The package's folder: a mirror read or written by a file in it does not warn (:func:`warn_mirror`).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _path(obj: Any, name: str) -> str:
    """The dotted path of setting ``name`` from ``obj``: its class's ``setting_paths`` entry, else ``name``."""
    return getattr(type(obj), "setting_paths", {}).get(name, name)


def _read(obj: Any, path: str) -> Any:
    value = obj
    for part in path.split("."):
        value = getattr(value, part)
    return value


def setting_value(obj: Any, name: str) -> Any:
    """The constructor setting ``name`` of ``obj`` read where it lives: ``obj.<name>``, or, for a name the class lists
    in ``setting_paths`` (``{"alpha": "min_norm.alpha"}``: FedAWARE's settings are its min-norm stage's), that
    dotted path from ``obj``.

    Raises:
        AttributeError: ``obj`` has no such setting.

    Example::

        >>> from types import SimpleNamespace
        >>> class Method(SimpleNamespace):
        ...     setting_paths = {"alpha": "stage.alpha"}
        >>> method = Method(stage=SimpleNamespace(alpha=0.5), lr=1.0)
        >>> setting_value(method, "alpha"), setting_value(method, "lr")
        (0.5, 1.0)
    """
    return _read(obj, _path(obj, name))


def has_setting(obj: Any, name: str) -> bool:
    """Whether ``obj`` has the constructor setting ``name`` (:func:`setting_value` would read one).

    >>> from types import SimpleNamespace
    >>> has_setting(SimpleNamespace(lr=1.0), "lr"), has_setting(SimpleNamespace(lr=1.0), "alpha")
    (True, False)
    """
    try:
        setting_value(obj, name)
    except AttributeError:
        return False
    return True


def fields_of(obj: Any, specs: Sequence[str]) -> list[tuple[str, Any]]:
    """``(key, value)`` of each ``"key"`` or ``"key=dotted.path"`` of ``specs``, read from ``obj`` (a bare ``"key"``
    through :func:`setting_value`): what a server optimizer's ``state_key_fields`` and ``repr_fields`` name.

    Example::

        >>> from lightning_fed.callbacks import FedAdam
        >>> server = FedAdam(lr=0.1)
        >>> fields_of(server, server.state_key_fields)
        [('lr', 0.1), ('beta1', 0.9), ('beta2', 0.99), ('tau', 0.001), ('weighting', 'num_samples')]
        >>> from types import SimpleNamespace
        >>> fields_of(SimpleNamespace(stage=SimpleNamespace(alpha=0.5)), ["alpha=stage.alpha"])
        [('alpha', 0.5)]
    """
    out = []
    for spec in specs:
        key, _, path = spec.partition("=")
        out.append((key, _read(obj, path) if path else setting_value(obj, key)))
    return out


def none_if_infinite(value: float) -> Optional[float]:
    """``None`` for ±∞ (an unset bound, as the constructor takes it), else ``value``: a :attr:`ServerOptimizer.repr_formats` entry.

    Example::

        >>> none_if_infinite(math.inf), none_if_infinite(2.0)
        (None, 2.0)
    """
    return None if math.isinf(value) else value


def warn_mirror(owner: str, name: str, kept: str) -> None:
    """Warn (``DeprecationWarning``, at the line that read or wrote ``<owner>.<name>``) that the mirror accessor is
    deprecated, naming the stage attribute to use, ``kept``, and the release that removes it. Not for a read or write
    by the package itself (the base class's own ``client_state`` and ``num_clients``, which a ready-made name's
    mirror overrides), as the old module paths warn only when imported from outside the package."""
    if os.path.abspath(sys._getframe(2).f_code.co_filename).startswith(_PACKAGE_DIR):  # the reader's file
        return
    warnings.warn(f"`{owner}.{name}` is deprecated and will be removed in lightning_fed {MIRRORS_REMOVED_IN}: it "
                  f"mirrors its stage; use `{kept}` instead.", DeprecationWarning, stacklevel=3)


def stage_mirror(name: str, kept: str, doc: str, get: Callable[[Any], Any],
                 set: Optional[Callable[[Any, Any], None]] = None) -> property:
    """A deprecated mirror accessor ``name`` of a ready-made name's stage: ``get(self)`` (and ``set(self, value)``,
    when given) with a ``DeprecationWarning`` naming ``kept`` (the stage attribute, e.g. ``"FedAWARE.min_norm.alpha"``;
    its first part is replaced by the class of the object read) at every read and write.

    Example::

        >>> import warnings
        >>> class Method:
        ...     def __init__(self):
        ...         self.stage = type("Stage", (), {"alpha": 0.5})()
        ...     alpha = stage_mirror("alpha", "Method.stage.alpha", "α.", lambda self: self.stage.alpha)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     Method().alpha
        0.5
        >>> print(caught[0].message)
        `Method.alpha` is deprecated and will be removed in lightning_fed 0.3.0: it mirrors its stage; use `Method.stage.alpha` instead.
    """
    rest = kept.partition(".")[2]

    def getter(self: Any) -> Any:
        warn_mirror(type(self).__name__, name, f"{type(self).__name__}.{rest}")
        return get(self)

    def setter(self: Any, value: Any) -> None:
        warn_mirror(type(self).__name__, name, f"{type(self).__name__}.{rest}")
        set(self, value)

    return property(getter, setter if set is not None else None,
                    doc=f"Deprecated (removed in {MIRRORS_REMOVED_IN}): ``{kept}``. {doc}")
