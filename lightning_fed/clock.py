"""The simulated clock: how long each round takes on the clients' devices, and the round deadline (issue #53).

A client's time in a round, from the round's start (Lai et al. 2022, FedScale, Sec. 4's client time model; Bonawitz
et al. 2019, Sec. 4's deadline and over-selection)::

    download_i = download_bytes_i / download_bytes_per_s_i + latency_s_i
    compute_i  = seconds_per_sample_i · (samples of the local steps it runs)
    upload_i   = upload_bytes_i / upload_bytes_per_s_i + latency_s_i
    finish_i   = download_i + compute_i + upload_i

Its local steps are those of the data module's local work (the samples each step really takes: a pass's last batch
may be smaller). :func:`plan_round` decides the whole round before any client trains, since every time is known in
advance (the device model is deterministic): with a ``round_deadline`` D (seconds after the round's start),

* ``"drop"`` (FedAvg's practice, Bonawitz et al. 2019): a client with ``finish_i > D`` misses the deadline; its update
  would be discarded, so it does not train at all (status ``"missed_deadline"``);
* ``"partial"``: it runs only the first ``k_i < K_i`` steps that fit, the largest k with
  ``download_i + seconds_per_sample_i · (samples of its first k steps) + upload_i <= D`` (with batches of one size B:
  ``k_i = floor((D − download_i − upload_i) / (B · seconds_per_sample_i))``), and its update is the one after those k_i
  steps — FedNova's and FedProx's setting of clients finishing different numbers of steps (Wang et al. 2020, Sec. 3;
  Li et al. 2020, Sec. 3); FedNova normalises by the k_i done (``ClientUpdate.num_steps``). ``k_i = 0``: it misses.

A client whose device goes offline (``online_until``) before the time it would stop — its finish, or the deadline —
fails like a dropped client (status ``"offline"``). With ``clients_per_round`` C (over-selection), the first C clients
to finish are kept, ties by client id; once C have reported the server stops waiting, and every other client is not
needed (status ``"not_needed"``, whether it would have finished later, missed the deadline or gone offline later;
they do not train).

The round's simulated time is when the server has what it waits for: once C clients reported (over-selection),
the C-th finish; otherwise the latest of the kept clients' finishes, the deadline D when a client missed it, and
the times clients went offline. Not modelled: contention between clients (each has its own bandwidth), the server's
compute time, failures other than the deadline and going offline, the time to sample the cohort.

**An empty round** (no client reports: every planned client missed the deadline or went offline, or no client was
planned because every candidate dropped out, was offline at selection, or none was sampled) lasts what the server
waits before it gives up on the round:

* with a deadline D: D (it closes the round at the deadline with nothing to aggregate, even when its clients
  failed earlier);
* without one, when clients were planned: the latest of their failure times (the times they went offline: the
  server learns of a failure when it happens);
* without one, when nobody could be asked (every client drawn was offline at selection): until the first of them
  comes online again (``idle_until``, :meth:`DeviceModel.next_online
  <lightning_fed.datamodules.devices.DeviceModel.next_online>`; O(drawn), never a scan of the population);
* without one, 0 s when there is nobody to wait for: every candidate dropped out (``client_dropout``: a client
  that drops out is unavailable from the round's start and costs no time, in this round as in any other), an empty
  sample (Poisson) drew nobody, or the clients drawn offline never come back (no online interval in their trace).

A round in which some client reports is timed as before, whatever failed in it.

Each round also counts the clients the cohort sampler drew that were offline at the round's start
(``offline_at_selection``, :attr:`CohortSelection.offline <lightning_fed.datamodules.cohorts.CohortSelection>`):
they were skipped, not sampled — under ``"fixed_size"`` those drawn before the cohort was full, under ``"poisson"``
the sampled ones, in a sweep round the round's share. It is the sampler's count, O(cohort), not the population's
(which would need a scan of every client each round). Under ``"fixed_size"`` its mean is the negative
hypergeometric ``num · offline / (online + 1)``, ``num`` the candidates sought and ``online`` / ``offline`` the
population's counts at the round's start (the draws are a uniformly random order of the clients).

:class:`SimulatedClock` adds up the rounds' times (the elapsed simulated seconds), saved in checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from lightning_fed.checks import ArgumentError, check_choice, check_int, check_positive

if TYPE_CHECKING:
    from lightning_fed.datamodules.devices.base import DeviceProfiles

__all__ = ["DEADLINE_POLICIES", "STATUSES", "RoundPlan", "SimulatedClock", "check_round_deadline", "payload_bytes",
           "plan_round", "shared_parameters"]

#: What a client that misses the round deadline does (``deadline_policy``).
DEADLINE_POLICIES = ("drop", "partial")
#: A planned client's outcome, :attr:`RoundPlan.status` indexes this tuple.
STATUSES = ("kept", "missed_deadline", "offline", "not_needed")
KEPT, MISSED_DEADLINE, OFFLINE, NOT_NEEDED = range(4)
#: The clock's round metrics (the loop logs them each round, TensorBoard step = round).
CLOCK_METRICS = ("clock/round_seconds", "clock/elapsed_seconds", "clock/bytes_down", "clock/bytes_up",
                 "clock/missed_deadline", "clock/offline", "clock/offline_at_selection")


def check_round_deadline(value: Any) -> Optional[float]:
    """``round_deadline`` as a float > 0 (simulated seconds), or ``None`` (no deadline).

    Raises:
        ArgumentError: anything else, e.g. a negative deadline.

    Example::

        >>> check_round_deadline(30), check_round_deadline(None)
        (30.0, None)
        >>> check_round_deadline(-1)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `round_deadline` must be a finite number > 0, got -1.
    """
    return None if value is None else check_positive("round_deadline", value)


def payload_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes that travel for ``tensors``: ``sum(numel · element_size)``, in their own dtypes. Give it what
    actually travels: the federated parameters (only the trainable ones under LoRA), without the parts a personalised
    method keeps on the client.

    Example: a float32 [10, 5] weight and a bfloat16 [5] bias::

        >>> payload_bytes([torch.zeros(10, 5), torch.zeros(5, dtype=torch.bfloat16)])
        210
    """
    return int(sum(t.numel() * t.element_size() for t in tensors))


def shared_parameters(params: Sequence[torch.Tensor], module: torch.nn.Module,
                      algorithms: Iterable[Any] = ()) -> list[torch.Tensor]:
    """The federated parameters ``params`` less those a client half keeps on the client
    (``ClientAlgorithm.local_parameters``, positions in ``module.parameters()``: FedPer's head, FedBN's norms):
    what travels between the server and a client each round.

    Example::

        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        >>> class KeepHead:
        ...     def local_parameters(self): return [2, 3]  # the second layer's weight and bias
        >>> payload_bytes(shared_parameters(list(net.parameters()), net, [KeepHead()]))  # (4·3 + 3) float32
        60
    """
    every = list(module.parameters())
    local = {id(every[i]) for algorithm in algorithms for i in algorithm.local_parameters()}
    return [p for p in params if id(p) not in local]


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """One round on the simulated clock, decided before any client trains (:func:`plan_round`).

    Per client (float64 or int ``[n]``, in the order of ``client_ids``): ``download_s``, ``compute_s`` (of the steps
    it runs), ``upload_s``, ``finish_s`` (seconds after the round's start; for a client that does not report, when it
    would have finished), ``steps`` (the local steps to run: K_i, or k_i < K_i under ``"partial"``; 0 for a client
    that does not train) and ``status`` (an index into :data:`STATUSES`).

    Attributes:
        start_time: Simulated seconds since the run's start at the round's start.
        round_seconds: The round's simulated duration (see the module doc).
        bytes_down: Bytes sent to the clients (every planned client downloads the model).
        bytes_up: Bytes received from the kept clients.
        offline_at_selection: Clients the cohort sampler drew that were offline at the round's start (skipped; see
            the module doc), default 0.

    Example: one client, 1 s down, 0.5 s of compute, 1 s up::

        >>> import numpy as np
        >>> from lightning_fed.datamodules.devices import DeviceProfiles
        >>> p = DeviceProfiles(np.array([0.05]), np.array([100.0]), np.array([100.0]), np.zeros(1))
        >>> plan = plan_round(10.0, np.array([3]), [np.array([10])], 100, 100, p)
        >>> plan.finish_s, plan.kept, plan.end_time, plan.metrics()["clock/bytes_up"]
        (array([2.5]), array([3]), 12.5, 100.0)
    """

    client_ids: np.ndarray
    download_s: np.ndarray
    compute_s: np.ndarray
    upload_s: np.ndarray
    finish_s: np.ndarray
    steps: np.ndarray
    status: np.ndarray
    start_time: float
    round_seconds: float
    bytes_down: float
    bytes_up: float
    offline_at_selection: int = 0

    @property
    def end_time(self) -> float:
        """``start_time + round_seconds``."""
        return self.start_time + self.round_seconds

    @property
    def kept(self) -> np.ndarray:
        """The clients that train and report, int64, in ``client_ids`` order."""
        return self.client_ids[self.status == KEPT]

    def count(self, status: str) -> int:
        """How many clients have ``status`` (one of :data:`STATUSES`)."""
        return int((self.status == STATUSES.index(status)).sum())

    def metrics(self) -> dict[str, float]:
        """The round metrics :data:`CLOCK_METRICS`."""
        values = (self.round_seconds, self.end_time, self.bytes_down, self.bytes_up, self.count("missed_deadline"),
                  self.count("offline"), self.offline_at_selection)
        return {name: float(v) for name, v in zip(CLOCK_METRICS, values)}


def _per_client(name: str, value: Any, n: int) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 0:
        array = np.full(n, float(array))
    if array.shape != (n,) or not np.all(np.isfinite(array) & (array >= 0)):
        raise ArgumentError(f"`{name}` must be finite numbers >= 0, one per client ({n}), got {value!r}.")
    return array


def plan_round(start_time: float, client_ids: np.ndarray, step_samples: Sequence[np.ndarray],
               download_bytes: Any, upload_bytes: Any, profiles: "DeviceProfiles",
               round_deadline: Optional[float] = None, policy: str = "drop",
               clients_per_round: Optional[int] = None, online_until: Optional[np.ndarray] = None,
               idle_until: Optional[float] = None, offline_at_selection: int = 0) -> RoundPlan:
    """Plan one round on the simulated clock (the module doc gives the model). Pure; O(n + total local steps).

    Args:
        start_time: The round's start, simulated seconds since the run's start (``>= 0``).
        client_ids: The planned clients, int ``[n]`` (the candidates left after sampling and dropout).
        step_samples: Per client, the samples of each of its K_i local steps (int ``[K_i]``, in order).
        download_bytes: Bytes each client downloads, ``[n]`` or one number (:func:`payload_bytes`).
        upload_bytes: Bytes each client uploads, ``[n]`` or one number (an encoded update may be smaller).
        profiles: The clients' :class:`~lightning_fed.datamodules.devices.DeviceProfiles`, ``[n]`` each.
        round_deadline: D, seconds after the round's start, ``> 0``, or ``None`` (default: no deadline).
        policy: ``"drop"`` (default) or ``"partial"``: what a client finishing after D does.
        clients_per_round: Keep the first C to finish (over-selection), or ``None`` (default: keep all).
        online_until: Simulated time (since the run's start) each client stays online, ``[n]``, or ``None``
            (default: always).
        idle_until: When no client is planned and there is no deadline: the simulated time (since the run's start,
            ``>= start_time``) the server waits until, the next time a client drawn offline comes online; ``None``
            (default): nobody to wait for, 0 s. Unused when a client is planned or with a deadline.
        offline_at_selection: Clients the sampler drew offline at the round's start, an int ``>= 0`` (default 0),
            recorded in the plan for :meth:`RoundPlan.metrics`.

    Returns:
        A :class:`RoundPlan`.

    Raises:
        ArgumentError: an unknown ``policy``, a deadline ``<= 0``, malformed per-client arrays, an ``idle_until``
            before ``start_time`` or not finite, a negative ``offline_at_selection``.

    Example: two clients of 2 steps of 10 samples, 1e6 bytes at 1e6 B/s both ways (1 s each way), D = 4.5 s; the
    first computes 0.1 s a sample (finish 1 + 2 + 1 = 4 s), the second 0.2 s (1 + 4 + 1 = 6 s): dropped, or under
    ``"partial"`` k = floor((4.5 − 1 − 1) / 2) = 1 step (finish 1 + 2 + 1 = 4 s)::

        >>> import numpy as np
        >>> from lightning_fed.datamodules.devices import DeviceProfiles
        >>> p = DeviceProfiles(np.array([0.1, 0.2]), np.full(2, 1e6), np.full(2, 1e6), np.zeros(2))
        >>> steps = [np.array([10, 10]), np.array([10, 10])]
        >>> plan = plan_round(0.0, np.array([4, 7]), steps, 1e6, 1e6, p, round_deadline=4.5)
        >>> plan.finish_s, plan.kept, plan.round_seconds
        (array([4., 6.]), array([4]), 4.5)
        >>> plan = plan_round(0.0, np.array([4, 7]), steps, 1e6, 1e6, p, round_deadline=4.5, policy="partial")
        >>> plan.steps, plan.finish_s, plan.round_seconds
        (array([2, 1]), array([4., 4.]), 4.0)

    An empty round: both go offline (at 2 s and 3 s) before they finish; without a deadline the server learns it at
    3 s, with one it waits until D; nobody planned, the server waits for a drawn client online again at 25 s::

        >>> gone = np.array([2.0, 3.0])
        >>> plan_round(0.0, np.array([4, 7]), steps, 1e6, 1e6, p, online_until=gone).round_seconds
        3.0
        >>> plan_round(0.0, np.array([4, 7]), steps, 1e6, 1e6, p, round_deadline=4.5, online_until=gone).round_seconds
        4.5
        >>> empty = DeviceProfiles(*(np.zeros(0) for _ in range(4)))
        >>> plan_round(10.0, np.zeros(0), [], 0, 0, empty, idle_until=25.0, offline_at_selection=2).metrics()
        ... # doctest: +NORMALIZE_WHITESPACE
        {'clock/round_seconds': 15.0, 'clock/elapsed_seconds': 25.0, 'clock/bytes_down': 0.0, 'clock/bytes_up': 0.0,
         'clock/missed_deadline': 0.0, 'clock/offline': 0.0, 'clock/offline_at_selection': 2.0}
    """
    policy = check_choice("policy", policy, DEADLINE_POLICIES)
    deadline = check_round_deadline(round_deadline)
    if clients_per_round is not None:
        clients_per_round = check_int("clients_per_round", clients_per_round, 1)
    offline_at_selection = check_int("offline_at_selection", offline_at_selection, 0)
    if idle_until is not None and not (math.isfinite(idle_until) and idle_until >= start_time):
        raise ArgumentError(f"`idle_until` must be a finite time >= start_time ({start_time!r}), got {idle_until!r}.")
    ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
    n = len(ids)
    if len(step_samples) != n:
        raise ArgumentError(f"`step_samples` must hold one array per client ({n}), got {len(step_samples)}.")
    down = _per_client("download_bytes", download_bytes, n)
    up = _per_client("upload_bytes", upload_bytes, n)
    spp, down_bw, up_bw, latency = (np.asarray(a, dtype=np.float64) for a in profiles)
    download_s = down / down_bw + latency
    upload_s = up / up_bw + latency
    # cum[j]: the samples of the first j steps of all clients in a row; client i's steps are starts[i]..ends[i]-1
    lengths = np.fromiter((len(s) for s in step_samples), dtype=np.int64, count=n)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    flat = [np.asarray(s, dtype=np.float64).reshape(-1) for s in step_samples]
    cum = np.concatenate([[0.0], np.cumsum(np.concatenate(flat) if flat else np.zeros(0))])
    total = cum[ends] - cum[starts]
    steps = lengths.copy()
    compute_s = spp * total
    finish = download_s + compute_s + upload_s
    status = np.full(n, KEPT, dtype=np.int8)
    if deadline is not None:
        late = finish > deadline
        if policy == "partial" and late.any():
            budget = deadline - download_s - upload_s
            owner = np.repeat(np.arange(n), lengths)
            done = cum[1:] - cum[starts[owner]]  # the samples of its client's steps up to this one
            fits = spp[owner] * done <= budget[owner]
            steps = np.where(late, np.bincount(owner, weights=fits, minlength=n).astype(np.int64), steps)
            samples = cum[starts + steps] - cum[starts]
            compute_s = np.where(late, spp * samples, compute_s)
            finish = np.where(late & (steps > 0), download_s + compute_s + upload_s, finish)
            status[late & (steps == 0)] = MISSED_DEADLINE
        else:
            status[late] = MISSED_DEADLINE
    stop = np.where(status == MISSED_DEADLINE, deadline if deadline is not None else 0.0, finish)
    if online_until is not None:
        left = np.asarray(online_until, dtype=np.float64).reshape(-1) - float(start_time)
        if left.shape != (n,):
            raise ArgumentError(f"`online_until` must hold one time per client ({n}), got shape {left.shape}.")
        gone = left < stop
        status[gone] = OFFLINE
        stop = np.where(gone, np.maximum(left, 0.0), stop)
    kept = status == KEPT
    if clients_per_round is not None and kept.sum() >= clients_per_round:  # the cohort is full: no more waiting
        order = np.lexsort((ids, np.where(kept, finish, np.inf)))  # by finish, ties by client id
        status[order[clients_per_round:][kept[order[clients_per_round:]]]] = NOT_NEEDED
        kept = status == KEPT
        round_seconds = float(finish[kept].max())
        # the server stopped waiting then: who was still out is not needed, not late (the deadline is later)
        status[(status == MISSED_DEADLINE) | ((status == OFFLINE) & (stop >= round_seconds))] = NOT_NEEDED
    elif not kept.any() and deadline is not None:  # an empty round: the server waits until the deadline
        round_seconds = deadline
    elif n:
        round_seconds = float(stop[status != NOT_NEEDED].max())
    else:  # nobody planned: until a client drawn offline comes online (if any)
        round_seconds = 0.0 if idle_until is None else float(idle_until) - float(start_time)
    steps = np.where(kept, steps, 0)
    return RoundPlan(ids, download_s, compute_s, upload_s, finish, steps, status, float(start_time), round_seconds,
                     float(down.sum()), float(up[kept].sum()), offline_at_selection)


class SimulatedClock:
    """The run's simulated time: the rounds planned so far and their total duration (seconds since the run's start).

    Saved in the checkpoints (:meth:`state_dict`), so a resumed run goes on at the same simulated time.

    Example::

        >>> clock = SimulatedClock()
        >>> clock.advance(12.5); clock.advance(3.0)
        >>> clock.elapsed_seconds, clock.rounds, clock.state_dict()
        (15.5, 2, {'elapsed_seconds': 15.5, 'rounds': 2})
        >>> other = SimulatedClock(); other.load_state_dict(clock.state_dict()); other.elapsed_seconds
        15.5
    """

    def __init__(self) -> None:
        #: Simulated seconds since the run's start (float64).
        self.elapsed_seconds = 0.0
        #: Rounds counted so far.
        self.rounds = 0

    def advance(self, round_seconds: float) -> None:
        """Add one round of ``round_seconds`` (``>= 0``)."""
        if not math.isfinite(round_seconds) or round_seconds < 0:
            raise ArgumentError(f"`round_seconds` must be a finite number >= 0, got {round_seconds!r}.")
        self.elapsed_seconds += float(round_seconds)
        self.rounds += 1

    def state_dict(self) -> dict[str, Any]:
        """``{"elapsed_seconds": float, "rounds": int}``."""
        return {"elapsed_seconds": self.elapsed_seconds, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.elapsed_seconds = float(state["elapsed_seconds"])
        self.rounds = int(state["rounds"])
