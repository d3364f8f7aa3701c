"""The old path of ready-made names that now live in their method's module (``lightning_fed.algorithms.feddyn``) with its client
and server halves (issue #52): re-exported, so imports and configs' ``class_path``s naming this path keep
working (a run record naming it resumes: :data:`lightning_fed.migrations.MOVED_CLASSES`)."""

from __future__ import annotations

from lightning_fed.algorithms.feddyn import FedDyn  # noqa: F401

__all__ = ["FedDyn"]
