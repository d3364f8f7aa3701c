"""Issue #56: the per-round overhead of each update compressor on a small CPU configuration.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compression_cost.py                  # all compressors, 3 repeats
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compression_cost.py --repeats 5 --rounds 8 --out /tmp/c.csv

A FedAvg fit of the 784-256-10 MLP (203,530 float32 parameters) on synthetic data: N = 20 clients, C = 5 a round,
2 local steps of B = 20 each. Each variant (``none`` and one ``Compression(...)`` per compressor; ``topk1%+ef`` with
error feedback) runs ``--rounds`` rounds; the first round is warm-up. The variants are interleaved: every repeat runs
each once, in turn, so a change of the machine's load touches them alike. Per variant, over all measured rounds of
all repeats, the medians of:

* ``round_ms``: the loop's ``round_time_s`` (wall clock);
* ``round_cpu_ms``: the process CPU time of the round (from the round's start to its end; less sensitive than the
  wall clock to other processes on a loaded machine);
* ``encode_ms``: the thread CPU time spent in ``Compression.encode`` in the round (the compressor's own cost; 0 for
  ``none``);

and ``overhead_pct`` = 100 · (median round_ms − median round_ms of ``none``) / median round_ms of ``none``, with
``encode_pct`` = 100 · median encode_ms / median round_ms of ``none`` (less noisy on a loaded machine: it times only
the added work), and ``cpu_overhead_pct`` from ``round_cpu_ms`` as ``overhead_pct`` from ``round_ms``. Also the bytes a client uploads (``up_bytes_per_client``) from the run's ledger.
"""

from __future__ import annotations

import argparse
import csv
import logging
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from lightning_fed import FederatedTrainer  # noqa: E402
from lightning_fed.callbacks import FedAvg  # noqa: E402
from lightning_fed.communication import (QSGD, BFloat16, Compression, Float16, RandK, Sign, TopK,  # noqa: E402
                                         UniformQuantization)
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner  # noqa: E402

VARIANTS = {
    "none": None,
    "float16": lambda: Compression(Float16()),
    "bfloat16": lambda: Compression(BFloat16()),
    "qsgd4": lambda: Compression(QSGD(levels=7)),
    "uniform8": lambda: Compression(UniformQuantization(bits=8)),
    "topk1%": lambda: Compression(TopK(fraction=0.01)),
    "topk1%+ef": lambda: Compression(TopK(fraction=0.01), error_feedback=True),
    "randk1%": lambda: Compression(RandK(fraction=0.01)),
    "sign": lambda: Compression(Sign()),
}
COLUMNS = ("variant", "rounds_measured", "round_ms", "round_cpu_ms", "encode_ms", "overhead_pct", "cpu_overhead_pct",
           "encode_pct", "up_bytes_per_client")


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class RoundTimes(L.Callback):
    def __init__(self) -> None:
        self.round_ms: list[float] = []
        self.round_cpu_ms: list[float] = []
        self.start = 0.0

    def on_train_epoch_start(self, trainer, pl_module):
        self.start = time.process_time()

    def on_train_epoch_end(self, trainer, pl_module):
        self.round_cpu_ms.append(1e3 * (time.process_time() - self.start))
        self.round_ms.append(1e3 * trainer.fit_loop.round_metrics["round_time_s"])


def timed_encode(encode_ms: list[float]):
    original = Compression.encode

    def encode(self, *args, **kwargs):
        start = time.thread_time()
        try:
            return original(self, *args, **kwargs)
        finally:
            encode_ms[-1] += 1e3 * (time.thread_time() - start)
    return original, encode


def run(variant: str, rounds: int) -> tuple[list[float], list[float], list[float], int]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20 * 40, 784, generator=g), torch.randint(0, 10, (20 * 40,), generator=g)
    dm = FederatedDataModule(TensorDataset(x, y), partitioner=IIDPartitioner(num_clients=20, seed=0),
                             clients_per_round=5, batch_size=20)
    times, encode_ms = RoundTimes(), [0.0]

    class PerRound(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            encode_ms.append(0.0)

    make = VARIANTS[variant]
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[FedAvg(), times, PerRound()], logger=False,
                               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                               accelerator="cpu", devices=1, client_algorithms=[make()] if make else None)
    original, wrapped = timed_encode(encode_ms)
    Compression.encode = wrapped
    try:
        torch.manual_seed(0)
        trainer.fit(MLP(), datamodule=dm)
    finally:
        Compression.encode = original
    ledger = trainer.fit_loop.communication
    up = next(iter(ledger.round_client_bytes_up.values()))
    return times.round_ms[1:], times.round_cpu_ms[1:], encode_ms[1:rounds], up


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=str, default=None)
    args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    variants = ["none", *[v for v in args.variants if v != "none"]]
    rounds = {v: [] for v in variants}
    cpu = {v: [] for v in variants}
    encode = {v: [] for v in variants}
    up = {}
    for _ in range(args.repeats):
        for v in variants:  # interleaved
            r, c, e, up[v] = run(v, args.rounds)
            rounds[v] += r
            cpu[v] += c
            encode[v] += e
    base = statistics.median(rounds["none"])
    base_cpu = statistics.median(cpu["none"])
    rows = []
    for v in variants:
        med, enc = statistics.median(rounds[v]), statistics.median(encode[v]) if encode[v] else 0.0
        med_cpu = statistics.median(cpu[v])
        rows.append({"variant": v, "rounds_measured": len(rounds[v]), "round_ms": round(med, 2),
                     "round_cpu_ms": round(med_cpu, 2), "encode_ms": round(enc, 2),
                     "overhead_pct": round(100 * (med - base) / base, 1),
                     "cpu_overhead_pct": round(100 * (med_cpu - base_cpu) / base_cpu, 1),
                     "encode_pct": round(100 * enc / base, 1), "up_bytes_per_client": up[v]})
        print("  ".join(f"{k}={rows[-1][k]}" for k in COLUMNS), flush=True)
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
