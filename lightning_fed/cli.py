"""The ``lightning-fed`` command: LightningCLI with the federated trainer, its own server-optimizer argument and
TensorBoard by default."""

from __future__ import annotations

import importlib
from typing import Any, Optional

from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.trainer import FederatedTrainer

#: TensorBoard under ./runs unless the config or command line names another logger. ``default_hp_metric`` is off:
#: Lightning's placeholder ``hp_metric`` session would be the first one in the run and hide the federated
#: hyper-parameters the loop logs at fit start (see :mod:`lightning_fed.tensorboard`).
DEFAULT_LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    "init_args": {"save_dir": "runs", "default_hp_metric": False},
}

#: The top-level argument holding the server optimizer.
SERVER_OPTIMIZER_KEY = "server_optimizer"

_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _is_server_optimizer(callback: Any) -> bool:
    """Whether a parsed ``trainer.callbacks`` entry (an instance, or a ``class_path`` namespace/dict) is a
    :class:`ServerOptimizer`. A class path that does not import is not one (jsonargparse reports it)."""
    if isinstance(callback, ServerOptimizer):
        return True
    if isinstance(callback, (Namespace, dict)):
        class_path = callback.get("class_path")
        if isinstance(class_path, str) and "." in class_path:
            module_name, _, name = class_path.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module_name), name)
            except (ImportError, AttributeError):
                return False
            return isinstance(cls, type) and issubclass(cls, ServerOptimizer)
    return False


def _describe(value: Any) -> str:
    if isinstance(value, (Namespace, dict)):
        return str(value.get("class_path", value))
    return type(value).__name__


def _server_optimizer_in_callbacks(cfg: Namespace, prefix: str) -> tuple[list[Any], list[int]]:
    """The ``trainer.callbacks`` list under ``prefix`` and the positions of its server optimizers."""
    callbacks = cfg.get(prefix + "trainer.callbacks")
    if callbacks is None:
        return [], []
    callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
    return callbacks, [i for i, cb in enumerate(callbacks) if _is_server_optimizer(cb)]


def _prefixes(cfg: Namespace) -> list[str]:
    """``""`` for a subcommand's config, ``"fit."`` etc. for the root parser's config."""
    return [""] + [f"{name}." for name in _SUBCOMMANDS if isinstance(cfg.get(name), Namespace)]


def move_server_optimizer(cfg: Namespace, source: str = "the config") -> Namespace:
    """Move a server optimizer given the old way, inside ``trainer.callbacks``, to ``server_optimizer`` (in place).

    Called on every config file/string as it is read, before later command-line arguments apply, so
    ``--config old.yaml --server_optimizer FedYogi`` swaps the optimizer and ``--server_optimizer.lr 0.01``
    changes the configured one's learning rate; the other callbacks stay in ``trainer.callbacks`` in order.

    Raises:
        ValueError: ``source`` gives more than one server optimizer in ``trainer.callbacks``, or gives one there
            and another as ``server_optimizer``.
    """
    for prefix in _prefixes(cfg):
        callbacks, found = _server_optimizer_in_callbacks(cfg, prefix)
        if not found:
            continue
        names = ", ".join(_describe(callbacks[i]) for i in found)
        if len(found) > 1:
            raise ValueError(
                f"{source} gives {len(found)} server optimizers in `{prefix}trainer.callbacks` ({names}); a federated "
                f"run has exactly one: give it as `{prefix}{SERVER_OPTIMIZER_KEY}`."
            )
        existing = cfg.get(prefix + SERVER_OPTIMIZER_KEY)
        if existing is not None:
            raise ValueError(
                f"{source} gives a server optimizer both as `{prefix}{SERVER_OPTIMIZER_KEY}` ({_describe(existing)}) "
                f"and in `{prefix}trainer.callbacks` ({names}); give exactly one, preferably `{SERVER_OPTIMIZER_KEY}`."
            )
        cfg[prefix + SERVER_OPTIMIZER_KEY] = callbacks.pop(found[0])
        cfg[prefix + "trainer.callbacks"] = callbacks
    return cfg


class FederatedArgumentParser(LightningArgumentParser):
    """A :class:`~lightning.pytorch.cli.LightningArgumentParser` that applies :func:`move_server_optimizer` to every
    config it reads (files, strings and objects), so configs with the server optimizer in ``trainer.callbacks``
    keep working next to the ``server_optimizer`` argument."""

    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Namespace:
        return self._move(super().parse_path(path, *args, **kwargs), f"Config {str(path)!r}")

    def parse_string(self, content: str, *args: Any, **kwargs: Any) -> Namespace:
        return self._move(super().parse_string(content, *args, **kwargs), "The config")

    def parse_object(self, obj: Any, *args: Any, **kwargs: Any) -> Namespace:
        return self._move(super().parse_object(obj, *args, **kwargs), "The config")

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
    it leaves ``trainer.callbacks`` (checkpoints, ...) alone. Replacing the class keeps the settings of the same name
    (jsonargparse's rule: ``--server_optimizer FedYogi`` on a FedAdam config keeps its lr, β₁, β₂ and τ; the others
    take FedYogi's defaults): give them explicitly, and check with ``--print_config``. Configs that give the server optimizer the old way, in
    ``trainer.callbacks``, still work: it is moved to ``server_optimizer`` as the config is read (``--print_config``
    shows it there).

    ``lightning-fed predict`` runs ``Trainer.predict`` (the global model's ``predict_step``, after ``--ckpt_path``
    restores it) on the data module's ``predict_dataloader``; without one it stops before loading data.

    Raises:
        SystemExit: (a parser error, exit code 2) a server optimizer given both as ``server_optimizer`` and in
            ``trainer.callbacks``, two server optimizers in ``trainer.callbacks``, or ``predict`` without a
            ``predict_dataloader`` on the data module or the model.
    """

    def __init__(self, args: Optional[Any] = None, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)
        kwargs.setdefault("trainer_defaults", {"logger": DEFAULT_LOGGER})
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_class", FederatedArgumentParser)
        super().__init__(args=args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_subclass_arguments(
            ServerOptimizer,
            SERVER_OPTIMIZER_KEY,
            required=False,
            fail_untyped=False,
            help="The server optimizer (ServerOpt), e.g. FedAdam; null = FedAvg with lr 1. Replaces a server "
            "optimizer in trainer.callbacks.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
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
        if subcommand == "predict":
            self._check_predict_source(parser, prefix)

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


def main(args: Optional[Any] = None) -> None:
    """Entry point of the ``lightning-fed`` console script."""
    FederatedCLI(args=args)


if __name__ == "__main__":  # pragma: no cover
    main()
