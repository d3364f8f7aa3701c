"""The ``lightning-fed`` command: LightningCLI with the federated trainer and TensorBoard by default."""

from __future__ import annotations

from typing import Any, Optional

from lightning.pytorch.cli import LightningCLI

from lightning_fed.trainer import FederatedTrainer

#: TensorBoard under ./runs unless the config or command line names another logger.
DEFAULT_LOGGER = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs"}}


class FederatedCLI(LightningCLI):
    """``lightning-fed fit --config examples/shakespeare_fedadam.yaml [--trainer.max_epochs 50 ...]``.

    A :class:`lightning.pytorch.cli.LightningCLI` whose trainer is :class:`~lightning_fed.FederatedTrainer`
    (``trainer.max_epochs`` counts rounds; the server optimizer goes in ``trainer.callbacks``). ``model`` is any
    LightningModule and ``data`` any :class:`~lightning_fed.datamodules.FederatedDataModule`, each given by
    ``class_path``/``init_args``. Every argument can be overridden on the command line.
    """

    def __init__(self, args: Optional[Any] = None, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)
        kwargs.setdefault("trainer_defaults", {"logger": DEFAULT_LOGGER})
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(args=args, **kwargs)


def main(args: Optional[Any] = None) -> None:
    """Entry point of the ``lightning-fed`` console script."""
    FederatedCLI(args=args)


if __name__ == "__main__":  # pragma: no cover
    main()
