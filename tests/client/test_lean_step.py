"""The lean local step (lightning_fed/client/lean_step.py) against Lightning's own optimization loop: the same
weights bit for bit and the same logged values, taken only when nothing of Lightning's per-step machinery can act,
and Lightning's own errors for bad ``self.log`` calls."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.utilities import move_data_to_device
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.utils.data import TensorDataset
from torchmetrics import MeanMetric

from lightning_fed import FederatedTrainer
from lightning_fed import _lightning as pl_private
from lightning_fed.client.host_sync import HostSyncCounter
from lightning_fed.client.lean_step import _moved, lean_step_blocker
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner


class MLP(L.LightningModule):
    """A small classifier; ``logs`` picks what training_step logs."""

    def __init__(self, logs: str = "step", lr: float = 0.1):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        self.logs, self.lr = logs, lr
        self.metric = MeanMetric()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        n = y.shape[0]
        if "step" in self.logs:
            self.log("train_loss", loss, prog_bar=True, batch_size=n)
        if "epoch" in self.logs:
            self.log("loss_epoch_only", 2 * loss, on_step=False, on_epoch=True)  # batch size from the batch
            self.log("loss_both", loss + 1, on_step=True, on_epoch=True, batch_size=n)
        if "dict" in self.logs:
            self.log_dict({"x_mean": x.mean(), "x_max_abs": x.abs().max()}, batch_size=n)
        if "max" in self.logs:
            self.log("x_max", x.max(), reduce_fx="max", on_step=False, on_epoch=True)
        if "metric" in self.logs:
            self.metric.update(loss.detach())
            self.log("loss_metric", self.metric, on_step=False, on_epoch=True)
        if "twice" in self.logs:  # the step's last value counts (Lightning's forward cache keeps the last)
            self.log("twice", loss, on_step=True, on_epoch=True, batch_size=n)
            self.log("twice", 3 * loss, on_step=True, on_epoch=True, batch_size=n)
            self.log("twice", x.std() if batch_idx % 2 else x.mean(), on_step=True, on_epoch=True, batch_size=n)
        if "float64" in self.logs:
            self.log("x_sum64", x.double().sum(), on_step=True, on_epoch=True, batch_size=n)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def values(metrics):
    """Metrics as floats, without the round's wall time (the one value that differs between two runs)."""
    return {k: float(v) for k, v in metrics.items() if k != "round_time_s"}


class Recorder(Callback):
    """Every round's callback/progress-bar metrics, and the callback metrics after each client."""

    def __init__(self):
        self.rounds, self.after_client = [], []

    def on_client_end(self, trainer, pl_module, update, position):
        self.after_client.append(values(trainer.callback_metrics))

    def on_train_epoch_end(self, trainer, pl_module):
        self.rounds.append((
            values(trainer.callback_metrics),
            values(trainer.progress_bar_metrics),
            trainer.global_step,
        ))


class MemoryLogger(Logger):
    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, values(metrics)))


def make_data(n=30, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(x, y)


def fit(model, lean=True, callbacks=(), rounds=2, batch_size=4, **kwargs):
    """Fit ``model`` for ``rounds`` rounds (3 clients, 2 per round); returns (trainer, recorder, logger)."""
    dm = FederatedDataModule(make_data(), partitioner=IIDPartitioner(num_clients=3), clients_per_round=2,
                             batch_size=batch_size)
    recorder, logger = Recorder(), MemoryLogger()
    kwargs.setdefault("on_client_failure", "raise")
    kwargs.setdefault("enable_checkpointing", False)
    trainer = FederatedTrainer(max_epochs=rounds, logger=logger, enable_progress_bar=False, enable_model_summary=False,
                               accelerator="cpu", num_sanity_val_steps=0,
                               callbacks=[recorder, *callbacks], **kwargs)
    trainer.fit_loop.client_runner.allow_lean_step = lean
    trainer.fit(model, datamodule=dm)
    return trainer, recorder, logger


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "logs", ["step", "step+epoch", "step+dict", "step+epoch+max+metric", "float64+epoch", "twice", "twice+max", ""]
)
def test_lean_step_equals_lightnings_loop_bit_for_bit(logs):
    lean_model, full_model = MLP(logs), MLP(logs)
    lean, lean_rec, lean_log = fit(lean_model, lean=True)
    full, full_rec, full_log = fit(full_model, lean=False)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert full.fit_loop.client_runner.step_path == "lightning"
    assert full.fit_loop.client_runner.lean_step_blocker == "allow_lean_step=False"
    for a, b in zip(weights(lean_model), weights(full_model)):
        assert torch.equal(a, b)
    assert lean.global_step == full.global_step == 2 * 2 * 3  # rounds x clients x ceil(10 / 4) steps
    assert lean_rec.rounds == full_rec.rounds  # callback metrics, progress bar, global step: every round
    assert lean_rec.after_client == full_rec.after_client  # as the last local step left them
    assert lean_log.rows == full_log.rows
    assert lean.fit_loop.state_dict() == full.fit_loop.state_dict()  # progress counters (checkpointed) too
    if "step" in logs:
        assert "train_loss" in lean_rec.rounds[-1][0] and "train_loss" in lean_rec.rounds[-1][1]


def test_each_rounds_first_step_logs_through_the_fast_path_bit_for_bit(monkeypatch):
    """Issue #51: the names the fast self.log path registered in round 0 stay registered, so later rounds' first
    steps take the fast path too (doing what Lightning's log does at a hook's first value: the hook's reset), not
    LightningModule.log; every round's metrics, the logger's rows and the weights equal Lightning's loop."""
    calls = []
    real_log = L.LightningModule.log

    def counting_log(self, name, *args, **kwargs):
        if self._current_fx_name == "training_step":
            calls.append((self.trainer.current_epoch, name))
        return real_log(self, name, *args, **kwargs)

    monkeypatch.setattr(L.LightningModule, "log", counting_log)
    lean_model, full_model = MLP("step+epoch"), MLP("step+epoch")
    lean, lean_rec, lean_log = fit(lean_model, lean=True, rounds=3)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert sorted(calls) == [(0, "loss_both"), (0, "loss_epoch_only"), (0, "train_loss")]  # round 0's first step
    full, full_rec, full_log = fit(full_model, lean=False, rounds=3)
    for a, b in zip(weights(lean_model), weights(full_model)):
        assert torch.equal(a, b)
    assert lean_rec.rounds == full_rec.rounds and lean_rec.after_client == full_rec.after_client
    assert lean_log.rows == full_log.rows and len(lean_rec.rounds) == 3


def test_a_clients_end_updates_the_logged_metrics_without_the_connectors_on_batch_end(monkeypatch):
    """Issue #51: at a lean client's end its last step values reach callback_metrics, progress_bar_metrics and
    logged_metrics through _lightning.end_logged_batch with the client's result collection at hand (the connector's
    on_batch_end reads trainer._results three times); the connector's own on_batch_end then runs once a round, at its
    end. Every client's and round's metrics, the logger's rows and the weights equal Lightning's loop."""
    from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

    calls = []
    real = _LoggerConnector.on_batch_end

    def counting(self):
        calls.append(self.trainer.current_epoch)
        return real(self)

    monkeypatch.setattr(_LoggerConnector, "on_batch_end", counting)
    lean_model, full_model = MLP("step+epoch"), MLP("step+epoch")
    lean, lean_rec, lean_log = fit(lean_model, lean=True)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert calls == [0, 1]  # the rounds' ends only (2 clients a round)
    full, full_rec, full_log = fit(full_model, lean=False)
    assert all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(full_model)))
    assert lean_rec.after_client == full_rec.after_client and len(lean_rec.after_client) == 4
    assert lean_rec.rounds == full_rec.rounds and lean_log.rows == full_log.rows


class SkipsOddSteps(MLP):
    """Returns None (no backward, no loss reported) at odd steps and a dict with an extra key at even ones."""

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return None if batch_idx % 2 else {"loss": loss, "extra": batch_idx}


def test_none_and_dict_outputs_as_lightnings_loop():
    lean_model, full_model = SkipsOddSteps(), SkipsOddSteps()
    lean, lean_rec, _ = fit(lean_model, lean=True)
    full, full_rec, _ = fit(full_model, lean=False)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(full_model)))
    assert lean_rec.rounds == full_rec.rounds and lean.global_step == full.global_step == 12
    assert lean_rec.rounds[-1][0]["round_local_steps"] == 6.0


def test_returning_none_warns_as_lightning_does():
    from lightning_fed import _lightning

    class Recorded(list):
        def warn(self, message):
            self.append(message)

    cache = _lightning._symbol("lightning.pytorch.loops.optimization.automatic", "Closure.warning_cache")
    saved, recorded = cache.warn, Recorded()
    cache.warn = recorded.warn
    try:
        trainer, _, _ = fit(SkipsOddSteps(), lean=True)
    finally:
        cache.warn = saved
    assert trainer.fit_loop.client_runner.step_path == "lean"
    assert recorded == ["`training_step` returned `None`. If this was on purpose, ignore this warning..."] * 4


def test_last_batch_size_and_dict_batches():
    """Epoch values weight by each step's own batch size (last batch smaller); Hugging Face-style dict batches
    use the first tensor's length."""

    class DictBatches(torch.utils.data.Dataset):
        def __init__(self):
            self.data = make_data()

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            x, y = self.data[i]
            return {"x": x, "y": y}

    class DictMLP(MLP):
        def training_step(self, batch, batch_idx):
            loss = F.cross_entropy(self.net(batch["x"]), batch["y"])
            self.log("loss", loss, on_step=False, on_epoch=True)
            return loss

    results = []
    for lean in (True, False):
        model = DictMLP()
        dm = FederatedDataModule(DictBatches(), partitioner=IIDPartitioner(num_clients=3), clients_per_round=2,
                                 batch_size=4)
        trainer = FederatedTrainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                                   enable_checkpointing=False, accelerator="cpu")
        trainer.fit_loop.client_runner.allow_lean_step = lean
        trainer.fit(model, datamodule=dm)
        assert trainer.fit_loop.client_runner.step_path == ("lean" if lean else "lightning")
        results.append((weights(model), float(trainer.callback_metrics["loss"])))
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert results[0][1] == results[1][1]


class HookCounter:
    calls = 0


class OnAfterBackward(MLP):
    def on_after_backward(self):
        HookCounter.calls += 1


class OnTrainBatchEnd(MLP):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        HookCounter.calls += 1


class TransferHook(MLP):
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        HookCounter.calls += 1
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


class ZeroGradHook(MLP):
    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        HookCounter.calls += 1
        optimizer.zero_grad()


class StepCallback(Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        HookCounter.calls += 1


class BatchEndCallback(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        HookCounter.calls += 1


@pytest.mark.parametrize(
    "model_cls, kwargs, reason",
    [
        (OnAfterBackward, {}, "the module overrides on_after_backward"),
        (OnTrainBatchEnd, {}, "the module overrides on_train_batch_end"),
        (TransferHook, {}, "the module overrides transfer_batch_to_device"),
        (ZeroGradHook, {}, "the module overrides optimizer_zero_grad"),
        (MLP, {"callbacks": [BatchEndCallback()]}, "callback BatchEndCallback overrides on_train_batch_end"),
    ],
)
def test_a_batch_hook_takes_lightnings_loop_and_is_called(model_cls, kwargs, reason):
    HookCounter.calls = 0
    trainer, _, _ = fit(model_cls(), **kwargs)
    runner = trainer.fit_loop.client_runner
    assert (runner.step_path, runner.lean_step_blocker) == ("lightning", reason)
    assert HookCounter.calls == 12  # 2 rounds x 2 clients x 3 local steps


class GradientProbe(Callback):
    """on_before_optimizer_step: records the hook name the module logs under, the optimizer it gets and the
    gradient norm (after backward, before the step), logs it, and changes the gradient (as FedProx does)."""

    def __init__(self):
        self.calls = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in pl_module.parameters()]))
        self.calls.append((pl_module._current_fx_name, optimizer is trainer.optimizers[0], float(norm)))
        pl_module.log("grad_norm", norm, on_step=True, on_epoch=True, batch_size=1)
        for p in pl_module.parameters():
            p.grad.mul_(0.5)


def test_a_callbacks_on_before_optimizer_step_keeps_the_lean_path_as_lightning_calls_it():
    """A callback's on_before_optimizer_step (FedProx's and SCAFFOLD's gradient corrections) runs where
    Lightning's precision plugin runs it — after the closure's backward, before the update, under the hook's
    name, with the torch optimizer — so the lean path keeps it: the same weights, hook calls and logs."""
    lean_probe, full_probe = GradientProbe(), GradientProbe()
    lean_model, full_model = MLP("step"), MLP("step")
    lean, lean_rec, lean_log = fit(lean_model, lean=True, callbacks=[lean_probe])
    full, full_rec, full_log = fit(full_model, lean=False, callbacks=[full_probe])
    assert (lean.fit_loop.client_runner.step_path, lean.fit_loop.client_runner.lean_step_blocker) == ("lean", None)
    assert len(lean_probe.calls) == 12 and lean_probe.calls == full_probe.calls
    assert lean_probe.calls[0][:2] == ("on_before_optimizer_step", True)
    assert all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(full_model)))
    assert lean_rec.rounds == full_rec.rounds and lean_rec.after_client == full_rec.after_client
    assert lean_log.rows == full_log.rows and "grad_norm_step" in lean_rec.rounds[-1][0]


@pytest.mark.parametrize("name", ["fedprox", "scaffold"])
def test_fedprox_and_scaffold_take_the_lean_path_bit_for_bit(name):
    from lightning_fed.callbacks import SCAFFOLD, FedProx

    make = {"fedprox": lambda: FedProx(mu=0.5), "scaffold": lambda: SCAFFOLD(lr=1.0)}[name]
    lean_model, full_model = MLP("step+epoch"), MLP("step+epoch")
    lean, lean_rec, lean_log = fit(lean_model, lean=True, callbacks=[make()], rounds=3)
    full, full_rec, full_log = fit(full_model, lean=False, callbacks=[make()], rounds=3)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(full_model)))
    assert lean_rec.rounds == full_rec.rounds and lean_log.rows == full_log.rows
    untouched = MLP("step+epoch")
    fit(untouched, lean=True, rounds=3)  # the correction did act
    assert not all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(untouched)))


def test_gradient_clipping_takes_lightnings_loop_and_clips():
    clipped, plain = MLP(lr=1.0), MLP(lr=1.0)
    trainer, _, _ = fit(clipped, gradient_clip_val=1e-3)
    fit(plain)
    runner = trainer.fit_loop.client_runner
    assert (runner.step_path, runner.lean_step_blocker) == ("lightning", "gradient clipping (gradient_clip_val=0.001)")
    moved = [(a - b).abs().max() for a, b in zip(weights(clipped), weights(MLP(lr=1.0)))]
    assert max(moved) <= 2 * 2 * 3 * 1.0 * 1e-3 + 1e-6  # every step's update is lr * (a gradient of norm <= 1e-3)
    assert not all(torch.equal(a, b) for a, b in zip(weights(clipped), weights(plain)))


def test_mixed_precision_profiler_and_manual_optimization_take_lightnings_loop():
    trainer, _, _ = fit(MLP(), precision="bf16-mixed")
    assert trainer.fit_loop.client_runner.lean_step_blocker == "precision plugin MixedPrecision (not plain 32-true)"
    trainer, _, _ = fit(MLP(), profiler="simple")
    assert trainer.fit_loop.client_runner.lean_step_blocker == "profiler SimpleProfiler"

    class Manual(MLP):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.steps = 0

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            loss = F.cross_entropy(self.net(batch[0]), batch[1])
            self.manual_backward(loss)
            opt.step()
            self.steps += 1
            return loss

    model = Manual()
    trainer, _, _ = fit(model)
    assert trainer.fit_loop.client_runner.lean_step_blocker == "manual optimization"
    assert model.steps == 12


def test_blocker_for_two_optimizers_and_accumulation():
    trainer = FederatedTrainer(logger=False, accelerator="cpu", accumulate_grad_batches=2)
    trainer.strategy.connect(MLP())
    assert lean_step_blocker(trainer, None, []) == "accumulate_grad_batches=2"
    trainer = FederatedTrainer(logger=False, accelerator="cpu")
    trainer.strategy.connect(MLP())
    trainer.strategy.optimizers = [torch.optim.SGD([torch.zeros(1)], lr=1.0), torch.optim.SGD([torch.zeros(1)], lr=1.0)]
    assert lean_step_blocker(trainer, None, []) == "2 optimizers"


class CheckpointSubclass(ModelCheckpoint):
    pass


def test_model_checkpoint_without_step_triggers_keeps_the_lean_path(tmp_path):
    """Lightning's ModelCheckpoint returns from on_train_batch_end at once without step triggers; a subclass
    (whose hook might do anything) takes Lightning's loop. Both save the same per-round checkpoints."""
    saved = []
    for lean, cls in ((True, ModelCheckpoint), (False, CheckpointSubclass)):
        model = MLP()
        checkpoint = cls(dirpath=tmp_path / cls.__name__, save_top_k=-1, monitor="train_loss")
        trainer, _, _ = fit(model, callbacks=[checkpoint], enable_checkpointing=True)
        runner = trainer.fit_loop.client_runner
        expected = ("lean", None) if lean else ("lightning", "callback CheckpointSubclass overrides on_train_batch_end")
        assert (runner.step_path, runner.lean_step_blocker) == expected
        saved.append((sorted(p.name for p in (tmp_path / cls.__name__).iterdir()), float(checkpoint.best_model_score),
                      weights(model)))
    assert saved[0][0] == saved[1][0] and len(saved[0][0]) == 2  # one checkpoint per round
    assert saved[0][1] == saved[1][1]
    assert all(torch.equal(a, b) for a, b in zip(saved[0][2], saved[1][2]))


class BadLog(MLP):
    """Logs correctly at the first step of each client, then ``bad`` from the second step on."""

    def __init__(self, bad):
        super().__init__()
        self.bad = bad

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        if batch_idx == 0:
            self.log("train_loss", loss)
        elif self.bad == "vector":
            self.log("train_loss", torch.stack([loss, loss]))
        elif self.bad == "kwargs":
            self.log("train_loss", loss, on_epoch=True)
        return loss


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("bad, error, match", [
    ("vector", ValueError, "must have a single element"),
    ("kwargs", MisconfigurationException, "twice in `training_step` with different arguments"),
])
def test_bad_log_call_raises_lightnings_error(lean, bad, error, match):
    with pytest.raises(error, match=match):
        fit(BadLog(bad), lean=lean)


def test_integer_values_are_converted_as_lightning_does():
    """An integer value always takes Lightning's own log (which warns once per process and converts it)."""

    class IntLog(MLP):
        def training_step(self, batch, batch_idx):
            self.log("n", torch.tensor(batch[1].shape[0]), on_step=False, on_epoch=True)
            return F.cross_entropy(self.net(batch[0]), batch[1])

    found = []
    for lean in (True, False):
        trainer, _, _ = fit(IntLog(), lean=lean)
        found.append(float(trainer.callback_metrics["n"]))
    assert found[0] == found[1] == pytest.approx((4 * 4 + 4 * 4 + 2 * 2) / 10)  # batch-size weighted: 4, 4, 2


def test_many_local_steps_same_logged_values():
    """10 local steps per client (batch size 1): the fast path's per-client float64 sums equal Lightning's."""
    lean_model, full_model = MLP("step+epoch+twice"), MLP("step+epoch+twice")
    lean, lean_rec, lean_log = fit(lean_model, lean=True, batch_size=1)
    full, full_rec, full_log = fit(full_model, lean=False, batch_size=1)
    assert lean.fit_loop.client_runner.step_path == "lean" and lean.global_step == 40
    assert all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(full_model)))
    assert lean_rec.rounds == full_rec.rounds and lean_rec.after_client == full_rec.after_client
    assert lean_log.rows == full_log.rows


@pytest.mark.parametrize("to_host", [False, True])
def test_add_step_values_equals_one_at_a_time(to_host):
    """In one go (``to_host``: at a client's end, as one copy to the host on an accelerator) or one at a time: the
    same float64 sum, bit for bit."""
    from lightning_fed.round_logging import RoundLogAccumulator

    g = torch.Generator().manual_seed(3)
    values = [torch.randn((), generator=g) * 10.0 ** float(torch.randint(-6, 6, (), generator=g)) for _ in range(500)]
    one, batched = RoundLogAccumulator(), RoundLogAccumulator()
    for start in (one, batched):
        start.start_client({})
    one.add_step_value("k", torch.tensor(0.25))
    batched.add_step_value("k", torch.tensor(0.25))
    for v in values:
        one.add_step_value("k", v)
    batched.add_step_values("k", values[:7], to_host=to_host)
    batched.add_step_values("k", values[7:], to_host=to_host)
    one.finish_client(0, {})
    batched.finish_client(0, {})
    assert one._pending == batched._pending  # the same float64 mean, bit for bit
    assert one._pending[0]["k/step"] == pytest.approx(float((0.25 + torch.stack(values).double().sum()) / 501))
    for dtype in (torch.float32, torch.float64):  # a client's first values in one go, float32 and float64 logs
        one, batched = RoundLogAccumulator(), RoundLogAccumulator()
        for start in (one, batched):
            start.start_client({})
        for v in values:
            one.add_step_value("k", v.to(dtype))
        batched.add_step_values("k", [v.to(dtype) for v in values], to_host=to_host)
        assert float(one._step_sum["k"]) == float(batched._step_sum["k"]) and batched._step_count["k"] == 500


def test_add_step_values_takes_the_floats_the_fast_path_keeps_on_the_cpu():
    """The lean step keeps CPU step values as Python floats (``item()``): the same sum as the tensors'."""
    from lightning_fed.round_logging import RoundLogAccumulator

    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.float64):
        values = list((torch.randn(200, generator=g, dtype=dtype) * 1e3).unbind())
        tensors, floats = RoundLogAccumulator(), RoundLogAccumulator()
        for start in (tensors, floats):
            start.start_client({})
        tensors.add_step_values("k", values[:1])  # one value: added as a tensor
        floats.add_step_values("k", [v.item() for v in values[:1]])
        tensors.add_step_values("k", values[1:])
        floats.add_step_values("k", [v.item() for v in values[1:]])
        assert float(tensors._step_sum["k"]) == float(floats._step_sum["k"]) and floats._step_count["k"] == 200


class ChangesItsLossInPlace(MLP):
    """Logs the loss, then changes the logged tensor in place (Lightning keeps a copy of the logged value)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        logged = loss.detach()
        self.log("train_loss", logged, prog_bar=True, batch_size=y.shape[0])
        logged.mul_(100.0)  # the logged value must stay the one at the call
        self.log("x_sum64", x.double().sum(), on_step=True, on_epoch=True, batch_size=y.shape[0])
        return loss * 1.0


def test_a_logged_tensor_changed_in_place_afterwards_logs_the_value_at_the_call():
    lean_model, full_model = ChangesItsLossInPlace(), ChangesItsLossInPlace()
    lean, lean_rec, lean_log = fit(lean_model, lean=True)
    full, full_rec, full_log = fit(full_model, lean=False)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert lean_rec.rounds == full_rec.rounds and lean_rec.after_client == full_rec.after_client
    assert lean_log.rows == full_log.rows
    assert lean.callback_metrics["train_loss"].dtype == torch.float32  # the forward cache's dtype
    assert lean.callback_metrics["x_sum64"].dtype == full.callback_metrics["x_sum64"].dtype


class WithOptimizer(MLP):
    def __init__(self, make):
        super().__init__("step+epoch")
        self.make = make

    def configure_optimizers(self):
        return self.make(self.parameters())


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=0.01),  # closure run before step(): the same update
    lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=3),  # calls the closure several times: step(closure) kept
], ids=["adam", "lbfgs"])
def test_other_optimizers_bit_for_bit(make):
    lean_model, full_model = WithOptimizer(make), WithOptimizer(make)
    lean, lean_rec, lean_log = fit(lean_model, lean=True)
    full, full_rec, full_log = fit(full_model, lean=False)
    assert lean.fit_loop.client_runner.step_path == "lean"
    assert all(torch.equal(a, b) for a, b in zip(weights(lean_model), weights(full_model)))
    assert lean_rec.rounds == full_rec.rounds and lean_log.rows == full_log.rows


def test_optimizer_step_pre_hook_sees_the_same_gradients():
    """A step pre-hook runs before the closure in step(closure): the lean step keeps that order."""
    seen = {True: [], False: []}
    for lean in (True, False):
        model = MLP()
        trainer_kwargs = {}

        class Hooked(Callback):
            def on_fit_start(self, trainer, pl_module):
                trainer.optimizers[0].register_step_pre_hook(
                    lambda opt, args, kwargs: seen[lean].append(
                        None if opt.param_groups[0]["params"][0].grad is None
                        else opt.param_groups[0]["params"][0].grad.clone()))

        trainer, _, _ = fit(model, lean=lean, callbacks=[Hooked()], **trainer_kwargs)
        assert trainer.fit_loop.client_runner.step_path == ("lean" if lean else "lightning")
    assert len(seen[True]) == len(seen[False]) == 12
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(seen[True], seen[False]))


# ---------------------------------------------------------------- #33.2 host synchronisations per local step
def _syncs(monkeypatch, host_scalars_on_cpu, batch_size):
    """Host syncs of a 2-round fit logging step and epoch values, and its logged rows."""
    import lightning_fed.client.lean_step as lean_step

    monkeypatch.setattr(lean_step, "HOST_SCALARS_ON_CPU", host_scalars_on_cpu)
    counter = HostSyncCounter()
    with counter:
        trainer, recorder, logger = fit(MLP("step+epoch+dict+float64"), batch_size=batch_size)
    assert trainer.fit_loop.client_runner.step_path == "lean"
    return counter.count, trainer.global_step, logger.rows, recorder.rounds


def test_no_host_sync_inside_a_local_step_on_the_device_path(monkeypatch):
    """Issue #33: every copy of a tensor's value to the host inside a local step stalls an accelerator. On the path
    every device but the CPU takes (HOST_SCALARS_ON_CPU off), a run with 3× the local steps makes exactly as many host
    syncs as one with a third of them: none is per step (the remaining ones are per client and per round: the round
    log's per-client means, the server's finiteness check and round metrics). With the CPU default each step keeps
    its logged values as Python floats (`item()`: a copy on the CPU, not a sync), one per logged name and step. The
    logged values are bit for bit the same either way."""
    # every client takes 4 local steps per round, then 10 (clients of 10 samples, batches of 3, then 1)
    few, few_steps, few_rows, few_rounds = _syncs(monkeypatch, False, batch_size=3)
    many, many_steps, many_rows, many_rounds = _syncs(monkeypatch, False, batch_size=1)
    assert many_steps == few_steps * 10 // 4
    assert many == few
    cpu_few, _, cpu_rows, cpu_rounds = _syncs(monkeypatch, True, batch_size=3)
    cpu_many, _, _, _ = _syncs(monkeypatch, True, batch_size=1)
    assert cpu_many - cpu_few > 0  # the CPU default: Python floats per step, by design
    assert (cpu_rows, cpu_rounds) == (few_rows, few_rounds)


def test_no_host_sync_inside_a_local_step_of_the_vectorized_executor():
    """The vectorized executor (the cohort's steps under torch.func.vmap, self.log recorded per client) makes as many
    host syncs for 10 local steps per client as for 4: none per step."""
    counts = []
    for batch_size in (3, 1):
        counter = HostSyncCounter()
        with counter:
            trainer, _, _ = fit(MLP("step+epoch+dict+float64"), batch_size=batch_size, client_executor="vectorized")
        counts.append((counter.count, trainer.global_step))
    (few, few_steps), (many, many_steps) = counts
    assert many_steps == few_steps * 10 // 4 and many == few


def test_a_tuple_of_plain_tensors_moves_as_move_data_to_device_moves_it():
    """The lean step's copy of a tuple batch to another device is ``move_data_to_device``'s (``meta`` stands in for
    CUDA here: a non-blocking device type), and anything else is left to ``move_data_to_device`` itself."""
    meta = torch.device("meta")
    assert "meta" not in pl_private.BLOCKING_DEVICE_TYPES and "cpu" in pl_private.BLOCKING_DEVICE_TYPES
    batch = (torch.randn(4, 3), torch.arange(4), torch.zeros(4, dtype=torch.float64))
    ours, lightnings = _moved(batch, meta, True), move_data_to_device(batch, meta)
    assert type(ours) is tuple and len(ours) == len(lightnings) == 3
    for a, b in zip(ours, lightnings):
        assert (a.device, a.dtype, a.shape) == (b.device, b.dtype, b.shape)
    same = _moved(batch, torch.device("cpu"), False)  # a blocking device: .to(device), here the tensors themselves
    assert all(a is b for a, b in zip(same, batch))

    class Tagged(torch.Tensor):
        pass

    for other in ((torch.zeros(2), 3), (torch.zeros(2).as_subclass(Tagged),), (torch.zeros(2), [torch.zeros(1)])):
        assert _moved(other, meta, True) is None
