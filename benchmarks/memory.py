"""Does a long federated run grow in memory from round to round?

Runs R rounds (default 200) of FedAdam on a small MLP over 100 Dirichlet clients on CPU, with validation every
10 rounds and a TensorBoard logger, and records the process's resident set size (RSS, from /proc/self/statm) at
the end of every round. Prints RSS at rounds 20, 100 and R and the relative growth from round 20 to round R
(the reliability issue asks for <= 5 %).

    .venv/bin/python benchmarks/memory.py [--rounds 200] [--threads 1]

``--case lora`` (issue #42) measures federated LoRA instead: see :func:`lora_case`.

    .venv/bin/python benchmarks/memory.py --case lora [--rounds 3] [--lora-executors sequential vectorized]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAdam
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class MLP(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class RecordRSS(L.Callback):
    def __init__(self) -> None:
        self.rss: list[float] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.rss.append(rss_mib())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("growth", "lora"), default="growth",
                        help="growth: RSS from round to round (default); lora: federated LoRA (issue #42)")
    parser.add_argument("--rounds", type=int, default=None, help="default 200 (growth), 3 (lora)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lora-executors", nargs="+", default=["sequential", "vectorized"],
                        choices=("sequential", "vectorized", "vectorized_eager"),
                        help="lora: the federated runs to measure (vectorized_eager: attn_implementation='eager')")
    parser.add_argument("--lora-variant", default=None, help=argparse.SUPPRESS)  # one run, in a child process
    parser.add_argument("--json", default=None, help="lora: also write the results to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.case == "lora":
        rounds = 3 if args.rounds is None else args.rounds
        if args.lora_variant is not None:
            print(RESULT_PREFIX + json.dumps(lora_run(args.lora_variant, rounds)), flush=True)
        else:
            lora_case(rounds, args.threads, args.lora_executors, args.json)
        return
    args.rounds = 200 if args.rounds is None else args.rounds
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, 20, generator=g)
    y = (x @ torch.randn(20, 10, generator=g)).argmax(1)
    train = TensorDataset(x[:18_000], y[:18_000])
    train.targets = y[:18_000]
    dm = FederatedDataModule(train, val_dataset=TensorDataset(x[18_000:], y[18_000:]),
                             partitioner=DirichletPartitioner(num_clients=100, alpha=0.5), clients_per_round=10,
                             batch_size=20)
    record = RecordRSS()
    with tempfile.TemporaryDirectory() as logs:
        trainer = FederatedTrainer(
            max_epochs=args.rounds, callbacks=[FedAdam(lr=0.01), record], check_val_every_n_epoch=10,
            logger=L.pytorch.loggers.TensorBoardLogger(logs), enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, accelerator="cpu", devices=1,
        )
        start = time.perf_counter()
        trainer.fit(MLP(), datamodule=dm)
        elapsed = time.perf_counter() - start
    r20, r100, rlast = record.rss[19], record.rss[min(99, args.rounds - 1)], record.rss[-1]
    print(f"rounds={args.rounds}  time={elapsed:.1f}s  ({elapsed / args.rounds * 1e3:.1f} ms/round)")
    print(f"RSS after round 20: {r20:.1f} MiB   round 100: {r100:.1f} MiB   round {args.rounds}: {rlast:.1f} MiB")
    print(f"growth round 20 -> {args.rounds}: {100 * (rlast - r20) / r20:+.2f} %")


# ----------------------------------------------------------------------------------------------- --case lora
#: Issue #42's model: a random-init GPT-2 (6 layers, width 512, 8 heads, 64 positions, a byte vocabulary of 256)
#: with LoRA r = 8 (alpha 16) on c_attn, attn.c_proj and c_fc: 19,349,504 parameters, 270,336 of them adapters.
LORA_MODEL = dict(vocab_size=256, n_layer=6, n_embd=512, n_head=8, n_positions=64, lora_r=8, lora_alpha=16,
                  target_modules=["c_attn", "attn.c_proj", "c_fc"], lr=0.1)
LORA_CLIENTS, LORA_COHORT, LORA_PER_CLIENT, LORA_BATCH, LORA_SEQ = 40, 10, 8, 4, 64  # 2 local steps a client
RESULT_PREFIX = "LORA_RESULT "


def _peak_reset() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(field)


def _numbers(obj) -> tuple[int, int]:
    """(tensors, numbers) in a nested dict/list/tuple of tensors."""
    if isinstance(obj, torch.Tensor):
        return 1, obj.numel()
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        counts = [_numbers(o) for o in obj]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)
    return 0, 0


class RoundTimes(L.Callback):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def _byte_data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(1, 256, (LORA_CLIENTS * LORA_PER_CLIENT, LORA_SEQ + 1), generator=g)
    return TensorDataset(seq[:, :-1].clone(), seq[:, 1:].clone())


def lora_run(variant: str, rounds: int) -> dict:
    """One measured run in this process: ``variant`` is ``plain`` (Lightning's Trainer, the same number of steps
    as the federated run: rounds x cohort x 2) or a federated executor (``sequential``, ``vectorized``, or
    ``vectorized_eager``: the vectorized executor with the model's ``attn_implementation="eager"``)."""
    from lightning_fed.client.runner import ClientRunner
    from lightning_fed.datamodules import IIDPartitioner
    from lightning_fed.models import LoRACausalLM

    torch.manual_seed(0)
    model = LoRACausalLM(**LORA_MODEL, attn_implementation="eager" if variant.endswith("_eager") else None)
    adapters = {k: v.clone() for k, v in model.adapter_state_dict().items()}
    out = {"variant": variant, "rounds": rounds, "parameters": model.num_parameters(),
           "adapter_parameters": model.num_parameters(trainable=True),
           "adapter_bytes": sum(t.numel() * t.element_size() for t in adapters.values())}
    data = _byte_data()
    times = RoundTimes()
    common = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, accelerator="cpu", devices=1)
    steps = rounds * LORA_COHORT * (LORA_PER_CLIENT // LORA_BATCH)
    updates: list[tuple[int, int, int]] = []
    if variant.startswith("plain"):
        from torch.utils.data import DataLoader

        # plain_cohort_batch: the batch the vectorized executor computes at once (cohort x B), as many steps as its
        # local steps
        batch = LORA_BATCH * (LORA_COHORT if variant == "plain_cohort_batch" else 1)
        steps //= batch // LORA_BATCH
        trainer = L.Trainer(max_steps=steps, limit_val_batches=0, callbacks=[times], **common)
        fit = lambda: trainer.fit(model, DataLoader(data, batch_size=batch, shuffle=True))  # noqa: E731
    else:
        build_update = ClientRunner.build_update

        def recording_build_update(self, client_id, delta, *args, **kwargs):  # what a client sends
            updates.append((len(delta), sum(d.numel() for d in delta), sum(int(torch.count_nonzero(d)) for d in delta)))
            return build_update(self, client_id, delta, *args, **kwargs)

        ClientRunner.build_update = recording_build_update
        executor = None
        if variant.startswith("vectorized"):
            from lightning_fed.vectorized import VectorizedExecutor

            executor = VectorizedExecutor()
        dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=LORA_CLIENTS, seed=0),
                                 clients_per_round=LORA_COHORT, batch_size=LORA_BATCH, seed=0)
        server = FedAdam(lr=0.01, tau=1e-3)
        trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server, times], client_executor=executor, **common)
        fit = lambda: trainer.fit(model, datamodule=dm)  # noqa: E731
    before = {k: v.clone() for k, v in model.state_dict().items() if k not in adapters}
    import gc

    gc.collect()
    out["rss_start_mib"] = rss_mib()
    out["peak_reset"] = _peak_reset()
    start = time.perf_counter()
    fit()
    out["fit_s"] = time.perf_counter() - start
    out["peak_mib"] = _status_mib("VmHWM")
    out["peak_above_start_mib"] = out["peak_mib"] - out["rss_start_mib"]
    out["round_s"] = times.seconds
    # plain: one "round" = the same number of steps as a federated round (cohort x 2), from the fit's time
    out["s_per_round_median_after_first"] = (out["fit_s"] / rounds if variant.startswith("plain")
                                             else statistics.median(times.seconds[1:] or times.seconds))
    out["steps"] = int(trainer.global_step) if variant.startswith("plain") else None
    out["base_bit_identical"] = all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    out["adapters_moved"] = all(not torch.equal(v, model.adapter_state_dict()[k]) for k, v in adapters.items())
    if not variant.startswith("plain"):
        out["fallback_reason"] = getattr(executor, "fallback_reason", None)
        out["update_tensors"], out["update_numbers"], out["update_nonzero_max"] = (
            updates[0][0], updates[0][1], max(u[2] for u in updates))
        out["client_updates"] = len(updates)
        out["server_state_tensors"], out["server_state_numbers"] = _numbers(server.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "last.ckpt"
        trainer.save_checkpoint(path)
        out["checkpoint_bytes"] = path.stat().st_size
        checkpoint = torch.load(path, weights_only=False, map_location="cpu")
        out["checkpoint_parts_numbers"] = {key: _numbers(value)[1] for key, value in checkpoint.items()
                                           if _numbers(value)[1]}
        torch.save(adapters, Path(tmp) / "adapters.pt")
        out["adapter_file_bytes"] = (Path(tmp) / "adapters.pt").stat().st_size
    return out


def lora_case(rounds: int, threads: int, executors: list[str], json_path) -> None:
    """Issue #42's federated LoRA measurement: the random-init GPT-2 of :data:`LORA_MODEL` (19.35 M parameters,
    270 k LoRA adapters) under FedAdam, cohort 10 of 40 IID clients, 2 local SGD steps of 4 x 64 random bytes per
    client, ``rounds`` rounds; a plain Lightning run of the same number of steps (the ratios' reference), and one
    (``plain_cohort_batch``) of the batch the vectorized executor computes at once (10 x 4) for as many steps as
    its local steps (its activations are a whole cohort's). Each run in its own process
    (a clean heap); peak RSS is the kernel's VmHWM after resetting it at fit start (``/proc/self/clear_refs``),
    less the RSS at fit start. Prints per-client update size, server-state size, peak memory (federated against
    plain), checkpoint size against the adapters' size, s/round (median of the rounds after the first)."""
    results = []
    for variant in ["plain", "plain_cohort_batch", *executors]:
        cmd = [sys.executable, __file__, "--case", "lora", "--lora-variant", variant, "--rounds", str(rounds),
               "--threads", str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_PREFIX)]
        if proc.returncode or not lines:
            print(f"{variant}: FAILED (exit {proc.returncode})\n{proc.stderr[-3000:]}")
            results.append({"variant": variant, "failed": proc.stderr[-3000:]})
            continue
        results.append(json.loads(lines[-1][len(RESULT_PREFIX):]))
    ok = [r for r in results if "failed" not in r]
    if ok:
        r0 = ok[0]
        print(f"model: {r0['parameters']:,} parameters, {r0['adapter_parameters']:,} LoRA adapters "
              f"({100 * r0['adapter_parameters'] / r0['parameters']:.2f} %), "
              f"adapters {r0['adapter_bytes'] / 1e6:.2f} MB "
              f"(saved alone: {r0['adapter_file_bytes'] / 1e6:.2f} MB); {rounds} rounds; load {os.getloadavg()[0]:.2f}")
    plain = next((r for r in ok if r["variant"] == "plain"), None)
    cohort_batch = next((r for r in ok if r["variant"] == "plain_cohort_batch"), None)
    for r in ok:
        ratio = f" ({r['peak_above_start_mib'] / plain['peak_above_start_mib']:.2f}x plain" if plain else " ("
        if cohort_batch and r["variant"].startswith("vectorized"):
            ratio += f", {r['peak_above_start_mib'] / cohort_batch['peak_above_start_mib']:.2f}x plain_cohort_batch"
        ratio = ratio + ")" if ratio != " (" else ""
        line = (f"{r['variant']:>10}: peak above start +{r['peak_above_start_mib']:.0f} MiB{ratio}, "
                f"{r['s_per_round_median_after_first']:.2f} s/round, checkpoint {r['checkpoint_bytes'] / 1e6:.2f} MB, "
                f"base bit-identical {r['base_bit_identical']}, adapters moved {r['adapters_moved']}")
        if not r["variant"].startswith("plain"):
            line += (f"\n{'':>12}update: {r['update_tensors']} tensors, {r['update_numbers']:,} numbers "
                     f"(at most {r['update_nonzero_max']:,} non-zero); server state: {r['server_state_tensors']} "
                     f"tensors, {r['server_state_numbers']:,} numbers; fallback: {r['fallback_reason']}")
        line += f"\n{'':>12}checkpoint numbers by key: {r['checkpoint_parts_numbers']}"
        print(line)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
