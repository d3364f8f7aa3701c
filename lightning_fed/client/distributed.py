"""Clients spread over DDP ranks: the cohort split and the gather of the round's updates and failures."""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from lightning_fed.client.update import ClientUpdate


def assign_clients(cohort: Sequence[int], num_samples: Sequence[int], world_size: int) -> list[list[int]]:
    """Split a cohort across ranks, balanced by client sample count, largest first (greedy LPT scheduling).

    Args:
        cohort: The round's client ids, in cohort order.
        num_samples: |D_i| of each client of ``cohort`` (same order).
        world_size: Number of ranks (>= 1).

    Returns:
        For each rank, its clients in cohort order. Deterministic: ties go to the lower rank.
    """
    order = sorted(range(len(cohort)), key=lambda i: (-int(num_samples[i]), i))
    loads = [(0, rank) for rank in range(world_size)]
    heapq.heapify(loads)
    positions: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        load, rank = heapq.heappop(loads)
        positions[rank].append(i)
        heapq.heappush(loads, (load + int(num_samples[i]), rank))
    return [[int(cohort[i]) for i in sorted(p)] for p in positions]


def _to(update: ClientUpdate, device: torch.device) -> ClientUpdate:
    """The same update with its tensors on ``device`` (a copy: ``dataclasses.replace``, not a new ``ClientUpdate``
    built field by field, so the runner stays the one place updates are made)."""

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(move(v) for v in value)
        return value

    return dataclasses.replace(
        update, delta=move(update.delta), buffers=move(update.buffers), extras=move(update.extras),
        client_lrs=list(update.client_lrs),
    )


def gather_updates(
    updates: list[ClientUpdate], failures: list[tuple[int, str]], cohort: Sequence[int], device: torch.device
) -> tuple[list[ClientUpdate], list[tuple[int, str]]]:
    """All ranks' client updates and failures of the round, on every rank, in cohort order
    (``torch.distributed.all_gather_object``; tensors travel through CPU and come back on ``device``)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, ([_to(u, torch.device("cpu")) for u in updates], failures))
    position = {int(c): i for i, c in enumerate(np.asarray(cohort).tolist())}
    all_updates = [_to(u, device) for rank_updates, _ in gathered for u in rank_updates]
    all_updates.sort(key=lambda u: position[u.client_id])
    all_failures = sorted((f for _, rank_failures in gathered for f in rank_failures), key=lambda f: position[f[0]])
    return all_updates, all_failures
