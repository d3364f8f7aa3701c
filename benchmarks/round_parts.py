"""Issue #51 (session 5): a sequential round split into its parts against the plain loop's, thread CPU time::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/round_parts.py          # MLP, 100 clients x 50 samples, B = 10, C = 10
    C=50 REPS=2 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/round_parts.py

The sequential executor's fit (``overhead.run_lightning``) with the client runner's, the loop's and the data module's
methods wrapped by a thread-time timer (a few µs a call), rounds 1 on; then the plain loop (``overhead.run_plain``'s
work, the same cohorts, batches, seeds and weights) with a timer around each of its parts. Prints the median ms a round
and a client of every part. ``W`` (``mlp``/``cnn``), ``C``, ``R`` (rounds a fit), ``REPS`` (fits) from the environment.
"""
import os, sys, time, statistics, logging, warnings, collections
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
import torch, numpy as np
import gpu_suite, overhead
from lightning.pytorch.callbacks import Callback
torch.set_num_threads(1); logging.getLogger("lightning.pytorch").setLevel(logging.ERROR); warnings.filterwarnings("ignore")
C = int(os.environ.get("C", "10")); R = int(os.environ.get("R", "8")); REPS = int(os.environ.get("REPS", "3"))
wl = gpu_suite.workload_args(os.environ.get("W", "mlp"), quick=False)
for k, v in dict(clients=100, cohort=C, samples_per_client=50, batch=10, rounds=R, repeats=1).items(): setattr(wl, k, v)
dm = overhead.make_datamodule(wl, overhead.make_dataset(wl))
init = {k: v.clone() for k, v in overhead.make_model(wl).state_dict().items()}
clock = time.thread_time
acc = collections.defaultdict(float); rounds = collections.defaultdict(list)
active = [False]
def wrap(owner, name, label=None):
    f = getattr(owner, name); label = label or name
    def w(*a, **k):
        if not active[0]: return f(*a, **k)
        t = clock()
        try: return f(*a, **k)
        finally: acc[label] += clock() - t
    setattr(owner, name, w)
from lightning_fed.client import runner as rmod, sequential as smod, lean_step as lmod
from lightning_fed import loop as loopmod
from lightning_fed.datamodules import federated as fmod
from lightning_fed.communication import bytes as bmod
R_ = rmod.ClientRunner
for n in ("start_client", "local_step", "finish_client", "client_end", "start_round", "build_update", "reset_to_global"): wrap(R_, n)
wrap(lmod.LeanLocalStep, "finish_client", "lean.finish_client")
wrap(fmod.FederatedDataModule, "client_batches"); wrap(fmod.FederatedDataModule, "select_cohort")
wrap(smod, "client_seed"); wrap(smod, "seed_client"); wrap(smod, "mean_step_loss")
L_ = loopmod.FederatedFitLoop
for n in ("_start_round", "_run_clients", "_filter_updates", "_server_step", "_report_round", "on_advance_end", "on_advance_start"): wrap(L_, n)
wrap(bmod.CommunicationLedger, "record", "communication.record")
it = fmod.TensorBatches.__iter__
def timed_iter(self):
    g = it(self)
    while True:
        t = clock()
        try: b = next(g)
        except StopIteration: return
        finally:
            if active[0]: acc["fetch"] += clock() - t
        yield b
fmod.TensorBatches.__iter__ = timed_iter
class T(Callback):
    def on_train_epoch_start(self, tr, m):
        if tr.current_epoch >= 1:
            acc.clear(); active[0] = True; self.t = clock()
    def on_train_epoch_end(self, tr, m):
        if active[0]:
            active[0] = False; rounds["epoch"].append(clock() - self.t)
            for k, v in acc.items(): rounds[k].append(v)
orig = overhead.FederatedTrainer
def patched(*a, **kw):
    kw["callbacks"] = list(kw["callbacks"]) + [T()]; return orig(*a, **kw)
overhead.FederatedTrainer = patched
plain = []
for rep in range(REPS):
    p = overhead.run_plain(wl, dm, init, torch.device("cpu")); plain += p.cpu[1:]
    s = overhead.run_lightning(wl, dm, init, torch.device("cpu"))
    assert torch.equal(p.weights[-1], s.weights[-1])
print(f"C={C} load {os.getloadavg()[0]:.2f}  plain round {statistics.median(plain)*1e3:.2f} ms (process cpu)")
for k, v in sorted(rounds.items(), key=lambda kv: -statistics.median(kv[1])):
    m = statistics.median(v) * 1e3
    print(f"  {k:28s} {m:8.3f} ms/round  {m / C:7.4f} ms/client")

# ---- the plain loop, timed by part
from lightning_fed.executor import client_seed
from lightning_fed.client.sequential import seed_client
def plain_parts():
    model = overhead.make_model(wl); model.load_state_dict(init); model.train()
    compute_loss = overhead.loss_fn(wl); params = list(model.parameters())
    x_all, y_all = dm.train_dataset.tensors
    out = collections.defaultdict(list)
    for round_idx in range(R):
        a = collections.defaultdict(float); t0 = clock()
        cohort = dm.sample_clients(round_idx)
        with torch.no_grad(): x_t = [p.detach().clone() for p in params]
        deltas, sizes = [], []
        for cid in cohort.tolist():
            t = clock()
            with torch.no_grad(): torch._foreach_copy_(params, x_t)
            optimizer = torch.optim.SGD(params, lr=wl.lr)
            seed_client(client_seed(dm.seed, round_idx, cid), torch.device("cpu"))
            a["client_start"] += clock() - t; t = clock()
            batches = dm.client_batches(cid, round_idx)
            a["client_batches"] += clock() - t
            for idx in batches:
                t = clock()
                index = torch.from_numpy(idx)
                batch = (x_all[index].to("cpu", non_blocking=True), y_all[index].to("cpu", non_blocking=True))
                a["fetch"] += clock() - t; t = clock()
                optimizer.zero_grad(); loss = compute_loss(model, batch); loss.backward(); optimizer.step()
                a["step"] += clock() - t
            t = clock()
            with torch.no_grad(): deltas.append(torch._foreach_sub(params, x_t))
            sizes.append(dm.client_num_samples(cid))
            a["delta"] += clock() - t
        t = clock()
        with torch.no_grad():
            average = [torch.mul(d.double(), sizes[0]) for d in deltas[0]]
            for n, delta in zip(sizes[1:], deltas[1:]): torch._foreach_add_(average, delta, alpha=n)
            torch._foreach_div_(average, float(sum(sizes)))
            torch._foreach_copy_(params, x_t)
            torch._foreach_add_(params, [a_.to(p.dtype) for a_, p in zip(average, params)], alpha=1.0)
        a["aggregate"] += clock() - t
        a["round"] = clock() - t0
        if round_idx:
            for k, v in a.items(): out[k].append(v)
    return out
pp = collections.defaultdict(list)
for rep in range(REPS):
    for k, v in plain_parts().items(): pp[k] += v
print("plain parts (thread time)")
for k, v in sorted(pp.items(), key=lambda kv: -statistics.median(kv[1])):
    m = statistics.median(v) * 1e3
    print(f"  {k:28s} {m:8.3f} ms/round  {m / C:7.4f} ms/client")
