"""Hung clients and stop signals (issue #16, item 8): a per-client time limit interrupts a client stuck in a
Python-level wait; SIGTERM/SIGINT stop a round with a hung client at once and leave a checkpoint that resumes
exactly (CPU)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data, linear_weights, mse_grad
from lightning_fed import FederatedTrainer, SequentialExecutor, VectorizedExecutor
from lightning_fed.callbacks import FedAvg
from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner
from lightning_fed.interrupts import REPEAT_S, ClientTimeLimit, ClientTimeout

HANG_MARK = 555.0
NUM_CLIENTS, HUNG, LR, LIMIT_S = 4, 3, 0.1, 0.3


class Hanging(LinearRegression):
    """Hangs on a marked input: in ``time.sleep``, in a pure-Python busy loop, or slowly, 0.1 s per step."""

    def __init__(self, how: str = "sleep", **kwargs) -> None:
        super().__init__(**kwargs)
        self.how = how

    def training_step(self, batch, batch_idx):
        x, y = batch
        if (x == HANG_MARK).any():
            if self.how == "sleep":
                time.sleep(1000)
            elif self.how == "busy":
                while True:
                    pass
            else:
                time.sleep(0.1)
        return F.mse_loss(self.linear(x).squeeze(-1), y)


def _data(batch_size=100, val=False):
    x, y = regression_data(n=10 * NUM_CLIENTS)
    ids = np.repeat(np.arange(NUM_CLIENTS), 10)
    x[ids == HUNG, 0] = HANG_MARK  # every batch of the hung client is marked
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    dataset.client_id = ids
    val_dataset = None
    if val:  # 12 samples in batches of 4: three validation steps
        val_dataset = TensorDataset(*(torch.tensor(a) for a in regression_data(n=12, seed=1)))
    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("client_id"), clients_per_round=NUM_CLIENTS,
                             batch_size=batch_size, val_dataset=val_dataset, eval_batch_size=4)
    return dm, x, y, ids


_grad, _weights = mse_grad, linear_weights


@pytest.mark.parametrize("how", ["sleep", "busy"])
def test_hung_client_is_interrupted_dropped_and_the_rest_aggregated(tmp_path, how):
    dm, x, y, ids = _data()
    model = Hanging(how, lr=LR)
    w = _weights(model)
    logger = CSVLogger(str(tmp_path), name="hung")
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        handler = signal.getsignal(signal.SIGALRM)
        start = time.monotonic()
        with pytest.warns(UserWarning, match=rf"Client {HUNG} failed in round 1: timed out \(client_timeout_s=0.3 s\)"):
            FederatedTrainer(max_epochs=2, callbacks=[FedAvg()], client_timeout_s=LIMIT_S,
                             **(quiet_trainer_kwargs(tmp_path) | {"logger": logger})).fit(model, datamodule=dm)
        elapsed = time.monotonic() - start
        assert signal.getsignal(signal.SIGALRM) is handler  # the previous handler is back ...
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # ... and no timer left armed
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert elapsed < 2 * LIMIT_S + 30  # two interrupted clients, not two 1000 s sleeps
    # Independent expectation: FedAvg (equal sizes, η = 1) of the three other clients, one full-batch step each.
    for _ in range(2):
        w = w + np.mean([-LR * _grad(w, x[ids == c], y[ids == c]) for c in range(NUM_CLIENTS) if c != HUNG], axis=0)
    np.testing.assert_allclose(_weights(model), w, rtol=0, atol=1e-12)
    rows = [r for r in csv.DictReader(open(f"{logger.log_dir}/metrics.csv")) if r.get("round_clients_dropped")]
    assert [float(r["round_clients_dropped"]) for r in rows] == [1.0, 1.0]
    assert [float(r["round_clients"]) for r in rows] == [3.0, 3.0]


def test_hung_client_with_raise_policy_raises(tmp_path):
    dm, *_ = _data()
    trainer = FederatedTrainer(max_epochs=1, client_timeout_s=LIMIT_S, on_client_failure="raise",
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match=rf"Client {HUNG} failed in round 0: timed out .*on_client_failure='raise'"):
        trainer.fit(Hanging("sleep", lr=LR), datamodule=dm)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_outside_the_main_thread_the_limit_is_checked_between_local_steps(tmp_path):
    dm, *_ = _data(batch_size=1)  # the slow client: 10 steps of 0.1 s
    trainer = FederatedTrainer(max_epochs=1, client_timeout_s=LIMIT_S, **quiet_trainer_kwargs(tmp_path))
    model = Hanging("slow", lr=LR)
    errors = []

    def fit():
        try:
            trainer.fit(model, datamodule=dm)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    start = time.monotonic()
    with pytest.warns(UserWarning, match=rf"Client {HUNG} failed in round 0: timed out"):
        thread = threading.Thread(target=fit)
        thread.start()
        thread.join(timeout=120)
    assert not thread.is_alive() and not errors
    assert trainer.fit_loop.round_metrics["round_clients_dropped"] == 1.0
    assert trainer.fit_loop.round_metrics["round_clients"] == 3.0
    assert time.monotonic() - start < 60


def test_time_limit_interrupts_sleep_and_restores_the_previous_handler_and_timer():
    def previous_handler(signum, frame):
        raise AssertionError("the previous timer fired during the client")

    old = signal.signal(signal.SIGALRM, previous_handler)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        start = time.monotonic()
        with pytest.raises(ClientTimeout, match="client 7 exceeded client_timeout_s=0.2 s in round 3"):
            with ClientTimeLimit(0.2, client_id=7, round_idx=3) as limit:
                assert limit.interrupts
                time.sleep(1000)
        assert 0.15 < time.monotonic() - start < 10
        assert signal.getsignal(signal.SIGALRM) is previous_handler
        remaining, interval = signal.getitimer(signal.ITIMER_REAL)
        assert 80.0 < remaining < 100.0 and interval == 0.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, old)


def test_time_limit_is_reraised_if_the_client_swallows_it():
    start = time.monotonic()
    with pytest.raises(ClientTimeout):
        with ClientTimeLimit(0.1, client_id=0, round_idx=0):
            try:
                time.sleep(1000)
            except BaseException:  # noqa: BLE001 - a careless client swallows the first one ...
                pass
            time.sleep(1000)  # ... and hangs again: the alarm repeats every REPEAT_S seconds
    assert time.monotonic() - start < 0.1 + REPEAT_S + 10


def test_vectorized_executor_trains_sequentially_under_a_time_limit(tmp_path):
    dm, x, y, ids = _data()
    model = Hanging("sleep", lr=LR)
    executor = VectorizedExecutor()
    with pytest.warns(UserWarning, match=rf"Client {HUNG} failed in round 0: timed out"):
        FederatedTrainer(max_epochs=1, client_executor=executor, client_timeout_s=LIMIT_S,
                         **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    assert "client_timeout_s" in executor.fallback_reason


def test_time_limit_with_an_executor_that_cannot_apply_it_is_refused(tmp_path):
    class Custom(SequentialExecutor):
        supports_client_timeout = False

    dm, *_ = _data()
    trainer = FederatedTrainer(max_epochs=1, client_executor=Custom(), client_timeout_s=1.0,
                               **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match="`client_timeout_s` is set but the client executor Custom does not support"):
        trainer.fit(LinearRegression(), datamodule=dm)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_bad_client_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="`client_timeout_s` must be None .* finite number of seconds > 0"):
        FederatedTrainer(client_timeout_s=bad, logger=False, enable_checkpointing=False)


# ---------------------------------------------------------------------------------------------- stop signals
class SignalsItself(LinearRegression):
    """Sends itself SIGTERM once: in a client's first local step of round 1 (``"in_round"``), while the global
    model of round 0 is validated (``"in_validation"``), or at the end of round 0 (``"after_round"``, from
    ``on_train_epoch_end``)."""

    def __init__(self, when: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.when, self.sent = when, False

    def _send(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def training_step(self, batch, batch_idx):
        if self.when == "in_round" and self.trainer.current_epoch == 1:
            self._send()
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if self.when == "in_validation" and self.trainer.current_epoch == 0:
            self._send()
        return super().validation_step(batch, batch_idx)

    def on_train_epoch_end(self):
        if self.when == "after_round" and self.trainer.current_epoch == 0:
            self._send()


@pytest.mark.parametrize(
    "when, message, rounds_done",
    [
        ("in_round", "Round 1 stopped by SIGTERM", 1),
        ("in_validation", "Stopped by SIGTERM after round 0", 1),  # validation finishes, then the round's end
        ("after_round", "Stopped by SIGTERM after round 0", 1),
    ],
)
def test_sigterm_without_model_checkpoint_writes_default_root_dir_last_and_resumes_exactly(
    tmp_path, when, message, rounds_done
):
    dm, *_ = _data(val=True)
    torch.manual_seed(0)
    reference = LinearRegression(lr=LR)
    FederatedTrainer(max_epochs=3, **quiet_trainer_kwargs(tmp_path / "ref")).fit(reference, datamodule=dm)
    torch.manual_seed(0)
    model = SignalsItself(when, lr=LR)
    trainer = FederatedTrainer(max_epochs=3, **quiet_trainer_kwargs(tmp_path))  # no ModelCheckpoint
    with pytest.raises(SIGTERMException, match=message):
        trainer.fit(model, datamodule=dm)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # Lightning's and the round's handlers are gone
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"] == rounds_done
    resumed = LinearRegression(lr=LR)
    FederatedTrainer(max_epochs=3, **quiet_trainer_kwargs(tmp_path)).fit(
        resumed, datamodule=dm, ckpt_path=str(tmp_path / "last.ckpt")
    )
    torch.testing.assert_close(_weights(resumed), _weights(reference), rtol=0, atol=0)


ROUNDS, HANG_ROUND = 4, 2

SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from lightning.pytorch.callbacks import ModelCheckpoint
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAdam
    from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule

    out, ckpt_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]


    class Hangs(SmallClassifier):
        def training_step(self, batch, batch_idx):
            if mode == "hang" and self.trainer.current_epoch == {hang_round}:
                open(out + ".hanging", "w").close()
                time.sleep(1000)
            return super().training_step(batch, batch_idx)


    torch.manual_seed(0)
    model = Hangs(dropout=0.2)
    train, val = classification_dataset(n=600, n_val=50)
    dm = FederatedDataModule(train, val_dataset=val, partitioner=DirichletPartitioner(num_clients=10, alpha=0.5),
                             clients_per_round=4, batch_size=8, local_epochs=1)
    trainer = FederatedTrainer(
        max_epochs={rounds}, callbacks=[FedAdam(lr=0.02), ModelCheckpoint(dirpath=ckpt_dir, save_last=True)],
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
        num_sanity_val_steps=0,
    )
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_dir + "/last.ckpt" if mode == "resume" else None)
    finally:
        open(out + ".left_fit", "w").write(repr(time.time()))
    torch.save(model.state_dict(), out)
    """
)


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent), rounds=ROUNDS, hang_round=HANG_ROUND))
    return script


def _command(tmp_path: Path, out: str, ckpt_dir: str, mode: str) -> list[str]:
    return [sys.executable, str(_script(tmp_path)), str(tmp_path / out), str(tmp_path / ckpt_dir), mode]


ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    subprocess.run(_command(tmp_path, "full.pt", "ckpt", "fresh"), check=True, env=ENV, capture_output=True,
                   timeout=300)
    return torch.load(tmp_path / "full.pt", weights_only=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_during_a_hung_round_checkpoints_exits_and_resumes_exactly(tmp_path, uninterrupted, signum):
    hanging, left_fit = tmp_path / "stopped.pt.hanging", tmp_path / "stopped.pt.left_fit"
    proc = subprocess.Popen(  # SIGINT as a terminal would deliver it (a background shell job would ignore it)
        _command(tmp_path, "stopped.pt", "ckpt", "hang"), env=ENV, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while not hanging.exists():  # a client of round HANG_ROUND is in time.sleep(1000)
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)
    sent = time.time()
    proc.send_signal(signum)
    try:
        stderr = proc.communicate(timeout=60)[1].decode()  # interpreter shutdown of torch + Lightning: seconds
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    assert float(left_fit.read_text()) - sent < 3.0  # fit ended promptly ...
    assert f"Round {HANG_ROUND} stopped by {signal.Signals(signum).name}" in stderr
    assert not (tmp_path / "stopped.pt").exists()  # ... without finishing
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    # Written by the stop, not ModelCheckpoint's end of round HANG_ROUND - 1 (which stores epoch HANG_ROUND - 1):
    # HANG_ROUND rounds processed and completed, the hung round neither ready nor started.
    progress = checkpoint["loops"]["fit_loop"]["epoch_progress"]
    assert progress["total"] == dict(ready=HANG_ROUND, started=HANG_ROUND, processed=HANG_ROUND, completed=HANG_ROUND)
    assert checkpoint["epoch"] == HANG_ROUND
    subprocess.run(_command(tmp_path, "resumed.pt", "ckpt", "resume"), check=True, env=ENV, capture_output=True,
                   timeout=300)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert resumed.keys() == uninterrupted.keys()
    for key in uninterrupted:
        torch.testing.assert_close(resumed[key], uninterrupted[key], rtol=0, atol=0)


# ------------------------------------------------------------------- issue #31, items 14 and 17: federated evaluation
EVAL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from torch.utils.data import TensorDataset
    from helpers import LinearRegression, regression_data
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    out, mode = sys.argv[1], sys.argv[2]


    class Model(LinearRegression):
        calls = 0

        def training_step(self, batch, batch_idx):
            if mode.endswith("hang") and self.trainer.validating:  # personalised evaluation's local steps
                open(out + ".hanging", "w").close()
                time.sleep(1000)
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            Model.calls += 1
            if mode == "validate_signal" and Model.calls == 2:  # call 1: the central batch; 2: the first client
                os.kill(os.getpid(), signal.SIGTERM)
            return super().validation_step(batch, batch_idx)


    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), clients_per_round=2, batch_size=5,
                             partitioner=IIDPartitioner(num_clients=4, seed=0), eval_fraction=0.2,
                             eval_clients_per_round="all", eval_local_steps=1 if mode.endswith("hang") else 0,
                             eval_batch_size=100)
    trainer = FederatedTrainer(max_epochs=2, default_root_dir=out + ".root", logger=False, enable_checkpointing=False,
                               enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                               num_sanity_val_steps=0)
    try:
        if mode == "fit_hang":
            trainer.fit(Model(), datamodule=dm)
        else:
            trainer.validate(Model(), datamodule=dm, verbose=False)
    finally:
        open(out + ".left", "w").write(repr(time.time()))
        if mode == "validate_signal":
            os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM while the process shuts down
            time.sleep(3)
    print("finished")
    """
)


def _run_eval_script(tmp_path: Path, mode: str) -> tuple[int, str, float]:
    """Run the script; in the ``*_hang`` modes send SIGTERM once a client hangs in personalised evaluation.
    Returns (exit status, stderr + stdout, seconds from the SIGTERM to leaving fit/validate)."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_SCRIPT.format(tests=str(Path(__file__).parent)))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(out), mode], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    sent = None
    try:
        if mode.endswith("hang"):
            hanging = Path(str(out) + ".hanging")
            deadline = time.monotonic() + 240
            while not hanging.exists():
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.2)
            sent = time.time()
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = Path(str(out) + ".left")
    delay = float(left.read_text()) - sent if sent is not None and left.exists() else 0.0
    return proc.returncode, stderr.decode() + stdout.decode(), delay


def test_sigterm_during_a_hung_personalized_evaluation_in_fit_stops_at_the_rounds_end(tmp_path):
    """Item 14: a client hung in personalised evaluation (no time limit) does not hold a SIGTERM back: the evaluation
    is abandoned at once (global model restored), the round ends with its checkpoint and the process exits 1."""
    code, output, delay = _run_eval_script(tmp_path, "fit_hang")
    assert code == 1, output
    assert delay < 3.0
    assert "Federated evaluation of round 0 stopped by SIGTERM" in output
    assert "Stopped by SIGTERM after round 0" in output and "finished" not in output
    checkpoint = torch.load(tmp_path / "run.root" / "last.ckpt", weights_only=True)
    assert checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"] == 1


@pytest.mark.parametrize("mode", ["validate_hang", "validate_signal"])
def test_sigterm_during_federated_evaluation_under_validate_exits_1(tmp_path, mode):
    """Item 17: under trainer.validate(), a SIGTERM during federated evaluation (a hung personalisation client, or
    between clients) ends the process with status 1, never 0; a second SIGTERM during shutdown still gives 1."""
    code, output, delay = _run_eval_script(tmp_path, mode)
    assert code == 1, output
    assert delay < 3.0
    assert "Federated evaluation" in output and "stopped by SIGTERM" in output
    assert "finished" not in output


def test_sigterm_with_lightnings_default_model_checkpoint_writes_default_root_dir_last(tmp_path):
    """Issue #32 item 8: checkpointing on (Lightning adds its default ModelCheckpoint) but none given: the stop
    checkpoint goes to the documented ``default_root_dir/last.ckpt``, not ``default_root_dir/checkpoints/``."""
    dm, *_ = _data(val=True)
    root = tmp_path / "root"
    kwargs = quiet_trainer_kwargs(root) | {"enable_checkpointing": True}
    trainer = FederatedTrainer(max_epochs=3, **kwargs)
    with pytest.raises(SIGTERMException, match=f"checkpoint written to {root / 'last.ckpt'}"):
        trainer.fit(SignalsItself("in_round", lr=LR), datamodule=dm)
    assert (root / "last.ckpt").is_file() and not (root / "checkpoints" / "last.ckpt").exists()
    checkpoint = torch.load(root / "last.ckpt", weights_only=True)
    assert checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"] == 1


# ------------------------------------------------------------------------- issue #50 item 5: sweeps that resume
def test_50_stop_checkpoints_of_a_sweep_go_to_each_runs_version_folder_and_resume_there(tmp_path):
    """Two runs started in one folder, each stopped by SIGTERM in round 1: each stop checkpoint lies in its own
    logger's version folder (no shared ``last.ckpt`` to overwrite); resuming run 0 logs into version_0 again, its
    ``metrics.csv`` holding rounds 0, 1, 2 once each."""
    dm, *_ = _data(val=True)
    kwargs = quiet_trainer_kwargs(tmp_path)
    paths = []
    for run in range(2):
        logger = CSVLogger(str(tmp_path))
        trainer = FederatedTrainer(max_epochs=3, **(kwargs | {"logger": logger}))
        with pytest.raises(SIGTERMException) as stop:
            trainer.fit(SignalsItself("in_round", lr=LR), datamodule=dm)
        path = tmp_path / "lightning_logs" / f"version_{run}" / "checkpoints" / "last.ckpt"
        assert f"resume with trainer.fit(..., ckpt_path='{path}')" in str(stop.value)
        paths.append(path)
    assert not (tmp_path / "last.ckpt").exists()
    for path in paths:
        checkpoint = torch.load(path, weights_only=True)
        assert checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"] == 1
    logger = CSVLogger(str(tmp_path))
    trainer = FederatedTrainer(max_epochs=3, **(kwargs | {"logger": logger}))
    trainer.fit(LinearRegression(lr=LR), datamodule=dm, ckpt_path=str(paths[0]))
    assert logger.version == 0 and sorted(os.listdir(tmp_path / "lightning_logs")) == ["version_0", "version_1"]
    rows = list(csv.DictReader(open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")))
    assert [int(r["step"]) for r in rows if r.get("round_clients")] == [0, 1, 2]
    assert trainer.fit_loop.first_round == 1


def test_50_a_logger_elsewhere_does_not_continue_the_version_and_says_why(tmp_path):
    dm, *_ = _data(val=True)
    kwargs = quiet_trainer_kwargs(tmp_path)
    trainer = FederatedTrainer(max_epochs=2, **(kwargs | {"logger": CSVLogger(str(tmp_path / "a"))}))
    with pytest.raises(SIGTERMException):
        trainer.fit(SignalsItself("in_round", lr=LR), datamodule=dm)
    path = tmp_path / "a" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    logger = CSVLogger(str(tmp_path / "b"))
    with pytest.warns(UserWarning, match=r"logs into .*b/lightning_logs/version_0 instead, because its save_dir/name"):
        FederatedTrainer(max_epochs=2, **(kwargs | {"logger": logger})).fit(
            LinearRegression(lr=LR), datamodule=dm, ckpt_path=str(path))
