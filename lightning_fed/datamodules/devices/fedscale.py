"""A device model replayed from FedScale's device traces (Lai et al., "FedScale: Benchmarking Model and System
Performance of Federated Learning at Scale", ICML 2022): compute and network capacity from its device-capacity trace,
availability from its behaviour trace. The file formats and their reading: :mod:`.fedscale_files`."""

from __future__ import annotations

import bisect
import math
import os
from typing import Any, Optional

import numpy as np

from lightning_fed.checks import check_int, check_non_negative
from lightning_fed.datamodules.devices.base import DeviceModel, DeviceProfiles
from lightning_fed.datamodules.devices.fedscale_files import (
    MAX_TRACE_BYTES, read_behaviour_trace, read_capacity_trace, trace_sha256,
)

__all__ = ["FedScaleDevices", "trace_rows"]

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
#: The streams of :func:`trace_rows`: a client's capacity row and behaviour row are drawn independently.
CAPACITY_STREAM, BEHAVIOUR_STREAM = 0, 1


def _mix(z: np.ndarray) -> np.ndarray:
    # SplitMix64's output function (Steele, Lea & Flood 2014) on uint64, wrapping
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def trace_rows(client_ids: Any, num_rows: int, seed: int, stream: int) -> np.ndarray:
    """The trace row (0 … ``num_rows`` − 1, in the trace's sorted key order) of each client: a keyed hash, O(1) per
    client and no array over the population, so a population of millions costs nothing until a client is asked for.

    ``key = mix((2·seed + stream + 0x9E3779B97F4A7C15) mod 2⁶⁴)``, ``row = mix(client_id XOR key) mod num_rows``,
    ``mix`` being SplitMix64's output function (Steele, Lea & Flood, OOPSLA 2014). Rows repeat (a trace of R devices
    serves any number of clients); the modulo's bias is below ``num_rows / 2⁶⁴``.

    Args:
        client_ids: int array-like ``[n]`` of client ids >= 0.
        num_rows: R, the trace's rows.
        seed: the device model's seed (another seed, another assignment).
        stream: :data:`CAPACITY_STREAM` or :data:`BEHAVIOUR_STREAM`.

    Returns:
        int64 ``[n]``.

    >>> trace_rows([0, 1, 2, 10**6], num_rows=5, seed=0, stream=CAPACITY_STREAM).tolist()
    [1, 2, 0, 4]
    """
    ids = np.asarray(client_ids, dtype=np.int64).astype(np.uint64)
    key_in = np.array([((2 * int(seed) + int(stream) + _GOLDEN) & _M64)], dtype=np.uint64)
    with np.errstate(over="ignore"):
        key = _mix(key_in)[0]
        return (_mix(ids ^ key) % np.uint64(num_rows)).astype(np.int64)


def _merged(finish: float, active: list[float], inactive: list[float]) -> tuple[list[float], list[float]]:
    """One period's online intervals as sorted, disjoint closed intervals within [0, finish) (touching ones merged)."""
    spans = sorted((a, min(b, finish)) for a, b in zip(active, inactive) if a < finish)
    starts: list[float] = []
    ends: list[float] = []
    for a, b in spans:
        if starts and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


class FedScaleDevices(DeviceModel):
    """Devices replayed from FedScale's traces: each client gets one row of the device-capacity trace (its compute
    and network speed) and, given a behaviour trace, one row of it (when it is online), both chosen by seed.

    **Compute and network** (FedScale's ``ClientMetadata.get_completion_time``: computation time
    = ``augmentation_factor · batch_size · local_steps · computation / 1000`` seconds, ``computation`` being the
    device's inference latency in ms per sample and the factor 3 standing for forward + backward; communication
    time = ``(upload + download) / communication`` seconds, sizes in kbit = bytes·8/1024 and ``communication`` in
    kbit/s). Our conversion to each client's :class:`~lightning_fed.datamodules.devices.DeviceProfiles`:

    * ``seconds_per_sample = augmentation_factor · computation / 1000`` (FedScale's default factor 3.0);
    * ``download_bytes_per_s = upload_bytes_per_s = communication · 1024 / 8`` — the trace has one bandwidth, used
      both ways (ours: with equal rates ``down / bw + up / bw`` is exactly FedScale's ``(up + down) / bw``);
    * ``latency_s = 0`` (ours: FedScale models no latency).

    **Availability** (FedScale's ``ClientMetadata.is_active``): a client is online at simulated time ``t`` (seconds)
    iff ``t mod finish_time`` lies in one of its closed intervals ``[active[k], inactive[k]]``. FedScale walks the
    intervals with an index kept between calls (advanced by one per call), so its answer depends on the order of
    earlier queries; ours is that walk's intent as a pure function of ``t`` (any interval, sorted; the parts of
    intervals past ``finish_time`` never match, as in FedScale, since ``t mod finish_time < finish_time``).
    :meth:`online_until` is the end of the online stretch holding ``t``: the end of its interval (intervals that
    touch, also across the period's end, join), ``inf`` for a client online over the whole period, and ``t`` itself
    for a client offline at ``t``. Without a behaviour trace every client is always online (FedScale's rule with no
    trace).

    **Mapping**: client ``i`` takes capacity row :func:`trace_rows` ``(i, R_c, seed, 0)`` and behaviour row
    ``trace_rows(i, R_b, seed, 1)`` of the traces' keys in sorted order — O(1) per client, no population-sized
    array (ours, seeded; FedScale gives its client ``c`` (counted from 1) the capacity row keyed ``c mod R_c``, a
    default ``{'computation': 1.0, 'communication': 1.0}`` when no row has that key, and the behaviour row at
    position ``c mod R_b`` of the file's key order).

    Security: the traces are pickles in FedScale's format; they are read with an unpickler that accepts only plain
    data (:func:`~lightning_fed.datamodules.devices.fedscale_files.read_trace`); the same content as ``.json`` files
    is the safer path. Name only files you chose: nothing is downloaded.

    Args:
        capacity_file: path to the device-capacity trace (pickle, or JSON if it ends in ``.json``).
        behaviour_file: path to the behaviour trace, or ``None`` (default: always online).
        seed: seeds the client → row mapping (default 0).
        augmentation_factor: training cost per sample in units of the trace's inference latency (default 3.0,
            FedScale's), ``>= 0``.
        max_bytes: refuse trace files larger than this (default 2 GiB).

    Raises:
        TraceFileError: a file missing, too large, unreadable or not in FedScale's format (the message names the
            file, the client key and the field).
        ArgumentError: ``seed`` not an integer >= 0, ``augmentation_factor`` not a finite number >= 0, ``max_bytes``
            not an integer >= 1.

    Example::

        >>> import pickle, tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (d / "cap.pkl").write_bytes(pickle.dumps({5: {"computation": 20.0, "communication": 1000.0}})) > 0
        True
        >>> (d / "beh.pkl").write_bytes(pickle.dumps({5: {"duration": 100, "finish_time": 100, "active": [10],
        ...                                              "inactive": [40], "model": "x"}})) > 0
        True
        >>> devices = FedScaleDevices(d / "cap.pkl", d / "beh.pkl")
        >>> devices.profiles(np.array([0, 999_999]))  # doctest: +NORMALIZE_WHITESPACE
        DeviceProfiles(seconds_per_sample=array([0.06, 0.06]), download_bytes_per_s=array([128000., 128000.]),
                       upload_bytes_per_s=array([128000., 128000.]), latency_s=array([0., 0.]))
        >>> devices.is_online([0, 1], t=125.0).tolist(), devices.online_until([0], t=125.0).tolist()
        ([True, True], [140.0])
        >>> devices.is_online([0], t=50.0).tolist(), devices.next_online([0], t=50.0).tolist()  # back at 100 + 10
        ([False], [110.0])
    """

    def __init__(self, capacity_file: str, behaviour_file: Optional[str] = None, seed: int = 0,
                 augmentation_factor: float = 3.0, max_bytes: int = MAX_TRACE_BYTES) -> None:
        self.seed = check_int("seed", seed, 0)
        self.augmentation_factor = check_non_negative("augmentation_factor", augmentation_factor)
        self.max_bytes = check_int("max_bytes", max_bytes, 1)
        self.capacity_file = os.fspath(capacity_file)
        self.behaviour_file = None if behaviour_file is None else os.fspath(behaviour_file)
        capacity = read_capacity_trace(self.capacity_file, self.max_bytes)
        self._sha256 = {"capacity_sha256": trace_sha256(self.capacity_file, "capacity trace"),
                        "behaviour_sha256": None}
        keys = sorted(capacity, key=_order)
        self._computation = np.array([capacity[k][0] for k in keys], dtype=np.float64)
        self._communication = np.array([capacity[k][1] for k in keys], dtype=np.float64)
        self._capacity_keys = keys
        self._behaviour: Optional[list[tuple[float, list[float], list[float], bool]]] = None
        self._behaviour_keys: list[Any] = []
        if self.behaviour_file is not None:
            behaviour = read_behaviour_trace(self.behaviour_file, self.max_bytes)
            self._sha256["behaviour_sha256"] = trace_sha256(self.behaviour_file, "behaviour trace")
            self._behaviour_keys = sorted(behaviour, key=_order)
            self._behaviour = []
            for k in self._behaviour_keys:
                finish, active, inactive = behaviour[k]
                starts, ends = _merged(finish, active, inactive)
                always = len(starts) == 1 and starts[0] <= 0 and ends[0] >= finish  # the whole period online
                self._behaviour.append((finish, starts, ends, always))

    @property
    def has_availability(self) -> bool:
        """Whether clients can be offline (a behaviour trace is given)."""
        return self._behaviour is not None

    def settings(self) -> dict[str, Any]:
        """``{name: value}``: ``capacity_file``, ``behaviour_file``, ``seed``, ``augmentation_factor`` (the run
        settings; ``max_bytes`` only guards the reading)."""
        return {"capacity_file": self.capacity_file, "behaviour_file": self.behaviour_file, "seed": self.seed,
                "augmentation_factor": self.augmentation_factor}

    def run_settings(self) -> dict[str, Any]:
        """:meth:`settings` and each trace file's content, for the checkpoints' run record: ``capacity_sha256`` and
        ``behaviour_sha256`` (``None`` without a behaviour trace), ``"<sha256 hex> <path>"`` of the file's bytes when
        the model was built (:func:`~lightning_fed.datamodules.devices.fedscale_files.trace_sha256`). A resume whose
        trace was edited since the checkpoint is refused, the line naming the file (the path alone would not tell)."""
        files = {"capacity_sha256": self.capacity_file, "behaviour_sha256": self.behaviour_file}
        return {**self.settings(), **{k: None if v is None else f"{v} {files[k]}" for k, v in self._sha256.items()}}

    def trace_keys(self, client_ids: Any) -> tuple[list[Any], Optional[list[Any]]]:
        """The FedScale client ids (trace keys) whose capacity and behaviour rows each client replays (behaviour:
        ``None`` without a behaviour trace)."""
        cap = [self._capacity_keys[r] for r in trace_rows(client_ids, len(self._capacity_keys), self.seed,
                                                          CAPACITY_STREAM)]
        if self._behaviour is None:
            return cap, None
        rows = trace_rows(client_ids, len(self._behaviour_keys), self.seed, BEHAVIOUR_STREAM)
        return cap, [self._behaviour_keys[r] for r in rows]

    def profiles(self, client_ids: np.ndarray) -> DeviceProfiles:
        """The devices of ``client_ids`` (int ``[n]``), float64 ``[n]`` each, converted as the class doc says."""
        rows = trace_rows(client_ids, len(self._capacity_keys), self.seed, CAPACITY_STREAM)
        seconds = self.augmentation_factor * self._computation[rows] / 1000.0
        bandwidth = self._communication[rows] * (1024.0 / 8.0)
        return DeviceProfiles(seconds, bandwidth, bandwidth.copy(), np.zeros(len(rows)))

    def _where(self, client_ids: Any, t: float) -> list[tuple[float, float]]:
        """Per client: (position in its period, the end of its online stretch from there, or -1 when offline)."""
        t = check_non_negative("t", t)
        rows = trace_rows(client_ids, len(self._behaviour_keys), self.seed, BEHAVIOUR_STREAM)
        out = []
        for r in rows.tolist():
            finish, starts, ends, always = self._behaviour[r]  # type: ignore[index]
            pos = math.fmod(t, finish)
            if always:
                out.append((pos, math.inf))
                continue
            k = bisect.bisect_right(starts, pos) - 1
            if k < 0 or pos > ends[k]:
                out.append((pos, -1.0))
                continue
            end = ends[k]
            if end >= finish and starts[0] <= 0:  # runs on into the next period's first interval
                end = finish + ends[0]
            out.append((pos, end))
        return out

    def is_online(self, client_ids: Any, t: float) -> np.ndarray:
        """Whether each client is online at simulated time ``t`` (seconds >= 0): bool ``[n]``."""
        if self._behaviour is None:
            check_non_negative("t", t)
            return np.ones(len(np.atleast_1d(client_ids)), dtype=bool)
        return np.array([end >= 0 for _, end in self._where(client_ids, t)], dtype=bool)

    def online_until(self, client_ids: Any, t: float) -> np.ndarray:
        """The simulated time (seconds) until which each client stays online from ``t``: float64 ``[n]`` (``inf``:
        always online; ``t``: offline at ``t``)."""
        if self._behaviour is None:
            check_non_negative("t", t)
            return np.full(len(np.atleast_1d(client_ids)), math.inf)
        t = float(t)
        return np.array([t if end < 0 else (math.inf if math.isinf(end) else t - pos + end)
                         for pos, end in self._where(client_ids, t)], dtype=np.float64)

    def next_online(self, client_ids: Any, t: float) -> np.ndarray:
        """The first simulated time ``>= t`` (seconds) at which each client is online: float64 ``[n]`` — ``t`` when
        online at ``t``, else the start of its next interval (``t − (t mod finish_time) + active``, in this period or
        the next), ``inf`` for a row with no interval within its period. O(n log intervals)."""
        t = check_non_negative("t", t)
        if self._behaviour is None:
            return np.full(len(np.atleast_1d(client_ids)), t)
        rows = trace_rows(client_ids, len(self._behaviour_keys), self.seed, BEHAVIOUR_STREAM)
        return np.array([_next_start(self._behaviour[r], t) for r in rows.tolist()], dtype=np.float64)


def _next_start(row: tuple[float, list[float], list[float], bool], t: float) -> float:
    """The first time >= t at which a behaviour row (period, merged interval starts and ends, always) is online."""
    finish, starts, ends, always = row
    pos = math.fmod(t, finish)
    k = bisect.bisect_right(starts, pos)
    if always or (k > 0 and pos <= ends[k - 1]):
        return t
    if not starts:  # no interval within the period: never online
        return math.inf
    return t - pos + (starts[k] if k < len(starts) else finish + starts[0])


def _order(key: Any) -> tuple:
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))
