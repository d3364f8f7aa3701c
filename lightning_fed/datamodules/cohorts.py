"""The cohort of each round: who is asked to train and who reports back (fixed size, Poisson, sweep-then-uniform,
simulated dropout, over-selection). One part of :class:`~lightning_fed.datamodules.FederatedDataModule`."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import numpy as np

from lightning_fed.checks import check_positive_int

#: The cohort samplings of :class:`CohortSampler` (``cohort_sampling``).
COHORT_SAMPLINGS = ("fixed_size", "poisson", "sweep_then_uniform")
#: How a Poisson cohort is drawn (:class:`CohortSampler`'s ``poisson_draws``).
POISSON_DRAWS = ("per_client", "binomial")
#: With availability, a fixed-size round over N > 2·L clients draws at most L = ``max(AVAILABILITY_DRAWS_FACTOR · num,
#: AVAILABILITY_DRAWS_MIN)`` distinct candidates looking for ``num`` online ones (see :meth:`CohortSampler.select`).
AVAILABILITY_DRAWS_FACTOR, AVAILABILITY_DRAWS_MIN = 100, 10_000


@dataclass(frozen=True)
class CohortSelection:
    """Who was asked and who reports back in one round.

    Attributes:
        cohort: The clients that train this round, int64 ``[<= clients_per_round]``, in selection order (with
            ``cohort_sampling="poisson"``: every sampled client that did not drop out, any number from 0 to N, in
            increasing id order).
        candidates: The clients sampled (``clients_per_round`` plus the over-selection; Poisson: the round's
            sample), int64, in order.
        unavailable: How many candidates dropped out (simulated device dropout).
        offline: How many clients drawn were offline at selection and so not sampled (only with a device model that
            has availability: :meth:`CohortSampler.select`'s ``is_online``; 0 otherwise; not in the repr).
        offline_ids: Those clients, int64 ``[offline]``, in draw order (not in the repr, not compared): the clients
            a round nobody could be asked in waits for (:func:`~lightning_fed.clock.plan_round`'s ``idle_until``).

    Example::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> dm = FederatedDataModule(TensorDataset(torch.zeros(12, 1)), partitioner=IIDPartitioner(4, seed=0),
        ...                          clients_per_round=2)
        >>> dm.setup()
        >>> dm.select_cohort(0)
        CohortSelection(cohort=array([2, 0]), candidates=array([2, 0]), unavailable=0)
    """

    cohort: np.ndarray
    candidates: np.ndarray
    unavailable: int
    offline: int = field(default=0, repr=False)
    offline_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False, compare=False)


class CohortSampler:
    """Draws each round's cohort from N clients; every draw is a pure function of ``(seed, round)``.

    Args:
        clients_per_round: Cohort size C (default 10); at most N (checked by :meth:`check_population`).
        cohort_sampling: ``"fixed_size"`` (default: C distinct clients, uniformly without replacement),
            ``"poisson"`` (each client joins independently with probability q = C/N; McMahan et al. 2018, Alg. 1)
            or ``"sweep_then_uniform"`` (the first ⌈N/C⌉ rounds visit every client once, in one seeded random
            order; then as ``"fixed_size"``). See :class:`~lightning_fed.datamodules.FederatedDataModule`.
        client_dropout: Probability in [0, 1) that a sampled client drops out of the round (default 0).
        over_selection: Sample ⌈C·(1 + over_selection)⌉ candidates and keep the first C that stay (Bonawitz et
            al. 2019), ``>= 0`` (default 0); ``"fixed_size"`` only.
        seed: The data module's seed (default 0).
        poisson_draws: How a ``"poisson"`` cohort is drawn: ``"per_client"`` (default: one uniform u_i per client
            and round, i joins iff u_i < q — N draws a round, the draws written in the privacy analysis) or
            ``"binomial"`` (K ~ Binomial(N, q), then K distinct clients uniformly at random, in increasing id order:
            O(K) a round, for populations of millions). Both give every subset S the probability
            q^|S|·(1 − q)^(N−|S|), so the DP accounting of Poisson sampling holds for either; the cohorts differ
            (other draws), so it is a run setting. Only with ``cohort_sampling="poisson"``.

    Raises:
        ValueError: a non-positive ``clients_per_round``, an unknown ``cohort_sampling``, ``client_dropout``
            outside [0, 1), a negative or non-finite ``over_selection`` or one with a sampling other than
            ``"fixed_size"``, an unknown ``poisson_draws`` or ``"binomial"`` with a sampling other than
            ``"poisson"``.

    Example::

        >>> sampler = CohortSampler(clients_per_round=3, client_dropout=0.5, over_selection=1.0, seed=1)
        >>> sampler.select(0, num_clients=10).cohort.tolist()
        [5, 0, 3]
        >>> sampler.settings()  # doctest: +NORMALIZE_WHITESPACE
        {'clients_per_round': 3, 'cohort_sampling': 'fixed_size', 'client_dropout': 0.5, 'over_selection': 1.0,
         'poisson_draws': 'per_client'}
        >>> fast = CohortSampler(clients_per_round=10, cohort_sampling="poisson", poisson_draws="binomial", seed=0)
        >>> len(fast.select(0, num_clients=1_000_000).cohort) > 0  # about 10 of a million, drawn in O(10)
        True
    """

    #: This part's settings, the names of :meth:`settings` (each an attribute; the data module forwards them).
    setting_names: ClassVar[tuple[str, ...]] = ("clients_per_round", "cohort_sampling", "client_dropout",
                                                "over_selection", "poisson_draws")
    #: The settings of :meth:`settings` that define a training run (recorded in checkpoints, compared on resume).
    run_settings: ClassVar[tuple[str, ...]] = ("clients_per_round", "client_dropout", "over_selection",
                                               "cohort_sampling", "poisson_draws")
    #: Run settings recorded later than the first checkpoints, with the value a checkpoint without them ran with.
    record_defaults: ClassVar[dict[str, Any]] = {"cohort_sampling": "fixed_size", "poisson_draws": "per_client"}

    def __init__(self, clients_per_round: int = 10, cohort_sampling: str = "fixed_size", client_dropout: float = 0.0,
                 over_selection: float = 0.0, seed: int = 0, poisson_draws: str = "per_client") -> None:
        if isinstance(client_dropout, bool) or not isinstance(client_dropout, numbers.Real) or not 0 <= client_dropout < 1:
            raise ValueError(f"`client_dropout` must be a probability in [0, 1), got {client_dropout!r}.")
        if (
            isinstance(over_selection, bool) or not isinstance(over_selection, numbers.Real)
            or not math.isfinite(over_selection) or over_selection < 0
        ):
            raise ValueError(f"`over_selection` must be a finite number >= 0, got {over_selection!r}.")
        if cohort_sampling not in COHORT_SAMPLINGS:
            raise ValueError(f"`cohort_sampling` must be one of {COHORT_SAMPLINGS}, got {cohort_sampling!r}.")
        if cohort_sampling == "poisson" and over_selection:
            raise ValueError(
                f"`over_selection` ({over_selection!r}) needs cohort_sampling='fixed_size': a Poisson cohort has no "
                "fixed size to over-select for."
            )
        if poisson_draws not in POISSON_DRAWS:
            raise ValueError(f"`poisson_draws` must be one of {POISSON_DRAWS}, got {poisson_draws!r}.")
        if poisson_draws != "per_client" and cohort_sampling != "poisson":
            raise ValueError(
                f"`poisson_draws={poisson_draws!r}` needs cohort_sampling='poisson' (got {cohort_sampling!r}): it says "
                "how a Poisson cohort is drawn."
            )
        if cohort_sampling == "sweep_then_uniform" and over_selection:
            raise ValueError(
                f"`over_selection` ({over_selection!r}) needs cohort_sampling='fixed_size': the sweep of "
                "cohort_sampling='sweep_then_uniform' visits each client once, with nobody to over-select."
            )
        self.cohort_sampling = cohort_sampling
        self.poisson_draws = poisson_draws
        self.client_dropout = float(client_dropout)
        self.over_selection = float(over_selection)
        self.clients_per_round = check_positive_int("clients_per_round", clients_per_round)
        self.seed = int(seed)
        self._sweep_order: Any = None

    def settings(self) -> dict[str, Any]:
        """``{name: value}`` of this part's settings."""
        return {name: getattr(self, name) for name in self.setting_names}

    def check_population(self, num_clients: int) -> None:
        """Raises ValueError when ``clients_per_round`` exceeds ``num_clients``."""
        if self.clients_per_round > num_clients:
            raise ValueError(
                f"`clients_per_round` ({self.clients_per_round}) must not exceed the number of clients "
                f"({num_clients})."
            )

    def sweep_rounds(self, num_clients: int) -> int:
        """⌈N/C⌉ under ``"sweep_then_uniform"``, else 0."""
        if self.cohort_sampling != "sweep_then_uniform":
            return 0
        return math.ceil(num_clients / self.clients_per_round)

    def select(self, round_idx: int, num_clients: int,
               is_online: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> CohortSelection:
        """Sample round ``round_idx``'s candidates among ``num_clients``, apply dropout, keep the first
        ``clients_per_round`` (Poisson and sweep cohorts: keep all that stay).

        ``is_online`` (issue #53: a device model with availability, asked at the round's simulated start time):
        ``is_online(client_ids int64 [n]) -> bool [n]``. A client offline then is not sampled, so the sampling law
        changes from the population to the clients online at that time:

        * ``"fixed_size"``: candidates are drawn one block at a time in the same seeded order as without
          availability and the offline ones skipped (rejection sampling), until ``⌈C·(1 + over_selection)⌉`` online
          ones are found: each round's candidates are uniform without replacement among the clients online at its
          start, not among all N (a client's chance of joining now follows its availability). O(cohort) a round:
          with N > 2·L, L = ``max(100·num, 10,000)``, at most L distinct clients are asked and a round finding
          fewer than ``num`` online among them raises RuntimeError; with N <= 2·L every client may be asked, and
          when fewer than ``num`` are online the round keeps them all, a smaller cohort or none (as FedScale's
          selection does).
        * ``"poisson"``: the Poisson sample's offline clients are left out: each online client joins with
          probability q = C/N (so the cohort size is Binomial(online, q), no longer Binomial(N, q)).
        * ``"sweep_then_uniform"``: a sweep round's offline clients miss their visit; after the sweep as
          ``"fixed_size"``.

        Client dropout then applies to the online candidates as without availability. With every client online
        the cohort is the same as without ``is_online``.
        """
        round_idx = int(round_idx)
        if self.cohort_sampling == "poisson":
            return self._poisson(round_idx, num_clients, is_online)
        if self.cohort_sampling == "sweep_then_uniform" and round_idx < self.sweep_rounds(num_clients):
            return self._sweep(round_idx, num_clients, is_online)
        num = min(num_clients, math.ceil(self.clients_per_round * (1.0 + self.over_selection)))
        rng = np.random.default_rng([self.seed, 0x5A3D, round_idx])
        candidates = rng.choice(num_clients, size=num, replace=False).astype(np.int64)
        offline = np.zeros(0, dtype=np.int64)
        if is_online is not None:
            candidates, offline = _online_candidates(rng, candidates, num, num_clients, is_online, round_idx)
        available = self._drop(candidates, round_idx)
        return CohortSelection(available[: self.clients_per_round], candidates, int(len(candidates) - len(available)),
                               len(offline), offline)

    def available(self, candidates: np.ndarray, round_idx: int) -> np.ndarray:
        """The candidates of round ``round_idx`` that do not drop out (``client_dropout``), in order: those the
        over-selection keeps the first ``clients_per_round`` of (by sample order, or with a device model by finish
        time, :mod:`lightning_fed.datamodules.simulated_time`)."""
        return self._drop(np.asarray(candidates, dtype=np.int64), int(round_idx))

    def _drop(self, candidates: np.ndarray, round_idx: int) -> np.ndarray:
        if self.client_dropout <= 0:
            return candidates
        draws = np.random.default_rng([self.seed, 0xD409, round_idx]).random(len(candidates))
        return candidates[draws >= self.client_dropout]

    def _sweep(self, round_idx: int, num_clients: int, is_online: Optional[Callable] = None) -> CohortSelection:
        c = self.clients_per_round
        key = (self.seed, num_clients)
        if self._sweep_order is None or self._sweep_order[0] != key:  # one permutation per sweep, drawn once
            order = np.random.default_rng([self.seed, 0x5EE9]).permutation(num_clients).astype(np.int64)
            self._sweep_order = (key, order)
        candidates = self._sweep_order[1][round_idx * c:(round_idx + 1) * c].copy()
        candidates, offline = _keep_online(candidates, is_online)
        available = self._drop(candidates, round_idx)
        return CohortSelection(available, candidates, int(len(candidates) - len(available)), len(offline), offline)

    def _poisson(self, round_idx: int, num_clients: int, is_online: Optional[Callable] = None) -> CohortSelection:
        # N uniforms per round: client i joins iff its own draw u_i < q (the exact draws of the privacy analysis)
        q = self.clients_per_round / num_clients
        if self.poisson_draws == "binomial":  # K ~ Bin(N, q), then a uniform K-subset: the same law, O(K) draws
            rng = np.random.default_rng([self.seed, 0xB1A0, round_idx])
            size = int(rng.binomial(num_clients, q))
            candidates = np.sort(rng.choice(num_clients, size=size, replace=False)).astype(np.int64)
        else:
            draws = np.random.default_rng([self.seed, 0x9015, round_idx]).random(num_clients)
            candidates = np.flatnonzero(draws < q).astype(np.int64)
        candidates, offline = _keep_online(candidates, is_online)
        available = self._drop(candidates, round_idx)
        return CohortSelection(available, candidates, int(len(candidates) - len(available)), len(offline), offline)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.settings().items())})"


def _online_mask(ids: np.ndarray, is_online: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    mask = np.asarray(is_online(ids))
    if mask.shape != ids.shape or mask.dtype != bool:
        raise TypeError(f"is_online must return a bool array of shape {ids.shape}, got {mask.dtype} {mask.shape}.")
    return mask


def _keep_online(candidates: np.ndarray, is_online: Optional[Callable]) -> tuple[np.ndarray, np.ndarray]:
    """The online ones of ``candidates`` (in order) and the offline ones."""
    if is_online is None or not len(candidates):
        return candidates, np.zeros(0, dtype=np.int64)
    mask = _online_mask(candidates, is_online)
    return candidates[mask], candidates[~mask]


def _online_candidates(rng: np.random.Generator, first: np.ndarray, num: int, num_clients: int,
                       is_online: Callable[[np.ndarray], np.ndarray], round_idx: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num`` online clients of a seeded sequence of distinct draws and the offline clients that came
    before them. The sequence: ``first`` (the draw without availability), then further draws from ``rng`` with the
    clients already drawn skipped: one permutation of all N when N <= 2·limit (every client is then asked if need
    be), else blocks of ``max(num, 64)`` drawn without replacement, at most ``limit`` clients in all. Each draw is
    uniform and the skipped clients are exactly those drawn before, so the sequence is a uniformly random order of
    distinct clients and its first ``num`` online ones a uniform sample without replacement of the online clients.

    Raises:
        RuntimeError: fewer than ``num`` online among ``limit`` clients drawn from a population larger than 2·limit.
    """
    limit = max(AVAILABILITY_DRAWS_FACTOR * num, AVAILABILITY_DRAWS_MIN)
    drawn, masks = [first], [_online_mask(first, is_online)]
    count, seen = int(masks[0].sum()), None
    total = len(first)
    while count < num and total < num_clients:
        if seen is None:
            seen = set(first.tolist())
        exhaustive = num_clients <= 2 * limit
        if not exhaustive and total >= limit:
            raise RuntimeError(
                f"Round {round_idx}: only {count} of the {total} clients drawn were online at the round's start, fewer "
                f"than the {num} the cohort needs (the draws stop at {limit}, O(cohort) a round): the device model's "
                "availability leaves about 1 % of the clients online or fewer then. Lower clients_per_round or use a "
                "device model with more clients online."
            )
        block = (rng.permutation(num_clients) if exhaustive else
                 rng.choice(num_clients, size=max(num, 64), replace=False)).tolist()
        new = np.array([c for c in block if c not in seen], dtype=np.int64)
        if not exhaustive:
            new = new[: limit - total]
        seen.update(new.tolist())
        total += len(new)
        drawn.append(new)
        masks.append(_online_mask(new, is_online))
        count += int(masks[-1].sum())
    order, online = np.concatenate(drawn), np.concatenate(masks)
    if count >= num:  # the offline ones drawn before the num-th online one
        end = int(np.flatnonzero(online)[num - 1]) + 1
        order, online = order[:end], online[:end]
    return order[online], order[~online]
