"""Reddi et al. 2021, Table 1, Shakespeare row: run the five generated configs (FedAdagrad, FedAdam, FedYogi, FedAvgM,
FedAvg) on the real plays for a few rounds and print validation accuracy side by side.

Each optimizer runs in its own `lightning-fed fit` subprocess (one thread each, ``--parallel`` at a time) with the
config unchanged except the number of rounds, the validation interval and a seeded validation subsample; the
metrics come from a CSVLogger. The paper's numbers are averages over rounds 1401-1500, so a short run only checks
that every recalled learning rate trains, and how fast.

    .venv/bin/python benchmarks/reddi_shakespeare.py --rounds 100 --val-every 25 --data-dir data
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ("fedadagrad", "fedadam", "fedyogi", "fedavgm", "fedavg")
PAPER = {"fedadagrad": 57.5, "fedadam": 57.0, "fedyogi": 57.2, "fedavgm": 57.3, "fedavg": 56.9}


def run(opt: str, args: argparse.Namespace) -> tuple[str, dict[int, float], float]:
    out = Path(args.out) / opt
    cmd = [str(Path(sys.executable).with_name("lightning-fed")), "fit", "--config",
           str(ROOT / "examples" / f"shakespeare_{opt}.yaml"), "--trainer.max_epochs", str(args.rounds),
           "--trainer.check_val_every_n_epoch", str(args.val_every), "--data.max_eval_samples", str(args.eval_samples),
           "--data.data_dir", args.data_dir, "--trainer.enable_progress_bar", "false",
           "--trainer.enable_checkpointing", "false", "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
           "--trainer.logger.save_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    accs: dict[int, float] = {}
    for path in out.rglob("metrics.csv"):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("val_acc"):
                    accs[int(row["epoch"]) + 1] = 100.0 * float(row["val_acc"])
    return opt, accs, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--val-every", type=int, default=25)
    parser.add_argument("--eval-samples", type=int, default=2000)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", default="/tmp/reddi_shakespeare")
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    args = parser.parse_args()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda o: run(o, args), args.optimizers))
    rounds = sorted({r for _, accs, _ in results for r in accs})
    print("| optimizer | " + " | ".join(f"round {r}" for r in rounds) + " | s/round | paper (last 100 of 1500) |")
    print("|---|" + "---|" * (len(rounds) + 2))
    for opt, accs, wall in results:
        cells = " | ".join(f"{accs[r]:.1f}" if r in accs else "–" for r in rounds)
        print(f"| {opt} | {cells} | {wall / args.rounds:.2f} | {PAPER[opt]} |")


if __name__ == "__main__":
    main()
