"""pfl-research's FedAvg on the benchmark workload (``benchmarks/overhead.py``): the same cohorts, mini-batches and
client SGD steps as the plain loop, for ``pfl_compare.py``, ``pfl_processes.py`` and ``gpu_suite.py``. pfl (0.6.0) is
not a dependency of lightning_fed: ``bash benchmarks/setup_pfl_env.sh`` makes a venv with it (or, on the offline GPU
machine, ``benchmarks/device_wheels.sh`` / ``device_run.sh``); :func:`pfl_version` says whether it imports."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402  (the shared workload and the run result)


def pfl_version() -> Optional[str]:
    """pfl's version, or None when it does not import (with ``pfl.model.pytorch``)."""
    try:
        import importlib.metadata

        import pfl  # noqa: F401
        import pfl.model.pytorch  # noqa: F401
        return importlib.metadata.version("pfl")
    except Exception:  # noqa: BLE001  (ImportError, or a pfl that does not load with this torch)
        return None


class _PflModule(torch.nn.Module):
    """The benchmark's model with the ``loss`` and ``metrics`` methods pfl's ``PyTorchModel`` calls."""

    def __init__(self, net: torch.nn.Module, compute_loss) -> None:
        super().__init__()
        self.net = net
        self._compute_loss = compute_loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._compute_loss(self.net, (x, y))

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        from pfl.metrics import Weighted

        return {"loss": Weighted(float(self.loss(x, y)) * len(x), len(x))}


def run_pfl(wl: argparse.Namespace, dm, init_state: dict, device: torch.device) -> overhead.RunResult:
    """FedAvg by pfl's simulator on the plain loop's cohorts and mini-batches; per-round wall/CPU time and weights.

    Under ``torchrun`` (``pfl_processes.py``) the same schedule serves every worker: pfl's distributed sampler draws
    one user per worker at each call and keeps its rank's, so worker r trains cohort positions i ≡ r (mod W) (C a
    multiple of W), and pfl all-reduces the summed statistics."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    net = overhead.make_model(wl)
    net.load_state_dict(init_state)
    module = _PflModule(net, overhead.loss_fn(wl)).to(device).train()
    x_all, y_all = dm.train_dataset.tensors
    schedule = iter([(r, cid) for r in range(wl.rounds) for cid in dm.sample_clients(r).tolist()])

    def make_dataset(user: tuple[int, int]) -> Dataset:  # called lazily in the round, as the plain loop indexes
        round_idx, cid = user
        batches = dm.client_batches(cid, round_idx)
        if any(len(b) != wl.batch for b in batches[:-1]):
            raise RuntimeError("pfl slices a user's data in batches of B: every batch but the last must have B")
        index = torch.from_numpy(np.concatenate(batches).astype(np.int64))
        return Dataset(raw_data=[x_all[index].to(device), y_all[index].to(device)], user_id=str(cid))

    result = overhead.RunResult()

    class _Timer(TrainingProcessCallback):
        def on_train_begin(self, *, model) -> Metrics:
            self.start = (time.perf_counter(), time.process_time())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            overhead.sync(device)
            result.add(self.start, module)
            self.start = (time.perf_counter(), time.process_time())  # the weights' copy is not timed
            return False, Metrics()

    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    data = FederatedDataset(make_dataset, user_sampler=lambda: next(schedule))
    backend = SimulatedBackend(training_data=data, val_data=data, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(central_num_iterations=wl.rounds, evaluation_frequency=wl.rounds + 1,
                                         train_cohort_size=wl.cohort, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_num_epochs=wl.epochs, local_learning_rate=wl.lr,
                                      local_batch_size=wl.batch)
    start = time.perf_counter()
    FederatedAveraging().run(algorithm_params, backend, model, train_params, callbacks=[_Timer()],
                             send_metrics_to_platform=False)
    result.total = time.perf_counter() - start
    return result
