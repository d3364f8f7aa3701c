"""Issue #55: what a round of each personalised-breadth method costs, before and after a change (CPU time).

``python benchmarks/personalised_breadth_cost.py run BEFORE_SRC AFTER_SRC OUT_DIR [ROUNDS] [reps=N] [METHOD ...]``
runs, for each of two source trees (a folder holding a ``lightning_fed`` package: e.g. ``git archive main
lightning_fed`` unpacked, and the worktree), one process that fits every method's
``examples/personalised_breadth_<method>.yaml`` (Fashion-MNIST, Dirichlet(0.1), 100 clients) for ``ROUNDS`` rounds
(default 4) with one evaluation of every client at the last round, one thread, no logger; the two processes
alternate (before, after, before, after: ``reps``, default 2), the load average recorded beside each method. It
writes ``OUT_DIR/<tree>_<rep>.json``: per method each round's thread CPU seconds (the federated round,
``FederatedFitLoop._synchronous_round``), the whole fit's process CPU seconds (data loading, sanity check and the
evaluation included), a SHA-256 of the final global model's ``state_dict`` and the logged metrics.
``compare OUT_DIR`` prints per method the median and mean round (round 0 left out) before and after and whether
every run agrees bit for bit (weights and metrics; those with ``time`` in their name, wall-clock seconds, left
out). The examples' data section is used as is (``data_dir: data``: run it from a folder whose ``data/`` holds the
data sets).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("fedavg", "pfedme", "fedala", "apfl", "ditto", "perfedavg", "fedbabu", "ifca")


def _digest(obj) -> str:
    import torch

    h = hashlib.sha256()
    if isinstance(obj, dict):
        for k in sorted(obj):
            h.update(k.encode())
            v = obj[k]
            h.update((v.detach().cpu().numpy().tobytes() if isinstance(v, torch.Tensor) else repr(v).encode()))
    return h.hexdigest()


def fit_all(examples: Path, rounds: int, methods: list[str]) -> dict:
    """In this process (its ``lightning_fed`` the tree under test): fit each method, per-round thread CPU."""
    import torch

    torch.set_num_threads(1)
    from lightning_fed import loop
    from lightning_fed.cli import main

    times: list[float] = []
    original = loop.FederatedFitLoop._synchronous_round

    def timed(self, rnd):
        start = time.thread_time()
        try:
            return original(self, rnd)
        finally:
            times.append(time.thread_time() - start)

    loop.FederatedFitLoop._synchronous_round = timed
    out = {}
    for method in methods:
        times.clear()
        trainers = []
        from lightning_fed import trainer as trainer_module

        fit = trainer_module.FederatedTrainer.fit

        def keep(self, *args, **kwargs):
            trainers.append(self)
            return fit(self, *args, **kwargs)

        trainer_module.FederatedTrainer.fit = keep
        start = time.process_time()
        try:
            main(["fit", "--config", str(examples / f"personalised_breadth_{method}.yaml"),
                  "--trainer.max_epochs", str(rounds), "--trainer.check_val_every_n_epoch", str(rounds),
                  "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
                  "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])
        finally:
            trainer_module.FederatedTrainer.fit = fit
        cpu = time.process_time() - start
        trainer = trainers[-1]
        out[method] = {"round_cpu_s": list(times), "fit_cpu_s": cpu, "load": os.getloadavg()[0],
                       "weights": _digest(trainer.lightning_module.state_dict()),
                       "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}}
        print(method, json.dumps(out[method]), flush=True)
    return out


def run(before: Path, after: Path, out_dir: Path, rounds: int, methods: list[str], reps: int = 1) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    examples = Path(__file__).resolve().parents[1] / "examples"
    for rep in range(reps):
        for name, tree in (("before", before), ("after", after)):
            env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
            code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
                    f"import personalised_breadth_cost as c, pathlib; "
                    f"r = c.fit_all(pathlib.Path({str(examples)!r}), {rounds}, {methods!r}); "
                    f"pathlib.Path({str(out_dir / f'{name}_{rep}.json')!r}).write_text(json.dumps(r))")
            subprocess.run([sys.executable, "-c", code], env=env, check=True)


def compare(out_dir: Path) -> None:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))}
    methods = next(iter(runs.values())).keys()
    print("| method | before s/round, median (mean) | after | after/before | fit CPU before → after s | bit for bit |")
    print("|---|---|---|---|---|---|")
    for m in methods:
        per = {t: [s for k, r in runs.items() if k.startswith(t) for s in r[m]["round_cpu_s"][1:]]
               for t in ("before", "after")}
        fit = {t: statistics.median(r[m]["fit_cpu_s"] for k, r in runs.items() if k.startswith(t))
               for t in ("before", "after")}
        same = len({(r[m]["weights"], json.dumps({k: v for k, v in sorted(r[m]["metrics"].items())
                                                   if "time" not in k})) for r in runs.values()}) == 1
        b, a = statistics.median(per["before"]), statistics.median(per["after"])
        mb, ma = statistics.mean(per["before"]), statistics.mean(per["after"])
        print(f"| {m} | {b:.2f} ({mb:.2f}) | {a:.2f} ({ma:.2f}) | {a / b:.2f} ({ma / mb:.2f}) | {fit['before']:.0f} → {fit['after']:.0f} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        rest = sys.argv[5:]
        rounds = int(rest[0]) if rest and rest[0].isdigit() else 4
        reps = [int(a.split("=")[1]) for a in rest if a.startswith("reps=")] or [2]
        chosen = [m for m in rest if not m.isdigit() and "=" not in m] or list(METHODS)
        run(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), rounds, chosen, reps[0])
    else:
        compare(Path(sys.argv[2]))
