"""Issue #33.1: lightning_fed against Apple's pfl-research (pfl 0.6.0) and a plain PyTorch loop (pfl also in a
process of its own, as its users run it: issue #51).

    bash benchmarks/setup_pfl_env.sh                      # once: benchmarks/.venv-pfl, pfl beside the project's torch
    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive benchmarks/.venv-pfl/bin/python benchmarks/pfl_compare.py   # the table
    OMP_NUM_THREADS=1 benchmarks/.venv-pfl/bin/python benchmarks/pfl_compare.py --quick    # a smoke test (~1 min)
    OMP_NUM_THREADS=1 benchmarks/.venv-pfl/bin/python benchmarks/pfl_compare.py --steps-per-client 5,30 --threads 1 \
        --variants plain,pfl,sequential                 # issue #44: small clients (5 local steps) against 30

Same clients, same model, same client SGD steps for every variant. Per cell (workload, cohort C, torch threads),
on N clients of synthetic data (IID, ``benchmarks/overhead.py``'s ``make_dataset`` / ``make_datamodule``):

* ``plain``: ``overhead.run_plain``, the hand-written loop (the same cohorts ``datamodule.sample_clients``, batches
  ``datamodule.client_batches``, a fresh ``torch.optim.SGD`` per client, FedAvg weighted by |D_i|);
* ``pfl``: pfl as its users run it (issue #51): ``pfl_worker.py`` in a fresh process of ``--pfl-python`` (default
  this Python, i.e. ``benchmarks/.venv-pfl/bin/python``) that imports only torch, numpy, pfl and ``pfl_worker.py``
  itself — never Lightning nor lightning_fed — and runs without ``PYTORCH_NVML_BASED_CUDA_CHECK`` (removed from its
  environment; the worker refuses to start with it and reports that Lightning stayed out of ``sys.modules``). Why:
  ``import lightning`` sets that variable in ``os.environ``, which makes ``torch.cuda.is_available()`` ask NVML at
  every call instead of answering from its cache, and pfl 0.6 calls it (``get_default_device``) for every tensor of
  every batch; in this process pfl would be measured 25–40 % slower on the small MLP than any pfl user sees it. The
  job (the model, every sample, the plan, the hyper-parameters) is written once a cell and read by each repeat's
  process before its first round; only rounds are timed, by that process (its own CPU time);
* ``pfl-inproc``: the very same pfl run (``pfl_worker.run_fedavg``, same model object type, loss, plan) in this
  process, after ``import lightning``: the variable set, as pfl_compare.py measured pfl before issue #51. Kept to
  show the difference; it is not how pfl runs for its users.

  Both pfl columns: ``pfl.algorithm.FederatedAveraging`` on a ``pfl.aggregate.simulate.SimulatedBackend`` with a
  ``pfl.model.pytorch.PyTorchModel`` (the benchmark module's ``nn.Sequential``, its ``loss`` the same cross-entropy), central optimizer
  ``torch.optim.SGD(lr=1)``, local ``torch.optim.SGD`` via ``NNTrainHyperParams(local_num_epochs=E,
  local_learning_rate=lr, local_batch_size=B)``, ``WeightByDatapoints`` (FedAvg's |D_i| weights). Its
  ``FederatedDataset``'s user sampler returns the plain loop's cohort of each round, in order, and each user's
  ``Dataset`` holds that client's samples in the order of its batches of that round, so pfl's ``iter(B)`` slices
  the very same mini-batches (the plan is computed before the run, ``pfl_fedavg.client_plan``: pfl does not pay
  for the permutation, ~0.06 ms a client, that the plain loop and lightning_fed compute in their rounds). Metrics are not sent to pfl's platform (``send_metrics_to_platform=False``: the
  default platform prints every round), and pfl evaluates users only in round 0 (``evaluation_frequency`` > rounds;
  pfl always evaluates round 0, the warm-up that is excluded anyway);
* ``sequential`` / ``vectorized``: ``FederatedTrainer`` with the default / ``VectorizedExecutor`` (``overhead.
  run_lightning``, as ``overhead.py`` and ``gpu_suite.py`` run them).

``--steps-per-client S1,S2,...`` (issue #44) gives every client S × B samples, so that it takes S local steps a
round (one local epoch); by default each workload keeps its own size (CNN 10 steps, MLP 30). Small S is the
cross-device regime, where each client's fixed cost (its start and end) weighs against few steps. ``--batch B``
changes B (default 20), keeping the local steps.

Variants are interleaved (order rotated every repeat); each run's first round is warm-up and excluded; the median
s/round over the remaining rounds of all repeats is reported, ÷ the plain loop's (and the minimum ÷ the plain loop's
minimum, less sensitive to the load of a busy machine), with the framework time per local
step ((t − t_plain) / steps), the max |w − w_plain| of the final weights (pfl averages in float32: rounding only),
and the 1-minute load average (``os.getloadavg``) before and after every run; also the median process CPU time a
round (``time.process_time``; one thread) and its ratio to the plain loop's, which a loaded machine moves far less
than the wall time (time spent waiting for a core is not counted). ``pfl`` and ``pfl-inproc`` are rows with status
``skipped`` when ``import pfl`` fails (pfl is not a dependency of lightning_fed).

Writes ``benchmarks/results/pfl_compare/<cpu or host>.csv`` (``-quick.csv`` with ``--quick``; ``--out``) and prints
the markdown table (:func:`markdown_table`).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import gpu_suite  # noqa: E402  (workload_args, the in-process variants, the CPU's name)
import overhead  # noqa: E402  (the shared workload, plain loop and lightning_fed runs)
from pfl_fedavg import client_plan, pfl_version, run_pfl  # noqa: E402,F401  (pfl's FedAvg on the same work)
from pfl_worker import NVML_CHECK, cross_entropy_loss  # noqa: E402  (pfl's run, also in a process of its own)

WORKLOADS = ("cnn", "mlp")
VARIANTS = ("plain", "pfl", "pfl-inproc", "sequential", "vectorized")
COLUMNS = (
    "workload", "steps_per_client", "cohort", "threads", "variant", "status", "s_per_round_median", "s_per_round_min",
    "ratio_to_plain",
    "ratio_min_to_plain_min",
    "ms_per_local_step", "framework_ms_per_step", "max_abs_diff_vs_plain", "rounds_measured", "repeats",
    "local_steps_per_round", "params", "clients", "samples_per_client", "batch", "loadavg_1m_min", "loadavg_1m_max",
    "cpu", "host", "omp_env", "torch_version", "pfl_version", "note", "timestamp", "cpu_s_per_round_median",
    "cpu_ratio_to_plain",
)
#: Workload sizes: ``gpu_suite``'s models (``mlp``: the 784-256-10 MLP; ``cnn``: FedAwareCNN "fedavg"), N clients,
#: samples per client (CNN 200 → 10 local steps per client of B = 20; MLP 600 → 30), rounds per run incl. the
#: warm-up, repeats.
FULL = {"cnn": dict(clients=100, samples_per_client=200, batch=20), "mlp": dict(clients=100, samples_per_client=600,
                                                                                batch=20)}
QUICK = {"cnn": dict(clients=6, samples_per_client=40, batch=20), "mlp": dict(clients=6, samples_per_client=40,
                                                                              batch=20)}
DEFAULTS = dict(rounds=3, repeats=3, cohorts="10,50", threads="1,2")
QUICK_DEFAULTS = dict(rounds=2, repeats=1, cohorts="2,4", threads="1,2")


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (6 clients, cohorts 2 and 4, 2 rounds, 1 "
                   "repeat): a smoke test, not a measurement")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)} (plain is "
                   "always run: the ratios are to it)")
    p.add_argument("--cohorts", default=None, help="comma-separated cohort sizes C (default 10,50; --quick 2,4)")
    p.add_argument("--threads", default=None, help="comma-separated torch.set_num_threads values (default 1,2)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per run, the first is warm-up (default 3)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per variant (default 2)")
    p.add_argument("--clients", type=int, default=None, help="N (default 100; --quick 6)")
    p.add_argument("--steps-per-client", default=None, help="comma-separated local steps a client takes a round "
                   "(S × B samples a client; default: the workload's own, CNN 10, MLP 30; --quick 2)")
    p.add_argument("--batch", type=int, default=None, help="B, the client batch size (default 20)")
    p.add_argument("--lr", type=float, default=0.05, help="client SGD learning rate (default 0.05)")
    p.add_argument("--out", default=None, help="CSV path (default benchmarks/results/pfl_compare/<cpu>.csv)")
    p.add_argument("--pfl-python", default=sys.executable, help="the Python that runs the `pfl` variant's own process "
                   "(default this one: benchmarks/.venv-pfl/bin/python when run as documented)")
    args = p.parse_args(argv)
    defaults = QUICK_DEFAULTS if args.quick else DEFAULTS
    for name in ("rounds", "repeats", "cohorts", "threads"):
        if getattr(args, name) is None:
            setattr(args, name, defaults[name])
    try:
        args.cohorts, args.threads = _ints(args.cohorts), _ints(args.threads)
        args.steps_per_client = None if args.steps_per_client is None else _ints(args.steps_per_client)
    except ValueError:
        p.error("--cohorts, --threads and --steps-per-client take comma-separated integers")
    if args.steps_per_client is not None and (not args.steps_per_client or min(args.steps_per_client) < 1):
        p.error("--steps-per-client must be >= 1")
    if args.batch is not None and args.batch < 1:
        p.error("--batch must be >= 1")
    args.workloads = gpu_suite.comma_choices(p, "--workloads", args.workloads, WORKLOADS)
    args.variants = gpu_suite.comma_choices(p, "--variants", args.variants, VARIANTS)
    if "plain" not in args.variants:
        args.variants.insert(0, "plain")
    if not args.cohorts or min(args.cohorts) < 1:
        p.error("--cohorts must be >= 1")
    if not args.threads or min(args.threads) < 1:
        p.error("--threads must be >= 1")
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (the first round is warm-up)")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    clients = args.clients if args.clients is not None else (QUICK if args.quick else FULL)["cnn"]["clients"]
    if clients < max(args.cohorts):
        p.error(f"--cohorts: {max(args.cohorts)} exceeds the {clients} clients (--clients)")
    args.clients = clients
    return args


def workload(args: argparse.Namespace, name: str, cohort: int, steps: Optional[int] = None) -> argparse.Namespace:
    """``overhead.py``'s namespace for one cell: gpu_suite's model, this script's sizes (``steps``: local steps a
    client, i.e. ``steps`` × B samples a client; ``None``: the workload's own size)."""
    wl = gpu_suite.workload_args(name, quick=args.quick, lr=args.lr)
    sizes = dict((QUICK if args.quick else FULL)[name])
    if args.batch is not None:  # the same local steps a client: samples a client scale with B
        sizes["samples_per_client"] = sizes["samples_per_client"] // sizes["batch"] * args.batch
        sizes["batch"] = args.batch
    if steps is not None:
        sizes["samples_per_client"] = steps * sizes["batch"]
    for key, value in {**sizes, "clients": args.clients, "cohort": cohort, "rounds": args.rounds,
                       "repeats": args.repeats}.items():
        setattr(wl, key, value)
    return wl


# ---------------------------------------------------------------------------------------------- one cell
def pfl_net(wl, init_state) -> torch.nn.Module:
    """The model both pfl columns train: the benchmark module's ``net`` (an ``nn.Sequential`` of ``torch.nn``
    layers, what a pfl user would write) with ``init_state``; its forward is the module's (no channels-last)."""
    model = overhead.make_model(wl)
    model.load_state_dict(init_state)
    return model.net


def write_job(path: Path, wl, dm, init_state: dict, threads: int) -> Path:
    """``pfl_worker.py``'s job file for one cell (its docstring gives the format): the model, every sample, the plain
    loop's plan (``pfl_fedavg.client_plan``) and the hyper-parameters."""
    x_all, y_all = dm.train_dataset.tensors
    torch.save(dict(net=pfl_net(wl, init_state), x=x_all, y=y_all, plan=client_plan(wl, dm), rounds=wl.rounds,
                    cohort=wl.cohort, epochs=wl.epochs, lr=wl.lr, batch=wl.batch, threads=threads), path)
    return path


def pfl_env() -> dict:
    """This process's environment without ``PYTORCH_NVML_BASED_CUDA_CHECK`` (set here by ``import lightning``): the
    environment of a pfl user's process."""
    return {k: v for k, v in os.environ.items() if k != NVML_CHECK}


def run_pfl_process(job: Path, python: str) -> overhead.RunResult:
    """One pfl run as a pfl user runs it: ``python pfl_worker.py job result`` in a fresh process that never imports
    Lightning, without ``PYTORCH_NVML_BASED_CUDA_CHECK`` (checked there, and the result says so)."""
    result_path = job.with_suffix(".result.pt")
    proc = subprocess.run([python, str(HERE / "pfl_worker.py"), str(job), str(result_path)], env=pfl_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pfl_worker.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    out = torch.load(result_path, weights_only=False)
    result_path.unlink()
    if out["nvml_check"] is not None or out["lightning_imported"]:
        raise RuntimeError(f"pfl_worker.py did not run as a pfl user's process: {NVML_CHECK}={out['nvml_check']!r}, "
                           f"Lightning imported: {out['lightning_imported']}")
    return overhead.RunResult(wall=out["wall"], cpu=out["cpu"], weights=out["weights"], total=out["total"])


def pfl_process_version(python: str) -> Optional[str]:
    """pfl's installed version for ``python`` (started as :func:`run_pfl_process` starts it), or None when pfl is
    not installed there (read from its metadata: nothing imported; a pfl that fails to import fails the run)."""
    proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('pfl'))"], env=pfl_env(),
                          capture_output=True, text=True)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _run(variant: str, wl, dm, init_state, device, job: Optional[Path] = None, python: str = sys.executable
         ) -> overhead.RunResult:
    if variant == "pfl":
        return run_pfl_process(job, python)
    if variant == "pfl-inproc":
        return run_pfl(wl, dm, init_state, device, net=pfl_net(wl, init_state), compute_loss=cross_entropy_loss)
    return gpu_suite._run(variant, wl, dm, init_state, device)


def run_cell(args, name: str, cohort: int, threads: int, meta: dict, steps: Optional[int] = None) -> list[dict]:
    """Every variant of one (workload, local steps a client, cohort, threads) cell, interleaved; one CSV row each."""
    wl = workload(args, name, cohort, steps)
    dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
    model = overhead.make_model(wl)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    params = sum(p.numel() for p in model.parameters())
    steps = overhead.steps_per_round(dm, wl.rounds)
    device = torch.device("cpu")
    pfl_here = {"pfl": meta["pfl_process_version"], "pfl-inproc": meta["pfl_version"]}
    variants = [v for v in args.variants if pfl_here.get(v, True)]
    runs: dict[str, list[overhead.RunResult]] = {v: [] for v in variants}
    loads: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="pfl_compare_") as tmp:
        job = write_job(Path(tmp) / "job.pt", wl, dm, init_state, threads) if "pfl" in variants else None
        for rep in range(wl.repeats):
            shift = rep % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                before = os.getloadavg()[0]
                runs[variant].append(_run(variant, wl, dm, init_state, device, job, args.pfl_python))
                loads[variant] += [before, os.getloadavg()[0]]
                print(f"  {name:>4} S={wl.samples_per_client // wl.batch:<3} C={cohort:<3} threads={threads} "
                      f"{variant:>10} repeat {rep}: s/round "
                      + " ".join(f"{t:.3f}" for t in runs[variant][-1].wall) + "  cpu s/round "
                      + " ".join(f"{t:.3f}" for t in runs[variant][-1].cpu) + f"  load {loads[variant][-1]:.2f}",
                      flush=True)
    base = dict(workload=name, steps_per_client=-(-wl.samples_per_client // wl.batch), cohort=cohort, threads=threads,
                repeats=wl.repeats, local_steps_per_round=f"{steps:g}",
                params=params, clients=wl.clients, samples_per_client=wl.samples_per_client, batch=wl.batch,
                **{k: v for k, v in meta.items() if k in COLUMNS})
    med = {v: statistics.median([t for r in runs[v] for t in r.wall[1:]]) for v in variants}
    low = {v: min(t for r in runs[v] for t in r.wall[1:]) for v in variants}
    cpu = {v: statistics.median([t for r in runs[v] for t in r.cpu[1:]]) for v in variants}
    rows = []
    for variant in args.variants:
        row = {c: "" for c in COLUMNS}
        row.update(base, variant=variant, status="ok", timestamp=datetime.datetime.now().isoformat(timespec="seconds"))
        row["pfl_version"] = (meta["pfl_process_version"] if variant == "pfl" else meta["pfl_version"]) or ""
        if variant not in variants:
            where = f"in --pfl-python {args.pfl_python}" if variant == "pfl" else "here"
            row.update(status="skipped", note=f"pfl does not import {where} (bash benchmarks/setup_pfl_env.sh, then "
                                              "run with benchmarks/.venv-pfl/bin/python)")
            rows.append(row)
            continue
        walls = [t for r in runs[variant] for t in r.wall[1:]]
        diff = (runs[variant][-1].weights[-1] - runs["plain"][-1].weights[-1]).abs().max()
        row.update(s_per_round_median=f"{med[variant]:.6g}", s_per_round_min=f"{min(walls):.6g}",
                   ratio_to_plain=f"{med[variant] / med['plain']:.4f}",
                   ratio_min_to_plain_min=f"{low[variant] / low['plain']:.4f}", ms_per_local_step=f"{1e3 * med[variant] / steps:.6g}",
                   framework_ms_per_step=f"{1e3 * (med[variant] - med['plain']) / steps:.4g}",
                   max_abs_diff_vs_plain=f"{float(diff):.3g}", rounds_measured=len(walls),
                   loadavg_1m_min=f"{min(loads[variant]):.2f}", loadavg_1m_max=f"{max(loads[variant]):.2f}",
                   cpu_s_per_round_median=f"{cpu[variant]:.6g}", cpu_ratio_to_plain=f"{cpu[variant] / cpu['plain']:.4f}")
        if variant == "sequential":
            row["note"] = f"local step path: {runs[variant][-1].step_path}"
        elif variant == "pfl":
            row["note"] = f"own process (pfl_worker.py), no Lightning imported, {NVML_CHECK} unset"
        elif variant == "pfl-inproc":
            row["note"] = f"in this process after import lightning, {NVML_CHECK}={os.environ.get(NVML_CHECK)}"
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- report
_LABELS = {"cnn": "CNN", "mlp": "MLP 784-256-10"}


def markdown_table(rows: Sequence[dict]) -> str:
    """Issue #33's table from the CSV rows: one line per (workload, local steps a client where the rows give them,
    cohort, threads), s/round ÷ plain loop of pfl (its own process), pfl in this process (``pfl-inproc``),
    sequential and vectorized — median ÷ median, and in parentheses minimum ÷ minimum where the rows have it (the
    less load-sensitive figure) — the plain loop's median s/round and the load range during the cell. Missing or
    skipped variants show as "—"."""
    cells: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        steps = row.get("steps_per_client")
        key = (str(row["workload"]), int(steps) if steps not in (None, "") else 0, int(row["cohort"]),
               int(row["threads"]))
        cells.setdefault(key, {})[str(row["variant"])] = row
    lines = ["| workload (cohort C, threads) | plain s/round | pfl | pfl in-process | lightning_fed sequential | "
             "lightning_fed vectorized | load (1-min) |", "|---|---|---|---|---|---|---|"]

    def ratio(cell: dict, variant: str) -> str:
        row = cell.get(variant)
        if not row or row.get("status") != "ok":
            return "—"
        low = row.get("ratio_min_to_plain_min")
        return f"{float(row['ratio_to_plain']):.2f}" + (f" ({float(low):.2f})" if low not in (None, "") else "")

    order = {w: i for i, w in enumerate(WORKLOADS)}
    for key in sorted(cells, key=lambda k: (order.get(k[0], len(order)), *k)):
        (name, steps, cohort, threads), cell = key, cells[key]
        ok = [r for r in cell.values() if r.get("status") == "ok" and r.get("loadavg_1m_min") not in (None, "")]
        load = (f"{min(float(r['loadavg_1m_min']) for r in ok):.2f}–{max(float(r['loadavg_1m_max']) for r in ok):.2f}"
                if ok else "—")
        plain = cell.get("plain")
        plain_s = f"{float(plain['s_per_round_median']):.3f}" if plain and plain.get("status") == "ok" else "—"
        label = (f"{_LABELS.get(name, name)}, {f'{steps} steps, ' if steps else ''}C = {cohort}, "
                 f"{threads} thread{'s' if threads != 1 else ''}")
        lines.append(f"| {label} | {plain_s} | {ratio(cell, 'pfl')} | {ratio(cell, 'pfl-inproc')} | "
                     f"{ratio(cell, 'sequential')} | "
                     f"{ratio(cell, 'vectorized')} | {load} |")
    return "\n".join(lines)


def write_report(out: Path, columns: Sequence[str], rows: list[dict], table: str, start: float) -> Path:
    """Write ``rows`` to the CSV ``out`` (``columns`` in order), print ``table`` and how long the run took since
    ``start`` (``time.perf_counter``) with the load now; returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print("\n" + table)
    print(f"\nwrote {out} ({len(rows)} rows) in {time.perf_counter() - start:.0f} s; load now {os.getloadavg()}")
    return out


def omp_env() -> str:
    """The OpenMP settings the process started with (they apply from torch's import on; see benchmarks/README.md: on a busy
    machine OpenMP's default spin-waiting makes every 2-thread run many times slower, OMP_WAIT_POLICY=passive not)."""
    return " ".join(f"{k}={os.environ.get(k, 'unset')}" for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"))


def default_out(quick: bool) -> Path:
    name = gpu_suite.device_name(torch.device("cpu")).removeprefix("cpu: ")
    slug = gpu_suite._slug(name) if name else gpu_suite._slug(socket.gethostname())
    return HERE / "results" / "pfl_compare" / f"{slug}{'-quick' if quick else ''}.csv"


def main(argv: Optional[Sequence[str]] = None) -> Path:
    """Run every cell; write the CSV and print the table. Lightning's log level, the warning filters and torch's
    thread count are restored on return."""
    args = parse_args(argv)
    logger = logging.getLogger("lightning.pytorch")
    level, threads0 = logger.level, torch.get_num_threads()
    out = Path(args.out) if args.out else default_out(args.quick)
    meta = dict(cpu=gpu_suite.device_name(torch.device("cpu")).removeprefix("cpu: "), host=socket.gethostname(),
                omp_env=omp_env(), torch_version=torch.__version__, pfl_version=pfl_version(),
                pfl_process_version=pfl_process_version(args.pfl_python) if "pfl" in args.variants else None)
    start = time.perf_counter()
    print(f"pfl_compare: torch {torch.__version__}, pfl {meta['pfl_version'] or 'not importable'} (own process: "
          f"{meta['pfl_process_version'] or 'not importable or not asked'}), cpu {meta['cpu']} "
          f"({os.cpu_count()} cores), {meta['omp_env']}, "
          f"load {os.getloadavg()}, quick={args.quick}", flush=True)
    rows: list[dict] = []
    try:
        with warnings.catch_warnings():
            logger.setLevel(logging.ERROR)
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*GPU available but not used.*")
            for threads in args.threads:
                torch.set_num_threads(threads)
                for name in args.workloads:
                    for steps in args.steps_per_client or [None]:
                        for cohort in args.cohorts:
                            rows += run_cell(args, name, cohort, threads, meta, steps)
    finally:
        logger.setLevel(level)
        torch.set_num_threads(threads0)
    return write_report(out, COLUMNS, rows, markdown_table(rows), start)


if __name__ == "__main__":
    main()
