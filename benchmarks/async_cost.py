"""What the asynchronous mode costs per client update against synchronous rounds on the same clients (issue #54).

Both fits train the same model on the same data module (N clients, the same local work, a device model): the
synchronous one ``rounds`` rounds of ``C`` clients through the SequentialExecutor, the asynchronous one ``rounds``
server steps of K = C buffered updates with ``concurrency`` = C in flight (s ≡ 1, nothing dropped), so both train
C · rounds clients. Runs are interleaved (sync, async, sync, ...); the figure is the median process CPU time
(``time.process_time``, one thread: on a loaded machine the wall time measures the other processes too) per client
update of each, and their ratio, with the wall-time medians beside them and the median (and quartiles) of the
CPU ratios of the repeats' side-by-side pairs (less sensitive to the load drifting between repeats); the 1-minute load average is printed with
it (a shared machine's figures).

Usage: ``python benchmarks/async_cost.py [--repeats 5] [--rounds 20] [--clients 10] [--population 100]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import lightning as L
import torch
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.asynchronous import AsyncConfig, StalenessWeighting
from lightning_fed.callbacks import FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.devices import ParametricDeviceModel


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch[0]).squeeze(-1), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(asynchronous: bool, rounds: int, clients: int, population: int) -> tuple[float, float]:
    """CPU and wall seconds per client update of one fit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(population * 20, 20, generator=g)
    data = TensorDataset(x, x.sum(1))
    config = AsyncConfig(concurrency=clients, buffer_size=clients, staleness=StalenessWeighting("constant")) \
        if asynchronous else None
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(population, seed=0), clients_per_round=clients,
                             batch_size=10, device_model=ParametricDeviceModel(0.01, compute_sigma=1.0),
                             asynchronous=config)
    torch.manual_seed(0)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[FedAvg(lr=1.0)], logger=False, accelerator="cpu",
                               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.fit(MLP(), datamodule=dm)
    return (time.process_time() - cpu) / (rounds * clients), (time.perf_counter() - wall) / (rounds * clients)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--population", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    fit(False, 2, args.clients, args.population)  # warm-up (imports, first-call set-up), not timed
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for asynchronous in (False, True):
            times[asynchronous].append(fit(asynchronous, args.rounds, args.clients, args.population))
    (sync_cpu, sync_wall), (asyn_cpu, asyn_wall) = (
        tuple(statistics.median(column) for column in zip(*times[a])) for a in (False, True))
    print(f"load (1 min) {os.getloadavg()[0]:.2f}; {args.rounds} x {args.clients} client updates, "
          f"{args.repeats} interleaved repeats")
    print(f"synchronous  {sync_cpu * 1e3:.3f} ms CPU / update  (wall {sync_wall * 1e3:.3f} ms)")
    print(f"asynchronous {asyn_cpu * 1e3:.3f} ms CPU / update  (wall {asyn_wall * 1e3:.3f} ms)  "
          f"ratio CPU {asyn_cpu / sync_cpu:.3f}, wall {asyn_wall / sync_wall:.3f}")
    paired = sorted(a[0] / s[0] for s, a in zip(times[False], times[True]))  # each repeat's pair, run side by side
    print(f"CPU ratio of each interleaved pair: median {statistics.median(paired):.3f}, "
          f"quartiles {paired[len(paired) // 4]:.3f} .. {paired[(3 * len(paired)) // 4]:.3f}")


if __name__ == "__main__":
    main()
