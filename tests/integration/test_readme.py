"""The README's snippet runs as written (small module and data in place of MyLitClassifier and a real dataset)."""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L

from helpers import SmallClassifier, classification_dataset

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippet() -> str:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "FederatedTrainer(max_epochs=500" in code
    return code.replace("max_epochs=500", "max_epochs=2, enable_progress_bar=False, enable_model_summary=False")


def test_readme_snippet_runs(tmp_path, monkeypatch):
    """With plain tensors: the snippet's own ``TensorDataset`` has no ``targets``, so DirichletPartitioner's labels
    come from the snippet's ``labels=`` (issue #32: the snippet failed on such a dataset)."""
    train, test = classification_dataset(n=60000, classes=10, n_val=200)
    (x_train, y_train), (x_test, y_test) = train.tensors, test.tensors
    monkeypatch.chdir(tmp_path)
    namespace = {"MyLitClassifier": lambda: SmallClassifier(num_classes=10),
                 "x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
    exec(compile(_snippet(), "README.md", "exec"), namespace)
    assert not hasattr(namespace["train_dataset"], "targets")
    trainer = namespace["trainer"]
    assert trainer.current_epoch == 2
    assert set(trainer.callback_metrics) >= {"round_train_loss", "val_loss"}
    assert not any(k.startswith("fed_") for k in trainer.callback_metrics)  # federated evaluation is opt-in
    assert list((tmp_path / "runs").rglob("events.out.tfevents.*")), "TensorBoard event files written"


def test_readme_snippet_with_federated_evaluation(tmp_path, monkeypatch):
    """The settings the paragraph after the snippet gives for federated evaluation work when added to it."""
    train, test = classification_dataset(n=60000, classes=10, n_val=200)
    (x_train, y_train), (x_test, y_test) = train.tensors, test.tensors
    text = README.read_text()
    added = re.search(r"add e\.g\. `(eval_clients_per_round=\d+, eval_fraction=[\d.]+)` to turn it on", text).group(1)
    code = _snippet().replace("clients_per_round=10, batch_size=20", f"clients_per_round=10, batch_size=20, {added}")
    assert added in code
    monkeypatch.chdir(tmp_path)
    namespace = {"MyLitClassifier": lambda: SmallClassifier(num_classes=10),
                 "x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
    exec(compile(code, "README.md", "exec"), namespace)
    metrics = namespace["trainer"].callback_metrics
    assert "fed_val_loss/weighted" in metrics and int(metrics["fed_eval_clients"]) == 10
