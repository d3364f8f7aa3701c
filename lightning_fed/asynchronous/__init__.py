"""Asynchronous federated training on the simulated clock (issue #54): FedBuff and FedAsync.

:mod:`.staleness` the weightings s(τ), :mod:`.events` dispatch and report times, :mod:`.simulation` the
event-driven server (:class:`AsyncSimulation`) and its settings (:class:`AsyncConfig`).
"""

from lightning_fed.asynchronous.events import InFlight, draw_client, report_times
from lightning_fed.asynchronous.simulation import AsyncConfig, AsyncSimulation, AsyncStep
from lightning_fed.asynchronous.staleness import STALENESS_WEIGHTINGS, StalenessWeighting

__all__ = ["STALENESS_WEIGHTINGS", "AsyncConfig", "AsyncSimulation", "AsyncStep", "InFlight", "StalenessWeighting",
           "draw_client", "report_times"]
