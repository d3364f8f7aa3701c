"""How much local work each client does per round, and the order in which it visits its samples.

A :class:`LocalWork` policy answers "how many epochs (or steps) and which batch size does client
``cid`` use in round ``round_idx``" with a :class:`ClientWork`; :func:`batch_schedule` turns that
answer into the concrete sequence of mini-batches (arrays of dataset indices).

All randomness is drawn from ``np.random.default_rng`` seeded by a tuple that contains the
experiment seed and the (round, client, epoch) it is for, never from global RNG state, so a
client's work does not depend on the order in which the cohort is processed or on what else was
sampled, and runs are reproducible on any machine.
"""

from __future__ import annotations

import abc
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_fed.checks import ArgumentError
from lightning_fed.seeding import default_rng

from .partition import _check_int, _check_seed

__all__ = [
    "DATA_ORDERS",
    "STEPS_RULES",
    "ClientWork",
    "LocalWork",
    "FixedLocalWork",
    "FixedLocalSteps",
    "SampledLocalWork",
    "batch_schedule",
    "has_single_sample_batch",
    "num_local_steps",
    "single_sample_batch_clients",
]

#: Allowed values of ``data_order`` in :func:`batch_schedule`.
DATA_ORDERS: tuple[str, ...] = ("reshuffle", "once", "none")

#: Allowed values of ``steps_rule`` in :class:`SampledLocalWork`.
STEPS_RULES: tuple[str, ...] = ("paper", "epochs")
#: Allowed values of ``SampledLocalWork(batch_size_upper=...)``: what ``batch_size=(low, None)`` draws up to.
BATCH_SIZE_UPPERS: tuple[str, ...] = ("dataset_size", "dataset_size_minus_one")

# Non-zero stream tags appended to the SeedSequence entropy so the permutation streams never
# coincide with each other or with SampledLocalWork's ``[seed, round_idx, cid]`` (SeedSequence
# treats trailing zeros as absent: ``[s, r, c, 0]`` and ``[s, r, c]`` give the same stream).
_TAG_RESHUFFLE = 0x52534846  # "RSHF"
_TAG_ONCE = 0x4F4E4345  # "ONCE"


@dataclass(frozen=True)
class ClientWork:
    """What one client does in one round.

    Attributes:
        epochs: local epochs (passes over the client's data), int >= 1; ignored when ``steps`` is set.
        batch_size: samples per mini-batch, int >= 1.
        steps: a fixed number of local steps (mini-batches) instead of epochs, int >= 1, or ``None``
            (default) to run ``epochs`` epochs.

    Raises:
        TypeError / ValueError: a field is not an int in its range (the message names the field).

    Example::

        >>> ClientWork(epochs=2, batch_size=4)
        ClientWork(epochs=2, batch_size=4, steps=None)
        >>> ClientWork(epochs=1, batch_size=0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `batch_size` must be an integer >= 1, got 0.
    """

    epochs: int
    batch_size: int
    steps: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "epochs", _check_int("epochs", self.epochs, minimum=1))
        object.__setattr__(self, "batch_size", _check_int("batch_size", self.batch_size, minimum=1))
        if self.steps is not None:
            object.__setattr__(self, "steps", _check_int("steps", self.steps, minimum=1))


def _check_plan_args(cid: Any, round_idx: Any, num_samples: Any) -> tuple[int, int, int]:
    return (
        _check_int("cid", cid, minimum=0),
        _check_int("round_idx", round_idx, minimum=0),
        _check_int("num_samples", num_samples, minimum=0),
    )


class LocalWork(abc.ABC):
    """A policy for the local work of each client in each round.

    Subclasses implement :meth:`plan`.

    Example: more epochs for smaller clients::

        >>> class SmallClientsWorkMore(LocalWork):
        ...     def plan(self, cid, round_idx, num_samples):
        ...         return ClientWork(epochs=1 if num_samples >= 100 else 3, batch_size=10)
        >>> SmallClientsWorkMore().plan(cid=0, round_idx=0, num_samples=40)
        ClientWork(epochs=3, batch_size=10, steps=None)
    """

    @abc.abstractmethod
    def plan(self, cid: int, round_idx: int, num_samples: int) -> ClientWork:
        """The work of client ``cid`` (int >= 0) in round ``round_idx`` (int >= 0), given its
        number of samples ``num_samples`` (int >= 0).

        Raises:
            TypeError / ValueError: an argument is not a non-negative int.
        """

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


class FixedLocalWork(LocalWork):
    """Every client runs ``local_epochs`` epochs with batch size ``batch_size`` every round (FedAvg's E and B).

    McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
    AISTATS 2017. Clients with more data therefore take more steps.

    Args:
        local_epochs: epochs per round (int >= 1, default 1).
        batch_size: mini-batch size (int >= 1, default 20).

    Raises:
        TypeError / ValueError: an argument is not an int >= 1.

    Example: E = 2, B = 4 on a 10-sample client is 2·ceil(10/4) = 6 steps (2·floor(10/4) = 4 with ``drop_last``)::

        >>> work = FixedLocalWork(local_epochs=2, batch_size=4).plan(cid=0, round_idx=0, num_samples=10)
        >>> work, num_local_steps(10, work), num_local_steps(10, work, drop_last=True)
        (ClientWork(epochs=2, batch_size=4, steps=None), 6, 4)
    """

    def __init__(self, local_epochs: int = 1, batch_size: int = 20) -> None:
        self.local_epochs = _check_int("local_epochs", local_epochs, minimum=1)
        self.batch_size = _check_int("batch_size", batch_size, minimum=1)

    def plan(self, cid: int, round_idx: int, num_samples: int) -> ClientWork:
        _check_plan_args(cid, round_idx, num_samples)
        return ClientWork(epochs=self.local_epochs, batch_size=self.batch_size)


class FixedLocalSteps(LocalWork):
    """Every client takes exactly ``steps`` mini-batch steps of size ``batch_size`` every round.

    The fixed step budget ``K`` of Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (and of
    local-SGD analyses); the client cycles through its data, reshuffling per pass (see
    :func:`batch_schedule`).

    Args:
        steps: local steps per round (int >= 1).
        batch_size: mini-batch size (int >= 1).

    Raises:
        TypeError / ValueError: an argument is not an int >= 1.

    Example::

        >>> FixedLocalSteps(steps=4, batch_size=2).plan(cid=3, round_idx=7, num_samples=5)
        ClientWork(epochs=1, batch_size=2, steps=4)
    """

    def __init__(self, steps: int, batch_size: int) -> None:
        self.steps = _check_int("steps", steps, minimum=1)
        self.batch_size = _check_int("batch_size", batch_size, minimum=1)

    def plan(self, cid: int, round_idx: int, num_samples: int) -> ClientWork:
        _check_plan_args(cid, round_idx, num_samples)
        return ClientWork(epochs=1, batch_size=self.batch_size, steps=self.steps)


def _check_range(name: str, value: Any, minimum: int, allow_none_high: bool) -> tuple[int, int | None]:
    """Validate an int or a ``(low, high)`` pair with ``minimum <= low <= high`` (high may be None)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        v = _check_int(name, value, minimum=minimum)
        return v, v
    allowed = f"an integer >= {minimum} or a pair (low, high) with {minimum} <= low <= high" + (
        " (high=None: the client's dataset size)" if allow_none_high else ""
    )
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        raise ArgumentError(f"`{name}` must be {allowed}, got {value!r}.")
    low = _check_int(f"{name}[0]", value[0], minimum=minimum)
    if value[1] is None and allow_none_high:
        return low, None
    high = _check_int(f"{name}[1]", value[1], minimum=minimum)
    if low > high:
        raise ArgumentError(f"`{name}` must be {allowed}, got low={low} > high={high}.")
    return low, high


class SampledLocalWork(LocalWork):
    """Heterogeneous local work: epochs and batch size drawn per (round, client).

    FedAWARE "Hybrid+" (Zeng et al. 2024, FedAWARE, arXiv:2310.02702, first titled "Tackling Hybrid
    Heterogeneity on Federated Optimization via Gradient Diversity Maximization", Sec. 5): ``E_i ~ U{2, ..., 5}`` and
    ``B_i ~ U{10, ..., |D_i|}``, both inclusive. When ``|D_i|`` is below the batch-size low end the
    batch is the whole client (``B_i = |D_i|``); a given batch-size high end above ``|D_i|`` is
    clipped to ``|D_i|``; a client with no samples gets ``B_i = 1`` (it has no batches anyway).

    How many local steps follow from ``(E_i, B_i)`` (``steps_rule``):

    * ``"paper"`` (default): ``K_i = floor(E_i * |D_i| / B_i)`` mini-batch steps, the paper's count
      (Sec. 5, Hybrid+: "the local steps K_i = ⌊E_i*|D_i|/B_i⌋"). The plan is
      ``ClientWork(epochs=E_i, batch_size=B_i, steps=K_i)``, so :func:`batch_schedule` yields the first
      ``K_i`` batches of the unbounded epoch sequence, in the data module's ``data_order``
      (``"reshuffle"``: a fresh permutation per epoch; ``"once"``; ``"none"``). Without ``drop_last``
      each epoch is cut into ``ceil(|D_i|/B_i)`` batches (the last one smaller), and
      ``K_i <= E_i * ceil(|D_i|/B_i)``: the schedule is exactly the first ``K_i`` batches of the
      ``"epochs"`` schedule, the last epoch possibly partial. With ``drop_last`` (``floor(|D_i|/B_i)``
      full batches per epoch) ``K_i`` can exceed ``E_i * floor(|D_i|/B_i)``, and the client goes on
      into epoch ``E_i`` (further epochs), still ``K_i`` steps of ``B_i`` samples.
    * ``"epochs"``: ``E_i`` full passes, ``E_i * ceil(|D_i|/B_i)`` steps (``floor`` with ``drop_last``):
      what the authors' public code runs (fedlab's ``get_dataloader``, a ``DataLoader`` without shuffling
      over the client's samples in the fixed order of fedlab's partition, which shuffled each client once:
      ``data_order="once"`` here; iterated ``E_i`` times), and this class's behaviour before ``steps_rule``
      existed. With ``|D_i| = q B_i + r`` the counts are
      ``E_i q + floor(E_i r / B_i)`` and ``E_i q + E_i [r > 0]``: they differ exactly when ``B_i``
      does not divide ``|D_i|``, and then the paper's is smaller by ``E_i - floor(E_i r / B_i) >= 1``.

    ``K_i >= E_i >= 1`` for every client with samples (``B_i <= |D_i|``). A client with no samples
    gets ``ClientWork(epochs=E_i, batch_size=1)`` under both rules (no steps; ``K_i = 0``); what a
    zero-step client does is left to the data module / loop.

    Draws come from ``np.random.default_rng([seed, round_idx, cid])`` (epochs first, then batch
    size), so they do not depend on cohort order or on what else was sampled; ``steps_rule`` does
    not change the draws.

    ``batch_size_upper`` sets what an open high end (``batch_size=(low, None)``) means:
    ``"dataset_size"`` (default, the paper's ``B_i ~ U{10..|D_i|}``) or ``"dataset_size_minus_one"``
    (``B_i ~ U{low..|D_i|−1}``, the authors' public code, ``np.random.randint(10, |D_i|)`` in
    ``settings.get_heterogeneity`` of github.com/dunzeng/FedAWARE, read, not copied; still
    ``B_i = |D_i|`` when ``|D_i| <= low``). A given high end is unaffected.

    Args:
        epochs: ``(low, high)`` inclusive range of local epochs, ``1 <= low <= high``, or one int
            (default ``(2, 5)``).
        batch_size: ``(low, high)`` inclusive range, ``1 <= low <= high``; ``high=None`` means the
            client's dataset size ``|D_i|``; or one int (default ``(10, None)``).
        seed: experiment seed (int >= 0, default 0).
        steps_rule: ``"paper"`` (default, ``K_i = floor(E_i |D_i| / B_i)`` steps) or ``"epochs"``
            (``E_i`` full epochs), see above.
        batch_size_upper: ``"dataset_size"`` (default) or ``"dataset_size_minus_one"``, see above
            (keyword-only).

    Raises:
        TypeError / ValueError: a malformed range or seed, or an unknown ``steps_rule`` or
            ``batch_size_upper`` (the message names the argument and the allowed values).

    Example: Hybrid+ on clients of |D_i| = 23 samples; K_i = floor(5·23/18) = 6, floor(5·23/16) = 7,
    floor(2·23/18) = 2::

        >>> work = SampledLocalWork(epochs=(2, 5), batch_size=(10, None), seed=0)
        >>> for cid in range(3):
        ...     print(work.plan(cid, round_idx=0, num_samples=23))
        ClientWork(epochs=5, batch_size=18, steps=6)
        ClientWork(epochs=5, batch_size=16, steps=7)
        ClientWork(epochs=2, batch_size=18, steps=2)
        >>> SampledLocalWork(steps_rule="epochs", seed=0).plan(0, 0, 23)  # 5 full passes, 5·ceil(23/18) = 10 steps
        ClientWork(epochs=5, batch_size=18, steps=None)
        >>> SampledLocalWork(epochs=(5, 2))
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `epochs` must be an integer >= 1 or a pair (low, high) with 1 <= low <= high, got low=5 > high=2.
    """

    def __init__(
        self,
        epochs: int | tuple[int, int] = (2, 5),
        batch_size: int | tuple[int, int | None] = (10, None),
        seed: int = 0,
        steps_rule: str = "paper",
        *,
        batch_size_upper: str = "dataset_size",
    ) -> None:
        self.epochs = _check_range("epochs", epochs, minimum=1, allow_none_high=False)
        self.batch_size = _check_range("batch_size", batch_size, minimum=1, allow_none_high=True)
        self.seed = _check_seed(seed)
        if not isinstance(steps_rule, str) or steps_rule not in STEPS_RULES:
            raise ValueError(f"`steps_rule` must be one of {STEPS_RULES}, got {steps_rule!r}")
        self.steps_rule = steps_rule
        if not isinstance(batch_size_upper, str) or batch_size_upper not in BATCH_SIZE_UPPERS:
            raise ValueError(f"`batch_size_upper` must be one of {BATCH_SIZE_UPPERS}, got {batch_size_upper!r}")
        self.batch_size_upper = batch_size_upper

    def plan(self, cid: int, round_idx: int, num_samples: int) -> ClientWork:
        cid, round_idx, num_samples = _check_plan_args(cid, round_idx, num_samples)
        rng = np.random.default_rng([self.seed, round_idx, cid])
        e_low, e_high = self.epochs
        epochs = int(rng.integers(e_low, e_high, endpoint=True))
        b_low, b_high = self.batch_size
        high = num_samples if b_high is None else min(b_high, num_samples)
        if b_high is None and self.batch_size_upper == "dataset_size_minus_one" and num_samples > b_low:
            high = num_samples - 1  # the public code: np.random.randint(low, |D_i|), |D_i| excluded
        low = min(b_low, high)
        batch = int(rng.integers(low, high, endpoint=True)) if high >= 1 else 1
        if self.steps_rule == "paper" and num_samples > 0:
            # FedAWARE Sec. 5: K_i = floor(E_i * |D_i| / B_i) >= E_i >= 1 (B_i <= |D_i|).
            return ClientWork(epochs=epochs, batch_size=batch, steps=(epochs * num_samples) // batch)
        return ClientWork(epochs=epochs, batch_size=batch)


def _epoch_order(n: int, data_order: str, seed: int, round_idx: int, cid: int, epoch: int) -> np.ndarray:
    """Positions ``0..n-1`` in the order visited in one pass (epoch) over the client's data."""
    if data_order == "none":
        return np.arange(n, dtype=np.int64)
    if data_order == "once":
        return default_rng(seed, cid, _TAG_ONCE).permutation(n)  # = np.random.default_rng([seed, cid, _TAG_ONCE])
    # np.random.default_rng([seed, round_idx, cid, epoch, _TAG_RESHUFFLE]), seeded without reading a list
    return default_rng(seed, round_idx, cid, epoch, _TAG_RESHUFFLE).permutation(n)


def _batches_per_pass(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def num_local_steps(num_samples: int, work: ClientWork, drop_last: bool = False) -> int:
    """How many mini-batches :func:`batch_schedule` yields for a client of ``num_samples`` samples.

    ``work.steps`` when set, else ``epochs * ceil(num_samples / batch_size)`` (``floor`` with
    ``drop_last``). Useful for step-normalised aggregation (e.g. FedNova's ``tau_i``).

    Example::

        >>> num_local_steps(10, ClientWork(epochs=2, batch_size=4)), num_local_steps(10, ClientWork(1, 4, steps=9))
        (6, 9)
    """
    num_samples = _check_int("num_samples", num_samples, minimum=0)
    if work.steps is not None:
        return work.steps
    return work.epochs * _batches_per_pass(num_samples, work.batch_size, drop_last)


def batch_schedule(
    indices: np.ndarray,
    work: ClientWork,
    round_idx: int,
    cid: int,
    seed: int,
    data_order: str = "reshuffle",
    drop_last: bool = False,
) -> list[np.ndarray]:
    """The round's sequence of mini-batches for one client (each an int64 array of dataset indices).

    Each epoch (pass) visits every entry of ``indices`` once, in an order set by ``data_order``, and
    is cut into consecutive batches of ``work.batch_size``; the last batch of a pass is smaller
    unless ``drop_last`` drops it. Batches never span two passes.

    * ``"reshuffle"`` (default): a fresh permutation every epoch, seeded by
      ``(seed, round_idx, cid, epoch)`` -- random reshuffling (Mishchenko, Khaled & Richtarik,
      "Random Reshuffling: Simple Analysis with Vast Improvements", NeurIPS 2020; Malinovsky,
      Mishchenko & Richtarik, "Server-Side Stepsizes and Sampling Without Replacement Provably Help
      in Federated Optimization", 2022, "Nastya").
    * ``"once"``: one permutation per client seeded by ``(seed, cid)``, identical in every epoch and
      every round (shuffle-once, same sources).
    * ``"none"``: the order of ``indices`` (for tests and debugging).

    With ``work.steps`` set, passes continue (epoch ``0, 1, ...``, each reshuffled under
    ``"reshuffle"``) until exactly ``work.steps`` batches: the schedule is the first ``steps``
    batches of the unbounded epoch sequence, and ``work.epochs`` is ignored.

    Args:
        indices: int ``[n]``, the client's dataset indices (e.g. ``Partition.client_indices(cid)``).
        work: the client's :class:`ClientWork` for this round.
        round_idx: round number (int >= 0).
        cid: client id (int >= 0).
        seed: experiment seed (int >= 0).
        data_order: one of ``"reshuffle"``, ``"once"``, ``"none"``.
        drop_last: drop each pass's final partial batch (default ``False``).

    Returns:
        A list of int64 arrays; ``num_local_steps(n, work, drop_last)`` of them.

    Raises:
        TypeError / ValueError: a bad argument (named in the message); with ``work.steps`` set, a
            client that cannot form a single batch (no samples, or fewer than ``batch_size`` with
            ``drop_last``).

    Example: 5 samples, batches of 2, in index order; with ``steps=4`` the second pass begins::

        >>> import numpy as np
        >>> batch_schedule(np.arange(5), ClientWork(epochs=1, batch_size=2), round_idx=0, cid=0, seed=0, data_order="none")
        [array([0, 1]), array([2, 3]), array([4])]
        >>> batch_schedule(np.arange(5), ClientWork(1, 2, steps=4), round_idx=0, cid=0, seed=0, data_order="none")
        [array([0, 1]), array([2, 3]), array([4]), array([0, 1])]
    """
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(f"`indices` must be a 1-D integer array, got shape {idx.shape}, dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    if not isinstance(work, ClientWork):
        raise TypeError(f"`work` must be a ClientWork, got {type(work).__name__}")
    round_idx = _check_int("round_idx", round_idx, minimum=0)
    cid = _check_int("cid", cid, minimum=0)
    seed = _check_seed(seed)
    if data_order not in DATA_ORDERS:
        raise ValueError(f"`data_order` must be one of {DATA_ORDERS}, got {data_order!r}")
    if not isinstance(drop_last, (bool, np.bool_)):
        raise TypeError(f"`drop_last` must be a bool, got {drop_last!r}")

    n, bs = idx.shape[0], work.batch_size
    per_pass = _batches_per_pass(n, bs, bool(drop_last))
    if work.steps is None:
        num_passes, total = work.epochs, work.epochs * per_pass
    else:
        if per_pass == 0:
            raise ValueError(
                f"client {cid} has {n} samples: no batch of `batch_size`={bs} can be formed"
                + (" with `drop_last`=True" if drop_last else "")
                + f", so `steps`={work.steps} cannot be taken"
            )
        num_passes, total = math.ceil(work.steps / per_pass), work.steps

    batches: list[np.ndarray] = []
    for epoch in range(num_passes):
        ordered = idx[_epoch_order(n, data_order, seed, round_idx, cid, epoch)]
        for b in range(min(per_pass, total - len(batches))):
            batches.append(ordered[b * bs : (b + 1) * bs])
    return batches


def has_single_sample_batch(num_samples: int, work: ClientWork, drop_last: bool = False,
                            limit: int | None = None) -> bool:
    """Whether :func:`batch_schedule` gives a client of ``num_samples`` samples a mini-batch of exactly one sample
    under ``work``, among its first ``limit`` batches (``None``: all; the trainer's ``limit_train_batches``). Exact
    for any data order: every batch holds ``batch_size`` samples but the last of each pass, which holds
    ``num_samples mod batch_size`` (none with ``drop_last``), so a one-sample batch is ``batch_size == 1``, or the
    last batch of the first pass when ``num_samples mod batch_size == 1`` and the schedule reaches it. A BatchNorm
    layer in training mode cannot normalise such a batch of ``[1, C]`` features.

    Example: 21 samples in batches of 10 end each pass with one sample; with ``drop_last``, or when the client stops
    after 2 batches (``limit=2``), it never takes it::

        >>> work = ClientWork(epochs=1, batch_size=10)
        >>> has_single_sample_batch(21, work), has_single_sample_batch(21, work, drop_last=True)
        (True, False)
        >>> has_single_sample_batch(21, work, limit=2), has_single_sample_batch(22, work)
        (False, False)
    """
    n, bs = int(num_samples), work.batch_size
    per_pass = _batches_per_pass(n, bs, bool(drop_last))
    if per_pass == 0:
        return False  # no batch at all
    total = work.steps if work.steps is not None else work.epochs * per_pass
    if limit is not None:
        total = min(total, int(limit))
    if bs == 1:
        return total >= 1
    return not drop_last and n % bs == 1 and total >= per_pass


def single_sample_batch_clients(sizes: Sequence[int] | np.ndarray, local_work: LocalWork, drop_last: bool = False,
                                limit: int | None = None) -> list[tuple[int, int, int]]:
    """The clients whose local work holds a mini-batch of exactly one sample (:func:`has_single_sample_batch`), as
    ``(client id, its number of samples, its batch size)`` in increasing id order. For :class:`FixedLocalWork` and
    :class:`FixedLocalSteps` (the same plan in every round) every client is judged by its plan; for another policy
    (a batch size drawn per round) only the clients of one sample, whose every batch is that sample whatever the
    round (their round-0 plan is read).

    Args:
        sizes: ``[N]``, each client's number of samples.
        local_work: The data module's policy.
        drop_last: The data module's ``drop_last``.
        limit: The most local batches a client takes in a round (``None``: no limit).

    Example: batches of 10; clients of 21 and 1 samples end a pass with one sample, 20 and 12 do not::

        >>> single_sample_batch_clients([21, 20, 1, 12], FixedLocalWork(batch_size=10))
        [(0, 21, 10), (2, 1, 10)]
        >>> single_sample_batch_clients([21, 1], SampledLocalWork(seed=0))  # only the one-sample client is certain
        [(1, 1, 1)]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    found: list[tuple[int, int, int]] = []
    if isinstance(local_work, (FixedLocalWork, FixedLocalSteps)):  # a plan of the client's size alone
        for n in np.unique(sizes).tolist():
            work = local_work.plan(0, 0, n)
            if has_single_sample_batch(n, work, drop_last, limit):
                found += [(int(c), n, work.batch_size) for c in np.flatnonzero(sizes == n)]
        return sorted(found)
    for c in np.flatnonzero(sizes == 1).tolist():
        work = local_work.plan(c, 0, 1)
        if has_single_sample_batch(1, work, drop_last, limit):
            found.append((c, 1, work.batch_size))
    return found
