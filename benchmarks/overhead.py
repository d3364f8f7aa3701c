"""How much does lightning_fed cost over a hand-written PyTorch FedAvg loop doing exactly the same work?

One workload — N clients (IID partition of synthetic data), cohort C, E local epochs, batch B, R rounds of FedAvg
(server lr 1, client SGD) — is run

  (a) by lightning_fed: ``FederatedTrainer`` + ``FederatedDataModule`` (logger, checkpointing, progress bar and
      validation off), with the sequential executor (and, with ``--executor vectorized``, also with
      :class:`lightning_fed.vectorized.VectorizedExecutor`);
  (b) by a plain PyTorch loop written below: for each round the same cohort (``datamodule.sample_clients``), for
      each client the same mini-batches (``datamodule.client_batches``, indexing the tensors directly), the same
      torch seed (``lightning_fed.executor.client_seed``), a fresh ``torch.optim.SGD``, ``zero_grad`` /
      ``backward`` / ``step``, and the deltas averaged with weights |D_i| / Σ|D_j| in the order FedAvg does.

(a) and (b) must end with the same weights (the max abs difference after every round is printed: 0 proves it is the
same work; the vectorized executor's batched kernels round differently, ~1e-8 after one round, growing with
training). (b) is the physical limit of sequential training on the device. Runs are interleaved (a, b, [v], then
b, [v], a, ...) ``--repeats`` times in one process; each run's first round (warm-up) is excluded, and the median
(and minimum) wall time and the median process CPU time per round over the remaining rounds of all repeats are
reported. On a machine shared with other work the CPU-time ratio (1 thread) is the least noisy overhead figure.

Examples::

    .venv/bin/python benchmarks/overhead.py --model cnn --clients 100 --cohort 10 --epochs 1 --batch 20 --rounds 5
    .venv/bin/python benchmarks/overhead.py --model lstm --threads 2 --executor vectorized
    .venv/bin/python benchmarks/overhead.py --model cnn --profile /tmp/a.prof   # cProfile of run (a)
    .venv/bin/python benchmarks/overhead.py --model cnn --only plain             # one variant: its own peak RSS
    .venv/bin/python benchmarks/overhead.py --model cnn --threads 2 --executor vectorized --also-floor
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import resource
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lightning_fed import FederatedTrainer  # noqa: E402
from lightning_fed.callbacks import FedAvg  # noqa: E402
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner  # noqa: E402
from lightning_fed.executor import client_seed  # noqa: E402
from lightning_fed.client.sequential import seed_client  # noqa: E402
from lightning_fed.models import FedAwareCNN, ShakespeareLSTM  # noqa: E402
from lightning_fed.models.classifier import Classifier  # noqa: E402
from lightning_fed.models.char_lstm import masked_token_loss  # noqa: E402
from lightning_fed.vectorized import VectorizedExecutor  # noqa: E402

VARIANTS = ("lightning", "plain", "vectorized", "lightning-nolog", "floor", "vmap-floor")


# ---------------------------------------------------------------------------------------------- workload
def make_dataset(args: argparse.Namespace) -> TensorDataset:
    """Synthetic data shaped like the task: Fashion-MNIST [1, 28, 28] / 10 classes, or Shakespeare [80] tokens."""
    n = args.clients * args.samples_per_client
    g = torch.Generator().manual_seed(1234)
    if args.model == "cnn":
        x = torch.randn(n, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
    else:
        x = torch.randint(1, 90, (n, 80), generator=g)
        y = torch.randint(1, 90, (n, 80), generator=g)
    dataset = TensorDataset(x, y)
    dataset.targets = y if args.model == "cnn" else None
    return dataset


class LinearProbe(Classifier):
    """``--cnn-arch linear``: a linear classifier on the flattened image (7,850 parameters). Its local step computes
    in about 0.1 ms here, so (a) − (b) is nearly all framework time: the per-step overhead in isolation."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
        self.init_metrics(num_classes=10)


class MLP256(Classifier):
    """``--cnn-arch mlp256``: the small MLP of issue #33's table, 784-256-10 with ReLU (203,530 parameters)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 10))
        self.init_metrics(num_classes=10)


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    if args.model == "cnn" and args.cnn_arch == "linear":
        return LinearProbe(lr=args.lr)
    if args.model == "cnn" and args.cnn_arch == "mlp256":
        return MLP256(lr=args.lr)
    if args.model == "cnn":
        return FedAwareCNN(arch=args.cnn_arch, lr=args.lr, channels_last=args.channels_last)
    return ShakespeareLSTM(lr=args.lr, hidden_size=args.hidden)


def loss_fn(args: argparse.Namespace) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """The same loss as the module's ``training_step``, without ``self.log``."""
    if args.model == "cnn":
        return lambda model, batch: F.cross_entropy(model(batch[0]), batch[1])
    return lambda model, batch: masked_token_loss(model(batch[0]), batch[1])[0]


def make_datamodule(args: argparse.Namespace, dataset: TensorDataset) -> FederatedDataModule:
    dm = FederatedDataModule(
        dataset,
        partitioner=IIDPartitioner(num_clients=args.clients, seed=0),
        clients_per_round=args.cohort,
        batch_size=args.batch,
        local_epochs=args.epochs,
        seed=0,
    )
    dm.setup()
    return dm


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


@dataclass
class RunResult:
    """One run: per-round wall and process CPU seconds, the weights after every round, the run's wall seconds."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    weights: list[torch.Tensor] = field(default_factory=list)
    total: float = 0.0
    step_path: str = ""  # lightning_fed runs: the sequential executor's local step ("lean" or "lightning")

    def add(self, start: tuple[float, float], model: torch.nn.Module) -> None:
        self.wall.append(time.perf_counter() - start[0])
        self.cpu.append(time.process_time() - start[1])
        self.weights.append(flat(model))


# ---------------------------------------------------------------------------------------------- (a) lightning_fed
class _RoundTimer(Callback):
    """Wall and process CPU time of every round (epoch start to epoch end: the whole round, hooks included) and the
    weights at the end of every round."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.result = RunResult()
        self._start = (0.0, 0.0)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        sync(self.device)
        self._start = (time.perf_counter(), time.process_time())

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        sync(self.device)
        self.result.add(self._start, pl_module)


def _no_log(*args: Any, **kwargs: Any) -> None:
    """Replaces ``LightningModule.log`` in the ``lightning-nolog`` variant."""


def run_lightning(args, dm, init_state, device, executor=None, no_log=False) -> RunResult:
    model = make_model(args)
    model.load_state_dict(init_state)
    if no_log:  # what `self.log("train_loss", ...)` in training_step costs per step
        model.log = _no_log
    timer = _RoundTimer(device)
    trainer = FederatedTrainer(
        max_epochs=args.rounds,
        callbacks=[FedAvg(lr=1.0), timer],
        client_executor=executor,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator=device.type,
        devices=1,
        default_root_dir="/tmp/lightning_fed_bench",
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    sync(device)
    timer.result.total = time.perf_counter() - start
    runner = trainer.fit_loop.client_runner
    timer.result.step_path = runner.step_path + (f" ({runner.lean_step_blocker})" if runner.lean_step_blocker else "")
    return timer.result


# ---------------------------------------------------------------------------------------------- (b) plain loop
def run_plain(args, dm, init_state, device) -> RunResult:
    """FedAvg by hand: the same cohorts, batches, seeds, optimizer and weighting as (a)."""
    model = make_model(args)
    model.load_state_dict(init_state)
    model.to(device).train()
    compute_loss = loss_fn(args)
    params = list(model.parameters())
    x_all, y_all = dm.train_dataset.tensors
    result = RunResult()
    total_start = time.perf_counter()
    for round_idx in range(args.rounds):
        sync(device)
        start = (time.perf_counter(), time.process_time())
        cohort = dm.sample_clients(round_idx)
        with torch.no_grad():
            x_t = [p.detach().clone() for p in params]
        deltas, sizes = [], []
        for cid in cohort.tolist():
            with torch.no_grad():
                torch._foreach_copy_(params, x_t)
            optimizer = torch.optim.SGD(params, lr=args.lr)
            seed_client(client_seed(dm.seed, round_idx, cid), device)  # as the executor seeds a client
            for idx in dm.client_batches(cid, round_idx):
                index = torch.from_numpy(idx)
                batch = (x_all[index].to(device, non_blocking=True), y_all[index].to(device, non_blocking=True))
                optimizer.zero_grad()
                loss = compute_loss(model, batch)
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                deltas.append(torch._foreach_sub(params, x_t))
            sizes.append(dm.client_num_samples(cid))
        with torch.no_grad():  # FedAvg's mean: Σ|D_i|Δ_i in float64, one division, rounded once (WeightedMean)
            average = [torch.mul(d.double(), sizes[0]) for d in deltas[0]]
            for n, delta in zip(sizes[1:], deltas[1:]):
                torch._foreach_add_(average, delta, alpha=n)
            torch._foreach_div_(average, float(sum(sizes)))
            torch._foreach_copy_(params, x_t)
            torch._foreach_add_(params, [a.to(p.dtype) for a, p in zip(average, params)], alpha=1.0)
        sync(device)
        result.add(start, model)
    result.total = time.perf_counter() - total_start
    return result


def run_floor(args, dm, init_state, device) -> RunResult:
    """The compute floor of any cohort-parallel execution (``--also-floor``): one model trained on each round's
    samples (the cohort's mini-batches, concatenated in client order) in steps of C·B samples — the round's
    forward/backward FLOPs with the widest batching an executor running the cohort at once could get, and no
    per-client weights, seeding or aggregation. It is not the same work as (a) and (b) (one model instead of C),
    so its weights are not compared; time(floor) / time(b) bounds from below what a vectorized executor can reach
    on the device."""
    model = make_model(args)
    model.load_state_dict(init_state)
    model.to(device).train()
    compute_loss = loss_fn(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    x_all, y_all = dm.train_dataset.tensors
    width = args.cohort * args.batch
    result = RunResult()
    total_start = time.perf_counter()
    for round_idx in range(args.rounds):
        sync(device)
        start = (time.perf_counter(), time.process_time())
        index = torch.from_numpy(np.concatenate([
            idx for cid in dm.sample_clients(round_idx).tolist() for idx in dm.client_batches(cid, round_idx)
        ]).astype(np.int64))
        for chunk in index.split(width):
            batch = (x_all[chunk].to(device, non_blocking=True), y_all[chunk].to(device, non_blocking=True))
            optimizer.zero_grad()
            compute_loss(model, batch).backward()
            optimizer.step()
        sync(device)
        result.add(start, model)
    result.total = time.perf_counter() - total_start
    return result


def run_vmap_floor(args, dm, init_state, device) -> RunResult:
    """The compute floor with per-client weights (``--also-floor``, variant ``vmap-floor``): the round's clients
    trained at once by ``torch.func.vmap(grad(loss))`` over stacked parameters and one ``_foreach_add_`` SGD step,
    nothing else — what the vectorized executor computes, without the framework. Steps are taken while every
    client has a batch of B (the IID workload's clients all have the same number of full batches); its weights
    are not compared."""
    from torch.func import functional_call, grad, vmap

    model = make_model(args)
    model.load_state_dict(init_state)
    model.to(device).train()
    compute_loss = loss_fn(args)
    names = [n for n, _ in model.named_parameters()]
    x_all, y_all = dm.train_dataset.tensors

    def client_loss(params, x, y):
        return compute_loss(lambda inp: functional_call(model, params, (inp,)), (x, y))

    step = vmap(grad(client_loss))
    result = RunResult()
    total_start = time.perf_counter()
    for round_idx in range(args.rounds):
        sync(device)
        start = (time.perf_counter(), time.process_time())
        cohort = dm.sample_clients(round_idx).tolist()
        schedules = [dm.client_batches(cid, round_idx) for cid in cohort]
        stacked = {n: p.detach().unsqueeze(0).repeat(len(cohort), *([1] * p.dim())) for n, p in
                   model.named_parameters()}
        for k in range(min(len(s) for s in schedules)):
            if any(len(s[k]) != len(schedules[0][k]) for s in schedules):
                break
            index = torch.from_numpy(np.stack([s[k] for s in schedules]).astype(np.int64))
            grads = step(stacked, x_all[index].to(device), y_all[index].to(device))
            torch._foreach_add_([stacked[n] for n in names], [grads[n] for n in names], alpha=-args.lr)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(stacked[n].mean(0))
        sync(device)
        result.add(start, model)
    result.total = time.perf_counter() - total_start
    return result


# ---------------------------------------------------------------------------------------------- reporting
def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def samples_per_round(dm: FederatedDataModule, rounds: int) -> float:
    counts = [
        sum(len(b) for cid in dm.sample_clients(r).tolist() for b in dm.client_batches(cid, r)) for r in range(rounds)
    ]
    return float(np.mean(counts[1:] if rounds > 1 else counts))


def steps_per_round(dm: FederatedDataModule, rounds: int) -> float:
    """Local steps (mini-batches) per measured round, summed over the cohort."""
    counts = [sum(len(dm.client_batches(cid, r)) for cid in dm.sample_clients(r).tolist()) for r in range(rounds)]
    return float(np.mean(counts[1:] if rounds > 1 else counts))


def run_variant(name, args, dm, init_state, device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if name == "plain":
        result = run_plain(args, dm, init_state, device)
    elif name == "lightning":
        result = run_lightning(args, dm, init_state, device)
    elif name == "lightning-nolog":
        result = run_lightning(args, dm, init_state, device, no_log=True)
    elif name == "floor":
        result = run_floor(args, dm, init_state, device)
    elif name == "vmap-floor":
        result = run_vmap_floor(args, dm, init_state, device)
    else:
        result = run_lightning(args, dm, init_state, device, VectorizedExecutor(max_parallel=args.max_parallel))
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    return result, cuda_peak


def profile_lightning(args, dm, init_state, device, path: str, executor: Optional[str]) -> None:
    """cProfile one lightning_fed run (warm-up included) and print the top functions."""
    profiler = cProfile.Profile()
    ex = VectorizedExecutor(max_parallel=args.max_parallel) if executor == "vectorized" else None
    profiler.enable()
    run_lightning(args, dm, init_state, device, ex)
    profiler.disable()
    profiler.dump_stats(path)
    print_breakdown(pstats.Stats(profiler))
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(args.profile_top)
        print(f"\n=== cProfile of run (a) [{executor or 'sequential'}], sorted by {key} (saved to {path}) ===")
        print(out.getvalue())


#: (label, file suffix, function name) of the functions whose cumulative time the breakdown reports.
_BREAKDOWN = (
    ("whole fit (Trainer.fit)", "pytorch/trainer/trainer.py", "fit"),
    ("  trainer set-up/teardown outside the fit loop", None, None),
    ("  rounds (FederatedFitLoop.advance)", "lightning_fed/loop.py", "advance"),
    ("    executor.run_round", "lightning_fed/client/sequential.py", "run_round"),
    ("      runner.start_client", "lightning_fed/client/runner.py", "start_client"),
    ("      datamodule.client_dataloader (loader creation)", "lightning_fed/datamodules/federated.py",
     "client_dataloader"),
    ("      TensorBatches.__iter__ (batch slicing, per batch)", "lightning_fed/datamodules/federated.py", "__iter__"),
    ("      DataLoader __next__ (other datasets: fetch + collate)", "torch/utils/data/dataloader.py", "__next__"),
    ("      runner.local_step", "lightning_fed/client/runner.py", "local_step"),
    ("        module.training_step (forward + loss + self.log)", None, "training_step"),
    ("          LightningModule.log", "pytorch/core/module.py", "log"),
    ("        loss.backward (autograd)", "torch/autograd/__init__.py", "backward"),
    ("        SGD update (_single_tensor_sgd)", "torch/optim/sgd.py", "_single_tensor_sgd"),
    ("        Lightning step machinery (rest of local_step)", None, None),
    ("      runner.finish_client", "lightning_fed/client/runner.py", "finish_client"),
    ("    server_update (aggregate + step)", "callbacks/server_optimizer.py", "server_update"),
    ("    gradient_diversity (round metric)", "callbacks/server_optimizer.py", "gradient_diversity"),
    ("    loop._is_finite (update checks)", "lightning_fed/loop.py", "_is_finite"),
    ("  on_advance_end (metrics logging, epoch hooks)", "lightning_fed/loop.py", "on_advance_end"),
)


def print_breakdown(stats: pstats.Stats) -> None:
    """Cumulative time of the main parts of run (a), from the profile (profiling inflates Python-heavy parts)."""
    cum: dict[tuple[Optional[str], Optional[str]], tuple[float, int]] = {}
    for (filename, _, func), (_, ncalls, _, cumtime, _) in stats.stats.items():
        for _, suffix, name in _BREAKDOWN:
            if name == func and (suffix is None or filename.endswith(suffix + ".py") or filename.endswith(suffix)):
                if name == "training_step" and ("lightning_fed/models" not in filename and "tests" not in filename):
                    continue
                total, calls = cum.get((suffix, name), (0.0, 0))
                cum[(suffix, name)] = (total + cumtime, calls + ncalls)
    def get(suffix, name):
        return cum.get((suffix, name), (0.0, 0))
    fit = get("pytorch/trainer/trainer.py", "fit")[0]
    rounds = get("lightning_fed/loop.py", "advance")[0]
    end = get("lightning_fed/loop.py", "on_advance_end")[0]
    local = get("lightning_fed/client/runner.py", "local_step")[0]
    inner = sum(get(s, n)[0] for _, s, n in _BREAKDOWN[9:13] if n not in ("log",))
    print("\n=== where run (a)'s time goes (cProfile cumulative seconds; profiling inflates Python-heavy parts) ===")
    for label, suffix, name in _BREAKDOWN:
        if name is None and label.strip().startswith("trainer"):
            value, calls = fit - rounds - end, 1
        elif name is None:
            value, calls = local - inner, get("lightning_fed/client/runner.py", "local_step")[1]
        else:
            value, calls = get(suffix, name)
        share = 100.0 * value / fit if fit else float("nan")
        print(f"{label:<62} {value:8.3f} s {share:6.1f} %  ({calls} calls)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", choices=("cnn", "lstm"), default="cnn")
    p.add_argument("--cnn-arch", choices=("fedavg", "toy", "mlp", "linear", "mlp256"), default="fedavg",
                   help="FedAwareCNN architecture for --model cnn (default fedavg: the 582k-parameter FedAvg CNN), or "
                        "linear: a 7,850-parameter linear classifier (the per-step framework overhead in isolation), "
                        "or mlp256: a 784-256-10 MLP (issue #33's MLP workload)")
    p.add_argument("--channels-last", action="store_true",
                   help="FedAwareCNN(channels_last=True) for --model cnn (every variant)")
    p.add_argument("--hidden", type=int, default=256, help="LSTM hidden size for --model lstm (default 256)")
    p.add_argument("--clients", type=int, default=100, help="number of clients N (default 100)")
    p.add_argument("--samples-per-client", type=int, default=None,
                   help="samples per client (default: 600 for cnn = Fashion-MNIST/100, 40 for lstm)")
    p.add_argument("--cohort", type=int, default=10, help="clients per round C (default 10)")
    p.add_argument("--epochs", type=int, default=1, help="local epochs E (default 1)")
    p.add_argument("--batch", type=int, default=20, help="local batch size B (default 20)")
    p.add_argument("--rounds", type=int, default=5, help="rounds R per run, the first is warm-up (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions of every variant (default 3)")
    p.add_argument("--lr", type=float, default=0.05, help="client SGD learning rate (default 0.05)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--executor", choices=("sequential", "vectorized"), default="sequential",
                   help="also run (a) with the VectorizedExecutor and report its speed-up (vectorized)")
    p.add_argument("--also-nolog", action="store_true",
                   help="also run (a) with the module's self.log replaced by a no-op (variant lightning-nolog)")
    p.add_argument("--also-floor", action="store_true",
                   help="also run the compute floors of a cohort-parallel executor (variant floor: one model, the "
                        "round's samples in steps of C*B; variant vmap-floor: torch.func.vmap over per-client "
                        "weights without the framework; not the same work, so their weights are not compared)")
    p.add_argument("--max-parallel", type=int, default=None, help="VectorizedExecutor(max_parallel=...)")
    p.add_argument("--only", choices=VARIANTS, default=None, help="run one variant only (its own peak RSS)")
    p.add_argument("--profile", default=None, help="write a cProfile of one run (a) to this path and print the top")
    p.add_argument("--profile-top", type=int, default=30)
    args = p.parse_args(argv)
    if args.samples_per_client is None:
        args.samples_per_client = 600 if args.model == "cnn" else 40
    for name in ("clients", "samples_per_client", "cohort", "epochs", "batch", "rounds", "repeats", "hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.rounds < 2:
        p.error("--rounds must be >= 2 (the first round is warm-up)")
    if args.cohort > args.clients:
        p.error("--cohort must not exceed --clients")
    if args.channels_last and (args.model != "cnn" or args.cnn_arch in ("linear", "mlp256")):
        p.error("--channels-last applies to FedAwareCNN only (--model cnn with --cnn-arch fedavg, toy or mlp)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*GPU available but not used.*")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")

    baseline_rss = peak_rss_mib()  # torch + lightning imported, nothing built yet
    dataset = make_dataset(args)
    dm = make_datamodule(args, dataset)
    init_state = {k: v.clone() for k, v in make_model(args).state_dict().items()}
    n_params = sum(p.numel() for p in make_model(args).parameters())
    per_round = samples_per_round(dm, args.rounds)
    print(
        f"workload: model={args.model}{'/' + args.cnn_arch if args.model == 'cnn' else ''} ({n_params:,} params), "
        f"N={args.clients} clients x {args.samples_per_client} samples, C={args.cohort}, E={args.epochs}, "
        f"B={args.batch}, R={args.rounds} rounds (1 warm-up), {per_round:.0f} samples/round, device={device}, "
        f"threads={torch.get_num_threads()}, repeats={args.repeats}"
    )
    print(f"peak RSS after imports: {baseline_rss:.1f} MiB; after building the data and partition: "
          f"{peak_rss_mib():.1f} MiB")

    if args.profile:
        profile_lightning(args, dm, init_state, device, args.profile, args.executor)
        return

    variants = ["lightning", "plain"] + (["vectorized"] if args.executor == "vectorized" else [])
    variants += ["lightning-nolog"] if args.also_nolog else []
    variants += (["floor", "vmap-floor"] if args.model == "cnn" else ["floor"]) if args.also_floor else []  # (nn.LSTM: no vmap rule)
    if args.only:
        variants = [args.only]
    runs: dict[str, list[RunResult]] = {v: [] for v in variants}
    rss: dict[str, float] = {}
    cuda_peak: dict[str, float] = {}
    for rep in range(args.repeats):
        shift = rep % len(variants)  # rotate the order so no variant always runs first
        for name in variants[shift:] + variants[:shift]:
            result, peak = run_variant(name, args, dm, init_state, device)
            runs[name].append(result)
            rss[name] = peak_rss_mib()
            cuda_peak[name] = peak
            print(f"  repeat {rep} {name:>15}: wall s/round " + " ".join(f"{t:.3f}" for t in result.wall)
                  + "  cpu " + " ".join(f"{t:.3f}" for t in result.cpu), flush=True)
    args._dm = dm
    report(args, variants, runs, rss, cuda_peak, per_round, device)


def report(args, variants, runs, rss, cuda_peak, per_round, device) -> None:
    """Medians (and minima) over all repeats of the per-round times, warm-up rounds excluded; ratios; weights."""
    wall = {n: [t for r in runs[n] for t in r.wall[1:]] for n in variants}
    cpu = {n: [t for r in runs[n] for t in r.cpu[1:]] for n in variants}
    med = {n: statistics.median(wall[n]) for n in variants}
    low = {n: min(wall[n]) for n in variants}
    med_cpu = {n: statistics.median(cpu[n]) for n in variants}
    print(f"\nresults over {args.repeats} repeats x {args.rounds - 1} rounds (warm-up round excluded):")
    header = (f"{'variant':>15} {'wall s/round':>12} {'(min)':>7} {'cpu s/round':>11} {'rounds/s':>9} "
              f"{'samples/s':>10} {'peak RSS MiB':>13}")
    print(header + ("  CUDA peak MiB" if device.type == "cuda" else ""))
    for name in variants:
        line = (f"{name:>15} {med[name]:12.4f} {low[name]:7.3f} {med_cpu[name]:11.4f} {1 / med[name]:9.3f} "
                f"{per_round / med[name]:10.1f} {rss[name]:13.1f}")
        if device.type == "cuda":
            line += f"  {cuda_peak[name]:14.1f}"
        print(line)
    print("(rounds/s and samples/s from the median wall time; peak RSS is the process's running maximum after that "
          "variant's runs: use --only for one variant's own)")

    def ratio(a: str, b: str) -> str:
        return (f"{med[a] / med[b]:.3f} (median wall), {low[a] / low[b]:.3f} (min wall), "
                f"{med_cpu[a] / med_cpu[b]:.3f} (median CPU)")

    if "plain" in variants:
        print()
        for name in variants:
            if name in ("plain", "floor", "vmap-floor"):
                continue
            diffs = [float((w - p).abs().max()) for w, p in zip(runs[name][-1].weights, runs["plain"][-1].weights)]
            print(f"same work: max |w_{name} - w_plain| after each round: " + " ".join(f"{d:.1e}" for d in diffs))
    for name in ("lightning", "lightning-nolog"):
        if name in variants:
            print(f"{name}: local step path {runs[name][-1].step_path}")
    if "plain" in variants and "lightning" in variants:
        print(f"overhead: time(a) / time(b) = {ratio('lightning', 'plain')}  (lightning_fed sequential / plain loop)")
        steps = steps_per_round(args._dm, args.rounds)
        print(f"overhead per local step (device-independent): (time(a) - time(b)) / steps = "
              f"{1e3 * (med['lightning'] - med['plain']) / steps:.3f} ms (median wall), "
              f"{1e3 * (med_cpu['lightning'] - med_cpu['plain']) / steps:.3f} ms (median CPU); {steps:.0f} steps/round; "
              f"plain loop {1e3 * med['plain'] / steps:.3f} ms/step")
    if "plain" in variants and "lightning-nolog" in variants:
        print(f"overhead without self.log in training_step: time / time(b) = {ratio('lightning-nolog', 'plain')}")
    if "vectorized" in variants:
        if "plain" in variants:
            print(f"vectorized: time(b) / time(vectorized) = {ratio('plain', 'vectorized')}  (speed-up vs plain loop)")
        if "lightning" in variants:
            print(f"vectorized: time(a) / time(vectorized) = {ratio('lightning', 'vectorized')}  "
                  f"(speed-up vs sequential executor)")
    if "floor" in variants and "plain" in variants:
        print(f"compute floor: time(floor) / time(b) = {ratio('floor', 'plain')}  (one model, steps of C*B = "
              f"{args.cohort * args.batch} samples: no cohort-parallel executor can beat this ratio on this device)")
    if "vmap-floor" in variants and "plain" in variants:
        print(f"vmap floor: time(vmap-floor) / time(b) = {ratio('vmap-floor', 'plain')}  (per-client weights: "
              f"vmap(grad) + one SGD step per local step, no framework: the vectorized executor's own floor)")


if __name__ == "__main__":
    main()
