"""The gather of a round's updates alone, over 2 gloo processes: pickles (``all_gather_object``) vs tensors.

Each of the 2 ranks holds ``--per-rank`` client updates of ``FedAwareCNN`` (``--cnn-arch``, default ``fedavg``:
582,026 float32 parameters) and gathers them on every rank, alternately with

* ``pickle``: what ``gather_updates`` did before issue #33.4 — every update (tensors moved to the CPU) pickled and
  gathered with ``torch.distributed.all_gather_object``, then moved to the device;
* ``tensors``: :func:`lightning_fed.client.distributed.gather_updates` with ``shared_memory=False`` — small pickled
  metadata, the tensors' bytes in one ``all_gather`` of a uint8 buffer;
* ``shm``: ``gather_updates`` as it runs by default on one host — each rank's buffer written to its ``/dev/shm``
  segment and read by the other (:mod:`lightning_fed.client.host_exchange`), one ``all_gather`` of sizes;
* ``allreduce``: one ``all_reduce`` of a float32 vector of the model's size (the floor a summed update would cost).

``--repeats`` interleaved repetitions after 2 warm-ups; rank 0 prints the median and minimum wall time of each
(``time.perf_counter`` around the call, after a barrier) and checks that the three gathers return the same updates
bit for bit. One thread per process (``OMP_NUM_THREADS=1``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/gather_updates.py --per-rank 5 --repeats 20
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from lightning_fed.client.distributed import gather_updates  # noqa: E402
from lightning_fed.client.host_exchange import close_host_exchanges  # noqa: E402
from lightning_fed.client.update import ClientUpdate  # noqa: E402
from lightning_fed.models import FedAwareCNN  # noqa: E402


def pickle_gather(updates: list[ClientUpdate], failures: list, cohort: list[int], device: torch.device):
    """The gather before issue #33.4 (``all_gather_object`` of the updates with their tensors on the CPU)."""

    def move(value, to):
        if isinstance(value, torch.Tensor):
            return value.to(to)
        if isinstance(value, dict):
            return {k: move(v, to) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(move(v, to) for v in value)
        return value

    def on(u: ClientUpdate, to: torch.device) -> ClientUpdate:
        return dataclasses.replace(u, delta=move(u.delta, to), buffers=move(u.buffers, to),
                                   extras=move(u.extras, to), client_lrs=list(u.client_lrs))

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, ([on(u, torch.device("cpu")) for u in updates], failures))
    position = {c: i for i, c in enumerate(cohort)}
    out = sorted((on(u, device) for rank_updates, _ in gathered for u in rank_updates),
                 key=lambda u: position[u.client_id])
    return out, sorted((f for _, fs in gathered for f in fs), key=lambda f: position[f[0]])


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    params = [p.detach() for p in FedAwareCNN(arch=args.cnn_arch).parameters()]
    cohort = list(range(2 * args.per_rank))
    mine = cohort[rank::2]
    g = torch.Generator().manual_seed(rank)
    updates = [ClientUpdate(client_id=c, delta=[torch.randn(p.shape, generator=g) for p in params], num_samples=200,
                            num_steps=10, loss=0.5, client_lr=0.05) for c in mine]
    size = sum(p.numel() for p in params)
    flat = torch.randn(size, generator=g)
    cpu = torch.device("cpu")
    calls = {
        "pickle": lambda: pickle_gather(updates, [], cohort, cpu),
        "tensors": lambda: gather_updates(updates, [], cohort, cpu, shared_memory=False),
        "shm": lambda: gather_updates(updates, [], cohort, cpu),
        "allreduce": lambda: dist.all_reduce(flat.clone()),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for i in range(args.repeats + 2):
        for name, call in (calls.items() if i % 2 == 0 else reversed(calls.items())):
            dist.barrier()
            start = time.perf_counter()
            call()
            if i >= 2:
                times[name].append(time.perf_counter() - start)
    old = calls["pickle"]()
    same = True
    for new in (calls["tensors"](), calls["shm"]()):
        same = same and all(
            a.client_id == b.client_id and all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(a.delta, b.delta))
            for a, b in zip(old[0], new[0])
        ) and len(old[0]) == len(new[0]) == len(cohort)
    if rank == 0:
        print(f"{args.per_rank} updates per rank x 2 ranks (gloo), FedAwareCNN {args.cnn_arch} ({size:,} float32 "
              f"parameters), {args.repeats} interleaved repeats, load average {os.getloadavg()[0]:.2f}")
        for name, values in times.items():
            print(f"{name:>9}: median {1e3 * statistics.median(values):7.1f} ms (min {1e3 * min(values):.1f} ms)")
        print(f"same updates bit for bit: {same}")
    close_host_exchanges()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-rank", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--cnn-arch", choices=("fedavg", "toy", "mlp"), default="fedavg")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=2)


if __name__ == "__main__":
    main()
