"""Clients across processes on one machine: 1 process vs 2 DDP processes on CPU (gloo), same weights.

The workload of ``overhead.py`` (synthetic Fashion-MNIST-shaped data, IID over N clients, cohort C, E local epochs,
batch B, client SGD, FedAvg; ``--model cnn --cnn-arch fedavg|mlp`` or ``--model lstm``) is trained by
``FederatedTrainer(accelerator="cpu", devices=D, strategy="ddp" if D > 1)`` for D = 1 and D = 2, every process with
``--threads`` threads (default 1, so D = 2 uses both cores). Each rank trains its share of the cohort (balanced by
sample count) and the updates are gathered on every rank, so the weights must equal the one-process run's.

Each configuration runs in its own ``python`` process tree (Lightning's subprocess launcher starts rank 1), the two
are interleaved ``--repeats`` times, every run's first round (warm-up) is excluded, and the median wall time per
round (rank 0, the whole round including the all-gather) is reported with the speed-up and the machine's load.

    .venv/bin/python benchmarks/ddp_speedup.py --model cnn --rounds 5 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    import overhead  # noqa: E402  (the shared workload)
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAvg

    dataset = overhead.make_dataset(args)
    dm = overhead.make_datamodule(args, dataset)
    model = overhead.make_model(args)
    from lightning_fed.distributed import FederatedDDPStrategy

    timer = overhead._RoundTimer(torch.device(args.accelerator))
    per_device = args.processes_per_device
    strategy = (FederatedDDPStrategy(processes_per_device=per_device) if per_device > 1
                else "ddp" if args.devices > 1 else "auto")
    executor = "sequential"
    if args.executor == "vectorized":
        from lightning_fed import VectorizedExecutor

        executor = VectorizedExecutor(on_unsupported="raise")
    trainer = FederatedTrainer(
        max_epochs=args.rounds, callbacks=[FedAvg(lr=1.0), timer], accelerator=args.accelerator, devices=args.devices,
        client_executor=executor,
        strategy=strategy, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        default_root_dir=tempfile.gettempdir() + "/lightning_fed_ddp_bench",
    )
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        weights = overhead.flat(model)
        torch.save(weights, args.out + ".pt")
        Path(args.out).write_text(json.dumps({"wall": timer.result.wall, "cpu": timer.result.cpu,
                                              "world_size": trainer.world_size}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "lstm"), default="cnn")
    p.add_argument("--cnn-arch", choices=("fedavg", "toy", "mlp", "mlp256"), default="fedavg")
    p.add_argument("--channels-last", action="store_true", help="FedAwareCNN(channels_last=True) (overhead.py's flag)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--samples-per-client", type=int, default=None)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1, help="threads per process (default 1)")
    p.add_argument("--executor", choices=("sequential", "vectorized"), default="sequential",
                   help="each rank's client executor (vectorized: VectorizedExecutor(on_unsupported='raise'))")
    p.add_argument("--devices", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    # the worker's accelerator ("cpu", or "cuda" with one GPU per rank; benchmarks/gpu_suite.py runs the worker)
    p.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu", help=argparse.SUPPRESS)
    # the worker's FederatedDDPStrategy(processes_per_device=k) on --devices devices (gpu_suite.py: k ranks on one GPU)
    p.add_argument("--processes-per-device", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.samples_per_client is None:
        args.samples_per_client = {"cnn": 200, "lstm": 40}[args.model]
    if args.devices is not None:
        return worker(args)

    import torch

    results: dict[int, list[dict]] = {1: [], 2: []}
    weights: dict[int, torch.Tensor] = {}
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for devices in ((1, 2) if repeat % 2 == 0 else (2, 1)):
                out = os.path.join(tmp, f"d{devices}_r{repeat}.json")
                cmd = [sys.executable, __file__, *sys.argv[1:], "--devices", str(devices), "--out", out]
                env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
                loads.append(os.getloadavg()[0])
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                results[devices].append(json.loads(Path(out).read_text()))
                weights[devices] = torch.load(out + ".pt")
    rounds = {d: [w for r in runs for w in r["wall"][1:]] for d, runs in results.items()}
    med = {d: statistics.median(v) for d, v in rounds.items()}
    diff = float((weights[1] - weights[2]).abs().max())
    print(f"workload: {args.model}{'/' + args.cnn_arch if args.model == 'cnn' else ''}, N={args.clients}, "
          f"C={args.cohort}, E={args.epochs}, B={args.batch}, {args.samples_per_client} samples/client, "
          f"R={args.rounds} x {args.repeats} repeats, {args.threads} thread(s) per process, {args.executor} executor")
    print(f"load average while starting the runs: {', '.join(f'{x:.2f}' for x in loads)}")
    for d in (1, 2):
        print(f"devices={d}: median {med[d]:.3f} s/round (min {min(rounds[d]):.3f}, {len(rounds[d])} rounds)")
    print(f"speed-up 2 processes vs 1: {med[1] / med[2]:.2f}x; max |w_1 - w_2| after {args.rounds} rounds: {diff:.3g}")


if __name__ == "__main__":
    main()
