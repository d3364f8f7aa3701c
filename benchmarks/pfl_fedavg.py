"""pfl-research's FedAvg on the benchmark workload (``benchmarks/overhead.py``): the same cohorts, mini-batches and
client SGD steps as the plain loop, for ``pfl_compare.py``, ``pfl_processes.py`` and ``gpu_suite.py``. pfl (0.6.0) is
not a dependency of lightning_fed: ``bash benchmarks/setup_pfl_env.sh`` makes a venv with it (or, on the offline GPU
machine, ``benchmarks/device_wheels.sh`` / ``device_run.sh``); :func:`pfl_version` says whether it imports. pfl's run
itself is ``pfl_worker.run_fedavg``, which ``pfl_compare.py`` also runs in a process that never imports Lightning
(``pfl_worker.py``'s docstring says why); :func:`run_pfl` runs it here, beside Lightning."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402  (the shared workload and the run result)
from pfl_worker import pfl_version, run_fedavg  # noqa: E402,F401  (pfl's run, shared with the Lightning-free process)


def client_plan(wl: argparse.Namespace, dm) -> list[tuple[int, int, torch.Tensor]]:
    """The plain loop's schedule for pfl: ``[(round, client id, int64 index tensor)]``, each round's cohort
    (``dm.sample_clients``) in order, each client's samples in the order of that round's mini-batches
    (``dm.client_batches``), so that pfl's ``iter(B)`` slices the very same batches. Computed before the run (pfl
    does not pay for the batch plan, which the plain loop and lightning_fed compute inside their rounds: about
    0.06 ms a client here)."""
    plan = []
    for round_idx in range(wl.rounds):
        for cid in dm.sample_clients(round_idx).tolist():
            batches = dm.client_batches(cid, round_idx)
            if any(len(b) != wl.batch for b in batches[:-1]):
                raise RuntimeError("pfl slices a user's data in batches of B: every batch but the last must have B")
            plan.append((round_idx, cid, torch.from_numpy(np.concatenate(batches).astype(np.int64))))
    return plan


def run_pfl(wl: argparse.Namespace, dm, init_state: dict, device: torch.device,
            net: Optional[torch.nn.Module] = None, compute_loss=None) -> overhead.RunResult:
    """FedAvg by pfl's simulator (:func:`pfl_worker.run_fedavg`) on the plain loop's cohorts and mini-batches
    (:func:`client_plan`), in this process; per-round wall/CPU time and weights. ``net`` / ``compute_loss``
    (default: the benchmark's module with ``init_state`` and its loss) replace the model and loss."""
    if net is None:
        net = overhead.make_model(wl)
        net.load_state_dict(init_state)
    x_all, y_all = dm.train_dataset.tensors
    out = run_fedavg(net, compute_loss or overhead.loss_fn(wl), x_all, y_all, client_plan(wl, dm), rounds=wl.rounds,
                     cohort=wl.cohort, epochs=wl.epochs, lr=wl.lr, batch=wl.batch, device=device)
    return overhead.RunResult(wall=out["wall"], cpu=out["cpu"], weights=out["weights"], total=out["total"])
