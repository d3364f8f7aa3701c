"""The ``lightning-fed`` command: LightningCLI with the federated trainer, its own server-optimizer argument and
TensorBoard by default.

Its parts, each in a module of its own (issue #52; every name stays importable from here): the config rewriting as
a config is read (:mod:`lightning_fed.cli_config`), swapping the server optimizer on the command line
(:mod:`lightning_fed.cli_swaps`), the help text (:mod:`lightning_fed.cli_help`), readable errors and ``--verbose``
(:mod:`lightning_fed.cli_errors`) and ``lightning-fed partition`` (:mod:`lightning_fed.cli_partition`).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Any, Optional

import yaml
from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_fed._jsonargparse import ActionTypeHint, previous_config, subcommands_action
from lightning_fed._moved import new_paths
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.cli_config import (  # noqa: F401  (MAX_ALIAS_EXPANSION re-exported)
    _SUBCOMMANDS,
    CLIENT_HALVES_KEY,
    MAX_ALIAS_EXPANSION,
    MAX_CONFIG_BYTES,
    SERVER_OPTIMIZER_KEY,
    _describe,
    _server_optimizer_in_callbacks,
    config_size_problem,
    move_client_halves,
    move_server_optimizer,
    read_new_paths,
)
from lightning_fed.cli_errors import (  # noqa: F401  (VERBOSE_ENV re-exported)
    _INSTANTIATION_ERROR,
    _VERBOSE_HINT,
    EXIT_BAD_ARGUMENT,
    VERBOSE_ENV,
    _import_class,
    _verbose_flag,
    data_not_found_message,
    instantiation_error_message,
    readable_parse_error,
    verbose,
)
from lightning_fed.cli_help import _docstring_summary, _PlainHelpFormatter, first_sentence, plain_text  # noqa: F401
from lightning_fed.cli_partition import PARTITION_USAGE, format_partition_stats, partition_command  # noqa: F401
from lightning_fed.cli_swaps import _carry_client_halves, _class_path_of, _SwapFromDefaults, swap_client_halves
from lightning_fed.errors import DataNotFoundError
from lightning_fed.trainer import FederatedTrainer
from lightning_fed.vectorized import VectorizedExecutor  # noqa: F401 - a --trainer.client_executor class by short name

#: TensorBoard under ./runs unless the config or command line names another logger. ``default_hp_metric`` is off:
#: Lightning's placeholder ``hp_metric`` session would be the first one in the run and hide the federated
#: hyper-parameters the loop logs at fit start (see :mod:`lightning_fed.tensorboard`).
DEFAULT_LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    "init_args": {"save_dir": "runs", "default_hp_metric": False},
}



# ------------------------------------------------------------------------------------------------ help text
class FederatedArgumentParser(LightningArgumentParser):
    """A :class:`~lightning.pytorch.cli.LightningArgumentParser` that applies :func:`move_server_optimizer` to every
    config it reads (files, strings and objects), so configs with the server optimizer in ``trainer.callbacks``
    keep working next to the ``server_optimizer`` argument.

    Example (the parser of :class:`FederatedCLI`): a config with FedYogi in ``trainer.callbacks``, the old way::

        >>> config = ("{trainer: {logger: false, enable_progress_bar: false, "
        ...           "callbacks: [{class_path: lightning_fed.callbacks.FedYogi, init_args: {lr: 0.01}}]}}")
        >>> cli = FederatedCLI(args=["--config", config, "--model", "lightning_fed.models.MNISTMLP",
        ...                          "--data", "lightning_fed.datamodules.MNISTDataModule",
        ...                          "--data.partitioner", "IIDPartitioner", "--data.partitioner.num_clients", "10"],
        ...                    run=False)
        >>> cli.config.server_optimizer.class_path, cli.config.trainer.callbacks
        ('lightning_fed.callbacks.FedYogi', [])
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `--trainer.max_ep 7` must be an error, not `max_epochs` (argparse's prefix matching is off)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _PlainHelpFormatter)
        super().__init__(*args, **kwargs)

    def _create_group_if_requested(self, obj: Any, nested_key: Any, as_group: Any, doc_group: Any, *args: Any,
                                   **kwargs: Any) -> Any:
        """jsonargparse's, with the group's title the first sentence of the class's or method's docstring, as plain
        text, instead of its first line (cut mid-sentence where the docstring wraps)."""
        if as_group:
            doc_group = _docstring_summary(obj, doc_group) or doc_group
        return super()._create_group_if_requested(obj, nested_key, as_group, doc_group, *args, **kwargs)

    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Namespace:
        """jsonargparse's, after the config's bounds (:func:`config_size_problem`: its size checked before it is
        read, its YAML aliases before they are expanded), which exit like a bad argument naming the file."""
        source = f"Config {str(path)!r}"
        try:
            file_name = getattr(path, "absolute", None) or str(path)
            size = os.path.getsize(file_name)
            if size > MAX_CONFIG_BYTES:
                self.error(f"{source} is {size / 2**20:.1f} MiB; the limit is {MAX_CONFIG_BYTES / 2**20:g} MiB "
                           "(MAX_CONFIG_BYTES): a config holds settings, not data.")
            with open(file_name, encoding="utf-8") as fh:
                content = fh.read()
        except (OSError, UnicodeDecodeError):
            content = None  # jsonargparse reports an unreadable config
        if content is not None:
            problem = config_size_problem(content, source)
            if problem is not None:
                self.error(problem)
            self._swap(content, source)
        self._checked_content, self._checked_source = content, source
        try:
            return self._move(super().parse_path(path, *args, **kwargs), source)
        finally:
            self._checked_content = None

    def parse_string(self, content: str, *args: Any, **kwargs: Any) -> Namespace:
        if content != getattr(self, "_checked_content", None):  # not the file parse_path read and checked
            problem = config_size_problem(content, "The config")
            if problem is not None:
                self.error(problem)
            self._swap(content, "The config")
        checked = content == getattr(self, "_checked_content", None)
        content = read_new_paths(content, self._checked_source if checked else "The config")
        return self._move(super().parse_string(content, *args, **kwargs), "The config")

    def _swap(self, content: str, source: str) -> None:
        try:
            self._forget_swapped(new_paths(content)[0], source)
        except ValueError as err:  # a method whose client half needs its server half (swap_client_halves)
            self.error(str(err))
            raise  # pragma: no cover - error() exits or raises unless the parser was told otherwise

    @staticmethod
    def _forget_swapped(content: str, source: str = "The config") -> None:
        """A config read after another (``--config a.yaml --config b.yaml``) that names a different server optimizer
        class starts it from that class's defaults: the earlier server optimizer is dropped from the config being
        built before jsonargparse would carry its same-named settings over (see :class:`_SwapFromDefaults`); the
        client half of a ready-made method it replaces is carried into ``trainer.client_algorithms``, or the swap
        refused (:func:`swap_client_halves`, ``ValueError`` naming ``source``)."""
        previous = previous_config()
        if not isinstance(previous, Namespace):
            return
        try:
            raw = yaml.safe_load(content)
        except yaml.YAMLError:
            return  # jsonargparse reports it
        if not isinstance(raw, dict):
            return
        nodes = [("", raw)] + [(f"{name}.", raw[name]) for name in _SUBCOMMANDS if isinstance(raw.get(name), dict)]
        for prefix, node in nodes:
            named = [node.get(SERVER_OPTIMIZER_KEY)]
            trainer = node.get("trainer")
            if isinstance(trainer, dict) and isinstance(trainer.get("callbacks"), list):
                named += trainer["callbacks"]
            new = next((c for c in map(_class_path_of, named) if c is not None), None)
            old_server = previous.get(prefix + SERVER_OPTIMIZER_KEY)
            old = old_server.get("class_path") if isinstance(old_server, Namespace) else None
            if new is not None and old is not None and new != old:
                short = new.rpartition(".")[2]
                halves = swap_client_halves(old_server, short, f"{source} (server optimizer {short})")
                previous[prefix + SERVER_OPTIMIZER_KEY] = None
                _carry_client_halves(previous, prefix + CLIENT_HALVES_KEY, halves)

    def parse_object(self, obj: Any, *args: Any, **kwargs: Any) -> Namespace:
        return self._move(super().parse_object(obj, *args, **kwargs), "The config")

    def error(self, message: str, ex: Optional[Exception] = None) -> Any:
        """A bad argument: ``error: ...`` in a few lines and exit status 2, without jsonargparse's usage dump; a
        misspelt class or option name names the closest known ones (:func:`readable_parse_error`). With
        ``--verbose`` (or ``LIGHTNING_FED_VERBOSE=1``), or when this parser raises instead of exiting, jsonargparse's
        own handling (usage and the full message)."""
        from lightning_fed._jsonargparse import debug_mode_active, report_error

        if verbose() or not self.exit_on_error or debug_mode_active():
            return super().error(message, ex)
        report_error(self, message)
        parser = getattr(ex, "subcommand_parser", None) or self
        readable = readable_parse_error(message, parser)
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {readable or message}\n")
        sys.stderr.write(f"  (`{prog} --help` lists the options; {_VERBOSE_HINT} shows the parser's full message)\n")
        self.exit(EXIT_BAD_ARGUMENT)

    def _move(self, cfg: Namespace, source: str) -> Namespace:
        try:
            return move_server_optimizer(cfg, source)
        except ValueError as err:
            self.error(str(err))  # usage and message on stderr, exit code 2 (like any bad argument)
            raise  # pragma: no cover - error() exits or raises unless the parser was told otherwise


class FederatedCLI(LightningCLI):
    """``lightning-fed fit --config examples/shakespeare_fedadam.yaml [--server_optimizer FedYogi ...]``.

    A :class:`lightning.pytorch.cli.LightningCLI` whose trainer is :class:`~lightning_fed.FederatedTrainer`
    (``trainer.max_epochs`` counts rounds). ``model`` is any LightningModule and ``data`` any
    :class:`~lightning_fed.datamodules.FederatedDataModule`, each given by ``class_path``/``init_args``. Every
    argument can be overridden on the command line.

    The server optimizer has its own top-level argument, ``server_optimizer``: any
    :class:`~lightning_fed.callbacks.ServerOptimizer` subclass, by short name (``--server_optimizer FedYogi``) or
    class path, with its settings as ``--server_optimizer.lr 0.01``; ``null`` (the default) means
    :class:`~lightning_fed.callbacks.FedAvg` with η = 1. It becomes the first of the trainer's callbacks, so swapping
    it leaves ``trainer.callbacks`` (checkpoints, ...) alone. A different class starts from its own defaults
    (``--server_optimizer FedAvg`` on a FedYogi config gives FedAvg's η = 1, not FedYogi's 0.01), on the command line
    and in a later ``--config`` alike; settings given after it (``--server_optimizer.lr 0.5``, or ``init_args`` in the
    config that names it) apply, and naming the configured class again keeps its settings. A ready-made method's
    own client half outlives the swap (:func:`swap_client_halves`): FedProx's, FedBN's, FedPer's, FedRep's, Ditto's
    and the #55 personalised methods' are carried into ``trainer.client_algorithms``; a swap away from SCAFFOLD,
    FedDyn, FedNova's proximal solver, Fed-LAMB or IFCA (halves that need their server halves) is refused, and
    ``--server_optimizer null`` first drops the configured method whole. Check with
    ``--print_config``. Option names are never abbreviated (``--trainer.max_ep`` is an error). Configs that give the
    server optimizer the old way, in
    ``trainer.callbacks``, still work: it is moved to ``server_optimizer`` as the config is read (``--print_config``
    shows it there). A class named by its path from before a move
    (``lightning_fed.datamodules.cifar.CIFAR10DataModule``, ``lightning_fed._moved``), in a config or on the
    command line, is read as its path now with a ``FutureWarning`` (:func:`read_new_paths`) until 0.3.0.

    ``lightning-fed predict`` runs ``Trainer.predict`` (the global model's ``predict_step``, after ``--ckpt_path``
    restores it) on the data module's ``predict_dataloader``; without one it stops before loading data.

    Errors are short (:meth:`FederatedArgumentParser.error`): ``error: ...`` and one line on how to see more,
    without jsonargparse's usage dump; a misspelt class or option name names the closest known ones
    (:func:`readable_parse_error`). Through :func:`main` (the ``lightning-fed`` command), a value a class refuses in
    ``__init__`` prints that class's own message (:func:`instantiation_error_message`), exit status 2; ``--verbose``
    or ``LIGHTNING_FED_VERBOSE=1`` shows the full parser message or traceback instead.

    Raises:
        SystemExit: (a parser error, exit code 2) a misspelt class or option name, a server optimizer given both as
            ``server_optimizer`` and in ``trainer.callbacks``, two server optimizers in ``trainer.callbacks``, a swap
            that would strand a client half needing its server half (:func:`swap_client_halves`), or
            ``predict`` without a ``predict_dataloader`` on the data module or the model.

    Example: parse and instantiate without running (``run=False``; nothing is read or written)::

        >>> cli = FederatedCLI(args=["--model", "lightning_fed.models.MNISTMLP",
        ...                          "--data", "lightning_fed.datamodules.MNISTDataModule",
        ...                          "--data.partitioner", "IIDPartitioner", "--data.partitioner.num_clients", "10",
        ...                          "--server_optimizer", "FedAdam", "--server_optimizer.lr", "0.03",
        ...                          "--trainer.max_epochs", "3", "--trainer.logger", "false",
        ...                          "--trainer.enable_progress_bar", "false"], run=False)
        >>> type(cli.trainer).__name__, cli.trainer.max_epochs, type(cli.model).__name__, cli.datamodule.partitioner
        ('FederatedTrainer', 3, 'MNISTMLP', IIDPartitioner(num_clients=10, seed=0))
        >>> cli.trainer.callbacks[0]  # the server optimizer comes first
        FedAdam(lr=0.03, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')
    """

    def __init__(self, args: Optional[Any] = None, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)
        kwargs.setdefault("trainer_defaults", {"logger": DEFAULT_LOGGER})
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_class", FederatedArgumentParser)
        argv = sys.argv[1:] if args is None else args
        self._help_of = _help_subcommand(argv)
        if self._help_of is not None:
            # `lightning-fed fit --help`: only that subcommand's parser is built (each takes about a second)
            self.subcommands = lambda: {self._help_of: LightningCLI.subcommands()[self._help_of]}  # type: ignore
        super().__init__(args=args, **kwargs)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        """Lightning's subcommands, then ``partition`` (run by :func:`main` before this parser is built; listed here
        so that ``lightning-fed --help`` names every subcommand)."""
        trainer_class = self.trainer_class if isinstance(self.trainer_class, type) else None
        summaries = {}
        for name in self.subcommands():
            method = getattr(trainer_class, name, None)
            summaries[name] = _docstring_summary(method) if method is not None else None
            if summaries[name]:
                kwargs[name] = {"description": summaries[name], **kwargs.get(name, {})}
        super()._add_subcommands(parser, **kwargs)
        for choice in subcommands_action(parser)._choices_actions:  # `lightning-fed --help`'s list
            if summaries.get(choice.dest):
                choice.help = summaries[choice.dest]
        if self._help_of is not None:
            return  # `lightning-fed fit --help`: no listing of the others
        summary = "Compute and print a data module's partition (client sizes, label counts) without training."
        listing = FederatedArgumentParser(description=f"{summary} Usage: {PARTITION_USAGE}", add_help=False)
        subcommands_action(parser).add_subcommand("partition", listing, help=summary)
        from lightning_fed.report import REPORT_USAGE

        summary = "Final and best metrics of finished runs, mean ± std over seeds, CSV and curves (from their logs)."
        listing = FederatedArgumentParser(description=f"{summary} Usage: {REPORT_USAGE}", add_help=False)
        subcommands_action(parser).add_subcommand("report", listing, help=summary)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_subclass_arguments(
            ServerOptimizer,
            SERVER_OPTIMIZER_KEY,
            required=False,
            fail_untyped=False,
            help="The server optimizer (ServerOpt), e.g. FedAdam; null = FedAvg with lr 1. Replaces a server "
            "optimizer in trainer.callbacks; a different class starts from its own defaults.",
        )
        for action in parser._actions:
            if action.dest == SERVER_OPTIMIZER_KEY and isinstance(action, ActionTypeHint):
                action.__class__ = _SwapFromDefaults

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)) and any(isinstance(a, str) and new_paths(a)[1] for a in argv):
            argv = [read_new_paths(a, "The command line") if isinstance(a, str) else a for a in argv]
            with warnings.catch_warnings():  # sys.argv's arguments, old paths read as the new ones: not a mix-up
                warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
                super().parse_arguments(parser, argv)
        else:
            super().parse_arguments(parser, args)
        # what command-line arguments added after the configs were read: e.g. `--trainer.callbacks+ FedYogi`
        subcommand = self.config.get("subcommand")
        prefix = f"{subcommand}." if subcommand else ""
        callbacks, found = _server_optimizer_in_callbacks(self.config, prefix)
        given = self.config.get(prefix + SERVER_OPTIMIZER_KEY)
        if found and (given is not None or len(found) > 1):
            names = ", ".join(_describe(callbacks[i]) for i in found)
            first = f"`{SERVER_OPTIMIZER_KEY}` ({_describe(given)}) and " if given is not None else ""
            parser.error(
                f"A server optimizer is given more than once: {first}`trainer.callbacks` ({names}). A federated run "
                f"has exactly one: swap it with `--{SERVER_OPTIMIZER_KEY} NAME` (e.g. `--{SERVER_OPTIMIZER_KEY} "
                f"FedYogi --{SERVER_OPTIMIZER_KEY}.lr 0.01`), which keeps the other callbacks."
            )
        move_client_halves(self.config)  # `--server_optimizer.client ...` given on the command line
        self._check_config_callables(parser, prefix)
        self._check_ckpt_path(parser, prefix)
        if subcommand == "predict":
            self._check_predict_source(parser, prefix)

    def _check_config_callables(self, parser: LightningArgumentParser, prefix: str) -> None:
        """Refuse a ``LocalParts`` (or subclass) ``predicate`` in the config that is not a registered name
        (:data:`~lightning_fed.client.personal.PARTS_PREDICATES`): a config must not name an arbitrary importable
        function, or a ``class_path`` of a callable class, to be called (or instantiated) at fit start."""
        from lightning_fed.client.personal import PARTS_PREDICATES, LocalParts

        def walk(value: Any, key: str) -> None:
            if isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    walk(item, f"{key}[{i}]")
                return
            if not isinstance(value, (Namespace, dict)):
                return
            class_path = value.get("class_path")
            init_args = value.get("init_args")
            cls = _import_class(class_path) if isinstance(class_path, str) else None
            if cls is not None and issubclass(cls, LocalParts) and isinstance(init_args, (Namespace, dict)):
                predicate = init_args.get("predicate")
                if predicate is not None and not (isinstance(predicate, str) and predicate in PARTS_PREDICATES):
                    shown = predicate.get("class_path", predicate) if isinstance(predicate, (Namespace, dict)) \
                        else predicate
                    parser.error(
                        f"{key}.init_args.predicate {shown}: {cls.__name__}'s predicate from a config must be a "
                        f"registered name, one of {sorted(PARTS_PREDICATES)} (register others in Python with "
                        "lightning_fed.client.personal.register_parts_predicate, or pass a callable from Python)."
                    )
            items = value.items() if isinstance(value, dict) else vars(value).items()
            for name, item in items:
                walk(item, f"{key}.{name}" if key else name)

        walk(self.config.get(prefix.rstrip(".")) if prefix else self.config, "")

    def _check_ckpt_path(self, parser: LightningArgumentParser, prefix: str) -> None:
        """Refuse a ``--ckpt_path`` that names a local file or folder that does not exist, before any logger folder
        is created (``last``, ``best``, ``hpc``, ``registry...`` and URLs are Lightning's to resolve)."""
        ckpt_path = self.config.get(prefix + "ckpt_path")
        if not isinstance(ckpt_path, (str, os.PathLike)):
            return
        path = os.fspath(ckpt_path)
        if path in ("last", "best", "hpc") or path.startswith("registry") or "://" in path or os.path.exists(path):
            return
        subcommand = self.config.get("subcommand")
        parser = getattr(self, "_subcommand_parsers", {}).get(subcommand, parser)
        parser.error(f"--ckpt_path {path}: no such file or folder (give a checkpoint written by `lightning-fed fit`, "
                     "or 'last' / 'best').")

    def _check_predict_source(self, parser: LightningArgumentParser, prefix: str) -> None:
        """Refuse ``predict`` up front (before any data is read) when nothing defines ``predict_dataloader``."""
        classes = []
        for key, base in (("data", LightningDataModule), ("model", LightningModule)):
            class_path = (self.config.get(prefix + key) or Namespace()).get("class_path")
            if not class_path:
                continue
            module_name, _, name = class_path.rpartition(".")
            cls = getattr(importlib.import_module(module_name), name)
            if is_overridden("predict_dataloader", cls, parent=base):
                return
            classes.append(f"{key} ({name})")
        parser.error(
            "`lightning-fed predict` needs a `predict_dataloader` (the data the global model predicts on), and neither "
            f"the {' nor the '.join(classes) or 'data module nor the model'} defines one: the federated data modules "
            "have none. Subclass the data module and add `predict_dataloader()` (the model's `predict_step` gets its "
            "batches), or evaluate with `lightning-fed test`."
        )

    def instantiate_classes(self) -> None:
        """Lightning's, with any exception it raises marked as a refused value (a class's ``__init__`` refused a
        setting), which :func:`main` prints as :func:`instantiation_error_message`; the exception itself is
        unchanged."""
        try:
            super().instantiate_classes()
        except Exception as err:
            try:
                setattr(err, _INSTANTIATION_ERROR, True)
            except AttributeError:  # pragma: no cover - an exception type with __slots__: shown in full
                pass
            raise

    def after_fit(self) -> None:
        """Close ``lightning-fed fit`` with :func:`run_summary`: rounds trained, last validation metrics, and where
        the logs, metrics, checkpoints and saved config are (``rank_zero_info``, Lightning's console logger)."""
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        rank_zero_info(run_summary(self.trainer))

    def instantiate_trainer(self, **kwargs: Any) -> FederatedTrainer:
        """The trainer, with the ``server_optimizer`` argument as the first callback (none: the trainer's FedAvg)."""
        server = self._get(self.config_init, SERVER_OPTIMIZER_KEY)
        if server is None:
            return super().instantiate_trainer(**kwargs)
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        callbacks = trainer_config.get("callbacks")
        if callbacks is None:
            callbacks = []
        elif not isinstance(callbacks, list):
            callbacks = [callbacks]
        trainer_config["callbacks"] = [server, *callbacks]
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer(trainer_config, extra)


def _help_subcommand(argv: Any) -> Optional[str]:
    """The subcommand whose help ``argv`` asks for (``fit --help``, ``validate -h ...``), else ``None``.

    >>> _help_subcommand(["fit", "--config", "c.yaml", "--help"]), _help_subcommand(["fit", "--config", "c.yaml"])
    ('fit', None)
    """
    if not isinstance(argv, (list, tuple)) or not argv or argv[0] not in _SUBCOMMANDS:
        return None
    return argv[0] if {"-h", "--help"} & set(argv) else None


def run_summary(trainer: Any) -> str:
    """The closing lines of ``lightning-fed fit``: how many rounds were trained, the last validation metrics, and
    where the run's outputs are.

    Rounds are counted from 0 in the TensorBoard step, the progress bar and the messages (round t of Reddi et al.'s
    Alg. 1, ``trainer.current_epoch``); "N rounds trained" is the count, so validation "after 10 rounds" is logged
    at step 9.

    Lines: ``Trained N round(s) (rounds 0..N-1 ...)`` (resumed from a checkpoint of round k: ``Trained N-k round(s)
    in this process (rounds k..N-1), N in total ...``); ``last validation (round t): val_acc 0.454, ...`` (the
    ``val_*`` values of ``trainer.callback_metrics``, 4 significant digits); with federated evaluation, ``last
    federated evaluation, weighted over clients: fed_personal_val_acc 0.61, fed_val_acc 0.45, ...`` (the
    ``fed_*/weighted`` values, ``fed_personal_*`` included, by name, 4 significant digits); one per logger
    (TensorBoard: the run's folder and the ``tensorboard --logdir`` command; CSV: ``metrics.csv`` and
    ``hparams.yaml``; another logger: its ``log_dir``), or ``no logger``; the saved ``config.yaml`` when there is
    one; one per ModelCheckpoint (its folder, the best checkpoint with its monitored score, the last one).
    """
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    rounds = int(trainer.current_epoch)
    first = min(int(getattr(trainer.fit_loop, "first_round", 0)), rounds)
    if first:  # resumed: this process trained rounds first..rounds-1
        done = f"rounds {first}..{rounds - 1}" if rounds > first else "no round"
        lines = [f"Trained {rounds - first} round(s) in this process ({done}), {rounds} in total (the TensorBoard "
                 "step and the progress bar count rounds from 0)."]
    else:
        last = f"rounds 0..{rounds - 1}" if rounds else "no round"
        lines = [f"Trained {rounds} round(s) ({last}; the TensorBoard step and the progress bar count rounds from 0)."]
    val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    if val:
        lines.append(f"  last validation (round {rounds - 1}): " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(val.items())))
    fed = {k[: -len("/weighted")]: float(v) for k, v in trainer.callback_metrics.items()
           if k.startswith("fed_") and k.endswith("/weighted")}
    if fed:
        lines.append("  last federated evaluation, weighted over clients: "
                     + ", ".join(f"{k} {v:.4g}" for k, v in sorted(fed.items())))
    config_dirs = []
    for logger in trainer.loggers:
        log_dir = getattr(logger, "log_dir", None) or logger.save_dir
        config_dirs.append(log_dir)
        if isinstance(logger, TensorBoardLogger):
            lines.append(f"  logs and metrics (TensorBoard): {log_dir}  -> tensorboard --logdir {logger.save_dir}")
        elif isinstance(logger, CSVLogger):
            lines.append(f"  metrics (CSV): {os.path.join(log_dir, 'metrics.csv')}; settings: "
                         f"{os.path.join(log_dir, 'hparams.yaml')}")
        else:
            lines.append(f"  logs ({type(logger).__name__}): {log_dir}")
    if not trainer.loggers:
        lines.append("  no logger (trainer.logger is false): no metrics were written")
    for folder in dict.fromkeys([*config_dirs, trainer.default_root_dir]):
        if folder and os.path.isfile(os.path.join(folder, "config.yaml")):
            lines.append(f"  config: {os.path.join(folder, 'config.yaml')}")
            break
    for callback in trainer.checkpoint_callbacks:
        parts = [f"  checkpoints: {callback.dirpath}"]
        if callback.best_model_path and callback.monitor:
            score = callback.best_model_score
            parts.append(f"best ({callback.monitor} {float(score):.4g}): {callback.best_model_path}")
        if callback.last_model_path:
            parts.append(f"last: {callback.last_model_path}")
        elif callback.best_model_path and not callback.monitor:
            parts.append(f"latest: {callback.best_model_path}")
        lines.append(parts[0] + (" (" + "; ".join(parts[1:]) + ")" if len(parts) > 1 else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ readable errors
def main(args: Optional[Any] = None) -> None:
    """Entry point of the ``lightning-fed`` console script (``partition`` is handled by :func:`partition_command`,
    ``report`` by :func:`lightning_fed.report.report_command`, the other subcommands by :class:`FederatedCLI`).

    Exit status 2 (:data:`EXIT_BAD_ARGUMENT`) for a bad argument: a parse error, or a value a class refused in its
    ``__init__`` while the config was instantiated, printed as :func:`instantiation_error_message` (two lines). With
    ``--verbose`` anywhere on the command line (removed before parsing; ``validate``/``test``'s own
    ``--verbose true|false`` stays) or ``LIGHTNING_FED_VERBOSE=1``: the full parser message with the usage, or the
    exception itself with its traceback (exit status 1). An error raised by the run itself (after instantiation) is
    never shortened, except a task's data that is not there (:class:`~lightning_fed.errors.DataNotFoundError`):
    ``error: <message>`` (:func:`data_not_found_message`), exit status 2, the traceback with ``--verbose``.
    """
    argv = sys.argv[1:] if args is None else args
    given_verbose = False
    if isinstance(argv, (list, tuple)) and "--verbose" in argv:
        argv, given_verbose = _take_verbose(list(argv))
        args = argv
    token = _verbose_flag.set(given_verbose or _verbose_flag.get())
    try:
        if isinstance(argv, (list, tuple)) and argv and argv[0] == "partition":
            partition_command(list(argv[1:]))
            return
        if isinstance(argv, (list, tuple)) and argv and argv[0] == "report":
            from lightning_fed.report import report_command

            report_command(list(argv[1:]))
            return
        if isinstance(argv, (list, tuple)) and argv and argv[0] in _SUBCOMMANDS and not {"-h", "--help"} & set(argv):
            print(thread_note(), file=sys.stderr)
        import warnings

        with warnings.catch_warnings():  # `--verbose` removed from sys.argv's arguments: not a mix-up
            warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
            FederatedCLI(args=args)
    except Exception as err:
        if not verbose() and isinstance(err, DataNotFoundError):
            print(data_not_found_message(err), file=sys.stderr)
            raise SystemExit(EXIT_BAD_ARGUMENT) from None
        if verbose() or not getattr(err, _INSTANTIATION_ERROR, False):
            raise
        print(instantiation_error_message(err), file=sys.stderr)
        raise SystemExit(EXIT_BAD_ARGUMENT) from None
    finally:
        _verbose_flag.reset(token)


def _take_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without the ``--verbose`` switch, and whether it was given. ``--verbose true|false`` after
    ``validate`` or ``test`` is those subcommands' own argument (Lightning's: print the results) and stays.

    >>> _take_verbose(["fit", "--verbose", "--config", "c.yaml"])
    (['fit', '--config', 'c.yaml'], True)
    >>> _take_verbose(["test", "--verbose", "false"])
    (['test', '--verbose', 'false'], False)
    """
    out, given = [], False
    own = bool(argv) and argv[0] in ("validate", "test")
    for i, arg in enumerate(argv):
        following = argv[i + 1].lower() if i + 1 < len(argv) else ""
        if arg == "--verbose" and not (own and following in ("true", "false")):
            given = True
            continue
        out.append(arg)
    return out, given


def thread_note() -> str:
    """One line saying how many threads torch computes with and where that number came from (printed by
    ``lightning-fed fit`` and the other training subcommands at start).

    torch runs one thread per core by default; with other work on the same cores (two runs at once, a test suite)
    that oversubscribes them and rounds take 10-30x longer. ``OMP_NUM_THREADS=1`` before the command avoids it.

    >>> thread_note().startswith("torch threads: ")
    True
    """
    import os

    import torch

    given = os.environ.get("OMP_NUM_THREADS")
    source = f"OMP_NUM_THREADS={given}" if given else (
        f"torch's default for {os.cpu_count()} cores; with other work on these cores set OMP_NUM_THREADS=1"
    )
    return f"torch threads: {torch.get_num_threads()} ({source})"


if __name__ == "__main__":  # pragma: no cover
    main()
