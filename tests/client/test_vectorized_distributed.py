"""The vectorized executor under FederatedDDPStrategy (issue #33.4: several clients at once on each of several
processes): each of 2 gloo processes vmaps its share of the cohort and the updates are gathered; the weights equal
the one-process vectorized run's (to float rounding: the vmapped batches hold other clients) and the sequential
run's, and no rank falls back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer, VectorizedExecutor
    from lightning_fed.callbacks import FedAdam
    from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule

    # one fit per executor named (in one process: its start costs more than a fit), each from the same seed
    folder, devices, executors = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for name in executors:
        executor = name.rstrip("0123456789")
        torch.manual_seed(0)
        model = SmallClassifier(dropout=0.0)
        train, _ = classification_dataset(n=1200, n_val=10)
        dm = FederatedDataModule(train, partitioner=DirichletPartitioner(num_clients=12, alpha=0.5),
                                 clients_per_round=6, batch_size=8)
        vectorized = VectorizedExecutor(on_unsupported="raise")
        trainer = FederatedTrainer(
            max_epochs=3, callbacks=[FedAdam(lr=0.05)], strategy="ddp" if devices > 1 else "auto",
            client_executor=vectorized if executor == "vectorized" else "sequential",
            accelerator="cpu", devices=devices, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        )
        trainer.fit(model, datamodule=dm)
        print(name, "rank", trainer.global_rank, "fallback:", vectorized.fallback_reason, "steps:", trainer.global_step)
        if trainer.global_rank == 0:
            torch.save({{"state": model.state_dict(), "world_size": trainer.world_size,
                        "loss": float(trainer.callback_metrics["round_train_loss"])}}, f"{{folder}}/{{name}}.pt")
    """
)


def test_two_processes_vectorize_their_shares(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent.parent)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    outputs = {}
    # one process: vectorized, then sequential; two processes: vectorized
    for devices, names in ((1, ["vectorized1", "sequential1"]), (2, ["vectorized2"])):
        done = subprocess.run([sys.executable, str(script), str(tmp_path), str(devices), *names],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        outputs[devices] = done.stdout
    assert outputs[2].count("fallback: None") == 2, outputs[2]  # both ranks trained vectorized
    one, two, seq = (torch.load(tmp_path / f"{n}.pt", weights_only=True)
                     for n in ("vectorized1", "vectorized2", "sequential1"))
    assert one["world_size"] == 1 and two["world_size"] == 2
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(seq["state"][key], value, rtol=1e-5, atol=1e-6)
    assert abs(two["loss"] - one["loss"]) < 1e-6
