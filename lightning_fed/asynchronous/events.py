"""The event side of asynchronous training: which client is dispatched next, and when it reports (issue #54).

**Dispatch.** The k-th dispatch of the run (k = 0, 1, ...) draws clients uniformly from the population
``0 .. N − 1`` with its own generator ``np.random.default_rng([seed, 0xA5F1C, k])``, rejecting a client already in
flight (a device runs one job at a time) and, with a device model that has availability
(``DeviceModel.has_availability``), a client offline at the dispatch time (``DeviceModel.is_online``): so the k-th
dispatched client is uniform over the idle online clients, and the same seed gives the same clients whatever happened
before (the generator depends on (seed, k) only). After ``max_draws`` rejections the slot stays empty until the next
event (the index k is not used up).

**Completion.** A client dispatched at simulated time t reports at t + download + compute + upload, the time pieces
of :func:`lightning_fed.clock.plan_round` (no deadline: an asynchronous server does not wait for anyone), from its
device profile and its local work's samples per step. A client whose device goes offline first
(``DeviceModel.online_until``) fails at that time and reports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, Optional

import numpy as np


__all__ = ["InFlight", "device_profiles", "draw_client", "report_times"]

_TAG = 0xA5F1C  # the dispatch stream: [seed, _TAG, k] never meets the cohorts', local work's or devices' streams


class InFlight(NamedTuple):
    """A client in flight; ordered by (``end_time``, ``client_id``): the order events are handled in.

    Attributes:
        end_time: When it reports (or goes offline), simulated seconds since the run's start.
        client_id: The client.
        dispatch: Its dispatch index k.
        version: The model version (server steps so far) it started from.
        reports: ``False``: its device goes offline at ``end_time`` and it reports nothing.

    Example: the earlier report first, a tie by the lower client id::

        >>> events = [InFlight(2.0, 1, 0, 0, True), InFlight(1.5, 7, 1, 0, True), InFlight(1.5, 3, 2, 1, False)]
        >>> [e.client_id for e in sorted(events)]
        [3, 7, 1]
    """

    end_time: float
    client_id: int
    dispatch: int
    version: int
    reports: bool


def draw_client(seed: int, dispatch: int, num_clients: int, busy: Collection[int],
                online: Optional[Callable[[int], bool]] = None, max_draws: int = 1000) -> Optional[int]:
    """The client of dispatch ``dispatch`` (the module doc): uniform over ``0 .. num_clients − 1`` less ``busy`` and
    those ``online`` says are offline; ``None`` after ``max_draws`` rejections.

    Example: the same (seed, k) gives the same client; a busy one is drawn past::

        >>> first = draw_client(0, 5, 100, busy=())
        >>> first == draw_client(0, 5, 100, busy=()), draw_client(0, 5, 100, busy={first}) != first
        (True, True)
        >>> draw_client(0, 5, 2, busy={0, 1}, max_draws=10) is None
        True
    """
    rng = np.random.default_rng([seed, _TAG, dispatch])
    for _ in range(max_draws):
        client = int(rng.integers(num_clients))
        if client not in busy and (online is None or online(client)):
            return client
    return None


def report_times(time: float, client_ids: np.ndarray, step_samples: Sequence[np.ndarray],
                 download_bytes: float, upload_bytes: float, device_model,
                 profiles: Optional[Sequence[tuple[float, float, float, float]]] = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """When clients dispatched at ``time`` report: float64 ``[n]`` end times and bool ``[n]`` (``False``: it goes
    offline first and the end time is when). ``step_samples``: per client, the samples of each of its local steps
    (int ``[K_i]``). ``profiles``: per client its device's (seconds per sample, download B/s, upload B/s, latency s)
    when already known (default: ``device_model.profiles(client_ids)``; a device model's profiles are a pure function
    of its settings and the ids). The time pieces are :func:`~lightning_fed.clock.plan_round`'s, bit for bit.

    Example: 20 samples at 0.1 s each, 1e6 bytes each way at 1e6 B/s: 1 + 2 + 1 = 4 s after t = 10::

        >>> from lightning_fed.datamodules.devices import ParametricDeviceModel
        >>> devices = ParametricDeviceModel(0.1, download_bytes_per_s=1e6, upload_bytes_per_s=1e6)
        >>> report_times(10.0, np.array([3]), [np.array([10, 10])], 1e6, 1e6, devices)
        (array([14.]), array([ True]))
    """
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    if len(step_samples) != len(ids):
        raise ValueError(f"`step_samples` must hold one array per client ({len(ids)}), got {len(step_samples)}.")
    online_until = np.asarray(device_model.online_until(ids, time), dtype=np.float64).reshape(-1).tolist()
    if profiles is None:
        profiles = device_profiles(device_model, ids)
    down, up = float(download_bytes), float(upload_bytes)
    ends, reports = [], []
    # plan_round's arithmetic for one client without a deadline, in Python floats (the same IEEE operations, in the
    # same order, so the same bits: tests/asynchronous/test_events.py checks it against plan_round); a dispatch
    # plans one client, where plan_round's array set-up would cost more than the arithmetic (issue #54's cost)
    for samples, (spp, down_bw, up_bw, latency), until in zip(step_samples, profiles, online_until):
        total = float(np.asarray(samples, dtype=np.int64).sum())  # exact: an integer count of samples
        finish = (down / down_bw + latency) + spp * total + (up / up_bw + latency)
        ok = not until - time < finish
        reports.append(ok)
        ends.append(time + finish if ok else max(until, time))
    return np.array(ends, dtype=np.float64), np.array(reports, dtype=bool)


def device_profiles(device_model, client_ids: np.ndarray) -> list[tuple[float, float, float, float]]:
    """``device_model.profiles(client_ids)`` as one (seconds per sample, download B/s, upload B/s, latency s) tuple
    of floats per client.

    Example::

        >>> from lightning_fed.datamodules.devices import ParametricDeviceModel
        >>> device_profiles(ParametricDeviceModel(0.1, latency_s=0.5), np.array([3]))
        [(0.1, 1250000.0, 125000.0, 0.5)]
    """
    arrays = device_model.profiles(np.asarray(client_ids, dtype=np.int64).reshape(-1))
    return list(zip(*(np.asarray(a, dtype=np.float64).reshape(-1).tolist() for a in arrays)))
