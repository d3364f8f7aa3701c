"""Clients spread over DDP ranks: a DDP strategy without gradient synchronisation (the cohort split and the gather
of updates are in :mod:`lightning_fed.client.distributed`, re-exported here)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from lightning.pytorch.strategies import DDPStrategy

from lightning_fed._lightning import sync_module_states
from lightning_fed.checks import check_positive_int
from lightning_fed.client.distributed import assign_clients, gather_updates
from lightning_fed.client.host_exchange import close_host_exchanges

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
    :class:`lightning.pytorch.strategies.DDPStrategy`, plus:

    Args:
        processes_per_device: k ≥ 1 processes on each device (default 1), the cohort split over all of them as
            over devices (pfl-research runs several workers per GPU): ``devices=1`` with k = 2 trains two clients at
            a time on one GPU, or in two CPU processes. With k > 1 the process group defaults to gloo (NCCL refuses
            two ranks on one GPU; updates are gathered through the CPU, :func:`gather_updates`). Tested on CPU (2
            processes on 1 device equal 1 process bit for bit); on a GPU not yet run.
        shared_memory: Whether ranks on one host exchange their round updates through ``/dev/shm``
            (:mod:`lightning_fed.client.host_exchange`; default True) instead of the process group's ``all_gather``
            — the same bytes, less copying: about 40 → 12 ms a round for five FedAwareCNN updates per rank on two
            CPU processes. Used only where every rank can read the others' files (checked once at the first round)
            and never under NCCL; ``False`` always gathers through the process group.

    Raises:
        ValueError: ``processes_per_device`` not an integer ≥ 1; ``shared_memory`` not a bool.

    Example: selected by ``strategy="ddp"`` (nothing is launched before ``fit``)::

        >>> from lightning_fed import FederatedTrainer
        >>> trainer = FederatedTrainer(strategy="ddp", accelerator="cpu", devices=2, logger=False,
        ...                            enable_progress_bar=False, enable_model_summary=False)
        >>> type(trainer.strategy).__name__, trainer.strategy.strategy_name, trainer.world_size
        ('FederatedDDPStrategy', 'federated_ddp', 2)
        >>> two_per_device = FederatedTrainer(strategy=FederatedDDPStrategy(processes_per_device=2), accelerator="cpu",
        ...                                   devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
        >>> two_per_device.world_size, two_per_device.strategy.process_group_backend
        (2, 'gloo')
    """

    strategy_name = "federated_ddp"

    def __init__(self, *args: Any, processes_per_device: int = 1, shared_memory: bool = True, **kwargs: Any) -> None:
        check_positive_int("processes_per_device", processes_per_device)
        if not isinstance(shared_memory, bool):
            raise ValueError(f"`shared_memory` must be True or False, got {shared_memory!r}.")
        #: Whether ranks on one host exchange round updates through ``/dev/shm`` (:func:`gather_updates`).
        self.shared_memory = shared_memory
        #: k, the processes started on each device (pfl-research's several workers per GPU).
        self.processes_per_device = processes_per_device
        if processes_per_device > 1 and kwargs.get("process_group_backend") is None:
            kwargs["process_group_backend"] = "gloo"  # NCCL refuses two ranks on one GPU
        super().__init__(*args, **kwargs)

    @property
    def parallel_devices(self) -> Optional[list[torch.device]]:
        """The device of each local process: every device given (``devices=...``) ``processes_per_device`` times."""
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: Optional[list[torch.device]]) -> None:
        k = getattr(self, "processes_per_device", 1)
        self._parallel_devices = None if devices is None else [d for d in devices for _ in range(k)]

    def configure_ddp(self) -> None:
        sync_module_states(self.model)

    def teardown(self) -> None:
        close_host_exchanges()  # this rank's /dev/shm segments (before the process group goes)
        super().teardown()
