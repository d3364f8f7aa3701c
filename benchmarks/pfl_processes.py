"""Issue #33.4: two processes × one thread against one, lightning_fed against pfl-research 0.6, on the CNN.

    bash benchmarks/setup_pfl_env.sh                                          # once (see pfl_compare.py)
    OMP_WAIT_POLICY=passive benchmarks/.venv-pfl/bin/python benchmarks/pfl_processes.py           # ~10 min
    benchmarks/.venv-pfl/bin/python benchmarks/pfl_processes.py --quick                            # ~1 min

The workload of ``pfl_compare.py`` (FedAwareCNN "fedavg", N = 100 IID clients of 200 synthetic Fashion-MNIST-shaped
samples, E = 1, B = 20, client SGD lr 0.05, FedAvg weighted by |D_i|), cohorts C = 10 and 50, four variants, each in
its own process tree, every process one torch thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``):

* ``lightning_fed-1`` / ``lightning_fed-2``: ``FederatedTrainer(accelerator="cpu", devices=1)`` and
  ``devices=2, strategy="ddp"`` (gloo), ``ddp_speedup.py``'s worker: each rank trains its share of the cohort and the
  updates are gathered as tensors (``client/distributed.py``), so both runs' weights are equal bit for bit;
* ``pfl-1`` / ``pfl-2``: ``pfl_fedavg.run_pfl`` in one process, and under ``python -m torch.distributed.run
  --standalone --nproc_per_node=2`` (pfl's documented launcher; gloo on CPU), each worker training the cohort
  positions i ≡ rank (mod 2) of the same cohorts and mini-batches; pfl all-reduces summed float32 statistics.

Variants are interleaved (order rotated every repeat), each run's first round is warm-up and excluded, and the
median s/round on rank 0 over the remaining rounds of all repeats is reported with the minimum, the speed-up of two
processes over one for each framework, lightning_fed ÷ pfl at two processes, the max |w − w_lightning_fed-1| of the
final weights (pfl: float32 averaging, rounding only) and the 1-minute load average before and after every run.
Writes ``benchmarks/results/pfl_compare/processes-<cpu>.csv`` (``--out``) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
VARIANTS = ("lightning_fed-1", "lightning_fed-2", "pfl-1", "pfl-2")
COLUMNS = ("workload", "cohort", "variant", "processes", "device", "status", "s_per_round_median", "s_per_round_min",
           "speedup_vs_one_process", "ratio_to_pfl_same_processes", "max_abs_diff_vs_lightning_fed_1",
           "rounds_measured", "repeats", "loadavg_1m_min", "loadavg_1m_max", "cpu", "cores", "omp_env",
           "torch_version", "pfl_version", "note", "timestamp")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (6 clients, cohort 4, 2 rounds, 1 repeat)")
    p.add_argument("--cohorts", default=None, help="comma-separated cohort sizes C (default 10,50; --quick 4)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per run, the first is warm-up (default 5)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per variant (default 3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to train (default cpu; cuda: with fewer GPUs than processes, both share GPU 0 — "
                        "FederatedDDPStrategy(processes_per_device=2) for lightning_fed, PFL_PYTORCH_DEVICE=cuda:0 "
                        "for pfl)")
    p.add_argument("--out", default=None, help="CSV path (default benchmarks/results/pfl_compare/processes-<device>.csv)")
    # one pfl run (this script started by itself, under torch.distributed.run for two processes)
    p.add_argument("--pfl-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    try:
        args.cohorts = [int(c) for c in (args.cohorts or ("4" if args.quick else "10,50")).split(",") if c.strip()]
    except ValueError:
        p.error("--cohorts takes comma-separated integers")
    sys.path.insert(0, str(HERE))
    import gpu_suite

    args.variants = gpu_suite.comma_choices(p, "--variants", args.variants, VARIANTS)
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (the first round is warm-up)")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if not args.cohorts or min(args.cohorts) < 2 or any(c % 2 for c in args.cohorts):
        p.error("--cohorts must be even and >= 2 (two processes share each cohort; pfl deals users in pairs)")
    return args


def _sizes(args: argparse.Namespace) -> dict:
    """``pfl_compare.py``'s CNN sizes (N clients, samples per client)."""
    import pfl_compare

    sizes = (pfl_compare.QUICK if args.quick else pfl_compare.FULL)["cnn"]
    if max(args.cohorts) > sizes["clients"]:
        raise SystemExit(f"pfl_processes: --cohorts {max(args.cohorts)} exceeds the {sizes['clients']} clients")
    return sizes


def pfl_worker(args: argparse.Namespace) -> None:
    """One pfl run (rank ``RANK`` of ``WORLD_SIZE`` under torchrun); rank 0 writes ``--pfl-worker``'s JSON + .pt."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    import overhead
    import pfl_compare
    import pfl_fedavg

    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    wl = pfl_compare.workload(argparse.Namespace(quick=args.quick, lr=0.05, clients=_sizes(args)["clients"],
                                                 rounds=args.rounds, repeats=1), "cnn", args.cohorts[0])
    dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
    init_state = {k: v.clone() for k, v in overhead.make_model(wl).state_dict().items()}
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device(os.environ.get("PFL_PYTORCH_DEVICE") or f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    result = pfl_fedavg.run_pfl(wl, dm, init_state, device)
    if rank == 0:
        torch.save(result.weights[-1], args.pfl_worker + ".pt")
        Path(args.pfl_worker).write_text(json.dumps({"wall": result.wall, "world_size": world_size}))


def failure_reason(stderr: str) -> str:
    """The line of a failed worker's stderr that says why: the last error line raised in a worker, not torchrun's
    closing ``ChildFailedError`` (whose message is empty); else the last error line, else the last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line]
    own = [line for line in errors if "ChildFailedError" not in line and "torch.distributed.elastic" not in line]
    return (own or errors or lines or ["(no output)"])[-1]


def _shared_gpu(args: argparse.Namespace, processes: int) -> bool:
    """Whether ``processes`` processes share one GPU (fewer GPUs visible than processes)."""
    import torch

    return args.device == "cuda" and processes > 1 and torch.cuda.device_count() < processes


def _command(variant: str, args: argparse.Namespace, cohort: int, out: str) -> list[str]:
    sizes = _sizes(args)
    processes = int(variant.rsplit("-", 1)[1])
    if variant.startswith("lightning_fed"):
        placement = (["--devices", "1", "--processes-per-device", str(processes)] if _shared_gpu(args, processes)
                     else ["--devices", str(processes)])
        return [sys.executable, str(HERE / "ddp_speedup.py"), "--model", "cnn", "--cohort", str(cohort),
                "--clients", str(sizes["clients"]), "--samples-per-client", str(sizes["samples_per_client"]),
                "--rounds", str(args.rounds), "--threads", "1", *placement, "--accelerator", args.device, "--out", out]
    own = [str(Path(__file__).resolve()), "--cohorts", str(cohort), "--rounds", str(args.rounds), "--pfl-worker", out,
           "--device", args.device]
    if args.quick:
        own.append("--quick")
    if processes == 1:
        return [sys.executable, *own]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc_per_node={processes}", *own]


def markdown_table(rows: Sequence[dict]) -> str:
    """One line per cohort: median s/round (min) of every variant, the two speed-ups and lightning_fed ÷ pfl."""
    by: dict[int, dict[str, dict]] = {}
    for row in rows:
        by.setdefault(int(row["cohort"]), {})[row["variant"]] = row

    def cell(c: dict, v: str) -> str:
        r = c.get(v)
        if not r or r["status"] != "ok":
            return "—"
        return f"{float(r['s_per_round_median']):.3f} ({float(r['s_per_round_min']):.3f})"

    def speed(c: dict, v: str, key: str) -> str:
        r = c.get(v)
        return f"{float(r[key]):.2f}×" if r and r.get(key) not in (None, "") else "—"

    lines = ["| CNN, cohort C | lightning_fed 1 proc | lightning_fed 2 procs | pfl 1 proc | pfl 2 procs | "
             "2 vs 1: lightning_fed | 2 vs 1: pfl | lightning_fed ÷ pfl, 2 procs | load (1-min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cohort in sorted(by):
        c = by[cohort]
        ok = [r for r in c.values() if r["status"] == "ok"]
        load = f"{min(float(r['loadavg_1m_min']) for r in ok):.2f}–{max(float(r['loadavg_1m_max']) for r in ok):.2f}" \
            if ok else "—"
        lines.append(f"| {cohort} | {cell(c, 'lightning_fed-1')} | {cell(c, 'lightning_fed-2')} | {cell(c, 'pfl-1')} | "
                     f"{cell(c, 'pfl-2')} | {speed(c, 'lightning_fed-2', 'speedup_vs_one_process')} | "
                     f"{speed(c, 'pfl-2', 'speedup_vs_one_process')} | "
                     f"{speed(c, 'lightning_fed-2', 'ratio_to_pfl_same_processes').rstrip('×')} | {load} |")
    return "\n".join(lines)


def run_cohort(args: argparse.Namespace, cohort: int, meta: dict, tmp: str) -> list[dict]:
    import torch

    variants = [v for v in args.variants if not v.startswith("pfl") or meta["pfl_version"]]
    walls: dict[str, list[float]] = {v: [] for v in variants}
    loads: dict[str, list[float]] = {v: [] for v in variants}
    weights: dict[str, torch.Tensor] = {}
    failed: dict[str, str] = {}
    for rep in range(args.repeats):
        shift = rep % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            if variant in failed:
                continue
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            if variant.startswith("pfl") and _shared_gpu(args, int(variant.rsplit("-", 1)[1])):
                env["PFL_PYTORCH_DEVICE"] = "cuda:0"
            out = os.path.join(tmp, f"{variant}_c{cohort}_r{rep}.json")
            before = os.getloadavg()[0]
            done = subprocess.run(_command(variant, args, cohort, out), env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                failed[variant] = f"exit {done.returncode}: {failure_reason(done.stderr)[:300]}"
                print(f"  C={cohort:<3} {variant:>15} repeat {rep}: FAILED ({failed[variant]})", flush=True)
                continue
            loads[variant] += [before, os.getloadavg()[0]]
            walls[variant] += json.loads(Path(out).read_text())["wall"][1:]
            weights[variant] = torch.load(out + ".pt").flatten()
            print(f"  C={cohort:<3} {variant:>15} repeat {rep}: s/round "
                  + " ".join(f"{t:.3f}" for t in json.loads(Path(out).read_text())["wall"])
                  + f"  load {loads[variant][-1]:.2f}", flush=True)
    variants = [v for v in variants if v not in failed]
    med = {v: statistics.median(walls[v]) for v in variants}
    rows = []
    for variant in args.variants:
        processes = int(variant.rsplit("-", 1)[1])
        row = {c: "" for c in COLUMNS}
        row.update(workload="cnn", cohort=cohort, variant=variant, processes=processes, repeats=args.repeats,
                   timestamp=datetime.datetime.now().isoformat(timespec="seconds"), **meta)
        row["pfl_version"] = meta["pfl_version"] or ""
        if variant in failed:
            row.update(status="failed", note=failed[variant])
            rows.append(row)
            continue
        if variant not in variants:
            row.update(status="skipped", note="pfl does not import here (bash benchmarks/setup_pfl_env.sh, then run "
                                              "with benchmarks/.venv-pfl/bin/python)")
            rows.append(row)
            continue
        framework = variant.rsplit("-", 1)[0]
        one, pfl_same = f"{framework}-1", f"pfl-{processes}"
        row.update(status="ok", s_per_round_median=f"{med[variant]:.6g}", s_per_round_min=f"{min(walls[variant]):.6g}",
                   rounds_measured=len(walls[variant]), loadavg_1m_min=f"{min(loads[variant]):.2f}",
                   loadavg_1m_max=f"{max(loads[variant]):.2f}")
        if processes > 1 and one in med:
            row["speedup_vs_one_process"] = f"{med[one] / med[variant]:.4f}"
        if framework == "lightning_fed" and pfl_same in med:
            row["ratio_to_pfl_same_processes"] = f"{med[variant] / med[pfl_same]:.4f}"
        if "lightning_fed-1" in weights:
            row["max_abs_diff_vs_lightning_fed_1"] = f"{float((weights[variant] - weights['lightning_fed-1']).abs().max()):.3g}"
        rows.append(row)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> Path:
    args = parse_args(argv)
    if args.pfl_worker:
        pfl_worker(args)
        return Path(args.pfl_worker)
    import gpu_suite
    import pfl_compare
    import pfl_fedavg
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available (use --device cpu)")
    cpu = gpu_suite.device_name(torch.device("cpu")).removeprefix("cpu: ")
    name = cpu if args.device == "cpu" else gpu_suite.device_name(torch.device("cuda"))
    out = Path(args.out) if args.out else HERE / "results" / "pfl_compare" / (
        f"processes-{gpu_suite._slug(name or socket.gethostname())}{'-quick' if args.quick else ''}.csv")
    meta = dict(cpu=cpu, cores=os.cpu_count(), omp_env=pfl_compare.omp_env(), torch_version=torch.__version__,
                pfl_version=pfl_fedavg.pfl_version(), device=name)
    start = time.perf_counter()
    print(f"pfl_processes: torch {torch.__version__}, pfl {meta['pfl_version'] or 'not importable'}, device {name}, "
          f"cpu {cpu} "
          f"({os.cpu_count()} cores), {meta['omp_env']}, load {os.getloadavg()}, quick={args.quick}", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for cohort in args.cohorts:
            rows += run_cohort(args, cohort, meta, tmp)
    return pfl_compare.write_report(out, COLUMNS, rows, markdown_table(rows), start)


if __name__ == "__main__":
    main()
