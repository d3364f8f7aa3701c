"""``python -m lightning_fed.datamodules.tasks.shakespeare --data-dir data``: print the corpus statistics."""

from lightning_fed.datamodules.tasks.shakespeare.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
