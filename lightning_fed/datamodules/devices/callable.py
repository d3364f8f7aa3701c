"""Devices from a Python function (issue #53 1c)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from lightning_fed.checks import ArgumentError

from .base import DeviceModel, DeviceProfiles, as_profiles

__all__ = ["CallableDeviceModel"]


class CallableDeviceModel(DeviceModel):
    """Devices given by ``function(client_ids) -> DeviceProfiles`` (or a dict of its four fields, a scalar standing
    for every client), checked on every call (:func:`~lightning_fed.datamodules.devices.base.as_profiles`).

    The function must be deterministic and cohort-free (a client's values may not depend on the other clients asked
    with it) and cost O(len(client_ids)); it is recorded in the run record by its import path
    (``module.qualname``), so a config names it as ``function: my_package.my_devices``.

    Args:
        function: ``function(client_ids: np.ndarray int64 [n]) -> DeviceProfiles | dict``.

    Raises:
        ArgumentError: ``function`` not callable; (on a call) its result malformed (the field named).

    Example: even clients on a fast phone, odd ones on a slow one::

        >>> import numpy as np
        >>> def phones(ids):
        ...     return {"seconds_per_sample": np.where(ids % 2 == 0, 0.01, 0.05), "download_bytes_per_s": 1e6,
        ...             "upload_bytes_per_s": 1e5, "latency_s": 0.1}
        >>> CallableDeviceModel(phones).profiles(np.array([0, 1])).seconds_per_sample
        array([0.01, 0.05])
    """

    def __init__(self, function: Callable[[np.ndarray], Any]) -> None:
        if not callable(function):
            raise ArgumentError(f"`function` must be a callable client_ids -> DeviceProfiles, got {function!r}.")
        self.function = function

    def profiles(self, client_ids: np.ndarray) -> DeviceProfiles:
        """``function(client_ids)``, checked: float64 ``[n]`` arrays.

        Raises:
            ArgumentError: a malformed result (naming the function and the field).
        """
        ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
        name = getattr(self.function, "__qualname__", repr(self.function))
        return as_profiles(self.function(ids.copy()), len(ids), source=f"CallableDeviceModel's function {name}")

    def __repr__(self) -> str:
        f = self.function
        return f"{type(self).__name__}(function={getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', f)!s})"
