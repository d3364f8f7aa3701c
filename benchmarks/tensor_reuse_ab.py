"""Issue #51 (session 6): the sequential executor with and without ``lightning_fed.tensor_reuse`` in one process::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tensor_reuse_ab.py                    # MLP, C = 10, 10 rounds x 6
    W=cnn C=10 R=5 REPS=4 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tensor_reuse_ab.py

Fits of ``overhead.run_lightning`` (100 clients x 50 samples, B = 10: 5 local steps a client) alternate between
reuse on (the library as it is) and off (``tensor_reuse._ALONE = None``: no tensor counts as unshared, so Δ_i and the
weighted mean's tensors are new every round, as before session 6), in alternating order, with the plain loop
(``overhead.run_plain``) before each pair; every fit's weights equal the plain loop's bit for bit. Prints, for each,
the median thread CPU ms a round (rounds 1 on), the median minor page faults a round and the mean system ms a round
(``getrusage(RUSAGE_THREAD)``). ``W`` (``mlp``/``cnn``), ``C``, ``R`` (rounds a fit), ``REPS`` from the environment.
"""
import json
import logging
import os
import resource
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

import gpu_suite  # noqa: E402
import overhead  # noqa: E402
from lightning_fed import tensor_reuse  # noqa: E402

torch.set_num_threads(1)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")
C, R, REPS, W = (int(os.environ.get("C", "10")), int(os.environ.get("R", "10")), int(os.environ.get("REPS", "6")),
                 os.environ.get("W", "mlp"))
wl = gpu_suite.workload_args(W, quick=False)
for k, v in dict(clients=100, cohort=C, samples_per_client=50, batch=10, rounds=R, repeats=1).items():
    setattr(wl, k, v)
dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
init = {k: v.clone() for k, v in overhead.make_model(wl).state_dict().items()}


def usage():
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return time.thread_time(), r.ru_minflt, r.ru_stime


rounds = []


class RoundUsage(Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        self.start = usage()

    def on_train_epoch_end(self, trainer, pl_module):
        rounds.append(tuple(b - a for a, b in zip(self.start, usage())))


make_trainer = overhead.FederatedTrainer
overhead.FederatedTrainer = lambda *a, **kw: make_trainer(*a, **{**kw, "callbacks": [*kw["callbacks"], RoundUsage()]})
alone = tensor_reuse._ALONE
result = {"on": [], "off": [], "plain": []}
for rep in range(REPS):
    plain = overhead.run_plain(wl, dm, init, torch.device("cpu"))
    result["plain"] += [(cpu, 0, 0.0) for cpu in plain.cpu[1:]]  # (process CPU time; faults not counted)
    for mode in ("off", "on") if rep % 2 == 0 else ("on", "off"):
        tensor_reuse._ALONE = alone if mode == "on" else None
        rounds.clear()
        weights = overhead.run_lightning(wl, dm, init, torch.device("cpu")).weights[-1]
        result[mode] += rounds[1:]
        assert torch.equal(weights, plain.weights[-1])
    tensor_reuse._ALONE = alone
summary = {mode: dict(cpu_ms=round(statistics.median(r[0] for r in rows) * 1e3, 1),
                      faults=statistics.median(r[1] for r in rows),
                      sys_ms=round(statistics.mean(r[2] for r in rows) * 1e3, 2), rounds=len(rows))
           for mode, rows in result.items()}
print(f"{W} C={C} {json.dumps(summary)} load {os.getloadavg()[0]:.1f}")
