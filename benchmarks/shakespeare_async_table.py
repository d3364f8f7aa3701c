"""Issue #54 item 6: the ``shakespeare_async`` table of ``benchmarks/reproduce.py`` — FedBuff against synchronous
FedAdam with a deadline on Shakespeare with simulated devices.

FedBuff (``examples/shakespeare_async_fedbuff.yaml``: K = 10, concurrency 100, s(τ) = 1/√(1 + τ), server FedAdam
with the synchronous run's settings; the config's header gives the choice and why) trains :data:`STEPS` server steps
of K = 10 client updates, the 2,000 client updates of ``shakespeare_clock``'s 200 rounds × 10 clients, validating
every :data:`VAL_EVERY` steps on the same seeded 2,000-sequence subset of the test set, seeds 0, 1, 2 (a seed also
seeds the dispatches, ``asynchronous.seed``; the device population keeps its seed 0, as in ``shakespeare_clock``).
The synchronous row is ``shakespeare_clock``'s FedAdam runs (``fedadam_seed0..2``, the same device model, a 60 s
deadline and over-selection 0.3): their CSVs are read, not run again.

The summary per method (mean ± std over the seeds that finished): the simulated hours at which ``val_acc`` first
reached 35 / 40 / 45 %, the final ``val_acc``, client updates per simulated hour (updates trained / the run's
simulated hours) and the mean staleness of the updates (0 for synchronous rounds).
"""

from __future__ import annotations

import copy
import math
import statistics
from pathlib import Path
from typing import Callable

TABLE = "shakespeare_async"
STEPS, VAL_EVERY = 200, 10
SEEDS = (0, 1, 2)
TARGETS = (0.35, 0.40, 0.45)
NAMES = {"fedbuff": "FedBuff (K = 10, concurrency 100, s(τ) = 1/√(1 + τ)), server FedAdam",
         "fedadam": "FedAdam, synchronous, 60 s deadline (shakespeare_clock)"}


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
    updates = sum(v for _, v in series(rows, "round_clients"))
    staleness = [v for _, v in series(rows, "async/staleness_mean")]  # K updates a step: the mean of the steps'
    return {"reached": reached, "final": 100 * accuracy[-1][1], "per_hour": updates / hours if hours else math.nan,
            "staleness": statistics.mean(staleness) if staleness else 0.0}


def table(runs: list, synchronous: list, read_csv: Callable[[Path], list[dict]], series: Callable,
          mean_std: Callable[[list[float]], str], target_cells: Callable[[list[dict], tuple], list[str]]) -> str:
    """The markdown table: FedBuff's ``runs`` and the synchronous FedAdam ``synchronous`` runs (both lists of
    ``reproduce.Run``; a run without its CSV yet counts as not finished); ``read_csv``, ``series``, ``mean_std`` and
    ``target_cells`` are ``reproduce``'s."""
    head = " | ".join(f"hours to {100 * t:.0f} %" for t in TARGETS)
    lines = [f"| method | seeds | {head} | final val_acc (%) | client updates per simulated hour | mean staleness |",
             "|---|" + "---|" * (len(TARGETS) + 4)]
    for method, members in (("fedbuff", runs), ("fedadam", synchronous)):
        done = [summary(read_csv(r.csv_path), series, r.csv_path) for r in members if r.csv_path.is_file()]
        cells = target_cells(done, TARGETS)
        lines.append(f"| {NAMES[method]} | {len(done)} of {len(members)} | " + " | ".join(cells) + " | "
                     f"{mean_std([s['final'] for s in done])} | {mean_std([s['per_hour'] for s in done])} | "
                     f"{mean_std([s['staleness'] for s in done])} |")
    return "\n".join(lines)


