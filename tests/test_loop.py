"""The federated loop end to end, with expected weights computed independently in NumPy."""

from __future__ import annotations

import csv
from typing import NamedTuple

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset

from helpers import (
    CHECKPOINT_DIR_REUSED, NO_VAL_DATALOADER, PLAIN_TRAINER_EMPTY_VAL, LinearRegression, SmallClassifier,
    classification_dataset, metadata, quiet_trainer_kwargs, regression_data)
from lightning_fed import FederatedFitLoop, FederatedTrainer
from lightning_fed.callbacks import FedAdam, FedAvg, FedYogi
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, IIDPartitioner
from lightning_fed.server.rules import Rule


def _linear_weights(model: LinearRegression) -> np.ndarray:
    return np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])


def _mse_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇ of mean((x·w[:-1] + w[-1] − y)²) with respect to w."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    return 2.0 / len(x) * xb.T @ (xb @ w - y)


def _regression_module(x, y, num_clients, **kwargs):
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    return FederatedDataModule(
        dataset, partitioner=IIDPartitioner(num_clients=num_clients, seed=0), **kwargs
    )


def test_one_client_one_full_batch_step_is_one_sgd_step(tmp_path):
    x, y = regression_data(n=40)
    model = LinearRegression(lr=0.1)
    w0 = _linear_weights(model)
    dm = _regression_module(x, y, num_clients=1, clients_per_round=1, batch_size=40, local_epochs=1)
    FederatedTrainer(max_epochs=1, callbacks=[FedAvg(lr=1.0)], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    np.testing.assert_allclose(_linear_weights(model), w0 - 0.1 * _mse_grad(w0, x, y), atol=1e-12)


def test_all_clients_equal_sizes_full_batch_is_gradient_descent(tmp_path):
    x, y = regression_data(n=40)
    model = LinearRegression(lr=0.05)
    w = _linear_weights(model)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=4, batch_size=10, local_epochs=1)
    FederatedTrainer(max_epochs=3, callbacks=[FedAvg()], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    for _ in range(3):  # the mean of the 4 equal-size clients' gradients is the full-batch gradient
        w = w - 0.05 * _mse_grad(w, x, y)
    np.testing.assert_allclose(_linear_weights(model), w, atol=1e-12)


def test_fedadam_on_real_client_deltas_matches_numpy(tmp_path):
    """Two local full-batch steps per client, weighted by size, then FedAdam (Alg. 2) — all in NumPy."""
    x, y = regression_data(n=30, seed=1)
    model = LinearRegression(lr=0.1)
    w = _linear_weights(model)
    dm = _regression_module(x, y, num_clients=3, clients_per_round=3, batch_size=100, local_epochs=2)
    dm.setup()
    parts = [dm.client_indices(c) for c in range(3)]
    FederatedTrainer(max_epochs=2, callbacks=[FedAdam(lr=0.05, tau=1e-2)], **quiet_trainer_kwargs(tmp_path)).fit(
        model, datamodule=dm
    )
    m, v = np.zeros_like(w), np.full_like(w, 1e-4)
    sizes = np.array([len(p) for p in parts], dtype=float)
    for _ in range(2):
        deltas = []
        for idx in parts:
            wi = w.copy()
            for _ in range(2):
                wi = wi - 0.1 * _mse_grad(wi, x[idx], y[idx])
            deltas.append(wi - w)
        delta = (sizes[:, None] * np.array(deltas)).sum(0) / sizes.sum()
        m = 0.9 * m + 0.1 * delta
        v = 0.99 * v + 0.01 * delta**2
        w = w + 0.05 * m / (np.sqrt(v) + 1e-2)
    np.testing.assert_allclose(_linear_weights(model), w, atol=1e-10)


def test_round_indexed_client_lr_schedule(tmp_path):
    """An ordinary StepLR (interval='epoch') decays the client learning rate per round."""

    class Decayed(LinearRegression):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=self.lr)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)}

    x, y = regression_data(n=20)
    model = Decayed(lr=0.1)
    w = _linear_weights(model)
    dm = _regression_module(x, y, num_clients=1, clients_per_round=1, batch_size=20)
    FederatedTrainer(max_epochs=5, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    for t in range(5):
        w = w - 0.1 * 0.1 ** (t // 2) * _mse_grad(w, x, y)
    np.testing.assert_allclose(_linear_weights(model), w, atol=1e-12)


def test_buffers_are_weighted_averages_not_server_optimized(tmp_path):
    class WithBatchNorm(LinearRegression):
        def __init__(self):
            super().__init__(lr=0.1)
            self.bn = torch.nn.BatchNorm1d(3, dtype=torch.float64)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.linear(self.bn(x)).squeeze(-1), y)

    x, y = regression_data(n=30, seed=2)
    model = WithBatchNorm()
    dm = _regression_module(x, y, num_clients=3, clients_per_round=3, batch_size=100, drop_last=False)
    dm.setup()
    parts = [dm.client_indices(c) for c in range(3)]
    # Yogi with a large lr would wreck buffers if they went through it.
    FederatedTrainer(max_epochs=1, callbacks=[FedYogi(lr=10.0)], **quiet_trainer_kwargs(tmp_path)).fit(
        model, datamodule=dm
    )
    sizes = np.array([len(p) for p in parts], dtype=float)
    client_means = np.array([0.1 * x[p].mean(0) for p in parts])  # momentum 0.1 from running_mean = 0
    client_vars = np.array([0.9 + 0.1 * x[p].var(0, ddof=1) for p in parts])
    np.testing.assert_allclose(model.bn.running_mean.numpy(), sizes @ client_means / sizes.sum(), atol=1e-12)
    np.testing.assert_allclose(model.bn.running_var.numpy(), sizes @ client_vars / sizes.sum(), atol=1e-12)
    assert int(model.bn.num_batches_tracked) == 1


def test_plain_module_trains_and_validation_loss_falls(tmp_path):
    data, val = classification_dataset(n=800, n_val=200)
    dm = FederatedDataModule(
        data, val_dataset=val,
        partitioner=DirichletPartitioner(num_clients=20, alpha=0.5, seed=0), clients_per_round=5, batch_size=10,
    )
    logger = CSVLogger(str(tmp_path), name="run")
    kwargs = quiet_trainer_kwargs(tmp_path) | {"logger": logger}
    trainer = FederatedTrainer(max_epochs=8, callbacks=[FedAdam(lr=0.03)], **kwargs)
    trainer.fit(SmallClassifier(), datamodule=dm)
    rows = list(csv.DictReader(open(f"{logger.log_dir}/metrics.csv")))
    val_losses = {int(r["step"]): float(r["val_loss"]) for r in rows if r.get("val_loss")}
    assert sorted(val_losses) == list(range(8)), "validation every round, logged at step = round"
    assert val_losses[7] < 0.8 * val_losses[0]
    round_rows = {int(r["step"]): r for r in rows if r.get("round_train_loss")}
    assert sorted(round_rows) == list(range(8))
    assert all(float(r["round_time_s"]) > 0 and float(r["round_pseudo_grad_norm"]) > 0 for r in round_rows.values())
    assert all(float(r["round_local_steps"]) > 0 for r in round_rows.values())


def _resume_setup(tmp_path, max_epochs, ckpt_dir, ckpt_path=None):
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.3)
    dm = FederatedDataModule(
        *classification_dataset(n=300, n_val=60),
        partitioner=DirichletPartitioner(num_clients=10, alpha=1.0, seed=0), clients_per_round=3, batch_size=8,
    )
    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True}
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=[FedYogi(lr=0.05), checkpoint], **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, trainer


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_interrupt_and_resume_equals_uninterrupted(tmp_path):
    full, _ = _resume_setup(tmp_path / "a", 5, tmp_path / "ckpt_a")
    _resume_setup(tmp_path / "b", 2, tmp_path / "ckpt_b")
    resumed, trainer = _resume_setup(tmp_path / "b", 5, tmp_path / "ckpt_b", ckpt_path=str(tmp_path / "ckpt_b" / "last.ckpt"))
    assert trainer.current_epoch == 5
    assert trainer.server_optimizer.num_steps == 5
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_runs_repeat_exactly(tmp_path):
    a, _ = _resume_setup(tmp_path / "a", 2, tmp_path / "ca")
    b, _ = _resume_setup(tmp_path / "b", 2, tmp_path / "cb")
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_default_server_optimizer_is_fedavg_and_two_is_an_error(tmp_path):
    assert isinstance(FederatedTrainer(**quiet_trainer_kwargs(tmp_path)).server_optimizer, FedAvg)
    with pytest.raises(ValueError, match="exactly one server optimizer.*FedAvg, FedAdam"):
        FederatedTrainer(callbacks=[FedAvg(), FedAdam()], **quiet_trainer_kwargs(tmp_path))


def test_loop_without_server_optimizer_is_an_error(tmp_path):
    x, y = regression_data()
    trainer = L.Trainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    loop = FederatedFitLoop(trainer, max_epochs=1)
    loop.epoch_loop = trainer.fit_loop.epoch_loop
    trainer.fit_loop = loop
    with pytest.raises(ValueError, match="exactly one server optimizer.*got 0"):
        trainer.fit(LinearRegression(), datamodule=_regression_module(x, y, num_clients=2, clients_per_round=1))


def test_cohort_larger_than_population_is_an_error(tmp_path):
    x, y = regression_data()
    dm = _regression_module(x, y, num_clients=4, clients_per_round=5)
    with pytest.raises(ValueError, match=r"`clients_per_round` \(5\) must not exceed the number of clients \(4\)"):
        FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=dm)


@pytest.mark.filterwarnings(NO_VAL_DATALOADER)
def test_plain_datamodule_is_an_error(tmp_path):
    x, y = regression_data()

    class Plain(L.LightningDataModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)))

    with pytest.raises(TypeError, match="FederatedDataModule"):
        FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=Plain())


def test_step_interval_scheduler_is_an_error(tmp_path):
    class StepSched(LinearRegression):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=self.lr)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    x, y = regression_data()
    with pytest.raises(ValueError, match="interval='epoch'"):
        FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(
            StepSched(), datamodule=_regression_module(x, y, num_clients=2, clients_per_round=1)
        )


@pytest.mark.filterwarnings(PLAIN_TRAINER_EMPTY_VAL)
def test_plain_trainer_trains_centrally_on_the_same_datamodule(tmp_path):
    """Without the federated loop the data module is an ordinary one (a centralized baseline)."""
    x, y = regression_data(n=40)
    model = LinearRegression(lr=0.1)
    w0 = _linear_weights(model)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=2, batch_size=40)
    L.Trainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    np.testing.assert_allclose(_linear_weights(model), w0 - 0.1 * _mse_grad(w0, x, y), atol=1e-12)


class _LogsAtRoundEnd(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        pl_module.log("extra_metric", 1.0, on_step=False, on_epoch=True, batch_size=1)


def test_round_metrics_survive_a_callback_logging_at_round_end(tmp_path):
    """Regression: a callback logging in on_train_epoch_end (FedAWARE, AdaptiveServerStepSize) used to make Lightning
    reset the round metrics logged before validation, so they never reached the loggers."""
    train, val = classification_dataset(n=120, n_val=30)
    dm = FederatedDataModule(train, val_dataset=val, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2,
                             batch_size=20)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedAvg(), _LogsAtRoundEnd()], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(SmallClassifier(), datamodule=dm)
    logged = trainer.logged_metrics
    assert logged["extra_metric"] == 1.0 and "val_loss" in logged
    assert logged["round_clients"] == 2 and logged["round_local_steps"] == 2 * 2  # 30 samples, batch 20: 2 steps


class _RoundEndRecorder(L.Callback):
    """Each round's callback and progress-bar metrics, without the wall time (the one value two runs differ in)."""

    def __init__(self):
        self.rounds = []

    def on_train_epoch_end(self, trainer, pl_module):
        drop = {"round_time_s"}
        results = trainer._results  # Lightning's result metrics of the round-end hook (a test may look inside)
        self.rounds.append((
            {k: float(v) for k, v in trainer.callback_metrics.items() if k not in drop},
            {k: float(v) for k, v in trainer.progress_bar_metrics.items() if k not in drop},
            {k: (float(m.value), float(m.cumulated_batch_size), m.value.dtype, m.has_reset, metadata(m.meta))
             for k, m in results.items() if k.startswith("on_train_epoch_end.") and not k.endswith("round_time_s")},
        ))


@pytest.mark.parametrize("val_every", [1, 2])
def test_round_metrics_added_directly_equal_lightnings_log(tmp_path, val_every):
    """The loop adds round metrics registered in an earlier round to Lightning's result metric directly: the same
    callback, progress-bar and logger values every round as through LightningModule.log, with validation in between
    or not and a callback logging at the round's end."""
    train, val = classification_dataset(n=120, n_val=30)
    runs = {}
    for fast in (True, False):
        dm = FederatedDataModule(train, val_dataset=val, partitioner=IIDPartitioner(num_clients=4),
                                 clients_per_round=2, batch_size=20)
        recorder = _RoundEndRecorder()
        kwargs = {**quiet_trainer_kwargs(tmp_path / str(fast)), "logger": CSVLogger(tmp_path / str(fast))}
        trainer = FederatedTrainer(max_epochs=4, check_val_every_n_epoch=val_every,
                                   callbacks=[FedAvg(), _LogsAtRoundEnd(), recorder], **kwargs)
        trainer.fit_loop.fast_round_logging = fast
        torch.manual_seed(0)
        trainer.fit(SmallClassifier(), datamodule=dm)
        with open(next((tmp_path / str(fast)).rglob("metrics.csv"))) as f:
            rows = [{k: v for k, v in r.items() if k != "round_time_s"} for r in csv.DictReader(f)]
        runs[fast] = (recorder.rounds, rows)
    assert runs[True] == runs[False]
    rounds, rows = runs[True]
    assert len(rounds) == 4 and all("round_train_loss" in callback for callback, _, _ in rounds)
    assert all(len(results) == 8 for _, _, results in rounds)  # 7 round metrics and the callback's
    assert sum(1 for r in rows if r["round_clients"]) == 4


def test_round_metric_fast_path_adds_as_log_and_declines_what_it_cannot_do(tmp_path):
    """lightning_fed._lightning.log_epoch_mean_again on a real trainer after fit: it adds a number to an existing
    round metric (value + v, count + 1) and does nothing for another name, other arguments or another hook."""
    from lightning_fed import _lightning

    checked = []

    class Check(L.Callback):
        def on_train_epoch_end(self, trainer, module):  # after the loop logged this round's metrics
            metric = trainer._results["on_train_epoch_end.round_clients"]
            before, count = float(metric.value), float(metric.cumulated_batch_size)
            with _lightning.hook_name(module, "on_train_epoch_end"):
                assert _lightning.log_epoch_mean_again(module, "round_clients", 3.0, prog_bar=False)
                assert float(metric.value) == before + 3.0 and float(metric.cumulated_batch_size) == count + 1
                assert metric.value.dtype == torch.float32 and not metric.has_reset
                assert not _lightning.log_epoch_mean_again(module, "not_logged_before", 1.0, prog_bar=False)
                assert not _lightning.log_epoch_mean_again(module, "round_clients", 1.0, prog_bar=True)  # other args
                assert float(metric.value) == before + 3.0
                metric.value, metric.cumulated_batch_size = metric.value - 3.0, metric.cumulated_batch_size - 1
            checked.append(True)

    train = classification_dataset(n=80)
    dm = FederatedDataModule(train, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2, batch_size=20)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedAvg(), Check()], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(SmallClassifier(), datamodule=dm)
    assert checked == [True]


def test_round_metric_fast_path_does_what_log_does_at_a_hooks_first_value(tmp_path):
    """Issue #51: the first round metric of a round (the logger connector's current hook is another one) takes the fast
    path too, doing what LightningModule.log does there: the hook's tensor metrics reset, then the value added, then
    the hook made the connector's current one. Compared with Lightning's own log from the same state; under
    Trainer(barebones=True) (where log logs nothing) it declines."""
    from lightning_fed import _lightning

    outcomes = []

    def state(trainer):
        return {k: (float(m.value), float(m.cumulated_batch_size), m.has_reset, m._update_count, m._computed is None)
                for k, m in trainer._results.items() if k.startswith("on_train_epoch_end.")}

    class Compare(L.Callback):
        def on_train_epoch_end(self, trainer, module):  # after the loop logged this round's metrics
            metrics = {k: m for k, m in trainer._results.items() if k.startswith("on_train_epoch_end.")}
            saved = {k: (m.value, m.cumulated_batch_size, m.has_reset, m._update_count, m._computed)
                     for k, m in metrics.items()}
            connector = trainer._logger_connector
            after = []
            for fast in (True, False):
                for k, m in metrics.items():
                    m.value, m.cumulated_batch_size, m.has_reset, m._update_count, m._computed = saved[k]
                connector._current_fx = "validation_step"  # as after validation, or the round's training steps
                with _lightning.hook_name(module, "on_train_epoch_end"):
                    if fast:
                        assert _lightning.log_epoch_mean_again(module, "round_clients", 3.0, prog_bar=False)
                    else:
                        module.log("round_clients", 3.0, on_step=False, on_epoch=True, batch_size=1)
                after.append((state(trainer), connector._current_fx))
            trainer.barebones = True  # (Trainer(barebones=True): log returns without logging)
            with _lightning.hook_name(module, "on_train_epoch_end"):
                after.append(_lightning.log_epoch_mean_again(module, "round_clients", 3.0, prog_bar=False))
            trainer.barebones = False
            outcomes.append(after)
            for k, m in metrics.items():
                m.value, m.cumulated_batch_size, m.has_reset, m._update_count, m._computed = saved[k]

    train = classification_dataset(n=80)
    dm = FederatedDataModule(train, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2, batch_size=20)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedAvg(), Compare()], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(SmallClassifier(), datamodule=dm)
    (fast, lightning, barebones), = outcomes
    assert fast == lightning and fast[1] == "on_train_epoch_end" and barebones is False
    reset = fast[0]  # every round metric reset (0, 0), round_clients then holds the one value 3
    assert reset.pop("on_train_epoch_end.round_clients")[:3] == (3.0, 1.0, False)
    assert reset and all(v[:3] == (0.0, 0.0, True) for v in reset.values())


def test_the_rounds_finiteness_check_reads_the_host_once_whatever_the_cohort():
    """Issue #33: which updates are finite is read on the host in one copy a round (on a GPU one sync, not one per
    client), with the same verdicts: a NaN or inf in a delta or a floating buffer makes an update non-finite; integer
    buffers and updates without tensors are not checked."""
    from lightning_fed.client import ClientUpdate
    from lightning_fed.client.host_sync import HostSyncCounter
    from lightning_fed.loop import FederatedFitLoop

    def update(cid, delta, buffers=()):
        return ClientUpdate(client_id=cid, delta=delta, num_samples=1, num_steps=1, loss=0.0, buffers=list(buffers))

    ok = [torch.ones(3), torch.zeros(2, 2)]
    updates = [
        update(0, ok),
        update(1, [torch.ones(3), torch.tensor([[1.0, float("nan")], [0.0, 0.0]])]),
        update(2, ok, [torch.tensor([float("inf")])]),
        update(3, ok, [torch.tensor([7])]),  # an integer buffer (e.g. num_batches_tracked): not checked
        update(4, []),
        update(5, [torch.ones(2, dtype=torch.float64) * float("-inf")]),
    ]
    counts = []
    for cohort in (updates[:1], updates):
        with HostSyncCounter() as counter:
            FederatedFitLoop._finite_updates(cohort)
        counts.append(counter.count)
    # one bool() per client counted 1 and 6 here; `tolist()` reads the stacked flags in one copy (on a GPU the one
    # sync of the round; on the CPU not an aten op the counter sees)
    assert counts[0] == counts[1] <= 1
    assert FederatedFitLoop._finite_updates(updates) == [True, False, False, True, True, False]
    assert FederatedFitLoop._finite_updates([]) == []


# ------------------------------------------------------------------ #43.6 a run without updates says why
def test_a_run_whose_poisson_cohorts_were_all_empty_says_no_client_was_sampled(tmp_path):
    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(20),
                             clients_per_round=1, batch_size=2, cohort_sampling="poisson", seed=0)
    dm.setup()
    rounds = next(r for r in range(1, 20) if any(len(dm.sample_clients(t)) for t in range(r + 1)))
    assert all(len(dm.sample_clients(t)) == 0 for t in range(rounds))  # the first `rounds` cohorts are empty
    trainer = FederatedTrainer(max_epochs=rounds, **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match=r"Round 0: no client reported back \(no client was sampled\)"), \
            pytest.raises(RuntimeError, match=rf"No client was sampled in any of the {rounds} round\(s\) of this run "
                                              r"\(cohort_sampling='poisson' draws each of the num_clients=20 clients "
                                              r"with probability q = clients_per_round/num_clients = 1/20 = 0.05 per "
                                              r"round\).*larger sampling rate \(clients_per_round\) or more rounds") as info:
        trainer.fit(LinearRegression(), datamodule=dm)
    assert "failed" not in str(info.value)


def test_a_run_without_updates_counts_empty_cohorts_apart_from_failed_clients(tmp_path):
    class NaNs(LinearRegression):  # every update non-finite: dropped, not a raised error
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * float("nan")

    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(20),
                             clients_per_round=1, batch_size=2, cohort_sampling="poisson", seed=3)
    dm.setup()
    sizes = [len(dm.sample_clients(t)) for t in range(8)]
    empty, nonempty = sizes.count(0), 8 - sizes.count(0)
    assert empty and nonempty
    trainer = FederatedTrainer(max_epochs=8, **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match=r"no client reported back \(all \d+ sampled clients failed or were dropped\)"), \
            pytest.raises(RuntimeError, match=rf"No client reported back in any of the 8 round\(s\) of this run \({empty} "
                                              rf"round\(s\): no client was sampled \(an empty cohort: cohort_sampling="
                                              rf"'poisson'.*\); {nonempty} round\(s\): every sampled client failed or "
                                              r"was dropped"):
        trainer.fit(NaNs(), datamodule=dm)


# ---------------------------------------------------------------------------------------------- #43 server steps
class _DirectionState(NamedTuple):
    direction: list


class _NormalizedStep(Rule):
    """A server rule of one's own (the public Rule API): x ← x + η·Δ/‖Δ‖, keeping the last direction as its state.
    A round whose pseudo-gradient is zero divides 0 by 0: NaN in the model and in the state."""

    State = _DirectionState

    def __init__(self, lr=0.1):
        self.lr = lr

    def init(self, params):
        return self.State([torch.zeros_like(p) for p in params])

    def update(self, params, delta, state, step):
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(delta)))
        direction = [d / norm for d in delta]
        torch._foreach_add_(params, direction, alpha=self.lr)
        return self.State(direction)


class _FrozenFirstRound(LinearRegression):
    """Clients take steps of learning rate 0 in round 0 (an LR schedule by round): Δ = 0 there, then ordinary."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda r: 0.0 if r == 0 else 1.0)
        return {"optimizer": opt, "lr_scheduler": schedule}


class _RoundEnds(L.Callback):
    def __init__(self):
        self.params, self.metrics = [], []

    def on_train_epoch_end(self, trainer, pl_module):
        self.params.append([p.detach().clone() for p in pl_module.parameters()])
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("round_")})


def _nonfinite_step_fit(tmp_path, **kwargs):
    from lightning_fed.callbacks import ServerOptimizer

    x, y = regression_data(n=40)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=2, batch_size=10)
    torch.manual_seed(0)
    model, ends = _FrozenFirstRound(lr=0.05), _RoundEnds()
    server = ServerOptimizer(rule=_NormalizedStep())
    trainer = FederatedTrainer(max_epochs=3, callbacks=[server, ends], **(quiet_trainer_kwargs(tmp_path) | kwargs))
    start = [p.detach().clone() for p in model.parameters()]
    trainer.fit(model, datamodule=dm)
    return model, server, ends, start


def test_43_a_server_step_that_makes_the_model_non_finite_stops_the_run_naming_the_tensors(tmp_path):
    """#43 case 1 (b): before, round 0's NaN step went into the model, every later client was dropped as non-finite
    and fit returned normally with a NaN model."""
    with pytest.raises(RuntimeError, match="Round 0: the server step made") as info:
        _nonfinite_step_fit(tmp_path)
    message = str(info.value)
    assert "global model parameter 'linear.weight' has 3 non-finite value(s) (of 3)" in message
    assert "global model parameter 'linear.bias' has 1 non-finite value(s) (of 1)" in message
    assert "ServerOptimizer state 'state.direction' for parameter 'linear.weight'" in message
    assert "on_nonfinite_server_step='restore'" in message


def test_43_restore_puts_back_the_rounds_start_and_counts_the_round_as_empty(tmp_path):
    with pytest.warns(UserWarning, match=r"Round 0: the server step made .*global model parameter 'linear.weight' has "
                                         r"3 non-finite value\(s\).*on_nonfinite_server_step='restore'"):
        model, server, ends, start = _nonfinite_step_fit(tmp_path, on_nonfinite_server_step="restore")
    for p, q in zip(ends.params[0], start):  # round 0 restored x_0 exactly
        assert torch.equal(p, q)
    assert server.num_steps == 2  # rounds 1 and 2 stepped; round 0 does not count
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(d).all() for d in server.state["direction"])
    assert ends.metrics[0]["round_clients"] == 0 and ends.metrics[0]["round_clients_dropped"] == 2
    assert ends.metrics[1]["round_clients"] == 2 and ends.metrics[1]["round_clients_dropped"] == 0
    assert not torch.equal(ends.params[1][0], start[0])


def test_43_on_nonfinite_server_step_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"`on_nonfinite_server_step` must be one of \('raise', 'restore'\), got 'skip'"):
        FederatedTrainer(on_nonfinite_server_step="skip", **quiet_trainer_kwargs(tmp_path))


def test_43_a_non_finite_per_client_state_row_of_the_round_stops_the_run(tmp_path):
    """#43: a client algorithm's new per-client state is server state too (its delta was finite, so the client was
    not dropped): a NaN row of a client of the round is named after the step (before: stored without a word)."""
    from lightning_fed.callbacks import FedAvg
    from lightning_fed.client import ClientAlgorithm

    class Visits(ClientAlgorithm):  # counts the client's rounds; 0/0 for client 1
        def state_dim(self, num_params):
            return 1

        def start(self, module, context, state):
            self.client_id = context.client_id

        def finish(self, module, context):
            value = torch.tensor([0.0]) / 0.0 if self.client_id == 1 else torch.ones(1)
            return {}, value

    x, y = regression_data(n=40)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=4, batch_size=10)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg(client=[Visits()])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match=r"Round 0: .*FedAvg state 'client_algorithms.Visits' row of client 1 has 1 "
                                           r"non-finite value\(s\) \(of 1\)"):
        trainer.fit(LinearRegression(lr=0.05), datamodule=dm)


# ------------------------------------------------------------------ #49: a server step non-finite round after round
class _StillAfterFirstRound(LinearRegression):
    """Clients take ordinary steps in round 0, steps of learning rate 0 after it: Δ = 0 from round 1 on, so
    _NormalizedStep divides 0 by 0 in every later round."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda r: 1.0 if r == 0 else 0.0)
        return {"optimizer": opt, "lr_scheduler": schedule}


def _restore_fit(tmp_path, module, rounds, **kwargs):
    from lightning_fed.callbacks import ServerOptimizer

    x, y = regression_data(n=40)
    dm = _regression_module(x, y, num_clients=4, clients_per_round=2, batch_size=10)
    torch.manual_seed(0)
    model, ends = module, _RoundEnds()
    start = _linear_weights(model)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[ServerOptimizer(rule=_NormalizedStep()), ends],
                               on_nonfinite_server_step="restore", **(quiet_trainer_kwargs(tmp_path) | kwargs))
    return trainer, dm, model, ends, start, x, y


def test_49_restore_stops_after_three_non_finite_steps_in_a_row_naming_the_tensors(tmp_path):
    """#49 part 4: before, "restore" undid rounds 1..5 one after another and fit returned normally."""
    trainer, dm, model, ends, w0, x, y = _restore_fit(tmp_path, _StillAfterFirstRound(lr=0.05), rounds=6)
    with pytest.warns(UserWarning, match="Round 1: the server step made"), pytest.raises(
        RuntimeError, match=r"Round 3: the server step made .* non-finite in 3 rounds in a row \(1, 2, 3\).*"
                            r"max_consecutive_restores=3") as info:
        trainer.fit(model, datamodule=dm)
    assert "global model parameter 'linear.weight' has 3 non-finite value(s) (of 3)" in str(info.value)
    assert trainer.current_epoch == 3
    # Independent expectation: round 0 alone moved the model, x_1 = x_0 + 0.1·Δ/‖Δ‖ with Δ the mean of the two
    # sampled clients' one full-batch SGD steps (10 samples each); rounds 1-3 were undone.
    parts = dm.partition
    deltas = [-0.05 * _mse_grad(w0, x[parts.client_indices(c)], y[parts.client_indices(c)])
              for c in dm.sample_clients(0)]
    delta = np.mean(deltas, axis=0)
    np.testing.assert_allclose(_linear_weights(model), w0 + 0.1 * delta / np.linalg.norm(delta), rtol=0, atol=1e-12)


def test_49_a_run_of_restored_rounds_counts_them_apart_in_the_end_of_run_error(tmp_path):
    """#49 part 4: before, the message read "No client reported back in any of the 2 round(s) of this run ()"."""
    trainer, dm, model, ends, *_ = _restore_fit(tmp_path, LinearRegression(lr=0.0), rounds=2,
                                                max_consecutive_restores=5)
    with pytest.warns(UserWarning, match=r"End of fit after 2 round\(s\): 2 round\(s\) had their non-finite server "
                                         r"step undone"), \
            pytest.raises(RuntimeError, match=r"No client reported back in any of the 2 round\(s\) of this run \(2 "
                                              r"round\(s\): the server step made the model or the server state "
                                              r"non-finite and was undone \(on_nonfinite_server_step='restore'\)\)"):
        trainer.fit(model, datamodule=dm)
    assert trainer.current_epoch == 2


@pytest.mark.parametrize("bad, policy, match", [
    (0, "restore", r"`max_consecutive_restores` must be an integer >= 1 or None \(3\), got 0"),
    (True, "restore", r"`max_consecutive_restores` must be an integer >= 1 or None \(3\), got True"),
    (2.0, "restore", r"`max_consecutive_restores` must be an integer >= 1 or None \(3\), got 2.0"),
    (2, "raise", r"`max_consecutive_restores`=2 applies only with on_nonfinite_server_step='restore'"),
])
def test_49_max_consecutive_restores_is_checked(tmp_path, bad, policy, match):
    with pytest.raises(ValueError, match=match):
        FederatedTrainer(on_nonfinite_server_step=policy, max_consecutive_restores=bad, **quiet_trainer_kwargs(tmp_path))


# ------------------------------------------------------------------ #49: BatchNorm with one-sample batches
class _BatchNormRegression(LinearRegression):
    def __init__(self, lr=0.1):
        super().__init__(lr=lr)
        self.norm = torch.nn.BatchNorm1d(3, dtype=torch.float64)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.linear(self.norm(x)).squeeze(-1), y)


def _sized_clients(sizes, **kwargs):
    from lightning_fed.datamodules import NaturalIdPartitioner

    x, y = regression_data(n=sum(sizes))
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = np.repeat(np.arange(len(sizes)), sizes)
    return FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), **kwargs)


def test_49_batchnorm_with_one_sample_batches_is_refused_at_fit_start_naming_the_clients(tmp_path):
    """#49 part 4: before, clients 1 and 3 (11 and 21 samples, batches of 10) failed in every round with BatchNorm's
    'Expected more than 1 value per channel' and were dropped while the run went on."""
    dm = _sized_clients([10, 11, 20, 21], clients_per_round=4, batch_size=10)
    model = _BatchNormRegression()
    before = _linear_weights(model)
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"_BatchNormRegression has BatchNorm1d layer\(s\) in training mode \(norm\), "
                                         r"and with batch_size=10 and drop_last=False 2 client\(s\) take a local batch "
                                         r"of a single sample: client 1 \(11 samples\), client 3 \(21 samples\)\..*"
                                         r"drop_last=True"):
        trainer.fit(model, datamodule=dm)
    np.testing.assert_array_equal(_linear_weights(model), before)  # before any client trained
    assert trainer.global_step == 0


def test_49_batchnorm_trains_when_no_batch_holds_one_sample_or_the_layer_is_in_eval_mode(tmp_path):
    in_eval = _BatchNormRegression()
    in_eval.norm.eval()  # running statistics: a one-sample batch is fine
    cases = [([10, 11, 20, 21], True, _BatchNormRegression(), 6),  # drop_last: 1+1+2+2 full batches
             ([10, 12, 20, 22], False, _BatchNormRegression(), 8),  # no remainder of 1: 1+2+2+3 batches
             ([10, 11, 20, 21], False, in_eval, 8)]
    for sizes, drop_last, model, steps in cases:
        dm = _sized_clients(sizes, clients_per_round=4, batch_size=10, drop_last=drop_last)
        trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
        trainer.fit(model, datamodule=dm)
        assert trainer.global_step == steps
        assert trainer.callback_metrics["round_clients"] == 4  # every client reported back


def test_49_a_finite_update_whose_float32_norm_overflows_is_kept():
    """Before: Δ_i with float32 entries 4e19 was dropped as non-finite: its norm √(4·(4e19)²) = 8e19 squares past
    float32's 3.4e38 (the sum of squares is inf). Only a true NaN/inf drops an update; the kept norms of such a Δ_i
    are float64 (8e19 and √2·4e19, by hand), those of an ordinary Δ_i stay the float32 `_foreach_norm` ones."""
    from lightning_fed.client import ClientUpdate
    from lightning_fed.loop import FederatedFitLoop

    def update(cid, delta, buffers=()):
        return ClientUpdate(client_id=cid, delta=delta, num_samples=1, num_steps=1, loss=0.0, buffers=list(buffers))

    big = [torch.full((4,), 4e19), torch.tensor([4e19, -4e19])]
    assert not torch.isfinite(torch.stack(torch._foreach_norm(big)).sum())  # the overflow the check used to see
    ordinary = [torch.tensor([3.0, 4.0])]
    updates = [
        update(0, big),
        update(1, ordinary),
        update(2, [torch.full((4,), 4e19), torch.tensor([float("nan"), 1.0])]),  # overflow and a true NaN
        update(3, ordinary, [torch.full((3,), 3e38)]),  # a finite buffer whose norm overflows
        update(4, ordinary, [torch.tensor([float("inf")])]),
        update(5, [torch.tensor([3e38]), torch.tensor([3e38])]),  # finite norms, their float32 sum overflows
    ]
    kept: dict = {}
    assert FederatedFitLoop._finite_updates(updates, kept) == [True, True, False, True, False, True]
    assert kept[id(updates[0])].norms.dtype == torch.float64
    v = float(np.float32(4e19))  # the float32 entry, exactly
    assert kept[id(updates[0])].norms.tolist() == pytest.approx([2.0 * v, np.sqrt(2.0) * v], rel=1e-15)
    assert kept[id(updates[1])].norms.dtype == torch.float32 and kept[id(updates[1])].norms.tolist() == [5.0]
    assert kept[id(updates[5])].norms.tolist() == pytest.approx([float(np.float32(3e38))] * 2, rel=1e-15)
