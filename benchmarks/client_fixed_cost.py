"""Issue #44.1: the sequential executor's fixed cost per client (its start and end, outside the local steps).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/client_fixed_cost.py              # MLP and CNN, 1/2/5/30 steps
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/client_fixed_cost.py --workloads mlp --steps 5 --top 40

For each workload (``mlp``: the 784-256-10 MLP; ``cnn``: FedAwareCNN "fedavg", as in ``pfl_compare.py``) and each
number of local steps a client (``--steps``: samples a client = steps × B, B = 20, one local epoch), a FedAvg fit of
N = 100 clients, cohort C (``--cohort``, default 10) runs with ``overhead.run_lightning``'s trainer and the
sequential executor. Rounds after the first (warm-up) are measured twice, in the thread's CPU time by default
(``--clock thread``; ``--clock wall`` for wall-clock time):

* **timer** (not profiled): each round's ``run_round`` time and the time of every
  ``ClientRunner.local_step`` call and of every batch fetch (slicing a batch: a cost per step, which the plain loop
  pays too) in it; the fixed cost per client is (run_round − Σ local_step − Σ batch fetch) / clients (what remains:
  the client's start, its batch plan, seeding, its end, ``on_client_end``), and
  the rest of the round (``timer_ms_round_rest``: the round's time outside ``run_round``: sampling, the server
  update, the update checks, the round's logging; per round, not per client);
* **against the plain loop** (``overhead.run_plain``, the same clients, batches and seeds; its weights must equal the
  executor's bit for bit): the median time a round of each (process CPU time with ``--clock thread``), and
  ``excess_ms_per_client`` = (sequential − plain) / C (a fit of its own, without the timers), which over S = 1, 2, 5, 30 local steps is a + b·S: a the
  executor's fixed cost a client above the plain loop's, b its cost a local step above a plain step (the round's
  own extra work, sampling aside, counts in a as 1/C of it);
* **cProfile** (a third fit, profiled from round 1 on): the same split from cumulative times (``TensorBatches.__iter__``
  for the batch fetches), and the per-client
  cost of each part (``start_client``, ``finish_client``, ``client_dataloader``, ``client_end``, ...) with call
  counts. cProfile inflates Python-heavy code several times; its figures compare versions, not absolute costs.

Prints one line per (workload, steps) and, with ``--top N``, the N functions with the largest own time under
``run_round`` outside ``local_step`` (callees of the per-client parts). ``--out`` writes the rows as CSV.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import logging
import os
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import gpu_suite  # noqa: E402
import overhead  # noqa: E402
from lightning_fed.client.runner import ClientRunner  # noqa: E402
from lightning_fed.client.sequential import SequentialExecutor  # noqa: E402

WORKLOADS = ("mlp", "cnn")
#: ``--clock``: the thread's CPU time (default: not counting the time the thread waits for a core, so a loaded
#: machine changes the figures far less), or wall-clock time.
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
_clock = CLOCKS["thread"]
#: (label, file suffix, function) of the per-client parts reported from the profile.
PARTS = (
    ("start_client", "lightning_fed/client/runner.py", "start_client"),
    ("  reset_to_global", "lightning_fed/client/runner.py", "reset_to_global"),
    ("  context", "lightning_fed/client/runner.py", "context"),
    ("client_dataloader", "lightning_fed/datamodules/federated.py", "client_dataloader"),
    ("seed_client + client_seed", None, None),
    ("batch slicing (TensorBatches.__iter__)", "lightning_fed/datamodules/federated.py", "__iter__"),
    ("mean_step_loss", "lightning_fed/client/sequential.py", "mean_step_loss"),
    ("finish_client", "lightning_fed/client/runner.py", "finish_client"),
    ("  build_update", "lightning_fed/client/runner.py", "build_update"),
    ("client_end", "lightning_fed/client/runner.py", "client_end"),
)
COLUMNS = ("workload", "steps", "cohort", "clients_measured", "plain_ms_per_round", "sequential_ms_per_round",
           "excess_ms_per_client", "timer_ms_per_client", "timer_ms_per_step",
           "timer_ms_per_batch_fetch", "timer_ms_round_rest",
           "profile_ms_per_client", *(p[0].strip() for p in PARTS), "loadavg_1m")


class _TimedBatches:
    """A client's batches, the time of each fetch (``next``) added to ``sink``."""

    def __init__(self, batches: Any, sink: list[float]) -> None:
        self._batches, self._sink = batches, sink

    def __iter__(self):
        it = iter(self._batches)
        while True:
            start = _clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                self._sink.append(_clock() - start)
            yield batch


class _TimedDataModule:
    """The data module, its ``client_dataloader``'s batch fetches timed (everything else delegates)."""

    def __init__(self, datamodule: Any, sink: list[float]) -> None:
        self._datamodule, self._sink = datamodule, sink

    def client_dataloader(self, cid: int, round_idx: int) -> Any:
        return _TimedBatches(self._datamodule.client_dataloader(cid, round_idx), self._sink)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._datamodule, name)


class _TimedRunner:
    """Wraps a :class:`ClientRunner`'s ``local_step`` with a timer, and its data module's batch fetches
    (everything else delegates)."""

    def __init__(self, runner: ClientRunner, sink: list[float], fetches: list[float]) -> None:
        self._runner, self._sink = runner, sink
        self.datamodule = _TimedDataModule(runner.datamodule, fetches)

    def local_step(self, batch: Any, batch_idx: int) -> Any:
        start = _clock()
        out = self._runner.local_step(batch, batch_idx)
        self._sink.append(_clock() - start)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


class MeasuredExecutor(SequentialExecutor):
    """The sequential executor, measured from round 1 on: times (``profiler=None``) or a cProfile."""

    def __init__(self, profiler: Optional[cProfile.Profile] = None) -> None:
        self.profiler = profiler
        self.rounds: list[tuple[float, float, int, int, float]] = []  # run_round s, Σ local_step s, clients, steps,
        # Σ batch fetch s

    def run_round(self, runner, cohort, round_idx):
        if round_idx == 0:
            return super().run_round(runner, cohort, round_idx)
        if self.profiler is not None:
            self.profiler.enable()
            try:
                return super().run_round(runner, cohort, round_idx)
            finally:
                self.profiler.disable()
        steps: list[float] = []
        fetches: list[float] = []
        start = _clock()
        result = super().run_round(_TimedRunner(runner, steps, fetches), cohort, round_idx)
        self.rounds.append((_clock() - start, sum(steps), len(cohort), len(steps), sum(fetches)))
        return result


def _cum(stats: pstats.Stats, suffix: Optional[str], name: str) -> tuple[float, int]:
    total, calls = 0.0, 0
    for (filename, _, func), (_, ncalls, _, cumtime, _) in stats.stats.items():
        if func == name and (suffix is None or filename.endswith(suffix + ".py") or filename.endswith(suffix)):
            total += cumtime
            calls += ncalls
    return total, calls


def measure(wl: argparse.Namespace, top: int) -> dict:
    dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
    init_state = {k: v.clone() for k, v in overhead.make_model(wl).state_dict().items()}
    device = torch.device("cpu")
    plain = overhead.run_plain(wl, dm, init_state, device)
    untimed = overhead.run_lightning(wl, dm, init_state, device)
    if not torch.equal(plain.weights[-1], untimed.weights[-1]):
        raise RuntimeError("the sequential executor's weights differ from the plain loop's")
    wall = _clock is time.perf_counter
    rounds = untimed.wall if wall else untimed.cpu  # (the process's CPU time: one thread)
    plain_rounds = plain.wall if wall else plain.cpu
    excess = statistics.median(rounds[1:]) - statistics.median(plain_rounds[1:])
    timed = MeasuredExecutor()
    result = overhead.run_lightning(wl, dm, init_state, device, timed)
    timed_rounds = result.wall if wall else result.cpu
    rest = [t - r[0] for t, r in zip(timed_rounds[1:], timed.rounds)]
    walls = [(r - s - f) / c for r, s, c, _, f in timed.rounds]
    per_step = [s / n for _, s, _, n, _ in timed.rounds]
    fetch = [f / n for _, _, _, n, f in timed.rounds]
    profiler = cProfile.Profile(_clock)
    overhead.run_lightning(wl, dm, init_state, device, MeasuredExecutor(profiler))
    stats = pstats.Stats(profiler)
    clients = _cum(stats, "lightning_fed/client/sequential.py", "train_client")[1]
    run_round = _cum(stats, "lightning_fed/client/sequential.py", "run_round")[0]
    local = _cum(stats, "lightning_fed/client/runner.py", "local_step")[0]
    slicing = _cum(stats, "lightning_fed/datamodules/federated.py", "__iter__")[0]
    row = dict(workload=wl.model_label, steps=wl.steps, cohort=wl.cohort, clients_measured=clients,
               plain_ms_per_round=f"{1e3 * statistics.median(plain_rounds[1:]):.3f}",
               sequential_ms_per_round=f"{1e3 * statistics.median(rounds[1:]):.3f}",
               excess_ms_per_client=f"{1e3 * excess / wl.cohort:.3f}",
               timer_ms_per_client=f"{1e3 * statistics.median(walls):.3f}",
               timer_ms_per_step=f"{1e3 * statistics.median(per_step):.3f}",
               timer_ms_per_batch_fetch=f"{1e3 * statistics.median(fetch):.3f}",
               timer_ms_round_rest=f"{1e3 * statistics.median(rest):.3f}",
               profile_ms_per_client=f"{1e3 * (run_round - local - slicing) / clients:.3f}",
               loadavg_1m=f"{os.getloadavg()[0]:.2f}")
    for label, suffix, name in PARTS:
        if name is None:
            value = _cum(stats, "lightning_fed/client/sequential.py", "seed_client")[0]
            value += _cum(stats, "lightning_fed/client/sequential.py", "client_seed")[0]
        else:
            value = _cum(stats, suffix, name)[0]
        row[label.strip()] = f"{1e3 * value / clients:.3f}"
    if top:
        out = io.StringIO()
        stats.stream = out
        stats.sort_stats("tottime").print_stats(top)
        print(out.getvalue())
    return row


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}")
    p.add_argument("--steps", default="1,2,5,30", help="local steps a client, comma-separated (default 1,2,5,30)")
    p.add_argument("--cohort", type=int, default=10, help="clients a round (default 10)")
    p.add_argument("--clients", type=int, default=100, help="N (default 100)")
    p.add_argument("--batch", type=int, default=20, help="B (default 20)")
    p.add_argument("--rounds", type=int, default=6, help="rounds a fit, the first is warm-up (default 6)")
    p.add_argument("--clock", default="thread", choices=tuple(CLOCKS), help="thread: the thread's CPU time "
                   "(default; far less sensitive to a loaded machine), wall: wall-clock time (both timer and profile)")
    p.add_argument("--top", type=int, default=0, help="print the N functions with the most own time (default 0)")
    p.add_argument("--out", default=None, help="CSV path (default: none)")
    args = p.parse_args(argv)
    args.workloads = gpu_suite.comma_choices(p, "--workloads", args.workloads, WORKLOADS)
    try:
        args.steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        p.error("--steps takes comma-separated integers")
    if not args.steps or min(args.steps) < 1:
        p.error("--steps must be >= 1")
    if not 1 <= args.cohort <= args.clients:
        p.error(f"--cohort must be in [1, {args.clients}] (--clients)")
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (the first round is warm-up)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    """Measure every (workload, steps) cell; write the CSV if asked. Lightning's log level, the warning filters and
    torch's thread count are restored on return (a test runs it in-process)."""
    global _clock
    args = parse_args(argv)
    _clock = CLOCKS[args.clock]
    logger = logging.getLogger("lightning.pytorch")
    level, threads0 = logger.level, torch.get_num_threads()
    rows = []
    try:
        with warnings.catch_warnings():
            torch.set_num_threads(1)
            logger.setLevel(logging.ERROR)
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            print(f"client_fixed_cost: torch {torch.__version__}, load {os.getloadavg()}", flush=True)
            for name in args.workloads:
                for steps in args.steps:
                    wl = gpu_suite.workload_args(name, quick=False)
                    for key, value in dict(clients=args.clients, cohort=args.cohort,
                                           samples_per_client=steps * args.batch, batch=args.batch, rounds=args.rounds,
                                           repeats=1).items():
                        setattr(wl, key, value)
                    wl.steps, wl.model_label = steps, name
                    row = measure(wl, args.top)
                    rows.append(row)
                    print("  ".join(f"{k}={row[k]}" for k in COLUMNS), flush=True)
    finally:
        logger.setLevel(level)
        torch.set_num_threads(threads0)
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
