"""Issue #54: the short server-step sweep behind ``examples/shakespeare_async_fedbuff.yaml``'s server η and weighting.

Each variant is the example config (seed 0) with one or two settings changed, trained for :data:`STEPS` server steps
(≈ 0.07 simulated hours) with validation every 10 steps on the seeded 2,000-sequence test subset of the
``shakespeare_async`` table, by ``lightning-fed fit`` in a fresh process (one thread). The validation rows of every
variant go to one CSV (``variant, step, elapsed_seconds, val_acc, staleness_mean``), by default
``benchmarks/results/shakespeare_async_sweep/seed0.csv``; the figures are in examples/README.md's FedBuff section.

Variants (:data:`VARIANTS`; "as shipped before" = FedAdam η = 10^-2, β1 = 0.9, the server optimizer's default
sample weighting): ``c10`` (concurrency 10: staleness ≈ 1), ``c100`` (as shipped before), ``c100_beta1_0`` (no server
momentum), ``c100_lr3e-3`` (η = 3·10^-3), ``c100_uniform`` (Alg. 1's uniform mean), ``c100_uniform_lr3e-3`` (both),
``c100_sgd`` (Alg. 1's own server step x ← x − η_g·Δ̄, η_g = 1, on the uniform mean: the example's setting now).

Usage (≈ 10 minutes a variant on one busy core)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/shakespeare_async_sweep.py [--only c10 c100 ...] [--out CSV]
"""

from __future__ import annotations

import argparse
import copy
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "shakespeare_async_fedbuff.yaml"
STEPS = 60
BEFORE = {"class_path": "lightning_fed.callbacks.FedAdam",
          "init_args": {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 0.001}}
#: variant → (server callback, asynchronous overrides)
VARIANTS = {
    "c10": (BEFORE, {"concurrency": 10}),
    "c100": (BEFORE, {}),
    "c100_beta1_0": ({**BEFORE, "init_args": {**BEFORE["init_args"], "beta1": 0.0}}, {}),
    "c100_lr3e-3": ({**BEFORE, "init_args": {**BEFORE["init_args"], "lr": 0.003}}, {}),
    "c100_uniform": ({**BEFORE, "init_args": {**BEFORE["init_args"], "weighting": "uniform"}}, {}),
    "c100_uniform_lr3e-3": ({**BEFORE, "init_args": {**BEFORE["init_args"], "lr": 0.003, "weighting": "uniform"}},
                            {}),
    "c100_sgd": ({"class_path": "lightning_fed.callbacks.FedAvg", "init_args": {"lr": 1.0, "weighting": "uniform"}},
                 {}),
}


def variant_config(name: str) -> dict:
    """The example config with variant ``name``'s server callback and asynchronous settings, seed 0, 60 steps."""
    config = yaml.safe_load(EXAMPLE.read_text())
    server, asynchronous = VARIANTS[name]
    config["trainer"]["callbacks"] = [copy.deepcopy(server)]
    config["trainer"].update(max_epochs=STEPS, check_val_every_n_epoch=10)
    init = config["data"]["init_args"]
    init["max_eval_samples"] = 2000
    init["asynchronous"].update(asynchronous)
    return config


def run(name: str, workdir: Path) -> list[dict]:
    """Train variant ``name`` in a fresh process; its validation rows."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(variant_config(name), sort_keys=False))
    subprocess.run([str(Path(sys.executable).parent / "lightning-fed"), "fit", "--config", str(path),
                    "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
                    "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                    "--trainer.logger.save_dir", str(workdir), "--trainer.logger.name", name],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return validation_rows(name, workdir / name / "version_0" / "metrics.csv")


def validation_rows(name: str, metrics: Path) -> list[dict]:
    """Variant ``name``'s validation rows from a CSVLogger ``metrics.csv`` (epoch e = server step e + 1; the step's
    simulated seconds and mean staleness from its training row)."""
    rows = list(csv.DictReader(open(metrics)))
    step = {r["epoch"]: r for r in rows if r.get("clock/elapsed_seconds")}
    return [{"variant": name, "step": int(r["epoch"]) + 1, "elapsed_seconds": step[r["epoch"]]["clock/elapsed_seconds"],
             "val_acc": r["val_acc"], "staleness_mean": step[r["epoch"]]["async/staleness_mean"]}
            for r in rows if r.get("val_acc")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/shakespeare_async_sweep/seed0.csv")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            rows += run(name, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
