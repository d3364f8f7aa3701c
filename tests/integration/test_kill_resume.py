"""A training process killed with SIGKILL at an arbitrary point resumes from its last checkpoint and ends with the
same weights as an uninterrupted run (CPU)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

ROUNDS = 8

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    import time
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAdam
    from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule

    out, ckpt_dir, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "resume"
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.2)
    train, val = classification_dataset(n=3000, n_val=100)
    dm = FederatedDataModule(train, val_dataset=val, partitioner=DirichletPartitioner(num_clients=20, alpha=0.5),
                             clients_per_round=5, batch_size=8, local_epochs=2)
    class SlowRounds(Callback):  # rounds of >= 0.3 s: the kill window (0-1.5 s after round 1) ends mid-run
        def on_train_epoch_start(self, trainer, pl_module):
            time.sleep(0.3)

    trainer = FederatedTrainer(
        max_epochs={rounds},
        callbacks=[FedAdam(lr=0.02), ModelCheckpoint(dirpath=ckpt_dir, save_last=True), SlowRounds()],
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_dir + "/last.ckpt" if resume else None)
    torch.save(model.state_dict(), out)
    """
)


def _run(tmp_path: Path, name: str, resume: bool = False, kill_after_checkpoint: bool = False) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parents[1]), rounds=ROUNDS))
    out, ckpt_dir = tmp_path / f"{name}.pt", tmp_path / f"ckpt_{name.split('_')[0]}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, str(script), str(out), str(ckpt_dir), "resume" if resume else "fresh"]
    if not kill_after_checkpoint:
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
        return out
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (ckpt_dir / "last.ckpt").exists():  # at least one round checkpointed ...
        assert proc.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(random.Random(os.getpid()).uniform(0.0, 1.5))  # ... then an arbitrary point
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "the run finished before SIGKILL; nothing was interrupted"
    return out


def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path):
    uninterrupted = torch.load(_run(tmp_path, "full"), weights_only=True)
    _run(tmp_path, "killed", kill_after_checkpoint=True)
    checkpoint = torch.load(tmp_path / "ckpt_killed" / "last.ckpt", weights_only=True)  # loads weights-only
    assert 0 <= checkpoint["epoch"] < ROUNDS - 1  # Lightning stores the index of the last finished round
    resumed = torch.load(_run(tmp_path, "killed_resumed", resume=True), weights_only=True)
    assert resumed.keys() == uninterrupted.keys()
    for key in uninterrupted:
        torch.testing.assert_close(resumed[key], uninterrupted[key], rtol=0, atol=0)


DISK_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import SCAFFOLD
    from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule

    out, root, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.manual_seed(0)
    model = SmallClassifier()
    train = classification_dataset(n=600)
    dm = FederatedDataModule(train, partitioner=DirichletPartitioner(num_clients=6, alpha=0.5), clients_per_round=3,
                             batch_size=8, local_epochs=1)

    class Bomb:  # pickled inside torch.save of round 3's checkpoint: the process dies mid-save
        def __reduce__(self):
            os.kill(os.getpid(), signal.SIGKILL)

    class KillMidSave(Callback):
        def state_dict(self):
            return {{"bomb": Bomb()}} if mode == "kill" and self.epoch == 3 else {{}}

        def on_train_epoch_start(self, trainer, pl_module):
            self.epoch = trainer.current_epoch

    trainer = FederatedTrainer(
        max_epochs={rounds}, default_root_dir=root,
        callbacks=[SCAFFOLD(client_state_store="disk"), KillMidSave(),
                   ModelCheckpoint(dirpath=root + "/ckpt", save_last=True, save_top_k=2, monitor="epoch", mode="max")],
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=root + "/ckpt/last.ckpt" if mode == "resume" else None)
    torch.save(model.state_dict(), out)
    """
)


def test_42_sigkill_mid_save_with_the_disk_client_state_store_loses_nothing(tmp_path):
    """SCAFFOLD with its c_i on disk, killed with SIGKILL inside torch.save of round 3's checkpoint (after that round's
    rows and the checkpoint's refs were written): the previous checkpoint and every row it references are intact,
    and the resume from it ends with the uninterrupted run's weights bit for bit (the rows the killed round wrote do
    not leak into it)."""
    script = tmp_path / "train_disk.py"
    script.write_text(DISK_SCRIPT.format(tests=str(Path(__file__).parents[1]), rounds=6))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")

    def run(name, mode, root):
        out = tmp_path / f"{name}.pt"
        proc = subprocess.run([sys.executable, str(script), str(out), str(root), mode], env=env, capture_output=True,
                              timeout=300)
        return proc, out

    proc, full = run("full", "fresh", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    proc, killed = run("killed", "kill", tmp_path / "b")
    assert proc.returncode == -signal.SIGKILL and not killed.exists()
    partials = [p.name for p in (tmp_path / "b" / "ckpt").iterdir() if ".partial-" in p.name]
    assert partials, "the kill did not happen inside the save"
    assert torch.load(tmp_path / "b" / "ckpt" / "last.ckpt", weights_only=True)["epoch"] == 2
    proc, resumed = run("resumed", "resume", tmp_path / "b")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    a, b = torch.load(full, weights_only=True), torch.load(resumed, weights_only=True)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0)
