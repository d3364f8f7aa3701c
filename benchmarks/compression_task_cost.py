"""Issue #56: what each uplink compressor adds to a round of the ``communication`` table's own configurations.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compression_task_cost.py                    # both tasks, 3 repeats
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compression_task_cost.py --tasks fmnist --repeats 5 --rounds 6

``benchmarks/compression_cost.py`` times the compressors on a deliberately small round (an MLP, 2 local steps): there
the encode is a large share of the round. This script times them where the table trains them: each task's FedAvg
configuration (``examples/communication_<task>_fedavg.yaml``, built by ``communication_table.config`` exactly as the
table builds its runs, seed 0), ``--rounds`` rounds through ``lightning-fed fit`` with a CSV logger and no
validation, timing each round's process CPU time with :class:`RoundCPUTime` (a Lightning callback: a round is an epoch,
so ``on_train_epoch_start``/``on_train_epoch_end`` bracket it). The first round is warm-up. Variants are interleaved (every repeat runs each variant once, in turn) so a
change of the machine's load touches them alike. Per task and variant, over all measured rounds of all repeats: the
median of the round's process CPU seconds (``round_cpu_s``; the same clients and local work in every variant, since
the seed fixes the cohorts and the batches; CPU time is far less disturbed than the wall clock by other processes on
a loaded machine) and of the loop's ``round_time_s`` (wall clock), each with its overhead over ``none`` in percent:
100 · (median − median of ``none``) / median of ``none``; and the median CPU seconds of ``Compression.encode`` a round
(``encode_cpu_s``) with ``encode_pct`` = 100 · it / the median round CPU seconds of ``none`` — the compressor's own
share of a round, which the whole round's CPU time (±10–30 % between identical rounds on a loaded 2-core machine)
cannot resolve.
The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import time

import yaml
from lightning.pytorch import Callback

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import communication_table as table  # noqa: E402


class RoundCPUTime(Callback):
    """Appends ``round,cpu_seconds,encode_seconds`` to ``path`` at the end of every round (training epoch): the
    process CPU time (``time.process_time``) from the round's start to its end, and the thread CPU time spent in
    ``Compression.encode`` in that round (the compressor's own work, timed as ``compression_cost.py`` times it: this
    process only runs the benchmark, so the wrapper touches no one else's run)."""

    def __init__(self, path: str) -> None:
        from compression_cost import timed_encode
        from lightning_fed.communication import Compression

        self.path, self._start, self._encode_ms = path, 0.0, [0.0]
        Compression.encode = timed_encode(self._encode_ms)[1]

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start, self._encode_ms[-1] = time.process_time(), 0.0

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        with open(self.path, "a") as f:
            f.write(f"{trainer.current_epoch},{time.process_time() - self._start},{self._encode_ms[-1] / 1e3}\n")


def round_times(task: str, variant: str, rounds: int, workdir: Path) -> tuple[list[float], list[float], list[float]]:
    """The process CPU seconds, the ``Compression.encode`` CPU seconds and the ``round_time_s`` of rounds
    2..``rounds`` of one ``lightning-fed fit`` of ``task``'s FedAvg config with ``variant``'s compressor."""
    base = yaml.safe_load((ROOT / "examples" / f"{table.TABLE}_{task}_fedavg.yaml").read_text())
    cfg = table.config(base, variant, 0)
    cfg["trainer"]["max_epochs"] = rounds
    cfg["trainer"]["check_val_every_n_epoch"] = rounds + 1
    cfg["trainer"]["enable_checkpointing"] = False
    cpu_file = workdir / f"{task}-{variant}-{time.monotonic_ns()}.cpu"
    cfg["trainer"].setdefault("callbacks", []).append(
        {"class_path": "compression_task_cost.RoundCPUTime", "init_args": {"path": str(cpu_file)}})
    folder = Path(tempfile.mkdtemp(prefix=f"{task}-{variant}-", dir=workdir))
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    exe = str(Path(sys.executable).with_name("lightning-fed"))
    cmd = [exe, "fit", "--config", str(folder / "config.yaml"), "--trainer.logger",
           "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(folder)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    with open(folder / "stderr.log", "w") as err:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    if proc.returncode != 0:
        raise SystemExit(f"{task}/{variant} failed (exit {proc.returncode}): see {folder / 'stderr.log'}")
    rows = list(csv.DictReader(next(folder.rglob("metrics.csv")).open()))
    times = {int(r["epoch"]): float(r["round_time_s"]) for r in rows if r.get("round_time_s")}
    cpu = {int(e): (float(c), float(enc)) for e, c, enc in (line.split(",") for line in cpu_file.read_text().split())}
    return ([cpu[e][0] for e in sorted(cpu) if e >= 1], [cpu[e][1] for e in sorted(cpu) if e >= 1],
            [times[e] for e in sorted(times) if e >= 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="*", default=list(table.TASKS), choices=list(table.TASKS))
    parser.add_argument("--variants", nargs="*", default=list(table.COMPRESSORS), choices=list(table.COMPRESSORS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=str, default=None, help="CSV of the per-variant medians")
    args = parser.parse_args()
    variants = ["none"] + [v for v in args.variants if v != "none"]
    print(f"load average before: {os.getloadavg()}", flush=True)
    cpu: dict[tuple[str, str], list[float]] = {}
    encode: dict[tuple[str, str], list[float]] = {}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for task in args.tasks:
                for variant in variants:
                    got_cpu, got_encode, got = round_times(task, variant, args.rounds, Path(workdir))
                    cpu.setdefault((task, variant), []).extend(got_cpu)
                    encode.setdefault((task, variant), []).extend(got_encode)
                    times.setdefault((task, variant), []).extend(got)
                    print(f"repeat {repeat} {task:11s} {variant:9s} cpu " + " ".join(f"{t:.3f}" for t in got_cpu)
                          + " | encode " + " ".join(f"{t:.3f}" for t in got_encode) + " | wall " + " ".join(f"{t:.3f}" for t in got), flush=True)
    print(f"load average after: {os.getloadavg()}")
    rows = []
    for task in args.tasks:
        ref_cpu, ref_wall = statistics.median(cpu[task, "none"]), statistics.median(times[task, "none"])
        for variant in variants:
            c, w = statistics.median(cpu[task, variant]), statistics.median(times[task, variant])
            e = statistics.median(encode[task, variant])
            rows.append({"task": task, "variant": variant, "rounds_measured": len(times[task, variant]),
                         "encode_cpu_s": round(e, 4), "encode_pct": round(100 * e / ref_cpu, 2),
                         "round_cpu_s": round(c, 4), "cpu_overhead_pct": round(100 * (c - ref_cpu) / ref_cpu, 2),
                         "round_s": round(w, 4), "overhead_pct": round(100 * (w - ref_wall) / ref_wall, 2)})
    print(",".join(rows[0]))
    for row in rows:
        print(",".join(str(v) for v in row.values()))
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
