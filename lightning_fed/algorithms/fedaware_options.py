"""FedAWARE's options (issue #52: moved out of ``algorithms/fedaware.py``): the checks of
:class:`~lightning_fed.algorithms.fedaware.FedAWAREMinNorm`'s arguments (:func:`check_options`) and the size of its
per-client state against this machine's memory (:func:`fedaware_state_bytes`, :func:`physical_memory_bytes`;
``max_state_bytes``). Every name stays importable from :mod:`lightning_fed.algorithms.fedaware`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import torch

from lightning_fed.checks import check_int
from lightning_fed.server.checks import WEIGHTINGS
from lightning_fed.server.min_norm import SOLVERS

#: Allowed values of ``alpha_convention``.
CONVENTIONS = ("paper", "code")
#: Allowed values of ``pairing``: ``"client_id"`` (Alg. 1) or ``"public_code"`` (its bug, see
#: :func:`public_code_pairing`).
PAIRINGS = ("client_id", "public_code")


def physical_memory_bytes() -> Optional[int]:
    """This machine's physical memory in bytes (``os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")``),
    ``None`` where the platform does not report it (then ``max_state_bytes="auto"`` sets no limit)."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return int(pages) * int(page_size) if pages > 0 and page_size > 0 else None


def fedaware_state_bytes(num_clients: int, dim: int, dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """The bytes of each per-client table FedAWARE holds for N = ``num_clients`` clients and d = ``dim``
    parameters of ``dtype`` (the deltas' promoted dtype): the momenta ``[N, d]``, the Gram matrix ``[N, N]``
    float64, |D_i| ``[N]`` int64 and the seen mask ``[N]`` bool, keyed by a label naming each.

    Example: 100,000 clients of a 582,026-parameter float32 CNN (FedAWARE's Fashion-MNIST model)::

        >>> sizes = fedaware_state_bytes(100_000, 582_026)
        >>> [f"{name}: {size / 2**30:.1f} GiB" for name, size in sizes.items()]  # doctest: +NORMALIZE_WHITESPACE
        ['momenta [N, d] float32: 216.8 GiB', 'Gram matrix [N, N] float64: 74.5 GiB',
         '|D_i| [N] int64: 0.0 GiB', 'seen mask [N] bool: 0.0 GiB']
    """
    n, d = int(num_clients), int(dim)
    item = torch.empty((), dtype=dtype).element_size()
    return {
        f"momenta [N, d] {str(dtype).removeprefix('torch.')}": n * d * item,
        "Gram matrix [N, N] float64": n * n * 8,
        "|D_i| [N] int64": n * 8,
        "seen mask [N] bool": n,
    }


def _format_bytes(num: int) -> str:
    """``num`` bytes in GiB (two decimals) from 1 GiB, else in MiB from 0.01 MiB, else in bytes."""
    for unit, scale, least in (("GiB", 2**30, 2**30), ("MiB", 2**20, 2**20 / 100)):
        if num >= least:
            return f"{num / scale:,.2f} {unit}"
    return f"{num:,} B"


def check_options(
    *,
    alpha: Any,
    normalize: Any,
    alpha_convention: Any,
    fedavg_warmup: Any,
    projection: Any,
    solver: Any,
    fw_max_iter: Any,
    fw_tol: Any,
    fw_away_steps: Any,
    weighting: Any,
    num_clients: Any,
    warmup_rounds: Any,
    pairing: Any,
    max_state_bytes: Any,
) -> None:
    """Refuse FedAWARE options outside their allowed values (:class:`FedAWAREMinNorm`'s arguments; ``fw_*`` as
    given, ``None`` for not given).

    Raises:
        ValueError: ``alpha`` outside its convention's range, an unknown ``alpha_convention``, ``weighting``,
            ``solver`` or ``pairing``, ``fw_max_iter`` < 1, ``fw_tol`` negative or not finite, an ``fw_*`` option
            given with a solver other than ``"frank_wolfe"``, ``num_clients`` not a positive integer, a non-boolean
            flag, ``warmup_rounds`` not an integer ≥ 0 or given with ``fedavg_warmup=True``, or ``max_state_bytes``
            not ``"auto"``, an integer ≥ 1 or ``None``; each naming the argument and what is allowed.

    Example:
        >>> from lightning_fed.algorithms.fedaware import FedAWAREMinNorm
        >>> FedAWAREMinNorm(pairing="sorted")
        Traceback (most recent call last):
        ...
        ValueError: `pairing` must be one of ('client_id', 'public_code'), got 'sorted'.
    """
    if max_state_bytes is not None and max_state_bytes != "auto" and (
        isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int) or max_state_bytes < 1
    ):
        raise ValueError(
            "`max_state_bytes` must be 'auto', an integer >= 1 (bytes) or None (no limit), "
            f"got {max_state_bytes!r}."
        )
    check_int("warmup_rounds", warmup_rounds, 0, optional=True)
    if warmup_rounds is not None and fedavg_warmup is True:
        raise ValueError(
            "`warmup_rounds` and `fedavg_warmup=True` are two ways to set the FedAvg warm-up: give one "
            f"(got warmup_rounds={warmup_rounds!r}, fedavg_warmup=True)."
        )
    if pairing not in PAIRINGS:
        raise ValueError(f"`pairing` must be one of {PAIRINGS}, got {pairing!r}.")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"`weighting` must be one of {WEIGHTINGS}, got {weighting!r}.")
    if alpha_convention not in CONVENTIONS:
        raise ValueError(f"`alpha_convention` must be one of {CONVENTIONS}, got {alpha_convention!r}.")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"`alpha` must be a finite number, got {alpha!r}.")
    if alpha_convention == "paper" and not 0.0 <= alpha < 1.0:
        raise ValueError(
            f"`alpha` must lie in [0, 1) with alpha_convention='paper' (weight of the old momentum), got {alpha!r}."
        )
    if alpha_convention == "code" and not 0.0 < alpha <= 1.0:
        raise ValueError(
            f"`alpha` must lie in (0, 1] with alpha_convention='code' (weight of the new update), got {alpha!r}."
        )
    for name, flag in (
        ("normalize", normalize), ("fedavg_warmup", fedavg_warmup), ("projection", projection),
        ("fw_away_steps", False if fw_away_steps is None else fw_away_steps),
    ):
        if not isinstance(flag, bool):
            raise ValueError(f"`{name}` must be a bool, got {flag!r}.")
    check_int("fw_max_iter", fw_max_iter, 1, optional=True)
    if fw_tol is not None and (
        isinstance(fw_tol, bool) or not isinstance(fw_tol, (int, float)) or not math.isfinite(fw_tol) or fw_tol < 0
    ):
        raise ValueError(f"`fw_tol` must be a finite number >= 0 or None, got {fw_tol!r}.")
    if solver not in SOLVERS:
        raise ValueError(f"`solver` must be one of {SOLVERS}, got {solver!r}.")
    given = [n for n, v in (("fw_max_iter", fw_max_iter), ("fw_tol", fw_tol), ("fw_away_steps", fw_away_steps))
             if v is not None]
    if solver != "frank_wolfe" and given:
        raise ValueError(
            f"{', '.join(f'`{n}`' for n in given)} only apply to solver='frank_wolfe', got solver={solver!r}: "
            "pass solver='frank_wolfe' or leave them at None."
        )
    check_int("num_clients", num_clients, 1, optional=True)
