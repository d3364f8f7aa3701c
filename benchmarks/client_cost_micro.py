"""Issue #51 (session 5): interleaved micro-timings of the per-client pieces it changed, before (main's expression,
inline here) against after (the library's), thread CPU time, minimum of 15 repeats of 2,000 calls::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/client_cost_micro.py

* the logger connector's update at a lean client's end: ``on_batch_end()`` / ``_lightning.end_logged_batch``;
* ``client_seed``: ``SeedSequence([...])`` of a list / ``seeding.seed_sequence``;
* one pass's batch order: ``default_rng([...]).permutation(50)`` / ``seeding.default_rng(...)``.
"""
import os, sys, time, timeit, logging, warnings
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np, torch
from lightning.pytorch.trainer.states import RunningStage
from lightning_fed import FederatedTrainer, _lightning
from lightning_fed.client.sequential import client_seed
from lightning_fed.datamodules.local_work import ClientWork, batch_schedule, _epoch_order
from lightning_fed.seeding import default_rng
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR); warnings.filterwarnings("ignore"); torch.set_num_threads(1)
trainer = FederatedTrainer(max_epochs=1, logger=False)
trainer.state.stage = RunningStage.TRAINING
connector, results = trainer._logger_connector, trainer.fit_loop.epoch_loop._results
results.log("training_step", "train_loss", torch.tensor(1.5), prog_bar=True, on_step=True, on_epoch=False, batch_size=10)
connector._first_loop_iter = False
metric = results["training_step.train_loss"]
def old_end():
    metric._forward_cache = torch.tensor(1.5); connector.on_batch_end()
def new_end():
    metric._forward_cache = torch.tensor(1.5); _lightning.end_logged_batch(trainer, results)
def old_seed(): return int(np.random.SeedSequence([0, 0x7C1E, 3, 17]).generate_state(1, dtype=np.uint32)[0])
def new_seed(): return client_seed(0, 3, 17)
def old_order(): return np.random.default_rng([0, 3, 17, 0, 0x52534846]).permutation(50)
def new_order(): return default_rng(0, 3, 17, 0, 0x52534846).permutation(50)
pairs = {"logger connector at a client's end": (old_end, new_end), "client_seed": (old_seed, new_seed),
         "batch order (one pass of 50)": (old_order, new_order)}
timer = time.thread_time
for name, (old, new) in pairs.items():
    best = {"old": [], "new": []}
    for _ in range(15):
        for k, f in (("old", old), ("new", new)):
            best[k].append(timeit.Timer(f, timer=timer).timeit(2000) / 2000 * 1e6)
    o, n = min(best["old"]), min(best["new"])
    print(f"{name:36s} before {o:6.1f} us  after {n:6.1f} us  saved {o - n:5.1f} us  (load {os.getloadavg()[0]:.1f})")
