"""Old home of FedAWARE's server half, now :mod:`lightning_fed.algorithms.fedaware` (removed in 0.3.0): the names
still import from here, with a ``DeprecationWarning`` naming the new path (:func:`lightning_fed._moved.moved_names`;
``from lightning_fed.server.aggregators import FedAWAREMinNorm`` keeps working without one).

Example:
    >>> import warnings
    >>> from lightning_fed.server.aggregators import fedaware
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)  # once per process, from code outside the package
    ...     stage_class = fedaware.FedAWAREMinNorm
    >>> stage_class.__module__
    'lightning_fed.algorithms.fedaware'
"""

from lightning_fed._moved import moved_names as _moved_names

__getattr__ = _moved_names(__name__)
