"""What the simulated clock costs (issue #53): per round at cohort 10 against a Shakespeare round, and O(cohort) at a
million clients.

(a) **Cohort 10, Shakespeare's configuration** (Reddi et al. 2021: 10 clients a round, batch 4, 1 local epoch,
``ShakespeareLSTM``): the clock's whole work in a round of a run — the payload of the federated parameters
(:func:`lightning_fed.clock.payload_bytes`), :meth:`SimulatedTime.start_round
<lightning_fed.datamodules.simulated_time.SimulatedTime.start_round>` (every planned client's local steps read from
``client_batches``, the devices of a log-normal :class:`~lightning_fed.datamodules.devices.ParametricDeviceModel`
with slow clients, :func:`~lightning_fed.clock.plan_round` with a deadline) and ``end_round`` — on a data module of
715 clients of 57 samples (the mean of Shakespeare's clients in the committed FedAvg run: 142 local steps of batch 4
over 10 clients in its first round), against the median ``round_time_s`` of that run
(``benchmarks/results/reddi_shakespeare/shakespeare_fedavg.csv``, its 1,500 rounds).

(b) **A million clients**: :func:`~lightning_fed.clock.plan_round` with the devices of the cohort (``profiles``)
for cohorts of 10, 100 and 1,000 drawn from populations of 10^3 and 10^6 clients (ids up to N − 1): the time
depends on the cohort, not on N.

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/clock_cost.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from lightning_fed.clock import payload_bytes, plan_round
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.devices import ParametricDeviceModel

RESULTS = Path(__file__).resolve().parent / "results" / "reddi_shakespeare" / "shakespeare_fedavg.csv"
DEVICES = dict(seconds_per_sample=0.05, compute_sigma=0.8, network_sigma=0.8, slow_fraction=0.1, slowdown=5.0,
               seed=0)


def shakespeare_round_seconds() -> float:
    """The median ``round_time_s`` of the committed Shakespeare FedAvg run (1,500 rounds)."""
    with open(RESULTS, newline="") as f:
        return statistics.median(float(row["round_time_s"]) for row in csv.DictReader(f))


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cohort_10_round(repeats: int) -> float:
    """(a): seconds of the clock's work in one round, median over ``repeats`` rounds."""
    from lightning_fed.models import ShakespeareLSTM

    params = [p for p in ShakespeareLSTM().parameters() if p.requires_grad]
    dm = FederatedDataModule(TensorDataset(torch.zeros(715 * 57, 1)), partitioner=IIDPartitioner(715, seed=0),
                             clients_per_round=10, batch_size=4, device_model=ParametricDeviceModel(**DEVICES),
                             round_deadline=60.0)
    dm.setup()
    timing, rounds = dm.simulated_time, iter(range(10**9))

    def one_round():
        t = next(rounds)
        nbytes = payload_bytes(params)
        _, plan = timing.start_round(dm, dm.select_cohort(t), t, nbytes, nbytes)
        timing.end_round(plan)

    return _median_seconds(one_round, repeats)


def million_clients(cohort: int, population: int, repeats: int) -> tuple[float, float]:
    """(b): seconds of ``profiles`` and of ``plan_round`` (apart) for one cohort drawn from ``population`` clients
    (each round's ids and local steps drawn before the timer)."""
    model = ParametricDeviceModel(**DEVICES)
    rng = np.random.default_rng(0)
    rounds = [(rng.choice(population, size=cohort, replace=False), [np.full(int(k), 4) for k in
                                                                  rng.integers(5, 30, cohort)])
              for _ in range(repeats + 1)]
    profiles = {}
    it = iter(range(10**9))

    def devices():
        t = next(it)
        profiles[t] = model.profiles(rounds[t][0])

    it2 = iter(range(10**9))

    def plan():
        t = next(it2)
        ids, steps = rounds[t]
        plan_round(0.0, ids, steps, 3.3e6, 3.3e6, profiles[t], round_deadline=60.0, policy="partial",
                   clients_per_round=max(1, int(cohort * 0.8)))

    return _median_seconds(devices, repeats), _median_seconds(plan, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock, round_s = cohort_10_round(args.repeats), shakespeare_round_seconds()
    print(f"(a) cohort 10: the clock's work {clock * 1e3:.3f} ms a round; Shakespeare FedAvg round (median of "
          f"{RESULTS.name}) {round_s:.3f} s: {100 * clock / round_s:.3f} % of a round")
    print("(b) ms a round (median): the cohort's devices (profiles), then plan_round")
    print(f"{'cohort':>8} {'N = 1e3':>20} {'N = 1e6':>20}")
    for cohort in (10, 100, 1000):
        row = [million_clients(cohort, n, max(5, args.repeats // 10)) if cohort < n else (float("nan"),) * 2
               for n in (1000, 1_000_000)]
        print(f"{cohort:>8} " + " ".join(f"{p * 1e3:>9.3f} {q * 1e3:>9.3f} " for p, q in row))

if __name__ == "__main__":
    main()
