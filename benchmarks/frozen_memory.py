"""Peak memory of a federated fit whose model is mostly frozen, against plain Lightning on the same steps (issue #42).

The model: a frozen 10.24M-parameter embedding (40,000 × 256, ``requires_grad=False``, handed to the optimizer with
the rest, as a user would write ``SGD(self.parameters())``) and a small trained head (256 → 64 → 10, 17k
parameters), classifying sequences of 16 token ids by their mean embedding. Each measurement runs in a fresh
process: it builds the model and the data, resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), fits, and
reports the peak resident set size above the RSS at the fit's start (``VmHWM − VmRSS`` before fit, MiB):

* ``plain``: ``lightning.Trainer`` on the same data module (trained centrally), ``max_steps`` = the federated run's
  number of client optimizer steps;
* ``sequential`` / ``vectorized``: ``FederatedTrainer`` with FedAdam, R rounds of a cohort of C clients (the
  client executor named).

    .venv/bin/python benchmarks/frozen_memory.py [--rounds 3] [--cohort 10] [--threads 1]
    PYTHONPATH=<another checkout> .venv/bin/python benchmarks/frozen_memory.py   # the same case on other code

Prints one line per mode (with the number of values in FedAdam's state) and the ratio of each federated mode's peak
to plain Lightning's (the issue's target: ≤ 2×).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

VOCAB, DIM, HIDDEN, CLASSES, LENGTH = 40_000, 256, 64, 10, 16
NUM_CLIENTS, SAMPLES, BATCH = 50, 3_200, 16  # 64 samples = 4 local steps a client


def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB -> MiB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measure(mode: str, rounds: int, cohort: int, threads: int) -> dict:
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset

    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    torch.set_num_threads(threads)

    class FrozenEmbeddingClassifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = torch.nn.Embedding(VOCAB, DIM)
            self.embedding.requires_grad_(False)
            self.head = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(),
                                            torch.nn.Linear(HIDDEN, CLASSES))

        def training_step(self, batch, batch_idx):
            tokens, labels = batch
            return F.cross_entropy(self.head(self.embedding(tokens).mean(-2)), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=g)
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
    dm = FederatedDataModule(TensorDataset(tokens, labels), partitioner=IIDPartitioner(NUM_CLIENTS, seed=0),
                             clients_per_round=cohort, batch_size=BATCH, seed=0)
    torch.manual_seed(0)
    model = FrozenEmbeddingClassifier()
    steps = rounds * cohort * (SAMPLES // NUM_CLIENTS // BATCH)
    common = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  accelerator="cpu", devices=1, num_sanity_val_steps=0)
    with tempfile.TemporaryDirectory() as root:
        if mode == "plain":
            trainer = L.Trainer(max_steps=steps, max_epochs=-1, limit_val_batches=0, default_root_dir=root, **common)
        else:
            from lightning_fed import FederatedTrainer
            from lightning_fed.callbacks import FedAdam

            trainer = FederatedTrainer(max_epochs=rounds, callbacks=[FedAdam(lr=0.01)], client_executor=mode,
                                       default_root_dir=root, **common)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
        start = _status("VmRSS")
        trainer.fit(model, datamodule=dm)
        peak = _status("VmHWM")
    params = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    server = getattr(trainer.fit_loop, "server_optimizer", None)
    state = None if server is None else sum(t.numel() for v in server.state.values() for t in v)
    return {"mode": mode, "start_mib": round(start, 1), "peak_above_start_mib": round(peak - start, 1),
            "steps": int(trainer.global_step), "parameters": params, "trained": trained, "server_state": state}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cohort", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="plain,sequential,vectorized")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one mode in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_measure(args.one, args.rounds, args.cohort, args.threads)))
        return
    results = {}
    for mode in args.modes.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--one", mode, "--rounds", str(args.rounds), "--cohort", str(args.cohort),
             "--threads", str(args.threads)], capture_output=True, text=True, env=os.environ.copy(),
        )
        if out.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[mode]
        print(f"{mode:>10}: peak RSS above the fit's start {r['peak_above_start_mib']:8.1f} MiB "
              f"(start {r['start_mib']:.1f} MiB, {r['steps']} optimizer steps, {r['trained']:,} of "
              f"{r['parameters']:,} parameters trained"
              + (f"; FedAdam state {r['server_state']:,} numbers" if r["server_state"] is not None else "") + ")",
              flush=True)
    plain = results.get("plain")
    if plain and plain["peak_above_start_mib"] > 0:
        for mode, r in results.items():
            if mode != "plain":
                print(f"{mode:>10}: {r['peak_above_start_mib'] / plain['peak_above_start_mib']:.2f}x plain Lightning")


if __name__ == "__main__":
    main()
