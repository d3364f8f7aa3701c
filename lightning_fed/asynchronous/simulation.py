"""Asynchronous federated training on the simulated clock: FedBuff and FedAsync, event by event (issue #54).

The server never waits for a cohort. ``concurrency`` clients train at once; each was dispatched with the model
version current at its dispatch time and reports at its own time (:mod:`.events`). Events are handled in time order,
ties by client id; all events at one time are handled before the free slots are filled again at that time. A
reporting client's update is weighted by s(τ), τ = server steps since its start version (:mod:`.staleness`); one
with τ > ``max_staleness`` is dropped and counted. Once ``buffer_size`` K updates are buffered, the server steps:

* FedBuff (Nguyen et al., AISTATS 2022, Alg. 1): Δ̄ = (1/K)·Σ_i s(τ_i)·Δ_i over the buffer, Δ_i = y_i − x_{v_i} the
  client's change from the version v_i it started from, then x ← ServerOpt(x, Δ̄) (Alg. 1's x ← x − η_g·Δ̄ is SGD;
  FedAdam, FedYogi, ... are the same step with another rule). The sum is the server's aggregator chain over the
  buffered updates s(τ_i)·Δ_i with ``"uniform"`` weighting (w_i = 1/K, the paper's mean; ``"num_samples"``
  weighs the buffer by samples instead, not in the paper);
* FedAsync (Xie, Koyejo, Gupta 2019, Alg. 1): K = 1 and ``mixing`` α: x_t = (1 − α_t)·x_{t−1} + α_t·x_new with
  α_t = α·s(τ) and x_new = x_{v} + Δ the client's model; the update handed to the server is
  α_t·(x_new − x_{t−1}), so the rule SGD with η = 1 gives the paper's mixing exactly.

Memory: the simulation trains a client when it reports (lazily), from the model version it started from, so it keeps
per client in flight only its :class:`~.events.InFlight` record, and one copy of each model version some client in
flight started from (refcounted; freed when its last client reports). A version older than
``current − max_staleness`` is freed at once: its clients will be dropped and never train. So it holds at most
min(concurrency, max_staleness + 1) model copies (+ the K buffered updates), never a Δ per client in flight
(benchmarks/async_memory.py measures it at 1,000 clients in flight).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from lightning_fed.asynchronous.events import InFlight, device_profiles, draw_client, report_times
from lightning_fed.asynchronous.staleness import StalenessWeighting
from lightning_fed.checks import ArgumentError, check_in_range, check_int
from lightning_fed.client.update import ClientUpdate
from lightning_fed.clock import payload_bytes

__all__ = ["AsyncConfig", "AsyncSimulation", "AsyncStep"]

_PROFILE_CACHE = 65536  # clients whose device profiles a simulation remembers (~10 MB)


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
    """The settings of asynchronous training.

    Args:
        concurrency: Clients training at once, an integer >= 1 (at most the population).
        buffer_size: K, updates per server step, an integer >= 1 (default 10, FedBuff's).
        staleness: s(τ), a :class:`~.staleness.StalenessWeighting` (default FedBuff's 1/√(1 + τ)).
        max_staleness: Updates with τ above it are dropped and counted, an integer >= 0, or ``None`` (default:
            none dropped).
        mixing: FedAsync's α in (0, 1], or ``None`` (default: FedBuff's buffered Δ). Needs ``buffer_size=1``.
        seed: Seeds the dispatches, an integer >= 0 (default 0).

    Raises:
        ArgumentError: a value out of its range, or ``mixing`` with ``buffer_size != 1``.

    Example::

        >>> AsyncConfig(concurrency=100).buffer_size
        10
        >>> AsyncConfig(concurrency=4, buffer_size=2, mixing=0.5)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `mixing` (FedAsync) mixes in one update per server step: it needs `buffer_size=1`, got 2.
    """

    concurrency: int
    buffer_size: int = 10
    staleness: StalenessWeighting = dataclasses.field(default_factory=StalenessWeighting)
    max_staleness: Optional[int] = None
    mixing: Optional[float] = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("concurrency", self.concurrency, 1)
        check_int("buffer_size", self.buffer_size, 1)
        check_int("max_staleness", self.max_staleness, 0, optional=True, none_means="none dropped")
        check_int("seed", self.seed, 0)
        if not isinstance(self.staleness, StalenessWeighting):
            raise ArgumentError(f"`staleness` must be a StalenessWeighting, got {type(self.staleness).__name__}.")
        if self.mixing is not None:
            check_in_range("mixing", self.mixing, low=0.0, low_open=True, high=1.0)
            if self.buffer_size != 1:
                raise ArgumentError("`mixing` (FedAsync) mixes in one update per server step: it needs "
                                    f"`buffer_size=1`, got {self.buffer_size}.")


@dataclasses.dataclass(frozen=True)
class AsyncStep:
    """One server step of :meth:`AsyncSimulation.step`.

    Attributes:
        version: The model version after the step (server steps so far).
        time: The simulated time of the step (the K-th buffered update's report), seconds since the run's start.
        client_ids: The buffered clients, int64 ``[K]``, in the order they reported.
        staleness: Their τ, int64 ``[K]``.
        weights: Their s(τ) (times α under FedAsync), float64 ``[K]``.
        dropped_stale: Updates dropped since the previous step for τ > ``max_staleness``.
        offline: Clients in flight that went offline since the previous step.
        dispatched: Clients dispatched since the previous step.
        failed: Clients whose training failed (``train`` returned ``None``) since the previous step.

    Example: step 3 at 130 s buffered clients 4 (fresh) and 9 (three steps stale, FedBuff weight 1/√(1 + 3))::

        >>> step = AsyncStep(3, 130.0, np.array([4, 9]), np.array([0, 3]), np.array([1.0, 0.5]), 1, 0, 3)
        >>> step.metrics(previous_time=100.0)["async/staleness_max"], bool(step.weights[1] == 1 / (1 + 3) ** 0.5)
        (3.0, True)
    """

    version: int
    time: float
    client_ids: np.ndarray
    staleness: np.ndarray
    weights: np.ndarray
    dropped_stale: int
    offline: int
    dispatched: int
    failed: int = 0

    def metrics(self, previous_time: float) -> dict[str, float]:
        """The step's metrics, given the previous step's ``time`` (0 for the first): ``async/staleness_mean``,
        ``async/staleness_max``, ``async/dropped_stale``, ``async/offline`` and ``async/updates_per_hour``, the
        buffered updates per simulated hour since the previous step (K · 3600 / Δt; ``inf`` for Δt = 0).

        Example::

            >>> step = AsyncStep(3, 130.0, np.array([4, 9]), np.array([0, 3]), np.array([1.0, 0.5]), 1, 0, 3)
            >>> step.metrics(previous_time=100.0)["async/updates_per_hour"]  # 2 updates in 30 s
            240.0
        """
        span = self.time - previous_time
        return {"async/staleness_mean": float(self.staleness.mean()),
                "async/staleness_max": float(self.staleness.max()), "async/dropped_stale": float(self.dropped_stale),
                "async/offline": float(self.offline),
                "async/updates_per_hour": len(self.client_ids) * 3600.0 / span if span > 0 else float("inf")}


class AsyncSimulation:
    """Asynchronous training, event by event on the simulated clock (the module doc gives the algorithm).

    Args:
        config: The :class:`AsyncConfig`.
        num_clients: N, the population, an integer >= ``config.concurrency``.
        train: ``train(client_id, params, dispatch) -> ClientUpdate``: the client's local training from ``params``
            (the model version it started from, one tensor per federated parameter; read-only), its Δ relative to
            them; ``dispatch`` is its dispatch index k, unique in the run (what keys its batch order, as the round
            does in synchronous training). ``None``: its training failed (counted in ``AsyncStep.failed``).
        server: The server's step, ``server(params, updates)``: aggregates the buffered updates and steps ``params``
            in place (a :class:`~lightning_fed.server.composer.ServerComposer`'s ``update``).
        device_model: The clients' :class:`~lightning_fed.datamodules.devices.DeviceModel`.
        step_samples: ``step_samples(client_id, dispatch)``: the samples of each of the client's local steps in that
            dispatch, int ``[K_i]``.
        download_bytes, upload_bytes: Bytes per transfer, or ``None`` (default: the payload of the parameters).

    Raises:
        ArgumentError: ``num_clients`` below the concurrency.

    Example: FedBuff with K = 2 on a scalar model, 3 clients at once out of 3, each client's update −0.5·x (a
    gradient step on x²/2 with lr 0.5); client c computes 0.1·(c + 1) s a sample, one sample::

        >>> from lightning_fed.datamodules.devices import DeviceModel, DeviceProfiles
        >>> from lightning_fed.server.composer import ServerComposer
        >>> from lightning_fed.server.rules import SGD
        >>> class Speeds(DeviceModel):
        ...     def profiles(self, ids):
        ...         n = len(ids)
        ...         return DeviceProfiles(0.1 * (ids + 1.0), np.full(n, np.inf), np.full(n, np.inf), np.zeros(n))
        >>> sim = AsyncSimulation(AsyncConfig(concurrency=3, buffer_size=2), 3,
        ...                       lambda c, p, k: ClientUpdate(c, [-0.5 * p[0]], 1, 1, 0.0),
        ...                       ServerComposer("uniform", None, SGD()).update, Speeds(), lambda c, k: np.array([1]))
        >>> x = [torch.tensor([1.0], dtype=torch.float64)]
        >>> step = sim.step(x)  # client 0 reports at 0.1 s, trains again (the one idle client), reports at 0.2 s,
        >>> # tied with client 1 and first by id: x = 1 + (−0.5 − 0.5) / 2, both from version 0
        >>> x, step.client_ids, step.staleness, round(step.time, 6)
        ([tensor([0.5000], dtype=torch.float64)], array([0, 0]), array([0, 0]), 0.2)
        >>> step = sim.step(x)  # client 1 (from x = 1, τ = 1: s = 1/√2), then client 0 from x = 0.5 at 0.3 s
        >>> [round(v, 6) for v in x[0].tolist()], step.client_ids, step.staleness
        ([0.198223], array([1, 0]), array([1, 0]))
    """

    def __init__(self, config: AsyncConfig, num_clients: int,
                 train: Callable[[int, list[Tensor], int], Optional[ClientUpdate]],
                 server: Callable[[list[Tensor], list[ClientUpdate]], Any], device_model: Any,
                 step_samples: Callable[[int, int], np.ndarray], download_bytes: Optional[float] = None,
                 upload_bytes: Optional[float] = None) -> None:
        if not isinstance(config, AsyncConfig):
            raise ArgumentError(f"`config` must be an AsyncConfig, got {type(config).__name__}.")
        self.config = config
        self.num_clients = check_int("num_clients", num_clients, config.concurrency)
        self.train, self.server, self.device_model, self.step_samples = train, server, device_model, step_samples
        self.download_bytes, self.upload_bytes = download_bytes, upload_bytes
        #: Simulated seconds since the run's start; model version (server steps so far); dispatches so far.
        self.time, self.version, self.dispatches = 0.0, 0, 0
        #: The clients in flight (a heap of :class:`~.events.InFlight`).
        self.in_flight: list[InFlight] = []
        self._busy: set[int] = set()  # their ids
        #: The model versions some client in flight started from, and how many such clients each has.
        self.versions: dict[int, list[Tensor]] = {}
        self.references: dict[int, int] = {}
        #: The buffered updates (already weighted) and their (client id, τ, weight), in report order.
        self.buffer: list[ClientUpdate] = []
        self.buffer_info: list[tuple[int, int, float]] = []
        #: Run totals: updates dropped for staleness, clients that went offline in flight.
        self.dropped_stale_total, self.offline_total = 0, 0
        self._counts = [0, 0, 0, 0]  # since the last step: dropped_stale, offline, dispatched, failed
        self._profile_cache: dict[int, tuple[float, float, float, float]] = {}
        self._weights: dict[int, float] = {}  # s(τ) by τ

    # ------------------------------------------------------------------ events
    def _fill(self, params: list[Tensor]) -> None:
        """Dispatch clients at ``self.time`` with the current version until ``concurrency`` are in flight."""
        busy = self._busy
        online = None
        if getattr(self.device_model, "has_availability", False):
            online = lambda c: bool(self.device_model.is_online(np.array([c]), self.time)[0])  # noqa: E731
        new: list[tuple[int, int]] = []
        while len(busy) < self.config.concurrency:
            client = draw_client(self.config.seed, self.dispatches, self.num_clients, busy, online)
            if client is None:
                break
            new.append((client, self.dispatches))
            busy.add(client)
            self.dispatches += 1
        if not new:
            return
        if self.version not in self.versions:
            self.versions[self.version] = [p.detach().clone() for p in params]
            self.references[self.version] = 0
        self.references[self.version] += len(new)
        size = payload_bytes(params) if self.download_bytes is None or self.upload_bytes is None else None
        ids = np.array([c for c, _ in new], dtype=np.int64)
        ends, reports = report_times(self.time, ids, [self.step_samples(c, k) for c, k in new],
                                     size if self.download_bytes is None else self.download_bytes,
                                     size if self.upload_bytes is None else self.upload_bytes, self.device_model,
                                     self._profiles(ids))
        for (client, k), end, ok in zip(new, ends.tolist(), reports.tolist()):
            heapq.heappush(self.in_flight, InFlight(end, client, k, self.version, bool(ok)))
        self._counts[2] += len(new)

    def _profiles(self, ids: np.ndarray) -> list[tuple[float, float, float, float]]:
        """The clients' device profiles, remembered per client (a pure function of the device model's settings and
        the id): at most ``_PROFILE_CACHE`` clients' (4 floats each), then forgotten and drawn again."""
        cache = self._profile_cache
        missing = [c for c in ids.tolist() if c not in cache]
        if missing:
            if len(cache) + len(missing) > _PROFILE_CACHE:
                cache.clear()
            cache.update(zip(missing, device_profiles(self.device_model, np.array(missing, dtype=np.int64))))
        return [cache[c] for c in ids.tolist()]

    def _release(self, version: int) -> None:
        if version in self.references:
            self.references[version] -= 1
            if self.references[version] == 0:
                del self.references[version]
                self.versions.pop(version, None)  # already freed if it grew older than max_staleness

    def _receive(self, event: InFlight, params: list[Tensor]) -> None:
        """Handle one report (or going offline) at ``self.time``."""
        tau = self.version - event.version
        start = self.versions.get(event.version)
        if not event.reports:
            self._counts[1] += 1
            self.offline_total += 1
        elif self.config.max_staleness is not None and tau > self.config.max_staleness:
            self._counts[0] += 1
            self.dropped_stale_total += 1
        else:
            update = self.train(event.client_id, start, event.dispatch)
            if update is None:  # its training failed: nothing to buffer
                self._counts[3] += 1
                self._release(event.version)
                return
            weight = self._weights.get(tau)
            if weight is None:  # s(τ) is a pure function of τ: computed once per τ
                weight = self._weights[tau] = float(self.config.staleness(np.array([tau]))[0])
            if self.config.mixing is None:  # FedBuff: s(τ)·Δ_i (s = 1, a fresh update's: Δ_i itself, the same bits)
                if weight != 1.0:
                    update = dataclasses.replace(update, delta=[torch.mul(d, weight) for d in update.delta])
            else:  # FedAsync: α_t·(x_v + Δ − x_{t−1})
                weight *= self.config.mixing
                update = dataclasses.replace(update, delta=[torch.mul(s.to(d.dtype) + d - p.detach().to(d.dtype),
                                                                      weight)
                                                            for s, d, p in zip(start, update.delta, params)])
            self.buffer.append(update)
            self.buffer_info.append((event.client_id, tau, weight))
        self._release(event.version)

    def step(self, params: list[Tensor]) -> AsyncStep:
        """Run events until the server's next step, and take it: ``params`` (the current model x, one tensor per
        federated parameter) stepped in place. Returns the :class:`AsyncStep`.

        Raises:
            RuntimeError: no client is in flight and none can be dispatched (every idle client offline).
        """
        while True:
            if not self.in_flight or self.in_flight[0].end_time > self.time:
                self._fill(params)
                if not self.in_flight:
                    raise RuntimeError(f"asynchronous training is stuck at simulated time {self.time} s: no client "
                                       "is in flight and no idle client is online to dispatch.")
            event = heapq.heappop(self.in_flight)
            self._busy.discard(event.client_id)
            self.time = event.end_time
            self._receive(event, params)
            if len(self.buffer) == self.config.buffer_size:
                return self._server_step(params)

    def _server_step(self, params: list[Tensor]) -> AsyncStep:
        self.server(params, self.buffer)
        self.version += 1
        if self.config.max_staleness is not None:  # their clients will be dropped: they never train
            for version in [v for v in self.versions if self.version - v > self.config.max_staleness]:
                del self.versions[version]
        ids, taus, weights = (np.array(col) for col in zip(*self.buffer_info))
        report = AsyncStep(self.version, self.time, ids.astype(np.int64), taus.astype(np.int64),
                           weights.astype(np.float64), *self._counts)
        self.buffer, self.buffer_info, self._counts = [], [], [0, 0, 0, 0]
        return report

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: clock, version, dispatches, the clients in flight, the versions they
        reference, the buffer and the counters (the server's own state is the server optimizer's)."""
        return {"time": self.time, "version": self.version, "dispatches": self.dispatches,
                "in_flight": [tuple(e) for e in self.in_flight],
                "versions": {v: [t.clone() for t in ts] for v, ts in self.versions.items()},
                "references": dict(self.references),
                "buffer": [dataclasses.asdict(u) for u in self.buffer], "buffer_info": list(self.buffer_info),
                "totals": [self.dropped_stale_total, self.offline_total], "counts": list(self._counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.time, self.version, self.dispatches = float(state["time"]), int(state["version"]), int(state["dispatches"])
        self.in_flight = [InFlight(*e) for e in state["in_flight"]]
        heapq.heapify(self.in_flight)
        self._busy = {e.client_id for e in self.in_flight}
        self.versions = {int(v): [t.clone() for t in ts] for v, ts in state["versions"].items()}
        self.references = {int(v): int(n) for v, n in state["references"].items()}
        self.buffer = [ClientUpdate(**u) for u in state["buffer"]]
        self.buffer_info = [tuple(i) for i in state["buffer_info"]]
        self.dropped_stale_total, self.offline_total = (int(n) for n in state["totals"])
        self._counts = [int(n) for n in state["counts"]] + [0] * (4 - len(state["counts"]))

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held for the clients in flight: ``"versions"`` (the model copies), ``"buffer"`` (the buffered
        updates), ``"in_flight"`` (their records, 5 numbers each: 40 bytes of values)."""
        return {"versions": sum(payload_bytes(ts) for ts in self.versions.values()),
                "buffer": sum(payload_bytes(u.delta) for u in self.buffer), "in_flight": 40 * len(self.in_flight)}
