"""Errors a person can read on the lightning-fed command line (issue #43): a value a class refuses in `__init__`
prints the class's own message in two lines (no jsonargparse traceback, no `Namespace(...)` dump); a misspelt class
or option name names the closest known ones instead of a usage dump; `--verbose` / LIGHTNING_FED_VERBOSE=1 show
everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_fed.cli import EXIT_BAD_ARGUMENT, VERBOSE_ENV, main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FMNIST_FEDYOGI = EXAMPLES / "fashion_mnist_hybrid_plus_fedyogi.yaml"  # FedYogi, DirichletPartitioner(100, α 0.1)


def _fail(args, capsys) -> list[str]:
    """Run `lightning-fed fit --config FMNIST_FEDYOGI *args` in-process; its stderr lines (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(FMNIST_FEDYOGI), *args])
    assert exit_info.value.code == EXIT_BAD_ARGUMENT == 2
    return capsys.readouterr().err.splitlines()


def _error_lines(lines: list[str]) -> list[str]:
    """From the first `error:` line on (before it: the torch threads line, Lightning's "Seed set to 0")."""
    first = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    return lines[first:]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(VERBOSE_ENV, raising=False)


@pytest.mark.parametrize("args, first_line", [
    (["--server_optimizer.lr", "-1"], "error: FedYogi(lr=-1.0): `lr` must be a finite number > 0, got -1.0."),
    (["--data.partitioner.num_clients", "0"],
     "error: DirichletPartitioner(num_clients=0): `num_clients` must be an integer >= 1, got 0."),
    (["--data.partitioner.alpha", "-1"], "error: DirichletPartitioner(alpha=-1): `alpha` must be a finite number > 0"),
    (["--trainer.accelerator", "gpux"],
     "error: FederatedTrainer(accelerator='gpux'): You selected an invalid accelerator name"),
], ids=["server_lr", "num_clients", "dirichlet_alpha", "trainer_accelerator"])
def test_a_value_refused_in_init_prints_the_class_message_first(args, first_line, capsys):
    """Before: a 60-114 line jsonargparse traceback ending in a `Namespace(...)` dump, the class's sentence in the
    middle (exit status 1)."""
    lines = _fail(args, capsys)
    assert len(lines) <= 5, lines
    error = _error_lines(lines)
    assert error[0].startswith(first_line), error
    assert len(error) == 2 and "--verbose" in error[1] and VERBOSE_ENV in error[1]
    text = "\n".join(lines)
    assert "Namespace(" not in text and "Traceback" not in text and "Union subtypes" not in text


def test_verbose_shows_the_full_traceback(capsys, monkeypatch):
    """`--verbose` anywhere on the command line, or LIGHTNING_FED_VERBOSE=1: the exception itself (jsonargparse's
    report, the class's exception as its cause)."""
    with pytest.raises(ValueError, match="Union subtypes") as info:
        main(["fit", "--verbose", "--config", str(FMNIST_FEDYOGI), "--server_optimizer.lr", "-1"])
    assert "`lr` must be a finite number > 0" in str(info.value.__cause__)
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with pytest.raises(ValueError, match="Union subtypes"):
        main(["fit", "--config", str(FMNIST_FEDYOGI), "--server_optimizer.lr", "-1"])


@pytest.mark.parametrize("args, expected", [
    (["--server_optimizer", "FedYogy"],
     "error: --server_optimizer FedYogy: no class of that name (a ServerOptimizer). Did you mean FedYogi"),
    (["--server_optimizer", "lightning_fed.callbacks.FedYogy"], "Did you mean FedYogi"),
    (["--data", "FashionMNISTDataModul"], "error: --data FashionMNISTDataModul: no class of that name "
                                          "(a LightningDataModule). Did you mean FashionMNISTDataModule"),
    (["--model", "FedAwareCN"], "error: --model FedAwareCN: no class of that name (a LightningModule). Did you "
                                "mean FedAwareCNN"),
    (["--data.partitioner", "DirichletPartitoner"],
     "error: --data.partitioner DirichletPartitoner: no class of that name (a Partitioner). Did you mean "
     "DirichletPartitioner"),
    (["--trainer.callbacks+", "ModelCheckpiont"], "Did you mean ModelCheckpoint"),
    (["--trainer.max_epoch", "3"], "error: --trainer.max_epoch: no such option. Did you mean --trainer.max_epochs"),
    (["--server_optimizer.lrr", "3"],
     "error: --server_optimizer.lrr: FedYogi has no argument 'lrr'. Did you mean --server_optimizer.lr?"),
    (["--data.partitioner.alph", "3"], "Did you mean --data.partitioner.alpha?"),
    (["--data.clients_per_roun", "3"], "Did you mean --data.clients_per_round"),
], ids=["server_optimizer", "class_path", "data", "model", "partitioner", "callback", "trainer_option",
        "server_option", "partitioner_option", "data_option"])
def test_a_misspelt_name_gets_the_closest_known_names(args, expected, capsys):
    """Before: a 60-line usage dump and "Expected a path but FedYogy either not accessible or invalid", no
    suggestion."""
    lines = _fail(args, capsys)
    assert len(lines) <= 4, lines
    error = _error_lines(lines)
    assert expected in error[0], error
    assert len(error) == 2 and "--help" in error[1] and "--verbose" in error[1]
    assert not any(line.startswith("usage:") for line in lines)


@pytest.mark.parametrize("args, expected", [
    (["--trainer.max_epochs", "abc"], "error: --trainer.max_epochs abc: expected int or null."),
    (["--server_optimizer.lr", "abc"], "error: --server_optimizer.lr abc: expected float."),
    (["--data.clients_per_round", "x"], "error: --data.clients_per_round x: expected int."),
], ids=["trainer", "server_optimizer", "data"])
def test_a_value_of_the_wrong_type_names_the_expected_type(args, expected, capsys):
    """Before: a usage dump and jsonargparse's 10-line union report."""
    lines = _fail(args, capsys)
    assert len(lines) <= 4 and _error_lines(lines)[0] == expected, lines


def test_settings_before_their_class_say_to_name_the_class_first(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--data.clients_per_round", "3"])
    error = _error_lines(capsys.readouterr().err.splitlines())
    assert error[0] == ("error: --data.clients_per_round: no --data class given before its settings; name one first "
                        "(--data NAME --data.clients_per_round ..., or class_path in a config).")


def test_a_misspelt_config_key_gets_the_closest_settings(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("trainer:\n  max_epoch: 3\n")
    error = _error_lines(_fail(["--config", str(tmp_path / "bad.yaml")], capsys))
    assert error[0] == ("error: trainer.max_epoch (in a config): no such setting. Did you mean trainer.max_epochs, "
                        "trainer.min_epochs or trainer.max_steps?")


def test_verbose_parse_error_shows_the_usage_and_the_full_message(capsys):
    lines = _fail(["--verbose", "--server_optimizer", "FedYogy"], capsys)
    assert any(line.startswith("usage:") for line in lines)
    assert any("Expected a path but FedYogy either not accessible or invalid" in line for line in lines)


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict", "fit"])
def test_a_missing_checkpoint_is_refused_before_any_log_folder_exists(subcommand, tmp_path, capsys):
    """Before: `lightning-fed validate --ckpt_path does/not/exist.ckpt` ended in Lightning's traceback and left an
    empty runs/lightning_logs/version_0 behind (an events file and config.yaml)."""
    from tests.test_cli import _mnist_config

    config = _mnist_config(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, "--config", str(config), "--ckpt_path", "does/not/exist.ckpt"])
    assert exit_info.value.code == 2
    error = _error_lines(capsys.readouterr().err.splitlines())
    assert error[0].startswith("error: --ckpt_path does/not/exist.ckpt: no such file or folder") and len(error) == 2
    assert f"{subcommand} --help" in error[1]
    assert not (tmp_path / "runs").exists()


def test_validate_and_test_keep_their_own_verbose_argument(tmp_path, capsys):
    """`--verbose true|false` after `validate` / `test` is Lightning's argument (print the results), not the switch."""
    from tests.test_cli import _mnist_config

    config = _mnist_config(tmp_path)
    for subcommand in ("validate", "test"):
        with pytest.raises(SystemExit):
            main([subcommand, "--config", str(config), "--verbose", "false", "--ckpt_path", "missing.ckpt"])
        error = _error_lines(capsys.readouterr().err.splitlines())
        assert error[0].startswith("error: --ckpt_path missing.ckpt: no such file") and len(error) == 2


# ------------------------------------------------------------------------------------------------ help text
def _help(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--help"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_help_is_plain_text_in_whole_sentences(subcommand, capsys):
    """Before: `fit --help` showed raw Sphinx markup (:meth:`...`, :class:`~...`, ``literal``) and titles cut where
    the docstring's first line wraps (":meth:`lightning.Trainer.fit` (the same arguments). When it raises before
    its first round finished, the")."""
    import re

    out = _help([subcommand], capsys)
    assert not re.search(r":(class|meth|func|attr|mod|data|exc|obj):`", out), "Sphinx role in the help"
    assert "``" not in out
    headings = [line for line in out.splitlines() if line and not line.startswith((" ", "usage:"))]
    assert "A lightning.Trainer that installs FederatedFitLoop:" in headings
    assert "LightningModule:" in headings  # not "<class 'lightning.pytorch.core.module.LightningModule'>:"
    for heading in headings:
        assert not re.search(r"\b(the|a|an|of|to|and|or|its|with|that|when|before)\s*:?$", heading), heading
    described = " ".join(out.split("options:", 1)[0].split("\n\n", 1)[1].split())  # the text after the usage
    assert described.endswith(".") and "lightning.Trainer." + subcommand in described
    if subcommand == "fit":
        assert described == "Train the global model, one round per epoch: lightning.Trainer.fit (the same arguments)."
    assert "How the cohort is trained: a ClientExecutor, or \"sequential\"" in " ".join(out.split())


def test_the_subcommand_list_is_plain_text(capsys):
    out = " ".join(_help([], capsys).split())
    assert "fit Train the global model, one round per epoch: lightning.Trainer.fit (the same arguments)." in out
    assert "validate Validate the global model: lightning.Trainer.validate" in out
    assert ":meth:" not in out


def test_subcommand_help_builds_only_its_own_parser_and_imports_no_report(monkeypatch, capsys):
    """`lightning-fed fit --help` took 7 s on a quiet machine (#50): Lightning built the parsers of all four
    subcommands (about a second each under load) and the CLI imported `lightning_fed.report` for the subcommand
    list. Now only `fit`'s parser is built and the report module is not imported (its entry in sys.modules is None
    here, so importing it raises); the help still lists the options and the known classes."""
    import sys

    from lightning.pytorch.cli import LightningCLI

    from lightning_fed.cli import main

    built = []
    prepare = LightningCLI._prepare_subcommand_parser

    def spy(self, klass, subcommand, **kwargs):
        built.append(subcommand)
        return prepare(self, klass, subcommand, **kwargs)

    monkeypatch.setattr(LightningCLI, "_prepare_subcommand_parser", spy)
    monkeypatch.setitem(sys.modules, "lightning_fed.report", None)
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert exit.value.code in (0, None) and built == ["fit"]
    assert "--server_optimizer" in out and "lightning_fed.VectorizedExecutor" in out
    assert "lightning_fed.datamodules.FashionMNISTDataModule" in out


# ------------------------------------------------------------------------------------------------ Optional options
def _wrong_value(annotation) -> "str | None":
    """A command-line value no member of the ``Optional``/``Union`` type ``annotation`` takes, by Python's rules
    (``None``: the union takes any value: ``Any``, or ``os.PathLike``, which jsonargparse takes as a path)."""
    import collections.abc
    import os
    import typing

    members = [m for m in typing.get_args(annotation) if m is not type(None)]
    if any(m is typing.Any or m is os.PathLike for m in members):
        return None
    origins = [typing.get_origin(m) or m for m in members]
    takes_str = any(o is str or (isinstance(o, type) and o.__module__.startswith("lightning_fed")) for o in origins)
    if not takes_str:
        return "abc"  # a string, and no class name of a class-typed member
    if not any(o in (list, tuple, collections.abc.Sequence) for o in origins):
        return "[1, 2]"
    return None


def _union_options(task: str) -> dict[str, "str"]:
    """``{option: wrong value}`` for each ``Optional``/``Union`` argument of ``task`` (its own and those it passes to
    FederatedDataModule through ``**kwargs``, as jsonargparse resolves them) that some value can be wrong for."""
    import types
    import typing

    from jsonargparse._parameter_resolvers import get_signature_parameters

    import lightning_fed.datamodules as dms

    out = {}
    for param in get_signature_parameters(getattr(dms, task)):
        if typing.get_origin(param.annotation) in (typing.Union, types.UnionType):
            wrong = _wrong_value(param.annotation)
            if wrong is not None:
                out[param.name] = wrong
    return out


def test_every_task_data_module_is_covered_by_the_union_option_check():
    import inspect

    import lightning_fed.datamodules.tasks as tasks
    from lightning_fed.datamodules import FederatedDataModule
    from tests.test_cli_data_options import TASKS

    found = {name for name, obj in vars(tasks).items()
             if inspect.isclass(obj) and issubclass(obj, FederatedDataModule) and obj is not FederatedDataModule}
    assert found and found <= set(TASKS)


@pytest.fixture(scope="module")
def fit_parser():
    """The parser `lightning-fed fit` parses with (built once: parsing one command line takes ~0.06 s, building the
    parser ~1 s)."""
    import warnings

    from lightning_fed.cli import FederatedCLI
    from tests.test_cli_data_options import EXAMPLES as TASK_EXAMPLES

    with warnings.catch_warnings():  # args given while pytest's own are in sys.argv: not a mix-up
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
        config = str(TASK_EXAMPLES / "fashion_mnist_hybrid_fedavg.yaml")
        return FederatedCLI(args=["--config", config], run=False).parser


@pytest.mark.parametrize("task", ["ShakespeareDataModule", "StackOverflowNWPDataModule", "StackOverflowTagDataModule",
                                  "EMNISTDataModule", "CIFAR10DataModule", "CIFAR100DataModule", "MNISTDataModule",
                                  "FashionMNISTDataModule"])
def test_a_wrong_type_for_an_optional_option_is_one_line_naming_the_class(task, fit_parser, capsys):
    """Before (#49): `--data.eval_fraction abc` (an Optional[float]) printed jsonargparse's 17-line nested "Does not
    validate against any of the Union subtypes" dump with `NestedArg(...)`, where `--trainer.max_epochs abc` gave
    one line. Now every Optional/Union option of every task (read from the signatures) gives `error:
    <Task>(<option>=<value>): expected ... (--data.<option>).`"""
    from tests.test_cli_data_options import EXAMPLES as TASK_EXAMPLES
    from tests.test_cli_data_options import TASKS

    options = _union_options(task)
    assert {"eval_fraction", "labels", "eval_clients_per_round", "local_work", "batch_columns"} <= set(options)
    capsys.readouterr()
    errors = {}
    for name, value in options.items():
        with pytest.raises(SystemExit) as exit_info:
            fit_parser.parse_args(["--config", str(TASK_EXAMPLES / TASKS[task]), f"--data.{name}", value])
        assert exit_info.value.code == EXIT_BAD_ARGUMENT
        lines = capsys.readouterr().err.splitlines()
        error = _error_lines(lines)
        shown = repr(value) if value == "abc" else value
        assert error[0].startswith(f"error: {task}({name}={shown}): expected "), (name, error)
        assert error[0].endswith(f" or null (--data.{name}).") and len(error) == 2, (name, error)
        assert "NestedArg" not in "\n".join(lines) and "Union subtypes" not in "\n".join(lines)
        errors[name] = error[0]
    expected = {"eval_fraction": "expected float or null", "labels": "expected a list of int or null",
                "eval_clients_per_round": "expected int or str or null",
                "local_work": "expected a LocalWork (a class name, or class_path and init_args) or null"}
    for name, text in expected.items():
        assert errors[name].endswith(f"): {text} (--data.{name})."), errors[name]


def test_a_wrong_type_for_an_optional_option_on_the_command_line(capsys):
    """The issue's command, end to end through `lightning-fed fit`."""
    error = _error_lines(_fail(["--data.eval_fraction", "abc"], capsys))
    assert error[0] == "error: FashionMNISTDataModule(eval_fraction='abc'): expected float or null (--data.eval_fraction)."
    assert len(error) == 2 and "--verbose" in error[1]


# ------------------------------------------------------------------------------------------------ bounded configs
def _alias_bomb(levels: int) -> str:
    """The "billion laughs" YAML: level 0 a list of 9 strings, each next level a list of 9 aliases of the previous
    (9**levels strings when expanded, in levels lines)."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 9)}]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_49_a_yaml_alias_bomb_is_refused_before_it_is_expanded(tmp_path, capsys):
    """Before: the 10-line bomb (9**9 ≈ 3.9e8 strings expanded) made `lightning-fed fit --config bomb.yaml` grow
    until a MemoryError (6 GB in 85 s here). Now refused in one line naming the file and the limit; the 10-line
    bomb's check is quick (the composed graph shares each alias: ~100 nodes walked)."""
    import time

    from lightning_fed.cli import MAX_ALIAS_EXPANSION, config_size_problem

    bomb = _alias_bomb(10)
    assert len(bomb.splitlines()) == 10
    start = time.perf_counter()
    problem = config_size_problem(bomb, "Config 'bomb.yaml'")
    assert time.perf_counter() - start < 1.0
    assert problem == (f"Config 'bomb.yaml': its YAML aliases expand to more than {MAX_ALIAS_EXPANSION} nodes (the "
                       "limit, MAX_ALIAS_EXPANSION); refusing to expand them.")
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(7))  # 9**7 ≈ 4.8e6 strings: enough for the limit, small enough to fail fast before
    error = _error_lines(_fail(["--config", str(path)], capsys))
    assert error[0] == f"error: Config {str(path)!r}: its YAML aliases expand to more than 100000 nodes (the limit, " \
                       "MAX_ALIAS_EXPANSION); refusing to expand them." and len(error) == 2


def test_49_a_config_larger_than_the_limit_is_refused_naming_the_file(tmp_path, capsys):
    from lightning_fed.cli import MAX_CONFIG_BYTES

    path = tmp_path / "huge.yaml"
    path.write_text("trainer:\n  max_epochs: 1\n" + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    size_mib = path.stat().st_size / 2**20
    error = _error_lines(_fail(["--config", str(path)], capsys))
    assert error[0] == (f"error: Config {str(path)!r} is {size_mib:.1f} MiB; the limit is 8 MiB (MAX_CONFIG_BYTES): a "
                        "config holds settings, not data.") and len(error) == 2


def test_49_aliases_for_shared_settings_still_work(tmp_path):
    """A config that shares a value through an anchor (a few nodes added) is read as before."""
    import warnings

    from lightning_fed.cli import FederatedCLI

    extra = tmp_path / "shared.yaml"
    extra.write_text("data:\n  init_args:\n    batch_size: &bs 16\n    eval_batch_size: *bs\n")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
        cli = FederatedCLI(args=["--config", str(FMNIST_FEDYOGI), "--config", str(extra),
                                 "--trainer.logger", "false"], run=False)
    assert (cli.datamodule.batch_size, cli.datamodule.eval_batch_size) == (16, 16)


# ------------------------------------------------------------------------------------------------ callables in configs
def _local_parts_config(tmp_path, predicate: str):
    path = tmp_path / "parts.yaml"
    path.write_text("trainer:\n  client_algorithms:\n    - class_path: lightning_fed.client.personal.LocalParts\n"
                    f"      init_args:\n        predicate: {predicate}\n")
    return path


def test_49_a_config_may_name_only_a_registered_local_parts_predicate(tmp_path, capsys):
    """Before: `predicate: os.system` was imported by jsonargparse and handed to LocalParts, to be called at fit
    start with every parameter's name: any importable function could be named. Now refused at parse time naming
    the argument and the registered names; a registered name is instantiated as its function."""
    import warnings

    from lightning_fed.cli import FederatedCLI
    from lightning_fed.client.personal import bias_tensors

    error = _error_lines(_fail(["--config", str(_local_parts_config(tmp_path, "os.system"))], capsys))
    assert error[0] == ("error: trainer.client_algorithms[0].init_args.predicate os.system: LocalParts's predicate "
                        "from a config must be a registered name, one of ['bias_tensors', 'vector_tensors'] "
                        "(register others in Python with lightning_fed.client.personal.register_parts_predicate, or "
                        "pass a callable from Python).") and len(error) == 2
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
        cli = FederatedCLI(args=["--config", str(FMNIST_FEDYOGI), "--config",
                                 str(_local_parts_config(tmp_path, "bias_tensors")), "--trainer.logger", "false"],
                           run=False)
    (half,) = cli.trainer.client_algorithms
    assert type(half).__name__ == "LocalParts" and half.predicate is bias_tensors


# ------------------------------------------------------------------------------------------------ missing data
def _no_data_args(tmp_path) -> list[str]:
    """Fashion-MNIST from an empty data folder, no Debian copy, no download."""
    (tmp_path / "no_debian").mkdir()
    return ["--data.data_dir", str(tmp_path / "data"), "--data.debian_dir", str(tmp_path / "no_debian"),
            "--data.download", "false", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


@pytest.mark.parametrize("command", ["fit", "partition"])
def test_missing_task_data_is_one_error_line_saying_how_to_get_it(command, tmp_path, capsys):
    """Before: a 22-line traceback (exit status 1) before the message saying what to do. Now `error: <message>`,
    one line on how to see the traceback, exit status 2."""
    from lightning_fed.datamodules.tasks.fashion_mnist import DEBIAN_FASHION_MNIST_DIR

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--config", str(FMNIST_FEDYOGI), *_no_data_args(tmp_path)])
    assert exit_info.value.code == EXIT_BAD_ARGUMENT == 2
    text = capsys.readouterr().err
    error = _error_lines(text.splitlines())
    missing = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte"]
    assert error[0] == (
        f"error: Fashion-MNIST not found: {tmp_path / 'data' / 'FashionMNIST' / 'raw'} lacks {missing}, and "
        f"debian_dir={str(tmp_path / 'no_debian')!r} does not hold the four *-ubyte.gz files. Get it offline with "
        f"`apt-get install -y dataset-fashion-mnist` (Debian/Ubuntu; installs the IDX .gz files into "
        f"{DEBIAN_FASHION_MNIST_DIR}), point `debian_dir` at a folder "
        "holding {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz, or pass download=True to let torchvision "
        "download it (needs internet)."
    ), error
    assert len(error) == 2 and "--verbose" in error[1] and VERBOSE_ENV in error[1]
    assert "Traceback" not in text


def test_missing_task_data_with_verbose_raises_with_its_traceback(tmp_path):
    from lightning_fed.errors import DataNotFoundError

    with pytest.raises(DataNotFoundError, match="Fashion-MNIST not found") as info:
        main(["fit", "--verbose", "--config", str(FMNIST_FEDYOGI), *_no_data_args(tmp_path)])
    assert isinstance(info.value, FileNotFoundError) and info.value.__traceback__ is not None
