"""Exceptions that the ``lightning-fed`` command reports in one line (``error: ...``, exit status 2) instead of a
traceback: the user's data or setup is at fault, and the message says what to do."""

from __future__ import annotations

__all__ = ["DataNotFoundError"]


class DataNotFoundError(FileNotFoundError):
    """A task's data is not where the data module looks for it, and it may not or cannot download it; the message
    names the missing files or folder and how to get them (a ``FileNotFoundError``, so ``except FileNotFoundError``
    still catches it).

    Raised by the tasks' ``prepare_data`` / ``setup`` (MNIST, Fashion-MNIST, EMNIST, CIFAR, Shakespeare, Stack
    Overflow). ``lightning-fed`` prints it as ``error: <message>`` with exit status 2; ``--verbose`` (or
    ``LIGHTNING_FED_VERBOSE=1``) shows the traceback.

    >>> issubclass(DataNotFoundError, FileNotFoundError)
    True
    >>> str(DataNotFoundError("Fashion-MNIST not found: data/FashionMNIST/raw lacks [...]."))
    'Fashion-MNIST not found: data/FashionMNIST/raw lacks [...].'
    """
