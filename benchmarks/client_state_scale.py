"""Per-client state at scale (issue #42, item 3): SCAFFOLD's c_i in the memory store vs the disk store vs FedAvg.

SCAFFOLD on N clients (default 100,000) with a ~1M-parameter MLP (16 → 1000 → 1000 → 1, float32: 1,019,001
parameters, a c_i row of 4.08 MB), cohort C (default 10), R rounds (default 20), a checkpoint every round
(``ModelCheckpoint(every_n_epochs=1, save_top_k=1)``: one save per round, the previous file deleted). The model is
cheap to train: one sample per client, one local step. Each variant runs in its own process; the script reports, per
variant,

* the process's RSS at the end of the first and the last round, its peak RSS (``ru_maxrss``) and both above
  FedAvg's (same run without per-client state);
* the checkpoint save time per round (``ModelCheckpoint._save_checkpoint``: the state dict built and written
  atomically), first and last rounds, and the checkpoint file's size;
* the seconds per round and, for the disk store, the bytes of row files left on disk.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/client_state_scale.py                     # all three, 100k clients
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/client_state_scale.py --clients 1000 --rounds 3   # a quick look
    .venv/bin/python benchmarks/client_state_scale.py --only disk --workdir /tmp/cs          # one variant

Targets (issue #42): the disk store's RSS < 1 GB above FedAvg's, its save time not growing with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

VARIANTS = ("fedavg", "memory", "disk")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_variant(variant: str, clients: int, cohort: int, rounds: int, workdir: str) -> dict:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch.utils.data import TensorDataset

    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import SCAFFOLD, FedAvg
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    torch.set_num_threads(1)

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000),
                                           torch.nn.ReLU(), torch.nn.Linear(1000, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    saves: list[float] = []

    class TimedCheckpoint(ModelCheckpoint):
        def _save_checkpoint(self, trainer, filepath):
            start = time.perf_counter()
            super()._save_checkpoint(trainer, filepath)
            saves.append(time.perf_counter() - start)

    rss: list[float] = []
    ends: list[float] = []

    class RoundEnd(Callback):
        def on_train_epoch_end(self, trainer, pl_module):  # after the checkpoint callback (order of `callbacks`)
            rss.append(_rss_mb())
            ends.append(time.perf_counter())

    root = os.path.join(workdir, variant)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(clients, 16, generator=g), torch.randn(clients, generator=g))
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=clients, seed=0), clients_per_round=cohort,
                             batch_size=1, local_epochs=1)
    server = FedAvg() if variant == "fedavg" else SCAFFOLD(client_state_store=variant)
    torch.manual_seed(0)
    model = MLP()
    saver = TimedCheckpoint(dirpath=os.path.join(root, "ckpt"), every_n_epochs=1, save_top_k=1)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server, saver, RoundEnd()], default_root_dir=root,
                               logger=False, enable_progress_bar=False, enable_model_summary=False,
                               num_sanity_val_steps=0, accelerator="cpu", devices=1)
    start_rss = _rss_mb()
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    ckpts = [os.path.join(root, "ckpt", f) for f in os.listdir(os.path.join(root, "ckpt"))]
    store = os.path.join(root, "client_state")
    row_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs
                    if f.endswith(".row")) if os.path.isdir(store) else 0
    rounds_s = [b - a for a, b in zip([start] + ends[:-1], ends)]
    return {"variant": variant, "clients": clients, "cohort": cohort, "rounds": rounds,
            "params": sum(p.numel() for p in model.parameters()),
            "rss_start_mb": start_rss, "rss_round_mb": rss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "save_s": saves, "round_s": rounds_s, "checkpoint_mb": max(os.path.getsize(c) for c in ckpts) / 2**20,
            "row_files_mb": row_bytes / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--cohort", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", choices=VARIANTS, help="run one variant in this process and print its JSON")
    parser.add_argument("--workdir", default="/tmp/client_state_scale", help="run directories (deleted first)")
    parser.add_argument("--json", help="write all results to this file")
    args = parser.parse_args()
    if args.only:
        print("RESULT " + json.dumps(run_variant(args.only, args.clients, args.cohort, args.rounds, args.workdir)))
        return
    results = {}
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--only", variant, "--clients", str(args.clients), "--cohort",
                              str(args.cohort), "--rounds", str(args.rounds), "--workdir", args.workdir],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode or not lines:
            sys.exit(f"{variant} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        results[variant] = json.loads(lines[-1][7:])
    base = results["fedavg"]
    load = open("/proc/loadavg").read().split()[:3]
    print(f"N={args.clients} clients, cohort {args.cohort}, {args.rounds} rounds, {base['params']:,} parameters; "
          f"loadavg {' '.join(load)}")
    print(f"{'variant':8} {'RSS r1':>8} {'RSS last':>9} {'peak':>8} {'last-FedAvg':>12} {'peak-FedAvg':>12} "
          f"{'save r1-3 (ms)':>16} {'save last 3 (ms)':>17} {'ckpt MB':>8} {'rows MB':>8} {'s/round':>8}")
    for name, r in results.items():
        first = "/".join(f"{1000 * s:.0f}" for s in r["save_s"][:3])
        last = "/".join(f"{1000 * s:.0f}" for s in r["save_s"][-3:])
        med = sorted(r["round_s"])[len(r["round_s"]) // 2]
        print(f"{name:8} {r['rss_round_mb'][0]:8.0f} {r['rss_round_mb'][-1]:9.0f} {r['peak_rss_mb']:8.0f} "
              f"{r['rss_round_mb'][-1] - base['rss_round_mb'][-1]:12.0f} {r['peak_rss_mb'] - base['peak_rss_mb']:12.0f} "
              f"{first:>16} {last:>17} {r['checkpoint_mb']:8.1f} {r['row_files_mb']:8.1f} {med:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
