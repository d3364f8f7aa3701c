"""Old import path of the vectorized executor (kept for configs, tests and benchmarks): see
:mod:`lightning_fed.client.vectorized`."""

from lightning_fed.client.vectorized import VectorizedExecutor

__all__ = ["VectorizedExecutor"]
