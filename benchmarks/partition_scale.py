"""How long and how much memory does a natural partition with a million clients take?

Builds a tiny ``TensorDataset`` (one uint8 feature per sample) of ``--samples`` samples carrying a ``client_id``
attribute (int64 ``[samples]``) with ``--clients`` distinct ids (every id has at least one sample; the rest are drawn
uniformly, so client sizes are 1 + Binomial — about 1 + Poisson(samples/clients − 1)), then times

* ``NaturalIdPartitioner().partition(n, ids=...)`` alone (one stable argsort),
* ``FederatedDataModule.setup()`` for the same partition (reads the column, partitions, validates),
* ``sample_clients(round)`` (cohort sampling, ``--cohort`` of N, averaged over ``--rounds`` rounds),
* ``client_batches`` / ``client_dataloader`` for sampled clients and ``Partition.stats()``,

and reports the partition's array bytes (CSR ``indices`` + ``offsets`` + ``client_names``) and the RSS it costs
(current RSS delta from ``/proc/self/statm`` and peak RSS delta from ``getrusage``). Repeated ``--repeats`` times,
median reported. With ``--labels K`` the dataset also has ``targets`` (int64, drawn uniformly from ``0 .. K-1``,
seeded by ``--seed``), so the ``eval_fraction`` split is stratified by label.

Example::

    .venv/bin/python benchmarks/partition_scale.py --clients 1000000 --samples 10000000
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner  # noqa: E402

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    """Current resident set size (MiB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2**20


def peak_rss_mib() -> float:
    """Peak resident set size so far (MiB; ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def make_dataset(num_samples: int, num_clients: int, seed: int, num_labels: int = 0) -> TensorDataset:
    rng = np.random.default_rng(seed)
    ids = np.concatenate([np.arange(num_clients, dtype=np.int64),
                          rng.integers(0, num_clients, num_samples - num_clients, dtype=np.int64)])
    rng.shuffle(ids)
    dataset = TensorDataset(torch.zeros(num_samples, 1, dtype=torch.uint8))
    dataset.client_id = torch.from_numpy(ids)
    if num_labels:  # labels of the samples: the eval_fraction split is then stratified
        dataset.targets = torch.from_numpy(np.random.default_rng([seed, 0x1AB]).integers(0, num_labels, num_samples))
    return dataset


def partition_bytes(partition) -> int:
    total = partition.indices.nbytes + partition.offsets.nbytes
    if partition.client_names is not None:
        total += partition.client_names.nbytes
    if partition.labels is not None:
        total += partition.labels.nbytes
    return total


def _per_call(fn, calls: int) -> float:
    """Mean seconds per call of ``fn(i)`` over ``calls`` calls."""
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


def population_steps(scales: list[int], per_client: int, cohort: int, rounds: int, seed: int,
                     num_labels: int = 0) -> None:
    """Time every population-wide step of ``FederatedDataModule`` at each population size (see the module doc)."""
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()}; "
          f"{f'{num_labels} labels (stratified split)' if num_labels else 'no labels'}")
    print("| clients | samples | setup() | setup(), eval_fraction=0.2 (RSS kept; CPU time) | eval_client_ids | "
          "select_eval_clients(10) | fixed_size cohort | poisson cohort | poisson cohort, poisson_draws='binomial' | "
          "sweep cohort: first round / others |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in scales:
        dataset = make_dataset(n * per_client, n, seed, num_labels)

        def module(**kwargs):
            return FederatedDataModule(dataset, partitioner=NaturalIdPartitioner(), clients_per_round=cohort, seed=0,
                                       **kwargs)

        dm = module()
        start = time.perf_counter()
        dm.setup()
        plain_s = time.perf_counter() - start
        fixed_s = _per_call(dm.sample_clients, rounds)
        del dm
        gc.collect()
        before = rss_mib()
        dm = module(eval_fraction=0.2, eval_clients_per_round=10)
        start, start_cpu = time.perf_counter(), time.process_time()
        dm.setup()
        eval_s, eval_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        eval_rss = rss_mib() - before
        ids_s = _per_call(lambda i: dm.eval_client_ids(), rounds)
        select_s = _per_call(dm.select_eval_clients, rounds)
        del dm
        dm = module(cohort_sampling="poisson")
        dm.setup()
        poisson_s = _per_call(dm.sample_clients, rounds)
        dm = module(cohort_sampling="poisson", poisson_draws="binomial")
        dm.setup()
        binomial_s = _per_call(dm.sample_clients, rounds)
        dm = module(cohort_sampling="sweep_then_uniform")
        dm.setup()
        start = time.perf_counter()
        dm.sample_clients(0)
        sweep_first_s = time.perf_counter() - start
        sweep_s = _per_call(lambda i: dm.sample_clients(1 + i % (dm.sweep_rounds - 1)), rounds)
        del dm
        gc.collect()
        ms = lambda t: f"{t * 1e3:.3f} ms"  # noqa: E731
        print(f"| {n:,} | {n * per_client:,} | {plain_s:.2f} s | {eval_s:.2f} s (+{eval_rss:.0f} MiB; CPU "
              f"{eval_cpu:.2f} s) | {ms(ids_s)} | {ms(select_s)} | {ms(fixed_s)} | {ms(poisson_s)} | {ms(binomial_s)} | {ms(sweep_first_s)} / "
              f"{ms(sweep_s)} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=1_000_000, help="distinct natural ids N (default 1,000,000)")
    p.add_argument("--samples", type=int, default=10_000_000, help="samples (default 10,000,000)")
    p.add_argument("--cohort", type=int, default=10, help="clients per round for sample_clients (default 10)")
    p.add_argument("--rounds", type=int, default=200, help="rounds to average sample_clients over (default 200)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of the partition timings (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scales", default=None,
                   help="comma-separated population sizes: time every population-wide step at each (see the doc)")
    p.add_argument("--samples-per-client", type=int, default=10, help="with --scales: mean samples per client (10)")
    p.add_argument("--labels", type=int, default=0,
                   help="K >= 1: give the samples labels drawn from 0..K-1 (seeded), so the eval_fraction split is "
                        "stratified (default 0: no labels)")
    args = p.parse_args(argv)
    if args.labels < 0:
        p.error(f"--labels must be 0 (no labels) or a number of classes >= 1, got {args.labels}")
    if args.scales:
        population_steps([int(v) for v in args.scales.split(",")], args.samples_per_client, args.cohort,
                         args.rounds, args.seed, args.labels)
        return
    if args.clients < 1 or args.samples < args.clients:
        p.error("need 1 <= --clients <= --samples")
    if args.cohort < 1 or args.cohort > args.clients or args.rounds < 1 or args.repeats < 1:
        p.error("need 1 <= --cohort <= --clients, --rounds >= 1 and --repeats >= 1")

    base_rss, base_peak = rss_mib(), peak_rss_mib()
    start = time.perf_counter()
    dataset = make_dataset(args.samples, args.clients, args.seed, args.labels)
    build_s = time.perf_counter() - start
    data_rss, data_peak = rss_mib(), peak_rss_mib()
    print(f"dataset: {args.samples:,} samples, {args.clients:,} ids (built in {build_s:.2f} s; "
          f"ids {dataset.client_id.numel() * 8 / 2**20:.1f} MiB, features {args.samples / 2**20:.1f} MiB; "
          f"RSS {base_rss:.0f} -> {data_rss:.0f} MiB)")

    ids = dataset.client_id.numpy()
    part_times, part_rss, part_peak = [], [], []
    partition = None
    for _ in range(args.repeats):
        partition = None
        gc.collect()
        before, before_peak = rss_mib(), peak_rss_mib()
        start = time.perf_counter()
        partition = NaturalIdPartitioner().partition(len(dataset), ids=ids)
        part_times.append(time.perf_counter() - start)
        part_rss.append(rss_mib() - before)
        part_peak.append(peak_rss_mib() - before_peak)
    assert partition is not None and partition.num_clients == args.clients
    nbytes = partition_bytes(partition)
    sizes = partition.sizes()
    print(f"NaturalIdPartitioner.partition: {statistics.median(part_times):.3f} s median of {args.repeats} "
          f"({', '.join(f'{t:.3f}' for t in part_times)}); {partition.num_clients:,} clients, sizes "
          f"min {sizes.min()} / median {np.median(sizes):.0f} / max {sizes.max()}")
    print(f"  partition arrays: {nbytes / 2**20:.1f} MiB (indices {partition.indices.nbytes / 2**20:.1f}, offsets "
          f"{partition.offsets.nbytes / 2**20:.1f}, client_names {partition.client_names.nbytes / 2**20:.1f}); "
          f"RSS kept +{statistics.median(part_rss):.1f} MiB, peak RSS +{max(part_peak):.1f} MiB (first run "
          f"{part_peak[0]:.1f}: the transient argsort buffers)")
    del partition
    gc.collect()

    setup_times, setup_rss = [], []
    dm = None
    for _ in range(args.repeats):
        dm = None
        gc.collect()
        before = rss_mib()
        dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner(), clients_per_round=args.cohort, seed=0)
        start = time.perf_counter()
        dm.setup()
        setup_times.append(time.perf_counter() - start)
        setup_rss.append(rss_mib() - before)
    assert dm is not None
    print(f"FederatedDataModule.setup(): {statistics.median(setup_times):.3f} s median "
          f"({', '.join(f'{t:.3f}' for t in setup_times)}); RSS kept +{statistics.median(setup_rss):.1f} MiB")

    start = time.perf_counter()
    cohorts = [dm.sample_clients(r) for r in range(args.rounds)]
    sample_s = (time.perf_counter() - start) / args.rounds
    start = time.perf_counter()
    for r, cohort in enumerate(cohorts[:20]):
        for cid in cohort.tolist():
            dm.client_batches(cid, r)
    batches_s = (time.perf_counter() - start) / (20 * args.cohort)
    start = time.perf_counter()
    for r, cohort in enumerate(cohorts[:20]):
        for cid in cohort.tolist():
            dm.client_dataloader(cid, r)
    loader_s = (time.perf_counter() - start) / (20 * args.cohort)
    start = time.perf_counter()
    dm.partition.stats(label_histogram=False)
    stats_s = time.perf_counter() - start
    print(f"sample_clients (C={args.cohort} of {args.clients:,}): {sample_s * 1e3:.3f} ms per round "
          f"(mean of {args.rounds})")
    print(f"client_batches: {batches_s * 1e3:.3f} ms per client; client_dataloader: {loader_s * 1e3:.3f} ms per "
          f"client; Partition.stats(): {stats_s:.3f} s")
    print(f"peak RSS of the process: {peak_rss_mib():.0f} MiB (after imports {base_peak:.0f} MiB, after the "
          f"dataset {data_peak:.0f} MiB)")


if __name__ == "__main__":
    main()
