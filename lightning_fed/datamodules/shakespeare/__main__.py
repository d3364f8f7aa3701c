"""Old path of ``python -m lightning_fed.datamodules.tasks.shakespeare`` (the corpus statistics), removed in 0.3.0:
runs it, with a ``DeprecationWarning`` naming the new path."""

from lightning_fed._moved import warn_moved

if __name__ == "__main__":  # pragma: no cover
    warn_moved("lightning_fed.datamodules.shakespeare", "lightning_fed.datamodules.tasks.shakespeare", depth=0)
    from lightning_fed.datamodules.tasks.shakespeare.cli import main

    main()
