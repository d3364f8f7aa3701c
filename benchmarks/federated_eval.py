"""Cost of federated evaluation: K clients evaluated one by one vs one central evaluation of the same samples.

Both run inside ``trainer.validate`` on the same model: the central evaluation is Lightning's validation loop over
the union of the K clients' evaluation samples (``eval_batch_size`` batches); the federated one is
:func:`lightning_fed.evaluation.evaluate_clients` on those K clients (their own batches, sliced directly). Repeats
are interleaved (central, federated, central, ...) and medians reported, with the machine's load average
(``os.getloadavg``) before and after.

    PYTHONPATH=$PWD python benchmarks/federated_eval.py --clients 100 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.evaluation import evaluate_clients


class CharModel(L.LightningModule):
    """Shakespeare-sized next-character model: Embedding(8) -> LSTM(hidden) -> 90 logits."""

    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(90, 8)
        self.lstm = torch.nn.LSTM(8, hidden, num_layers=2, batch_first=True)
        self.out = torch.nn.Linear(hidden, 90)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.out(self.lstm(self.emb(x))[0])
        self.log("val_loss", F.cross_entropy(logits.reshape(-1, 90), y.reshape(-1)))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples-per-client", type=int, default=13, help="mean; sizes vary 1..2·mean")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 2 * args.samples_per_client, size=args.clients) + 1  # >= 2: each has eval data
    ids = np.repeat(np.arange(args.clients), sizes)
    n = ids.size
    tokens = torch.from_numpy(rng.integers(0, 90, size=(n, 81)))
    train = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    train.client_id = ids
    # all samples are evaluation samples of their client: a natural split onto the same dataset
    dm = _AllEvalDataModule(train, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=1,
                            eval_clients_per_round="all", eval_batch_size=args.eval_batch_size)
    dm.setup()
    model = CharModel(args.hidden)
    trainer = FederatedTrainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                               enable_checkpointing=False, accelerator="cpu", devices=1)
    timer = _Timer(dm)
    trainer.callbacks.append(timer)
    dm.eval_clients_per_round = None  # the trainer's own federated evaluation off: timed by _Timer instead
    load_before = os.getloadavg()
    central, federated = [], []
    for _ in range(args.repeats):
        timer.mode = "central"
        trainer.validate(model, datamodule=dm, verbose=False)
        central.append(timer.central)
        timer.mode = "federated"
        trainer.validate(model, datamodule=dm, verbose=False)
        federated.append(timer.federated)
    load_after = os.getloadavg()
    c, f = statistics.median(central), statistics.median(federated)
    print(f"clients={args.clients} samples={n} eval_batch_size={args.eval_batch_size} hidden={args.hidden} "
          f"threads={torch.get_num_threads()}")
    print(f"central   median {c * 1e3:.1f} ms  runs {[round(t * 1e3, 1) for t in central]}")
    print(f"federated median {f * 1e3:.1f} ms  runs {[round(t * 1e3, 1) for t in federated]}")
    pairs = [fi / ci for fi, ci in zip(federated, central)]
    print(f"ratio federated/central = {f / c:.3f} (ratio of medians); per interleaved pair "
          f"{[round(r, 2) for r in pairs]}, median {statistics.median(pairs):.3f}")
    print(f"load average before {load_before} after {load_after}")


class _AllEvalDataModule(FederatedDataModule):
    def natural_eval_split(self):
        return self.train_dataset, self.train_dataset.client_id

    def val_dataloader(self):
        union = np.concatenate([self.client_eval_indices(c) for c in self.eval_client_ids()]).tolist()
        return DataLoader(Subset(self.train_dataset, union), batch_size=self.eval_batch_size)


class _Timer(L.Callback):
    """Times the central validation loop (batches) or federated evaluation of all clients (at epoch end)."""

    def __init__(self, dm) -> None:
        self.dm, self.mode, self.central, self.federated = dm, "central", 0.0, 0.0

    def on_validation_epoch_start(self, trainer, pl_module):
        self._start = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        if self.mode == "central":
            self.central = time.perf_counter() - self._start
            return
        start = time.perf_counter()
        evaluate_clients(trainer, self.dm, self.dm.eval_client_ids(), 0)
        self.federated = time.perf_counter() - start


if __name__ == "__main__":
    main()
