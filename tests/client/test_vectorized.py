"""VectorizedExecutor: the same client updates as the sequential executor (and as NumPy), or an exact fallback."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.vectorized import VectorizedExecutor

#: Client sizes: with batch size 4 the clients take 1..5 steps per epoch and most have a short last batch.
SIZES = (3, 7, 12, 5, 20, 9)

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_dampening_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.05),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
    "adam_wd": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, amsgrad=True),
}


class TinyMLP(L.LightningModule):
    """An MLP classifier with an unused parameter (the sequential optimizer never touches it: no gradient)."""

    def __init__(self, make_optimizer=OPTIMIZERS["sgd"], dropout: float = 0.0, batchnorm: bool = False) -> None:
        super().__init__()
        layers = [torch.nn.Linear(5, 8)]
        if batchnorm:
            layers.append(torch.nn.BatchNorm1d(8))
        layers += [torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(8, 3)]
        self.net = torch.nn.Sequential(*layers)
        self.unused = torch.nn.Parameter(torch.ones(3))
        self.make_optimizer = make_optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return self.make_optimizer(self.parameters())


class TinyCNN(L.LightningModule):
    """Conv-ReLU-MaxPool-Linear on 1x8x8 images; training_step returns a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.head = torch.nn.Linear(4 * 3 * 3, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        loss = F.cross_entropy(self.head(h.flatten(1)), y)
        self.log("train_loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Recorder(Callback):
    """Keeps every ClientUpdate (federated hook ``on_client_end``)."""

    def __init__(self) -> None:
        self.updates = []

    def on_client_end(self, trainer, pl_module, update, position):
        self.updates.append(update)


def natural_dataset(image: bool = False, seed: int = 0) -> TensorDataset:
    ids = np.repeat(np.arange(len(SIZES)), SIZES)
    np.random.default_rng(seed).shuffle(ids)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(ids), 1, 8, 8, generator=g) if image else torch.randn(len(ids), 5, generator=g)
    dataset = TensorDataset(x, torch.randint(0, 3, (len(ids),), generator=g))
    dataset.client_id = torch.from_numpy(ids)
    return dataset


def fit(tmp_path, make_module, executor, dataset, callbacks=(), rounds=2, **dm_kwargs):
    torch.manual_seed(0)
    module = make_module()
    recorder = Recorder()
    kwargs = dict(clients_per_round=4, batch_size=4, local_epochs=2, seed=3)
    kwargs.update(dm_kwargs)
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner(), **kwargs)
    trainer = FederatedTrainer(
        max_epochs=rounds, callbacks=[*callbacks, recorder], client_executor=executor, **quiet_trainer_kwargs(tmp_path)
    )
    trainer.fit(module, datamodule=dm)
    weights = torch.cat([p.detach().flatten() for p in module.parameters()])
    return weights, recorder.updates, trainer


def assert_same_updates(seq, vec, atol=1e-5):
    assert [u.client_id for u in seq] == [u.client_id for u in vec]
    assert len({u.num_steps for u in seq}) > 1  # heterogeneous local work
    for a, b in zip(seq, vec):
        for field in ("num_steps", "num_samples", "client_lr", "extras"):
            assert getattr(a, field) == getattr(b, field), field
        assert b.loss == pytest.approx(a.loss, abs=atol)
        for da, db in zip(a.delta, b.delta):
            assert da.shape == db.shape and da.dtype == db.dtype
            torch.testing.assert_close(db, da, atol=atol, rtol=0)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_same_updates_and_weights_as_sequential(tmp_path, name):
    dataset = natural_dataset()
    make = lambda: TinyMLP(OPTIMIZERS[name])  # noqa: E731
    w_seq, u_seq, t_seq = fit(tmp_path, make, None, dataset)
    executor = VectorizedExecutor()
    w_vec, u_vec, t_vec = fit(tmp_path, make, executor, dataset)
    assert executor.fallback_reason is None
    assert_same_updates(u_seq, u_vec)
    torch.testing.assert_close(w_vec, w_seq, atol=1e-5, rtol=0)
    assert t_vec.global_step == t_seq.global_step == sum(u.num_steps for u in u_seq)
    unused = [n for n, _ in TinyMLP().named_parameters()].index("unused")
    for update in u_vec:  # the unused parameter: no gradient, so no weight decay either (as torch.optim skips it)
        assert torch.equal(update.delta[unused], torch.zeros(3))


def test_tiny_cnn_dict_output_and_chunks(tmp_path):
    dataset = natural_dataset(image=True)
    w_seq, u_seq, _ = fit(tmp_path, TinyCNN, None, dataset)
    executor = VectorizedExecutor(max_parallel=3)
    w_vec, u_vec, _ = fit(tmp_path, TinyCNN, executor, dataset)
    assert executor.fallback_reason is None
    assert_same_updates(u_seq, u_vec)
    torch.testing.assert_close(w_vec, w_seq, atol=1e-5, rtol=0)


#: Client-optimizer options that the fits above do not reach (maximize, coupled Adam with AMSGrad, ...), each with
#: two parameter groups of different learning rates.
STEP_OPTIONS = {
    "sgd_maximize_wd": (torch.optim.SGD, dict(lr=0.1, weight_decay=0.05, maximize=True)),
    "sgd_nesterov_wd_maximize": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02,
                                                       maximize=True)),
    "sgd_momentum_dampening": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3)),
    "adam_amsgrad_maximize": (torch.optim.Adam, dict(lr=0.01, betas=(0.7, 0.9), amsgrad=True, weight_decay=0.05,
                                                     maximize=True)),
    "adam_decoupled": (torch.optim.Adam, dict(lr=0.02, eps=1e-3, weight_decay=0.1, decoupled_weight_decay=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}


@pytest.mark.parametrize("name", sorted(STEP_OPTIONS))
def test_stacked_optimizer_step_is_torch_optims_step_row_by_row_bit_for_bit(name):
    """Three clients taking 4, 3 and 1 local steps (a finished client keeps its row): each row of the stacked
    update equals, bit for bit, a fresh ``torch.optim`` optimizer of that class stepped on that client alone."""
    from lightning_fed.client.vectorized import _group_hparams

    kind, options = STEP_OPTIONS[name]
    g = torch.Generator().manual_seed(7)
    shapes = [(5, 7), (13,), (3, 2)]  # odd sizes: vectorized kernels' remainders
    steps = [4, 3, 1]
    x0 = [torch.randn(len(steps), *s, generator=g) for s in shapes]
    grads = [[torch.randn(len(steps), *s, generator=g) for s in shapes] for _ in range(max(steps))]

    def groups(params):
        return [{"params": params[:2]}, {"params": params[2:], "lr": options["lr"] / 2}]

    expected = []
    for row in range(len(steps)):
        params = [torch.nn.Parameter(x[row].clone()) for x in x0]
        optimizer = kind(groups(params), **options)
        for k in range(steps[row]):
            for p, grad in zip(params, grads[k]):
                p.grad = grad[row].clone()
            optimizer.step()
        expected.append([p.detach() for p in params])

    hparams = _group_hparams(kind(groups([torch.nn.Parameter(x[0].clone()) for x in x0]), **options))
    stacked, state = [x.clone() for x in x0], {}
    for k in range(max(steps)):
        active = sum(s > k for s in steps)
        for group, js in ((0, [0, 1]), (1, [2])):
            VectorizedExecutor._optimizer_step(hparams[group], [stacked[j][:active] for j in js],
                                               [grads[k][j][:active] for j in js], state, js, k, active)
    for row, want in enumerate(expected):
        for got, w in zip(stacked, want):
            assert torch.equal(got[row], w), (row, (got[row] - w).abs().max())


class ItemDataset(torch.utils.data.Dataset):
    """A map-style dataset with per-sample ``__getitem__`` only (collated by ``default_collate``)."""

    def __init__(self, tensors: TensorDataset) -> None:
        self.x, self.y = tensors.tensors
        self.client_id = tensors.client_id

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class SlicedDataset(ItemDataset):
    """A dataset with the data module's ``get_batch(index)`` protocol (fetched by slicing)."""

    def get_batch(self, index):
        return {"x": self.x[index], "y": self.y[index]}


class DictMLP(TinyMLP):
    def training_step(self, batch, batch_idx):
        return super().training_step((batch["x"], batch["y"]), batch_idx)


@pytest.mark.parametrize("kind", [ItemDataset, SlicedDataset])
def test_per_sample_and_get_batch_datasets(tmp_path, kind):
    dataset = kind(natural_dataset())
    make = lambda: DictMLP(OPTIMIZERS["sgd_momentum_dampening_wd"])  # noqa: E731
    w_seq, u_seq, _ = fit(tmp_path, make, None, dataset)
    executor = VectorizedExecutor()
    w_vec, u_vec, _ = fit(tmp_path, make, executor, dataset)
    assert executor.fallback_reason is None
    assert_same_updates(u_seq, u_vec)
    torch.testing.assert_close(w_vec, w_seq, atol=1e-5, rtol=0)


class SkipsSecondStep(TinyMLP):
    def training_step(self, batch, batch_idx):
        return None if batch_idx == 1 else super().training_step(batch, batch_idx)


def test_step_without_loss_falls_back_for_the_rest_of_the_fit(tmp_path):
    dataset = natural_dataset()
    w_seq, u_seq, _ = fit(tmp_path, SkipsSecondStep, None, dataset)
    executor = VectorizedExecutor()
    w_vec, u_vec, _ = fit(tmp_path, SkipsSecondStep, executor, dataset)
    assert executor.fallback_reason.startswith("training_step returned NoneType")
    assert torch.equal(w_vec, w_seq)


class BrokenSample(ItemDataset):
    """Sample 0 cannot be read: its client fails, every round it is sampled."""

    def __getitem__(self, i):
        if i == 0:
            raise OSError("unreadable sample 0")
        return super().__getitem__(i)


def test_failing_client_is_isolated_by_a_sequential_retry(tmp_path):
    dataset = BrokenSample(natural_dataset())
    make = lambda: DictMLP(OPTIMIZERS["sgd"])  # noqa: E731
    with pytest.warns(UserWarning, match="unreadable sample 0"):
        w_seq, u_seq, _ = fit(tmp_path, make, None, dataset, clients_per_round=5)
    executor = VectorizedExecutor()
    with pytest.warns(UserWarning, match="unreadable sample 0"):
        w_vec, u_vec, _ = fit(tmp_path, make, executor, dataset, clients_per_round=5)
    assert executor.fallback_reason == "round 1 failed under vmap (OSError)"  # the probe (clients 2, 3) passed
    failing = int(dataset.client_id[0])
    assert failing not in {u.client_id for u in u_seq}
    assert [u.client_id for u in u_vec] == [u.client_id for u in u_seq]
    assert torch.equal(w_vec, w_seq)


def _adam_numpy(w, x, y, batches, steps_lr=0.05, b1=0.9, b2=0.99, eps=1e-8, wd=0.1):
    """torch.optim.Adam (coupled weight decay, bias-corrected) on mean squared error, in NumPy."""
    m, v = np.zeros_like(w), np.zeros_like(w)
    for k, idx in enumerate(batches, start=1):
        xb = np.hstack([x[idx], np.ones((len(idx), 1))])
        g = 2.0 / len(idx) * xb.T @ (xb @ w - y[idx]) + wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - steps_lr / (1 - b1**k) * m / (np.sqrt(v) / np.sqrt(1 - b2**k) + eps)
    return w


def test_adam_matches_numpy_fedavg(tmp_path):
    """Three clients with 3, 7 and 12 samples, batches of 5 in dataset order, 2 local epochs (2, 4 and 6 Adam
    steps, batch sizes 3 / 5+2 / 5+5+2), FedAvg weighted by size — computed independently in NumPy."""
    sizes = (3, 7, 12)
    ids = np.repeat(np.arange(3), sizes)
    rng = np.random.default_rng(5)
    rng.shuffle(ids)
    x = rng.normal(size=(len(ids), 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids

    class AdamRegression(LinearRegression):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.05, betas=(0.9, 0.99), weight_decay=0.1)

    torch.manual_seed(0)
    model = AdamRegression()
    w = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner(), clients_per_round=3, batch_size=5,
                             local_epochs=2, data_order="none")
    executor = VectorizedExecutor()
    FederatedTrainer(max_epochs=2, client_executor=executor, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    assert executor.fallback_reason is None
    for _ in range(2):
        deltas = []
        for c in range(3):
            idx = np.flatnonzero(ids == c)
            batches = [idx[i : i + 5] for i in range(0, len(idx), 5)] * 2
            deltas.append(_adam_numpy(w, x, y, batches) - w)
        w = w + np.average(deltas, axis=0, weights=sizes)
    got = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    np.testing.assert_allclose(got, w, atol=1e-10)


def test_batchnorm_falls_back_to_the_exact_sequential_result(tmp_path, caplog):
    dataset = natural_dataset()
    make = lambda: TinyMLP(OPTIMIZERS["sgd_nesterov"], batchnorm=True)  # noqa: E731
    w_seq, u_seq, _ = fit(tmp_path, make, None, dataset, batch_size=5)  # no batch of one sample: BatchNorm needs 2
    executor = VectorizedExecutor()
    with caplog.at_level(logging.WARNING, logger="lightning_fed.vectorized"):
        w_vec, u_vec, _ = fit(tmp_path, make, executor, dataset, batch_size=5)
    assert "BatchNorm1d" in executor.fallback_reason
    assert sum("BatchNorm1d" in r.getMessage() for r in caplog.records) == 1  # logged once, not every round
    assert torch.equal(w_vec, w_seq)
    for a, b in zip(u_seq, u_vec):
        assert all(torch.equal(x, y) for x, y in zip(a.buffers, b.buffers))


def test_dropout_falls_back_unless_randomness_different(tmp_path):
    dataset = natural_dataset()
    make = lambda: TinyMLP(dropout=0.5)  # noqa: E731
    w_seq, _, _ = fit(tmp_path, make, None, dataset)
    executor = VectorizedExecutor()
    w_vec, _, _ = fit(tmp_path, make, executor, dataset)
    assert "random" in executor.fallback_reason
    assert torch.equal(w_vec, w_seq)
    different = VectorizedExecutor(randomness="different")
    w_a, _, _ = fit(tmp_path, make, different, dataset)
    assert different.fallback_reason is None
    w_b, _, _ = fit(tmp_path, make, VectorizedExecutor(randomness="different"), dataset)
    assert torch.equal(w_a, w_b)  # seeded per round: repeatable
    assert not torch.allclose(w_a, w_seq)  # but other dropout masks than the sequential run's


class ExtrasFedAvg(FedAvg):
    """A server optimizer with a client channel: asks each client for its final first-layer bias."""

    def collect_client_extras(self, trainer, pl_module, client_id, round_idx, context=None):
        return {"bias": pl_module.net[0].bias.detach().clone()}


class StepCounter(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.calls += 1


@pytest.mark.parametrize(
    "case, reason", [("extras", "collect_client_extras"), ("step_hook", "on_before_optimizer_step")]
)
def test_client_algorithms_and_step_hooks_fall_back(tmp_path, case, reason):
    dataset = natural_dataset()
    make_callbacks = ExtrasFedAvg if case == "extras" else StepCounter
    callbacks_seq, callbacks_vec = [make_callbacks()], [make_callbacks()]
    executor = VectorizedExecutor()
    w_seq, u_seq, _ = fit(tmp_path, TinyMLP, None, dataset, callbacks=callbacks_seq)
    w_vec, u_vec, _ = fit(tmp_path, TinyMLP, executor, dataset, callbacks=callbacks_vec)
    assert reason in executor.fallback_reason
    assert torch.equal(w_vec, w_seq)
    if case == "extras":
        assert all(torch.equal(a.extras["bias"], b.extras["bias"]) for a, b in zip(u_seq, u_vec))
    else:
        assert callbacks_vec[0].calls == callbacks_seq[0].calls == sum(u.num_steps for u in u_seq)


def test_gradient_clipping_falls_back(tmp_path):
    torch.manual_seed(0)
    dm = FederatedDataModule(natural_dataset(), partitioner=NaturalIdPartitioner(), clients_per_round=2, batch_size=4)
    executor = VectorizedExecutor()
    trainer = FederatedTrainer(max_epochs=1, gradient_clip_val=0.5, client_executor=executor,
                               **quiet_trainer_kwargs(tmp_path))
    trainer.fit(TinyMLP(), datamodule=dm)
    assert executor.fallback_reason == "gradient clipping (gradient_clip_val=0.5)"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"randomness": "same"}, r"`randomness` must be one of \('error', 'different'\), got 'same'"),
        ({"max_parallel": 0}, r"`max_parallel` must be an integer >= 1 or None, got 0"),
        ({"max_parallel": 2.5}, r"`max_parallel` must be an integer >= 1 or None, got 2.5"),
        ({"max_parallel": True}, r"`max_parallel` must be an integer >= 1 or None, got True"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VectorizedExecutor(**kwargs)


class ManyLogs(TinyMLP):
    """Logs at every step: the loss (step and epoch), a value with its own batch size, a Python float and a
    log_dict (epoch only), and every 2nd step a value with max reduction, which cannot be recorded per client."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("x_mean", x.mean(), batch_size=2 * y.shape[0])
        self.log("const", 0.5, on_step=False, on_epoch=True)
        self.log_dict({"x_max": x.abs().max(), "y_mean": y.float().mean()}, on_step=False, on_epoch=True)
        if batch_idx % 2 == 0:
            self.log("loss_max", loss, reduce_fx="max")
        return loss


def _metric_rows(trainer):
    import csv

    path = Path(trainer.logger.log_dir) / "metrics.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return {(r["epoch"], k): float(v) for r in rows for k, v in r.items() if v and k not in ("epoch", "step")}


@pytest.mark.parametrize("max_parallel", [None, 3])
def test_values_logged_in_a_vmapped_training_step_equal_the_sequential_executors(tmp_path, max_parallel):
    """self.log / self.log_dict inside the vmapped training_step: each value reaches the round's log, the
    callback metrics and the logger as through the sequential executor (client-weighted means of the clients'
    step means / batch-size-weighted epoch means; sums in float64 instead of Lightning's float32, so equal to
    ~1e-6). Clients with a short last batch run in their own vmapped call (their batch size counts)."""
    from lightning.pytorch.loggers import CSVLogger

    def run(executor, folder):
        kwargs = quiet_trainer_kwargs(tmp_path / folder)
        kwargs["logger"] = CSVLogger(tmp_path / folder, name="logs")
        torch.manual_seed(0)
        dm = FederatedDataModule(natural_dataset(), partitioner=NaturalIdPartitioner(), clients_per_round=4,
                                 batch_size=4, local_epochs=2, seed=3)
        trainer = FederatedTrainer(max_epochs=3, client_executor=executor, **kwargs)
        with pytest.warns(UserWarning) as record:
            trainer.fit(ManyLogs(), datamodule=dm)
        return trainer, [str(w.message) for w in record if "not recorded" in str(w.message)]

    seq, seq_warnings = run(None, "seq")
    executor = VectorizedExecutor(max_parallel=max_parallel)  # 3: the cohort of 4 in chunks of 3 and 1
    vec, vec_warnings = run(executor, "vec")
    assert executor.fallback_reason is None and seq_warnings == []
    assert len(vec_warnings) == 1 and "(['loss_max'])" in vec_warnings[0]  # named once per fit, not per round
    names = {"train_loss", "train_loss_step", "train_loss_epoch", "x_mean", "const", "x_max", "y_mean"}
    assert names <= set(vec.callback_metrics)
    for name in names | {"round_train_loss"}:
        assert float(vec.callback_metrics[name]) == pytest.approx(float(seq.callback_metrics[name]), rel=1e-6)
    seq_rows, vec_rows = _metric_rows(seq), _metric_rows(vec)
    assert {k for k in vec_rows if k[1] != "loss_max"} == {k for k in seq_rows if k[1] != "loss_max"}
    for key, value in seq_rows.items():
        if key[1] not in ("loss_max", "round_time_s"):
            assert vec_rows[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    assert vec_rows[("0", "const")] == 0.5


def test_logging_a_name_with_other_arguments_fails_the_clients_as_lightning_does(tmp_path):
    class Changes(TinyMLP):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("v", loss, prog_bar=batch_idx == 0)
            return loss

    match = r"Client \d+ failed in round 0: MisconfigurationException: You called `self.log\(v, ...\)` twice in `training_step`"
    # every client fails the same way, as in sequential training: the run stops at round 0 with that error (#43.1)
    stop = r"Round 0: all \d+ clients failed with the same error, MisconfigurationException: You called `self.log"
    for executor in (None, VectorizedExecutor()):
        with pytest.warns(UserWarning, match=match), pytest.raises(RuntimeError, match=stop) as info:
            fit(tmp_path, Changes, executor, natural_dataset(), rounds=2)
        assert "MisconfigurationException" in type(info.value.__cause__).__name__


def test_a_logged_names_metadata_is_the_sequential_executors(tmp_path):
    """The name registered after a vectorized round carries the arguments it was logged with (enable_graph,
    prog_bar, on_epoch, ...) in Lightning's metadata, as the sequential executor's calls register it."""
    from lightning_fed import _lightning as pl_private

    class GraphLog(TinyMLP):
        def training_step(self, batch, batch_idx):
            loss = F.cross_entropy(self.net(batch[0]), batch[1])
            self.log("g", loss, enable_graph=True, prog_bar=True, on_epoch=True)
            return loss

    class Meta(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            metas.append(pl_private.results(trainer)["training_step.g"].meta)

    metas = []
    for executor in (None, VectorizedExecutor()):
        fit(tmp_path, GraphLog, executor, natural_dataset(), callbacks=[Meta()], rounds=1)
    from helpers import metadata

    assert metas[1].enable_graph and metas[1].prog_bar and metas[1].on_epoch
    assert metadata(metas[1]) == metadata(metas[0])


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_a_frozen_encoder_is_shared_by_the_cohort_and_only_the_trained_parameters_are_stacked(tmp_path):
    from helpers import fit_frozen_pair, same_head

    executor = VectorizedExecutor(on_unsupported="raise")
    frozen, head_only, trainer, _ = fit_frozen_pair(tmp_path, FedAvg, executor=executor)
    encoder = frozen.encoder.weight
    assert same_head(frozen, head_only)  # vectorized, number for number the model of the trained layers alone
    assert executor.fallback_reason is None
    assert trainer.fit_loop.client_runner.param_names == ["head.weight", "head.bias"]
    sequential, _, _, _ = fit_frozen_pair(tmp_path / "seq", FedAvg)
    torch.testing.assert_close(frozen.head.weight, sequential.head.weight, atol=1e-12, rtol=0)
    assert frozen.encoder.weight is encoder and torch.equal(encoder, sequential.encoder.weight)
