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

from lightning_fed.clock import KEPT, plan_round

__all__ = ["InFlight", "draw_client", "report_times"]

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
                 download_bytes: float, upload_bytes: float, device_model) -> tuple[np.ndarray, np.ndarray]:
    """When clients dispatched at ``time`` report: float64 ``[n]`` end times and bool ``[n]`` (``False``: it goes
    offline first and the end time is when). ``step_samples``: per client, the samples of each of its local steps
    (int ``[K_i]``). The time pieces are :func:`~lightning_fed.clock.plan_round`'s.

    Example: 20 samples at 0.1 s each, 1e6 bytes each way at 1e6 B/s: 1 + 2 + 1 = 4 s after t = 10::

        >>> from lightning_fed.datamodules.devices import ParametricDeviceModel
        >>> devices = ParametricDeviceModel(0.1, download_bytes_per_s=1e6, upload_bytes_per_s=1e6)
        >>> report_times(10.0, np.array([3]), [np.array([10, 10])], 1e6, 1e6, devices)
        (array([14.]), array([ True]))
    """
    ids = np.asarray(client_ids, dtype=np.int64)
    online_until = np.asarray(device_model.online_until(ids, time), dtype=np.float64)
    plan = plan_round(time, ids, list(step_samples), download_bytes, upload_bytes,
                      device_model.profiles(ids), online_until=online_until)
    reports = plan.status == KEPT
    return np.where(reports, time + plan.finish_s, np.maximum(online_until, time)), reports
