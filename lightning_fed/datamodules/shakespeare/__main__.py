"""``python -m lightning_fed.datamodules.shakespeare --data-dir data``: print the corpus statistics."""

from lightning_fed.datamodules.shakespeare.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
