"""The old path of :class:`~lightning_fed.algorithms.fedbn.FedBN`, which now lives in its method's module with its
client half (issue #52): re-exported, so imports and configs' ``class_path``s naming this path keep working (a run
record naming it resumes: :data:`lightning_fed.migrations.MOVED_CLASSES`)."""

from __future__ import annotations

from lightning_fed.algorithms.fedbn import FedBN  # noqa: F401

__all__ = ["FedBN"]
