"""Clients spread over 2 CPU processes (gloo) end with the same weights as a single-process run."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch


SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedYogi
    from lightning_fed.distributed import FederatedDDPStrategy
    from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule

    out, devices = sys.argv[1], int(sys.argv[2])
    per_device = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.2)
    train, val = classification_dataset(n=2000, n_val=200)
    dm = FederatedDataModule(train, val_dataset=val, partitioner=DirichletPartitioner(num_clients=20, alpha=0.5),
                             clients_per_round=5, batch_size=8)
    trainer = FederatedTrainer(
        max_epochs=3, callbacks=[FedYogi(lr=0.05)],
        strategy=(FederatedDDPStrategy(processes_per_device=per_device) if per_device > 1
                  else "ddp" if devices > 1 else "auto"),
        accelerator="cpu", devices=devices, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        torch.save({{"state": model.state_dict(), "val_loss": float(trainer.callback_metrics["val_loss"]),
                    "world_size": trainer.world_size, "step_path": trainer.fit_loop.client_runner.step_path}}, out)
    """
)


def _train(folder: Path, name: str, *argv: str) -> dict:
    """SCRIPT run in its own process with ``argv`` (devices [, processes per device]); what its rank 0 saved."""
    script = folder / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, str(script), str(folder / f"{name}.pt"), *argv], check=True, env=env, cwd=folder,
                   capture_output=True, timeout=300)
    return torch.load(folder / f"{name}.pt", weights_only=True)


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> dict:
    """The one-process run (devices=1, strategy "auto") both equality tests compare with: one run for the file."""
    return _train(tmp_path_factory.mktemp("one_process"), "w1", "1")


def test_two_gloo_processes_equal_one(tmp_path, one):
    two = _train(tmp_path, "w2", "2")
    assert one["world_size"] == 1 and two["world_size"] == 2
    # every rank takes the lean local step too (issue #33: it was switched off whenever the world size was not 1)
    assert one["step_path"] == two["step_path"] == "lean"
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, rtol=0, atol=0)  # bit for bit
    # validation is sharded across the two ranks; the logged value is rank 0's shard mean, so only roughly equal
    assert abs(two["val_loss"] - one["val_loss"]) < 0.5


def test_two_processes_on_one_device_equal_one(tmp_path, one):
    """Issue #33 item 4: k = 2 processes per device (``FederatedDDPStrategy(processes_per_device=2)``, ``devices=1``,
    gloo) split the cohort as two devices do and end with one process's weights, bit for bit."""
    two = _train(tmp_path, "w2", "1", "2")
    assert one["world_size"] == 1 and two["world_size"] == 2 and two["step_path"] == "lean"
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, rtol=0, atol=0)


def test_processes_per_device_must_be_a_positive_integer():
    import pytest

    from lightning_fed.distributed import FederatedDDPStrategy

    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"`processes_per_device` must be an integer >= 1, got"):
            FederatedDDPStrategy(processes_per_device=bad)
    assert FederatedDDPStrategy(processes_per_device=3, process_group_backend="gloo").process_group_backend == "gloo"
    assert FederatedDDPStrategy().process_group_backend is None  # k = 1: Lightning's default backend


def test_shared_memory_must_be_a_bool():
    import pytest

    from lightning_fed.distributed import FederatedDDPStrategy

    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match=r"`shared_memory` must be True or False, got"):
            FederatedDDPStrategy(shared_memory=bad)
    assert FederatedDDPStrategy().shared_memory is True
    assert FederatedDDPStrategy(shared_memory=False).shared_memory is False


FAIL_FAST_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import IIDPartitioner, FederatedDataModule

    class MissingKey(SmallClassifier):
        def training_step(self, batch, batch_idx):
            return {{"x": batch[0]}}["features"]

    out = sys.argv[1]
    train, _ = classification_dataset(n=200, n_val=20)
    dm = FederatedDataModule(train, partitioner=IIDPartitioner(num_clients=10), clients_per_round=5, batch_size=8)
    trainer = FederatedTrainer(max_epochs=5, strategy="ddp", accelerator="cpu", devices=2, logger=False,
                               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(MissingKey(), datamodule=dm)
    except RuntimeError as error:
        if trainer.global_rank == 0:
            with open(out, "w") as f:
                f.write(f"{{trainer.current_epoch}}\\n{{error}}\\n{{type(error.__cause__).__name__}}")
    """
)


def test_every_rank_stops_a_round_whose_clients_all_failed_alike(tmp_path):
    """#43.1 under DDP: the decision is taken on the failures gathered from both ranks (the same on each), so the run
    stops at round 0 with the clients' error, without a rank left waiting in a collective."""
    script = tmp_path / "fail_fast.py"
    script.write_text(FAIL_FAST_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, str(script), str(tmp_path / "error.txt")], env=env, cwd=tmp_path,
                   capture_output=True, timeout=300)
    epoch, message = (tmp_path / "error.txt").read_text().split("\n", 1)
    assert epoch == "0"
    assert "Round 0: all 5 clients failed with the same error, KeyError: 'features'" in message
    assert "fail_fast.py" in message  # the place it was raised (and, from the other rank, its traceback)
