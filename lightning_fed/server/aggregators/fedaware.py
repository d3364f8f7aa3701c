"""Old home of FedAWARE's server half, now :mod:`lightning_fed.algorithms.fedaware`: the names still import from
here, with a ``DeprecationWarning`` naming the new path (``from lightning_fed.server.aggregators import
FedAWAREMinNorm`` keeps working without one)."""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = ("FedAWAREMinNorm", "fedaware_state_bytes", "physical_memory_bytes", "public_code_pairing")


def __getattr__(name: str) -> Any:
    """``lightning_fed.algorithms.fedaware.<name>`` with a ``DeprecationWarning`` for the names that moved there.

    Raises:
        AttributeError: ``name`` is not one of them.

    Example:
        >>> import warnings
        >>> from lightning_fed.server.aggregators import fedaware
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     stage_class = fedaware.FedAWAREMinNorm
        >>> stage_class.__module__, caught[0].category.__name__
        ('lightning_fed.algorithms.fedaware', 'DeprecationWarning')
    """
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"`lightning_fed.server.aggregators.fedaware.{name}` moved to `lightning_fed.algorithms.fedaware.{name}`; "
        "import it from there.", DeprecationWarning, stacklevel=2,
    )
    from lightning_fed.algorithms import fedaware

    return getattr(fedaware, name)
