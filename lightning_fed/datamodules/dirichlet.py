"""Old path of :mod:`lightning_fed.datamodules.partitioners.dirichlet`, removed in 0.3.0: its names, with a
``DeprecationWarning`` naming the new path (:mod:`lightning_fed._moved`)."""

from lightning_fed._moved import moved_module as _moved_module

__getattr__, __dir__ = _moved_module(__name__)
