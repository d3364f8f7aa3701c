"""The README's snippet runs as written (small module and data in place of MyLitClassifier and a real dataset)."""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L

from helpers import SmallClassifier, classification_dataset

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_snippet_runs(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "FederatedTrainer(max_epochs=500" in code
    code = code.replace("max_epochs=500", "max_epochs=2, enable_progress_bar=False, enable_model_summary=False")
    train_dataset, test_dataset = classification_dataset(n=60000, classes=10, n_val=200)
    monkeypatch.chdir(tmp_path)
    namespace = {"MyLitClassifier": lambda: SmallClassifier(num_classes=10), "train_dataset": train_dataset, "test_dataset": test_dataset}
    exec(compile(code, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.current_epoch == 2
    assert set(trainer.callback_metrics) >= {"round_train_loss", "val_loss"}
    assert list((tmp_path / "runs").rglob("events.out.tfevents.*")), "TensorBoard event files written"
