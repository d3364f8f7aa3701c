"""What glibc's ``malloc`` costs a large CPU tensor: allocate, fill and free ``--mb`` MB ``--repeats`` times and print
the median time and the process's minor page faults. Run it with and without the settings that keep freed blocks in
the heap (README "Speed"; benchmarks/README.md, "glibc's malloc and large batches")::

    .venv/bin/python benchmarks/malloc_reuse.py
    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296 .venv/bin/python benchmarks/malloc_reuse.py
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=80.0, help="tensor size in MB (default 80)")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    n = int(args.mb * 1e6 / 4)
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.repeats):
        start = time.perf_counter()
        x = torch.empty(n)
        x.fill_(1.0)
        del x
        times.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(f"{args.mb:g} MB alloc + fill + free: median {statistics.median(times) * 1e3:.1f} ms, "
          f"{faults / args.repeats:.0f} minor page faults per repeat")


if __name__ == "__main__":
    main()
