"""The README's quick start and the snippets of the pages it sends to run as written (small module and data in place
of MyLitClassifier and a real dataset)."""

from __future__ import annotations

import re
from pathlib import Path

import lightning as L

from helpers import SmallClassifier, classification_dataset

README = Path(__file__).resolve().parents[2] / "README.md"
#: The guide page that took the README's Lightning details (#57) and the page that opens on its algorithm section.
LIGHTNING_PAGE = README.parent / "docs" / "guide" / "your-own-lightningmodule-federated.md"
ALGORITHM_PAGE = README.parent / "docs" / "write-your-own-algorithm.md"


def _snippet() -> str:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "FederatedTrainer(max_epochs=500" in code
    return code.replace("max_epochs=500", "max_epochs=2, enable_progress_bar=False, enable_model_summary=False")


def test_readme_snippet_runs(tmp_path, monkeypatch):
    """With plain tensors: the snippet's own ``TensorDataset`` has no ``targets``, so DirichletPartitioner's labels
    come from the snippet's ``labels=`` (issue #32: the snippet failed on such a dataset). A 10,000-sample dataset:
    the snippet's ``min_partition_size`` is met there (issue #43: the default 10 made every draw fail)."""
    train, test = classification_dataset(n=10000, classes=10, n_val=200)
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
    train, test = classification_dataset(n=10000, classes=10, n_val=200)
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


def test_write_your_own_algorithm_snippets_run(tmp_path):
    """The two snippets opening docs/write-your-own-algorithm.md run as written, train, and do what they say: the client half
    adds λ·w to every gradient, the rule moves x_t by η·sign(Δ_t)."""
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    from helpers import LinearRegression, linear_weights, quiet_trainer_kwargs, regression_data
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    section = ALGORITHM_PAGE.read_text().split("# Write your own algorithm", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/write-your-own-algorithm.md", "exec"), namespace)
    x, y = regression_data(n=20, d=3)
    runs = {}
    for name, server in (("signsgd", namespace["server"]),
                         ("no_decay", namespace["ServerOptimizer"](rule=namespace["SignSGD"](lr=0.001)))):
        dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                                 partitioner=IIDPartitioner(num_clients=2, seed=0), clients_per_round=2,
                                 batch_size=100, local_epochs=1)
        torch.manual_seed(0)
        model = LinearRegression(lr=0.1)
        w0 = linear_weights(model)
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
        runs[name] = (w0, linear_weights(model))
    # one full-batch local step per client, then x ← x + 0.001·sign(mean Δ): every coordinate moves by exactly η
    w0, w1 = runs["signsgd"]
    np.testing.assert_allclose(np.abs(w1 - w0), 0.001, rtol=1e-12)
    assert np.array_equal(runs["no_decay"][0], w0)


def test_hugging_face_dict_batches_snippet_runs(tmp_path, monkeypatch):
    """The "Hugging Face datasets: dict batches" snippet (docs/guide/your-own-lightningmodule-federated.md) runs as written: a module written for (x, y) tuples trains
    on a Hugging Face dataset with ``batch_columns``, labels for the Dirichlet partition from its "label" column."""
    text = LIGHTNING_PAGE.read_text()
    section = text[text.index("## Hugging Face datasets: dict batches"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'batch_columns=("image", "label")' in code and "FederatedTrainer(max_epochs=500)" in code
    code = code.replace("FederatedTrainer(max_epochs=500)", "FederatedTrainer(max_epochs=2, logger=False, "
                        "enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)")
    train = classification_dataset(n=60000, classes=10)  # the first snippet's size: alpha=0.1 needs it
    monkeypatch.chdir(tmp_path)
    namespace = {"MyLitClassifier": lambda: SmallClassifier(num_classes=10),
                 "x_train": train.tensors[0], "y_train": train.tensors[1]}
    exec(compile(code, "docs/guide/your-own-lightningmodule-federated.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.current_epoch == 2 and trainer.callback_metrics["round_train_loss"].isfinite()
