"""Side-by-side of the server-side methods on real Fashion-MNIST in FedAWARE's Hybrid+ setting.

Runs each `examples/fashion_mnist_hybrid_plus_<method>.yaml` through the `lightning-fed` CLI in this process
with the same seed, rounds and data, and prints the final and best validation (= test set) accuracy of the
global model. Needs the Debian package `dataset-fashion-mnist` (real images, offline).

    .venv/bin/python benchmarks/compare_methods.py --rounds 50 [--arch mlp|fedavg] [--methods fedavg fedyogi ...]

`--arch mlp` is the FedAWARE authors' (Fashion-)MNIST model (784-200-200-10); `fedavg` is the CNN (about 40x
slower on CPU).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from lightning_fed.cli import FederatedCLI

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
METHODS = ["fedavg", "fedavgm", "fedyogi", "fedprox", "scaffold", "fedaware", "fedlamb", "fedams", "nastya"]


def run(method: str, rounds: int, arch: str, data_dir: str, log_dir: str, threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    config = EXAMPLES / f"fashion_mnist_hybrid_plus_{method}.yaml"
    args = [
        "fit", "--config", str(config), "--trainer.max_epochs", str(rounds), "--trainer.check_val_every_n_epoch", "5",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.enable_checkpointing", "false", "--trainer.logger.init_args.save_dir", log_dir,
        "--trainer.logger.init_args.name", method, "--model.init_args.arch", arch, "--data.init_args.data_dir", data_dir,
    ]
    start = time.perf_counter()
    cli = FederatedCLI(args=args)
    elapsed = time.perf_counter() - start
    return {
        "final_acc": float(cli.trainer.callback_metrics.get("val_acc", float("nan"))),
        "final_loss": float(cli.trainer.callback_metrics.get("val_loss", float("nan"))),
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--arch", default="mlp", choices=["mlp", "fedavg", "toy"])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--log-dir", default=None, help="TensorBoard logs (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="compare-")
    rows = []
    for method in args.methods:
        result = run(method, args.rounds, args.arch, args.data_dir, log_dir, args.threads)
        rows.append((method, result))
        print(f"{method}: {result}", flush=True)
    print(f"\nFashion-MNIST Hybrid+, {args.rounds} rounds, arch={args.arch}, logs in {log_dir}\n")
    print("| method | final val acc (%) | final val loss | wall time (s) |\n|---|---|---|---|")
    for method, r in rows:
        print(f"| {method} | {100 * r['final_acc']:.2f} | {r['final_loss']:.3f} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
