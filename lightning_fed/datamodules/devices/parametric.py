"""Seeded parametric devices: constant values, log-normal spreads and a fraction of slow clients (issue #53 1a)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lightning_fed.checks import ArgumentError, check_int, check_non_negative, check_positive

from .base import DeviceModel, DeviceProfiles

__all__ = ["ParametricDeviceModel"]

_TAG = 0xDE71CE  # the devices' stream: [seed, _TAG, client id] never meets the cohorts' or local work's streams


def _check_bandwidth(name: str, value: Any) -> float:
    if value == math.inf:
        return math.inf
    return check_positive(name, value)


class ParametricDeviceModel(DeviceModel):
    """Each client's device drawn once, by seed, around given medians.

    Client ``i``'s values come from its own generator ``np.random.default_rng([seed, 0xDE71CE, i])``, three standard
    normals ``z_c, z_d, z_u`` then one uniform ``u``, so they cost O(1) per client, do not depend on the cohort it is
    asked with or on the round, and repeat on any machine:

    * ``seconds_per_sample_i = seconds_per_sample · exp(compute_sigma · z_c) · (slowdown if u < slow_fraction else 1)``
    * ``download_bytes_per_s_i = download_bytes_per_s · exp(network_sigma · z_d)``
    * ``upload_bytes_per_s_i = upload_bytes_per_s · exp(network_sigma · z_u)``
    * ``latency_s_i = latency_s``

    So with both sigmas 0 and ``slow_fraction=0`` every client has the constant values; with a sigma > 0 a value is
    log-normal with the given median and ``sigma`` the standard deviation of its logarithm (the shape used for device
    speeds and bandwidths in FedScale's measurements, Lai et al. 2022, and in Bonawitz et al. 2019's straggler
    analyses); ``slow_fraction`` of the clients (a Bernoulli draw each) are ``slowdown`` times slower to compute.

    Args:
        seconds_per_sample: Median compute time of one training sample, seconds, ``> 0`` (default 0.01).
        download_bytes_per_s: Median downlink, bytes/s, ``> 0`` or ``inf`` (default 1.25e6: 10 Mbit/s).
        upload_bytes_per_s: Median uplink, bytes/s, ``> 0`` or ``inf`` (default 1.25e5: 1 Mbit/s).
        latency_s: Latency of each transfer, seconds, ``>= 0`` (default 0).
        compute_sigma: Log-normal spread of ``seconds_per_sample``, ``>= 0`` (default 0: constant).
        network_sigma: Log-normal spread of both bandwidths (drawn apart), ``>= 0`` (default 0: constant).
        slow_fraction: Probability in [0, 1) that a client is a slow device (default 0).
        slowdown: Factor ``>= 1`` on a slow client's ``seconds_per_sample`` (default 1).
        seed: Seeds the draws, an int ``>= 0`` (default 0).

    Raises:
        ArgumentError: an argument outside its range (named, with the allowed values).

    Example::

        >>> import numpy as np
        >>> model = ParametricDeviceModel(seconds_per_sample=0.02, compute_sigma=0.5, slow_fraction=0.1, slowdown=4.0)
        >>> p = model.profiles(np.array([7, 3]))
        >>> bool(np.all(p.seconds_per_sample > 0)), p.upload_bytes_per_s
        (True, array([125000., 125000.]))
        >>> bool(model.profiles(np.array([3])).seconds_per_sample[0] == p.seconds_per_sample[1])  # cohort-free
        True
        >>> ParametricDeviceModel(slowdown=0.5)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `slowdown` must be a finite number >= 1, got 0.5.
    """

    def __init__(self, seconds_per_sample: float = 0.01, download_bytes_per_s: float = 1.25e6,
                 upload_bytes_per_s: float = 1.25e5, latency_s: float = 0.0, compute_sigma: float = 0.0,
                 network_sigma: float = 0.0, slow_fraction: float = 0.0, slowdown: float = 1.0, seed: int = 0) -> None:
        self.seconds_per_sample = check_positive("seconds_per_sample", seconds_per_sample)
        self.download_bytes_per_s = _check_bandwidth("download_bytes_per_s", download_bytes_per_s)
        self.upload_bytes_per_s = _check_bandwidth("upload_bytes_per_s", upload_bytes_per_s)
        self.latency_s = check_non_negative("latency_s", latency_s)
        self.compute_sigma = check_non_negative("compute_sigma", compute_sigma)
        self.network_sigma = check_non_negative("network_sigma", network_sigma)
        if isinstance(slow_fraction, bool) or not isinstance(slow_fraction, (int, float)) or not 0 <= slow_fraction < 1:
            raise ArgumentError(f"`slow_fraction` must be a number in [0, 1), got {slow_fraction!r}.")
        self.slow_fraction = float(slow_fraction)
        if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not (
                math.isfinite(slowdown) and slowdown >= 1):
            raise ArgumentError(f"`slowdown` must be a finite number >= 1, got {slowdown!r}.")
        self.slowdown = float(slowdown)
        self.seed = check_int("seed", seed, 0)

    @property
    def constant(self) -> bool:
        """Whether every client gets the same values (no spread, no slow clients): no draws are made."""
        return self.compute_sigma == 0 and self.network_sigma == 0 and self.slow_fraction == 0

    def profiles(self, client_ids: np.ndarray) -> DeviceProfiles:
        """The devices of ``client_ids`` (int ``[n]``, each ``>= 0``): float64 ``[n]`` arrays, O(n)."""
        ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
        n = len(ids)
        if self.constant:
            z, slow = np.zeros((n, 3)), np.zeros(n, dtype=bool)
        else:
            z, u = np.empty((n, 3)), np.empty(n)
            for j, cid in enumerate(ids.tolist()):
                rng = np.random.default_rng([self.seed, _TAG, cid])
                z[j], u[j] = rng.standard_normal(3), rng.random()
            slow = u < self.slow_fraction
        spp = self.seconds_per_sample * np.exp(self.compute_sigma * z[:, 0]) * np.where(slow, self.slowdown, 1.0)
        return DeviceProfiles(
            seconds_per_sample=spp,
            download_bytes_per_s=self.download_bytes_per_s * np.exp(self.network_sigma * z[:, 1]),
            upload_bytes_per_s=self.upload_bytes_per_s * np.exp(self.network_sigma * z[:, 2]),
            latency_s=np.full(n, self.latency_s),
        )
