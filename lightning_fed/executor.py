"""Old import path of the client executors (kept for configs, tests and benchmarks): see
:mod:`lightning_fed.client.sequential`."""

from lightning_fed.client.sequential import ClientExecutor, SequentialExecutor, client_seed

__all__ = ["ClientExecutor", "SequentialExecutor", "client_seed"]
