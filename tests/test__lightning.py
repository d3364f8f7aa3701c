"""lightning_fed._lightning: every private Lightning symbol the package uses exists in the installed Lightning, and a
Lightning that lacks one fails at import with a message naming it and the supported versions."""

import importlib
import re
from pathlib import Path

import lightning
import lightning.pytorch.trainer.call as lightning_call
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric

from lightning_fed import FederatedTrainer
from lightning_fed import _lightning
from helpers import LinearRegression

ROOT = Path(__file__).resolve().parents[1]


def test_supported_range_is_the_pyproject_pin():
    pin = re.search(r'"lightning(>=[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert _lightning.SUPPORTED_LIGHTNING == pin


@pytest.mark.parametrize("module, path", _lightning.REQUIRED_SYMBOLS, ids=[p for _, p in _lightning.REQUIRED_SYMBOLS])
def test_required_symbol_exists(module, path):
    obj = importlib.import_module(module)
    for part in path.split("."):
        assert hasattr(obj, part), (
            f"Lightning {lightning.__version__} lacks {module}.{path}, a private symbol lightning_fed._lightning "
            f"uses (supported: lightning{_lightning.SUPPORTED_LIGHTNING}); update _lightning.py for this version."
        )
        obj = getattr(obj, part)


def _owners(tmp_path):
    trainer = FederatedTrainer(max_epochs=1, logger=False, default_root_dir=tmp_path)
    epoch_loop = trainer.fit_loop.epoch_loop  # a test may look inside Lightning's loops
    metric = _ResultMetric(_Metadata(fx="training_step", name="loss"), is_tensor=True)
    return {
        "Trainer": trainer,
        "Strategy": trainer.strategy,
        "_LoggerConnector": trainer._logger_connector,
        "_TrainingEpochLoop": epoch_loop,
        "_AutomaticOptimization": epoch_loop.automatic_optimization,
        "LightningModule": LinearRegression(),
        "ModelCheckpoint": ModelCheckpoint(dirpath=tmp_path),
        "_ResultMetric": metric,
        "_EvaluationLoop": trainer.validate_loop,
        "TensorBoardLogger": TensorBoardLogger(tmp_path),
        "CSVLogger": CSVLogger(tmp_path),
    }


def test_every_private_instance_attribute_exists(tmp_path):
    owners = _owners(tmp_path)
    missing = []
    for owner, path in _lightning.INSTANCE_ATTRIBUTES:
        obj = owners[owner]
        for part in path.split("."):
            if not hasattr(obj, part):
                missing.append(f"{owner}.{path}")
                break
            obj = getattr(obj, part)
    assert not missing, (
        f"Lightning {lightning.__version__} lacks the private attribute(s) {missing} that lightning_fed._lightning "
        f"uses (supported: lightning{_lightning.SUPPORTED_LIGHTNING})."
    )


def test_a_lightning_without_a_symbol_fails_at_import_naming_it(monkeypatch):
    monkeypatch.delattr(lightning_call, "_call_strategy_hook")
    try:
        with pytest.raises(ImportError, match=r"lightning\.pytorch\.trainer\.call\._call_strategy_hook.*"
                                              r"lightning>=2\.6,<2\.7"):
            importlib.reload(_lightning)
    finally:
        monkeypatch.undo()
        importlib.reload(_lightning)
    assert _lightning.call_strategy_hook is not None


def test_missing_class_attribute_is_named_too(monkeypatch):
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    monkeypatch.delattr(_TrainingEpochLoop, "_build_kwargs")
    try:
        with pytest.raises(ImportError, match=r"_TrainingEpochLoop\._build_kwargs, which the installed lightning"):
            importlib.reload(_lightning)
    finally:
        monkeypatch.undo()
        importlib.reload(_lightning)


@pytest.mark.parametrize("first_loop_iter", [True, False])
def test_end_logged_batch_is_the_logger_connectors_on_batch_end(tmp_path, first_loop_iter):
    """Issue #51: end_logged_batch(trainer, results) — on_batch_end with the result collection at hand — leaves the
    callback, progress-bar and logged metrics and the results' batch exactly as the connector's own on_batch_end."""
    import torch
    from lightning.pytorch.trainer.states import RunningStage

    after = []
    for ours in (False, True):
        trainer = FederatedTrainer(max_epochs=1, logger=False, default_root_dir=tmp_path)
        trainer.state.stage = RunningStage.TRAINING
        connector, results = trainer._logger_connector, trainer.fit_loop.epoch_loop._results
        assert trainer._results is results
        results.log("training_step", "loss", torch.tensor(1.5), prog_bar=True, on_step=True, on_epoch=False,
                    batch_size=4)
        results.log("training_step", "acc", torch.tensor(0.25), on_step=True, on_epoch=True, batch_size=4)
        results.log("training_step", "quiet", torch.tensor(3.0), logger=False, on_step=True, on_epoch=False,
                    batch_size=4)
        results.log("training_step", "epoch_only", torch.tensor(2.0), on_step=False, on_epoch=True, batch_size=2)
        connector._first_loop_iter, results.batch, results.batch_size = first_loop_iter, ("batch",), 4
        connector._callback_metrics["earlier"] = torch.tensor(9.0)
        if ours:
            _lightning.end_logged_batch(trainer, results)
        else:
            connector.on_batch_end()
        after.append(({k: v.item() for k, v in connector._callback_metrics.items()}, dict(connector._progress_bar_metrics),
                      {k: v.item() for k, v in connector._logged_metrics.items()}, results.batch, results.batch_size))
    assert after[0] == after[1]
    assert after[0][0] == {"earlier": 9.0, "loss": 1.5, "acc": 0.25, "acc_step": 0.25, "quiet": 3.0}
    assert after[0][1] == {"loss": 1.5} and after[0][3:] == (None, None)
