"""What asynchronous training holds for its clients in flight (issue #54): 1,000 clients in flight.

:class:`~lightning_fed.asynchronous.AsyncSimulation` trains a client when it reports, from the model version it
started from, so it keeps one model copy per version some client in flight started from (and the K buffered
updates), never a Δ per client in flight. This runs FedBuff (K = 10, concurrency 1,000, population 100,000) with
log-normal devices (``compute_sigma`` 1, ``network_sigma`` 0.5) on a model of ``--params`` float32 parameters
(the clients' training is replaced by a zero update: only what is held is measured) and reports, over the server
steps after the first 100 (the warm-up, while the first dispatches report), the model versions held and their
bytes, the buffer's bytes and the in-flight records' bytes (``sys.getsizeof`` of each record and its numbers),
with and without ``max_staleness``, against 1,000 Δs (one per client in flight).

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/async_memory.py [--params 100000] [--steps 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from lightning_fed.asynchronous import AsyncConfig, AsyncSimulation
from lightning_fed.client.update import ClientUpdate
from lightning_fed.datamodules.devices import ParametricDeviceModel
from lightning_fed.server.composer import ServerComposer
from lightning_fed.server.rules import SGD


def record_bytes(sim: AsyncSimulation) -> int:
    return sum(sys.getsizeof(e) + sum(sys.getsizeof(v) for v in e) for e in sim.in_flight)


def run(params: int, steps: int, max_staleness) -> dict:
    x = [torch.zeros(params)]
    zero = ClientUpdate(0, [torch.zeros(params)], 1, 1, 0.0)
    config = AsyncConfig(concurrency=1000, buffer_size=10, max_staleness=max_staleness, seed=0)
    devices = ParametricDeviceModel(0.01, compute_sigma=1.0, network_sigma=0.5, seed=0)
    sim = AsyncSimulation(config, 100_000, lambda c, p, k: zero, ServerComposer("uniform", None, SGD()).update, devices,
                          lambda c, k: np.full(10, 20))
    held, model_bytes, buffer_bytes, records, taus = [], [], [], [], []
    start = time.perf_counter()
    for i in range(steps):
        step = sim.step(x)
        if i >= 100:
            memory = sim.memory_bytes()
            held.append(len(sim.versions))
            model_bytes.append(memory["versions"])
            buffer_bytes.append(memory["buffer"])
            records.append(record_bytes(sim))
            taus.extend(step.staleness.tolist())
    seconds = time.perf_counter() - start
    return {"max_staleness": max_staleness, "versions_mean": statistics.mean(held), "versions_max": max(held),
            "version_MB_max": max(model_bytes) / 2**20, "buffer_MB_max": max(buffer_bytes) / 2**20,
            "records_kB_max": max(records) / 1024, "staleness_median": statistics.median(taus),
            "dropped": sim.dropped_stale_total, "us_per_update": 1e6 * seconds / (10 * steps + sim.dropped_stale_total)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    per_model = 4 * args.params / 2**20
    print(f"model: {args.params} float32 = {per_model:.3f} MiB; "
          f"1,000 Δs in flight would be {1000 * per_model:.1f} MiB")
    for max_staleness in (None, 20):
        print(run(args.params, args.steps, max_staleness))


if __name__ == "__main__":
    main()
