"""Hugging Face ``datasets`` against a ``TensorDataset`` holding the same data: seconds per federated round.

Three variants train the same clients on the same batches with the same model (issue #32):

  tensor   — a ``TensorDataset`` (the reference speed);
  hf       — the same data as ``datasets.Dataset.from_dict(...)`` (the data module gives it the ``"torch"``
             format): today's path, its columns held as tensors once (``HFTensorColumns``) and sliced per batch;
  hf-arrow — the same Hugging Face dataset read through a ``DataLoader`` (one Arrow read and formatting per batch:
             the path before #32, forced with ``HF_TENSOR_LIMIT_BYTES = 0``).

Each variant runs in its own process (one torch thread), interleaved ``--repeats`` times (tensor, hf, hf-arrow,
tensor, ...); the first round of each run is warm-up and excluded; the median s/round over the remaining rounds of
all repeats is printed, with the ratio to ``tensor`` and the machine's 1-minute load average before and after.

Workloads: ``--model mlp`` — the trial's small MLP (784-256-10) on 60,000 Fashion-MNIST-shaped images (1 × 28 × 28), 100 IID
clients, 10 per round, 1 local epoch, batch 20; ``--model lstm`` — Shakespeare-sized data (55,491 sequences of 80
tokens, the char-LSTM of Reddi et al.), 1,154 clients, 10 per round, batch 4.

    .venv/bin/python benchmarks/hf_datasets.py --model mlp --rounds 6 --repeats 3
    .venv/bin/python benchmarks/hf_datasets.py --model lstm --rounds 3 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("tensor", "hf", "hf-arrow")


def _run(model: str, variant: str, rounds: int) -> list[float]:
    """One run in this process: the per-round wall times (s) of ``rounds`` rounds."""
    import lightning as L
    import numpy as np
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import TensorDataset

    import datasets
    import lightning_fed.datamodules.federated as federated
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
    from lightning_fed.models import ShakespeareLSTM

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if model == "mlp":
        x = rng.random((60_000, 1, 28, 28), dtype=np.float32)  # images as a Hugging Face dataset holds them
        y = rng.integers(0, 10, 60_000)
        clients, batch = 100, 20
    else:
        x = rng.integers(1, 90, (55_491, 80))
        y = np.roll(x, -1, axis=1)
        clients, batch = 1154, 4

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
                        if model == "mlp" else ShakespeareLSTM())

        def training_step(self, b, i):
            xb, yb = (b["x"], b["y"]) if isinstance(b, dict) else b
            if model == "mlp":
                return F.cross_entropy(self.net(xb), yb)
            logits = self.net(xb)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if variant == "tensor":
        data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    else:
        data = datasets.Dataset.from_dict({"x": x, "y": y})
        if variant == "hf-arrow":
            federated.HF_TENSOR_LIMIT_BYTES = 0
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=clients, seed=0), clients_per_round=10,
                             batch_size=batch, local_epochs=1)

    class Clock(Callback):
        times: list[float] = []

        def on_train_epoch_start(self, trainer, module):
            self.t = time.perf_counter()

        def on_train_epoch_end(self, trainer, module):
            self.times.append(time.perf_counter() - self.t)

    clock = Clock()
    FederatedTrainer(max_epochs=rounds, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[clock]).fit(Net(), datamodule=dm)
    return clock.times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "lstm"), default="mlp")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)  # one run in this process (internal)
    args = parser.parse_args()
    if args.only:
        print(json.dumps(_run(args.model, args.only, args.rounds)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--rounds", str(args.rounds),
                                  "--only", variant], env=env, check=True, capture_output=True, text=True).stdout
            times[variant] += json.loads(out.strip().splitlines()[-1])[1:]  # the first round is warm-up
    load_after = os.getloadavg()[0]
    ref = statistics.median(times["tensor"])
    print(f"model {args.model}, {args.rounds} rounds x {args.repeats} repeats, 1 thread; "
          f"1-min load average {load_before:.2f} before, {load_after:.2f} after")
    for variant in VARIANTS:
        med = statistics.median(times[variant])
        print(f"  {variant:9s} {med:8.3f} s/round  ({med / ref:5.2f}x tensor; min {min(times[variant]):.3f})")


if __name__ == "__main__":
    main()
