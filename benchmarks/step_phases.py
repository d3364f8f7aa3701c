"""Issue #33.1: where a local step's time goes, phase by phase, in the plain PyTorch loop and in lightning_fed.

``overhead.py`` gives the whole step's overhead; this script splits it. The same workload (``overhead.py``'s: IID
synthetic clients, cohort C, one local epoch, client SGD, FedAvg) runs through ``overhead.run_plain`` and
``overhead.run_lightning`` (the sequential executor, lean local step), interleaved ``--repeats`` times, with a
``time.perf_counter`` around each call of:

* ``forward+loss``: the plain loop's ``F.cross_entropy(model(x), y)``; for lightning_fed the module's
  ``training_step`` (the same forward and loss, plus its ``self.log("train_loss", ...)``), reported as
  ``training_step``;
* ``self.log``: the lean step's fast ``self.log`` (:meth:`lightning_fed.client.lean_step.LeanLocalStep.log`), inside
  ``training_step``;
* ``zero_grad``, ``backward`` (``Tensor.backward``), ``optimizer.step`` (``torch.optim.SGD``'s), the same calls in both;
* ``step``: lightning_fed's whole lean step (:meth:`LeanLocalStep.step`; batch to device, closure, update, counters).

The timers are attached for the run and removed after it (``timed``); each adds well under a microsecond per call,
the same in both variants. Per phase: the median over repeats of the mean µs per call. Example (2-core CPU, linear
model, 1 thread, about 20 s)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_phases.py --cnn-arch linear --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import overhead  # noqa: E402
from lightning_fed.client.lean_step import LeanLocalStep  # noqa: E402
from lightning_fed.models.classifier import Classifier  # noqa: E402

PHASES = ("forward+loss", "training_step", "self.log", "zero_grad", "backward", "optimizer.step", "step")


@contextlib.contextmanager
def timed(totals: dict[str, list]) -> Iterator[None]:
    """Accumulate ``[seconds, calls]`` per phase in ``totals`` while active; the originals are restored after."""
    targets = [(torch.optim.SGD, "zero_grad", "zero_grad"), (torch.optim.SGD, "step", "optimizer.step"),
               (torch.Tensor, "backward", "backward"), (Classifier, "training_step", "training_step"),
               (LeanLocalStep, "log", "self.log"), (LeanLocalStep, "step", "step")]
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in targets]  # None: inherited
    saved_loss_fn = overhead.loss_fn

    def wrap(fn: Any, phase: str) -> Any:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                entry = totals.setdefault(phase, [0.0, 0])
                entry[0] += time.perf_counter() - start
                entry[1] += 1
        # (torch.optim.Optimizer wraps an optimizer class's `step` with its hooks once, marking it `hooked`)
        timed_call.hooked = getattr(fn, "hooked", None)  # type: ignore[attr-defined]
        return timed_call

    def loss_fn(args: argparse.Namespace) -> Any:
        return wrap(saved_loss_fn(args), "forward+loss")

    try:
        for owner, name, phase in targets:
            setattr(owner, name, wrap(getattr(owner, name), phase))
        overhead.loss_fn = loss_fn
        yield
    finally:
        overhead.loss_fn = saved_loss_fn
        for owner, name, original in saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cnn-arch", choices=("linear", "mlp256", "fedavg"), default="linear",
                   help="overhead.py's model (default linear: the smallest step, where framework time shows most)")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--samples-per-client", type=int, default=600)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4, help="rounds per run (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each variant (default 3)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = p.parse_args(argv)
    for name in ("clients", "cohort", "samples_per_client", "batch", "rounds", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.cohort > args.clients:
        p.error(f"--cohort must be <= --clients ({args.clients}), got {args.cohort}")
    return args


def main(argv: Optional[list[str]] = None) -> dict[str, dict[str, float]]:
    """Run both variants; returns ``{variant: {phase: median µs per call}}`` and prints the table."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    wl = argparse.Namespace(model="cnn", cnn_arch=args.cnn_arch, clients=args.clients, cohort=args.cohort,
                            samples_per_client=args.samples_per_client, batch=args.batch, rounds=args.rounds,
                            repeats=args.repeats, epochs=1, lr=0.05, hidden=256, channels_last=False,
                            max_parallel=None)
    device = torch.device(args.device)
    dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
    init_state = {k: v.clone() for k, v in overhead.make_model(wl).state_dict().items()}
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "lightning_fed": []}
    for rep in range(args.repeats):
        order = ("plain", "lightning_fed") if rep % 2 == 0 else ("lightning_fed", "plain")
        for variant in order:
            totals: dict[str, list] = {}
            with timed(totals):
                if variant == "plain":
                    overhead.run_plain(wl, dm, init_state, device)
                else:
                    overhead.run_lightning(wl, dm, init_state, device)
            runs[variant].append({k: 1e6 * t / n for k, (t, n) in totals.items() if n})
    result = {v: {p: statistics.median(r[p] for r in rs) for p in PHASES if all(p in r for r in rs)}
              for v, rs in runs.items()}
    print(f"µs per call, median of {args.repeats} runs ({args.cnn_arch}, C={args.cohort}, B={args.batch}, "
          f"{args.device}, {args.threads} thread(s))")
    print(f"{'phase':>16} {'plain':>9} {'lightning_fed':>14}")
    for phase in PHASES:
        cells = [f"{result[v][phase]:.1f}" if phase in result[v] else "—" for v in ("plain", "lightning_fed")]
        print(f"{phase:>16} {cells[0]:>9} {cells[1]:>14}")
    return result


if __name__ == "__main__":
    main()
