"""Reading FedScale's two device-trace files (Lai et al., "FedScale: Benchmarking Model and System Performance of
Federated Learning at Scale", ICML 2022; the formats of FedScale's "Device Trace File Formats" page,
``benchmark/dataset/data/device_info/README.md``, and their use in ``fedscale/cloud/internal/client_metadata.py``):
bounded, validated, with errors that name the file and the key.

The two formats (a dict keyed by FedScale's client id; one value per client):

* **device capacity** (FedScale's ``client_device_capacity``): ``{client_id: {'computation': float,
  'communication': float}}``. ``computation``: the device's inference latency in milliseconds per sample;
  ``communication``: its network bandwidth in kbit/s, FedScale's kbit being 1024 bits (FedScale sizes a model update
  as ``len(pickle) / 1024 * 8`` "kbits" and takes ``(upload + download) / communication`` as the seconds spent
  communicating).
* **behaviour / availability** (FedScale's ``client_behave_trace``): ``{client_id: {'duration': int,
  'inactive': [int], 'finish_time': int, 'active': [int], 'model': str}}``, times in seconds. ``active[k]`` and
  ``inactive[k]`` are the start and end of the k-th online interval within one period of ``finish_time`` seconds.
  Only ``finish_time``, ``active`` and ``inactive`` decide availability (FedScale's ``is_active`` reads only them);
  ``duration`` and ``model`` (the phone model) are not needed and not checked.

Security: a pickle can run code while it loads. :func:`read_trace` reads a pickle with an unpickler that refuses every
global except NumPy's scalar and dtype constructors (Python's documented "restricting globals" pattern), so a file
holding anything but dicts, lists, numbers and strings fails instead of running; still, open only trace files you
chose (nothing is downloaded here). The safer path: the same content as JSON (a file ending in ``.json``; keys are
then strings, read back as integers when they are decimal integers).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import numbers
import os
import pickle
from pathlib import Path
from typing import Any, Union

__all__ = ["MAX_TRACE_BYTES", "TraceFileError", "read_trace", "read_capacity_trace", "read_behaviour_trace",
           "trace_sha256"]

#: The largest trace file read by default (bytes): FedScale's own traces are a few hundred MB at most.
MAX_TRACE_BYTES = 2 * 1024**3

#: The only globals a trace pickle may name: NumPy's scalar and dtype constructors (a value saved as ``np.float64``).
_ALLOWED_GLOBALS = frozenset({
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype"),
})


class TraceFileError(ValueError):
    """A device-trace file that cannot be read or does not hold FedScale's format; the message names the file and,
    where one is at fault, the client key and field.

    >>> issubclass(TraceFileError, ValueError)
    True
    """


class _TraceUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a trace file")
        return super().find_class(module, name)


def _int_key(key: Any) -> Any:
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    return int(key) if isinstance(key, numbers.Integral) and not isinstance(key, bool) else key


def read_trace(path: Union[str, os.PathLike], what: str = "trace", max_bytes: int = MAX_TRACE_BYTES) -> dict:
    """The dict a trace file holds (``client id -> row``), keys that are integers (or decimal strings, as JSON
    writes them) as ``int``.

    Args:
        path: a pickle file, or a JSON file if its name ends in ``.json``.
        what: the file's role, for messages (``"capacity trace"``, ``"behaviour trace"``).
        max_bytes: refuse a larger file before reading it (default :data:`MAX_TRACE_BYTES`).

    Raises:
        TraceFileError: no such file, a file over ``max_bytes``, not a pickle / JSON (or a pickle naming a global
            other than NumPy's scalar), not a dict, or an empty dict.

    Example::

        >>> import json, tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "capacity.json"
        >>> _ = f.write_text(json.dumps({"7": {"computation": 50.0, "communication": 800.0}}))
        >>> read_trace(f, "capacity trace")
        {7: {'computation': 50.0, 'communication': 800.0}}
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFileError(f"{what} {str(path)!r}: no such file.")
    size = path.stat().st_size
    if size > max_bytes:
        raise TraceFileError(f"{what} {str(path)!r} is {size} bytes, over the limit max_bytes={max_bytes}.")
    with open(path, "rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:  # grew while being read
        raise TraceFileError(f"{what} {str(path)!r} is over the limit max_bytes={max_bytes}.")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(raw.decode("utf-8"))
        else:
            data = _TraceUnpickler(io.BytesIO(raw)).load()
    except Exception as err:  # any parse failure: one error naming the file
        kind = "JSON" if path.suffix.lower() == ".json" else "pickle of a dict (FedScale's format)"
        raise TraceFileError(f"{what} {str(path)!r} is not a readable {kind}: {err}") from err
    if not isinstance(data, dict):
        raise TraceFileError(
            f"{what} {str(path)!r} must hold a dict of client id -> row (FedScale's format), got {type(data).__name__}."
        )
    if not data:
        raise TraceFileError(f"{what} {str(path)!r} holds no client (an empty dict).")
    out = {}
    for key, row in data.items():
        out[_int_key(key)] = row
    if len(out) != len(data):
        raise TraceFileError(f"{what} {str(path)!r} names a client twice (as an integer and as a string).")
    return out


def _field(row: Any, key: Any, field: str, where: str) -> Any:
    if not isinstance(row, dict):
        raise TraceFileError(f"{where}: client {key!r} must map to a dict, got {type(row).__name__}.")
    if field not in row:
        raise TraceFileError(f"{where}: client {key!r} has no {field!r} (keys: {sorted(map(str, row))}).")
    return row[field]


def _number(value: Any, key: Any, field: str, where: str, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or (value <= 0 if positive else value < 0):
        bound = "> 0" if positive else ">= 0"
        raise TraceFileError(f"{where}: client {key!r} {field!r} must be a finite number {bound}, got {value!r}.")
    return float(value)


def read_capacity_trace(path: Union[str, os.PathLike], max_bytes: int = MAX_TRACE_BYTES) -> dict[Any, tuple]:
    """FedScale's device-capacity trace as ``{client id: (computation ms/sample, communication kbit/s)}``.

    Raises:
        TraceFileError: as :func:`read_trace`; a row that is not a dict, lacks ``'computation'`` or
            ``'communication'``, or holds a non-number, a negative ``computation`` or a ``communication`` <= 0.

    >>> import json, tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "capacity.json"
    >>> _ = f.write_text(json.dumps({"1": {"computation": 50, "communication": 800.5}}))
    >>> read_capacity_trace(f)
    {1: (50.0, 800.5)}
    """
    where = f"capacity trace {str(path)!r}"
    rows = read_trace(path, "capacity trace", max_bytes)
    return {
        key: (_number(_field(row, key, "computation", where), key, "computation", where, positive=False),
              _number(_field(row, key, "communication", where), key, "communication", where, positive=True))
        for key, row in rows.items()
    }


def _times(value: Any, key: Any, field: str, where: str) -> list[float]:
    if not isinstance(value, (list, tuple)) or not value:
        raise TraceFileError(f"{where}: client {key!r} {field!r} must be a non-empty list of seconds, got {value!r}.")
    return [_number(v, key, f"{field}[{i}]", where, positive=False) for i, v in enumerate(value)]


def read_behaviour_trace(path: Union[str, os.PathLike],
                         max_bytes: int = MAX_TRACE_BYTES) -> dict[Any, tuple[float, list[float], list[float]]]:
    """FedScale's behaviour (availability) trace as ``{client id: (finish_time, active, inactive)}``, seconds.

    Raises:
        TraceFileError: as :func:`read_trace`; a row that is not a dict or lacks ``'finish_time'``, ``'active'`` or
            ``'inactive'``; ``finish_time`` not a number > 0; ``active`` / ``inactive`` not non-empty lists of numbers
            >= 0 of one length; an interval whose end comes before its start.

    >>> import json, tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "behaviour.json"
    >>> _ = f.write_text(json.dumps({"3": {"finish_time": 100, "active": [10], "inactive": [40], "duration": 100}}))
    >>> read_behaviour_trace(f)
    {3: (100.0, [10.0], [40.0])}
    """
    where = f"behaviour trace {str(path)!r}"
    out = {}
    for key, row in read_trace(path, "behaviour trace", max_bytes).items():
        finish = _number(_field(row, key, "finish_time", where), key, "finish_time", where, positive=True)
        active = _times(_field(row, key, "active", where), key, "active", where)
        inactive = _times(_field(row, key, "inactive", where), key, "inactive", where)
        if len(active) != len(inactive):
            raise TraceFileError(
                f"{where}: client {key!r} has {len(active)} 'active' but {len(inactive)} 'inactive' times (one each "
                "per online interval)."
            )
        for k, (a, b) in enumerate(zip(active, inactive)):
            if b < a:
                raise TraceFileError(
                    f"{where}: client {key!r} interval {k} ends before it starts (active={a}, inactive={b})."
                )
        out[key] = (finish, active, inactive)
    return out


def trace_sha256(path: Union[str, os.PathLike], what: str = "trace") -> str:
    """The SHA-256 of a trace file's bytes, 64 hex digits (FIPS 180-4, :mod:`hashlib`), read in 1 MiB blocks: what a
    run record holds to tell an edited trace from the one a checkpoint ran with.

    Raises:
        TraceFileError: no such file.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "trace.json"
    >>> _ = f.write_bytes(b"abc")
    >>> trace_sha256(f)  # FIPS 180-2's example "abc"
    'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    """
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise TraceFileError(f"{what} {str(path)!r}: cannot be read: {err}") from err
    return digest.hexdigest()
