"""Does a long federated run grow in memory from round to round?

Runs R rounds (default 200) of FedAdam on a small MLP over 100 Dirichlet clients on CPU, with validation every
10 rounds and a TensorBoard logger, and records the process's resident set size (RSS, from /proc/self/statm) at
the end of every round. Prints RSS at rounds 20, 100 and R and the relative growth from round 20 to round R
(the reliability issue asks for <= 5 %).

    .venv/bin/python benchmarks/memory.py [--rounds 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAdam
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class RecordRSS(L.Callback):
    def __init__(self) -> None:
        self.rss: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.rss.append(rss_mib())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, 20, generator=g)
    y = (x @ torch.randn(20, 10, generator=g)).argmax(1)
    train = TensorDataset(x[:18_000], y[:18_000])
    train.targets = y[:18_000]
    dm = FederatedDataModule(train, val_dataset=TensorDataset(x[18_000:], y[18_000:]),
                             partitioner=DirichletPartitioner(num_clients=100, alpha=0.5), clients_per_round=10,
                             batch_size=20)
    record = RecordRSS()
    with tempfile.TemporaryDirectory() as logs:
        trainer = FederatedTrainer(
            max_epochs=args.rounds, callbacks=[FedAdam(lr=0.01), record], check_val_every_n_epoch=10,
            logger=L.pytorch.loggers.TensorBoardLogger(logs), enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, accelerator="cpu", devices=1,
        )
        start = time.perf_counter()
        trainer.fit(MLP(), datamodule=dm)
        elapsed = time.perf_counter() - start
    r20, r100, rlast = record.rss[19], record.rss[min(99, args.rounds - 1)], record.rss[-1]
    print(f"rounds={args.rounds}  time={elapsed:.1f}s  ({elapsed / args.rounds * 1e3:.1f} ms/round)")
    print(f"RSS after round 20: {r20:.1f} MiB   round 100: {r100:.1f} MiB   round {args.rounds}: {rlast:.1f} MiB")
    print(f"growth round 20 -> {args.rounds}: {100 * (rlast - r20) / r20:+.2f} %")


if __name__ == "__main__":
    main()
