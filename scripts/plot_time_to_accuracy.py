"""A metric against simulated time (issue #53): runs trained with a device model, read from their run folders.

Each run's ``<metric>`` (default ``val_acc``; TensorBoard step = round) is paired round by round with its
``clock/elapsed_seconds`` (the simulated seconds at the round's end, :mod:`lightning_fed.clock`) and drawn as one line
per run with matplotlib (Agg backend); with ``--target`` it also prints each run's time to reach it (the first round's
simulated time at which the metric is ``>= target``, ``<=`` for a metric named ``*loss*``)::

    .venv/bin/python scripts/plot_time_to_accuracy.py runs/fedavg runs/fednova --metric val_acc --target 0.5 \
        --out time_to_accuracy.png

The runs are read with :func:`lightning_fed.report.load_run` (TensorBoard's ``EventAccumulator``).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Optional, Sequence

import numpy as np

from lightning_fed.report import find_runs, is_minimized, load_run

CLOCK = "clock/elapsed_seconds"


def time_curve(run, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(simulated seconds, values)`` of ``metric`` in a :class:`~lightning_fed.report.Run`, at the rounds that
    logged both the metric and the clock.

    Raises:
        KeyError: the run has no ``metric`` or no clock (trained without a device model).
    """
    for name in (metric, CLOCK):
        if name not in run.curves:
            raise KeyError(f"run {run.path} has no {name!r} (a run with a device model logs {CLOCK!r}); it has "
                           f"{sorted(run.curves)}")
    rounds, values = run.curves[metric]
    clock_rounds, seconds = run.curves[CLOCK]
    at = dict(zip(clock_rounds.tolist(), seconds.tolist()))
    keep = [i for i, r in enumerate(rounds.tolist()) if r in at]
    return np.array([at[int(rounds[i])] for i in keep]), values[keep]


def time_to_target(seconds: np.ndarray, values: np.ndarray, target: float, minimize: bool = False) -> float:
    """The first simulated time at which ``values`` reach ``target`` (``>=``; ``<=`` when ``minimize``), else ``inf``.

    >>> time_to_target(np.array([10.0, 25.0, 40.0]), np.array([0.2, 0.55, 0.6]), 0.5)
    25.0
    """
    reached = values <= target if minimize else values >= target
    return float(seconds[np.argmax(reached)]) if reached.any() else math.inf


def plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], metric: str, out: str) -> None:
    """Draw ``{run name: (seconds, values)}`` into ``out`` (hours on the x axis when a run lasts over 2 h)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest = max((s.max() for s, _ in curves.values() if len(s)), default=0.0)
    scale, unit = (3600.0, "h") if longest > 7200 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (seconds, values) in curves.items():
        ax.plot(seconds / scale, values, label=name)
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (or folders above them)")
    parser.add_argument("--metric", default="val_acc")
    parser.add_argument("--out", default="time_to_accuracy.png")
    parser.add_argument("--target", type=float, default=None, help="print each run's simulated time to reach it")
    args = parser.parse_args(argv)
    curves = {path: time_curve(load_run(path), args.metric) for path in find_runs(args.runs)}
    plot(curves, args.metric, args.out)
    times: dict[str, float] = {}
    if args.target is not None:
        minimize = is_minimized(args.metric)
        for name, (seconds, values) in curves.items():
            times[name] = time_to_target(seconds, values, args.target, minimize)
            print(f"{name}\t{args.metric} {'<=' if minimize else '>='} {args.target}: {times[name]:.1f} s")
    return times


if __name__ == "__main__":
    main(sys.argv[1:])
