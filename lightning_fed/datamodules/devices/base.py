"""The device model's base: each client's compute speed, network and availability (issue #53).

A device model is a part of :class:`~lightning_fed.datamodules.FederatedDataModule` (``device_model=``), beside the
cohort sampler and the local work. It answers, for any clients, the four numbers the simulated clock
(:mod:`lightning_fed.clock`) needs (:class:`DeviceProfiles`), and when each client is online
(:meth:`DeviceModel.online_until`, :meth:`DeviceModel.is_online`; always, by default). One scheme per module:
:mod:`.parametric` (seeded constant / log-normal / slow fraction), :mod:`.callable` (a Python function); trace files
in FedScale's formats add availability.

Contract of every device model:

* :meth:`DeviceModel.profiles` costs O(len(client_ids)): no array over the whole population is built, so it works at
  a million clients;
* it is a pure function of the model's settings (its seed) and the client ids: a client's values do not depend on
  which other clients are asked with it, nor on the round (devices do not change between rounds);
* :meth:`DeviceModel.settings` reports the constructor settings (the run record, TensorBoard's HParams).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, NamedTuple

import numpy as np

from lightning_fed.checks import ArgumentError

__all__ = ["DeviceModel", "DeviceProfiles", "as_profiles"]


class DeviceProfiles(NamedTuple):
    """The devices of some clients: one float64 entry per client, in the order of the client ids asked for.

    Attributes:
        seconds_per_sample: Compute time of one training sample (forward + backward), seconds, ``>= 0``
            (a local step on a batch of B samples takes ``B * seconds_per_sample``).
        download_bytes_per_s: Downlink bandwidth, bytes per second, ``> 0`` (``inf``: instantaneous).
        upload_bytes_per_s: Uplink bandwidth, bytes per second, ``> 0`` (``inf``: instantaneous).
        latency_s: Latency added once to each transfer (download and upload), seconds, ``>= 0``.

    Example::

        >>> import numpy as np
        >>> p = DeviceProfiles(np.array([0.01]), np.array([1e6]), np.array([1e5]), np.array([0.05]))
        >>> p.seconds_per_sample * 20  # one step of 20 samples, seconds
        array([0.2])
    """

    seconds_per_sample: np.ndarray
    download_bytes_per_s: np.ndarray
    upload_bytes_per_s: np.ndarray
    latency_s: np.ndarray


def as_profiles(value: Any, num_clients: int, source: str = "device model") -> DeviceProfiles:
    """``value`` (a :class:`DeviceProfiles` or a dict with its four field names) as a checked
    :class:`DeviceProfiles` of float64 arrays of shape ``[num_clients]`` (a scalar is broadcast).

    Raises:
        ArgumentError: naming ``source`` and the field: a missing or unknown field, a wrong shape, a value out of its
            range (``seconds_per_sample`` and ``latency_s`` finite ``>= 0``; the bandwidths ``> 0``, ``inf`` allowed).

    Example::

        >>> as_profiles({"seconds_per_sample": 0.01, "download_bytes_per_s": [1e6, 2e6],
        ...              "upload_bytes_per_s": 1e5, "latency_s": 0.0}, 2).download_bytes_per_s
        array([1000000., 2000000.])
        >>> as_profiles({"seconds_per_sample": -1.0, "download_bytes_per_s": 1.0, "upload_bytes_per_s": 1.0,
        ...              "latency_s": 0.0}, 1)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: device model: `seconds_per_sample` must be finite numbers >= 0, got -1.0.
    """
    if isinstance(value, DeviceProfiles):
        value = value._asdict()
    if not isinstance(value, dict):
        raise ArgumentError(f"{source} must give a DeviceProfiles or a dict of {DeviceProfiles._fields}, got "
                            f"{type(value).__name__}.")
    missing = [f for f in DeviceProfiles._fields if f not in value]
    unknown = [f for f in value if f not in DeviceProfiles._fields]
    if missing or unknown:
        raise ArgumentError(f"{source} must give exactly the fields {DeviceProfiles._fields}; missing {missing}, "
                            f"unknown {unknown}.")
    out = {}
    for name in DeviceProfiles._fields:
        array = np.asarray(value[name], dtype=np.float64)
        if array.ndim == 0:
            array = np.full(num_clients, float(array))
        if array.shape != (num_clients,):
            raise ArgumentError(f"{source}: `{name}` must have shape ({num_clients},), one value per client asked "
                                f"for, got {array.shape}.")
        bandwidth = name.endswith("bytes_per_s")
        bad = ~(array > 0) if bandwidth else ~(np.isfinite(array) & (array >= 0))
        if bad.any():
            allowed = "numbers > 0 (inf allowed)" if bandwidth else "finite numbers >= 0"
            raise ArgumentError(f"{source}: `{name}` must be {allowed}, got {float(array[bad][0])!r}.")
        out[name] = array
    return DeviceProfiles(**out)


class DeviceModel:
    """The base of device models: per-client compute speed, bandwidths, latency and availability.

    A subclass implements :meth:`profiles` (O(len(client_ids)), deterministic by its settings); one with availability
    (traces) overrides :meth:`online_until`, :meth:`is_online` and :meth:`next_online` too. The constructor's
    arguments, stored as attributes of the same names, are its :meth:`settings` (recorded in checkpoints, with
    :meth:`run_settings`: a resume with other device settings is refused like any other run setting).

    Example: every client on the same device, always online::

        >>> import numpy as np
        >>> class SameDevice(DeviceModel):
        ...     def __init__(self, seconds_per_sample: float = 0.01):
        ...         self.seconds_per_sample = seconds_per_sample
        ...     def profiles(self, client_ids):
        ...         n = len(client_ids)
        ...         return DeviceProfiles(np.full(n, self.seconds_per_sample), np.full(n, 1e6), np.full(n, 1e5),
        ...                               np.zeros(n))
        >>> model = SameDevice()
        >>> model.profiles(np.array([3, 9])).seconds_per_sample, model.is_online(np.array([3, 9]), t=10.0)
        (array([0.01, 0.01]), array([ True,  True]))
        >>> model.online_until(np.array([3]), t=10.0), model.next_online(np.array([3]), t=10.0), model.settings()
        (array([inf]), array([10.]), {'seconds_per_sample': 0.01})
    """

    def setup(self, num_clients: int) -> None:
        """Called by the data module's ``setup`` with the population size N (default: nothing). A model that maps
        clients to rows of a table (traces) may check or prepare the mapping here."""

    def profiles(self, client_ids: np.ndarray) -> DeviceProfiles:
        """The devices of ``client_ids`` (int64 ``[n]``): a :class:`DeviceProfiles` of float64 ``[n]`` arrays."""
        raise NotImplementedError(f"{type(self).__name__} must implement profiles(client_ids).")

    def online_until(self, client_ids: np.ndarray, t: float) -> np.ndarray:
        """The simulated time (seconds since the run's start) until which each of ``client_ids``, online at ``t``,
        stays online: float64 ``[n]``, ``>= t`` for a client online at ``t`` (default ``+inf``: always online). A
        client whose round would end later goes offline mid-round and fails like a dropped client."""
        return np.full(len(client_ids), math.inf)

    def is_online(self, client_ids: np.ndarray, t: float) -> np.ndarray:
        """Whether each of ``client_ids`` is online at simulated time ``t``: bool ``[n]`` (default all ``True``)."""
        return np.ones(len(client_ids), dtype=bool)

    def next_online(self, client_ids: np.ndarray, t: float) -> np.ndarray:
        """The first simulated time ``>= t`` (seconds since the run's start) at which each of ``client_ids`` is
        online: float64 ``[n]``; ``t`` for a client online at ``t`` (the default: always online), ``+inf`` for one
        never online again. The clock waits until then in a round where nobody could be asked
        (:func:`~lightning_fed.clock.plan_round`'s ``idle_until``)."""
        return np.full(len(client_ids), float(t))

    @property
    def has_availability(self) -> bool:
        """Whether this model says when clients are offline (it overrides :meth:`is_online`): the cohort's sampling
        law then differs from uniform / Poisson sampling of the population."""
        return type(self).is_online is not DeviceModel.is_online

    def settings(self) -> dict[str, Any]:
        """``{name: value}`` of the constructor arguments stored as attributes of the same name."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def run_settings(self) -> dict[str, Any]:
        """The settings of the checkpoints' run record, compared on resume (default :meth:`settings`; a model that
        reads files adds what tells their content apart, e.g. FedScaleDevices' SHA-256 of its traces)."""
        return self.settings()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.settings().items())})"
