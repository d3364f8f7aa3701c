"""Issue #54 item 6: the ``shakespeare_async`` table of ``benchmarks/reproduce.py`` — FedBuff against synchronous
FedAdam with a deadline on Shakespeare with simulated devices.

FedBuff (``examples/shakespeare_async_fedbuff.yaml``: K = 10, concurrency 100, s(τ) = 1/√(1 + τ), the buffer's
uniform mean and the server's SGD step with η_g = 1 of Alg. 1; the config's header gives the choice and why) trains :data:`STEPS` server steps of K = 10 client updates, ≈ 1.1 simulated hours
(200 steps took 0.22 h), about what the synchronous runs need to reach 45 %: the comparison is at equal simulated
time, as the issue asks (accuracy against simulated time), not at equal client updates (FedBuff trains ~9,000
updates a simulated hour against ~750 for the synchronous rounds). It validates every :data:`VAL_EVERY` steps on the
same seeded 2,000-sequence subset of the test set, seeds 0, 1, 2 (a seed also seeds the dispatches,
``asynchronous.seed``; the device population keeps its seed 0, as in ``shakespeare_clock``). The synchronous rows are
``shakespeare_clock``'s FedAdam and FedAvg runs (``fedadam_seed0..2``, ``fedavg_seed0..2``: the same device model, a
60 s deadline and over-selection 0.3, 200 rounds ≈ 2.7 simulated hours): their CSVs are read, not run again.

The summary per method (mean ± std over the seeds that finished): the simulated hours at which ``val_acc`` first
reached 35 / 40 / 45 %, ``val_acc`` at :data:`AT_HOURS` simulated hour (the last validation at or before it), the
final ``val_acc`` (at the run's end: ≈ 1.1 h for FedBuff, ≈ 2.7 h for the synchronous runs), client updates per
simulated hour (updates trained / the run's simulated hours) and the mean staleness of the updates (0 for
synchronous rounds).
"""

from __future__ import annotations

import copy
import math
import statistics
from pathlib import Path
from typing import Callable

TABLE = "shakespeare_async"
STEPS, VAL_EVERY = 1000, 50
#: the simulated hours at which every method's validation accuracy is compared
AT_HOURS = 1.0
SEEDS = (0, 1, 2)
TARGETS = (0.35, 0.40, 0.45)
#: the figure of validation accuracy against simulated time, relative to the repository root (the ``shakespeare_clock``
#: and ``shakespeare_async`` sections of examples/README.md embed it as ``../`` + this)
FIGURE = "docs/images/shakespeare_time.png"
#: the figure's line colour per method (``shakespeare_clock``'s three and FedBuff)
COLOURS = {"fedbuff": "tab:red", "fedadam": "tab:blue", "fedavg": "tab:green", "fednova": "tab:orange"}
NAMES = {"fedbuff": "FedBuff (K = 10, concurrency 100, s(τ) = 1/√(1 + τ)), Alg. 1's server SGD, η_g = 1",
         "fedadam": "FedAdam, synchronous, 60 s deadline (shakespeare_clock)",
         "fedavg": "FedAvg, synchronous, 60 s deadline (shakespeare_clock)"}


def run_specs(examples: Path, load: Callable[[Path], dict]) -> list[tuple[str, dict, int]]:
    """``(run name, config, seed)`` of the FedBuff runs, seed-major (the caller applies ``reproduce.seeded``)."""
    specs = []
    for seed in SEEDS:
        config = copy.deepcopy(load(examples / "shakespeare_async_fedbuff.yaml"))
        init = config["data"]["init_args"]
        init["max_eval_samples"] = 2000
        init["asynchronous"]["seed"] = seed
        specs.append((f"fedbuff_seed{seed}", config, seed))
    return specs


def summary(rows: list[dict], series: Callable[[list[dict], str], list[tuple[int, float]]],
            path: Path) -> dict:
    """One finished run's figures from its CSV rows (a FedBuff run's or a synchronous ``shakespeare_clock`` run's)."""
    elapsed = dict(series(rows, "clock/elapsed_seconds"))
    accuracy = series(rows, "val_acc")
    if not elapsed or not accuracy:
        raise SystemExit(f"{path} has no clock/elapsed_seconds or val_acc values: not a simulated-clock run's CSV")
    hours = elapsed[max(elapsed)] / 3600
    reached = {t: next((elapsed[r] / 3600 for r, a in accuracy if a >= t and r in elapsed), math.nan)
               for t in TARGETS}
    early = [a for r, a in accuracy if r in elapsed and elapsed[r] <= 3600 * AT_HOURS]
    updates = sum(v for _, v in series(rows, "round_clients"))
    staleness = [v for _, v in series(rows, "async/staleness_mean")]  # K updates a step: the mean of the steps'
    return {"reached": reached, "at_hours": 100 * early[-1] if early else math.nan, "final": 100 * accuracy[-1][1],
            "per_hour": updates / hours if hours else math.nan,
            "staleness": statistics.mean(staleness) if staleness else 0.0}


#: the summary's figures after the targets' columns, in the table's order
COLUMNS = ("at_hours", "final", "per_hour", "staleness")


def table(runs: list, synchronous: dict, read_csv: Callable[[Path], list[dict]], series: Callable,
          mean_std: Callable[[list[float]], str], target_cells: Callable[[list[dict], tuple], list[str]]) -> str:
    """The markdown table: FedBuff's ``runs`` and the synchronous runs ``synchronous`` (method → runs; all
    ``reproduce.Run``; a run without its CSV yet counts as not finished); ``read_csv``, ``series``, ``mean_std`` and
    ``target_cells`` are ``reproduce``'s."""
    head = " | ".join(f"hours to {100 * t:.0f} %" for t in TARGETS)
    lines = [f"| method | seeds | {head} | val_acc at {AT_HOURS:g} simulated hour (%) | final val_acc (%) | "
             "client updates per simulated hour | mean staleness |", "|---|" + "---|" * (len(TARGETS) + 5)]
    for method, members in (("fedbuff", runs), *synchronous.items()):
        done = [summary(read_csv(r.csv_path), series, r.csv_path) for r in members if r.csv_path.is_file()]
        cells = target_cells(done, TARGETS)
        lines.append(f"| {NAMES[method]} | {len(done)} of {len(members)} | " + " | ".join(cells) + " | "
                     + " | ".join(mean_std([s[key] for s in done]) for key in COLUMNS) + " |")
    return "\n".join(lines + ["", figure_line()])




def figure_line() -> str:
    """The markdown line that embeds :data:`FIGURE` in examples/README.md."""
    return f"![validation accuracy against simulated hours, per run](../{FIGURE})"


def figure(groups: dict, read_csv: Callable[[Path], list[dict]], series: Callable, path: Path,
           labels: dict, dpi: int = 120) -> Path:
    """Validation accuracy (%) against simulated hours, one line per finished run, one colour per method
    (:data:`COLOURS`); ``groups`` maps a method to its ``reproduce.Run`` list (runs without a CSV are left out) and
    ``labels`` a method to its legend text. Written to ``path`` (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for method, members in groups.items():
        finished = [r for r in members if r.csv_path.is_file()]
        for i, run in enumerate(finished):
            rows = read_csv(run.csv_path)
            elapsed = dict(series(rows, "clock/elapsed_seconds"))
            points = [(elapsed[r] / 3600, 100 * a) for r, a in series(rows, "val_acc") if r in elapsed]
            ax.plot(*zip(*points), color=COLOURS[method], alpha=0.8, lw=1.2,
                    label=f"{labels[method]} ({len(finished)} of {len(members)} seeds)" if i == 0 else None)
    if not ax.lines:
        ax.text(0.5, 0.5, "no finished run yet", transform=ax.transAxes, ha="center", va="center")
    ax.set_xlabel("simulated hours")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("Shakespeare on simulated devices (shakespeare_clock, shakespeare_async): one line per seed",
                 fontsize=10)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
