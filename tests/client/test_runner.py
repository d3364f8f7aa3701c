"""ClientRunner: start a client from x_t, local steps, finish it into a ClientUpdate — driven by a hand-written
executor and checked against SGD on a linear model computed in NumPy."""

from __future__ import annotations


import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAvg
from lightning_fed.client.runner import ClientContext, ClientRunner
from lightning_fed.client.sequential import ClientExecutor
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
import csv
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from helpers import (LinearRegression, linear_weights, mse_grad, quiet_trainer_kwargs, regression_data,
                     FrozenEncoder, HeadOnly, NO_VALIDATION_STEP)
from lightning_fed.callbacks import FedAdam, FedAvg, FedYogi
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, NaturalIdPartitioner


def _weights(model) -> np.ndarray:
    return np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])


def _mse(w, x, y):
    xb = np.hstack([x, np.ones((len(x), 1))])
    r = xb @ w - y
    return float(np.mean(r**2)), 2.0 / len(x) * xb.T @ r


class ByHand(ClientExecutor):
    """Drives the runner step by step, as an executor would, and keeps what it saw."""

    def __init__(self):
        self.updates, self.contexts = [], []

    def run_round(self, runner: ClientRunner, cohort, round_idx):
        updates = []
        for cid in cohort.tolist():
            runner.start_client(cid)
            self.contexts.append(runner.context(cid))
            losses = []
            for batch_idx, batch in enumerate(runner.datamodule.client_dataloader(cid, round_idx)):
                losses.append(float(runner.local_step(batch, batch_idx)["loss"]))
            update = runner.finish_client(cid, num_steps=len(losses), loss=sum(losses) / len(losses))
            updates.append(update)
            self.updates.append(update)
        return updates, []


def test_start_steps_finish_is_sgd_by_hand(tmp_path):
    x, y = regression_data(n=40)
    model = LinearRegression(lr=0.1)
    w0 = _weights(model)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(1, seed=0),
                             clients_per_round=1, batch_size=40, local_epochs=2)
    executor = ByHand()
    FederatedTrainer(max_epochs=1, client_executor=executor, callbacks=[FedAvg(lr=1.0)],
                     **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    # two full-batch SGD steps from x_t with γ = 0.1 (the client's rows are all 40, in some order: full batch)
    loss0, g0 = _mse(w0, x, y)
    w1 = w0 - 0.1 * g0
    loss1, g1 = _mse(w1, x, y)
    w2 = w1 - 0.1 * g1
    (update,) = executor.updates
    delta = np.concatenate([t.detach().numpy().ravel() for t in update.delta])
    np.testing.assert_allclose(delta, w2 - w0, rtol=0, atol=1e-12)
    assert update.client_id == 0 and update.num_samples == 40 and update.num_steps == 2 and update.loss_steps == 2
    assert update.loss == pytest.approx((loss0 + loss1) / 2, rel=1e-12)
    assert update.client_lr == 0.1 and update.client_lrs == [0.1, 0.1]
    assert update.buffers == [] and update.extras == {}
    # FedAvg with η = 1 and one client: the global model is x_t + Δ
    np.testing.assert_allclose(_weights(model), w2, rtol=0, atol=1e-12)
    (context,) = executor.contexts
    assert isinstance(context, ClientContext) and context.client_id == 0 and context.round_idx == 0
    np.testing.assert_array_equal(np.concatenate([t.numpy().ravel() for t in context.global_params]), w0)
    assert context.client_lr == 0.1 and context.client_lrs == [0.1, 0.1]


class _SeesContexts(FedAvg):
    """FedAvg that keeps the contexts its client channel is given."""

    def __init__(self):
        super().__init__(lr=1.0)
        self.seen = []

    def configure_client(self, trainer, pl_module, client_id, round_idx, context=None):
        self.seen.append(("start", client_id, context))

    def collect_client_extras(self, trainer, pl_module, client_id, round_idx, context=None):
        self.seen.append(("end", client_id, context))
        return {}


def test_a_clients_start_and_end_share_one_context(tmp_path):
    """Issue #44: the runner makes a client's ClientContext once, at its start, and passes that object at its end too
    (one construction per client instead of two; the same values as before)."""
    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(4, seed=0),
                             clients_per_round=2, batch_size=5)
    server = _SeesContexts()
    FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(lr=0.1),
                                                                                           datamodule=dm)
    assert [s[0] for s in server.seen] == ["start", "end"] * 4
    for (_, cid0, start), (_, cid1, end) in zip(server.seen[::2], server.seen[1::2]):
        assert cid0 == cid1 == start.client_id and end is start and start.client_lrs == [0.1, 0.1]
    assert [s[2].round_idx for s in server.seen[::2]] == [0, 0, 1, 1]


def test_failure_policy_is_applied_by_the_runner():
    class FakeTrainer:
        current_epoch = 3

    skip = ClientRunner("skip")
    skip.trainer = FakeTrainer()
    with pytest.warns(UserWarning, match="Client 7 failed in round 3: boom; dropped"):
        assert skip.report_failure(7, "boom") == (7, "boom")
    with pytest.warns(UserWarning, match="Client 8 failed in round 3: ValueError: bad"):
        assert skip.client_failed(8, ValueError("bad")) == (8, "ValueError: bad")
    strict = ClientRunner("raise")
    strict.trainer = FakeTrainer()
    with pytest.raises(RuntimeError, match=r"Client 7 failed in round 3: boom \(on_client_failure='raise'\)"):
        strict.report_failure(7, "boom")
    with pytest.raises(ValueError, match="bad"):
        strict.client_failed(8, ValueError("bad"))
    with pytest.raises(ValueError, match=r"`on_client_failure` must be one of \('skip', 'raise', 'skip_all'\), got 'ignore'"):
        ClientRunner("ignore")


def test_an_executor_returning_a_bare_list_is_refused(tmp_path):
    class Old(ByHand):
        def run_round(self, runner, cohort, round_idx):
            return super().run_round(runner, cohort, round_idx)[0]

    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(2, seed=0),
                             clients_per_round=1, batch_size=40)
    trainer = FederatedTrainer(max_epochs=1, client_executor=Old(), **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(TypeError, match=r"Old\.run_round must return \(updates, failures\).*got list"):
        trainer.fit(LinearRegression(), datamodule=dm)


RAISE_MARK = 999.0


class Fragile(LinearRegression):
    """An ordinary module that raises on a marked input (a bug that shows up only on some clients' data)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        if (x == RAISE_MARK).any():
            raise RuntimeError("corrupt sample")
        return F.mse_loss(self.linear(x).squeeze(-1), y)


_grad, _weights = mse_grad, linear_weights  # (from the former test_reliability.py; same as _weights above)

def _faulty_module(num_clients=5, nan_clients=(1,), raise_clients=(3,), **kwargs):
    """Clients 0..N-1 by natural id; ``nan_clients`` hold a NaN input, ``raise_clients`` a marked input."""
    x, y = regression_data(n=10 * num_clients)
    ids = np.repeat(np.arange(num_clients), 10)
    for c in nan_clients:
        x[np.flatnonzero(ids == c)[0], 0] = np.nan
    for c in raise_clients:
        x[np.flatnonzero(ids == c)[0], 0] = RAISE_MARK
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=num_clients,
                             batch_size=100, **kwargs)
    return dm, x, y, ids


def test_nan_and_raising_clients_are_dropped_and_the_rest_aggregated(tmp_path):
    dm, x, y, ids = _faulty_module()
    model = Fragile(lr=0.1)
    w0 = _weights(model)
    logger = CSVLogger(str(tmp_path), name="faults")
    with pytest.warns(UserWarning, match="dropped from the round"):
        FederatedTrainer(max_epochs=2, callbacks=[FedAvg()], **(quiet_trainer_kwargs(tmp_path) | {"logger": logger})).fit(
            model, datamodule=dm
        )
    # Independent expectation: FedAvg of the three healthy clients (equal sizes), one full-batch step each.
    w = w0
    for _ in range(2):
        w = w + np.mean([-0.1 * _grad(w, x[ids == c], y[ids == c]) for c in (0, 2, 4)], axis=0)
    np.testing.assert_allclose(_weights(model), w, atol=1e-12)
    rows = [r for r in csv.DictReader(open(f"{logger.log_dir}/metrics.csv")) if r.get("round_clients_dropped")]
    assert [float(r["round_clients_dropped"]) for r in rows] == [2.0, 2.0]
    assert [float(r["round_clients"]) for r in rows] == [3.0, 3.0]


def test_round_where_every_client_fails_changes_nothing(tmp_path):
    dm, *_ = _faulty_module(num_clients=2, nan_clients=(0,), raise_clients=(1,))
    model = Fragile(lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    server = FedYogi(lr=0.1)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    # every round failed for every client: the run ends with an error (issue #11.6), after both rounds ran
    with pytest.warns(UserWarning, match="no client reported back"), pytest.raises(RuntimeError, match="No client"):
        trainer.fit(model, datamodule=dm)
    for a, b in zip(before, model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert server.num_steps == 0 and server.state == {}
    assert trainer.callback_metrics["round_clients_dropped"] == 2
    assert trainer.current_epoch == 2


def test_raise_policy_stops_training(tmp_path):
    dm, *_ = _faulty_module(nan_clients=(), raise_clients=(2,))
    trainer = FederatedTrainer(max_epochs=1, on_client_failure="raise", **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="corrupt sample"):
        trainer.fit(Fragile(), datamodule=dm)
    dm, *_ = _faulty_module(nan_clients=(1,), raise_clients=())
    trainer = FederatedTrainer(max_epochs=1, on_client_failure="raise", **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="Client 1 failed in round 0: non-finite update"):
        trainer.fit(Fragile(), datamodule=dm)


def test_bad_failure_policy(tmp_path):
    with pytest.raises(ValueError, match="`on_client_failure` must be one of \\('skip', 'raise', 'skip_all'\\)"):
        FederatedTrainer(on_client_failure="ignore", **quiet_trainer_kwargs(tmp_path))


# ------------------------------------------------------------------ #43.1 a deterministic error stops the run at once
class MissingKey(LinearRegression):
    """A bug every client hits at the same line: a lookup of a key the batch does not hold (the key's name differs
    by client, so the messages differ; the place does not)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        fields = {"x": x, "y": y}
        return fields[f"label_{int(x.shape[0])}"]


class TwoBugs(LinearRegression):
    """Clients with an even number of samples (one full batch) fail at one line, the others at another: not the
    same error."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        if x.shape[0] % 2 == 0:
            raise KeyError("even")
        raise KeyError("odd")


def _clients_of_sizes(sizes):
    ids = np.repeat(np.arange(len(sizes)), sizes)
    x, y = regression_data(n=len(ids))
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids
    return dataset


@pytest.mark.parametrize("clients", [3, 1])
def test_every_client_raising_the_same_error_stops_the_run_at_that_round(tmp_path, clients):
    dataset = _clients_of_sizes([4, 5, 6][:clients])
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=clients,
                             batch_size=100)
    trainer = FederatedTrainer(max_epochs=5, **quiet_trainer_kwargs(tmp_path))
    count = f"all {clients} clients" if clients > 1 else "its only client"
    with pytest.warns(UserWarning, match="KeyError"), pytest.raises(
        RuntimeError, match=rf"Round 0: {count} failed with the same error, KeyError: 'label_\d'.*test_runner.py:\d+"
    ) as info:
        trainer.fit(MissingKey(), datamodule=dm)
    assert isinstance(info.value.__cause__, KeyError)  # the client's own exception and its traceback
    assert info.value.__cause__.__traceback__ is not None
    assert trainer.current_epoch == 0  # not after max_epochs rounds


def test_different_errors_and_skip_all_keep_dropping_clients_round_after_round(tmp_path):
    dataset = _clients_of_sizes([4, 5, 6, 7])
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=4,
                             batch_size=100)
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="dropped"), pytest.raises(RuntimeError, match="No client reported back"):
        trainer.fit(TwoBugs(), datamodule=dm)
    assert trainer.current_epoch == 2
    trainer = FederatedTrainer(max_epochs=2, on_client_failure="skip_all", **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="dropped"), pytest.raises(RuntimeError, match="No client reported back"):
        trainer.fit(MissingKey(), datamodule=dm)
    assert trainer.current_epoch == 2 and trainer.callback_metrics["round_clients_dropped"] == 4


def test_a_failure_records_where_it_was_raised_and_crosses_ranks():
    from lightning_fed.client.distributed import pack_updates, unpack_updates
    from lightning_fed.client.runner import ClientFailure, failure_origin

    class FakeTrainer:
        current_epoch = 0
        strategy = L.pytorch.strategies.SingleDeviceStrategy(torch.device("cpu"))  # its barrier: a no-op

    runner = ClientRunner("skip")
    runner.trainer = FakeTrainer()
    failures = []
    for cid in (2, 5):
        try:
            {}[cid]
        except KeyError as error:
            with pytest.warns(UserWarning, match=f"Client {cid} failed in round 0: KeyError: {cid}"):
                failures.append(runner.client_failed(cid, error))
    assert failures == [(2, "KeyError: 2"), (5, "KeyError: 5")]
    assert failures[0].origin == failures[1].origin == failure_origin(failures[0].error)
    assert failures[0].origin.startswith("builtins.KeyError at ") and "test_runner.py" in failures[0].origin
    # the DDP gather's packing keeps origin and traceback text (not the exception): every rank decides alike
    packed = pack_updates([], failures)
    buffer = torch.frombuffer(bytearray(packed.meta), dtype=torch.uint8)
    _, back = unpack_updates(buffer, len(packed.meta), torch.device("cpu"))
    assert back == failures and all(isinstance(f, ClientFailure) and f.error is None for f in back)
    assert [f.origin for f in back] == [f.origin for f in failures] and "KeyError" in back[0].traceback
    with pytest.raises(RuntimeError, match=r"Round 0: all 2 clients failed.*\nClient 2's traceback:\nTraceback"):
        runner.stop_if_all_failed_alike(0, back, 0)
    runner.stop_if_all_failed_alike(1, back, 0)  # someone reported back: nothing
    runner.stop_if_all_failed_alike(0, [back[0], ClientFailure(6, "timed out")], 0)  # not all alike: nothing
    runner.on_client_failure = "skip_all"
    runner.stop_if_all_failed_alike(0, back, 0)


# ------------------------------------------------------------------ only the trainable parameters are federated (#42)
class Recording(ClientExecutor):
    """The sequential executor, keeping every update and the runner's x_t."""

    def __init__(self):
        from lightning_fed.client.sequential import SequentialExecutor

        self.inner, self.updates, self.global_params = SequentialExecutor(), [], []

    def run_round(self, runner, cohort, round_idx):
        updates, failures = self.inner.run_round(runner, cohort, round_idx)
        self.updates += updates
        self.global_params.append(list(runner.global_params))
        return updates, failures


def _fit_frozen(tmp_path, model, server, executor=None, rounds=2, **kwargs):
    x, y = regression_data(n=60)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(4, seed=0),
                             clients_per_round=3, batch_size=5, seed=0)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], client_executor=executor,
                               **{**quiet_trainer_kwargs(tmp_path), **kwargs})
    trainer.fit(model, datamodule=dm)
    return trainer


@pytest.mark.filterwarnings(NO_VALIDATION_STEP)
@pytest.mark.parametrize("method", ["fedavg", "fedadam", "fedyogi"])
def test_a_frozen_encoder_federates_like_a_model_of_only_the_trainable_layers(tmp_path, method):
    make = {"fedavg": FedAvg, "fedadam": lambda: FedAdam(lr=0.05),
            "fedyogi": lambda: FedYogi(lr=0.05)}[method]
    frozen, head_only = FrozenEncoder(), HeadOnly()
    encoder, storage, before = frozen.encoder.weight, frozen.encoder.weight.data_ptr(), frozen.encoder.weight.clone()
    recording = Recording()
    trainer = _fit_frozen(tmp_path / "a", frozen, make(), executor=recording)
    reference = _fit_frozen(tmp_path / "b", head_only, make())
    # number for number the model of the trainable layers alone (the head moved: not a trivial equality)
    assert torch.equal(frozen.head.weight, head_only.head.weight) and torch.equal(frozen.head.bias, head_only.head.bias)
    assert not torch.equal(frozen.head.bias, torch.zeros(1, dtype=torch.float64))
    # the frozen tensor: the same object, the same storage, the same values; never copied per client or round
    assert frozen.encoder.weight is encoder and encoder.data_ptr() == storage and torch.equal(encoder, before)
    runner = trainer.fit_loop.client_runner
    assert runner.param_names == ["head.weight", "head.bias"] and runner.federated_positions == [2, 3]
    assert [n for n, _ in runner.frozen_params] == ["encoder.weight", "encoder.bias"]
    assert all(len(u.delta) == 2 and len(u.client_lrs) == 2 for u in recording.updates)
    assert all(len(x_t) == 2 and all(t.data_ptr() != encoder.data_ptr() for t in x_t)
               for x_t in recording.global_params)
    server = trainer.fit_loop.server_optimizer
    assert all(len(v) == 2 for v in server.state.values())  # FedAdam's/FedYogi's moments: F only
    if server.state:
        assert [t.shape for t in server.state["exp_avg"]] == [torch.Size([1, 6]), torch.Size([1])]
    ref_server = reference.fit_loop.server_optimizer
    for key, value in server.state.items():
        assert all(torch.equal(a, b) for a, b in zip(value, ref_server.state[key]))


@pytest.mark.filterwarnings(NO_VALIDATION_STEP)
def test_a_parameter_in_no_optimizer_group_is_frozen_too(tmp_path):
    model = FrozenEncoder(unoptimized=True)
    before = model.encoder.weight.clone()
    trainer = _fit_frozen(tmp_path, model, FedAvg(), rounds=1)
    assert trainer.fit_loop.client_runner.param_names == ["head.weight", "head.bias"]
    assert torch.equal(model.encoder.weight, before)


@pytest.mark.filterwarnings(NO_VALIDATION_STEP)
def test_fit_start_reports_how_many_parameters_are_federated(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="lightning.pytorch"):
        _fit_frozen(tmp_path, FrozenEncoder(), FedAvg(), rounds=1)
    assert "federating 7 of 31 parameters" in caplog.text


class ChangesItsEncoder(FrozenEncoder):
    def training_step(self, batch, batch_idx):
        if batch_idx == 1:
            with torch.no_grad():
                self.encoder.bias.add_(1.0)  # a client changing a frozen parameter anyway
        return super().training_step(batch, batch_idx)


@pytest.mark.filterwarnings(NO_VALIDATION_STEP)
@pytest.mark.parametrize("policy", ["skip", "skip_all"])
def test_a_client_that_changes_a_frozen_parameter_stops_the_run_naming_it(tmp_path, policy):
    from lightning_fed.client.runner import FrozenParameterChangedError

    match = r"client \d+ changed the frozen parameter\(s\) 'encoder.bias'"
    with pytest.raises(FrozenParameterChangedError, match=match):
        _fit_frozen(tmp_path, ChangesItsEncoder(), FedAvg(), rounds=1, on_client_failure=policy)


@pytest.mark.filterwarnings(NO_VALIDATION_STEP)
def test_everything_frozen_is_refused_at_fit_start(tmp_path):
    model = FrozenEncoder()
    model.head.requires_grad_(False)
    with pytest.raises(ValueError, match="FrozenEncoder has no federated parameter"):
        _fit_frozen(tmp_path, model, FedAvg(), rounds=1)


# ------------------------------------------------------------------ #49: a client that fails in every round
def test_49_a_client_failing_in_each_of_its_last_three_rounds_stops_the_run_naming_it(tmp_path):
    """#49 part 4: before, client 3 was dropped in every round and fit returned normally without it."""
    dm, x, y, ids = _faulty_module(nan_clients=(), raise_clients=(3,))
    model = Fragile(lr=0.1)
    w = _weights(model)
    trainer = FederatedTrainer(max_epochs=6, callbacks=[FedAvg()], **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="Client 3 failed in round 2: RuntimeError: corrupt sample"), pytest.raises(
        RuntimeError, match=r"Round 2: client 3 failed in each of its last 3 sampled rounds \(rounds 0, 1, 2\), last "
                            r"with: RuntimeError: corrupt sample\..*max_consecutive_client_failures=3.*"
                            r"on_client_failure='skip_all'") as info:
        trainer.fit(model, datamodule=dm)
    assert "test_runner.py" in str(info.value)  # the client's last traceback
    assert trainer.current_epoch == 2
    # Independent expectation: rounds 0 and 1 are FedAvg of the four other clients; round 2 stopped with the module
    # back at x_2 (not the last client's local model)
    for _ in range(2):
        w = w + np.mean([-0.1 * _grad(w, x[ids == c], y[ids == c]) for c in (0, 1, 2, 4)], axis=0)
    np.testing.assert_allclose(_weights(model), w, atol=1e-12)


def test_49_a_client_that_fails_in_fewer_rounds_in_a_row_or_under_skip_all_is_only_dropped(tmp_path):
    """Clients failing in fewer than n rounds in a row are dropped as before; the end-of-fit summary names the ones
    that never trained."""
    dm, x, y, ids = _faulty_module(nan_clients=(1,), raise_clients=(3,))
    trainer = FederatedTrainer(max_epochs=3, callbacks=[FedAvg()], max_consecutive_client_failures=4,
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match=r"End of fit after 3 round\(s\): 2 of the 5 sampled clients never trained "
                                         r"\(dropped in every round they were sampled in\): client 1 \(sampled in 3 "
                                         r"round\(s\); last: non-finite update \(loss=nan\)\); client 3 \(sampled in 3 "
                                         r"round\(s\); last: RuntimeError: corrupt sample\)"):
        trainer.fit(Fragile(lr=0.1), datamodule=dm)
    assert trainer.current_epoch == 3
    trainer = FederatedTrainer(max_epochs=4, callbacks=[FedAvg()], on_client_failure="skip_all",
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match="dropped from the round"):
        trainer.fit(Fragile(lr=0.1), datamodule=dm)
    assert trainer.current_epoch == 4


def test_49_a_failing_round_between_successes_restarts_the_count():
    from lightning_fed.client.runner import ClientRecord

    record = ClientRecord()
    record.end_round(0, [1, 2], [2], [(1, "e")])
    record.end_round(1, [1, 2], [1, 2], [])  # client 1 trained: its run of failures ends
    record.end_round(2, [1], [], [(1, "e")])
    record.end_round(3, [2], [2], [])  # client 1 not sampled: its run goes on
    record.end_round(4, [1], [], [(1, "e")])
    assert record.streak_rounds[1] == [2, 4] and record.failing(3) == [] and record.failing(2) == [1]
    record.end_round(5, [1], [1], [(1, "outlier")], counted=[False])  # an update-norm outlier trained
    assert 1 not in record.streak_rounds and record.never_trained() == []


@pytest.mark.parametrize("bad, policy, match", [
    (0, "skip", r"`max_consecutive_client_failures` must be an integer >= 1 or None \(3\), got 0"),
    (True, "skip", r"`max_consecutive_client_failures` must be an integer >= 1 or None \(3\), got True"),
    (2, "skip_all", r"`max_consecutive_client_failures`=2 applies only with on_client_failure='skip' \(of \('skip', "
                    r"'raise', 'skip_all'\)\)"),
    (2, "raise", r"`max_consecutive_client_failures`=2 applies only with on_client_failure='skip'"),
])
def test_49_max_consecutive_client_failures_is_checked(tmp_path, bad, policy, match):
    with pytest.raises(ValueError, match=match):
        FederatedTrainer(on_client_failure=policy, max_consecutive_client_failures=bad, **quiet_trainer_kwargs(tmp_path))
