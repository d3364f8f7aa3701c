"""A small, seeded example pair of device traces in FedScale's formats (its "Device Trace File Formats" page): a
device-capacity trace and a behaviour (availability) trace, pickles of dicts keyed by client id, for
:class:`~lightning_fed.datamodules.devices.fedscale.FedScaleDevices`::

    .venv/bin/python scripts/make_device_trace.py --out-dir traces --rows 20 --seed 0 [--json]

writes ``traces/client_device_capacity`` and ``traces/client_behave_trace`` (FedScale's file names; with ``--json``
the same content as ``….json``, the reading path that runs no pickle). The numbers are invented, not measured:

* ``computation`` (inference latency, ms per sample): log-normal, median 20 ms, σ = 0.8 (a few slow phones);
* ``communication`` (bandwidth, kbit/s with kbit = 1024 bits): log-normal, median 8,000 kbit/s (1 MB/s), σ = 1.0;
* behaviour: a period (``finish_time``) of ``--period`` seconds (default 86,400, one day) holding 1 to 3 online
  intervals each, integer seconds, sorted and disjoint, the first starting at 0 for about half the devices (so a
  run's first round, at t = 0, finds clients online); ``duration`` = ``finish_time`` and ``model`` a made-up phone
  name (FedScale's fields, unused by availability).

The same ``--seed`` and ``--rows`` give the same files byte for byte.
"""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np

CAPACITY_NAME = "client_device_capacity"
BEHAVIOUR_NAME = "client_behave_trace"


def make_traces(rows: int = 20, seed: int = 0, period: int = 86_400) -> tuple[dict[int, Any], dict[int, Any]]:
    """``(capacity, behaviour)``: the two traces as dicts keyed by client ids 1 … ``rows`` (FedScale's ids start at
    1)."""
    rng = np.random.default_rng(seed)
    capacity, behaviour = {}, {}
    for cid in range(1, rows + 1):
        capacity[cid] = {"computation": round(float(20.0 * rng.lognormal(0.0, 0.8)), 3),
                         "communication": round(float(8000.0 * rng.lognormal(0.0, 1.0)), 3)}
        k = int(rng.integers(1, 4))
        cuts = np.sort(rng.choice(np.arange(1, period), size=2 * k, replace=False)).tolist()
        if rng.random() < 0.5:  # about half the devices are online at the period's start (t = 0)
            cuts[0] = 0
        behaviour[cid] = {"duration": period, "inactive": cuts[1::2], "finish_time": period, "active": cuts[0::2],
                          "model": f"phone-{int(rng.integers(1, 6))}"}
    return capacity, behaviour


def write_traces(out_dir: Path, rows: int = 20, seed: int = 0, period: int = 86_400,
                 as_json: bool = False) -> tuple[Path, Path]:
    """Write :func:`make_traces`' pair under ``out_dir``; returns ``(capacity path, behaviour path)``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, trace in zip((CAPACITY_NAME, BEHAVIOUR_NAME), make_traces(rows, seed, period)):
        path = out_dir / (name + (".json" if as_json else ""))
        if as_json:
            path.write_text(json.dumps(trace, indent=1) + "\n")
        else:
            path.write_bytes(pickle.dumps(trace, protocol=4))
        paths.append(path)
    return paths[0], paths[1]


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("traces"))
    parser.add_argument("--rows", type=int, default=20, help="devices in each trace (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--period", type=int, default=86_400, help="finish_time, seconds (default 86400)")
    parser.add_argument("--json", action="store_true", help="write JSON instead of pickles")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.period < 7:
        parser.error("--rows must be >= 1 and --period >= 7 (room for three intervals)")
    for path in write_traces(args.out_dir, args.rows, args.seed, args.period, args.json):
        print(path)


if __name__ == "__main__":
    main()
