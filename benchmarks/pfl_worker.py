"""pfl-research's FedAvg on a fixed schedule, importing only torch, numpy and pfl (issue #51): what a pfl user runs.

    benchmarks/.venv-pfl/bin/python benchmarks/pfl_worker.py JOB.pt RESULT.pt     # started by pfl_compare.py

Why a process of its own: importing Lightning (``lightning.fabric``'s ``__init__``) sets
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` in ``os.environ``, and with it ``torch.cuda.is_available()`` asks NVML again at
every call instead of returning its cached answer; pfl 0.6 calls it (through
``pfl.internal.ops.pytorch_ops.get_default_device``) for every tensor of every batch it moves. A pfl user's process
never imports Lightning, so pfl measured beside Lightning in one process is slower than any pfl user sees it
(25–40 % on the small MLP of issue #51). This module holds the pieces of pfl's run that both of
``pfl_compare.py``'s pfl columns share — :func:`run_fedavg` (pfl's FedAvg on a given schedule) and the job file's
format — and, run as a script, runs one job in a process that has imported neither Lightning nor lightning_fed (it
refuses to run with the variable set, and records that Lightning stayed out of ``sys.modules``).

A job (``torch.save`` of a dict, written by ``pfl_compare.write_job``): ``net`` (a ``torch.nn`` module of standard
layers only, e.g. the benchmark model's ``nn.Sequential``, with its initial weights), ``x`` / ``y`` (all training
samples and labels), ``plan`` (``[(round, client id, int64 index tensor)]`` in the order pfl samples the users:
each round's cohort, each client's samples in the order of that round's mini-batches), ``rounds``, ``cohort``,
``epochs``, ``lr``, ``batch``, ``threads``. The result (``torch.save`` of a dict): ``wall`` and ``cpu`` (seconds per
round: ``time.perf_counter`` and this process's ``time.process_time``), ``weights`` (the flat float32 weights after
the last round), ``total``, ``pfl_version``, ``nvml_check`` (the variable's value in this process: ``None``),
``lightning_imported`` (``False``) and ``threads``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

#: The variable that ``import lightning`` sets (``lightning/fabric/__init__.py``); see the module docstring.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def pfl_version() -> Optional[str]:
    """pfl's version, or None when it does not import (with ``pfl.model.pytorch``)."""
    try:
        import importlib.metadata

        import pfl  # noqa: F401
        import pfl.model.pytorch  # noqa: F401
        return importlib.metadata.version("pfl")
    except Exception:  # noqa: BLE001  (ImportError, or a pfl that does not load with this torch)
        return None


def cross_entropy_loss(net: torch.nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """The image workloads' loss (the Classifier's ``training_step`` without ``self.log``)."""
    return F.cross_entropy(net(batch[0]), batch[1])


class PflModule(torch.nn.Module):
    """A model with the ``loss`` and ``metrics`` methods pfl's ``PyTorchModel`` calls."""

    def __init__(self, net: torch.nn.Module, compute_loss: Callable[[torch.nn.Module, Any], torch.Tensor]) -> None:
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


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in module.parameters()])


def run_fedavg(net: torch.nn.Module, compute_loss, x_all: torch.Tensor, y_all: torch.Tensor, plan: Sequence[tuple],
               *, rounds: int, cohort: int, epochs: int, lr: float, batch: int,
               device: torch.device = torch.device("cpu")) -> dict:
    """pfl 0.6's ``FederatedAveraging`` on a ``SimulatedBackend`` over ``plan`` (see the module docstring): a user
    sampler that returns the plan's users in order, a user's ``Dataset`` made lazily inside the round from its
    index tensor (the samples gathered as the plain loop gathers them), local SGD (``NNTrainHyperParams(
    local_num_epochs=epochs, local_learning_rate=lr, local_batch_size=batch)``), central SGD with lr 1,
    ``WeightByDatapoints``; metrics not sent to pfl's platform, users evaluated in round 0 only (pfl always does).

    Returns ``{"wall": [s per round], "cpu": [process CPU s per round], "weights": [flat weights per round],
    "total": s}``; the copy of the weights after a round is not timed.

    Under ``torchrun`` (``pfl_processes.py``) the same plan serves every worker: pfl's distributed sampler draws one
    user per worker at each call and keeps its rank's, so worker r trains cohort positions i ≡ r (mod W) (C a
    multiple of W), and pfl all-reduces the summed statistics.
    """
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    module = PflModule(net, compute_loss).to(device).train()
    indices = {(r, cid): index for r, cid, index in plan}
    schedule = iter([(r, cid) for r, cid, _ in plan])

    def make_dataset(user: tuple[int, int]) -> Dataset:  # called lazily in the round, as the plain loop indexes
        index = indices[user]
        return Dataset(raw_data=[x_all[index].to(device), y_all[index].to(device)], user_id=str(user[1]))

    result: dict = {"wall": [], "cpu": [], "weights": []}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    class _Timer(TrainingProcessCallback):
        def on_train_begin(self, *, model) -> Metrics:
            self.start = (time.perf_counter(), time.process_time())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            sync()
            result["wall"].append(time.perf_counter() - self.start[0])
            result["cpu"].append(time.process_time() - self.start[1])
            result["weights"].append(_flat(module))
            self.start = (time.perf_counter(), time.process_time())  # the weights' copy is not timed
            return False, Metrics()

    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    data = FederatedDataset(make_dataset, user_sampler=lambda: next(schedule))
    backend = SimulatedBackend(training_data=data, val_data=data, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds + 1,
                                         train_cohort_size=cohort, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_num_epochs=epochs, local_learning_rate=lr, local_batch_size=batch)
    start = time.perf_counter()
    FederatedAveraging().run(algorithm_params, backend, model, train_params, callbacks=[_Timer()],
                             send_metrics_to_platform=False)
    result["total"] = time.perf_counter() - start
    return result


def run_job(job: dict) -> dict:
    """Run one job (the module docstring's dict) with :func:`run_fedavg` on the CPU; the result dict."""
    torch.set_num_threads(int(job["threads"]))
    out = run_fedavg(job["net"], cross_entropy_loss, job["x"], job["y"], job["plan"], rounds=job["rounds"],
                     cohort=job["cohort"], epochs=job["epochs"], lr=job["lr"], batch=job["batch"])
    out["weights"] = out["weights"][-1:]
    out.update(pfl_version=pfl_version(), nvml_check=os.environ.get(NVML_CHECK),
               lightning_imported=any(m == "lightning" or m.startswith(("lightning.", "lightning_fed", "pytorch_lightning"))
                                      for m in sys.modules), threads=torch.get_num_threads())
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        raise SystemExit("usage: pfl_worker.py JOB.pt RESULT.pt")
    if os.environ.get(NVML_CHECK) is not None:
        raise SystemExit(f"pfl_worker: {NVML_CHECK} is set ({os.environ[NVML_CHECK]!r}); a pfl user's process does "
                         "not set it: start this script without it")
    job = torch.load(argv[0], weights_only=False)
    torch.save(run_job(job), argv[1])


if __name__ == "__main__":
    main()
