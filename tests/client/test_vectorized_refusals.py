"""VectorizedExecutor(on_unsupported="raise"): every configuration it cannot train exactly is refused on the fit's
first round with a ValueError naming the reason (the default "fallback" trains those sequentially, exactly:
tests/client/test_vectorized.py)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from helpers import quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.vectorized import VectorizedExecutor
from tests.client.test_vectorized import OPTIMIZERS, TinyMLP, natural_dataset


class Manual(TinyMLP):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


class BatchStartHook(TinyMLP):
    def on_train_batch_start(self, batch, batch_idx):
        return None


class StepCallback(Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        pass


CASES = {
    "manual_optimization": (Manual, {}, "the module uses manual optimization"),
    "gradient_clipping": (TinyMLP, {"gradient_clip_val": 0.5}, r"gradient clipping \(gradient_clip_val=0.5\)"),
    "precision_64": (TinyMLP, {"precision": "64-true"}, r"precision plugin DoublePrecision \(only 32-bit"),
    "precision_bf16": (TinyMLP, {"precision": "bf16-mixed"}, r"precision plugin MixedPrecision \(only 32-bit"),
    "adagrad": (lambda: TinyMLP(lambda p: torch.optim.Adagrad(p, lr=0.1)), {},
                r"client optimizer Adagrad is not supported \(only torch.optim.SGD, Adam and AdamW\)"),
    "client_timeout": (TinyMLP, {"client_timeout_s": 30.0}, r"client_timeout_s is set \(a per-client time limit"),
    "batchnorm": (lambda: TinyMLP(batchnorm=True), {}, "BatchNorm1d updates its running statistics in train mode"),
    "dropout": (lambda: TinyMLP(dropout=0.5), {}, r"the probe step failed under vmap .*random"),
    "module_batch_hook": (BatchStartHook, {}, "the module overrides the per-step hook `on_train_batch_start`"),
    "callback_step_hook": (TinyMLP, {"callbacks": [StepCallback()]},
                           "callback StepCallback overrides the per-step hook `on_before_optimizer_step`"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unsupported_configuration_is_refused_on_the_first_round(tmp_path, case):
    make_module, trainer_kwargs, reason = CASES[case]
    torch.manual_seed(0)
    dm = FederatedDataModule(natural_dataset(), partitioner=NaturalIdPartitioner(), clients_per_round=3,
                             batch_size=5, seed=0)
    trainer = FederatedTrainer(max_epochs=2, client_executor=VectorizedExecutor(on_unsupported="raise"),
                               **{**quiet_trainer_kwargs(tmp_path), **trainer_kwargs})
    module = make_module()
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(ValueError, match=r"on_unsupported='raise'\) cannot train round 0's cohort vectorized: "
                       + reason):
        trainer.fit(module, datamodule=dm)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))  # nothing trained


def test_supported_configuration_runs_with_raise(tmp_path):
    torch.manual_seed(0)
    dm = FederatedDataModule(natural_dataset(), partitioner=NaturalIdPartitioner(), clients_per_round=3,
                             batch_size=5, seed=0)
    executor = VectorizedExecutor(on_unsupported="raise")
    trainer = FederatedTrainer(max_epochs=2, client_executor=executor, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(TinyMLP(OPTIMIZERS["adamw_amsgrad"]), datamodule=dm)
    assert trainer.current_epoch == 2 and executor.fallback_reason is None


def test_bad_on_unsupported():
    with pytest.raises(ValueError, match=r"`on_unsupported` must be one of \('fallback', 'raise'\), got 'warn'"):
        VectorizedExecutor(on_unsupported="warn")
