"""Clients spread over DDP ranks: a DDP strategy without gradient synchronisation (the cohort split and the gather
of updates are in :mod:`lightning_fed.client.distributed`, re-exported here)."""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy

from lightning_fed._lightning import sync_module_states
from lightning_fed.client.distributed import assign_clients, gather_updates

__all__ = ["DDP_STRATEGY_NAMES", "FederatedDDPStrategy", "assign_clients", "gather_updates"]

#: Strategy names that FederatedTrainer turns into :class:`FederatedDDPStrategy` (with the same start method).
DDP_STRATEGY_NAMES = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}


class FederatedDDPStrategy(DDPStrategy):
    """Lightning's DDP strategy for federated simulation: processes, devices, nodes and collectives as
    ``strategy="ddp"``, but the module is not wrapped in ``DistributedDataParallel``.

    Ranks train different clients for different numbers of local steps, so per-step gradient all-reduce (and
    DDP's buffer broadcasts) must not happen; the federated loop combines the clients' updates once per round
    instead (:func:`gather_updates`). At setup, every rank's module is made equal to rank 0's (a broadcast), so
    all ranks start from the same x_0 and, applying the same server update to the same gathered updates, stay
    equal. ``FederatedTrainer(strategy="ddp")`` selects this strategy; arguments are those of
    :class:`lightning.pytorch.strategies.DDPStrategy`.

    Example: selected by ``strategy="ddp"`` (nothing is launched before ``fit``)::

        >>> from lightning_fed import FederatedTrainer
        >>> trainer = FederatedTrainer(strategy="ddp", accelerator="cpu", devices=2, logger=False,
        ...                            enable_progress_bar=False, enable_model_summary=False)
        >>> type(trainer.strategy).__name__, trainer.strategy.strategy_name, trainer.world_size
        ('FederatedDDPStrategy', 'federated_ddp', 2)
    """

    strategy_name = "federated_ddp"

    def configure_ddp(self) -> None:
        sync_module_states(self.model)
